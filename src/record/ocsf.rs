//! The decision line as an OCSF 1.8.0 event (`--log-format ocsf`), for
//! SIEMs that ingest the Open Cybersecurity Schema Framework: HTTP Activity
//! (4002) for `http` and `tls`, Network Activity (4001) for `connect`, DNS
//! Activity (4003) for `dns`, each with the `security_control` profile, so
//! the outcome is `disposition_id` (Allowed 1, Blocked 2; a report-mode
//! pass is Detected 15) and the exception is `policy` (its id as `uid` and
//! `name`, its owner as `group.name`).
//!
//! Where the fields go: the client's address and named id are
//! `src_endpoint` (`ip`, `port`, `name`), the destination `dst_endpoint`
//! (`hostname` as requested, `ip` dialled, `port`), egressd's reason is
//! `status_code`, the line's `note` `status_detail`, bytes `traffic`,
//! `time` is the arrival in epoch milliseconds and `duration` milliseconds.
//! What OCSF has no attribute for (`proto`, `mode`, an upstream `error`,
//! a CONNECT's method, a dialled port that differs from the requested one,
//! the package gate's `package`, an upload budget's `upload` and egressd's own fetches' `origin`) is under `unmapped.egressd`. `report::read` reads these events back into the same
//! fields as an egressd line.
//!
//! Written by hand with the egressd line's helpers (one JSON object and a
//! newline); it owns the mapping only. Which format a line is written in
//! is chosen once per line by [`super::Recorder`].

use std::net::IpAddr;

use super::json::{ip, json_str, package, uint, upload, word};
use super::{Event, Phase};
use crate::policy::decision::enforced;
use crate::policy::{Logged, Proto};

/// The OCSF schema version the events follow.
pub const OCSF_VERSION: &str = "1.8.0";

const CATEGORY_NETWORK: u64 = 4;
const CLASS_NETWORK: u64 = 4001;
const CLASS_HTTP: u64 = 4002;
const CLASS_DNS: u64 = 4003;

/// HTTP Activity's activity ids by method (its `activity_id` enum).
const HTTP_ACTIVITIES: &[(&str, u64, &str)] = &[
    ("CONNECT", 1, "Connect"),
    ("DELETE", 2, "Delete"),
    ("GET", 3, "Get"),
    ("HEAD", 4, "Head"),
    ("OPTIONS", 5, "Options"),
    ("POST", 6, "Post"),
    ("PUT", 7, "Put"),
    ("TRACE", 8, "Trace"),
    ("PATCH", 9, "Patch"),
];

/// DNS Activity's `rcode_id` by mnemonic, with the caption OCSF gives it.
const RCODES: &[(&str, u64, &str)] = &[
    ("NOERROR", 0, "NoError"),
    ("FORMERR", 1, "FormError"),
    ("SERVFAIL", 2, "ServError"),
    ("NXDOMAIN", 3, "NXDomain"),
    ("NOTIMP", 4, "NotImp"),
    ("REFUSED", 5, "Refused"),
    ("YXDOMAIN", 6, "YXDomain"),
    ("YXRRSET", 7, "YXRRSet"),
    ("NXRRSET", 8, "NXRRSet"),
    ("NOTAUTH", 9, "NotAuth"),
    ("NOTZONE", 10, "NotZone"),
];

/// The outcome: (`action_id`, `action`, `disposition_id`, `disposition`),
/// from the decision and its reason, never from the answer's status: a
/// tunnel closed for `sni_mismatch` was answered `200` before its first
/// bytes were judged, and was blocked all the same.
fn outcome(ev: &Event) -> (u64, &'static str, u64, &'static str) {
    match ev.decision {
        Logged::Allow => (1, "Allowed", 1, "Allowed"),
        // Report mode logs a denial it let through as the denial it would
        // be: OCSF's "observed, no action taken". What report mode does
        // not relax (malformed, mismatched SNI, overload, …) was blocked.
        Logged::Deny if !enforced(ev.mode, ev.reason) => (3, "Observed", 15, "Detected"),
        Logged::Deny => (2, "Denied", 2, "Blocked"),
    }
}

