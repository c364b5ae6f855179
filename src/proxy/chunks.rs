//! The bound on a chunked request body's size lines (DESIGN "Bounds"):
//! a chunk-size line, extensions included, of more than
//! [`MAX_CHUNK_LINE`] bytes fails the request (`400 malformed`). hyper
//! bounds only the extensions of a whole body, at 16 KiB, and keeps what
//! it reads of them; this bounds each line, before hyper buffers it.
//!
//! [`ChunkGuard`] wraps a client's stream under hyper's HTTP/1 server and
//! follows the requests' framing as the bytes go by: each request head
//! (only `Transfer-Encoding` and `Content-Length` matter), a body of
//! known length skipped by count, a chunked body line by line through its
//! trailers. Nothing is copied or allocated per read: a head line keeps a
//! fixed prefix, a body is a countdown. It stops looking once the
//! connection is no longer HTTP/1 requests: the HTTP/2 preface, or an
//! upgrade the service granted (`101`, a `2xx` to CONNECT), which it says
//! through [`ChunkGuard::upgraded`]. A tunnel that takes its socket back
//! from hyper unwraps the guard ([`ChunkGuard::into_inner`]).
//!
//! A line over the bound: the bytes before it are handed on, so that the
//! request's head reaches hyper whole, and the next read fails; hyper then
//! gives the request body an error, which the exchange answers `400`
//! with the request's line (`exchange`, "the request body: …").

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest chunk-size line accepted: the size and its extensions,
/// without the line end.
pub const MAX_CHUNK_LINE: usize = 4 << 10;

/// How much of a head line is kept to read a framing header's value.
const LINE_KEEP: usize = 128;

/// Why the read failed, as the request's line says.
const TOO_LONG: &str = "a chunk-size line (chunk extensions) over 4 KiB";
const TOO_BIG: &str = "a chunk size that does not fit 64 bits";

/// A client stream whose chunked request bodies have bounded size lines.
pub struct ChunkGuard<S> {
    inner: S,
    scan: Scan,
    upgraded: Arc<AtomicBool>,
    failed: Option<&'static str>,
}

impl<S> ChunkGuard<S> {
    pub fn new(inner: S) -> ChunkGuard<S> {
        ChunkGuard {
            inner,
            scan: Scan::default(),
            upgraded: Arc::new(AtomicBool::new(false)),
            failed: None,
        }
    }

    /// Set by the service when it grants an upgrade: the bytes after the
    /// answer are the upgraded protocol's, not requests.
    pub fn upgraded(&self) -> Arc<AtomicBool> {
        self.upgraded.clone()
    }

    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// Whether `status` in answer to a request with `method` hands the
/// connection over to another protocol.
pub fn is_upgrade(method: &http::Method, status: http::StatusCode) -> bool {
    status == http::StatusCode::SWITCHING_PROTOCOLS
        || (method == http::Method::CONNECT && status.is_success())
}

impl<S: AsyncRead + Unpin> AsyncRead for ChunkGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(why) = this.failed {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if this.scan.state == State::Pass || this.upgraded.load(Ordering::Acquire) {
            this.scan.state = State::Pass;
            return Poll::Ready(Ok(()));
        }
        if let Err((at, why)) = this.scan.feed(&buf.filled()[before..]) {
            this.failed = Some(why);
            if at == 0 {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
            }
            buf.set_filled(before + at);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ChunkGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A request head, line by line.
    Head,
    /// A body of known length: bytes still to come.
    Body(u64),
    /// A chunk-size line.
    Size,
    /// Chunk data: bytes still to come.
    Data(u64),
    /// The line end after chunk data.
    DataEnd,
    /// Trailer lines, up to the empty one.
    Trailer,
    /// Not HTTP/1 requests any more: nothing is looked at.
    Pass,
}

/// Where the requests' framing is, between reads.
struct Scan {
    state: State,
    /// Bytes of the current line, without CR and LF.
    line_len: usize,
    /// The first bytes of the current head line.
    line: [u8; LINE_KEEP],
    /// Whether the head being read has its request line yet.
    started: bool,
    /// The framing of the head being read.
    chunked: bool,
    length: u64,
    /// The current chunk-size line: its value, and whether its digits
    /// are still being read.
    size: u64,
    in_digits: bool,
}

impl Default for Scan {
    fn default() -> Scan {
        Scan {
            state: State::Head,
            line_len: 0,
            line: [0; LINE_KEEP],
            started: false,
            chunked: false,
            length: 0,
            size: 0,
            in_digits: true,
        }
    }
}

impl Scan {
    /// Follows `bytes`; on a line over the bound, where it starts being
    /// too long (the bytes before it are fine to hand on) and why.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), (usize, &'static str)> {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Pass => return Ok(()),
                State::Body(n) | State::Data(n) => {
                    let take = n.min((bytes.len() - i) as u64);
                    i += take as usize;
                    let left = n - take;
                    self.state = match (self.state, left) {
                        (State::Body(_), 0) => State::Head,
                        (State::Body(_), _) => State::Body(left),
                        (_, 0) => State::DataEnd,
                        _ => State::Data(left),
                    };
                }
                State::DataEnd => {
                    if bytes[i] == b'\n' {
                        self.start_size();
                    }
                    i += 1;
                }
                State::Head => {
                    self.head_byte(bytes[i]);
                    i += 1;
                }
                State::Size => {
                    self.size_byte(bytes[i]).map_err(|why| (i, why))?;
                    i += 1;
                }
                State::Trailer => {
                    match bytes[i] {
                        b'\n' if self.line_len == 0 => self.state = State::Head,
                        b'\n' => self.line_len = 0,
                        b'\r' => {}
                        _ => self.line_len += 1,
                    }
                    i += 1;
                }
            }
        }
        Ok(())
    }

    fn start_size(&mut self) {
        self.state = State::Size;
        self.line_len = 0;
        self.size = 0;
        self.in_digits = true;
    }

    fn size_byte(&mut self, b: u8) -> Result<(), &'static str> {
        match b {
            b'\n' => {
                self.line_len = 0;
                self.state = match self.size {
                    0 => State::Trailer,
                    n => State::Data(n),
                };
                return Ok(());
            }
            b'\r' => return Ok(()),
            _ => {}
        }
        self.line_len += 1;
        if self.line_len > MAX_CHUNK_LINE {
            return Err(TOO_LONG);
        }
        if self.in_digits {
            match (b as char).to_digit(16) {
                Some(d) => {
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(u64::from(d)))
                        .ok_or(TOO_BIG)?;
                }
                None => self.in_digits = false,
            }
        }
        Ok(())
    }

    fn head_byte(&mut self, b: u8) {
        match b {
            b'\n' => self.end_head_line(),
            b'\r' => {}
            _ => {
                if self.line_len < LINE_KEEP {
                    self.line[self.line_len] = b;
                }
                self.line_len += 1;
            }
        }
    }

    fn end_head_line(&mut self) {
        let len = self.line_len;
        self.line_len = 0;
        let kept = &self.line[..len.min(LINE_KEEP)];
        if len == 0 {
            // Empty lines before a request line are allowed (RFC 9112
            // §2.2); after one, the head ends.
            if self.started {
                self.state = match (self.chunked, self.length) {
                    (true, _) => State::Size,
                    (false, 0) => State::Head,
                    (false, n) => State::Body(n),
                };
                if self.state == State::Size {
                    self.start_size();
                }
                self.started = false;
                self.chunked = false;
                self.length = 0;
            }
            return;
        }
        if !self.started {
            self.started = true;
            if kept.starts_with(b"PRI * HTTP/2.0") {
                self.state = State::Pass;
            }
            return;
        }
        let truncated = len > LINE_KEEP;
        if let Some(v) = value_of(kept, b"transfer-encoding") {
            let last = v.rsplit(|c| *c == b',').next().unwrap_or_default();
            // A value past what is kept: chunked if it says so anywhere,
            // so that a body is never taken for the next head.
            self.chunked = trim(last).eq_ignore_ascii_case(b"chunked")
                || (truncated && v.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked")));
        } else if let Some(v) = value_of(kept, b"content-length") {
            // Anything but one number is refused by hyper or the exchange
            // before a body is read.
            self.length = std::str::from_utf8(trim(v))
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        }
    }
}

