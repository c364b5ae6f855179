//! Reading decision logs: plain or gzip (detected by content, not by name),
//! any number of files or `-` for stdin, one line at a time into a reused
//! buffer, so memory does not grow with the size of the logs. Each line is
//! parsed into a [`LogLine`] that borrows from that buffer: an egressd line
//! directly, an OCSF event (`serve --log-format ocsf`) through [`OcsfLine`],
//! line by line, so a log that changed format midway reads whole.
//!
//! It does not interpret lines; [`super::stats`] and [`super::replay`] do.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use serde::Deserialize;

use crate::time::days_from_civil;

/// A line longer than this is not a decision-log line (egressd's longest
/// are a few KiB); it is skipped, counted as unreadable.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Read buffer per file.
const READ_BUF_BYTES: usize = 256 << 10;

/// The fields of a decision-log line that the report and the replay read.
/// Unknown fields are ignored, so logs from newer egressd versions still read.
#[derive(Debug, Deserialize)]
pub struct LogLine<'a> {
    #[serde(borrow)]
    pub ts: Cow<'a, str>,
    #[serde(borrow, default)]
    pub client: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub src: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub proto: Cow<'a, str>,
    #[serde(borrow, default)]
    pub host: Option<Cow<'a, str>>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub path: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub decision: Cow<'a, str>,
    #[serde(borrow, default)]
    pub reason: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub exception: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub owner: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub mode: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub qname: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub qtype: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub note: Option<Cow<'a, str>>,
    /// A package-gate request's package (DESIGN "Log field").
    #[serde(borrow, default)]
    pub package: Option<LogPackage<'a>>,
    /// `egressd` on a request egressd made for itself (an index fetched to
    /// learn times or files); absent on the sandbox's requests.
    #[serde(borrow, default)]
    pub origin: Option<Cow<'a, str>>,
    /// The grant that allowed the request (DESIGN "Grants").
    #[serde(borrow, default)]
    pub grant: Option<Cow<'a, str>>,
    /// The request's id (DESIGN "Grants"): what `egressd grant` looks for.
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    /// `open` or `close` on a long-lived connection's two lines (DESIGN
    /// "The record holds"); absent on a short request's one line.
    #[serde(borrow, default)]
    pub event: Option<Cow<'a, str>>,
}

/// A decision-log line's `package`.
#[derive(Debug, Deserialize)]
pub struct LogPackage<'a> {
    #[serde(borrow)]
    pub ecosystem: Cow<'a, str>,
    /// Normalised by the gate.
    #[serde(borrow)]
    pub name: Cow<'a, str>,
    /// `null` for an index.
    #[serde(borrow, default)]
    pub version: Option<Cow<'a, str>>,
    /// The set that allowed, held or denied; `null` when none did.
    #[serde(borrow, default)]
    pub set: Option<Cow<'a, str>>,
    /// On a filtered index: how many versions were removed.
    #[serde(default)]
    pub versions_hidden: Option<u64>,
}

impl LogLine<'_> {
    /// A connection's close line: its bytes and duration. The connection
    /// was decided, and is counted, by its open line (the same `id`), so
    /// the report and the replay pass over this one.
    pub fn is_close(&self) -> bool {
        self.event.as_deref() == Some("close")
    }
    pub fn allowed(&self) -> bool {
        self.decision == "allow"
    }
    pub fn reason(&self) -> &str {
        self.reason.as_deref().unwrap_or("")
    }
    /// The named client, or `-` for an anonymous one.
    pub fn client(&self) -> &str {
        self.client.as_deref().unwrap_or("-")
    }
    /// Who made the request, for people: the client id, or for an anonymous
    /// client its source address without the port.
    pub fn who(&self) -> &str {
        match self.client() {
            "-" | "" => self.src.as_deref().map(strip_port).unwrap_or("-"),
            id => id,
        }
    }
    /// The destination name or address: `qname` for DNS, `host` otherwise.
    pub fn destination(&self) -> Option<&str> {
        if self.proto == "dns" {
            self.qname.as_deref().or(self.host.as_deref())
        } else {
            self.host.as_deref()
        }
    }
    /// One request as a person would write it: `CONNECT host:443`,
    /// `GET http://host/path`, `dns host TXT`.
    pub fn example(&self) -> String {
        let dest = self.destination().unwrap_or("?");
        let port = self.port.unwrap_or(0);
        let method = self.method.as_deref().unwrap_or("GET");
        let path = self.path.as_deref().unwrap_or("/");
        match &*self.proto {
            "dns" => format!("dns {dest} {}", self.qtype.as_deref().unwrap_or("A")),
            "connect" => format!("CONNECT {}:{port}", bracket(dest)),
            "http" => format!(
                "{method} http://{}{}{path}",
                bracket(dest),
                port_suffix(port, 80)
            ),
            "tls" => format!(
                "{method} https://{}{}{path}",
                bracket(dest),
                port_suffix(port, 443)
            ),
            other => format!("{other} {dest}:{port}"),
        }
    }
}

