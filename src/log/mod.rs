//! The decision-log sink: owns getting every line to the log, or, when the
//! log will not take it, refusing new requests and showing the line on
//! stderr at exit. It does not build lines (`decision::Recorder` does) and
//! does not decide what is refused (the front-ends ask [`LogSink::healthy`]
//! before they forward anything).
//!
//! Lines go to one writer thread through one shared batch: a request's line
//! is written straight into it ([`LogSink::append`]), and the writer takes
//! the whole batch at once, at most [`COALESCE`] later while lines keep
//! coming. No line is a buffer of its own, and no line wakes the writer
//! unless it had gone idle. The batch is unbounded, its content bounded
//! here, by bytes and age, so a sender never waits (a tokio worker blocked
//! on a full queue would stall every connection it serves).
//! The sink stops taking lines in two ways, and both fail closed:
//!
//! - a **failure**: a write returns an error (disk full, closed pipe). The
//!   writer counts it, says so on stderr and retries every [`RETRY_EVERY`],
//!   reopening the file;
//! - a **stall**: nothing fails, but nothing is taken either (a FIFO or
//!   socket nobody reads, a hung disk). The oldest unwritten line ages past
//!   [`MAX_BACKLOG_AGE`], or the unwritten bytes pass [`MAX_BACKLOG_BYTES`].
//!   Both are read from atomics on the request path, so a writer thread that
//!   is itself stuck in `write(2)` still makes egressd refuse.
//!
//! Either way [`LogSink::healthy`] turns false and new requests get
//! `503 log_unavailable` until the sink takes lines again. Their own lines
//! are kept too, up to [`MAX_HELD_BYTES`]; past that a refusal's line is
//! counted, not kept (see [`LogSink::write_refusal`]). At exit
//! [`LogSink::finish`] gives the sink the drain time, then writes whatever
//! it has not taken to stderr, one line each behind [`UNWRITTEN_PREFIX`],
//! and prints their count: a record is never lost without being counted and
//! shown.
//!
//! FIFOs and pipes are written through a non-blocking descriptor of their
//! own, so the writer always knows exactly which bytes the sink took: a
//! line is either in the sink or on stderr, never both and never half. A
//! regular file, a socket or a terminal is written blocking; a write that
//! hangs there is shown on stderr at exit even if it completes later.
//! SIGUSR1 ([`LogSink::reopen`]) reopens the file for log rotation; a line
//! is never split across two files.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

pub mod chain;
pub mod verify;

use chain::Chain;

/// The oldest unwritten line may be this old before new requests are
/// refused: "at most 1 s of traffic" is held, measured by age (cheap to
/// check, and independent of the request rate).
pub const MAX_BACKLOG_AGE: Duration = Duration::from_secs(1);
/// Unwritten bytes past which new requests are refused, whatever their age
/// (a flood can queue more than this within a second).
pub const MAX_BACKLOG_BYTES: u64 = 16 << 20;
/// Unwritten bytes past which the line of a refusal made before the policy
/// (see [`LogSink::write_refusal`]) is counted instead of kept. Lines of
/// requests that were served are always kept: new ones are refused, so
/// they are bounded by the connections and queries in flight.
pub const MAX_HELD_BYTES: u64 = 2 * MAX_BACKLOG_BYTES;
/// What each line the log did not take is written behind on stderr at exit.
pub const UNWRITTEN_PREFIX: &str = "egressd: unwritten decision: ";
/// How often a failing sink is retried.
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// How long the writer waits for a full pipe to take bytes before it
/// looks at the channel (and the exit) again. It is woken as soon as the
/// reader reads, so catching up runs at the reader's speed.
const STALL_POLL: Duration = Duration::from_millis(10);
/// While lines keep coming, the writer collects them on this tick instead
/// of sleeping on the channel: a parked receiver costs every sender a futex
/// wake, and the process two context switches and one write(2) per line.
const COALESCE: Duration = Duration::from_millis(10);
/// Empty ticks before the writer parks on the channel again (an idle
/// egressd does not wake on every tick).
const IDLE_TICKS: u32 = 2;
/// How long an idle writer sleeps on the channel (a line, a reopen or the
/// exit wakes it sooner).
const PARK: Duration = Duration::from_secs(3600);
/// Most bytes handed to one write(2) on a file.
const WRITE_CHUNK: usize = 1 << 20;
/// Most bytes handed to one write(2) on a pipe: whole lines up to
/// PIPE_BUF, which a non-blocking pipe takes whole or not at all, so a
/// reader never holds half a line when the writer stops (a single line
/// longer than this is written alone and may still be split).
const PIPE_CHUNK: usize = libc::PIPE_BUF;
/// How long the exit waits for a write already in flight to return before
/// it shows that write's lines on stderr anyway (a hung disk).
const CLOSE_GRACE: Duration = Duration::from_millis(100);
/// How often a request waiting for its line looks at the sink's health
/// again (a stall shows by age alone, with no event to wake on).
const SETTLE_POLL: Duration = Duration::from_millis(20);
/// How often [`LogSink::flush`] looks at the writer's progress.
const FLUSH_POLL: Duration = Duration::from_millis(2);

/// Why the sink refuses, besides the age of its oldest line (bits of
/// `Shared::refusing`).
const FAILING: u32 = 1;
const OVER_BYTES: u32 = 2;

#[derive(Clone, Debug)]
pub enum LogTarget {
    Stdout,
    Stderr,
    File(PathBuf),
}

impl LogTarget {
    /// `-` and `/dev/stdout` are stdout, `/dev/stderr` is stderr (written
    /// through the inherited descriptor: reopening `/dev/stderr` fails when
    /// it is a socket), anything else a file opened for appending.
    pub fn parse(s: &str) -> LogTarget {
        match s {
            "-" | "/dev/stdout" => LogTarget::Stdout,
            "/dev/stderr" => LogTarget::Stderr,
            _ => LogTarget::File(PathBuf::from(s)),
        }
    }
}

/// Whole lines the writer holds (one batch, each line with its newline),
/// and when it took them (see `Shared::now`): stamped there, once per
/// batch, so the request path reads no clock. Lines still in the shared
/// batch are younger than every line the writer holds, so the oldest
/// line's age is the backlog's.
struct Line {
    bytes: Vec<u8>,
    at: u64,
}

/// What the writer thread receives: a wake-up (a line for an idle writer,
/// a reopen request, the exit).
struct Wake;

/// The lines not yet taken by the writer, under `Shared::pending`.
#[derive(Default)]
struct Pending {
    batch: Vec<u8>,
    /// The writer is (about to be) asleep on the channel: the next line
    /// wakes it.
    parked: bool,
    /// `--log-chain`: seals each line as it is queued (the batch's order
    /// is the order written).
    chain: Option<Chain>,
    /// The final checkpoint was written (the exit seals once).
    sealed: bool,
}

