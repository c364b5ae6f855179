//! The package gate on the wire (DESIGN "Packages"): every request to a
//! registry host of an enforced ecosystem, once the host itself is allowed,
//! is classified, decided by `packages`, and either answered here
//! (a denial in the channel its client shows, a `304`), or forwarded with a
//! [`Plan`] for its response: an index document filtered before the client
//! sees it, a pinned download hashed as it streams.
//!
//! A download needs the package's index to be decided (the filtered index
//! and the download must agree): when no view of it is cached, egressd
//! fetches the index itself, through the same checked-address TLS path as
//! the client's requests, as its own logged request (`"origin":
//! "egressd"`), and keeps the registry's facts ([`Views`]) for
//! [`VIEW_TTL`].
//!
//! Owns: the gate's answers, the index response rewrite (decompression
//! bound, filter, `ETag`/`304`), egressd's own index fetches and their
//! cache, the streaming sha256 check. Does not own: which versions are
//! allowed (`packages`), the host decision or how requests reach
//! origins (`exchange`, `upstream`, `tls_origins`).

use std::io::Read;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Frame, SizeHint};

use super::dest::Dest;
use super::index_cache;
use super::respond::{self, BoxError, ProxyBody, Responder};
use super::tls_origins::UpstreamAddr;
use super::upstream;
use super::ProxyCtx;
use crate::packages::classify::{
    self, classify, go_mod_path, index_location, Classified, IndexForm, Kind, PackageRef,
};
use crate::packages::compile::{Mirror, PackagePolicy};
use crate::packages::decide::{deny_phrase, PackageDecision, PackageReason, Verdict};
use crate::packages::filter::{self, FilterError, Filtered, MAX_INDEX_BYTES};
use crate::packages::name::PackageName;
use crate::packages::stamp::parse_http_date;
use crate::packages::view::IndexView;
use crate::packages::Ecosystem;
use crate::policy::host::{parse_target, Target};
use crate::policy::path::{normalize_path, PathError};
use crate::policy::{self, enforced, ClientIdx, Decision, Mode, Policy, Proto, Reason};
use crate::record::{Event, PackageLine, UpstreamFailure};
use crate::tls::lru::Lru;

/// How long a package's index view, fetched by egressd or read from a
/// client's index response, authorises downloads before it is read again.
pub const VIEW_TTL: Duration = Duration::from_secs(60);
/// Package views kept at once (least recently used dropped).
pub const MAX_VIEWS: usize = 1024;
/// Go `.mod` publish times kept at once ((module, version) pairs; a
/// publish time never changes, so they are kept until evicted).
pub const MAX_GO_TIMES: usize = 16_384;
/// Versions of one Go module whose `.mod` egressd fetches to filter an
/// `@v/list` (newest last in the list; older ones beyond this stay
/// without a time, and `time_unknown` applies to them).
pub const MAX_GO_MOD_FETCHES: usize = 64;
/// Longest wait for egressd's own index fetch, head and body.
pub const OWN_FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for an index response's body (to filter it).
pub const INDEX_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Headers that make a registry answer `304` to a copy the client
/// filtered under an older policy: never sent upstream for an index.
const CONDITIONALS: [HeaderName; 5] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

/// A package's view and when it was read.
type ViewCache = Lru<(Ecosystem, PackageName), (Instant, Arc<IndexView>)>;

/// The registry's facts per package, as egressd last read them.
pub(crate) struct Views {
    views: Mutex<ViewCache>,
    go_times: Mutex<Lru<(PackageName, String), Option<i64>>>,
}

impl Views {
    pub(crate) fn new() -> Views {
        Views {
            views: Mutex::new(Lru::new(MAX_VIEWS)),
            go_times: Mutex::new(Lru::new(MAX_GO_TIMES)),
        }
    }

    fn get(&self, eco: Ecosystem, name: &PackageName) -> Option<Arc<IndexView>> {
        let mut v = self.views.lock().unwrap_or_else(|e| e.into_inner());
        let key = (eco, name.clone());
        match v.get(&key) {
            Some((at, view)) if at.elapsed() < VIEW_TTL => Some(view.clone()),
            Some(_) => {
                v.remove(&key);
                None
            }
            None => None,
        }
    }

    fn put(&self, view: IndexView) -> Arc<IndexView> {
        let view = Arc::new(view);
        let mut v = self.views.lock().unwrap_or_else(|e| e.into_inner());
        v.insert(
            (view.ecosystem, view.name.clone()),
            (Instant::now(), view.clone()),
        );
        view
    }

    fn go_time(&self, module: &PackageName, version: &str) -> Option<Option<i64>> {
        let mut t = self.go_times.lock().unwrap_or_else(|e| e.into_inner());
        t.get(&(module.clone(), version.to_string())).copied()
    }

    fn put_go_time(&self, module: &PackageName, version: &str, time: Option<i64>) {
        let mut t = self.go_times.lock().unwrap_or_else(|e| e.into_inner());
        t.insert((module.clone(), version.to_string()), time);
    }
}

/// The line's reason for a package denial.
fn line_reason(r: PackageReason) -> Reason {
    Reason::from(r)
}

/// What the gate makes of one request.
pub(crate) enum Gate {
    /// Not a package request: the ordinary path.
    Pass(Event),
    /// Answered here (a denial, or egressd could not read what it needed):
    /// the line is recorded.
    Answered(Response<ProxyBody>),
    /// Forwarded; its response handled as the plan says.
    Forward(Plan, Event),
    /// A registry resource that names no package (PyPI's project list,
    /// cargo's `config.json`), sent to the ecosystem's mirror.
    Mirror(Ecosystem, Mirror, Event),
}

/// What to do with the response of a request the gate let through.
pub(crate) struct Plan {
    pub eco: Ecosystem,
    pub name: PackageName,
    pub client: Option<ClientIdx>,
    pub what: PlanKind,
    /// Whether package denials are enforced (not `mode: report`).
    pub enforce: bool,
    /// The mirror the request goes to instead of the public registry.
    pub mirror: Option<Mirror>,
    /// The port the client asked for (egressd's own fetches use it too).
    pub port: u16,
    /// The set that approved the name (egressd's own fetches for this
    /// response log it).
    pub set: Option<Arc<str>>,
}

pub(crate) enum PlanKind {
    /// An index document in this (requested) form: filtered.
    Index {
        form: IndexForm,
        /// The client's `If-None-Match`, answered against the filtered ETag.
        if_none_match: Option<HeaderValue>,
        /// Where the registry's answer is kept if it allows
        /// ([`index_cache`]); `None`: the request may not use the cache.
        keep: Option<Box<index_cache::Key>>,
    },
    /// A download whose body must hash to one of these (empty: any);
    /// `cut`: a mismatch ends the transfer (the mode enforces it).
    Download { verify: Vec<[u8; 32]>, cut: bool },
    /// Anything else the gate allowed (per-version metadata, Go `.mod`).
    Other { go_mod: Option<String> },
}

