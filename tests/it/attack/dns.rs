//! The resolver under attack: multi-question packets, compression loops,
//! oversized names, TCP length abuse, ANY/NULL and zone transfers,
//! random-subdomain floods, and hostile upstream answers (answers for
//! other names, wrong IDs, oversized, CNAME chains, wrong classes and
//! types). The upstream is a scripted server that records every query:
//! a denied name must never appear there.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::CNAME;
use hickory_proto::rr::{DNSClass, RData, RecordType};

use super::*;

/// The names exception `exact` allows; every other name the tests ask
/// about is denied, or below `*.wild.test`.
const EXACT: &[&str] = &[
    "allowed.test",
    "victim.test",
    "big.test",
    "chain.test",
    "odd.test",
];

/// The upstream answers every name under `.test`, A with 93.184.216.34
/// and AAAA with a public v6 address; the hostile cases are scripted per
/// test.
fn lab() -> Lab {
    let l = crate::support::lab().start(|_| {
        // A 16-hex-digit label is 10 bytes of information to the budget.
        policy()
            .setting("dns", "{ tunnel: { block_bytes: 360, alert_bytes: 200 } }")
            .exception("exact")
            .reason("names the tests ask about")
            .hosts(EXACT)
            .exception("wild")
            .reason("a wildcard to flood under")
            .host("*.wild.test")
    });
    l.dns
        .set("*.test", &["93.184.216.34", "2606:2800:220:1::1"]);
    l
}

/// Only names an exception allows were ever sent upstream.
fn assert_upstream_clean(l: &Lab) {
    for n in l.dns.names() {
        assert!(
            EXACT.contains(&n.as_str()) || n.ends_with(".wild.test"),
            "{n} reached upstream"
        );
    }
}

/// A reply to raw bytes over UDP, decoded.
fn raw(l: &Lab, bytes: &[u8]) -> Option<Message> {
    udp_exchange(l.e.dns, bytes, Duration::from_secs(3))
        .map(|b| Message::from_vec(&b).expect("a decodable reply"))
}

/// A header: ID, flags RD, the given counts.
fn header(id: u16, qd: u16, an: u16) -> Vec<u8> {
    let mut h = id.to_be_bytes().to_vec();
    h.extend_from_slice(&[0x01, 0x00]);
    for c in [qd, an, 0, 0] {
        h.extend_from_slice(&c.to_be_bytes());
    }
    h
}

/// `labels` in wire form, ending with the root label.
fn wire_name(labels: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in labels {
        out.push(l.len() as u8);
        out.extend_from_slice(l);
    }
    out.push(0);
    out
}

#[test]
fn packets_with_more_or_fewer_than_one_question() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for (first, second) in [
        ("allowed.test.", "evil.test."),
        ("evil.test.", "allowed.test."),
    ] {
        let mut m = dns_query(first, RecordType::A);
        m.add_query(Query::query(name(second), RecordType::A));
        let r = ask_udp(l.e.dns, &m);
        assert_eq!(
            r.metadata.response_code,
            ResponseCode::FormErr,
            "{first} {second}"
        );
        assert_denied_line(
            &lines.one("two questions"),
            "malformed",
            None,
            "two questions",
        );
    }
    // 300 questions in one packet.
    let mut m = dns_query("allowed.test.", RecordType::A);
    for i in 0..300 {
        m.add_query(Query::query(
            name(&format!("q{i}.evil.test.")),
            RecordType::A,
        ));
    }
    let r = ask_tcp(l.e.dns, &m);
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    lines.one("300 questions");
    // No question at all; a count that promises more than is there.
    for bytes in [header(0x1111, 0, 0), header(0x2222, 2, 0), {
        let mut b = header(0x3333, 2, 0);
        b.extend_from_slice(&wire_name(&[b"allowed", b"test"]));
        b.extend_from_slice(&[0, 1, 0, 1]);
        b
    }] {
        let r = raw(&l, &bytes).expect("an answer");
        assert!(
            matches!(r.metadata.response_code, ResponseCode::FormErr),
            "{:?}",
            r.metadata.response_code
        );
        assert_denied_line(&lines.one("counts"), "malformed", None, "counts");
    }
    lines.done("questions");
    assert_upstream_clean(&l);
    assert!(l.dns.names().is_empty(), "{:?}", l.dns.names());
}

