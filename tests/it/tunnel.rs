//! CONNECT tunnels: allowed, denied (and what was pipelined behind),
//! inspection_required, SNI checks on port 443.

use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};

use egressd::proxy::sni::build_client_hello;

use crate::support::*;

/// echo.test on `port`, and api.test there too but only with path rules
/// (which a tunnel cannot enforce).
fn tunnel_policy(port: u16) -> PolicyYaml {
    policy()
        .exception("echo")
        .reason("the echo server")
        .host("echo.test")
        .cidr(LOOPBACK)
        .port(port)
        .exception("inspected")
        .reason("needs path rules")
        .host("api.test")
        .cidr(LOOPBACK)
        .ports(&[port, 443])
        .path("/v1/**")
}

/// A lab whose echo server is echo.test, allowed by [`tunnel_policy`].
fn echo_lab() -> Lab {
    lab()
        .names(&["echo.test"])
        .start(|ports| tunnel_policy(ports.echo))
}

#[test]
fn allowed_connect_tunnels_bytes_both_ways_with_half_close() {
    let l = echo_lab();
    let (e, echo) = (&l.e, l.echo);
    let mut s = connect(e.proxy);
    write!(
        s,
        "CONNECT echo.test:{p} HTTP/1.1\r\nHost: echo.test:{p}\r\n\r\n",
        p = echo.port()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 200);
    let payload = vec![7u8; 100_000];
    s.write_all(&payload).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    r.read_to_end(&mut back).unwrap();
    assert_eq!(
        back.len(),
        payload.len(),
        "echoed everything, then EOF after half-close"
    );
    let line = e.wait_line("tunnel line", |l| {
        l["proto"] == "connect" && l["event"] == "close"
    });
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["exception"], "echo");
    assert_eq!(line["status"], 200);
    assert_eq!(line["bytes_up"], 100_000);
    assert_eq!(line["bytes_down"], 100_000);
    assert_eq!(line["method"], "CONNECT");
}

/// DESIGN "The record holds": a tunnel is on record from its first
/// second. Its open line is in the log file while it is still open
/// (carrying the decision, no bytes); its close line, with the same id,
/// carries the bytes and the duration.
#[test]
fn a_tunnel_is_on_record_while_open_and_its_close_line_pairs_with_it() {
    let l = echo_lab();
    let (e, echo) = (&l.e, l.echo);
    let mut s = connect(e.proxy);
    write!(
        s,
        "CONNECT echo.test:{p} HTTP/1.1\r\nHost: echo.test:{p}\r\n\r\n",
        p = echo.port()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    s.write_all(b"first bytes").unwrap();
    let mut back = [0u8; 11];
    r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"first bytes");
    // The tunnel stays open: its open line is already in the file.
    let open = e.wait_line("the open line", |l| l["event"] == "open");
    assert_eq!(open["proto"], "connect");
    assert_eq!(open["decision"], "allow");
    assert_eq!(open["reason"], "exception");
    assert_eq!(open["exception"], "echo");
    assert_eq!(open["addr"], format!("127.0.0.1:{}", echo.port()));
    assert_eq!(
        (open["bytes_up"].clone(), open["bytes_down"].clone()),
        (0.into(), 0.into())
    );
    let id = open["id"]
        .as_str()
        .expect("an open line carries its id")
        .to_string();
    let lines = e.log_lines();
    assert_eq!(lines.len(), 1, "no close line while open: {lines:?}");
    // Still carrying bytes after the open line was read.
    s.write_all(b"more").unwrap();
    let mut more = [0u8; 4];
    r.read_exact(&mut more).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    let close = e.wait_line("the close line", |l| l["event"] == "close");
    assert_eq!(
        close["id"],
        id.as_str(),
        "the close line pairs with the open line"
    );
    for k in ["proto", "host", "port", "exception", "decision", "addr"] {
        assert_eq!(close[k], open[k], "{k}");
    }
    assert_eq!(close["bytes_up"], 15);
    assert_eq!(close["bytes_down"], 15);
    assert!(close["duration_ms"].is_u64());
    assert_eq!(e.log_lines().len(), 2, "{:?}", e.log_lines());
    // One connection in the metrics, not two.
    let m = e.metrics_text();
    assert!(
        m.lines().any(|l| l.starts_with("egressd_requests_total")
            && l.contains("proto=\"connect\"")
            && l.contains("decision=\"allow\"")
            && l.ends_with(" 1")),
        "{m}"
    );
}

