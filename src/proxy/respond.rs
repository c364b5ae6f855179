//! The answers egressd gives instead of a destination's: 403 with
//! `X-Egressd-Reason` and a one-paragraph explanation, 400 for what cannot be
//! parsed, 502/504 for destinations that fail, 503 when the log is down.
//!
//! `Responder` is the one responder of the HTTP front-ends (forward,
//! CONNECT, requests inside interception, captured plain HTTP): it answers
//! a refusal or an unreachable destination and records the request's line
//! with it, so that no answer goes out without its line. One map from
//! reason to status ([`Reason::status`], through [`status_for`]); one deny
//! body ([`deny`]).

use std::fmt::Display;
use std::future::Future;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};

use crate::policy::suggest::{self, Asked, Closest};
use crate::policy::{Proto, Reason};
use crate::record::{Event, Recorder, UpstreamFailure};
use crate::time::unix_now;

/// What a body handed to hyper may fail with: the origin's error, or
/// egressd's own (a download cut for not matching its pin).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub type ProxyBody = BoxBody<Bytes, BoxError>;

pub const REASON_HEADER: &str = "x-egressd-reason";
/// The denied request's id (the `id` of its log line), for `egressd grant`.
pub const REQUEST_HEADER: &str = "x-egressd-request";

pub fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// Status for a denial made for `reason`: [`Reason::status`], the one
/// table, as hyper's type. Its statuses are all valid codes (the unit test
/// below asks each); a code that were not would answer 500, never a pass.
pub fn status_for(reason: Reason) -> StatusCode {
    StatusCode::from_u16(reason.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// What a denial answer says: what was denied, why, whom to ask, and —
/// for the policy's own denials — the `egressd explain` command that
/// reproduces the decision and the exception stub that would allow it
/// (see [`crate::policy::suggest`]: built from the decided facts only,
/// never from the client's headers or query).
pub struct Denial<'a> {
    pub reason: Reason,
    pub what: &'a str,
    pub contact: &'a str,
    pub detail: Option<&'a str>,
    pub explain: Option<String>,
    pub stub: Option<String>,
    /// The request's id, as its log line has it.
    pub request: Option<String>,
}

impl Denial<'_> {
    /// The one paragraph: what, why, and (for a 403) whom to ask.
    fn paragraph(&self) -> String {
        let reason = self.reason;
        let mut body = format!(
            "egressd denied {} ({}): {}.",
            self.what,
            reason.as_str(),
            reason.describe()
        );
        if let Some(d) = self.detail {
            body.push(' ');
            body.push_str(&sentence(d));
        }
        if status_for(reason) == StatusCode::FORBIDDEN {
            body.push_str(&format!(
                " If this task needs it, ask {} for an exception, saying what the destination is and why it is needed.",
                self.contact
            ));
        }
        body
    }

    fn text(&self) -> String {
        let mut body = self.paragraph();
        body.push('\n');
        match (&self.explain, &self.request) {
            (Some(cmd), Some(id)) => {
                // A shell comment: the line still pastes as the command.
                body.push_str(&format!("\nTo see the decision: {cmd}  # request {id}\n"))
            }
            (Some(cmd), None) => body.push_str(&format!("\nTo see the decision: {cmd}\n")),
            (None, Some(id)) => body.push_str(&format!("\nRequest: {id}\n")),
            (None, None) => {}
        }
        if let (Some(id), true) = (
            &self.request,
            status_for(self.reason) == StatusCode::FORBIDDEN,
        ) {
            body.push_str(&format!(
                "To allow it for a while: egressd grant {id} --ttl 1h --uses 1 --owner WHO --reason WHY\n"
            ));
        }
        if let Some(stub) = &self.stub {
            body.push_str(
                "\nAn exception that would allow it, for a person to review (owner and reason left to fill in):\n\n",
            );
            body.push_str(stub);
        }
        body
    }

    fn json(&self) -> String {
        let detail = match self.detail {
            Some(d) => format!("{}. {}", self.reason.describe(), sentence(d)),
            None => format!("{}.", self.reason.describe()),
        };
        // `message` is the field API clients print from an error body
        // (GitHub's and GitLab's APIs put it there; `gh` shows it after
        // the status): the reason and the request to grant, in one line.
        let message = match &self.request {
            Some(id) => format!("egressd: {} ({detail}) request {id}", self.reason.as_str()),
            None => format!("egressd: {} ({detail})", self.reason.as_str()),
        };
        let mut v = serde_json::json!({
            "message": message,
            "denied": self.what,
            "status": status_for(self.reason).as_u16(),
            "reason": self.reason.as_str(),
            "detail": detail,
            "contact": self.contact,
            "explain": self.explain,
            "stub": self.stub,
            "request": self.request,
        })
        .to_string();
        v.push('\n');
        v
    }
}