#[test]
fn compression_loops_and_bad_pointers() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let question = |name: Vec<u8>| {
        let mut b = header(0xbeef, 1, 0);
        b.extend_from_slice(&name);
        b.extend_from_slice(&[0, 1, 0, 1]);
        b
    };
    // (rcode 1 FORMERR: undecodable; 5 REFUSED: decodable, not a host name)
    for (what, name, rcode) in [
        ("pointer to itself", vec![0xc0, 12], 1),
        ("pointer forward", vec![0xc0, 14, 0xc0, 12], 1),
        (
            "two pointers in a ring",
            vec![1, b'a', 0xc0, 16, 1, b'b', 0xc0, 12],
            1,
        ),
        ("pointer past the end", vec![0xc0, 0xff], 1),
        (
            "label after a pointer loop",
            vec![3, b'w', b'w', b'w', 0xc0, 12],
            1,
        ),
        ("extended label type 01", vec![0x40, b'a', 0], 1),
        ("reserved label type 10", vec![0x80, b'a', 0], 1),
        ("label longer than the packet", vec![63, b'a', b'b'], 1),
        // Into the header: decodes to the name "\000." (flags byte 0x01,
        // then a NUL label). The reply echoes the question as sent, so its
        // pointer then lands on the reply's own flags: only the header of
        // the reply is read here.
        ("pointer into the header", vec![0xc0, 2], 5),
    ] {
        let b = udp_exchange(l.e.dns, &question(name), Duration::from_secs(3)).expect(what);
        assert_eq!((b[0], b[1]), (0xbe, 0xef), "{what}");
        assert_eq!(b[3] & 0x0f, rcode, "{what}: {b:02x?}");
        assert_eq!(b[6..8], [0, 0], "{what}: answered with records");
        assert_denied_line(&lines.one(what), "malformed", None, what);
    }
    // Still serving.
    let r = ask_udp(l.e.dns, &dns_query("allowed.test.", RecordType::A));
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    lines.one("control");
    lines.done("pointers");
    assert_upstream_clean(&l);
}

#[test]
fn oversized_names() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let label = [b'a'; 63];
    // Over 255 octets in wire form: not a name at all.
    let mut b = header(0x4444, 1, 0);
    b.extend_from_slice(&wire_name(&[&label, &label, &label, &label, b"test"]));
    b.extend_from_slice(&[0, 1, 0, 1]);
    let r = raw(&l, &b).expect("an answer");
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    assert_denied_line(&lines.one("> 255 octets"), "malformed", None, "> 255");
    // The longest name there is (253 characters), below no wildcard.
    let long = format!(
        "{}.{}.{}.{}.test.",
        "a".repeat(63),
        "a".repeat(63),
        "a".repeat(63),
        "a".repeat(56)
    );
    let r = ask_udp(l.e.dns, &dns_query(&long, RecordType::A));
    assert_dns_denied(&r, "no_exception", "253 characters");
    lines.one("253 characters");
    // Names over the tunnel caps (120 characters) below an allowed
    // wildcard are data: dns_tunnel, never sent.
    for n in [
        format!("{}.{}.wild.test.", "b".repeat(60), "c".repeat(60)),
        format!(
            "{}.{}.{}.{}.wild.test.",
            "d".repeat(60),
            "d".repeat(60),
            "d".repeat(60),
            "d".repeat(60)
        ),
    ] {
        let r = ask_udp(l.e.dns, &dns_query(&n, RecordType::A));
        assert_dns_denied(&r, "dns_tunnel", &n);
        assert_denied_line(&lines.one(&n), "dns_tunnel", None, &n);
    }
    lines.done("names");
    assert!(l.dns.names().is_empty(), "{:?}", l.dns.names());
}

