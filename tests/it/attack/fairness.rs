//! Fair shares: one sandbox that opens every connection it can must not
//! starve another sharing the same egressd. Each client (a named client
//! its source identifies, else its source address) may hold at most
//! `settings.limits.connections_per_client` connections, tunnels included;
//! past it a connection is answered `503 overloaded` at once, with its one
//! line, and DNS queries in flight are bounded per client likewise.
//!
//! The hog connects from 127.0.0.2 and the other client from 127.0.0.3
//! (sockets bound to those loopback addresses before connecting). Each of
//! the other client's requests and queries must be answered within
//! [`WAIT`]: a bound that fails the test, not a speed measurement.

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use super::*;

const HOG: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const OTHER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// The longest the other client may wait for any one answer.
const WAIT: Duration = Duration::from_secs(1);

/// Raises this process's open-file limit (and so that of the egressd it
/// starts) to at least `want`, within the hard limit.
fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one plain struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(
        lim.rlim_cur >= want,
        "this test needs {want} open files; the hard limit is {}",
        lim.rlim_max
    );
}

/// A 503 `overloaded`, written at once to a connection that sent nothing,
/// and the end of the connection after it.
fn assert_overloaded(s: TcpStream, what: &str) {
    let r = read_response(&mut BufReader::new(s))
        .unwrap_or_else(|| panic!("{what}: no answer on a refused connection"));
    assert_eq!(
        (r.status, r.reason()),
        (503, Some("overloaded")),
        "{what}: {}",
        r.text()
    );
}

