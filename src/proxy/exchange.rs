//! The one way out for HTTP requests, plain or intercepted: decision →
//! checked address → upstream client → a body that writes the line when
//! the response ends. Shared by the forward proxy, requests inside
//! intercepted tunnels (`mitm`) and captured plain HTTP (`transparent`),
//! which differ only in their edge checks ([`Inbound`]) and in how the
//! origin is reached ([`Scheme`]).
//!
//! WebSocket (HTTP/1.1 `Upgrade`) requests pass only after the decision;
//! an accepted upgrade writes an open line, and a close line when the
//! upgraded connection closes.
//!
//! Owns the request's rewrite on the way out (hop-by-hop headers, `Host`,
//! `Via`, injected credentials) and the response's on the way back. Does
//! not own the edge (parsing, `Host` agreement: the front-ends), resolving
//! and checking addresses (`upstream`), or connections (`pool`,
//! `tls_origins`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::admit::Draft;
use super::dest::Dest;
use super::gate::index_cache::{self, Use};
use super::gate::{self, Gate, Plan, PlanKind};
use super::held::ReqBody;
use super::pool;
use super::relay::{self, meter::Counted};
use super::respond::{self, BoxError, ProxyBody, Responder, Stop};
use super::scrub;
use super::tls_origins::{TlsClient, UpstreamAddr};
use super::upstream::{self, Egress};
use super::writes::{self, Judged};
use super::ProxyCtx;
use crate::packages::compile::{Mirror, PackagePolicy};
use crate::packages::Ecosystem;
use crate::policy::{self, ClientIdx, Decision, Exception, Policy, Proto, Reason};
use crate::record::{Event, Recorder, UpstreamFailure};
use crate::shutdown::Permit;
use crate::time::unix_now;

/// Longest wait for an origin's response head after the request is sent.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest path kept in a log line.
const MAX_LOGGED_PATH: usize = 2048;

static VIA: HeaderValue = HeaderValue::from_static("1.1 egressd");

/// Headers many frameworks read the method from instead of the request
/// line (Rails, Symfony, Express's method-override, ASP.NET, ...).
/// Named as `HeaderName`s, not strings: a lookup by string parses the
/// name first, three times per request.
const METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

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
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

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

/// Decides `req` and, when allowed, forwards it: the decision, then
/// [`reach_origin`]'s steps, then the answer whose body writes the line.
/// Every way it ends records exactly one line.
pub(crate) async fn decide_and_forward(
    ctx: &ProxyCtx,
    policy: &Policy,
    req: Request<Incoming>,
    mut ev: Event,
    inbound: Inbound<'_>,
    responder: &Responder<'_>,
) -> Response<ProxyBody> {
    if let Err(stop) = check_framing(req.headers()) {
        return responder.stop(ev, stop);
    }
    let now = unix_now();
    let d = decide(policy, &req, &mut ev, &inbound, now);
    if !d.is_allowed() {
        return responder.refuse(ev);
    }
    if let Err(stop) = scrub::refuse_trace(req.method(), d.exception) {
        return responder.stop(ev, stop);
    }
    let mut req = req;
    super::matched::send_the_path_matched(req.uri_mut(), d.exception, inbound.path);
    Draft::publish(&req, &ev);
    let mut mirror = None;
    // The package gate's and the mirror's futures are boxed: they are
    // large and rare, and inline they would make every request's future
    // (which hyper moves per request) as large as theirs.
    let (mut plan, mut ev) = match package_gated(policy, inbound.dest) {
        None => (None, ev),
        Some(eco) => {
            let pkgs = package_policy(policy);
            let client = inbound.client;
            let gated = Box::pin(gate::gate(
                ctx,
                policy,
                pkgs,
                eco,
                &mut req,
                ev,
                client,
                inbound.dest,
                &d,
                now,
                responder,
            ))
            .await;
            let (plan, ev) = match gated {
                Gate::Pass(ev) => (None, ev),
                Gate::Answered(resp) => return resp,
                Gate::Forward(plan, ev) => {
                    mirror = plan.mirror.clone().map(|m| (plan.eco, m));
                    (Some(plan), ev)
                }
                Gate::Mirror(eco, m, ev) => {
                    mirror = Some((eco, m));
                    (None, ev)
                }
            };
            // What the gate noted is the draft's from here on; a request
            // no gate saw keeps the draft published above.
            Draft::publish(&req, &ev);
            (plan, ev)
        }
    };
    if let Some(p) = plan.as_mut() {
        if let Some(resp) = from_kept(ctx, &req, &inbound, &d, p, &mut ev) {
            let pkgs = package_policy(policy);
            let p = plan.take().expect("an index plan");
            return Box::pin(gate::answer_index(
                ctx, policy, pkgs, p, resp, ev, 0, now, responder,
            ))
            .await;
        }
    }
    let mode = policy.settings.mode;
    let (req, mut ev, advert) =
        match Box::pin(writes::judge(req, ev, inbound.path, &d, mode, responder)).await {
            Judged::Forward(req, ev) => (req, ev, false),
            Judged::Advertise(req, ev) => (req, ev, true),
            Judged::Answered(resp) => return resp,
        };
    let route = mirror.as_ref().map(|(e, m)| (*e, m));
    let secrets = scrub::Secrets::of(
        d.exception,
        mirror
            .iter()
            .flat_map(|(_, m)| m.inject.iter().map(|h| &h.value)),
    );
    match reach_origin(ctx, policy, req, &mut ev, &inbound, &d, now, route).await {
        Ok(sent) => match plan {
            Some(p)
                if matches!(p.what, PlanKind::Index { .. })
                    && sent.resp.status() == StatusCode::OK =>
            {
                let Sent {
                    mut resp,
                    lent,
                    up_bytes,
                    ..
                } = sent;
                strip_hop_by_hop(resp.headers_mut());
                resp.headers_mut().append(header::VIA, VIA.clone());
                let up = up_bytes.load(Ordering::Relaxed);
                let pkgs = package_policy(policy);
                let r = Box::pin(gate::answer_index(
                    ctx, policy, pkgs, p, resp, ev, up, now, responder,
                ))
                .await;
                // The whole body was read: the connection may be reused.
                if let Some(l) = lent {
                    l.give_back();
                }
                r
            }
            p => writes::answered(answer(sent, ev, ctx, p, mode, secrets), advert),
        },
        Err(stop) => responder.stop(ev, stop),
    }
}