impl Event {
    /// Appends the decision as one OCSF event (one JSON object and a
    /// newline) to `out`.
    pub fn write_ocsf(&self, out: &mut Vec<u8>) {
        // A long-lived connection's open and close lines are Network
        // Activity's Open and Close, whatever its protocol (a WebSocket's
        // request is its `url` and `unmapped.egressd.method`).
        let (class, class_name, activity, activity_name) = self.ocsf_class();
        let (_, _, disposition_id, _) = outcome(self);
        self.ocsf_head(out, (class, class_name), (activity, activity_name));
        out.extend_from_slice(b",\"src_endpoint\":{\"ip\":\"");
        ip(out, self.src.ip());
        out.extend_from_slice(b"\",\"port\":");
        uint(out, self.src.port().into());
        if &*self.client != "-" {
            out.extend_from_slice(b",\"name\":");
            json_str(out, &self.client);
        }
        out.push(b'}');

        let dialled = self.addr.map(|a| a.ip());
        if self.host.is_some() || dialled.is_some() {
            out.extend_from_slice(b",\"dst_endpoint\":{");
            let mut first = true;
            let mut sep = |out: &mut Vec<u8>| {
                if !std::mem::take(&mut first) {
                    out.push(b',');
                }
            };
            if let Some(h) = &self.host {
                sep(out);
                out.extend_from_slice(b"\"hostname\":");
                json_str(out, h);
            }
            if let Some(a) = dialled {
                sep(out);
                out.extend_from_slice(b"\"ip\":\"");
                ip(out, a);
                out.push(b'"');
            }
            if let Some(p) = self.port {
                sep(out);
                out.extend_from_slice(b"\"port\":");
                uint(out, p.into());
            }
            out.push(b'}');
        }

        match self.proto {
            Proto::Http | Proto::Tls | Proto::Connect => {
                out.extend_from_slice(
                    b",\"connection_info\":{\"direction_id\":2,\"direction\":\"Outbound\",\"protocol_name\":\"tcp\"}",
                );
                out.extend_from_slice(b",\"traffic\":{\"bytes_out\":");
                uint(out, self.bytes_up);
                out.extend_from_slice(b",\"bytes_in\":");
                uint(out, self.bytes_down);
                out.extend_from_slice(b",\"bytes\":");
                uint(out, self.bytes_up.saturating_add(self.bytes_down));
                out.push(b'}');
            }
            Proto::Dns => {}
        }
        match (class, self.proto) {
            (CLASS_HTTP, _) => self.http_objects(out),
            (CLASS_DNS, _) => self.dns_objects(out),
            (_, Proto::Http | Proto::Tls) if self.path.is_some() => {
                out.push(b',');
                self.url(out);
            }
            _ => {}
        }

        self.ocsf_policy(out, disposition_id == 1);
        self.ocsf_unmapped(out, class);
        out.extend_from_slice(b"}}}\n");
    }

    /// The OCSF class and activity (`class_uid`, its name, `activity_id`,
    /// its name).
    fn ocsf_class(&self) -> (u64, &'static str, u64, &str) {
        let (class, class_name) = match (self.event, self.proto) {
            (Some(_), _) | (None, Proto::Connect) => (CLASS_NETWORK, "Network Activity"),
            (None, Proto::Http | Proto::Tls) => (CLASS_HTTP, "HTTP Activity"),
            (None, Proto::Dns) => (CLASS_DNS, "DNS Activity"),
        };
        let (_, _, disposition_id, _) = outcome(self);
        let (activity, activity_name): (u64, &str) = match (self.event, self.proto) {
            (Some(Phase::Open), _) => (1, "Open"),
            (Some(Phase::Close), _) => (2, "Close"),
            (None, proto) => match proto {
                Proto::Http | Proto::Tls => match self.method.as_deref() {
                    None => (0, "Unknown"),
                    Some(m) => HTTP_ACTIVITIES
                        .iter()
                        .find(|(name, _, _)| *name == m)
                        .map(|(_, id, caption)| (*id, *caption))
                        .unwrap_or((99, m)),
                },
                Proto::Connect if disposition_id == 2 => (5, "Refuse"),
                Proto::Connect if self.error.is_some() => (4, "Fail"),
                Proto::Connect | Proto::Dns => (6, "Traffic"),
            },
        };
        (class, class_name, activity, activity_name)
    }