#[test]
fn denied_connect_closes_and_never_reads_pipelined_bytes() {
    let l = lab()
        .names(&["echo.test"])
        .start(|ports| tunnel_policy(ports.origin));
    let (e, o, c) = (&l.e, &l.origin, &l.canary);
    let mut s = connect(e.proxy);
    // A refused CONNECT with an allowed plain request smuggled behind it,
    // sent in one write so both arrive together.
    let raw = format!(
        "CONNECT evil.test:{c} HTTP/1.1\r\nHost: evil.test:{c}\r\n\r\nGET http://echo.test:{o}/smuggled HTTP/1.1\r\nHost: echo.test:{o}\r\n\r\n",
        c = c.addr.port(),
        o = o.addr.port()
    );
    s.write_all(raw.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 403);
    assert_eq!(resp.reason(), Some("no_exception"));
    assert_eq!(resp.header("connection"), Some("close"));
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "a second response came back: {:?}",
        String::from_utf8_lossy(&rest)
    );
    assert_eq!(o.count(), 0, "the pipelined request was processed");
    assert_eq!(c.hits(), 0);
    let lines = eventually("one line", || {
        let l = e.log_lines();
        (!l.is_empty()).then_some(l)
    });
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["reason"], "no_exception");
    assert!(l.dns.names().is_empty(), "{:?}", l.dns.names());
}

#[test]
fn connect_port_authority_and_inspection_rules() {
    let l = lab()
        .names(&["echo.test", "api.test"])
        .start(|ports| tunnel_policy(ports.echo));
    let (e, p) = (&l.e, l.echo_port());
    let connect_status = |target: &str, host: Option<&str>| {
        let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
        let r = e.request(&format!("CONNECT {target} HTTP/1.1\r\n{host}\r\n"));
        (r.status, r.reason().map(str::to_string))
    };
    assert_eq!(
        connect_status(&format!("echo.test:{}", p + 1), None),
        (403, Some("port_not_allowed".into()))
    );
    // Port 443 carries TLS only, which needs a CA to look into; any other
    // port may carry plain HTTP, served per request (attack::connect).
    assert_eq!(
        connect_status("api.test:443", None),
        (403, Some("inspection_required".into()))
    );
    assert_eq!(connect_status(&format!("api.test:{p}"), None), (200, None));
    assert_eq!(
        connect_status(&format!("echo.test:{p}"), Some("evil.test")),
        (403, Some("host_mismatch".into()))
    );
    assert_eq!(connect_status("echo.test", None).0, 400);
    assert_eq!(connect_status(&format!("echo.test:0{p}"), None).0, 400);
    assert_eq!(connect_status(&format!("user@echo.test:{p}"), None).0, 400);
    assert_eq!(connect_status("[::1:443", None).0, 400);
}

/// Each SNI test uses its own loopback address, so tests can bind :443 in parallel.
fn tls_echo(test: &str, last_octet: u8) -> IpAddr {
    need_root(test, "binding port 443");
    let ip: IpAddr = format!("127.0.44.{last_octet}").parse().unwrap();
    try_echo_on(ip, 443).unwrap_or_else(|e| panic!("{test}: cannot bind {ip}:443: {e}"));
    ip
}