#[test]
fn tcp_length_abuse() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let q = dns_query("allowed.test.", RecordType::A).to_vec().unwrap();
    let frame = |b: &[u8]| {
        let mut f = (b.len() as u16).to_be_bytes().to_vec();
        f.extend_from_slice(b);
        f
    };
    let read_reply = |s: &mut TcpStream| -> Message {
        let mut len = [0u8; 2];
        s.read_exact(&mut len).unwrap();
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut buf).unwrap();
        Message::from_vec(&buf).unwrap()
    };
    // A zero-length frame and a one-byte frame: logged, unanswered; the
    // connection goes on and the next frame is answered.
    let mut s = connect(l.e.dns);
    s.write_all(&[0, 0]).unwrap();
    s.write_all(&frame(&[0x12])).unwrap();
    s.write_all(&frame(&q)).unwrap();
    assert_eq!(
        read_reply(&mut s).metadata.response_code,
        ResponseCode::NoError
    );
    let got = lines.next_n("short frames", 3);
    assert_eq!(got[0]["reason"], "malformed");
    assert_eq!(got[1]["reason"], "malformed");
    assert_eq!(got[2]["decision"], "allow");
    // Ten queries in one write: ten answers, in order.
    let mut batch = Vec::new();
    let mut ids = Vec::new();
    for i in 0..10 {
        let mut m = dns_query(
            if i % 2 == 0 {
                "allowed.test."
            } else {
                "evil.test."
            },
            RecordType::A,
        );
        m.metadata.id = 0x5000 + i;
        ids.push(m.metadata.id);
        batch.extend_from_slice(&frame(&m.to_vec().unwrap()));
    }
    s.write_all(&batch).unwrap();
    let got: Vec<u16> = (0..10).map(|_| read_reply(&mut s).metadata.id).collect();
    assert_eq!(got, ids);
    lines.next_n("batch", 10);
    drop(s);
    // A frame that promises 65535 bytes and stalls holds only its own
    // connection: others are answered meanwhile.
    let mut stalled = connect(l.e.dns);
    stalled.write_all(&[0xff, 0xff]).unwrap();
    stalled.write_all(&q[..12]).unwrap();
    let t = Instant::now();
    assert_eq!(
        ask_tcp(l.e.dns, &dns_query("allowed.test.", RecordType::A))
            .metadata
            .response_code,
        ResponseCode::NoError
    );
    assert_eq!(
        ask_udp(l.e.dns, &dns_query("allowed.test.", RecordType::A))
            .metadata
            .response_code,
        ResponseCode::NoError
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a stalled frame held others up"
    );
    lines.next_n("others", 2);
    // The stalled connection is closed at the I/O timeout, without a reply.
    let mut buf = [0u8; 1];
    stalled
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    assert_eq!(
        stalled.read(&mut buf).unwrap_or(0),
        0,
        "the stalled connection was answered"
    );
    // A frame length that disagrees with its content: the extra bytes are
    // the next frame's length and body, never part of this query.
    let mut s = connect(l.e.dns);
    let mut lying = (12u16).to_be_bytes().to_vec();
    lying.extend_from_slice(&q);
    s.write_all(&lying).unwrap();
    let r = read_reply(&mut s);
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    drop(s);
    let got = eventually("lines for the lying frame", || {
        let all = complete_lines(&l.e);
        (all.len() > lines.seen()).then_some(all)
    });
    assert!(
        got[lines.seen()..].iter().all(|x| x["decision"] == "deny"),
        "{:?}",
        &got[lines.seen()..]
    );
    assert_upstream_clean(&l);
    // Only allowed.test went upstream (cached after the first).
    assert!(l.dns.names().iter().all(|n| n == "allowed.test"));
}

#[test]
fn any_null_and_zone_transfers_are_never_answered() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for t in [
        RecordType::ANY,
        RecordType::NULL,
        RecordType::AXFR,
        RecordType::IXFR,
        RecordType::TXT,
        RecordType::MX,
        RecordType::Unknown(65280),
    ] {
        for n in ["allowed.test.", "x.wild.test."] {
            let r = ask_udp(l.e.dns, &dns_query(n, t));
            assert_dns_denied(&r, "qtype_not_allowed", &format!("{n} {t}"));
            let line = lines.one(n);
            assert_denied_line(&line, "qtype_not_allowed", None, n);
        }
    }
    // Over TCP too (where zone transfers would normally go).
    let r = ask_tcp(l.e.dns, &dns_query("allowed.test.", RecordType::AXFR));
    assert_dns_denied(&r, "qtype_not_allowed", "AXFR over TCP");
    lines.one("axfr tcp");
    lines.done("qtypes");
    assert!(l.dns.names().is_empty(), "{:?}", l.dns.names());
}

