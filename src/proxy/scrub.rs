//! The credential never comes back: on an exception with `inject`, the
//! exact values egressd added to the request are replaced in what flows
//! back to the client — response headers, and the body as it streams,
//! across read boundaries — so an origin that echoes request headers (a
//! debug endpoint, `TRACE`, an error page quoting the request) does not
//! hand the sandbox the credential it was never given.
//!
//! A value is replaced by as many `*` as it has bytes, so `Content-Length`
//! and every framing stay true. Besides each whole value, each of its
//! space-separated words of [`MIN_WORD`] bytes or more is replaced (the
//! token of `Bearer <token>`). Bodies are scanned as sent: a compressed body
//! (gzip, br) is not decoded, and what it holds is not seen.
//!
//! Owns the replacement and its line note; does not own which exception
//! applies (`exchange`).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Frame, SizeHint};

use crate::policy::Exception;
use crate::record::Event;

/// `TRACE` on an exception that injects: the origin would echo the
/// request, credential included. Refused, whatever the methods allow.
pub(crate) fn refuse_trace(
    method: &http::Method,
    exception: Option<&Exception>,
) -> Result<(), super::respond::Stop> {
    if method == http::Method::TRACE && exception.is_some_and(|e| !e.inject().is_empty()) {
        return Err(super::respond::Stop::Deny(
            crate::policy::Reason::MethodNotAllowed,
            Some("TRACE echoes the request, and this exception injects a credential".into()),
        ));
    }
    Ok(())
}

/// The shortest word of a value replaced on its own: shorter ones
/// (`Bearer`, `Basic`) are scheme names, not secrets.
const MIN_WORD: usize = 8;

/// The byte sequences to replace, longest first (a whole value before the
/// token inside it).
#[derive(Debug, Default)]
pub(crate) struct Secrets {
    values: Vec<Vec<u8>>,
    longest: usize,
    /// How many replacements were made, headers and body together.
    pub(crate) replaced: AtomicU64,
}

impl Secrets {
    /// The values `inject` adds, from the exception and the mirror's
    /// headers; `None` when nothing is injected.
    pub(crate) fn of<'a>(
        exception: Option<&'a Exception>,
        extra: impl IntoIterator<Item = &'a HeaderValue>,
    ) -> Option<Arc<Secrets>> {
        let mut values: Vec<Vec<u8>> = Vec::new();
        let injected = exception
            .into_iter()
            .flat_map(|e| e.inject().iter().map(|h| &h.value))
            .chain(extra);
        for v in injected {
            let v = v.as_bytes();
            let mut add = |b: &[u8]| {
                if !b.is_empty() && !values.iter().any(|x| x == b) {
                    values.push(b.to_vec());
                }
            };
            add(v);
            for w in v.split(|&c| c == b' ').filter(|w| w.len() >= MIN_WORD) {
                add(w);
            }
        }
        if values.is_empty() {
            return None;
        }
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        let longest = values[0].len();
        Some(Arc::new(Secrets {
            values,
            longest,
            replaced: AtomicU64::new(0),
        }))
    }

    /// Replaces every secret in `buf` in place; how many.
    fn replace_in(&self, buf: &mut [u8]) -> u64 {
        let mut n = 0;
        for v in &self.values {
            let mut i = 0;
            while i + v.len() <= buf.len() {
                // To the next place the value's first byte is.
                let Some(at) = buf[i..=buf.len() - v.len()].iter().position(|&b| b == v[0]) else {
                    break;
                };
                i += at;
                if buf[i..i + v.len()] == v[..] {
                    buf[i..i + v.len()].fill(b'*');
                    n += 1;
                    i += v.len();
                } else {
                    i += 1;
                }
            }
        }
        n
    }

    /// Replaces the secrets in every response header value.
    pub(crate) fn scrub_headers(&self, h: &mut HeaderMap) {
        let mut n = 0;
        for v in h.values_mut() {
            let mut b = v.as_bytes().to_vec();
            let k = self.replace_in(&mut b);
            if k > 0 {
                n += k;
                // Only visible ASCII replaced by '*': still a valid value.
                if let Ok(nv) = HeaderValue::from_bytes(&b) {
                    *v = nv;
                }
            }
        }
        self.replaced.fetch_add(n, Ordering::Relaxed);
    }

    /// The line's note, when something was replaced.
    pub(crate) fn note(&self, ev: &mut Event) {
        let n = self.replaced.load(Ordering::Relaxed);
        if n > 0 {
            ev.add_note(Some(format!(
                "injected credential echoed by the origin: replaced {n} time{} in the answer",
                if n == 1 { "" } else { "s" }
            )));
        }
    }
}

/// A response body with the secrets replaced as it streams. The last
/// `longest - 1` bytes of each chunk are held back until the next one (or
/// the end), so a value split across two reads is still found whole.
pub(crate) struct Scrubbed<B> {
    inner: B,
    secrets: Arc<Secrets>,
    held: BytesMut,
    /// Trailers that arrived while bytes were held: sent after them.
    trailers: Option<Frame<Bytes>>,
}