/// Sorts `conns` into those egressd answered (and closed) and those it
/// holds open, waiting until `answered` were answered. A held connection
/// has nothing to read.
fn sort_answered(conns: Vec<TcpStream>, answered: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    for c in &conns {
        c.set_nonblocking(true).unwrap();
    }
    let end = Instant::now() + DEADLINE;
    loop {
        let ready = conns.iter().filter(|c| has_bytes(c)).count();
        if ready >= answered || Instant::now() > end {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (done, held): (Vec<_>, Vec<_>) = conns.into_iter().partition(has_bytes);
    for c in done.iter().chain(&held) {
        c.set_nonblocking(false).unwrap();
    }
    (done, held)
}

/// Whether a non-blocking `c` has bytes (or its end) to read.
fn has_bytes(c: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    match c.peek(&mut b) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// The decision-log lines of refusals for being over a share, from `ip`.
fn overloaded_from(e: &Egressd, ip: Ipv4Addr) -> Vec<serde_json::Value> {
    complete_lines(e)
        .into_iter()
        .filter(|l| l["reason"] == "overloaded")
        .filter(|l| {
            l["src"]
                .as_str()
                .is_some_and(|s| s.starts_with(&format!("{ip}:")))
        })
        .collect()
}

/// A lab whose origin serves `allowed.test`, with `settings.limits` set to
/// `limits` (a flow mapping) if given.
fn fair_lab(limits: Option<&str>) -> Lab {
    lab().names(&["allowed.test"]).start(|ports| {
        let p = policy()
            .exception("origin")
            .host("allowed.test")
            .cidr(LOOPBACK)
            .port(ports.origin);
        match limits {
            Some(l) => p.setting("limits", l),
            None => p,
        }
    })
}

#[test]
fn a_client_holding_3000_connections_leaves_the_others_their_share() {
    const HELD: usize = 3000;
    let share = 1024; // the default
    raise_nofile(2 * HELD as u64 + 1024);
    // Long enough a header timeout that none of the idle connections is
    // closed while the test runs; the share is the default.
    let l = fair_lab(Some("{ header_timeout: 5m }"));
    let url = format!("http://allowed.test:{}/", l.port());

    let conns: Vec<TcpStream> = (0..HELD).map(|_| connect_from(HOG, l.e.proxy)).collect();
    let (refused, held) = sort_answered(conns, HELD - share);
    assert_eq!(
        (held.len(), refused.len()),
        (share, HELD - share),
        "the hog holds its share and no more"
    );
    for (i, c) in refused.into_iter().enumerate() {
        assert_overloaded(c, &format!("refused connection {i}"));
    }
    let lines = eventually("a line for each refused connection", || {
        let l = overloaded_from(&l.e, HOG);
        (l.len() >= HELD - share).then_some(l)
    });
    assert_eq!(lines.len(), HELD - share);
    assert!(lines
        .iter()
        .all(|l| l["status"] == 503 && l["decision"] == "deny"));

    // The other client is not affected, by the proxy or the resolver.
    assert_served(OTHER, l.e.proxy, l.e.dns, &url, 20, WAIT);
    assert!(overloaded_from(&l.e, OTHER).is_empty());

    // The hog's share is still full: its next connection is refused too...
    assert_overloaded(connect_from(HOG, l.e.proxy), "one more from the hog");
    // ...until it lets one of its connections go.
    drop(held.into_iter().next());
    eventually("a slot given back", || open_from(HOG, l.e.proxy, &url).ok());
}

/// A connection from `from` that had one `GET` answered `200` and stays
/// open (so it keeps counting against its client's share), or the
/// refusal it got instead.
fn open_from(from: Ipv4Addr, proxy: SocketAddr, url: &str) -> Result<TcpStream, Response> {
    let mut s = connect_from(from, proxy);
    let host = host_of(url);
    s.write_all(format!("GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap())).expect("an answer");
    match r.status {
        200 => Ok(s),
        _ => Err(r),
    }
}

/// A CONNECT tunnel from the hog to `target` that carried a few bytes
/// both ways, or the refusal it got.
fn tunnel_from(from: Ipv4Addr, proxy: SocketAddr, target: &str) -> Result<TcpStream, String> {
    let mut s = connect_from(from, proxy);
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let head = read_head(&mut r).expect("a CONNECT answer");
    if !head[0].contains(" 200") {
        return Err(head.join("\n"));
    }
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    r.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping", "the tunnel carries bytes");
    Ok(s)
}

#[test]
fn tunnels_count_against_the_share_for_as_long_as_they_are_open() {
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("origin")
            .host("allowed.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
            .exception("echo")
            .cidr("127.0.0.1/32")
            .port(ports.echo)
            .setting("limits", "{ connections_per_client: 4 }")
    });
    let echo = format!("127.0.0.1:{}", l.echo_port());
    // A tunnel's line is written when it closes.
    let mut lines = Lines::new(&l.e);
    let mut tunnels: Vec<TcpStream> = (0..4)
        .map(|i| tunnel_from(HOG, l.e.proxy, &echo).unwrap_or_else(|e| panic!("tunnel {i}: {e}")))
        .collect();
    // Four open tunnels are the whole share, long after their CONNECT
    // was answered.
    assert_overloaded(connect_from(HOG, l.e.proxy), "a fifth connection");
    let refused = lines.one("the fifth connection");
    assert_eq!(
        (refused["reason"].as_str(), refused["status"].as_u64()),
        (Some("overloaded"), Some(503))
    );
    let e = tunnel_from(HOG, l.e.proxy, &echo).expect_err("a fifth tunnel");
    assert!(
        e.starts_with("HTTP/1.1 503") && e.contains("overloaded"),
        "{e}"
    );
    lines.one("the fifth tunnel");
    // Another client is not affected.
    let r = get_from(
        OTHER,
        l.e.proxy,
        &format!("http://allowed.test:{}/", l.port()),
        WAIT,
    );
    assert_eq!(r.status, 200);
    lines.one("the other client's request");
    // Closing a tunnel gives its slot back.
    drop(tunnels.pop());
    let t = eventually("the closed tunnel's slot", || {
        tunnel_from(HOG, l.e.proxy, &echo).ok()
    });
    tunnels.push(t);
}

#[test]
fn a_named_client_has_one_share_across_its_sources() {
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("origin")
            .host("allowed.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
            .client_from("hog", &["127.0.0.2/32", "127.0.0.4/32"])
            .setting("limits", "{ connections_per_client: 3 }")
    });
    let url = format!("http://allowed.test:{}/", l.port());
    let second_source = Ipv4Addr::new(127, 0, 0, 4);
    let mut lines = Lines::new(&l.e);
    let _held = [
        open_from(HOG, l.e.proxy, &url).expect("first"),
        open_from(second_source, l.e.proxy, &url).expect("second"),
        open_from(HOG, l.e.proxy, &url).expect("third"),
    ];
    lines.next_n("three requests", 3);
    let r = open_from(second_source, l.e.proxy, &url).expect_err("a fourth connection");
    assert_overloaded_for(&r, &mut lines, "hog");
    // The addresses outside the named client have shares of their own.
    let r = get_from(OTHER, l.e.proxy, &url, WAIT);
    assert_eq!(r.status, 200);
}

#[test]
fn a_reload_applies_the_new_share_to_new_connections() {
    let policy_with = |port: u16, share: u32| {
        policy()
            .exception("origin")
            .host("allowed.test")
            .cidr(LOOPBACK)
            .port(port)
            .setting("limits", &format!("{{ connections_per_client: {share} }}"))
            .yaml()
    };
    let l = lab()
        .names(&["allowed.test"])
        .start(|ports| policy_with(ports.origin, 2));
    let url = format!("http://allowed.test:{}/", l.port());
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| open_from(HOG, l.e.proxy, &url).expect("within the share"))
        .collect();
    let r = open_from(HOG, l.e.proxy, &url).expect_err("past the share of 2");
    assert_eq!(r.reason(), Some("overloaded"));
    atomic_write(&l.e.policy_dir.join("p.yaml"), &policy_with(l.port(), 4));
    // The two held connections stay; two more fit the new share.
    held.push(eventually("the new share", || {
        open_from(HOG, l.e.proxy, &url).ok()
    }));
    held.push(open_from(HOG, l.e.proxy, &url).expect("the fourth"));
    let r = open_from(HOG, l.e.proxy, &url).expect_err("past the share of 4");
    assert_eq!(r.reason(), Some("overloaded"));
}

#[test]
fn dns_queries_in_flight_are_bounded_per_client() {
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("origin")
            .hosts(&["allowed.test", "slow.allowed.test"])
            .cidr(LOOPBACK)
            .port(ports.origin)
            .setting("limits", "{ connections_per_client: 4 }")
    });
    l.dns.silent("slow.allowed.test");
    // allowed.test in the answer cache: a query for it is answered at once.
    let r = ask_from(OTHER, l.e.dns, "allowed.test", WAIT);
    assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{r}");
    // Ten queries the upstream never answers: four in flight, six refused
    // at once.
    let hog = UdpSocket::bind((HOG, 0)).unwrap();
    hog.set_read_timeout(Some(DEADLINE)).unwrap();
    for _ in 0..10 {
        let q = dns_query("slow.allowed.test", RecordType::A);
        hog.send_to(&q.to_vec().unwrap(), l.e.dns).unwrap();
    }
    recv_overloaded(&hog, 6);
    // Queries answered without a task (cached, denied) take no slot but
    // still look at the share: a client at its share is refused those too,
    // not served past it.
    for name in ["allowed.test", "denied.test"] {
        let q = dns_query(name, RecordType::A);
        hog.send_to(&q.to_vec().unwrap(), l.e.dns).unwrap();
        recv_overloaded(&hog, 1);
    }
    // Meanwhile another client's queries are answered.
    for i in 0..5 {
        let r = ask_from(OTHER, l.e.dns, "allowed.test", WAIT);
        assert_eq!(
            r.metadata.response_code,
            ResponseCode::NoError,
            "query {i}: {r}"
        );
    }
    let lines = eventually("eight overloaded lines", || {
        let l = overloaded_from(&l.e, HOG);
        (l.len() >= 8).then_some(l)
    });
    assert_eq!(lines.len(), 8);
    let qnames: Vec<&str> = lines.iter().map(|l| l["qname"].as_str().unwrap()).collect();
    assert!(
        qnames[..6].iter().all(|q| *q == "slow.allowed.test"),
        "{qnames:?}"
    );
    assert_eq!(qnames[6..], ["allowed.test", "denied.test"]);
}

