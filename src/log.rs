//! The decision-log sink. Lines are handed to one writer thread through a
//! bounded channel (a full channel makes the sender wait: backpressure, never
//! a silent drop). A failed write keeps the unwritten bytes, marks the sink
//! unhealthy (front-ends then answer 503 `log_unavailable`), counts the error
//! and says so on stderr; the writer retries until a write succeeds again.
//! SIGUSR1 (via [`LogSink::reopen`]) reopens the file for log rotation.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;

/// Lines queued for the writer before senders wait.
const CHANNEL_LINES: usize = 65_536;
/// Bytes kept while the sink is failing; beyond this, lines are counted as
/// lost and reported on stderr (memory must stay bounded).
const MAX_PENDING_BYTES: usize = 64 << 20;
/// How often a failing sink is retried.
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// While lines keep coming, the writer collects them on this tick instead
/// of sleeping on the channel: a parked receiver costs every sender a futex
/// wake, and the process two context switches and one write(2) per line.
const COALESCE: Duration = Duration::from_millis(1);
/// Empty ticks before the writer parks on the channel again (an idle
/// egressd does not wake every millisecond).
const IDLE_TICKS: u32 = 2;

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

/// What the writer thread receives.
enum Msg {
    Line(Vec<u8>),
    /// Wake up (to act on a reopen request).
    Wake,
    /// Write everything queued so far, then acknowledge.
    Flush(std::sync::mpsc::Sender<()>),
}

struct Shared {
    healthy: AtomicBool,
    reopen: AtomicBool,
    lost: AtomicU64,
}

/// Handle to the writer thread; cheap to clone.
#[derive(Clone)]
pub struct LogSink {
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
}

impl LogSink {
    /// Starts the writer thread. The thread ends when every handle is dropped,
    /// after writing what it holds.
    pub fn start(target: LogTarget, metrics: Arc<Metrics>) -> io::Result<LogSink> {
        let out = open(&target)?;
        let (tx, rx) = sync_channel(CHANNEL_LINES);
        let shared = Arc::new(Shared {
            healthy: AtomicBool::new(true),
            reopen: AtomicBool::new(false),
            lost: AtomicU64::new(0),
        });
        let s2 = shared.clone();
        std::thread::Builder::new()
            .name("egressd-log".into())
            .spawn(move || writer(target, out, rx, s2, metrics))?;
        Ok(LogSink { tx, shared })
    }

    pub fn healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Relaxed)
    }

    /// Queues one line (with its newline). Waits when the queue is full.
    pub fn write(&self, line: Vec<u8>) {
        if self.tx.send(Msg::Line(line)).is_err() {
            eprintln!("egressd: decision log writer has stopped; line lost");
        }
    }

    /// Asks the writer to reopen its file (log rotation).
    pub fn reopen(&self) {
        self.shared.reopen.store(true, Ordering::Relaxed);
        // Wake the writer so the reopen happens promptly.
        let _ = self.tx.try_send(Msg::Wake);
    }

    /// Waits until every line queued before this call has been written (or
    /// the writer has tried and failed), at most `timeout`. Used at shutdown
    /// so no line is lost when the process exits.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = std::sync::mpsc::channel();
        if self.tx.send(Msg::Flush(ack)).is_err() {
            return false;
        }
        done.recv_timeout(timeout).is_ok()
    }
}

enum Out {
    Stdout(io::Stdout),
    Stderr(io::Stderr),
    File(File),
}

impl Out {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Out::Stdout(s) => {
                let mut l = s.lock();
                let n = l.write(b)?;
                l.flush()?;
                Ok(n)
            }
            Out::Stderr(s) => {
                let mut l = s.lock();
                let n = l.write(b)?;
                l.flush()?;
                Ok(n)
            }
            Out::File(f) => f.write(b),
        }
    }
}

fn open(t: &LogTarget) -> io::Result<Out> {
    match t {
        LogTarget::Stdout => Ok(Out::Stdout(io::stdout())),
        LogTarget::Stderr => Ok(Out::Stderr(io::stderr())),
        LogTarget::File(p) => OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map(Out::File),
    }
}

fn writer(
    target: LogTarget,
    mut out: Out,
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
) {
    let mut pending: VecDeque<u8> = VecDeque::new();
    let mut batch: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut failing = false;
    let mut idle_ticks = IDLE_TICKS;
    loop {
        let wait = if failing {
            RETRY_EVERY
        } else {
            Duration::from_secs(3600)
        };
        let mut acks = Vec::new();
        let mut take = |m: Msg, batch: &mut Vec<u8>| match m {
            Msg::Line(l) => batch.extend_from_slice(&l),
            Msg::Wake => {}
            Msg::Flush(a) => acks.push(a),
        };
        let next = if !failing && idle_ticks < IDLE_TICKS {
            std::thread::sleep(COALESCE);
            rx.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            })
        } else {
            rx.recv_timeout(wait)
        };
        match next {
            Ok(m) => {
                idle_ticks = 0;
                take(m, &mut batch);
                while batch.len() < (1 << 20) {
                    match rx.try_recv() {
                        Ok(m) => take(m, &mut batch),
                        Err(_) => break,
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => idle_ticks = idle_ticks.saturating_add(1),
            Err(RecvTimeoutError::Disconnected) => {
                flush_pending(&mut out, &mut pending, &shared, &metrics, &mut failing);
                return;
            }
        }
        if shared.reopen.swap(false, Ordering::Relaxed) {
            match open(&target) {
                Ok(o) => out = o,
                Err(e) => eprintln!("egressd: cannot reopen decision log: {e}"),
            }
        }
        if pending.len() + batch.len() > MAX_PENDING_BYTES {
            let lines = bytecount_lines(&batch);
            shared.lost.fetch_add(lines, Ordering::Relaxed);
            eprintln!(
                "egressd: decision log unwritable and {MAX_PENDING_BYTES} bytes are already queued; {lines} lines lost ({} in all)",
                shared.lost.load(Ordering::Relaxed)
            );
            batch.clear();
        } else {
            pending.extend(batch.drain(..));
        }
        if failing && !pending.is_empty() {
            // Re-open before each retry: a deleted or rotated file, or a pipe
            // whose reader came back, may need a fresh descriptor.
            if let Ok(o) = open(&target) {
                out = o;
            }
        }
        flush_pending(&mut out, &mut pending, &shared, &metrics, &mut failing);
        for a in acks {
            let _ = a.send(());
        }
    }
}

fn flush_pending(
    out: &mut Out,
    pending: &mut VecDeque<u8>,
    shared: &Shared,
    metrics: &Metrics,
    failing: &mut bool,
) {
    while !pending.is_empty() {
        let (a, _) = pending.as_slices();
        match out.write(a) {
            Ok(0) => {
                fail(
                    shared,
                    metrics,
                    failing,
                    &io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes"),
                );
                return;
            }
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                fail(shared, metrics, failing, &e);
                return;
            }
        }
    }
    if *failing {
        eprintln!("egressd: decision log writable again; serving");
    }
    *failing = false;
    shared.healthy.store(true, Ordering::Relaxed);
}

fn fail(shared: &Shared, metrics: &Metrics, failing: &mut bool, e: &io::Error) {
    // Refuse new requests first; count and report after.
    shared.healthy.store(false, Ordering::Relaxed);
    metrics.log_write_errors.inc();
    if !*failing {
        eprintln!(
            "egressd: cannot write decision log: {e}; refusing new requests (503 log_unavailable) until it works"
        );
    }
    *failing = true;
}

fn bytecount_lines(b: &[u8]) -> u64 {
    b.iter().filter(|c| **c == b'\n').count() as u64
}