/// Where a line ends in the sink's byte stream: it reached the kernel when
/// the sink's written bytes reach it (see [`LogSink::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ticket(u64);

/// The room a new batch starts with (the writer's, not a request's,
/// allocation).
const BATCH_ROOM: usize = 64 << 10;

/// What the request path, the writer and the exit share. The request path
/// touches only atomics.
struct Shared {
    /// `FAILING` and `OVER_BYTES`; zero when neither holds.
    refusing: AtomicU32,
    /// Since when the writer has not taken lines (`now()` units): when the
    /// oldest line it holds reached it, or when it went into an open(2)
    /// holding none; 0 when it holds none.
    head: AtomicU64,
    epoch: Instant,
    /// Bytes of every line ever queued, and of every line written whole
    /// (or shown on stderr at exit); the difference is the backlog.
    queued: AtomicU64,
    written: AtomicU64,
    /// A stall was seen and counted; cleared when the sink takes lines again.
    stall_noted: AtomicBool,
    /// Refusal lines counted instead of kept (past `MAX_HELD_BYTES`).
    not_kept: AtomicU64,
    /// Lines shown on stderr after the exit's drain, not yet reported.
    late: AtomicU64,
    reopen: AtomicBool,
    closed: AtomicBool,
    /// Lines queued and not yet taken by the writer.
    pending: Mutex<Pending>,
    state: Mutex<State>,
    /// Signalled when a write in flight returns after the exit began.
    settled: Condvar,
    metrics: Arc<Metrics>,
    /// The log's descriptor for writes from the request path (a regular
    /// file or a non-blocking pipe; `None` for a sink that could block,
    /// which only the writer thread writes). Whoever writes holds it: a
    /// request thread only with `try_lock`, so a write hung in the kernel
    /// never holds a request thread that wants to write too.
    direct: Mutex<Option<Arc<File>>>,
    /// A line a request thread wrote only in part (or not at all), and how
    /// much of it the sink took: the writer puts it first, under `direct`.
    leftover: Mutex<Option<(Line, usize)>>,
    /// Requests waiting for their line to be written ([`LogSink::settle`]).
    waiters: std::sync::atomic::AtomicUsize,
    notify: tokio::sync::Notify,
    /// The writer thread, unparked when a request waits for its line.
    writer: OnceLock<std::thread::Thread>,
}

/// The unwritten lines, under `Shared::state`: the writer takes lines from
/// here to write them; at exit the rest are taken from here to stderr.
struct State {
    rx: Receiver<Wake>,
    lines: VecDeque<Line>,
    /// Emptied batches, reused for the next ones.
    spare: Vec<Vec<u8>>,
    /// Bytes of the front line the sink has already taken.
    off: usize,
    /// The writer is inside write(2) with bytes of `lines` (unlocked).
    in_flight: bool,
    /// The exit took the lines: the writer must not touch them again.
    taken: bool,
}

impl Shared {
    /// A monotonic stamp; never 0 (0 means "no line" in `head`).
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn backlog(&self) -> u64 {
        let w = self.written.load(Ordering::Relaxed);
        self.queued.load(Ordering::Relaxed).saturating_sub(w)
    }

    /// Counts a stall once per episode (the writer may be stuck in
    /// write(2) and unable to count it itself).
    fn note_stall(&self) {
        if !self.stall_noted.load(Ordering::Relaxed)
            && !self.stall_noted.swap(true, Ordering::Relaxed)
        {
            self.metrics.log_write_errors.inc();
        }
    }

    /// Counts `n` lines shown on stderr instead of the log.
    fn lost(&self, n: u64) {
        self.metrics.log_lines_lost.inc_by(n);
    }

