//! Decisions and their record. [`Decision`] is the value `Policy::decide`
//! returns; [`Event`] is what a front-end knows once the request is over; and
//! [`Recorder::record`] is the one function that writes the decision-log line
//! and counts the metrics, for every protocol. A front-end that answers a
//! request without calling `record` is a bug.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use crate::log::LogSink;
use crate::metrics::Metrics;
use crate::policy::time::{format_rfc3339_millis, unix_now_millis};
use crate::policy::{Exception, Mode};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    /// Appends the decision-log line (one JSON object and a newline) to
    /// `out`. Written by hand rather than through serde: it is the one
    /// thing every request and query pays for, and the derive spent most of
    /// its time in generic string escaping and number formatting.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"ts\":\"");
        timestamp(out, self.ts_ms);
        out.extend_from_slice(b"\",\"client\":");
        json_str(out, &self.client);
        out.extend_from_slice(b",\"src\":\"");
        socket_addr(out, self.src);
        out.extend_from_slice(b"\",\"proto\":\"");
        out.extend_from_slice(self.proto.as_str().as_bytes());
        out.extend_from_slice(b"\",\"host\":");
        opt_str(out, self.host.as_deref());
        out.extend_from_slice(b",\"port\":");
        match self.port {
            Some(p) => uint(out, p.into()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"addr\":");
        match self.addr {
            Some(a) => {
                out.push(b'"');
                socket_addr(out, a);
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"method\":");
        opt_str(out, self.method.as_deref());
        out.extend_from_slice(b",\"path\":");
        opt_str(out, self.path.as_deref());
        out.extend_from_slice(b",\"decision\":");
        word(out, self.decision);
        out.extend_from_slice(b",\"reason\":");
        word(out, self.reason);
        out.extend_from_slice(b",\"exception\":");
        opt_str(out, self.exception.as_deref());
        out.extend_from_slice(b",\"owner\":");
        opt_str(out, self.owner.as_deref());
        out.extend_from_slice(b",\"mode\":");
        word(out, self.mode);
        out.extend_from_slice(b",\"status\":");
        match self.status {
            Some(s) => uint(out, s.into()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"bytes_up\":");
        uint(out, self.bytes_up);
        out.extend_from_slice(b",\"bytes_down\":");
        uint(out, self.bytes_down);
        out.extend_from_slice(b",\"duration_ms\":");
        uint(out, self.duration_ms);
        for (key, value) in [
            (&b",\"qname\":"[..], self.qname.as_deref()),
            (b",\"qtype\":", self.qtype.as_deref()),
            (b",\"rcode\":", self.rcode.as_deref()),
            (b",\"error\":", self.error.as_deref()),
            (b",\"note\":", self.note.as_deref()),
        ] {
            if let Some(v) = value {
                out.extend_from_slice(key);
                json_str(out, v);
            }
        }
        out.extend_from_slice(b"}\n");
    }
}

fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// A JSON string: `"`, `\\` and control characters escaped (the short
/// forms where JSON has them, `\u00XX` otherwise), everything else,
/// UTF-8 included, copied in runs. Clean stretches are skipped eight bytes
/// at a time.
fn json_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.push(b'"');
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        while let Some(chunk) = bytes.get(i..i + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            if may_need_escape(word) {
                break;
            }
            i += 8;
        }
        let Some(&b) = bytes.get(i) else { break };
        i += 1;
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[run..i - 1]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ]),
        }
        run = i;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// Whether any of the eight bytes in `w` may be below 0x20, `"` or `\\`
/// (never a false "no"; a rare false "yes" only sends the bytes through
/// the byte-by-byte check).
fn may_need_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    (control | zero_byte(w ^ (ONES * u64::from(b'"'))) | zero_byte(w ^ (ONES * u64::from(b'\\'))))
        != 0
}

