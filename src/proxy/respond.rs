//! The answers egressd gives instead of a destination's: 403 with
//! `X-Egressd-Reason` and a one-paragraph explanation, 400 for what cannot be
//! parsed, 502/504 for destinations that fail, 503 when the log is down.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};

use crate::policy::Reason;

pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

pub const REASON_HEADER: &str = "x-egressd-reason";

pub fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// Status for a denial made for `reason`.
pub fn status_for(reason: Reason) -> StatusCode {
    match reason {
        Reason::Malformed => StatusCode::BAD_REQUEST,
        Reason::LogUnavailable | Reason::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        Reason::UpstreamError => StatusCode::BAD_GATEWAY,
        _ => StatusCode::FORBIDDEN,
    }
}

/// A denial: what was denied, why, and whom to ask.
pub fn deny(
    reason: Reason,
    what: &str,
    contact: &str,
    detail: Option<&str>,
    close: bool,
) -> Response<ProxyBody> {
    let status = status_for(reason);
    let mut body = format!(
        "egressd denied {what} ({}): {}.",
        reason.as_str(),
        reason.describe()
    );
    if let Some(d) = detail {
        body.push(' ');
        let mut chars = d.chars();
        if let Some(first) = chars.next() {
            body.extend(first.to_uppercase());
            body.push_str(chars.as_str());
        }
        if !d.ends_with('.') {
            body.push('.');
        }
    }
    if status == StatusCode::FORBIDDEN {
        body.push_str(&format!(
            " If this task needs it, ask {contact} for an exception, saying what the destination is and why it is needed."
        ));
    }
    body.push('\n');
    build(status, Some(reason), body, close)
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
