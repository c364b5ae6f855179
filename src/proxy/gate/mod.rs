//! The package gate on the wire (DESIGN "Packages"): every request to a
//! registry host of an enforced ecosystem, once the host itself is allowed,
//! is classified, decided by `packages`, and either answered here
//! (a denial in the channel its client shows, a `304`), or sent on its
//! [`Route`]: plain, a gated index (a [`Plan`] filters the document before
//! the client sees it), a gated download (hashed as it streams), any of
//! them through the ecosystem's mirror. [`gate`] is the one entry; the
//! request path ([`super::exchange`]) calls it once, between the decision
//! and reaching the origin.
//!
//! A download needs the package's index to be decided (the filtered index
//! and the download must agree): when no view of it is cached, egressd
//! fetches the index itself, through the one upstream path the client's
//! requests take ([`super::origin::reach`]: checked addresses, the pool,
//! TLS verification), as its own logged request (`"origin": "egressd"`),
//! and keeps the registry's facts ([`Views`]) for [`VIEW_TTL`].
//!
//! Owns: the route, the gate's answers, the index response rewrite
//! (decompression bound, filter, `ETag`/`304`), egressd's own index
//! fetches and their cache, the streaming sha256 check. Does not own:
//! which versions are allowed (`packages`), the host decision or how
//! requests reach origins (`exchange`, `origin`, `upstream`,
//! `tls_origins`).

mod deny;
mod fetch;
mod index;
pub(crate) mod index_cache;
mod mirror;
mod route;
mod verify;

use deny::*;
use fetch::*;
pub(crate) use index::*;
pub(crate) use mirror::*;
pub(crate) use route::*;
pub(crate) use verify::*;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Request;

use super::dest::Dest;
use crate::packages::classify::{self, Classified, IndexForm, Kind, PackageRef};
use crate::packages::compile::{Mirror, PackagePolicy};
use crate::packages::decide::{PackageDecision, PackageReason, Verdict};
use crate::packages::name::PackageName;
use crate::packages::view::IndexView;
use crate::packages::Ecosystem;
use crate::policy::host::Target;
use crate::policy::path::{normalize_path, PathError};
use crate::policy::{enforced, ClientIdx, Mode, Reason};
use crate::record::{Event, PackageLine};
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

/// The gate for one request whose host the policy allowed (`eco`: the
/// ecosystem whose registry it is): the route it goes on, or its answer
/// (its line recorded).
pub(crate) async fn gate<B>(
    at: &Allowed<'_>,
    eco: Ecosystem,
    req: &mut Request<B>,
    mut ev: Event,
) -> Gate {
    let pkgs = &at.policy.packages;
    let r = match classified(pkgs, eco, at.dest, req) {
        Classified::Package(r) => r,
        Classified::Registry(_, res) => {
            let mirror = pkgs.settings.mirror(eco);
            if let (Some(m), classify::RegistryResource::CargoConfig) = (mirror, res) {
                return cargo_config(at, m, ev).await;
            }
            let mirror = mirror.map(|m| (eco, m.clone()));
            return Gate::Go(Route { mirror, plan: None }, ev);
        }
        Classified::NotRegistry => return Gate::Go(Route::default(), ev),
        Classified::Publish { ecosystem, what } => {
            return deny::publish(at, ecosystem, what, req.uri().path(), ev);
        }
        Classified::Unparseable { ecosystem, why } => {
            return unparseable(at, ecosystem, why, ev);
        }
    };
    let d = match decide_package(at, eco, &r, &ev).await {
        Ok(d) => d,
        Err((d, why)) => return unreadable_index(at, eco, &r, &d, why, ev),
    };
    ev.package = Some(package_line(eco, Some(&r), Some(&d)));
    let mode = at.policy.settings.mode;
    match d.verdict {
        Verdict::Deny(reason) => {
            match deny(
                ev,
                denied(eco, &r, &d, reason),
                at.decision,
                mode,
                at.responder,
            ) {
                Ok(resp) => return Gate::Answered(resp),
                Err(e) => ev = *e,
            }
        }
        Verdict::NeedIndex => return undecided(at, eco, &r, ev),
        Verdict::Allow => {}
    }
    let plan = Plan {
        eco,
        name: r.name.clone(),
        client: at.client,
        what: plan_kind(req, &r, &d, mode),
        enforce: enforced(mode, line_reason(PackageReason::NotApproved)),
        mirror: pkgs.settings.mirror(eco).cloned(),
        port: at.dest.port,
        set: d.set.map(|s| s.id.clone()),
    };
    Gate::Go(Route::of(plan), ev)
}

