//! CONNECT tunnels: the edge. The decision is made on the request-target
//! authority alone, before any byte reaches the destination; a refused
//! CONNECT gets its 403 and the connection is closed, so nothing the client
//! pipelined behind it is ever read as a request. The client's first bytes
//! are read before any goes upstream: a ClientHello (on any port) naming
//! another host than the CONNECT's closes the tunnel (`sni_mismatch`, no
//! domain fronting), and on port 443 bytes that are not TLS close it too.
//! Off port 443 a server that speaks first (SSH, SMTP) is not kept
//! waiting: its greeting means no ClientHello is coming first. Then `relay`
//! moves the bytes both ways.
//!
//! A CONNECT whose exception needs method/path rules or injected
//! credentials is handed to `mitm` instead, which decides each request
//! inside: off port 443 by its first bytes, plain HTTP served as HTTP (no
//! CA needed) and TLS intercepted with `--ca-dir`; on port 443 (TLS only)
//! intercepted, and refused `inspection_required` without a CA.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::admit::{admit, identify, request_token, Draft};
use super::chunks::ChunkGuard;
use super::dest::{check_host_headers, parse_authority, Dest};
use super::held::Charge;
use super::mitm;
use super::origin::Scheme;
use super::relay::{self, IDLE_TIMEOUT};
use super::respond::{self, record_stop, ProxyBody, Responder, Stop};
use super::rewind::Rewind;
use super::sni::{self, Hello, SniRule, HELLO_TIMEOUT};
use super::upload;
use super::upstream;
use super::ProxyCtx;
use crate::metrics::ActiveGuard;
use crate::policy::{self, ClientIdx, Decision, Exception, Policy, Proto, Reason, Verdict};
use crate::record::Event;
use crate::shutdown::Permit;
use crate::time::unix_now;

/// Read buffer for a ClientHello that arrives in pieces.
const HELLO_READ: usize = 4096;

pub async fn handle(
    mut req: Request<Incoming>,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let policy = ctx.policy.snapshot();
    let mut ev = Event::new(Proto::Connect, peer);
    ev.method = Some("CONNECT".into());
    let auth = req.uri().authority().cloned();
    let what = || format!("CONNECT {}", auth.as_ref().map_or("", |a| a.as_str()));
    // Every refusal closes the connection: after a CONNECT, the client's next
    // bytes were meant for the destination, never for us.
    let responder = Responder {
        what: &what,
        contact: &policy.settings.contact,
        close: true,
        json: respond::wants_json(req.headers()),
        rec: &ctx.recorder,
    };
    let edge = admit(&ctx.recorder, &policy, &mut ev, &req)
        .and_then(|client| Ok((client, read_target(&req, &mut ev)?)));
    let (client, dest) = match edge {
        Ok(x) => x,
        Err(stop) => return responder.stop(ev, stop),
    };
    let now = unix_now();
    let d = decide(&ctx, &policy, client, &dest, &mut ev, now);
    if !d.is_allowed() {
        return responder.refuse(ev);
    }
    Draft::publish(&req, &ev);
    let sni = SniRule::new(&dest, d.exception, policy.settings.missing_sni);
    if d.verdict == Verdict::Intercept {
        return inspect(req, ev, dest, sni, &ctx, &responder);
    }
    let upstream_conn = match connect(&ctx, &policy, &mut ev, client, &dest, &d, now).await {
        Ok(c) => c,
        Err(stop) => return responder.stop(ev, stop),
    };
    ev.status = Some(200);
    let cap = upload::tunnel(&d, &mut ev, policy.settings.mode);
    // What the task holds lives as long as the tunnel, idle or not: it is
    // most of an idle tunnel's memory (docs/performance.md). The upgrade
    // is taken out of the request here so the request itself is not kept,
    // and the event is boxed once rather than copied into every nested
    // future's state.
    let opened = Opened {
        upgrade: hyper::upgrade::on(&mut req),
        upstream_conn,
        ev: Box::new(ev),
        sni,
        // Plain HTTP inside is served as HTTP, each request checked as a
        // proxy request is (its `Host` must name the CONNECT host): what
        // that needs, boxed, so an opaque tunnel holds one pointer for it.
        plain: Box::new(PlainInside {
            token: request_token(&req).ok().flatten(),
            dest,
            ctx: ctx.clone(),
        }),
        // The tunnel outlives hyper's connection: it keeps the
        // connection's permit until it closes.
        permit: req.extensions().get::<Permit>().cloned(),
        cap,
    };
    tokio::spawn(carry(opened));
    established()
}

