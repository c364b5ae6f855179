//! Policies a reload replaced, kept until no request holds them, so that
//! the reloader thread frees them and not a request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::policy::Policy;

/// How long a reload waits, right after a swap, for the requests that hold
/// the previous policy to finish, so that it is freed on the reloader thread.
pub(super) const RETIRE_WAIT: Duration = Duration::from_millis(250);
const RETIRE_STEP: Duration = Duration::from_millis(2);
/// Retired policies kept waiting for long-lived holders (tunnels keep the
/// policy they were decided with). Beyond this the oldest is let go: its
/// last holder frees it, a cost preferred over unbounded memory.
pub(super) const MAX_RETIRED: usize = 4;

/// Policies replaced by a reload, kept until the reloader holds the only
/// reference so that freeing them (100k exceptions are ~10^6 allocations,
/// tens of milliseconds) happens on the reloader thread, at idle priority,
/// and not on a runtime worker in the middle of serving requests.
#[derive(Default)]
pub struct Retired {
    held: Vec<Arc<Policy>>,
}

impl Retired {
    pub fn push(&mut self, p: Arc<Policy>) {
        self.held.push(p);
        if self.held.len() > MAX_RETIRED {
            self.held.remove(0);
        }
    }

    /// Frees every retired policy no request holds any more; returns how
    /// many were freed.
    pub fn reap(&mut self) -> usize {
        let before = self.held.len();
        self.held.retain(|p| Arc::strong_count(p) > 1);
        before - self.held.len()
    }

    /// `reap` until nothing is left or `limit` has passed.
    pub fn reap_within(&mut self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut freed = self.reap();
        while !self.held.is_empty() && Instant::now() < deadline {
            std::thread::sleep(RETIRE_STEP);
            freed += self.reap();
        }
        freed
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}
