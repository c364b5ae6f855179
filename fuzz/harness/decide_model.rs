//! `Policy::decide` against a small reference model. The input picks a
//! policy (up to four exceptions over a small vocabulary of hosts, ranges,
//! ports, methods, paths, clients, expiry and DNS types) and a request;
//! the policy is written as YAML and compiled the real way, and its
//! decision must equal the one the model derives from the documented
//! semantics by brute force: every exception, in load order, matched with
//! plain string and range comparisons (no index, no hashing).

use std::fmt::Write as _;
use std::net::IpAddr;

use egressd::policy::host::parse_target;
use egressd::policy::{from_yaml, Request};
use egressd::policy::{Proto, Reason, Verdict};

use super::Bytes;

const NOW: i64 = 2_000_000_000;

const HOSTS: &[&str] = &[
    "a.test",
    "b.a.test",
    "c.b.a.test",
    "*.a.test",
    "*.b.a.test",
    "api-*.a.test",
    "*z.b.a.test",
    "x.test",
];
const CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "10.1.0.0/16",
    "127.0.0.1/32",
    "::1/128",
    "fd00::/8",
    "8.8.8.0/24",
];
const PORTS: &[u16] = &[80, 443, 8080];
const METHODS: &[&str] = &["GET", "POST"];
const PATHS: &[&str] = &["/a/**", "/b/*"];
const TYPES: &[&str] = &["TXT", "MX"];

/// Request targets: names (in odd spellings too) and addresses.
const TARGETS: &[&str] = &[
    "a.test",
    "A.TEST.",
    "b.a.test",
    "c.b.a.test",
    "d.c.b.a.test",
    "api-1.a.test",
    "api-.a.test",
    "api-1.x.a.test",
    "z.b.a.test",
    "zz.b.a.test",
    "za.b.a.test",
    "x.test",
    "evil.test",
    "a.test.evil.test",
    "xa.test",
    "10.1.2.3",
    "10.2.0.1",
    "127.0.0.1",
    "::1",
    "fd00::5",
    "8.8.8.8",
    "8.8.4.4",
];
const REQ_PORTS: &[u16] = &[80, 443, 8080, 22];
const REQ_METHODS: &[&str] = &["GET", "POST", "DELETE"];
const REQ_PATHS: &[&str] = &["/a/x", "/a/x/y", "/b/y", "/b/y/z", "/c"];
/// A, TXT, MX, ANY, NULL, AXFR, HTTPS.
const QTYPES: &[u16] = &[1, 16, 15, 255, 10, 252, 65];

#[derive(Debug)]
struct Exc {
    id: String,
    hosts: Vec<&'static str>,
    cidrs: Vec<&'static str>,
    ports: Option<Vec<u16>>,
    methods: Option<Vec<&'static str>>,
    paths: Option<Vec<&'static str>>,
    clients: Option<Vec<&'static str>>,
    expired: Option<bool>,
    dns_types: Vec<&'static str>,
}

impl Exc {
    fn ports(&self) -> Vec<u16> {
        self.ports.clone().unwrap_or_else(|| vec![80, 443])
    }
    fn needs_inspection(&self) -> bool {
        self.methods.is_some() || self.paths.is_some()
    }
}

fn gen(b: &mut Bytes) -> (Vec<Exc>, bool) {
    let report = b.byte() < 32;
    let n = 1 + b.pick(4);
    let mut out = Vec::new();
    for i in 0..n {
        let mut hosts = b.subset(HOSTS);
        let cidrs = b.subset(CIDRS);
        if hosts.is_empty() && cidrs.is_empty() {
            hosts.push(HOSTS[b.pick(HOSTS.len())]);
        }
        let ports = b.bool().then(|| b.subset(PORTS)).filter(|p| !p.is_empty());
        let methods = b
            .bool()
            .then(|| b.subset(METHODS))
            .filter(|m| !m.is_empty());
        let paths = b.bool().then(|| b.subset(PATHS)).filter(|p| !p.is_empty());
        let clients = match b.pick(4) {
            1 => Some(vec!["ci-*"]),
            2 => Some(vec!["agent"]),
            _ => None,
        };
        let expired = match b.pick(6) {
            0 => Some(true),
            1 => Some(false),
            _ => None,
        };
        let dns_types = b.subset(TYPES);
        out.push(Exc {
            id: format!("e{i}"),
            hosts,
            cidrs,
            ports,
            methods,
            paths,
            clients,
            expired,
            dns_types,
        });
    }
    (out, report)
}

