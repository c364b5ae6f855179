//! HTTPS to origins, for the requests inside intercepted tunnels: one
//! hyper client per origin name and its checked addresses, verifying the
//! origin's certificate against the system roots and `--upstream-ca`, its
//! connector dialling only those checked addresses (never the name).
//!
//! Owns the origin-side TLS configs and the clients' LRU. Does not own the
//! client-facing TLS (`mitm`) or what a request is sent (`exchange`).

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use super::dest::Dest;
use super::upstream::{Egress, POOL_IDLE, POOL_MAX_IDLE_PER_ADDR};
use crate::policy::host::Target;
use crate::tls::lru::Lru;
use crate::tls::{roots, TlsError};

/// Longest TLS handshake with an origin (after the TCP connect).
pub const UPSTREAM_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Origins (name + checked addresses) with a live upstream client; the
/// least recently used is dropped, and its idle connections with it.
pub const MAX_ORIGINS: usize = 256;

/// The address an upstream connection was made to, found in the response's
/// extensions (for the log line).
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAddr(pub SocketAddr);

/// What an HTTPS request to an origin carries: a client's body (counted)
/// or egressd's own empty one (an index the package gate reads).
pub type OutBody = http_body_util::combinators::BoxBody<bytes::Bytes, super::held::BodyError>;

/// An HTTPS client bound to one origin name and its checked addresses.
/// Cloning it is one reference count (a request takes one from the map).
#[derive(Clone)]
pub struct TlsClient(Arc<Bound>);

struct Bound {
    client: Client<TlsConnect, OutBody>,
    /// `name` or `name:port` (off 443), parsed once: the authority of
    /// every request URI this client sends.
    authority: Authority,
}

impl TlsClient {
    /// The absolute URI of a request for `pq` on this client's origin,
    /// made from parts parsed once (no string built and parsed again per
    /// request). `pq` is the client's origin form; an empty path is `/`.
    pub fn uri(&self, pq: Option<&PathAndQuery>) -> Uri {
        let pq = match pq {
            Some(p) if !p.path().is_empty() => p.clone(),
            Some(p) => match p.query() {
                Some(q) => PathAndQuery::try_from(format!("/?{q}"))
                    .unwrap_or_else(|_| PathAndQuery::from_static("/")),
                None => PathAndQuery::from_static("/"),
            },
            None => PathAndQuery::from_static("/"),
        };
        Uri::from_parts({
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(Scheme::HTTPS);
            parts.authority = Some(self.0.authority.clone());
            parts.path_and_query = Some(pq);
            parts
        })
        .expect("scheme, authority and path make an absolute URI")
    }

    /// Sends `req`, whose URI is absolute and names the origin as its
    /// `Host` would. The authority travels once: on an HTTP/1.1 connection
    /// hyper writes `Host` from the URI, and HTTP/2 carries it only as
    /// `:authority` — a `Host` beside it is a duplicate that origins such
    /// as nginx answer with 400.
    pub fn request(&self, mut req: Request<OutBody>) -> ResponseFuture {
        req.headers_mut().remove(http::header::HOST);
        self.0.client.request(req)
    }
}

/// What a client is bound to. The map is keyed by this key's hash
/// ([`origin_hash`], taken from borrowed parts, so a request for an origin
/// already served allocates nothing to find its client); entries sharing a
/// hash are told apart by the whole key.
struct OriginKey {
    target: Target,
    port: u16,
    addrs: Box<[SocketAddr]>,
    h1_only: bool,
}

impl OriginKey {
    fn is(&self, target: &Target, port: u16, addrs: &[SocketAddr], h1_only: bool) -> bool {
        self.port == port
            && self.h1_only == h1_only
            && *self.addrs == *addrs
            && self.target == *target
    }
}

/// The map key of (target, port, addrs, h1_only): std's randomly keyed
/// SipHash, so names a client picks cannot be made to share a hash on
/// purpose (and if two ever do, [`OriginKey::is`] tells them apart).
fn origin_hash(
    keys: &RandomState,
    target: &Target,
    port: u16,
    addrs: &[SocketAddr],
    h1_only: bool,
) -> u64 {
    keys.hash_one((target, port, addrs, h1_only))
}

/// The HTTPS clients of every origin reached from inside a tunnel.
pub(crate) struct TlsOrigins {
    /// Offers h2 and http/1.1 to origins.
    tls: Arc<ClientConfig>,
    /// http/1.1 only, for requests that upgrade (WebSocket over h2 would
    /// need RFC 8441, which origins rarely speak).
    tls_h1: Arc<ClientConfig>,
    clients: Mutex<Lru<u64, Vec<(OriginKey, TlsClient)>>>,
    /// The keys of [`origin_hash`].
    keys: RandomState,
    /// Directly, or through `--upstream-proxy`.
    egress: Egress,
}

