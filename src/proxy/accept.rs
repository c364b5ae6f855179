//! Accepting clients: the accept loop shared by the proxy port and the
//! capture listeners (at most [`MAX_CONNECTIONS`] open at once), one hyper
//! HTTP/1 connection per client, and the dispatch of each request to
//! `forward` (absolute-form requests) or `tunnel` (CONNECT).
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
use tokio::sync::{watch, Semaphore};

use super::admit::Unanswered;
use super::respond::ProxyBody;
use super::{forward, tunnel, ProxyCtx, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_HEADER_BYTES};
use crate::metrics::ActiveGuard;
use crate::policy::{Proto, Reason};
use crate::record::Event;

/// How long accepting pauses after it failed (EMFILE and friends), instead
/// of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves the proxy port until `shutdown` flips; then stops accepting and
/// lets open connections finish on their own.
pub async fn serve(listener: TcpListener, ctx: Arc<ProxyCtx>, shutdown: watch::Receiver<bool>) {
    accept_loop(listener, ctx, shutdown, "", serve_conn).await
}

/// Accepts connections on `listener` until `shutdown` flips, at most
/// [`MAX_CONNECTIONS`] open at once, and runs `conn` for each on its own
/// task. Shared by the proxy port and transparent capture; `what` names the
/// listener in accept errors.
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    ctx: Arc<ProxyCtx>,
    mut shutdown: watch::Receiver<bool>,
    what: &str,
    conn: F,
) where
    F: Fn(TcpStream, SocketAddr, Arc<ProxyCtx>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p.expect("semaphore never closed"),
            _ = shutdown.changed() => return,
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
            _ = shutdown.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let task = conn(stream, peer, ctx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            task.await;
        });
    }
}

async fn serve_conn(stream: TcpStream, peer: SocketAddr, ctx: Arc<ProxyCtx>) {
    serve_http1(stream, peer, ctx, None, move |req, ctx| {
        dispatch(req, peer, ctx)
    })
    .await
}

/// Serves one client connection as HTTP/1.1 (with upgrades), each request
/// answered by `answer`. A request hyper could not parse has already been
/// answered 400/431 by hyper; its log line (with `note`, if any) is written
/// here. Shared by the proxy port and transparent capture.
pub(crate) async fn serve_http1<F, Fut>(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
    note: Option<String>,
    answer: F,
) where
    F: Fn(Request<Incoming>, Arc<ProxyCtx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let _active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Http);
    let c2 = ctx.clone();
    let answer = Arc::new(answer);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (ctx, answer) = (c2.clone(), answer.clone());
        async move { Ok::<_, Infallible>(answer(req, ctx).await) }
    });
    let res = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
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
