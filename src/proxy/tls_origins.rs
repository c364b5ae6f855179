//! HTTPS to origins, for the requests inside intercepted tunnels: one
//! hyper client per origin name and its checked addresses, verifying the
//! origin's certificate against the system roots and `--upstream-ca`, its
//! connector dialling only those checked addresses (never the name).
//!
//! Owns the origin-side TLS configs and the clients' LRU. Does not own the
//! client-facing TLS (`mitm`) or what a request is sent (`exchange`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

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
pub type OutBody = http_body_util::combinators::BoxBody<bytes::Bytes, hyper::Error>;

/// An HTTPS client bound to one origin name and its checked addresses.
#[derive(Clone)]
pub struct TlsClient(Client<TlsConnect, OutBody>);

impl TlsClient {
    /// Sends `req`, whose URI is absolute and names the origin as its
    /// `Host` would. The authority travels once: on an HTTP/1.1 connection
    /// hyper writes `Host` from the URI, and HTTP/2 carries it only as
    /// `:authority` — a `Host` beside it is a duplicate that origins such
    /// as nginx answer with 400.
    pub fn request(&self, mut req: Request<OutBody>) -> ResponseFuture {
        req.headers_mut().remove(http::header::HOST);
        self.0.request(req)
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct OriginKey {
    target: Target,
    port: u16,
    addrs: Vec<SocketAddr>,
    h1_only: bool,
}

/// The HTTPS clients of every origin reached from inside a tunnel.
pub(crate) struct TlsOrigins {
    /// Offers h2 and http/1.1 to origins.
    tls: Arc<ClientConfig>,
    /// http/1.1 only, for requests that upgrade (WebSocket over h2 would
    /// need RFC 8441, which origins rarely speak).
    tls_h1: Arc<ClientConfig>,
    clients: Mutex<Lru<OriginKey, TlsClient>>,
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
        let key = OriginKey {
            target: dest.target.clone(),
            port: dest.port,
            addrs: addrs.to_vec(),
            h1_only,
        };
        let mut clients = self.clients.lock().expect("clients lock");
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
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
        let client = TlsClient(client);
        clients.insert(key, client.clone());
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
