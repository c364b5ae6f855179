//! The decision log as tests read it: a cursor that hands out one new line
//! per attempt, so that every attempt is pinned to exactly its own line,
//! and the assertions an attack makes about that line; and a FIFO to give
//! egressd as a log that fails on demand.
//!
//! Owns reading the log; not writing it (egressd's) nor the process
//! (`process.rs`).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use serde_json::Value;

use super::{eventually, scratch, try_request, Egressd, Scratch};

/// The decision log's complete lines. A line the writer is still writing
/// (no newline yet) is left for the next read: under load a reader can
/// see half of one.
pub fn complete_lines(e: &Egressd) -> Vec<Value> {
    let text = std::fs::read_to_string(&e.log_path).unwrap_or_default();
    parse_log(text.rfind('\n').map_or("", |i| &text[..=i]))
}

/// Every line of the decision log at `path`, parsed (none before the file
/// is there): `egressd serve`'s and `egressd run`'s alike.
pub fn read_log(path: &Path) -> Vec<Value> {
    parse_log(&std::fs::read_to_string(path).unwrap_or_default())
}

/// The lines of `text`, each a JSON object or a failed test.
fn parse_log(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("bad log line {l:?}: {err}")))
        .collect()
}

/// The lines that end an attempt: a short request's one line, or a
/// long-lived connection's close line, each close line checked to pair
/// with an open line (same `id`, host, port, exception, decision) before
/// it. Open lines are left out: an attempt is pinned to the line that
/// says how it ended.
pub fn ending_lines(e: &Egressd) -> Vec<Value> {
    ending(complete_lines(e))
}

/// [`ending_lines`] of lines read some other way.
pub fn ending(all: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::with_capacity(all.len());
    for (i, l) in all.iter().enumerate() {
        match l["event"].as_str() {
            Some("open") => continue,
            Some("close") => {
                let open = all[..i]
                    .iter()
                    .find(|o| o["event"] == "open" && o["id"] == l["id"])
                    .unwrap_or_else(|| panic!("a close line without its open line: {l}"));
                for k in ["proto", "host", "port", "exception", "decision", "reason"] {
                    assert_eq!(open[k], l[k], "{k} differs between {open} and {l}");
                }
            }
            _ => {}
        }
        out.push(l.clone());
    }
    out
}

/// Hands out decision-log lines one attempt at a time: [`Lines::one`] waits
/// for the next line and fails if more than one appeared, so every attempt
/// is pinned to exactly its own line (a long-lived connection's close
/// line, see [`ending_lines`]).
pub struct Lines<'a> {
    e: &'a Egressd,
    seen: usize,
}

impl<'a> Lines<'a> {
    pub fn new(e: &'a Egressd) -> Lines<'a> {
        Lines {
            e,
            seen: ending_lines(e).len(),
        }
    }

    /// The one line the last attempt produced.
    pub fn one(&mut self, what: &str) -> Value {
        let mut got = self.next_n(what, 1);
        got.pop().unwrap()
    }

    /// The next `n` lines (exactly `n` new ones).
    pub fn next_n(&mut self, what: &str, n: usize) -> Vec<Value> {
        let seen = self.seen;
        let all = eventually(&format!("{n} log line(s) for {what}"), || {
            let l = ending_lines(self.e);
            (l.len() >= seen + n).then_some(l)
        });
        assert_eq!(
            all.len(),
            seen + n,
            "{what}: expected exactly {n} new line(s), got {:#?}",
            &all[seen..]
        );
        self.seen = all.len();
        all[seen..].to_vec()
    }

    /// How many lines were there or handed out so far.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// No line beyond those handed out so far.
    pub fn done(&self, what: &str) {
        let l = ending_lines(self.e);
        assert_eq!(
            l.len(),
            self.seen,
            "{what}: unexpected extra lines {:#?}",
            &l[self.seen.min(l.len())..]
        );
    }
}

/// Asserts a line records a denial for `reason` (and `status`, when the
/// proxy answered one).
pub fn assert_denied_line(line: &Value, reason: &str, status: Option<u16>, what: &str) {
    assert_eq!(line["decision"], "deny", "{what}: {line}");
    assert_eq!(line["reason"], reason, "{what}: {line}");
    if let Some(s) = status {
        assert_eq!(line["status"], s, "{what}: {line}");
    }
}

/// Sends an attack and checks the answer: `status`, and for 403 the
/// `X-Egressd-Reason`; then its one log line and that line's reason.
pub fn refused(lines: &mut Lines, raw: &str, status: u16, reason: &str) -> Value {
    let what = raw.lines().next().unwrap_or(raw).to_string();
    let r = try_request(lines.e.proxy, raw.as_bytes())
        .unwrap_or_else(|| panic!("{what}: no response at all"));
    assert_eq!(r.status, status, "{what}: {}", r.text());
    if status == 403 {
        assert_eq!(r.reason(), Some(reason), "{what}");
    }
    let line = lines.one(&what);
    assert_denied_line(&line, reason, Some(status), &what);
    line
}

/// A FIFO for egressd's decision log: a sink the test can make fail
/// (the reader goes away: writes get EPIPE) and recover (a new reader).
pub struct LogFifo {
    pub path: PathBuf,
    _dir: Scratch,
}

pub fn log_fifo() -> LogFifo {
    let dir = scratch();
    let path = dir.path("log.fifo");
    assert!(Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap()
        .success());
    LogFifo { path, _dir: dir }
}

impl LogFifo {
    /// The path as egressd's `--log` takes it.
    pub fn arg(&self) -> &str {
        self.path.to_str().unwrap()
    }
    /// Opens the reading end in a thread (egressd's open for writing
    /// blocks until a reader exists); join it to get the open file.
    pub fn open_reader(&self) -> JoinHandle<File> {
        let path = self.path.clone();
        thread::spawn(move || File::open(path).unwrap())
    }
    /// A reader that keeps everything written, until egressd exits (so
    /// the pipe stays writable).
    pub fn collect(&self) -> Arc<Mutex<Vec<u8>>> {
        let got = Arc::new(Mutex::new(Vec::new()));
        let (path, g) = (self.path.clone(), got.clone());
        thread::spawn(move || {
            let mut file = File::open(path).unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    break;
                }
                g.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        got
    }
}
