//! The guard: everything the embedded egressd reads or writes, found on the
//! host before the sandbox exists, so that the plan can mask each one and
//! refuse a policy the sandbox could change.
//!
//! Guarded: the policy (file or directory, the grants under it, and where a
//! policy file's link leads), the decision log, the CA directory,
//! `--upstream-ca`, `--upstream-proxy-auth-file`, `--token-file`, and every
//! `${file:…}` an exception or mirror names. Each is masked at its canonical
//! path (what a symlink inside leads to) and at the path as given. A
//! guarded file with another hard link is refused: the sandbox might see it
//! under a name no mask covers.
//!
//! Also here: the decision log's default under `run`, a file of its own
//! outside everything the sandbox shows.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::launcher::RunArgs;

/// One guarded path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guarded {
    /// Canonical (or as given, for the extra mask at a symlink's place).
    pub path: PathBuf,
    pub dir: bool,
    /// What it is, for messages ("the policy", "--upstream-ca", …).
    pub what: String,
    /// Part of the policy: the sandbox must not be able to change it.
    pub policy: bool,
}

/// What the launcher found.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub guarded: Vec<Guarded>,
    /// The policy path the embedded egressd loads (canonical: a link the
    /// sandbox could repoint is never followed again on reload).
    pub policy: PathBuf,
    /// The decision log the embedded egressd writes.
    pub log: PathBuf,
    /// Whether [`Found::log`] is the default file made for this run.
    pub log_is_default: bool,
}

/// Log destinations that are CMD's own streams (or reach them).
const SHARED_STREAMS: &[&str] = &[
    "-",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/tty",
    "/proc/self/fd/1",
    "/proc/self/fd/2",
    "/dev/fd/1",
    "/dev/fd/2",
];

/// Finds every path the embedded egressd uses (with `--connect`, only the
/// token file). Creates the decision log (so that it can be masked).
pub fn find(args: &RunArgs, cwd: &Path) -> Result<Found, String> {
    let mut found = Found::default();
    let mut add =
        |p: &Path, what: &str, policy: bool| guard(&mut found.guarded, cwd, p, what, policy);
    if let Some(t) = &args.token_file {
        add(t, "--token-file", false)?;
    }
    if args.connect.is_some() {
        return Ok(found);
    }

    // The policy, as egressd reads it (links out of its directory, and
    // files of other owners, are refused there).
    let given = cwd.join(&args.engine.policy);
    let policy = match given.canonicalize() {
        Ok(p) => p,
        // The loader's own words for a missing policy (with the hint).
        Err(e) => {
            crate::policy::read_sources(&given).map_err(|e| e.to_string())?;
            return Err(format!("--policy {}: {e}", args.engine.policy.display()));
        }
    };
    let sources = crate::policy::read_sources(&policy).map_err(|e| e.to_string())?;
    add(&policy, "the policy", true)?;
    let mut secrets = Vec::new();
    for s in &sources {
        add(&s.path, "the policy", true)?;
        secrets.extend(file_substitutions(&s.text));
    }
    for f in secrets {
        add(Path::new(&f), "a ${file:…} secret of the policy", false)?;
    }
    if let Some(d) = &args.engine.ca_dir {
        add(d, "--ca-dir", false)?;
    }
    if let Some(f) = &args.engine.upstream_ca {
        add(f, "--upstream-ca", false)?;
    }
    if let Some(f) = &args.engine.upstream_proxy_auth_file {
        add(f, "--upstream-proxy-auth-file", false)?;
    }
    // The key that signs the chained log: whoever reads it can forge a
    // checkpoint.
    if let Some(k) = &args.engine.chain.log_key {
        add(k, "--log-key", false)?;
    }
    // Grants are policy (a planted grant allows) and egressd writes their
    // use counts there: made now, so that it can be masked like the policy.
    if let Some(g) = &args.engine.grants {
        let dir = cwd.join(g);
        std::fs::create_dir_all(&dir).map_err(|e| format!("--grants {}: {e}", g.display()))?;
        add(g, "--grants", true)?;
    }

    let (log, is_default) = open_log(args, cwd)?;
    add(&log, "--log", false)?;
    found.policy = policy;
    found.log = log;
    found.log_is_default = is_default;
    Ok(found)
}