fn port_suffix(port: u16, default: u16) -> String {
    if port == default || port == 0 {
        String::new()
    } else {
        format!(":{port}")
    }
}

/// IPv6 literals in brackets, as in a URL.
pub fn bracket(host: &str) -> Cow<'_, str> {
    if host.contains(':') && !host.starts_with('[') {
        Cow::Owned(format!("[{host}]"))
    } else {
        Cow::Borrowed(host)
    }
}

/// `10.0.0.1:5353` → `10.0.0.1`, `[::1]:5353` → `::1`.
pub fn strip_port(src: &str) -> &str {
    if let Some(rest) = src.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match src.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => src,
    }
}

/// Unix seconds of an RFC 3339 UTC timestamp as egressd writes them
/// (`2026-11-29T20:00:00.123Z`), fast: the date is converted once per day
/// seen, via `cache`.
pub fn parse_ts(ts: &str, cache: &mut Option<([u8; 10], i64)>) -> Option<i64> {
    let b = ts.as_bytes();
    if b.len() < 19 || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let day: [u8; 10] = b[..10].try_into().ok()?;
    let days = match cache {
        Some((d, n)) if *d == day => *n,
        _ => {
            let n = parse_day(&ts[..10])?;
            *cache = Some((day, n));
            n
        }
    };
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = &b[r];
        if s.iter().all(u8::is_ascii_digit) {
            Some(s.iter().fold(0i64, |a, d| a * 10 + (d - b'0') as i64))
        } else {
            None
        }
    };
    let (h, m, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some(days * 86400 + h * 3600 + m * 60 + s)
}

fn parse_day(s: &str) -> Option<i64> {
    let mut it = s.split('-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let d: u32 = it.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

/// Where a line came from, for messages.
#[derive(Debug, Clone)]
pub struct Position<'f> {
    pub file: &'f Path,
    pub line: u64,
}

/// What reading one set of logs came to, besides the lines themselves.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ReadStats {
    pub files: Vec<PathBuf>,
    pub lines: u64,
    /// Lines that were not decision-log lines (not JSON, missing fields,
    /// too long, not UTF-8).
    pub unreadable: u64,
    /// The first unreadable line, as `file:line: what`.
    pub first_unreadable: Option<String>,
    pub bytes: u64,
}

/// Opens a log for reading: `-` is stdin; gzip is recognised by its magic
/// bytes, so `decisions.log.1.gz`, a gzip without the suffix and a plain file
/// named `.gz` all read.
pub fn open(path: &Path) -> io::Result<Box<dyn BufRead>> {
    let raw: Box<dyn Read> = if path == Path::new("-") {
        Box::new(io::stdin())
    } else {
        Box::new(File::open(path)?)
    };
    let mut r = BufReader::with_capacity(READ_BUF_BYTES, raw);
    let head = r.fill_buf()?;
    if head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b {
        Ok(Box::new(BufReader::with_capacity(
            READ_BUF_BYTES,
            MultiGzDecoder::new(r),
        )))
    } else {
        Ok(Box::new(r))
    }
}