    /// From `activity_id` to `metadata`: what the event is, when, its
    /// outcome and the product.
    fn ocsf_head(
        &self,
        out: &mut Vec<u8>,
        (class, class_name): (u64, &str),
        (activity, activity_name): (u64, &str),
    ) {
        let (action_id, action, disposition_id, disposition) = outcome(self);
        let failed = disposition_id == 2 || self.error.is_some();

        out.extend_from_slice(b"{\"activity_id\":");
        uint(out, activity);
        out.extend_from_slice(b",\"activity_name\":");
        json_str(out, activity_name);
        out.extend_from_slice(b",\"category_uid\":");
        uint(out, CATEGORY_NETWORK);
        out.extend_from_slice(b",\"category_name\":\"Network Activity\",\"class_uid\":");
        uint(out, class);
        out.extend_from_slice(b",\"class_name\":");
        json_str(out, class_name);
        out.extend_from_slice(b",\"type_uid\":");
        uint(out, class * 100 + activity);
        out.extend_from_slice(b",\"type_name\":");
        json_str(out, &format!("{class_name}: {activity_name}"));
        if disposition_id == 1 {
            out.extend_from_slice(b",\"severity_id\":1,\"severity\":\"Informational\"");
        } else {
            out.extend_from_slice(b",\"severity_id\":2,\"severity\":\"Low\"");
        }
        out.extend_from_slice(b",\"time\":");
        int(out, self.ts_ms);
        out.extend_from_slice(b",\"duration\":");
        uint(out, self.duration_ms);
        if failed {
            out.extend_from_slice(b",\"status_id\":2,\"status\":\"Failure\"");
        } else {
            out.extend_from_slice(b",\"status_id\":1,\"status\":\"Success\"");
        }
        out.extend_from_slice(b",\"status_code\":");
        word(out, self.reason.as_str());
        if let Some(n) = &self.note {
            out.extend_from_slice(b",\"status_detail\":");
            json_str(out, n);
        }
        out.extend_from_slice(b",\"action_id\":");
        uint(out, action_id);
        out.extend_from_slice(b",\"action\":");
        word(out, action);
        out.extend_from_slice(b",\"disposition_id\":");
        uint(out, disposition_id);
        out.extend_from_slice(b",\"disposition\":");
        word(out, disposition);
        out.extend_from_slice(b",\"message\":");
        json_str(out, &self.summary(disposition));
        out.extend_from_slice(b",\"metadata\":{\"version\":\"");
        out.extend_from_slice(OCSF_VERSION.as_bytes());
        out.extend_from_slice(
            b"\",\"product\":{\"name\":\"egressd\",\"vendor_name\":\"egressd\",\"version\":\"",
        );
        out.extend_from_slice(env!("CARGO_PKG_VERSION").as_bytes());
        out.extend_from_slice(
            b"\"},\"profiles\":[\"security_control\"],\"log_name\":\"decisions\"}",
        );
    }

    /// The exception that decided, as OCSF's `policy` object.
    fn ocsf_policy(&self, out: &mut Vec<u8>, applied: bool) {
        if let Some(id) = &self.exception {
            out.extend_from_slice(b",\"policy\":{\"uid\":");
            json_str(out, id);
            out.extend_from_slice(b",\"name\":");
            json_str(out, id);
            out.extend_from_slice(b",\"type\":\"egressd exception\",\"is_applied\":");
            out.extend_from_slice(if applied { b"true" } else { b"false" });
            if let Some(owner) = &self.owner {
                out.extend_from_slice(b",\"group\":{\"name\":");
                json_str(out, owner);
                out.push(b'}');
            }
            out.push(b'}');
        }
    }

