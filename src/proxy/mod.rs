//! The HTTP proxy: each front-end turns its input into one
//! `policy::Request`, asks `Policy::decide` once, and records exactly one
//! `Event` per request through the one responder.
//!
//! ```text
//!  accept ─► admit ─► forward (absolute form) ─┐
//!   (accept.rs) │     tunnel (CONNECT) ─► mitm ─┼─► exchange: decide → route → reach → answer
//!               │     transparent (captured) ──┘              │        │
//!               │                           gate (a gated registry):   │
//!               │                           Route, own index fetches ──┤
//!               │                                                      ▼
//!               │                  origin (the one upstream path) ─► pool / tls_origins
//!               │                  upstream (resolve → check → connect) beneath
//!               └─ dest (host:port), sni (ClientHello), respond (answers + lines),
//!                  relay (bytes both ways, meters), upload (`upload:` budgets
//!                  charged on bodies and relays) below them all
//! ```
//!
//! In front of hyper on the proxy port sits `fast`: allowed, bodiless,
//! plainly framed GET/HEAD requests are served there on the same steps
//! (admit, decide, upstream), and the connection goes on to hyper, with
//! the bytes it read put back (`rewind`), at the first request it does not
//! take.
//!
//! The modules form a one-way graph (a test checks it): an edge front-end
//! may use the shared steps below it, never the other way round; this file
//! holds only the context they share.

mod accept;
mod admit;
mod body_rules;
pub(crate) mod chunks;
pub mod dest;
mod exchange;
#[doc(hidden)]
pub mod fast;
pub mod forward;
pub mod listeners;

pub(crate) mod gate;
pub(crate) mod held;
mod matched;
pub mod mitm;
mod origin;
pub mod pool;
pub(crate) mod relay;
pub mod respond;
pub(crate) mod rewind;
pub(crate) mod scrub;
pub mod sni;
pub(crate) mod streams;
mod tls_origins;
pub mod transparent;
pub mod tunnel;
mod upload;
pub mod upstream;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::dns::Resolver;
use crate::policy::PolicyHandle;
use crate::record::Recorder;
use crate::shutdown::Permits;
pub use accept::serve;
pub use admit::proxy_token;
pub use fast::RawPool;
pub use origin::RESPONSE_TIMEOUT;
pub use relay::IDLE_TIMEOUT;

/// Client connections served at once (every listener together, tunnels
/// and upgrades included); further clients wait in the backlog.
pub const MAX_CONNECTIONS: u32 = 16_384;
/// Longest wait for a complete request head by default
/// (`settings.limits.header_timeout`, see [`ProxyCtx::header_timeout`]).
pub const HEADER_READ_TIMEOUT: Duration =
    Duration::from_secs(crate::policy::DEFAULT_HEADER_TIMEOUT_SECS);
/// Largest request head accepted (hyper answers 431 beyond it).
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// What every proxy task shares.
pub struct ProxyCtx {
    pub policy: Arc<PolicyHandle>,
    pub recorder: Recorder,
    pub resolver: Arc<Resolver>,
    /// egressd's own listening addresses: never a destination.
    pub own_addrs: Vec<SocketAddr>,
    pub http: Arc<pool::OriginPool>,
    /// Pipes for spliced tunnels, lent only while data flows.
    pub(crate) pipes: Arc<relay::pipe::PipePool>,
    /// Directly, or through `--upstream-proxy`.
    pub egress: upstream::Egress,
    /// TLS interception (`--ca-dir`); `None`: CONNECTs are only tunnelled.
    pub mitm: Option<Arc<mitm::Interceptor>>,
    /// One per open client connection, [`MAX_CONNECTIONS`] in all: the
    /// bound, and what a drain waits for.
    pub connections: Permits,
    /// The package gate's views of registry indexes (short-lived cache).
    pub(crate) package_views: gate::Views,
    /// Registry index documents kept while the registry says they are
    /// fresh.
    pub(crate) index_cache: gate::index_cache::IndexCache,
    /// Origin connections of the forward proxy's fast path, per checked
    /// address.
    pub(crate) raw_origins: Arc<fast::RawPool>,
}

impl ProxyCtx {
    /// Longest wait for a complete request head, as the policy says now
    /// (`settings.limits.header_timeout`): on the proxy port, on capture
    /// listeners and inside inspected tunnels alike.
    pub(crate) fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.policy.snapshot().settings.limits.header_timeout_secs)
    }

    /// How long a client may keep its window shut on a stream
    /// (`settings.limits.stall_timeout`).
    pub(crate) fn stall_timeout(&self) -> Duration {
        Duration::from_secs(self.policy.snapshot().settings.limits.stall_timeout_secs)
    }

    /// The HTTPS clients requests inside intercepted tunnels reach their
    /// origins through (`None` without `--ca-dir`).
    pub(crate) fn tls_origins(&self) -> Option<&tls_origins::TlsOrigins> {
        self.mitm.as_deref().map(|m| &m.origins)
    }
}
