//! The way out: resolve a name once through egressd's own resolver, check
//! every address against the policy, and connect only to a checked
//! `SocketAddr`. Nothing here hands a host name to `connect`: the plain-HTTP
//! pool ([`super::pool`]) and the connectors take `SocketAddr`s only, so a
//! code path cannot dial a name it forgot to resolve and check.
//!
//! [`Egress`] is how a checked address is reached: directly, or through a
//! corporate proxy (`--upstream-proxy`). Through the proxy egressd still
//! names the *checked address* (`CONNECT 151.101.0.223:443`,
//! `GET http://151.101.0.223/…` with `Host: pypi.org`), so the proxy cannot
//! be steered to an address egressd did not check.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::dest::Dest;
use super::respond::Stop;
use super::ProxyCtx;
use crate::dns::{ResolveError, Resolver, TunnelOutcome};
use crate::policy::host::Target;
use crate::policy::{enforced, ClientIdx, Exception, Policy, Reason};
use crate::record::{Attempts, Event, UpstreamFailure};

/// Longest wait for one TCP connect to a destination (or the upstream proxy).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the upstream proxy's answer to a CONNECT.
pub const PROXY_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response head accepted from the upstream proxy.
const MAX_PROXY_HEAD: usize = 16 << 10;
/// Idle pooled connections to origins are closed after this.
pub const POOL_IDLE: Duration = Duration::from_secs(30);
/// Idle pooled connections kept per origin address. The pool must hold as
/// many as requests recently ran at once to one address, or steady load
/// above the bound opens and closes an origin connection for each request
/// past it (at 64, 128 kept-alive clients to one origin did, and paid for
/// the connects in CPU per request). Every idle connection was in use by a client
/// request less than [`POOL_IDLE`] ago, so client connections bound them;
/// this bounds one address's share, at the default per-client share.
pub const POOL_MAX_IDLE_PER_ADDR: usize = 1024;

/// A corporate proxy egressd itself must leave through.
#[derive(Debug)]
pub struct UpstreamProxy {
    pub addrs: Vec<SocketAddr>,
    /// `Basic …` for Proxy-Authorization; never logged.
    pub auth: Option<HeaderValue>,
    /// `host:port` as configured, for messages.
    pub display: String,
}

impl UpstreamProxy {
    /// Parses `http://[user:password@]host:port`. Credentials may come from
    /// the URL (best passed as `EGRESSD_UPSTREAM_PROXY`, not on a command
    /// line) or from `auth_file` (`user:password`, one line). The proxy's
    /// host is the operator's configuration, resolved once here by the system
    /// resolver: it is not a destination the policy decides.
    pub fn parse(url: &str, auth_file: Option<&std::path::Path>) -> Result<UpstreamProxy, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or("--upstream-proxy must be an http:// URL (http://host:port)")?;
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') {
            return Err("--upstream-proxy takes no path".into());
        }
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, rest),
        };
        let userinfo = match auth_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?
                    .trim_end_matches(['\n', '\r'])
                    .to_string(),
            ),
            None => userinfo.map(|u| percent_decode(&u)),
        };
        let auth = match userinfo {
            Some(u) if !u.is_empty() => {
                let mut v =
                    HeaderValue::from_str(&format!("Basic {}", base64_encode(u.as_bytes())))
                        .map_err(|_| {
                            "upstream proxy credentials are not valid in a header".to_string()
                        })?;
                v.set_sensitive(true);
                Some(v)
            }
            _ => None,
        };
        let with_port = if hostport
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hostport.to_string()
        } else {
            format!("{hostport}:3128")
        };
        let addrs: Vec<SocketAddr> = with_port
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve upstream proxy {with_port}: {e}"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("upstream proxy {with_port} has no address"));
        }
        Ok(UpstreamProxy {
            addrs,
            auth,
            display: with_port,
        })
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn base64_encode(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How egressd reaches a checked address.
#[derive(Clone, Debug)]
pub enum Egress {
    Direct,
    Proxy(Arc<UpstreamProxy>),
}

impl Egress {
    /// A TCP stream to the first checked address that answers: directly, or
    /// as a CONNECT tunnel through the upstream proxy. Returns the address.
    pub async fn connect_first(&self, addrs: &[SocketAddr]) -> io::Result<(TcpStream, SocketAddr)> {
        match self {
            Egress::Direct => connect_first(addrs).await,
            Egress::Proxy(p) => {
                let mut last = io::Error::other("no address to connect to");
                for a in addrs {
                    match proxy_connect(p, *a).await {
                        Ok(s) => return Ok((s, *a)),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }

    /// The connection a plain-HTTP request to the checked address `addr`
    /// goes on: to `addr` itself, or to the upstream proxy, which then gets
    /// the request in absolute form (naming `addr`).
    pub async fn connect_http(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        match self {
            Egress::Direct => Ok(connect_first(&[addr]).await?.0),
            Egress::Proxy(p) => Ok(connect_first(&p.addrs)
                .await
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("upstream proxy {}: {e}", p.display))
                })?
                .0),
        }
    }

    /// Proxy-Authorization for plain-HTTP requests sent to the upstream proxy.
    pub fn proxy_auth(&self) -> Option<&HeaderValue> {
        match self {
            Egress::Proxy(p) => p.auth.as_ref(),
            Egress::Direct => None,
        }
    }
}

/// `CONNECT addr` through the upstream proxy; the stream is the tunnel.
async fn proxy_connect(p: &UpstreamProxy, addr: SocketAddr) -> io::Result<TcpStream> {
    let (mut s, _) = connect_first(&p.addrs)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("upstream proxy {}: {e}", p.display)))?;
    let mut head = format!("CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n");
    if let Some(a) = &p.auth {
        head.push_str("Proxy-Authorization: ");
        head.push_str(a.to_str().unwrap_or_default());
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let handshake = async {
        s.write_all(head.as_bytes()).await?;
        // Read byte by byte up to the blank line: nothing of the tunnel's
        // own bytes may be consumed here.
        let mut buf = Vec::with_capacity(256);
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if buf.len() >= MAX_PROXY_HEAD {
                return Err(io::Error::other(
                    "upstream proxy sent an oversized response head",
                ));
            }
            if s.read(&mut byte).await? == 0 {
                return Err(io::Error::other("upstream proxy closed during CONNECT"));
            }
            buf.push(byte[0]);
        }
        let line = String::from_utf8_lossy(&buf);
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .unwrap_or(0);
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "upstream proxy {} refused CONNECT {addr}: {}",
                p.display,
                line.lines().next().unwrap_or("").trim()
            )))
        }
    };
    match tokio::time::timeout(PROXY_HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(())) => Ok(s),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "upstream proxy {} did not answer CONNECT in time",
                p.display
            ),
        )),
    }
}

