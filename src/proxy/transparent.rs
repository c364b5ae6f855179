//! Transparent capture (`egressd run --transparent`): TCP connections that
//! nftables inside the sandbox redirected to a capture listener, from
//! programs that ignore the proxy variables.
//!
//! ```text
//!  accept ─► original destination ─► peek the first bytes ─┬─ HTTP request line ─► by Host:
//!            (SO_ORIGINAL_DST, in     (bounded wait)        │   forward::decide_and_forward
//!             the sandbox's conntrack)                      └─ anything else ─► one decision by
//!                  TLS server name | name the client resolved here | the address,
//!                  then a checked address of that name ─► splice ─► one log line
//! ```
//!
//! The original destination is read on the accepted socket: the socket
//! lives in the sandbox's network namespace, and so does the connection
//! tracking entry the redirect made, wherever the descriptor was passed.
//!
//! The first bytes are only peeked (left in the socket): a client that
//! speaks first (HTTP, TLS, most database protocols) has sent them within
//! [`PEEK_TIMEOUT`]; one that waits for the server (SSH, SMTP, MySQL) has
//! not, and is decided by name alone. On port 443, where every client
//! speaks first, the wait is `tunnel::HELLO_TIMEOUT`.
//!
//! What the connection is decided as:
//! - plain HTTP (`GET /x HTTP/1.1`): each request by its `Host`, through
//!   the same path as the forward proxy (`proto: http`); proxy-form
//!   requests (absolute URI, CONNECT) aimed at a captured address are
//!   served exactly as the proxy serves them.
//! - anything else (`proto: connect`): by the TLS server name; else by an
//!   allowed name the client resolved through egressd to this address
//!   (`dns::answers`: the first of them the policy allows); else by the
//!   address itself (which only an exception's `cidrs` can allow). On port
//!   443 the ClientHello rules of CONNECT apply (`SniRule`).
//! - to a name's own address inside the sandbox (`dns::inside`, 198.18/15):
//!   by that name alone; a TLS server name naming another is refused
//!   (`sni_mismatch`), so no connection carries two names' requests (HTTP/2
//!   coalescing).
//!
//! Where the connection goes: never blindly to the original destination.
//! The decided name is resolved and every address checked, as for a proxied
//! request (`upstream::resolve_checked`); the original destination is
//! dialled when it is one of those checked addresses, and otherwise a
//! checked address of the name is (through `--upstream-proxy` when one is
//! set, like every way out), noted in the log line. That is what a
//! CONNECT to the name would reach, so a client cannot use an allowed name
//! to reach an address of its own choosing; refusing instead would gain no
//! safety and would break clients whose answer is older or newer than
//! egressd's own (CDN rotation) or pinned (`curl --resolve`).
//!
//! Every connection gets exactly one log line with the note `transparent:
//! to ADDR, name from …` (plain HTTP: one per request), decided or not.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request, Response};
use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};

use super::accept::{accept_loop, serve_http1, Refusal};
use super::admit::{accepting, client_of, identify};
use super::dest::{parse_authority, Dest};
use super::exchange::{decide_and_forward, request_event, truncate_path, Inbound};
use super::origin::Scheme;
use super::relay;
use super::respond::{self, record_stop, ProxyBody, Responder, Stop};
use super::rewind::Rewind;
use super::sni::{self, Hello, SniRule, HELLO_TIMEOUT};
use super::upload;
use super::upstream::{self, Reach};
use super::{forward, mitm, tunnel, ProxyCtx};
use crate::dns::inside;
use crate::metrics::ActiveGuard;
use crate::policy::host::{parse_host, Target};
use crate::policy::{self, canonical_ip, ClientIdx, Decision, Policy, Proto, Reason, Verdict};
use crate::record::Event;
use crate::shutdown::{Permit, Shutdown};
use crate::time::unix_now;