/// Precedence: a name no exception covers is `no_exception`, whatever the
/// type asked (ANY and zone transfers included): the type matters only
/// once a name is covered. Nothing is asked upstream.
#[test]
fn a_name_no_exception_covers_is_no_exception_whatever_its_type() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for t in [
        RecordType::ANY,
        RecordType::NULL,
        RecordType::AXFR,
        RecordType::IXFR,
        RecordType::TXT,
        RecordType::A,
        RecordType::Unknown(65280),
    ] {
        for n in ["nobody.test.", "x.other.test."] {
            let what = format!("{n} {t}");
            let r = ask_udp(l.e.dns, &dns_query(n, t));
            assert_dns_denied(&r, "no_exception", &what);
            assert_denied_line(&lines.one(&what), "no_exception", None, &what);
        }
    }
    let r = ask_tcp(l.e.dns, &dns_query("nobody.test.", RecordType::AXFR));
    assert_dns_denied(&r, "no_exception", "AXFR over TCP");
    lines.one("axfr tcp");
    lines.done("uncovered names");
    assert!(l.dns.names().is_empty(), "{:?}", l.dns.names());
}

/// An upstream whose reply is truncated over TCP too has given no answer:
/// the client gets SERVFAIL, never an empty NOERROR it would take for "no
/// such records" (and cache).
#[test]
fn an_upstream_truncating_over_tcp_too_is_servfail() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    l.dns.set_script(|q, _tcp| {
        let mut r = response_to(q);
        if qname(q) == "big.test" {
            r.metadata.truncation = true;
        } else {
            r.add_answer(addr_rr(&format!("{}.", qname(q)), "93.184.216.34"));
        }
        DnsAct::Answer(r)
    });
    for what in ["udp", "tcp"] {
        let q = dns_query("big.test.", RecordType::A);
        let r = match what {
            "udp" => ask_udp(l.e.dns, &q),
            _ => ask_tcp(l.e.dns, &q),
        };
        assert_eq!(
            r.metadata.response_code,
            ResponseCode::ServFail,
            "{what}: {r:?}"
        );
        assert!(r.answers.is_empty(), "{what}");
        let line = lines.one(what);
        assert_eq!(line["rcode"], "SERVFAIL", "{line}");
        assert!(
            line["error"]
                .as_str()
                .is_some_and(|e| e.contains("truncated")),
            "{line}"
        );
    }
    assert!(
        l.dns
            .queries()
            .iter()
            .any(|q| q.tcp && q.name == "big.test"),
        "egressd never retried over TCP"
    );
    // Control: a name answered in full is answered.
    let r = ask_udp(l.e.dns, &dns_query("allowed.test.", RecordType::A));
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(r.answers.len(), 1);
    lines.one("control");
    lines.done("tc over tcp");
}

#[test]
fn random_subdomain_floods() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    // Below a name nobody excepted: all refused, none sent upstream.
    for i in 0..300u32 {
        let n = format!("{:08x}.evil.test.", i.wrapping_mul(2654435761));
        let b = dns_query(&n, RecordType::A).to_vec().unwrap();
        let _ = udp_exchange(l.e.dns, &b, Duration::from_secs(3));
    }
    let got = lines.next_n("flood under evil.test", 300);
    assert!(got.iter().all(|x| x["decision"] == "deny"));
    assert!(l.dns.names().is_empty(), "{:?}", l.dns.names());
    // Below an allowed wildcard: the budget stops it; what reached upstream
    // is bounded by block_bytes (360 here: 36 labels), not by the flood.
    let mut blocked = 0;
    for i in 0..200u32 {
        let n = format!(
            "{:016x}.wild.test.",
            (i as u64).wrapping_mul(0x9e3779b97f4a7c15)
        );
        let r = ask_udp(l.e.dns, &dns_query(&n, RecordType::A));
        if r.metadata.response_code == ResponseCode::Refused {
            assert_dns_denied(&r, "dns_tunnel", &n);
            blocked += 1;
        }
    }
    let got = lines.next_n("flood under *.wild.test", 200);
    assert!(blocked > 150, "only {blocked} of 200 blocked");
    assert_eq!(
        got.iter().filter(|x| x["reason"] == "dns_tunnel").count(),
        blocked
    );
    let sent = l.dns.names().len();
    assert!(sent <= 2 * (600 / 16 + 2), "{sent} names reached upstream");
    assert_upstream_clean(&l);
}

