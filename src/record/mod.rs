//! The record of a request: the typed [`Event`] a front-end fills in as the
//! request goes, and [`Recorder::record`], the one function that turns it
//! into a decision-log line and metric samples, for every protocol. A
//! front-end that answers a request without calling `record` is a bug.
//!
//! Owns the event's fields and the counting that goes with a line. Does not
//! own the decision (`policy`), the sink that writes lines (`log`), or the
//! registry (`metrics`); the line's JSON is written in [`json`] (egressd's
//! own line) or [`ocsf`] (an OCSF event), chosen once per line.

pub mod denials;
mod json;
pub mod ocsf;
pub mod rate;
pub mod recent;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use crate::log::{LogSink, Ticket};
use crate::metrics::Metrics;
use crate::packages::decide::PackageReason;
use crate::packages::Ecosystem;
use crate::policy::{Decision, Logged, Mode, Proto, Reason};
use crate::time::unix_now_millis;

/// One finished request or query: the decision-log line's fields, written
/// by [`Event::write_json`] in the order docs/log.md shows.
#[derive(Debug, Clone)]
pub struct Event {
    /// The request's id (DESIGN "Grants"): short, unique, written on deny
    /// lines and in the deny answer, so `egressd grant ID` can find it.
    pub id: RequestId,
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
    pub decision: Logged,
    pub reason: Reason,
    pub exception: Option<Arc<str>>,
    pub owner: Option<Arc<str>>,
    /// The grant that allowed it (the exception's id); written only when set.
    pub grant: Option<Arc<str>>,
    /// This request took one of the grant's uses (a request served, not a
    /// DNS answer or a CONNECT whose requests are decided inside).
    pub grant_use: bool,
    pub mode: Mode,
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
    /// Set (with `error`, by [`Event::fail_upstream`]) when the request
    /// failed reaching its destination: counted by kind.
    pub upstream: Option<UpstreamFailure>,
    /// Upstream DNS exchanges that failed while this request was served
    /// (counted with `proto="dns"`; not written to the line).
    pub dns_attempts: Attempts,
    /// Extra detail, e.g. which resolved addresses were refused; written
    /// only when set.
    pub note: Option<String>,
    /// A request the package gate decided (DESIGN "Packages"); written
    /// only when set, and counted in the package metrics.
    pub package: Option<Box<PackageLine>>,
    /// A smart-HTTP git request under a `git:` exception; written only
    /// when set, and a push counted in `egressd_git_pushes_total`.
    pub git: Option<Box<GitLine>>,
    /// A request or connection under an `upload:` budget; written only
    /// when set, its bytes counted in `egressd_upload_bytes_total`.
    pub upload: Option<Arc<UploadLine>>,
    /// `"egressd"` for a request egressd made for itself (an index the
    /// gate fetched to authorise a download); written only when set.
    pub origin: Option<&'static str>,
    /// A long-lived connection's line (DESIGN "The record holds"): `open`
    /// when it is decided, `close` when it ends; `None` for a short
    /// request's one line. Set by [`Recorder::open`], never by hand.
    pub event: Option<Phase>,
    /// The open line was summed into a `rate_limited` line: its close
    /// writes no line either (every close line pairs with an open line).
    quiet_close: bool,
    pub started: Option<Instant>,
}

/// Which line of a long-lived connection (a CONNECT tunnel, an
/// intercepted connection, a WebSocket) a line is: the line's `event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Written when the connection is decided: the decision, no bytes.
    Open,
    /// Written when it ends: the same id, its bytes and duration.
    Close,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Open => "open",
            Phase::Close => "close",
        }
    }
}

/// What the package gate decided about one request: the line's `package`
/// object, and the labels of `egressd_package_decisions_total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageLine {
    pub ecosystem: Ecosystem,
    /// Normalised; `None` only for a registry path the gate could not read
    /// (`package_unparseable`).
    pub name: Option<String>,
    /// `None` for an index document.
    pub version: Option<String>,
    /// The set that allowed, or whose entry held or denied.
    pub set: Option<Arc<str>>,
    /// The package denial; `None` when the gate allowed (the metric's
    /// `reason="exception"`).
    pub reason: Option<PackageReason>,
    /// Versions a filtered index hid, per reason (the line writes their
    /// total as `versions_hidden`, only for a filtered index).
    pub hidden: Option<Vec<(PackageReason, u32)>>,
    /// For `package_not_approved`: the approved name within edit distance 2.
    /// Not a field of the line (`egressd report` works it out from the
    /// policy); kept for `egressd run`'s summary at exit.
    pub did_you_mean: Option<String>,
}

