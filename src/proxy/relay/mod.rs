//! Relaying bytes both ways between a client and a destination, and
//! metering them: the one place a tunnel's, an upgraded connection's or a
//! captured connection's bytes move, are counted, and time out when idle.
//!
//! Two ways to move them, named for what they do:
//! - [`tcp`]: two TCP sockets. Each burst of data starts with one read
//!   into a short-lived buffer and one write; a burst that fills it (bulk)
//!   goes on spliced socket → pipe → socket inside the kernel through pipes
//!   leased only while data flows ([`pipe`]), or copied when no pipe can be
//!   had. Writes the connection's log line once, however it ends.
//! - [`streams`]: any two streams (hyper's upgraded WebSocket connections),
//!   copied in user space.
//!
//! Both stop a connection on which nothing moved for [`IDLE_TIMEOUT`].
//! The meters ([`meter`]) count what each side carried. This module owns
//! no decision: what it relays has been allowed already.

pub(crate) mod meter;
pub(crate) mod pipe;

use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::record::{Event, Recorder};
use meter::{Activity, Charge, Metered};
use pipe::{Lease, PipePool};

/// A connection with no byte in either direction for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Copy buffer per direction of [`streams`].
const BUF: usize = 64 << 10;
/// Bytes read per wake-up while data flows, when a direction copies in
/// user space (no pipe could be made, or its sockets cannot be spliced).
const TCP_CHUNK: usize = 256 << 10;
/// The first read of every burst goes into a buffer this size, freed when
/// the burst ends. Most bursts of an interactive tunnel (a TLS flight, a
/// request, a streamed event) are well under it: one read and one write
/// move them, where a splice through a pipe takes five calls (fill, fill
/// again to learn the socket is dry, drain, and the lease's checks). A
/// read that fills it means more is coming, and the burst goes on spliced.
const FIRST_READ: usize = 16 << 10;

/// Runs `copy` until it ends, or until nothing has moved for
/// [`IDLE_TIMEOUT`] by `activity` (then `TimedOut`). A reset or broken
/// pipe is a normal end. `copy` comes pinned by the caller, so its state
/// is held once (a future taken by value and pinned here would be held
/// twice: as this future's argument and as its pinned local).
async fn until_idle<F>(mut copy: Pin<&mut F>, activity: &Activity) -> io::Result<()>
where
    F: Future<Output = io::Result<()>>,
{
    let result = loop {
        let remaining = IDLE_TIMEOUT.saturating_sub(activity.idle_for());
        if remaining.is_zero() {
            break Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout"));
        }
        tokio::select! {
            r = copy.as_mut() => break r,
            _ = tokio::time::sleep(remaining) => continue,
        }
    };
    normal_end(result)
}

/// The log line of a relayed connection, written exactly once: when the
/// relay ends, or, if its task is dropped first (egressd stopping with the
/// tunnel still open after the drain period), from `Drop`, with the bytes
/// counted so far.
struct RelayLine {
    ev: Option<Box<Event>>,
    rec: Recorder,
    up: AtomicU64,
    down: AtomicU64,
}

impl RelayLine {
    fn finish(&mut self, error: Option<String>) {
        if let Some(mut ev) = self.ev.take() {
            ev.bytes_up = self.up.load(Ordering::Relaxed);
            ev.bytes_down = self.down.load(Ordering::Relaxed);
            if error.is_some() {
                ev.error = error;
            }
            self.rec.record(*ev);
        }
    }
}

impl Drop for RelayLine {
    fn drop(&mut self) {
        self.finish(Some("egressd stopped while the tunnel was open".into()));
    }
}