#[test]
fn a_client_known_by_its_token_has_one_share_across_addresses() {
    let digest: String = ring::digest::digest(&ring::digest::SHA256, b"agent-token")
        .as_ref()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect();
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("origin")
            .host("allowed.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
            .client_token("agent", &digest)
            .setting("limits", "{ connections_per_client: 2 }")
    });
    let url = format!("http://allowed.test:{}/", l.port());
    // Basic agent:agent-token
    let get_with_token = |s: &mut TcpStream| {
        s.write_all(
            format!(
                "GET {url} HTTP/1.1\r\nHost: allowed.test\r\n\
                 Proxy-Authorization: Basic YWdlbnQ6YWdlbnQtdG9rZW4=\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
        read_response(&mut BufReader::new(s.try_clone().unwrap())).expect("an answer")
    };
    let mut lines = Lines::new(&l.e);
    let mut held = Vec::new();
    for from in [HOG, Ipv4Addr::new(127, 0, 0, 4)] {
        let mut s = connect_from(from, l.e.proxy);
        let r = get_with_token(&mut s);
        assert_eq!(r.status, 200, "from {from}: {}", r.text());
        held.push(s);
    }
    lines.next_n("two requests with the token", 2);
    // A third address, each within its own share, but the token's client
    // has its two.
    let third = Ipv4Addr::new(127, 0, 0, 5);
    let mut s = connect_from(third, l.e.proxy);
    let r = get_with_token(&mut s);
    assert_overloaded_for(&r, &mut lines, "agent");
    // The address itself is not refused: without the token it is served.
    let r = get_from(third, l.e.proxy, &url, WAIT);
    assert_eq!(r.status, 200);
    // Once one of the client's connections closes, the token is served.
    drop(held.pop());
    eventually("the token client's slot back", || {
        let mut s = connect_from(third, l.e.proxy);
        (get_with_token(&mut s).status == 200).then_some(())
    });
}

#[test]
fn a_named_clients_dns_queries_in_flight_share_one_bound() {
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("origin")
            .hosts(&["allowed.test", "slow.allowed.test"])
            .cidr(LOOPBACK)
            .port(ports.origin)
            .client_from("hog", &["127.0.0.2/32", "127.0.0.4/32"])
            .setting("limits", "{ connections_per_client: 4 }")
    });
    l.dns.silent("slow.allowed.test");
    let q = dns_query("slow.allowed.test", RecordType::A)
        .to_vec()
        .unwrap();
    // Three slow queries from one of the client's addresses, then three
    // from the other: the last two are past the client's four.
    let first = UdpSocket::bind((HOG, 0)).unwrap();
    for _ in 0..3 {
        first.send_to(&q, l.e.dns).unwrap();
    }
    let second = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 4), 0)).unwrap();
    second.set_read_timeout(Some(DEADLINE)).unwrap();
    // One receive queue: they arrive in the order sent.
    for _ in 0..3 {
        second.send_to(&q, l.e.dns).unwrap();
    }
    recv_overloaded(&second, 2);
    let lines = eventually("two overloaded lines", || {
        let l: Vec<_> = complete_lines(&l.e)
            .into_iter()
            .filter(|l| l["reason"] == "overloaded")
            .collect();
        (l.len() >= 2).then_some(l)
    });
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l["client"] == "hog"), "{lines:?}");
    // Another address is not the named client, and has its own share.
    let r = ask_from(OTHER, l.e.dns, "allowed.test", WAIT);
    assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{r}");
}