/// An allowed CONNECT whose upstream connection is open, waiting for
/// hyper to hand over the client's side.
struct Opened {
    upgrade: OnUpgrade,
    upstream_conn: TcpStream,
    ev: Box<Event>,
    sni: SniRule,
    plain: Box<PlainInside>,
    permit: Option<Permit>,
    /// The `upload:` budget the client's bytes are charged to, if any.
    cap: Option<Arc<dyn Charge>>,
}

/// The tunnel's task: the client's first bytes judged, then relayed
/// opaque, or served as plain HTTP. Its parts are taken apart here, before
/// the task starts, so the task holds each once.
fn carry(opened: Opened) -> impl std::future::Future<Output = ()> + Send {
    let Opened {
        upgrade,
        mut upstream_conn,
        mut ev,
        sni,
        plain,
        permit,
        cap,
    } = opened;
    let (rec, pipes) = (plain.ctx.recorder.clone(), plain.ctx.pipes.clone());
    async move {
        let _active = ActiveGuard::new(&rec.metrics, Proto::Connect);
        let up = match upgrade.await {
            Ok(up) => up,
            Err(e) => {
                ev.error = Some(format!("upgrade: {e}"));
                return rec.record(*ev);
            }
        };
        // Judging the first bytes is boxed: its state exists only until
        // the tunnel is judged, not for as long as it stays open.
        match Box::pin(judge(up, &mut upstream_conn, &mut ev, &sni)).await {
            Ok(Judged::Relay(client, sent)) => {
                let _permit = permit;
                drop(plain);
                if !rec.open_settled(&mut ev).await {
                    return rec.record(*ev);
                }
                relay::tcp(client, upstream_conn, sent, ev, rec, &pipes, cap).await
            }
            Ok(Judged::Http(client, first)) => {
                drop(upstream_conn);
                let PlainInside { token, dest, ctx } = *plain;
                ev.note = Some("plain HTTP, decided per request".into());
                let tunnel = mitm::Tunnel {
                    peer: ev.src,
                    token,
                    dest,
                    sni,
                    scheme: Scheme::Http,
                };
                let io = Rewind::new(client, first);
                mitm::run_plain(io, Arc::new(tunnel), *ev, ctx, permit).await
            }
            Err(()) => rec.record(*ev),
        }
    }
}

/// What an opaque tunnel needs should its first bytes be plain HTTP.
struct PlainInside {
    token: Option<Vec<u8>>,
    dest: Dest,
    ctx: Arc<ProxyCtx>,
}

/// How an opaque tunnel goes on once its first bytes are judged.
enum Judged {
    /// Bytes both ways: the client's socket and what was sent upstream.
    Relay(TcpStream, u64),
    /// Its first bytes are an HTTP/1 request: served as HTTP, from them.
    Http(TcpStream, Vec<u8>),
}

/// `200` to a CONNECT: the tunnel is open.
fn established() -> Response<ProxyBody> {
    Response::builder()
        .status(StatusCode::OK)
        .body(respond::full(""))
        .expect("static response")
}

/// The authority-form target (`host:port`), parsed and noted in `ev`; a
/// `Host` header must name the same destination.
fn read_target<B>(req: &Request<B>, ev: &mut Event) -> Result<Dest, Stop> {
    let uri = req.uri();
    let auth = uri.authority().map(|a| a.as_str()).unwrap_or("");
    if auth.is_empty()
        || uri.scheme().is_some()
        || uri.path_and_query().is_some_and(|p| p.as_str() != "/")
    {
        return Err(Stop::malformed(
            "CONNECT needs an authority-form target (host:port)",
        ));
    }
    let dest = parse_authority(auth, None).map_err(Stop::malformed)?;
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);
    check_host_headers(req.headers(), &dest).map_err(|(r, d)| Stop::Deny(r, d))?;
    Ok(dest)
}

/// The one decision for the CONNECT, noted in `ev`.
fn decide<'p>(
    ctx: &ProxyCtx,
    policy: &'p Policy,
    client: Option<ClientIdx>,
    dest: &Dest,
    ev: &mut Event,
    now: i64,
) -> Decision<'p> {
    let preq = policy::Request {
        proto: Proto::Connect,
        client,
        target: &dest.target,
        port: dest.port,
        method: None,
        path: None,
        qtype: None,
        can_intercept: can_inspect(ctx, dest),
    };
    let d = policy.decide_to_serve(&preq, now);
    ev.set_decision(&d, policy.settings.mode);
    d
}