/// The facts a gate decision adds to the line.
fn package_line(
    eco: Ecosystem,
    r: Option<&PackageRef>,
    d: Option<&PackageDecision<'_>>,
) -> Box<PackageLine> {
    Box::new(PackageLine {
        ecosystem: eco,
        name: r.map(|r| r.name.as_str().to_string()),
        version: r.and_then(|r| match r.kind {
            Kind::Index(_) => None,
            _ => r.version.clone(),
        }),
        set: d.and_then(|d| d.set).map(|s| s.id.clone()),
        reason: d.and_then(|d| d.reason()),
        hidden: None,
        did_you_mean: d.and_then(|d| d.did_you_mean).map(str::to_string),
    })
}

/// The gate for one request whose host the policy allowed (`host` is an
/// `eco` registry host; `pkgs` the policy's package sets). Records the
/// line of what it answers itself.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn gate<B>(
    ctx: &ProxyCtx,
    policy: &Policy,
    pkgs: &PackagePolicy,
    eco: Ecosystem,
    req: &mut Request<B>,
    mut ev: Event,
    client: Option<ClientIdx>,
    dest: &Dest,
    host_decision: &Decision<'_>,
    now: i64,
    responder: &Responder<'_>,
) -> Gate {
    let host = dest.target.to_string();
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mode = policy.settings.mode;
    let read_as = public_path(pkgs.settings.mirror(eco), &path);
    let r = match classify(
        Some(eco),
        &host,
        req.method().as_str(),
        &read_as,
        accept.as_deref(),
    ) {
        Classified::Registry(..) => {
            return match pkgs.settings.mirror(eco) {
                Some(m) => Gate::Mirror(eco, m.clone(), ev),
                None => Gate::Pass(ev),
            }
        }
        Classified::NotRegistry => return Gate::Pass(ev),
        Classified::Unparseable { ecosystem, why } => {
            let reason = PackageReason::Unparseable;
            let mut line = package_line(ecosystem, None, None);
            line.reason = Some(reason);
            ev.package = Some(line);
            let answer = Denied {
                eco: ecosystem,
                reason,
                name: None,
                version: None,
                did_you_mean: None,
                set: None,
                detail: Some(why),
            };
            return match deny(ev, answer, host_decision, mode, responder) {
                Ok(resp) => Gate::Answered(resp),
                Err(ev) => Gate::Pass(*ev),
            };
        }
        Classified::Package(r) => r,
    };
    let client_u32 = client;
    let mut view = ctx.package_views.get(eco, &r.name);
    let mut d = pkgs.decide(client_u32, &r, now, view.as_deref());
    if d.verdict == Verdict::NeedIndex {
        let serves = Serves {
            name: &r.name,
            set: d.set.map(|s| &s.id),
            version: None,
        };
        let by = OnBehalf {
            ctx,
            policy,
            client,
            port: dest.port,
            parent: &ev,
            now,
        };
        match own_index(by, pkgs, eco, serves).await {
            Ok(v) => {
                view = Some(v);
                d = pkgs.decide(client_u32, &r, now, view.as_deref());
            }
            Err(why) => {
                let reason = PackageReason::IndexUnfilterable;
                let mut line = package_line(eco, Some(&r), Some(&d));
                line.reason = Some(reason);
                ev.package = Some(line);
                let answer = Denied {
                    eco,
                    reason,
                    name: Some(r.name.as_str()),
                    version: r.version.as_deref(),
                    did_you_mean: None,
                    set: d.set.map(|s| (&*s.id, &*s.owner)),
                    detail: Some(format!("egressd could not read its index: {why}")),
                };
                // Not a policy decision: refused in every mode.
                return Gate::Answered(enforced_deny(ev, answer, host_decision, responder));
            }
        }
    }
    ev.package = Some(package_line(eco, Some(&r), Some(&d)));
    let enforce = enforced(mode, line_reason(PackageReason::NotApproved));
    match d.verdict {
        Verdict::Deny(reason) => {
            let answer = Denied {
                eco,
                reason,
                name: Some(r.name.as_str()),
                version: r
                    .version
                    .as_deref()
                    .filter(|_| !matches!(r.kind, Kind::Index(_))),
                did_you_mean: d.did_you_mean,
                set: d.set.map(|s| (&*s.id, &*s.owner)),
                detail: d.deny_reason.map(str::to_string),
            };
            match deny(ev, answer, host_decision, mode, responder) {
                Ok(resp) => return Gate::Answered(resp),
                Err(e) => ev = *e,
            }
        }
        Verdict::NeedIndex => {
            // The view egressd just read does not settle it: refuse.
            let reason = PackageReason::IndexUnfilterable;
            if let Some(l) = ev.package.as_mut() {
                l.reason = Some(reason);
            }
            let answer = Denied {
                eco,
                reason,
                name: Some(r.name.as_str()),
                version: r.version.as_deref(),
                did_you_mean: None,
                set: None,
                detail: Some("the index egressd read does not decide this file".into()),
            };
            return Gate::Answered(enforced_deny(ev, answer, host_decision, responder));
        }
        Verdict::Allow => {}
    }
    let what = match (&r.kind, d.filter) {
        (Kind::Index(_), Some(form)) if req.method() == http::Method::GET => {
            let if_none_match = req.headers().get(header::IF_NONE_MATCH).cloned();
            prepare_index_request(req.headers_mut());
            PlanKind::Index {
                form,
                if_none_match,
                keep: None,
            }
        }
        (Kind::Artifact(a), _) if !a.metadata && !d.verify_sha256.is_empty() => {
            // The whole file is hashed: a range of it cannot be checked.
            req.headers_mut().remove(header::RANGE);
            req.headers_mut().remove(header::IF_RANGE);
            PlanKind::Download {
                verify: d.verify_sha256.clone(),
                cut: enforced(mode, line_reason(PackageReason::IntegrityMismatch)),
            }
        }
        (Kind::Meta(classify::MetaKind::GoMod), _) => PlanKind::Other {
            go_mod: r.version.clone(),
        },
        _ => PlanKind::Other { go_mod: None },
    };
    let plan = Plan {
        eco,
        name: r.name.clone(),
        client,
        what,
        enforce,
        mirror: pkgs.settings.mirror(eco).cloned(),
        port: dest.port,
        set: d.set.map(|s| s.id.clone()),
    };
    Gate::Forward(plan, ev)
}

/// An index request as it goes upstream: no conditionals (the client's
/// validators are checked against the filtered document here, never by
/// the registry), and only gzip, the one encoding egressd decodes.
fn prepare_index_request(h: &mut HeaderMap) {
    for c in &CONDITIONALS {
        h.remove(c);
    }
    h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
}

/// A package denial, as its client will show it.
struct Denied<'a> {
    eco: Ecosystem,
    reason: PackageReason,
    name: Option<&'a str>,
    version: Option<&'a str>,
    did_you_mean: Option<&'a str>,
    /// (id, owner) of the set that held or denied.
    set: Option<(&'a str, &'a str)>,
    detail: Option<String>,
}

