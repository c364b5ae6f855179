//! Log volume per client is bounded (DESIGN "Bounds, backpressure and
//! fairness"): a line's free-text fields have bounded lengths
//! ([`bound_fields`]), and past `settings.limits.log_lines_per_client_per_sec`
//! lines in one second, a client's further decisions that second are not
//! written one by one but summed ([`LogRate`]) into one
//! `"event":"rate_limited"` line, with counts by protocol, decision and
//! reason. Metrics still count every decision: the record stays complete as
//! counts, and a flood cannot fill the disk for the other clients.
//!
//! A client is the named client, else the source address (an IPv6 one by
//! its /64), as for its share of connections.
//!
//! Owns the per-client windows and the summary line. Does not own the
//! sink (`log`) or the per-decision line (`json`, `ocsf`).
//!
//! The rate is a token bucket: a client may write [`BURST_SECS`] seconds'
//! worth of lines at once (a package install's burst is kept line by
//! line), and then its rate; a flood is summarised from then on.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Event;
use crate::policy::{Logged, Proto, Reason, DEFAULT_LOG_LINES_PER_CLIENT_PER_SEC};
use crate::time::{format_rfc3339_millis, unix_now_millis};

/// Longest host, method, DNS name or package name and version written.
pub const MAX_LOGGED_NAME: usize = 256;
/// Longest path written (the front-ends cut it at the same length).
pub const MAX_LOGGED_PATH: usize = 2048;
/// Longest note or error written.
pub const MAX_LOGGED_TEXT: usize = 1024;
/// What a cut field ends with.
pub const CUT_MARKER: &str = "…";
/// How many seconds' worth of lines a client may write at once.
pub const BURST_SECS: u32 = 10;
/// Clients with a window open at once; past it the oldest windows are
/// closed (their summaries written) early. Bounds the table's memory.
const MAX_WINDOWS: usize = 65_536;

/// Cuts every free-text field of `ev` to its bound, with [`CUT_MARKER`].
pub fn bound_fields(ev: &mut Event) {
    cut_opt(&mut ev.host, MAX_LOGGED_NAME);
    cut_opt(&mut ev.method, MAX_LOGGED_NAME);
    cut_opt(&mut ev.path, MAX_LOGGED_PATH);
    cut_opt(&mut ev.qname, MAX_LOGGED_NAME);
    cut_opt(&mut ev.note, MAX_LOGGED_TEXT);
    cut_opt(&mut ev.error, MAX_LOGGED_TEXT);
    if let Some(p) = ev.package.as_deref_mut() {
        cut_opt(&mut p.name, MAX_LOGGED_NAME);
        cut_opt(&mut p.version, MAX_LOGGED_NAME);
    }
}

fn cut_opt(s: &mut Option<String>, max: usize) {
    if let Some(s) = s {
        cut(s, max);
    }
}

/// Cuts `s` to at most `max` bytes (on a character boundary) followed by
/// [`CUT_MARKER`]; a string within `max` is left as it is.
pub fn cut(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(CUT_MARKER);
}

/// Whose lines are counted together.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Named(Arc<str>),
    Addr(IpAddr),
}

impl Key {
    fn of(ev: &Event) -> Key {
        if &*ev.client != "-" {
            return Key::Named(ev.client.clone());
        }
        Key::Addr(match ev.src.ip() {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            },
            v4 => v4,
        })
    }
}

/// One client's bucket, and its current second's summary.
struct Window {
    /// The second (since the epoch) the summary counts.
    second: i64,
    /// Lines it may write now, and when that was reckoned.
    tokens: f64,
    at_ms: i64,
    /// The limit when the second began.
    limit: u32,
    /// Of the decisions not written one by one: the first one's time, its
    /// client and source, and counts by (proto, decision, reason).
    first_ms: i64,
    client: Arc<str>,
    src: IpAddr,
    suppressed: Vec<((Proto, Logged, Reason), u64)>,
}

impl Window {
    fn total(&self) -> u64 {
        self.suppressed.iter().map(|(_, n)| n).sum()
    }
}