#[test]
fn sni_must_match_the_connect_host_on_443() {
    let ip = tls_echo("sni_must_match_the_connect_host_on_443", 1);
    let l = lab_with(SocketAddr::new(ip, 443))
        .names(&["echo.test", "wild.echo.test"])
        .start(|_| {
            policy()
                .exception("echo443")
                .reason("tls echo")
                .hosts(&["echo.test", "*.echo.test"])
                .cidr(LOOPBACK)
                .port(443)
        });
    let e = &l.e;
    let try_hello = |host: &str, hello: &[u8]| -> Vec<u8> {
        let mut s = connect(e.proxy);
        write!(s, "CONNECT {host}:443 HTTP/1.1\r\n\r\n").unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(read_response(&mut r).unwrap().status, 200);
        s.write_all(hello).unwrap();
        let mut back = vec![0u8; hello.len()];
        match r.read_exact(&mut back) {
            Ok(()) => back,
            Err(_) => Vec::new(),
        }
    };
    let good = build_client_hello(Some("Echo.Test"), false);
    assert_eq!(try_hello("echo.test", &good), good, "matching SNI passes");
    let fronted = build_client_hello(Some("evil.test"), false);
    assert!(
        try_hello("echo.test", &fronted).is_empty(),
        "fronted SNI was relayed"
    );
    let no_sni = build_client_hello(None, false);
    assert_eq!(
        try_hello("echo.test", &no_sni),
        no_sni,
        "no SNI to an exact host passes"
    );
    assert!(
        try_hello("wild.echo.test", &no_sni).is_empty(),
        "no SNI under a wildcard is refused"
    );
    let ech = build_client_hello(Some("echo.test"), true);
    assert!(
        try_hello("wild.echo.test", &ech).is_empty(),
        "ECH under a wildcard is refused"
    );
    assert!(
        try_hello("echo.test", b"GET / HTTP/1.1\r\n\r\n").is_empty(),
        "plain text on 443 is refused"
    );
    let lines = eventually("six lines", || {
        let l = ending_lines(e);
        (l.len() >= 6).then_some(l)
    });
    let mismatches = lines
        .iter()
        .filter(|l| l["reason"] == "sni_mismatch" && l["decision"] == "deny")
        .count();
    assert_eq!(mismatches, 4, "{lines:#?}");
}

#[test]
fn open_tunnels_keep_their_decision_across_a_reload() {
    let l = echo_lab();
    let (e, echo) = (&l.e, l.echo);
    let mut s = connect(e.proxy);
    write!(s, "CONNECT echo.test:{} HTTP/1.1\r\n\r\n", echo.port()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    // Remove the exception.
    atomic_write(
        &e.policy_dir.join("p.yaml"),
        &policy()
            .exception("other")
            .reason("r")
            .host("other.test")
            .yaml(),
    );
    eventually("the new policy denies new tunnels", || {
        let r = e.request(&format!(
            "CONNECT echo.test:{} HTTP/1.1\r\n\r\n",
            echo.port()
        ));
        (r.status == 403).then_some(())
    });
    // The tunnel opened before the reload still works.
    s.write_all(b"still here").unwrap();
    let mut back = [0u8; 10];
    r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still here");
}

#[test]
fn bytes_sent_right_behind_an_allowed_connect_are_not_lost() {
    let l = echo_lab();
    let (e, echo) = (&l.e, l.echo);
    let mut s = connect(e.proxy);
    // The client does not wait for the 200 (as TLS False Start style clients
    // and pipelining tools may): the bytes ride in hyper's read buffer.
    let raw = format!(
        "CONNECT echo.test:{} HTTP/1.1\r\n\r\nearly-bytes",
        echo.port()
    );
    s.write_all(raw.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    let mut back = [0u8; 11];
    r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"early-bytes");
}

/// Deterministic bytes that differ at every offset of a chunk.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[0] ^ seed)
        .collect()
}

fn sha256(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .to_vec()
}

