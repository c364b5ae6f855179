//! The reloader thread's scheduling class: lowered to `SCHED_IDLE` (or nice
//! 19) so that compiling a policy takes no CPU from requests, and raised to
//! normal priority by a deadline thread when a reload runs too long.
//!
//! Owns the system calls on thread priorities (every `unsafe` here has its
//! `// SAFETY:`). Does not own the reload itself (`reload`).

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The scheduling class the reloader thread got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadClass {
    /// `SCHED_IDLE`: runs only when no normal thread wants the CPU.
    Idle,
    /// `SCHED_IDLE` was refused: nice 19 instead.
    Nice19,
    /// Both were refused; normal priority.
    Normal,
}

/// Lowers the calling thread (not the process) to `SCHED_IDLE`, or to nice
/// 19 if that is refused (seccomp profiles, some container runtimes).
pub fn lower_this_thread() -> ThreadClass {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread (pid 0 / its tid)
        // with a valid, initialised sched_param.
        unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 {
                return ThreadClass::Idle;
            }
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            if libc::setpriority(libc::PRIO_PROCESS, tid, 19) == 0 {
                return ThreadClass::Nice19;
            }
        }
    }
    ThreadClass::Normal
}

/// A reload still running after this long is raised from the idle class to
/// normal priority until it ends: on a CPU that requests keep saturated an
/// idle-class thread gets almost nothing (compiles of 6 s were seen in the
/// load benchmark), and the promise that a change takes effect within 2 s
/// outranks some latency on an already overloaded proxy.
pub(super) const ESCALATE_AFTER: Duration = Duration::from_millis(600);
pub(super) const DEADLINE_CHECK: Duration = Duration::from_millis(100);

/// What the deadline thread knows of the reloader thread.
pub(super) struct Pace {
    pub(super) tid: AtomicI32,
    /// Milliseconds since `epoch` at which the running reload started, plus
    /// one; 0 while no reload runs.
    busy_since: AtomicU64,
    epoch: Instant,
}

impl Pace {
    pub(super) fn new() -> Pace {
        Pace {
            tid: AtomicI32::new(0),
            busy_since: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// One look by the deadline thread: raise an overdue reload, lower the
    /// thread again once the reload is done.
    pub(super) fn check(&self, raised: &mut bool, lowered_to: ThreadClass) {
        let tid = self.tid.load(Ordering::Relaxed);
        if tid == 0 || lowered_to == ThreadClass::Normal {
            return;
        }
        let since = self.busy_since.load(Ordering::Relaxed);
        let overdue =
            since != 0 && self.now_ms().saturating_sub(since) >= ESCALATE_AFTER.as_millis() as u64;
        if overdue && !*raised {
            *raised = set_thread_class(tid, ThreadClass::Normal);
        } else if since == 0 && *raised {
            *raised = !set_thread_class(tid, lowered_to);
        }
    }
}

/// Marks a reload as running for as long as it lives.
pub(super) struct Busy<'a>(&'a Pace);
impl<'a> Busy<'a> {
    pub(super) fn start(p: &'a Pace) -> Busy<'a> {
        p.busy_since.store(p.now_ms(), Ordering::Relaxed);
        Busy(p)
    }
}
impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy_since.store(0, Ordering::Relaxed);
    }
}

/// Sets another thread of this process (by tid) to `class`; whether it took.
fn set_thread_class(tid: i32, class: ThreadClass) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on a thread of this process, with a valid
        // sched_param.
        unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            return match class {
                ThreadClass::Idle => libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) == 0,
                ThreadClass::Nice19 | ThreadClass::Normal => {
                    let nice = if class == ThreadClass::Nice19 { 19 } else { 0 };
                    libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) == 0
                        && libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0
                }
            };
        }
    }
    #[allow(unreachable_code)]
    {
        let _ = (tid, class);
        false
    }
}

pub(super) fn current_tid() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions.
        return unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    }
    #[allow(unreachable_code)]
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An overdue reload is raised to normal priority, and lowered back
    /// once it is done. Raising a thread needs CAP_SYS_NICE: skipped without.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_overdue_reload_is_raised_and_lowered_again() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: raising a thread's priority needs root");
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            assert_eq!(lower_this_thread(), ThreadClass::Idle);
            tx.send(current_tid()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        // SAFETY: queries about a thread of this process.
        let class = || unsafe { libc::sched_getscheduler(tid) };
        let pace = Pace::new();
        pace.tid.store(tid, Ordering::Relaxed);
        let mut raised = false;
        {
            let _busy = Busy::start(&pace);
            pace.check(&mut raised, ThreadClass::Idle);
            assert_eq!(class(), libc::SCHED_IDLE, "raised before the deadline");
            std::thread::sleep(ESCALATE_AFTER + Duration::from_millis(20));
            pace.check(&mut raised, ThreadClass::Idle);
            assert!(raised);
            assert_eq!(class(), libc::SCHED_OTHER);
        }
        pace.check(&mut raised, ThreadClass::Idle);
        assert!(!raised);
        assert_eq!(class(), libc::SCHED_IDLE);
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
