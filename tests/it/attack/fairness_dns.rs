//! Fair shares of DNS (issue 41): what one client spends or holds is its
//! own. An unnamed client's tunnel budget is its source address's, so a
//! flood of new names under an allowed wildcard from one address leaves
//! every other address its budget (for its queries and for the proxy's
//! lookups of the same names); and the total of TCP DNS connections is
//! shared fairly, so addresses that hold every slot give one up to a
//! client under its share.
//!
//! Clients are loopback source addresses (sockets bound before they
//! connect or send). The second client's latency is measured while the
//! attack runs and printed (`--nocapture`); the assertions are that it is
//! served, within [`WAIT`] each.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;

use super::*;

const HOG: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const OTHER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// The longest the other client may wait for any one answer.
const WAIT: Duration = Duration::from_secs(2);

/// A name below `*.wild.example` that nobody asked before: 24 random
/// letters and digits, what a tunnel's data looks like.
fn random_name(i: usize) -> String {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ std::process::id() as u64;
    let label: String = (0..24)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b"abcdefghijklmnopqrstuvwxyz0123456789"[(x % 36) as usize] as char
        })
        .collect();
    format!("{label}.wild.example")
}

/// The median and the largest of `v`.
fn p50_max(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], *v.last().unwrap())
}

#[test]
fn a_budget_spent_from_one_address_leaves_another_its_own() {
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("wild")
            .host("*.wild.example")
            .cidr(LOOPBACK)
            .port(ports.origin)
    });
    let origin = l.origin.addr().ip().to_string();
    l.dns.set("*.wild.example", &[&origin]);
    // 300 new names from one address: its budget runs out and the
    // wildcard is refused to it.
    let hog = UdpSocket::bind((HOG, 0)).unwrap();
    hog.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = vec![0u8; 65535];
    let mut refused = 0;
    for i in 0..300 {
        let q = dns_query(&random_name(i), RecordType::A);
        hog.send_to(&q.to_vec().unwrap(), l.e.dns).unwrap();
        let (n, _) = hog.recv_from(&mut buf).expect("an answer");
        let r = Message::from_vec(&buf[..n]).unwrap();
        if r.metadata.response_code == ResponseCode::Refused {
            assert_eq!(
                ede_text(&r).map(|t| without_request_id(&t)).as_deref(),
                Some("egressd: dns_tunnel"),
                "{r}"
            );
            refused += 1;
        }
    }
    assert!(
        refused > 100,
        "the flood spent its budget: {refused} refused"
    );
    // The same address's next ordinary name is refused too (the
    // cool-down)...
    let r = ask_from(HOG, l.e.dns, "www.wild.example", WAIT);
    assert_dns_denied(&r, "dns_tunnel", "the flooding address");
    // ...and another address's is answered, and its proxy request for
    // it allowed.
    let started = Instant::now();
    let r = ask_from(OTHER, l.e.dns, "www.wild.example", WAIT);
    let dns_took = started.elapsed();
    assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{r}");
    assert!(!r.answers.is_empty(), "{r}");
    let url = format!("http://www.wild.example:{}/", l.port());
    let started = Instant::now();
    let resp = get_from(OTHER, l.e.proxy, &url, WAIT);
    let get_took = started.elapsed();
    assert_eq!(resp.status, 200, "{}", resp.text());
    eprintln!(
        "after 300 names from {HOG} ({refused} refused): {OTHER}'s query {dns_took:?}, \
         its GET {get_took:?}"
    );
    let lines = complete_lines(&l.e);
    let other_denied: Vec<_> = lines
        .iter()
        .filter(|l| l["reason"] == "dns_tunnel")
        .filter(|l| {
            l["src"]
                .as_str()
                .is_some_and(|s| s.starts_with("127.0.0.3:"))
        })
        .collect();
    assert!(other_denied.is_empty(), "{other_denied:?}");
}

/// A TCP connection to `to` from `from`, or why not.
fn try_connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.bind(SocketAddr::from((from, 0)))?;
        let s = sock.connect(to).await?.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s)
    })
}

/// Connections each hog address keeps open.
const PER_HOG: usize = 16;
/// Hog addresses: 127.0.0.10-29.
const HOGS: std::ops::Range<u8> = 10..30;

