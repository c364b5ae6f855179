//! Intercepted CONNECT tunnels. For exceptions that restrict methods or
//! paths or inject credentials, egressd terminates the client's TLS with a
//! leaf minted for the CONNECT host, serves HTTP/1.1 or HTTP/2 (ALPN) inside,
//! and decides every request on its own (`proto: tls`) before forwarding it
//! to the origin over TLS verified against the system roots and
//! `--upstream-ca`.
//!
//! Inside a tunnel the CONNECT host is the only destination: a ClientHello
//! naming another host closes the tunnel (`sni_mismatch`), and a request
//! whose `Host` or `:authority` names another gets `403 host_mismatch`
//! (no domain fronting). The CONNECT gets its own `connect` line when the
//! tunnel closes; each request inside gets one `tls` line.
//!
//! This module owns the client-facing TLS and the HTTPS upstream clients;
//! the decision and forwarding are `forward::decide_and_forward`, shared
//! with plain HTTP.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::dest::{check_host_headers, parse_authority, Dest};
use super::forward::{self, truncate_path, Counted, Denier, Inbound, Scheme};
use super::respond::ProxyBody;
use super::sni::Hello;
use super::tunnel::{Metered, SniRule, IDLE_TIMEOUT};
use super::upstream::{Egress, POOL_IDLE, POOL_MAX_IDLE_PER_ADDR};
use super::{ProxyCtx, HEADER_READ_TIMEOUT, MAX_HEADER_BYTES};
use crate::policy::host::Target;
use crate::policy::path::normalize_path;
use crate::policy::{Proto, Reason};
use crate::record::Event;
use crate::tls::lru::Lru;
use crate::tls::{roots, CertAuthority, LeafCache, TlsError};

/// Longest wait for the client's ClientHello, and again for the rest of its
/// handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest TLS handshake with an origin (after the TCP connect).
pub const UPSTREAM_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 streams one client may have open in one tunnel.
pub const MAX_STREAMS: u32 = 128;
/// How long an idle intercepted tunnel gets to close gracefully.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// Origins (name + checked addresses) with a live upstream client; the
/// least recently used is dropped, and its idle connections with it.
pub const MAX_ORIGINS: usize = 256;

/// What a tunnel's requests are checked against.
pub(crate) struct Tunnel {
    pub peer: SocketAddr,
    /// The CONNECT's Proxy-Authorization token: requests inside carry none,
    /// and are identified again with it on the policy they are decided by.
    pub token: Option<Vec<u8>>,
    pub dest: Dest,
    pub sni: SniRule,
}

/// The address an upstream connection was made to, found in the response's
/// extensions (for the log line).
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAddr(pub SocketAddr);

/// An HTTPS client bound to one origin name and its checked addresses.
pub type TlsClient = Client<TlsConnect, Counted<Incoming>>;

#[derive(Clone, PartialEq, Eq, Hash)]
struct OriginKey {
    target: Target,
    port: u16,
    addrs: Vec<SocketAddr>,
    h1_only: bool,
}

/// Everything interception needs: the CA's leaves for the client side,
/// TLS configs and pooled clients for the origin side.
pub struct Interceptor {
    pub leaves: LeafCache,
    /// Offers h2 and http/1.1 to origins.
    tls: Arc<ClientConfig>,
    /// http/1.1 only, for requests that upgrade (WebSocket over h2 would
    /// need RFC 8441, which origins rarely speak).
    tls_h1: Arc<ClientConfig>,
    clients: Mutex<Lru<OriginKey, TlsClient>>,
    /// Directly, or through `--upstream-proxy`.
    egress: Egress,
}

impl Interceptor {
    /// Loads the CA from `ca_dir` and the origin trust store. Returns
    /// warnings for the operator beside it.
    pub fn new(
        ca_dir: &Path,
        upstream_ca: Option<&Path>,
        egress: Egress,
    ) -> Result<(Interceptor, Vec<String>), TlsError> {
        let (ca, warnings) = CertAuthority::load(ca_dir)?;
        let roots = Arc::new(roots::upstream_roots(upstream_ca)?);
        Ok((
            Interceptor {
                leaves: LeafCache::new(ca),
                tls: roots::client_config(roots.clone(), &[b"h2", b"http/1.1"])?,
                tls_h1: roots::client_config(roots, &[b"http/1.1"])?,
                clients: Mutex::new(Lru::new(MAX_ORIGINS)),
                egress,
            },
            warnings,
        ))
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
            .set_host(false)
            .build(connector);
        clients.insert(key, client.clone());
        Ok(client)
    }
}

