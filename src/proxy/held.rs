//! A request body on its way upstream: streamed from the client as it
//! arrives, or held whole in memory because a rule had to read it before
//! anything was forwarded (a git push, DESIGN "Writes on allowed hosts"),
//! and, under an `upload:` budget, charged to it frame by frame: the
//! frame that would cross the budget is not passed on, the body fails
//! instead, and the request to the origin is aborted with it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// What bytes a client sends upstream are charged to (an `upload:`
/// budget, `proxy::upload`): `take` charges `n` bytes, or refuses them
/// when they would cross it, and then they must not go on.
pub trait Charge: Send + Sync {
    fn take(&self, n: u64) -> bool;
}

/// A request's budget, carried in its extensions to the connection it
/// may upgrade to (a WebSocket's bytes are charged too).
#[derive(Clone)]
pub(crate) struct Cap(pub Arc<dyn Charge>);

/// The error a stream or body gives when its bytes would cross their
/// budget: the connection or request is cut there.
pub const CUT: &str = "the upload budget is spent";

/// A body's error: the client's (hyper's) or a spent budget ([`CUT`]).
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The request body every upstream connection carries.
pub enum ReqBody {
    Stream(Incoming),
    /// Read whole and judged; `None` once sent.
    Held(Option<Bytes>),
    /// Charged to an upload budget as it goes.
    Charged(Box<ReqBody>, Arc<dyn Charge>),
    /// The bytes read to judge it (`None` once sent), then the rest as it
    /// arrives: a body past `body:`'s bound that a later exception without
    /// `body:` allows.
    Prefixed(Option<Bytes>, Incoming),
}

impl std::fmt::Debug for ReqBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReqBody::Stream(b) => f.debug_tuple("Stream").field(b).finish(),
            ReqBody::Held(b) => f.debug_tuple("Held").field(b).finish(),
            ReqBody::Charged(b, _) => f.debug_tuple("Charged").field(b).finish(),
            ReqBody::Prefixed(h, r) => f.debug_tuple("Prefixed").field(h).field(r).finish(),
        }
    }
}

impl ReqBody {
    pub fn held(b: Bytes) -> ReqBody {
        ReqBody::Held(Some(b))
    }

    /// The body's length when it is known before it is read: held, or
    /// framed by `Content-Length`.
    pub fn known_len(&self) -> Option<u64> {
        self.size_hint().exact()
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ReqBody::Stream(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(BodyError::from))),
            ReqBody::Held(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ReqBody::Charged(b, charge) => {
                let r = Pin::new(b.as_mut()).poll_frame(cx);
                if let Poll::Ready(Some(Ok(f))) = &r {
                    let n = f.data_ref().map_or(0, |d| d.len() as u64);
                    if n > 0 && !charge.take(n) {
                        return Poll::Ready(Some(Err(CUT.into())));
                    }
                }
                r
            }
            ReqBody::Prefixed(head, rest) => match head.take() {
                Some(h) => Poll::Ready(Some(Ok(Frame::data(h)))),
                None => Pin::new(rest)
                    .poll_frame(cx)
                    .map(|f| f.map(|r| r.map_err(BodyError::from))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Stream(b) => b.is_end_stream(),
            ReqBody::Held(b) => b.is_none(),
            ReqBody::Charged(b, _) => b.is_end_stream(),
            ReqBody::Prefixed(head, rest) => head.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Stream(b) => b.size_hint(),
            ReqBody::Held(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ReqBody::Held(None) => SizeHint::with_exact(0),
            ReqBody::Charged(b, _) => b.size_hint(),
            ReqBody::Prefixed(head, rest) => {
                let n = head.as_ref().map_or(0, |h| h.len() as u64);
                let r = rest.size_hint();
                let mut s = SizeHint::new();
                s.set_lower(r.lower() + n);
                if let Some(u) = r.upper() {
                    s.set_upper(u + n);
                }
                s
            }
        }
    }
}
