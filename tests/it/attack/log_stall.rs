//! A decision log that stops taking lines (issue 14, item 1): a FIFO whose
//! reader stops reading, `/dev/full`, a full tmpfs. Traffic must never
//! leave without a record: egressd refuses (`503 log_unavailable`, DNS
//! `REFUSED`) once the unwritten lines are a second old, and at exit every
//! line the sink did not take is on stderr behind
//! `egressd: unwritten decision:`, with its count. Each test checks the
//! ledger: every request sent has exactly one line, in the sink or on
//! stderr, saying the status it got — so the `200`s never outnumber the
//! lines that reached the sink plus those shown.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use serde_json::Value;

use super::*;

const PREFIX: &str = "egressd: unwritten decision: ";

fn policy(host: &str, port: u16) -> String {
    format!(
        r#"
exceptions:
  - id: origin
    owner: t
    reason: the test origin
    hosts: [{host}]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
"#
    )
}

/// The requests a test sent, by path, with the status each got.
#[derive(Default)]
struct Sent {
    http: Vec<(String, u16)>,
}

impl Sent {
    /// `GET http://busy.test:PORT/rN` on a new connection: its status and
    /// `X-Egressd-Reason`.
    fn get(&mut self, e: &Egressd, port: u16) -> (u16, Option<String>) {
        let path = format!("/r{}", self.http.len());
        // The request whose line the log could not take has its answer
        // cut (DESIGN "The record holds": the last bytes wait for the
        // line): no answer, status 0; its line is kept all the same.
        let Some(r) = try_request(
            e.proxy,
            get_raw(&format!("http://busy.test:{port}{path}")).as_bytes(),
        ) else {
            self.http.push((path, 0));
            return (0, None);
        };
        self.http.push((path, r.status));
        let reason = r.reason().map(str::to_string);
        if r.status != 200 {
            assert_eq!(
                (r.status, reason.as_deref()),
                (503, Some("log_unavailable")),
                "{}",
                r.text()
            );
        }
        (r.status, reason)
    }

    fn served(&self) -> usize {
        self.http.iter().filter(|(_, s)| *s == 200).count()
    }
}

/// The lines egressd showed on stderr at exit (as written, and parsed),
/// once it has printed their count (which must match).
fn shown_on_stderr(e: &Egressd) -> (Vec<String>, Vec<Value>) {
    let counted = |err: &str| -> Option<usize> {
        let mut total = None;
        for l in err.lines() {
            let Some(rest) = l.strip_prefix("egressd: ") else {
                continue;
            };
            let (n, tail) = rest.split_once(' ')?;
            if tail.starts_with("unwritten decision lines")
                || tail.starts_with("more unwritten decision lines")
            {
                *total.get_or_insert(0) += n.parse::<usize>().ok()?;
            }
        }
        total
    };
    let (err, n) = eventually("the count of unwritten lines on stderr", || {
        let err = e.stderr_text();
        counted(&err).map(|n| (err, n))
    });
    let raw: Vec<String> = err
        .lines()
        .filter_map(|l| l.strip_prefix(PREFIX))
        .map(str::to_string)
        .collect();
    let shown = raw
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|x| panic!("shown line {l:?}: {x}")))
        .collect();
    assert_eq!(raw.len(), n, "the printed count\n{err}");
    (raw, shown)
}

/// Sends SIGTERM and waits for a clean exit.
fn stop(e: &mut Egressd) {
    e.signal("TERM");
    let status = eventually("egressd to exit", || e.child.try_wait().unwrap());
    assert!(status.success(), "{status:?}\n{}", e.stderr_text());
}

/// The complete lines of a sink's output, and what follows the last
/// newline (a line the sink took only part of).
fn split_lines(bytes: &[u8]) -> (Vec<Value>, String) {
    let text = String::from_utf8_lossy(bytes);
    let end = text.rfind('\n').map_or(0, |i| i + 1);
    let lines = text[..end]
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|x| panic!("sink line {l:?}: {x}")))
        .collect();
    (lines, text[end..].to_string())
}