impl Denied<'_> {
    /// Why, in a clause: what the reason means for this name.
    fn why(&self) -> String {
        let name = self.name.unwrap_or("this request");
        let nv = match self.version {
            Some(v) => format!("{name} {v}"),
            None => name.to_string(),
        };
        let mut s = match self.reason {
            PackageReason::NotApproved => {
                format!("no approved package set for this client lists {name}")
            }
            PackageReason::VersionNotApproved => {
                format!("{nv} is outside the versions its package set approves")
            }
            PackageReason::TooNew => {
                format!("{nv} was published more recently than its package set's min_age allows")
            }
            PackageReason::TimeUnknown => format!(
                "the registry gives no publish time for {nv}, and settings.packages.time_unknown is deny"
            ),
            PackageReason::Denied => format!("{nv} is denied by a package set"),
            PackageReason::SetExpired => {
                format!("the package set that approves {name} has expired")
            }
            PackageReason::NotListed => {
                format!("{nv} is not a file the filtered index of {name} lists")
            }
            PackageReason::IntegrityMismatch => {
                format!("{nv} does not match the sha256 its package set pins")
            }
            PackageReason::IndexUnfilterable => {
                format!("egressd could not filter the index of {name}")
            }
            PackageReason::Unparseable => {
                "egressd cannot read this registry request as a package".to_string()
            }
        };
        if let Some(d) = &self.detail {
            s.push_str(": ");
            s.push_str(d);
        }
        if let Some(m) = self.did_you_mean {
            s.push_str(&format!("; did you mean {m}?"));
        }
        s
    }

    fn phrase(&self) -> String {
        let p = deny_phrase(
            self.reason,
            self.name.unwrap_or("-"),
            self.version,
            self.did_you_mean,
        );
        // The phrase names the status it goes with: a 502 is no "Forbidden".
        match (self.reason.status(), p.strip_prefix("Forbidden")) {
            (502, Some(rest)) => format!("Bad Gateway{rest}"),
            _ => p,
        }
    }

    /// The text body (pip, cargo, go, and anyone else).
    fn text(&self, what: &str, contact: &str) -> String {
        let why = self.why();
        let stop = if why.ends_with('?') { "" } else { "." };
        let mut body = format!(
            "egressd denied {what} ({}): {why}{stop}\n",
            self.reason.as_str()
        );
        if let Some((id, owner)) = self.set {
            body.push_str(&format!("Package set: {id} (owner {owner}).\n"));
        }
        if self.reason.status() == 403 {
            body.push_str(&format!(
                "If this task needs it, ask {contact} to approve it in a package set, saying which package and why.\n"
            ));
        }
        body
    }

    /// The npm registry's error document: npm prints its `error`.
    fn npm_json(&self, what: &str, contact: &str) -> String {
        let mut msg = format!("egressd: {} {}", self.reason.as_str(), self.why());
        if let Some((id, _)) = self.set {
            msg.push_str(&format!(" (package set {id})"));
        }
        if self.reason.status() == 403 {
            msg.push_str(&format!("; ask {contact} to approve it"));
        }
        let mut v = serde_json::json!({
            "error": msg,
            "reason": self.reason.as_str(),
            "denied": what,
            "set": self.set.map(|(id, _)| id),
            "did_you_mean": self.did_you_mean,
            "contact": contact,
        })
        .to_string();
        v.push('\n');
        v
    }
}

/// [`deny`] in every mode: a refusal that is not the policy's.
fn enforced_deny(
    ev: Event,
    d: Denied<'_>,
    host_decision: &Decision<'_>,
    responder: &Responder<'_>,
) -> Response<ProxyBody> {
    let mode = ev.mode;
    match deny(ev, d, host_decision, Mode::Enforce, responder) {
        Ok(r) => r,
        Err(mut ev) => {
            ev.mode = mode;
            let r = Response::new(respond::full(""));
            responder.rec.record(*ev);
            r
        }
    }
}

/// Answers a package denial and records the line — unless `mode` does not
/// enforce it (report mode): then the denial is noted in the event, given
/// back to go on.
fn deny(
    mut ev: Event,
    d: Denied<'_>,
    host_decision: &Decision<'_>,
    mode: Mode,
    responder: &Responder<'_>,
) -> Result<Response<ProxyBody>, Box<Event>> {
    let reason = line_reason(d.reason);
    let decision = Decision::deny(reason, host_decision.exception).under(mode);
    ev.set_decision(&decision, mode);
    if decision.is_allowed() {
        return Err(Box::new(ev));
    }
    let what = (responder.what)();
    let (body, ctype) = match d.eco {
        Ecosystem::Npm => (d.npm_json(&what, responder.contact), "application/json"),
        _ => (
            d.text(&what, responder.contact),
            "text/plain; charset=utf-8",
        ),
    };
    let status = respond::status_for(Reason::from(d.reason));
    let mut resp = Response::new(respond::full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        respond::REASON_HEADER,
        HeaderValue::from_static(d.reason.as_str()),
    );
    if responder.close {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    // pip shows nothing of a failed download but its status line.
    if let Ok(p) = hyper::ext::ReasonPhrase::try_from(d.phrase().into_bytes()) {
        resp.extensions_mut().insert(p);
    }
    ev.status = Some(status.as_u16());
    ev.add_note(d.detail);
    responder.rec.record(ev);
    Ok(resp)
}

/// The path `paths:` rules see: [`normalize_path`]'s, except that on an
/// npm registry host `%2f`/`%2F` is the scope separator (`/@s%2fn` is the
/// package `@s/n`, what npm itself sends), not an encoded `/` to refuse.
pub(crate) fn policy_path(target: &Target, raw: &str) -> Result<String, PathError> {
    let npm = matches!(target, Target::Name(h)
        if classify::registry_ecosystem(h.as_str()) == Some(Ecosystem::Npm));
    if npm && (raw.contains("%2f") || raw.contains("%2F")) {
        return normalize_path(&raw.replace("%2f", "/").replace("%2F", "/"));
    }
    normalize_path(raw)
}

// ---------------------------------------------------------------- index responses

/// Why an index could not be filtered.
fn unfilterable(why: impl Into<String>) -> FilterError {
    FilterError::Unfilterable(why.into())
}

/// Reads a response body up to `max` bytes (more is an error), within
/// [`INDEX_BODY_TIMEOUT`].
async fn read_bounded<B>(mut body: B, max: usize) -> Result<Vec<u8>, FilterError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let read = async {
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| unfilterable(format!("reading the index: {e}")))?;
            if let Ok(d) = frame.into_data() {
                if out.len() + d.len() > max {
                    return Err(over_bound());
                }
                out.extend_from_slice(&d);
            }
        }
        Ok(out)
    };
    tokio::time::timeout(INDEX_BODY_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| Err(unfilterable("the index did not arrive in time")))
}

fn over_bound() -> FilterError {
    unfilterable(format!(
        "the index is over the {} MiB bound",
        MAX_INDEX_BYTES >> 20
    ))
}