fn yaml(excs: &[Exc], report: bool) -> String {
    let mut y = String::from("settings:\n");
    if report {
        y.push_str("  mode: report\n");
    }
    y.push_str("  clients:\n    - id: ci-runner\n      sources: [10.8.0.0/16]\n    - id: agent\n      sources: [10.9.0.0/16]\n");
    y.push_str("exceptions:\n");
    let list = |v: &[&str]| {
        v.iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for e in excs {
        let _ = writeln!(y, "  - id: {}\n    owner: o\n    reason: r", e.id);
        if !e.hosts.is_empty() {
            let _ = writeln!(y, "    hosts: [{}]", list(&e.hosts));
        }
        if !e.cidrs.is_empty() {
            let _ = writeln!(y, "    cidrs: [{}]", list(&e.cidrs));
        }
        if let Some(p) = &e.ports {
            let p: Vec<String> = p.iter().map(u16::to_string).collect();
            let _ = writeln!(y, "    ports: [{}]", p.join(", "));
        }
        if let Some(m) = &e.methods {
            let _ = writeln!(y, "    methods: [{}]", list(m));
        }
        if let Some(p) = &e.paths {
            let _ = writeln!(y, "    paths: [{}]", list(p));
        }
        if let Some(c) = &e.clients {
            let _ = writeln!(y, "    clients: [{}]", list(c));
        }
        match e.expired {
            Some(true) => y.push_str("    expires: 2020-01-01\n"),
            Some(false) => y.push_str("    expires: 2099-01-01\n"),
            None => {}
        }
        if !e.dns_types.is_empty() {
            let _ = writeln!(y, "    dns_types: [{}]", e.dns_types.join(", "));
        }
    }
    y
}

// ------------------------------------------------------------------ model

/// The documented host-pattern semantics, by plain string comparison on
/// the name as the client spelled it (lower-cased, one trailing dot off).
fn host_matches(pattern: &str, spelled: &str) -> bool {
    let name = spelled
        .strip_suffix('.')
        .unwrap_or(spelled)
        .to_ascii_lowercase();
    if let Some(rest) = pattern.strip_prefix("*.") {
        return name.len() > rest.len() + 1 && name.ends_with(&format!(".{rest}"));
    }
    if let Some((first, rest)) = pattern.split_once('.') {
        if let Some((pre, suf)) = first.split_once('*') {
            return match name.split_once('.') {
                Some((label, r)) => {
                    r == rest
                        && label.len() >= pre.len() + suf.len()
                        && label.starts_with(pre)
                        && label.ends_with(suf)
                }
                None => false,
            };
        }
    }
    name == pattern
}

fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    let (net, len) = cidr.split_once('/').unwrap();
    let len: u32 = len.parse().unwrap();
    match (net.parse::<IpAddr>().unwrap(), ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(n) & m == u32::from(a) & m
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(n) & m == u128::from(a) & m
        }
        _ => false,
    }
}

/// `/a/**`: anything below /a/; `/b/*`: one segment below /b/.
fn path_matches(pattern: &str, path: &str) -> bool {
    match pattern {
        "/a/**" => path.starts_with("/a/"),
        "/b/*" => path
            .strip_prefix("/b/")
            .is_some_and(|r| !r.is_empty() && !r.contains('/')),
        _ => unreachable!(),
    }
}

