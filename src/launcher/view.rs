//! The sandbox's filesystem, decided before anything is mounted: which host
//! paths it shows, in which order they are mounted, what is masked, and,
//! for a path it does not show, why and which `--ro` would show it. Pure:
//! the host's facts are gathered by the caller; `namespaces` carries the
//! view out.
//!
//! The root is a fresh, read-only tmpfs holding only:
//! - the system, read-only: [`SYSTEM`] (symlinks such as `/bin -> usr/bin`
//!   are recreated as symlinks);
//! - the sandbox's own `/proc` and a minimal `/dev` ([`DEV_NODES`], `pts`,
//!   `shm`);
//! - fresh `/tmp`, `/var/tmp`, `/run` and HOME;
//! - the working directory (`--cwd rw`, the default, or `ro`) and the
//!   `--ro`/`--rw` paths, each at its own place;
//! - the generated resolv.conf and, with `--ca-dir`, the CA's public files
//!   (both written by the sandbox into a tmpfs of its own, then bound).
//!
//! Nothing else of the host is there, so no host Unix socket outside those
//! paths can be reached. Secrets that live in `/etc` ([`ETC_SECRETS`],
//! SSH host keys) and the CA directory are masked by empty, unreadable
//! mounts placed after everything else, wherever a bind shows them.
//!
//! Mount order is the kernel's semantics made explicit: layers (fresh tmpfs
//! and binds) are mounted shallow to deep, so the deepest covering a path
//! wins; at the same path a bind follows the tmpfs it replaces (`--ro
//! $HOME` shows the real HOME). [`View::shows`] answers with the same rule.

use std::path::{Path, PathBuf};

/// The host's system trees, shown read-only when they exist.
pub const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];
/// Secrets kept in `/etc` that the sandbox must never read, whatever its
/// uid: password hashes (and the backups `shadow-`, `gshadow-` that hold
/// the same), TLS and Kerberos host keys. SSH host keys are matched by
/// [`is_etc_secret`].
pub const ETC_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
    "/etc/krb5.keytab",
];
/// Where SSH host keys live (`ssh_host_*_key`; the `.pub` files stay).
pub const SSH_DIR: &str = "/etc/ssh";
/// Device nodes of the minimal `/dev`, bound from the host's.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Symlinks of the minimal `/dev`.
pub const DEV_LINKS: &[(&str, &str)] = &[
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
];
/// Fresh scratch directories (besides HOME), with their modes.
pub const SCRATCH: &[(&str, u32)] = &[("/tmp", 0o1777), ("/var/tmp", 0o1777), ("/run", 0o755)];
/// Directory names whose parent is a tool's prefix (`~/.cargo/bin/cargo`
/// needs `~/.cargo`; `~/.pyenv/shims/python3` needs `~/.pyenv`).
const PREFIX_CHILDREN: &[&str] = &["bin", "sbin", "shims", "libexec"];

/// `true` for the paths of [`ETC_SECRETS`] and SSH host private keys.
pub fn is_etc_secret(p: &Path) -> bool {
    if ETC_SECRETS.iter().any(|s| p == Path::new(s)) {
        return true;
    }
    p.parent() == Some(Path::new(SSH_DIR))
        && p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ssh_host_") && n.ends_with("_key"))
}

/// What a system path is on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    Dir,
    /// A symlink (merged /usr: `/bin -> usr/bin`), recreated as one.
    Symlink(PathBuf),
}

/// Why a layer is there (for messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The working directory.
    Cwd,
    /// `--ro` or `--rw`.
    Flag,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    /// A fresh tmpfs: `mode`; owned by CMD (HOME) or by the sandbox's root.
    Tmpfs {
        path: PathBuf,
        mode: u32,
        cmd_owned: bool,
    },
    /// A host path shown at the same place.
    Bind {
        path: PathBuf,
        writable: bool,
        /// Through an idmapped mount (the owner's files are CMD's).
        idmapped: bool,
        origin: Origin,
    },
}

impl Layer {
    pub fn path(&self) -> &Path {
        match self {
            Layer::Tmpfs { path, .. } | Layer::Bind { path, .. } => path,
        }
    }
    fn rank(&self) -> u8 {
        match self {
            Layer::Tmpfs { .. } => 0,
            Layer::Bind { .. } => 1,
        }
    }
}

/// An empty, unreadable mount over a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    pub path: PathBuf,
    pub dir: bool,
}