/// The document under its `Content-Encoding` (none or gzip, the one
/// egressd asks for), at most [`MAX_INDEX_BYTES`] decompressed.
fn decode(encoding: Option<&HeaderValue>, raw: Vec<u8>) -> Result<Vec<u8>, FilterError> {
    let enc = encoding
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    match enc.as_str() {
        "" | "identity" => Ok(raw),
        "gzip" | "x-gzip" => {
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(&raw[..])
                .take(MAX_INDEX_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| unfilterable(format!("gzip: {e}")))?;
            if out.len() > MAX_INDEX_BYTES {
                return Err(over_bound());
            }
            Ok(out)
        }
        other => Err(unfilterable(format!(
            "content encoding {other:?} (egressd asks for gzip only)"
        ))),
    }
}

/// Whether documents of this form carry publish times (their view can
/// authorise downloads and time the forms without them).
fn timed(form: IndexForm) -> bool {
    matches!(
        form,
        IndexForm::PypiSimpleJson
            | IndexForm::PypiJson
            | IndexForm::NpmFull
            | IndexForm::CargoSparse
    )
}

/// An index response of an allowed package, as the client gets it: read
/// (bounded), decoded, filtered, with its own `ETag` (and `304` when the
/// client has that one). The line is recorded here.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn answer_index<B>(
    ctx: &ProxyCtx,
    policy: &Policy,
    pkgs: &PackagePolicy,
    plan: Plan,
    resp: Response<B>,
    mut ev: Event,
    bytes_up: u64,
    now: i64,
    responder: &Responder<'_>,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let PlanKind::Index {
        form,
        if_none_match,
        keep,
    } = &plan.what
    else {
        unreachable!("answer_index is given index plans only");
    };
    if let Some(a) = resp.extensions().get::<UpstreamAddr>() {
        ev.addr = Some(a.0);
    }
    ev.bytes_up = bytes_up;
    let (mut parts, body) = resp.into_parts();
    let read = async {
        let raw = read_bounded(body, MAX_INDEX_BYTES).await?;
        let doc = decode(parts.headers.get(header::CONTENT_ENCODING), raw)?;
        let ct = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let got = IndexForm::from_content_type(*form, ct)
            .ok_or_else(|| unfilterable(format!("content type {:?}", ct.unwrap_or(""))))?;
        Ok::<_, FilterError>((doc, got))
    };
    // `as_sent`: the registry's document, decoded, which is what the
    // cache keeps; `doc`: what is filtered (with a mirror's URLs
    // rewritten).
    let (as_sent, got) = match read.await {
        Ok((doc, got)) => (doc, Ok(got)),
        Err(e) => (Vec::new(), Err(e)),
    };
    let doc = match &plan.mirror {
        Some(m) if got.is_ok() => std::borrow::Cow::Owned(rewrite_mirror_urls(m, &as_sent)),
        _ => std::borrow::Cow::Borrowed(&as_sent[..]),
    };
    let filtered = match got {
        Ok(got) => filter_document(ctx, policy, pkgs, &plan, got, &doc, &ev, now)
            .await
            .map(|f| (got, f)),
        Err(e) => Err(e),
    };
    let (got, f) = match filtered {
        Ok(x) => x,
        Err(e) => {
            let reason = e.reason();
            if let Some(l) = ev.package.as_mut() {
                l.reason = Some(reason);
            }
            let detail = match &e {
                FilterError::Unfilterable(why) => Some(why.clone()),
                FilterError::NothingAllowed(_) => Some("no version of it is allowed".into()),
            };
            let answer = Denied {
                eco: plan.eco,
                reason,
                name: Some(plan.name.as_str()),
                version: None,
                did_you_mean: None,
                set: None,
                detail,
            };
            // An unfilterable index is never passed on, in any mode.
            let mode = match reason {
                PackageReason::IndexUnfilterable => Mode::Enforce,
                _ => policy.settings.mode,
            };
            let host_decision = Decision::deny(line_reason(reason), None);
            return match deny(ev, answer, &host_decision, mode, responder) {
                Ok(r) => r,
                Err(ev) => {
                    // Report mode, nothing allowed for Go's @latest: the
                    // registry's answer, as it came.
                    let mut parts = parts;
                    parts.headers.remove(header::CONTENT_LENGTH);
                    parts.headers.remove(header::CONTENT_ENCODING);
                    ctx.recorder.record(*ev);
                    Response::from_parts(parts, respond::full(doc.into_owned()))
                }
            };
        }
    };
    if timed(got) {
        ctx.package_views.put(f.view.clone());
    }
    drop(doc);
    if let Some(key) = keep.clone() {
        // Headers as the registry sent them (the filtered answer's are
        // set below); a document it does not let egressd keep drops any
        // copy kept before.
        ctx.index_cache
            .put(*key, &parts.headers, Bytes::from(as_sent));
    }
    if let Some(l) = ev.package.as_mut() {
        l.hidden = Some(f.hidden.iter().collect());
    }
    let (body, etag) = (f.body, f.etag);
    let h = &mut parts.headers;
    for n in [
        header::ETAG,
        header::LAST_MODIFIED,
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::TRANSFER_ENCODING,
    ] {
        h.remove(n);
    }
    let etag_value = HeaderValue::from_str(&etag).expect("an ETag is a header value");
    h.insert(header::ETAG, etag_value);
    let fresh = if_none_match.as_ref().is_some_and(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    });
    ev.status = Some(if fresh { 304 } else { parts.status.as_u16() });
    let resp = if fresh {
        parts.status = StatusCode::NOT_MODIFIED;
        Response::from_parts(parts, respond::full(""))
    } else {
        ev.bytes_down = body.len() as u64;
        Response::from_parts(parts, respond::full(body))
    };
    ctx.recorder.record(ev);
    resp
}

/// Filters `doc` (in form `got`), fetching the timed companion when the
/// form has no times and the rules need them.
#[allow(clippy::too_many_arguments)]
async fn filter_document(
    ctx: &ProxyCtx,
    policy: &Policy,
    pkgs: &PackagePolicy,
    plan: &Plan,
    got: IndexForm,
    doc: &[u8],
    ev: &Event,
    now: i64,
) -> Result<Filtered, FilterError> {
    // Report mode hides what a `deny:` entry holds, and only that.
    let rules_now = || {
        let rules = pkgs.rules(plan.client, plan.eco, &plan.name, now);
        if plan.enforce {
            rules
        } else {
            rules.denies_only()
        }
    };
    let needs_times = rules_now().needs_times();
    let serves = Serves {
        name: &plan.name,
        set: plan.set.as_ref(),
        version: None,
    };
    let by = OnBehalf {
        ctx,
        policy,
        client: plan.client,
        port: plan.port,
        parent: ev,
        now,
    };
    let times: Option<Arc<IndexView>> = match got {
        IndexForm::PypiSimpleHtml | IndexForm::NpmAbbreviated if needs_times => {
            match ctx.package_views.get(plan.eco, &plan.name) {
                Some(v) => Some(v),
                None => own_index(by, pkgs, plan.eco, serves).await.ok(),
            }
        }
        IndexForm::GoList | IndexForm::GoLatest if needs_times => {
            let versions = match got {
                IndexForm::GoList => go_versions(doc),
                _ => match ctx.package_views.get(plan.eco, &plan.name) {
                    Some(v) => v.versions().iter().map(|v| v.version.clone()).collect(),
                    None => Vec::new(),
                },
            };
            Some(Arc::new(
                go_times(by, serves, &versions, plan.mirror.as_ref()).await,
            ))
        }
        _ => None,
    };
    let f = filter::filter(&rules_now(), got, doc, times.as_deref())?;
    if got == IndexForm::GoList {
        ctx.package_views.put(f.view.clone());
    }
    Ok(f)
}

