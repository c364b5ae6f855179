//! Hot reload: watch → load → swap, keeping the last good policy. The
//! serving policy lives in a [`PolicyHandle`] (an atomic pointer swap:
//! readers take a snapshot without locking and keep it for the whole request
//! or tunnel). The watcher re-reads on file events and SIGHUP, compiles
//! through the same `compile` as the first load, and swaps only a valid
//! policy; an invalid one is reported and the last good one serves on.
//! The compile is handed the serving policy, so that files unchanged since
//! it was compiled are not parsed again; SIGHUP compiles from scratch.
//!
//! The reloader runs on its own OS thread at the idle scheduling class
//! ([`Reloader::spawn`], [`priority`]): parsing and compiling a large policy
//! takes hundreds of milliseconds of CPU, and on a proxy confined to one CPU
//! any of it spent at normal priority is taken from requests. The policy it
//! replaces is freed on that thread too (see [`Retired`]), never by the
//! request that happens to release the last reference.
//!
//! Owns the watcher, its threads and the reload counters. Does not own
//! compiling (`policy::compile`) or the pointer readers load (`PolicyHandle`).

pub mod grants;
pub mod priority;
mod retired;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::policy::{self, PolicyHandle};
use crate::shutdown::Shutdown;
use priority::{current_tid, lower_this_thread, Busy, Pace, ThreadClass, DEADLINE_CHECK};
pub use retired::Retired;
use retired::RETIRE_WAIT;

/// Events within this window are handled as one reload.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// Fallback scan of file metadata, for events a watcher can miss (network
/// filesystems, some symlink swaps). Keeps reloads within the 2 s promise.
const POLL_EVERY: Duration = Duration::from_millis(1000);

/// Hands the pages this thread's heap no longer uses back to the system
/// (mimalloc's `mi_collect`, forced). Compiling 100k exceptions allocates
/// and frees hundreds of thousands of small blocks (the files, the raw
/// form), and freeing a replaced policy is as many again; without this the
/// resident size after a load stays at its peak during the compile. Called
/// by the thread that compiled or freed: once the first policy is in place,
/// before serving, and on the reloader thread after each reload and each
/// freed retired policy. It collects only the calling thread's heap, so the
/// threads serving requests are not held up (glibc's `malloc_trim`, used
/// before, locked every arena while it walked them: 26–31 ms stalls when
/// run after reloads under load).
pub fn release_freed_memory() {
    // SAFETY: mi_collect only returns free pages of the allocator's own
    // heap to the system; no pointer the program holds is affected.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

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
    retired: Retired,
    pace: Option<Arc<Pace>>,
    /// The policy files' metadata taken before the serving policy was read.
    loaded: Option<Stamp>,
    /// `egressd run`: each new policy serves this client only.
    only_client: Option<Arc<str>>,
    /// `--grants DIR`: grants read from there, not `<policy>/grants/`.
    grants: Option<PathBuf>,
    /// Grant use counts, shared by every policy this reloader swaps in.
    store: Arc<grants::GrantStore>,
}

/// The policy files' metadata (each file's name, size, mtime, inode): what
/// the reloader compares before it reads anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp(Vec<(PathBuf, u64, Option<SystemTime>, u64)>);