/// A file of egressd's shown read-only inside at `target`. Its bytes are
/// taken by the launcher and written into the sandbox's own staging tmpfs:
/// the sandbox never mounts a host file that another launcher may replace
/// meanwhile (each `egressd run --ca-dir` rewrites the CA directory's
/// bundle by rename, and a mount of a file renamed over can no longer be
/// attached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBind {
    pub contents: Vec<u8>,
    pub target: PathBuf,
}

/// Everything mounted, in order: system, `/proc` and `/dev`, layers,
/// resolv.conf, masks, file binds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    pub system: Vec<(PathBuf, SystemEntry)>,
    /// Shallow to deep; at the same path, tmpfs before bind.
    pub layers: Vec<Layer>,
    /// Where the generated resolv.conf is bound (None: the host has none,
    /// and glibc's default, 127.0.0.1, is the resolver inside anyway).
    pub resolv_conf: Option<PathBuf>,
    pub masks: Vec<Mask>,
    pub files: Vec<FileBind>,
}

/// A host directory the sandbox shows rebuilt on a tmpfs of its own
/// (see [`View::rebuilt`]): what is at each of its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    pub path: PathBuf,
    /// Entries something is mounted on (masks, resolv.conf, file binds):
    /// an empty placeholder of their own instead of the host's entry.
    pub targets: Vec<PathBuf>,
}

/// Why the sandbox does not show a host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hidden {
    /// Under a fresh tmpfs (HOME, /tmp, /run, …): the path given.
    Fresh(PathBuf),
    /// Masked (a secret, the CA directory).
    Masked(PathBuf),
    /// The sandbox's own `/proc` or `/dev`.
    Own(PathBuf),
    /// Outside everything the sandbox shows.
    NotShown,
}

impl View {
    /// The working directory's `.git` when it is pinned (a writable mount
    /// of its own, its configuration read-only in it): the launcher
    /// watches it while the box runs (`git_watch`).
    pub fn pinned_git(&self) -> Option<&Path> {
        self.layers.iter().find_map(|l| match l {
            Layer::Bind {
                path,
                writable: true,
                origin: Origin::Cwd,
                ..
            } if path.file_name() == Some(".git".as_ref()) => Some(path.as_path()),
            _ => None,
        })
    }

    /// Sorts the layers into mount order.
    pub fn order(&mut self) {
        self.layers
            .sort_by_key(|l| (l.path().components().count(), l.rank()));
    }

    /// Every path something is mounted on after the layers (resolv.conf,
    /// masks, file binds).
    fn targets(&self) -> impl Iterator<Item = &Path> {
        self.resolv_conf
            .iter()
            .map(PathBuf::as_path)
            .chain(self.masks.iter().map(|m| m.path.as_path()))
            .chain(self.files.iter().map(|f| f.target.as_path()))
    }

    /// The directories of the system trees that hold a mount target
    /// (`/etc` for resolv.conf and the masks of `/etc/shadow`,
    /// `/etc/ssl/certs` for the CA bundle, …) and every directory between
    /// them and their system tree, shallow to deep. Each is rebuilt on a
    /// tmpfs of the sandbox's own: its entries are the host's (symlinks
    /// recreated, everything else bound on a placeholder of its own), and
    /// what egressd mounts goes on a placeholder, never on the host's file.
    /// The kernel detaches every mount whose mount point is a file that
    /// another namespace unlinks or renames over, so a mask, resolv.conf
    /// or CA bundle placed on the host's own `/etc` file would vanish (or,
    /// racing the rename, fail to mount) when the host replaces that file,
    /// as `passwd`, DHCP clients and `update-ca-certificates` do. Targets
    /// under a layer keep the layer's own mount points (a `--ro` of a
    /// directory in `/etc` shows that directory live).
    pub fn rebuilt(&self) -> Vec<Rebuilt> {
        let mut dirs: Vec<Rebuilt> = Vec::new();
        for t in self.targets() {
            if self.layers.iter().any(|l| t.starts_with(l.path())) {
                continue;
            }
            let Some(tree) = self
                .system
                .iter()
                .find(|(s, e)| *e == SystemEntry::Dir && t.starts_with(s) && t != s)
                .map(|(s, _)| s)
            else {
                continue;
            };
            let mut child = t;
            while let Some(dir) = child.parent() {
                match dirs.iter_mut().find(|r| r.path == dir) {
                    Some(r) if !r.targets.iter().any(|x| x == child) => {
                        r.targets.push(child.to_path_buf())
                    }
                    Some(_) => {}
                    None => dirs.push(Rebuilt {
                        path: dir.to_path_buf(),
                        targets: vec![child.to_path_buf()],
                    }),
                }
                if dir == tree {
                    break;
                }
                child = dir;
            }
        }
        dirs.sort_by(|a, b| {
            (a.path.components().count(), &a.path).cmp(&(b.path.components().count(), &b.path))
        });
        dirs
    }

