//! The forward proxy's fast path: the common request served without
//! hyper. Most requests on the proxy port are the same shape: `GET` or
//! `HEAD http://name/path HTTP/1.1`, no body, a handful of headers, allowed
//! by an exception that needs nothing but the decision, to an origin that
//! answers with a `Content-Length` or chunked body. For those, hyper's
//! server and client (head parsed into a map twice, two dispatch state
//! machines, timers) were most of a GET's cost (callgrind); here the head
//! is parsed once with `httparse` (the parser hyper uses, in the same
//! configuration), decided by the same steps as every request (admit,
//! `Policy::decide`, `upstream::check_destination`), written to a pooled
//! connection to the checked address, and the answer relayed with its
//! framing checked and rewritten.
//!
//! **Everything else goes to hyper, untouched.** At the first request this
//! path does not take — any other method, a body or its framing headers, an
//! upgrade, `Expect`, `Proxy-Authorization`, method-override headers, a
//! `Host` that is not the target's authority spelled the same, a head that
//! does not parse, a request the policy
//! denies or whose exception injects credentials or is package-gated, a log
//! that is not taking lines, an upstream proxy — the connection is handed
//! to hyper with the bytes read put back ([`super::rewind`]): hyper parses
//! that request as if it were the first, answers it (its 400, its 403, its
//! gate) and writes its line. So this path is never more lenient than
//! hyper: what it accepts, hyper would have accepted and read the same way
//! (the differential test in this file holds that), and what it does not
//! accept, hyper judges.
//!
//! An origin's answer is held to stricter rules than hyper's client: one
//! framing only (`Content-Length` lines that agree, or `Transfer-Encoding:
//! chunked` alone), chunk sizes and line ends exact, trailers dropped,
//! heads bounded; anything else is a `502`, and the origin connection is
//! not reused. Chunk extensions are not forwarded (chunks are re-framed).
//!
//! Every request taken here writes exactly one line, whichever way it
//! ends (a guard writes it if the connection's task is dropped mid-way).
//!
//! Owns the fast path's parsing, its origin connections ([`RawPool`]) and
//! relaying. Does not own the decision (`policy`), admission (`admit`),
//! resolving and checking addresses (`upstream`) or answers on failure
//! (`respond`).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Uri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::admit;
use super::dest::{parse_authority, Dest};
use super::exchange::truncate_path;
use super::origin::{is_hop_by_hop_name, origin_form, RESPONSE_TIMEOUT};
use super::respond::{self, Responder, Stop};
use super::upstream::{self, Egress, POOL_IDLE, POOL_MAX_IDLE_PER_ADDR};
use super::{ProxyCtx, MAX_HEADER_BYTES};
use crate::policy::{self, Policy, Proto, Verdict};
use crate::record::{Event, Recorder, UpstreamFailure};
use crate::time::unix_now;

/// Header lines per head, as hyper's default (`h1_max_headers`): a request
/// with more goes to hyper, which refuses it; an answer with more is a 502.
const MAX_HEADERS: usize = 100;
/// Largest response head read from an origin: hyper's client bound
/// (8 KiB plus 100 lines of 4 KiB), so no answer that passed before fails.
const MAX_RESPONSE_HEAD: usize = 8192 + 4096 * 100;
/// Longest chunk-size line (with extensions) in an origin's chunked body.
const MAX_CHUNK_LINE: usize = super::chunks::MAX_CHUNK_LINE;
/// Bytes read from an origin at a time.
const READ_SIZE: usize = 16 << 10;

/// How the client connection goes on after the fast path.
pub(crate) enum Next {
    /// Closed (by the client, or after an answer that ends it).
    Done,
    /// A request the fast path does not take: hyper serves the connection
    /// from here, starting with these bytes.
    HandOff(TcpStream, Vec<u8>),
}

/// Serves requests on `client` while they are the fast path's; returns
/// when the connection ends or at the first request it does not take.
pub(crate) async fn serve(mut client: TcpStream, peer: SocketAddr, ctx: &ProxyCtx) -> Next {
    if !matches!(ctx.egress, Egress::Direct) {
        // Through an upstream proxy the origin side is hyper's (absolute
        // form, the proxy's credentials).
        return Next::HandOff(client, Vec::new());
    }
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        // A request head within the header timeout, counted from the
        // moment the connection waits for a request (idle keep-alive
        // included), as hyper counts it; one deadline however many reads
        // the head takes. Past it the connection closes, as hyper closes it.
        let deadline = tokio::time::Instant::now() + ctx.header_timeout();
        let req = loop {
            match parse_request(&buf) {
                Parsed::Request(r) => break r,
                Parsed::Other => return Next::HandOff(client, buf),
                // hyper answers 431.
                Parsed::Partial if buf.len() >= MAX_HEADER_BYTES => {
                    return Next::HandOff(client, buf)
                }
                Parsed::Partial => {}
            }
            match tokio::time::timeout_at(deadline, client.read_buf(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Next::Done,
                Err(_) => {
                    // A connection that sent part of a head gets its
                    // line; an idle one (before or after its requests)
                    // sent no request and closes quietly.
                    if !buf.is_empty() {
                        record_head_timeout(ctx, peer, buf.len(), None);
                    }
                    return Next::Done;
                }
                Ok(Ok(_)) => {}
            }
        };
        let policy = ctx.policy.snapshot();
        let Some(taken) = admit_and_decide(ctx, &policy, &req, peer) else {
            return Next::HandOff(client, buf);
        };
        let keep = req.keep_alive;
        let ended = exchange(ctx, &policy, &req, taken, &mut client).await;
        buf.drain(..req.head_len);
        if !(keep && ended == Ended::Clean) {
            return Next::Done;
        }
    }
}

