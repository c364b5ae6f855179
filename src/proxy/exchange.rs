//! The shared request path for HTTP requests, plain or intercepted, in
//! four steps ([`decide_and_forward`]): decide → plan the route (plain, or
//! the package gate's [`gate::Route`]) → reach it through the one upstream
//! path ([`origin::reach`]) → answer, with a body that writes the line when
//! the response ends. Shared by the forward proxy, requests inside
//! intercepted tunnels (`mitm`) and captured plain HTTP (`transparent`),
//! which differ only in their edge checks ([`Inbound`]) and in how the
//! origin is reached ([`Scheme`]).
//!
//! WebSocket (HTTP/1.1 `Upgrade`) requests pass only after the decision;
//! an accepted upgrade writes an open line, and a close line when the
//! upgraded connection closes.
//!
//! Owns the decision step (framing, methods and their overrides, `TRACE`),
//! the order of the steps, and the response's rewrite on the way back.
//! Does not own the edge (parsing, `Host` agreement: the front-ends), the
//! package gate (`gate`), the request's rewrite on the way out and sending
//! it (`origin`), resolving and checking addresses (`upstream`), or
//! connections (`pool`, `tls_origins`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::admit::Draft;
use super::dest::Dest;
use super::gate::index_cache::{self, Use};
use super::gate::{self, Allowed, Gate, Plan, PlanKind, Route};
use super::held::{Cap, ReqBody};
use super::origin::{self, content_length, strip_hop_by_hop, Scheme, Sent, Way, VIA};
use super::pool;
use super::relay;
use super::respond::{self, BoxError, ProxyBody, Responder, Stop};
use super::scrub;
use super::tls_origins::UpstreamAddr;
use super::upload;
use super::upstream;
use super::writes::{self, Judged};
use super::ProxyCtx;
use crate::packages::compile::Mirror;
use crate::packages::Ecosystem;
use crate::policy::{self, ClientIdx, Decision, Exception, Policy, Proto, Reason};
use crate::record::{Event, Recorder};
use crate::time::unix_now;

/// Longest path kept in a log line.
const MAX_LOGGED_PATH: usize = 2048;

/// Headers many frameworks read the method from instead of the request
/// line (Rails, Symfony, Express's method-override, ASP.NET, ...).
/// Named as `HeaderName`s, not strings: a lookup by string parses the
/// name first, three times per request.
const METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// A request that passed its front-end's edge checks: the destination is
/// parsed, `Host` agrees with it, the path is normalised.
pub(crate) struct Inbound<'a> {
    pub client: Option<ClientIdx>,
    pub dest: &'a Dest,
    /// Normalised path, for `paths:` rules.
    pub path: &'a str,
    pub scheme: Scheme,
}

/// Decides `req` and, when allowed, forwards it, in four steps: the
/// decision; the route (plain, or the package gate's: a gated index, a
/// gated download, a mirror); the one upstream path ([`origin::reach`]);
/// the answer, whose body writes the line. Every way it ends records
/// exactly one line.
pub(crate) async fn decide_and_forward(
    ctx: &ProxyCtx,
    policy: &Policy,
    mut req: Request<Incoming>,
    mut ev: Event,
    inbound: Inbound<'_>,
    responder: &Responder<'_>,
) -> Response<ProxyBody> {
    let now = unix_now();
    let d = match admit(policy, &req, &mut ev, &inbound, now) {
        Ok(d) => d,
        Err(stop) => return responder.stop(ev, stop),
    };
    super::matched::send_the_path_matched(req.uri_mut(), d.exception, inbound.path);
    Draft::publish(&req, &ev);
    let at = inbound.allowed(ctx, policy, &d, now, responder);
    let (route, ev) = match plan_route(&at, &mut req, inbound.scheme, ev).await {
        Gate::Go(route, ev) => (route, ev),
        Gate::Answered(resp) => return resp,
    };
    // `body:` may hand the request to a later exception that allows its
    // body: the steps after it see that exception's decision.
    let mut d = d;
    let cands = match d.exception {
        Some(e) if e.body().is_some() => allowing(policy, &req, ev.proto, &inbound, now),
        _ => Vec::new(),
    };
    let mode = policy.settings.mode;
    let judged = writes::judge(req, ev, inbound.path, cands, &mut d, mode, responder);
    let (req, mut ev, advert) = match Box::pin(judged).await {
        Judged::Forward(req, ev) => (req, ev, false),
        Judged::Advertise(req, ev) => (req, ev, true),
        Judged::Answered(resp) => return resp,
    };
    let req = match upload::meter(req, &mut ev, &d, policy.settings.mode) {
        Ok(req) => req,
        Err(stop) => return responder.stop(ev, stop),
    };
    let at = inbound.allowed(ctx, policy, &d, now, responder);
    let mirror = route.mirror.as_ref().map(|(e, m)| (*e, m));
    match reach_origin(&at, inbound.scheme, req, &mut ev, mirror).await {
        Ok(sent) => answer_route(&at, sent, ev, route, advert).await,
        Err(stop) => responder.stop(ev, stop),
    }
}