    /// What OCSF has no field for, under `unmapped.egressd` (left open:
    /// the caller closes it).
    fn ocsf_unmapped(&self, out: &mut Vec<u8>, class: u64) {
        out.extend_from_slice(b",\"unmapped\":{\"egressd\":{\"proto\":");
        word(out, self.proto.as_str());
        out.extend_from_slice(b",\"mode\":");
        word(out, self.mode.as_str());
        if class == CLASS_NETWORK {
            if let Some(m) = &self.method {
                out.extend_from_slice(b",\"method\":");
                json_str(out, m);
            }
        }
        if class == CLASS_NETWORK && self.proto != Proto::Connect {
            if let Some(st) = self.status {
                out.extend_from_slice(b",\"status\":");
                uint(out, st.into());
            }
        }
        // The request's id where egressd's own line has it: a denial's (the
        // one `egressd grant` takes) and a connection's two events' (which
        // it pairs); and the grant that allowed the request.
        if self.decision == Logged::Deny || self.event.is_some() {
            out.extend_from_slice(b",\"id\":\"");
            out.extend_from_slice(&self.id.as_bytes());
            out.push(b'"');
        }
        if let Some(g) = &self.grant {
            out.extend_from_slice(b",\"grant\":");
            json_str(out, g);
        }
        if let Some(e) = &self.error {
            out.extend_from_slice(b",\"error\":");
            json_str(out, e);
        }
        if let Some(p) = &self.package {
            out.extend_from_slice(b",\"package\":");
            package(out, p);
        }
        if let Some(u) = &self.upload {
            out.extend_from_slice(b",\"upload\":");
            upload(out, u);
        }
        if let Some(o) = self.origin {
            out.extend_from_slice(b",\"origin\":");
            json_str(out, o);
        }
        if let Some(a) = self.addr {
            if self.port != Some(a.port()) {
                out.extend_from_slice(b",\"addr\":");
                json_str(out, &a.to_string());
            }
        }
    }

    fn http_objects(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b",\"http_request\":{");
        let mut any = false;
        if let Some(m) = &self.method {
            out.extend_from_slice(b"\"http_method\":");
            json_str(out, m);
            any = true;
        }
        // OCSF's url needs a path (or the whole URL); without one there is
        // no url object, and the host is still dst_endpoint's.
        if self.path.is_some() {
            if any {
                out.push(b',');
            }
            self.url(out);
        }
        out.push(b'}');
        if let Some(s) = self.status {
            out.extend_from_slice(b",\"http_response\":{\"code\":");
            uint(out, s.into());
            out.push(b'}');
        }
    }

    /// `"url":{…}` of a request with a path.
    fn url(&self, out: &mut Vec<u8>) {
        if let Some(path) = &self.path {
            out.extend_from_slice(b"\"url\":{\"scheme\":");
            word(
                out,
                if self.proto == Proto::Tls {
                    "https"
                } else {
                    "http"
                },
            );
            if let Some(h) = &self.host {
                out.extend_from_slice(b",\"hostname\":");
                json_str(out, h);
            }
            if let Some(p) = self.port {
                out.extend_from_slice(b",\"port\":");
                uint(out, p.into());
            }
            out.extend_from_slice(b",\"path\":");
            json_str(out, path);
            out.push(b'}');
        }
    }

    fn dns_objects(&self, out: &mut Vec<u8>) {
        if let Some(q) = &self.qname {
            out.extend_from_slice(b",\"query\":{\"hostname\":");
            json_str(out, q);
            if let Some(t) = &self.qtype {
                out.extend_from_slice(b",\"type\":");
                json_str(out, t);
            }
            out.push(b'}');
        }
        if let Some(r) = &self.rcode {
            let (id, caption) = RCODES
                .iter()
                .find(|(m, _, _)| *m == &**r)
                .map(|(_, id, c)| (*id, *c))
                .unwrap_or((99, r));
            out.extend_from_slice(b",\"rcode_id\":");
            uint(out, id);
            out.extend_from_slice(b",\"rcode\":");
            json_str(out, caption);
        }
    }

    /// `Blocked CONNECT pypi.org:443: no_exception`, for a person reading the SIEM.
    fn summary(&self, disposition: &str) -> String {
        let what = match self.proto {
            Proto::Dns => format!(
                "DNS {} {}",
                self.qname.as_deref().unwrap_or("?"),
                self.qtype.as_deref().unwrap_or("?")
            ),
            _ => {
                let host = self.host.as_deref().unwrap_or("?");
                let host = match host.parse::<IpAddr>() {
                    Ok(IpAddr::V6(_)) => format!("[{host}]"),
                    _ => host.to_string(),
                };
                let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
                match self.proto {
                    Proto::Connect => format!("CONNECT {host}{port}"),
                    _ => format!(
                        "{} {}://{host}{port}{}",
                        self.method.as_deref().unwrap_or("?"),
                        if self.proto == Proto::Tls {
                            "https"
                        } else {
                            "http"
                        },
                        self.path.as_deref().unwrap_or("")
                    ),
                }
            }
        };
        match &self.exception {
            Some(e) if self.decision == Logged::Allow => {
                format!("{disposition} {what} by exception {e}")
            }
            _ => format!("{disposition} {what}: {}", self.reason.as_str()),
        }
    }
}