/// What a request to `eco`'s registry asks for, its path read as the
/// public registry's (a mirror's base taken off).
fn classified<B>(
    pkgs: &PackagePolicy,
    eco: Ecosystem,
    dest: &Dest,
    req: &Request<B>,
) -> Classified {
    let host = dest.target.to_string();
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    classify_request(
        pkgs.settings.mirror(eco),
        eco,
        &host,
        req.method().as_str(),
        path,
        accept,
    )
}

/// The package decision for `r`, egressd reading the package's index
/// first when the decision needs it; the first decision and why the index
/// could not be read otherwise.
async fn decide_package<'p>(
    at: &Allowed<'p>,
    eco: Ecosystem,
    r: &PackageRef,
    parent: &Event,
) -> Result<PackageDecision<'p>, (PackageDecision<'p>, FetchError)> {
    let pkgs = &at.policy.packages;
    let view = at.ctx.package_views.get(eco, &r.name);
    let d = pkgs.decide(at.client, r, at.now, view.as_deref());
    if d.verdict != Verdict::NeedIndex {
        return Ok(d);
    }
    let serves = Serves {
        name: &r.name,
        set: d.set.map(|s| &s.id),
        version: None,
    };
    match own_index(OnBehalf::of(at, parent), eco, serves).await {
        Ok(view) => Ok(pkgs.decide(at.client, r, at.now, Some(&view))),
        Err(why) => Err((d, why)),
    }
}

/// A registry URL the gate cannot read: denied (`package_unparseable`).
fn unparseable(at: &Allowed<'_>, eco: Ecosystem, why: String, mut ev: Event) -> Gate {
    let reason = PackageReason::Unparseable;
    let mut line = package_line(eco, None, None);
    line.reason = Some(reason);
    ev.package = Some(line);
    let answer = Denied {
        eco,
        reason,
        name: None,
        version: None,
        did_you_mean: None,
        set: None,
        detail: Some(why),
    };
    let mode = at.policy.settings.mode;
    match deny(ev, answer, at.decision, mode, at.responder) {
        Ok(resp) => Gate::Answered(resp),
        Err(ev) => Gate::Go(Route::default(), *ev),
    }
}

/// A download egressd could not read the index of, to decide it: refused
/// in every mode (not a policy decision).
fn unreadable_index(
    at: &Allowed<'_>,
    eco: Ecosystem,
    r: &PackageRef,
    d: &PackageDecision<'_>,
    why: FetchError,
    mut ev: Event,
) -> Gate {
    let reason = PackageReason::IndexUnfilterable;
    let mut line = package_line(eco, Some(r), Some(d));
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
    Gate::Answered(enforced_deny(ev, answer, at.decision, at.responder))
}

/// A request the view egressd just read does not settle: refused.
fn undecided(at: &Allowed<'_>, eco: Ecosystem, r: &PackageRef, mut ev: Event) -> Gate {
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
    Gate::Answered(enforced_deny(ev, answer, at.decision, at.responder))
}

/// The denial of `r` for `reason`, as its client will show it.
fn denied<'a>(
    eco: Ecosystem,
    r: &'a PackageRef,
    d: &PackageDecision<'a>,
    reason: PackageReason,
) -> Denied<'a> {
    Denied {
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
    }
}

/// What to do with the answer of an allowed package request (and the
/// request made ready for it: an index asks without conditionals, a
/// pinned download for the whole file).
fn plan_kind<B>(
    req: &mut Request<B>,
    r: &PackageRef,
    d: &PackageDecision<'_>,
    mode: Mode,
) -> PlanKind {
    match (&r.kind, d.filter) {
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
    }
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

#[cfg(test)]
mod tests;
