//! Plain-HTTP/1.1 connections to origins, kept per checked address.
//!
//! One request at a time per connection: [`OriginPool::send`] lends a
//! connection (an idle one for that address, or a new one), and the
//! response body hands it back through [`Lent::give_back`] once the
//! response has been read to its end. A response abandoned half way drops
//! its connection instead, so no connection is reused mid-message. Idle
//! connections are closed after [`POOL_IDLE`], and at most
//! [`POOL_MAX_IDLE_PER_ADDR`] are kept per address.
//!
//! Keyed by the checked `SocketAddr` and nothing else: a connection is never
//! shared between addresses, and nothing here resolves a name. Replaces
//! hyper-util's general client, whose pool keys on the URI's authority
//! (hashed byte by byte) and whose checkout/return machinery cost more per
//! request than the rest of the origin side together (callgrind).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use super::held::ReqBody;
use super::relay::meter::Counted;
use super::upstream::{Egress, POOL_IDLE, POOL_MAX_IDLE_PER_ADDR};

/// The request body the pool's connections carry.
pub type Body = Counted<ReqBody>;

/// How long a lent idle connection may take to become ready for the next
/// request (its previous exchange is finishing on the connection's task).
const READY_WAIT: Duration = Duration::from_secs(1);

struct Idle<B> {
    sender: SendRequest<B>,
    since: Instant,
}

/// The pool; shared as an `Arc`. `B` is the request body type.
pub struct OriginPool<B = Body> {
    egress: Egress,
    idle: Mutex<HashMap<SocketAddr, Vec<Idle<B>>>>,
}

/// A connection lent for one request.
pub struct Lent<B = Body> {
    pool: Weak<OriginPool<B>>,
    addr: SocketAddr,
    sender: SendRequest<B>,
}

impl<B> Lent<B> {
    /// Returns the connection for the next request to its address. Call it
    /// only once the response has been read to its end.
    pub fn give_back(self) {
        if self.sender.is_closed() {
            return;
        }
        if let Some(pool) = self.pool.upgrade() {
            let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            let list = idle.entry(self.addr).or_default();
            if list.len() < POOL_MAX_IDLE_PER_ADDR {
                list.push(Idle {
                    sender: self.sender,
                    since: Instant::now(),
                });
            }
        }
    }
}

/// Why a request got no response.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made.
    Connect(io::Error),
    /// The connection failed before a response head arrived.
    Http(hyper::Error),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "{e}"),
            SendError::Http(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::Connect(e) => e.source(),
            SendError::Http(e) => std::error::Error::source(e),
        }
    }
}