/// A gated index request the cache can answer: the kept copy, as the
/// registry's answer to filter (its `Age` set, the line noting it);
/// otherwise `None`, with the plan told where to keep the registry's
/// answer if the request allows keeping it.
fn from_kept(
    ctx: &ProxyCtx,
    req: &Request<Incoming>,
    inbound: &Inbound<'_>,
    d: &Decision<'_>,
    plan: &mut Plan,
    ev: &mut Event,
) -> Option<Response<http_body_util::Full<Bytes>>> {
    let PlanKind::Index { keep, .. } = &mut plan.what else {
        return None;
    };
    let exception = d.exception?;
    let mirror = plan.mirror.as_ref();
    let injects = !exception.inject().is_empty() || mirror.is_some_and(|m| !m.inject.is_empty());
    let Use::UpTo(limit) = index_cache::request_use(req.headers(), injects) else {
        return None;
    };
    let key = index_cache::Key {
        scheme: inbound.scheme.as_str(),
        host: inbound.dest.target.to_string(),
        port: inbound.dest.port,
        target: req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string(),
        accept: req
            .headers()
            .get(header::ACCEPT)
            .map(|v| Bytes::copy_from_slice(v.as_bytes())),
        exception: exception.id.clone(),
        mirror: mirror.map(|m| format!("{}://{}:{}{}", m.scheme, m.host, m.port, m.path)),
    };
    let Some(kept) = ctx.index_cache.get(&key, limit) else {
        *keep = Some(Box::new(key));
        return None;
    };
    let age = kept.age(std::time::Instant::now()).as_secs();
    let mut resp = Response::new(http_body_util::Full::new(kept.doc.clone()));
    *resp.headers_mut() = kept.headers.clone();
    resp.headers_mut()
        .insert(header::AGE, HeaderValue::from(age));
    resp.headers_mut().append(header::VIA, VIA.clone());
    ev.add_note(Some(format!(
        "index answered from egressd's cache ({age} s old)"
    )));
    Some(resp)
}

/// The one decision for the request, noted in `ev`.
fn decide<'p>(
    policy: &'p Policy,
    req: &Request<Incoming>,
    ev: &mut Event,
    inbound: &Inbound<'_>,
    now: i64,
) -> Decision<'p> {
    let overrides = method_overrides(req.headers());
    let preq = policy::Request {
        proto: ev.proto,
        client: inbound.client,
        target: &inbound.dest.target,
        port: inbound.dest.port,
        method: Some(policy::Method {
            name: req.method().as_str(),
            overrides: &overrides,
        }),
        path: Some(inbound.path),
        qtype: None,
        can_intercept: false,
    };
    let d = policy.decide_to_serve(&preq, now);
    ev.set_decision(&d, policy.settings.mode);
    if d.reason == Reason::MethodNotAllowed && !overrides.is_empty() {
        ev.add_note(Some(format!(
            "method override headers name {}",
            overrides.join(", ")
        )));
    }
    d
}

