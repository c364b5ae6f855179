//! What resolving can fail with: shared by the resolver and the failures
//! it remembers (`failures`), below both.

/// Why a name could not be resolved: always upstream's fault or absence,
/// never a policy decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// No upstream answered within our deadline.
    #[error("upstream DNS timed out")]
    Timeout,
    /// Upstreams failed (SERVFAIL, REFUSED, unreachable, garbage).
    #[error("upstream DNS failed: {0}")]
    Upstream(String),
    /// The name does not exist or has no A/AAAA records (NXDOMAIN, NODATA).
    #[error("the name has no addresses")]
    NoAddresses,
    /// This (name, type) failed a moment ago, and the failure is held
    /// (`failures`, RFC 9520): the upstreams were not asked this time. The
    /// seconds until they are asked again.
    #[error("{0}; failure remembered, upstreams asked again in {1} s")]
    Remembered(Box<ResolveError>, u64),
}
