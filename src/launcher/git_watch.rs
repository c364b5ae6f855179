//! Two names in `.git` point the host's git somewhere else: `commondir`
//! (the repository's common directory, its `config` included) and
//! `config.worktree` (read when the config enables it). When they exist
//! before the run they are mounted read-only inside; a name that does not
//! exist cannot be mounted over, and `.git` itself must stay writable (git
//! writes its locks there). So while the box runs, the launcher watches
//! `.git` from outside and moves such a file aside the moment it appears,
//! and sweeps once more when the box has ended: a planted `commondir`
//! leading to a `core.fsmonitor` never meets the host's next git command.
//!
//! Owns the watch and the quarantine. Does not own the read-only mounts
//! (`plan`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use notify::{RecursiveMode, Watcher};

/// The names the box may not create in `.git`.
pub const REDIRECTS: [&str; 2] = ["commondir", "config.worktree"];

/// The watch on one `.git` directory, for the names absent at the start.
pub struct GitWatch {
    git: PathBuf,
    absent: Vec<&'static str>,
    moved: Arc<Mutex<Vec<PathBuf>>>,
    n: Arc<AtomicU32>,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl GitWatch {
    /// Starts watching `git` (the host's `.git`). `Err` when the watch
    /// cannot be set up: the run must not start unwatched.
    pub fn start(git: &Path) -> Result<GitWatch, String> {
        let absent: Vec<&'static str> = REDIRECTS
            .into_iter()
            .filter(|n| std::fs::symlink_metadata(git.join(n)).is_err())
            .collect();
        let mut w = GitWatch {
            git: git.to_path_buf(),
            absent,
            moved: Arc::default(),
            n: Arc::default(),
            _watcher: None,
        };
        if w.absent.is_empty() {
            return Ok(w);
        }
        let (dir, names, moved, n) = (
            w.git.clone(),
            w.absent.clone(),
            w.moved.clone(),
            w.n.clone(),
        );
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // Any event (or an error, such as a queue overflow) is a
            // reason to look: the check is two lstat calls.
            let _ = res;
            sweep_into(&dir, &names, &moved, &n);
        })
        .map_err(|e| format!("cannot watch {}: {e}", git.display()))?;
        watcher
            .watch(git, RecursiveMode::NonRecursive)
            .map_err(|e| format!("cannot watch {}: {e}", git.display()))?;
        w._watcher = Some(watcher);
        // Created between the lstat above and the watch.
        w.sweep();
        Ok(w)
    }

    /// Moves aside what the box created; the paths moved so far.
    pub fn sweep(&self) -> Vec<PathBuf> {
        sweep_into(&self.git, &self.absent, &self.moved, &self.n);
        self.moved.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn sweep_into(git: &Path, names: &[&str], moved: &Mutex<Vec<PathBuf>>, n: &AtomicU32) {
    for name in names {
        let p = git.join(name);
        if std::fs::symlink_metadata(&p).is_err() {
            continue;
        }
        let aside = git.join(format!(
            "{name}.egressd-quarantined-{}-{}",
            std::process::id(),
            n.fetch_add(1, Ordering::Relaxed) + 1
        ));
        match std::fs::rename(&p, &aside) {
            Ok(()) => {
                eprintln!(
                    "egressd run: the sandbox created {}, which would point the host's git at \
                     configuration of its choosing; moved to {}",
                    p.display(),
                    aside.display()
                );
                moved.lock().unwrap_or_else(|p| p.into_inner()).push(aside);
            }
            Err(e) => eprintln!(
                "egressd run: the sandbox created {} and it could not be moved aside ({e}): \
                 remove it before running git here",
                p.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_created_after_the_start_is_moved_aside_and_one_there_before_is_not() {
        let d = tempfile::tempdir().unwrap();
        let git = d.path();
        std::fs::write(git.join("config.worktree"), "[core]\n").unwrap();
        let w = GitWatch::start(git).unwrap();
        assert_eq!(w.absent, ["commondir"]);
        std::fs::write(git.join("commondir"), "/elsewhere\n").unwrap();
        let moved = w.sweep();
        assert_eq!(moved.len(), 1);
        assert!(!git.join("commondir").exists());
        assert_eq!(std::fs::read_to_string(&moved[0]).unwrap(), "/elsewhere\n");
        assert!(git.join("config.worktree").exists());
    }
}
