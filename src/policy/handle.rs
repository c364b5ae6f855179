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
    pub fn new(p: Policy) -> Arc<PolicyHandle> {
        Arc::new(PolicyHandle {
            current: ArcSwap::from_pointee(p),
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
    pub fn swap(&self, p: Policy) -> Arc<Policy> {
        self.current.swap(Arc::new(p))
    }
}