/// The line of a connection closed because no complete request head came
/// within the header timeout (slowloris, or a connection opened and left
/// silent): `malformed`, no status (nothing was answered), and how many
/// bytes of a head had come (`bytes_up`, when known).
pub(crate) fn record_head_timeout(
    ctx: &ProxyCtx,
    peer: SocketAddr,
    received: usize,
    note: Option<String>,
) {
    let policy = ctx.policy.snapshot();
    let mut ev = Event::new(Proto::Http, peer);
    if let Some(id) = policy.client_id(policy.identify(peer.ip(), None).ok().flatten()) {
        ev.client = id.clone();
    }
    ev.set_denied(policy::Reason::Malformed);
    ev.bytes_up = received as u64;
    ev.error = Some(format!(
        "no complete request head within the header timeout ({}s); connection closed",
        policy.settings.limits.header_timeout_secs
    ));
    ev.note = note;
    ctx.recorder.record(ev);
}

/// A request head the fast path takes, parsed.
struct Simple {
    head_len: usize,
    head: bool,
    uri: Uri,
    dest: Dest,
    /// Normalised, for `paths:` rules and the log.
    path: String,
    /// The headers forwarded, as `name: value\r\n` lines (hop-by-hop ones
    /// and `Host` left out).
    fwd: Vec<u8>,
    keep_alive: bool,
    /// `Accept` values (deny answers in JSON for agents that ask).
    accept: Vec<HeaderValue>,
}

/// What the fast path reads a request head as, for checking it against
/// hyper's reading (`fuzz/harness/http1_fast.rs`): the head's length, the
/// method and target, and the headers it forwards (name as sent, value).
#[doc(hidden)]
pub struct Reading {
    pub head_len: usize,
    pub method: &'static str,
    pub uri: Uri,
    pub forwarded: Vec<(String, Vec<u8>)>,
    pub keep_alive: bool,
}

/// The fast path's reading of `buf`, `None` when it leaves the request to
/// hyper (or wants more bytes).
#[doc(hidden)]
pub fn reading(buf: &[u8]) -> Option<Reading> {
    let Parsed::Request(r) = parse_request(buf) else {
        return None;
    };
    let mut forwarded = Vec::new();
    for line in r.fwd.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|b| *b == b':')?;
        let name = String::from_utf8(line[..colon].to_vec()).ok()?;
        forwarded.push((name, line[colon + 2..].to_vec()));
    }
    Some(Reading {
        head_len: r.head_len,
        method: if r.head { "HEAD" } else { "GET" },
        uri: r.uri,
        forwarded,
        keep_alive: r.keep_alive,
    })
}

// Made once per request and taken apart at once: boxing the large
// variant would cost an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Request(Simple),
    Partial,
    /// Not the fast path's: hyper takes it (and refuses it, if malformed).
    Other,
}

/// Request headers the fast path leaves to hyper: a body or its framing,
/// a protocol switch, interim answers, the client's token (named clients,
/// their shares), method overrides (decided with the method), and what
/// marks a loop.
fn hands_off(name: &str) -> bool {
    const OTHERS: &[&str] = &[
        "content-length",
        "transfer-encoding",
        "upgrade",
        "expect",
        "proxy-authorization",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "via",
    ];
    // `_` look-alikes of framing headers and friends go to hyper's path,
    // which strips them.
    name.contains('_') || OTHERS.iter().any(|o| name.eq_ignore_ascii_case(o))
}

fn parse_request(buf: &[u8]) -> Parsed {
    if buf.is_empty() {
        return Parsed::Partial;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
        return Parsed::Other;
    };
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Parsed::Other,
    };
    // Only the lower-case scheme; any other spelling is hyper's to judge.
    let Some(rest) = target.strip_prefix("http://") else {
        return Parsed::Other;
    };
    // The authority as spelled in the target: up to the path or query.
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    // The request target, read by the parser hyper reads it with.
    let Ok(uri) = Uri::from_maybe_shared(Bytes::copy_from_slice(target.as_bytes())) else {
        return Parsed::Other;
    };
    if uri.authority().map(|a| a.as_str()) != Some(authority) {
        return Parsed::Other;
    }
    let Ok(dest) = parse_authority(authority, Some(80)) else {
        return Parsed::Other;
    };
    let Ok(path) = super::gate::policy_path(&dest.target, uri.path()) else {
        return Parsed::Other;
    };
    // A spelling other than the canonical one is the general path's: under
    // `paths:` it sends the path the rule matched (proxy/matched.rs).
    if path != uri.path() {
        return Parsed::Other;
    }
    let Some(Forwarded {
        fwd,
        keep_alive,
        accept,
    }) = forwarded(req.headers, authority, buf.len())
    else {
        return Parsed::Other;
    };
    Parsed::Request(Simple {
        head_len,
        head,
        uri,
        dest,
        path,
        fwd,
        keep_alive,
        accept,
    })
}

/// A fast-path request's headers as they go on.
struct Forwarded {
    /// The header lines forwarded (`Host` and hop-by-hop ones left out).
    fwd: Vec<u8>,
    /// The client did not ask to close.
    keep_alive: bool,
    /// Its `Accept` values.
    accept: Vec<HeaderValue>,
}