/// The methods a request's override headers name, as spelled: every line
/// of each, every element of a list. An empty value names none; bytes
/// that are not text name a method no exception lists.
fn method_overrides(h: &HeaderMap) -> Vec<String> {
    METHOD_OVERRIDES
        .iter()
        .flat_map(|n| h.get_all(n))
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(',')
                .map(|m| m.trim_matches([' ', '\t']).to_string())
                .filter(|m| !m.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The framing checks hyper leaves to its user (RFC 9112 §6). hyper has
/// already refused a `Transfer-Encoding` that does not end in `chunked`,
/// `Content-Length`s that disagree or are not numbers, and has dropped
/// `Content-Length` beside `Transfer-Encoding` (and closes the connection
/// after such a request). What it lets through, parsers disagree on, so it
/// is refused here: more than one `Transfer-Encoding` line, an empty list
/// element, `chunked` twice, and codings before `chunked` (501: egressd
/// decodes none, and forwarding them undecoded would change the body).
fn check_framing(h: &HeaderMap) -> Result<(), Stop> {
    let bad = |status, detail: &str| Stop::BadMessage {
        status,
        detail: detail.to_string(),
    };
    let mut lines = h.get_all(header::TRANSFER_ENCODING).iter();
    if let Some(te) = lines.next() {
        if lines.next().is_some() {
            let why = "more than one Transfer-Encoding line";
            return Err(bad(StatusCode::BAD_REQUEST, why));
        }
        let te = te
            .to_str()
            .map_err(|_| bad(StatusCode::BAD_REQUEST, "Transfer-Encoding is not text"))?;
        let codings: Vec<&str> = te.split(',').map(|c| c.trim_matches([' ', '\t'])).collect();
        let chunked = |c: &str| c.eq_ignore_ascii_case("chunked");
        if codings.iter().any(|c| c.is_empty()) {
            let why = "an empty element in Transfer-Encoding";
            return Err(bad(StatusCode::BAD_REQUEST, why));
        }
        if codings.iter().filter(|c| chunked(c)).count() != 1
            || !codings.last().is_some_and(|c| chunked(c))
        {
            let why = "Transfer-Encoding must name chunked once, last";
            return Err(bad(StatusCode::BAD_REQUEST, why));
        }
        if let Some(other) = codings.iter().find(|c| !chunked(c)) {
            let why = format!("transfer coding {other:?} is not supported, only chunked");
            return Err(bad(StatusCode::NOT_IMPLEMENTED, &why));
        }
    }
    content_length(h).map_err(|why| bad(StatusCode::BAD_REQUEST, why))?;
    Ok(())
}

/// The one length every `Content-Length` line states (decimal digits, each
/// line the same number), `None` without one.
fn content_length(h: &HeaderMap) -> Result<Option<u64>, &'static str> {
    let mut len = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        let v = v.as_bytes();
        let n = std::str::from_utf8(v)
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or("Content-Length is not a number")?;
        if len.is_some_and(|l| l != n) {
            return Err("Content-Length lines disagree");
        }
        len = Some(n);
    }
    Ok(len)
}

/// Why an origin's answer cannot be relayed: framed two ways, so that one
/// reader's end of it is another's start of the next response (response
/// splitting). `None` when its framing is one.
fn ambiguous_answer(h: &HeaderMap) -> Option<&'static str> {
    if h.contains_key(header::TRANSFER_ENCODING) && h.contains_key(header::CONTENT_LENGTH) {
        return Some("the origin's answer carries both Content-Length and Transfer-Encoding");
    }
    content_length(h)
        .err()
        .map(|_| "the origin's answer carries conflicting or invalid Content-Length")
}

/// An allowed request, on its way: checked addresses, the origin chosen,
/// the request rewritten for it, sent. A package request for an ecosystem
/// with a mirror goes to the mirror instead (its path mapped, its headers
/// injected, its addresses not judged by the exceptions).
#[allow(clippy::too_many_arguments)]
async fn reach_origin(
    ctx: &ProxyCtx,
    policy: &Policy,
    mut req: Request<ReqBody>,
    ev: &mut Event,
    inbound: &Inbound<'_>,
    d: &Decision<'_>,
    now: i64,
    mirror: Option<(Ecosystem, &Mirror)>,
) -> Result<Sent, Stop> {
    if let Some((eco, m)) = mirror {
        return Box::pin(reach_mirror(ctx, policy, req, ev, inbound, eco, m)).await;
    }
    let checked = upstream::check_destination(
        ctx,
        policy,
        d.exception,
        inbound.client,
        inbound.dest,
        ev,
        now,
    )
    .await?;
    let upgrade = upgrade_protocol(&req);
    let origin = Origin::choose(ctx, &req, ev, inbound, &checked, upgrade.is_some())?;
    let client_upgrade = rewrite(&mut req, ctx, &origin, upgrade, d.exception, inbound.scheme)
        .map(|up| (up, req.extensions().get::<Permit>().cloned()));
    send(ctx, req, origin, client_upgrade, ev).await
}

