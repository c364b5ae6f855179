//! Plain-HTTP forwarding of absolute-form requests (`GET http://host/path`).
//! The target is parsed at the edge into a `Target` and port, the `Host`
//! header must agree with it, the path is normalised for `paths:` rules, one
//! decision is made, and the request goes to a checked address over a pooled
//! connection with hop-by-hop headers removed and `Host` rewritten.
//!
//! [`decide_and_forward`] is that second half — decision, checked address,
//! upstream client, the body that writes the line — and is shared with
//! requests inside intercepted TLS tunnels (`mitm`), which differ only in
//! their edge checks and in reaching the origin over verified TLS.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use hyper_util::rt::TokioIo;

use super::dest::{check_host_headers, parse_authority, Dest};
use super::pool;
use super::respond::{self, ProxyBody};
use super::upstream::{self, Refusal};
use super::ProxyCtx;
use crate::policy::path::normalize_path;
use crate::policy::{self, ClientIdx, Exception, Policy, Proto, Reason};
use crate::record::{Event, Recorder, UpstreamFailure};
use crate::time::unix_now;

/// Longest wait for an origin's response head after the request is sent.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest path kept in a log line.
const MAX_LOGGED_PATH: usize = 2048;

static VIA: HeaderValue = HeaderValue::from_static("1.1 egressd");

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus
/// the proxy's own credentials.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those the `Connection` header names.
/// One pass over the names present: a request that carries none of them
/// (the usual case) costs a scan, not a dozen failed lookups.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let mut doomed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    doomed.extend(h.keys().filter(|n| is_hop_by_hop(n)).cloned());
    for n in doomed {
        h.remove(n);
    }
}

fn is_hop_by_hop(n: &HeaderName) -> bool {
    if HOP_BY_HOP.contains(n) {
        return true;
    }
    let s = n.as_str();
    // CGI-style servers read `_` as `-`: to them a `Content_Length` or
    // `Transfer_Encoding` is a second framing, and on a pooled connection a
    // smuggled request (past `methods`/`paths`, into another client's turn).
    let lookalike = |of: &str| {
        s != of
            && s.bytes()
                .zip(of.bytes())
                .all(|(a, b)| a == b || (a == b'_' && b == b'-'))
    };
    match s.len() {
        10 => s == "keep-alive",
        16 => s == "proxy-connection",
        14 => lookalike("content-length"),
        17 => lookalike("transfer-encoding"),
        _ => false,
    }
}

pub(crate) fn truncate_path(p: &str) -> String {
    let p = p.split(['?', '#']).next().unwrap_or("");
    if p.len() <= MAX_LOGGED_PATH {
        return p.to_string();
    }
    let mut end = MAX_LOGGED_PATH;
    while !p.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &p[..end])
}

/// A refusal's answer and its log line: what was asked, whom to contact,
/// and whether the connection closes after it. Every front-end that
/// forwards HTTP builds one.
pub(crate) struct Denier<'a> {
    /// What was asked (`GET http://host/path`), for the deny body: made
    /// only when a request is denied.
    pub what: &'a (dyn Fn() -> String + Send + Sync),
    pub contact: &'a str,
    pub close: bool,
    pub rec: &'a Recorder,
}

impl Denier<'_> {
    /// Answers `reason` and records the line. `policy_decided`: the event
    /// already carries the policy's decision (and its exception).
    pub fn deny(
        &self,
        mut ev: Event,
        reason: Reason,
        detail: Option<String>,
        policy_decided: bool,
    ) -> Response<ProxyBody> {
        if !policy_decided {
            ev.set_denied(reason);
        }
        let resp = respond::deny(
            reason,
            &(self.what)(),
            self.contact,
            detail.as_deref(),
            self.close,
        );
        ev.status = Some(resp.status().as_u16());
        if let Some(d) = detail {
            ev.note.get_or_insert(d);
        }
        self.rec.record(ev);
        resp
    }
}

/// How an allowed request reaches its origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// Plain HTTP to a checked address, pooled per address.
    Http,
    /// HTTPS from inside an intercepted tunnel, verified against the trust
    /// store and pooled per (name, checked addresses).
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// A request that passed its front-end's edge checks: the destination is
/// parsed, `Host` agrees with it, the path is normalised.
pub(crate) struct Inbound<'a> {
    pub client: Option<ClientIdx>,
    pub dest: &'a Dest,
    /// Normalised path, for `paths:` rules.
    pub path: &'a str,
    pub scheme: Scheme,
}

