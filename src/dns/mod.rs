//! DNS: the resolver front-end (`server`), the upstream client and cache
//! (`forward`) that the HTTP proxy also resolves through, and the tunnel
//! detector (`tunnel`). hickory types never leave this module.
//!
//! CONTRACT used by the proxy (src/proxy/upstream.rs) — keep these signatures:
//!
//! ```ignore
//! pub struct Resolver;                       // shared, Arc'd, cheap to call concurrently
//! impl Resolver {
//!     pub fn new(upstreams: Vec<SocketAddr>, metrics: Arc<Metrics>) -> Arc<Resolver>;
//!     /// A + AAAA for a name, through the cache; never reads /etc/hosts, never
//!     /// applies search domains. Bounded by our own timeout.
//!     pub async fn lookup_ip(&self, host: &Host, policy: &Policy) -> Result<Vec<IpAddr>, ResolveError>;
//!     /// Tunnel budget for a name some exception allowed (proxy lookups and
//!     /// client queries share one budget per client).
//!     pub fn tunnel_check(&self, policy: &Policy, client: Option<ClientIdx>, host: &Host,
//!                         exception: &Exception, now: i64) -> TunnelOutcome;
//! }
//! ```
