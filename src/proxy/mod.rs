//! The HTTP proxy front-end: accept loop, one hyper HTTP/1 connection per
//! client, and the dispatch of each request to `forward` (absolute-form
//! requests) or `tunnel` (CONNECT), which hands tunnels that need inspection
//! to `mitm`. Each builds one `policy::Request` and asks `Policy::decide`;
//! each records exactly one `Event` per request. `transparent` serves the
//! connections `egressd run --transparent` captures, through the same paths.

pub mod dest;
pub mod forward;
pub mod mitm;
pub mod pool;
pub mod respond;
pub mod sni;
pub mod transparent;
pub mod tunnel;
pub mod upstream;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::dns::Resolver;
use crate::metrics::ActiveGuard;
use crate::policy::{ClientIdx, Policy, PolicyHandle, Proto, Reason, UnknownToken};
use crate::record::{Event, Recorder};
use respond::ProxyBody;

/// Client connections served at once; further clients wait in the backlog.
pub const MAX_CONNECTIONS: usize = 16_384;
/// Longest wait for a complete request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head accepted (hyper answers 431 beyond it).
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// What every proxy task shares.
pub struct ProxyCtx {
    pub policy: Arc<PolicyHandle>,
    pub recorder: Recorder,
    pub resolver: Arc<Resolver>,
    /// egressd's own listening addresses: never a destination.
    pub own_addrs: Vec<SocketAddr>,
    pub http: Arc<pool::OriginPool>,
    /// Pipes for spliced tunnels, lent only while data flows.
    pub(crate) pipes: Arc<tunnel::pipe::PipePool>,
    /// Directly, or through `--upstream-proxy`.
    pub egress: upstream::Egress,
    /// TLS interception (`--ca-dir`); `None`: CONNECTs are only tunnelled.
    pub mitm: Option<Arc<mitm::Interceptor>>,
}

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
    F: Fn(tokio::net::TcpStream, SocketAddr, Arc<ProxyCtx>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
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
                    // EMFILE and friends: back off instead of spinning.
                    eprintln!("egressd: accept failed{what}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
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

async fn serve_conn(stream: tokio::net::TcpStream, peer: SocketAddr, ctx: Arc<ProxyCtx>) {
    serve_http1(stream, peer, ctx, None, move |req, ctx| {
        handle(req, peer, ctx)
    })
    .await
}

/// Serves one client connection as HTTP/1.1 (with upgrades), each request
/// answered by `answer`. A request hyper could not parse has already been
/// answered 400/431 by hyper; its log line (with `note`, if any) is written
/// here. Shared by the proxy port and transparent capture.
pub(crate) async fn serve_http1<F, Fut>(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
    note: Option<String>,
    answer: F,
) where
    F: Fn(Request<Incoming>, Arc<ProxyCtx>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<respond::ProxyBody>> + Send + 'static,
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

/// The client a request comes from, by Proxy-Authorization token or source.
pub(crate) fn identify(
    policy: &Policy,
    req: &Request<Incoming>,
    peer: SocketAddr,
) -> Result<Option<ClientIdx>, UnknownToken> {
    let token = request_token(req)?;
    policy.identify(peer.ip(), token.as_deref())
}

/// The Proxy-Authorization token a request presents, if any (an
/// unparsable header counts as an unknown token).
pub(crate) fn request_token<B>(req: &Request<B>) -> Result<Option<Vec<u8>>, UnknownToken> {
    req.headers()
        .get(http::header::PROXY_AUTHORIZATION)
        .map(|v| proxy_token(v.as_bytes()).ok_or(UnknownToken))
        .transpose()
}

/// The token in `Basic base64(user:token)` (or `user:` with the token as
/// user), or `Bearer token`.
pub fn proxy_token(v: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let (scheme, rest) = s.split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return (!rest.is_empty()).then(|| rest.as_bytes().to_vec());
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64_decode(rest)?;
    let colon = raw.iter().position(|b| *b == b':')?;
    let (user, pass) = (&raw[..colon], &raw[colon + 1..]);
    let tok = if pass.is_empty() { user } else { pass };
    (!tok.is_empty()).then(|| tok.to_vec())
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return None,
        } as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

async fn handle(
    mut req: Request<Incoming>,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let draft = Draft::default();
    req.extensions_mut().insert(draft.clone());
    let mut guard = Unanswered {
        draft,
        rec: ctx.recorder.clone(),
        armed: true,
    };
    let resp = if req.method() == http::Method::CONNECT {
        tunnel::handle(req, peer, ctx).await
    } else {
        forward::handle(req, peer, ctx).await
    };
    guard.armed = false;
    resp
}

/// The request's event as it stood when the policy decided, published by
/// the front-end (through the request's extensions) so that a request
/// whose client goes away before the answer still gets its one line.
#[derive(Clone, Default)]
pub(crate) struct Draft(Arc<std::sync::Mutex<Option<Event>>>);

impl Draft {
    /// Publishes `ev` for the request `req` carries a draft for.
    pub(crate) fn publish<B>(req: &Request<B>, ev: &Event) {
        if let Some(d) = req.extensions().get::<Draft>() {
            *d.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(ev.clone());
        }
    }
}

/// Writes the draft when the request's future is dropped before it
/// answered: hyper drops it when the client disconnects while egressd is
/// resolving, connecting or waiting for the origin's response head. Every
/// path that answers records its own line and completes the future first.
struct Unanswered {
    draft: Draft,
    rec: Recorder,
    armed: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ev = self
            .draft
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut ev) = ev {
            ev.status = None;
            ev.error = Some("client went away before the answer".into());
            self.rec.record(ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        // "agent:s3cret"
        assert_eq!(proxy_token(b"Basic YWdlbnQ6czNjcmV0").unwrap(), b"s3cret");
        // "s3cret:"
        assert_eq!(proxy_token(b"Basic czNjcmV0Og==").unwrap(), b"s3cret");
        assert_eq!(proxy_token(b"Bearer abc").unwrap(), b"abc");
        assert!(proxy_token(b"Digest x").is_none());
        assert!(proxy_token(b"Basic !!!").is_none());
    }
}