/// How long a client that has sent nothing yet is given before it is taken
/// for one that waits for the server to speak first.
pub const PEEK_TIMEOUT: Duration = Duration::from_millis(300);
/// How often a partly arrived ClientHello or request line is looked at
/// again (a peek does not wait for more bytes than are already there).
const PEEK_RETRY: Duration = Duration::from_millis(5);
/// First peek buffer; grown up to `sni::MAX_HELLO` for large ClientHellos.
const PEEK_START: usize = 4096;
/// Longest method token looked for in a request line.
const MAX_METHOD: usize = 16;

/// Where a connection's name came from, as the log line's note says.
const FROM_SNI: &str = "the TLS server name";
const FROM_HOST: &str = "the Host header";
const FROM_DNS: &str = "a DNS answer egressd gave";
const FROM_INSIDE: &str = "the address egressd gave that name inside the sandbox";

/// Serves one capture listener until `shutdown` fires; open connections
/// finish on their own.
pub async fn serve(listener: TcpListener, ctx: Arc<ProxyCtx>, shutdown: Shutdown) {
    accept_loop(
        listener,
        ctx,
        shutdown,
        " on the capture listener",
        Refusal::Close,
        handle,
    )
    .await
}

/// What the first bytes of a captured connection say it is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// Nothing within the wait (or end of stream before any byte).
    Silent,
    /// A TLS handshake record: what `sni::parse` made of it.
    Tls(Hello),
    /// An HTTP/1 request line.
    Http,
    /// Bytes of some other protocol.
    Opaque,
}

/// A captured connection that is not plain HTTP, as it arrived: from
/// whom, where it was going, what its first bytes are.
struct Captured {
    peer: SocketAddr,
    orig: SocketAddr,
    kind: Kind,
}

/// Where a connection was going and how its name was found, for the log
/// line (`None`: it had none, and was decided by its address).
fn note(orig: SocketAddr, source: Option<&str>) -> String {
    match source {
        Some(s) => format!("transparent: to {orig}, name from {s}"),
        None => format!("transparent: to {orig}, no name (decided by the address)"),
    }
}

async fn handle(stream: TcpStream, peer: SocketAddr, ctx: Arc<ProxyCtx>, permit: Permit) {
    let mut ev = Event::new(Proto::Connect, peer);
    let orig = match original_destination(&stream) {
        Ok(a) => a,
        Err(e) => {
            ev.set_denied(Reason::Malformed);
            ev.note = Some(format!("transparent: no original destination ({e})"));
            ctx.recorder.record(ev);
            return;
        }
    };
    ev.port = Some(orig.port());
    // The rules never redirect loopback: this is a connection made to the
    // capture listener itself.
    if canonical_ip(orig.ip()).is_loopback() {
        ev.host = Some(canonical_ip(orig.ip()).to_string());
        ev.set_denied(Reason::LoopDetected);
        ev.note = Some(format!(
            "transparent: {orig} is the capture listener itself"
        ));
        ctx.recorder.record(ev);
        return;
    }
    let kind = match sniff(&stream, orig.port()).await {
        Ok(k) => k,
        Err(e) => {
            ev.set_denied(Reason::Malformed);
            ev.note = Some(format!("transparent: to {orig}"));
            ev.error = Some(format!("reading the first bytes: {e}"));
            ctx.recorder.record(ev);
            return;
        }
    };
    if kind == Kind::Http {
        serve_http(stream, peer, orig, ctx, permit).await;
    } else {
        carry(stream, Captured { peer, orig, kind }, ev, ctx, permit).await;
    }
}

