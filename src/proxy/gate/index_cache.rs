//! Index documents kept by egressd and served again while the registry
//! says they are fresh: a shared cache in RFC 9111's sense, for the one
//! kind of response the package gate reads whole anyway.
//!
//! What is kept is the registry's document as it arrived (decoded, before
//! any mirror rewrite or filter), never a filtered one: every answer from
//! here goes through the same filter as a fetched one, with the policy
//! serving at that moment and the rules of the client asking, so a reload,
//! a newly approved version or a client's own `packages:` set applies to
//! a kept document at once. The request is decided and logged as every
//! request is; only the trip to the registry is saved.
//!
//! Kept only where the registry allows it and no credential is involved:
//! a `200` whose `Cache-Control` gives an explicit lifetime (`s-maxage`,
//! else `max-age`, less `Age`; at most [`MAX_FRESH`]) and does not say
//! `no-store`, `private` or `no-cache`, with no `Set-Cookie` and no `Vary`
//! beyond `Accept` and `Accept-Encoding`; never for a request that carries
//! `Authorization` or `Cookie`, or whose exception injects headers. A
//! client that asks for a fresh copy (`Cache-Control: no-cache` or a
//! `max-age` the kept copy is older than, `Pragma: no-cache`) gets one
//! from the registry, and that answer replaces the kept one. Nothing stale
//! is ever served. Keyed by scheme, host, port, path and query, `Accept`,
//! the exception that allowed the request and the mirror it goes to.
//!
//! Owns: whether a response may be kept and for how long, whether a
//! request may be answered from here, the bounded store. Does not own:
//! filtering (`packages`), the decision or the line.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};

/// The longest a kept document is served, whatever the registry says.
pub const MAX_FRESH: Duration = Duration::from_secs(600);
/// Bytes of documents kept at once (least recently used dropped first).
pub const MAX_KEPT_BYTES: usize = 64 << 20;
/// Documents kept at once.
pub const MAX_KEPT: usize = 4096;
/// A larger document is served but not kept.
pub const MAX_DOC_BYTES: usize = 16 << 20;

/// Which kept document answers a request.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Key {
    pub scheme: &'static str,
    pub host: String,
    pub port: u16,
    /// Path and query as the client sent them.
    pub target: String,
    pub accept: Option<Bytes>,
    /// The exception that allowed the request.
    pub exception: Arc<str>,
    /// The mirror's base the request goes to instead, if any.
    pub mirror: Option<String>,
}

/// What a request allows the cache to do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Use {
    /// Credentials are involved: neither answered from nor kept.
    Bypass,
    /// Answered by a kept copy no older than this (`None`: any fresh one),
    /// else fetched and kept.
    UpTo(Option<Duration>),
}

/// A kept document.
pub(crate) struct Kept {
    /// The registry's end-to-end headers (no framing, encoding, `Age`,
    /// `Via` or validators: the filtered answer gets its own).
    pub headers: HeaderMap,
    /// The document, decoded.
    pub doc: Bytes,
    stored: Instant,
    /// Its `Age` when it arrived.
    arrived_aged: Duration,
    /// How long after `stored` it is served.
    fresh_for: Duration,
}

impl Kept {
    /// How old the copy is (RFC 9111 §4.2.3): its `Age` when it arrived
    /// plus the time since.
    pub fn age(&self, now: Instant) -> Duration {
        self.arrived_aged + now.saturating_duration_since(self.stored)
    }
}

struct Entry {
    kept: Arc<Kept>,
    used: u64,
}

#[derive(Default)]
struct Store {
    map: HashMap<Key, Entry>,
    bytes: usize,
    tick: u64,
}

impl Store {
    fn remove(&mut self, key: &Key) {
        if let Some(e) = self.map.remove(key) {
            self.bytes -= e.kept.doc.len();
        }
    }

    /// Drops least recently used documents until `room` more bytes and
    /// one more document fit.
    fn make_room(&mut self, room: usize) {
        while !self.map.is_empty()
            && (self.bytes + room > MAX_KEPT_BYTES || self.map.len() >= MAX_KEPT)
        {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.remove(&k),
                None => break,
            }
        }
    }
}

