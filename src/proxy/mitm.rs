//! Intercepted CONNECT tunnels. For exceptions that restrict methods or
//! paths or inject credentials, egressd terminates the client's TLS with a
//! leaf minted for the CONNECT host, serves HTTP/1.1 or HTTP/2 (ALPN) inside,
//! and decides every request on its own (`proto: tls`) before forwarding it
//! to the origin over TLS verified against the system roots and
//! `--upstream-ca` (`tls_origins`).
//!
//! Inside a tunnel the CONNECT host is the only destination: a ClientHello
//! naming another host closes the tunnel (`sni_mismatch`), and a request
//! whose `Host` or `:authority` names another gets `403 host_mismatch`
//! (no domain fronting). The CONNECT gets its own `connect` line when the
//! tunnel closes; each request inside gets one `tls` line.
//!
//! A CONNECT whose exception needs inspection and whose first bytes are
//! plain HTTP (`ws://` through a proxy is `CONNECT host:80` and an Upgrade
//! request) is served the same way without the TLS ([`run_plain`]): each
//! request inside decided on its own (`proto: http`), no CA needed.
//!
//! This module owns the client-facing TLS and the edge of the requests
//! inside; the decision and forwarding are `exchange::decide_and_forward`,
//! shared with plain HTTP.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;

use super::admit::{accepting, identify};
use super::chunks::{self, ChunkGuard};
use super::dest::{check_host_headers, parse_authority, Dest};
use super::exchange::{decide_and_forward, request_event, truncate_path, Inbound};
use super::origin::Scheme;
use super::relay::meter::{Activity, Metered};
use super::relay::IDLE_TIMEOUT;
use super::respond::{self, ProxyBody, Responder, Stop};
use super::sni::{Hello, SniRule};
use super::tls_origins::TlsOrigins;
use super::upstream::Egress;
use super::{ProxyCtx, MAX_HEADER_BYTES};
use crate::policy::{ClientIdx, Proto, Reason};
use crate::record::Event;
use crate::shutdown::Permit;
use crate::tls::{CertAuthority, LeafCache, TlsError};

/// Longest wait for the client's ClientHello, and again for the rest of its
/// handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 streams one client may have open in one tunnel.
pub const MAX_STREAMS: u32 = super::streams::MAX_STREAMS;
/// How long an idle intercepted tunnel gets to close gracefully.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// What a tunnel's requests are checked against.
pub(crate) struct Tunnel {
    pub peer: SocketAddr,
    /// The CONNECT's Proxy-Authorization token: requests inside carry none,
    /// and are identified again with it on the policy they are decided by.
    pub token: Option<Vec<u8>>,
    pub dest: Dest,
    pub sni: SniRule,
    /// What the requests inside are: `Https` in intercepted TLS, `Http`
    /// when the tunnel carries plain HTTP.
    pub scheme: Scheme,
}

/// Everything interception needs: the CA's leaves for the client side,
/// the HTTPS clients for the origin side.
pub struct Interceptor {
    pub leaves: LeafCache,
    pub(crate) origins: TlsOrigins,
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
        Ok((
            Interceptor {
                leaves: LeafCache::new(ca),
                origins: TlsOrigins::new(upstream_ca, egress)?,
            },
            warnings,
        ))
    }
}

impl Tunnel {
    /// What the requests inside are logged as.
    fn proto(&self) -> Proto {
        match self.scheme {
            Scheme::Http => Proto::Http,
            Scheme::Https => Proto::Tls,
        }
    }
}

/// The client side of a tunnel: counted both ways, its last byte timed.
type ClientIo<IO> = Metered<IO>;

/// Serves one intercepted tunnel on `io` (the client's side of an
/// accepted CONNECT) and records the CONNECT's line when it ends. The
/// client connection's `permit` is held until then, and lent to every
/// request inside (a WebSocket among them may outlive the tunnel's task).
pub(crate) async fn run<IO>(
    io: IO,
    tunnel: Arc<Tunnel>,
    ev: Event,
    ctx: Arc<ProxyCtx>,
    mitm: Arc<Interceptor>,
    permit: Option<Permit>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let meters = Meters::new();
    let io = meters.wrap(io);
    let (mut ev, tls) = match handshake(io, &tunnel, ev, &mitm).await {
        Ok(x) => x,
        Err((ev, error)) => return meters.finish(ev, error, &ctx),
    };
    if !ctx.recorder.open_settled(&mut ev).await {
        return meters.finish(ev, None, &ctx);
    }
    serve_inside(tls, &tunnel, &ctx, &meters.activity, permit).await;
    meters.finish(ev, None, &ctx)
}

