//! The answer to a gated index request: the registry's document read
//! (bounded), decoded, filtered, with its own `ETag` (and `304`); Go's
//! version times.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Body;

use crate::packages::classify::{go_mod_path, IndexForm};
use crate::packages::compile::Mirror;
use crate::packages::decide::PackageReason;
use crate::packages::filter::{self, FilterError, Filtered, MAX_INDEX_BYTES};
use crate::packages::stamp::parse_http_date;
use crate::packages::view::IndexView;
use crate::packages::Ecosystem;
use crate::policy::{Decision, Mode};
use crate::proxy::respond::{self, ProxyBody};
use crate::proxy::tls_origins::UpstreamAddr;
use crate::proxy::ProxyCtx;
use crate::record::Event;

use super::*;

/// Why an index could not be filtered.
pub(super) fn unfilterable(why: impl Into<String>) -> FilterError {
    FilterError::Unfilterable(why.into())
}

/// Reads a response body up to `max` bytes (more is an error), within
/// [`INDEX_BODY_TIMEOUT`].
pub(super) async fn read_bounded<B>(mut body: B, max: usize) -> Result<Vec<u8>, FilterError>
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

pub(super) fn over_bound() -> FilterError {
    unfilterable(format!(
        "the index is over the {} MiB bound",
        MAX_INDEX_BYTES >> 20
    ))
}

/// The document under its `Content-Encoding` (none or gzip, the one
/// egressd asks for), at most [`MAX_INDEX_BYTES`] decompressed.
pub(super) fn decode(encoding: Option<&HeaderValue>, raw: Vec<u8>) -> Result<Vec<u8>, FilterError> {
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
pub(super) fn timed(form: IndexForm) -> bool {
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
pub(crate) async fn answer_index<B>(
    at: &Allowed<'_>,
    plan: Plan,
    resp: Response<B>,
    mut ev: Event,
    bytes_up: u64,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let PlanKind::Index { form, keep, .. } = &plan.what else {
        unreachable!("answer_index is given index plans only");
    };
    if let Some(a) = resp.extensions().get::<UpstreamAddr>() {
        ev.addr = Some(a.0);
    }
    ev.bytes_up = bytes_up;
    let (parts, body) = resp.into_parts();
    // `as_sent`: the registry's document, decoded, which is what the
    // cache keeps; `doc`: what is filtered (with a mirror's URLs
    // rewritten).
    let (as_sent, got) = match read_index(body, &parts.headers, *form).await {
        Ok((doc, got)) => (doc, Ok(got)),
        Err(e) => (Vec::new(), Err(e)),
    };
    let doc = match &plan.mirror {
        Some(m) if got.is_ok() => std::borrow::Cow::Owned(rewrite_mirror_urls(m, &as_sent)),
        _ => std::borrow::Cow::Borrowed(&as_sent[..]),
    };
    let filtered = match got {
        Ok(got) => filter_document(at, &plan, got, &doc, &ev)
            .await
            .map(|f| (got, f)),
        Err(e) => Err(e),
    };
    let (got, f) = match filtered {
        Ok(x) => x,
        Err(e) => return refuse_index(at, &plan, parts, e, doc.into_owned(), ev),
    };
    if timed(got) {
        at.ctx.package_views.put(f.view.clone());
    }
    drop(doc);
    if let Some(key) = keep.clone() {
        // Headers as the registry sent them (the filtered answer's are
        // set below); a document it does not let egressd keep drops any
        // copy kept before.
        at.ctx
            .index_cache
            .put(*key, &parts.headers, Bytes::from(as_sent));
    }
    filtered_answer(at.ctx, &plan, parts, f, ev)
}

/// The registry's index document, read (bounded) and decoded, and the
/// form its `Content-Type` says it is in (`form`: the one asked for).
async fn read_index<B>(
    body: B,
    headers: &HeaderMap,
    form: IndexForm,
) -> Result<(Vec<u8>, IndexForm), FilterError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let raw = read_bounded(body, MAX_INDEX_BYTES).await?;
    let doc = decode(headers.get(header::CONTENT_ENCODING), raw)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let got = IndexForm::from_content_type(form, ct)
        .ok_or_else(|| unfilterable(format!("content type {:?}", ct.unwrap_or(""))))?;
    Ok((doc, got))
}

/// An index that could not be filtered, or that allows nothing: denied
/// (an unfilterable one in every mode); in report mode, nothing allowed
/// for Go's `@latest`, the registry's answer as it came.
fn refuse_index(
    at: &Allowed<'_>,
    plan: &Plan,
    mut parts: http::response::Parts,
    e: FilterError,
    doc: Vec<u8>,
    mut ev: Event,
) -> Response<ProxyBody> {
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
        _ => at.policy.settings.mode,
    };
    let host_decision = Decision::deny(line_reason(reason), None);
    match deny(ev, answer, &host_decision, mode, at.responder) {
        Ok(r) => r,
        Err(ev) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            parts.headers.remove(header::CONTENT_ENCODING);
            at.ctx.recorder.record(*ev);
            Response::from_parts(parts, respond::full(doc))
        }
    }
}

/// The filtered document as the client gets it: the registry's framing
/// and validators replaced by its own `ETag`, `304` when the client's
/// `If-None-Match` names it. Records the line.
fn filtered_answer(
    ctx: &ProxyCtx,
    plan: &Plan,
    mut parts: http::response::Parts,
    f: Filtered,
    mut ev: Event,
) -> Response<ProxyBody> {
    let PlanKind::Index { if_none_match, .. } = &plan.what else {
        unreachable!("filtered_answer is given index plans only");
    };
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
pub(super) async fn filter_document(
    at: &Allowed<'_>,
    plan: &Plan,
    got: IndexForm,
    doc: &[u8],
    ev: &Event,
) -> Result<Filtered, FilterError> {
    let (ctx, pkgs) = (at.ctx, &at.policy.packages);
    // Report mode hides what a `deny:` entry holds, and only that.
    let rules_now = || {
        let rules = pkgs.rules(plan.client, plan.eco, &plan.name, at.now);
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
        policy: at.policy,
        client: plan.client,
        port: plan.port,
        parent: ev,
        now: at.now,
    };
    let times: Option<Arc<IndexView>> = match got {
        IndexForm::PypiSimpleHtml | IndexForm::NpmAbbreviated if needs_times => {
            match ctx.package_views.get(plan.eco, &plan.name) {
                Some(v) => Some(v),
                None => own_index(by, plan.eco, serves).await.ok(),
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
pub(super) fn go_versions(doc: &[u8]) -> Vec<String> {
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
pub(super) async fn go_times(
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