#[cfg(test)]
mod proxy_url_tests {
    use super::*;

    #[test]
    fn parses_upstream_proxy_urls() {
        let p = UpstreamProxy::parse("http://alice:s%40cret@127.0.0.1:8080", None).unwrap();
        assert_eq!(p.addrs, vec!["127.0.0.1:8080".parse().unwrap()]);
        // "alice:s@cret"
        assert_eq!(p.auth.unwrap().to_str().unwrap(), "Basic YWxpY2U6c0BjcmV0");
        let p = UpstreamProxy::parse("http://127.0.0.1", None).unwrap();
        assert_eq!(p.addrs[0].port(), 3128);
        assert!(p.auth.is_none());
        assert!(UpstreamProxy::parse("https://127.0.0.1:1", None).is_err());
        assert!(UpstreamProxy::parse("http://127.0.0.1:1/path", None).is_err());
        assert_eq!(base64_encode(b"ab"), "YWI=");
        assert_eq!(base64_encode(b"abc"), "YWJj");
        assert_eq!(base64_encode(b"a"), "YQ==");
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

/// A destination to check, for whom and by which exception's leave, when.
#[derive(Clone, Copy)]
pub struct Reach<'a> {
    pub dest: &'a Dest,
    /// The exception that allowed it (its `addresses:` widen the check).
    pub exception: Option<&'a Exception>,
    pub client: Option<ClientIdx>,
    pub now: i64,
}

/// Where egressd looks a destination up and what it must never dial.
pub struct Lookup<'a> {
    pub resolver: &'a Resolver,
    /// egressd's own listeners: a request to one is a loop.
    pub own: &'a [SocketAddr],
    /// The request's source address, whose tunnel budget a name spends
    /// when `reach` names no client.
    pub src: IpAddr,
    /// Failed upstream DNS exchanges, noted for the request's line.
    pub attempts: &'a mut Attempts,
}

