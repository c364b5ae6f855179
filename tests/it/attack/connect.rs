//! CONNECT: the authority against the `Host` header, malformed authorities,
//! ports outside the exception, bytes pipelined behind a refused CONNECT,
//! the TLS server name against the authority, bytes that are not TLS in a
//! tunnel to port 443, and plain HTTP inside any tunnel (its `Host`).

use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr};

use egressd::proxy::sni::build_client_hello;

use super::*;

/// `allowed.test` is the echo server (exception `tunnel`), `plain.test`
/// the plain origin (exception `plain`), which no attack here may reach.
fn lab() -> Lab {
    crate::support::lab()
        .names(&["allowed.test", "evil.test", "plain.test"])
        .start(|ports| {
            policy()
                .exception("tunnel")
                .reason("the echo server")
                .host("allowed.test")
                .cidr(LOOPBACK)
                .port(ports.echo)
                .exception("plain")
                .reason("the plain origin")
                .host("plain.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
        })
}

fn assert_clean(l: &Lab) {
    assert_eq!(l.origin.count(), 0, "the plain origin was reached");
    l.assert_clean(&["allowed.test"]);
}

#[test]
fn the_authority_and_the_host_header_must_agree() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let (p, c) = (l.echo.port(), l.canary.addr.port());
    for host in [
        "evil.test".to_string(),
        format!("evil.test:{p}"),
        format!("allowed.test:{c}"),
        "allowed.test:443".to_string(),
        format!("allowed.test.evil.test:{p}"),
        format!("evil.test@allowed.test:{p}"),
        String::new(),
    ] {
        let raw = format!("CONNECT allowed.test:{p} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        refused(&mut lines, &raw, 403, "host_mismatch");
    }
    let raw = format!(
        "CONNECT allowed.test:{p} HTTP/1.1\r\nHost: allowed.test:{p}\r\nHost: evil.test:{c}\r\n\r\n"
    );
    refused(&mut lines, &raw, 400, "malformed");
    // Control: an agreeing Host (a port-less one means the CONNECT port).
    for host in [format!("ALLOWED.TEST.:{p}"), "allowed.test".into()] {
        let mut s = connect(l.e.proxy);
        write!(
            s,
            "CONNECT allowed.test:{p} HTTP/1.1\r\nHost: {host}\r\n\r\n"
        )
        .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(read_response(&mut r).unwrap().status, 200, "{host}");
        s.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        r.read_exact(&mut back).unwrap();
        drop((s, r));
        let line = lines.one(&host);
        assert_eq!(line["decision"], "allow");
    }
    lines.done("host");
    assert_clean(&l);
}

#[test]
fn malformed_authorities_are_refused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.echo.port();
    for auth in [
        "allowed.test".to_string(),
        "allowed.test:".to_string(),
        format!(":{p}"),
        "allowed.test:0".to_string(),
        format!("allowed.test:0{p}"),
        "allowed.test:65536".to_string(),
        format!("allowed.test:+{p}"),
        format!("allowed.test:{p}:{p}"),
        format!("allowed.test:{p}/"),
        format!("allowed.test:{p}/x"),
        format!("allowed.test:{p}?x"),
        format!("http://allowed.test:{p}"),
        format!("http://allowed.test:{p}/"),
        format!("user@allowed.test:{p}"),
        format!("evil.test@allowed.test:{p}"),
        format!("allowed.test:{p}@evil.test:{p}"),
        format!("allowed.test%3a{p}"),
        format!("allowed.test:0x{p:x}"),
        format!("*:{p}"),
        format!("[allowed.test]:{p}"),
        "[::1]".to_string(),
        "[::1]:".to_string(),
        format!("[::1:{p}"),
        format!("::1:{p}"),
        format!("allowed..test:{p}"),
        format!("allowed.test\\@evil.test:{p}"),
        "*".to_string(),
        "/".to_string(),
    ] {
        refused(&mut lines, &connect_raw(&auth), 400, "malformed");
    }
    // Method spelled in lower case is not CONNECT: an authority-form target
    // on a plain request is not proxied.
    refused(
        &mut lines,
        &format!("connect allowed.test:{p} HTTP/1.1\r\n\r\n"),
        400,
        "malformed",
    );
    lines.done("authorities");
    assert_clean(&l);
}