/// The headers of a request for `authority` as they are forwarded;
/// `None` when one of them sends the request to hyper's path (a second
/// or disagreeing `Host`, a `Connection` naming another header, a name
/// the fast path does not handle).
fn forwarded(headers: &[httparse::Header<'_>], authority: &str, cap: usize) -> Option<Forwarded> {
    let mut fwd = Vec::with_capacity(cap);
    let mut keep_alive = true;
    let mut hosts = 0;
    let mut accept = Vec::new();
    for h in headers {
        let name = h.name;
        if hands_off(name) {
            return None;
        }
        if name.eq_ignore_ascii_case("host") {
            hosts += 1;
            if hosts > 1 || h.value != authority.as_bytes() {
                return None;
            }
            continue;
        }
        if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                    // Names another header as hop-by-hop: hyper's path.
                    return None;
                }
            }
            continue;
        }
        if is_hop_by_hop_name(name) {
            continue;
        }
        if name.eq_ignore_ascii_case("accept") {
            accept.push(HeaderValue::from_bytes(h.value).ok()?);
        }
        fwd.extend_from_slice(name.as_bytes());
        fwd.extend_from_slice(b": ");
        fwd.extend_from_slice(h.value);
        fwd.extend_from_slice(b"\r\n");
    }
    Some(Forwarded {
        fwd,
        keep_alive,
        accept,
    })
}

/// Admission and the decision for `req`, as the forward path makes them;
/// `None` when hyper's path must take the request (not admitted, not
/// allowed, or allowed with more than the decision to apply). Nothing is
/// recorded for a request handed on: hyper's path decides it again and
/// writes its line.
fn admit_and_decide<'p>(
    ctx: &ProxyCtx,
    policy: &'p Policy,
    req: &Simple,
    peer: SocketAddr,
) -> Option<(Event, Option<policy::ClientIdx>, policy::Decision<'p>)> {
    if !ctx.recorder.accepting() {
        return None;
    }
    let mut ev = Event::new(Proto::Http, peer);
    let client = admit::identify(policy, &mut ev, None).ok()?;
    if let policy::host::Target::Name(h) = &req.dest.target {
        if policy.package_gated(h.as_str()).is_some() {
            return None;
        }
    }
    let now = unix_now();
    let d = policy.decide(
        &policy::Request {
            proto: Proto::Http,
            client,
            target: &req.dest.target,
            port: req.dest.port,
            method: Some(policy::Method {
                name: if req.head { "HEAD" } else { "GET" },
                overrides: &[],
            }),
            path: Some(&req.path),
            qtype: None,
            can_intercept: false,
        },
        now,
    );
    let plain = d.verdict == Verdict::Allow
        && !d.report_only
        && d.exception.is_some_and(|e| {
            // `body:` judges what a request carries, a GET's body too:
            // the exchange path reads it.
            e.inject().is_empty() && e.grant().is_none() && e.git().is_none() && e.body().is_none()
        });
    if !plain {
        return None;
    }
    ev.set_decision(&d, policy.settings.mode);
    ev.method = Some(if req.head { "HEAD" } else { "GET" }.to_string());
    ev.host = Some(req.dest.target.to_string());
    ev.port = Some(req.dest.port);
    ev.path = Some(truncate_path(&req.path));
    Some((ev, client, d))
}

/// How an exchange left the client connection.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The answer was written whole: the connection may serve the next.
    Clean,
    /// It must close (the client left, or the answer could not be whole).
    Close,
}

/// The request's line, written when the exchange ends, or by the guard's
/// drop if the connection's task is dropped first.
struct Line<'a> {
    ev: Option<Event>,
    rec: &'a Recorder,
}

impl Line<'_> {
    fn ev(&mut self) -> &mut Event {
        self.ev.as_mut().expect("the line is written once")
    }

    fn write(&mut self, error: Option<String>) {
        if let Some(mut ev) = self.ev.take() {
            if error.is_some() {
                ev.error = error;
            }
            self.rec.record(ev);
        }
    }

    /// Writes the line of an answer read whole, for [`Recorder::settle`].
    fn commit(&mut self) -> crate::log::Ticket {
        self.ev
            .take()
            .map(|ev| self.rec.commit(ev))
            .unwrap_or_default()
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        self.write(Some("the connection ended before the response did".into()));
    }
}