/// Resolves (if needed) and checks a destination (`reach`). IP literals
/// are checked as they are; names are resolved once, through the cache,
/// after the tunnel budget (the named client's, else the source
/// address's) has had its say.
pub async fn resolve_checked(
    policy: &Policy,
    reach: Reach<'_>,
    lookup: Lookup<'_>,
) -> Result<Checked, Refusal> {
    let Reach {
        dest,
        exception,
        client,
        now,
    } = reach;
    let (target, port) = (&dest.target, dest.port);
    let Lookup {
        resolver,
        own,
        src,
        attempts,
    } = lookup;
    // The guards answer to the one rule for report mode, as the
    // resolver's do (`policy::enforced`).
    let mode = policy.settings.mode;
    let mut notes = Vec::new();
    let ips: Vec<IpAddr> = match target {
        Target::Ip(ip) => vec![*ip],
        Target::Name(host) => {
            if let Some(exc) = exception {
                let (outcome, why) = resolver.tunnel_assess(policy, client, src, host, exc, now);
                if outcome == TunnelOutcome::Block {
                    if enforced(mode, Reason::DnsTunnel) {
                        return Err(Refusal::Policy(Reason::DnsTunnel, why));
                    }
                    notes.extend(why);
                }
            }
            resolver
                .lookup_ip_for(host, policy, attempts)
                .await
                .map_err(Refusal::Resolve)?
        }
    };
    let Sorted {
        mut ok,
        refused,
        looped,
        others,
    } = sort_addrs(policy, exception, own, &ips, port);
    let list = || {
        let l: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
        l.join(",")
    };
    if !refused.is_empty() {
        if enforced(mode, Reason::PrivateAddress) {
            notes.push(format!("refused non-public {}", list()));
        } else {
            notes.push(format!("would refuse non-public {}", list()));
            ok.extend(refused.iter().copied());
        }
    }
    if ok.is_empty() {
        if looped {
            let note = (!others.is_empty()).then(|| {
                let l: Vec<String> = others.iter().map(|a| a.to_string()).collect();
                format!("another egressd listens at {} on this host", l.join(","))
            });
            return Err(Refusal::Policy(Reason::LoopDetected, note));
        }
        return Err(Refusal::Policy(Reason::PrivateAddress, notes.pop()));
    }
    // IPv4 first: many sandboxes and hosts have no IPv6 route, and a v6
    // failure costs a connect timeout.
    ok.sort_by_key(|a| a.is_ipv6());
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok(Checked { addrs: ok, note })
}

/// A destination's addresses sorted by what may be dialled.
struct Sorted {
    ok: Vec<SocketAddr>,
    /// Non-public addresses no exception's `cidrs` open.
    refused: Vec<SocketAddr>,
    /// One was egressd's own listener, or another egressd's.
    looped: bool,
    /// Those that were another egressd's (`proxy::listeners`).
    others: Vec<SocketAddr>,
}

/// Sorts `ips` at `port`. An egressd listener, this one's or another's on
/// the host, is never dialled, whatever the policy opens and in report
/// mode too: it comes before the policy's address check.
fn sort_addrs(
    policy: &Policy,
    exception: Option<&Exception>,
    own: &[SocketAddr],
    ips: &[IpAddr],
    port: u16,
) -> Sorted {
    let mut s = Sorted {
        ok: Vec::with_capacity(ips.len()),
        refused: Vec::new(),
        looped: false,
        others: Vec::new(),
    };
    for &ip in ips {
        let sa = SocketAddr::new(ip, port);
        if is_own_listener(sa, own) {
            s.looped = true;
        } else if super::listeners::another_egressd(sa) {
            s.looped = true;
            s.others.push(sa);
        } else if policy.addr_allowed(exception, ip) {
            s.ok.push(sa);
        } else {
            s.refused.push(sa);
        }
    }
    s
}

/// [`resolve_checked`] for one request through the proxy: the refused
/// addresses noted in `ev`, failed DNS exchanges charged to it, a refusal
/// turned into the [`Stop`] that ends the request.
pub(crate) async fn check_destination(
    ctx: &ProxyCtx,
    policy: &Policy,
    reach: Reach<'_>,
    ev: &mut Event,
) -> Result<Vec<SocketAddr>, Stop> {
    let lookup = Lookup {
        resolver: &ctx.resolver,
        own: &ctx.own_addrs,
        src: ev.src.ip(),
        attempts: &mut ev.dns_attempts,
    };
    let found = resolve_checked(policy, reach, lookup).await;
    match found {
        Ok(c) => {
            ev.add_note(c.note);
            Ok(c.addrs)
        }
        Err(Refusal::Policy(reason, note)) => {
            ev.add_note(note);
            Err(Stop::Deny(reason, None))
        }
        Err(Refusal::Resolve(e)) => Err(Stop::Unreachable {
            kind: UpstreamFailure::Resolve,
            message: e.to_string(),
            timeout: false,
        }),
    }
}

/// A connection to the first of `addrs` (checked addresses) that answers,
/// the one reached noted in `ev`.
pub(crate) async fn connect_checked(
    ctx: &ProxyCtx,
    addrs: &[SocketAddr],
    ev: &mut Event,
) -> Result<TcpStream, Stop> {
    let (conn, addr) = ctx
        .egress
        .connect_first(addrs)
        .await
        .map_err(|e| Stop::Unreachable {
            kind: UpstreamFailure::Connect,
            timeout: e.kind() == io::ErrorKind::TimedOut,
            message: e.to_string(),
        })?;
    ev.addr = Some(addr);
    Ok(conn)
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
