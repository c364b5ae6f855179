//! A request body on its way upstream: streamed from the client as it
//! arrives, or held whole in memory because a rule had to read it before
//! anything was forwarded (a git push, DESIGN "Writes on allowed hosts").

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// The request body every upstream connection carries.
#[derive(Debug)]
pub enum ReqBody {
    Stream(Incoming),
    /// Read whole and judged; `None` once sent.
    Held(Option<Bytes>),
}

impl ReqBody {
    pub fn held(b: Bytes) -> ReqBody {
        ReqBody::Held(Some(b))
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Stream(b) => Pin::new(b).poll_frame(cx),
            ReqBody::Held(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Stream(b) => b.is_end_stream(),
            ReqBody::Held(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Stream(b) => b.size_hint(),
            ReqBody::Held(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ReqBody::Held(None) => SizeHint::with_exact(0),
        }
    }
}