/// The original destination of a redirected connection (its connection
/// tracking entry, in the namespace of the socket).
fn original_destination(s: &TcpStream) -> io::Result<SocketAddr> {
    let fd = s.as_raw_fd();
    match s.local_addr()? {
        SocketAddr::V4(_) => {
            // SAFETY: sockaddr_in is plain data; the kernel writes at most
            // `len` bytes into it.
            let mut sin: libc::sockaddr_in = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_IP,
                    libc::SO_ORIGINAL_DST,
                    &mut sin as *mut libc::sockaddr_in as *mut libc::c_void,
                    &mut len,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        SocketAddr::V6(_) => {
            // SAFETY: as above, for sockaddr_in6.
            let mut sin6: libc::sockaddr_in6 = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_IPV6,
                    libc::IP6T_SO_ORIGINAL_DST,
                    &mut sin6 as *mut libc::sockaddr_in6 as *mut libc::c_void,
                    &mut len,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                0,
                0,
            )))
        }
    }
}

/// Peeks at what the client sent first, without taking it from the socket.
async fn sniff(stream: &TcpStream, port: u16) -> io::Result<Kind> {
    let wait = if port == 443 {
        HELLO_TIMEOUT
    } else {
        PEEK_TIMEOUT
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = vec![0u8; PEEK_START];
    let mut seen = 0;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Err(_) => break,
            Ok(r) => r?,
        };
        if n == 0 {
            break; // end of stream: nothing more will come
        }
        let partial = match classify(&buf[..n]) {
            Some(kind) => return Ok(kind),
            None => n,
        };
        if partial == buf.len() && buf.len() < sni::MAX_HELLO {
            buf.resize((buf.len() * 2).min(sni::MAX_HELLO), 0);
        } else if partial == seen {
            // The same bytes again: wait for more to arrive.
            if tokio::time::Instant::now() + PEEK_RETRY > deadline {
                break;
            }
            tokio::time::sleep(PEEK_RETRY).await;
        }
        seen = partial;
    }
    // Out of time or input: what is there decides.
    Ok(match buf.get(..seen) {
        Some([]) | None => Kind::Silent,
        Some(b) if b[0] == 0x16 => Kind::Tls(sni::parse(b)),
        Some(_) => Kind::Opaque,
    })
}

/// `None` while more bytes are needed to tell.
fn classify(b: &[u8]) -> Option<Kind> {
    if b.is_empty() {
        return None;
    }
    if b[0] == 0x16 {
        return match sni::parse(b) {
            Hello::Incomplete if b.len() < sni::MAX_HELLO => None,
            Hello::Incomplete => Some(Kind::Tls(Hello::Malformed)),
            h => Some(Kind::Tls(h)),
        };
    }
    match http_request_line(b) {
        Some(true) => Some(Kind::Http),
        Some(false) => Some(Kind::Opaque),
        None => None,
    }
}

/// Whether `b` starts an HTTP/1 request line: an upper-case method, a
/// space, and an origin-form (`/…`), asterisk, absolute (`http://…`) or
/// CONNECT target. `None` until enough bytes have come to tell.
fn http_request_line(b: &[u8]) -> Option<bool> {
    let method_len = b.iter().take_while(|c| c.is_ascii_uppercase()).count();
    if method_len == b.len() {
        return (method_len > MAX_METHOD).then_some(false);
    }
    if method_len == 0 || method_len > MAX_METHOD || b[method_len] != b' ' {
        return Some(false);
    }
    let method = &b[..method_len];
    let target = &b[method_len + 1..];
    if target.is_empty() {
        return None;
    }
    if method == b"CONNECT" || target[0] == b'/' || target[0] == b'*' {
        return Some(true);
    }
    const ABSOLUTE: &[u8] = b"http://";
    let n = target.len().min(ABSOLUTE.len());
    if !target[..n].eq_ignore_ascii_case(&ABSOLUTE[..n]) {
        return Some(false);
    }
    (n == ABSOLUTE.len()).then_some(true)
}

// ---------------------------------------------------------------- plain HTTP

async fn serve_http(
    stream: TcpStream,
    peer: SocketAddr,
    orig: SocketAddr,
    ctx: Arc<ProxyCtx>,
    permit: Permit,
) {
    let note = Some(format!("transparent: to {orig}"));
    let stream = Rewind::new(stream, Vec::new());
    let active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Http);
    serve_http1(stream, peer, ctx, permit, active, note, move |req, ctx| {
        request(req, peer, orig, ctx)
    })
    .await
}

