//! Plain-HTTP forwarding of absolute-form requests (`GET http://host/path`).
//! The target is parsed at the edge into a `Target` and port, the `Host`
//! header must agree with it, the path is normalised for `paths:` rules, one
//! decision is made, and the request goes to a checked address over a pooled
//! connection with hop-by-hop headers removed and `Host` rewritten.

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

use super::respond::{self, ProxyBody};
use super::upstream::{self, Refusal};
use super::ProxyCtx;
use crate::decision::{Event, Proto, Reason, Recorder};
use crate::policy::host::{parse_target, Target};
use crate::policy::path::normalize_path;
use crate::policy::time::unix_now;
use crate::policy::{self, Exception};

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
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
}

/// A request target's destination, parsed at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dest {
    pub target: Target,
    pub port: u16,
}

/// Parses an authority (`host`, `host:port`, `[v6]:port`). Empty ports,
/// ports with leading zeros or signs, and userinfo are refused: spellings
/// that parsers disagree on are attacks, not typos.
pub fn parse_authority(auth: &str, default_port: Option<u16>) -> Result<Dest, String> {
    if auth.contains('@') {
        return Err("userinfo in the request target is not allowed".into());
    }
    let (host, port) = if let Some(rest) = auth.strip_prefix('[') {
        let end = rest.find(']').ok_or("unterminated IPv6 literal")?;
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err("junk after IPv6 literal".into()),
        };
        (&auth[..end + 2], port)
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (auth, None),
        }
    };
    let port = match port {
        None => default_port.ok_or("a port is required")?,
        Some(p) => {
            if p.is_empty()
                || !p.bytes().all(|b| b.is_ascii_digit())
                || (p.len() > 1 && p.starts_with('0'))
            {
                return Err(format!("invalid port {p:?}"));
            }
            match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(format!("port {p} is out of range")),
            }
        }
    };
    let target = parse_target(host).map_err(|e| format!("invalid host {host:?}: {e}"))?;
    Ok(Dest { target, port })
}

