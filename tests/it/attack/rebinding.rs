//! DNS rebinding and time-of-check/time-of-use: allowed names that resolve
//! to internal addresses, or flip between lookups; CNAMEs into internal
//! names; redirects (passed to the client, never followed).
//!
//! The origin listens on 127.0.0.2:P (the one range the exception lists in
//! `cidrs`), a canary on 127.0.0.3:P: an address checked but not the one
//! dialled would show up at the canary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::svcb::{IpHint, SvcParamValue};
use hickory_proto::rr::{RData, Record, RecordType};

use super::*;

const ORIGIN_IP: &str = "127.0.0.2";
const CANARY_IP: &str = "127.0.0.3";

/// An origin on ORIGIN_IP that redirects `/redirect?to=<url>` there and
/// answers 200 otherwise, a canary beside it on CANARY_IP, and egressd
/// allowing `names` on ORIGIN_IP only; answers are cached for a second.
/// The fake DNS starts empty: each test says where its names point.
fn lab(names: &[&str]) -> Lab<RawOrigin> {
    let (origin, canary) = beside(CANARY_IP, || {
        raw_origin_on(ORIGIN_IP.parse().unwrap(), 0, |r| {
            if r.target.starts_with("/redirect") {
                let to = r.target.trim_start_matches("/redirect?to=");
                Act::Reply(
                    format!(
                        "HTTP/1.1 302 Found\r\nLocation: {to}\r\nRefresh: 0; url={to}\r\nContent-Length: 0\r\n\r\n"
                    )
                    .into_bytes(),
                )
            } else {
                ok_reply(r)
            }
        })
    });
    lab_with(origin).canary(canary).start(|ports| {
        policy()
            .setting("dns", "{ cache_min_ttl: 1s, cache_max_ttl: 1s }")
            .exception("rebind")
            .reason("names that move")
            .hosts(names)
            .cidr(&format!("{ORIGIN_IP}/32"))
            .port(ports.origin)
    })
}

fn get(l: &Lab<RawOrigin>, host: &str, path: &str) -> Response {
    try_request(
        l.e.proxy,
        get_raw(&format!("http://{host}:{}{path}", l.port())).as_bytes(),
    )
    .unwrap()
}

/// Every non-public address class an answer for an allowed name may carry.
const INTERNAL: &[&str] = &[
    CANARY_IP,
    "127.0.0.1",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.0.1",
    "169.254.169.254",
    "100.64.0.1",
    "0.0.0.0",
    "255.255.255.255",
    "224.0.0.1",
    "198.18.0.1",
    "::1",
    "::",
    "::ffff:127.0.0.3",
    "::127.0.0.3",
    "fe80::1",
    "fd00:ec2::254",
    "fc00::1",
    "64:ff9b::7f00:3",
    "64:ff9b::a9fe:a9fe",
    "2002:7f00:3::",
    "2001:0:4136:e378:8000:63bf:80ff:fffc",
];

#[test]
fn allowed_names_resolving_to_internal_addresses_are_refused() {
    let names: Vec<String> = (0..INTERNAL.len())
        .map(|i| format!("n{i}.rebind.test"))
        .collect();
    let mut all: Vec<&str> = names.iter().map(String::as_str).collect();
    all.push("all.rebind.test");
    let l = lab(&all);
    for (n, ip) in names.iter().zip(INTERNAL) {
        l.dns.set(n, &[ip]);
    }
    l.dns.set("all.rebind.test", INTERNAL);
    let mut lines = Lines::new(&l.e);
    for (n, ip) in names
        .iter()
        .zip(INTERNAL)
        .chain([(&"all.rebind.test".to_string(), &"*")])
    {
        let line = refused(
            &mut lines,
            &get_raw(&format!("http://{n}:{}/", l.port())),
            403,
            "private_address",
        );
        assert!(line["addr"].is_null(), "{n} ({ip}) was dialled: {line}");
        assert!(
            line["note"].as_str().is_some_and(|s| s.contains("refused")),
            "{line}"
        );
        refused(
            &mut lines,
            &connect_raw(&format!("{n}:{}", l.port())),
            403,
            "private_address",
        );
        // The resolver answers the client the same way.
        for t in [RecordType::A, RecordType::AAAA] {
            let r = ask_udp(l.e.dns, &dns_query(n, t));
            let line = lines.one(n);
            if r.metadata.response_code == ResponseCode::Refused {
                assert_dns_denied(&r, "private_address", n);
                assert_denied_line(&line, "private_address", None, n);
            } else {
                // The other family: nothing to answer, nothing refused.
                assert!(r.answers.is_empty(), "{n} {t}: {r:?}");
            }
        }
    }
    lines.done("internal");
    assert_eq!(l.canary.hits(), 0);
    assert!(l.origin.requests().is_empty());
}