/// Opens a CONNECT tunnel to `echo.test:port` and reads the 200.
fn open_tunnel(proxy: std::net::SocketAddr, port: u16) -> (TcpStream, BufReader<TcpStream>) {
    let mut s = connect(proxy);
    write!(
        s,
        "CONNECT echo.test:{port} HTTP/1.1\r\nHost: echo.test:{port}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 200);
    (s, r)
}

#[test]
fn large_transfers_both_ways_at_once_arrive_byte_exact_across_a_half_close() {
    const UP: usize = 32 << 20;
    const DOWN: usize = 48 << 20;
    // The server sends DOWN bytes while it reads the client's UP bytes;
    // after the client's half-close it answers with the SHA-256 of what it
    // received, so bytes written after that half-close must still arrive.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        let mut rd = c.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(UP);
            rd.read_to_end(&mut got).unwrap();
            got
        });
        let mut w = c;
        w.write_all(&pattern(2, DOWN)).unwrap();
        let got = reader.join().unwrap();
        w.write_all(&sha256(&got)).unwrap();
        w.shutdown(Shutdown::Write).unwrap();
        got.len()
    });
    let l = lab().names(&["echo.test"]).start(|_| tunnel_policy(port));
    let e = &l.e;
    let (s, mut r) = open_tunnel(e.proxy, port);
    let sent = pattern(1, UP);
    let sent_hash = sha256(&sent);
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::with_capacity(DOWN + 32);
    r.read_to_end(&mut back).unwrap();
    writer.join().unwrap();
    assert_eq!(server.join().unwrap(), UP, "server received every byte");
    assert_eq!(back.len(), DOWN + 32);
    assert!(
        sha256(&back[..DOWN]) == sha256(&pattern(2, DOWN)),
        "server → client bytes differ"
    );
    assert_eq!(
        &back[DOWN..],
        &sent_hash[..],
        "client → server bytes differ"
    );
    let line = e.wait_line("tunnel line", |l| {
        l["proto"] == "connect" && l["event"] == "close"
    });
    assert_eq!(line["bytes_up"], UP as u64);
    assert_eq!(line["bytes_down"], (DOWN + 32) as u64);
    assert_eq!(line["error"], serde_json::Value::Null);
}

/// Pipes egressd has open (each is two descriptors), from /proc.
fn pipe_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|f| std::fs::read_link(f.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("pipe:"))
        .count()
}

#[test]
fn idle_tunnels_hold_no_pipe_and_used_pipes_are_kept_for_reuse() {
    const TUNNELS: usize = 100;
    let l = echo_lab();
    let (e, echo) = (&l.e, l.echo);
    let pid = e.child.id();
    let before = pipe_fds(pid);
    // Every tunnel moves data both ways, then stays open and idle. 64 KiB
    // each way: more than a burst's first read (which is copied), so the
    // rest goes through a pipe.
    let mut open = Vec::new();
    for i in 0..TUNNELS {
        let (mut s, mut r) = open_tunnel(e.proxy, echo.port());
        let msg = pattern(i as u8, 64 << 10);
        s.write_all(&msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        r.read_exact(&mut got).unwrap();
        assert!(got == msg);
        open.push((s, r));
    }
    // Each direction gives its pipe back once the pipe is empty and its
    // source would block, which may lag the echo we read by a moment. Held
    // pipes would be 2 per tunnel (400 descriptors); a few free ones stay
    // open for reuse.
    let held = eventually("idle tunnels to give their pipes back", || {
        let n = pipe_fds(pid) - before;
        (n <= 8).then_some(n)
    });
    assert!(
        held >= 2,
        "a used pipe is kept in the free list, not closed"
    );
    drop(open);
    eventually("every tunnel's line", || {
        let n = complete_lines(e)
            .iter()
            .filter(|l| l["proto"] == "connect" && l["event"] == "close")
            .count();
        (n == TUNNELS).then_some(())
    });
    let after = pipe_fds(pid) - before;
    assert!(after <= 8, "pipes closed or kept, not leaked: {after} fds");
}