#[test]
fn hostile_upstream_answers() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    l.dns.set_script(|q, tcp| {
        let n = qname(q);
        let t = q.queries[0].query_type();
        let mut r = response_to(q);
        let owner = format!("{n}.");
        match (n.as_str(), t) {
            // Extra records for other names: a cache-poisoning attempt.
            ("allowed.test", RecordType::A) => {
                r.add_answer(addr_rr("victim.test.", "10.6.6.6"));
                r.add_answer(addr_rr(&owner, "93.184.216.34"));
                r.add_answer(addr_rr("victim.test.", "6.6.6.6"));
                r.add_additional(addr_rr("victim.test.", "6.6.6.7"));
                r.add_authority(addr_rr("victim.test.", "6.6.6.8"));
            }
            ("victim.test", RecordType::A) => {
                r.add_answer(addr_rr(&owner, "93.184.216.35"));
            }
            // More than a UDP client may get: egressd truncates for it.
            ("big.test", RecordType::A) if !tcp => {
                for i in 1..=150u8 {
                    r.add_answer(addr_rr(&owner, &format!("93.184.{}.{i}", i / 100)));
                }
            }
            // Wrong class, wrong type, and a CNAME chain longer than allowed.
            ("odd.test", RecordType::A) => {
                let mut ch = addr_rr(&owner, "93.184.216.36");
                ch.dns_class = DNSClass::CH;
                r.add_answer(ch);
                r.add_answer(addr_rr(&owner, "2606:2800::1"));
                r.add_answer(addr_rr(&owner, "93.184.216.37"));
            }
            ("chain.test", RecordType::A) => {
                let mut from = owner.clone();
                for i in 0..20 {
                    let to = format!("c{i}.chain.test.");
                    r.add_answer(rr(&from, RData::CNAME(CNAME(name(&to)))));
                    from = to;
                }
                r.add_answer(addr_rr(&from, "93.184.216.38"));
            }
            _ => {}
        }
        DnsAct::Answer(r)
    });
    let addrs = |m: &Message| -> Vec<String> {
        m.answers
            .iter()
            .filter_map(|r| r.data.ip_addr())
            .map(|ip| ip.to_string())
            .collect()
    };
    let r = ask_udp(l.e.dns, &dns_query("allowed.test.", RecordType::A));
    assert_eq!(addrs(&r), ["93.184.216.34"], "{r:?}");
    assert!(
        r.additionals.iter().all(|x| x.data.ip_addr().is_none()),
        "{r:?}"
    );
    assert!(
        r.authorities.iter().all(|x| x.data.ip_addr().is_none()),
        "{r:?}"
    );
    lines.one("allowed");
    // victim.test is asked upstream, not served from what came with allowed.test.
    let r = ask_udp(l.e.dns, &dns_query("victim.test.", RecordType::A));
    assert_eq!(addrs(&r), ["93.184.216.35"]);
    assert_eq!(
        l.dns.count("victim.test"),
        1,
        "the poisoned records were cached"
    );
    lines.one("victim");
    // Oversized: truncated to the client's size, complete over TCP.
    let mut m = dns_query("big.test.", RecordType::A);
    m.edns = None;
    let b = udp_exchange(l.e.dns, &m.to_vec().unwrap(), DEADLINE).unwrap();
    assert!(b.len() <= 512);
    assert!(Message::from_vec(&b).unwrap().metadata.truncation);
    lines.one("big");
    let r = ask_udp(l.e.dns, &dns_query("odd.test.", RecordType::A));
    assert_eq!(addrs(&r), ["93.184.216.37"], "{r:?}");
    lines.one("odd");
    let r = ask_udp(l.e.dns, &dns_query("chain.test.", RecordType::A));
    assert!(r.answers.len() <= 9, "{} records", r.answers.len());
    assert!(addrs(&r).is_empty(), "followed a chain past its cap: {r:?}");
    lines.one("chain");
    lines.done("hostile");
    assert_upstream_clean(&l);
}