/// Relays two TCP sockets ([`splice_or_copy`]) and records `ev` with the
/// bytes each way when the connection ends, however it ends. `already_up`:
/// bytes the client sent that were written to `b` before. With `cap` (an
/// `upload:` budget) what the client sends is copied in user space and
/// charged to it, and the tunnel is cut at the first read it refuses.
pub(crate) async fn tcp(
    a: TcpStream,
    b: TcpStream,
    already_up: u64,
    ev: Box<Event>,
    rec: Recorder,
    pipes: &PipePool,
    cap: Option<Arc<dyn Charge>>,
) {
    let mut line = RelayLine {
        ev: Some(ev),
        rec,
        up: AtomicU64::new(already_up),
        down: AtomicU64::new(0),
    };
    let result = match cap {
        None => splice_or_copy(a, b, &line.up, &line.down, pipes).await,
        // The first bytes (a ClientHello) went upstream when the tunnel was
        // judged: charged first, and the tunnel cut if they cross already.
        Some(cap) if already_up > 0 && !cap.take(already_up) => Err(io::Error::other(meter::CUT)),
        Some(cap) => {
            // Bytes cannot be charged as they pass inside the kernel.
            let (up, down, r) = streams(a, b, already_up, Some(cap)).await;
            line.up.store(up, Ordering::Relaxed);
            line.down.store(down, Ordering::Relaxed);
            r
        }
    };
    line.finish(result.err().map(|e| format!("tunnel: {e}")));
}

/// Moves bytes both ways between two TCP sockets, holding nothing while
/// idle: each direction waits for readability, then splices socket → pipe
/// → socket with a pipe leased from `pool` only while data keeps arriving
/// ([`pipe`]). Ten thousand idle tunnels cost their sockets and tasks, not
/// buffers or pipes. Counts bytes read from `a` into `up` and from `b` into
/// `down`.
async fn splice_or_copy(
    mut a: TcpStream,
    mut b: TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
    pool: &PipePool,
) -> io::Result<()> {
    let activity = Activity::new();
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let copy = pin!(async {
        tokio::try_join!(
            pump(&mut ar, &mut bw, pool, up, &activity),
            pump(&mut br, &mut aw, pool, down, &activity)
        )
        .map(|_| ())
    });
    until_idle(copy, &activity).await
}

/// How a burst of data on one direction ended.
#[derive(Debug, PartialEq, Eq)]
enum Burst {
    /// The source would block; everything read has been written.
    Dry,
    /// The source ended; everything read has been written.
    End,
    /// These sockets cannot be spliced; everything read has been written.
    Unsupported,
}

/// One direction: wait until `src` is readable, move what it has to `dst`,
/// and pass end-of-stream on as a half-close.
async fn pump(
    src: &mut ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    pool: &PipePool,
    count: &AtomicU64,
    activity: &Activity,
) -> io::Result<()> {
    let tick = || activity.touch();
    let mut can_splice = true;
    let mut bulk = false;
    loop {
        // Readiness polled in place: `readable()`'s future would add its
        // own state to every idle tunnel's task, per direction. A socket
        // keeps one read waker: this pump is its only reader.
        std::future::poll_fn(|cx| src.as_ref().poll_read_ready(cx)).await?;
        // The bursts are boxed: their state exists only while data flows,
        // so an idle tunnel's task stays small. A burst starts with a read
        // and a write, unless this direction's last burst was bulk: then it
        // is spliced from its first byte.
        let start = count.load(Ordering::Relaxed);
        if !bulk {
            if let Some(b) = Box::pin(copy_first(src, dst, count, &tick)).await? {
                if b == Burst::End {
                    dst.shutdown().await?;
                    return Ok(());
                }
                continue;
            }
        }
        let lease = if can_splice { pool.take().ok() } else { None };
        let burst = match lease {
            Some(lease) => match Box::pin(splice_burst(src, dst, lease, count, &tick)).await? {
                Burst::Unsupported => {
                    can_splice = false;
                    Box::pin(copy_burst(src, dst, count, &tick)).await?
                }
                b => b,
            },
            // No pipe to be had (EMFILE, ENFILE): copy this burst, and try
            // for a pipe again on the next.
            None => Box::pin(copy_burst(src, dst, count, &tick)).await?,
        };
        bulk = count.load(Ordering::Relaxed) - start >= FIRST_READ as u64;
        if let Burst::End = burst {
            dst.shutdown().await?;
            return Ok(());
        }
    }
}