/// Twenty addresses (127.0.0.10-29), each holding [`PER_HOG`] TCP
/// connections that send a length prefix and nothing more, reopened as
/// soon as egressd closes them, until `stop`. `opened` counts the
/// connections opened in all.
fn hold_tcp_slots(
    dns: SocketAddr,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<()>> {
    HOGS.map(|last| {
        let (stop, opened) = (stop.clone(), opened.clone());
        std::thread::spawn(move || {
            let from = Ipv4Addr::new(127, 0, 0, last);
            let open = || {
                let mut s = try_connect_from(from, dns).ok()?;
                // A query of 64 bytes is announced; none follows.
                s.write_all(&64u16.to_be_bytes()).ok()?;
                s.set_nonblocking(true).ok()?;
                opened.fetch_add(1, Ordering::Relaxed);
                Some(s)
            };
            let mut held: Vec<Option<TcpStream>> = (0..PER_HOG).map(|_| open()).collect();
            while !stop.load(Ordering::Relaxed) {
                for slot in held.iter_mut() {
                    let closed = match slot {
                        None => true,
                        Some(s) => {
                            let mut b = [0u8; 1];
                            match s.peek(&mut b) {
                                Ok(_) => true,
                                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                            }
                        }
                    };
                    if closed {
                        *slot = open();
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    })
    .collect()
}

/// One TCP query for `allowed.test` from `from` on a new connection: its
/// answer within `wait`, or what went wrong.
fn tcp_ask_from(from: Ipv4Addr, dns: SocketAddr, wait: Duration) -> Result<Message, String> {
    let mut s = try_connect_from(from, dns).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(wait)).unwrap();
    let q = dns_query("allowed.test", RecordType::A).to_vec().unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).map_err(|e| format!("write: {e}"))?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).map_err(|e| format!("length: {e}"))?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).map_err(|e| format!("answer: {e}"))?;
    Message::from_vec(&buf).map_err(|e| e.to_string())
}

#[test]
fn tcp_dns_slots_held_by_twenty_addresses_leave_another_its_share() {
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("origin")
            .host("allowed.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let hogs = hold_tcp_slots(l.e.dns, stop.clone(), opened.clone());
    // Every hog connection opened (320, more than the total of 256) before
    // the other client comes.
    let all = PER_HOG * HOGS.len();
    eventually("the hogs' connections open", || {
        (opened.load(Ordering::Relaxed) >= all).then_some(())
    });
    let answered = AtomicUsize::new(0);
    let mut took = Vec::new();
    let mut failed = Vec::new();
    for i in 0..25 {
        let started = Instant::now();
        match tcp_ask_from(OTHER, l.e.dns, WAIT) {
            Ok(r) if r.metadata.response_code == ResponseCode::NoError => {
                answered.fetch_add(1, Ordering::Relaxed);
                took.push(started.elapsed());
            }
            Ok(r) => failed.push(format!("query {i}: {r}")),
            Err(e) => failed.push(format!("query {i}: {e}")),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    let opened = opened.load(Ordering::Relaxed);
    let n = answered.load(Ordering::Relaxed);
    let (p50, max) = if took.is_empty() {
        (None, None)
    } else {
        let (p50, max) = p50_max(took);
        (Some(p50), Some(max))
    };
    eprintln!(
        "TCP DNS with 20 addresses holding slots ({opened} connections opened): \
         {n}/25 answered, p50 {p50:?}, max {max:?}"
    );
    assert!(failed.is_empty(), "{n}/25 answered: {failed:#?}");
    // The slots taken back were taken from the hogs, with a line each;
    // never from the other client.
    let reclaimed = eventually("reclaim lines", || {
        let lines: Vec<_> = complete_lines(&l.e)
            .into_iter()
            .filter(|l| l["reason"] == "overloaded")
            .filter(|l| {
                l["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("TCP connection closed"))
            })
            .collect();
        (!lines.is_empty()).then_some(lines)
    });
    for line in &reclaimed {
        let src = line["src"].as_str().unwrap();
        let ip: SocketAddr = src.parse().unwrap();
        assert_ne!(ip.ip(), OTHER, "{line}");
        assert_eq!(line["proto"], "dns", "{line}");
    }
}

/// Queries that wait for the resolver hold a slot of their client's share
/// (here `connections_per_client: 4`): one address that sends a dozen
/// queries for slow names at once gets the rest refused `overloaded`,
/// inline and counted (`egressd_overload_total{what="dns_queries"}`),
/// while another address's query is answered.
#[test]
fn queries_past_an_addresss_share_of_the_resolver_are_refused_and_counted() {
    let names: Vec<String> = (0..12).map(|i| format!("slow{i}.wild.example")).collect();
    let l = lab().names(&["fast.wild.example"]).start(|ports| {
        policy()
            .setting("limits", "{ connections_per_client: 4 }")
            .exception("wild")
            .host("*.wild.example")
            .cidr(LOOPBACK)
            .port(ports.origin)
    });
    let origin = l.origin.addr().ip().to_string();
    for n in &names {
        l.dns.set(n, &[&origin]);
        l.dns.delay(n, Duration::from_millis(1000));
    }
    let hog = UdpSocket::bind((HOG, 0)).unwrap();
    hog.set_read_timeout(Some(DEADLINE)).unwrap();
    for n in &names {
        let q = dns_query(n, RecordType::A);
        hog.send_to(&q.to_vec().unwrap(), l.e.dns).unwrap();
    }
    // While the hog's four wait, another address is served.
    let r = ask_from(OTHER, l.e.dns, "fast.wild.example", WAIT);
    assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{r}");
    let mut buf = vec![0u8; 65535];
    let (mut answered, mut overloaded) = (0, 0);
    for _ in &names {
        let (n, _) = hog.recv_from(&mut buf).expect("an answer to every query");
        let r = Message::from_vec(&buf[..n]).unwrap();
        match r.metadata.response_code {
            ResponseCode::NoError => answered += 1,
            ResponseCode::Refused => {
                assert_eq!(
                    ede_text(&r).map(|t| without_request_id(&t)).as_deref(),
                    Some("egressd: overloaded"),
                    "{r}"
                );
                overloaded += 1;
            }
            other => panic!("{other:?}: {r}"),
        }
    }
    assert_eq!((answered, overloaded), (4, 8));
    let counted = eventually("the refusals counted", || {
        l.e.metric("egressd_overload_total{what=\"dns_queries\"}")
            .filter(|n| *n >= 8.0)
    });
    assert_eq!(counted, 8.0);
}