async fn exchange(
    ctx: &ProxyCtx,
    policy: &Policy,
    req: &Simple,
    (ev, client, d): (Event, Option<policy::ClientIdx>, policy::Decision<'_>),
    conn: &mut TcpStream,
) -> Ended {
    let now = unix_now();
    let mut line = Line {
        ev: Some(ev),
        rec: &ctx.recorder,
    };
    let reach = upstream::Reach {
        dest: &req.dest,
        exception: d.exception,
        client,
        now,
    };
    let checked = upstream::check_destination(ctx, policy, reach, line.ev()).await;
    let result = match checked {
        Ok(addrs) => {
            let addr = addrs[0];
            line.ev().addr = Some(addr);
            relay(ctx, req, addr, conn, &mut line).await
        }
        Err(stop) => Err(stop),
    };
    match result {
        Ok(ended) => ended,
        Err(stop) => {
            let ev = line.ev.take().expect("the line is written once");
            answer_stop(ctx, policy, req, ev, stop, conn).await
        }
    }
}

/// A failure before any byte of the answer went out, answered as the
/// forward path answers it (through the one responder, which writes the
/// line).
async fn answer_stop(
    ctx: &ProxyCtx,
    policy: &Policy,
    req: &Simple,
    ev: Event,
    stop: Stop,
    conn: &mut TcpStream,
) -> Ended {
    let method = if req.head { "HEAD" } else { "GET" };
    let what = || format!("{method} {}", truncate_path(&req.uri.to_string()));
    let mut accept = HeaderMap::new();
    for v in &req.accept {
        accept.append(http::header::ACCEPT, v.clone());
    }
    let responder = Responder {
        what: &what,
        contact: &policy.settings.contact,
        close: false,
        json: respond::wants_json(&accept),
        rec: &ctx.recorder,
    };
    let resp = responder.stop(ev, stop);
    let closes = resp
        .headers()
        .get(http::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let Some(mut bytes) = respond::encode(resp) else {
        return Ended::Close;
    };
    if req.head {
        // The head only; its Content-Length says what a GET would get.
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            bytes.truncate(end + 4);
        }
    }
    match conn.write_all(&bytes).await {
        Ok(()) if !closes => Ended::Clean,
        _ => Ended::Close,
    }
}

/// Sends the request to `addr` and relays the answer to `client`.
/// `Err` only before any byte of the answer was written.
async fn relay(
    ctx: &ProxyCtx,
    req: &Simple,
    addr: SocketAddr,
    client: &mut TcpStream,
    line: &mut Line<'_>,
) -> Result<Ended, Stop> {
    let head = request_head(req);
    let (mut origin, mut rbuf, answer) = send(&ctx.raw_origins, addr, &head).await?;
    // Interim answers (1xx but 101) are read past, as hyper's client does.
    let mut answer = answer;
    loop {
        match answer.status {
            101 => return Err(bad_answer("a 101 to a request that asked for no upgrade")),
            100..=199 => {
                rbuf.drain(..answer.head_len);
                answer = read_answer(&mut origin, &mut rbuf).await?;
            }
            _ => break,
        }
    }
    let framing = answer.framing(req.head)?;
    let ev = line.ev();
    ev.status = Some(answer.status);
    let mut out = Vec::with_capacity(answer.head_len + 64);
    answer.write_head(&rbuf, framing, req.keep_alive, &mut out);
    rbuf.drain(..answer.head_len);
    let reusable = answer.keep_alive && !matches!(framing, Framing::UntilClose);
    let (outcome, down) = match framing {
        Framing::None => (Ok(out), 0),
        Framing::Length(n) => relay_length(&mut origin, client, &mut rbuf, out, n).await,
        Framing::Chunked => relay_chunked(&mut origin, client, &mut rbuf, out).await,
        Framing::UntilClose => relay_until_close(&mut origin, client, &mut rbuf, out).await,
    };
    line.ev().bytes_down = down;
    match outcome {
        Ok(last) => {
            if reusable && rbuf.is_empty() {
                ctx.raw_origins.put(addr, origin);
            }
            // The answer is complete: its line reaches the log before its
            // last bytes reach the client (DESIGN "The record holds").
            let ticket = line.commit();
            if !ctx.recorder.settle(ticket).await {
                return Ok(Ended::Close);
            }
            match client_write(client, &last).await {
                Ok(()) => Ok(Ended::Clean),
                Err(_) => Ok(Ended::Close),
            }
        }
        Err(Broke::Client(e)) => {
            line.write(Some(format!(
                "client went away before the response ended: {e}"
            )));
            Ok(Ended::Close)
        }
        Err(Broke::Origin(e)) => {
            line.write(Some(format!("response body: {e}")));
            Ok(Ended::Close)
        }
        // Nothing was written yet: the client gets a 502, not a cut answer.
        Err(Broke::BeforeHead(e)) => {
            let ev = line.ev();
            ev.status = None;
            ev.bytes_down = 0;
            Err(bad_answer(format!("response body: {e}")))
        }
    }
}

/// The request head sent to the origin: origin form, `Host` as the
/// destination (its port when not 80), the forwarded headers, `Via`.
fn request_head(req: &Simple) -> Vec<u8> {
    let host = if req.dest.port == 80 {
        req.dest.target.to_string()
    } else {
        format!("{}:{}", req.dest.target, req.dest.port)
    };
    let pq = origin_form(&req.uri);
    let method = if req.head { "HEAD" } else { "GET" };
    let mut head = Vec::with_capacity(req.fwd.len() + pq.len() + host.len() + 64);
    head.extend_from_slice(method.as_bytes());
    head.push(b' ');
    head.extend_from_slice(pq.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(host.as_bytes());
    head.extend_from_slice(b"\r\n");
    head.extend_from_slice(&req.fwd);
    head.extend_from_slice(b"via: 1.1 egressd\r\n\r\n");
    head
}

fn bad_answer(why: impl Into<String>) -> Stop {
    Stop::Unreachable {
        kind: UpstreamFailure::Connect,
        message: why.into(),
        timeout: false,
    }
}

/// Writes `head` on a pooled connection to `addr`, or a new one, and reads
/// the answer's head. A pooled connection the origin closed while it was
/// idle (nothing of an answer came back) is dropped and the request sent
/// once more on a new one: GET and HEAD are idempotent (RFC 9110 §9.2.2),
/// and no answer was seen.
async fn send(
    pool: &RawPool,
    addr: SocketAddr,
    head: &[u8],
) -> Result<(TcpStream, Vec<u8>, Answer), Stop> {
    let mut rbuf = Vec::with_capacity(READ_SIZE);
    if let Some(mut origin) = pool.take(addr) {
        let sent = origin.write_all(head).await;
        if sent.is_ok() {
            match read_answer(&mut origin, &mut rbuf).await {
                Ok(a) => return Ok((origin, rbuf, a)),
                // Closed or reset with nothing read: it was closed idle.
                Err(Stop::Unreachable { timeout: false, .. }) if rbuf.is_empty() => {}
                Err(stop) => return Err(stop),
            }
        }
        rbuf.clear();
    }
    let mut origin =
        match tokio::time::timeout(upstream::CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(Stop::Unreachable {
                    kind: UpstreamFailure::Connect,
                    timeout: e.kind() == io::ErrorKind::TimedOut,
                    message: e.to_string(),
                })
            }
            Err(_) => {
                return Err(Stop::Unreachable {
                    kind: UpstreamFailure::Connect,
                    timeout: true,
                    message: "connect timed out".into(),
                })
            }
        };
    let _ = origin.set_nodelay(true);
    origin
        .write_all(head)
        .await
        .map_err(|e| bad_answer(format!("sending the request: {e}")))?;
    let a = read_answer(&mut origin, &mut rbuf).await?;
    Ok((origin, rbuf, a))
}

/// An origin's answer head, as read (the bytes stay in the buffer).
struct Answer {
    head_len: usize,
    status: u16,
    keep_alive: bool,
    length: Option<u64>,
    chunked: bool,
}

/// How an answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

impl Answer {
    /// RFC 9112 §6.3, for an answer to GET or HEAD.
    fn framing(&self, head: bool) -> Result<Framing, Stop> {
        Ok(if head || self.status == 204 || self.status == 304 {
            Framing::None
        } else if self.chunked {
            Framing::Chunked
        } else if let Some(n) = self.length {
            Framing::Length(n)
        } else {
            Framing::UntilClose
        })
    }

    /// The head the client gets: the origin's status and headers less the
    /// hop-by-hop ones (and those its `Connection` names) and its framing,
    /// then egressd's framing and `Via`. Written from `raw` (the buffer
    /// the head was read into), parsed again: the parse is cheap and the
    /// buffer is not borrowed across the relay.
    fn write_head(&self, raw: &[u8], framing: Framing, keep: bool, out: &mut Vec<u8>) {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        // Parsed once already: it parses the same way again.
        let _ = resp.parse(&raw[..self.head_len]);
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\n");
        let named = connection_tokens(resp.headers);
        for h in resp.headers.iter() {
            let n = h.name;
            if is_hop_by_hop_name(n)
                || n.eq_ignore_ascii_case("content-length")
                || named.iter().any(|t| n.as_bytes().eq_ignore_ascii_case(t))
            {
                continue;
            }
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        match framing {
            Framing::Length(n) => {
                out.extend_from_slice(format!("content-length: {n}\r\n").as_bytes())
            }
            Framing::Chunked | Framing::UntilClose => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n")
            }
            Framing::None => {
                // A HEAD's (or 304's) length describes the GET's body.
                if let Some(n) = self.length {
                    out.extend_from_slice(format!("content-length: {n}\r\n").as_bytes())
                }
            }
        }
        out.extend_from_slice(b"via: 1.1 egressd\r\n");
        if !keep {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// The tokens of every `Connection` header (the headers they name are
/// hop-by-hop too).
fn connection_tokens<'b>(headers: &[httparse::Header<'b>]) -> Vec<&'b [u8]> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Reads an answer head into `rbuf` (bounded in size and time) and checks
/// its framing: one `Content-Length` value, or `Transfer-Encoding:
/// chunked` alone, never both.
async fn read_answer(origin: &mut TcpStream, rbuf: &mut Vec<u8>) -> Result<Answer, Stop> {
    let deadline = tokio::time::Instant::now() + RESPONSE_TIMEOUT;
    loop {
        if !rbuf.is_empty() {
            if let Some(a) = parse_answer(rbuf)? {
                return Ok(a);
            }
            if rbuf.len() >= MAX_RESPONSE_HEAD {
                return Err(bad_answer("the origin's response head is too large"));
            }
        }
        rbuf.reserve(READ_SIZE);
        match tokio::time::timeout_at(deadline, origin.read_buf(rbuf)).await {
            Ok(Ok(0)) => {
                return Err(bad_answer(if rbuf.is_empty() {
                    "the origin closed the connection without a response"
                } else {
                    "the origin closed the connection in the response head"
                }))
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(bad_answer(format!("reading the response: {e}"))),
            Err(_) => {
                return Err(Stop::Unreachable {
                    kind: UpstreamFailure::Timeout,
                    message: "no response in time".into(),
                    timeout: true,
                })
            }
        }
    }
}

/// `Ok(None)`: not complete yet.
fn parse_answer(raw: &[u8]) -> Result<Option<Answer>, Stop> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(bad_answer(format!("the origin's response: {e}"))),
    };
    let status = resp.code.unwrap_or(0);
    let mut keep_alive = resp.version == Some(1);
    let (mut length, mut te, mut chunked) = (None, 0, false);
    for h in resp.headers.iter() {
        let n = h.name;
        if n.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    bad_answer("the origin's answer carries an invalid Content-Length")
                })?;
            if length.is_some_and(|l| l != v) {
                return Err(bad_answer(
                    "the origin's answer carries conflicting Content-Length",
                ));
            }
            length = Some(v);
        } else if n.eq_ignore_ascii_case("transfer-encoding") {
            te += 1;
            chunked = h.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if n.eq_ignore_ascii_case("connection") {
            for t in h.value.split(|b| *b == b',') {
                if t.trim_ascii().eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                }
            }
        }
    }
    if te > 0 && length.is_some() {
        return Err(bad_answer(
            "the origin's answer carries both Content-Length and Transfer-Encoding",
        ));
    }
    if te > 1 || (te == 1 && !chunked) {
        return Err(bad_answer(
            "the origin's answer has a Transfer-Encoding other than chunked alone",
        ));
    }
    Ok(Some(Answer {
        head_len,
        status,
        keep_alive,
        length,
        chunked,
    }))
}