/// One request on a captured plain-HTTP connection: its `Host` names the
/// destination (on the port the client connected to).
async fn request(
    req: Request<Incoming>,
    peer: SocketAddr,
    orig: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    // A proxy request sent to a captured address gets the proxy's answer.
    if req.method() == Method::CONNECT {
        return tunnel::handle(req, peer, ctx).await;
    }
    if req.uri().scheme().is_some() {
        return forward::handle(req, peer, ctx).await;
    }
    let policy = ctx.policy.snapshot();
    let mut ev = request_event(Proto::Http, peer, &req);
    let shown_host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| orig.to_string());
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let what = move || format!("{method} http://{shown_host}{}", truncate_path(uri.path()));
    let responder = Responder {
        what: &what,
        contact: &policy.settings.contact,
        close: false,
        json: respond::wants_json(req.headers()),
        rec: &ctx.recorder,
    };
    // Details of refusals made here go into the note, after `transparent`'s.
    ev.note = Some(note(orig, Some(FROM_HOST)));
    let edge = client_of(&policy, &mut ev, &req).and_then(|client| {
        let dest = captured_dest(&req, &ctx, peer, orig, &mut ev)?;
        accepting(&ctx.recorder)?;
        let path = captured_path(&req, &dest, orig)?;
        Ok((client, dest, path))
    });
    let (client, dest, path) = match edge {
        Ok(x) => x,
        Err(stop) => return responder.stop(ev, stop),
    };
    ev.path = Some(truncate_path(&path));
    let inbound = Inbound {
        client,
        dest: &dest,
        path: &path,
        scheme: Scheme::Http,
    };
    decide_and_forward(&ctx, &policy, req, ev, inbound, &responder).await
}

/// The destination a captured request names: its one `Host` header (on
/// the port connected to, if it names none), or for an HTTP/1.0 request
/// without one, whatever a nameless connection is decided by. Noted in
/// `ev`, with where the name came from.
fn captured_dest<B>(
    req: &Request<B>,
    ctx: &ProxyCtx,
    peer: SocketAddr,
    orig: SocketAddr,
    ev: &mut Event,
) -> Result<Dest, Stop> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let dest = match (hosts.next(), hosts.next()) {
        (Some(h), None) => h
            .to_str()
            .ok()
            .and_then(|h| parse_authority(h, Some(orig.port())).ok())
            .ok_or_else(|| Stop::malformed("the Host header is not host[:port]"))?,
        (None, _) => {
            let (target, source) = nameless_target(ctx, peer, orig);
            ev.note = Some(note(orig, source));
            Dest {
                target,
                port: orig.port(),
            }
        }
        (Some(_), Some(_)) => return Err(Stop::malformed("more than one Host header")),
    };
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);
    Ok(dest)
}

/// The request's normalised path, once its `Host` agrees with the port the
/// connection was made to.
fn captured_path<B>(req: &Request<B>, dest: &Dest, orig: SocketAddr) -> Result<String, Stop> {
    if dest.port != orig.port() {
        return Err(Stop::Deny(
            Reason::HostMismatch,
            Some(format!(
                "the Host header names port {}, the connection was made to port {}",
                dest.port,
                orig.port()
            )),
        ));
    }
    super::gate::policy_path(&dest.target, req.uri().path()).map_err(Stop::malformed)
}

/// The name of a connection that names nothing itself: the most recent
/// allowed name its client resolved here to that address, else the
/// address.
fn nameless_target(
    ctx: &ProxyCtx,
    peer: SocketAddr,
    orig: SocketAddr,
) -> (Target, Option<&'static str>) {
    match ctx.resolver.recall(peer.ip(), orig.ip()).into_iter().next() {
        Some(h) => (Target::Name(h), Some(FROM_DNS)),
        None => (Target::Ip(canonical_ip(orig.ip())), None),
    }
}