/// The kept index documents.
#[derive(Default)]
pub(crate) struct IndexCache {
    store: Mutex<Store>,
}

impl IndexCache {
    pub(crate) fn new() -> IndexCache {
        IndexCache::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kept copy for `key`, if it is fresh and no older than `limit`.
    /// A copy past its lifetime is dropped.
    pub(crate) fn get(&self, key: &Key, limit: Option<Duration>) -> Option<Arc<Kept>> {
        let now = Instant::now();
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        let e = s.map.get_mut(key)?;
        if now.saturating_duration_since(e.kept.stored) >= e.kept.fresh_for {
            s.remove(key);
            return None;
        }
        // `max-age=0` (and `no-cache`) ask for the registry's answer.
        if limit.is_some_and(|l| l.is_zero() || e.kept.age(now) > l) {
            return None;
        }
        e.used = tick;
        Some(e.kept.clone())
    }

    /// Keeps `doc` (the registry's `200`, decoded) under `key` if its
    /// headers allow; otherwise drops any copy kept under `key` (the
    /// registry no longer allows it, or the client asked for a fresh one
    /// and this is it). Returns whether it was kept.
    pub(crate) fn put(&self, key: Key, headers: &HeaderMap, doc: Bytes) -> bool {
        let lifetime = lifetime(headers).filter(|_| doc.len() <= MAX_DOC_BYTES);
        let mut s = self.lock();
        s.remove(&key);
        let Some(fresh_for) = lifetime else {
            return false;
        };
        let arrived_aged = Duration::from_secs(
            headers
                .get(header::AGE)
                .and_then(|a| seconds(a.to_str().ok()))
                .unwrap_or(0),
        );
        let mut kept_headers = headers.clone();
        for n in DROPPED {
            kept_headers.remove(n);
        }
        s.make_room(doc.len());
        s.tick += 1;
        let used = s.tick;
        s.bytes += doc.len();
        let kept = Arc::new(Kept {
            headers: kept_headers,
            doc,
            stored: Instant::now(),
            arrived_aged,
            fresh_for,
        });
        s.map.insert(key, Entry { kept, used });
        true
    }
}

/// Headers a kept copy does not keep: framing and encoding (the document
/// is kept decoded), the registry's validators (the filtered answer has
/// its own), and what each answer gets anew.
const DROPPED: [HeaderName; 8] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::TRANSFER_ENCODING,
    header::ETAG,
    header::LAST_MODIFIED,
    header::AGE,
    header::VIA,
    header::DATE,
];