/// Why a relay stopped short.
enum Broke {
    Client(io::Error),
    Origin(io::Error),
    /// The origin's body broke before any byte went to the client.
    BeforeHead(io::Error),
}

async fn client_write(client: &mut TcpStream, b: &[u8]) -> Result<(), Broke> {
    client.write_all(b).await.map_err(Broke::Client)
}

/// Reads more of the origin's body into `rbuf` (it must be empty or
/// hold an incomplete piece): bounded by the response timeout per read,
/// end of stream an error.
async fn origin_read(origin: &mut TcpStream, rbuf: &mut Vec<u8>) -> Result<(), Broke> {
    rbuf.reserve(READ_SIZE);
    match tokio::time::timeout(RESPONSE_TIMEOUT, origin.read_buf(rbuf)).await {
        Ok(Ok(0)) => Err(Broke::Origin(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the origin closed the connection mid-body",
        ))),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Broke::Origin(e)),
        Err(_) => Err(Broke::Origin(io::Error::new(
            io::ErrorKind::TimedOut,
            "no body bytes in time",
        ))),
    }
}

/// A `Content-Length` body: the head and what of the body came with it in
/// one write, then the rest as it comes. Returns the body bytes relayed;
/// the answer's last piece is returned unwritten (the caller writes the
/// line first).
async fn relay_length(
    origin: &mut TcpStream,
    client: &mut TcpStream,
    rbuf: &mut Vec<u8>,
    mut out: Vec<u8>,
    n: u64,
) -> (Result<Vec<u8>, Broke>, u64) {
    let mut left = n;
    let take = (rbuf.len() as u64).min(left) as usize;
    out.extend_from_slice(&rbuf[..take]);
    rbuf.drain(..take);
    left -= take as u64;
    if left == 0 {
        return (Ok(out), n);
    }
    if let Err(e) = client_write(client, &out).await {
        return (Err(e), n - left);
    }
    while left > 0 {
        if let Err(e) = origin_read(origin, rbuf).await {
            return (Err(e), n - left);
        }
        let take = (rbuf.len() as u64).min(left) as usize;
        if take as u64 == left {
            let last = rbuf[..take].to_vec();
            rbuf.drain(..take);
            return (Ok(last), n);
        }
        if let Err(e) = client_write(client, &rbuf[..take]).await {
            return (Err(e), n - left);
        }
        rbuf.drain(..take);
        left -= take as u64;
    }
    (Ok(Vec::new()), n)
}

