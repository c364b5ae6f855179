//! CMD as the sandbox will find it. Before the sandbox exists, the launcher
//! looks CMD up on the host the way the sandbox will (its PATH, `#!`
//! interpreters, `#!/usr/bin/env NAME`), and [`check`] compares what it
//! found with the [`View`]: a command (or interpreter) that exists on the
//! host only where the sandbox does not look — HOME, `/srv`, … — is refused
//! with what to pass (`--ro ~/.cargo --ro ~/.rustup`) rather than left to
//! fail inside with a bare "No such file or directory". Exit status 127,
//! as for any command that cannot be found.
//!
//! [`lookup`] reads the host's files; [`check`] is pure. A command that is
//! not on the host at all is left to the sandbox (which says it cannot run
//! it); a candidate the sandbox does not show is passed over when a later
//! one on PATH is shown, as the sandbox's own search would.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::view::{hider_of, suggest_ro, View};

/// Bytes of a file read for its `#!` line (the kernel reads 256).
const SHEBANG_MAX: usize = 256;

/// Launchers whose real programs live in another directory: the file name
/// of the launcher's real path, and for each directory it needs, the
/// variable that moves it and its default under HOME. (A rustup proxy,
/// `~/.cargo/bin/cargo -> rustup`, runs toolchains from `~/.rustup`.)
const SPLIT_HOMES: &[(&str, &[(&str, &str)])] = &[
    (
        "rustup",
        &[("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo")],
    ),
    (
        "rustup-init",
        &[("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo")],
    ),
];

/// An executable file found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executable {
    /// As the sandbox would name it (PATH entry + name, or the path given).
    pub path: PathBuf,
    /// With every symlink resolved.
    pub real: PathBuf,
    /// Its `#!` interpreter, if it is a script.
    pub interpreter: Option<Interpreter>,
    /// Directories it needs besides its own ([`SPLIT_HOMES`]) that exist,
    /// with the variable that named them when the host set it.
    pub needs: Vec<(PathBuf, Option<String>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interpreter {
    /// `#!/path/to/interp`.
    Path(Box<Executable>),
    /// `#!/usr/bin/env NAME`: env itself, and NAME's hits on PATH.
    Env {
        env: Box<Executable>,
        name: String,
        found: Vec<Executable>,
    },
    /// `#!` naming a file the host does not have: left to the sandbox.
    Missing,
}

/// CMD's hits on the host, in the order the sandbox would try them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub name: String,
    pub found: Vec<Executable>,
}

/// Looks `argv0` up on the host: as a path (relative to `cwd`) when it
/// has a `/`, else in each directory of `path_var`.
pub fn lookup(argv0: &OsStr, path_var: &OsStr, cwd: &Path, env: &[(OsString, OsString)]) -> Lookup {
    let name = argv0.to_string_lossy().into_owned();
    let home = var(env, "HOME").map(PathBuf::from);
    let found = candidates(argv0, path_var, cwd)
        .into_iter()
        .filter_map(|p| executable(&p, path_var, cwd, env, home.as_deref(), true))
        .collect();
    Lookup { name, found }
}

fn var<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a OsStr> {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_os_str())
        .filter(|v| !v.is_empty())
}

fn candidates(argv0: &OsStr, path_var: &OsStr, cwd: &Path) -> Vec<PathBuf> {
    if argv0.as_bytes().contains(&b'/') {
        return vec![cwd.join(argv0)];
    }
    path_var
        .as_bytes()
        .split(|&b| b == b':')
        .map(|d| {
            let d = if d.is_empty() { b"." as &[u8] } else { d };
            cwd.join(OsStr::from_bytes(d)).join(argv0)
        })
        .collect()
}