/// The per-client windows. Cheap to share; one lock, held for a lookup.
pub struct LogRate {
    windows: Mutex<HashMap<Key, Window>>,
    /// The current limit (read from the serving policy at each new window).
    limit: Box<dyn Fn() -> u32 + Send + Sync>,
    /// The last second every closed window was swept.
    swept: AtomicU64,
}

impl Default for LogRate {
    fn default() -> Self {
        LogRate::new(Box::new(|| DEFAULT_LOG_LINES_PER_CLIENT_PER_SEC))
    }
}

/// A summary to write: a closed window with suppressed decisions.
pub struct Summary {
    first_ms: i64,
    client: Arc<str>,
    src: IpAddr,
    limit: u32,
    counts: Vec<((Proto, Logged, Reason), u64)>,
}

impl Summary {
    /// How many decisions it sums.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }

    /// The `"event":"rate_limited"` line, with its newline.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let counts: Vec<serde_json::Value> = self
            .counts
            .iter()
            .map(|((proto, decision, reason), n)| {
                serde_json::json!({
                    "proto": proto.as_str(),
                    "decision": decision.as_str(),
                    "reason": reason.as_str(),
                    "count": n,
                })
            })
            .collect();
        let line = serde_json::json!({
            "ts": format_rfc3339_millis(self.first_ms),
            "event": "rate_limited",
            "client": &*self.client,
            "src": self.src.to_string(),
            "limit_per_sec": self.limit,
            "suppressed": self.total(),
            "counts": counts,
        });
        // Writing a `Value` into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &line);
        out.push(b'\n');
    }
}

impl LogRate {
    /// Windows whose limit `limit` gives (called once per client per
    /// second, so it may read the serving policy).
    pub fn new(limit: Box<dyn Fn() -> u32 + Send + Sync>) -> LogRate {
        LogRate {
            windows: Mutex::default(),
            limit,
            swept: AtomicU64::new(0),
        }
    }

    /// Whether `ev` gets its own line: `false` once its client wrote its
    /// second's share, and then it is counted for that second's summary.
    /// Summaries of windows that closed are pushed to `out`.
    pub fn admit(&self, ev: &Event, now_ms: i64, out: &mut Vec<Summary>) -> bool {
        let second = now_ms.div_euclid(1000);
        let key = Key::of(ev);
        let mut map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if self.swept.load(Ordering::Relaxed) < second as u64 {
            self.swept.store(second as u64, Ordering::Relaxed);
            sweep(&mut map, second, out);
        }
        if !map.contains_key(&key) && map.len() >= MAX_WINDOWS {
            sweep(&mut map, i64::MAX, out);
        }
        let w = map.entry(key).or_insert_with(|| {
            let limit = (self.limit)();
            Window {
                second,
                tokens: capacity(limit),
                at_ms: now_ms,
                limit,
                first_ms: now_ms,
                client: ev.client.clone(),
                src: ev.src.ip(),
                suppressed: Vec::new(),
            }
        });
        if w.second != second {
            if let Some(s) = close(w) {
                out.push(s);
            }
            w.second = second;
            w.limit = (self.limit)();
        }
        refill(w, now_ms);
        if w.tokens >= 1.0 {
            w.tokens -= 1.0;
            return true;
        }
        if w.suppressed.is_empty() {
            w.first_ms = now_ms;
            w.client = ev.client.clone();
            w.src = ev.src.ip();
        }
        let k = (ev.proto, ev.decision, ev.reason);
        match w.suppressed.iter_mut().find(|(x, _)| *x == k) {
            Some((_, n)) => *n += 1,
            None => w.suppressed.push((k, 1)),
        }
        false
    }

    /// The summaries of every window that has closed by `now_ms` (all of
    /// them when `all`), for a ticker and for the end.
    pub fn closed(&self, now_ms: i64, all: bool) -> Vec<Summary> {
        let mut out = Vec::new();
        let before = if all {
            i64::MAX
        } else {
            now_ms.div_euclid(1000)
        };
        let mut map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        sweep(&mut map, before, &mut out);
        // A full bucket is what a new client gets: its window can go.
        map.retain(|_, w| {
            refill(w, now_ms);
            !(w.suppressed.is_empty() && w.tokens >= capacity(w.limit))
        });
        out
    }