/// A body read until the origin closes, sent on as chunks (the client's
/// connection stays usable). The last chunk is returned unwritten.
async fn relay_until_close(
    origin: &mut TcpStream,
    client: &mut TcpStream,
    rbuf: &mut Vec<u8>,
    mut out: Vec<u8>,
) -> (Result<Vec<u8>, Broke>, u64) {
    let mut down = 0u64;
    loop {
        if !rbuf.is_empty() {
            out.extend_from_slice(format!("{:x}\r\n", rbuf.len()).as_bytes());
            out.extend_from_slice(rbuf);
            out.extend_from_slice(b"\r\n");
            down += rbuf.len() as u64;
            rbuf.clear();
        }
        if !out.is_empty() {
            if let Err(e) = client_write(client, &out).await {
                return (Err(e), down);
            }
            out.clear();
        }
        rbuf.reserve(READ_SIZE);
        match tokio::time::timeout(RESPONSE_TIMEOUT, origin.read_buf(rbuf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return (Err(Broke::Origin(e)), down),
            Err(_) => {
                let e = io::Error::new(io::ErrorKind::TimedOut, "no body bytes in time");
                return (Err(Broke::Origin(e)), down);
            }
        }
    }
    (Ok(b"0\r\n\r\n".to_vec()), down)
}

/// Where a chunked body's reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines until the empty one.
    Trailers,
    Done,
}

/// One step of a chunked body in `rbuf`: what it consumed, what it adds
/// to `out`, and the body bytes it carried. `Ok(None)`: `rbuf` holds too
/// little; read more.
fn chunk_step(
    state: Chunk,
    rbuf: &[u8],
    out: &mut Vec<u8>,
    trailer_bytes: &mut usize,
) -> io::Result<Option<(Chunk, usize, u64)>> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    match state {
        Chunk::Size => chunk_size_line(rbuf, out),
        Chunk::Data(left) => {
            if rbuf.is_empty() {
                return Ok(None);
            }
            let take = (rbuf.len() as u64).min(left) as usize;
            out.extend_from_slice(&rbuf[..take]);
            let next = if take as u64 == left {
                Chunk::DataEnd
            } else {
                Chunk::Data(left - take as u64)
            };
            Ok(Some((next, take, take as u64)))
        }
        Chunk::DataEnd => {
            if rbuf.len() < 2 {
                return Ok(None);
            }
            if &rbuf[..2] != b"\r\n" {
                return Err(bad("chunk data not followed by CRLF"));
            }
            out.extend_from_slice(b"\r\n");
            Ok(Some((Chunk::Size, 2, 0)))
        }
        Chunk::Trailers => trailer_line(rbuf, out, trailer_bytes),
        Chunk::Done => Ok(Some((Chunk::Done, 0, 0))),
    }
}