/// Guards `p` (as given, relative to `cwd`, and where it leads): refused
/// when it has other hard links.
fn guard(
    guarded: &mut Vec<Guarded>,
    cwd: &Path,
    p: &Path,
    what: &str,
    policy: bool,
) -> Result<(), String> {
    let given = cwd.join(p);
    let canonical = given
        .canonicalize()
        .map_err(|e| format!("{what} {}: {e}", p.display()))?;
    let meta = std::fs::metadata(&canonical).map_err(|e| format!("{what} {}: {e}", p.display()))?;
    if meta.is_file() && meta.nlink() > 1 {
        return Err(format!(
            "{what} {} has {} hard links: the sandbox could reach it under another name; \
             give egressd a copy of its own",
            canonical.display(),
            meta.nlink()
        ));
    }
    for path in [canonical.clone(), given.clone()] {
        if !guarded.iter().any(|g| g.path == path) {
            guarded.push(Guarded {
                path,
                dir: meta.is_dir(),
                what: what.to_string(),
                policy,
            });
        }
    }
    Ok(())
}

/// The decision log of the run (the default one made for it when `--log`
/// is not given), created so that it can be masked: never CMD's streams.
fn open_log(args: &RunArgs, cwd: &Path) -> Result<(PathBuf, bool), String> {
    let (log, is_default) = match args.log.as_str() {
        "" => (default_log()?, true),
        l if SHARED_STREAMS.contains(&l) || l.starts_with("/dev/fd/") => {
            return Err(format!(
                "--log {l}: under run the decision log is never CMD's stdout or stderr (CMD \
                 could forge, cut or lose lines there); give a file, or leave --log out for \
                 one outside the sandbox"
            ))
        }
        l => (cwd.join(l), false),
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("--log {}: {e}", log.display()))?;
    Ok((log, is_default))
}

/// The paths of every `${file:PATH}` in a policy file's text (whatever key
/// holds it: exceptions' and mirrors' `inject` alike).
pub fn file_substitutions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("${file:") {
        rest = &rest[i + "${file:".len()..];
        if let Some(end) = rest.find('}') {
            let p = rest[..end].trim();
            if !p.is_empty() {
                out.push(p.to_string());
            }
            rest = &rest[end..];
        }
    }
    out
}

/// A new decision log outside everything the sandbox shows: in
/// `$XDG_RUNTIME_DIR/egressd`, else `/run/egressd` (root), else a private
/// directory under `/tmp` (the sandbox's `/tmp` and `/run` are its own).
fn default_log() -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let stamp = crate::time::unix_now();
    let name = format!("run-{stamp}-{}.jsonl", std::process::id());
    let mut bases: Vec<PathBuf> = Vec::new();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if x.is_absolute() && x.is_dir() {
            bases.push(x.join("egressd"));
        }
    }
    if super::sys::geteuid() == 0 {
        bases.push(PathBuf::from("/run/egressd"));
    }
    for b in bases {
        let made = std::fs::DirBuilder::new().mode(0o700).create(&b);
        let ok = made.is_ok() || std::fs::symlink_metadata(&b).is_ok_and(|m| m.is_dir());
        if ok && std::fs::symlink_metadata(&b).is_ok_and(|m| m.uid() == super::sys::geteuid()) {
            return Ok(b.join(name));
        }
    }
    // Made here, 0700, never an existing one (another user's /tmp entry).
    for attempt in 0..16u32 {
        let dir = PathBuf::from(format!(
            "/tmp/egressd-run-{}-{stamp}-{attempt}",
            std::process::id()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir.join(name)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot make a directory for the decision log: {e}")),
        }
    }
    Err("cannot make a directory for the decision log under /tmp".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_substitutions_are_found_wherever_they_are() {
        let t =
            "exceptions:\n  - inject: {headers: {A: \"x ${file:/run/a} ${env:B} ${file: /b }\"}}\n\
                 mirrors: {pypi: {inject: {headers: {C: \"${file:/c}\"}}}}\n";
        assert_eq!(file_substitutions(t), ["/run/a", "/b", "/c"]);
        assert!(file_substitutions("${file:").is_empty());
    }
}
