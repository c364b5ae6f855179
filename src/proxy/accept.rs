//! Accepting clients: the accept loop shared by the proxy port and the
//! capture listeners (at most [`MAX_CONNECTIONS`](super::MAX_CONNECTIONS) open at once, all
//! listeners together), one hyper HTTP/1 connection per client, and the
//! dispatch of each request to `forward` (absolute-form requests) or
//! `tunnel` (CONNECT).
//!
//! Each connection holds a [`Permit`] for as long as it lives: the
//! connection's task holds it, and every request carries a clone in its
//! extensions, so that a tunnel, an intercepted TLS connection or a
//! WebSocket that outlives hyper's connection (an upgrade) keeps it. The
//! drain at shutdown waits for the last of them.
//!
//! Owns the connection bounds and timeouts of the client side. Does not
//! own what a request is answered (the front-ends) or the line of a
//! request hyper could not parse beyond writing it here.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use super::admit::Unanswered;
use super::respond::ProxyBody;
use super::{forward, tunnel, ProxyCtx, HEADER_READ_TIMEOUT, MAX_HEADER_BYTES};
use crate::metrics::ActiveGuard;
use crate::policy::{Proto, Reason};
use crate::record::Event;
use crate::shutdown::{Permit, Shutdown};

/// How long accepting pauses after it failed (EMFILE and friends), instead
/// of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves the proxy port until `shutdown` fires; then stops accepting and
/// lets open connections finish on their own.
pub async fn serve(listener: TcpListener, ctx: Arc<ProxyCtx>, shutdown: Shutdown) {
    accept_loop(listener, ctx, shutdown, "", serve_conn).await
}

/// Accepts connections on `listener` until `shutdown` fires, while the
/// proxy's [`MAX_CONNECTIONS`](super::MAX_CONNECTIONS) permits last (beyond them clients wait in
/// the backlog), and runs `conn` for each on its own task, with its
/// permit. Shared by the proxy port and transparent capture; `what` names
/// the listener in accept errors.
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    ctx: Arc<ProxyCtx>,
    mut shutdown: Shutdown,
    what: &str,
    conn: F,
) where
    F: Fn(TcpStream, SocketAddr, Arc<ProxyCtx>, Permit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let permit = tokio::select! {
            p = ctx.connections.acquire() => p,
            _ = shutdown.fired() => return,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("egressd: accept failed{what}: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = shutdown.fired() => return,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(conn(stream, peer, ctx.clone(), permit));
    }
}

async fn serve_conn(stream: TcpStream, peer: SocketAddr, ctx: Arc<ProxyCtx>, permit: Permit) {
    serve_http1(stream, peer, ctx, permit, None, move |req, ctx| {
        dispatch(req, peer, ctx)
    })
    .await
}

/// Serves one client connection as HTTP/1.1 (with upgrades), each request
/// answered by `answer` and carrying a clone of the connection's `permit`.
/// A request hyper could not parse has already been answered 400/431 by
/// hyper; its log line (with `note`, if any) is written here. Shared by the
/// proxy port and transparent capture.
pub(crate) async fn serve_http1<F, Fut>(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
    permit: Permit,
    note: Option<String>,
    answer: F,
) where
    F: Fn(Request<Incoming>, Arc<ProxyCtx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let _active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Http);
    let c2 = ctx.clone();
    let answer = Arc::new(answer);
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(permit.clone());
        let (ctx, answer) = (c2.clone(), answer.clone());
        async move { Ok::<_, Infallible>(answer(req, ctx).await) }
    });
    let res = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_header_size(MAX_HEADER_BYTES)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc)
        .with_upgrades()
        .await;
    if let Err(e) = res {
        if e.is_parse() || e.is_parse_too_large() || e.is_parse_status() {
            let mut ev = Event::new(Proto::Http, peer);
            ev.set_denied(Reason::Malformed);
            ev.status = Some(if e.is_parse_too_large() { 431 } else { 400 });
            ev.error = Some(e.to_string());
            ev.note = note;
            ctx.recorder.record(ev);
        }
    }
}

/// One request on the proxy port: CONNECT is a tunnel, anything else is
/// forwarded. Either way it gets one line, even if its client goes away
/// before the answer.
async fn dispatch(
    mut req: Request<Incoming>,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let guard = Unanswered::arm(&mut req, &ctx.recorder);
    let resp = if req.method() == http::Method::CONNECT {
        tunnel::handle(req, peer, ctx).await
    } else {
        forward::handle(req, peer, ctx).await
    };
    guard.answered();
    resp
}