impl Stamp {
    /// The stamp of the policy at `path` now (relative paths made absolute,
    /// as the reloader sees them).
    pub fn of(path: &Path) -> Stamp {
        Stamp(fingerprint(
            &std::path::absolute(path).unwrap_or(path.into()),
        ))
    }
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
            retired: Retired::default(),
            pace: None,
            loaded: None,
            only_client: None,
            grants: None,
            store: Arc::default(),
        }
    }

    /// Every policy loaded serves `client` only (`Policy::serve_only`).
    pub fn serving_only(mut self, client: Option<Arc<str>>) -> Reloader {
        self.only_client = client;
        self
    }

    /// Reads grants from `grants` (`--grants DIR`; `None`: the policy
    /// directory's `grants/`) and counts their uses in `store`.
    pub fn with_grants(
        mut self,
        grants: Option<PathBuf>,
        store: Arc<grants::GrantStore>,
    ) -> Reloader {
        self.grants = grants.map(|g| std::path::absolute(&g).unwrap_or(g));
        self.store = store;
        self
    }

    /// The policy's and the grants' files' metadata.
    fn fingerprint(&self) -> Vec<(PathBuf, u64, Option<SystemTime>, u64)> {
        let mut f = fingerprint(&self.path);
        if let Some(g) = &self.grants {
            f.extend(fingerprint(g));
        }
        f
    }

    /// Tells the reloader the stamp of the files as they were just before
    /// the serving policy was read: if they are unchanged when it starts,
    /// it does not read and digest them all again (for 100k exceptions,
    /// 13 MB read while the proxy starts serving).
    pub fn loaded_from(mut self, stamp: Stamp) -> Reloader {
        self.loaded = Some(stamp);
        self
    }

    /// Policies replaced and not yet freed (still held by requests).
    pub fn retired(&mut self) -> &mut Retired {
        &mut self.retired
    }

    /// Runs the reloader on its own thread, `egressd-reload`, lowered to
    /// the idle class, with a small runtime of its own for the watcher,
    /// the poll and the debounce timers.
    /// A second, normally sleeping thread raises a reload that is still
    /// running after `priority::ESCALATE_AFTER` to normal priority.
    pub fn spawn(
        mut self,
        sighup: mpsc::UnboundedReceiver<()>,
        shutdown: Shutdown,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let pace = Arc::new(Pace::new());
        self.pace = Some(pace.clone());
        let (class_tx, class_rx) = std::sync::mpsc::channel();
        let watched = Arc::downgrade(&pace);
        drop(pace);
        let reloader = std::thread::Builder::new()
            .name("egressd-reload".into())
            .spawn(move || {
                let class = lower_this_thread();
                if let Some(p) = &self.pace {
                    p.tid
                        .store(current_tid(), std::sync::atomic::Ordering::Relaxed);
                }
                let _ = class_tx.send(class);
                match class {
                    ThreadClass::Idle => {}
                    ThreadClass::Nice19 => eprintln!(
                        "egressd: SCHED_IDLE refused for the policy reloader; it runs at nice 19"
                    ),
                    ThreadClass::Normal => eprintln!(
                        "egressd: cannot lower the policy reloader's priority; reloads compete with requests for CPU"
                    ),
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        eprintln!("egressd: policy reloader not started: {e}");
                        return;
                    }
                };
                rt.block_on(self.run(sighup, shutdown));
            })?;
        std::thread::Builder::new()
            .name("egressd-reload-deadline".into())
            .spawn(move || {
                let Ok(class) = class_rx.recv() else { return };
                let mut raised = false;
                loop {
                    std::thread::sleep(DEADLINE_CHECK);
                    // Ends with the reloader (the only strong holder).
                    let Some(p) = watched.upgrade() else { return };
                    p.check(&mut raised, class);
                }
            })?;
        Ok(reloader)
    }

    /// One reload: read, compare digests, compile, swap. On error the
    /// serving policy stays and the error is reported and counted.
    pub fn reload(&mut self, forced: bool) -> ReloadOutcome {
        let pace = self.pace.clone();
        let _busy = pace.as_deref().map(Busy::start);
        let t0 = Instant::now();
        let sources = match policy::read_sources_with(&self.path, self.grants.as_deref()) {
            Ok(s) => s,
            Err(e) => return self.failed(e.to_string(), None),
        };
        let digests = policy::digest_sources(&sources);
        let serving = self.handle.snapshot();
        if !forced && digests.policy == serving.digest {
            return ReloadOutcome::Unchanged;
        }
        if !forced && self.last_failed == Some(digests.policy) {
            return ReloadOutcome::Unchanged;
        }
        let t1 = Instant::now();
        // Files unchanged since the serving policy was compiled are copied
        // from it, not parsed again. SIGHUP compiles from scratch: how an
        // operator has everything read again, whatever the compile may copy.
        let previous = (!forced).then_some(&*serving);
        let compiled =
            policy::compile_digested(&sources, &digests, previous, &|n| std::env::var(n).ok());
        // Held no longer than the compile: the swap below retires it, and
        // a reference here would count as a request still using it.
        drop(serving);
        match compiled {
            Ok(mut p) => {
                drop(sources);
                if let Some(id) = &self.only_client {
                    p.serve_only(id);
                }
                self.store.share(&mut p);
                let n = p.exceptions.len();
                let (parsed, files) = (p.files_parsed(), p.files.len());
                let t2 = Instant::now();
                // The metrics count for the new policy before it serves,
                // so no hit under a new exception finds no series.
                let p = Arc::new(p);
                self.metrics.sync_policy(&p);
                let t3 = Instant::now();
                let old = self.handle.swap(p.clone());
                self.metrics.serving(&p);
                self.retired.push(old);
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                self.last_failed = None;
                let freed = self.retired.reap_within(RETIRE_WAIT);
                release_freed_memory();
                let t4 = Instant::now();
                let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
                eprintln!(
                    "egressd: policy reloaded from {} ({n} exceptions, {parsed} of {files} files re-parsed; read {:.1} ms, compile {:.1} ms, metrics {:.1} ms, retire {:.1} ms{})",
                    self.path.display(),
                    ms(t0, t1),
                    ms(t1, t2),
                    ms(t2, t3),
                    ms(t3, t4),
                    if freed == 0 { ", previous policy still in use" } else { "" },
                );
                ReloadOutcome::Swapped { exceptions: n }
            }
            Err(e) => self.failed(e.to_string(), Some(digests.policy)),
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
    /// metadata poll, until `shutdown` fires.
    pub async fn run(mut self, mut sighup: mpsc::UnboundedReceiver<()>, mut shutdown: Shutdown) {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        let mut watcher = watcher(self.path.clone(), self.grants.clone(), tx.clone());
        let mut watched: Vec<PathBuf> = Vec::new();
        let grants = self.grants.clone();
        let rewatch =
            |w: &mut Option<notify::RecommendedWatcher>,
             watched: &mut Vec<PathBuf>,
             path: &Path| { rewatch(w, watched, path, grants.as_deref()) };
        rewatch(&mut watcher, &mut watched, &self.path);
        let mut stamp = self.fingerprint();
        // A change made between the first load and this point raised no
        // event we saw and is already in `stamp`: compare digests once now,
        // unless the files are as they were before that load read them.
        if self.loaded.take().map(|s| s.0) != Some(stamp.clone()) {
            self.reload(false);
        }
        let mut poll = tokio::time::interval(POLL_EVERY);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = shutdown.fired() => return,
                Some(()) = rx.recv() => false,
                Some(()) = sighup.recv() => true,
                _ = poll.tick() => {
                    if self.retired.reap() > 0 {
                        release_freed_memory();
                    }
                    let now = self.fingerprint();
                    if now == stamp { continue; }
                    false
                }
            };
            // Let a burst of events (editor save, ConfigMap swap) settle.
            tokio::time::sleep(DEBOUNCE).await;
            while rx.try_recv().is_ok() {}
            stamp = self.fingerprint();
            let path = self.path.clone();
            let outcome = self.reload(forced);
            if !matches!(outcome, ReloadOutcome::Unchanged) {
                // The directory itself may have been replaced (a symlink swap).
                rewatch(&mut watcher, &mut watched, &path);
            }
        }
    }
}

