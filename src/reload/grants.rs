//! Grant use counts that outlive a policy (and, in memory, the `upload:`
//! budgets' ledgers, by exception id): one counter per grant id,
//! handed to every policy that holds the grant ([`GrantStore::share`]), and
//! kept on disk beside the grant (`<grants>/.state/<id>.uses`, written
//! atomically at each use) so a restart of egressd starts where it stopped.
//! Each use is taken under an exclusive `flock` of `<id>.lock` beside it,
//! from the count on disk: egressd replicas sharing one grants directory
//! (a shared volume) count each grant together, exactly, and a replica
//! that dies leaves its count to the others. A grants directory egressd
//! cannot write (a ConfigMap) keeps counts in memory, and says so once.
//!
//! Owns the counters and their files. Does not own taking a use (the
//! compare-and-swap is `policy::grant::Grant::take`) or the grant files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::policy::grant::{GrantUses, UseSink};
use crate::policy::upload::UploadLedger;
use crate::policy::Policy;

/// The directory, inside the grants directory, that holds use counts.
/// Hidden, so the policy reader and the watcher pass it by.
pub const STATE_DIR: &str = ".state";

/// Where grant `id`'s use count is kept.
pub fn state_file(grants: &Path, id: &str) -> PathBuf {
    grants.join(STATE_DIR).join(format!("{id}.uses"))
}

/// The file whose `flock` guards grant `id`'s count (not the count's own
/// file: that is replaced by a rename at each use).
pub fn lock_file(grants: &Path, id: &str) -> PathBuf {
    grants.join(STATE_DIR).join(format!("{id}.lock"))
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
    /// Whether `dir/.state/` can be written, found once, when the first
    /// grant is served (a policy without grants never makes the directory).
    writable: std::sync::OnceLock<bool>,
    /// The `upload:` ledgers, by exception id: in memory only (a restart
    /// starts every budget afresh).
    uploads: Mutex<HashMap<Arc<str>, Arc<UploadLedger>>>,
}

impl GrantStore {
    pub fn new(dir: Option<PathBuf>) -> Arc<GrantStore> {
        Arc::new(GrantStore {
            dir,
            counters: Mutex::default(),
            writable: std::sync::OnceLock::new(),
            uploads: Mutex::default(),
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
        drop(counters);
        // Upload budgets likewise, by exception id: a reload that keeps
        // the exception keeps what its clients have sent.
        let mut uploads = self.uploads.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept: HashMap<Arc<str>, Arc<UploadLedger>> = HashMap::new();
        policy.share_upload_ledgers(|e| {
            let ledger = uploads
                .get(&e.id)
                .cloned()
                .or_else(|| e.upload().map(|u| u.ledger().clone()))?;
            kept.insert(e.id.clone(), ledger.clone());
            Some(ledger)
        });
        *uploads = kept;
    }

    fn counter(&self, id: &str) -> GrantUses {
        match &self.dir {
            Some(dir) if self.writable(dir) => GrantUses::new(
                read_uses(dir, id),
                Some(Box::new(FileSink {
                    path: state_file(dir, id),
                    lock: lock_file(dir, id),
                })),
            ),
            // Read-only: what an earlier run kept still counts.
            Some(dir) => GrantUses::new(read_uses(dir, id), None),
            None => GrantUses::new(0, None),
        }
    }

    /// Whether grant counts can be kept in `dir`: `.state/` made if
    /// missing, and a file created and removed in it. Said on stderr once
    /// when they cannot.
    fn writable(&self, dir: &Path) -> bool {
        *self.writable.get_or_init(|| {
            let state = dir.join(STATE_DIR);
            let probe = state.join(format!(".probe.{}", std::process::id()));
            let r = std::fs::create_dir_all(&state)
                .and_then(|()| std::fs::File::create(&probe).map(drop))
                .and_then(|()| std::fs::remove_file(&probe));
            if let Err(e) = &r {
                eprintln!(
                    "egressd: the grants directory {} is read-only ({e}): grant use counts are kept in memory only, per process, and start again from the kept count at a restart",
                    dir.display()
                );
            }
            r.is_ok()
        })
    }
}

/// Keeps a grant's count in its state file, under a lock on its lock file
/// that every egressd sharing the directory takes: the count is read, the
/// use taken and the new count written (a temporary file renamed over the
/// old, so a reader sees the old count or the new, never half) while the
/// lock is held.
#[derive(Debug)]
struct FileSink {
    path: PathBuf,
    lock: PathBuf,
}

impl UseSink for FileSink {
    fn take(&self, mine: u32, max: Option<u32>) -> Result<u32, u32> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock)
            .and_then(|f| {
                use std::os::fd::AsRawFd;
                // SAFETY: flock on a descriptor this function owns; the
                // lock is released when `f` is closed.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(f)
            });
        if let Err(e) = &lock {
            eprintln!(
                "egressd: cannot lock a grant's use count {}: {e} (counted in this process only)",
                self.lock.display()
            );
        }
        let kept = std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        let cur = kept.max(mine);
        if max.is_some_and(|m| cur >= m) {
            return Err(cur);
        }
        if let Err(e) = write_atomic(&self.path, format!("{}\n", cur + 1).as_bytes()) {
            eprintln!(
                "egressd: cannot keep a grant's use count in {}: {e}",
                self.path.display()
            );
        }
        drop(lock);
        Ok(cur + 1)
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

    /// Two egressd processes sharing one grants directory (two stores, as
    /// each process has its own): the uses are counted together, exactly,
    /// under racing takers, and one that stops leaves its count to the other.
    #[test]
    fn replicas_sharing_a_grants_directory_count_together_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            GrantStore::new(Some(dir.path().into())),
            GrantStore::new(Some(dir.path().into())),
        );
        let (mut pa, mut pb) = (grant_policy(dir.path()), grant_policy(dir.path()));
        a.share(&mut pa);
        b.share(&mut pb);
        let (ga, gb) = (
            pa.exceptions[0].grant().unwrap(),
            pb.exceptions[0].grant().unwrap(),
        );
        let taken: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let g = if i % 2 == 0 { ga } else { gb };
                    s.spawn(move || g.take() as u32)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(taken, 2, "max_uses 2 across both");
        assert_eq!(read_uses(dir.path(), "g1"), 2);
        assert!(ga.used_up() && gb.used_up());

        // One use taken by A only; B has not seen it in memory, and takes
        // the last from the count on disk.
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            GrantStore::new(Some(dir.path().into())),
            GrantStore::new(Some(dir.path().into())),
        );
        let (mut pa, mut pb) = (grant_policy(dir.path()), grant_policy(dir.path()));
        a.share(&mut pa);
        b.share(&mut pb);
        assert!(pa.exceptions[0].grant().unwrap().take());
        drop((a, pa));
        let gb = pb.exceptions[0].grant().unwrap();
        assert_eq!(gb.used(), 0);
        assert!(gb.take());
        assert_eq!(gb.used(), 2);
        assert!(!gb.take());
    }
}
