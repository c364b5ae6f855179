//! The record of a request: the typed [`Event`] a front-end fills in as the
//! request goes, and [`Recorder::record`], the one function that turns it
//! into a decision-log line and metric samples, for every protocol. A
//! front-end that answers a request without calling `record` is a bug.
//!
//! Owns the event's fields and the counting that goes with a line. Does not
//! own the decision (`policy`), the sink that writes lines (`log`), or the
//! registry (`metrics`); the line's JSON is written in [`json`].

mod json;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use crate::log::LogSink;
use crate::metrics::Metrics;
use crate::policy::{Decision, Mode, Proto, Reason};
use crate::time::unix_now_millis;

/// One finished request or query: the decision-log line's fields, written
/// by [`Event::write_json`] in the order DESIGN.md shows.
#[derive(Debug, Clone)]
pub struct Event {
    /// When the request arrived, in milliseconds since the Unix epoch
    /// (the line's `ts`, formatted as RFC 3339 when written).
    pub ts_ms: i64,
    pub client: Arc<str>,
    pub src: SocketAddr,
    pub proto: Proto,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub addr: Option<SocketAddr>,
    pub method: Option<String>,
    pub path: Option<String>,
    pub decision: &'static str,
    pub reason: &'static str,
    pub exception: Option<Arc<str>>,
    pub owner: Option<Arc<str>>,
    pub mode: &'static str,
    pub status: Option<u16>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    /// DNS only: written only when set.
    pub qname: Option<String>,
    pub qtype: Option<Cow<'static, str>>,
    pub rcode: Option<Cow<'static, str>>,
    /// An upstream or transport failure (not a policy decision); written
    /// only when set.
    pub error: Option<String>,
    /// Extra detail, e.g. which resolved addresses were refused; written
    /// only when set.
    pub note: Option<String>,
    pub started: Option<Instant>,
}

/// The `client` of a request no client entry names.
pub fn anonymous() -> Arc<str> {
    static DASH: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("-"));
    DASH.clone()
}

impl Event {
    /// A new event for a request that arrived now from `src`.
    pub fn new(proto: Proto, src: SocketAddr) -> Event {
        Event {
            ts_ms: unix_now_millis(),
            client: anonymous(),
            src,
            proto,
            host: None,
            port: None,
            addr: None,
            method: None,
            path: None,
            decision: "deny",
            reason: Reason::Malformed.as_str(),
            exception: None,
            owner: None,
            mode: Mode::Enforce.as_str(),
            status: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            qname: None,
            qtype: None,
            rcode: None,
            error: None,
            note: None,
            started: Some(Instant::now()),
        }
    }

    /// Copies a decision's outcome into the event.
    pub fn set_decision(&mut self, d: &Decision<'_>, mode: Mode) {
        self.decision = d.logged_decision();
        self.reason = d.reason.as_str();
        self.exception = d.exception.map(|e| e.id.clone());
        self.owner = d.exception.map(|e| e.owner.clone());
        self.mode = mode.as_str();
    }

    /// A denial made before or without the policy (malformed input, log failure).
    pub fn set_denied(&mut self, reason: Reason) {
        self.decision = "deny";
        self.reason = reason.as_str();
        self.exception = None;
        self.owner = None;
    }

    pub fn allowed_by_exception(&self) -> bool {
        self.reason == Reason::Exception.as_str() && self.exception.is_some()
    }
}

/// Writes decision-log lines and counts metrics: shared by every front-end.
#[derive(Clone)]
pub struct Recorder {
    pub log: LogSink,
    pub metrics: Arc<Metrics>,
}

impl Recorder {
    pub fn new(log: LogSink, metrics: Arc<Metrics>) -> Recorder {
        Recorder { log, metrics }
    }

    /// Whether new requests may be served (the log is writable).
    pub fn accepting(&self) -> bool {
        self.log.healthy()
    }

    /// The one place a decision becomes a log line and metric samples.
    pub fn record(&self, mut ev: Event) {
        if let Some(start) = ev.started {
            let elapsed = start.elapsed();
            ev.duration_ms = elapsed.as_millis() as u64;
            self.metrics
                .observe_duration(ev.proto, elapsed.as_secs_f64());
        }
        let denied = ev.decision == "deny";
        let hit = if !denied && ev.allowed_by_exception() {
            ev.exception.as_deref()
        } else {
            None
        };
        self.metrics.count(
            ev.proto,
            denied,
            ev.reason,
            hit,
            (ev.bytes_up, ev.bytes_down),
        );
        // Sized for a typical line up front: growing from empty cost a
        // handful of reallocations per line.
        let mut line = Vec::with_capacity(512);
        ev.write_json(&mut line);
        self.log.write(line);
    }
}
