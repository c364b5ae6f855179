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
//! Each permit also counts against its client's share
//! (`settings.limits.connections_per_client`, read at accept, so a reload
//! applies to the connections after it): the named client its source
//! identifies, else the source address. A connection past its client's
//! share holds nothing: it is answered `503` (`overloaded`) at once, with
//! no request read, and closed; others are not affected.
//!
//! The total is shared fairly (DESIGN "Bounds, backpressure and
//! fairness"): when every permit is held, a client under its share still
//! gets one, taken from the client holding the most (a connection between
//! requests first), whose connection is closed with a line (reason
//! `overloaded`); only when no client holds more than the newcomer is the
//! newcomer refused. A connection can be taken back while hyper serves it,
//! not once it has become a tunnel. Both count in
//! `egressd_overload_total{what="connections"}`.
//!
//! Owns the connection bounds and timeouts of the client side. Does not
//! own what a request is answered (the front-ends) or the line of a
//! request hyper could not parse beyond writing it here.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::admit::Unanswered;
use super::chunks::{self, ChunkGuard};
use super::respond::{self, ProxyBody};
use super::rewind::Rewind;
use super::{fast, forward, tunnel, ProxyCtx, MAX_HEADER_BYTES};
use crate::metrics::ActiveGuard;
use crate::policy::{Policy, Proto, Reason};
use crate::record::Event;
use crate::shutdown::{Admission, Holder, Permit, Shutdown};

/// How long accepting pauses after it failed (EMFILE and friends), instead
/// of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Refused connections (past their client's share) kept open a moment
/// after their `503`, per listener; beyond it one is closed right after.
const MAX_REFUSING: usize = 1024;
/// How long a refused connection stays after its `503`: what the client
/// sends is read and dropped until it closes (so that closing does not
/// reset the answer away) or this ends.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// How a listener refuses a connection past its client's share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Answer `503` (the proxy port: every client speaks HTTP first).
    Http,
    /// Close it (capture listeners: the client may be speaking TLS).
    Close,
}

/// Serves the proxy port until `shutdown` fires; then stops accepting and
/// lets open connections finish on their own.
pub async fn serve(listener: TcpListener, ctx: Arc<ProxyCtx>, shutdown: Shutdown) {
    accept_loop(listener, ctx, shutdown, "", Refusal::Http, serve_conn).await
}

/// Whose share a connection from `ip` counts against: the named client
/// its source identifies, else its address.
fn holder_of(policy: &Policy, ip: std::net::IpAddr) -> (Holder, Option<Arc<str>>) {
    let named = policy.client_id(policy.identify(ip, None).ok().flatten());
    match named {
        Some(id) => (Holder::Named(id.clone()), Some(id.clone())),
        None => (Holder::addr(ip), None),
    }
}

/// Accepts connections on `listener` until `shutdown` fires and runs
/// `conn` for each on its own task, with its permit of the proxy's
/// [`MAX_CONNECTIONS`](super::MAX_CONNECTIONS), counted against its
/// client's share and admitted fairly ([`Permits::try_admit`](crate::shutdown::Permits::try_admit)); past the
/// share, or with the total full and nobody to take from, it is refused as
/// `refusal` says. Shared by the proxy port and transparent
/// capture; `what` names the listener in accept errors.
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    ctx: Arc<ProxyCtx>,
    mut shutdown: Shutdown,
    what: &str,
    refusal: Refusal,
    conn: F,
) where
    F: Fn(TcpStream, SocketAddr, Arc<ProxyCtx>, Permit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let metrics = ctx.recorder.metrics.clone();
    loop {
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
        let policy = ctx.policy.snapshot();
        let (holder, named) = holder_of(&policy, peer.ip());
        let max = policy.settings.limits.connections_per_client;
        let permit = match ctx.connections.try_admit(holder, max) {
            Admission::Admitted(p) => p,
            Admission::Reclaimed { permit, .. } => {
                metrics.overloaded("connections");
                permit
            }
            full => {
                metrics.overloaded("connections");
                let detail = match full {
                    Admission::OverShare => {
                        format!("this client already has {max} connections open, its share")
                    }
                    _ => format!(
                        "all {} of egressd's connections are open and no client holds more \
                         than this one",
                        ctx.connections.max()
                    ),
                };
                let slot = refusing.clone().try_acquire_owned().ok();
                refuse(stream, (peer, named), &detail, &policy, &ctx, refusal, slot);
                continue;
            }
        };
        // Boxed, so the task's own memory is a pointer: the connection
        // future (hyper's, 1.6 KiB) is freed the moment it ends. A task's
        // memory lives as long as any waker of it, and a CONNECT's tunnel
        // keeps one: each idle tunnel held a finished connection task
        // (dhat: 1,000 of them live with 1,000 tunnels).
        let watch = permit.clone();
        let served = Box::pin(conn(stream, peer, ctx.clone(), permit));
        let ctx = ctx.clone();
        tokio::spawn(async move {
            // While the connection is served (not once it has become a
            // tunnel), the total may take it back for a client under its
            // share: then it closes, with its line.
            tokio::select! {
                () = served => {}
                () = watch.reclaimed() => reclaimed_line(peer, named, &ctx),
            }
        });
    }
}

