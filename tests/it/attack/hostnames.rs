//! Host-name games: case, trailing dots, label boundaries, the apex of a
//! wildcard, IDN and Unicode dots, percent-encoded hosts, single-label and
//! `localhost` names, NUL and empty labels. Every name an attack uses
//! resolves (in the fake DNS) to the canary, on a port the exceptions
//! allow: a name wrongly allowed would be resolved and would reach it.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, RecordType};

use super::*;

/// Names the policy allows (controls), reached on the origin's port.
const ALLOWED: &[&str] = &[
    "allowed.test",
    "ALLOWED.TEST",
    "Allowed.Test.",
    "xn--bcher-kva.test",
    "XN--BCHER-KVA.TEST",
    "a.wild.test",
    "a.b.c.wild.test",
    "A.WILD.TEST.",
    "api-1.glob.test",
    "api-.glob.test",
    "API-EU.GLOB.TEST",
];

/// Names that must match no exception.
const NO_EXCEPTION: &[&str] = &[
    "evilallowed.test",
    "allowed.test.evil.test",
    "allowed.test.evil.test.",
    "allowed.testx",
    "xallowed.test",
    "allowed-test.test",
    "allowed_test",
    "test.allowed",
    "sub.allowed.test",
    "-allowed.test",
    "EVILALLOWED.TEST",
    // The apex of a wildcard, and its neighbours.
    "wild.test",
    "wild.test.",
    "WILD.TEST",
    "evilwild.test",
    "wild.test.evil.test",
    "wild.testx",
    "a.wild.testx",
    "a-wild.test",
    // One `*` inside the first label covers one label only.
    "api.glob.test",
    "glob.test",
    "xapi-1.glob.test",
    "api-1.x.glob.test",
    "api-1.glob.test.evil.test",
    // IDN: the A-label is the name; look-alikes are other names.
    "bucher.test",
    "xn--bcher-kva.test.evil.test",
    "xn--bcher-kva2.test",
    // Single-label and internal names nobody excepted.
    "metadata",
    "metadata.google.internal",
    "instance-data",
    "kubernetes",
    "localhost.evil.test",
];

/// Spellings that are not host names at all.
const MALFORMED: &[&str] = &[
    "allowed..test",
    ".allowed.test",
    "allowed.test..",
    "..",
    "allowed%2etest",
    "%61llowed.test",
    "allowed.test%00",
    "allowed.test%00.evil.test",
    "allowed.test%2f",
    "*.wild.test",
    "a.*.wild.test",
    "allowed.test%20",
];

/// Names listed by an exception that only mean something inside.
const SINGLE_LABEL: &[&str] = &["localhost", "intranet", "corp"];

fn lab() -> Lab {
    crate::support::lab()
        .names(ALLOWED)
        .names(NO_EXCEPTION)
        .names(SINGLE_LABEL)
        .start(|ports| {
            let both = [ports.canary, ports.origin];
            policy()
                .exception("exact")
                .reason("exact names")
                .hosts(&["allowed.test", "bücher.test"])
                .cidr(LOOPBACK)
                .ports(&both)
                .exception("wild")
                .reason("wildcards")
                .hosts(&["*.wild.test", "api-*.glob.test"])
                .cidr(LOOPBACK)
                .ports(&both)
                .exception("single-label")
                .reason("names that only mean something inside")
                .hosts(SINGLE_LABEL)
                .port(ports.canary)
        })
}

/// No name reached the canary, and only allowed names were resolved.
fn assert_clean(l: &Lab) {
    let mut allowed: Vec<String> = ALLOWED
        .iter()
        .map(|n| n.trim_end_matches('.').to_ascii_lowercase())
        .collect();
    allowed.extend(SINGLE_LABEL.iter().map(|n| n.to_string()));
    let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
    l.assert_clean(&allowed);
}

#[test]
fn names_that_match_no_exception_are_refused_and_never_resolved() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let c = l.canary_port();
    for n in NO_EXCEPTION {
        let line = refused(
            &mut lines,
            &get_raw(&format!("http://{n}:{c}/")),
            403,
            "no_exception",
        );
        assert_eq!(
            line["host"],
            n.trim_end_matches('.').to_ascii_lowercase(),
            "logged normalised"
        );
        refused(
            &mut lines,
            &connect_raw(&format!("{n}:{c}")),
            403,
            "no_exception",
        );
    }
    lines.done("names");
    assert_clean(&l);
}