// ---------------------------------------------------------------- everything else

/// A connection that is not plain HTTP: one decision, one checked
/// address, bytes relayed both ways, one log line.
async fn carry(
    client: TcpStream,
    conn: Captured,
    mut ev: Event,
    ctx: Arc<ProxyCtx>,
    permit: Permit,
) {
    let (peer, orig) = (conn.peer, conn.orig);
    let _active = ActiveGuard::new(&ctx.recorder.metrics, Proto::Connect);
    let rec = &ctx.recorder;
    let policy = ctx.policy.snapshot();
    // A captured connection carries no Proxy-Authorization: the client is
    // whoever its source address names.
    let who = identify(&policy, &mut ev, None).unwrap_or(None);
    ev.mode = policy.settings.mode;
    let now = unix_now();
    let (dest, d) = match decide_captured(&ctx, &policy, &conn, who, &mut ev, now) {
        Ok(x) => x,
        Err(stop) => return record_stop(rec, ev, stop),
    };
    let rule = SniRule::new(&dest, d.exception, policy.settings.missing_sni);
    if d.verdict == Verdict::Intercept {
        let Some(mitm) = ctx.mitm.clone() else {
            return record_stop(rec, ev, Stop::Deny(Reason::InspectionRequired, None));
        };
        // The ClientHello is still in the socket: mitm reads it, checks it
        // against `rule`, and decides every request inside.
        ev.add_note(Some("intercepted".into()));
        let tunnel = Arc::new(mitm::Tunnel {
            peer,
            token: None,
            dest,
            sni: rule,
            scheme: Scheme::Https,
        });
        let ctx2 = ctx.clone();
        drop(policy);
        mitm::run(client, tunnel, ev, ctx2, mitm, Some(permit)).await;
        return;
    }
    let exception = d.exception;
    let connected = async {
        check_hello(&conn.kind, &rule, orig)?;
        let reach = Reach {
            dest: &dest,
            exception,
            client: who,
            now,
        };
        connect_captured(&ctx, &policy, reach, orig, &mut ev).await
    };
    let upstream_conn = match connected.await {
        Ok(c) => c,
        Err(stop) => return record_stop(rec, ev, stop),
    };
    let cap = upload::tunnel(&d, &mut ev, policy.settings.mode);
    drop(policy);
    if !rec.open_settled(&mut ev).await {
        return rec.record(ev);
    }
    // The peeked bytes are still in the client's socket: the relay
    // carries them like everything after.
    relay::tcp(
        client,
        upstream_conn,
        0,
        Box::new(ev),
        rec.clone(),
        &ctx.pipes,
        cap,
    )
    .await;
}

/// The names a connection may be decided by, in order of preference: the
/// TLS server name; else the allowed names its client resolved here to
/// this address; else the address itself.
fn candidates(
    conn: &Captured,
    ctx: &ProxyCtx,
) -> Result<(Vec<Target>, Option<&'static str>), Stop> {
    let (kind, peer, orig) = (&conn.kind, conn.peer, conn.orig);
    let sni = match kind {
        Kind::Tls(Hello::ClientHello {
            sni: Some(name), ..
        }) => Some(name),
        _ => None,
    };
    // A name's own address inside the sandbox carries that name only: a
    // client cannot coalesce another name's requests onto it.
    if inside::is_inside(orig.ip()) {
        let Some(own) = ctx.resolver.inside_name(orig.ip()) else {
            return Err(Stop::Deny(
                Reason::NoException,
                Some(format!(
                    "{} is no name's address inside the sandbox (an answer from before \
                     egressd started, or given up since)",
                    orig.ip()
                )),
            ));
        };
        if let Some(name) = sni {
            if parse_host(name).ok().as_ref() != Some(&own) {
                return Err(Stop::Deny(
                    Reason::SniMismatch,
                    Some(format!(
                        "the TLS server name {name} is not {own}, whose address inside the \
                         sandbox {} is: a connection to one name's address carries that name \
                         only",
                        orig.ip()
                    )),
                ));
            }
        }
        let source = if sni.is_some() { FROM_SNI } else { FROM_INSIDE };
        return Ok((vec![Target::Name(own)], Some(source)));
    }
    if let Some(name) = sni {
        return match parse_host(name) {
            Ok(h) => Ok((vec![Target::Name(h)], Some(FROM_SNI))),
            Err(e) => Err(Stop::malformed(format!(
                "the TLS server name is not a host name: {e}"
            ))),
        };
    }
    let names = ctx.resolver.recall(peer.ip(), orig.ip());
    if names.is_empty() {
        return Ok((vec![Target::Ip(canonical_ip(orig.ip()))], None));
    }
    Ok((
        names.into_iter().map(Target::Name).collect(),
        Some(FROM_DNS),
    ))
}

