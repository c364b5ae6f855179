//! Meters: streams and bodies that count the bytes they carry, and the
//! clock of a connection's last byte (for its idle timeout). Shared by
//! tunnels, intercepted TLS connections and forwarded request bodies.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

pub(crate) use crate::proxy::held::{Charge, CUT};

/// When bytes last moved on a connection, in either direction. Tokio's
/// clock, so that idle timeouts are testable with paused time.
pub(crate) struct Activity {
    started: Instant,
    /// Milliseconds after `started` of the last byte.
    last_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// A byte moved now.
    pub(crate) fn touch(&self) {
        self.last_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long nothing has moved.
    pub(crate) fn idle_for(&self) -> Duration {
        self.started
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// A stream that counts the bytes read from and written to it and notes
/// when the last one moved (for the idle timeout). Used by tunnels and by
/// intercepted TLS connections alike.
pub(crate) struct Metered<S> {
    inner: S,
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
    activity: Arc<Activity>,
    /// Bytes read are charged here first; refused ones are not passed on.
    cap: Option<Arc<dyn Charge>>,
}

impl<S> Metered<S> {
    /// `inner`, counting bytes read into `read` and written into `written`.
    pub(crate) fn new(
        inner: S,
        read: Arc<AtomicU64>,
        written: Arc<AtomicU64>,
        activity: Arc<Activity>,
    ) -> Metered<S> {
        Metered {
            inner,
            read,
            written,
            activity,
            cap: None,
        }
    }

    /// Charges every byte read to `cap`; a read it refuses ends the stream
    /// with an error ([`CUT`]) and its bytes are dropped.
    pub(crate) fn capped(mut self, cap: Option<Arc<dyn Charge>>) -> Metered<S> {
        self.cap = cap;
        self
    }

    fn touch(&self) {
        self.activity.touch();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 && self.cap.as_ref().is_some_and(|c| !c.take(n as u64)) {
            buf.set_filled(before);
            return Poll::Ready(Err(io::Error::other(CUT)));
        }
        if n > 0 {
            self.read.fetch_add(n as u64, Ordering::Relaxed);
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
            self.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that counts what it carries upstream.
pub struct Counted<B> {
    inner: B,
    counter: Arc<AtomicU64>,
    /// Set once the body failed (when asked for).
    failed: Option<Arc<AtomicBool>>,
}

impl<B> Counted<B> {
    pub(crate) fn new(inner: B, counter: Arc<AtomicU64>) -> Counted<B> {
        Counted {
            inner,
            counter,
            failed: None,
        }
    }

    /// Sets `flag` if the body fails: whoever reads it (a client sending
    /// it on) can then tell the body's failure from its own.
    pub(crate) fn flag_errors(mut self, flag: Arc<AtomicBool>) -> Counted<B> {
        self.failed = Some(flag);
        self
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.counter.fetch_add(d.len() as u64, Ordering::Relaxed);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(flag) = &self.failed {
                    flag.store(true, Ordering::Relaxed);
                }
            }
            _ => {}
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