fn qtype_allowed(e: &Exc, t: u16) -> bool {
    let name = match t {
        16 => "TXT",
        15 => "MX",
        _ => "",
    };
    // ANY, NULL, AXFR, IXFR: never, and only once a name is covered (a
    // name no exception covers is `no_exception` whatever its type).
    ![10, 251, 252, 255].contains(&t)
        && ([1, 5, 28, 64, 65].contains(&t) || e.dns_types.contains(&name))
}

/// How far a failing exception got (the furthest explains a denial).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Expired,
    Client,
    Port,
    Qtype,
    Method,
    Path,
    Inspection,
}

struct Req<'a> {
    proto: Proto,
    client: Option<&'static str>,
    target: &'a str,
    ip: Option<IpAddr>,
    port: u16,
    method: &'static str,
    path: &'static str,
    qtype: u16,
    intercept: bool,
}

/// Ok(needs inspection) if `e` allows `r`, else the stage it failed at.
fn evaluate(e: &Exc, r: &Req) -> Result<bool, Stage> {
    if e.expired == Some(true) {
        return Err(Stage::Expired);
    }
    if let Some(pats) = &e.clients {
        let ok = match (r.client, pats[0]) {
            (Some(c), "ci-*") => c.starts_with("ci-"),
            (Some(c), p) => c == p,
            (None, _) => false,
        };
        if !ok {
            return Err(Stage::Client);
        }
    }
    match r.proto {
        Proto::Dns => {
            if !qtype_allowed(e, r.qtype) {
                return Err(Stage::Qtype);
            }
            Ok(false)
        }
        Proto::Connect => {
            if !e.ports().contains(&r.port) {
                return Err(Stage::Port);
            }
            if e.needs_inspection() {
                return if r.intercept {
                    Ok(true)
                } else {
                    Err(Stage::Inspection)
                };
            }
            Ok(false)
        }
        Proto::Http | Proto::Tls => {
            if !e.ports().contains(&r.port) {
                return Err(Stage::Port);
            }
            if let Some(m) = &e.methods {
                if !m.contains(&r.method) {
                    return Err(Stage::Method);
                }
            }
            if let Some(p) = &e.paths {
                if !p.iter().any(|p| path_matches(p, r.path)) {
                    return Err(Stage::Path);
                }
            }
            Ok(false)
        }
    }
}

/// (verdict, reason, exception id, report_only)
type Outcome = (Verdict, Reason, Option<String>, bool);

fn model(excs: &[Exc], report: bool, r: &Req) -> Outcome {
    let finish = |(v, reason, e): (Verdict, Reason, Option<String>)| {
        if v == Verdict::Deny && report {
            (Verdict::Allow, reason, e, true)
        } else {
            (v, reason, e, false)
        }
    };
    // The first exception in load order that allows the request decides
    // how (tunnelled, or intercepted when it needs inspection).
    let mut first: Option<(usize, bool)> = None;
    let mut closest: Option<(Stage, usize)> = None;
    for (i, e) in excs.iter().enumerate() {
        let names = match r.ip {
            Some(ip) => e.cidrs.iter().any(|c| cidr_contains(c, ip)),
            None => e.hosts.iter().any(|h| host_matches(h, r.target)),
        };
        if !names {
            continue;
        }
        match evaluate(e, r) {
            Ok(inspect) => {
                first.get_or_insert((i, inspect));
            }
            Err(s) => {
                if closest.is_none_or(|(cs, _)| s > cs) {
                    closest = Some((s, i));
                }
            }
        }
    }
    let id = |i: usize| Some(excs[i].id.clone());
    finish(match first {
        Some((i, true)) => (Verdict::Intercept, Reason::Exception, id(i)),
        Some((i, false)) => (Verdict::Allow, Reason::Exception, id(i)),
        None => match closest {
            Some((s, i)) => {
                let reason = match s {
                    Stage::Expired => Reason::Expired,
                    Stage::Client => Reason::ClientNotAllowed,
                    Stage::Port => Reason::PortNotAllowed,
                    Stage::Qtype => Reason::QtypeNotAllowed,
                    Stage::Method => Reason::MethodNotAllowed,
                    Stage::Path => Reason::PathNotAllowed,
                    Stage::Inspection => Reason::InspectionRequired,
                };
                (Verdict::Deny, reason, id(i))
            }
            None => (Verdict::Deny, Reason::NoException, None),
        },
    })
}