    /// Wakes requests waiting for their lines (after a write, or when the
    /// sink stops taking lines).
    fn wake_waiters(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    fn head_fresh(&self) -> bool {
        let head = self.head.load(Ordering::Relaxed);
        head == 0 || self.now().saturating_sub(head) <= MAX_BACKLOG_AGE.as_nanos() as u64
    }
}

/// Puts the calling thread (the writer) in `SCHED_BATCH`: the same share
/// of the CPU as the request threads, so it keeps pace with them under
/// load, but its wake-ups (one per [`COALESCE`] tick while lines come) do
/// not preempt a request being served; it runs when a request thread
/// waits. On a CPU shared with the proxy's runtime, a tick that preempted
/// the request in hand added the batch's `write(2)` to that request's
/// latency. Where the class is refused the writer runs as before.
fn batch_this_thread() {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain syscall on the calling thread (pid 0) with a valid,
    // initialised sched_param.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handle to the writer thread; cheap to clone.
#[derive(Clone)]
pub struct LogSink {
    tx: Sender<Wake>,
    shared: Arc<Shared>,
}

impl LogSink {
    /// Opens the target and starts the writer thread. A FIFO is opened
    /// when a reader has it open (the open waits for one, as a writer's
    /// open of a FIFO does).
    pub fn start(target: LogTarget, metrics: Arc<Metrics>) -> io::Result<LogSink> {
        let (sink, writer) = LogSink::parts(target, metrics)?;
        let t = std::thread::Builder::new()
            .name("egressd-log".into())
            .spawn(move || {
                batch_this_thread();
                writer.run()
            })?;
        let _ = sink.shared.writer.set(t.thread().clone());
        Ok(sink)
    }

    /// The handle and the writer, not yet running (tests drive the
    /// writer's steps by hand).
    fn parts(target: LogTarget, metrics: Arc<Metrics>) -> io::Result<(LogSink, Writer)> {
        let out = Out::open(&target, true)?;
        Ok(LogSink::with_out(target, out, metrics))
    }

    fn with_out(target: LogTarget, out: Out, metrics: Arc<Metrics>) -> (LogSink, Writer) {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared {
            refusing: AtomicU32::new(0),
            head: AtomicU64::new(0),
            epoch: Instant::now(),
            queued: AtomicU64::new(0),
            written: AtomicU64::new(0),
            stall_noted: AtomicBool::new(false),
            not_kept: AtomicU64::new(0),
            late: AtomicU64::new(0),
            reopen: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            pending: Mutex::new(Pending {
                batch: Vec::with_capacity(BATCH_ROOM),
                parked: false,
                chain: None,
                sealed: false,
            }),
            state: Mutex::new(State {
                rx,
                lines: VecDeque::new(),
                spare: Vec::new(),
                off: 0,
                in_flight: false,
                taken: false,
            }),
            settled: Condvar::new(),
            metrics,
            direct: Mutex::new(out.direct()),
            leftover: Mutex::new(None),
            waiters: Default::default(),
            notify: tokio::sync::Notify::new(),
            writer: OnceLock::new(),
        });
        let writer = Writer {
            target,
            out,
            shared: shared.clone(),
            buf: Vec::with_capacity(64 << 10),
            failing: false,
            blocked: false,
            idle_ticks: IDLE_TICKS,
            said_stall: false,
            said_not_kept: false,
            seen_not_kept: 0,
            retry_at: Instant::now(),
        };
        (LogSink { tx, shared }, writer)
    }

    /// Whether the sink takes lines: no write is failing, the oldest
    /// unwritten line is at most [`MAX_BACKLOG_AGE`] old and the backlog
    /// is under [`MAX_BACKLOG_BYTES`]. Front-ends ask before forwarding
    /// anything, so no request is served whose line could not be kept.
    pub fn healthy(&self) -> bool {
        let s = &*self.shared;
        if s.refusing.load(Ordering::Relaxed) != 0 {
            return false;
        }
        if s.head_fresh() {
            return true;
        }
        s.note_stall();
        false
    }

    /// Queues the line (with its newline) of a request that was served or
    /// decided by the policy. Never waits, and the line is always kept.
    pub fn write(&self, line: Vec<u8>) {
        self.append(false, |out| out.extend_from_slice(&line));
    }

    /// Queues the line of a refusal made before the policy (the log is
    /// unavailable, the client is over its share, the input is malformed):
    /// nothing was forwarded for it. Such lines arrive as fast as a client
    /// can send while the log is stalled, so past [`MAX_HELD_BYTES`] of
    /// unwritten lines one is counted (`egressd_log_write_errors_total`,
    /// and the exit's summary on stderr) instead of kept.
    pub fn write_refusal(&self, line: Vec<u8>) {
        self.append(true, |out| out.extend_from_slice(&line));
    }

    /// Queues the line `write_line` appends (one whole line with its
    /// newline), written straight into the shared batch: no buffer of its
    /// own. `refusal`: the line of a refusal made before the policy (see
    /// [`LogSink::write_refusal`]), shown on stderr and counted instead of
    /// kept past [`MAX_HELD_BYTES`]. Never waits for the writer.
    ///
    /// When the sink holds nothing else, the line is written here, by one
    /// write(2) from the calling thread (a regular file or a non-blocking
    /// pipe): the common case costs no hand-off to the writer and the line
    /// is in the kernel when this returns. Otherwise the writer writes it
    /// in order after the rest. The returned [`Ticket`] says, to
    /// [`LogSink::settle`], when it is written.
    pub fn append(&self, refusal: bool, write_line: impl FnOnce(&mut Vec<u8>)) -> Ticket {
        let s = &*self.shared;
        let mut p = lock(&s.pending);
        let start = p.batch.len();
        write_line(&mut p.batch);
        let len = (p.batch.len() - start) as u64;
        if refusal && s.backlog() + len > MAX_HELD_BYTES {
            let line = p.batch.split_off(start);
            drop(p);
            s.not_kept.fetch_add(1, Ordering::Relaxed);
            s.metrics.log_write_errors.inc();
            s.queued.fetch_add(len, Ordering::SeqCst);
            // Not kept, so shown now: a record is never lost unseen.
            let shown = show(
                s,
                &[Line { bytes: line, at: 0 }],
                0,
                &mut io::stderr().lock(),
            );
            s.lost(shown as u64);
            return Ticket(0);
        }
        if let Some(mut c) = p.chain.take() {
            c.seal(&mut p.batch, start);
            p.chain = Some(c);
        }
        let len = (p.batch.len() - start) as u64;
        // Under the batch's lock: either the writer parks after this line
        // is in (it sees the line and does not park), or before (it set
        // `parked`, and this wakes it).
        let queued = s.queued.fetch_add(len, Ordering::SeqCst) + len;
        let ticket = Ticket(queued);
        if start == 0 && queued - len == s.written.load(Ordering::SeqCst) {
            // Nothing else is unwritten: no line can be ahead of this one.
            if let Ok(fd) = s.direct.try_lock() {
                if let Some(f) = fd.as_ref().filter(|f| still_linked(f)) {
                    let f = f.clone();
                    return self.write_now(p, fd, &f, ticket);
                }
            }
        }
        let wake = std::mem::take(&mut p.parked);
        drop(p);
        if queued.saturating_sub(s.written.load(Ordering::Relaxed)) > MAX_BACKLOG_BYTES
            && s.refusing.load(Ordering::Relaxed) & OVER_BYTES == 0
        {
            s.refusing.fetch_or(OVER_BYTES, Ordering::Relaxed);
            s.note_stall();
        }
        if wake {
            // The receiver lives in `shared`, which this handle keeps alive.
            let _ = self.tx.send(Wake);
        }
        // After the exit's dump nobody writes the batch out: show the line
        // now. The fence pairs with the swap in `close`: either the dump
        // sees this line, or this sees `closed`.
        fence(Ordering::SeqCst);
        if s.closed.load(Ordering::Relaxed) {
            show_late(s);
        }
        ticket
    }

    /// The line alone in the batch, written from this thread. The batch's
    /// lock is let go before the write (a line queued meanwhile goes to
    /// the writer, which waits for `direct` before it writes). What the
    /// descriptor does not take is handed to the writer, whole line first.
    fn write_now(
        &self,
        mut p: MutexGuard<'_, Pending>,
        fd: MutexGuard<'_, Option<Arc<File>>>,
        f: &File,
        ticket: Ticket,
    ) -> Ticket {
        let s = &*self.shared;
        thread_local! {
            static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        LINE.with_borrow_mut(|line| {
            line.clear();
            line.extend_from_slice(&p.batch);
            p.batch.clear();
            drop(p);
            // An error is met again, and counted, by the writer.
            let n: usize = (&*f).write(line).unwrap_or_default();
            if n == line.len() {
                s.written.fetch_add(n as u64, Ordering::SeqCst);
                drop(fd);
                s.wake_waiters();
                return;
            }
            // The writer takes it from here (and meets the error itself):
            // this line goes before any queued since, and no other line
            // was unwritten (or written in part) when it was queued. Not
            // through `state`, which the writer holds while it sleeps.
            let at = s.now();
            *lock(&s.leftover) = Some((
                Line {
                    bytes: line.clone(),
                    at,
                },
                n,
            ));
            let _ = s
                .head
                .compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
            drop(fd);
            self.wake_writer();
            fence(Ordering::SeqCst);
            if s.closed.load(Ordering::SeqCst) {
                show_leftover(s);
            }
        });
        ticket
    }

    fn wake_writer(&self) {
        let _ = self.tx.send(Wake);
        if let Some(t) = self.shared.writer.get() {
            t.unpark();
        }
    }

    /// Whether the line of `ticket` is written (handed to the kernel).
    pub fn written(&self, ticket: Ticket) -> bool {
        self.shared.written.load(Ordering::SeqCst) >= ticket.0
    }

    /// Waits until the line of `ticket` is written; `false` if the sink
    /// stops taking lines first (failing, stalled or closed: the line is
    /// kept and shown at exit, and the caller must not complete the
    /// answer as if it were on record). Wakes the writer at once rather
    /// than on its tick.
    pub async fn settle(&self, ticket: Ticket) -> bool {
        if self.written(ticket) {
            return true;
        }
        let s = &*self.shared;
        s.waiters.fetch_add(1, Ordering::SeqCst);
        struct Waiting<'a>(&'a Shared);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.waiters.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _w = Waiting(s);
        self.wake_writer();
        loop {
            let n = s.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.written(ticket) {
                return true;
            }
            if !self.healthy() || s.closed.load(Ordering::SeqCst) {
                return false;
            }
            // Re-checked on a short tick too: a stall shows by age, with no
            // event to wake on.
            let _ = tokio::time::timeout(SETTLE_POLL, n).await;
        }
    }

    /// Makes this a chained log (`--log-chain`): from the next line on,
    /// each line is sealed (see [`chain`]). Call before the first line.
    pub fn set_chain(&self, c: Chain) {
        lock(&self.shared.pending).chain = Some(c);
    }

    /// Appends the chain's final checkpoint (a clean exit), once.
    fn seal_final(&self) {
        let mut p = lock(&self.shared.pending);
        if p.sealed {
            return;
        }
        p.sealed = true;
        let Some(mut c) = p.chain.take() else {
            return;
        };
        let start = p.batch.len();
        c.checkpoint(&mut p.batch, true);
        // Lines of connections cut after this still link on (and are
        // reported unsealed).
        p.chain = Some(c);
        let len = (p.batch.len() - start) as u64;
        self.shared.queued.fetch_add(len, Ordering::SeqCst);
        drop(p);
        self.wake_writer();
    }

    /// Asks the writer to reopen its file (log rotation).
    pub fn reopen(&self) {
        self.shared.reopen.store(true, Ordering::Relaxed);
        let _ = self.tx.send(Wake);
    }

    /// Waits until every line queued before this call has been written, at
    /// most `timeout`, and gives up sooner when the sink has taken nothing
    /// for [`MAX_BACKLOG_AGE`] (it is stalled or failing: waiting longer
    /// only delays the exit). Returns whether everything was written (or,
    /// after [`LogSink::finish`] closed the sink, shown).
    pub fn flush(&self, timeout: Duration) -> bool {
        let s = &*self.shared;
        let target = s.queued.load(Ordering::SeqCst);
        let start = Instant::now();
        let mut last = (s.written.load(Ordering::SeqCst), start);
        loop {
            let w = s.written.load(Ordering::SeqCst);
            if w >= target || s.closed.load(Ordering::SeqCst) {
                return true;
            }
            let now = Instant::now();
            if w != last.0 {
                last = (w, now);
            }
            if now - start >= timeout || now - last.1 >= MAX_BACKLOG_AGE {
                return false;
            }
            std::thread::sleep(FLUSH_POLL);
        }
    }

    /// The exit: gives the sink up to `drain` (see [`LogSink::flush`]) to
    /// take what is queued. If it took everything the sink stays open, so
    /// lines of connections cut later still reach it; otherwise the lines
    /// it has not taken go to stderr, each behind [`UNWRITTEN_PREFIX`],
    /// with their count, and every later line goes straight to stderr
    /// too. Called again after that, it reports the lines shown since.
    pub fn finish(&self, drain: Duration) {
        let s = &*self.shared;
        if s.closed.load(Ordering::SeqCst) {
            show_late(s);
            let late = s.late.swap(0, Ordering::Relaxed);
            if late > 0 {
                eprintln!(
                    "egressd: {late} more unwritten decision lines are above (queued after the drain)"
                );
            }
            return;
        }
        self.seal_final();
        if self.flush(drain) {
            return;
        }
        self.close(&mut io::stderr().lock());
    }

    /// Stops the writer, takes every line it has not written and writes
    /// them, then their count, to `err`.
    fn close(&self, err: &mut dyn Write) {
        let s = &*self.shared;
        if s.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.tx.send(Wake);
        let mut st = lock(&s.state);
        let grace = Instant::now() + CLOSE_GRACE;
        while st.in_flight {
            let Some(left) = grace.checked_duration_since(Instant::now()) else {
                break;
            };
            st = s
                .settled
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.taken = true;
        // What of the front batch the sink took is not shown again (but a
        // line it took only part of is shown whole).
        let mut off = st.off;
        let mut lines: Vec<Line> = Vec::new();
        // A line a request thread left goes before every other.
        if let Some((line, o)) = lock(&s.leftover).take() {
            lines.push(line);
            off = o;
        }
        lines.extend(st.lines.drain(..));
        drain_pending(s, &mut lines);
        drop(st);
        // No more writes from request threads; the descriptor closes with
        // the writer (a reader sees the end).
        if let Ok(mut d) = s.direct.try_lock() {
            *d = None;
        }
        let shown = show(s, &lines, off, err);
        s.lost(shown as u64);
        s.wake_waiters();
        // Says the prefix in other words, so `grep -c` of it counts lines.
        let _ = writeln!(
            err,
            "egressd: {shown} unwritten decision lines are above (the log did not take them within the drain time)"
        );
        let not_kept = s.not_kept.load(Ordering::Relaxed);
        if not_kept > 0 {
            let _ = writeln!(
                err,
                "egressd: {not_kept} lines of refusals made before the policy (nothing forwarded) were counted, not kept: the unwritten lines had reached {} MiB",
                MAX_HELD_BYTES >> 20
            );
        }
        let _ = err.flush();
    }
}

/// Takes the lines not yet taken by the writer.
fn drain_pending(s: &Shared, into: &mut Vec<Line>) {
    let mut p = lock(&s.pending);
    if !p.batch.is_empty() {
        into.push(Line {
            bytes: std::mem::take(&mut p.batch),
            at: 0,
        });
    }
}

/// Writes the lines of `batches` to `err`, each behind the prefix, from
/// the start of the line that holds byte `off` of the first; counts them
/// as taken. Returns how many lines it showed.
fn show(s: &Shared, batches: &[Line], off: usize, err: &mut dyn Write) -> usize {
    let mut out = io::BufWriter::new(err);
    let mut shown = 0;
    for (i, b) in batches.iter().enumerate() {
        let from = if i == 0 {
            b.bytes[..off.min(b.bytes.len())]
                .iter()
                .rposition(|&c| c == b'\n')
                .map_or(0, |n| n + 1)
        } else {
            0
        };
        for line in b.bytes[from..].split_inclusive(|&c| c == b'\n') {
            let _ = out.write_all(UNWRITTEN_PREFIX.as_bytes());
            let _ = out.write_all(line);
            if line.last() != Some(&b'\n') {
                let _ = out.write_all(b"\n");
            }
            shown += 1;
        }
        s.written.fetch_add(b.bytes.len() as u64, Ordering::SeqCst);
    }
    let _ = out.flush();
    shown
}

/// After the exit's dump: shows a line a request thread could not write.
fn show_leftover(s: &Shared) {
    let left = lock(&s.leftover).take();
    if let Some((line, off)) = left {
        let n = show(s, &[line], off, &mut io::stderr().lock());
        s.lost(n as u64);
    }
}

/// After the exit's dump: shows whatever reached the batch since.
fn show_late(s: &Shared) {
    let mut lines = Vec::new();
    drain_pending(s, &mut lines);
    if !lines.is_empty() {
        let n = show(s, &lines, 0, &mut io::stderr().lock());
        s.lost(n as u64);
        s.late.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// An open log: the descriptor and which file it is (a line is never split
/// across two files).
struct Out {
    file: Arc<File>,
    id: (u64, u64),
    pipe: bool,
}

impl Out {
    /// `first`: at start, a FIFO without a reader is waited for; later
    /// (retries, rotation) it is an error, so the writer never hangs in
    /// open(2).
    fn open(t: &LogTarget, first: bool) -> io::Result<Out> {
        let file = match t {
            LogTarget::Stdout => stdio(io::stdout().as_fd().try_clone_to_owned()?.into())?,
            LogTarget::Stderr => stdio(io::stderr().as_fd().try_clone_to_owned()?.into())?,
            LogTarget::File(p) => match open_nonblocking(p) {
                Err(e) if first && e.raw_os_error() == Some(libc::ENXIO) => {
                    // A FIFO nobody reads yet: wait for a reader, then take
                    // a non-blocking descriptor of our own.
                    let blocking = OpenOptions::new().create(true).append(true).open(p)?;
                    let nb = open_nonblocking(p)?;
                    drop(blocking);
                    nb
                }
                r => r?,
            },
        };
        let m = file.metadata()?;
        Ok(Out {
            file: Arc::new(file),
            id: (m.dev(), m.ino()),
            pipe: m.file_type().is_fifo(),
        })
    }

    /// The descriptor request threads may write themselves: a regular file
    /// or a pipe we opened non-blocking; not a socket or terminal, whose
    /// write(2) could hold a request thread.
    fn direct(&self) -> Option<Arc<File>> {
        let m = self.file.metadata().ok()?;
        let nonblocking = {
            use std::os::fd::AsRawFd;
            // SAFETY: F_GETFL on a descriptor `self.file` owns.
            let fl = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETFL) };
            fl >= 0 && fl & libc::O_NONBLOCK != 0
        };
        (m.is_file() || (self.pipe && nonblocking)).then(|| self.file.clone())
    }

    /// Waits until the descriptor takes bytes again, at most `d`.
    fn wait_writable(&self, d: Duration) {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: `p` is one initialised pollfd that lives across the call
        // (the count passed is 1), and its descriptor is owned by
        // `self.file`, open for the whole call. The result needs no check:
        // the next write says whether the pipe takes bytes.
        unsafe {
            libc::poll(&mut p, 1, d.as_millis() as libc::c_int);
        }
    }
}

/// Whether `f` is still the file at its path's inode (a regular file that
/// was deleted takes writes nobody will ever read). Not a path lookup: a
/// rotated (renamed) file still counts until SIGUSR1.
fn still_linked(f: &File) -> bool {
    f.metadata().map_or(true, |m| !m.is_file() || m.nlink() > 0)
}

/// Our own open file description, non-blocking: a full pipe answers
/// EAGAIN instead of holding the writer. (For regular files O_NONBLOCK
/// changes nothing.)
fn open_nonblocking(p: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
}

/// Stdout or stderr. A pipe gets a non-blocking description of its own
/// through /proc (setting O_NONBLOCK on the inherited one would change it
/// for every process sharing it, a sandboxed command included); anything
/// else is written through the inherited one, blocking.
fn stdio(dup: File) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    if dup.metadata()?.file_type().is_fifo() {
        let own = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", dup.as_raw_fd()));
        if let Ok(f) = own {
            return Ok(f);
        }
    }
    Ok(dup)
}

/// The writer thread's own state.
struct Writer {
    target: LogTarget,
    out: Out,
    shared: Arc<Shared>,
    /// The bytes of the write in flight, copied out of `State` so the exit
    /// can take the lines while a write hangs.
    buf: Vec<u8>,
    failing: bool,
    /// The last write would have blocked (a full pipe).
    blocked: bool,
    idle_ticks: u32,
    said_stall: bool,
    said_not_kept: bool,
    seen_not_kept: u64,
    /// When a failing sink is next retried.
    retry_at: Instant,
}

enum Wait {
    /// Lines are waiting: take what else came and write again.
    None,
    /// Sleep one coalescing tick first.
    Coalesce,
    /// Wait (unlocked) for the full pipe to take bytes again.
    Writable,
    /// Sleep on the channel at most this long.
    Channel(Duration),
}

impl Writer {
    fn run(mut self) {
        let shared = self.shared.clone();
        loop {
            let wait = {
                let st = lock(&shared.state);
                if st.taken || shared.closed.load(Ordering::SeqCst) {
                    return;
                }
                self.wait_for(!st.lines.is_empty())
            };
            match wait {
                // A request waiting for its line unparks it.
                Wait::Coalesce => std::thread::park_timeout(COALESCE),
                Wait::Writable => self.out.wait_writable(STALL_POLL),
                Wait::None | Wait::Channel(_) => {}
            }
            let disconnected = {
                let mut st = lock(&shared.state);
                let got = collect(&shared, &mut st, &wait);
                if shared.closed.load(Ordering::SeqCst) {
                    return;
                }
                match got {
                    Ok(true) => self.idle_ticks = 0,
                    Ok(false) => self.idle_ticks = self.idle_ticks.saturating_add(1),
                    Err(()) => {}
                }
                got.is_err()
            };
            self.maybe_reopen();
            let progress = self.write_once();
            self.report();
            if disconnected && (!progress || self.failing || self.blocked) {
                // Every handle is gone and the sink takes nothing more:
                // nobody will call `finish`, so show the rest now.
                let mut st = lock(&shared.state);
                if !st.lines.is_empty() {
                    let off = st.off;
                    let lines: Vec<Line> = st.lines.drain(..).collect();
                    st.taken = true;
                    drop(st);
                    let n = show(&shared, &lines, off, &mut io::stderr().lock());
                    shared.lost(n as u64);
                }
                return;
            }
        }
    }