    /// Decisions counted for summaries not written yet.
    pub fn pending(&self) -> u64 {
        let map = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        map.values().map(Window::total).sum()
    }
}

/// Closes the summary of every window older than `before` (to `out`);
/// with `before` = `i64::MAX` (the table is full, or the end) the windows
/// go too.
fn sweep(map: &mut HashMap<Key, Window>, before: i64, out: &mut Vec<Summary>) {
    map.retain(|_, w| {
        if w.second < before {
            out.extend(close(w));
        }
        before != i64::MAX
    });
}

/// Lines a client may write at once under `limit`.
fn capacity(limit: u32) -> f64 {
    f64::from(limit) * f64::from(BURST_SECS)
}

/// Adds what `limit` a second gives since the bucket was last reckoned.
fn refill(w: &mut Window, now_ms: i64) {
    let gained = (now_ms - w.at_ms).max(0) as f64 * f64::from(w.limit) / 1000.0;
    w.tokens = (w.tokens + gained).min(capacity(w.limit));
    w.at_ms = now_ms;
}

fn close(w: &mut Window) -> Option<Summary> {
    if w.suppressed.is_empty() {
        return None;
    }
    Some(Summary {
        first_ms: w.first_ms,
        client: w.client.clone(),
        src: w.src,
        limit: w.limit,
        counts: std::mem::take(&mut w.suppressed),
    })
}

/// Now, for [`LogRate::admit`].
pub fn now_ms() -> i64 {
    unix_now_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(src: &str, reason: Reason) -> Event {
        let mut e = Event::new(Proto::Tls, src.parse().unwrap());
        e.set_denied(reason);
        e
    }

    #[test]
    fn past_the_burst_and_the_rate_a_second_is_summed_per_client() {
        // 3 a second: a burst of 30, then 3 more each second.
        let rate = LogRate::new(Box::new(|| 3));
        let mut out = Vec::new();
        let t = 10_000;
        let mut a = |at| rate.admit(&ev("10.0.0.1:1", Reason::NoException), at, &mut out);
        assert!((0..30).all(|_| a(t)), "the burst");
        assert!(!a(t) && !a(t + 1));
        // Another address is not affected; an IPv6 one counts by its /64.
        assert!(rate.admit(&ev("10.0.0.2:1", Reason::NoException), t, &mut out));
        for p in 0..31 {
            let src = format!("[2001:db8::{p}]:1");
            let ok = rate.admit(&ev(&src, Reason::Malformed), t, &mut out);
            assert_eq!(ok, p < 30);
        }
        assert!(out.is_empty());
        assert_eq!(rate.pending(), 3);
        // The next second: its rate again, and the closed seconds swept
        // into summaries.
        let mut a = |at| rate.admit(&ev("10.0.0.1:1", Reason::NoException), at, &mut out);
        assert!(a(t + 1000) && a(t + 1000) && a(t + 1000));
        assert!(!a(t + 1000));
        assert_eq!(out.len(), 2);
        let mut line = Vec::new();
        let s = out
            .iter()
            .find(|s| s.src.to_string() == "10.0.0.1")
            .unwrap();
        s.write_json(&mut line);
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["event"], "rate_limited");
        assert_eq!(v["suppressed"], 2);
        assert_eq!(v["counts"][0]["reason"], "no_exception");
        assert_eq!(v["counts"][0]["count"], 2);
        assert_eq!(rate.pending(), 1);
        assert_eq!(rate.closed(t + 2000, false).len(), 1);
        // Windows whose bucket has filled again go.
        assert!(rate.closed(t + 60_000, false).is_empty());
        assert_eq!(rate.windows.lock().unwrap().len(), 0);
    }

    #[test]
    fn fields_are_cut_with_a_marker() {
        let mut e = ev("10.0.0.1:1", Reason::Malformed);
        e.path = Some("/é".repeat(4000));
        e.host = Some("h".repeat(300));
        bound_fields(&mut e);
        let p = e.path.unwrap();
        assert!(p.len() <= MAX_LOGGED_PATH + CUT_MARKER.len() && p.ends_with(CUT_MARKER));
        assert_eq!(e.host.unwrap().len(), MAX_LOGGED_NAME + CUT_MARKER.len());
    }
}