/// One decision for a captured connection: the first candidate name the
/// policy allows, else the first one's denial (`Stop::Decided`).
fn decide_captured<'p>(
    ctx: &ProxyCtx,
    policy: &'p Policy,
    conn: &Captured,
    who: Option<ClientIdx>,
    ev: &mut Event,
    now: i64,
) -> Result<(Dest, Decision<'p>), Stop> {
    let (kind, orig) = (&conn.kind, conn.orig);
    let (candidates, source) = match candidates(conn, ctx) {
        Ok(c) => c,
        Err(stop) => {
            let sni = match kind {
                Kind::Tls(Hello::ClientHello { sni, .. }) => sni.clone(),
                _ => None,
            };
            ev.note = Some(note(orig, sni.as_ref().map(|_| FROM_SNI)));
            ev.host = match sni {
                // A name that is not a host name is not logged as one.
                Some(n) => parse_host(&n).ok().map(|h| h.to_string()),
                None => Some(canonical_ip(orig.ip()).to_string()),
            };
            return Err(stop);
        }
    };
    ev.note = Some(note(orig, source));
    if let Err(stop) = accepting(&ctx.recorder) {
        ev.host = Some(candidates[0].to_string());
        return Err(stop);
    }
    let can_intercept = ctx.mitm.is_some() && matches!(kind, Kind::Tls(Hello::ClientHello { .. }));
    let decide = |target: &Target| {
        policy.decide(
            &policy::Request {
                proto: Proto::Connect,
                client: who,
                target,
                port: orig.port(),
                method: None,
                path: None,
                qtype: None,
                can_intercept,
            },
            now,
        )
    };
    let (target, mut d) = candidates
        .iter()
        .map(|t| (t, decide(t)))
        .find(|(_, d)| d.is_allowed())
        .unwrap_or_else(|| (&candidates[0], decide(&candidates[0])));
    if d.exception.is_some_and(|e| e.grant().is_some()) {
        // The name chosen is served: a grant that allows it gives one use
        // (or, raced out of its last one, no longer matches).
        d = policy.decide_to_serve(
            &policy::Request {
                proto: Proto::Connect,
                client: who,
                target,
                port: orig.port(),
                method: None,
                path: None,
                qtype: None,
                can_intercept,
            },
            now,
        );
    }
    ev.host = Some(target.to_string());
    ev.set_decision(&d, policy.settings.mode);
    if !d.is_allowed() {
        return Err(Stop::Decided);
    }
    let dest = Dest {
        target: target.clone(),
        port: orig.port(),
    };
    Ok((dest, d))
}

/// Port 443 gets CONNECT's ClientHello rules: TLS, naming the host.
fn check_hello(kind: &Kind, rule: &SniRule, orig: SocketAddr) -> Result<(), Stop> {
    if orig.port() != 443 {
        return Ok(());
    }
    let verdict = match kind {
        Kind::Tls(h) => rule.judge(h),
        Kind::Silent => Some((Reason::SniMismatch, "no ClientHello in time".into())),
        Kind::Http | Kind::Opaque => rule.judge(&Hello::NotTls),
    };
    match verdict {
        Some((reason, why)) => Err(Stop::Deny(reason, Some(why))),
        None => Ok(()),
    }
}