/// Decimal digits of a signed `v`.
fn int(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    uint(out, v.unsigned_abs());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Mode, Reason};
    use std::sync::Arc;

    fn event(ev: &Event) -> serde_json::Value {
        let mut out = Vec::new();
        ev.write_ocsf(&mut out);
        assert_eq!(out.last(), Some(&b'\n'), "one line, newline-terminated");
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        serde_json::from_slice(&out).expect("valid JSON")
    }

    #[test]
    fn an_allowed_connect_is_network_activity_with_its_policy() {
        let mut ev = Event::new(Proto::Connect, "10.8.3.7:51234".parse().unwrap());
        ev.ts_ms = 1_795_982_400_123;
        ev.client = Arc::from("ci-runner");
        ev.host = Some("pypi.org".into());
        ev.port = Some(443);
        ev.addr = Some("151.101.0.223:443".parse().unwrap());
        ev.method = Some("CONNECT".into());
        ev.decision = Logged::Allow;
        ev.reason = Reason::Exception;
        ev.exception = Some(Arc::from("pypi"));
        ev.owner = Some(Arc::from("platform \"team\""));
        ev.status = Some(200);
        ev.bytes_up = 512;
        ev.bytes_down = 81234;
        ev.duration_ms = 120;
        let v = event(&ev);
        assert_eq!(v["class_uid"], 4001);
        assert_eq!(v["type_uid"], 400106);
        assert_eq!(v["time"], 1_795_982_400_123i64);
        assert_eq!(v["disposition_id"], 1);
        assert_eq!(v["disposition"], "Allowed");
        assert_eq!(v["status_code"], "exception");
        assert_eq!(v["policy"]["uid"], "pypi");
        assert_eq!(v["policy"]["group"]["name"], "platform \"team\"");
        assert_eq!(v["policy"]["is_applied"], true);
        assert_eq!(v["src_endpoint"]["ip"], "10.8.3.7");
        assert_eq!(v["src_endpoint"]["name"], "ci-runner");
        assert_eq!(v["dst_endpoint"]["hostname"], "pypi.org");
        assert_eq!(v["dst_endpoint"]["ip"], "151.101.0.223");
        assert_eq!(v["traffic"]["bytes"], 81746);
        assert_eq!(
            v["message"],
            "Allowed CONNECT pypi.org:443 by exception pypi"
        );
        assert_eq!(v["unmapped"]["egressd"]["proto"], "connect");
        assert_eq!(v["metadata"]["product"]["name"], "egressd");
    }

    #[test]
    fn denials_and_report_mode() {
        let mut ev = Event::new(Proto::Http, "[2001:db8::7]:5353".parse().unwrap());
        ev.host = Some("evil.example".into());
        ev.port = Some(80);
        ev.method = Some("PROPFIND".into());
        ev.path = Some("/a\"b".into());
        ev.set_denied(Reason::NoException);
        ev.status = Some(403);
        let v = event(&ev);
        assert_eq!(
            (v["class_uid"].clone(), v["activity_id"].clone()),
            (4002.into(), 99.into())
        );
        assert_eq!(v["activity_name"], "PROPFIND");
        assert_eq!(v["disposition_id"], 2);
        assert_eq!(v["action"], "Denied");
        assert_eq!(v["src_endpoint"]["ip"], "2001:db8::7");
        assert_eq!(v["http_request"]["url"]["path"], "/a\"b");
        assert_eq!(v["http_response"]["code"], 403);
        assert!(v.get("policy").is_none());
        assert_eq!(
            v["message"],
            "Blocked PROPFIND http://evil.example:80/a\"b: no_exception"
        );
        // Report mode: the denial it would be, let through.
        ev.mode = Mode::Report;
        ev.status = Some(200);
        let v = event(&ev);
        assert_eq!(
            (v["action_id"].clone(), v["disposition_id"].clone()),
            (3.into(), 15.into())
        );
        // …but what report mode does not relax was blocked all the same,
        // whatever the status: a tunnel is answered 200 before its
        // ClientHello is judged.
        for reason in [
            Reason::SniMismatch,
            Reason::Malformed,
            Reason::PrivateAddress,
        ] {
            ev.set_denied(reason);
            let v = event(&ev);
            assert_eq!(
                (v["action_id"].clone(), v["disposition_id"].clone()),
                (2.into(), 2.into()),
                "{reason:?}"
            );
        }
    }

    #[test]
    fn dns_queries_carry_query_and_rcode() {
        let mut ev = Event::new(Proto::Dns, "127.0.0.1:5300".parse().unwrap());
        ev.qname = Some("evil.example".into());
        ev.qtype = Some("TXT".into());
        ev.rcode = Some("REFUSED".into());
        ev.set_denied(Reason::QtypeNotAllowed);
        let v = event(&ev);
        assert_eq!(v["class_uid"], 4003);
        assert_eq!(v["type_uid"], 400306);
        assert_eq!(v["query"]["hostname"], "evil.example");
        assert_eq!(v["query"]["type"], "TXT");
        assert_eq!(
            (v["rcode_id"].clone(), v["rcode"].clone()),
            (5.into(), "Refused".into())
        );
        assert!(v.get("dst_endpoint").is_none());
        assert!(v.get("traffic").is_none());
    }

    #[test]
    fn a_denial_carries_its_request_id_and_a_granted_request_its_grant() {
        let mut ev = Event::new(Proto::Http, "10.8.3.7:51234".parse().unwrap());
        ev.host = Some("api.example.com".into());
        ev.decision = Logged::Deny;
        ev.reason = crate::policy::Reason::NoException;
        let v = event(&ev);
        assert_eq!(v["unmapped"]["egressd"]["id"], ev.id.to_string());
        assert!(v["unmapped"]["egressd"].get("grant").is_none());
        ev.decision = Logged::Allow;
        ev.reason = crate::policy::Reason::Exception;
        ev.exception = Some(std::sync::Arc::from("g-abc"));
        ev.grant = Some(std::sync::Arc::from("g-abc"));
        let v = event(&ev);
        assert_eq!(v["unmapped"]["egressd"]["grant"], "g-abc");
        assert!(v["unmapped"]["egressd"].get("id").is_none());
    }
}