/// Replies that are not the reply to egressd's query (wrong ID, another
/// question, a query instead of a response, garbage) are ignored: the
/// client gets SERVFAIL in bounded time, never the forged answer.
#[test]
fn forged_upstream_replies_are_ignored() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    l.dns.set_script(|q, _| {
        let n = qname(q);
        let mut r = response_to(q);
        r.add_answer(addr_rr(&format!("{n}."), "6.6.6.6"));
        let mut bytes = r.to_vec().unwrap();
        match n.as_str() {
            "allowed.test" => {
                // Wrong ID.
                bytes[0] ^= 0xff;
                DnsAct::Raw(bytes)
            }
            "victim.test" => {
                // Another question.
                let mut other = Message::response(q.metadata.id, q.metadata.op_code);
                other.metadata.message_type = MessageType::Response;
                other.add_query(Query::query(name("elsewhere.test."), RecordType::A));
                other.add_answer(addr_rr("elsewhere.test.", "6.6.6.6"));
                DnsAct::Raw(other.to_vec().unwrap())
            }
            "odd.test" => {
                // The query echoed back, QR clear, with an answer in it.
                let mut echo = r.clone();
                echo.metadata.message_type = MessageType::Query;
                DnsAct::Raw(echo.to_vec().unwrap())
            }
            _ => DnsAct::Raw(bytes[..7].to_vec()),
        }
    });
    let start = Instant::now();
    let handles: Vec<_> = ["allowed.test.", "victim.test.", "odd.test.", "chain.test."]
        .into_iter()
        .map(|n| {
            let dns = l.e.dns;
            std::thread::spawn(move || (n, ask_udp(dns, &dns_query(n, RecordType::A))))
        })
        .collect();
    for h in handles {
        let (n, r) = h.join().unwrap();
        assert_eq!(
            r.metadata.response_code,
            ResponseCode::ServFail,
            "{n}: {r:?}"
        );
        assert!(r.answers.is_empty(), "{n}: a forged answer was passed on");
    }
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    let got = lines.next_n("forged", 4);
    assert!(
        got.iter()
            .all(|x| x["rcode"] == "SERVFAIL" && x["error"].is_string()),
        "{got:?}"
    );
    assert_upstream_clean(&l);
}

/// More queries in flight than one client may hold: the excess is refused
/// at once (`overloaded`), every query still gets its line.
#[test]
fn a_client_flooding_a_silent_upstream_gets_refused_not_queued() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    l.dns.set_script(|_, _| DnsAct::Silent);
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let n = 100;
    for i in 0..n {
        let mut m = dns_query(&format!("f{i}.wild.test."), RecordType::A);
        m.metadata.id = i as u16;
        s.send_to(&m.to_vec().unwrap(), l.e.dns).unwrap();
    }
    let mut overloaded = 0;
    let mut buf = [0u8; 1500];
    while let Ok((len, _)) = s.recv_from(&mut buf) {
        let r = Message::from_vec(&buf[..len]).unwrap();
        if r.metadata.response_code == ResponseCode::Refused {
            overloaded += 1;
        }
    }
    assert!(overloaded >= n - 64, "only {overloaded} refused at once");
    let got = lines.next_n("flood", n);
    let over = got.iter().filter(|x| x["reason"] == "overloaded").count();
    assert_eq!(over, overloaded, "refusals and lines disagree");
    assert_upstream_clean(&l);
}

/// egressd asks upstream a fresh question: nothing the client put in its
/// query (case, flags, EDNS Client Subnet, cookies) is relayed.
#[test]
fn nothing_the_client_sent_is_relayed_upstream() {
    use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let mut m = dns_query("AlLoWeD.TeSt.", RecordType::A);
    m.metadata.id = 0x4242;
    m.metadata.checking_disabled = true;
    m.metadata.authentic_data = true;
    let edns = m.edns.as_mut().unwrap();
    // Client Subnet 10.1.2.0/24, and a client cookie.
    edns.options_mut()
        .insert(EdnsOption::Unknown(8, vec![0, 1, 24, 0, 10, 1, 2]));
    edns.options_mut()
        .insert(EdnsOption::Unknown(10, vec![1, 2, 3, 4, 5, 6, 7, 8]));
    let r = ask_udp(l.e.dns, &m);
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(r.metadata.id, 0x4242);
    lines.one("fresh question");
    let asked = l.dns.queries();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let up = &asked[0].message;
    assert_eq!(up.queries[0].name().to_ascii(), "allowed.test.");
    assert!(!up.metadata.checking_disabled && !up.metadata.authentic_data);
    let codes: Vec<EdnsCode> = up
        .edns
        .as_ref()
        .map(|e| e.options().as_ref().iter().map(|(c, _)| *c).collect())
        .unwrap_or_default();
    assert!(
        !codes.contains(&EdnsCode::Subnet) && !codes.contains(&EdnsCode::Cookie),
        "client EDNS options relayed: {codes:?}"
    );
}
