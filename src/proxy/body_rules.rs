//! The serving step of `body:` rules (DESIGN "Writes on allowed hosts"):
//! after the policy allowed a request whose first allowing exception has
//! `body:`, the body is read whole, bounded, and judged over every
//! exception that allows the request, before any byte of it goes
//! upstream. The first that allows decides (its credentials are the ones
//! injected); when none does, the first one's reason answers, naming the
//! pointer or field. Plain HTTP and intercepted requests, HTTP/1.1 and
//! HTTP/2, come here alike: hyper hands every one the same body.
//!
//! The judgement is pure (`crate::writes::body`); this module reads,
//! answers and notes the line.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::held::ReqBody;
use super::respond::{ProxyBody, Responder};
use crate::policy::{Decision, Exception, Mode, Reason};
use crate::record::Event;
use crate::writes::body::{self, Choice, Refusal};

/// How long reading a body may take.
const READ_TIME: Duration = Duration::from_secs(60);
/// How much of a chunked body past the bound is read and dropped, so that
/// the client (which sends before it reads) sees the refusal rather than
/// a reset connection. A declared length past the bound is refused before
/// any of it is read.
const DRAIN_MAX: u64 = 16 << 20;
/// How long that drain may take.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// What the step decided: forward this request (its body held, or the
/// client's stream), or the answer already recorded.
// Returned once per request and taken apart at once, as `writes::Judged`
// (whose two forwarding variants keep clippy quiet) is.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Stepped {
    Forward(Request<ReqBody>, Event),
    Answered(Response<ProxyBody>),
}

/// Reads and judges `req`'s body over `cands` (the exceptions that allow
/// it, in load order; the first has `body:`), setting `d` to the one that
/// allows it.
pub(crate) async fn step<'p>(
    req: Request<Incoming>,
    mut ev: Event,
    d: &mut Decision<'p>,
    cands: Vec<&'p Exception>,
    mode: Mode,
    responder: &Responder<'_>,
) -> Stepped {
    let Some(bound) = body::read_bound(&cands) else {
        return Stepped::Forward(req.map(ReqBody::Stream), ev);
    };
    let fallback = cands.iter().any(|e| e.body().is_none());
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let (parts, incoming) = req.into_parts();
    if declared.is_some_and(|n| n > bound) && !fallback {
        // Refused before a byte of it is kept: with `Expect:
        // 100-continue` the client never sends it; otherwise what it sends
        // is read and dropped (bounded), so that it reads the answer
        // rather than a reset.
        let expects = parts
            .headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if !expects {
            drain(incoming).await;
        }
        return refuse(ev, d, &cands, mode, responder);
    }
    let read = match tokio::time::timeout(READ_TIME, read_upto(incoming, bound)).await {
        Ok(r) => r,
        Err(_) => Read::Failed("the request body did not arrive in time".into()),
    };
    let raw = match read {
        Read::Whole(b) => b,
        Read::Over(head, rest) => {
            if fallback {
                if let Some(Choice::Allow(e)) = body::choose(&cands, None) {
                    set(d, e, &mut ev, mode);
                    let req = Request::from_parts(parts, ReqBody::Prefixed(Some(head), rest));
                    return Stepped::Forward(req, ev);
                }
            }
            drain(rest).await;
            return refuse(ev, d, &cands, mode, responder);
        }
        Read::Failed(why) => {
            return Stepped::Answered(responder.deny(ev, Reason::Malformed, Some(why)));
        }
    };
    let plain = match decoded(&parts.headers, &raw, bound) {
        Ok(p) => p,
        Err(why) => {
            let e = cands[0];
            let r = Refusal {
                reason: Reason::BodyNotAllowed,
                detail: why,
            };
            return refused((parts, raw), ev, d, e, r, mode, responder);
        }
    };
    match body::choose(&cands, Some(&plain)) {
        Some(Choice::Allow(e)) => {
            if !take_grant(e) {
                let r = Refusal {
                    reason: Reason::GrantUsedUp,
                    detail: "the grant that allows this body has used all its uses".into(),
                };
                return refused((parts, raw), ev, d, e, r, mode, responder);
            }
            set(d, e, &mut ev, mode);
            Stepped::Forward(Request::from_parts(parts, ReqBody::held(raw)), ev)
        }
        Some(Choice::Refuse(e, r)) => refused((parts, raw), ev, d, e, r, mode, responder),
        None => Stepped::Forward(Request::from_parts(parts, ReqBody::held(raw)), ev),
    }
}