/// A watcher of the policy path and the grants, whose relevant events
/// send on `tx` (`None`: no watcher; the poll still sees changes).
fn watcher(
    policy_path: PathBuf,
    grants_path: Option<PathBuf>,
    tx: mpsc::UnboundedSender<()>,
) -> Option<notify::RecommendedWatcher> {
    // The parent directory is watched for renames of the policy path
    // itself; everything else there (a decision log written beside the
    // policy, say) must not cost a re-read per event.
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
                ev.paths.is_empty()
                    || ev.paths.iter().any(|p| {
                        p.starts_with(&policy_path)
                            || grants_path.as_ref().is_some_and(|g| p.starts_with(g))
                    })
            }
            Err(_) => true,
        };
        if relevant {
            let _ = tx.send(());
        }
    });
    match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!(
                "egressd: file watcher unavailable ({e}); polling the policy every {POLL_EVERY:?}"
            );
            None
        }
    }
}

/// Watches `path`, its parent directory and the grants directory (none
/// recursively) instead of what `watched` held.
fn rewatch(
    w: &mut Option<notify::RecommendedWatcher>,
    watched: &mut Vec<PathBuf>,
    path: &Path,
    grants: Option<&Path>,
) {
    let Some(w) = w.as_mut() else { return };
    for p in watched.drain(..) {
        let _ = w.unwatch(&p);
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let own_grants = path.join(policy::GRANTS_DIR);
    let grants = grants.unwrap_or(&own_grants);
    for p in [parent, path, grants] {
        if p.is_dir() && w.watch(p, RecursiveMode::NonRecursive).is_ok() {
            watched.push(p.to_path_buf());
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
        // The grants directory's files: a grant edited in place changes
        // no metadata of the directory itself. Its hidden `.state/` (use
        // counts, written at every use) is not policy and is passed by.
        if let Ok(rd) = std::fs::read_dir(path.join(policy::GRANTS_DIR)) {
            for e in rd.flatten() {
                if !e.file_name().to_string_lossy().starts_with('.') {
                    add(e.path());
                }
            }
        }
    } else {
        add(path.to_path_buf());
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use retired::MAX_RETIRED;

    fn policy_text(host: &str) -> String {
        format!("exceptions:\n  - id: a\n    owner: t\n    reason: r\n    hosts: [{host}]\n")
    }

    fn setup() -> (tempfile::TempDir, Reloader, Arc<PolicyHandle>) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, policy_text("a.test")).unwrap();
        let handle = PolicyHandle::new(policy::load(&file).unwrap());
        let metrics = Metrics::new();
        let r = Reloader::new(file, handle.clone(), metrics);
        (dir, r, handle)
    }

    /// What lets the reloader skip its first read: the stamp `serve` takes
    /// by the path as typed equals the reloader's own (by its absolute
    /// path) while nothing changes, and differs after any replacement of
    /// the file, even one of the same size.
    #[test]
    fn a_stamp_changes_with_the_file_and_not_with_how_it_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, policy_text("a.test")).unwrap();
        let cwd = std::env::current_dir().unwrap();
        let relative: PathBuf = std::iter::repeat_n("..", cwd.components().count() - 1)
            .collect::<PathBuf>()
            .join(file.strip_prefix("/").unwrap());
        let before = Stamp::of(&relative);
        let handle = PolicyHandle::new(policy::load(&file).unwrap());
        let r = Reloader::new(relative.clone(), handle, Metrics::new());
        assert_eq!(
            Stamp(fingerprint(&r.path)),
            before,
            "{}",
            relative.display()
        );
        // Same length, new content, swapped in by rename (a new inode).
        let tmp = dir.path().join(".p.yaml.tmp");
        std::fs::write(&tmp, policy_text("b.test")).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        assert_ne!(Stamp(fingerprint(&r.path)), before);
    }

    #[test]
    fn a_policy_loaded_by_a_relative_path_is_not_reloaded_unchanged() {
        // `serve` loads `--policy policy/` as typed; the reloader watches
        // its absolute path. Nothing changed: nothing to reload.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.yaml"), policy_text("a.test")).unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let relative = std::path::Path::new("..").join("p.yaml");
        let absolute = dir.path().join("p.yaml");
        let via_relative = policy::read_sources(&sub.join(&relative)).unwrap();
        let via_absolute = policy::read_sources(&absolute).unwrap();
        assert_ne!(via_relative[0].path, via_absolute[0].path);
        assert_eq!(
            policy::digest_sources(&via_relative),
            policy::digest_sources(&via_absolute)
        );
        let handle = PolicyHandle::new(policy::load(&absolute).unwrap());
        let mut r = Reloader::new(absolute, handle, Metrics::new());
        assert!(matches!(r.reload(false), ReloadOutcome::Unchanged));
    }

    #[test]
    fn a_policy_still_held_by_a_request_is_freed_by_the_reloader_not_the_request() {
        let (dir, mut r, handle) = setup();
        let held = handle.snapshot(); // a request (or tunnel) in flight
        std::fs::write(dir.path().join("p.yaml"), policy_text("b.test")).unwrap();
        assert!(matches!(r.reload(false), ReloadOutcome::Swapped { .. }));
        assert_eq!(r.retired().len(), 1, "the reloader keeps the old policy");
        let weak = Arc::downgrade(&held);
        drop(held); // the request ends: it must not be the one that frees
        assert!(weak.upgrade().is_some(), "freed by the request's drop");
        assert_eq!(r.retired().reap(), 1);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn an_unheld_policy_is_freed_during_the_reload() {
        let (dir, mut r, handle) = setup();
        let weak = Arc::downgrade(&handle.snapshot());
        std::fs::write(dir.path().join("p.yaml"), policy_text("b.test")).unwrap();
        assert!(matches!(r.reload(false), ReloadOutcome::Swapped { .. }));
        assert!(r.retired().is_empty());
        assert!(weak.upgrade().is_none());
    }

    /// A reload parses only the files that changed (SIGHUP every one); an
    /// edit that breaks one file beside unchanged ones is still refused
    /// with its file:line:column and counted, and the old policy serves on.
    #[test]
    fn a_reload_parses_only_changed_files_and_still_reports_a_broken_one() {
        let dir = tempfile::tempdir().unwrap();
        let text = |id: &str, host: &str| {
            format!("exceptions:\n  - id: {id}\n    owner: t\n    reason: r\n    hosts: [{host}]\n")
        };
        for id in ["a", "b", "c"] {
            std::fs::write(
                dir.path().join(format!("{id}.yaml")),
                text(id, &format!("{id}.test")),
            )
            .unwrap();
        }
        let handle = PolicyHandle::new(policy::load(dir.path()).unwrap());
        let metrics = Metrics::new();
        let mut r = Reloader::new(dir.path().into(), handle.clone(), metrics.clone());
        let hosts = |id: &str| {
            let p = handle.snapshot();
            format!("{:?}", p.exception(id).unwrap().hosts)
        };

        std::fs::write(dir.path().join("b.yaml"), text("b", "b2.test")).unwrap();
        assert!(matches!(
            r.reload(false),
            ReloadOutcome::Swapped { exceptions: 3 }
        ));
        assert_eq!(handle.snapshot().files_parsed(), 1);
        assert!(hosts("b").contains("b2.test"), "{}", hosts("b"));

        std::fs::write(dir.path().join("c.yaml"), text("c", "c..test")).unwrap();
        match r.reload(false) {
            ReloadOutcome::Failed(msg) => {
                assert!(msg.contains("c.yaml:5:13: "), "{msg}");
                assert_eq!(msg.lines().count(), 1, "{msg}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(metrics.reloads.with_label_values(&["error"]).get(), 1);
        assert!(hosts("c").contains("c.test") && hosts("b").contains("b2.test"));

        std::fs::write(dir.path().join("c.yaml"), text("c", "c3.test")).unwrap();
        assert!(matches!(
            r.reload(true),
            ReloadOutcome::Swapped { exceptions: 3 }
        ));
        assert_eq!(
            handle.snapshot().files_parsed(),
            3,
            "SIGHUP parses everything"
        );
        assert!(hosts("c").contains("c3.test"));
        assert_eq!(metrics.reloads.with_label_values(&["ok"]).get(), 2);
    }

    #[test]
    fn retired_policies_are_bounded() {
        let (_dir, mut r, handle) = setup();
        let mut held = Vec::new();
        for i in 0..MAX_RETIRED + 3 {
            held.push(handle.snapshot());
            let p = policy::from_yaml(&policy_text(&format!("h{i}.test"))).unwrap();
            r.retired().push(handle.swap(p));
        }
        assert_eq!(r.retired().len(), MAX_RETIRED);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_reloader_thread_runs_at_the_idle_class() {
        let (_dir, r, _handle) = setup();
        let (_hup_tx, hup_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = Shutdown::new();
        let thread = r.spawn(hup_rx, stop_rx).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let policy = loop {
            let found = std::fs::read_dir("/proc/thread-self/..")
                .unwrap()
                .flatten()
                .find(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "egressd-reload")
                });
            if let Some(t) = found {
                let tid: libc::pid_t = t.file_name().to_string_lossy().parse().unwrap();
                // SAFETY: a query about a thread of this process.
                let p = unsafe { libc::sched_getscheduler(tid) };
                if p == libc::SCHED_IDLE || Instant::now() > deadline {
                    break p;
                }
            }
            assert!(Instant::now() < deadline, "no egressd-reload thread");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(policy, libc::SCHED_IDLE);
        stop.fire();
        thread.join().unwrap();
    }
}
