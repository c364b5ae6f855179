//! The decision-log line's JSON, written by hand: it is the one thing every
//! request and query pays for, and serde's derive spent most of its time in
//! generic string escaping and number formatting. Every piece is tested
//! against its reference (serde_json, `Display`, the RFC 3339 formatter).

use std::net::SocketAddr;

use super::Event;
use crate::time::format_rfc3339_millis;

impl Event {
    /// Appends the decision-log line (one JSON object and a newline) to
    /// `out`, its fields in the order docs/log.md shows.
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
        word(out, self.decision.as_str());
        out.extend_from_slice(b",\"reason\":");
        word(out, self.reason.as_str());
        out.extend_from_slice(b",\"exception\":");
        opt_str(out, self.exception.as_deref());
        out.extend_from_slice(b",\"owner\":");
        opt_str(out, self.owner.as_deref());
        out.extend_from_slice(b",\"mode\":");
        word(out, self.mode.as_str());
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
        self.write_optional(out);
        out.extend_from_slice(b"}\n");
    }

    /// The fields a line has only when they apply: the event and id, the
    /// grant, package, git and origin objects, the DNS and error texts.
    fn write_optional(&self, out: &mut Vec<u8>) {
        if let Some(e) = self.event {
            out.extend_from_slice(b",\"event\":");
            word(out, e.as_str());
        }
        // The id pairs a connection's close line with its open line.
        if self.decision == crate::policy::Logged::Deny || self.event.is_some() {
            out.extend_from_slice(b",\"id\":\"");
            out.extend_from_slice(&self.id.as_bytes());
            out.push(b'"');
        }
        if let Some(g) = &self.grant {
            out.extend_from_slice(b",\"grant\":");
            json_str(out, g);
        }
        if let Some(p) = &self.package {
            out.extend_from_slice(b",\"package\":");
            package(out, p);
        }
        if let Some(g) = &self.git {
            out.extend_from_slice(b",\"git\":");
            git(out, g);
        }
        if let Some(u) = &self.upload {
            out.extend_from_slice(b",\"upload\":");
            upload(out, u);
        }
        if let Some(o) = self.origin {
            out.extend_from_slice(b",\"origin\":");
            json_str(out, o);
        }
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
    }
}

/// The `upload` object: `{budget, used, crossed}`, as charged so far.
pub(super) fn upload(out: &mut Vec<u8>, u: &super::UploadLine) {
    use std::sync::atomic::Ordering::Relaxed;
    out.extend_from_slice(b"{\"budget\":");
    uint(out, u.budget);
    out.extend_from_slice(b",\"used\":");
    uint(out, u.used.load(Relaxed));
    out.extend_from_slice(b",\"crossed\":");
    out.extend_from_slice(if u.crossed.load(Relaxed) {
        b"true"
    } else {
        b"false"
    });
    out.push(b'}');
}

/// The `package` object: `{ecosystem, name, version, set}` and, for a
/// filtered index only, `versions_hidden`.
pub(super) fn package(out: &mut Vec<u8>, p: &super::PackageLine) {
    out.extend_from_slice(b"{\"ecosystem\":");
    word(out, p.ecosystem.as_str());
    out.extend_from_slice(b",\"name\":");
    opt_str(out, p.name.as_deref());
    out.extend_from_slice(b",\"version\":");
    opt_str(out, p.version.as_deref());
    out.extend_from_slice(b",\"set\":");
    opt_str(out, p.set.as_deref());
    if let Some(n) = p.versions_hidden() {
        out.extend_from_slice(b",\"versions_hidden\":");
        uint(out, n);
    }
    out.push(b'}');
}

/// The `git` object: `{repo, service, refs: [{ref, old, new, verdict}], pack_bytes}`.
pub(super) fn git(out: &mut Vec<u8>, g: &super::GitLine) {
    out.extend_from_slice(b"{\"repo\":");
    json_str(out, &g.repo);
    out.extend_from_slice(b",\"service\":");
    word(out, g.service);
    if !g.refs.is_empty() {
        out.extend_from_slice(b",\"refs\":[");
        for (i, r) in g.refs.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"ref\":");
            json_str(out, &r.name);
            out.extend_from_slice(b",\"old\":");
            json_str(out, &r.old);
            out.extend_from_slice(b",\"new\":");
            json_str(out, &r.new);
            out.extend_from_slice(b",\"verdict\":");
            word(out, r.verdict);
            out.push(b'}');
        }
        out.push(b']');
    }
    if let Some(n) = g.pack_bytes {
        out.extend_from_slice(b",\"pack_bytes\":");
        uint(out, n);
    }
    out.push(b'}');
}

