//! Grant use counts that outlive a policy: one counter per grant id,
//! handed to every policy that holds the grant ([`GrantStore::share`]), and
//! kept on disk beside the grant (`<grants>/.state/<id>.uses`, written
//! atomically at each use) so a restart of egressd starts where it stopped.
//!
//! Owns the counters and their files. Does not own taking a use (the
//! compare-and-swap is `policy::grant::Grant::take`) or the grant files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::policy::grant::{GrantUses, UseSink};
use crate::policy::Policy;

/// The directory, inside the grants directory, that holds use counts.
/// Hidden, so the policy reader and the watcher pass it by.
pub const STATE_DIR: &str = ".state";

/// Where grant `id`'s use count is kept.
pub fn state_file(grants: &Path, id: &str) -> PathBuf {
    grants.join(STATE_DIR).join(format!("{id}.uses"))
}

/// The use count kept for grant `id` (0 when none is kept).
pub fn read_uses(grants: &Path, id: &str) -> u32 {
    std::fs::read_to_string(state_file(grants, id))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The counters of the grants served so far, by grant id.
#[derive(Debug, Default)]
pub struct GrantStore {
    /// `None`: counts are kept in memory only (a one-file policy without
    /// `--grants`, which can hold no grant anyway).
    dir: Option<PathBuf>,
    counters: Mutex<HashMap<Arc<str>, Arc<GrantUses>>>,
}

impl GrantStore {
    pub fn new(dir: Option<PathBuf>) -> Arc<GrantStore> {
        Arc::new(GrantStore {
            dir,
            counters: Mutex::default(),
        })
    }

    /// Gives every grant of `policy` its counter: the one an earlier policy
    /// counted in, else one that starts at the count kept on disk. Counters
    /// of grants `policy` no longer holds are dropped (a revoked grant).
    pub fn share(&self, policy: &mut Policy) {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept: HashMap<Arc<str>, Arc<GrantUses>> = HashMap::new();
        policy.share_grant_uses(|e| {
            let uses = counters
                .get(&e.id)
                .cloned()
                .unwrap_or_else(|| Arc::new(self.counter(&e.id)));
            kept.insert(e.id.clone(), uses.clone());
            Some(uses)
        });
        *counters = kept;
    }

    fn counter(&self, id: &str) -> GrantUses {
        match &self.dir {
            Some(dir) => GrantUses::new(
                read_uses(dir, id),
                Some(Box::new(FileSink {
                    path: state_file(dir, id),
                })),
            ),
            None => GrantUses::new(0, None),
        }
    }
}

/// Writes a grant's count to its state file: a temporary file renamed over
/// it, so a reader (or a restart) sees the old count or the new, never half.
#[derive(Debug)]
struct FileSink {
    path: PathBuf,
}

impl UseSink for FileSink {
    fn used(&self, n: u32) {
        if let Err(e) = write_atomic(&self.path, format!("{n}\n").as_bytes()) {
            eprintln!(
                "egressd: cannot keep a grant's use count in {}: {e}",
                self.path.display()
            );
        }
    }
}

/// Writes `bytes` to `path` by a temporary file in the same directory and
/// a rename (the directory made if missing).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?;
    // Hidden (the policy reader skips it), and this process's own.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{compile, Source};

    fn grant_policy(dir: &Path) -> Policy {
        let text = "exceptions:\n  - id: g1\n    owner: o\n    reason: r\n    expires: 2030-01-01T01:00:00Z\n    hosts: [api.example.com]\n    grant: {from_request: abc, granted_by: me, granted_at: 2030-01-01T00:00:00Z, max_uses: 2}\n";
        compile(
            &[Source {
                path: dir.join("g1.yaml"),
                text: text.into(),
                grant: true,
            }],
            &|_| None,
        )
        .unwrap()
    }

    #[test]
    fn counts_are_shared_by_reloads_and_kept_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let store = GrantStore::new(Some(dir.path().into()));
        let mut p1 = grant_policy(dir.path());
        store.share(&mut p1);
        let g1 = p1.exceptions[0].grant().unwrap();
        assert!(g1.take());
        let mut p2 = grant_policy(dir.path());
        store.share(&mut p2);
        let g2 = p2.exceptions[0].grant().unwrap();
        assert_eq!(g2.used(), 1, "a reload keeps the count");
        assert!(g2.take());
        assert!(!g1.take(), "both policies count in one counter");
        assert_eq!(read_uses(dir.path(), "g1"), 2);
        // A restart: a new store reads the count kept on disk.
        let store = GrantStore::new(Some(dir.path().into()));
        let mut p3 = grant_policy(dir.path());
        store.share(&mut p3);
        assert!(p3.exceptions[0].grant().unwrap().used_up());
    }
}