pub async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let policy = ctx.policy.snapshot();
    let mut ev = Event::new(Proto::Http, peer);
    ev.method = Some(req.method().as_str().to_string());
    ev.path = Some(truncate_path(req.uri().path()));
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let what = move || format!("{method} {}", truncate_path(&uri.to_string()));
    let denier = Denier {
        what: &what,
        contact: &policy.settings.contact,
        close: false,
        rec: &ctx.recorder,
    };
    let deny = |ev, reason, detail, decided| denier.deny(ev, reason, detail, decided);

    if !ctx.recorder.accepting() {
        return deny(ev, Reason::LogUnavailable, None, false);
    }
    let client = match super::identify(&policy, &req, peer) {
        Ok(c) => c,
        Err(e) => return deny(ev, Reason::ClientNotAllowed, Some(e.to_string()), false),
    };
    if let Some(id) = policy.client_id(client) {
        ev.client = id.clone();
    }

    // The request target must be absolute-form http://authority/path.
    let uri = req.uri().clone();
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(s) if s.eq_ignore_ascii_case("https") => {
            return deny(
                ev,
                Reason::Malformed,
                Some("send https:// requests through CONNECT".into()),
                false,
            )
        }
        Some(s) => {
            return deny(
                ev,
                Reason::Malformed,
                Some(format!("scheme {s:?} is not proxied")),
                false,
            )
        }
        None => return deny(
            ev,
            Reason::Malformed,
            Some(
                "this is an HTTP proxy: requests must use an absolute target (http://host/path)"
                    .into(),
            ),
            false,
        ),
    }
    let Some(authority) = uri.authority() else {
        return deny(
            ev,
            Reason::Malformed,
            Some("request target has no host".into()),
            false,
        );
    };
    let dest = match parse_authority(authority.as_str(), Some(80)) {
        Ok(d) => d,
        Err(e) => return deny(ev, Reason::Malformed, Some(e.to_string()), false),
    };
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);

    // A Host header that names another destination is a request for a
    // different origin riding on an allowed one: refuse, don't pick.
    if let Err((reason, detail)) = check_host_headers(req.headers(), &dest) {
        return deny(ev, reason, detail, false);
    }

    let path = match normalize_path(uri.path()) {
        Ok(p) => p,
        Err(e) => return deny(ev, Reason::Malformed, Some(e.to_string()), false),
    };
    ev.path = Some(truncate_path(&path));
    let inbound = Inbound {
        client,
        dest: &dest,
        path: &path,
        scheme: Scheme::Http,
    };
    decide_and_forward(&ctx, &policy, req, ev, inbound, &denier).await
}