/// The value of a header line named `name` (lower case), if it is one.
fn value_of<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = line.get(name.len()..)?;
    (line[..name.len()].eq_ignore_ascii_case(name) && rest.first() == Some(&b':'))
        .then(|| &rest[1..])
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end.max(start)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` bytes; the offset (from the start)
    /// where it failed, if it did.
    fn feed(text: &[u8], step: usize) -> (Scan, Option<usize>) {
        let mut s = Scan::default();
        for (k, piece) in text.chunks(step).enumerate() {
            if let Err((at, _)) = s.feed(piece) {
                return (s, Some(k * step + at));
            }
        }
        (s, None)
    }

    fn chunked(ext: usize) -> Vec<u8> {
        let mut t = b"POST /a HTTP/1.1\r\nHost: x\r\ntransfer-encoding:  Chunked \r\n\r\n".to_vec();
        t.extend_from_slice(
            format!("5;x={}\r\nhello\r\n0\r\nT: 1\r\n\r\n", "e".repeat(ext)).as_bytes(),
        );
        t
    }

    #[test]
    fn size_lines_are_bounded_wherever_the_reads_split() {
        for step in [1, 7, 4096, 1 << 20] {
            // "5;x=" and the extension: exactly the bound, then one over.
            let ok = [
                chunked(MAX_CHUNK_LINE - 4),
                b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            ]
            .concat();
            let (s, failed) = feed(&ok, step);
            assert_eq!((failed, s.state), (None, State::Head), "step {step}");
            let bad = chunked(MAX_CHUNK_LINE - 3);
            let at = bad.windows(2).position(|w| w == b"5;").unwrap();
            assert_eq!(feed(&bad, step).1, Some(at + MAX_CHUNK_LINE), "step {step}");
        }
        let zeros = format!(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{}5\r\nhello\r\n0\r\n\r\n",
            "0".repeat(MAX_CHUNK_LINE)
        );
        assert!(
            feed(zeros.as_bytes(), 100).1.is_some(),
            "leading zeros count too"
        );
    }

    #[test]
    fn bodies_of_known_length_and_pipelined_heads_are_skipped_by_count() {
        let long = "x".repeat(10_000);
        let t = format!(
            "\r\nPOST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n{long}GET / HTTP/1.1\r\nX: {long}\r\n\r\n",
            long.len()
        );
        let (s, failed) = feed(t.as_bytes(), 333);
        assert_eq!((failed, s.state), (None, State::Head));
        // A body that looks like a chunked head is data.
        let inner = format!("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{long}\r\n");
        let t = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n{inner}",
            inner.len()
        );
        assert_eq!(feed(t.as_bytes(), 1000).1, None);
    }

    #[test]
    fn http2_and_oversized_sizes() {
        let mut t = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        t.extend(std::iter::repeat_n(b'a', 10_000));
        let (s, failed) = feed(&t, 50);
        assert_eq!((failed, s.state), (None, State::Pass));
        let t = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n";
        assert!(feed(t, 5).1.is_some());
    }
}