/// Whether egressd can look inside a tunnel to `dest`: plain HTTP always
/// (no CA needed), which any port but 443 may carry; TLS with a CA.
fn can_inspect(ctx: &ProxyCtx, dest: &Dest) -> bool {
    ctx.mitm.is_some() || dest.port != 443
}

/// Hands a CONNECT whose exception needs inspection to `mitm` once hyper
/// gives up the connection. Nothing is resolved or dialled yet: each
/// request inside is decided on its own and reaches the origin through the
/// shared request path. This line records the tunnel; each request gets
/// its own.
fn inspect(
    req: Request<Incoming>,
    mut ev: Event,
    dest: Dest,
    sni: SniRule,
    ctx: &Arc<ProxyCtx>,
    responder: &Responder<'_>,
) -> Response<ProxyBody> {
    let token = match request_token(&req) {
        Ok(t) => t,
        Err(e) => return responder.deny(ev, Reason::ClientNotAllowed, Some(e.to_string())),
    };
    ev.status = Some(200);
    let tunnel = mitm::Tunnel {
        peer: ev.src,
        token,
        dest,
        sni,
        scheme: Scheme::Https,
    };
    let ctx = ctx.clone();
    let permit = req.extensions().get::<Permit>().cloned();
    tokio::spawn(async move {
        let _active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Connect);
        let up = match hyper::upgrade::on(req).await {
            Ok(up) => up,
            Err(e) => {
                ev.error = Some(format!("upgrade: {e}"));
                return ctx.recorder.record(ev);
            }
        };
        if tunnel.dest.port == 443 {
            // TLS only: mitm reads the ClientHello and checks it.
            let Some(mitm) = ctx.mitm.clone() else {
                return record_stop(&ctx.recorder, ev, no_ca());
            };
            ev.note = Some("intercepted".into());
            let io = TokioIo::new(up);
            return mitm::run(io, Arc::new(tunnel), ev, ctx, mitm, permit).await;
        }
        match take_socket(up) {
            Ok((client, first)) => by_first_bytes(client, first, tunnel, ev, ctx, permit).await,
            Err(e) => {
                ev.error = Some(e.into());
                ctx.recorder.record(ev);
            }
        }
    });
    established()
}

fn no_ca() -> Stop {
    Stop::Deny(Reason::InspectionRequired, None)
}

/// The client's socket back from hyper, with whatever the client sent
/// behind its CONNECT.
fn take_socket(up: Upgraded) -> Result<(TcpStream, Vec<u8>), &'static str> {
    match up.downcast::<TokioIo<ChunkGuard<Rewind>>>() {
        Ok(parts) => {
            // Bytes put back that hyper did not read (it reads all it is
            // given first, so normally none) come before its own buffer's.
            let (socket, mut unread) = parts.io.into_inner().into_inner().into_parts();
            unread.extend_from_slice(&parts.read_buf);
            Ok((socket, unread))
        }
        Err(_) => Err("tunnel: client connection is not a TCP socket"),
    }
}

/// An inspected tunnel off port 443, by what the client sends first:
/// plain HTTP is served as HTTP; TLS is intercepted with a CA, and without
/// one it is what the policy gives a CONNECT egressd cannot look into
/// (`inspection_required`, or an opaque tunnel by another exception or in
/// report mode), once its ClientHello names the host.
async fn by_first_bytes(
    mut client: TcpStream,
    mut first: Vec<u8>,
    mut tunnel: mitm::Tunnel,
    mut ev: Event,
    ctx: Arc<ProxyCtx>,
    permit: Option<Permit>,
) {
    let rec = &ctx.recorder;
    // Enough to tell TLS (0x16 0x03) from anything else.
    let deadline = tokio::time::Instant::now() + ctx.header_timeout();
    let mut buf = vec![0u8; HELLO_READ];
    while first.is_empty() || first == [0x16] {
        let why = match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(0)) => "client closed before its first bytes".to_string(),
            Ok(Ok(n)) => {
                first.extend_from_slice(&buf[..n]);
                continue;
            }
            Ok(Err(e)) => format!("reading the first bytes: {e}"),
            Err(_) => "no first bytes in time".to_string(),
        };
        ev.error = Some(why);
        return rec.record(ev);
    }
    if sni::parse(&first) == Hello::NotTls {
        ev.note = Some("plain HTTP, decided per request".into());
        tunnel.scheme = Scheme::Http;
        let io = Rewind::new(client, first);
        return mitm::run_plain(io, Arc::new(tunnel), ev, ctx.clone(), permit).await;
    }
    if let Some(mitm) = ctx.mitm.clone() {
        ev.note = Some("intercepted".into());
        let io = Rewind::new(client, first);
        return mitm::run(io, Arc::new(tunnel), ev, ctx.clone(), mitm, permit).await;
    }
    if let Some((reason, note)) = read_hello(&mut client, &mut first, &tunnel.sni).await {
        ev.set_denied(reason);
        ev.note = Some(note);
        return rec.record(ev);
    }
    let policy = ctx.policy.snapshot();
    let now = unix_now();
    let opaque = async {
        let who = identify(&policy, &mut ev, tunnel.token.as_deref())?;
        let d = decide_opaque(&policy, who, &tunnel.dest, &mut ev, now);
        if !d.is_allowed() {
            return Err(Stop::Decided);
        }
        let conn = connect(&ctx, &policy, &mut ev, who, &tunnel.dest, &d, now).await?;
        Ok((conn, upload::tunnel(&d, &mut ev, policy.settings.mode)))
    };
    let (mut upstream_conn, cap) = match opaque.await {
        Ok(c) => c,
        Err(stop) => return record_stop(rec, ev, stop),
    };
    if let Err(e) = upstream_conn.write_all(&first).await {
        ev.error = Some(format!("upstream write: {e}"));
        return rec.record(ev);
    }
    drop(policy);
    if !rec.open_settled(&mut ev).await {
        return rec.record(ev);
    }
    relay::tcp(
        client,
        upstream_conn,
        first.len() as u64,
        Box::new(ev),
        rec.clone(),
        &ctx.pipes,
        cap,
    )
    .await;
}