/// `d` as a sentence: capitalised, ending in a full stop.
fn sentence(d: &str) -> String {
    let mut s = String::with_capacity(d.len() + 1);
    let mut chars = d.chars();
    if let Some(first) = chars.next() {
        s.extend(first.to_uppercase());
        s.push_str(chars.as_str());
    }
    if !d.ends_with('.') {
        s.push('.');
    }
    s
}

/// Whether the client asked for JSON (`Accept: application/json`, or a
/// `+json` type, with a non-zero q): agents that parse answers get one.
pub fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let json = media == "application/json"
                || (media.starts_with("application/") && media.ends_with("+json"));
            let q_zero = parts.any(|p| {
                p.strip_prefix("q=")
                    .or_else(|| p.strip_prefix("Q="))
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            json && !q_zero
        })
}

/// A denial's answer, as text or (`json`) as a JSON document.
pub fn deny(d: &Denial, close: bool, json: bool) -> Response<ProxyBody> {
    let status = status_for(d.reason);
    let mut r = if json {
        build(status, Some(d.reason), d.json(), close)
    } else {
        build(status, Some(d.reason), d.text(), close)
    };
    if let Some(v) = d
        .request
        .as_deref()
        .and_then(|id| HeaderValue::from_str(id).ok())
    {
        r.headers_mut().insert(REQUEST_HEADER, v);
    }
    if json {
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    r
}

/// An upstream failure: 502, or 504 for a timeout.
pub fn upstream_error(what: &str, err: &str, timeout: bool, close: bool) -> Response<ProxyBody> {
    let status = if timeout {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    let body = format!("egressd could not reach {what}: {err}\n");
    build(status, None, body, close)
}

fn build(
    status: StatusCode,
    reason: Option<Reason>,
    body: String,
    close: bool,
) -> Response<ProxyBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    if let Some(reason) = reason {
        h.insert(REASON_HEADER, HeaderValue::from_static(reason.as_str()));
    }
    if close {
        h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// How a request ends before a destination answers it: the steps of a
/// front-end return one, and [`Responder::stop`] turns it into the answer
/// and the line.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Refused for `reason` by egressd itself (before or beside the
    /// policy); `detail` goes into the body and after the event's note.
    Deny(Reason, Option<String>),
    /// Refused by the policy decision already in the event.
    Decided,
    /// The request's framing cannot be trusted (RFC 9112 §6): refused as
    /// malformed with `status` (400, or 501 for a transfer coding egressd
    /// does not decode), and the connection closed, since where the
    /// request ends is not known.
    BadMessage { status: StatusCode, detail: String },
    /// The destination could not be reached.
    Unreachable {
        kind: UpstreamFailure,
        message: String,
        /// 504 rather than 502.
        timeout: bool,
    },
}

/// A captured connection that is not HTTP has no one to answer: `stop`
/// only completes its line and records it.
pub(crate) fn record_stop(rec: &Recorder, mut ev: Event, stop: Stop) {
    match stop {
        Stop::Deny(reason, detail) => {
            ev.set_denied(reason);
            ev.add_note(detail);
        }
        Stop::Decided => {}
        Stop::BadMessage { detail, .. } => {
            ev.set_denied(Reason::Malformed);
            ev.add_note(Some(detail));
        }
        Stop::Unreachable { kind, message, .. } => ev.fail_upstream(kind, message),
    }
    rec.record(ev);
}

/// The explain command and exception stub for a denial recorded in `ev`.
fn suggestions(ev: &Event, reason: Reason) -> (Option<String>, Option<String>) {
    let (Some(host), Some(port)) = (ev.host.as_deref(), ev.port) else {
        return (None, None);
    };
    let asked = Asked {
        proto: ev.proto,
        host,
        port,
        method: ev.method.as_deref(),
        path: ev.path.as_deref().filter(|_| ev.proto != Proto::Connect),
        client: Some(&*ev.client).filter(|c| *c != "-"),
        addr: ev.addr.map(|a| a.ip()),
    };
    let closest = match (&ev.exception, &ev.owner) {
        (Some(id), Some(owner)) => Some(Closest { id, owner }),
        _ => None,
    };
    (
        suggest::explain_command(&asked, reason),
        suggest::exception_stub(&asked, reason, closest, unix_now()),
    )
}

impl Stop {
    /// Refused as malformed, saying why.
    pub fn malformed(detail: impl ToString) -> Stop {
        Stop::Deny(Reason::Malformed, Some(detail.to_string()))
    }
}

/// A request's refusals and failures, answered and recorded: what was
/// asked (made only when a request is refused), whom to contact, whether
/// the connection closes after the answer (after a CONNECT the client's
/// next bytes were meant for the destination, never for egressd).
pub(crate) struct Responder<'a> {
    /// What was asked (`GET http://host/path`), for the deny body.
    pub what: &'a (dyn Fn() -> String + Send + Sync),
    pub contact: &'a str,
    pub close: bool,
    /// Answer denials as JSON ([`wants_json`] of the request's headers).
    pub json: bool,
    pub rec: &'a Recorder,
}

impl Responder<'_> {
    /// Answers `stop` and records the line.
    pub fn stop(&self, ev: Event, stop: Stop) -> Response<ProxyBody> {
        match stop {
            Stop::Deny(reason, detail) => self.deny(ev, reason, detail),
            Stop::Decided => self.refuse(ev),
            Stop::BadMessage { status, detail } => {
                let closing = Responder {
                    close: true,
                    ..*self
                };
                let mut ev = ev;
                ev.set_denied(Reason::Malformed);
                closing.answer_denial_as(ev, Reason::Malformed, Some(detail), status)
            }
            Stop::Unreachable {
                kind,
                message,
                timeout,
            } => self.unreachable(ev, kind, message, timeout),
        }
    }

    /// A refusal egressd makes itself (malformed input, log failure).
    pub fn deny(
        &self,
        mut ev: Event,
        reason: Reason,
        detail: Option<String>,
    ) -> Response<ProxyBody> {
        ev.set_denied(reason);
        self.answer_denial(ev, reason, detail)
    }

    /// The refusal the policy decided, already in `ev`.
    pub fn refuse(&self, ev: Event) -> Response<ProxyBody> {
        let reason = ev.reason;
        self.answer_denial(ev, reason, None)
    }

    /// The refusal the policy decided, already in `ev` (its exception
    /// kept), with a sentence saying what was refused.
    pub fn refuse_with(&self, ev: Event, detail: String) -> Response<ProxyBody> {
        let reason = ev.reason;
        self.answer_denial(ev, reason, Some(detail))
    }

    fn answer_denial(
        &self,
        ev: Event,
        reason: Reason,
        detail: Option<String>,
    ) -> Response<ProxyBody> {
        self.answer_denial_as(ev, reason, detail, status_for(reason))
    }

    /// [`Responder::answer_denial`] with `status` instead of the reason's.
    fn answer_denial_as(
        &self,
        mut ev: Event,
        reason: Reason,
        detail: Option<String>,
        status: StatusCode,
    ) -> Response<ProxyBody> {
        let what = (self.what)();
        let (explain, stub) = suggestions(&ev, reason);
        let denial = Denial {
            reason,
            what: &what,
            contact: self.contact,
            detail: detail.as_deref(),
            explain,
            stub,
            request: Some(ev.id.to_string()),
        };
        let mut resp = deny(&denial, self.close, self.json);
        *resp.status_mut() = status;
        ev.status = Some(resp.status().as_u16());
        ev.add_note(detail);
        self.rec.record(ev);
        resp
    }

    /// The destination (the event's `host`) could not be reached: 502 (504
    /// for a timeout), an upstream failure of `kind` in the line.
    pub fn unreachable(
        &self,
        mut ev: Event,
        kind: UpstreamFailure,
        message: impl Display,
        timeout: bool,
    ) -> Response<ProxyBody> {
        let message = message.to_string();
        let host = ev.host.as_deref().unwrap_or("the destination");
        let resp = upstream_error(host, &message, timeout, self.close);
        ev.status = Some(resp.status().as_u16());
        ev.fail_upstream(kind, message);
        self.rec.record(ev);
        resp
    }
}

/// `resp` (an answer whose body is in memory) as HTTP/1.1 bytes.
pub(crate) fn encode(resp: Response<ProxyBody>) -> Option<Vec<u8>> {
    let (parts, body) = resp.into_parts();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut collect = std::pin::pin!(body.collect());
    let body = match collect.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(b)) => b.to_bytes(),
        _ => return None,
    };
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_u16(),
        parts.status.canonical_reason().unwrap_or("")
    );
    for (name, value) in &parts.headers {
        head.push_str(&format!("{name}: {}\r\n", value.to_str().ok()?));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_answers_the_status_of_its_one_table() {
        for r in Reason::ALL {
            let want = match r {
                Reason::Malformed => StatusCode::BAD_REQUEST,
                Reason::UploadBudget => StatusCode::TOO_MANY_REQUESTS,
                Reason::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                Reason::LogUnavailable | Reason::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
                Reason::UpstreamError | Reason::PackageIndexUnfilterable => StatusCode::BAD_GATEWAY,
                _ => StatusCode::FORBIDDEN,
            };
            assert_eq!(status_for(r), want, "{r:?}");
            assert_eq!(status_for(r).as_u16(), r.status(), "{r:?}");
        }
    }
}