/// Calls `f` with every readable line of every log, in order. Unreadable
/// lines are counted in the returned stats; a file that cannot be opened
/// or fails mid-way is an error naming it.
pub fn for_each_line(
    paths: &[PathBuf],
    mut f: impl FnMut(&LogLine<'_>, Position<'_>),
) -> Result<ReadStats, String> {
    let mut stats = ReadStats::default();
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    for path in paths {
        stats.files.push(path.clone());
        let mut r = open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut n: u64 = 0;
        loop {
            buf.clear();
            let got = read_line_bounded(&mut r, &mut buf)
                .map_err(|e| format!("{}: line {}: {e}", path.display(), n + 1))?;
            let Some(overlong) = got else { break };
            n += 1;
            stats.bytes += buf.len() as u64;
            let line = trim_newline(&buf);
            if line.is_empty() {
                continue;
            }
            stats.lines += 1;
            let parsed = if overlong {
                Err("longer than 1 MiB".to_string())
            } else {
                parse_line(line)
            };
            match parsed {
                Ok(l) => f(
                    &l,
                    Position {
                        file: path,
                        line: n,
                    },
                ),
                Err(e) => {
                    stats.unreadable += 1;
                    if stats.first_unreadable.is_none() {
                        stats.first_unreadable = Some(format!("{}:{n}: {e}", path.display()));
                    }
                }
            }
        }
    }
    Ok(stats)
}

/// One line of either format. egressd's own is tried first, so its lines
/// cost what they always did.
pub fn parse_line(line: &[u8]) -> Result<LogLine<'_>, String> {
    let egressd_err = match serde_json::from_slice::<LogLine<'_>>(line) {
        Ok(l) => return Ok(l),
        Err(e) => e,
    };
    if !line.windows(11).any(|w| w == b"\"class_uid\"") {
        return Err(egressd_err.to_string());
    }
    serde_json::from_slice::<OcsfLine<'_>>(line)
        .map_err(|e| format!("OCSF event: {e}"))?
        .into_line()
}

/// The attributes of an OCSF event (`record::ocsf`) the report reads.
#[derive(Debug, Deserialize)]
pub struct OcsfLine<'a> {
    class_uid: u32,
    #[serde(default)]
    activity_id: u32,
    time: i64,
    disposition_id: u32,
    #[serde(borrow, default)]
    status_code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status_detail: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    src_endpoint: Option<OcsfEndpoint<'a>>,
    #[serde(borrow, default)]
    dst_endpoint: Option<OcsfEndpoint<'a>>,
    #[serde(borrow, default)]
    http_request: Option<OcsfHttpRequest<'a>>,
    /// A WebSocket's open and close lines (Network Activity) carry its
    /// request's `url` here.
    #[serde(borrow, default)]
    url: Option<OcsfUrl<'a>>,
    #[serde(borrow, default)]
    query: Option<OcsfQuery<'a>>,
    #[serde(borrow, default)]
    policy: Option<OcsfPolicy<'a>>,
    #[serde(borrow, default)]
    unmapped: Option<OcsfUnmapped<'a>>,
}

#[derive(Debug, Deserialize)]
struct OcsfEndpoint<'a> {
    #[serde(borrow, default)]
    ip: Option<Cow<'a, str>>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    hostname: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct OcsfHttpRequest<'a> {
    #[serde(borrow, default)]
    http_method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    url: Option<OcsfUrl<'a>>,
}

#[derive(Debug, Deserialize)]
struct OcsfUrl<'a> {
    #[serde(borrow, default)]
    scheme: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    path: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct OcsfQuery<'a> {
    #[serde(borrow)]
    hostname: Cow<'a, str>,
    #[serde(borrow, default, rename = "type")]
    qtype: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct OcsfPolicy<'a> {
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    group: Option<OcsfGroup<'a>>,
}

#[derive(Debug, Deserialize)]
struct OcsfGroup<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct OcsfUnmapped<'a> {
    #[serde(borrow, default)]
    egressd: Option<OcsfEgressd<'a>>,
}