    fn wait_for(&self, backlog: bool) -> Wait {
        if self.failing {
            let left = self.retry_at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Wait::None
            } else {
                Wait::Channel(left)
            }
        } else if self.blocked {
            Wait::Writable
        } else if backlog {
            Wait::None
        } else if self.idle_ticks < IDLE_TICKS {
            Wait::Coalesce
        } else {
            Wait::Channel(PARK)
        }
    }

    /// Reopens on SIGUSR1, and before each retry of a failing sink: a
    /// deleted or rotated file, or a FIFO whose reader came back, needs a
    /// fresh descriptor. Not under the state lock (open(2) can hang too).
    fn maybe_reopen(&mut self) {
        let asked = self.shared.reopen.swap(false, Ordering::Relaxed);
        let retry = self.failing && Instant::now() >= self.retry_at;
        if !asked && !retry {
            return;
        }
        // open(2) can hang as a write can (a dead NFS server): the lines
        // queued meanwhile are at most as old as this, and if it hangs,
        // requests are refused by that age.
        let front = lock(&self.shared.state).lines.front().map(|l| l.at);
        let since = front.unwrap_or_else(|| self.shared.now());
        self.shared.head.store(since, Ordering::Relaxed);
        match Out::open(&self.target, false) {
            Ok(o) => {
                if o.id != self.out.id {
                    // A new file starts with whole lines: the line the old
                    // file holds a fragment of is written again in full, and
                    // only that one (the front entry is a batch of lines, and
                    // those before it are already in the old file).
                    let mut st = lock(&self.shared.state);
                    let off = st.off;
                    st.off = st.lines.front().map_or(0, |f| {
                        f.bytes[..off]
                            .iter()
                            .rposition(|&b| b == b'\n')
                            .map_or(0, |i| i + 1)
                    });
                }
                self.out = o;
                *lock(&self.shared.direct) = self.out.direct();
            }
            Err(e) if asked => eprintln!("egressd: cannot reopen decision log: {e}"),
            Err(_) => {}
        }
    }