    /// Whether `p` (absolute, with the host's symlinks resolved or leading
    /// through [`SYSTEM`] symlinks) shows the host's content inside.
    pub fn shows(&self, p: &Path) -> Result<(), Hidden> {
        self.underneath(p)?;
        match self.masks.iter().find(|m| p.starts_with(&m.path)) {
            Some(m) => Err(Hidden::Masked(m.path.clone())),
            None => Ok(()),
        }
    }

    /// [`View::shows`] before masks.
    fn underneath(&self, p: &Path) -> Result<(), Hidden> {
        if let Some(l) = self.layers.iter().rev().find(|l| p.starts_with(l.path())) {
            return match l {
                Layer::Bind { .. } => Ok(()),
                Layer::Tmpfs { path, .. } => Err(Hidden::Fresh(path.clone())),
            };
        }
        for own in ["/proc", "/dev"] {
            if p.starts_with(own) {
                return Err(Hidden::Own(own.into()));
            }
        }
        if self.system.iter().any(|(s, _)| p.starts_with(s)) {
            return Ok(());
        }
        Err(Hidden::NotShown)
    }
}

/// The `--ro` that would show `p`, a host file the sandbox hides under
/// `hider` (a fresh tmpfs, or `/` when nothing shows it): a tool's prefix
/// (`~/.cargo` for `~/.cargo/bin/cargo`), else the file's directory, else
/// the file itself — never `hider` itself (a whole HOME is not a hint).
pub fn suggest_ro(p: &Path, hider: &Path) -> PathBuf {
    let below = |d: &Path| d.starts_with(hider) && d != hider;
    let Some(dir) = p.parent() else {
        return p.to_path_buf();
    };
    let named = |d: &Path| {
        d.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| PREFIX_CHILDREN.contains(&n))
    };
    match dir.parent() {
        Some(prefix) if named(dir) && below(prefix) => prefix.to_path_buf(),
        _ if below(dir) => dir.to_path_buf(),
        _ => p.to_path_buf(),
    }
}