/// The `Cache-Control` directives of `h`, lower-cased, each with its value
/// (quotes removed).
fn directives(h: &HeaderMap, name: HeaderName) -> Vec<(String, Option<String>)> {
    h.get_all(name)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split(',')
                .filter_map(|d| {
                    let d = d.trim();
                    if d.is_empty() {
                        return None;
                    }
                    Some(match d.split_once('=') {
                        Some((k, v)) => (
                            k.trim().to_ascii_lowercase(),
                            Some(v.trim().trim_matches('"').to_string()),
                        ),
                        None => (d.to_ascii_lowercase(), None),
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Seconds in a delta-seconds value; `None` if it is not one.
fn seconds(v: Option<&str>) -> Option<u64> {
    let v = v?;
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Larger than any lifetime kept here: the bound applies.
    Some(v.parse().unwrap_or(u64::MAX))
}

/// How long a shared cache may serve a response with headers `h`, from
/// now (RFC 9111 §4.2.1, explicit lifetimes only; no heuristic); `None`:
/// it may not be kept.
pub(crate) fn lifetime(h: &HeaderMap) -> Option<Duration> {
    if h.contains_key(header::SET_COOKIE) {
        return None;
    }
    let varies = h.get_all(header::VARY).iter().any(|v| {
        String::from_utf8_lossy(v.as_bytes())
            .split(',')
            .map(|f| f.trim().to_ascii_lowercase())
            .any(|f| !f.is_empty() && f != "accept" && f != "accept-encoding")
    });
    if varies {
        return None;
    }
    let cc = directives(h, header::CACHE_CONTROL);
    let has = |n: &str| cc.iter().any(|(k, _)| k == n);
    if has("no-store") || has("private") || has("no-cache") {
        return None;
    }
    let value = |n: &str| {
        cc.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| seconds(v.as_deref()))
    };
    // A directive present but malformed makes the response not keepable
    // (RFC 9111 §4.2.1: treat as stale).
    let max_age = match value("s-maxage").or_else(|| value("max-age")) {
        Some(Some(s)) => s,
        _ => return None,
    };
    let age = match h.get(header::AGE) {
        None => 0,
        Some(a) => seconds(a.to_str().ok())?,
    };
    let left = max_age.saturating_sub(age);
    (left > 0).then(|| Duration::from_secs(left).min(MAX_FRESH))
}

/// What a request with headers `h` allows (RFC 9111 §5.2.1, §3.5).
/// `injects`: its exception adds headers of its own (credentials).
pub(crate) fn request_use(h: &HeaderMap, injects: bool) -> Use {
    if injects || h.contains_key(header::AUTHORIZATION) || h.contains_key(header::COOKIE) {
        return Use::Bypass;
    }
    let cc = directives(h, header::CACHE_CONTROL);
    let pragma = directives(h, header::PRAGMA);
    if cc.iter().any(|(k, _)| k == "no-cache" || k == "no-store")
        || (cc.is_empty() && pragma.iter().any(|(k, _)| k == "no-cache"))
    {
        return Use::UpTo(Some(Duration::ZERO));
    }
    match cc.iter().find(|(k, _)| k == "max-age") {
        // A malformed max-age asks for nothing kept.
        Some((_, v)) => Use::UpTo(Some(Duration::from_secs(
            seconds(v.as_deref()).unwrap_or(0),
        ))),
        None => Use::UpTo(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn key(target: &str) -> Key {
        Key {
            scheme: "https",
            host: "pypi.org".into(),
            port: 443,
            target: target.into(),
            accept: None,
            exception: "pypi".into(),
            mirror: None,
        }
    }

    #[test]
    fn only_explicit_shared_lifetimes_are_kept() {
        let secs = |pairs: &[(&str, &str)]| lifetime(&headers(pairs)).map(|d| d.as_secs());
        assert_eq!(secs(&[("cache-control", "max-age=600, public")]), Some(600));
        assert_eq!(secs(&[("cache-control", "public,max-age=300")]), Some(300));
        assert_eq!(
            secs(&[("cache-control", "max-age=60, s-maxage=30")]),
            Some(30)
        );
        assert_eq!(secs(&[("cache-control", "max-age=\"120\"")]), Some(120));
        assert_eq!(
            secs(&[("cache-control", "max-age=600"), ("age", "590")]),
            Some(10)
        );
        assert_eq!(
            secs(&[("cache-control", "max-age=99999999999999999999")]),
            Some(600)
        );
        for never in [
            &[("cache-control", "max-age=600"), ("age", "600")][..],
            &[("cache-control", "max-age=600"), ("age", "x")],
            &[("cache-control", "max-age=0")],
            &[("cache-control", "max-age=-1")],
            &[("cache-control", "max-age=1e3")],
            &[("cache-control", "max-age")],
            &[("cache-control", "no-store, max-age=600")],
            &[
                ("cache-control", "max-age=600"),
                ("cache-control", "private"),
            ],
            &[("cache-control", "no-cache, max-age=600")],
            &[("cache-control", "max-age=600, no-cache=\"set-cookie\"")],
            &[("cache-control", "max-age=600"), ("set-cookie", "a=b")],
            &[("cache-control", "max-age=600"), ("vary", "Accept, Cookie")],
            &[("cache-control", "max-age=600"), ("vary", "*")],
            &[("expires", "Thu, 01 Dec 2099 16:00:00 GMT")],
            &[],
        ] {
            assert_eq!(secs(never), None, "{never:?}");
        }
        assert_eq!(
            secs(&[
                ("cache-control", "max-age=600"),
                ("vary", "Accept-Encoding, accept")
            ]),
            Some(600)
        );
    }

    #[test]
    fn requests_with_credentials_or_asking_for_fresh_copies() {
        let u = |pairs: &[(&str, &str)]| request_use(&headers(pairs), false);
        assert_eq!(u(&[]), Use::UpTo(None));
        assert_eq!(u(&[("authorization", "Basic eDp5")]), Use::Bypass);
        assert_eq!(u(&[("cookie", "s=1")]), Use::Bypass);
        assert_eq!(request_use(&HeaderMap::new(), true), Use::Bypass);
        let zero = Use::UpTo(Some(Duration::ZERO));
        assert_eq!(u(&[("cache-control", "max-age=0")]), zero);
        assert_eq!(u(&[("cache-control", "no-cache")]), zero);
        assert_eq!(u(&[("cache-control", "no-store")]), zero);
        assert_eq!(u(&[("pragma", "no-cache")]), zero);
        assert_eq!(u(&[("cache-control", "max-age=oops")]), zero);
        assert_eq!(
            u(&[("cache-control", "max-age=30")]),
            Use::UpTo(Some(Duration::from_secs(30)))
        );
    }

    #[test]
    fn a_kept_copy_is_served_while_fresh_and_replaced_or_dropped_by_the_next_answer() {
        let c = IndexCache::new();
        let ok = headers(&[
            ("cache-control", "max-age=600"),
            ("content-type", "text/html"),
            ("etag", "\"r\""),
            ("content-encoding", "gzip"),
        ]);
        assert!(c.put(key("/simple/a/"), &ok, Bytes::from_static(b"one")));
        let got = c.get(&key("/simple/a/"), None).unwrap();
        assert_eq!(&got.doc[..], b"one");
        assert!(got.headers.get(header::ETAG).is_none());
        assert!(got.headers.get(header::CONTENT_ENCODING).is_none());
        assert_eq!(got.headers[header::CONTENT_TYPE], "text/html");
        assert!(c.get(&key("/simple/b/"), None).is_none());
        // Another exception, Accept or mirror is another copy.
        let mut other = key("/simple/a/");
        other.exception = "other".into();
        assert!(c.get(&other, None).is_none());
        let mut other = key("/simple/a/");
        other.accept = Some(Bytes::from_static(b"application/vnd.pypi.simple.v1+json"));
        assert!(c.get(&other, None).is_none());
        // A client asking for a fresh copy.
        assert!(c.get(&key("/simple/a/"), Some(Duration::ZERO)).is_none());
        assert!(c
            .get(&key("/simple/a/"), Some(Duration::from_secs(60)))
            .is_some());
        let aged = headers(&[("cache-control", "max-age=600"), ("age", "100")]);
        assert!(c.put(key("/simple/old/"), &aged, Bytes::from_static(b"old")));
        assert!(c
            .get(&key("/simple/old/"), Some(Duration::from_secs(60)))
            .is_none());
        assert!(c
            .get(&key("/simple/old/"), Some(Duration::from_secs(200)))
            .is_some());
        // The fresh answer replaces the kept one; one that may not be
        // kept drops it.
        assert!(c.put(key("/simple/a/"), &ok, Bytes::from_static(b"two")));
        assert_eq!(&c.get(&key("/simple/a/"), None).unwrap().doc[..], b"two");
        let no = headers(&[("cache-control", "no-store")]);
        assert!(!c.put(key("/simple/a/"), &no, Bytes::from_static(b"three")));
        assert!(c.get(&key("/simple/a/"), None).is_none());
    }

    #[test]
    fn the_store_stays_within_its_bytes() {
        let c = IndexCache::new();
        let ok = headers(&[("cache-control", "max-age=600")]);
        let doc = Bytes::from(vec![b'x'; MAX_DOC_BYTES]);
        let fit = MAX_KEPT_BYTES / MAX_DOC_BYTES;
        for i in 0..fit + 2 {
            assert!(c.put(key(&format!("/simple/p{i}/")), &ok, doc.clone()));
            // The first stays the most recently used.
            assert!(c.get(&key("/simple/p0/"), None).is_some(), "{i}");
        }
        let s = c.lock();
        assert!(s.bytes <= MAX_KEPT_BYTES);
        assert_eq!(s.map.len(), fit);
        drop(s);
        assert!(c.get(&key("/simple/p1/"), None).is_none());
        let too_big = Bytes::from(vec![b'x'; MAX_DOC_BYTES + 1]);
        assert!(!c.put(key("/simple/big/"), &ok, too_big));
    }
}