#[derive(Debug, Deserialize)]
struct OcsfEgressd<'a> {
    #[serde(borrow, default)]
    proto: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    mode: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    grant: Option<Cow<'a, str>>,
}

impl<'a> OcsfLine<'a> {
    /// The egressd line this event records. The protocol is egressd's
    /// own when the event names it, else the class's (HTTP Activity over
    /// `https` is an intercepted request).
    pub fn into_line(self) -> Result<LogLine<'a>, String> {
        let egressd = self.unmapped.and_then(|u| u.egressd);
        let (proto, mode, connect_method, id, grant) = match egressd {
            Some(e) => (e.proto, e.mode, e.method, e.id, e.grant),
            None => (None, None, None, None, None),
        };
        let http = self.http_request;
        let (method, url) = match http {
            Some(h) => (h.http_method, h.url),
            None => (None, None),
        };
        let (scheme, path) = match url.or(self.url) {
            Some(u) => (u.scheme, u.path),
            None => (None, None),
        };
        let proto = match (proto, self.class_uid) {
            (Some(p), _) => p,
            (None, 4001) => Cow::Borrowed("connect"),
            (None, 4003) => Cow::Borrowed("dns"),
            (None, 4002) if scheme.as_deref() == Some("https") => Cow::Borrowed("tls"),
            (None, 4002) => Cow::Borrowed("http"),
            (None, other) => return Err(format!("OCSF class {other} is not a decision")),
        };
        // Network Activity's Open and Close are a connection's two lines.
        let event = match (self.class_uid, self.activity_id) {
            (4001, 1) => Some(Cow::Borrowed("open")),
            (4001, 2) => Some(Cow::Borrowed("close")),
            _ => None,
        };
        let decision = match self.disposition_id {
            1 => "allow",
            _ => "deny",
        };
        let src = self.src_endpoint;
        let client = src.as_ref().and_then(|s| s.name.clone());
        let src = src.and_then(|s| {
            let ip = s.ip?;
            let port = s.port.unwrap_or(0);
            Some(Cow::Owned(if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }))
        });
        let (host, port) = match self.dst_endpoint {
            Some(d) => (d.hostname, d.port),
            None => (None, None),
        };
        let (exception, owner) = match self.policy {
            Some(p) => (p.uid, p.group.and_then(|g| g.name)),
            None => (None, None),
        };
        let (qname, qtype) = match self.query {
            Some(q) => (Some(q.hostname), q.qtype),
            None => (None, None),
        };
        Ok(LogLine {
            ts: Cow::Owned(crate::time::format_rfc3339_millis(self.time)),
            client: Some(client.unwrap_or(Cow::Borrowed("-"))),
            src,
            proto,
            host,
            port,
            method: method.or(connect_method),
            path,
            decision: Cow::Borrowed(decision),
            reason: self.status_code,
            exception,
            owner,
            mode,
            qname,
            qtype,
            note: self.status_detail,
            package: None,
            origin: None,
            grant,
            id,
            event,
        })
    }
}