fn executable(
    p: &Path,
    path_var: &OsStr,
    cwd: &Path,
    env: &[(OsString, OsString)],
    home: Option<&Path>,
    follow_shebang: bool,
) -> Option<Executable> {
    let meta = std::fs::metadata(p).ok()?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return None;
    }
    let real = p.canonicalize().ok()?;
    let interpreter = if follow_shebang {
        shebang(&real).map(|(interp, arg)| {
            let Some(e) = executable(&interp, path_var, cwd, env, home, false) else {
                return Interpreter::Missing;
            };
            let is_env = interp.file_name() == Some(OsStr::new("env"));
            match arg.filter(|_| is_env) {
                Some(name) => Interpreter::Env {
                    env: Box::new(e),
                    found: candidates(OsStr::new(&name), path_var, cwd)
                        .into_iter()
                        .filter_map(|c| executable(&c, path_var, cwd, env, home, false))
                        .collect(),
                    name,
                },
                None => Interpreter::Path(Box::new(e)),
            }
        })
    } else {
        None
    };
    let base = real.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let mut needs = Vec::new();
    for (tool, dirs) in SPLIT_HOMES {
        if *tool != base {
            continue;
        }
        for (name, default) in *dirs {
            let (dir, named) = match var(env, name) {
                Some(v) => (PathBuf::from(v), Some(name.to_string())),
                None => match home {
                    Some(h) => (h.join(default), None),
                    None => continue,
                },
            };
            if let Ok(d) = dir.canonicalize() {
                if d.is_dir() {
                    needs.push((d, named));
                }
            }
        }
    }
    Some(Executable {
        path: absolute(p),
        real,
        interpreter,
        needs,
    })
}

/// `a/./b` → `a/b` (lexically; `..` is left to [`Executable::real`]).
fn absolute(p: &Path) -> PathBuf {
    p.components().collect()
}

/// The interpreter and its first argument of a `#!` line.
fn shebang(p: &Path) -> Option<(PathBuf, Option<String>)> {
    let mut head = [0u8; SHEBANG_MAX];
    let mut f = std::fs::File::open(p).ok()?;
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    parse_shebang(&head[..n])
}

fn parse_shebang(head: &[u8]) -> Option<(PathBuf, Option<String>)> {
    let line = head.strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_ascii_whitespace();
    let interp = words.next()?;
    if !interp.starts_with('/') {
        return None;
    }
    // `env -S …` and other options: the first word that is not one.
    let arg = words.find(|w| !w.starts_with('-')).map(str::to_string);
    Some((PathBuf::from(interp), arg))
}

/// CMD exists on the host only where the sandbox does not show it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot run {name}: {what} {why}; pass {flags}")]
pub struct CommandHidden {
    pub name: String,
    what: String,
    why: String,
    flags: String,
    /// The `--ro` paths suggested (what `flags` says, without `--env`).
    pub ro: Vec<PathBuf>,
}

/// Whether the sandbox will find what the host found, and if not, why and
/// what to pass. `home` is the sandbox's HOME.
pub fn check(l: &Lookup, view: &View, home: &Path) -> Result<(), CommandHidden> {
    let shown = |e: &Executable| view.shows(&e.path).is_ok() && view.shows(&e.real).is_ok();
    let Some(first) = l.found.iter().find(|e| shown(e)).or(l.found.first()) else {
        return Ok(()); // not on the host either: the sandbox says so
    };
    let mut problems: Vec<(String, &Executable)> = Vec::new();
    if !shown(first) {
        problems.push((describe(first), first));
    } else {
        match &first.interpreter {
            Some(Interpreter::Path(i)) if !shown(i) => {
                problems.push((format!("its interpreter {}", describe(i)), i))
            }
            Some(Interpreter::Env { env, .. }) if !shown(env) => {
                problems.push((format!("its interpreter {}", describe(env)), env))
            }
            Some(Interpreter::Env { name, found, .. }) => {
                if let Some(e) = found.first().filter(|_| !found.iter().any(shown)) {
                    problems.push((format!("its interpreter {name}, {}", describe(e)), e));
                }
            }
            _ => {}
        }
    }
    let Some((what, e)) = problems.first().cloned() else {
        return Ok(());
    };
    // What hides the first path that is hidden says why.
    let hidden = [&e.path, &e.real]
        .into_iter()
        .find_map(|p| view.shows(p).err())
        .expect("a problem has a hidden path");
    let (why, _) = hider_of(&hidden, home);
    let mut ro: Vec<PathBuf> = Vec::new();
    let mut envs: Vec<String> = Vec::new();
    for p in [&e.path, &e.real]
        .into_iter()
        .chain(e.needs.iter().map(|(d, _)| d))
    {
        if let Err(h) = view.shows(p) {
            let (_, under) = hider_of(&h, home);
            let s = if e.needs.iter().any(|(d, _)| d == p) {
                p.clone()
            } else {
                suggest_ro(p, &under)
            };
            ro.push(s);
        }
    }
    for (_, named) in &e.needs {
        if let Some(n) = named {
            envs.push(n.clone());
        }
    }
    ro.sort();
    ro.dedup();
    let covered: Vec<PathBuf> = ro
        .iter()
        .filter(|p| ro.iter().any(|q| q != *p && p.starts_with(q)))
        .cloned()
        .collect();
    ro.retain(|p| !covered.contains(p));
    let mut flags: Vec<String> = envs.iter().map(|n| format!("--env {n}")).collect();
    flags.extend(ro.iter().map(|p| format!("--ro {}", p.display())));
    Err(CommandHidden {
        name: l.name.clone(),
        what,
        why,
        flags: flags.join(" "),
        ro,
    })
}

