//! IP literals in every spelling an OS or URL parser accepts. The origin
//! listens on 127.0.0.1:P and is the only address an exception lists;
//! canaries listen on 127.0.0.2:P and [::1]:P, the same port, so a spelling
//! judged as one address but dialled as another would land on a canary.
//! Literals are never resolved: the fake upstream DNS must see nothing.

use super::*;

/// Origin on 127.0.0.1:P, the lab's canary on 127.0.0.2:P, and (if IPv6
/// works) a second canary on [::1]:P; `report` runs the policy in report mode.
fn lab(report: bool) -> (Lab, Option<Canary>) {
    let (origin, c2) = beside("127.0.0.2", origin);
    let c6 = try_canary_on("::1".parse().unwrap(), origin.addr.port()).ok();
    let l = lab_with(origin).canary(c2).start(|ports| {
        let p = policy()
            .contact("#sec")
            .exception("one-loopback")
            .reason("the test origin, by address only")
            .cidr("127.0.0.1/32")
            .port(ports.origin);
        if report {
            p.mode("report")
        } else {
            p
        }
    });
    (l, c6)
}

fn assert_nothing_leaked(l: &Lab, c6: &Option<Canary>, origin_count: usize) {
    assert_eq!(l.canary.hits(), 0, "a literal reached 127.0.0.2");
    if let Some(c6) = c6 {
        assert_eq!(c6.hits(), 0, "a literal reached [::1]");
    }
    assert_eq!(l.origin.count(), origin_count, "origin requests");
    assert!(
        l.dns.names().is_empty(),
        "a literal was resolved: {:?}",
        l.dns.names()
    );
}

/// Spellings of the excepted 127.0.0.1: each is the address dialled.
const LOOPBACK_ONE: &[&str] = &[
    "127.0.0.1",
    "127.0.0.1.",
    "2130706433",
    "0x7f000001",
    "0X7F000001",
    "017700000001",
    "0x7f.1",
    "0x7f.0.1",
    "0x7f.0x0.0x0.0x1",
    "0177.0.0.1",
    "0177.0.0.01",
    "127.000.000.001",
    "127.1",
    "127.0.1",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:7f00:1]",
];

/// Spellings of 127.0.0.2 (a canary), which no exception lists.
const LOOPBACK_TWO: &[&str] = &[
    "127.0.0.2",
    "2130706434",
    "0x7f000002",
    "0x7f.2",
    "0177.0.0.2",
    "0177.0.0.02",
    "127.2",
    "127.0.2",
    "[::ffff:127.0.0.2]",
    "[::ffff:7f00:2]",
];

/// The unspecified address, which Linux dials as the local host (where the
/// origin listens: it must not get these either).
const UNSPECIFIED: &[&str] = &[
    "0",
    "0.0.0.0",
    "0x0",
    "00",
    "0.0",
    "0.0.0",
    "[::]",
    "[::0]",
    "[0:0:0:0:0:0:0:0]",
    "[::ffff:0.0.0.0]",
    "[::ffff:0:0]",
];

/// IPv6 loopback and IPv6 forms that embed an IPv4 loopback address.
const V6_LOOPBACKS: &[&str] = &[
    "[::1]",
    "[0:0:0:0:0:0:0:1]",
    "[0::1]",
    "[::0:1]",
    // IPv4-compatible
    "[::127.0.0.1]",
    "[::7f00:1]",
    // NAT64, well-known and local-use prefixes
    "[64:ff9b::7f00:1]",
    "[64:ff9b::127.0.0.1]",
    "[64:ff9b:1::7f00:1]",
    // 6to4
    "[2002:7f00:1::1]",
    // Teredo, client 127.0.0.1 (obfuscated)
    "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
];

/// Cloud metadata endpoints, every spelling.
const METADATA: &[&str] = &[
    "169.254.169.254",
    "169.254.169.254.",
    "2852039166",
    "0xa9fea9fe",
    "0xA9FEA9FE",
    "0251.0376.0251.0376",
    "025177524776",
    "0xa9.0xfe.0xa9.0xfe",
    "169.254.43518",
    "169.16689662",
    "0xa9.16689662",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[::169.254.169.254]",
    "[64:ff9b::a9fe:a9fe]",
    "[64:ff9b::169.254.169.254]",
    "[2002:a9fe:a9fe::]",
    "[2001:0:4136:e378:8000:63bf:5601:5601]",
    "[fd00:ec2::254]",
    "[fe80::a9fe:a9fe]",
    // Alibaba Cloud (CGNAT range), and Oracle's 192.0.0.192
    "100.100.100.200",
    "192.0.0.192",
];