/// The line of a connection closed to give its slot to another client.
fn reclaimed_line(peer: SocketAddr, named: Option<Arc<str>>, ctx: &ProxyCtx) {
    let mut ev = Event::new(Proto::Http, peer);
    if let Some(id) = named {
        ev.client = id;
    }
    ev.set_denied(Reason::Overloaded);
    ev.note = Some(format!(
        "connection closed: all {} of egressd's connections were open and this client held \
         the most of them; its slot went to another client under its share",
        ctx.connections.max()
    ));
    ctx.recorder.record(ev);
}

/// A connection past its client's share: one line, reason
/// `overloaded`, and for [`Refusal::Http`] a `503` written at once, no
/// request read. While a refusal slot is free, the connection then stays
/// a moment on a task of its own, reading and dropping what the client
/// sends, so that closing it does not reset the answer away.
fn refuse(
    stream: TcpStream,
    (peer, named): (SocketAddr, Option<Arc<str>>),
    detail: &str,
    policy: &Policy,
    ctx: &ProxyCtx,
    refusal: Refusal,
    slot: Option<OwnedSemaphorePermit>,
) {
    let mut ev = Event::new(Proto::Http, peer);
    if let Some(id) = named {
        ev.client = id;
    }
    ev.set_denied(Reason::Overloaded);
    if refusal == Refusal::Close {
        ev.add_note(Some(format!("{detail}; closed")));
        ctx.recorder.record(ev);
        return;
    }
    // Nothing of the request was read: the answer is text, and no
    // exception could change it, so it offers no stub.
    let denial = respond::Denial {
        reason: Reason::Overloaded,
        what: "this connection",
        contact: &policy.settings.contact,
        detail: Some(detail),
        explain: None,
        stub: None,
        request: Some(ev.id.to_string()),
    };
    let resp = respond::deny(&denial, true, false);
    ev.status = Some(resp.status().as_u16());
    ev.add_note(Some(detail.to_string()));
    // A new connection's send buffer is empty: the answer fits at once.
    let written = match respond::encode(resp) {
        Some(bytes) => stream.try_write(&bytes).is_ok_and(|n| n == bytes.len()),
        None => false,
    };
    if !written {
        ev.status = None;
        ev.error = Some("the 503 could not be written".into());
    }
    ctx.recorder.record(ev);
    if let (true, Some(slot)) = (written, slot) {
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(REFUSAL_LINGER, linger(stream)).await;
        });
    }
}

/// Ends the sending side, then reads and drops what the client sends
/// until it closes.
async fn linger(mut stream: TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
}

/// One client of the proxy port: the fast path first, then hyper from the
/// first request the fast path does not take, with the bytes it read.
async fn serve_conn(stream: TcpStream, peer: SocketAddr, ctx: Arc<ProxyCtx>, permit: Permit) {
    // One count in `egressd_active_connections` for the connection's whole
    // life, whichever of the two serves it: one guard each looked the
    // gauge up twice for every new tunnel.
    let active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Http);
    let stream = match fast::serve(stream, peer, &ctx).await {
        fast::Next::Done => return,
        fast::Next::HandOff(stream, read) => Rewind::new(stream, read),
    };
    serve_http1(stream, peer, ctx, permit, active, None, move |req, ctx| {
        dispatch(req, peer, ctx)
    })
    .await
}

/// Serves one client connection as HTTP/1.1 (with upgrades), each request
/// answered by `answer` and carrying a clone of the connection's `permit`.
/// A request hyper could not parse has already been answered 400/431 by
/// hyper; its log line (with `note`, if any) is written here. `active` is
/// the connection's count in `egressd_active_connections`, held until it
/// ends. Shared by the proxy port and transparent capture.
pub(crate) async fn serve_http1<F, Fut>(
    stream: Rewind,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
    permit: Permit,
    active: ActiveGuard,
    note: Option<String>,
    answer: F,
) where
    F: Fn(Request<Incoming>, Arc<ProxyCtx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let _active = active;
    let header_timeout = ctx.header_timeout();
    let c2 = ctx.clone();
    let answer = Arc::new(answer);
    let stream = ChunkGuard::new(stream);
    let upgraded = stream.upgraded();
    let heads = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let heads_read = heads.clone();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        // Busy until its answer's head: a connection between requests is
        // the idle one a full total takes back first.
        let busy = permit.busy();
        req.extensions_mut().insert(permit.clone());
        heads_read.store(true, Ordering::Relaxed);
        let (ctx, answer, upgraded) = (c2.clone(), answer.clone(), upgraded.clone());
        async move {
            let method = req.method().clone();
            // The answer's future is boxed, made in place once: hyper moves
            // this future per request (into its in-flight slot), and inline
            // it would be as large as the largest way of answering. The
            // forward path's alone made every GET copy kilobytes (8.4k of a
            // GET's 77k instructions under callgrind were that copy).
            let resp = Box::pin(answer(req, ctx)).await;
            if chunks::is_upgrade(&method, resp.status()) {
                upgraded.store(true, Ordering::Release);
            }
            drop(busy);
            Ok::<_, Infallible>(resp)
        }
    });
    let res = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
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
        } else if e.is_timeout() && !heads.load(Ordering::Relaxed) {
            // hyper closed it on the header timeout before any request
            // head was complete (after one, an idle keep-alive closes
            // quietly: its requests have their lines).
            fast::record_head_timeout(&ctx, peer, 0, note);
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
    // Inline in one future, which `serve_http1` boxes once per request.
    let resp = if req.method() == http::Method::CONNECT {
        tunnel::handle(req, peer, ctx).await
    } else {
        forward::handle(req, peer, ctx).await
    };
    guard.answered();
    resp
}