impl<B> Scrubbed<B> {
    pub(crate) fn new(inner: B, secrets: Arc<Secrets>) -> Scrubbed<B> {
        Scrubbed {
            inner,
            secrets,
            held: BytesMut::new(),
            trailers: None,
        }
    }

    /// Scans `held` (with `data` appended) and returns what may go out.
    fn pass(&mut self, data: &[u8], end: bool) -> Bytes {
        self.held.extend_from_slice(data);
        let n = self.secrets.replace_in(&mut self.held);
        self.secrets.replaced.fetch_add(n, Ordering::Relaxed);
        let keep = if end {
            0
        } else {
            self.held.len().min(self.secrets.longest - 1)
        };
        let out = self.held.len() - keep;
        self.held.split_to(out).freeze()
    }
}

impl<B> Body for Scrubbed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(t)));
        }
        loop {
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.pass(&data, false);
                        if out.is_empty() {
                            continue;
                        }
                        Poll::Ready(Some(Ok(Frame::data(out))))
                    }
                    Err(frame) => {
                        let frame = match frame.into_trailers() {
                            Ok(mut t) => {
                                this.secrets.scrub_headers(&mut t);
                                Frame::trailers(t)
                            }
                            Err(f) => f,
                        };
                        if this.held.is_empty() {
                            return Poll::Ready(Some(Ok(frame)));
                        }
                        // Trailers end the data: what is held goes first.
                        this.trailers = Some(frame);
                        Poll::Ready(Some(Ok(Frame::data(this.pass(&[], true)))))
                    }
                },
                Poll::Ready(None) if !this.held.is_empty() => {
                    let out = this.pass(&[], true);
                    Poll::Ready(Some(Ok(Frame::data(out))))
                }
                other => other,
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.trailers.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // The same number of bytes comes out as goes in.
        let mut h = self.inner.size_hint();
        let held = self.held.len() as u64;
        h.set_lower(h.lower() + held);
        if let Some(u) = h.upper() {
            h.set_upper(u + held);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body of the given chunks, one per poll.
    struct Chunks(Vec<Bytes>);
    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.0.is_empty() {
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Ok(Frame::data(self.0.remove(0)))))
        }
    }

    fn secrets(v: &str) -> Arc<Secrets> {
        let hv = HeaderValue::from_str(v).unwrap();
        Secrets::of(None, [&hv]).unwrap()
    }

    fn scrub(chunks: &[&str], s: &Arc<Secrets>) -> String {
        let body = Chunks(
            chunks
                .iter()
                .map(|c| Bytes::copy_from_slice(c.as_bytes()))
                .collect(),
        );
        let body = Scrubbed::new(body, s.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt.block_on(body.collect()).unwrap().to_bytes();
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn values_split_across_reads_are_replaced_and_the_length_kept() {
        let s = secrets("Bearer tok-1234567890");
        let out = scrub(
            &["ab Bearer tok-12", "3456", "7890 and tok-1234567890", "!"],
            &s,
        );
        let (whole, token) = ("*".repeat(21), "*".repeat(14));
        assert_eq!(out, format!("ab {whole} and {token}!"));
        assert_eq!(s.replaced.load(Ordering::Relaxed), 2);
        let s = secrets("short");
        assert_eq!(scrub(&["sho", "rt", "x"], &s), "*****x");
    }

    /// The cost on a 10 MB answer in 16 KiB reads, against passing the
    /// same reads through: `cargo test --lib scrub_cost -- --ignored
    /// --nocapture` (the figure in docs/security.md).
    #[test]
    #[ignore]
    fn scrub_cost_on_a_10_mb_answer() {
        let chunk = Bytes::from(
            (0..16 * 1024)
                .map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789 Bearer t\n"[i % 46])
                .collect::<Vec<u8>>(),
        );
        let chunks = || Chunks(vec![chunk.clone(); 10 * 1024 * 1024 / chunk.len()]);
        let s = secrets("Bearer tok-1234567890abcdef");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let time = |f: &dyn Fn() -> usize| {
            let mut best = std::time::Duration::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                assert_eq!(f(), 10 * 1024 * 1024);
                best = best.min(t.elapsed());
            }
            best
        };
        let plain = time(&|| rt.block_on(chunks().collect()).unwrap().to_bytes().len());
        let scrubbed = time(&|| {
            let b = Scrubbed::new(chunks(), s.clone());
            rt.block_on(b.collect()).unwrap().to_bytes().len()
        });
        println!("10 MB in 16 KiB reads: passed through {plain:?}, scrubbed {scrubbed:?}");
    }

    #[test]
    fn header_values_are_replaced() {
        let s = secrets("Bearer tok-1234567890");
        let mut h = HeaderMap::new();
        h.insert("x-echo", HeaderValue::from_static("got tok-1234567890"));
        s.scrub_headers(&mut h);
        assert_eq!(h["x-echo"], format!("got {}", "*".repeat(14)).as_str());
    }
}