/// The ledger: each HTTP request sent has exactly one line, in the sink or
/// shown, with the status it got; the `200`s are no more than the lines
/// that reached the sink plus those shown. Returns the lines by proto.
fn assert_ledger(sent: &Sent, sink: &[Value], shown: &[Value]) -> HashMap<String, usize> {
    let all: Vec<&Value> = sink.iter().chain(shown).collect();
    assert!(
        sent.served() <= all.len(),
        "{} answers 200, only {} lines in the sink and {} shown",
        sent.served(),
        sink.len(),
        shown.len()
    );
    let mut by_path: HashMap<&str, Vec<&Value>> = HashMap::new();
    let mut by_proto: HashMap<String, usize> = HashMap::new();
    for l in &all {
        *by_proto
            .entry(l["proto"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
        if l["proto"] == "http" {
            by_path
                .entry(l["path"].as_str().unwrap_or(""))
                .or_default()
                .push(l);
        }
    }
    for (path, status) in &sent.http {
        let lines = by_path.remove(path.as_str()).unwrap_or_default();
        assert_eq!(
            lines.len(),
            1,
            "{path} (answered {status}): lines {lines:?}"
        );
        // A cut answer (0: the log stopped before its line was written)
        // is on record as what the origin answered.
        let want = if *status == 0 { 200 } else { *status };
        assert_eq!(lines[0]["status"], want, "{path}: {}", lines[0]);
        if *status == 503 {
            assert_eq!(lines[0]["reason"], "log_unavailable", "{path}");
        }
    }
    assert!(
        by_path.is_empty(),
        "lines for requests never sent: {by_path:?}"
    );
    by_proto
}

/// The same refusal for CONNECT and DNS while the log is unavailable.
fn assert_connect_and_dns_refused(e: &Egressd, port: u16) {
    let r = try_request(
        e.proxy,
        connect_raw(&format!("busy.test:{port}")).as_bytes(),
    )
    .expect("an answer to CONNECT");
    assert_eq!((r.status, r.reason()), (503, Some("log_unavailable")));
    let r = ask_udp(e.dns, &dns_query("busy.test.", RecordType::A));
    assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    assert_eq!(
        ede_text(&r).map(|t| without_request_id(&t)).as_deref(),
        Some("egressd: log_unavailable")
    );
}

// ---------------------------------------------------------------- FIFO

const READ: u8 = 0;
const FEW_THEN_STOP: u8 = 1;
const STOPPED: u8 = 2;

/// The reading end of a FIFO, steered by the test: it reads, reads a few
/// lines and stops, or stops; it ends at EOF (egressd gone).
struct FifoReader {
    mode: Arc<AtomicU8>,
    got: Arc<Mutex<Vec<u8>>>,
    done: thread::JoinHandle<()>,
}

impl FifoReader {
    fn open(path: &Path) -> FifoReader {
        let mode = Arc::new(AtomicU8::new(FEW_THEN_STOP));
        let got = Arc::new(Mutex::new(Vec::new()));
        let done = thread::spawn({
            let (path, mode, got) = (path.to_path_buf(), mode.clone(), got.clone());
            move || {
                let mut f = File::open(path).unwrap();
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let m = mode.load(Ordering::SeqCst);
                    if m == STOPPED {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    // A few lines: one small read at a time.
                    let want = if m == FEW_THEN_STOP { 256 } else { buf.len() };
                    let n = f.read(&mut buf[..want]).unwrap();
                    if n == 0 {
                        return;
                    }
                    let mut g = got.lock().unwrap();
                    g.extend_from_slice(&buf[..n]);
                    if m == FEW_THEN_STOP && g.iter().filter(|b| **b == b'\n').count() >= 3 {
                        mode.store(STOPPED, Ordering::SeqCst);
                    }
                }
            }
        });
        FifoReader { mode, got, done }
    }

    fn set(&self, m: u8) {
        self.mode.store(m, Ordering::SeqCst);
    }

    /// Reads to EOF and returns everything the FIFO carried.
    fn finish(self) -> Vec<u8> {
        self.set(READ);
        self.done.join().unwrap();
        Arc::try_unwrap(self.got).unwrap().into_inner().unwrap()
    }
}

/// A FIFO whose reader reads a few lines and stops: `200`s stop within a
/// second of the pipe filling and `503 log_unavailable` takes over (for
/// CONNECT and DNS too); when the reader resumes, `200`s come back and the
/// refusals stop. The reader stops again and egressd gets SIGTERM: what it
/// held is shown on stderr, and with what the FIFO carried that is every
/// line, once. (Before: ~1,500 `200`s, 185 lines ever, the rest gone.)
#[test]
fn a_fifo_reader_that_stops_gets_refusals_and_loses_no_line() {
    let origin = raw_origin(ok_reply);
    let dns = fake_dns();
    dns.set("busy.test", &["127.0.0.1"]);
    let p = origin.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("log.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = FifoReader::open(&fifo);
    let mut e = egressd()
        .policy("p.yaml", &policy("busy.test", p))
        .dns(dns.addr)
        .log(fifo.to_str().unwrap())
        .start();
    let mut sent = Sent::default();

    // The reader stops after a few lines; keep sending until egressd
    // refuses. With the pipe full, that is at most a second of traffic.
    let end = Instant::now() + Duration::from_secs(8);
    let mut refused = 0;
    while refused < 50 {
        assert!(
            Instant::now() < end,
            "no 503 log_unavailable while the log was not read: {} answers 200",
            sent.served()
        );
        if sent.get(&e, p).0 == 503 {
            refused += 1;
        }
    }
    let reached = origin.requests().len();
    for _ in 0..20 {
        assert_eq!(sent.get(&e, p).0, 503, "served while stalled");
    }
    assert_eq!(
        origin.requests().len(),
        reached,
        "a request reached the origin while refused"
    );
    assert_connect_and_dns_refused(&e, p);
    assert!(e.metric("egressd_log_write_errors_total").unwrap() >= 1.0);

    // The reader resumes: the backlog drains and requests are served.
    reader.set(READ);
    eventually("a 200 once the reader resumed", || {
        (sent.get(&e, p).0 == 200).then_some(())
    });
    for _ in 0..100 {
        assert_eq!(sent.get(&e, p).0, 200, "refused after the reader resumed");
    }

    // The reader stops again; more than a pipe's worth is sent, then SIGTERM.
    reader.set(STOPPED);
    for _ in 0..400 {
        sent.get(&e, p);
    }
    stop(&mut e);
    let (_, shown) = shown_on_stderr(&e);
    let (sink, rest) = split_lines(&reader.finish());
    assert_eq!(rest, "", "the FIFO carried half a line");
    assert!(!shown.is_empty(), "nothing was held at exit");
    // Past a full pipe no answer completes before its line is written, so
    // fewer requests fit in the test's time than when answers ran ahead.
    assert!(
        sent.http.len() >= 500,
        "{} requests: the test drives too little",
        sent.http.len()
    );
    let by_proto = assert_ledger(&sent, &sink, &shown);
    assert_eq!(by_proto.get("connect"), Some(&1), "{by_proto:?}");
    assert_eq!(by_proto.get("dns"), Some(&1), "{by_proto:?}");
}

// ---------------------------------------------------------------- /dev/full

/// Every write fails: requests are refused (HTTP, CONNECT, DNS), the error
/// counter keeps rising while the writer retries, nothing reaches the
/// origin, and at exit every line is on stderr (the sink took none).
#[test]
fn dev_full_refuses_counts_and_shows_every_line_at_exit() {
    assert!(
        Path::new("/dev/full").exists(),
        "this test writes its log to /dev/full, which this machine lacks"
    );
    let origin = origin();
    let dns = fake_dns();
    dns.set("busy.test", &["127.0.0.1"]);
    let p = origin.addr.port();
    let mut e = egressd()
        .policy("p.yaml", &policy("busy.test", p))
        .dns(dns.addr)
        .log("/dev/full")
        .start();
    let mut sent = Sent::default();
    // The first line fails to write; from then on egressd refuses.
    eventually("503 log_unavailable", || {
        (sent.get(&e, p).0 == 503).then_some(())
    });
    let reached = origin.count();
    assert!(
        reached <= 1,
        "{reached} requests served on a log that takes nothing"
    );
    for _ in 0..20 {
        assert_eq!(sent.get(&e, p).0, 503);
    }
    assert_connect_and_dns_refused(&e, p);
    assert_eq!(origin.count(), reached);
    let errors = e.metric("egressd_log_write_errors_total").unwrap();
    assert!(errors >= 1.0);
    eventually("the error counter to rise (retries fail too)", || {
        (e.metric("egressd_log_write_errors_total")? > errors).then_some(())
    });
    stop(&mut e);
    let (_, shown) = shown_on_stderr(&e);
    let by_proto = assert_ledger(&sent, &[], &shown);
    assert_eq!(by_proto.get("connect"), Some(&1), "{by_proto:?}");
    assert_eq!(by_proto.get("dns"), Some(&1), "{by_proto:?}");
}

// ---------------------------------------------------------------- full tmpfs

/// A small tmpfs mounted for one test, unmounted when it ends.
struct Tmpfs {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs { _dir: dir, mnt })
    }

    /// Fills the file system: a filler file grows until ENOSPC.
    fn fill(&self) {
        let mut f = File::create(self.mnt.join("filler")).unwrap();
        let block = [0u8; 4096];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }

    fn free(&self) {
        std::fs::remove_file(self.mnt.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.mnt)
            .status();
    }
}

/// The log's file system fills up: refusals; space freed: the held lines
/// are written and requests served again; full again and SIGTERM: the
/// file plus stderr hold every line, once (a line the file took only part
/// of is shown whole).
#[test]
fn a_full_tmpfs_refuses_recovers_and_loses_no_line() {
    crate::support::need_root(
        "a_full_tmpfs_refuses_recovers_and_loses_no_line",
        "mounting a tmpfs",
    );
    let fs = Tmpfs::mount("256k").expect("mount a tmpfs (as root)");
    let log = fs.mnt.join("decisions.log");
    let origin = origin();
    let dns = fake_dns();
    dns.set("busy.test", &["127.0.0.1"]);
    let p = origin.addr.port();
    let mut e = egressd()
        .policy("p.yaml", &policy("busy.test", p))
        .dns(dns.addr)
        .log(log.to_str().unwrap())
        .start();
    let mut sent = Sent::default();
    let file_lines = || split_lines(&std::fs::read(&log).unwrap_or_default()).0;
    for _ in 0..5 {
        assert_eq!(sent.get(&e, p).0, 200);
    }
    eventually("five lines in the file", || {
        (file_lines().len() == 5).then_some(())
    });

    fs.fill();
    eventually("503 log_unavailable on a full file system", || {
        (sent.get(&e, p).0 == 503).then_some(())
    });
    let reached = origin.count();
    for _ in 0..10 {
        assert_eq!(sent.get(&e, p).0, 503);
    }
    assert_connect_and_dns_refused(&e, p);
    assert_eq!(origin.count(), reached);
    assert!(e.metric("egressd_log_write_errors_total").unwrap() >= 1.0);

    fs.free();
    eventually("200 once space is free", || {
        (sent.get(&e, p).0 == 200).then_some(())
    });
    let so_far = sent.http.len();
    eventually("every held line written", || {
        (file_lines().iter().filter(|l| l["proto"] == "http").count() == so_far).then_some(())
    });

    fs.fill();
    eventually("503 on the full file system again", || {
        (sent.get(&e, p).0 == 503).then_some(())
    });
    for _ in 0..10 {
        sent.get(&e, p);
    }
    stop(&mut e);
    let (raw, shown) = shown_on_stderr(&e);
    let (sink, rest) = split_lines(&std::fs::read(&log).unwrap());
    assert!(
        rest.is_empty() || raw.iter().any(|l| l.starts_with(&rest)),
        "the file ends in a fragment of no shown line: {rest:?}"
    );
    assert!(!shown.is_empty(), "nothing was held at exit");
    let by_proto = assert_ledger(&sent, &sink, &shown);
    assert_eq!(by_proto.get("connect"), Some(&1), "{by_proto:?}");
    assert_eq!(by_proto.get("dns"), Some(&1), "{by_proto:?}");
}