#[test]
fn ports_outside_the_exception_are_refused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let c = l.canary.addr.port();
    for port in [c, 22, 25, 443, 80, 1, 65535, l.e.proxy.port()] {
        if port == l.echo.port() {
            continue;
        }
        let line = refused(
            &mut lines,
            &connect_raw(&format!("allowed.test:{port}")),
            403,
            "port_not_allowed",
        );
        assert_eq!(line["port"], port);
        assert_eq!(
            line["exception"], "tunnel",
            "the closest exception is named"
        );
    }
    lines.done("ports");
    assert_clean(&l);
}

/// Whatever follows a refused CONNECT was meant for the destination: none
/// of it is read as a request, whatever the refusal.
#[test]
fn nothing_pipelined_behind_a_refused_connect_is_read() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let (p, c, o) = (l.echo.port(), l.canary.addr.port(), l.origin.addr.port());
    let smuggled = format!(
        "GET http://plain.test:{o}/smuggled HTTP/1.1\r\nHost: plain.test:{o}\r\n\r\n\
         CONNECT allowed.test:{p} HTTP/1.1\r\n\r\n"
    );
    for (head, status, reason) in [
        (
            format!("CONNECT evil.test:{c} HTTP/1.1\r\n\r\n"),
            403,
            "no_exception",
        ),
        (
            format!("CONNECT allowed.test:{c} HTTP/1.1\r\n\r\n"),
            403,
            "port_not_allowed",
        ),
        (
            format!("CONNECT allowed.test:{p} HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
            403,
            "host_mismatch",
        ),
        (
            "CONNECT allowed.test:0 HTTP/1.1\r\n\r\n".to_string(),
            400,
            "malformed",
        ),
        (
            format!(
                "CONNECT allowed.test:{p} HTTP/1.1\r\nProxy-Authorization: Bearer nope\r\n\r\n"
            ),
            403,
            "client_not_allowed",
        ),
    ] {
        let raw = format!("{head}{smuggled}");
        let got = all_responses(l.e.proxy, raw.as_bytes());
        assert_eq!(got.len(), 1, "{head:?}: {} responses", got.len());
        assert_eq!(got[0].status, status, "{head:?}");
        assert_eq!(got[0].header("connection"), Some("close"), "{head:?}");
        let line = lines.one(&head);
        assert_denied_line(&line, reason, Some(status), &head);
    }
    // And with the pipelined bytes arriving a moment later, in their own write.
    let mut s = connect(l.e.proxy);
    write!(s, "CONNECT evil.test:{c} HTTP/1.1\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 403);
    let _ = s.write_all(smuggled.as_bytes());
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    lines.one("late pipelined bytes");
    lines.done("pipelined");
    assert_clean(&l);
}

/// Bytes sent right behind an allowed CONNECT belong to the tunnel: they
/// reach the destination as data, never egressd's HTTP parser.
#[test]
fn bytes_pipelined_behind_an_allowed_connect_are_tunnel_data() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.echo.port();
    let inner = b"\x00\x01not a request, tunnel data\n".to_vec();
    let mut s = connect(l.e.proxy);
    write!(s, "CONNECT allowed.test:{p} HTTP/1.1\r\n\r\n").unwrap();
    s.write_all(&inner).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut r = BufReader::new(s);
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    let mut back = Vec::new();
    r.read_to_end(&mut back).unwrap();
    assert_eq!(back, inner, "echoed back as tunnel data");
    let line = lines.one("tunnel");
    assert_eq!(line["bytes_up"], inner.len());
    lines.done("tunnel");
    assert_clean(&l);
}