fn trim_newline(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// Reads one line into `buf`, keeping at most [`MAX_LINE_BYTES`] of it
/// (the rest of a longer line is skipped). `None` at end of input;
/// `Some(true)` when the line was cut short.
fn read_line_bounded(r: &mut dyn BufRead, buf: &mut Vec<u8>) -> io::Result<Option<bool>> {
    let limit = MAX_LINE_BYTES as u64 + 1;
    let n = Read::take(&mut *r, limit).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.len() as u64 == limit && buf.last() != Some(&b'\n') {
        buf.truncate(MAX_LINE_BYTES);
        r.skip_until(b'\n')?;
        return Ok(Some(true));
    }
    Ok(Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        let mut c = None;
        assert_eq!(parse_ts("1970-01-01T00:00:00Z", &mut c), Some(0));
        assert_eq!(
            parse_ts("2026-11-29T20:00:00.123Z", &mut c),
            crate::time::parse_date("2026-11-29T20:00:00Z")
        );
        assert_eq!(
            parse_ts("2026-11-29T20:00:01.999Z", &mut c),
            crate::time::parse_date("2026-11-29T20:00:01Z")
        );
        assert_eq!(parse_ts("2026-11-29 20:00:00", &mut c), None);
        assert_eq!(parse_ts("2026-13-29T20:00:00Z", &mut None), None);
        assert_eq!(parse_ts("yesterday", &mut c), None);
    }

    #[test]
    fn sources() {
        assert_eq!(strip_port("10.0.0.1:5353"), "10.0.0.1");
        assert_eq!(strip_port("[::1]:5353"), "::1");
        assert_eq!(strip_port("-"), "-");
    }

    #[test]
    fn examples() {
        let l: LogLine = serde_json::from_str(
            r#"{"ts":"2026-11-29T20:00:00.123Z","client":"-","src":"10.1.2.3:4","proto":"http","host":"x.example","port":8080,"method":"POST","path":"/a","decision":"deny","reason":"no_exception","extra":1}"#,
        )
        .unwrap();
        assert_eq!(l.example(), "POST http://x.example:8080/a");
        assert_eq!(l.who(), "10.1.2.3");
        let l: LogLine = serde_json::from_str(
            r#"{"ts":"2026-11-29T20:00:00.123Z","client":"ci","proto":"connect","host":"2001:db8::1","port":443,"decision":"deny"}"#,
        )
        .unwrap();
        assert_eq!(l.example(), "CONNECT [2001:db8::1]:443");
        assert_eq!(l.who(), "ci");
    }

    #[test]
    fn bounded_lines() {
        let mut data = vec![b'x'; MAX_LINE_BYTES + 10];
        data.extend_from_slice(b"\nshort\nlast");
        let mut r = io::Cursor::new(data);
        let mut buf = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut buf).unwrap(), Some(true));
        assert_eq!(buf.len(), MAX_LINE_BYTES);
        buf.clear();
        assert_eq!(read_line_bounded(&mut r, &mut buf).unwrap(), Some(false));
        assert_eq!(buf, b"short\n");
        buf.clear();
        assert_eq!(read_line_bounded(&mut r, &mut buf).unwrap(), Some(false));
        assert_eq!(buf, b"last");
        buf.clear();
        assert_eq!(read_line_bounded(&mut r, &mut buf).unwrap(), None);
    }
}

/// The writer (`record`) and this reader agree: every event egressd can
/// write reads back with each field as it was.
#[cfg(test)]
mod round_trip {
    use std::borrow::Cow;
    use std::net::SocketAddr;
    use std::sync::Arc;

    use super::*;
    use crate::policy::{Logged, Mode, Proto, Reason};
    use crate::record::Event;
    use crate::time::format_rfc3339_millis;

    /// Strings that stress the writer's escaping: quotes, backslashes,
    /// control bytes at every offset of an eight-byte chunk, UTF-8.
    fn awkward() -> Vec<String> {
        let mut v: Vec<String> = [
            "",
            "plain",
            "a\"b\\c",
            "line\nbreak\r\ttab",
            "caf\u{e9} \u{1F600} \u{7f}",
            "\u{0}\u{1f}x\u{1b}[31m",
            "/simple/path/of/some/length/without/escapes",
        ]
        .map(String::from)
        .to_vec();
        for at in 0..10 {
            let mut s = vec![b'p'; 10];
            s[at] = if at % 2 == 0 { b'"' } else { 0x01 };
            v.push(String::from_utf8(s).unwrap());
        }
        v
    }