/// The versions of a Go `@v/list` (its lines).
fn go_versions(doc: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(doc)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The publish times of `versions` of a Go module (`serves.name`): each
/// `.mod`'s `Last-Modified`, cached, fetched by egressd for the newest
/// [`MAX_GO_MOD_FETCHES`] it does not know yet.
async fn go_times(
    by: OnBehalf<'_>,
    serves: Serves<'_>,
    versions: &[String],
    mirror: Option<&Mirror>,
) -> IndexView {
    let module = serves.name;
    let mut view = IndexView::new(Ecosystem::Go, module.clone());
    let mut fetched = 0;
    for v in versions.iter().rev() {
        let t = match by.ctx.package_views.go_time(module, v) {
            Some(t) => t,
            None if fetched < MAX_GO_MOD_FETCHES => {
                fetched += 1;
                let path = go_mod_path(module, v);
                let serves = Serves {
                    version: Some(v),
                    ..serves
                };
                let got = own_fetch(
                    by,
                    Ecosystem::Go,
                    ("proxy.golang.org", &path, "*/*"),
                    serves,
                    mirror,
                    false,
                )
                .await;
                let t = got.ok().and_then(|(head, _)| {
                    head.get(header::LAST_MODIFIED)
                        .and_then(|v| v.to_str().ok())
                        .and_then(parse_http_date)
                });
                by.ctx.package_views.put_go_time(module, v, t);
                t
            }
            None => None,
        };
        view.add_version(v, t);
    }
    view
}

/// Notes the `Last-Modified` of a Go `.mod` a client fetched (the
/// version's publish time for the gate).
pub(crate) fn note_go_mod(ctx: &ProxyCtx, plan: &Plan, headers: &HeaderMap) {
    if let PlanKind::Other {
        go_mod: Some(version),
    } = &plan.what
    {
        let t = headers
            .get(header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_http_date);
        if t.is_some() {
            ctx.package_views.put_go_time(&plan.name, version, t);
        }
    }
}

// ---------------------------------------------------------------- egressd's own fetches

/// What an own fetch is for, as its line says: the package, the set that
/// approved it in the decision the fetch serves, and (a Go `.mod`) the
/// version.
#[derive(Clone, Copy)]
struct Serves<'a> {
    name: &'a PackageName,
    set: Option<&'a Arc<str>>,
    version: Option<&'a str>,
}

/// The client request an own fetch is made for: egressd's fetch is decided
/// for the same client, port and time, and logged beside `parent`.
#[derive(Clone, Copy)]
struct OnBehalf<'a> {
    ctx: &'a ProxyCtx,
    policy: &'a Policy,
    client: Option<ClientIdx>,
    /// The registry port the client's request went to.
    port: u16,
    parent: &'a Event,
    now: i64,
}

/// The view of `serves.name`'s index, read by egressd itself (cached).
async fn own_index(
    by: OnBehalf<'_>,
    pkgs: &PackagePolicy,
    eco: Ecosystem,
    serves: Serves<'_>,
) -> Result<Arc<IndexView>, String> {
    let name = serves.name;
    if let Some(v) = by.ctx.package_views.get(eco, name) {
        return Ok(v);
    }
    let loc = index_location(eco, name);
    let mirror = pkgs.settings.mirror(eco);
    let mut got = own_fetch(
        by,
        eco,
        (loc.host, &loc.path, loc.accept),
        serves,
        mirror,
        true,
    )
    .await;
    // The sparse index files a crate under its own spelling, which may
    // have `-` where the normal form has `_`.
    if eco == Ecosystem::Cargo
        && name.as_str().contains('_')
        && matches!(&got, Err(e) if e.contains("404"))
    {
        let dashed = name.as_str().replace('_', "-");
        let path = classify::cargo_index_path(&dashed);
        got = own_fetch(by, eco, (loc.host, &path, loc.accept), serves, mirror, true).await;
    }
    let (head, doc) = got?;
    let ct = head.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let form =
        IndexForm::from_content_type(loc.form, ct).ok_or_else(|| format!("content type {ct:?}"))?;
    let times = if eco == Ecosystem::Go {
        let versions = go_versions(&doc);
        Some(go_times(by, serves, &versions, mirror).await)
    } else {
        None
    };
    let rules = pkgs.rules(by.client, eco, name, by.now);
    let f = filter::filter(&rules, form, &doc, times.as_ref()).map_err(|e| e.to_string())?;
    Ok(by.ctx.package_views.put(f.view))
}