#[test]
fn spellings_that_are_not_host_names_are_malformed() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let c = l.canary_port();
    for n in MALFORMED {
        refused(
            &mut lines,
            &get_raw(&format!("http://{n}:{c}/")),
            400,
            "malformed",
        );
        refused(
            &mut lines,
            &connect_raw(&format!("{n}:{c}")),
            400,
            "malformed",
        );
    }
    // Raw bytes no URL parser should accept: UTF-8, Unicode dots, NUL, tabs.
    let long_label = "a".repeat(64);
    let long_name = format!("{}.test", vec!["a".repeat(63); 4].join("."));
    for raw in [
        "b\u{fc}cher.test",
        "allowed\u{3002}test",
        "allowed\u{ff0e}test",
        "\u{ff41}llowed.test",
        "allowed.test\0",
        "allowed\ttest",
        &long_label,
        &long_name,
    ] {
        let url = format!("http://{raw}:{c}/");
        refused(&mut lines, &get_raw(&url), 400, "malformed");
        refused(
            &mut lines,
            &connect_raw(&format!("{raw}:{c}")),
            400,
            "malformed",
        );
    }
    lines.done("malformed");
    assert_clean(&l);
}

#[test]
fn case_trailing_dots_and_a_labels_of_allowed_names_are_the_same_name() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let o = l.port();
    for n in ALLOWED {
        let r = try_request(l.e.proxy, get_raw(&format!("http://{n}:{o}/")).as_bytes()).unwrap();
        assert_eq!(r.status, 200, "{n}: {}", r.text());
        let line = lines.one(n);
        assert_eq!(line["decision"], "allow", "{n}");
        assert_eq!(line["host"], n.trim_end_matches('.').to_ascii_lowercase());
    }
    assert_eq!(l.origin.count(), ALLOWED.len());
    assert_clean(&l);
}

/// `localhost` and single-label names that an exception does list are still
/// resolved through egressd's resolver (never /etc/hosts) and refused when
/// they land on a non-public address.
#[test]
fn localhost_and_single_label_names_cannot_reach_local_services() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let c = l.canary_port();
    for n in ["localhost", "LOCALHOST.", "intranet", "corp"] {
        refused(
            &mut lines,
            &get_raw(&format!("http://{n}:{c}/")),
            403,
            "private_address",
        );
        refused(
            &mut lines,
            &connect_raw(&format!("{n}:{c}")),
            403,
            "private_address",
        );
    }
    // Through the resolver, they are answered only with what passes.
    let r = ask_udp(l.e.dns, &dns_query("localhost.", RecordType::A));
    assert_dns_denied(&r, "private_address", "localhost A");
    lines.one("dns localhost");
    assert_clean(&l);
}

/// The same names asked of egressd's resolver: denied names are refused and
/// never sent upstream; names that are not host names are malformed.
#[test]
fn the_resolver_plays_the_same_name_games() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for n in NO_EXCEPTION {
        let r = ask_udp(
            l.e.dns,
            &dns_query(&format!("{}.", n.trim_end_matches('.')), RecordType::A),
        );
        assert_dns_denied(&r, "no_exception", n);
        let line = lines.one(n);
        assert_denied_line(&line, "no_exception", None, n);
        assert_eq!(line["qname"], n.trim_end_matches('.').to_ascii_lowercase());
    }
    for n in ALLOWED {
        let r = ask_udp(
            l.e.dns,
            &dns_query(&format!("{}.", n.trim_end_matches('.')), RecordType::A),
        );
        assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{n}");
        lines.one(n);
    }
    // Labels carrying bytes a host name cannot: a dot inside a label, NUL,
    // UTF-8, percent signs, spaces.
    for labels in [
        vec![&b"allowed.test"[..], b"evil", b"test"],
        vec![b"allowed\0", b"test"],
        vec![b"b\xc3\xbccher", b"test"],
        vec![b"allowed%2etest"],
        vec![b"allowed test", b"test"],
    ] {
        let mut m = dns_query("x.test.", RecordType::A);
        m.queries[0].set_name(Name::from_labels(labels.clone()).unwrap());
        let r = ask_udp(l.e.dns, &m);
        assert_dns_denied(&r, "malformed", &format!("{labels:?}"));
        lines.one("odd labels");
    }
    // Below an allowed wildcard the same shapes are data, not names.
    let mut m = dns_query("x.test.", RecordType::A);
    m.queries[0].set_name(Name::from_labels(vec![&b"a.b"[..], b"wild", b"test"]).unwrap());
    assert_dns_denied(
        &ask_udp(l.e.dns, &m),
        "dns_tunnel",
        "dotted label under a wildcard",
    );
    lines.one("dotted label under a wildcard");
    lines.done("resolver");
    assert_clean(&l);
}