    fn events() -> Vec<Event> {
        let mut out = Vec::new();
        let srcs: [SocketAddr; 3] = [
            "10.8.3.7:51234".parse().unwrap(),
            "[2001:db8::7]:5353".parse().unwrap(),
            "[::ffff:1.2.3.4]:80".parse().unwrap(),
        ];
        let protos = Proto::ALL;
        for (i, text) in awkward().into_iter().enumerate() {
            let proto = protos[i % protos.len()];
            let mut ev = Event::new(proto, srcs[i % srcs.len()]);
            ev.ts_ms = 1_795_982_400_000 + (i as i64) * 86_399_777;
            ev.client = Arc::from(text.as_str());
            ev.host = Some(format!("h{i}.test"));
            ev.port = (i % 3 != 0).then_some(443 + i as u16);
            ev.addr = Some(srcs[(i + 1) % srcs.len()]);
            ev.method = (i % 2 == 0).then(|| "GET".to_string());
            ev.path = Some(text.clone());
            ev.decision = if i % 2 == 0 {
                Logged::Allow
            } else {
                Logged::Deny
            };
            ev.reason = Reason::ALL[i % Reason::ALL.len()];
            ev.exception = (i % 3 == 1).then(|| Arc::from(format!("exc-{text}")));
            ev.owner = (i % 3 == 1).then(|| Arc::from("team \"x\""));
            ev.mode = if i % 4 == 0 {
                Mode::Report
            } else {
                Mode::Enforce
            };
            ev.status = (i % 5 != 0).then_some(200 + i as u16);
            ev.bytes_up = i as u64 * 1000;
            ev.bytes_down = u64::MAX - i as u64;
            ev.duration_ms = i as u64;
            if proto == Proto::Dns {
                ev.qname = Some(format!("{text}.q.test"));
                ev.qtype = Some(Cow::Borrowed("TXT"));
                ev.rcode = Some(Cow::Borrowed("NOERROR"));
            }
            ev.error = (i % 2 == 1).then(|| format!("connect: {text}"));
            ev.note = (i % 3 == 2).then(|| text.clone());
            out.push(ev);
        }
        out
    }

    #[test]
    fn every_written_field_reads_back_as_it_was() {
        let events = events();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.log");
        let mut bytes = Vec::new();
        for ev in &events {
            ev.write_json(&mut bytes);
        }
        std::fs::write(&path, &bytes).unwrap();

        let mut read = 0;
        let mut day_cache = None;
        let stats = for_each_line(std::slice::from_ref(&path), |l, at| {
            let ev = &events[at.line as usize - 1];
            let s = |v: &Option<Cow<'_, str>>| v.as_deref().map(str::to_string);
            assert_eq!(l.ts, format_rfc3339_millis(ev.ts_ms));
            assert_eq!(
                parse_ts(&l.ts, &mut day_cache),
                Some(ev.ts_ms.div_euclid(1000))
            );
            assert_eq!(l.client(), &*ev.client);
            assert_eq!(s(&l.src), Some(ev.src.to_string()));
            assert_eq!(l.proto, ev.proto.as_str());
            assert_eq!(s(&l.host), ev.host);
            assert_eq!(l.port, ev.port);
            assert_eq!(s(&l.method), ev.method);
            assert_eq!(s(&l.path), ev.path);
            assert_eq!(l.decision, ev.decision.as_str());
            assert_eq!(l.allowed(), ev.decision == Logged::Allow);
            assert_eq!(l.reason(), ev.reason.as_str());
            assert_eq!(s(&l.exception), ev.exception.as_deref().map(str::to_string));
            assert_eq!(s(&l.owner), ev.owner.as_deref().map(str::to_string));
            assert_eq!(l.mode.as_deref(), Some(ev.mode.as_str()));
            assert_eq!(s(&l.qname), ev.qname);
            assert_eq!(s(&l.qtype), ev.qtype.as_deref().map(str::to_string));
            assert_eq!(s(&l.note), ev.note);
            read += 1;
        })
        .unwrap();
        assert_eq!((read, stats.unreadable), (events.len(), 0));

        // The fields the reader leaves alone are written as they were too.
        for (line, ev) in bytes.split(|b| *b == b'\n').zip(&events) {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            let addr = ev.addr.map(|a| a.to_string());
            assert_eq!(v["addr"].as_str(), addr.as_deref());
            assert_eq!(v["status"].as_u64(), ev.status.map(u64::from));
            assert_eq!(v["bytes_up"], ev.bytes_up);
            assert_eq!(v["bytes_down"], ev.bytes_down);
            assert_eq!(v["duration_ms"], ev.duration_ms);
            assert_eq!(v.get("rcode").and_then(|r| r.as_str()), ev.rcode.as_deref());
            assert_eq!(v.get("error").and_then(|e| e.as_str()), ev.error.as_deref());
        }
    }