/// Serves one intercepted tunnel on `io` (the client's side of an
/// accepted CONNECT) and records the CONNECT's line when it ends.
pub(crate) async fn run<IO>(
    io: IO,
    tunnel: Arc<Tunnel>,
    mut ev: Event,
    ctx: Arc<ProxyCtx>,
    mitm: Arc<Interceptor>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let up = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = Metered {
        inner: io,
        read: up.clone(),
        written: down.clone(),
        activity: activity.clone(),
        started,
    };
    let finish = |mut ev: Event, error: Option<String>| {
        ev.bytes_up = up.load(Ordering::Relaxed);
        ev.bytes_down = down.load(Ordering::Relaxed);
        if error.is_some() {
            ev.error = error;
        }
        ctx.recorder.record(ev);
    };

    let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return finish(ev, Some(format!("client TLS: {e}"))),
        Err(_) => return finish(ev, Some("client TLS: no ClientHello in time".into())),
    };
    let sni = start.client_hello().server_name().map(str::to_string);
    let hello = Hello::ClientHello { sni, ech: false };
    if let Some((reason, note)) = tunnel.sni.judge(&hello) {
        ev.set_denied(reason);
        ev.note = Some(note);
        return finish(ev, None);
    }
    let config = match mitm.leaves.server_config(&tunnel.dest.target) {
        Ok(c) => c,
        Err(e) => return finish(ev, Some(format!("minting a certificate: {e}"))),
    };
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, start.into_stream(config)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return finish(
                ev,
                Some(format!(
                    "client TLS handshake: {e} (does the client trust egressd's CA?)"
                )),
            )
        }
        Err(_) => return finish(ev, Some("client TLS handshake timed out".into())),
    };

    let c2 = ctx.clone();
    let t2 = tunnel.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (ctx, tunnel) = (c2.clone(), t2.clone());
        async move { Ok::<_, Infallible>(handle(req, tunnel, ctx).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
    tokio::pin!(conn);
    // Like an opaque tunnel, an intercepted one that moves no byte for
    // IDLE_TIMEOUT is closed: gracefully first (h2 GOAWAY), then for good.
    let idle = || {
        started
            .elapsed()
            .saturating_sub(Duration::from_millis(activity.load(Ordering::Relaxed)))
    };
    let mut closing = false;
    let res = loop {
        let wait = if closing {
            CLOSE_GRACE
        } else {
            IDLE_TIMEOUT.saturating_sub(idle())
        };
        tokio::select! {
            r = conn.as_mut() => break r,
            _ = tokio::time::sleep(wait) => {
                if closing {
                    break Ok(());
                }
                if idle() >= IDLE_TIMEOUT {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    };
    if let Err(e) = res {
        if let Some(he) = e.downcast_ref::<hyper::Error>() {
            // hyper answered 400/431 for what it could not parse; the
            // request's line is ours to write.
            if he.is_parse() || he.is_parse_too_large() {
                let mut bad = Event::new(Proto::Tls, tunnel.peer);
                bad.host = Some(tunnel.dest.target.to_string());
                bad.port = Some(tunnel.dest.port);
                bad.set_denied(Reason::Malformed);
                bad.status = Some(if he.is_parse_too_large() { 431 } else { 400 });
                bad.error = Some(he.to_string());
                ctx.recorder.record(bad);
            }
        }
    }
    finish(ev, None)
}

/// One request inside an intercepted tunnel: the edge checks that make the
/// CONNECT host the only destination, then the shared forwarding path.
async fn handle(
    req: Request<Incoming>,
    tunnel: Arc<Tunnel>,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let policy = ctx.policy.snapshot();
    let dest = &tunnel.dest;
    let mut ev = Event::new(Proto::Tls, tunnel.peer);
    ev.method = Some(req.method().as_str().to_string());
    ev.path = Some(truncate_path(req.uri().path()));
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let what = move || {
        let port = match dest.port {
            443 => String::new(),
            p => format!(":{p}"),
        };
        format!(
            "{method} https://{}{port}{}",
            dest.target,
            truncate_path(uri.path())
        )
    };
    let denier = Denier {
        what: &what,
        contact: &policy.settings.contact,
        close: false,
        rec: &ctx.recorder,
    };
    let deny = |ev, reason, detail: Option<&str>| {
        denier.deny(ev, reason, detail.map(str::to_string), false)
    };

    if !ctx.recorder.accepting() {
        return deny(ev, Reason::LogUnavailable, None);
    }
    let client = match policy.identify(tunnel.peer.ip(), tunnel.token.as_deref()) {
        Ok(c) => c,
        Err(e) => return deny(ev, Reason::ClientNotAllowed, Some(&e.to_string())),
    };
    if let Some(id) = policy.client_id(client) {
        ev.client = id.clone();
    }
    if req.method() == http::Method::CONNECT {
        return deny(
            ev,
            Reason::Malformed,
            Some("CONNECT inside an intercepted tunnel"),
        );
    }
    if req
        .uri()
        .scheme_str()
        .is_some_and(|s| !s.eq_ignore_ascii_case("https"))
    {
        return deny(
            ev,
            Reason::Malformed,
            Some("only https requests are served inside a tunnel"),
        );
    }
    // HTTP/2's :authority (or an absolute-form HTTP/1.1 target) and Host
    // must both name the CONNECT host: the request goes there, whatever
    // it says, so one that says otherwise is refused, not redirected.
    if let Some(a) = req.uri().authority() {
        match parse_authority(a.as_str(), Some(dest.port)) {
            Ok(d) if d == *dest => {}
            Ok(_) => return deny(ev, Reason::HostMismatch, None),
            Err(e) => return deny(ev, Reason::Malformed, Some(&e.to_string())),
        }
    }
    if let Err((reason, detail)) = check_host_headers(req.headers(), dest) {
        return deny(ev, reason, detail.as_deref());
    }
    let path = match normalize_path(req.uri().path()) {
        Ok(p) => p,
        Err(e) => return deny(ev, Reason::Malformed, Some(&e.to_string())),
    };
    ev.path = Some(truncate_path(&path));
    let inbound = Inbound {
        client,
        dest,
        path: &path,
        scheme: Scheme::Https,
    };
    forward::decide_and_forward(&ctx, &policy, req, ev, inbound, &denier).await
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
