//! What an intercepted HTTP/2 client causes counts against its share
//! (DESIGN "Bounds, backpressure and fairness"). Each stream in flight is
//! one more count against the client's `connections_per_client`, beside
//! its connection's own: a stream holds an upstream connection and a
//! response chunk on the client's behalf, so one connection's 100 streams
//! weigh as 100 connections ([`count`]). And a stream whose client keeps
//! its flow-control window shut while egressd holds data for it is reset
//! after `settings.limits.stall_timeout` ([`StreamExec`]): its upstream
//! connection and buffer are freed, not held for the idle timeout.
//!
//! A stall is seen where it happens: hyper asks a response body for its
//! next frame only once the client's window took the previous one, so a
//! body whose last frame has not been followed by a new ask for that long
//! is waiting on the client alone ([`Watched`]). hyper runs each HTTP/2
//! stream as a task of the executor it is given; [`StreamExec`] runs each
//! under a watch that drops the stream's task past the bound (h2 then
//! resets the stream, `CANCEL`), and marks why, so that the request's line
//! says so ([`reset_reason`]).
//!
//! Owns the stream counts and the stall watch. Does not own the share
//! (`shutdown::Permits`) or the request's line (`exchange`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Version};
use hyper::body::{Body, Frame, SizeHint};

use super::respond::{BoxError, ProxyBody, Stop};
use crate::metrics::Metrics;
use crate::policy::{Policy, Reason};
use crate::shutdown::{Extra, Permit};

/// HTTP/2 streams one client may have open in one intercepted connection
/// (advertised as `SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_STREAMS: u32 = 100;
/// Bytes hyper may buffer to send on one HTTP/2 stream.
pub const MAX_SEND_BUF: usize = 64 << 10;

tokio::task_local! {
    /// The stream whose task is running (set by [`StreamExec`]).
    static STREAM: Arc<Stream>;
}

/// One HTTP/2 stream's watch.
struct Stream {
    born: Instant,
    /// Milliseconds after `born` (plus one) when the response body last
    /// gave hyper a frame it has not asked past yet; 0 when none.
    handed: AtomicU64,
    /// Set when the watch reset the stream.
    reset: AtomicBool,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            born: Instant::now(),
            handed: AtomicU64::new(0),
            reset: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.born.elapsed().as_millis() as u64 + 1
    }

    /// How long the client has kept the last frame waiting, if it has.
    fn stalled_for(&self) -> Option<Duration> {
        match self.handed.load(Ordering::Relaxed) {
            0 => None,
            t => Some(Duration::from_millis(self.now().saturating_sub(t))),
        }
    }
}

/// hyper's executor for the HTTP/2 streams of intercepted connections:
/// each stream's task runs under the stall watch.
#[derive(Clone)]
pub(crate) struct StreamExec {
    pub stall: Duration,
    pub metrics: Arc<Metrics>,
}

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let stream = Arc::new(Stream::new());
        let task = STREAM.scope(stream.clone(), fut);
        tokio::spawn(watch(task, stream, self.stall, self.metrics.clone()));
    }
}

/// Runs `task` until it ends, or until its client has kept a frame
/// waiting for `stall`: then the task is dropped (with [`STREAM`] still
/// set, so the request's line can say why) and h2 resets the stream.
async fn watch<F: Future<Output = ()>>(
    task: F,
    stream: Arc<Stream>,
    stall: Duration,
    metrics: Arc<Metrics>,
) {
    tokio::pin!(task);
    loop {
        let wait = match stream.stalled_for() {
            Some(d) => stall.saturating_sub(d),
            None => stall,
        };
        tokio::select! {
            () = task.as_mut() => return,
            () = tokio::time::sleep(wait) => {
                if stream.stalled_for().is_some_and(|d| d >= stall) {
                    stream.reset.store(true, Ordering::Relaxed);
                    metrics.count_overload("streams", 1);
                    return;
                }
            }
        }
    }
}

/// Why the running stream's response ended early, when the stall watch
/// reset it (for the request's line); `None` elsewhere.
pub(crate) fn reset_reason() -> Option<String> {
    STREAM
        .try_with(|s| {
            s.reset.load(Ordering::Relaxed).then(|| {
                "stream reset: the client kept its flow-control window shut past \
                 settings.limits.stall_timeout"
                    .to_string()
            })
        })
        .ok()
        .flatten()
}

/// Counts an HTTP/2 request against its client's share, beside its
/// connection (whose permit the request carries): `overloaded` past it.
/// Other requests count as their connection does, and get `None`.
pub(crate) fn count<B>(
    req: &Request<B>,
    policy: &Policy,
    metrics: &Metrics,
) -> Result<Option<Extra>, Stop> {
    if req.version() != Version::HTTP_2 {
        return Ok(None);
    }
    let Some(permit) = req.extensions().get::<Permit>() else {
        return Ok(None);
    };
    let max = policy.settings.limits.connections_per_client;
    match permit.count_more(max) {
        Some(extra) => Ok(Some(extra)),
        None => {
            metrics.count_overload("streams", 1);
            let detail = format!(
                "this client already has {max} connections and HTTP/2 streams open, its share"
            );
            Err(Stop::Deny(Reason::Overloaded, Some(detail)))
        }
    }
}

/// `resp` with its body watched for stalls (within a stream's task) and
/// holding `share` until it ends.
pub(crate) fn watched(resp: Response<ProxyBody>, share: Option<Extra>) -> Response<ProxyBody> {
    let stream = STREAM.try_with(Arc::clone).ok();
    if stream.is_none() && share.is_none() {
        return resp;
    }
    resp.map(|inner| {
        ProxyBody::new(Watched {
            inner,
            stream,
            _share: share,
        })
    })
}

/// A response body on an HTTP/2 stream: notes when it gave hyper a frame
/// and when hyper asked again, and holds the stream's count.
struct Watched {
    inner: ProxyBody,
    stream: Option<Arc<Stream>>,
    _share: Option<Extra>,
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(s) = &self.stream {
            s.handed.store(0, Ordering::Relaxed);
        }
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Some(s), Poll::Ready(Some(Ok(f)))) = (&self.stream, &r) {
            if f.data_ref().is_some_and(|d| !d.is_empty()) {
                s.handed.store(s.now(), Ordering::Relaxed);
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