fn describe(e: &Executable) -> String {
    if e.path == e.real {
        e.path.display().to_string()
    } else {
        format!("{} (a link to {})", e.path.display(), e.real.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::view::{Layer, Origin, SystemEntry};

    fn exe(path: &str, real: &str) -> Executable {
        Executable {
            path: path.into(),
            real: real.into(),
            interpreter: None,
            needs: vec![],
        }
    }

    fn view() -> View {
        let mut v = View {
            system: vec![
                ("/usr".into(), SystemEntry::Dir),
                ("/bin".into(), SystemEntry::Symlink("usr/bin".into())),
            ],
            layers: vec![
                Layer::Tmpfs {
                    path: "/root".into(),
                    mode: 0o700,
                    cmd_owned: true,
                },
                Layer::Bind {
                    path: "/srv/proj".into(),
                    writable: true,
                    idmapped: false,
                    origin: Origin::Cwd,
                },
            ],
            ..View::default()
        };
        v.order();
        v
    }

    fn with_ro(mut v: View, ro: &[PathBuf]) -> View {
        for p in ro {
            v.layers.push(Layer::Bind {
                path: p.clone(),
                writable: false,
                idmapped: false,
                origin: Origin::Flag,
            });
        }
        v.order();
        v
    }

    fn cargo() -> Executable {
        let mut e = exe("/root/.cargo/bin/cargo", "/root/.cargo/bin/rustup");
        e.needs = vec![
            ("/root/.rustup".into(), None),
            ("/root/.cargo".into(), None),
        ];
        e
    }

    #[test]
    fn a_rustup_proxy_in_home_needs_both_homes() {
        let l = Lookup {
            name: "cargo".into(),
            found: vec![cargo()],
        };
        let e = check(&l, &view(), Path::new("/root")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "cannot run cargo: /root/.cargo/bin/cargo (a link to /root/.cargo/bin/rustup) \
                 is in HOME (/root), which is a fresh, empty directory inside"
            ),
            "{msg}"
        );
        assert!(
            msg.ends_with("; pass --ro /root/.cargo --ro /root/.rustup"),
            "{msg}"
        );
        // Following the hint is enough.
        let v = with_ro(view(), &e.ro);
        assert_eq!(check(&l, &v, Path::new("/root")), Ok(()));
    }

    #[test]
    fn a_hidden_hit_is_passed_over_for_a_shown_one_later_on_path() {
        let l = Lookup {
            name: "python3".into(),
            found: vec![
                exe("/root/.pyenv/shims/python3", "/root/.pyenv/shims/python3"),
                exe("/usr/bin/python3", "/usr/bin/python3.11"),
            ],
        };
        assert_eq!(check(&l, &view(), Path::new("/root")), Ok(()));
        let l = Lookup {
            name: "nothing".into(),
            found: vec![],
        };
        assert_eq!(check(&l, &view(), Path::new("/root")), Ok(()));
    }

    #[test]
    fn interpreters_are_checked_too() {
        let mut script = exe("/srv/proj/run.py", "/srv/proj/run.py");
        script.interpreter = Some(Interpreter::Path(Box::new(exe(
            "/root/.pyenv/shims/python3",
            "/root/.pyenv/shims/python3",
        ))));
        let l = Lookup {
            name: "./run.py".into(),
            found: vec![script.clone()],
        };
        let e = check(&l, &view(), Path::new("/root")).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "cannot run ./run.py: its interpreter /root/.pyenv/shims/python3 is in HOME"
            ),
            "{e}"
        );
        assert_eq!(e.ro, [PathBuf::from("/root/.pyenv")]);

        // `#!/usr/bin/env tool`, tool only under /opt/tools (not shown).
        script.interpreter = Some(Interpreter::Env {
            env: Box::new(exe("/usr/bin/env", "/usr/bin/env")),
            name: "tool".into(),
            found: vec![exe("/srv/tools/bin/tool", "/srv/tools/bin/tool")],
        });
        let l = Lookup {
            name: "./run.py".into(),
            found: vec![script],
        };
        let e = check(&l, &view(), Path::new("/root")).unwrap_err();
        assert!(
            e.to_string()
                .contains("its interpreter tool, /srv/tools/bin/tool is not shown inside"),
            "{e}"
        );
        assert_eq!(e.ro, [PathBuf::from("/srv/tools")]);
    }

    #[test]
    fn a_host_variable_that_moved_a_home_is_passed_on() {
        let mut e = cargo();
        e.needs = vec![("/opt/rustup".into(), Some("RUSTUP_HOME".into()))];
        let l = Lookup {
            name: "cargo".into(),
            found: vec![e],
        };
        let mut v = view();
        v.system.push(("/opt".into(), SystemEntry::Dir));
        let e = check(&l, &v, Path::new("/root")).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("; pass --env RUSTUP_HOME --ro /root/.cargo"),
            "{e}"
        );
    }

    #[test]
    fn shebangs() {
        assert_eq!(
            parse_shebang(b"#!/bin/sh -e\necho"),
            Some(("/bin/sh".into(), None))
        );
        assert_eq!(
            parse_shebang(b"#! /usr/bin/env -S python3 -u\n"),
            Some(("/usr/bin/env".into(), Some("python3".into())))
        );
        assert_eq!(parse_shebang(b"#!python\n"), None);
        assert_eq!(parse_shebang(b"\x7fELF"), None);
    }

    #[test]
    fn lookup_follows_path_links_and_shebangs() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let interp = bin.join("interp");
        std::fs::write(&interp, "#!/bin/sh\n").unwrap();
        let script = bin.join("tool");
        std::fs::write(&script, format!("#!{}\n", interp.display())).unwrap();
        for f in [&interp, &script] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::os::unix::fs::symlink(&script, bin.join("alias")).unwrap();
        std::fs::write(bin.join("plain"), "not executable").unwrap();
        let path = OsString::from(format!("/nonexistent:{}", bin.display()));
        let l = lookup(OsStr::new("alias"), &path, d.path(), &[]);
        assert_eq!(l.found.len(), 1, "{l:?}");
        let e = &l.found[0];
        assert_eq!(e.path, bin.join("alias"));
        assert_eq!(e.real, script.canonicalize().unwrap());
        match &e.interpreter {
            Some(Interpreter::Path(i)) => assert_eq!(i.real, interp.canonicalize().unwrap()),
            other => panic!("{other:?}"),
        }
        assert!(lookup(OsStr::new("plain"), &path, d.path(), &[])
            .found
            .is_empty());
        let l = lookup(OsStr::new("./bin/tool"), &path, d.path(), &[]);
        assert_eq!(l.found[0].path, bin.join("tool"));
    }
}