/// [`reach_origin`] for a registry request served by its mirror.
async fn reach_mirror(
    ctx: &ProxyCtx,
    policy: &Policy,
    mut req: Request<ReqBody>,
    ev: &mut Event,
    inbound: &Inbound<'_>,
    eco: Ecosystem,
    m: &Mirror,
) -> Result<Sent, Stop> {
    let unreachable_mirror = |why: String| unreachable(UpstreamFailure::Connect, why, false);
    let dest = gate::mirror_dest(m).map_err(unreachable_mirror)?;
    let addrs = gate::mirror_addrs(ctx, policy, &dest, ev)
        .await
        .map_err(|why| unreachable(UpstreamFailure::Resolve, why, false))?;
    let host = inbound.dest.target.to_string();
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let path = gate::mirror_path(m, eco, &host, &pq);
    *req.uri_mut() = path
        .parse()
        .map_err(|_| Stop::Deny(Reason::Malformed, Some("unparsable mirror path".into())))?;
    ev.add_note(Some(format!("via the {} mirror", eco.as_str())));
    let scheme = if m.scheme == http::uri::Scheme::HTTP {
        Scheme::Http
    } else {
        Scheme::Https
    };
    let via = Inbound {
        client: inbound.client,
        dest: &dest,
        path: &path,
        scheme,
    };
    let origin = Origin::choose(ctx, &req, ev, &via, &addrs, false)?;
    rewrite(&mut req, ctx, &origin, None, None, scheme);
    for h in &m.inject {
        req.headers_mut().insert(h.name.clone(), h.value.clone());
    }
    send(ctx, req, origin, None, ev).await
}

fn unreachable(kind: UpstreamFailure, message: impl ToString, timeout: bool) -> Stop {
    Stop::Unreachable {
        kind,
        message: message.to_string(),
        timeout,
    }
}

/// Where an allowed request goes and how.
struct Origin {
    uri: Uri,
    /// The `Host` header it carries (`name`, or `name:port` off the
    /// scheme's default port).
    host: String,
    /// Plain HTTP: the checked address the pool dials.
    addr: Option<SocketAddr>,
    /// HTTPS: a client bound to this name and these checked addresses.
    tls: Option<TlsClient>,
}

impl Origin {
    /// Plain HTTP: the checked address in the URI is the pool key. HTTPS:
    /// a client bound to this name and these checked addresses, so the URI
    /// carries the name (it becomes h2's :authority) and no pooled
    /// connection is ever shared between names.
    fn choose<B>(
        ctx: &ProxyCtx,
        req: &Request<B>,
        ev: &mut Event,
        inbound: &Inbound<'_>,
        checked: &[SocketAddr],
        upgrade: bool,
    ) -> Result<Origin, Stop> {
        let dest = inbound.dest;
        let host = if dest.port == inbound.scheme.default_port() {
            dest.target.to_string()
        } else {
            format!("{}:{}", dest.target, dest.port)
        };
        let (uri, addr, tls) = match inbound.scheme {
            Scheme::Http => {
                let pq = origin_form(req.uri());
                let addr = checked[0];
                ev.addr = Some(addr);
                let uri = match ctx.egress {
                    // The origin gets the origin form; the pool dials `addr`.
                    Egress::Direct => pq,
                    // An upstream proxy gets the checked address, never the name.
                    Egress::Proxy(_) => format!("http://{addr}{pq}"),
                };
                let uri = uri.parse().map_err(|_| {
                    Stop::Deny(Reason::Malformed, Some("unparsable request target".into()))
                })?;
                (uri, Some(addr), None)
            }
            Scheme::Https => {
                let Some(origins) = ctx.tls_origins() else {
                    let why = "interception is not enabled";
                    return Err(unreachable(UpstreamFailure::Tls, why, false));
                };
                let client = origins
                    .client(dest, checked, upgrade)
                    .map_err(|e| unreachable(UpstreamFailure::Tls, e, false))?;
                // The client's authority, parsed once; the request's own
                // path and query, as parsed when it arrived.
                (client.uri(req.uri().path_and_query()), None, Some(client))
            }
        };
        Ok(Origin {
            uri,
            host,
            addr,
            tls,
        })
    }
}

