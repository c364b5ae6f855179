//! CONNECT tunnels: the edge. The decision is made on the request-target
//! authority alone, before any byte reaches the destination; a refused
//! CONNECT gets its 403 and the connection is closed, so nothing the client
//! pipelined behind it is ever read as a request. On port 443 the
//! ClientHello is read first and a server name other than the CONNECT host
//! closes the tunnel (`sni_mismatch`, no domain fronting). Then `relay`
//! moves the bytes both ways.
//!
//! With interception enabled (`--ca-dir`), a CONNECT whose exception needs
//! method/path rules or injected credentials is handed to `mitm` instead:
//! egressd terminates TLS and decides each request inside.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::admit::{admit, request_token, Draft};
use super::dest::{check_host_headers, parse_authority, Dest};
use super::mitm;
use super::relay::{self, pipe::PipePool};
use super::respond::{self, ProxyBody, Responder, Stop};
use super::sni::{self, Hello, SniRule, HELLO_TIMEOUT};
use super::upstream;
use super::ProxyCtx;
use crate::metrics::ActiveGuard;
use crate::policy::{self, ClientIdx, Decision, Exception, Policy, Proto, Reason, Verdict};
use crate::record::{Event, Recorder};
use crate::shutdown::Permit;
use crate::time::unix_now;

/// Read buffer for a ClientHello that arrives in pieces.
const HELLO_READ: usize = 4096;

pub async fn handle(
    req: Request<Incoming>,
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
        return intercept(req, ev, dest, sni, &ctx, &responder);
    }
    let upstream_conn = match connect(&ctx, &policy, &mut ev, client, &dest, &d, now).await {
        Ok(c) => c,
        Err(stop) => return responder.stop(ev, stop),
    };
    ev.status = Some(200);
    let (rec, pipes) = (ctx.recorder.clone(), ctx.pipes.clone());
    // The tunnel outlives hyper's connection: it keeps the connection's
    // permit until it closes.
    let permit = req.extensions().get::<Permit>().cloned();
    tokio::spawn(async move {
        let _permit = permit;
        let _active = ActiveGuard::new(&rec.metrics, Proto::Connect);
        match hyper::upgrade::on(req).await {
            Ok(up) => run_tunnel(up, upstream_conn, ev, sni, rec, &pipes).await,
            Err(e) => {
                ev.error = Some(format!("upgrade: {e}"));
                rec.record(ev);
            }
        }
    });
    established()
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
        can_intercept: ctx.mitm.is_some(),
    };
    let d = policy.decide(&preq, now);
    ev.set_decision(&d, policy.settings.mode);
    d
}

/// Hands an intercepted CONNECT to `mitm` once hyper gives up the
/// connection. Nothing is resolved or dialled yet: each request inside is
/// decided on its own and reaches the origin through the shared request
/// path. This line records the tunnel; each request gets its own.
fn intercept(
    req: Request<Incoming>,
    mut ev: Event,
    dest: Dest,
    sni: SniRule,
    ctx: &Arc<ProxyCtx>,
    responder: &Responder<'_>,
) -> Response<ProxyBody> {
    let Some(mitm) = ctx.mitm.clone() else {
        return responder.deny(ev, Reason::InspectionRequired, None);
    };
    let token = match request_token(&req) {
        Ok(t) => t,
        Err(e) => return responder.deny(ev, Reason::ClientNotAllowed, Some(e.to_string())),
    };
    ev.status = Some(200);
    ev.note = Some("intercepted".into());
    let tunnel = Arc::new(mitm::Tunnel {
        peer: ev.src,
        token,
        dest,
        sni,
    });
    let ctx = ctx.clone();
    let permit = req.extensions().get::<Permit>().cloned();
    tokio::spawn(async move {
        let _active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Connect);
        match hyper::upgrade::on(req).await {
            Ok(up) => mitm::run(TokioIo::new(up), tunnel, ev, ctx, mitm, permit).await,
            Err(e) => {
                ev.error = Some(format!("upgrade: {e}"));
                ctx.recorder.record(ev);
            }
        }
    });
    established()
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
    let addrs =
        upstream::check_destination(ctx, policy, d.exception, client, dest, ev, now).await?;
    let conn = upstream::connect_checked(ctx, &addrs, ev).await?;
    debug_assert!(
        !d.exception.is_some_and(Exception::needs_inspection),
        "opaque tunnels are never allowed for exceptions needing inspection"
    );
    Ok(conn)
}

/// An opaque tunnel, once hyper gives up the client's connection: the
/// ClientHello checked where it is due, then the bytes relayed.
async fn run_tunnel(
    up: Upgraded,
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
    if rule.applies() {
        if let Some((reason, note)) = read_hello(&mut client, &mut first, &rule).await {
            ev.set_denied(reason);
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
    relay::tcp(client, upstream_conn, first.len() as u64, ev, rec, pipes).await;
}

/// Reads the client's ClientHello into `first` (which holds what arrived
/// with the CONNECT), at most [`HELLO_TIMEOUT`]: `None` when it may pass,
/// else the reason and a note.
async fn read_hello(
    client: &mut TcpStream,
    first: &mut Vec<u8>,
    rule: &SniRule,
) -> Option<(Reason, String)> {
    let mut buf = vec![0u8; HELLO_READ];
    let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    loop {
        match sni::parse(first) {
            Hello::Incomplete if first.len() < sni::MAX_HELLO => {}
            h => return rule.judge(&h),
        }
        let why = match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(0)) => "client closed before its ClientHello".to_string(),
            Ok(Ok(n)) => {
                first.extend_from_slice(&buf[..n]);
                continue;
            }
            Ok(Err(e)) => format!("reading ClientHello: {e}"),
            Err(_) => "no ClientHello in time".to_string(),
        };
        return Some((Reason::SniMismatch, why));
    }
}