/// `Policy::decide` picks between a plain allow and an interception by
/// the order its index visits candidates, not by load order: with a
/// plain-allowing exception first and one needing inspection later, a
/// CONNECT is intercepted (and named after the later one) when the index
/// happens to visit the later one first (e.g. `*.b.a.test` before
/// `*.a.test`). Fixed: decide now intercepts only when the exception
/// needing inspection comes first in load order; the input is in
/// `fuzz/regressions/decide_model/`. Kept as a switch to re-run the lax model.
const INTERCEPT_ORDER_FIXED: bool = true;

/// Some exception allows `r` plainly and another only with interception.
fn mixed_allow(excs: &[Exc], r: &Req) -> bool {
    let mut plain = false;
    let mut inspect = false;
    for e in excs {
        let names = match r.ip {
            Some(ip) => e.cidrs.iter().any(|c| cidr_contains(c, ip)),
            None => e.hosts.iter().any(|h| host_matches(h, r.target)),
        };
        match (names, evaluate(e, r)) {
            (true, Ok(false)) => plain = true,
            (true, Ok(true)) => inspect = true,
            _ => {}
        }
    }
    plain && inspect
}

pub fn run(data: &[u8]) {
    check(data, INTERCEPT_ORDER_FIXED);
}

/// Without skipping the known divergence (for `fuzz/pending/`).
pub fn run_strict(data: &[u8]) {
    check(data, true);
}

fn check(data: &[u8], strict: bool) {
    let mut b = Bytes::new(data);
    let (excs, report) = gen(&mut b);
    let text = yaml(&excs, report);
    let policy =
        from_yaml(&text).unwrap_or_else(|e| panic!("generated policy refused: {e}\n{text}"));
    // Several requests per policy: compiling is the expensive part.
    for _ in 0..8 {
        if b.exhausted() {
            break;
        }
        let spelled = TARGETS[b.pick(TARGETS.len())];
        let target = parse_target(spelled).expect("vocabulary targets parse");
        let proto = [Proto::Http, Proto::Connect, Proto::Dns, Proto::Tls][b.pick(4)];
        let client = [None, Some("ci-runner"), Some("agent")][b.pick(3)];
        let client_idx = match client {
            None => None,
            Some(id) => policy
                .clients
                .iter()
                .position(|c| &*c.id == id)
                .map(|i| i as u32),
        };
        let r = Req {
            proto,
            client,
            target: spelled,
            ip: spelled.parse().ok(),
            port: REQ_PORTS[b.pick(REQ_PORTS.len())],
            method: REQ_METHODS[b.pick(REQ_METHODS.len())],
            path: REQ_PATHS[b.pick(REQ_PATHS.len())],
            qtype: QTYPES[b.pick(QTYPES.len())],
            intercept: proto == Proto::Connect && b.bool(),
        };
        let got = policy.decide(
            &Request {
                proto,
                client: client_idx,
                target: &target,
                port: r.port,
                method: Some(r.method.into()),
                path: Some(r.path),
                qtype: Some(r.qtype),
                can_intercept: r.intercept,
            },
            NOW,
        );
        let got: Outcome = (
            got.verdict,
            got.reason,
            got.exception.map(|e| e.id.to_string()),
            got.report_only,
        );
        let want = model(&excs, report, &r);
        if !strict && r.intercept && mixed_allow(&excs, &r) {
            // Known divergence, reported: see INTERCEPT_ORDER_FIXED.
            continue;
        }
        assert_eq!(
            got, want,
            "{spelled} {proto:?} client={client:?} port={} {} {} qtype={} intercept={}\n{text}",
            r.port, r.method, r.path, r.qtype, r.intercept
        );
    }
}