    /// One write(2) of the front of the backlog; whether it took bytes.
    fn write_once(&mut self) -> bool {
        let s = self.shared.clone();
        if !still_linked(&self.out.file) {
            // Deleted under egressd: a new file, or a failure (never
            // lines into a file nobody can read).
            s.reopen.store(true, Ordering::Relaxed);
            self.maybe_reopen();
            if !still_linked(&self.out.file) {
                let no = io::Error::new(io::ErrorKind::NotFound, "the log file was deleted");
                self.fail(&no);
                return false;
            }
        }
        // Request threads write only while holding this (see `direct`).
        let _direct = lock(&s.direct);
        {
            let mut st = lock(&s.state);
            if let Some((line, off)) = lock(&s.leftover).take() {
                if st.taken {
                    drop(st);
                    let n = show(&s, &[line], off, &mut io::stderr().lock());
                    s.lost(n as u64);
                    return false;
                }
                // Before every line queued after it; none of those has
                // been written (this thread could not, until now).
                debug_assert_eq!(st.off, 0);
                st.lines.push_front(line);
                st.off = off;
            }
            if st.lines.is_empty() || st.taken {
                self.publish(&st);
                return false;
            }
            if self.failing && Instant::now() < self.retry_at {
                self.publish(&st);
                return false;
            }
            self.buf.clear();
            let chunk = if self.out.pipe {
                PIPE_CHUNK
            } else {
                WRITE_CHUNK
            };
            fill(&mut self.buf, &st, chunk);
            self.publish(&st);
            st.in_flight = true;
        }
        let r = self.out.file.write(&self.buf);
        let mut st = lock(&s.state);
        st.in_flight = false;
        if st.taken {
            s.settled.notify_all();
            return false;
        }
        let took = self.took(&s, &mut st, r);
        self.publish(&st);
        if s.closed.load(Ordering::SeqCst) {
            s.settled.notify_all();
        }
        drop(st);
        s.wake_waiters();
        took
    }

