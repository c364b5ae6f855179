//! The serving policy: an atomic pointer that readers load without a lock
//! and keep for a whole request or tunnel, and that a reload swaps.
//!
//! Owns only the pointer. Does not own reading, compiling or watching files
//! (`reload`), nor when an old policy is freed (`reload::Retired`).

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Policy;

/// The serving policy. `snapshot()` never blocks.
pub struct PolicyHandle {
    current: ArcSwap<Policy>,
}

impl PolicyHandle {
    /// A policy, or one already shared (with the metrics' exception
    /// table, which labels its series from it).
    pub fn new(p: impl Into<Arc<Policy>>) -> Arc<PolicyHandle> {
        Arc::new(PolicyHandle {
            current: ArcSwap::new(p.into()),
        })
    }

    /// The policy to decide one request (or one whole tunnel) with.
    pub fn snapshot(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Serves `p` from now on and hands back the policy it replaces. Every
    /// reader that loaded the old one before the swap is counted in the
    /// returned `Arc` (arc-swap pays its debts in `swap`), so a strong count
    /// of 1 means no request holds it any more.
    pub fn swap(&self, p: impl Into<Arc<Policy>>) -> Arc<Policy> {
        self.current.swap(p.into())
    }
}