impl PackageLine {
    /// The line's `versions_hidden`: set for a filtered index only.
    pub fn versions_hidden(&self) -> Option<u64> {
        self.hidden
            .as_ref()
            .map(|h| h.iter().map(|(_, n)| u64::from(*n)).sum())
    }
}

/// A request's id: 12 characters of lower-case base32 (no i, l, o, u), made
/// of the arrival millisecond (40 bits, wrapping every 34 years) and a
/// sequence (20 bits) that starts at a random point in each process, so
/// ids from one process never repeat within a millisecond's million
/// requests and two processes' ids collide only by a 2^-20 chance per
/// millisecond they share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId(u64);

/// The sequence of [`RequestId`]s. A process-wide counter, not a
/// registry: ids must differ across every front-end and recorder.
static SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

impl RequestId {
    const ALPHABET: &'static [u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
    pub const LEN: usize = 12;

    fn next(ts_ms: i64) -> RequestId {
        use std::sync::atomic::Ordering;
        let mut seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        if seq == u64::MAX {
            // First use in this process: start at a random point.
            let mut b = [0u8; 8];
            let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
            let start = u64::from_le_bytes(b) & 0xfffff;
            let _ = SEQUENCE.compare_exchange(0, start + 1, Ordering::Relaxed, Ordering::Relaxed);
            seq = start;
        }
        RequestId(((ts_ms as u64 & 0xff_ffff_ffff) << 20) | (seq & 0xfffff))
    }

    /// Its 12 characters.
    pub fn as_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        for (i, c) in out.iter_mut().enumerate() {
            *c = Self::ALPHABET[((self.0 >> (55 - 5 * i)) & 31) as usize];
        }
        out
    }

    /// Whether `s` is spelled as an id.
    pub fn looks_like(s: &str) -> bool {
        s.len() == Self::LEN && s.bytes().all(|b| Self::ALPHABET.contains(&b))
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.as_bytes();
        f.write_str(std::str::from_utf8(&b).expect("ASCII"))
    }
}

/// The line's `git` object (DESIGN "Writes on allowed hosts").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitLine {
    /// As the path names it.
    pub repo: String,
    /// `fetch` or `push`.
    pub service: &'static str,
    /// A push's ref updates, each with its verdict.
    pub refs: Vec<GitRefLine>,
    /// A push's body size, as the client sent it.
    pub pack_bytes: Option<u64>,
}

/// The line's `upload` object: what a request or connection under an
/// `upload:` budget charged to it. Shared with the body or relay doing the
/// charging, so the line says what had been charged when it is written.
#[derive(Debug, Default)]
pub struct UploadLine {
    /// The exception's budget, bytes per window.
    pub budget: u64,
    /// What the client's window held after this request's last charge.
    pub used: AtomicU64,
    /// The budget was crossed: the request refused or cut, or in report
    /// mode let through past it.
    pub crossed: AtomicBool,
    /// Bytes charged and not yet counted in the metric.
    pub uncounted: AtomicU64,
}

/// One ref update of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRefLine {
    pub name: String,
    pub old: String,
    pub new: String,
    /// `allow`, or the reason it was refused.
    pub verdict: &'static str,
}

/// The `client` of a request no client entry names.
pub fn anonymous() -> Arc<str> {
    static DASH: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("-"));
    DASH.clone()
}

impl Event {
    /// A new event for a request that arrived now from `src`.
    pub fn new(proto: Proto, src: SocketAddr) -> Event {
        let ts_ms = unix_now_millis();
        Event {
            id: RequestId::next(ts_ms),
            ts_ms,
            client: anonymous(),
            src,
            proto,
            host: None,
            port: None,
            addr: None,
            method: None,
            path: None,
            decision: Logged::Deny,
            reason: Reason::Malformed,
            exception: None,
            owner: None,
            grant: None,
            grant_use: false,
            mode: Mode::Enforce,
            status: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            qname: None,
            qtype: None,
            rcode: None,
            error: None,
            upstream: None,
            dns_attempts: Attempts::default(),
            note: None,
            package: None,
            git: None,
            upload: None,
            origin: None,
            event: None,
            quiet_close: false,
            started: Some(Instant::now()),
        }
    }