    /// What one write(2) did, counted: whether it took bytes.
    fn took(&mut self, s: &Shared, st: &mut State, r: io::Result<usize>) -> bool {
        match r {
            Ok(0) => {
                self.fail(&io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes"));
                false
            }
            Ok(n) => {
                advance(s, st, n);
                self.blocked = false;
                if self.failing {
                    eprintln!("egressd: decision log writable again; serving");
                    self.failing = false;
                    s.refusing.fetch_and(!FAILING, Ordering::Relaxed);
                }
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.blocked = true;
                false
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            Err(e) => {
                self.fail(&e);
                false
            }
        }
    }

    /// Makes the backlog's age and size visible to the request path.
    fn publish(&self, st: &State) {
        let s = &*self.shared;
        s.head
            .store(st.lines.front().map_or(0, |l| l.at), Ordering::Relaxed);
        if s.backlog() <= MAX_BACKLOG_BYTES {
            s.refusing.fetch_and(!OVER_BYTES, Ordering::Relaxed);
            // A sender may have crossed the bound meanwhile: it sets the
            // bit again with its next line, this re-checks on every write.
            if s.backlog() > MAX_BACKLOG_BYTES {
                s.refusing.fetch_or(OVER_BYTES, Ordering::Relaxed);
            }
        }
    }

    fn fail(&mut self, e: &io::Error) {
        let s = &*self.shared;
        // Refuse new requests first; count and report after.
        s.refusing.fetch_or(FAILING, Ordering::Relaxed);
        s.metrics.log_write_errors.inc();
        if !self.failing {
            eprintln!(
                "egressd: cannot write decision log: {e}; refusing new requests (503 log_unavailable) until it works"
            );
        }
        self.failing = true;
        self.retry_at = Instant::now() + RETRY_EVERY;
        s.wake_waiters();
    }

    /// Says on stderr when a stall begins and ends, and when refusals
    /// start being counted instead of kept (once per episode each).
    fn report(&mut self) {
        let s = &*self.shared;
        let healthy = s.refusing.load(Ordering::Relaxed) == 0 && s.head_fresh();
        if s.stall_noted.load(Ordering::Relaxed) {
            if healthy {
                s.stall_noted.store(false, Ordering::Relaxed);
                if self.said_stall {
                    eprintln!("egressd: decision log takes lines again; serving");
                }
                self.said_stall = false;
            } else if !self.said_stall && !self.failing {
                eprintln!(
                    "egressd: decision log stalled: lines wait over {} s or over {} MiB; refusing new requests (503 log_unavailable) until it takes lines again",
                    MAX_BACKLOG_AGE.as_secs(),
                    MAX_BACKLOG_BYTES >> 20
                );
                self.said_stall = true;
            }
        }
        let not_kept = s.not_kept.load(Ordering::Relaxed);
        if not_kept > self.seen_not_kept && !self.said_not_kept {
            eprintln!(
                "egressd: decision log backlog at {} MiB: lines of refusals made before the policy are counted, not kept",
                MAX_HELD_BYTES >> 20
            );
            self.said_not_kept = true;
        }
        self.seen_not_kept = not_kept;
        if healthy {
            self.said_not_kept = false;
        }
    }
}

/// Moves the shared batch into the backlog, waiting as told (asleep on
/// the channel only with no line pending, woken by the next one).
/// `Ok(true)` when lines came, `Err` when every handle is gone.
fn collect(s: &Shared, st: &mut State, wait: &Wait) -> Result<bool, ()> {
    if st.taken {
        // The exit took the lines: later ones are shown by their senders.
        return Ok(false);
    }
    let mut disconnected = false;
    if let Wait::Channel(d) = wait {
        let park = {
            let mut p = lock(&s.pending);
            p.parked = p.batch.is_empty();
            p.parked
        };
        if park {
            match st.rx.recv_timeout(*d) {
                Ok(Wake) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => disconnected = true,
            }
        }
    }
    loop {
        match st.rx.try_recv() {
            Ok(Wake) => {}
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                disconnected = true;
                break;
            }
        }
    }
    let room = st
        .spare
        .pop()
        .unwrap_or_else(|| Vec::with_capacity(BATCH_ROOM));
    let mut bytes = {
        let mut p = lock(&s.pending);
        p.parked = false;
        std::mem::replace(&mut p.batch, room)
    };
    let got = !bytes.is_empty();
    if got {
        // While the sink is behind, what it holds should cost what the
        // bound counts (its length), not a batch's room. (Here, on the
        // writer thread, never on the request path.)
        if !st.lines.is_empty() {
            bytes.shrink_to_fit();
        }
        st.lines.push_back(Line { bytes, at: s.now() });
    } else {
        st.spare.push(bytes);
    }
    if disconnected {
        return Err(());
    }
    Ok(got)
}

/// Drops the `n` bytes the sink took from the front of the backlog.
/// Whole lines of the backlog (from `st.off` into its first) into `buf`,
/// up to `chunk` bytes (a longer line alone, whole).
fn fill(buf: &mut Vec<u8>, st: &State, chunk: usize) {
    let mut off = st.off;
    for l in &st.lines {
        let part = &l.bytes[off..];
        off = 0;
        let room = chunk.saturating_sub(buf.len());
        if part.len() <= room {
            buf.extend_from_slice(part);
            continue;
        }
        let end = match part[..room].iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None if buf.is_empty() => part
                .iter()
                .position(|&b| b == b'\n')
                .map_or(part.len(), |i| i + 1),
            None => 0,
        };
        buf.extend_from_slice(&part[..end]);
        break;
    }
}

