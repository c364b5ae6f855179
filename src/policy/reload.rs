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