impl<'a> Inbound<'a> {
    /// The request, allowed by `d`, as the steps after the decision see it.
    fn allowed(
        &self,
        ctx: &'a ProxyCtx,
        policy: &'a Policy,
        d: &'a Decision<'a>,
        now: i64,
        responder: &'a Responder<'a>,
    ) -> Allowed<'a> {
        Allowed {
            ctx,
            policy,
            client: self.client,
            dest: self.dest,
            decision: d,
            now,
            responder,
        }
    }
}

/// The decision step: the request's framing checked, the one decision
/// made (and noted in `ev`), a `TRACE` that would echo injected
/// credentials refused. Whatever refuses it is the `Stop` that answers.
fn admit<'p>(
    policy: &'p Policy,
    req: &Request<Incoming>,
    ev: &mut Event,
    inbound: &Inbound<'_>,
    now: i64,
) -> Result<Decision<'p>, Stop> {
    check_framing(req.headers())?;
    let d = decide(policy, req, ev, inbound, now);
    if !d.is_allowed() {
        return Err(Stop::Decided);
    }
    scrub::refuse_trace(req.method(), d.exception)?;
    Ok(d)
}

/// The route step: plain, unless the host is a gated registry's; then
/// the gate's route, or its own answer (a denial, or a gated index
/// answered from egressd's cache).
async fn plan_route(
    at: &Allowed<'_>,
    req: &mut Request<Incoming>,
    scheme: Scheme,
    ev: Event,
) -> Gate {
    let Some(eco) = package_gated(at.policy, at.dest) else {
        return Gate::Go(Route::default(), ev);
    };
    // The package gate's and the mirror's futures are boxed: they are
    // large and rare, and inline they would make every request's future
    // (which hyper moves per request) as large as theirs.
    let (Route { mirror, mut plan }, mut ev) = match Box::pin(gate::gate(at, eco, req, ev)).await {
        Gate::Go(route, ev) => (route, ev),
        answered => return answered,
    };
    // What the gate noted is the draft's from here on; a request no gate
    // saw keeps the draft published after the decision.
    Draft::publish(req, &ev);
    let to_mirror = mirror.as_ref().map(|(_, m)| m);
    let kept = match plan.as_mut() {
        Some(p) => from_kept(at, req, scheme, p, to_mirror, &mut ev),
        None => None,
    };
    match (kept, plan) {
        (Some(kept), Some(plan)) => {
            Gate::Answered(Box::pin(gate::answer_index(at, plan, kept, ev, 0)).await)
        }
        (_, plan) => Gate::Go(Route { mirror, plan }, ev),
    }
}

/// The answer step: a gated index that came back whole is filtered;
/// anything else is relayed ([`answer`]), an advertisement of a write
/// rule's marked ([`writes::answered`]).
async fn answer_route(
    at: &Allowed<'_>,
    sent: Sent,
    ev: Event,
    route: Route,
    advert: bool,
) -> Response<ProxyBody> {
    let Route { mirror, plan } = route;
    match plan {
        Some(p)
            if matches!(p.what, PlanKind::Index { .. }) && sent.resp.status() == StatusCode::OK =>
        {
            answer_index(at, sent, ev, p).await
        }
        plan => {
            let injected = mirror.iter().flat_map(|(_, m)| m.inject.iter());
            let secrets = scrub::Secrets::of(at.decision.exception, injected.map(|h| &h.value));
            let mode = at.policy.settings.mode;
            writes::answered(answer(sent, ev, at.ctx, plan, mode, secrets), advert)
        }
    }
}

/// A gated index the registry answered: read whole and filtered
/// ([`gate::answer_index`]), its connection given back after.
async fn answer_index(at: &Allowed<'_>, sent: Sent, ev: Event, plan: Plan) -> Response<ProxyBody> {
    let Sent {
        mut resp,
        lent,
        up_bytes,
        ..
    } = sent;
    strip_hop_by_hop(resp.headers_mut());
    resp.headers_mut().append(header::VIA, VIA.clone());
    let up = up_bytes.load(Ordering::Relaxed);
    let r = Box::pin(gate::answer_index(at, plan, resp, ev, up)).await;
    // The whole body was read: the connection may be reused.
    if let Some(l) = lent {
        l.give_back();
    }
    r
}