/// [`chunk_step`] at a chunk-size line: the size read (extensions
/// dropped), written in egressd's own spelling.
fn chunk_size_line(rbuf: &[u8], out: &mut Vec<u8>) -> io::Result<Option<(Chunk, usize, u64)>> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    let Some(eol) = rbuf.windows(2).position(|w| w == b"\r\n") else {
        if rbuf.len() > MAX_CHUNK_LINE {
            return Err(bad("chunk-size line too long"));
        }
        if rbuf.contains(&b'\n') {
            return Err(bad("bare LF in a chunk-size line"));
        }
        return Ok(None);
    };
    if eol > MAX_CHUNK_LINE {
        return Err(bad("chunk-size line too long"));
    }
    let line = &rbuf[..eol];
    let digits = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let rest = &line[digits..];
    if digits == 0 || digits > 15 {
        return Err(bad("invalid chunk size"));
    }
    // Extensions (`;name=value`) are dropped; anything else after
    // the size is not a chunk-size line.
    let ext = rest.trim_ascii_start();
    if !(ext.is_empty() || ext[0] == b';') {
        return Err(bad("invalid chunk size"));
    }
    if rest.iter().any(|b| *b == b'\n' || *b == b'\r' || *b == 0) {
        return Err(bad("invalid chunk extension"));
    }
    let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).unwrap_or("x"), 16)
        .map_err(|_| bad("invalid chunk size"))?;
    if size == 0 {
        return Ok(Some((Chunk::Trailers, eol + 2, 0)));
    }
    out.extend_from_slice(format!("{size:x}\r\n").as_bytes());
    Ok(Some((Chunk::Data(size), eol + 2, 0)))
}

/// [`chunk_step`] after the last chunk: trailer lines read past (bounded)
/// up to the empty one, which ends the body.
fn trailer_line(
    rbuf: &[u8],
    out: &mut Vec<u8>,
    trailer_bytes: &mut usize,
) -> io::Result<Option<(Chunk, usize, u64)>> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    let Some(eol) = rbuf.windows(2).position(|w| w == b"\r\n") else {
        if rbuf.len() + *trailer_bytes > MAX_RESPONSE_HEAD {
            return Err(bad("trailers too large"));
        }
        return Ok(None);
    };
    *trailer_bytes += eol + 2;
    if *trailer_bytes > MAX_RESPONSE_HEAD {
        return Err(bad("trailers too large"));
    }
    if eol == 0 {
        // Trailer fields are not forwarded: the body ends here.
        out.extend_from_slice(b"0\r\n\r\n");
        return Ok(Some((Chunk::Done, 2, 0)));
    }
    Ok(Some((Chunk::Trailers, eol + 2, 0)))
}

/// A chunked body, re-framed chunk by chunk (sizes written by egressd,
/// extensions and trailers dropped), checked as it goes. What holds the
/// last chunk is returned unwritten.
async fn relay_chunked(
    origin: &mut TcpStream,
    client: &mut TcpStream,
    rbuf: &mut Vec<u8>,
    mut out: Vec<u8>,
) -> (Result<Vec<u8>, Broke>, u64) {
    let (mut state, mut down, mut trailer_bytes) = (Chunk::Size, 0u64, 0usize);
    let (mut used, mut written) = (0, false);
    loop {
        while state != Chunk::Done {
            match chunk_step(state, &rbuf[used..], &mut out, &mut trailer_bytes) {
                Ok(Some((next, n, body))) => {
                    state = next;
                    used += n;
                    down += body;
                }
                Ok(None) => break,
                Err(e) if !written => return (Err(Broke::BeforeHead(e)), down),
                Err(e) => return (Err(Broke::Origin(e)), down),
            }
        }
        rbuf.drain(..used);
        used = 0;
        if state == Chunk::Done {
            return (Ok(out), down);
        }
        if !out.is_empty() {
            if let Err(e) = client_write(client, &out).await {
                return (Err(e), down);
            }
            written = true;
            out.clear();
        }
        if let Err(e) = origin_read(origin, rbuf).await {
            return (Err(e), down);
        }
    }
}

/// Idle origin connections of the fast path, per checked address: a
/// connection is never shared between addresses, and one goes back only
/// after its answer was read to its end with nothing after it.
pub struct RawPool {
    idle: Mutex<HashMap<SocketAddr, Vec<(TcpStream, Instant)>>>,
}

