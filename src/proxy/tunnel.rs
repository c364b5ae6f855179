//! CONNECT tunnels. The decision is made on the request-target authority
//! alone, before any byte reaches the destination; a refused CONNECT gets
//! its 403 and the connection is closed, so nothing the client pipelined
//! behind it is ever read as a request. On port 443 the ClientHello is read
//! first and a server name other than the CONNECT host closes the tunnel
//! (`sni_mismatch`, no domain fronting). Then bytes are copied both ways with
//! half-close and an idle timeout.
//!
//! With interception enabled (`--ca-dir`), a CONNECT whose exception needs
//! method/path rules or injected credentials is handed to `mitm` instead:
//! egressd terminates TLS and decides each request inside.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{header, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::forward::{parse_authority, Dest};
use super::mitm;
use super::respond::{self, ProxyBody};
use super::sni::{self, Hello};
use super::upstream::{self, Refusal};
use super::ProxyCtx;
use crate::decision::{Event, Proto, Reason, Recorder, Verdict};
use crate::metrics::ActiveGuard;
use crate::policy::host::{parse_host, HostPattern, Target};
use crate::policy::time::unix_now;
use crate::policy::{self, Exception, MissingSni};

/// A tunnel with no byte in either direction for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest wait for the client's first bytes (the ClientHello) on port 443.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Copy buffer per direction.
const BUF: usize = 64 << 10;