/// The first read of a burst, through a [`FIRST_READ`] buffer, and its
/// write: the burst's end (`Dry`: the read did not fill the buffer, so the
/// socket is drained, and tokio clears its readiness without another call;
/// `End`), or `None` when the buffer filled and more is likely waiting.
async fn copy_first(
    src: &mut ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    count: &AtomicU64,
    tick: &impl Fn(),
) -> io::Result<Option<Burst>> {
    let mut buf: Vec<u8> = Vec::with_capacity(FIRST_READ);
    // One read attempt, never a wait: readiness that turns out spurious
    // ends the burst (its buffer freed) and the pump waits again.
    let read = std::future::poll_fn(|cx| match pin!(src.read_buf(&mut buf)).poll(cx) {
        Poll::Ready(Ok(n)) => Poll::Ready(Ok(Some(n))),
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Ready(Ok(None)),
    })
    .await?;
    match read {
        None => return Ok(Some(Burst::Dry)),
        Some(0) => return Ok(Some(Burst::End)),
        Some(_) => {}
    }
    dst.write_all(&buf).await?;
    count.fetch_add(buf.len() as u64, Ordering::Relaxed);
    tick();
    Ok((buf.len() < FIRST_READ).then_some(Burst::Dry))
}

/// Splices what `src` has to `dst` through the leased pipe, until `src`
/// would block or ends and the pipe is empty again. Dropping the lease then
/// returns the pipe; an error or a cancelled task drops it with whatever it
/// still holds, which closes it.
async fn splice_burst(
    src: &ReadHalf<'_>,
    dst: &WriteHalf<'_>,
    mut lease: Lease<'_>,
    count: &AtomicU64,
    tick: &impl Fn(),
) -> io::Result<Burst> {
    let (from, to) = (src.as_ref(), dst.as_ref());
    let mut ended = false;
    loop {
        let mut dry = false;
        while !ended && !lease.full() {
            // With the pipe empty, WouldBlock can only mean the socket has
            // nothing: try_io then clears its readiness. With bytes in the
            // pipe it may mean the pipe is full, so readiness is left alone
            // (clearing it with data waiting would stall the direction).
            let r = if lease.held() == 0 {
                from.try_io(Interest::READABLE, || lease.fill_from(from.as_fd()))
            } else {
                lease.fill_from(from.as_fd())
            };
            match r {
                Ok(0) => ended = true,
                Ok(n) => {
                    count.fetch_add(n as u64, Ordering::Relaxed);
                    tick();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    dry = lease.held() == 0;
                    break;
                }
                Err(e) if pipe::unsupported(&e) => {
                    drain(&mut lease, dst, tick).await?;
                    return Ok(Burst::Unsupported);
                }
                Err(e) => return Err(e),
            }
        }
        while lease.held() > 0 {
            match to.try_io(Interest::WRITABLE, || lease.drain_to(to.as_fd())) {
                Ok(_) => tick(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if pipe::unsupported(&e) => {
                    write_out(&mut lease, dst, tick).await?;
                    return Ok(Burst::Unsupported);
                }
                Err(e) => return Err(e),
            }
        }
        if lease.held() > 0 {
            // `dst` is full: nothing moves until it drains.
            to.writable().await?;
        } else if ended {
            return Ok(Burst::End);
        } else if dry {
            return Ok(Burst::Dry);
        }
    }
}

/// Empties the pipe into `dst`, splicing, before a direction switches to
/// copying in user space.
async fn drain(lease: &mut Lease<'_>, dst: &WriteHalf<'_>, tick: &impl Fn()) -> io::Result<()> {
    let to = dst.as_ref();
    while lease.held() > 0 {
        match to.try_io(Interest::WRITABLE, || lease.drain_to(to.as_fd())) {
            Ok(_) => tick(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(e) if pipe::unsupported(&e) => return write_out(lease, dst, tick).await,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Empties the pipe into `dst` through memory: `dst` cannot be spliced to.
async fn write_out(lease: &mut Lease<'_>, dst: &WriteHalf<'_>, tick: &impl Fn()) -> io::Result<()> {
    let buf = lease.read_out()?;
    let to = dst.as_ref();
    let mut done = 0;
    while done < buf.len() {
        match to.try_write(&buf[done..]) {
            Ok(n) => {
                done += n;
                tick();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copies what `src` has to `dst` through a buffer that lives only for
/// this burst.
async fn copy_burst(
    src: &ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    count: &AtomicU64,
    tick: &impl Fn(),
) -> io::Result<Burst> {
    let mut buf: Vec<u8> = Vec::with_capacity(TCP_CHUNK);
    loop {
        buf.clear();
        match src.try_read_buf(&mut buf) {
            Ok(0) => return Ok(Burst::End),
            Ok(n) => {
                dst.write_all(&buf[..n]).await?;
                count.fetch_add(n as u64, Ordering::Relaxed);
                tick();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Burst::Dry),
            Err(e) => return Err(e),
        }
    }
}

/// A reset or broken pipe is how many peers end a connection: not an error.
fn normal_end(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e)
            if e.kind() == io::ErrorKind::ConnectionReset
                || e.kind() == io::ErrorKind::BrokenPipe =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Copies bytes both ways between `a` (the client side) and `b` in user
/// space until both directions end (half-close passes through) or nothing
/// moves for [`IDLE_TIMEOUT`]. Returns bytes read from `a` (plus
/// `already_up`), bytes read from `b`, and the error that ended it; a reset
/// or broken pipe is a normal end, not an error. With `cap` (an `upload:`
/// budget) what `a` sends is charged to it, and the copy is cut at the
/// first read it refuses (those bytes not passed on).
pub(crate) async fn streams<A, B>(
    a: A,
    b: B,
    already_up: u64,
    cap: Option<Arc<dyn Charge>>,
) -> (u64, u64, io::Result<()>)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity::new());
    let up = Arc::new(AtomicU64::new(already_up));
    let down = Arc::new(AtomicU64::new(0));
    // Bytes read from each side are the counts; what is written to one
    // side was read from the other, so the written counters go unused.
    let mut c =
        Metered::new(a, up.clone(), Arc::new(AtomicU64::new(0)), activity.clone()).capped(cap);
    let mut u = Metered::new(
        b,
        down.clone(),
        Arc::new(AtomicU64::new(0)),
        activity.clone(),
    );
    let copy = pin!(async {
        tokio::io::copy_bidirectional_with_sizes(&mut c, &mut u, BUF, BUF)
            .await
            .map(|_| ())
    });
    let result = until_idle(copy, &activity).await;
    (
        up.load(Ordering::Relaxed),
        down.load(Ordering::Relaxed),
        result,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::AsyncReadExt;

    use super::*;
    use tokio::net::TcpListener;

    /// Two connected sockets on 127.0.0.1: (the outside end, the end
    /// handed to the tunnel).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let out = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (inner, _) = l.accept().await.unwrap();
        (out, inner)
    }

    /// Deterministic bytes that differ at every offset of a chunk.
    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[0] ^ seed)
            .collect()
    }

    /// Sends `data` on `s`, half-closes, and reads to the end meanwhile.
    async fn exchange(s: TcpStream, data: Vec<u8>) -> Vec<u8> {
        let (mut r, mut w) = s.into_split();
        let send = async move {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
            w
        };
        let recv = async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let (_w, got) = tokio::join!(send, recv);
        got
    }

    /// Runs `splice_or_copy` between a client and a server that each send
    /// `n_up` / `n_down` bytes at once, and checks what arrived.
    async fn both_ways(pool: &PipePool, n_up: usize, n_down: usize) {
        let (client, a) = pair().await;
        let (server, b) = pair().await;
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let (sent_up, sent_down) = (pattern(1, n_up), pattern(2, n_down));
        let (r, at_server, at_client) = tokio::join!(
            splice_or_copy(a, b, &up, &down, pool),
            exchange(server, sent_down.clone()),
            exchange(client, sent_up.clone()),
        );
        r.unwrap();
        assert!(at_server == sent_up, "client → server bytes differ");
        assert!(at_client == sent_down, "server → client bytes differ");
        assert_eq!(up.load(Ordering::Relaxed), n_up as u64);
        assert_eq!(down.load(Ordering::Relaxed), n_down as u64);
    }

    #[tokio::test]
    async fn splices_both_ways_and_returns_the_pipes() {
        let pool = PipePool::new(8, pipe::PIPE_SIZE);
        both_ways(&pool, 8 << 20, (5 << 20) + 3).await;
        assert_eq!(pool.leased(), 0);
        assert!(pool.free_len() >= 1, "a pipe went back to the free list");
        assert_eq!(pool.open(), pool.free_len(), "no pipe closed or leaked");
        // Each burst's first read is copied; the bulk behind it is spliced.
        let spliced = pool.spliced.load(Ordering::Relaxed);
        assert!(spliced <= (13 << 20) + 3);
        assert!(
            spliced >= (13 << 20) / 2,
            "only {spliced} bytes went through a pipe"
        );
    }

    #[tokio::test]
    async fn copies_in_user_space_when_no_pipe_can_be_had() {
        let pool = PipePool::without_pipes();
        both_ways(&pool, (3 << 20) + 1, 2 << 20).await;
        assert_eq!(pool.open(), 0);
    }

    /// Both directions carry bulk (each message fills several first
    /// reads), then go quiet: each gives its pipe back.
    #[tokio::test]
    async fn an_idle_tunnel_holds_no_pipe() {
        const MSG: usize = 256 << 10;
        let pool = PipePool::new(8, pipe::PIPE_SIZE);
        let (mut client, a) = pair().await;
        let (mut server, b) = pair().await;
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let talk = async {
            for i in 0..8u8 {
                let msg = pattern(i, MSG);
                let (mut at_server, mut back) = (vec![0u8; MSG], vec![0u8; MSG]);
                let (w, r) =
                    tokio::join!(client.write_all(&msg), server.read_exact(&mut at_server));
                w.unwrap();
                r.unwrap();
                let (w, r) =
                    tokio::join!(server.write_all(&at_server), client.read_exact(&mut back));
                w.unwrap();
                r.unwrap();
                assert!(back == msg, "message {i} came back changed");
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool.leased() > 0 {
                assert!(Instant::now() < deadline, "an idle direction kept its pipe");
                tokio::task::yield_now().await;
            }
            assert!(pool.free_len() >= 1, "bulk went through no pipe");
            drop(client);
            drop(server);
        };
        let (r, ()) = tokio::join!(splice_or_copy(a, b, &up, &down, &pool), talk);
        r.unwrap();
        assert_eq!(up.load(Ordering::Relaxed), 8 * MSG as u64);
        assert_eq!(down.load(Ordering::Relaxed), 8 * MSG as u64);
        assert_eq!(pool.leased(), 0);
    }

    /// An interactive exchange (a request, its answer, turn by turn) moves
    /// every burst with one read and one write: no pipe is ever leased.
    #[tokio::test]
    async fn small_bursts_are_copied_without_a_pipe() {
        let pool = PipePool::new(8, pipe::PIPE_SIZE);
        let (mut client, a) = pair().await;
        let (mut server, b) = pair().await;
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let talk = async {
            for i in 0..20u8 {
                client.write_all(&[i; 1000]).await.unwrap();
                let mut got = [0u8; 1000];
                server.read_exact(&mut got).await.unwrap();
                server.write_all(&got).await.unwrap();
                client.read_exact(&mut got).await.unwrap();
                assert_eq!(got, [i; 1000]);
            }
            drop(client);
            drop(server);
        };
        let (r, ()) = tokio::join!(splice_or_copy(a, b, &up, &down, &pool), talk);
        r.unwrap();
        assert_eq!(up.load(Ordering::Relaxed), 20_000);
        assert_eq!(down.load(Ordering::Relaxed), 20_000);
        assert_eq!(pool.spliced.load(Ordering::Relaxed), 0);
        assert_eq!(pool.open(), 0, "a pipe was made for small bursts");
    }
}