/// Serves a tunnel that carries plain HTTP (`tunnel.scheme` is `Http`):
/// [`run`] without the TLS. `io` still holds the client's first bytes.
pub(crate) async fn run_plain<IO>(
    io: IO,
    tunnel: Arc<Tunnel>,
    ev: Event,
    ctx: Arc<ProxyCtx>,
    permit: Option<Permit>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    debug_assert_eq!(tunnel.scheme, Scheme::Http);
    let mut ev = ev;
    let meters = Meters::new();
    let io = meters.wrap(io);
    if !ctx.recorder.open_settled(&mut ev).await {
        return meters.finish(ev, None, &ctx);
    }
    serve_inside(io, &tunnel, &ctx, &meters.activity, permit).await;
    meters.finish(ev, None, &ctx)
}

/// A tunnel's client side, counted both ways and its last byte timed; the
/// CONNECT's line takes the counts when the tunnel ends.
struct Meters {
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
    activity: Arc<Activity>,
}

impl Meters {
    fn new() -> Meters {
        Meters {
            up: Arc::new(AtomicU64::new(0)),
            down: Arc::new(AtomicU64::new(0)),
            activity: Arc::new(Activity::new()),
        }
    }
    fn wrap<IO>(&self, io: IO) -> ClientIo<IO> {
        Metered::new(
            io,
            self.up.clone(),
            self.down.clone(),
            self.activity.clone(),
        )
    }
    fn finish(&self, mut ev: Event, error: Option<String>, ctx: &ProxyCtx) {
        ev.bytes_up = self.up.load(Ordering::Relaxed);
        ev.bytes_down = self.down.load(Ordering::Relaxed);
        if error.is_some() {
            ev.error = error;
        }
        ctx.recorder.record(ev);
    }
}

/// The client's TLS handshake, on a leaf minted for the CONNECT host once
/// its ClientHello passed the tunnel's rule. Err: the CONNECT's event (a
/// refusal noted in it) and the error to record with it.
async fn handshake<IO>(
    io: ClientIo<IO>,
    tunnel: &Tunnel,
    mut ev: Event,
    mitm: &Interceptor,
) -> Result<(Event, TlsStream<ClientIo<IO>>), (Event, Option<String>)>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err((ev, Some(format!("client TLS: {e}")))),
        Err(_) => return Err((ev, Some("client TLS: no ClientHello in time".into()))),
    };
    let sni = start.client_hello().server_name().map(str::to_string);
    let hello = Hello::ClientHello { sni, ech: false };
    if let Some((reason, note)) = tunnel.sni.judge(&hello) {
        ev.set_denied(reason);
        ev.note = Some(note);
        return Err((ev, None));
    }
    let config = match mitm.leaves.server_config(&tunnel.dest.target) {
        Ok(c) => c,
        Err(e) => return Err((ev, Some(format!("minting a certificate: {e}")))),
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, start.into_stream(config)).await {
        Ok(Ok(s)) => Ok((ev, s)),
        Ok(Err(e)) => Err((
            ev,
            Some(format!(
                "client TLS handshake: {e} (does the client trust egressd's CA?)"
            )),
        )),
        Err(_) => Err((ev, Some("client TLS handshake timed out".into()))),
    }
}