pub async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let policy = ctx.policy.snapshot();
    let mut ev = Event::new(Proto::Connect, peer);
    ev.method = Some("CONNECT".into());
    let auth = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default();
    let what = format!("CONNECT {auth}");
    let rec = &ctx.recorder;
    let contact = policy.settings.contact.clone();

    // Every refusal closes the connection: after a CONNECT, the client's next
    // bytes were meant for the destination, never for us.
    let deny = |mut ev: Event, reason: Reason, detail: Option<String>, policy_decided: bool| {
        if !policy_decided {
            ev.set_denied(reason);
        }
        let resp = respond::deny(reason, &what, &contact, detail.as_deref(), true);
        ev.status = Some(resp.status().as_u16());
        if let Some(d) = detail {
            ev.note.get_or_insert(d);
        }
        rec.record(ev);
        resp
    };

    if !rec.accepting() {
        return deny(ev, Reason::LogUnavailable, None, false);
    }
    let client = match super::identify(&policy, &req, peer) {
        Ok(c) => c,
        Err(e) => return deny(ev, Reason::ClientNotAllowed, Some(e.to_string()), false),
    };
    if let Some(id) = policy.client_id(client) {
        ev.client = id.clone();
    }
    if auth.is_empty()
        || req.uri().scheme().is_some()
        || req
            .uri()
            .path_and_query()
            .is_some_and(|p| p.as_str() != "/")
    {
        return deny(
            ev,
            Reason::Malformed,
            Some("CONNECT needs an authority-form target (host:port)".into()),
            false,
        );
    }
    let dest = match parse_authority(&auth, None) {
        Ok(d) => d,
        Err(e) => return deny(ev, Reason::Malformed, Some(e), false),
    };
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);
    let hosts: Vec<_> = req.headers().get_all(header::HOST).iter().collect();
    if hosts.len() > 1 {
        return deny(
            ev,
            Reason::Malformed,
            Some("more than one Host header".into()),
            false,
        );
    }
    if let Some(h) = hosts.first() {
        let agrees = h
            .to_str()
            .ok()
            .and_then(|h| parse_authority(h, Some(dest.port)).ok())
            .is_some_and(|hd| hd == dest);
        if !agrees {
            return deny(ev, Reason::HostMismatch, None, false);
        }
    }

    let now = unix_now();
    let preq = policy::Request {
        proto: Proto::Connect,
        client,
        target: &dest.target,
        port: dest.port,
        method: None,
        path: None,
        qtype: None,
        can_intercept: ctx.mitm.is_some(),
    };
    let d = policy.decide(&preq, now);
    ev.set_decision(&d, policy.settings.mode);
    if !d.is_allowed() {
        return deny(ev, d.reason, None, true);
    }
    super::Draft::publish(&req, &ev);
    let sni_rule = SniRule::new(&dest, d.exception, policy.settings.missing_sni);

    if d.verdict == Verdict::Intercept {
        // Nothing is resolved or dialled yet: each request inside is decided
        // on its own and reaches the origin through the shared forwarding
        // path. This line records the tunnel; each request gets its own.
        let Some(mitm) = ctx.mitm.clone() else {
            return deny(ev, Reason::InspectionRequired, None, false);
        };
        let token = match super::request_token(&req) {
            Ok(t) => t,
            Err(e) => return deny(ev, Reason::ClientNotAllowed, Some(e.to_string()), false),
        };
        ev.status = Some(200);
        ev.note = Some("intercepted".into());
        let tunnel = Arc::new(mitm::Tunnel {
            peer,
            token,
            dest,
            sni: sni_rule,
        });
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Connect);
            match hyper::upgrade::on(req).await {
                Ok(up) => mitm::run(TokioIo::new(up), tunnel, ev, ctx, mitm).await,
                Err(e) => {
                    ev.error = Some(format!("upgrade: {e}"));
                    ctx.recorder.record(ev);
                }
            }
        });
        return Response::builder()
            .status(StatusCode::OK)
            .body(respond::full(""))
            .expect("static response");
    }

    let checked = match upstream::resolve_checked(
        &policy,
        &ctx.resolver,
        d.exception,
        client,
        &dest.target,
        dest.port,
        &ctx.own_addrs,
        now,
    )
    .await
    {
        Ok(c) => c,
        Err(Refusal::Policy(reason, note)) => {
            ev.note = note;
            return deny(ev, reason, None, false);
        }
        Err(Refusal::Resolve(e)) => {
            rec.metrics
                .upstream_errors
                .with_label_values(&["connect", "resolve"])
                .inc();
            let resp =
                respond::upstream_error(&dest.target.to_string(), &e.to_string(), false, true);
            ev.status = Some(resp.status().as_u16());
            ev.error = Some(format!("resolve: {e}"));
            rec.record(ev);
            return resp;
        }
    };
    ev.note = checked.note.clone();
    let (upstream_conn, addr) = match ctx.egress.connect_first(&checked.addrs).await {
        Ok(x) => x,
        Err(e) => {
            rec.metrics
                .upstream_errors
                .with_label_values(&["connect", "connect"])
                .inc();
            let timeout = e.kind() == io::ErrorKind::TimedOut;
            let resp =
                respond::upstream_error(&dest.target.to_string(), &e.to_string(), timeout, true);
            ev.status = Some(resp.status().as_u16());
            ev.error = Some(format!("connect: {e}"));
            rec.record(ev);
            return resp;
        }
    };
    ev.addr = Some(addr);
    ev.status = Some(200);

    let recorder = ctx.recorder.clone();
    let exception_injects = d.exception.is_some_and(Exception::needs_inspection);
    debug_assert!(
        !exception_injects,
        "opaque tunnels are never allowed for exceptions needing inspection"
    );
    tokio::spawn(async move {
        let _active = ActiveGuard::new(&recorder.metrics, Proto::Connect);
        match hyper::upgrade::on(req).await {
            Ok(up) => run_tunnel(up, upstream_conn, ev, sni_rule, recorder).await,
            Err(e) => {
                ev.error = Some(format!("upgrade: {e}"));
                recorder.record(ev);
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .body(respond::full(""))
        .expect("static response")
}

/// What a tunnel's ClientHello must name: the CONNECT host, or nothing at
/// all when `settings.tls.missing_sni` allows it for this destination.
pub(crate) struct SniRule {
    /// Opaque tunnels: only port 443 is checked. Intercepted tunnels always
    /// are (egressd reads their ClientHello itself).
    check: bool,
    target: Target,
    missing: MissingSni,
    exact_host: bool,
}

impl SniRule {
    pub(crate) fn new(dest: &Dest, exception: Option<&Exception>, missing: MissingSni) -> SniRule {
        // What a ClientHello without a usable server name may do.
        let exact_host = match (&dest.target, exception) {
            (Target::Name(h), Some(e)) => e
                .hosts
                .iter()
                .any(|p| matches!(p, HostPattern::Exact(x) if x == h)),
            _ => false,
        };
        SniRule {
            check: dest.port == 443,
            target: dest.target.clone(),
            missing,
            exact_host,
        }
    }

    /// `None` when the hello may pass; else the reason and a note.
    pub(crate) fn judge(&self, hello: &Hello) -> Option<(Reason, String)> {
        match hello {
            Hello::ClientHello { sni, ech } => {
                let missing_ok = match self.missing {
                    MissingSni::Allow => true,
                    MissingSni::Deny => false,
                    MissingSni::ExactOnly => {
                        self.exact_host || matches!(self.target, Target::Ip(_))
                    }
                };
                if *ech && !missing_ok {
                    return Some((
                        Reason::SniMismatch,
                        "encrypted ClientHello hides the server name".into(),
                    ));
                }
                match sni {
                    None if missing_ok => None,
                    None => Some((
                        Reason::SniMismatch,
                        "ClientHello without a server name".into(),
                    )),
                    Some(name) => {
                        let ok = match (&self.target, parse_host(name)) {
                            (Target::Name(h), Ok(s)) => *h == s,
                            _ => false,
                        };
                        if ok || *ech && missing_ok {
                            None
                        } else {
                            Some((
                                Reason::SniMismatch,
                                format!("ClientHello names {:?}", truncate(name, 255)),
                            ))
                        }
                    }
                }
            }
            Hello::NotTls => Some((
                Reason::SniMismatch,
                "the client sent non-TLS bytes to port 443".into(),
            )),
            Hello::Malformed | Hello::Incomplete => {
                Some((Reason::SniMismatch, "malformed TLS ClientHello".into()))
            }
        }
    }
}

fn truncate(s: &str, n: usize) -> &str {
    let mut end = s.len().min(n);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

async fn run_tunnel(
    up: hyper::upgrade::Upgraded,
    mut upstream_conn: TcpStream,
    mut ev: Event,
    rule: SniRule,
    rec: Recorder,
) {
    // Take the client's socket back from hyper, with whatever the client
    // sent behind its CONNECT, so the tunnel can copy socket to socket and
    // hold no buffer while idle.
    let (mut client, mut first) = match up.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => (parts.io.into_inner(), parts.read_buf.to_vec()),
        Err(_) => {
            ev.error = Some("tunnel: client connection is not a TCP socket".into());
            rec.record(ev);
            return;
        }
    };
    if rule.check {
        let mut buf = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
        let verdict = loop {
            match sni::parse(&first) {
                Hello::Incomplete if first.len() < sni::MAX_HELLO => {}
                h => break rule.judge(&h),
            }
            match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
                Ok(Ok(0)) => {
                    break Some((
                        Reason::SniMismatch,
                        "client closed before its ClientHello".into(),
                    ))
                }
                Ok(Ok(n)) => first.extend_from_slice(&buf[..n]),
                Ok(Err(e)) => {
                    break Some((Reason::SniMismatch, format!("reading ClientHello: {e}")))
                }
                Err(_) => break Some((Reason::SniMismatch, "no ClientHello in time".into())),
            }
        };
        if let Some((reason, note)) = verdict {
            ev.set_denied(reason);
            ev.exception = None;
            ev.owner = None;
            ev.note = Some(note);
            ev.bytes_up = 0;
            ev.bytes_down = 0;
            rec.record(ev);
            return;
        }
    }
    if !first.is_empty() {
        if let Err(e) = upstream_conn.write_all(&first).await {
            ev.error = Some(format!("upstream write: {e}"));
            rec.record(ev);
            return;
        }
    }
    splice_tcp(client, upstream_conn, first.len() as u64, ev, rec).await;
}

/// The log line of a spliced connection, written exactly once: when the
/// splice ends, or, if its task is dropped first (egressd stopping with the
/// tunnel still open after the drain period), from `Drop`, with the bytes
/// counted so far.
struct SpliceLine {
    ev: Option<Event>,
    rec: Recorder,
    up: AtomicU64,
    down: AtomicU64,
}

impl SpliceLine {
    fn finish(&mut self, error: Option<String>) {
        if let Some(mut ev) = self.ev.take() {
            ev.bytes_up = self.up.load(Ordering::Relaxed);
            ev.bytes_down = self.down.load(Ordering::Relaxed);
            if error.is_some() {
                ev.error = error;
            }
            self.rec.record(ev);
        }
    }
}

impl Drop for SpliceLine {
    fn drop(&mut self) {
        self.finish(Some("egressd stopped while the tunnel was open".into()));
    }
}

/// Splices two TCP sockets ([`copy_tcp`]) and records `ev` with the bytes
/// each way when the tunnel ends, however it ends.
pub(crate) async fn splice_tcp(
    a: TcpStream,
    b: TcpStream,
    already_up: u64,
    ev: Event,
    rec: Recorder,
) {
    let mut line = SpliceLine {
        ev: Some(ev),
        rec,
        up: AtomicU64::new(already_up),
        down: AtomicU64::new(0),
    };
    let result = copy_tcp(a, b, &line.up, &line.down).await;
    line.finish(result.err().map(|e| format!("tunnel: {e}")));
}

/// Bytes read per wake-up while data flows.
const TCP_CHUNK: usize = 256 << 10;

/// Copies both ways between two TCP sockets, holding no buffer while
/// idle: each direction waits for readability, then reads into a buffer
/// that lives only as long as data keeps arriving. Ten thousand idle
/// tunnels cost their sockets and tasks, not 128 KiB of buffers each.
/// Counts bytes read from `a` into `up` and from `b` into `down`.
async fn copy_tcp(
    mut a: TcpStream,
    mut b: TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
) -> io::Result<()> {
    let started = Instant::now();
    let activity = AtomicU64::new(0);
    let (ar, mut aw) = a.split();
    let (br, mut bw) = b.split();
    let copy = async {
        tokio::try_join!(
            pump(&ar, &mut bw, up, &activity, started),
            pump(&br, &mut aw, down, &activity, started)
        )
    };
    tokio::pin!(copy);
    let result = loop {
        let idle_for = started
            .elapsed()
            .saturating_sub(Duration::from_millis(activity.load(Ordering::Relaxed)));
        let remaining = IDLE_TIMEOUT.saturating_sub(idle_for);
        if remaining.is_zero() {
            break Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout"));
        }
        tokio::select! {
            r = &mut copy => break r.map(|_| ()),
            _ = tokio::time::sleep(remaining) => continue,
        }
    };
    normal_end(result)
}

/// One direction: read from `src` when it is readable, write everything to
/// `dst`, and pass end-of-stream on as a half-close.
async fn pump(
    src: &tokio::net::tcp::ReadHalf<'_>,
    dst: &mut tokio::net::tcp::WriteHalf<'_>,
    count: &AtomicU64,
    activity: &AtomicU64,
    started: Instant,
) -> io::Result<()> {
    loop {
        src.readable().await?;
        let mut buf: Vec<u8> = Vec::with_capacity(TCP_CHUNK);
        loop {
            buf.clear();
            match src.try_read_buf(&mut buf) {
                Ok(0) => {
                    dst.shutdown().await?;
                    return Ok(());
                }
                Ok(n) => {
                    dst.write_all(&buf[..n]).await?;
                    count.fetch_add(n as u64, Ordering::Relaxed);
                    activity.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A reset or broken pipe is how many peers end a connection: not an error.
fn normal_end(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e)
            if e.kind() == io::ErrorKind::ConnectionReset
                || e.kind() == io::ErrorKind::BrokenPipe =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Copies bytes both ways between `a` (the client side) and `b` until
/// both directions end (half-close passes through) or nothing moves for
/// [`IDLE_TIMEOUT`]. Returns bytes read from `a` (plus `already_up`), bytes
/// read from `b`, and the error that ended it; a reset or broken pipe is a
/// normal end, not an error.
pub(crate) async fn splice<A, B>(a: A, b: B, already_up: u64) -> (u64, u64, io::Result<()>)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let up = Arc::new(AtomicU64::new(already_up));
    let down = Arc::new(AtomicU64::new(0));
    // Bytes read from each side are the counts; what is written to one
    // side was read from the other, so the written counters go unused.
    let mut c = Metered {
        inner: a,
        read: up.clone(),
        written: Arc::new(AtomicU64::new(0)),
        activity: activity.clone(),
        started,
    };
    let mut u = Metered {
        inner: b,
        read: down.clone(),
        written: Arc::new(AtomicU64::new(0)),
        activity: activity.clone(),
        started,
    };
    let copy = tokio::io::copy_bidirectional_with_sizes(&mut c, &mut u, BUF, BUF);
    tokio::pin!(copy);
    let result = loop {
        let idle_for = started
            .elapsed()
            .saturating_sub(Duration::from_millis(activity.load(Ordering::Relaxed)));
        let remaining = IDLE_TIMEOUT.saturating_sub(idle_for);
        if remaining.is_zero() {
            break Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout"));
        }
        tokio::select! {
            r = &mut copy => break r.map(|_| ()),
            _ = tokio::time::sleep(remaining) => continue,
        }
    };
    (
        up.load(Ordering::Relaxed),
        down.load(Ordering::Relaxed),
        normal_end(result),
    )
}

/// A stream that counts the bytes read from and written to it and notes
/// when the last one moved (for the idle timeout). Used by tunnels and by
/// intercepted TLS connections alike.
pub(crate) struct Metered<S> {
    pub(crate) inner: S,
    pub(crate) read: Arc<AtomicU64>,
    pub(crate) written: Arc<AtomicU64>,
    pub(crate) activity: Arc<AtomicU64>,
    pub(crate) started: Instant,
}

impl<S> Metered<S> {
    fn touch(&self) {
        self.activity
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.read.fetch_add(n as u64, Ordering::Relaxed);
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