impl RawPool {
    /// A pool; inside a Tokio runtime it also starts the task that closes
    /// connections idle for [`POOL_IDLE`].
    pub fn new() -> Arc<RawPool> {
        let pool = Arc::new(RawPool {
            idle: Mutex::new(HashMap::new()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak: Weak<RawPool> = Arc::downgrade(&pool);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(POOL_IDLE / 2).await;
                    let Some(pool) = weak.upgrade() else { return };
                    let now = Instant::now();
                    pool.lock().retain(|_, list| {
                        list.retain(|(_, since)| now.duration_since(*since) < POOL_IDLE);
                        !list.is_empty()
                    });
                }
            });
        }
        pool
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SocketAddr, Vec<(TcpStream, Instant)>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently returned idle connection to `addr` that has not
    /// been closed or sent anything since (either makes it unusable).
    fn take(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut idle = self.lock();
        let list = idle.get_mut(&addr)?;
        let now = Instant::now();
        while let Some((conn, since)) = list.pop() {
            if now.duration_since(since) >= POOL_IDLE {
                continue;
            }
            let mut probe = [0u8; 1];
            match conn.try_read(&mut probe) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(conn),
                _ => continue,
            }
        }
        None
    }

    fn put(&self, addr: SocketAddr, conn: TcpStream) {
        let mut idle = self.lock();
        let list = idle.entry(addr).or_default();
        if list.len() < POOL_MAX_IDLE_PER_ADDR {
            list.push((conn, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(head: &str) -> Option<Simple> {
        match parse_request(head.as_bytes()) {
            Parsed::Request(r) => Some(r),
            _ => None,
        }
    }

    #[test]
    fn the_common_shape_is_taken_and_its_hop_by_hop_headers_dropped() {
        let r = taken(
            "GET http://a.test:8080/x/~y?q=%2e%2e HTTP/1.1\r\nHost: a.test:8080\r\n\
             Proxy-Connection: Keep-Alive\r\nKeep-Alive: 5\r\nTE: trailers\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.dest.port, 8080);
        assert_eq!(r.dest.target.to_string(), "a.test");
        assert_eq!(r.path, "/x/~y");
        assert_eq!(origin_form(&r.uri), "/x/~y?q=%2e%2e");
        assert_eq!(r.fwd, b"Accept: */*\r\n");
        assert!(r.keep_alive && !r.head);
        let r = taken("HEAD http://a.test/ HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
        assert!(r.head && !r.keep_alive);
    }

    /// Each of these is left to hyper's path, which refuses or handles it.
    #[test]
    fn anything_else_goes_to_hyper() {
        for head in [
            "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n",
            "GET http://a.test/ HTTP/1.0\r\nHost: a.test\r\n\r\n",
            "GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "GET HTTP://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "GET /relative HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nHost: A.test\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n",
            "GET http://u@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nContent_Length: 4\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nProxy-Authorization: Basic eDp5\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nX-HTTP-Method-Override: DELETE\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nVia: 1.1 egressd\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
            "GET http://a.test/x/../y HTTP/1.1\r\n\r\n",
            // Not the canonical spelling: the general path sends the path a
            // `paths:` rule matched (proxy/matched.rs).
            "GET http://a.test/x//%7ey HTTP/1.1\r\n\r\n",
            "GET http://a.test/%78 HTTP/1.1\r\n\r\n",
            "GET http://a.test/%zz HTTP/1.1\r\n\r\n",
        ] {
            assert!(taken(head).is_none(), "taken: {head:?}");
        }
        assert!(matches!(
            parse_request(b"GET http://a.test/ HTTP/1.1\r\nHost:"),
            Parsed::Partial
        ));
    }

    fn answer(raw: &str) -> Result<Option<Answer>, Stop> {
        parse_answer(raw.as_bytes())
    }

    #[test]
    fn an_answer_has_one_framing_or_is_refused() {
        let a = answer("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(a.unwrap().unwrap().length, Some(5));
        let a = answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked \r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(a.chunked && a.keep_alive);
        let a = answer("HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert!(!a.keep_alive);
        assert_eq!(a.framing(false).unwrap(), Framing::UntilClose);
        assert_eq!(a.framing(true).unwrap(), Framing::None);
        let a = answer("HTTP/1.1 304 Not Modified\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!a.keep_alive);
        assert_eq!(a.framing(false).unwrap(), Framing::None);
        assert!(answer("HTTP/1.1 200 OK\r\nContent-Length: 5")
            .unwrap()
            .is_none());
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
        ] {
            assert!(answer(bad).is_err(), "accepted: {bad:?}");
        }
    }

    /// Feeds `body` to the chunk reader in pieces of `step` bytes; what it
    /// writes, and the body bytes it counted.
    fn rechunk(body: &[u8], step: usize) -> io::Result<(Vec<u8>, u64, bool)> {
        let (mut state, mut out, mut down, mut tb) = (Chunk::Size, Vec::new(), 0, 0);
        let mut buf = Vec::new();
        for piece in body.chunks(step) {
            buf.extend_from_slice(piece);
            let mut used = 0;
            while state != Chunk::Done {
                match chunk_step(state, &buf[used..], &mut out, &mut tb)? {
                    Some((next, n, b)) => {
                        state = next;
                        used += n;
                        down += b;
                    }
                    None => break,
                }
            }
            buf.drain(..used);
        }
        Ok((out, down, state == Chunk::Done && buf.is_empty()))
    }

    #[test]
    fn chunks_are_reframed_without_extensions_or_trailers_in_any_split() {
        let body = b"5;ext=\"x\"\r\nhello\r\n001\r\n!\r\n0\r\nX-Trailer: t\r\n\r\n";
        for step in 1..body.len() {
            let (out, down, done) = rechunk(body, step).unwrap();
            assert_eq!(out, b"5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n", "step {step}");
            assert_eq!(down, 6);
            assert!(done);
        }
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for bad in [
            &b"5\r\nhelloX\r\n0\r\n\r\n"[..],
            b"-5\r\nhello\r\n",
            b"0x5\r\nhello\r\n",
            b"\r\n",
            b"5\nhello\r\n",
            b"ffffffffffffffff\r\n",
            b"5 x\r\nhello\r\n",
        ] {
            assert!(rechunk(bad, bad.len()).is_err(), "accepted: {bad:?}");
        }
        let long = [b"1;".as_slice(), &vec![b'a'; MAX_CHUNK_LINE + 1], b"\r\n"].concat();
        assert!(rechunk(&long, 64).is_err());
    }
}