pub(super) fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// A JSON string: `"`, `\\` and control characters escaped (the short
/// forms where JSON has them, `\u00XX` otherwise), everything else,
/// UTF-8 included, copied in runs. Clean stretches are skipped eight bytes
/// at a time.
pub(super) fn json_str(out: &mut Vec<u8>, s: &str) {
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
pub(super) fn uint(out: &mut Vec<u8>, mut v: u64) {
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
pub(super) fn word(out: &mut Vec<u8>, w: &'static str) {
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

/// An address as `IpAddr`'s `Display` writes it (the OCSF writer's; the
/// decision line keeps its own copy in [`socket_addr`], one call fewer).
pub(super) fn ip(out: &mut Vec<u8>, a: std::net::IpAddr) {
    match a {
        std::net::IpAddr::V4(v4) => ipv4(out, v4),
        std::net::IpAddr::V6(_) => {
            use std::io::Write;
            let _ = write!(out, "{a}");
        }
    }
}

fn ipv4(out: &mut Vec<u8>, a: std::net::Ipv4Addr) {
    let mut buf = [0u8; 15];
    let mut n = 0;
    for (i, octet) in a.octets().into_iter().enumerate() {
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
    out.extend_from_slice(&buf[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Logged, Proto, Reason};
    use std::sync::Arc;

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
        ev.decision = Logged::Allow;
        ev.reason = Reason::Exception;
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
    fn package_requests_carry_their_package_and_own_fetches_their_origin() {
        use crate::packages::decide::PackageReason;
        use crate::packages::Ecosystem;
        let mut ev = Event::new(Proto::Tls, "10.0.0.1:1".parse().unwrap());
        assert!(line(&ev).get("package").is_none());
        assert!(line(&ev).get("origin").is_none());
        ev.package = Some(Box::new(crate::record::PackageLine {
            ecosystem: Ecosystem::Pypi,
            name: Some("requests".into()),
            version: None,
            set: Some(Arc::from("py-agent-runtime")),
            reason: None,
            hidden: Some(vec![
                (PackageReason::TooNew, 2),
                (PackageReason::VersionNotApproved, 1),
            ]),
            did_you_mean: None,
        }));
        ev.origin = Some("egressd");
        let v = line(&ev);
        assert_eq!(
            v["package"],
            serde_json::json!({"ecosystem": "pypi", "name": "requests", "version": null,
                               "set": "py-agent-runtime", "versions_hidden": 3})
        );
        assert_eq!(v["origin"], "egressd");
        // A download: a version, no versions_hidden.
        let p = ev.package.as_mut().unwrap();
        p.version = Some("2.32.\"3".into());
        p.hidden = None;
        p.set = None;
        let v = line(&ev);
        assert_eq!(
            v["package"],
            serde_json::json!({"ecosystem": "pypi", "name": "requests", "version": "2.32.\"3", "set": null})
        );
        let mut o = Vec::new();
        ev.write_ocsf(&mut o);
        let o: serde_json::Value = serde_json::from_slice(&o).unwrap();
        assert_eq!(o["unmapped"]["egressd"]["package"], v["package"]);
        assert_eq!(o["unmapped"]["egressd"]["origin"], "egressd");
    }

    /// A connection's open and close lines, against the same object built
    /// by serde_json: `event` and the `id` that pairs them (written on an
    /// allowed line only for these), and a short request's line has neither.
    #[test]
    fn open_and_close_lines_match_serde_json() {
        use crate::record::Phase;
        let mut ev = Event::new(Proto::Connect, "10.8.3.7:51234".parse().unwrap());
        ev.ts_ms = 1_795_982_400_123;
        ev.host = Some("pypi.org".into());
        ev.port = Some(443);
        ev.addr = Some("151.101.0.223:443".parse().unwrap());
        ev.method = Some("CONNECT".into());
        ev.decision = Logged::Allow;
        ev.reason = Reason::Exception;
        ev.exception = Some(Arc::from("pypi"));
        ev.owner = Some(Arc::from("platform-team"));
        ev.status = Some(200);
        let short = line(&ev);
        assert!(short.get("event").is_none() && short.get("id").is_none());
        let id = ev.id.to_string();
        for (phase, up, down, ms) in [(Phase::Open, 0, 0, 0), (Phase::Close, 512, 81234, 3600)] {
            ev.event = Some(phase);
            (ev.bytes_up, ev.bytes_down, ev.duration_ms) = (up, down, ms);
            let want = serde_json::json!({
                "ts": "2026-11-29T20:00:00.123Z", "client": "-", "src": "10.8.3.7:51234",
                "proto": "connect", "host": "pypi.org", "port": 443,
                "addr": "151.101.0.223:443", "method": "CONNECT", "path": null,
                "decision": "allow", "reason": "exception", "exception": "pypi",
                "owner": "platform-team", "mode": "enforce", "status": 200,
                "bytes_up": up, "bytes_down": down, "duration_ms": ms,
                "event": phase.as_str(), "id": id,
            });
            assert_eq!(line(&ev), want, "{phase:?}");
        }
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

    /// The `upload` object says what was charged when the line is written.
    #[test]
    fn the_upload_object_is_read_when_written() {
        use std::sync::atomic::Ordering::Relaxed;
        let mut ev = Event::new(Proto::Http, "127.0.0.1:1".parse().unwrap());
        assert!(line(&ev).get("upload").is_none());
        let u = std::sync::Arc::new(crate::record::UploadLine {
            budget: 10 << 20,
            ..Default::default()
        });
        ev.upload = Some(u.clone());
        u.used.store(600, Relaxed);
        u.crossed.store(true, Relaxed);
        assert_eq!(
            line(&ev)["upload"],
            serde_json::json!({"budget": 10485760, "used": 600, "crossed": true})
        );
    }
}