/// A connection to a checked address of the decided name: the original
/// destination when it is one of them, else another (noted).
async fn connect_captured(
    ctx: &ProxyCtx,
    policy: &Policy,
    reach: Reach<'_>,
    orig: SocketAddr,
    ev: &mut Event,
) -> Result<TcpStream, Stop> {
    let dest = reach.dest;
    let checked = upstream::check_destination(ctx, policy, reach, ev).await?;
    let addrs = prefer_original(checked, orig);
    // A name's own address inside is never dialled: it stands for the name.
    if canonical_ip(addrs[0].ip()) != canonical_ip(orig.ip()) && !inside::is_inside(orig.ip()) {
        ev.add_note(Some(format!(
            "{} is not a checked address of {}: connected to one that is",
            orig.ip(),
            dest.target
        )));
    }
    upstream::connect_checked(ctx, &addrs, ev).await
}

/// The checked addresses with the original destination first, if it is
/// one of them.
fn prefer_original(mut addrs: Vec<SocketAddr>, orig: SocketAddr) -> Vec<SocketAddr> {
    let want: IpAddr = canonical_ip(orig.ip());
    if let Some(i) = addrs.iter().position(|a| canonical_ip(a.ip()) == want) {
        let a = addrs.remove(i);
        addrs.insert(0, a);
    }
    addrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_told_from_other_protocols() {
        for yes in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"POST /x",
            b"OPTIONS * HTTP/1.1",
            b"GET http://a.test/ HTTP/1.1",
            b"CONNECT a.test:443 HTTP/1.1",
        ] {
            assert_eq!(http_request_line(yes), Some(true), "{yes:?}");
        }
        for no in [
            &b"SSH-2.0-OpenSSH_9.6\r\n"[..],
            b"PING\r\n",
            b"GET key\r\n",
            b"get / HTTP/1.1",
            b" / HTTP/1.1",
            b"GET ftp://a.test/",
            b"\x00\x00\x00\x08\x04\xd2\x16\x2f",
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZ / HTTP/1.1",
        ] {
            assert_eq!(http_request_line(no), Some(false), "{no:?}");
        }
        for undecided in [&b"GE"[..], b"GET", b"GET ", b"GET htt"] {
            assert_eq!(http_request_line(undecided), None, "{undecided:?}");
        }
    }

    #[test]
    fn first_bytes_classify() {
        let hello = sni::build_client_hello(Some("a.test"), false);
        assert_eq!(
            classify(&hello),
            Some(Kind::Tls(Hello::ClientHello {
                sni: Some("a.test".into()),
                ech: false
            }))
        );
        assert_eq!(
            classify(&hello[..hello.len() - 1]),
            None,
            "wait for the rest"
        );
        assert_eq!(classify(b"GET / HTTP/1.1\r\n"), Some(Kind::Http));
        assert_eq!(classify(b"SSH-2.0-x\r\n"), Some(Kind::Opaque));
        assert_eq!(classify(b""), None);
    }

    #[test]
    fn the_original_destination_goes_first_only_when_checked() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let checked = vec![a("192.0.2.1:22"), a("192.0.2.2:22")];
        assert_eq!(
            prefer_original(checked.clone(), a("192.0.2.2:22")),
            [a("192.0.2.2:22"), a("192.0.2.1:22")]
        );
        assert_eq!(
            prefer_original(checked.clone(), a("198.51.100.9:22")),
            checked
        );
        assert_eq!(
            prefer_original(checked, a("[::ffff:192.0.2.2]:22")),
            [a("192.0.2.2:22"), a("192.0.2.1:22")]
        );
    }
}