#[test]
fn literal_spellings_of_the_excepted_address_reach_only_it() {
    let (l, c6) = lab(false);
    let mut lines = Lines::new(&l.e);
    for s in LOOPBACK_ONE {
        let r = try_request(
            l.e.proxy,
            get_raw(&format!("http://{s}:{}/x", l.port())).as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{s}: {}", r.text());
        let line = lines.one(s);
        assert_eq!(line["decision"], "allow", "{s}");
        assert_eq!(
            line["host"], "127.0.0.1",
            "{s}: logged as the address dialled"
        );
        assert_eq!(line["addr"], format!("127.0.0.1:{}", l.port()), "{s}");
    }
    assert_nothing_leaked(&l, &c6, LOOPBACK_ONE.len());
}

#[test]
fn literal_spellings_of_other_local_addresses_are_refused() {
    let (l, c6) = lab(false);
    let mut lines = Lines::new(&l.e);
    let mut cases: Vec<(&str, &str)> = Vec::new();
    cases.extend(LOOPBACK_TWO.iter().map(|s| (*s, "127.0.0.2")));
    cases.extend(UNSPECIFIED.iter().map(|s| (*s, "")));
    cases.extend(V6_LOOPBACKS.iter().map(|s| (*s, "")));
    for (s, canonical) in cases {
        let url = format!("http://{s}:{}/", l.port());
        let line = refused(&mut lines, &get_raw(&url), 403, "no_exception");
        if !canonical.is_empty() {
            assert_eq!(line["host"], canonical, "{s}");
        }
        assert!(line["addr"].is_null(), "{s}: something was dialled: {line}");
        // And as a CONNECT authority.
        let line = refused(
            &mut lines,
            &connect_raw(&format!("{s}:{}", l.port())),
            403,
            "no_exception",
        );
        assert!(line["addr"].is_null(), "{s}");
    }
    assert_nothing_leaked(&l, &c6, 0);
}

#[test]
fn metadata_addresses_are_refused_in_every_spelling() {
    let (l, c6) = lab(false);
    let mut lines = Lines::new(&l.e);
    for s in METADATA {
        let line = refused(
            &mut lines,
            &get_raw(&format!("http://{s}/latest/meta-data/iam/")),
            403,
            "no_exception",
        );
        assert!(line["addr"].is_null(), "{s}");
        refused(
            &mut lines,
            &connect_raw(&format!("{s}:80")),
            403,
            "no_exception",
        );
    }
    // The canonical form is what the log names.
    for s in ["2852039166", "0xa9fea9fe", "[::ffff:a9fe:a9fe]"] {
        let line = refused(
            &mut lines,
            &get_raw(&format!("http://{s}/")),
            403,
            "no_exception",
        );
        assert_eq!(line["host"], "169.254.169.254", "{s}");
    }
    assert_nothing_leaked(&l, &c6, 0);
}

/// Numbers that are not addresses must not fall through to name resolution
/// (a resolver or libc might still read them as addresses).
#[test]
fn numeric_non_addresses_are_malformed_not_resolved() {
    let (l, c6) = lab(false);
    let mut lines = Lines::new(&l.e);
    for s in [
        "127.0.0.256",
        "4294967296",
        "127.0.0.1.5",
        "0x100000000",
        "08.0.0.1",
        "09",
        "1.2.3.0x100",
        "127.16777216",
        "127.0.65536",
        "x.0.0.1",
        "[::1",
        "[:::1]",
        "[::ffff:127.0.0.256]",
        "[127.0.0.1]",
        "[1:2:3:4:5:6:7:8:9]",
    ] {
        let url = format!("http://{s}:{}/", l.port());
        refused(&mut lines, &get_raw(&url), 400, "malformed");
    }
    assert_nothing_leaked(&l, &c6, 0);
}

/// IPv6 zone identifiers: the zone never changes the address judged.
#[test]
fn zone_ids_do_not_change_the_address() {
    let (l, c6) = lab(false);
    let mut lines = Lines::new(&l.e);
    for s in [
        "[fe80::1%25lo]",
        "[::1%25lo]",
        "[::ffff:127.0.0.2%251]",
        "[fe80::a9fe:a9fe%25eth0]",
    ] {
        let url = format!("http://{s}:{}/", l.port());
        let r = try_request(l.e.proxy, get_raw(&url).as_bytes()).unwrap();
        let line = lines.one(s);
        assert_eq!(line["decision"], "deny", "{s}: {line}");
        assert!(
            (r.status, line["reason"].as_str()) == (403, Some("no_exception"))
                || (r.status, line["reason"].as_str()) == (400, Some("malformed")),
            "{s}: {} {line}",
            r.status
        );
        let auth = format!("{s}:{}", l.port());
        let r = try_request(l.e.proxy, connect_raw(&auth).as_bytes()).unwrap();
        assert!(r.status == 403 || r.status == 400, "{auth}: {}", r.status);
        lines.one(&auth);
    }
    assert_nothing_leaked(&l, &c6, 0);
}

/// `mode: report` lets policy denials through, but never the address guard
/// or malformed input: 127.0.0.2 in any spelling stays refused.
#[test]
fn report_mode_keeps_the_address_guard() {
    let (l, c6) = lab(true);
    let mut lines = Lines::new(&l.e);
    for s in LOOPBACK_TWO
        .iter()
        .chain(["0", "[::1]", "[64:ff9b::7f00:2]"].iter())
    {
        let url = format!("http://{s}:{}/", l.port());
        let line = refused(&mut lines, &get_raw(&url), 403, "private_address");
        assert!(line["addr"].is_null(), "{s}");
    }
    for s in METADATA.iter().take(6) {
        refused(
            &mut lines,
            &get_raw(&format!("http://{s}/")),
            403,
            "private_address",
        );
    }
    refused(
        &mut lines,
        &get_raw(&format!("http://127.0.0.256:{}/", l.port())),
        400,
        "malformed",
    );
    assert_nothing_leaked(&l, &c6, 0);
}