/// The one way out for HTTP requests, plain or intercepted: decision →
/// checked address → pooled upstream client → a body that writes the line
/// when the response ends. WebSocket (HTTP/1.1 `Upgrade`) requests pass
/// only after the decision, and their line is written when the upgraded
/// connection closes.
pub(crate) async fn decide_and_forward(
    ctx: &ProxyCtx,
    policy: &Policy,
    mut req: Request<Incoming>,
    mut ev: Event,
    inbound: Inbound<'_>,
    denier: &Denier<'_>,
) -> Response<ProxyBody> {
    let Inbound {
        client,
        dest,
        path,
        scheme,
    } = inbound;
    let rec = &ctx.recorder;
    let proto = ev.proto;
    let now = unix_now();
    let preq = policy::Request {
        proto,
        client,
        target: &dest.target,
        port: dest.port,
        method: Some(req.method().as_str()),
        path: Some(path),
        qtype: None,
        can_intercept: false,
    };
    let d = policy.decide(&preq, now);
    ev.set_decision(&d, policy.settings.mode);
    if !d.is_allowed() {
        return denier.deny(ev, d.reason, None, true);
    }
    super::Draft::publish(&req, &ev);

    let upstream_error = |mut ev: Event, kind: UpstreamFailure, msg: String, timeout: bool| {
        let resp = respond::upstream_error(&dest.target.to_string(), &msg, timeout, denier.close);
        ev.status = Some(resp.status().as_u16());
        ev.fail_upstream(kind, msg);
        rec.record(ev);
        resp
    };

    let checked = match upstream::resolve_checked(
        policy,
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
            add_note(&mut ev, note);
            return denier.deny(ev, reason, None, false);
        }
        Err(Refusal::Resolve(e)) => {
            return upstream_error(ev, UpstreamFailure::Resolve, e.to_string(), false)
        }
    };
    add_note(&mut ev, checked.note.clone());

    let upgrade = upgrade_protocol(&req);
    let host_value = if dest.port == scheme.default_port() {
        dest.target.to_string()
    } else {
        format!("{}:{}", dest.target, dest.port)
    };
    // The origin form: an empty path is `/` (`http://host?q` asks for `/?q`).
    let pq = {
        let (path, query) = (req.uri().path(), req.uri().query());
        let path = if path.is_empty() { "/" } else { path };
        match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        }
    };
    // Plain HTTP: the checked address in the URI is the pool key. HTTPS: a
    // client bound to this name and these checked addresses, so the URI
    // carries the name (it becomes h2's :authority) and no pooled
    // connection is ever shared between names.
    let (up_uri, tls_client) = match scheme {
        Scheme::Http => {
            let addr = checked.addrs[0];
            ev.addr = Some(addr);
            match ctx.egress {
                // The origin gets the origin form; the pool dials `addr`.
                upstream::Egress::Direct => (pq, None),
                // An upstream proxy gets the checked address, never the name.
                upstream::Egress::Proxy(_) => (format!("http://{addr}{pq}"), None),
            }
        }
        Scheme::Https => {
            let Some(mitm) = ctx.mitm.as_ref() else {
                return upstream_error(
                    ev,
                    UpstreamFailure::Tls,
                    "interception is not enabled".into(),
                    false,
                );
            };
            match mitm.client(dest, &checked.addrs, upgrade.is_some()) {
                Ok(c) => (format!("https://{host_value}{pq}"), Some(c)),
                Err(e) => return upstream_error(ev, UpstreamFailure::Tls, e, false),
            }
        }
    };
    let up_uri: Uri = match up_uri.parse() {
        Ok(u) => u,
        Err(_) => {
            return denier.deny(
                ev,
                Reason::Malformed,
                Some("unparsable request target".into()),
                false,
            )
        }
    };
    {
        let h = req.headers_mut();
        strip_hop_by_hop(h);
        if let Some(p) = &upgrade {
            h.insert(header::UPGRADE, p.clone());
            h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
        h.insert(
            header::HOST,
            HeaderValue::from_str(&host_value).expect("normalised host is a valid header"),
        );
        h.append(header::VIA, VIA.clone());
        if let Some(e) = d.exception {
            inject(h, e);
        }
        // Plain HTTP through an upstream proxy goes to the proxy itself
        // (absolute form): it gets egressd's credentials, never the client's.
        if scheme == Scheme::Http {
            if let Some(auth) = ctx.egress.proxy_auth() {
                h.insert(header::PROXY_AUTHORIZATION, auth.clone());
            }
        }
    }
    *req.uri_mut() = up_uri;
    *req.version_mut() = http::Version::HTTP_11;
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));

    let up_bytes = Arc::new(AtomicU64::new(0));
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(
        parts,
        Counted {
            inner: body,
            counter: up_bytes.clone(),
        },
    );
    let origin = ev.addr;
    let sent = async {
        match (&tls_client, origin) {
            (Some(c), _) => c
                .request(req)
                .await
                .map(|r| (r, None))
                .map_err(|e| error_chain(&e)),
            (None, Some(addr)) => ctx
                .http
                .send(addr, req)
                .await
                .map(|(r, lent)| (r, Some(lent)))
                .map_err(|e| error_chain(&e)),
            (None, None) => Err("no checked address to connect to".to_string()),
        }
    };
    let (mut resp, lent) = match tokio::time::timeout(RESPONSE_TIMEOUT, sent).await {
        Ok(Ok(sent)) => sent,
        Ok(Err(e)) => {
            ev.bytes_up = up_bytes.load(Ordering::Relaxed);
            return upstream_error(ev, UpstreamFailure::Connect, e, false);
        }
        Err(_) => {
            ev.bytes_up = up_bytes.load(Ordering::Relaxed);
            return upstream_error(
                ev,
                UpstreamFailure::Timeout,
                "no response in time".into(),
                true,
            );
        }
    };
    if let Some(a) = resp.extensions().get::<super::mitm::UpstreamAddr>() {
        ev.addr = Some(a.0);
    }
    ev.status = Some(resp.status().as_u16());
    let switching = resp.status() == http::StatusCode::SWITCHING_PROTOCOLS;
    let resp_upgrade = resp.headers().get(header::UPGRADE).cloned();
    strip_hop_by_hop(resp.headers_mut());
    resp.headers_mut().append(header::VIA, VIA.clone());
    if let (true, Some(client_up), Some(p)) = (switching, client_upgrade, resp_upgrade) {
        let origin_up = hyper::upgrade::on(&mut resp);
        let h = resp.headers_mut();
        h.insert(header::UPGRADE, p);
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        let recorder = rec.clone();
        tokio::spawn(async move {
            // The upgraded connection is never pooled; its sender lives
            // until the upgrade is done with.
            let _lent = lent;
            match tokio::try_join!(client_up, origin_up) {
                Ok((c, o)) => {
                    let (up, down, result) =
                        super::tunnel::splice(TokioIo::new(c), TokioIo::new(o), 0).await;
                    ev.bytes_up = up;
                    ev.bytes_down = down;
                    if let Err(e) = result {
                        ev.error = Some(format!("upgraded connection: {e}"));
                    }
                }
                Err(e) => ev.error = Some(format!("upgrade: {e}")),
            }
            recorder.record(ev);
        });
        let (parts, _) = resp.into_parts();
        return Response::from_parts(parts, respond::full(""));
    }
    let (parts, body) = resp.into_parts();
    let body = Recorded {
        inner: body,
        up: up_bytes,
        down: 0,
        event: Some(ev),
        recorder: rec.clone(),
        lent,
    };
    Response::from_parts(parts, body.boxed())
}