    /// Copies a decision's outcome into the event: the one setter of
    /// `decision`, `reason`, `exception` and `owner`. A denial that comes
    /// after the policy allowed (the tunnel budget, an answer of only
    /// private addresses) is a `Decision::deny` naming that exception.
    pub fn set_decision(&mut self, d: &Decision<'_>, mode: Mode) {
        self.decision = d.logged();
        self.reason = d.reason;
        self.exception = d.exception.map(|e| e.id.clone());
        self.owner = d.exception.map(|e| e.owner.clone());
        self.grant = d
            .exception
            .filter(|e| e.grant().is_some() && d.logged() == Logged::Allow)
            .map(|e| e.id.clone());
        self.grant_use = self.grant.is_some()
            && d.verdict == crate::policy::Verdict::Allow
            && self.proto != Proto::Dns;
        self.mode = mode;
    }

    /// A denial made before or without the policy (malformed input, log
    /// failure); the mode stays what it was.
    pub fn set_denied(&mut self, reason: Reason) {
        self.set_decision(&Decision::deny(reason, None), self.mode);
    }

    pub fn allowed_by_exception(&self) -> bool {
        self.reason == Reason::Exception && self.exception.is_some()
    }

    /// Adds `note` after what the event already notes (a front-end's own
    /// note, such as transparent capture's, is kept).
    pub fn add_note(&mut self, note: Option<String>) {
        if let Some(n) = note {
            self.note = Some(match self.note.take() {
                Some(prev) => format!("{prev}; {n}"),
                None => n,
            });
        }
    }

    /// The request could not reach its destination: `error` reads
    /// `kind: message`, and the failure is counted by kind.
    pub fn fail_upstream(&mut self, kind: UpstreamFailure, message: impl std::fmt::Display) {
        self.upstream = Some(kind);
        self.error = Some(format!("{}: {message}", kind.as_str()));
    }
}

/// How reaching a destination or an upstream DNS server failed: the `kind`
/// of `egressd_upstream_errors_total`. Never a policy decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The destination's name did not resolve.
    Resolve,
    /// No checked address took the connection, or the exchange failed.
    Connect,
    /// The destination did not answer in time.
    Timeout,
    /// TLS to the origin could not be set up.
    Tls,
    /// An upstream DNS server could not be reached or sent garbage.
    Io,
    /// An upstream DNS server answered with an error (SERVFAIL, REFUSED).
    Servfail,
}

impl UpstreamFailure {
    pub const ALL: [UpstreamFailure; 6] = [
        UpstreamFailure::Resolve,
        UpstreamFailure::Connect,
        UpstreamFailure::Timeout,
        UpstreamFailure::Tls,
        UpstreamFailure::Io,
        UpstreamFailure::Servfail,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamFailure::Resolve => "resolve",
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::Timeout => "timeout",
            UpstreamFailure::Tls => "tls",
            UpstreamFailure::Io => "io",
            UpstreamFailure::Servfail => "servfail",
        }
    }
}

/// Failed upstream DNS exchanges, by kind: the resolver notes each failed
/// attempt here (several per resolution when upstreams are retried), and
/// `Recorder::record` counts them with the request they served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempts {
    failed: [u16; UpstreamFailure::ALL.len()],
}

impl Attempts {
    pub fn fail(&mut self, kind: UpstreamFailure) {
        let n = &mut self.failed[kind as usize];
        *n = n.saturating_add(1);
    }

    pub fn add(&mut self, other: &Attempts) {
        for (n, m) in self.failed.iter_mut().zip(other.failed) {
            *n = n.saturating_add(m);
        }
    }

    /// Each kind that failed, with how often.
    pub fn failed(&self) -> impl Iterator<Item = (UpstreamFailure, u64)> + '_ {
        UpstreamFailure::ALL
            .iter()
            .zip(self.failed)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (*k, u64::from(n)))
    }
}

