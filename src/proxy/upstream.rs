//! The way out: resolve a name once through egressd's own resolver, check
//! every address against the policy, and connect only to a checked
//! `SocketAddr`. Nothing here hands a host name to `connect`; the HTTP client
//! is built with a resolver that refuses every name, so a code path that
//! forgot to resolve-and-check fails instead of dialling.

use std::future::Ready;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpStream;

use crate::decision::Reason;
use crate::dns::{ResolveError, Resolver, TunnelOutcome};
use crate::policy::host::Target;
use crate::policy::{ClientIdx, Exception, Policy};

/// Longest wait for one TCP connect to a destination.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections to origins are closed after this.
pub const POOL_IDLE: Duration = Duration::from_secs(30);
/// Idle pooled connections kept per origin address.
pub const POOL_MAX_IDLE_PER_ADDR: usize = 64;

/// The pooled HTTP/1 client for plain-HTTP forwarding. Its pool is keyed by
/// the checked `IP:port` the request URI carries, never by a name.
pub type HttpClient = Client<HttpConnector<RefuseNames>, super::forward::Counted<Incoming>>;

pub fn http_client() -> HttpClient {
    let mut conn = HttpConnector::new_with_resolver(RefuseNames);
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(CONNECT_TIMEOUT));
    conn.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_ADDR)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .set_host(false)
        .build(conn)
}

/// A resolver for hyper's connector that resolves nothing: every URI we hand
/// the client carries an already checked IP literal.
#[derive(Clone, Copy, Debug)]
pub struct RefuseNames;

impl tower_service::Service<Name> for RefuseNames {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Ready<Result<Self::Response, io::Error>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, name: Name) -> Self::Future {
        std::future::ready(Err(io::Error::other(format!(
            "refusing to resolve {name}: upstream connections take checked addresses only"
        ))))
    }
}

/// Why no address could be used.
#[derive(Debug)]
pub enum Refusal {
    /// A policy reason (private_address, loop_detected, dns_tunnel).
    Policy(Reason, Option<String>),
    /// Resolution failed (not a policy decision).
    Resolve(ResolveError),
}

/// Addresses that passed the checks, preferred order first, plus a note
/// naming the ones refused (for the log line).
#[derive(Debug)]
pub struct Checked {
    pub addrs: Vec<SocketAddr>,
    pub note: Option<String>,
}

/// Resolves (if needed) and checks a destination allowed by `exception`.
/// IP literals are checked as they are; names are resolved once, through the
/// cache, after the tunnel budget has had its say.
#[allow(clippy::too_many_arguments)]
pub async fn resolve_checked(
    policy: &Policy,
    resolver: &Resolver,
    exception: Option<&Exception>,
    client: Option<ClientIdx>,
    target: &Target,
    port: u16,
    own: &[SocketAddr],
    now: i64,
) -> Result<Checked, Refusal> {
    let ips: Vec<IpAddr> = match target {
        Target::Ip(ip) => vec![*ip],
        Target::Name(host) => {
            if let Some(exc) = exception {
                let (outcome, why) = resolver.tunnel_assess(policy, client, host, exc, now);
                if outcome == TunnelOutcome::Block {
                    return Err(Refusal::Policy(Reason::DnsTunnel, why));
                }
            }
            resolver
                .lookup_ip(host, policy)
                .await
                .map_err(Refusal::Resolve)?
        }
    };
    let mut ok = Vec::with_capacity(ips.len());
    let mut refused = Vec::new();
    let mut looped = false;
    for ip in ips {
        let sa = SocketAddr::new(ip, port);
        if is_own_listener(sa, own) {
            looped = true;
        } else if policy.addr_allowed(exception, ip) {
            ok.push(sa);
        } else {
            refused.push(ip.to_string());
        }
    }
    if ok.is_empty() {
        if looped {
            return Err(Refusal::Policy(Reason::LoopDetected, None));
        }
        return Err(Refusal::Policy(
            Reason::PrivateAddress,
            Some(format!("refused non-public {}", refused.join(","))),
        ));
    }
    // IPv4 first: many sandboxes and hosts have no IPv6 route, and a v6
    // failure costs a connect timeout.
    ok.sort_by_key(|a| a.is_ipv6());
    let note = (!refused.is_empty()).then(|| format!("refused non-public {}", refused.join(",")));
    Ok(Checked { addrs: ok, note })
}

/// Whether `dest` is one of egressd's own listeners (a request looping back
/// into the proxy, the resolver or the metrics endpoint).
pub fn is_own_listener(dest: SocketAddr, own: &[SocketAddr]) -> bool {
    let dip = crate::policy::canonical_ip(dest.ip());
    own.iter().any(|l| {
        l.port() == dest.port()
            && (crate::policy::canonical_ip(l.ip()) == dip
                || (l.ip().is_unspecified() && (dip.is_loopback() || dip.is_unspecified()))
                || dip.is_unspecified())
    })
}

/// Connects to the first checked address that answers.
pub async fn connect_first(addrs: &[SocketAddr]) -> io::Result<(TcpStream, SocketAddr)> {
    let mut last = io::Error::other("no address to connect to");
    for a in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, *a));
            }
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = io::Error::new(io::ErrorKind::TimedOut, format!("connect to {a} timed out"))
            }
        }
    }
    Err(last)
}
