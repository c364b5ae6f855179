//! CONNECT tunnels. The decision is made on the request-target authority
//! alone, before any byte reaches the destination; a refused CONNECT gets
//! its 403 and the connection is closed, so nothing the client pipelined
//! behind it is ever read as a request. On port 443 the ClientHello is read
//! first and a server name other than the CONNECT host closes the tunnel
//! (`sni_mismatch`, no domain fronting). Then bytes move both ways with
//! half-close and an idle timeout, spliced inside the kernel through pipes
//! leased only while data flows ([`pipe`]).
//!
//! With interception enabled (`--ca-dir`), a CONNECT whose exception needs
//! method/path rules or injected credentials is handed to `mitm` instead:
//! egressd terminates TLS and decides each request inside.

pub(crate) mod pipe;

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::Interest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use super::dest::{check_host_headers, parse_authority, Dest};
use super::mitm;
use super::respond::{self, ProxyBody};
use super::sni::{self, Hello};
use super::upstream::{self, Refusal};
use super::ProxyCtx;
use crate::metrics::ActiveGuard;
use crate::policy::host::{parse_host, HostPattern, Target};
use crate::policy::{self, Exception, MissingSni, Proto, Reason, Verdict};
use crate::record::{Event, Recorder, UpstreamFailure};
use crate::time::unix_now;
use pipe::{Lease, PipePool};

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
        Err(e) => return deny(ev, Reason::Malformed, Some(e.to_string()), false),
    };
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);
    if let Err((reason, detail)) = check_host_headers(req.headers(), &dest) {
        return deny(ev, reason, detail, false);
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
        &mut ev.dns_attempts,
    )
    .await
    {
        Ok(c) => c,
        Err(Refusal::Policy(reason, note)) => {
            ev.note = note;
            return deny(ev, reason, None, false);
        }
        Err(Refusal::Resolve(e)) => {
            let resp =
                respond::upstream_error(&dest.target.to_string(), &e.to_string(), false, true);
            ev.status = Some(resp.status().as_u16());
            ev.fail_upstream(UpstreamFailure::Resolve, e);
            rec.record(ev);
            return resp;
        }
    };
    ev.note = checked.note.clone();
    let (upstream_conn, addr) = match ctx.egress.connect_first(&checked.addrs).await {
        Ok(x) => x,
        Err(e) => {
            let timeout = e.kind() == io::ErrorKind::TimedOut;
            let resp =
                respond::upstream_error(&dest.target.to_string(), &e.to_string(), timeout, true);
            ev.status = Some(resp.status().as_u16());
            ev.fail_upstream(UpstreamFailure::Connect, e);
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
    let pipes = ctx.pipes.clone();
    tokio::spawn(async move {
        let _active = ActiveGuard::new(&recorder.metrics, Proto::Connect);
        match hyper::upgrade::on(req).await {
            Ok(up) => run_tunnel(up, upstream_conn, ev, sni_rule, recorder, &pipes).await,
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
    pipes: &PipePool,
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
    splice_tcp(client, upstream_conn, first.len() as u64, ev, rec, pipes).await;
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
    pipes: &PipePool,
) {
    let mut line = SpliceLine {
        ev: Some(ev),
        rec,
        up: AtomicU64::new(already_up),
        down: AtomicU64::new(0),
    };
    let result = copy_tcp(a, b, &line.up, &line.down, pipes).await;
    line.finish(result.err().map(|e| format!("tunnel: {e}")));
}

/// Bytes read per wake-up while data flows, when a direction copies in
/// user space (no pipe could be made, or its sockets cannot be spliced).
const TCP_CHUNK: usize = 256 << 10;

/// Moves bytes both ways between two TCP sockets, holding nothing while
/// idle: each direction waits for readability, then splices socket → pipe
/// → socket with a pipe leased from `pool` only while data keeps arriving
/// ([`pipe`]). Ten thousand idle tunnels cost their sockets and tasks, not
/// buffers or pipes. Counts bytes read from `a` into `up` and from `b` into
/// `down`.
async fn copy_tcp(
    mut a: TcpStream,
    mut b: TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
    pool: &PipePool,
) -> io::Result<()> {
    let started = Instant::now();
    let activity = AtomicU64::new(0);
    let (ar, mut aw) = a.split();
    let (br, mut bw) = b.split();
    let copy = async {
        tokio::try_join!(
            pump(&ar, &mut bw, pool, up, &activity, started),
            pump(&br, &mut aw, pool, down, &activity, started)
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

/// How a burst of data on one direction ended.
enum Burst {
    /// The source would block; everything read has been written.
    Dry,
    /// The source ended; everything read has been written.
    End,
    /// These sockets cannot be spliced; everything read has been written.
    Unsupported,
}

/// One direction: wait until `src` is readable, move what it has to `dst`,
/// and pass end-of-stream on as a half-close.
async fn pump(
    src: &ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    pool: &PipePool,
    count: &AtomicU64,
    activity: &AtomicU64,
    started: Instant,
) -> io::Result<()> {
    let tick = || activity.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    let mut can_splice = true;
    loop {
        src.readable().await?;
        // The bursts are boxed: their state exists only while data flows,
        // so an idle tunnel's task stays small.
        let lease = if can_splice { pool.take().ok() } else { None };
        let burst = match lease {
            Some(lease) => match Box::pin(splice_burst(src, dst, lease, count, &tick)).await? {
                Burst::Unsupported => {
                    can_splice = false;
                    Box::pin(copy_burst(src, dst, count, &tick)).await?
                }
                b => b,
            },
            // No pipe to be had (EMFILE, ENFILE): copy this burst, and try
            // for a pipe again on the next.
            None => Box::pin(copy_burst(src, dst, count, &tick)).await?,
        };
        if let Burst::End = burst {
            dst.shutdown().await?;
            return Ok(());
        }
    }
}

/// Splices what `src` has to `dst` through the leased pipe, until `src`
/// would block or ends and the pipe is empty again. Dropping the lease then
/// returns the pipe; an error or a cancelled task drops it with whatever it
/// still holds, which closes it.
async fn splice_burst(
    src: &ReadHalf<'_>,
    dst: &WriteHalf<'_>,
    mut lease: Lease<'_>,
    count: &AtomicU64,
    tick: &impl Fn(),
) -> io::Result<Burst> {
    let (from, to) = (src.as_ref(), dst.as_ref());
    let mut ended = false;
    loop {
        let mut dry = false;
        while !ended && !lease.full() {
            // With the pipe empty, WouldBlock can only mean the socket has
            // nothing: try_io then clears its readiness. With bytes in the
            // pipe it may mean the pipe is full, so readiness is left alone
            // (clearing it with data waiting would stall the direction).
            let r = if lease.held() == 0 {
                from.try_io(Interest::READABLE, || lease.fill_from(from.as_fd()))
            } else {
                lease.fill_from(from.as_fd())
            };
            match r {
                Ok(0) => ended = true,
                Ok(n) => {
                    count.fetch_add(n as u64, Ordering::Relaxed);
                    tick();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    dry = lease.held() == 0;
                    break;
                }
                Err(e) if pipe::unsupported(&e) => {
                    drain(&mut lease, dst, tick).await?;
                    return Ok(Burst::Unsupported);
                }
                Err(e) => return Err(e),
            }
        }
        while lease.held() > 0 {
            match to.try_io(Interest::WRITABLE, || lease.drain_to(to.as_fd())) {
                Ok(_) => tick(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if pipe::unsupported(&e) => {
                    write_out(&mut lease, dst, tick).await?;
                    return Ok(Burst::Unsupported);
                }
                Err(e) => return Err(e),
            }
        }
        if lease.held() > 0 {
            // `dst` is full: nothing moves until it drains.
            to.writable().await?;
        } else if ended {
            return Ok(Burst::End);
        } else if dry {
            return Ok(Burst::Dry);
        }
    }
}

/// Empties the pipe into `dst`, splicing, before a direction switches to
/// copying in user space.
async fn drain(lease: &mut Lease<'_>, dst: &WriteHalf<'_>, tick: &impl Fn()) -> io::Result<()> {
    let to = dst.as_ref();
    while lease.held() > 0 {
        match to.try_io(Interest::WRITABLE, || lease.drain_to(to.as_fd())) {
            Ok(_) => tick(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(e) if pipe::unsupported(&e) => return write_out(lease, dst, tick).await,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Empties the pipe into `dst` through memory: `dst` cannot be spliced to.
async fn write_out(lease: &mut Lease<'_>, dst: &WriteHalf<'_>, tick: &impl Fn()) -> io::Result<()> {
    let buf = lease.read_out()?;
    let to = dst.as_ref();
    let mut done = 0;
    while done < buf.len() {
        match to.try_write(&buf[done..]) {
            Ok(n) => {
                done += n;
                tick();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copies what `src` has to `dst` through a buffer that lives only for
/// this burst.
async fn copy_burst(
    src: &ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    count: &AtomicU64,
    tick: &impl Fn(),
) -> io::Result<Burst> {
    let mut buf: Vec<u8> = Vec::with_capacity(TCP_CHUNK);
    loop {
        buf.clear();
        match src.try_read_buf(&mut buf) {
            Ok(0) => return Ok(Burst::End),
            Ok(n) => {
                dst.write_all(&buf[..n]).await?;
                count.fetch_add(n as u64, Ordering::Relaxed);
                tick();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Burst::Dry),
            Err(e) => return Err(e),
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Two connected sockets on 127.0.0.1: (the outside end, the end
    /// handed to the tunnel).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let out = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (inner, _) = l.accept().await.unwrap();
        (out, inner)
    }

    /// Deterministic bytes that differ at every offset of a chunk.
    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[0] ^ seed)
            .collect()
    }

    /// Sends `data` on `s`, half-closes, and reads to the end meanwhile.
    async fn exchange(s: TcpStream, data: Vec<u8>) -> Vec<u8> {
        let (mut r, mut w) = s.into_split();
        let send = async move {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
            w
        };
        let recv = async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let (_w, got) = tokio::join!(send, recv);
        got
    }

    /// Runs `copy_tcp` between a client and a server that each send
    /// `n_up` / `n_down` bytes at once, and checks what arrived.
    async fn both_ways(pool: &PipePool, n_up: usize, n_down: usize) {
        let (client, a) = pair().await;
        let (server, b) = pair().await;
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let (sent_up, sent_down) = (pattern(1, n_up), pattern(2, n_down));
        let (r, at_server, at_client) = tokio::join!(
            copy_tcp(a, b, &up, &down, pool),
            exchange(server, sent_down.clone()),
            exchange(client, sent_up.clone()),
        );
        r.unwrap();
        assert!(at_server == sent_up, "client → server bytes differ");
        assert!(at_client == sent_down, "server → client bytes differ");
        assert_eq!(up.load(Ordering::Relaxed), n_up as u64);
        assert_eq!(down.load(Ordering::Relaxed), n_down as u64);
    }

    #[tokio::test]
    async fn splices_both_ways_and_returns_the_pipes() {
        let pool = PipePool::new(8, pipe::PIPE_SIZE);
        both_ways(&pool, 8 << 20, (5 << 20) + 3).await;
        assert_eq!(pool.leased(), 0);
        assert!(pool.free_len() >= 1, "a pipe went back to the free list");
        assert_eq!(pool.open(), pool.free_len(), "no pipe closed or leaked");
        let spliced = pool.spliced.load(Ordering::Relaxed);
        assert_eq!(spliced, (13 << 20) + 3, "every byte went through a pipe");
    }

    #[tokio::test]
    async fn copies_in_user_space_when_no_pipe_can_be_had() {
        let pool = PipePool::without_pipes();
        both_ways(&pool, (3 << 20) + 1, 2 << 20).await;
        assert_eq!(pool.open(), 0);
    }

    #[tokio::test]
    async fn an_idle_tunnel_holds_no_pipe() {
        let pool = PipePool::new(8, pipe::PIPE_SIZE);
        let (mut client, a) = pair().await;
        let (mut server, b) = pair().await;
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let talk = async {
            for i in 0..20u8 {
                client.write_all(&[i; 1000]).await.unwrap();
                let mut got = [0u8; 1000];
                server.read_exact(&mut got).await.unwrap();
                server.write_all(&got).await.unwrap();
                client.read_exact(&mut got).await.unwrap();
                assert_eq!(got, [i; 1000]);
            }
            // Both directions have moved data and gone quiet: each gives its
            // pipe back as soon as its source would block.
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool.leased() > 0 {
                assert!(Instant::now() < deadline, "an idle direction kept its pipe");
                tokio::task::yield_now().await;
            }
            assert!(pool.free_len() >= 1);
            drop(client);
            drop(server);
        };
        let (r, ()) = tokio::join!(copy_tcp(a, b, &up, &down, &pool), talk);
        r.unwrap();
        assert_eq!(up.load(Ordering::Relaxed), 20_000);
        assert_eq!(down.load(Ordering::Relaxed), 20_000);
        assert_eq!(pool.leased(), 0);
    }
}