/// How a decision becomes a line (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// egressd's own JSON line (DESIGN.md's "Decision log").
    #[default]
    Egressd,
    /// An OCSF 1.8.0 event: HTTP, Network or DNS Activity.
    Ocsf,
}

/// Writes decision-log lines and counts metrics: shared by every front-end.
#[derive(Clone)]
pub struct Recorder {
    pub log: LogSink,
    pub metrics: Arc<Metrics>,
    pub format: LogFormat,
    /// The package denials answered, for `egressd run`'s summary.
    pub package_denials: Arc<denials::PackageDenials>,
    /// Each client's lines this second (`rate`): past its limit they are
    /// summed into a `rate_limited` line.
    pub rate: Arc<rate::LogRate>,
    /// The recent denials a grant could lift, for `egressd grant ID` from
    /// the running egressd (served on the metrics listener).
    pub recent_denials: Arc<recent::RecentDenials>,
}

impl Recorder {
    pub fn new(log: LogSink, metrics: Arc<Metrics>) -> Recorder {
        Recorder {
            log,
            metrics,
            format: LogFormat::Egressd,
            package_denials: Arc::default(),
            rate: Arc::default(),
            recent_denials: Arc::default(),
        }
    }

    /// The same recorder with each client's lines per second bounded by
    /// what `limit` reads (the serving policy's
    /// `settings.limits.log_lines_per_client_per_sec`).
    pub fn with_log_rate(mut self, limit: Box<dyn Fn() -> u32 + Send + Sync>) -> Recorder {
        self.rate = Arc::new(rate::LogRate::new(limit));
        self
    }

    /// Writes the `rate_limited` summaries of the seconds that have ended
    /// (of every second when `all`, at the end): a ticker calls it once a
    /// second, so a summary does not wait for its client's next decision.
    pub fn flush_rate_limited(&self, all: bool) {
        let closed = self.rate.closed(rate::now_ms(), all);
        self.write_summaries(&closed);
    }

    fn write_summaries(&self, closed: &[rate::Summary]) {
        for s in closed {
            self.log.append(false, |out| s.write_json(out));
        }
    }

    /// The same recorder writing `format` lines. Either way a decision is
    /// one line through the same sink, so its bounds and fail-closed
    /// handling do not depend on the format.
    pub fn with_format(mut self, format: LogFormat) -> Recorder {
        self.format = format;
        self
    }

    /// Whether new requests may be served (the log is writable).
    pub fn accepting(&self) -> bool {
        self.log.healthy()
    }

    /// The one place a decision becomes a log line and metric samples:
    /// the request, its denial or exception hit, its bytes and duration,
    /// and its upstream failures are counted here and nowhere else.
    /// [`Recorder::commit`]'s ticket says when the line reached the kernel: a front-end
    /// holding the last bytes of an answer waits for it
    /// ([`Recorder::settle`]) before it lets them go.
    pub fn record(&self, mut ev: Event) {
        self.record_mut(&mut ev);
    }

    /// [`Recorder::record`], returning when the line reaches the kernel.
    pub fn commit(&self, mut ev: Event) -> Ticket {
        self.record_mut(&mut ev)
    }

    /// Waits until the line of `ticket` is written; `false` when the log
    /// stopped taking lines first (the answer must not complete).
    pub async fn settle(&self, ticket: Ticket) -> bool {
        self.log.settle(ticket).await
    }

    /// Writes the open line of a long-lived connection decided now (a
    /// tunnel, an intercepted connection, a WebSocket): its decision, no
    /// bytes and no duration yet, counted as the request it is. The event
    /// becomes its close line: recording it later writes `"event":"close"`
    /// with the same id, its bytes and duration, counted for its bytes
    /// only, so the connection is one request in the metrics. Returns when
    /// the line reaches the kernel.
    pub fn open(&self, ev: &mut Event) -> Ticket {
        debug_assert!(ev.event.is_none(), "a connection opens once");
        rate::bound_fields(ev);
        let kept = (ev.bytes_up, ev.bytes_down);
        (ev.bytes_up, ev.bytes_down, ev.duration_ms) = (0, 0, 0);
        ev.event = Some(Phase::Open);
        let ticket = self.single(ev);
        if ticket.is_none() {
            ev.quiet_close = true;
        }
        ev.event = Some(Phase::Close);
        (ev.bytes_up, ev.bytes_down) = kept;
        // What the open line counted is not counted again at the close.
        ev.dns_attempts = Attempts::default();
        ticket.unwrap_or_default()
    }