/// The decision for a tunnel egressd cannot look into, noted in `ev`.
fn decide_opaque<'p>(
    policy: &'p Policy,
    client: Option<ClientIdx>,
    dest: &Dest,
    ev: &mut Event,
    now: i64,
) -> Decision<'p> {
    let preq = policy::Request {
        proto: Proto::Connect,
        client,
        target: &dest.target,
        port: dest.port,
        method: None,
        path: None,
        qtype: None,
        can_intercept: false,
    };
    let d = policy.decide_to_serve(&preq, now);
    ev.set_decision(&d, policy.settings.mode);
    d
}

/// A connection to the first checked address of `dest` that answers,
/// noted in `ev`.
async fn connect(
    ctx: &ProxyCtx,
    policy: &Policy,
    ev: &mut Event,
    client: Option<ClientIdx>,
    dest: &Dest,
    d: &Decision<'_>,
    now: i64,
) -> Result<TcpStream, Stop> {
    let reach = upstream::Reach {
        dest,
        exception: d.exception,
        client,
        now,
    };
    let addrs = upstream::check_destination(ctx, policy, reach, ev).await?;
    let conn = upstream::connect_checked(ctx, &addrs, ev).await?;
    debug_assert!(
        d.report_only || !d.exception.is_some_and(Exception::needs_inspection),
        "opaque tunnels are never allowed for exceptions needing inspection"
    );
    Ok(conn)
}

/// An opaque tunnel, once hyper gives up the client's connection: the
/// client's socket and the bytes it has sent upstream already, once its
/// ClientHello is checked where it is due; `Err` when the tunnel ends
/// here, with why noted in `ev`.
async fn judge(
    up: Upgraded,
    upstream_conn: &mut TcpStream,
    ev: &mut Event,
    rule: &SniRule,
) -> Result<Judged, ()> {
    // Take the client's socket back from hyper, with whatever the client
    // sent behind its CONNECT, so the tunnel can copy socket to socket and
    // hold no buffer while idle.
    let (mut client, mut first) = take_socket(up).map_err(|e| ev.error = Some(e.into()))?;
    // Off port 443 a server may speak first (SSH, SMTP): its greeting
    // means the client's first bytes are an answer, not a ClientHello.
    let server_first = if first.is_empty() && !rule.tls_only() {
        server_speaks_first(&client, upstream_conn)
            .await
            .ok_or_else(|| ev.error = Some("tunnel idle before its first byte".into()))?
    } else {
        false
    };
    if !server_first {
        if let Some((reason, note)) = read_hello(&mut client, &mut first, rule).await {
            ev.set_denied(reason);
            ev.note = Some(note);
            ev.bytes_up = 0;
            ev.bytes_down = 0;
            return Err(());
        }
    }
    if !server_first && read_request_line(&mut client, &mut first).await {
        return Ok(Judged::Http(client, std::mem::take(&mut first)));
    }
    if !first.is_empty() {
        upstream_conn
            .write_all(&first)
            .await
            .map_err(|e| ev.error = Some(format!("upstream write: {e}")))?;
    }
    Ok(Judged::Relay(client, first.len() as u64))
}