/// Cleartext fronting (issue 37): an HTTP request pipelined behind an
/// allowed CONNECT, or sent later inside it, is checked as a proxy request
/// is, on a hosts-only exception too: a `Host` or absolute-form target
/// naming another host gets `403 host_mismatch`, and nothing reaches the
/// CONNECT host's address or the other host.
#[test]
fn plain_http_inside_any_connect_must_name_the_connect_host() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let (p, o) = (l.echo.port(), l.origin.addr.port());
    for (what, inner) in [
        (
            "absolute form",
            format!("GET http://plain.test:{o}/inner HTTP/1.1\r\nHost: plain.test:{o}\r\n\r\n"),
        ),
        (
            "Host header",
            format!("GET /inner HTTP/1.1\r\nHost: plain.test:{o}\r\n\r\n"),
        ),
        (
            "Host without the port",
            "GET /inner HTTP/1.0\r\nHost: evil.test\r\n\r\n".to_string(),
        ),
    ] {
        let mut s = connect(l.e.proxy);
        write!(s, "CONNECT allowed.test:{p} HTTP/1.1\r\n\r\n{inner}").unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(read_response(&mut r).unwrap().status, 200, "{what}");
        let resp = read_response(&mut r).unwrap_or_else(|| panic!("{what}: no answer inside"));
        assert_eq!(
            (resp.status, resp.reason()),
            (403, Some("host_mismatch")),
            "{what}: {}",
            resp.text()
        );
        drop((s, r));
        // The request's line and, once the tunnel closes, the tunnel's.
        let two = lines.next_n(what, 2);
        let line = two.iter().find(|x| x["proto"] == "http").expect(what);
        assert_eq!(line["reason"], "host_mismatch", "{what}: {line}");
        assert!(
            two.iter().any(|x| x["proto"] == "connect"),
            "{what}: {two:?}"
        );
    }
    lines.done("fronting inside");
    assert_clean(&l);

    // A request that names the CONNECT host is served, inside the same
    // tunnel as its refused neighbour.
    let mut s = connect(l.e.proxy);
    write!(
        s,
        "CONNECT allowed.test:{p} HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\nHost: evil.test:{p}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    assert_eq!(read_response(&mut r).unwrap().status, 403);
    write!(s, "GET /x HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n").unwrap();
    let resp = read_response(&mut r).expect("an answer from the CONNECT host");
    assert_ne!(resp.status, 403, "{}", resp.text());
}

/// A TLS echo server on its own loopback address at port 443, and a canary
/// (counting bytes) on another; port 443 needs root.
fn tls_pair(test: &str, n: u8) -> (IpAddr, IpAddr, Canary) {
    need_root(test, "binding port 443");
    let echo_ip: IpAddr = format!("127.0.45.{n}").parse().unwrap();
    let canary_ip: IpAddr = format!("127.0.45.{}", n + 1).parse().unwrap();
    try_echo_on(echo_ip, 443).unwrap_or_else(|e| panic!("{test}: {echo_ip}:443: {e}"));
    let c =
        try_canary_on(canary_ip, 443).unwrap_or_else(|e| panic!("{test}: {canary_ip}:443: {e}"));
    (echo_ip, canary_ip, c)
}