    /// [`Recorder::open`], returning once the open line reached the
    /// kernel: a connection carries no byte before it is on record.
    /// `false` when the log stopped taking lines first: the connection
    /// must not go on, and its close line (recorded by the caller) says so.
    pub async fn open_settled(&self, ev: &mut Event) -> bool {
        let ticket = self.open(ev);
        if self.settle(ticket).await {
            return true;
        }
        ev.error = Some("the decision log stopped taking lines as the connection opened".into());
        false
    }

    /// [`Recorder::record`] of an event the caller keeps (to reuse the
    /// room of its strings; only `duration_ms` is changed).
    pub fn record_mut(&self, ev: &mut Event) -> Ticket {
        rate::bound_fields(ev);
        if ev.event == Some(Phase::Close) {
            return self.close(ev);
        }
        let ticket = self.single(ev);
        ticket.unwrap_or_default()
    }

    /// Bytes charged to an upload budget since its line (or its
    /// connection's open line) was last counted.
    fn count_upload(&self, ev: &Event) {
        if let Some(u) = &ev.upload {
            let n = u.uncounted.swap(0, std::sync::atomic::Ordering::Relaxed);
            if n > 0 {
                self.metrics
                    .count_upload(ev.exception.as_deref().unwrap_or("-"), n);
            }
        }
    }

    /// The close line: its duration observed, its bytes and any upstream
    /// failure counted, the request itself not (its open line was), and
    /// written past the per-client rate limit, which its open line met.
    fn close(&self, ev: &mut Event) -> Ticket {
        if let Some(start) = ev.started {
            let elapsed = start.elapsed();
            ev.duration_ms = elapsed.as_millis() as u64;
            self.metrics
                .observe_duration(ev.proto, elapsed.as_secs_f64());
        }
        self.metrics.count_bytes(ev.bytes_up, ev.bytes_down);
        self.count_upload(ev);
        if let Some(kind) = ev.upstream {
            self.metrics
                .count_upstream_error(ev.proto, kind.as_str(), 1);
        }
        for (kind, n) in ev.dns_attempts.failed() {
            self.metrics
                .count_upstream_error(Proto::Dns, kind.as_str(), n);
        }
        if ev.quiet_close {
            return Ticket::default();
        }
        let (ev, format) = (&*ev, self.format);
        self.log.append(false, |out| match format {
            LogFormat::Egressd => ev.write_json(out),
            LogFormat::Ocsf => ev.write_ocsf(out),
        })
    }

    /// A short request's one line, or a connection's open line (then its
    /// duration is left 0); `None` when the rate limit summed it into a
    /// `rate_limited` line.
    fn single(&self, ev: &mut Event) -> Option<Ticket> {
        if let (Some(start), None) = (ev.started, ev.event) {
            let elapsed = start.elapsed();
            ev.duration_ms = elapsed.as_millis() as u64;
            self.metrics
                .observe_duration(ev.proto, elapsed.as_secs_f64());
        }
        let ev = &*ev;
        self.count(ev);
        self.package_denials.note(ev);
        let mut closed = Vec::new();
        let own_line = self.rate.admit(ev, rate::now_ms(), &mut closed);
        self.write_summaries(&closed);
        if !own_line {
            self.metrics.count_overload("log_rate", 1);
            // Summed into the next `rate_limited` line: nothing to wait for.
            return None;
        }
        self.recent_denials.note(ev);
        // Refusals before the policy forwarded nothing and come as fast as
        // a client sends: the sink may count them instead of keeping them
        // when it is far behind. Every other line is always kept.
        let refusal = matches!(
            ev.reason,
            Reason::LogUnavailable | Reason::Overloaded | Reason::Malformed | Reason::LoopDetected
        );
        // Written straight into the sink's batch: no buffer per line.
        let format = self.format;
        Some(self.log.append(refusal, |out| match format {
            LogFormat::Egressd => ev.write_json(out),
            LogFormat::Ocsf => ev.write_ocsf(out),
        }))
    }

