//! Decisions and their record. [`Decision`] is the value `Policy::decide`
//! returns; [`Event`] is what a front-end knows once the request is over; and
//! [`Recorder::record`] is the one function that writes the decision-log line
//! and counts the metrics, for every protocol. A front-end that answers a
//! request without calling `record` is a bug.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::log::LogSink;
use crate::metrics::Metrics;
use crate::policy::time::{format_rfc3339_millis, unix_now_millis};
use crate::policy::{Exception, Mode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Http,
    Connect,
    Tls,
    Dns,
}

impl Proto {
    pub const ALL: [Proto; 4] = [Proto::Http, Proto::Connect, Proto::Tls, Proto::Dns];

    /// Position in [`Proto::ALL`] (a match, so a new variant cannot be
    /// forgotten here).
    pub fn index(self) -> usize {
        match self {
            Proto::Http => 0,
            Proto::Connect => 1,
            Proto::Tls => 2,
            Proto::Dns => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Http => "http",
            Proto::Connect => "connect",
            Proto::Tls => "tls",
            Proto::Dns => "dns",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Allowed, but only through TLS interception, where each request inside
    /// is decided again with its method and path.
    Intercept,
    Deny,
}

/// Why a decision went the way it did. The `as_str` names are the log's and
/// the `X-Egressd-Reason` header's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Exception,
    NoException,
    Expired,
    PrivateAddress,
    ClientNotAllowed,
    PortNotAllowed,
    MethodNotAllowed,
    PathNotAllowed,
    InspectionRequired,
    HostMismatch,
    SniMismatch,
    QtypeNotAllowed,
    DnsTunnel,
    Malformed,
    LogUnavailable,
    LoopDetected,
    Overloaded,
    UpstreamError,
}

impl Reason {
    /// Every reason, for pre-creating metric series.
    pub const ALL: [Reason; 18] = [
        Reason::Exception,
        Reason::NoException,
        Reason::Expired,
        Reason::PrivateAddress,
        Reason::ClientNotAllowed,
        Reason::PortNotAllowed,
        Reason::MethodNotAllowed,
        Reason::PathNotAllowed,
        Reason::InspectionRequired,
        Reason::HostMismatch,
        Reason::SniMismatch,
        Reason::QtypeNotAllowed,
        Reason::DnsTunnel,
        Reason::Malformed,
        Reason::LogUnavailable,
        Reason::LoopDetected,
        Reason::Overloaded,
        Reason::UpstreamError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exception => "exception",
            Reason::NoException => "no_exception",
            Reason::Expired => "exception_expired",
            Reason::PrivateAddress => "private_address",
            Reason::ClientNotAllowed => "client_not_allowed",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::MethodNotAllowed => "method_not_allowed",
            Reason::PathNotAllowed => "path_not_allowed",
            Reason::InspectionRequired => "inspection_required",
            Reason::HostMismatch => "host_mismatch",
            Reason::SniMismatch => "sni_mismatch",
            Reason::QtypeNotAllowed => "qtype_not_allowed",
            Reason::DnsTunnel => "dns_tunnel",
            Reason::Malformed => "malformed",
            Reason::LogUnavailable => "log_unavailable",
            Reason::LoopDetected => "loop_detected",
            Reason::Overloaded => "overloaded",
            Reason::UpstreamError => "upstream_error",
        }
    }

    /// One sentence for deny bodies and `explain`.
    pub fn describe(self) -> &'static str {
        match self {
            Reason::Exception => "an exception allows it",
            Reason::NoException => "no exception allows this destination",
            Reason::Expired => "the exception that allowed this destination has expired",
            Reason::PrivateAddress => "the destination is a private, loopback, link-local or otherwise non-public address that no exception lists in cidrs",
            Reason::ClientNotAllowed => "an exception names this destination, but not for this client",
            Reason::PortNotAllowed => "an exception names this destination, but not on this port",
            Reason::MethodNotAllowed => "an exception names this destination, but not for this method",
            Reason::PathNotAllowed => "an exception names this destination, but not for this path",
            Reason::InspectionRequired => "the exceptions for this destination restrict methods or paths or inject credentials, which an opaque tunnel cannot enforce, and TLS interception is not enabled",
            Reason::HostMismatch => "the Host header does not match the request target",
            Reason::SniMismatch => "the TLS server name does not match the CONNECT host",
            Reason::QtypeNotAllowed => "this DNS record type is not allowed for this name",
            Reason::DnsTunnel => "the name looks like data carried over DNS (tunnelling)",
            Reason::Malformed => "the request is malformed",
            Reason::LogUnavailable => "the decision log cannot be written, so egressd refuses new requests until it can",
            Reason::LoopDetected => "the destination is egressd itself",
            Reason::Overloaded => "too many requests from this client are in flight",
            Reason::UpstreamError => "the destination could not be reached",
        }
    }
}

/// The outcome of `Policy::decide`: a pure value that carries its reason
/// and, when one matched, the exception (borrowed from the policy snapshot
/// the request holds).
#[derive(Debug, Clone, Copy)]
pub struct Decision<'p> {
    pub verdict: Verdict,
    pub reason: Reason,
    pub exception: Option<&'p Exception>,
    /// `mode: report` turned a denial into an allow; the log says deny.
    pub report_only: bool,
}

impl<'p> Decision<'p> {
    pub fn allow(e: &'p Exception) -> Self {
        Decision {
            verdict: Verdict::Allow,
            reason: Reason::Exception,
            exception: Some(e),
            report_only: false,
        }
    }
    pub fn deny(reason: Reason, e: Option<&'p Exception>) -> Self {
        Decision {
            verdict: Verdict::Deny,
            reason,
            exception: e,
            report_only: false,
        }
    }
    pub fn is_allowed(&self) -> bool {
        self.verdict != Verdict::Deny
    }
    /// What the log says: a report-mode pass is logged as the denial it would be.
    pub fn logged_decision(&self) -> &'static str {
        if self.verdict == Verdict::Deny || self.report_only {
            "deny"
        } else {
            "allow"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_and_reason_tables_are_complete() {
        for (i, p) in Proto::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
        }
        let names: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len(), "reason names are unique");
    }
}

/// One finished request or query: the decision-log line's fields.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub ts: String,
    pub client: Arc<str>,
    pub src: String,
    pub proto: Proto,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub addr: Option<String>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rcode: Option<String>,
    /// An upstream or transport failure (not a policy decision).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Extra detail, e.g. which resolved addresses were refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip)]
    pub started: Option<Instant>,
}

impl Event {
    /// A new event for a request that arrived now from `src`.
    pub fn new(proto: Proto, src: SocketAddr) -> Event {
        Event {
            ts: format_rfc3339_millis(unix_now_millis()),
            client: Arc::from("-"),
            src: src.to_string(),
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
        self.metrics.count(&ev);
        // Sized for a typical line up front: growing from empty cost a
        // handful of reallocations per line.
        let mut line = Vec::with_capacity(512);
        match serde_json::to_writer(&mut line, &ev) {
            Ok(()) => {
                line.push(b'\n');
                self.log.write(line);
            }
            Err(e) => eprintln!("egressd: cannot serialise decision event: {e}"),
        }
    }
}