fn truncate_path(p: &str) -> String {
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

pub async fn handle(
    mut req: Request<Incoming>,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let policy = ctx.policy.snapshot();
    let contact = policy.settings.contact.clone();
    let mut ev = Event::new(Proto::Http, peer);
    ev.method = Some(req.method().as_str().to_string());
    ev.path = Some(truncate_path(req.uri().path()));
    let what = format!("{} {}", req.method(), truncate_path(&req.uri().to_string()));
    let rec = &ctx.recorder;

    let deny = |mut ev: Event, reason: Reason, detail: Option<String>, policy_decided: bool| {
        if !policy_decided {
            ev.set_denied(reason);
        }
        let resp = respond::deny(reason, &what, &contact, detail.as_deref(), false);
        ev.status = Some(resp.status().as_u16());
        if let Some(d) = detail {
            ev.note.get_or_insert(d);
        }
        rec.record(ev);
        resp
    };

    if !rec.accepting() {
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
        Err(e) => return deny(ev, Reason::Malformed, Some(e), false),
    };
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);

    // A Host header that names another destination is a request for a
    // different origin riding on an allowed one: refuse, don't pick.
    let hosts: Vec<&HeaderValue> = req.headers().get_all(header::HOST).iter().collect();
    if hosts.len() > 1 {
        return deny(
            ev,
            Reason::Malformed,
            Some("more than one Host header".into()),
            false,
        );
    }
    if let Some(h) = hosts.first() {
        let agrees = h
            .to_str()
            .ok()
            .and_then(|h| parse_authority(h, Some(dest.port)).ok())
            .is_some_and(|hd| hd == dest);
        if !agrees {
            return deny(ev, Reason::HostMismatch, None, false);
        }
    }

    let path = match normalize_path(uri.path()) {
        Ok(p) => p,
        Err(e) => return deny(ev, Reason::Malformed, Some(e.to_string()), false),
    };
    ev.path = Some(truncate_path(&path));

    let now = unix_now();
    let preq = policy::Request {
        proto: Proto::Http,
        client,
        target: &dest.target,
        port: dest.port,
        method: Some(req.method().as_str()),
        path: Some(&path),
        qtype: None,
        can_intercept: false,
    };
    let d = policy.decide(&preq, now);
    ev.set_decision(&d, policy.settings.mode);
    if !d.is_allowed() {
        return deny(ev, d.reason, None, true);
    }

    let checked = match upstream::resolve_checked(
        &policy,
        &ctx.resolver,
        d.exception,
        client,
        &dest.target,
        dest.port,
        &ctx.own_addrs,
        now,
    )
    .await
    {
        Ok(c) => c,
        Err(Refusal::Policy(reason, note)) => {
            ev.note = note.clone();
            return deny(ev, reason, None, false);
        }
        Err(Refusal::Resolve(e)) => {
            rec.metrics
                .upstream_errors
                .with_label_values(&["http", "resolve"])
                .inc();
            let resp =
                respond::upstream_error(&dest.target.to_string(), &e.to_string(), false, false);
            ev.status = Some(resp.status().as_u16());
            ev.error = Some(format!("resolve: {e}"));
            rec.record(ev);
            return resp;
        }
    };
    ev.note = checked.note;
    let addr = checked.addrs[0];
    ev.addr = Some(addr.to_string());

    // Rewrite for the origin: origin address in the URI (the pool key),
    // the target's authority in Host.
    let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let up_uri: Uri = match format!("http://{addr}{pq}").parse() {
        Ok(u) => u,
        Err(_) => {
            return deny(
                ev,
                Reason::Malformed,
                Some("unparsable request target".into()),
                false,
            )
        }
    };
    let host_value = if dest.port == 80 {
        dest.target.to_string()
    } else {
        format!("{}:{}", dest.target, dest.port)
    };
    {
        let h = req.headers_mut();
        strip_hop_by_hop(h);
        h.insert(
            header::HOST,
            HeaderValue::from_str(&host_value).expect("normalised host is a valid header"),
        );
        h.append(header::VIA, VIA.clone());
        if let Some(e) = d.exception {
            inject(h, e);
        }
    }
    *req.uri_mut() = up_uri;
    *req.version_mut() = http::Version::HTTP_11;

    let up_bytes = Arc::new(AtomicU64::new(0));
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(
        parts,
        Counted {
            inner: body,
            counter: up_bytes.clone(),
        },
    );
    let result = tokio::time::timeout(RESPONSE_TIMEOUT, ctx.http.request(req)).await;
    match result {
        Ok(Ok(mut resp)) => {
            ev.status = Some(resp.status().as_u16());
            strip_hop_by_hop(resp.headers_mut());
            resp.headers_mut().append(header::VIA, VIA.clone());
            let (parts, body) = resp.into_parts();
            let body = Recorded {
                inner: body,
                up: up_bytes,
                down: 0,
                event: Some(ev),
                recorder: ctx.recorder.clone(),
            };
            Response::from_parts(parts, body.boxed())
        }
        Ok(Err(e)) => {
            rec.metrics
                .upstream_errors
                .with_label_values(&["http", "connect"])
                .inc();
            let msg = error_chain(&e);
            let resp = respond::upstream_error(&dest.target.to_string(), &msg, false, false);
            ev.status = Some(resp.status().as_u16());
            ev.error = Some(msg);
            ev.bytes_up = up_bytes.load(Ordering::Relaxed);
            rec.record(ev);
            resp
        }
        Err(_) => {
            rec.metrics
                .upstream_errors
                .with_label_values(&["http", "timeout"])
                .inc();
            let resp = respond::upstream_error(
                &dest.target.to_string(),
                "no response in time",
                true,
                false,
            );
            ev.status = Some(resp.status().as_u16());
            ev.error = Some("response timeout".into());
            ev.bytes_up = up_bytes.load(Ordering::Relaxed);
            rec.record(ev);
            resp
        }
    }
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
}

impl Recorded {
    fn finish(&mut self, error: Option<String>) {
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
    fn authorities() {
        let d = parse_authority("Example.COM.", Some(80)).unwrap();
        assert_eq!(d.target.to_string(), "example.com");
        assert_eq!(d.port, 80);
        assert_eq!(parse_authority("[::1]:8080", None).unwrap().port, 8080);
        assert_eq!(
            parse_authority("0x7f.1:81", None)
                .unwrap()
                .target
                .to_string(),
            "127.0.0.1"
        );
        for bad in [
            "a.test:",
            "a.test:0080",
            "a.test:65616",
            "a.test:0",
            "u@a.test",
            "a.test:+80",
            "[::1",
            "[::1]x",
            "a.test: 80",
        ] {
            assert!(parse_authority(bad, Some(80)).is_err(), "{bad}");
        }
        assert!(parse_authority("a.test", None).is_err());
    }
}