/// A gated index request the cache can answer: the kept copy, as the
/// registry's answer to filter (its `Age` set, the line noting it);
/// otherwise `None`, with the plan told where to keep the registry's
/// answer if the request allows keeping it.
fn from_kept(
    at: &Allowed<'_>,
    req: &Request<Incoming>,
    scheme: Scheme,
    plan: &mut Plan,
    mirror: Option<&Mirror>,
    ev: &mut Event,
) -> Option<Response<http_body_util::Full<Bytes>>> {
    let PlanKind::Index { keep, .. } = &mut plan.what else {
        return None;
    };
    let exception = at.decision.exception?;
    let injects = !exception.inject().is_empty() || mirror.is_some_and(|m| !m.inject.is_empty());
    let Use::UpTo(limit) = index_cache::request_use(req.headers(), injects) else {
        return None;
    };
    let key = index_cache::Key {
        scheme: scheme.as_str(),
        host: at.dest.target.to_string(),
        port: at.dest.port,
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
    let Some(kept) = at.ctx.index_cache.get(&key, limit) else {
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

/// Every exception that allows `req` as the decision saw it, in load
/// order: `body:` rules are judged over them.
fn allowing<'p>(
    policy: &'p Policy,
    req: &Request<Incoming>,
    proto: policy::Proto,
    inbound: &Inbound<'_>,
    now: i64,
) -> Vec<&'p Exception> {
    let overrides = method_overrides(req.headers());
    let preq = policy::Request {
        proto,
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
    policy.allowing(&preq, now)
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

/// The reach step: checked addresses, then the one upstream path. A
/// package request for an ecosystem with a mirror goes to the mirror
/// instead (its path mapped, its headers injected, its addresses not
/// judged by the exceptions).
async fn reach_origin(
    at: &Allowed<'_>,
    scheme: Scheme,
    req: Request<ReqBody>,
    ev: &mut Event,
    mirror: Option<(Ecosystem, &Mirror)>,
) -> Result<Sent, Stop> {
    if let Some(m) = mirror {
        return Box::pin(reach_mirror(at, req, ev, m)).await;
    }
    let checked = upstream::check_destination(at.ctx, at.policy, at.reach(), ev).await?;
    let upgrade = upgrade_protocol(&req);
    let way = Way {
        dest: at.dest,
        scheme,
        addrs: &checked,
        exception: at.decision.exception,
        inject: &[],
    };
    origin::reach(at.ctx, req, ev, way, upgrade).await
}

/// [`reach_origin`] for a registry request served by its mirror.
async fn reach_mirror(
    at: &Allowed<'_>,
    mut req: Request<ReqBody>,
    ev: &mut Event,
    (eco, m): (Ecosystem, &Mirror),
) -> Result<Sent, Stop> {
    let host = at.dest.target.to_string();
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let to = gate::to_mirror(at.ctx, at.policy, (eco, m), (&host, &pq), ev).await?;
    *req.uri_mut() = to
        .path
        .parse()
        .map_err(|_| Stop::Deny(Reason::Malformed, Some("unparsable mirror path".into())))?;
    ev.add_note(Some(format!("via the {} mirror", eco.as_str())));
    let mut sent = origin::reach(at.ctx, req, ev, to.way(m), None).await?;
    gate::rewrite_mirror_location(m, sent.resp.headers_mut());
    Ok(sent)
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
    if let (true, Some((client_up, permit, cap)), Some(p)) =
        (switching, client_upgrade, resp_upgrade)
    {
        let origin_up = hyper::upgrade::on(&mut resp);
        let h = resp.headers_mut();
        h.insert(header::UPGRADE, p);
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        // The WebSocket's open line, on record before a byte is relayed.
        let opened = rec.open(&mut ev);
        let relay = relay_upgraded(client_up, origin_up, lent, ev, opened, rec.clone(), cap);
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
    cap: Option<Cap>,
) {
    let _lent = lent;
    if !rec.settle(opened).await {
        ev.error = Some("the decision log stopped taking lines as the connection opened".into());
        return rec.record(ev);
    }
    match tokio::try_join!(client_up, origin_up) {
        Ok((c, o)) => {
            let (c, o) = (TokioIo::new(c), TokioIo::new(o));
            // Under an upload budget, what the client sends is charged.
            let (up, down, result) = relay::streams(c, o, 0, cap.map(|c| c.0)).await;
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
}
