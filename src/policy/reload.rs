//! Hot reload: the serving policy lives in a [`PolicyHandle`] (an atomic
//! pointer swap: readers take a snapshot without locking and keep it for the
//! whole request or tunnel). The watcher re-reads on file events and SIGHUP,
//! compiles through the same `compile` as the first load, and swaps only a
//! valid policy; an invalid one is reported and the last good one serves on.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Policy;

/// The serving policy. `snapshot()` never blocks.
pub struct PolicyHandle {
    current: ArcSwap<Policy>,
}

impl PolicyHandle {
    pub fn new(p: Policy) -> Arc<PolicyHandle> {
        Arc::new(PolicyHandle {
            current: ArcSwap::from_pointee(p),
        })
    }

    /// The policy to decide one request (or one whole tunnel) with.
    pub fn snapshot(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    pub fn swap(&self, p: Policy) {
        self.current.store(Arc::new(p));
    }
}

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;

/// Events within this window are handled as one reload.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// Fallback scan of file metadata, for events a watcher can miss (network
/// filesystems, some symlink swaps). Keeps reloads within the 2 s promise.
const POLL_EVERY: Duration = Duration::from_millis(1000);

/// Outcome of one reload attempt.
#[derive(Debug)]
pub enum ReloadOutcome {
    Unchanged,
    Swapped { exceptions: usize },
    Failed(String),
}

/// Re-reads the policy path and swaps in a valid, changed policy.
pub struct Reloader {
    path: PathBuf,
    handle: Arc<PolicyHandle>,
    metrics: Arc<Metrics>,
    last_failed: Option<[u8; 32]>,
}

impl Reloader {
    pub fn new(path: PathBuf, handle: Arc<PolicyHandle>, metrics: Arc<Metrics>) -> Reloader {
        // Absolute, so watcher events (absolute paths) can be compared with it.
        let path = std::path::absolute(&path).unwrap_or(path);
        Reloader {
            path,
            handle,
            metrics,
            last_failed: None,
        }
    }

    /// One reload: read, compare digests, compile, swap. On error the
    /// serving policy stays and the error is reported and counted.
    pub fn reload(&mut self, forced: bool) -> ReloadOutcome {
        let sources = match super::read_sources(&self.path) {
            Ok(s) => s,
            Err(e) => return self.failed(e.to_string(), None),
        };
        let digest = super::digest_sources(&sources);
        if !forced && digest == self.handle.snapshot().digest {
            return ReloadOutcome::Unchanged;
        }
        if !forced && self.last_failed == Some(digest) {
            return ReloadOutcome::Unchanged;
        }
        match super::compile(&sources, &|n| std::env::var(n).ok()) {
            Ok(p) => {
                let n = p.exceptions.len();
                self.metrics.sync_policy(&p);
                self.handle.swap(p);
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                self.last_failed = None;
                eprintln!(
                    "egressd: policy reloaded from {} ({n} exceptions)",
                    self.path.display()
                );
                ReloadOutcome::Swapped { exceptions: n }
            }
            Err(e) => self.failed(e.to_string(), Some(digest)),
        }
    }

    fn failed(&mut self, msg: String, digest: Option<[u8; 32]>) -> ReloadOutcome {
        self.metrics.reloads.with_label_values(&["error"]).inc();
        self.last_failed = digest;
        eprintln!("egressd: policy reload rejected; the previous policy keeps serving:\n{msg}");
        ReloadOutcome::Failed(msg)
    }

    /// Watches the policy (and its parent directory, for renames and
    /// symlink swaps) and reloads on change, on `sighup` messages, and on the
    /// metadata poll, until `shutdown` flips.
    pub async fn run(
        mut self,
        mut sighup: mpsc::UnboundedReceiver<()>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        let tx2 = tx.clone();
        // The parent directory is watched for renames of the policy path
        // itself; everything else there (a decision log written beside the
        // policy, say) must not cost a re-read per event.
        let policy_path = self.path.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            use notify::event::{AccessKind, AccessMode, EventKind};
            let relevant = match &res {
                // inotify reports opens and read-only closes too: our own
                // re-read of the policy would trigger the next one, forever
                // (a read and SHA-256 of the whole policy every DEBOUNCE).
                Ok(ev)
                    if matches!(
                        ev.kind,
                        EventKind::Access(
                            AccessKind::Open(_)
                                | AccessKind::Read
                                | AccessKind::Close(AccessMode::Read)
                        )
                    ) =>
                {
                    false
                }
                Ok(ev) => {
                    ev.paths.is_empty() || ev.paths.iter().any(|p| p.starts_with(&policy_path))
                }
                Err(_) => true,
            };
            if relevant {
                let _ = tx2.send(());
            }
        });
        let mut watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("egressd: file watcher unavailable ({e}); polling the policy every {POLL_EVERY:?}");
                None
            }
        };
        let mut watched: Vec<PathBuf> = Vec::new();
        let rewatch = |w: &mut Option<notify::RecommendedWatcher>,
                       watched: &mut Vec<PathBuf>,
                       path: &Path| {
            let Some(w) = w.as_mut() else { return };
            for p in watched.drain(..) {
                let _ = w.unwatch(&p);
            }
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            for p in [parent, path] {
                if p.is_dir() && w.watch(p, RecursiveMode::NonRecursive).is_ok() {
                    watched.push(p.to_path_buf());
                }
            }
        };
        rewatch(&mut watcher, &mut watched, &self.path);
        let mut stamp = fingerprint(&self.path);
        // A change made between the first load and this point raised no
        // event we saw and is already in `stamp`: compare digests once now.
        {
            let this = &mut self;
            tokio::task::block_in_place(|| this.reload(false));
        }
        let mut poll = tokio::time::interval(POLL_EVERY);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = rx.recv() => false,
                Some(()) = sighup.recv() => true,
                _ = poll.tick() => {
                    let now = fingerprint(&self.path);
                    if now == stamp { continue; }
                    false
                }
            };
            // Let a burst of events (editor save, ConfigMap swap) settle.
            tokio::time::sleep(DEBOUNCE).await;
            while rx.try_recv().is_ok() {}
            stamp = fingerprint(&self.path);
            let path = self.path.clone();
            let this = &mut self;
            let outcome = tokio::task::block_in_place(|| this.reload(forced));
            if !matches!(outcome, ReloadOutcome::Unchanged) {
                // The directory itself may have been replaced (a symlink swap).
                rewatch(&mut watcher, &mut watched, &path);
            }
        }
    }
}

/// Cheap metadata fingerprint of the policy path (each file's name, size,
/// mtime, inode), following symlinks.
fn fingerprint(path: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut add = |p: PathBuf| {
        if let Ok(m) = std::fs::metadata(&p) {
            out.push((p, m.len(), m.modified().ok(), m.ino()));
        }
    };
    if path.is_dir() {
        if let Ok(rd) = std::fs::read_dir(path) {
            for e in rd.flatten() {
                add(e.path());
            }
        }
    } else {
        add(path.to_path_buf());
    }
    out.sort();
    out
}