/// Opens a CONNECT to `host:443`, sends `bytes` (in `chunk`-sized writes)
/// and returns what came back before the tunnel closed (or `want` bytes).
fn through(e: &Egressd, host: &str, bytes: &[u8], chunk: usize, want: usize) -> Vec<u8> {
    let mut s = connect(e.proxy);
    write!(s, "CONNECT {host}:443 HTTP/1.1\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200, "{host}");
    for c in bytes.chunks(chunk) {
        if s.write_all(c).is_err() {
            break;
        }
        s.flush().unwrap();
    }
    let mut back = vec![0u8; want];
    match r.read_exact(&mut back) {
        Ok(()) => back,
        Err(_) => Vec::new(),
    }
}

#[test]
fn the_server_name_must_be_the_connect_host() {
    let (echo_ip, canary_ip, tls_canary) = tls_pair("the_server_name_must_be_the_connect_host", 10);
    let l = lab_with(SocketAddr::new(echo_ip, 443))
        .canary(tls_canary)
        .names(&["allowed.test"])
        .start(|_| tls_policy(&["allowed.test", "trap.test"]));
    l.dns.set("trap.test", &[&canary_ip.to_string()]);
    let e = &l.e;
    let mut lines = Lines::new(e);

    // Controls: the CONNECT host, in any case, with or without the dot,
    // whole or one byte per write, passes and is echoed.
    for (sni, chunk) in [
        ("allowed.test", 4096),
        ("ALLOWED.Test", 1),
        ("allowed.test.", 7),
    ] {
        let hello = build_client_hello(Some(sni), false);
        assert_eq!(
            through(e, "allowed.test", &hello, chunk, hello.len()),
            hello,
            "{sni}"
        );
        assert_eq!(lines.one(sni)["decision"], "allow");
    }
    // Domain fronting and other names: the tunnel closes, nothing is sent on.
    let fronts = [
        "evil.test",
        "evilallowed.test",
        "allowed.test.evil.test",
        "xallowed.test",
        "allowed.tes",
        "allowed.test\0",
        "allowed.test\0.evil.test",
        "allowed..test",
        "127.0.45.10",
        "",
        "b\u{fc}cher.test",
    ];
    for sni in fronts {
        let hello = build_client_hello(Some(sni), false);
        assert!(
            through(e, "trap.test", &hello, 4096, 1).is_empty(),
            "{sni:?}"
        );
        let line = lines.one(sni);
        assert_denied_line(&line, "sni_mismatch", None, sni);
        assert_eq!(line["bytes_up"], 0, "{sni:?}");
    }
    // An IP-literal CONNECT with a named SNI is fronting too.
    let hello = build_client_hello(Some("trap.test"), false);
    assert!(through(e, &canary_ip.to_string(), &hello, 4096, 1).is_empty());
    assert_denied_line(&lines.one("ip + sni"), "sni_mismatch", None, "ip + sni");
    // Two server_name extensions, the second naming another host.
    let mut two = build_client_hello(Some("trap.test"), false);
    let ext = build_client_hello(Some("evil.test"), false);
    let idx = find(&ext, b"evil.test").unwrap() - 9;
    let extra = ext[idx..idx + 9 + "evil.test".len()].to_vec();
    splice_extension(&mut two, &extra);
    assert!(through(e, "trap.test", &two, 4096, 1).is_empty());
    assert_denied_line(&lines.one("two SNIs"), "sni_mismatch", None, "two SNIs");
    lines.done("sni");
    assert_eq!(
        l.canary.bytes.lock().unwrap().len(),
        0,
        "bytes reached the trap's server"
    );
    assert_only_asked(&l.dns, &["allowed.test", "trap.test"]);
}

#[test]
fn non_tls_bytes_in_a_tunnel_to_443_close_it() {
    let (_, _, trap) = tls_pair("non_tls_bytes_in_a_tunnel_to_443_close_it", 20);
    // The only destination is the trap: whatever reaches it got through.
    let l = lab_with(trap)
        .names(&["trap.test"])
        .start(|_| tls_policy(&["trap.test"]));
    let mut lines = Lines::new(&l.e);
    let mut truncated = build_client_hello(Some("trap.test"), false);
    truncated[4] = 0xff; // record length far beyond what follows, then EOF
    let mut wrong_type = build_client_hello(Some("trap.test"), false);
    wrong_type[5] = 2; // a ServerHello, not a ClientHello
    for (what, bytes) in [
        (
            "plain HTTP",
            b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n".to_vec(),
        ),
        ("SSH banner", b"SSH-2.0-OpenSSH_9.6\r\n".to_vec()),
        (
            "HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        ),
        ("SSLv2 hello", vec![0x80, 0x2e, 0x01, 0x00, 0x02]),
        ("TLS alert", vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]),
        (
            "garbage in a handshake record",
            vec![0x16, 0x03, 0x01, 0x00, 0x04, 0xde, 0xad, 0xbe, 0xef],
        ),
        ("truncated hello", truncated),
        ("server hello", wrong_type),
    ] {
        let mut s = connect(l.e.proxy);
        s.write_all(b"CONNECT trap.test:443 HTTP/1.1\r\n\r\n")
            .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(read_response(&mut r).unwrap().status, 200);
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        let _ = r.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{what}");
        let line = lines.one(what);
        assert_denied_line(&line, "sni_mismatch", None, what);
    }
    lines.done("non-tls");
    assert_eq!(
        l.origin.bytes.lock().unwrap().len(),
        0,
        "bytes reached the server"
    );
}

/// `hosts` on port 443 of the TLS pairs' addresses.
fn tls_policy(hosts: &[&str]) -> PolicyYaml {
    policy()
        .exception("tls")
        .reason("tls names")
        .hosts(hosts)
        .cidr("127.0.45.0/24")
        .port(443)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Appends one extension (type, length, body) to a ClientHello built by
/// `build_client_hello`, fixing every length on the way.
fn splice_extension(hello: &mut Vec<u8>, ext: &[u8]) {
    // record(5) handshake(4) version(2) random(32) sid(1) suites(4) comp(2) exts_len(2)
    let exts_len_at = 5 + 4 + 2 + 32 + 1 + 4 + 2;
    hello.extend_from_slice(ext);
    let bump = |h: &mut Vec<u8>, at: usize, width: usize| {
        let mut v = 0usize;
        for i in 0..width {
            v = v << 8 | h[at + i] as usize;
        }
        v += ext.len();
        for i in 0..width {
            h[at + width - 1 - i] = (v >> (8 * i)) as u8;
        }
    };
    bump(hello, 3, 2);
    bump(hello, 6, 3);
    bump(hello, exts_len_at, 2);
}

/// The ClientHello is checked on every port, not only 443: a tunnel to
/// the echo server's port carrying a ClientHello for another name closes
/// before a byte reaches it. Non-TLS bytes pass off port 443, and a server
/// that speaks first (SSH, SMTP) is never held up waiting for the client.
#[test]
fn the_server_name_is_checked_on_every_port() {
    let banner = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bport = banner.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in banner.incoming() {
            let Ok(mut c) = c else { continue };
            let _ = c.write_all(b"SSH-2.0-banner\r\n");
            let mut buf = [0u8; 64];
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 || c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let l = crate::support::lab()
        .names(&["allowed.test", "api.allowed.test"])
        .start(|ports| {
            policy()
                .exception("tunnel")
                .reason("the echo server and the banner server")
                .hosts(&["allowed.test", "api.allowed.test"])
                .cidr(LOOPBACK)
                .ports(&[ports.echo, bport])
        });
    let mut lines = Lines::new(&l.e);
    let p = l.echo.port();
    let open = |port: u16| {
        let mut s = connect(l.e.proxy);
        write!(s, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(read_response(&mut r).unwrap().status, 200);
        (s, r)
    };
    for (sni, chunk) in [("api.allowed.test", 4096), ("evil.test", 1), ("", 4096)] {
        let (mut s, mut r) = open(p);
        for c in build_client_hello(Some(sni), false).chunks(chunk) {
            if s.write_all(c).is_err() {
                break;
            }
        }
        let mut back = Vec::new();
        let _ = r.read_to_end(&mut back);
        assert!(back.is_empty(), "{sni:?}: the echo server got the hello");
        let line = lines.one(sni);
        assert_denied_line(&line, "sni_mismatch", Some(200), sni);
        assert_eq!(line["bytes_up"], 0, "{sni:?}");
    }
    // Controls: the CONNECT host's hello, and bytes that are not TLS.
    for bytes in [
        build_client_hello(Some("allowed.test"), false),
        b"ping".to_vec(),
    ] {
        let (mut s, mut r) = open(p);
        s.write_all(&bytes).unwrap();
        let mut back = vec![0u8; bytes.len()];
        r.read_exact(&mut back).unwrap();
        assert_eq!(back, bytes);
        drop((s, r));
        assert_eq!(lines.one("control")["decision"], "allow");
    }
    // The server speaks first: its banner arrives before the client sent a byte.
    let (mut s, mut r) = open(bport);
    let mut banner = String::new();
    std::io::BufRead::read_line(&mut r, &mut banner).unwrap();
    assert_eq!(banner, "SSH-2.0-banner\r\n");
    s.write_all(b"SSH-2.0-client\r\n").unwrap();
    let mut back = String::new();
    std::io::BufRead::read_line(&mut r, &mut back).unwrap();
    assert_eq!(back, "SSH-2.0-client\r\n");
    drop((s, r));
    assert_eq!(lines.one("server first")["decision"], "allow");
    lines.done("every port");
    l.assert_clean(&["allowed.test", "api.allowed.test"]);
}

/// A CONNECT whose exception restricts paths carries plain HTTP: it is
/// served as HTTP, one decision per request inside the tunnel (no CA is
/// needed), each request's Host must be the CONNECT host, and a 403 leaves
/// the connection open for the next request.
#[test]
fn plain_http_inside_a_connect_is_decided_per_request() {
    let l = crate::support::lab()
        .names(&["plain.test", "evil.test"])
        .start(|ports| {
            policy()
                .exception("inspected")
                .reason("the origin, /ok only")
                .host("plain.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .path("/ok/**")
        });
    let mut lines = Lines::new(&l.e);
    let o = l.port();
    let mut s = connect(l.e.proxy);
    write!(s, "CONNECT plain.test:{o} HTTP/1.1\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    assert_eq!((resp.status, resp.reason()), (200, None), "{}", resp.text());
    for (path, host, status, reason) in [
        ("/ok/1", format!("plain.test:{o}"), 200, "exception"),
        ("/admin", format!("plain.test:{o}"), 403, "path_not_allowed"),
        ("/ok/2", format!("evil.test:{o}"), 403, "host_mismatch"),
        // A port-less Host means the CONNECT's port, as for the CONNECT.
        ("/ok/3", "plain.test".to_string(), 200, "exception"),
        ("/ok/4", format!("PLAIN.test:{o}"), 200, "exception"),
    ] {
        write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
        let resp = read_response(&mut r).unwrap_or_else(|| panic!("{path}: no answer"));
        assert_eq!(resp.status, status, "{path} {host}: {}", resp.text());
        let line = lines.one(path);
        assert_eq!(
            (&line["proto"], &line["path"]),
            (&"http".into(), &path.into())
        );
        assert_eq!(line["reason"], reason, "{path}: {line}");
        if status == 403 {
            assert_eq!(resp.reason(), Some(reason), "{path}");
        }
    }
    drop((s, r));
    let line = lines.one("the tunnel");
    assert_eq!(
        (&line["proto"], &line["decision"]),
        (&"connect".into(), &"allow".into())
    );
    lines.done("plain http inside");
    let served: Vec<String> = l
        .origin
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|x| x.target.clone())
        .collect();
    assert_eq!(served, ["/ok/1", "/ok/3", "/ok/4"]);
    l.assert_clean(&["plain.test"]);
}

/// TLS inside a CONNECT whose exception needs inspection, and no CA to
/// look inside: the tunnel closes `inspection_required` once the hello is
/// read (`sni_mismatch` when it names another host); nothing reaches the
/// destination.
#[test]
fn tls_that_cannot_be_inspected_is_refused_off_port_443_too() {
    let l = crate::support::lab()
        .names(&["allowed.test"])
        .start(|ports| {
            policy()
                .exception("inspected")
                .reason("the echo server, /ok only")
                .host("allowed.test")
                .cidr(LOOPBACK)
                .port(ports.echo)
                .path("/ok/**")
        });
    let mut lines = Lines::new(&l.e);
    for (sni, reason) in [
        ("allowed.test", "inspection_required"),
        ("evil.test", "sni_mismatch"),
    ] {
        let mut s = connect(l.e.proxy);
        write!(s, "CONNECT allowed.test:{} HTTP/1.1\r\n\r\n", l.echo.port()).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(read_response(&mut r).unwrap().status, 200);
        s.write_all(&build_client_hello(Some(sni), false)).unwrap();
        let mut back = Vec::new();
        let _ = r.read_to_end(&mut back);
        assert!(back.is_empty(), "{sni}: the echo server got the hello");
        let line = lines.one(sni);
        assert_denied_line(&line, reason, Some(200), sni);
        assert_eq!(line["bytes_up"], 0, "{sni}");
    }
    lines.done("tls without a CA");
    l.assert_clean(&["allowed.test"]);
}