/// A name moves from the origin to the canary and back: each request is
/// decided on the address it is sent to, never a stale one.
#[test]
fn a_name_that_flips_between_lookups_is_checked_every_time() {
    let l = lab(&["flip.test"]);
    let dns = &l.dns;
    dns.set("flip.test", &[ORIGIN_IP]);
    assert_eq!(get(&l, "flip.test", "/1").status, 200);
    dns.set("flip.test", &[CANARY_IP]);
    eventually("the cached answer to expire", || {
        let r = get(&l, "flip.test", "/2");
        assert!(
            r.status == 200 || r.reason() == Some("private_address"),
            "{}",
            r.status
        );
        (r.status == 403).then_some(())
    });
    // Both addresses in one answer: only the checked one is dialled.
    dns.set("flip.test", &[CANARY_IP, ORIGIN_IP]);
    eventually("the mixed answer", || {
        let r = get(&l, "flip.test", "/3");
        (r.status == 200).then_some(())
    });
    let line = eventually("the mixed line", || {
        complete_lines(&l.e)
            .into_iter()
            .find(|x| x["path"] == "/3" && x["decision"] == "allow")
    });
    assert_eq!(line["addr"], format!("{ORIGIN_IP}:{}", l.port()));
    assert!(line["note"].as_str().unwrap().contains(CANARY_IP), "{line}");
    assert_eq!(l.canary.hits(), 0);
    // Every line that was allowed went to the origin.
    for x in complete_lines(&l.e) {
        if x["decision"] == "allow" {
            assert_eq!(x["addr"], format!("{ORIGIN_IP}:{}", l.port()), "{x}");
        }
    }
}

/// The record flips every few milliseconds while requests run: whatever
/// the interleaving, nothing reaches the canary.
#[test]
fn a_name_flipping_under_load_never_reaches_the_internal_address() {
    let l = lab(&["race.test"]);
    let dns = &l.dns;
    dns.set("race.test", &[ORIGIN_IP]);
    let stop = AtomicBool::new(false);
    let (mut ok, mut refused_n) = (0, 0);
    thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ip = if i % 2 == 0 { CANARY_IP } else { ORIGIN_IP };
                dns.set("race.test", &[ip]);
                i += 1;
                thread::sleep(Duration::from_millis(3));
            }
        });
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            let r = get(&l, "race.test", "/race");
            match (r.status, r.reason()) {
                (200, _) => ok += 1,
                (403, Some("private_address")) => refused_n += 1,
                other => panic!("unexpected answer {other:?}: {}", r.text()),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(ok + refused_n > 0);
    assert_eq!(l.canary.hits(), 0, "a flipped answer was dialled");
    let lines = eventually("all lines", || {
        let x = complete_lines(&l.e);
        (x.len() >= ok + refused_n).then_some(x)
    });
    assert_eq!(lines.len(), ok + refused_n);
    assert_eq!(l.origin.requests().len(), ok);
    // Each lookup asked A and AAAA once: never a second resolution per request.
    let asked = dns.count("race.test");
    assert!(
        asked <= 2 * (ok + refused_n),
        "{asked} lookups for {} requests",
        ok + refused_n
    );
}

/// The client resolves through egressd, then asks the proxy: the proxy's
/// own lookup decides, not what the client was told.
#[test]
fn what_the_client_resolved_does_not_decide_what_the_proxy_dials() {
    let l = lab(&["both.test"]);
    let dns = &l.dns;
    dns.set("both.test", &["93.184.216.34"]);
    let r = ask_udp(l.e.dns, &dns_query("both.test", RecordType::A));
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    dns.set("both.test", &[CANARY_IP]);
    eventually("the proxy's lookup to see the new answer", || {
        let r = get(&l, "both.test", "/");
        (r.reason() == Some("private_address")).then_some(())
    });
    let r = ask_udp(l.e.dns, &dns_query("both.test", RecordType::A));
    assert_dns_denied(&r, "private_address", "after the flip");
    assert_eq!(l.canary.hits(), 0);
}