/// Longest first line read to tell an HTTP/1 request inside a tunnel.
const MAX_REQUEST_LINE: usize = 8192;

/// Whether the client's first bytes (in `first`, read further within
/// [`HELLO_TIMEOUT`] while undecided) are an HTTP/1 request line: a method
/// token, a space, and a line that ends in ` HTTP/1.x`.
async fn read_request_line(client: &mut TcpStream, first: &mut Vec<u8>) -> bool {
    let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    let mut buf = vec![0u8; HELLO_READ];
    loop {
        if let Some(is) = http1_request_line(first) {
            return is;
        }
        match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => first.extend_from_slice(&buf[..n]),
            // Undecided when the client stops: not an HTTP request (the
            // bytes so far go upstream as they would have).
            _ => return false,
        }
    }
}

/// `Some(true)` when `b` starts with an HTTP/1 request line, `Some(false)`
/// when it cannot, `None` while more bytes could tell.
fn http1_request_line(b: &[u8]) -> Option<bool> {
    let token = b.iter().take_while(|c| c.is_ascii_uppercase()).count();
    if token == b.len() {
        return (token > 20).then_some(false);
    }
    if token == 0 || b[token] != b' ' {
        return Some(false);
    }
    let Some(nl) = b.iter().position(|c| *c == b'\n') else {
        return (b.len() >= MAX_REQUEST_LINE).then_some(false);
    };
    let line = b[..nl].strip_suffix(b"\r").unwrap_or(&b[..nl]);
    Some(line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0"))
}

/// Reads the client's first bytes into `first` (which holds what arrived
/// with the CONNECT) until they are judged: a whole ClientHello, or bytes
/// that are not TLS (which pass off port 443). At most [`HELLO_TIMEOUT`]
/// on port 443; elsewhere the client may take as long as an idle tunnel
/// lasts before its first byte, and then [`HELLO_TIMEOUT`] for the rest of
/// a ClientHello. `None` when they may pass, else the reason and a note.
async fn read_hello(
    client: &mut TcpStream,
    first: &mut Vec<u8>,
    rule: &SniRule,
) -> Option<(Reason, String)> {
    let mut buf = vec![0u8; HELLO_READ];
    let now = tokio::time::Instant::now;
    let mut deadline = match (first.is_empty(), rule.tls_only()) {
        (true, false) => now() + IDLE_TIMEOUT,
        _ => now() + HELLO_TIMEOUT,
    };
    loop {
        match sni::parse(first) {
            Hello::Incomplete if first.len() < sni::MAX_HELLO => {}
            h => return rule.judge(&h),
        }
        let why = match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(0)) => "client closed before its ClientHello".to_string(),
            Ok(Ok(n)) => {
                if first.is_empty() {
                    deadline = deadline.min(now() + HELLO_TIMEOUT);
                }
                first.extend_from_slice(&buf[..n]);
                continue;
            }
            Ok(Err(e)) => format!("reading ClientHello: {e}"),
            Err(_) => "no ClientHello in time".to_string(),
        };
        return Some((Reason::SniMismatch, why));
    }
}

/// Whether the server spoke before the client (`None`: neither did while
/// an idle tunnel lasts). Only readiness is looked at; nothing is read.
async fn server_speaks_first(client: &TcpStream, upstream: &TcpStream) -> Option<bool> {
    let first = async {
        tokio::select! {
            biased;
            r = client.readable() => r.is_err(),
            r = upstream.readable() => r.is_ok(),
        }
    };
    tokio::time::timeout(IDLE_TIMEOUT, first).await.ok()
}

#[cfg(test)]
mod tests {
    use super::http1_request_line;

    #[test]
    fn request_lines_are_told_from_other_first_bytes() {
        assert_eq!(http1_request_line(b"GET / HTTP/1.1\r\n"), Some(true));
        assert_eq!(
            http1_request_line(b"POST http://a.test/ HTTP/1.0\n"),
            Some(true)
        );
        assert_eq!(http1_request_line(b"GE"), None);
        assert_eq!(http1_request_line(b"GET /partial"), None);
        assert_eq!(http1_request_line(b"SSH-2.0-OpenSSH_9.6\r\n"), Some(false));
        assert_eq!(http1_request_line(b"get / HTTP/1.1\r\n"), Some(false));
        assert_eq!(http1_request_line(b"GET / SPDY\r\n"), Some(false));
        assert_eq!(http1_request_line(b"\x00\x01"), Some(false));
    }
}
