//! The one upstream path for HTTP requests: a request whose addresses
//! are checked goes to its origin (or a registry's mirror) here, whoever
//! made it: a client's request ([`super::exchange`]) or egressd's own index
//! fetch ([`super::gate`]). The origin chosen (a pooled plain-HTTP address
//! or a TLS client bound to the name and its checked addresses), the
//! request rewritten for it (hop-by-hop headers out, `Host`, `Via` and
//! credentials in), sent, the response head awaited (bounded) and refused
//! when its framing is ambiguous.
//!
//! Owns: [`Way`], [`reach`], the hop-by-hop list, the framing of lengths.
//! Does not own: which addresses are checked (`upstream`), connections
//! (`pool`, `tls_origins`), what happens to the answer (`exchange`, `gate`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use super::dest::Dest;
use super::held::{Cap, ReqBody};
use super::pool;
use super::relay::meter::Counted;
use super::respond::Stop;
use super::tls_origins::TlsClient;
use super::upstream::Egress;
use super::ProxyCtx;
use crate::packages::compile::MirrorHeader;
use crate::policy::{Exception, Reason};
use crate::record::{Event, UpstreamFailure};
use crate::shutdown::Permit;

/// Where a request goes, its addresses already checked.
pub(crate) struct Way<'a> {
    pub dest: &'a Dest,
    pub scheme: Scheme,
    /// Checked addresses, preferred first.
    pub addrs: &'a [SocketAddr],
    /// The exception whose credentials the request carries.
    pub exception: Option<&'a Exception>,
    /// A mirror's headers, put in after everything else.
    pub inject: &'a [MirrorHeader],
}

/// Sends `req` the one way out: the origin chosen for `way`, the request
/// rewritten for it (and asked to switch to `upgrade`, a WebSocket), the
/// response head awaited.
pub(crate) async fn reach(
    ctx: &ProxyCtx,
    mut req: Request<ReqBody>,
    ev: &mut Event,
    way: Way<'_>,
    upgrade: Option<HeaderValue>,
) -> Result<Sent, Stop> {
    let origin = Origin::choose(ctx, &req, ev, &way, upgrade.is_some())?;
    let client_upgrade =
        rewrite(&mut req, ctx, &origin, upgrade, way.exception, way.scheme).map(|up| {
            let x = req.extensions();
            (up, x.get::<Permit>().cloned(), x.get::<Cap>().cloned())
        });
    for h in way.inject {
        req.headers_mut().insert(h.name.clone(), h.value.clone());
    }
    send(ctx, req, origin, client_upgrade, ev).await
}

/// Longest wait for an origin's response head after the request is sent.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) static VIA: HeaderValue = HeaderValue::from_static("1.1 egressd");

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

/// The one length every `Content-Length` line states (decimal digits, each
/// line the same number), `None` without one.
pub(crate) fn content_length(h: &HeaderMap) -> Result<Option<u64>, &'static str> {
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

pub(crate) fn unreachable(kind: UpstreamFailure, message: impl ToString, timeout: bool) -> Stop {
    Stop::Unreachable {
        kind,
        message: message.to_string(),
        timeout,
    }
}

/// Where an allowed request goes and how.
pub(crate) struct Origin {
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
        way: &Way<'_>,
        upgrade: bool,
    ) -> Result<Origin, Stop> {
        let (dest, checked) = (way.dest, way.addrs);
        let host = if dest.port == way.scheme.default_port() {
            dest.target.to_string()
        } else {
            format!("{}:{}", dest.target, dest.port)
        };
        let (uri, addr, tls) = match way.scheme {
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
pub(crate) struct Sent {
    pub resp: Response<Incoming>,
    /// The pooled plain-HTTP connection, given back when the body ends.
    pub lent: Option<pool::Lent>,
    pub up_bytes: Arc<AtomicU64>,
    /// The client side of a WebSocket upgrade, the client connection's
    /// permit, which the upgraded connection keeps until it closes, and
    /// the request's upload budget, which its bytes are charged to.
    pub client_upgrade: Option<(OnUpgrade, Option<Permit>, Option<Cap>)>,
}

/// Sends `req` to `origin` and waits (bounded) for the response head.
async fn send(
    ctx: &ProxyCtx,
    req: Request<ReqBody>,
    origin: Origin,
    client_upgrade: Option<(OnUpgrade, Option<Permit>, Option<Cap>)>,
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
            // Cut at its upload budget: refused as that, not as malformed.
            if let Some(cut) = super::upload::cut(ev) {
                return Err(cut);
            }
            return Err(Stop::BadMessage {
                status: StatusCode::BAD_REQUEST,
                detail: format!("the request body: {e}"),
            });
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