impl<B> OriginPool<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A pool reaching origins through `egress`. Inside a Tokio runtime it
    /// also starts the task that closes connections idle for [`POOL_IDLE`].
    pub fn new(egress: Egress) -> Arc<OriginPool<B>> {
        let pool = Arc::new(OriginPool {
            egress,
            idle: Mutex::new(HashMap::new()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&pool);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(POOL_IDLE / 2).await;
                    let Some(pool) = weak.upgrade() else { return };
                    pool.sweep(Instant::now());
                }
            });
        }
        pool
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SocketAddr, Vec<Idle<B>>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops idle connections that are closed or older than [`POOL_IDLE`].
    fn sweep(&self, now: Instant) {
        self.lock().retain(|_, list| {
            list.retain(|i| !i.sender.is_closed() && now.duration_since(i.since) < POOL_IDLE);
            !list.is_empty()
        });
    }

    /// Idle connections to `addr` kept now.
    pub fn idle_count(&self, addr: SocketAddr) -> usize {
        self.lock().get(&addr).map_or(0, Vec::len)
    }

    /// The most recently returned idle connection to `addr` still open.
    fn checkout(&self, addr: SocketAddr) -> Option<SendRequest<B>> {
        let mut idle = self.lock();
        let list = idle.get_mut(&addr)?;
        let now = Instant::now();
        while let Some(i) = list.pop() {
            if !i.sender.is_closed() && now.duration_since(i.since) < POOL_IDLE {
                return Some(i.sender);
            }
        }
        None
    }

    /// Sends `req` to the checked address `addr` on an idle connection or a
    /// new one. A request an idle connection could not take (it closed as
    /// the request came) goes on the next one, or a new one; a request that
    /// was written is never sent twice.
    pub async fn send(
        self: &Arc<Self>,
        addr: SocketAddr,
        mut req: Request<B>,
    ) -> Result<(Response<Incoming>, Lent<B>), SendError> {
        if matches!(self.egress, Egress::Direct) {
            // Origin-form to the origin; an upstream proxy takes the
            // absolute form the request carries.
            let pq = match req.uri().path_and_query() {
                // `http://host?q` asks for `/?q`.
                Some(pq) if pq.as_str().starts_with('?') => {
                    PathAndQuery::try_from(format!("/{}", pq.as_str()))
                        .map_err(|e| SendError::Connect(io::Error::other(e)))?
                }
                Some(pq) => pq.clone(),
                None => PathAndQuery::from_static("/"),
            };
            *req.uri_mut() = Uri::from(pq);
        }
        while let Some(mut sender) = self.checkout(addr) {
            // Usually ready at once (its last exchange finished): no timer.
            if !sender.is_ready() {
                match tokio::time::timeout(READY_WAIT, sender.ready()).await {
                    Ok(Ok(())) => {}
                    _ => continue,
                }
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok((resp, self.lend(addr, sender))),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(SendError::Http(e.into_error())),
                },
            }
        }
        let stream = self
            .egress
            .connect_http(addr)
            .await
            .map_err(SendError::Connect)?;
        let (mut sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Http)?;
        tokio::spawn(async move {
            // Errors here reach the request that was in flight.
            let _ = conn.with_upgrades().await;
        });
        let resp = sender.send_request(req).await.map_err(SendError::Http)?;
        Ok((resp, self.lend(addr, sender)))
    }

    fn lend(self: &Arc<Self>, addr: SocketAddr, sender: SendRequest<B>) -> Lent<B> {
        Lent {
            pool: Arc::downgrade(self),
            addr,
            sender,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    type Pool = OriginPool<Empty<Bytes>>;

    /// An origin on 127.0.0.1 answering every request with `ok`, keeping
    /// the connection unless `close` (then `Connection: close` and a
    /// close). Counts connections and keeps each request line.
    struct Origin {
        addr: SocketAddr,
        conns: Arc<AtomicUsize>,
        lines: Arc<Mutex<Vec<String>>>,
    }

    async fn origin(close: bool) -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (c, ls) = (conns.clone(), lines.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let ls = ls.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 1024];
                        let n = match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            buf.drain(..end + 4);
                            ls.lock()
                                .unwrap()
                                .push(head.lines().next().unwrap_or("").to_string());
                            let reply: &[u8] = if close {
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                            } else {
                                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                            };
                            if s.write_all(reply).await.is_err() || close {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Origin { addr, conns, lines }
    }

    fn get(path: &str) -> Request<Empty<Bytes>> {
        Request::get(format!("http://127.0.0.1{path}"))
            .header("host", "a.test")
            .body(Empty::new())
            .unwrap()
    }

    /// Sends, reads the body to its end, gives the connection back.
    async fn exchange(pool: &Arc<Pool>, addr: SocketAddr, path: &str) -> Bytes {
        let (resp, lent) = pool.send(addr, get(path)).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        lent.give_back();
        body
    }

    #[tokio::test]
    async fn a_connection_serves_one_request_after_another() {
        let o = origin(false).await;
        let pool = Pool::new(Egress::Direct);
        for i in 0..5 {
            assert_eq!(exchange(&pool, o.addr, &format!("/n/{i}?q=1")).await, "ok");
        }
        assert_eq!(o.conns.load(Ordering::SeqCst), 1, "one connection, reused");
        assert_eq!(pool.idle_count(o.addr), 1);
        // Origin-form on the wire: the origin never sees the address form.
        assert_eq!(o.lines.lock().unwrap()[4], "GET /n/4?q=1 HTTP/1.1");
        exchange(&pool, o.addr, "?only=query").await;
        assert_eq!(o.lines.lock().unwrap()[5], "GET /?only=query HTTP/1.1");
    }

    #[tokio::test]
    async fn a_response_not_read_to_its_end_is_not_reused() {
        let o = origin(false).await;
        let pool = Pool::new(Egress::Direct);
        let (resp, lent) = pool.send(o.addr, get("/")).await.unwrap();
        drop(lent); // the caller stopped before the body's end
        drop(resp);
        assert_eq!(pool.idle_count(o.addr), 0);
        assert_eq!(exchange(&pool, o.addr, "/").await, "ok");
        assert_eq!(o.conns.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_origin_closed_is_not_used_again() {
        let o = origin(true).await;
        let pool = Pool::new(Egress::Direct);
        for _ in 0..3 {
            assert_eq!(exchange(&pool, o.addr, "/").await, "ok");
        }
        assert_eq!(
            o.conns.load(Ordering::SeqCst),
            3,
            "a new connection each time"
        );
    }

    #[tokio::test]
    async fn connections_are_kept_per_address() {
        let (a, b) = (origin(false).await, origin(false).await);
        let pool = Pool::new(Egress::Direct);
        for _ in 0..3 {
            exchange(&pool, a.addr, "/").await;
            exchange(&pool, b.addr, "/").await;
        }
        assert_eq!(a.conns.load(Ordering::SeqCst), 1);
        assert_eq!(b.conns.load(Ordering::SeqCst), 1);
        assert_eq!((pool.idle_count(a.addr), pool.idle_count(b.addr)), (1, 1));
    }

    #[tokio::test]
    async fn idle_connections_expire() {
        let o = origin(false).await;
        let pool = Pool::new(Egress::Direct);
        exchange(&pool, o.addr, "/").await;
        pool.sweep(Instant::now());
        assert_eq!(pool.idle_count(o.addr), 1, "fresh: kept");
        pool.sweep(Instant::now() + POOL_IDLE);
        assert_eq!(pool.idle_count(o.addr), 0, "idle for POOL_IDLE: closed");
    }

    #[tokio::test]
    async fn an_unreachable_address_is_a_connect_error() {
        // A port nothing listens on: bind, note it, close.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let pool = Pool::new(Egress::Direct);
        match pool.send(addr, get("/")).await {
            Err(SendError::Connect(_)) => {}
            other => panic!("expected a connect error, got {:?}", other.map(|_| ())),
        }
    }
}