/// Decimal digits of `v`.
fn uint(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// A word of egressd's own vocabulary (`allow`, `no_exception`,
/// `enforce`): quoted, never in need of escaping.
fn word(out: &mut Vec<u8>, w: &'static str) {
    debug_assert!(w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    out.push(b'"');
    out.extend_from_slice(w.as_bytes());
    out.push(b'"');
}

/// `ts` as RFC 3339 with milliseconds. The part up to the seconds changes
/// once a second: each thread keeps the last one it wrote.
fn timestamp(out: &mut Vec<u8>, ms: i64) {
    thread_local! {
        static LAST: std::cell::Cell<(i64, [u8; 20])> = const { std::cell::Cell::new((i64::MIN, [0; 20])) };
    }
    let (sec, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000) as u16);
    let (cached, prefix) = LAST.get();
    let prefix = if cached == sec {
        prefix
    } else {
        let full = format_rfc3339_millis(sec * 1000);
        let Ok(prefix) = <[u8; 20]>::try_from(&full.as_bytes()[..full.len().min(20)]) else {
            // Outside years 0..=9999: no fixed-width form to cache.
            out.extend_from_slice(format_rfc3339_millis(ms).as_bytes());
            return;
        };
        if full.len() != 24 {
            out.extend_from_slice(format_rfc3339_millis(ms).as_bytes());
            return;
        }
        LAST.set((sec, prefix));
        prefix
    };
    out.extend_from_slice(&prefix);
    out.extend_from_slice(&[
        b'0' + (milli / 100) as u8,
        b'0' + (milli / 10 % 10) as u8,
        b'0' + (milli % 10) as u8,
        b'Z',
    ]);
}

/// `a.b.c.d:port` or `[v6]:port`, as `SocketAddr`'s `Display` writes them.
fn socket_addr(out: &mut Vec<u8>, a: SocketAddr) {
    match a {
        SocketAddr::V4(v4) => {
            let mut buf = [0u8; 21];
            let mut n = 0;
            for (i, octet) in v4.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    buf[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    buf[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                buf[n] = b'0' + octet % 10;
                n += 1;
            }
            buf[n] = b':';
            out.extend_from_slice(&buf[..=n]);
            uint(out, v4.port().into());
        }
        SocketAddr::V6(_) => {
            use std::io::Write;
            let _ = write!(out, "{a}");
        }
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
        ev.write_json(&mut line);
        // Refusals before the policy forwarded nothing and come as fast as
        // a client sends: the sink may count them instead of keeping them
        // when it is far behind. Every other line is always kept.
        if [
            Reason::LogUnavailable,
            Reason::Overloaded,
            Reason::Malformed,
            Reason::LoopDetected,
        ]
        .iter()
        .any(|r| r.as_str() == ev.reason)
        {
            self.log.write_refusal(line);
        } else {
            self.log.write(line);
        }
    }
}

#[cfg(test)]
mod json_tests {
    use super::*;

    fn line(ev: &Event) -> serde_json::Value {
        let mut out = Vec::new();
        ev.write_json(&mut out);
        assert_eq!(out.last(), Some(&b'\n'), "one line, newline-terminated");
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        serde_json::from_slice(&out).expect("valid JSON")
    }

    #[test]
    fn strings_escape_as_serde_json_does() {
        let mut samples: Vec<String> = (0u8..0x80).map(|b| (b as char).to_string()).collect();
        samples.extend(
            [
                "",
                "plain",
                "a\"b\\c",
                "line\nbreak\r\t",
                "caf\u{e9} \u{1F600} \u{7f}",
                "\u{0}\u{1f}x\u{1b}[31m",
                "/simple/path/of/some/length/without/escapes",
                "0123456\"89abcdef\\x\u{1}yz0123456789ABCDEF\u{1f}",
                "\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\"",
            ]
            .map(String::from),
        );
        // Every byte that needs escaping, at every offset in and around
        // an eight-byte chunk, among bytes that do not.
        for at in 0..20 {
            for b in (0u8..0x20).chain([b'"', b'\\']) {
                let mut v = vec![b'a'; 20];
                v[at] = b;
                samples.push(String::from_utf8(v).unwrap());
            }
        }
        for s in samples {
            let mut out = Vec::new();
            json_str(&mut out, &s);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(&s).unwrap(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn numbers_and_addresses_match_display() {
        for v in [0u64, 7, 10, 99, 100, 65535, 1 << 40, u64::MAX] {
            let mut out = Vec::new();
            uint(&mut out, v);
            assert_eq!(String::from_utf8(out).unwrap(), v.to_string());
        }
        for a in [
            "0.0.0.0:0",
            "127.0.0.1:3128",
            "255.255.255.255:65535",
            "10.8.3.7:51234",
            "[::1]:53",
            "[2001:db8::1%3]:443",
            "[::ffff:1.2.3.4]:80",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let mut out = Vec::new();
            socket_addr(&mut out, a);
            assert_eq!(String::from_utf8(out).unwrap(), a.to_string());
        }
    }

    #[test]
    fn timestamps_match_the_formatter_across_seconds() {
        for ms in [
            0i64,
            999,
            1000,
            1_795_982_399_999,
            1_795_982_400_000,
            1_795_982_400_123,
            1_795_982_400_999,
            1_795_982_401_000,
            253_402_300_799_999, // 9999-12-31T23:59:59.999Z
            253_402_300_800_000, // year 10000: no cached form
            -1,
        ] {
            let mut out = Vec::new();
            timestamp(&mut out, ms);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format_rfc3339_millis(ms),
                "{ms}"
            );
        }
    }

    #[test]
    fn a_line_has_every_field_in_order() {
        let mut ev = Event::new(Proto::Connect, "10.8.3.7:51234".parse().unwrap());
        ev.ts_ms = 1_795_982_400_123; // 2026-11-29T20:00:00.123Z
        ev.client = Arc::from("ci-\"runner\"");
        ev.host = Some("pypi.org".into());
        ev.port = Some(443);
        ev.addr = Some("151.101.0.223:443".parse().unwrap());
        ev.method = Some("CONNECT".into());
        ev.decision = "allow";
        ev.reason = Reason::Exception.as_str();
        ev.exception = Some(Arc::from("pypi"));
        ev.owner = Some(Arc::from("platform-team"));
        ev.status = Some(200);
        ev.bytes_up = 512;
        ev.bytes_down = 81234;
        ev.duration_ms = 120;
        let mut out = Vec::new();
        ev.write_json(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            concat!(
                r#"{"ts":"2026-11-29T20:00:00.123Z","client":"ci-\"runner\"","src":"10.8.3.7:51234","#,
                r#""proto":"connect","host":"pypi.org","port":443,"addr":"151.101.0.223:443","#,
                r#""method":"CONNECT","path":null,"decision":"allow","reason":"exception","#,
                r#""exception":"pypi","owner":"platform-team","mode":"enforce","status":200,"#,
                r#""bytes_up":512,"bytes_down":81234,"duration_ms":120}"#,
                "\n"
            )
        );
    }

    #[test]
    fn optional_fields_appear_only_when_set() {
        let mut ev = Event::new(Proto::Dns, "[::1]:5353".parse().unwrap());
        let v = line(&ev);
        for key in ["qname", "qtype", "rcode", "error", "note"] {
            assert!(v.get(key).is_none(), "{key} absent");
        }
        assert_eq!(v["client"], "-");
        assert_eq!(v["src"], "[::1]:5353");
        assert_eq!(v["host"], serde_json::Value::Null);
        ev.qname = Some("a\u{7}.test".into());
        ev.qtype = Some("A".into());
        ev.rcode = Some("REFUSED".into());
        ev.error = Some("upstream: \"timed out\"".into());
        ev.note = Some("line\nbreak".into());
        let v = line(&ev);
        assert_eq!(v["qname"], "a\u{7}.test");
        assert_eq!(v["qtype"], "A");
        assert_eq!(v["rcode"], "REFUSED");
        assert_eq!(v["error"], "upstream: \"timed out\"");
        assert_eq!(v["note"], "line\nbreak");
    }
}