    /// The same events written as OCSF read back with every field the
    /// report uses as it was; only what OCSF has no place for in a
    /// protocol's class (a DNS query's method and path, a tunnel's path)
    /// is absent.
    #[test]
    fn every_field_reads_back_from_ocsf_too() {
        let events = events();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.ocsf.log");
        let mut bytes = Vec::new();
        for ev in &events {
            ev.write_ocsf(&mut bytes);
        }
        std::fs::write(&path, &bytes).unwrap();
        let mut read = 0;
        let stats = for_each_line(std::slice::from_ref(&path), |l, at| {
            let ev = &events[at.line as usize - 1];
            let s = |v: &Option<Cow<'_, str>>| v.as_deref().map(str::to_string);
            let http = matches!(ev.proto, Proto::Http | Proto::Tls);
            assert_eq!(l.ts, format_rfc3339_millis(ev.ts_ms));
            assert_eq!(l.client(), &*ev.client);
            assert_eq!(s(&l.src), Some(ev.src.to_string()));
            assert_eq!(l.proto, ev.proto.as_str());
            assert_eq!(s(&l.host), ev.host);
            assert_eq!(l.port, ev.port);
            let method = if ev.proto == Proto::Dns {
                None
            } else {
                ev.method.clone()
            };
            assert_eq!(s(&l.method), method);
            assert_eq!(s(&l.path), if http { ev.path.clone() } else { None });
            assert_eq!(l.decision, ev.decision.as_str());
            assert_eq!(l.reason(), ev.reason.as_str());
            assert_eq!(s(&l.exception), ev.exception.as_deref().map(str::to_string));
            let owner = ev.exception.as_ref().and(ev.owner.as_deref());
            assert_eq!(s(&l.owner), owner.map(str::to_string));
            assert_eq!(l.mode.as_deref(), Some(ev.mode.as_str()));
            assert_eq!(s(&l.qname), ev.qname);
            assert_eq!(s(&l.qtype), ev.qtype.as_deref().map(str::to_string));
            assert_eq!(s(&l.note), ev.note);
            read += 1;
        })
        .unwrap();
        assert_eq!((read, stats.unreadable), (events.len(), 0));
    }

    /// A line that is neither format is unreadable, with the reason of the
    /// format it looks like.
    #[test]
    fn unreadable_lines_say_why() {
        assert!(parse_line(b"{\"class_uid\":4001}")
            .unwrap_err()
            .starts_with("OCSF event: missing field `time`"));
        assert!(parse_line(b"{\"proto\":\"dns\"}")
            .unwrap_err()
            .contains("missing field `ts`"));
    }

    #[test]
    fn an_ocsf_event_reads_back_its_request_id_and_grant() {
        use crate::policy::{Logged, Proto, Reason};
        use crate::record::Event;
        let mut ev = Event::new(Proto::Http, "10.8.3.7:51234".parse().unwrap());
        ev.host = Some("api.example.com".into());
        ev.decision = Logged::Deny;
        ev.reason = Reason::NoException;
        let mut out = Vec::new();
        ev.write_ocsf(&mut out);
        let l = parse_line(trim_newline(&out)).unwrap();
        assert_eq!(l.id.as_deref(), Some(ev.id.to_string().as_str()));
        assert!(!l.allowed());
        ev.decision = Logged::Allow;
        ev.reason = Reason::Exception;
        ev.exception = Some(std::sync::Arc::from("g-abc"));
        ev.grant = Some(std::sync::Arc::from("g-abc"));
        out.clear();
        ev.write_ocsf(&mut out);
        let l = parse_line(trim_newline(&out)).unwrap();
        assert_eq!((l.grant.as_deref(), l.id), (Some("g-abc"), None));
    }
}