impl TlsOrigins {
    /// Trusts the system roots and `upstream_ca`.
    pub(crate) fn new(upstream_ca: Option<&Path>, egress: Egress) -> Result<TlsOrigins, TlsError> {
        let roots = Arc::new(roots::upstream_roots(upstream_ca)?);
        Ok(TlsOrigins {
            tls: roots::client_config(roots.clone(), &[b"h2", b"http/1.1"])?,
            tls_h1: roots::client_config(roots, &[b"http/1.1"])?,
            clients: Mutex::new(Lru::new(MAX_ORIGINS)),
            keys: RandomState::new(),
            egress,
        })
    }

    /// The pooled client for `dest` at these checked addresses.
    pub(crate) fn client(
        &self,
        dest: &Dest,
        addrs: &[SocketAddr],
        h1_only: bool,
    ) -> Result<TlsClient, String> {
        let hash = origin_hash(&self.keys, &dest.target, dest.port, addrs, h1_only);
        let mut clients = self.clients.lock().expect("clients lock");
        if let Some(found) = clients.get(&hash).and_then(|same| {
            same.iter()
                .find(|(k, _)| k.is(&dest.target, dest.port, addrs, h1_only))
        }) {
            return Ok(found.1.clone());
        }
        let authority = if dest.port == 443 {
            dest.target.to_string()
        } else {
            format!("{}:{}", dest.target, dest.port)
        };
        let authority = Authority::try_from(authority)
            .map_err(|e| format!("{} is not a URI authority: {e}", dest.target))?;
        let name = match &dest.target {
            Target::Name(h) => ServerName::try_from(h.as_str().to_string())
                .map_err(|e| format!("{h} is not a name TLS can verify: {e}"))?,
            Target::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        let connector = TlsConnect {
            config: if h1_only { &self.tls_h1 } else { &self.tls }.clone(),
            name,
            addrs: addrs.into(),
            egress: self.egress.clone(),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_ADDR)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .set_host(true)
            .build(connector);
        let client = TlsClient(Arc::new(Bound { client, authority }));
        let key = OriginKey {
            target: dest.target.clone(),
            port: dest.port,
            addrs: addrs.into(),
            h1_only,
        };
        let mut same = clients.remove(&hash).unwrap_or_default();
        same.push((key, client.clone()));
        clients.insert(hash, same);
        Ok(client)
    }
}

/// hyper's connector for one origin: dials the checked addresses in order
/// (never a name) and verifies the origin's certificate for `name`.
#[derive(Clone)]
pub struct TlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    addrs: Arc<[SocketAddr]>,
    egress: Egress,
}

impl tower_service::Service<Uri> for TlsConnect {
    type Response = TlsConn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsConn>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (tcp, addr) = this.egress.connect_first(&this.addrs).await?;
            let connector = tokio_rustls::TlsConnector::from(this.config);
            let tls = tokio::time::timeout(
                UPSTREAM_HANDSHAKE_TIMEOUT,
                connector.connect(this.name, tcp),
            )
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("TLS handshake with {addr} timed out"),
                )
            })??;
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            Ok(TlsConn {
                io: TokioIo::new(tls),
                addr,
                h2,
            })
        })
    }
}

/// A verified TLS connection to an origin.
pub struct TlsConn {
    io: TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    addr: SocketAddr,
    h2: bool,
}

impl Connection for TlsConn {
    fn connected(&self) -> Connected {
        let c = Connected::new().extra(UpstreamAddr(self.addr));
        if self.h2 {
            c.negotiated_h2()
        } else {
            c
        }
    }
}

impl hyper::rt::Read for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::dest::parse_authority;

    #[test]
    fn one_client_per_name_addresses_and_alpn_and_its_uris() {
        let origins = TlsOrigins::new(None, Egress::Direct).unwrap();
        let a: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:8443".parse().unwrap();
        let dest = parse_authority("origin.test:8443", Some(443)).unwrap();
        let c = origins.client(&dest, &[a], false).unwrap();
        let same = origins.client(&dest, &[a], false).unwrap();
        assert!(
            Arc::ptr_eq(&c.0, &same.0),
            "a second request finds the same client"
        );
        for (addrs, h1) in [(&[b][..], false), (&[a, b][..], false), (&[a][..], true)] {
            let other = origins.client(&dest, addrs, h1).unwrap();
            assert!(
                !Arc::ptr_eq(&c.0, &other.0),
                "{addrs:?} h1_only={h1} is another origin"
            );
        }
        let other_name = parse_authority("other.test:8443", Some(443)).unwrap();
        assert!(!Arc::ptr_eq(
            &c.0,
            &origins.client(&other_name, &[a], false).unwrap().0
        ));
        let pq = |s: &'static str| PathAndQuery::from_static(s);
        assert_eq!(
            c.uri(Some(&pq("/a/b?x=1"))),
            "https://origin.test:8443/a/b?x=1"
        );
        assert_eq!(c.uri(Some(&pq("?x=1"))), "https://origin.test:8443/?x=1");
        assert_eq!(c.uri(None), "https://origin.test:8443/");
        let on_443 = parse_authority("origin.test", Some(443)).unwrap();
        let d = origins.client(&on_443, &[a], false).unwrap();
        assert_eq!(d.uri(Some(&pq("/"))), "https://origin.test/");
    }
}