/// What hides a path, as the hint's words and the root a suggestion must
/// stay below.
pub fn hider_of(h: &Hidden, home: &Path) -> (String, PathBuf) {
    match h {
        Hidden::Fresh(t) if t == home => (
            format!(
                "is in HOME ({}), which is a fresh, empty directory inside",
                home.display()
            ),
            t.clone(),
        ),
        Hidden::Fresh(t) => (
            format!(
                "is under {}, which is a fresh, empty directory inside",
                t.display()
            ),
            t.clone(),
        ),
        Hidden::Masked(m) => (
            format!("is under {}, which is masked inside", m.display()),
            m.clone(),
        ),
        Hidden::Own(o) => (
            format!("is under {}, which is the sandbox's own", o.display()),
            o.clone(),
        ),
        Hidden::NotShown => (
            format!(
                "is not shown inside (the sandbox shows {}, the working directory, \
                 and the --ro/--rw paths)",
                SYSTEM.join(" ")
            ),
            PathBuf::from("/"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> View {
        let mut v = View {
            system: vec![
                ("/usr".into(), SystemEntry::Dir),
                ("/bin".into(), SystemEntry::Symlink("usr/bin".into())),
                ("/etc".into(), SystemEntry::Dir),
            ],
            layers: vec![
                Layer::Bind {
                    path: "/home/me/proj".into(),
                    writable: true,
                    idmapped: false,
                    origin: Origin::Cwd,
                },
                Layer::Tmpfs {
                    path: "/home/me".into(),
                    mode: 0o700,
                    cmd_owned: true,
                },
                Layer::Tmpfs {
                    path: "/tmp".into(),
                    mode: 0o1777,
                    cmd_owned: false,
                },
                Layer::Bind {
                    path: "/home".into(),
                    writable: false,
                    idmapped: false,
                    origin: Origin::Flag,
                },
            ],
            masks: vec![Mask {
                path: "/etc/shadow".into(),
                dir: false,
            }],
            ..View::default()
        };
        v.order();
        v
    }

    #[test]
    fn layers_go_shallow_to_deep_binds_after_tmpfs() {
        let v = view();
        let order: Vec<_> = v
            .layers
            .iter()
            .map(|l| l.path().to_str().unwrap())
            .collect();
        assert_eq!(order, ["/tmp", "/home", "/home/me", "/home/me/proj"]);
    }

    #[test]
    fn shows_what_is_mounted_last_over_a_path() {
        let v = view();
        assert_eq!(v.shows(Path::new("/usr/bin/python3")), Ok(()));
        assert_eq!(v.shows(Path::new("/bin/sh")), Ok(()));
        assert_eq!(v.shows(Path::new("/home/me/proj/run.sh")), Ok(()));
        assert_eq!(v.shows(Path::new("/home/other/x")), Ok(()), "--ro /home");
        assert_eq!(
            v.shows(Path::new("/home/me/.cargo/bin/cargo")),
            Err(Hidden::Fresh("/home/me".into())),
            "HOME stays fresh under --ro /home"
        );
        assert_eq!(
            v.shows(Path::new("/tmp/x")),
            Err(Hidden::Fresh("/tmp".into()))
        );
        assert_eq!(
            v.shows(Path::new("/etc/shadow")),
            Err(Hidden::Masked("/etc/shadow".into()))
        );
        assert_eq!(v.shows(Path::new("/srv/tool")), Err(Hidden::NotShown));
        assert_eq!(
            v.shows(Path::new("/proc/1/exe")),
            Err(Hidden::Own("/proc".into()))
        );
    }

    #[test]
    fn directories_holding_mount_targets_are_rebuilt_down_from_their_tree() {
        let mut v = view();
        v.resolv_conf = Some("/etc/resolv.conf".into());
        v.masks.push(Mask {
            path: "/home/me/proj/ca".into(),
            dir: true,
        });
        v.files = vec![
            FileBind {
                contents: b"roots".to_vec(),
                target: "/etc/ssl/certs/ca-certificates.crt".into(),
            },
            FileBind {
                contents: b"ca".to_vec(),
                target: "/tmp/ca.pem".into(),
            },
        ];
        let rebuilt = v.rebuilt();
        let got: Vec<(&str, Vec<&str>)> = rebuilt
            .iter()
            .map(|r| {
                (
                    r.path.to_str().unwrap(),
                    r.targets.iter().map(|t| t.to_str().unwrap()).collect(),
                )
            })
            .collect();
        // Under a layer (the working directory, a fresh /tmp): the layer's
        // own mount points; outside every system tree: nothing.
        assert_eq!(
            got,
            [
                ("/etc", vec!["/etc/resolv.conf", "/etc/shadow", "/etc/ssl"]),
                ("/etc/ssl", vec!["/etc/ssl/certs"]),
                ("/etc/ssl/certs", vec!["/etc/ssl/certs/ca-certificates.crt"]),
            ]
        );
    }

    #[test]
    fn suggestions_name_a_tools_prefix_never_home() {
        let home = Path::new("/home/me");
        for (p, want) in [
            ("/home/me/.cargo/bin/cargo", "/home/me/.cargo"),
            ("/home/me/.pyenv/shims/python3", "/home/me/.pyenv"),
            ("/home/me/.local/bin/tool", "/home/me/.local"),
            ("/home/me/bin/tool", "/home/me/bin"),
            ("/home/me/tool", "/home/me/tool"),
            (
                "/home/me/.nvm/versions/node/v20/bin/node",
                "/home/me/.nvm/versions/node/v20",
            ),
        ] {
            assert_eq!(suggest_ro(Path::new(p), home), Path::new(want), "{p}");
        }
        let root = Path::new("/");
        assert_eq!(
            suggest_ro(Path::new("/srv/tools/bin/x"), root),
            Path::new("/srv/tools")
        );
        assert_eq!(suggest_ro(Path::new("/srv/x"), root), Path::new("/srv"));
        assert_eq!(suggest_ro(Path::new("/x"), root), Path::new("/x"));
    }

    #[test]
    fn etc_secrets() {
        for yes in [
            "/etc/shadow",
            "/etc/gshadow-",
            "/etc/ssl/private",
            "/etc/ssh/ssh_host_ed25519_key",
            "/etc/ssh/ssh_host_rsa_key",
        ] {
            assert!(is_etc_secret(Path::new(yes)), "{yes}");
        }
        for no in [
            "/etc/passwd",
            "/etc/ssh/ssh_host_ed25519_key.pub",
            "/etc/ssh/ssh_config",
            "/etc/ssl/certs",
            "/srv/ssh/ssh_host_rsa_key",
        ] {
            assert!(!is_etc_secret(Path::new(no)), "{no}");
        }
    }
}