/// One GET egressd makes for itself to a registry host (or its mirror),
/// decided and logged as its own request (`"origin": "egressd"`) on behalf
/// of `parent`'s client, its line's package being what `serves` says.
/// Returns the response head and the decoded body (`body: false`: the
/// head only, the body read and dropped).
async fn own_fetch(
    by: OnBehalf<'_>,
    eco: Ecosystem,
    (host, path, accept): (&str, &str, &'static str),
    serves: Serves<'_>,
    mirror: Option<&Mirror>,
    body: bool,
) -> Result<(HeaderMap, Vec<u8>), String> {
    let mut ev = Event::new(Proto::Tls, by.parent.src);
    ev.client = by.parent.client.clone();
    ev.origin = Some("egressd");
    ev.method = Some("GET".into());
    ev.path = Some(path.to_string());
    ev.package = Some(Box::new(PackageLine {
        ecosystem: eco,
        name: Some(serves.name.as_str().to_string()),
        version: serves.version.map(str::to_string),
        set: serves.set.cloned(),
        reason: None,
        hidden: None,
        did_you_mean: None,
    }));
    let result = own_fetch_inner(by, eco, (host, path, accept), &mut ev, mirror, body).await;
    if let Err(why) = &result {
        if ev.error.is_none() && ev.decision == policy::Logged::Allow {
            ev.error = Some(why.clone());
        }
    }
    by.ctx.recorder.record(ev);
    result
}

async fn own_fetch_inner(
    by: OnBehalf<'_>,
    eco: Ecosystem,
    (host, path, accept): (&str, &str, &'static str),
    ev: &mut Event,
    mirror: Option<&Mirror>,
    body: bool,
) -> Result<(HeaderMap, Vec<u8>), String> {
    let OnBehalf {
        ctx,
        policy,
        client,
        port,
        now,
        ..
    } = by;
    let (dest, addrs, upstream_path, inject) = match mirror {
        Some(m) => {
            let dest = mirror_dest(m)?;
            ev.host = Some(dest.target.to_string());
            ev.port = Some(dest.port);
            // Configuration, not a destination the exceptions decide: the
            // line says allowed, by no exception, through the mirror.
            ev.decision = policy::Logged::Allow;
            ev.reason = Reason::Exception;
            ev.mode = policy.settings.mode;
            ev.add_note(Some(format!("mirror for {host}")));
            let addrs = mirror_addrs(ctx, policy, &dest, ev).await?;
            let p = mirror_path(m, eco, host, path);
            ev.path = Some(p.clone());
            let inject = m
                .inject
                .iter()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect();
            (dest, addrs, p, inject)
        }
        None => {
            let target = parse_target(host).map_err(|e| e.to_string())?;
            let dest = Dest { target, port };
            ev.host = Some(host.to_string());
            ev.port = Some(port);
            let preq = policy::Request {
                proto: Proto::Tls,
                client,
                target: &dest.target,
                port,
                method: Some(policy::Method {
                    name: "GET",
                    overrides: &[],
                }),
                path: Some(path),
                qtype: None,
                can_intercept: false,
            };
            let d = policy.decide(&preq, now);
            ev.set_decision(&d, policy.settings.mode);
            if !d.is_allowed() {
                ev.status = None;
                return Err(format!("{host} is not allowed ({})", d.reason.as_str()));
            }
            let addrs =
                upstream::check_destination(ctx, policy, d.exception, client, &dest, ev, now)
                    .await
                    .map_err(|s| format!("{s:?}"))?;
            let inject: Vec<(HeaderName, HeaderValue)> = d
                .exception
                .map(|e| {
                    e.inject()
                        .iter()
                        .map(|h| (h.name.clone(), h.value.clone()))
                        .collect()
                })
                .unwrap_or_default();
            (dest, addrs, path.to_string(), inject)
        }
    };
    // A mirror may be plain HTTP (configuration); registries are HTTPS.
    let plain = mirror.is_some_and(|m| m.scheme == http::uri::Scheme::HTTP);
    let (scheme, default_port) = if plain { ("http", 80) } else { ("https", 443) };
    let authority = if dest.port == default_port {
        dest.target.to_string()
    } else {
        format!("{}:{}", dest.target, dest.port)
    };
    let mut req = Request::get(format!("{scheme}://{authority}{upstream_path}"))
        .header(header::HOST, &authority)
        .header(header::ACCEPT, accept)
        .header(header::ACCEPT_ENCODING, "gzip")
        .header(
            header::USER_AGENT,
            concat!("egressd/", env!("CARGO_PKG_VERSION")),
        )
        .header(header::VIA, "1.1 egressd")
        .body(
            Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed(),
        )
        .map_err(|e| e.to_string())?;
    for (n, v) in inject {
        req.headers_mut().insert(n, v);
    }
    let fetch = async {
        let sent = if plain {
            send_plain(ctx, addrs[0], req).await
        } else {
            let Some(origins) = ctx.tls_origins() else {
                return Err(
                    "interception is not enabled (egressd reads registries over TLS)".into(),
                );
            };
            let tls = origins
                .client(&dest, &addrs, false)
                .map_err(|e| format!("tls: {e}"))?;
            tls.request(req).await.map_err(|e| e.to_string())
        };
        let resp = sent.inspect_err(|e| ev.fail_upstream(UpstreamFailure::Connect, e))?;
        if let Some(a) = resp.extensions().get::<UpstreamAddr>() {
            ev.addr = Some(a.0);
        }
        ev.status = Some(resp.status().as_u16());
        let (parts, b) = resp.into_parts();
        if !parts.status.is_success() {
            return Err(format!("the registry answered {}", parts.status.as_u16()));
        }
        let raw = read_bounded(b, MAX_INDEX_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        ev.bytes_down = raw.len() as u64;
        if !body {
            return Ok((parts.headers, Vec::new()));
        }
        let doc =
            decode(parts.headers.get(header::CONTENT_ENCODING), raw).map_err(|e| e.to_string())?;
        Ok((parts.headers, doc))
    };
    match tokio::time::timeout(OWN_FETCH_TIMEOUT, fetch).await {
        Ok(r) => r,
        Err(_) => {
            ev.fail_upstream(UpstreamFailure::Timeout, "no response in time");
            Err("no response in time".into())
        }
    }
}

/// One GET over plain HTTP (a mirror configured as `http://`) on a
/// connection of its own: to the checked address, or through the upstream
/// proxy in absolute form naming that address.
async fn send_plain(
    ctx: &ProxyCtx,
    addr: SocketAddr,
    mut req: Request<super::tls_origins::OutBody>,
) -> Result<Response<hyper::body::Incoming>, String> {
    let stream = ctx
        .egress
        .connect_http(addr)
        .await
        .map_err(|e| e.to_string())?;
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri = match &ctx.egress {
        upstream::Egress::Direct => pq,
        upstream::Egress::Proxy(p) => {
            if let Some(auth) = &p.auth {
                req.headers_mut()
                    .insert(header::PROXY_AUTHORIZATION, auth.clone());
            }
            format!("http://{addr}{pq}")
        }
    };
    *req.uri_mut() = uri.parse().map_err(|e| format!("{e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| e.to_string())
}

// ---------------------------------------------------------------- mirrors

/// The mirror's host and port as a destination.
pub(crate) fn mirror_dest(m: &Mirror) -> Result<Dest, String> {
    let target = parse_target(&m.host).map_err(|e| format!("mirror host: {e}"))?;
    Ok(Dest {
        target,
        port: m.port,
    })
}

/// The mirror's addresses: resolved through egressd's resolver like any
/// name, but not judged by the exceptions (a mirror is configuration, as
/// `--upstream-proxy` is, and usually private); only egressd's own
/// listeners are refused.
pub(crate) async fn mirror_addrs(
    ctx: &ProxyCtx,
    policy: &Policy,
    dest: &Dest,
    ev: &mut Event,
) -> Result<Vec<SocketAddr>, String> {
    let ips = match &dest.target {
        Target::Ip(ip) => vec![*ip],
        Target::Name(h) => ctx
            .resolver
            .lookup_ip_for(h, policy, &mut ev.dns_attempts)
            .await
            .map_err(|e| {
                ev.fail_upstream(UpstreamFailure::Resolve, &e);
                format!("mirror {h}: {e}")
            })?,
    };
    let addrs: Vec<SocketAddr> = ips
        .into_iter()
        .map(|ip| SocketAddr::new(ip, dest.port))
        .filter(|a| !upstream::is_own_listener(*a, &ctx.own_addrs))
        .collect();
    if addrs.is_empty() {
        return Err("the mirror resolves to egressd itself".into());
    }
    Ok(addrs)
}

/// The mirror's path for a public registry request: the index root
/// (`/simple/` for PyPI, `/` elsewhere) replaced by the mirror URL's path;
/// requests to the file hosts keep their path (mirror documents' file URLs
/// were rewritten to the public file host with the mirror's path).
pub(crate) fn mirror_path(m: &Mirror, eco: Ecosystem, host: &str, path: &str) -> String {
    let base = mirror_base(m);
    if base != "/" && path.starts_with(base) {
        return path.to_string();
    }
    let index_root = match (eco, host) {
        (Ecosystem::Pypi, "pypi.org") => Some("/simple/"),
        (Ecosystem::Pypi, _) => None,
        (Ecosystem::Cargo, "static.crates.io" | "crates.io") => None,
        _ => Some("/"),
    };
    match index_root.and_then(|r| path.strip_prefix(r)) {
        Some(rest) => format!("{}{rest}", m.path),
        None => path.to_string(),
    }
}

/// Where a mirror keeps its documents and files: its URL's path, without
/// PyPI's `simple/` (`/api/pypi/simple/` keeps files under `/api/pypi/`).
fn mirror_base(m: &Mirror) -> &str {
    match m.ecosystem {
        Ecosystem::Pypi => m.path.strip_suffix("simple/").unwrap_or(&m.path),
        _ => &m.path,
    }
}

/// The registry path a request names, for classifying it: a path under
/// the mirror's base (a URL egressd rewrote from a mirror's document) is
/// read without that base (`/api/pypi/packages/…` is `/packages/…`).
fn public_path<'a>(m: Option<&Mirror>, path: &'a str) -> std::borrow::Cow<'a, str> {
    if let Some(m) = m {
        let base = mirror_base(m);
        if base != "/" {
            if let Some(rest) = path.strip_prefix(base) {
                return format!("/{rest}").into();
            }
        }
    }
    path.into()
}

/// The public host a mirror's absolute URLs are rewritten to: the
/// ecosystem's file host.
fn public_file_host(eco: Ecosystem) -> &'static str {
    match eco {
        Ecosystem::Pypi => "files.pythonhosted.org",
        Ecosystem::Npm => "registry.npmjs.org",
        Ecosystem::Cargo => "static.crates.io",
        Ecosystem::Go => "proxy.golang.org",
    }
}

/// A mirror document with its absolute URLs into the mirror
/// (`https://mirror.corp[:port]/…`) pointing at the public file host with
/// the same path, which egressd routes back to the mirror.
pub(crate) fn rewrite_mirror_urls(m: &Mirror, doc: &[u8]) -> Vec<u8> {
    let scheme = m.scheme.as_str();
    let default = if scheme == "https" { 443 } else { 80 };
    let mut prefixes = vec![format!("{scheme}://{}:{}/", m.host, m.port)];
    if m.port == default {
        prefixes.push(format!("{scheme}://{}/", m.host));
    }
    let to = format!("https://{}/", public_file_host(m.ecosystem));
    let mut out = doc.to_vec();
    for p in prefixes {
        out = replace_all(&out, p.as_bytes(), to.as_bytes());
    }
    out
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------- downloads

/// A download body checked against its set's sha256 pins as it streams:
/// the last frame is held back until the whole body has hashed, so a file
/// that does not match ends in an error (the client sees a cut transfer),
/// never as a complete body.
pub(crate) struct Verified<B> {
    inner: B,
    ctx: ring::digest::Context,
    pins: Vec<[u8; 32]>,
    held: Option<Frame<Bytes>>,
    finished: bool,
    /// Report mode: a mismatch is noted, the file still delivered.
    enforce: bool,
    /// [`INTEGRITY_UNKNOWN`], [`INTEGRITY_OK`] or [`INTEGRITY_MISMATCH`].
    pub(crate) outcome: Arc<AtomicU8>,
}

pub(crate) const INTEGRITY_UNKNOWN: u8 = 0;
pub(crate) const INTEGRITY_OK: u8 = 1;
pub(crate) const INTEGRITY_MISMATCH: u8 = 2;

impl<B> Verified<B> {
    pub(crate) fn new(inner: B, pins: Vec<[u8; 32]>, enforce: bool) -> Verified<B> {
        Verified {
            inner,
            ctx: ring::digest::Context::new(&ring::digest::SHA256),
            pins,
            held: None,
            finished: false,
            enforce,
            outcome: Arc::new(AtomicU8::new(INTEGRITY_UNKNOWN)),
        }
    }
}

impl<B> Body for Verified<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.finished {
                return Poll::Ready(this.held.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(d) = frame.data_ref() {
                        this.ctx.update(d);
                    }
                    if let Some(prev) = this.held.replace(frame) {
                        return Poll::Ready(Some(Ok(prev)));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    this.finished = true;
                    let digest = std::mem::replace(
                        &mut this.ctx,
                        ring::digest::Context::new(&ring::digest::SHA256),
                    )
                    .finish();
                    if this.pins.iter().any(|p| p[..] == *digest.as_ref()) {
                        this.outcome.store(INTEGRITY_OK, Ordering::Relaxed);
                    } else {
                        this.outcome.store(INTEGRITY_MISMATCH, Ordering::Relaxed);
                        if !this.enforce {
                            continue;
                        }
                        this.held = None;
                        return Poll::Ready(Some(Err(
                            "the file does not match its sha256 pin (package_integrity_mismatch)"
                                .into(),
                        )));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Notes in a download's line that its body did not match its pins (the
/// transfer was cut): the line's decision becomes that denial.
pub(crate) fn note_integrity(ev: &mut Event, outcome: u8, mode: Mode) {
    if outcome != INTEGRITY_MISMATCH {
        return;
    }
    let reason = PackageReason::IntegrityMismatch;
    // The exception that allowed the host stays named: the file, not the
    // host, was refused.
    ev.decision = policy::Logged::Deny;
    ev.reason = line_reason(reason);
    ev.mode = mode;
    if let Some(l) = ev.package.as_mut() {
        l.reason = Some(reason);
    }
    ev.error = Some("sha256 of the file matches no pin; transfer cut".into());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::compile::tests::compile_yaml;
    use std::io::Write;

    fn sha(b: &[u8]) -> [u8; 32] {
        ring::digest::digest(&ring::digest::SHA256, b)
            .as_ref()
            .try_into()
            .unwrap()
    }

    /// A body of ready data frames.
    struct Chunks(std::collections::VecDeque<Bytes>);
    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }
    fn chunks(parts: &[&'static [u8]]) -> Chunks {
        Chunks(parts.iter().map(|p| Bytes::from_static(p)).collect())
    }

    /// The data frames a body yields, and how it ended.
    async fn drain(mut b: impl Body<Data = Bytes, Error = BoxError> + Unpin) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            match f {
                Ok(f) => out.extend_from_slice(f.data_ref().unwrap()),
                Err(_) => return (out, false),
            }
        }
        (out, true)
    }

    #[tokio::test]
    async fn a_pinned_download_ends_only_when_its_hash_matches() {
        let file: &[&[u8]] = &[b"first ", b"second ", b"last"];
        let good = sha(b"first second last");
        let v = Verified::new(chunks(file), vec![[0; 32], good], true);
        let outcome = v.outcome.clone();
        let (got, ok) = drain(v).await;
        assert!(ok);
        assert_eq!(got, b"first second last");
        assert_eq!(outcome.load(Ordering::Relaxed), INTEGRITY_OK);

        // Not the pinned file: everything but the last frame, then an
        // error — never a complete body.
        let v = Verified::new(chunks(file), vec![sha(b"another file")], true);
        let outcome = v.outcome.clone();
        let (got, ok) = drain(v).await;
        assert!(!ok, "the transfer is cut");
        assert_eq!(got, b"first second ");
        assert_eq!(outcome.load(Ordering::Relaxed), INTEGRITY_MISMATCH);

        // Report mode: delivered, and noted.
        let v = Verified::new(chunks(file), vec![sha(b"another file")], false);
        let outcome = v.outcome.clone();
        let (got, ok) = drain(v).await;
        assert!(ok);
        assert_eq!(got, b"first second last");
        assert_eq!(outcome.load(Ordering::Relaxed), INTEGRITY_MISMATCH);
    }

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn index_bodies_decode_within_the_bound() {
        let gz = HeaderValue::from_static("gzip");
        assert_eq!(decode(Some(&gz), gzip(b"{\"a\":1}")).unwrap(), b"{\"a\":1}");
        assert_eq!(decode(None, b"plain".to_vec()).unwrap(), b"plain");
        let br = HeaderValue::from_static("br");
        assert!(matches!(
            decode(Some(&br), b"x".to_vec()),
            Err(FilterError::Unfilterable(w)) if w.contains("\"br\"")
        ));
        assert!(decode(Some(&gz), b"not gzip".to_vec()).is_err());
        // A small body that inflates past the bound is refused.
        let bomb = gzip(&vec![b' '; MAX_INDEX_BYTES + 1]);
        assert!(bomb.len() < 1 << 20);
        assert!(matches!(
            decode(Some(&gz), bomb),
            Err(FilterError::Unfilterable(w)) if w.contains("64 MiB")
        ));
        assert!(decode(Some(&gz), gzip(&vec![b' '; MAX_INDEX_BYTES])).is_ok());
    }

    fn mirror_policy() -> PackagePolicy {
        compile_yaml(
            r#"
packages:
  - id: py
    owner: team
    reason: deps
    ecosystem: pypi
    allow: [requests]
settings:
  packages:
    enforce: [pypi]
    mirrors:
      pypi: { url: "https://mirror.corp:8443/api/pypi/simple/", inject: { headers: { Authorization: "Bearer ${env:TOKEN}" } } }
"#,
            &[],
        )
        .unwrap()
    }

    #[test]
    fn mirror_paths_and_urls_map_to_the_public_names() {
        let p = mirror_policy();
        let m = p.settings.mirror(Ecosystem::Pypi).unwrap();
        assert_eq!(
            mirror_path(m, Ecosystem::Pypi, "pypi.org", "/simple/requests/"),
            "/api/pypi/simple/requests/"
        );
        // File URLs came from the mirror's documents with its own path.
        let f = "/api/pypi/packages/ab/cd/requests-2.32.3-py3-none-any.whl";
        assert_eq!(
            mirror_path(m, Ecosystem::Pypi, "files.pythonhosted.org", f),
            f
        );
        assert_eq!(
            public_path(Some(m), f),
            "/packages/ab/cd/requests-2.32.3-py3-none-any.whl"
        );
        assert_eq!(public_path(None, f), f);
        assert_eq!(public_path(Some(m), "/simple/x/"), "/simple/x/");
        let doc = br#"<a href="https://mirror.corp:8443/api/pypi/packages/x.whl#sha256=00">x</a> https://mirror.corporate/ https://mirror.corp:8443"#;
        assert_eq!(
            String::from_utf8(rewrite_mirror_urls(m, doc)).unwrap(),
            r#"<a href="https://files.pythonhosted.org/api/pypi/packages/x.whl#sha256=00">x</a> https://mirror.corporate/ https://mirror.corp:8443"#
        );
    }

    #[test]
    fn denials_name_the_package_the_set_and_a_close_name() {
        let d = Denied {
            eco: Ecosystem::Pypi,
            reason: PackageReason::NotApproved,
            name: Some("reqests"),
            version: Some("2.0"),
            did_you_mean: Some("requests"),
            set: None,
            detail: None,
        };
        assert_eq!(
            d.phrase(),
            "Forbidden (egressd: package_not_approved reqests@2.0; did you mean requests?)"
        );
        let t = d.text("GET https://files.pythonhosted.org/x", "#security");
        assert!(t.starts_with("egressd denied GET https://files.pythonhosted.org/x (package_not_approved): no approved package set for this client lists reqests; did you mean requests?\n"), "{t}");
        assert!(t.contains("ask #security"), "{t}");
        let n = Denied {
            eco: Ecosystem::Npm,
            reason: PackageReason::TooNew,
            name: Some("left-pad"),
            version: Some("1.3.0"),
            did_you_mean: None,
            set: Some(("js", "web")),
            detail: None,
        };
        let v: serde_json::Value =
            serde_json::from_str(&n.npm_json("GET https://registry.npmjs.org/left-pad", "#sec"))
                .unwrap();
        let e = v["error"].as_str().unwrap();
        assert!(
            e.contains("package_too_new") && e.contains("left-pad 1.3.0"),
            "{e}"
        );
        assert!(e.contains("package set js") && e.contains("#sec"), "{e}");
        assert_eq!(v["set"], "js");
        // 502 for an index egressd could not filter: no "ask to approve".
        let u = Denied {
            reason: PackageReason::IndexUnfilterable,
            ..n
        };
        assert!(!u.text("x", "#sec").contains("ask"));
        assert_eq!(
            u.phrase(),
            "Bad Gateway (egressd: package_index_unfilterable left-pad@1.3.0)"
        );
    }

    #[test]
    fn index_requests_go_upstream_without_validators_and_only_gzip() {
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"x\""));
        h.insert(header::IF_MODIFIED_SINCE, HeaderValue::from_static("Mon"));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("br, zstd"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
        prepare_index_request(&mut h);
        assert!(h.get(header::IF_NONE_MATCH).is_none());
        assert!(h.get(header::IF_MODIFIED_SINCE).is_none());
        assert_eq!(h[header::ACCEPT_ENCODING], "gzip");
        assert_eq!(h[header::ACCEPT], "text/html");
    }
}

#[cfg(test)]
mod path_tests {
    use super::*;

    #[test]
    fn npm_scope_separators_are_slashes_for_path_rules() {
        let npm = parse_target("registry.npmjs.org").unwrap();
        let other = parse_target("api.test").unwrap();
        assert_eq!(policy_path(&npm, "/@lab%2fscoped").unwrap(), "/@lab/scoped");
        assert_eq!(policy_path(&npm, "/@lab%2Fscoped").unwrap(), "/@lab/scoped");
        assert!(policy_path(&other, "/@lab%2fscoped").is_err());
        // Dot segments stay refused however they are spelled.
        assert!(policy_path(&npm, "/a%2f..%2fb").is_err());
    }
}