fn advance(s: &Shared, st: &mut State, mut n: usize) {
    while n > 0 {
        let Some(front) = st.lines.front() else { break };
        let rest = front.bytes.len() - st.off;
        if n < rest {
            st.off += n;
            return;
        }
        n -= rest;
        st.off = 0;
        let len = front.bytes.len() as u64;
        if let Some(mut done) = st.lines.pop_front().map(|l| l.bytes) {
            if st.spare.len() < 2 && (BATCH_ROOM..=4 * BATCH_ROOM).contains(&done.capacity()) {
                done.clear();
                st.spare.push(done);
            }
        }
        s.written.fetch_add(len, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn line(i: usize) -> Vec<u8> {
        format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(200)).into_bytes()
    }

    fn fifo(dir: &Path) -> PathBuf {
        let p = dir.join("log.fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap()
            .success());
        p
    }

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The writer's class: batch, so its ticks do not preempt requests.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_writer_thread_runs_in_the_batch_class() {
        let class = std::thread::spawn(|| {
            batch_this_thread();
            // SAFETY: a query on the calling thread.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .unwrap();
        assert_eq!(class, libc::SCHED_BATCH);
    }

    /// A FIFO whose reader stops: the sink turns unhealthy by age, without
    /// any write failing; when the reader drains it, healthy again, and
    /// every line arrives whole and once.
    #[test]
    fn a_stalled_fifo_refuses_by_age_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let p = fifo(dir.path());
        let r = std::thread::spawn({
            let p = p.clone();
            move || File::open(p).unwrap()
        });
        let sink = LogSink::start(LogTarget::File(p), Metrics::new()).unwrap();
        let mut reader = r.join().unwrap();
        let mut n = 0;
        // Fill the pipe and then some: nobody reads.
        while sink.healthy() {
            sink.write(line(n));
            n += 1;
            if n % 512 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(n < 1_000_000, "never refused");
        }
        assert_eq!(
            sink.shared.refusing.load(Ordering::Relaxed),
            0,
            "a stall, not a failure"
        );
        assert!(
            sink.shared.metrics.log_write_errors.get() >= 1,
            "the stall is counted"
        );
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        let mut lines = 0;
        while lines < n {
            let k = reader.read(&mut buf).unwrap();
            assert!(k > 0, "the writer closed the pipe early");
            lines += buf[..k].iter().filter(|b| **b == b'\n').count();
            got.extend_from_slice(&buf[..k]);
        }
        until("healthy again", || sink.healthy());
        let text = String::from_utf8(got).unwrap();
        for (i, l) in text.lines().enumerate() {
            assert_eq!(l.as_bytes(), &line(i)[..line(i).len() - 1]);
        }
    }

    /// At exit, what the sink did not take is shown, once, with its count;
    /// together with what the reader got, that is every line.
    #[test]
    fn close_shows_every_line_the_sink_did_not_take() {
        let dir = tempfile::tempdir().unwrap();
        let p = fifo(dir.path());
        let r = std::thread::spawn({
            let p = p.clone();
            move || File::open(p).unwrap()
        });
        let sink = LogSink::start(LogTarget::File(p), Metrics::new()).unwrap();
        let mut reader = r.join().unwrap();
        let n = 2_000; // ~420 KiB: more than a pipe holds
        for i in 0..n {
            sink.write(line(i));
        }
        assert!(!sink.flush(Duration::from_millis(300)));
        let mut err = Vec::new();
        sink.close(&mut err);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap_or_default();
        drop(sink); // the writer's descriptor closes with it
        let err = String::from_utf8(err).unwrap();
        let shown: Vec<&str> = err
            .lines()
            .filter_map(|l| l.strip_prefix(UNWRITTEN_PREFIX))
            .collect();
        assert!(!shown.is_empty());
        assert!(
            err.contains(&format!(
                "egressd: {} unwritten decision lines",
                shown.len()
            )),
            "{err}"
        );
        let text = String::from_utf8(got).unwrap();
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "a half line in the pipe"
        );
        let all: Vec<&str> = text.lines().chain(shown.iter().copied()).collect();
        assert_eq!(all.len(), n);
        for (i, l) in all.iter().enumerate() {
            assert_eq!(l.as_bytes(), &line(i)[..line(i).len() - 1], "line {i}");
        }
    }

    /// Past the held bound, refusals are counted instead of kept, while a
    /// served request's line is still kept.
    #[test]
    fn refusals_past_the_held_bound_are_counted_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = fifo(dir.path());
        let r = std::thread::spawn({
            let p = p.clone();
            move || File::open(p).unwrap()
        });
        let metrics = Metrics::new();
        let sink = LogSink::start(LogTarget::File(p), metrics.clone()).unwrap();
        let _reader = r.join().unwrap();
        let l = line(0);
        let fit = (MAX_HELD_BYTES / l.len() as u64) as usize + 10;
        // More than the bound, even after a pipe's worth has been taken.
        for _ in 0..fit + 2_000 {
            sink.write_refusal(l.clone());
        }
        assert!(!sink.healthy(), "over the byte bound");
        let not_kept = sink.shared.not_kept.load(Ordering::Relaxed);
        assert!(not_kept >= 1_000, "{not_kept}");
        assert!(sink.shared.backlog() <= MAX_HELD_BYTES);
        let before = sink.shared.queued.load(Ordering::Relaxed);
        sink.write(l.clone());
        assert_eq!(
            sink.shared.queued.load(Ordering::Relaxed),
            before + l.len() as u64
        );
        assert!(metrics.log_write_errors.get() >= not_kept);
        let mut err = Vec::new();
        sink.close(&mut err);
        let err = String::from_utf8(err).unwrap();
        assert!(
            err.contains(&format!("egressd: {not_kept} lines of refusals")),
            "the count of lines not kept is printed"
        );
    }

    /// A failing sink (/dev/full) refuses and counts each failed write.
    #[test]
    fn a_failing_write_refuses_and_counts() {
        if !Path::new("/dev/full").exists() {
            eprintln!("skipped: no /dev/full");
            return;
        }
        let metrics = Metrics::new();
        let sink = LogSink::start(LogTarget::File("/dev/full".into()), metrics.clone()).unwrap();
        sink.write(line(0));
        until("refusing", || !sink.healthy());
        until("a retry counted", || metrics.log_write_errors.get() >= 2);
        let mut err = Vec::new();
        sink.close(&mut err);
        let err = String::from_utf8(err).unwrap();
        assert!(err.starts_with(UNWRITTEN_PREFIX), "{err}");
        assert!(err.contains("egressd: 1 unwritten decision lines"), "{err}");
    }

    /// A reopen while the front line is half written (the first 10 bytes
    /// are taken): on the same file the rest follows them; on a new file
    /// (rotation) the line is written again whole.
    #[test]
    fn a_line_is_never_split_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        let (sink, mut w) = LogSink::parts(LogTarget::File(p.clone()), Metrics::new()).unwrap();
        // Lines go through the writer here, not from this thread.
        let no_direct = || *lock(&sink.shared.direct) = None;
        no_direct();
        let cut = |n: usize| {
            no_direct();
            sink.write(line(n));
            let mut st = lock(&sink.shared.state);
            collect(&sink.shared, &mut st, &Wait::None).unwrap();
            st.off = 10;
        };
        cut(7);
        sink.reopen();
        w.maybe_reopen();
        assert!(w.write_once());
        assert_eq!(std::fs::read(&p).unwrap(), &line(7)[10..]);
        cut(8);
        std::fs::rename(&p, dir.path().join("a.log.1")).unwrap();
        sink.reopen();
        w.maybe_reopen();
        assert!(w.write_once());
        assert_eq!(std::fs::read(&p).unwrap(), line(8));
        assert!(lock(&sink.shared.state).lines.is_empty());
        assert!(sink.flush(Duration::from_secs(1)));
    }

    /// A rotation in the middle of a batch (its first line already in the
    /// old file, the second half written): the new file gets the second
    /// line whole and not the first again.
    #[test]
    fn a_rotation_mid_batch_does_not_write_taken_lines_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        let (sink, mut w) = LogSink::parts(LogTarget::File(p.clone()), Metrics::new()).unwrap();
        *lock(&sink.shared.direct) = None;
        sink.write(line(1));
        sink.write(line(2));
        {
            let mut st = lock(&sink.shared.state);
            collect(&sink.shared, &mut st, &Wait::None).unwrap();
            assert_eq!(st.lines.len(), 1, "both lines in one batch");
            st.off = line(1).len() + 10;
        }
        std::fs::rename(&p, dir.path().join("a.log.1")).unwrap();
        sink.reopen();
        w.maybe_reopen();
        assert!(w.write_once());
        assert_eq!(
            String::from_utf8(std::fs::read(&p).unwrap()).unwrap(),
            String::from_utf8(line(2)).unwrap()
        );
        assert!(sink.flush(Duration::from_secs(1)));
    }

    /// A sink written blocking (a socket, like a hung disk) whose peer stops
    /// reading: the writer is stuck inside write(2), yet requests are
    /// refused by the age of the oldest line, and at exit every line is
    /// shown or was taken (a write still hanging is shown in full).
    #[test]
    fn a_writer_stuck_in_write_still_refuses_and_shows_its_lines() {
        use std::os::unix::net::UnixStream;
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let file = File::from(std::os::fd::OwnedFd::from(ours));
        let m = file.metadata().unwrap();
        let out = Out {
            file: Arc::new(file),
            id: (m.dev(), m.ino()),
            pipe: false,
        };
        let (sink, w) = LogSink::with_out(LogTarget::Stderr, out, Metrics::new());
        std::thread::spawn(move || w.run());
        let mut n = 0;
        while sink.healthy() {
            sink.write(line(n));
            n += 1;
            if n % 256 == 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(n < 1_000_000, "never refused");
        }
        assert!(
            lock(&sink.shared.state).in_flight,
            "the writer is inside write(2)"
        );
        let mut err = Vec::new();
        sink.close(&mut err);
        peer.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(k) = peer.read(&mut buf) {
            if k == 0 {
                break;
            }
            got.extend_from_slice(&buf[..k]);
        }
        let err = String::from_utf8(err).unwrap();
        let shown: std::collections::HashSet<&str> = err
            .lines()
            .filter_map(|l| l.strip_prefix(UNWRITTEN_PREFIX))
            .collect();
        assert!(!shown.is_empty());
        let text = String::from_utf8_lossy(&got);
        let taken: std::collections::HashSet<&str> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| l.trim_end())
            .collect();
        for i in 0..n {
            let l = String::from_utf8(line(i)).unwrap();
            let l = l.trim_end();
            assert!(taken.contains(l) || shown.contains(l), "line {i} lost");
        }
    }
}