/// Serves HTTP/1.1 or HTTP/2 on the tunnel's stream (decrypted, or plain),
/// each request through [`handle`], until the client is done or the tunnel
/// has been idle for [`IDLE_TIMEOUT`] (then gracefully first, h2 GOAWAY,
/// for [`CLOSE_GRACE`]).
async fn serve_inside<S>(
    stream: S,
    tunnel: &Arc<Tunnel>,
    ctx: &Arc<ProxyCtx>,
    activity: &Activity,
    permit: Option<Permit>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (c2, t2) = (ctx.clone(), tunnel.clone());
    let stream = ChunkGuard::new(stream);
    let upgraded = stream.upgraded();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(p) = &permit {
            req.extensions_mut().insert(p.clone());
        }
        let (ctx, tunnel, upgraded) = (c2.clone(), t2.clone(), upgraded.clone());
        async move {
            let method = req.method().clone();
            // Boxed, made in place once: hyper moves this future into its
            // in-flight slot per request (see `accept::serve_http1`).
            let resp = Box::pin(handle(req, tunnel, ctx)).await;
            if chunks::is_upgrade(&method, resp.status()) {
                upgraded.store(true, std::sync::atomic::Ordering::Release);
            }
            Ok::<_, Infallible>(resp)
        }
    });
    // Each HTTP/2 stream runs under the stall watch (`streams`).
    let exec = super::streams::StreamExec {
        stall: ctx.stall_timeout(),
        metrics: ctx.recorder.metrics.clone(),
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(exec);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(ctx.header_timeout())
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_send_buf_size(super::streams::MAX_SEND_BUF)
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let mut closing = false;
    let res = loop {
        let wait = if closing {
            CLOSE_GRACE
        } else {
            IDLE_TIMEOUT.saturating_sub(activity.idle_for())
        };
        tokio::select! {
            r = conn.as_mut() => break r,
            _ = tokio::time::sleep(wait) => {
                if closing {
                    break Ok(());
                }
                if activity.idle_for() >= IDLE_TIMEOUT {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    };
    if let Err(e) = res {
        if let Some(he) = e.downcast_ref::<hyper::Error>() {
            record_unparsable(he, tunnel, ctx);
        }
    }
}

/// hyper answered 400/431 for what it could not parse; the request's line
/// is ours to write.
fn record_unparsable(he: &hyper::Error, tunnel: &Tunnel, ctx: &ProxyCtx) {
    if !(he.is_parse() || he.is_parse_too_large()) {
        return;
    }
    let mut bad = Event::new(tunnel.proto(), tunnel.peer);
    bad.host = Some(tunnel.dest.target.to_string());
    bad.port = Some(tunnel.dest.port);
    bad.set_denied(Reason::Malformed);
    bad.status = Some(if he.is_parse_too_large() { 431 } else { 400 });
    bad.error = Some(he.to_string());
    ctx.recorder.record(bad);
}

/// One request inside an intercepted tunnel: the edge checks that make the
/// CONNECT host the only destination, then the shared request path.
async fn handle(
    req: Request<Incoming>,
    tunnel: Arc<Tunnel>,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let policy = ctx.policy.snapshot();
    let dest = &tunnel.dest;
    let mut ev = request_event(tunnel.proto(), tunnel.peer, &req);
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let scheme = tunnel.scheme;
    let what = move || {
        let port = match (scheme, dest.port) {
            (Scheme::Https, 443) | (Scheme::Http, 80) => String::new(),
            (_, p) => format!(":{p}"),
        };
        format!(
            "{method} {}://{}{port}{}",
            scheme.as_str(),
            dest.target,
            truncate_path(uri.path())
        )
    };
    let responder = Responder {
        what: &what,
        contact: &policy.settings.contact,
        close: false,
        json: respond::wants_json(req.headers()),
        rec: &ctx.recorder,
    };
    // Requests inside carry no Proxy-Authorization: the CONNECT's token
    // identifies them, again, on the policy they are decided by.
    let edge = accepting(&ctx.recorder)
        .and_then(|()| identify(&policy, &mut ev, tunnel.token.as_deref()))
        .and_then(|client| Ok((client, read_inner(&req, dest, scheme)?)));
    let (client, path): (Option<ClientIdx>, String) = match edge {
        Ok(x) => x,
        Err(stop) => return responder.stop(ev, stop),
    };
    ev.path = Some(truncate_path(&path));
    // An HTTP/2 stream counts against its client's share beside its
    // connection, until its response ends.
    let share = match super::streams::count(&req, &policy, &ctx.recorder.metrics) {
        Ok(share) => share,
        Err(stop) => return responder.stop(ev, stop),
    };
    let inbound = Inbound {
        client,
        dest,
        path: &path,
        scheme,
    };
    let resp = decide_and_forward(&ctx, &policy, req, ev, inbound, &responder).await;
    super::streams::watched(resp, share)
}

/// A request inside the tunnel must be a request of the tunnel's scheme
/// for the CONNECT host: HTTP/2's :authority (or an absolute-form HTTP/1.1
/// target) and `Host` must both name it. The request goes there, whatever
/// it says, so one that says otherwise is refused, not redirected. Returns
/// the normalised path.
fn read_inner<B>(req: &Request<B>, dest: &Dest, scheme: Scheme) -> Result<String, Stop> {
    if req.method() == http::Method::CONNECT {
        return Err(Stop::malformed("CONNECT inside a tunnel"));
    }
    if req
        .uri()
        .scheme_str()
        .is_some_and(|s| !s.eq_ignore_ascii_case(scheme.as_str()))
    {
        return Err(Stop::malformed(format!(
            "only {} requests are served inside this tunnel",
            scheme.as_str()
        )));
    }
    if let Some(a) = req.uri().authority() {
        match parse_authority(a.as_str(), Some(dest.port)) {
            Ok(d) if d == *dest => {}
            Ok(_) => return Err(Stop::Deny(Reason::HostMismatch, None)),
            Err(e) => return Err(Stop::malformed(e)),
        }
    }
    check_host_headers(req.headers(), dest).map_err(|(r, d)| Stop::Deny(r, d))?;
    super::gate::policy_path(&dest.target, req.uri().path()).map_err(Stop::malformed)
}