    fn count(&self, ev: &Event) {
        let denied = ev.decision == Logged::Deny;
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
        if let Some(kind) = ev.upstream {
            self.metrics
                .count_upstream_error(ev.proto, kind.as_str(), 1);
        }
        for (kind, n) in ev.dns_attempts.failed() {
            self.metrics
                .count_upstream_error(Proto::Dns, kind.as_str(), n);
        }
        if ev.grant_use && !denied {
            self.metrics.grant_uses.inc();
        }
        if ev
            .git
            .as_ref()
            .is_some_and(|g| g.service == "push" && !g.refs.is_empty())
        {
            let result = if ev.decision == Logged::Deny {
                ev.reason.as_str()
            } else {
                "allow"
            };
            self.metrics
                .count_git_push(ev.exception.as_deref().unwrap_or("-"), result);
        }
        self.count_upload(ev);
        if let Some(p) = &ev.package {
            let set = p.set.as_deref().unwrap_or("-");
            let reason = p.reason.map_or("exception", PackageReason::as_str);
            self.metrics
                .count_package(p.ecosystem, set, ev.decision.as_str(), reason);
            for (r, n) in p.hidden.iter().flatten() {
                self.metrics
                    .count_versions_hidden(p.ecosystem, set, r.as_str(), u64::from(*n));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::LogTarget;

    fn recorder() -> (tempfile::TempDir, Recorder) {
        let dir = tempfile::tempdir().unwrap();
        let target = LogTarget::File(dir.path().join("decisions.log"));
        let metrics = Metrics::new();
        let log = LogSink::start(target, metrics.clone()).unwrap();
        (dir, Recorder::new(log, metrics))
    }

    fn upstream_errors(m: &Metrics, proto: &str, kind: &str) -> u64 {
        m.upstream_errors.with_label_values(&[proto, kind]).get()
    }

    #[test]
    fn upstream_failures_are_counted_by_record_with_their_request() {
        let (_dir, rec) = recorder();
        let mut ev = Event::new(Proto::Connect, "10.0.0.1:1".parse().unwrap());
        ev.fail_upstream(UpstreamFailure::Resolve, "upstream DNS timed out");
        ev.dns_attempts.fail(UpstreamFailure::Timeout);
        ev.dns_attempts.fail(UpstreamFailure::Timeout);
        ev.dns_attempts.fail(UpstreamFailure::Servfail);
        assert_eq!(ev.error.as_deref(), Some("resolve: upstream DNS timed out"));
        let m = rec.metrics.clone();
        assert_eq!(upstream_errors(&m, "connect", "resolve"), 0, "not before");
        rec.record(ev);
        assert_eq!(upstream_errors(&m, "connect", "resolve"), 1);
        assert_eq!(upstream_errors(&m, "dns", "timeout"), 2);
        assert_eq!(upstream_errors(&m, "dns", "servfail"), 1);
        assert_eq!(upstream_errors(&m, "dns", "io"), 0);
        // An event that reached its destination counts none.
        rec.record(Event::new(Proto::Http, "10.0.0.1:2".parse().unwrap()));
        assert_eq!(upstream_errors(&m, "connect", "resolve"), 1);
        assert_eq!(upstream_errors(&m, "http", "connect"), 0);
    }

    #[test]
    fn package_requests_are_counted_by_ecosystem_set_decision_and_reason() {
        let (_dir, rec) = recorder();
        let pkg = |set: Option<&str>, reason, hidden| {
            Some(Box::new(PackageLine {
                ecosystem: Ecosystem::Npm,
                name: Some("left-pad".into()),
                version: None,
                set: set.map(Arc::from),
                reason,
                hidden,
                did_you_mean: None,
            }))
        };
        let mut ok = Event::new(Proto::Tls, "10.0.0.1:1".parse().unwrap());
        ok.decision = Logged::Allow;
        ok.reason = Reason::Exception;
        ok.package = pkg(Some("js"), None, Some(vec![(PackageReason::TooNew, 3)]));
        rec.record(ok);
        let mut no = Event::new(Proto::Tls, "10.0.0.1:1".parse().unwrap());
        no.package = pkg(None, Some(PackageReason::NotApproved), None);
        rec.record(no);
        rec.record(Event::new(Proto::Tls, "10.0.0.1:1".parse().unwrap()));
        let m = &rec.metrics;
        let d = |l: &[&str]| m.package_decisions.with_label_values(l).get();
        assert_eq!(d(&["npm", "js", "allow", "exception"]), 1);
        assert_eq!(d(&["npm", "-", "deny", "package_not_approved"]), 1);
        let h = m
            .package_versions_hidden
            .with_label_values(&["npm", "js", "package_too_new"])
            .get();
        assert_eq!(h, 3);
    }

    fn lines(dir: &tempfile::TempDir, rec: &Recorder) -> Vec<serde_json::Value> {
        assert!(rec.log.flush(std::time::Duration::from_secs(10)));
        std::fs::read_to_string(dir.path().join("decisions.log"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn connection() -> Event {
        let mut ev = Event::new(Proto::Connect, "10.0.0.1:1".parse().unwrap());
        ev.decision = Logged::Allow;
        ev.reason = Reason::Exception;
        ev.host = Some("a.test".into());
        ev
    }

    #[test]
    fn a_connection_is_one_request_with_an_open_and_a_close_line() {
        let (dir, rec) = recorder();
        let mut ev = connection();
        ev.bytes_up = 3; // bytes before the open are the close line's
        rec.open(&mut ev);
        let m = rec.metrics.clone();
        let allowed = || m.requests.with_label_values(&["connect", "allow"]).get();
        assert_eq!(allowed(), 1);
        let open = lines(&dir, &rec);
        assert_eq!(open.len(), 1);
        assert_eq!(open[0]["event"], "open");
        assert_eq!(open[0]["bytes_up"], 0);
        ev.bytes_up += 10;
        ev.bytes_down = 20;
        rec.record(ev);
        assert_eq!(allowed(), 1, "the close line counts no second request");
        let all = lines(&dir, &rec);
        assert_eq!(all.len(), 2);
        assert_eq!(all[1]["event"], "close");
        assert_eq!(all[1]["id"], all[0]["id"]);
        assert_eq!(
            (all[1]["bytes_up"].as_u64(), all[1]["bytes_down"].as_u64()),
            (Some(13), Some(20))
        );
    }

    #[test]
    fn a_close_line_is_not_written_when_its_open_line_was_rate_limited() {
        let (dir, rec) = recorder();
        let rec = rec.with_log_rate(Box::new(|| 1));
        let mut written = 0;
        let mut closes = Vec::new();
        for _ in 0..(rate_burst() + 3) {
            let mut ev = connection();
            rec.open(&mut ev);
            closes.push(ev);
        }
        for ev in closes {
            rec.record(ev);
        }
        rec.flush_rate_limited(true);
        for l in lines(&dir, &rec) {
            match l["event"].as_str() {
                Some("open") => written += 1,
                Some("close") => written -= 1,
                _ => {}
            }
        }
        assert_eq!(written, 0, "every close line pairs with an open line");
        let all = lines(&dir, &rec);
        assert!(all.iter().any(|l| l["event"] == "rate_limited"), "{all:?}");
        let opens = all.iter().filter(|l| l["event"] == "open").count();
        assert!(
            opens > 0 && opens < rate_burst() + 3,
            "some opens summed: {opens}"
        );
    }

    fn rate_burst() -> usize {
        rate::BURST_SECS as usize
    }

    #[test]
    fn denials_are_counted_by_reason() {
        let (_dir, rec) = recorder();
        for r in Reason::ALL.into_iter().filter(|r| *r != Reason::Exception) {
            let mut ev = Event::new(Proto::Tls, "10.0.0.1:1".parse().unwrap());
            ev.set_denied(r);
            rec.record(ev);
        }
        for r in Reason::ALL.into_iter().filter(|r| *r != Reason::Exception) {
            let n = rec
                .metrics
                .denied
                .with_label_values(&["tls", r.as_str()])
                .get();
            assert_eq!(n, 1, "{r:?}");
        }
        let denied = rec
            .metrics
            .requests
            .with_label_values(&["tls", "deny"])
            .get();
        assert_eq!(denied, Reason::ALL.len() as u64 - 1);
    }
}