/// Adds `note` after what the event already notes (a front-end's own
/// note, such as transparent capture's, is kept).
pub(crate) fn add_note(ev: &mut Event, note: Option<String>) {
    if let Some(n) = note {
        ev.note = Some(match ev.note.take() {
            Some(prev) => format!("{prev}; {n}"),
            None => n,
        });
    }
}

/// The protocol an HTTP/1.1 request asks to switch to (`Connection:
/// upgrade` plus `Upgrade: websocket`); `None` for every other request.
/// Only WebSocket switches: after any other upgrade (h2c above all) the
/// client would send the origin requests egressd never decides, past the
/// exception's `methods` and `paths`. Other `Upgrade` headers are dropped
/// with the hop-by-hop headers and the request goes on as plain HTTP/1.1.
fn upgrade_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != http::Version::HTTP_11 {
        return None;
    }
    let asks = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
        .filter(|p| p.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// Adds an exception's credentials, replacing whatever the client sent
/// under the same names.
pub fn inject(h: &mut HeaderMap, e: &Exception) {
    for ih in &e.inject {
        h.remove(&ih.name);
        h.insert(ih.name.clone(), ih.value.clone());
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A request body that counts what it carries upstream.
pub struct Counted<B> {
    inner: B,
    counter: Arc<AtomicU64>,
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                self.counter.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that writes the request's log line once it is done
/// (fully sent, failed, or abandoned by the client): one line, always.
struct Recorded {
    inner: Incoming,
    up: Arc<AtomicU64>,
    down: u64,
    event: Option<Event>,
    recorder: Recorder,
    /// The pooled origin connection, given back once the response has
    /// been read to its end (and dropped, closing it, otherwise).
    lent: Option<pool::Lent>,
}

impl Recorded {
    fn finish(&mut self, error: Option<String>) {
        if error.is_none() && self.inner.is_end_stream() {
            if let Some(lent) = self.lent.take() {
                lent.give_back();
            }
        }
        if let Some(mut ev) = self.event.take() {
            ev.bytes_up = self.up.load(Ordering::Relaxed);
            ev.bytes_down = self.down;
            if error.is_some() {
                ev.error = error;
            }
            self.recorder.record(ev);
        }
    }
}

impl Body for Recorded {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.down += d.len() as u64;
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let msg = format!("response body: {e}");
                self.finish(Some(msg));
            }
            Poll::Ready(None) => self.finish(None),
            Poll::Pending => {}
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let incomplete = !self.inner.is_end_stream();
        self.finish(incomplete.then(|| "client went away before the response ended".to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_their_look_alikes_go() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("host", "a.test"),
            ("connection", "keep-alive, X-Session"),
            ("connection", "close"),
            ("x-session", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic x"),
            ("te", "trailers"),
            ("trailer", "x"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("transfer_encoding", "chunked"),
            ("content_length", "5"),
            ("content-length", "3"),
            ("x_forwarded_for", "1.2.3.4"),
            ("accept", "*/*"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(
            left,
            ["accept", "content-length", "host", "x_forwarded_for"]
        );
    }
}