/// `e` decides the request from here on (its credentials, its `cidrs`).
fn set<'p>(d: &mut Decision<'p>, e: &'p Exception, ev: &mut Event, mode: Mode) {
    if d.exception.is_some_and(|x| std::ptr::eq(x, e)) {
        return;
    }
    *d = Decision::allow(e).under(mode);
    ev.set_decision(d, mode);
}

/// A grant allows a request once per use: the decision took none for a
/// request its first exception (not the grant) allowed.
fn take_grant(e: &Exception) -> bool {
    e.grant().is_none_or(|g| g.take())
}

/// A body past every bound: `body_too_large`, in both modes (what was not
/// kept cannot be forwarded).
fn refuse<'p>(
    mut ev: Event,
    d: &mut Decision<'p>,
    cands: &[&'p Exception],
    mode: Mode,
    responder: &Responder<'_>,
) -> Stepped {
    let e = cands
        .iter()
        .copied()
        .find(|e| e.body().is_some())
        .expect("a body: exception");
    let max = e.body().map_or(0, |b| b.max_bytes);
    let r = Refusal::too_large(max);
    let dd = Decision::deny(r.reason, Some(e));
    ev.set_decision(&dd, mode);
    *d = dd;
    Stepped::Answered(responder.refuse_with(ev, r.detail))
}

/// A body the rules refuse; in report mode logged and forwarded. The
/// request arrives as its head and the body read to judge it.
fn refused<'p>(
    (parts, raw): (http::request::Parts, Bytes),
    mut ev: Event,
    d: &mut Decision<'p>,
    e: &'p Exception,
    r: Refusal,
    mode: Mode,
    responder: &Responder<'_>,
) -> Stepped {
    let dd = Decision::deny(r.reason, Some(e)).under(mode);
    ev.set_decision(&dd, mode);
    if dd.is_allowed() {
        ev.add_note(Some(r.detail));
        *d = dd;
        return Stepped::Forward(Request::from_parts(parts, ReqBody::held(raw)), ev);
    }
    *d = dd;
    Stepped::Answered(responder.refuse_with(ev, r.detail))
}

/// The body as the origin reads it: `gzip` inflated (at most `max`
/// bytes); another coding is refused, since egressd would judge bytes the
/// origin does not read.
fn decoded(h: &http::HeaderMap, raw: &Bytes, max: u64) -> Result<Bytes, String> {
    let codings: Vec<String> = h
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    match codings.as_slice() {
        [] => Ok(raw.clone()),
        [c] if c == "identity" => Ok(raw.clone()),
        [c] if c == "gzip" || c == "x-gzip" => gunzip(raw, max),
        _ => Err("the body is in a content coding egressd does not read (gzip only)".into()),
    }
}

fn gunzip(raw: &[u8], max: u64) -> Result<Bytes, String> {
    use std::io::Read as _;
    let mut out = Vec::new();
    let mut d = flate2::read::GzDecoder::new(raw).take(max + 1);
    d.read_to_end(&mut out)
        .map_err(|e| format!("the gzip body does not inflate: {e}"))?;
    if out.len() as u64 > max {
        return Err("the gzip body inflates past body: max_bytes".into());
    }
    Ok(out.into())
}

enum Read {
    Whole(Bytes),
    /// More than the bound: what was read, and the rest, unread.
    Over(Bytes, Incoming),
    Failed(String),
}

/// The body, whole, when it is at most `max` bytes.
async fn read_upto(mut body: Incoming, max: u64) -> Read {
    let mut buf = BytesMut::new();
    loop {
        match body.frame().await {
            None => return Read::Whole(buf.freeze()),
            Some(Err(e)) => return Read::Failed(format!("the request body: {e}")),
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                    if buf.len() as u64 > max {
                        return Read::Over(buf.freeze(), body);
                    }
                }
            }
        }
    }
}

/// Reads and drops the rest of a refused body, bounded in bytes and time.
async fn drain(mut body: Incoming) {
    let mut seen = 0u64;
    let go = async {
        while let Some(Ok(f)) = body.frame().await {
            if let Ok(d) = f.into_data() {
                seen += d.len() as u64;
                if seen > DRAIN_MAX {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, go).await;
}