#[test]
fn cnames_into_internal_names_are_judged_by_where_they_end() {
    let l = lab(&["inside.test", "meta.test", "good.test"]);
    for (n, target, ip) in [
        ("inside.test", "db.corp.internal", CANARY_IP),
        ("meta.test", "metadata.google.internal", "169.254.169.254"),
        ("good.test", "edge.cdn.test", ORIGIN_IP),
    ] {
        l.dns.cname(n, target);
        l.dns.set(target, &[ip]);
    }
    let mut lines = Lines::new(&l.e);
    for n in ["inside.test", "meta.test"] {
        refused(
            &mut lines,
            &get_raw(&format!("http://{n}:{}/", l.port())),
            403,
            "private_address",
        );
        let r = ask_udp(l.e.dns, &dns_query(n, RecordType::A));
        assert_dns_denied(&r, "private_address", n);
        lines.one(n);
    }
    assert_eq!(get(&l, "good.test", "/").status, 200, "control");
    lines.one("good");
    lines.done("cnames");
    assert_eq!(l.canary.hits(), 0);
    // Only names the policy allowed were asked: the CNAME targets were not
    // chased with queries of their own.
    assert_eq!(asked(&l.dns), ["good.test", "inside.test", "meta.test"]);
}

/// A redirect to an internal address is handed to the client as it is;
/// egressd never follows it (the client's next request is decided anew).
#[test]
fn redirects_are_passed_on_not_followed() {
    let l = lab(&["redir.test"]);
    l.dns.set("redir.test", &[ORIGIN_IP]);
    let mut lines = Lines::new(&l.e);
    let targets = [
        format!("http://{CANARY_IP}:{}/", l.port()),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        format!("http://[::ffff:127.0.0.3]:{}/", l.port()),
        "file:///etc/passwd".to_string(),
    ];
    for to in &targets {
        let r = get(&l, "redir.test", &format!("/redirect?to={to}"));
        assert_eq!(r.status, 302, "{to}");
        assert_eq!(r.header("location"), Some(to.as_str()));
        let line = lines.one(to);
        assert_eq!(
            (line["decision"].as_str(), line["status"].as_u64()),
            (Some("allow"), Some(302))
        );
    }
    // The client following it is a new request, decided on its own.
    let line = refused(&mut lines, &get_raw(&targets[0]), 403, "no_exception");
    assert!(line["addr"].is_null());
    lines.done("redirects");
    assert_eq!(
        l.origin.requests().len(),
        targets.len(),
        "one request per redirect"
    );
    assert_eq!(l.canary.hits(), 0);
}

/// The addresses an HTTPS record hints at (ipv4hint, ipv6hint).
fn hints(r: &Record) -> Vec<IpAddr> {
    let RData::HTTPS(h) = &r.data else {
        return Vec::new();
    };
    h.0.svc_params
        .iter()
        .flat_map(|(_, v)| match v {
            SvcParamValue::Ipv4Hint(IpHint(a)) => a.iter().map(|x| IpAddr::V4(x.0)).collect(),
            SvcParamValue::Ipv6Hint(IpHint(a)) => a.iter().map(|x| IpAddr::V6(x.0)).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// A client may connect to the addresses an HTTPS record hints at, so a
/// hint is an answer like an A record: a record hinting at an internal
/// address outside the exception's cidrs is removed, whatever else it
/// hints at, and the line names what was removed.
#[test]
fn https_record_hints_are_held_to_the_address_rule() {
    let l = lab(&["svc.test"]);
    let mut lines = Lines::new(&l.e);
    l.dns.https("svc.test", &[CANARY_IP]);
    l.dns.https("svc.test", &["93.184.216.34", "::1"]);
    l.dns.https("svc.test", &[ORIGIN_IP]);
    let r = ask_udp(l.e.dns, &dns_query("svc.test", RecordType::HTTPS));
    assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{r:?}");
    let kept: Vec<Vec<IpAddr>> = r.answers.iter().map(hints).collect();
    assert_eq!(
        kept,
        [vec![ORIGIN_IP.parse::<IpAddr>().unwrap()]],
        "only the record hinting inside the exception's cidrs is kept"
    );
    let line = lines.one("https");
    assert_eq!(line["decision"], "allow", "{line}");
    let note = line["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(CANARY_IP) && note.contains("::1") && !note.contains("93.184"),
        "{line}"
    );
    lines.done("https");
    assert_eq!(l.canary.hits(), 0);
    assert_eq!(asked(&l.dns), ["svc.test"]);
}