/// The origin form: an empty path is `/` (`http://host?q` asks for `/?q`).
pub(crate) fn origin_form(uri: &Uri) -> String {
    let path = match uri.path() {
        "" => "/",
        p => p,
    };
    match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    }
}

/// Rewrites `req` for `origin`: hop-by-hop headers out, `Host`, `Via` and
/// the exception's credentials in, the upgrade (if any) asked for again.
/// Returns the client side of that upgrade.
fn rewrite(
    req: &mut Request<ReqBody>,
    ctx: &ProxyCtx,
    origin: &Origin,
    upgrade: Option<HeaderValue>,
    exception: Option<&Exception>,
    scheme: Scheme,
) -> Option<OnUpgrade> {
    let h = req.headers_mut();
    strip_hop_by_hop(h);
    // Forwarded in canonical form (`010` is 10 to some origins, 8 to
    // others); `check_framing` made sure there is one number.
    if let Ok(Some(n)) = content_length(h) {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    if let Some(p) = &upgrade {
        h.insert(header::UPGRADE, p.clone());
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    h.insert(
        header::HOST,
        HeaderValue::from_str(&origin.host).expect("normalised host is a valid header"),
    );
    h.append(header::VIA, VIA.clone());
    if let Some(e) = exception {
        inject(h, e);
    }
    // Plain HTTP through an upstream proxy goes to the proxy itself
    // (absolute form): it gets egressd's credentials, never the client's.
    if scheme == Scheme::Http {
        if let Some(auth) = ctx.egress.proxy_auth() {
            h.insert(header::PROXY_AUTHORIZATION, auth.clone());
        }
    }
    *req.uri_mut() = origin.uri.clone();
    *req.version_mut() = http::Version::HTTP_11;
    upgrade.is_some().then(|| hyper::upgrade::on(req))
}

/// What came back from the origin.
struct Sent {
    resp: Response<Incoming>,
    /// The pooled plain-HTTP connection, given back when the body ends.
    lent: Option<pool::Lent>,
    up_bytes: Arc<AtomicU64>,
    /// The client side of a WebSocket upgrade, and the client connection's
    /// permit, which the upgraded connection keeps until it closes.
    client_upgrade: Option<(OnUpgrade, Option<Permit>)>,
}

/// Sends `req` to `origin` and waits (bounded) for the response head.
async fn send(
    ctx: &ProxyCtx,
    req: Request<ReqBody>,
    origin: Origin,
    client_upgrade: Option<(OnUpgrade, Option<Permit>)>,
    ev: &mut Event,
) -> Result<Sent, Stop> {
    let up_bytes = Arc::new(AtomicU64::new(0));
    let body_failed = Arc::new(AtomicBool::new(false));
    let (parts, body) = req.into_parts();
    let body = Counted::new(body, up_bytes.clone()).flag_errors(body_failed.clone());
    let req = Request::from_parts(parts, body);
    let sent = async {
        match (&origin.tls, origin.addr) {
            (Some(c), _) => c
                .request(req.map(|b| b.boxed()))
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
    let result = tokio::time::timeout(RESPONSE_TIMEOUT, sent).await;
    if !matches!(result, Ok(Ok(_))) {
        ev.bytes_up = up_bytes.load(Ordering::Relaxed);
    }
    let (resp, lent) = match result {
        Ok(Ok(sent)) => sent,
        // The client's own body broke the exchange (hyper's chunk
        // extension bound, a bad chunk size): its request was malformed.
        Ok(Err(e)) if body_failed.load(Ordering::Relaxed) => {
            return Err(Stop::BadMessage {
                status: StatusCode::BAD_REQUEST,
                detail: format!("the request body: {e}"),
            })
        }
        Ok(Err(e)) => return Err(unreachable(UpstreamFailure::Connect, e, false)),
        Err(_) => {
            let why = "no response in time";
            return Err(unreachable(UpstreamFailure::Timeout, why, true));
        }
    };
    if let Some(why) = ambiguous_answer(resp.headers()) {
        // Neither the answer nor its connection is used: `lent` is
        // dropped here, closing the connection instead of pooling it.
        drop((resp, lent));
        ev.bytes_up = up_bytes.load(Ordering::Relaxed);
        return Err(unreachable(UpstreamFailure::Connect, why, false));
    }
    Ok(Sent {
        resp,
        lent,
        up_bytes,
        client_upgrade,
    })
}

/// The origin's response, on its way to the client: hop-by-hop headers
/// out, `Via` in, and either a body that writes the line when it ends or,
/// for a WebSocket the origin accepted, the upgraded connection relayed.
/// A pinned download's body is hashed on its way ([`gate::Verified`]).
fn answer(
    sent: Sent,
    mut ev: Event,
    ctx: &ProxyCtx,
    plan: Option<Plan>,
    mode: policy::Mode,
    secrets: Option<Arc<scrub::Secrets>>,
) -> Response<ProxyBody> {
    let rec = &ctx.recorder;
    let Sent {
        mut resp,
        lent,
        up_bytes,
        client_upgrade,
    } = sent;
    if let Some(a) = resp.extensions().get::<UpstreamAddr>() {
        ev.addr = Some(a.0);
    }
    ev.status = Some(resp.status().as_u16());
    let switching = resp.status() == http::StatusCode::SWITCHING_PROTOCOLS;
    let resp_upgrade = resp.headers().get(header::UPGRADE).cloned();
    strip_hop_by_hop(resp.headers_mut());
    resp.headers_mut().append(header::VIA, VIA.clone());
    if let Some(s) = &secrets {
        s.scrub_headers(resp.headers_mut());
    }
    if let (true, Some((client_up, permit)), Some(p)) = (switching, client_upgrade, resp_upgrade) {
        let origin_up = hyper::upgrade::on(&mut resp);
        let h = resp.headers_mut();
        h.insert(header::UPGRADE, p);
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        // The WebSocket's open line, on record before a byte is relayed.
        let opened = rec.open(&mut ev);
        let relay = relay_upgraded(client_up, origin_up, lent, ev, opened, rec.clone());
        tokio::spawn(async move {
            let _permit = permit;
            relay.await
        });
        let (parts, _) = resp.into_parts();
        return Response::from_parts(parts, respond::full(""));
    }
    if let Some(p) = &plan {
        gate::note_go_mod(ctx, p, resp.headers());
    }
    let (parts, body) = resp.into_parts();
    let (inner, integrity): (ProxyBody, _) = match plan {
        Some(Plan {
            what: PlanKind::Download { verify, cut },
            ..
        }) if !verify.is_empty() && parts.status == StatusCode::OK => {
            let v = gate::Verified::new(body, verify, cut);
            let outcome = v.outcome.clone();
            (v.boxed(), Some(outcome))
        }
        _ => (body.map_err(BoxError::from).boxed(), None),
    };
    let inner = match &secrets {
        Some(s) => scrub::Scrubbed::new(inner, s.clone()).boxed(),
        None => inner,
    };
    let body = Recorded {
        inner,
        up: up_bytes,
        down: 0,
        event: Some(ev),
        recorder: rec.clone(),
        lent,
        integrity,
        mode,
        secrets,
        held: None,
    };
    Response::from_parts(parts, body.boxed())
}

/// Relays an upgraded (WebSocket) connection both ways and writes its line
/// when it closes. The upgraded connection is never pooled; its sender
/// lives until the upgrade is done with.
async fn relay_upgraded(
    client_up: OnUpgrade,
    origin_up: OnUpgrade,
    lent: Option<pool::Lent>,
    mut ev: Event,
    opened: crate::log::Ticket,
    rec: Recorder,
) {
    let _lent = lent;
    if !rec.settle(opened).await {
        ev.error = Some("the decision log stopped taking lines as the connection opened".into());
        return rec.record(ev);
    }
    match tokio::try_join!(client_up, origin_up) {
        Ok((c, o)) => {
            let (up, down, result) = relay::streams(TokioIo::new(c), TokioIo::new(o), 0).await;
            ev.bytes_up = up;
            ev.bytes_down = down;
            if let Err(e) = result {
                ev.error = Some(format!("upgraded connection: {e}"));
            }
        }
        Err(e) => ev.error = Some(format!("upgrade: {e}")),
    }
    rec.record(ev);
}

/// The event of an HTTP request that arrived now from `src`: its method
/// and path (as the log keeps it) noted.
pub(crate) fn request_event<B>(proto: Proto, src: SocketAddr, req: &Request<B>) -> Event {
    let mut ev = Event::new(proto, src);
    ev.method = Some(req.method().as_str().to_string());
    ev.path = Some(truncate_path(req.uri().path()));
    ev
}

/// A path as the log line keeps it: no query or fragment, at most
/// [`MAX_LOGGED_PATH`] bytes.
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

/// The ecosystem whose registry `dest` is, when the policy enforces it.
fn package_gated(policy: &Policy, dest: &Dest) -> Option<Ecosystem> {
    match &dest.target {
        crate::policy::host::Target::Name(h) => policy.package_gated(h.as_str()),
        crate::policy::host::Target::Ip(_) => None,
    }
}

/// The policy's package sets.
fn package_policy(policy: &Policy) -> &PackagePolicy {
    &policy.packages
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
/// One pass over the names present: a request that carries none of them
/// (the usual case) costs a scan, not a dozen failed lookups. A name the
/// `Connection` header lists is compared with the names present (header
/// names are lowercase, tokens any case), not made into a `HeaderName`:
/// that allocated for every `Connection: keep-alive`.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    // The tokens `Connection` lists, read once rather than once per name
    // present; past the first few (a message rarely lists more than two),
    // the header is read again for each name.
    const KEPT: usize = 8;
    let listed = h.get_all(header::CONNECTION);
    let listed_tokens = || {
        listed
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
    };
    let mut tokens = [""; KEPT];
    let (mut kept, mut more) = (0, false);
    for t in listed_tokens() {
        match tokens.get_mut(kept) {
            Some(slot) => {
                *slot = t;
                kept += 1;
            }
            None => more = true,
        }
    }
    let named = |n: &HeaderName| {
        let n = n.as_str();
        tokens[..kept].iter().any(|t| t.eq_ignore_ascii_case(n))
            || (more && listed_tokens().any(|t| t.eq_ignore_ascii_case(n)))
    };
    let doomed: Vec<HeaderName> = h
        .keys()
        .filter(|n| is_hop_by_hop(n) || named(n))
        .cloned()
        .collect();
    for n in doomed {
        h.remove(n);
    }
}

fn is_hop_by_hop(n: &HeaderName) -> bool {
    HOP_BY_HOP.contains(n) || is_extra_hop_by_hop(n.as_str())
}

/// [`is_hop_by_hop`] for a name as it arrived (any case): the fast path's
/// view of the same list.
pub(crate) fn is_hop_by_hop_name(s: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| s.eq_ignore_ascii_case(h.as_str()))
        || is_extra_hop_by_hop(s)
}

/// The hop-by-hop names beyond [`HOP_BY_HOP`], compared in any case.
fn is_extra_hop_by_hop(s: &str) -> bool {
    // CGI-style servers read `_` as `-`: to them a `Content_Length` or
    // `Transfer_Encoding` is a second framing, and on a pooled connection a
    // smuggled request (past `methods`/`paths`, into another client's turn).
    let lookalike = |of: &str| {
        !s.eq_ignore_ascii_case(of)
            && s.bytes()
                .zip(of.bytes())
                .all(|(a, b)| a.to_ascii_lowercase() == b || (a == b'_' && b == b'-'))
    };
    match s.len() {
        10 => s.eq_ignore_ascii_case("keep-alive"),
        16 => s.eq_ignore_ascii_case("proxy-connection"),
        14 => lookalike("content-length"),
        17 => lookalike("transfer-encoding"),
        _ => false,
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
    for ih in e.inject() {
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

/// A response body that writes the request's log line once it is done
/// (fully sent, failed, or abandoned by the client): one line, always.
struct Recorded {
    inner: ProxyBody,
    up: Arc<AtomicU64>,
    down: u64,
    event: Option<Event>,
    recorder: Recorder,
    /// The pooled origin connection, given back once the response has
    /// been read to its end (and dropped, closing it, otherwise).
    lent: Option<pool::Lent>,
    /// A pinned download's check ([`gate::Verified`]'s outcome).
    integrity: Option<Arc<std::sync::atomic::AtomicU8>>,
    mode: policy::Mode,
    /// Injected values replaced on the way back ([`scrub`]).
    secrets: Option<Arc<scrub::Secrets>>,
    /// The answer's last frame (or its end), held until its line is
    /// written (DESIGN "The record holds").
    held: Option<Held>,
}

type Settling = Pin<Box<dyn std::future::Future<Output = bool> + Send + Sync>>;

struct Held {
    settling: Settling,
    last: Option<Frame<Bytes>>,
}

impl Recorded {
    /// The answer is complete: its line is written, and `last` goes to
    /// the client once the line reached the kernel, or an error instead
    /// (the answer does not complete) if the log stopped taking lines.
    fn release(
        &mut self,
        cx: &mut Context<'_>,
        last: Option<Frame<Bytes>>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let ticket = self.finish(None);
        if self.recorder.log.written(ticket) {
            return Poll::Ready(last.map(Ok));
        }
        let rec = self.recorder.clone();
        self.held = Some(Held {
            settling: Box::pin(async move { rec.settle(ticket).await }),
            last,
        });
        self.poll_held(cx)
    }

    fn poll_held(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(h) = self.held.as_mut() else {
            return Poll::Ready(None);
        };
        let Poll::Ready(ok) = h.settling.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        let last = self.held.take().and_then(|h| h.last);
        if ok {
            Poll::Ready(last.map(Ok))
        } else {
            Poll::Ready(Some(Err("the decision log is not taking lines".into())))
        }
    }

    fn finish(&mut self, error: Option<String>) -> crate::log::Ticket {
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
            if let Some(outcome) = &self.integrity {
                gate::note_integrity(&mut ev, outcome.load(Ordering::Relaxed), self.mode);
            }
            if let Some(s) = &self.secrets {
                s.note(&mut ev);
            }
            return self.recorder.commit(ev);
        }
        crate::log::Ticket::default()
    }
}

impl Body for Recorded {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.held.is_some() {
            return self.poll_held(cx);
        }
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.down += d.len() as u64;
                }
                if self.event.is_some() && self.inner.is_end_stream() {
                    return self.release(cx, Some(f));
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => {
                let msg = format!("response body: {e}");
                self.finish(Some(msg));
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => self.release(cx, None),
            Poll::Pending => Poll::Pending,
        }
    }
    fn is_end_stream(&self) -> bool {
        // Not before the line is written: an empty body is still polled
        // once, so its line is written before the answer completes.
        self.held.is_none() && self.event.is_none() && self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let incomplete = !self.inner.is_end_stream();
        let _ = self.finish(incomplete.then(|| {
            super::streams::reset_reason()
                .unwrap_or_else(|| "client went away before the response ended".to_string())
        }));
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

    /// A header named anywhere in a long `Connection` list goes, past the
    /// tokens read up front as well as among them.
    #[test]
    fn every_header_a_long_connection_list_names_goes() {
        let mut h = HeaderMap::new();
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("a1, a2, X-First, a4, a5, a6, a7"),
        );
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("a8, a9, x-LAST"),
        );
        for k in ["x-first", "x-last", "x-kept", "host"] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["host", "x-kept"]);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn one_chunked_last_is_the_only_transfer_encoding() {
        let status = |pairs: &[(&'static str, &'static str)]| match check_framing(&headers(pairs)) {
            Ok(()) => 200,
            Err(Stop::BadMessage { status, .. }) => status.as_u16(),
            Err(other) => panic!("{other:?}"),
        };
        let te = "transfer-encoding";
        assert_eq!(status(&[(te, "chunked")]), 200);
        assert_eq!(status(&[(te, " Chunked\t")]), 200);
        assert_eq!(status(&[]), 200);
        for bad in [
            "chunked, chunked",
            ",chunked",
            "chunked,",
            "gzip",
            "chunked, gzip",
        ] {
            assert_eq!(status(&[(te, bad)]), 400, "{bad}");
        }
        assert_eq!(status(&[(te, "chunked"), (te, "chunked")]), 400);
        assert_eq!(status(&[(te, "gzip, chunked")]), 501);
        assert_eq!(
            status(&[("content-length", "5"), ("content-length", "6")]),
            400
        );
    }

    #[test]
    fn lengths_and_ambiguous_answers() {
        let cl = |v: &'static str| content_length(&headers(&[("content-length", v)]));
        assert_eq!(cl("010"), Ok(Some(10)));
        assert_eq!(cl("0"), Ok(Some(0)));
        for bad in ["", "+5", "5, 5", "0x5", "99999999999999999999999"] {
            assert!(cl(bad).is_err(), "{bad}");
        }
        let te_cl = headers(&[("transfer-encoding", "chunked"), ("content-length", "5")]);
        assert!(ambiguous_answer(&te_cl).is_some());
        let two = headers(&[("content-length", "5"), ("content-length", "6")]);
        assert!(ambiguous_answer(&two).is_some());
        assert!(ambiguous_answer(&headers(&[("content-length", "5")])).is_none());
        assert!(ambiguous_answer(&headers(&[("transfer-encoding", "chunked")])).is_none());
    }

    #[test]
    fn the_origin_form_of_an_empty_path_is_slash() {
        let f = |u: &str| origin_form(&u.parse().unwrap());
        assert_eq!(f("http://a.test"), "/");
        assert_eq!(f("http://a.test?q=1"), "/?q=1");
        assert_eq!(f("http://a.test/x/y?z"), "/x/y?z");
    }
}
