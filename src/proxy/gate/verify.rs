//! A pinned download's sha256, checked as its body streams.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::packages::decide::PackageReason;
use crate::policy::{self, Mode};
use crate::proxy::respond::BoxError;
use crate::record::Event;

use super::*;

/// A download body checked against its set's sha256 pins as it streams:
/// the last frame is held back until the whole body has hashed, so a file
/// that does not match ends in an error (the client sees a cut transfer),
/// never as a complete body.
pub(crate) struct Verified<B> {
    inner: B,
    ctx: ring::digest::Context,
    pins: Vec<[u8; 32]>,
    held: Option<Frame<Bytes>>,
    finished: bool,
    /// Report mode: a mismatch is noted, the file still delivered.
    enforce: bool,
    /// [`INTEGRITY_UNKNOWN`], [`INTEGRITY_OK`] or [`INTEGRITY_MISMATCH`].
    pub(crate) outcome: Arc<AtomicU8>,
}

pub(crate) const INTEGRITY_UNKNOWN: u8 = 0;
pub(crate) const INTEGRITY_OK: u8 = 1;
pub(crate) const INTEGRITY_MISMATCH: u8 = 2;

impl<B> Verified<B> {
    pub(crate) fn new(inner: B, pins: Vec<[u8; 32]>, enforce: bool) -> Verified<B> {
        Verified {
            inner,
            ctx: ring::digest::Context::new(&ring::digest::SHA256),
            pins,
            held: None,
            finished: false,
            enforce,
            outcome: Arc::new(AtomicU8::new(INTEGRITY_UNKNOWN)),
        }
    }
}

impl<B> Body for Verified<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.finished {
                return Poll::Ready(this.held.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(d) = frame.data_ref() {
                        this.ctx.update(d);
                    }
                    if let Some(prev) = this.held.replace(frame) {
                        return Poll::Ready(Some(Ok(prev)));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => {
                    this.finished = true;
                    let digest = std::mem::replace(
                        &mut this.ctx,
                        ring::digest::Context::new(&ring::digest::SHA256),
                    )
                    .finish();
                    if this.pins.iter().any(|p| p[..] == *digest.as_ref()) {
                        this.outcome.store(INTEGRITY_OK, Ordering::Relaxed);
                    } else {
                        this.outcome.store(INTEGRITY_MISMATCH, Ordering::Relaxed);
                        if !this.enforce {
                            continue;
                        }
                        this.held = None;
                        return Poll::Ready(Some(Err(
                            "the file does not match its sha256 pin (package_integrity_mismatch)"
                                .into(),
                        )));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Notes in a download's line that its body did not match its pins (the
/// transfer was cut): the line's decision becomes that denial.
pub(crate) fn note_integrity(ev: &mut Event, outcome: u8, mode: Mode) {
    if outcome != INTEGRITY_MISMATCH {
        return;
    }
    let reason = PackageReason::IntegrityMismatch;
    // The exception that allowed the host stays named: the file, not the
    // host, was refused.
    ev.decision = policy::Logged::Deny;
    ev.reason = line_reason(reason);
    ev.mode = mode;
    if let Some(l) = ev.package.as_mut() {
        l.reason = Some(reason);
    }
    ev.error = Some("sha256 of the file matches no pin; transfer cut".into());
}
