//! Protocol upgrades: h2c (an upgrade into HTTP/2, whose requests egressd
//! would never see), HTTP/2 with prior knowledge at the proxy port, and
//! WebSocket — with data sent right behind the upgrade request, refused
//! upgrades, and origins that do not switch.
//!
//! The exception allows `/public/**` only: after an upgrade the client
//! could send the origin anything, so only WebSocket may switch, and only
//! once the origin agreed (101).

use std::io::{BufReader, Read, Write};

use super::*;

/// An origin that switches protocols for any Upgrade request to a path
/// containing "switch" (then echoes), and answers 200 otherwise.
fn lab() -> Lab<RawOrigin> {
    let origin = raw_origin(|r| {
        match r.header("upgrade") {
        Some(proto) if r.target.contains("switch") => Act::Switch(
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: {proto}\r\nConnection: Upgrade\r\n\r\n"
            )
            .into_bytes(),
        ),
        _ => ok_reply(r),
    }
    });
    lab_with(origin)
        .names(&["allowed.test", "evil.test"])
        .start(|ports| {
            policy()
                .exception("public")
                .reason("the public half of the origin")
                .host("allowed.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .method("GET")
                .path("/public/**")
        })
}

fn assert_clean(l: &Lab<RawOrigin>) {
    for r in l.origin.requests() {
        assert!(r.target.starts_with("/public/"), "origin got {r:?}");
    }
    let text = l.origin.text();
    assert!(!text.contains("/admin"), "the origin saw /admin:\n{text}");
    l.assert_clean(&["allowed.test"]);
}

/// `Upgrade: h2c` turns the connection into HTTP/2, whose streams carry
/// requests egressd would never decide. The upgrade is not passed on: the
/// origin gets a plain HTTP/1.1 request, and a client that goes on as if it
/// had switched has its bytes parsed (and refused) as HTTP/1.1 by egressd.
#[test]
fn h2c_upgrades_are_not_passed_on() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    for (upgrade, connection) in [
        ("h2c", "Upgrade, HTTP2-Settings"),
        ("H2C", "upgrade"),
        ("h2c, websocket", "Upgrade"),
        ("http/2.0", "Upgrade"),
        ("TLS/1.2", "Upgrade"),
        ("foo", "Upgrade"),
    ] {
        let raw = format!(
            "GET http://allowed.test:{p}/public/switch HTTP/1.1\r\nHost: allowed.test:{p}\r\n\
             Connection: {connection}\r\nUpgrade: {upgrade}\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n\
             {preface}GET /admin HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
        );
        let mut s = connect(l.e.proxy);
        s.write_all(raw.as_bytes()).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let first = read_response(&mut r).expect("a response");
        assert_ne!(first.status, 101, "{upgrade}: switched protocols");
        assert_eq!(first.status, 200, "{upgrade}");
        // Whatever the client sends next is read as HTTP/1.1, not relayed.
        let mut rest = Vec::new();
        let _ = r.read_to_end(&mut rest);
        let rest = String::from_utf8_lossy(&rest);
        assert!(!rest.contains("/admin"), "{upgrade}: {rest}");
        // Two lines: the request, and the HTTP/2 preface refused as malformed.
        let logged = lines.next_n(upgrade, 2);
        assert_eq!(logged[0]["decision"], "allow", "{upgrade}");
        assert_denied_line(&logged[1], "malformed", None, upgrade);
        let last = l.origin.requests().pop().unwrap();
        assert_eq!(last.target, "/public/switch");
        assert_eq!(
            last.header("upgrade"),
            None,
            "{upgrade}: Upgrade reached the origin"
        );
        if connection.contains("HTTP2-Settings") {
            assert_eq!(last.header("http2-settings"), None, "named in Connection");
        }
        assert!(
            !last
                .header("connection")
                .is_some_and(|c| c.to_ascii_lowercase().contains("upgrade")),
            "{upgrade}: {last:?}"
        );
    }
    assert_clean(&l);
}

/// HTTP/2 with prior knowledge at the proxy port: not HTTP/1.1, refused
/// and logged, the connection closed.
#[test]
fn http2_prior_knowledge_is_refused_at_the_proxy_port() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let mut raw = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // An empty SETTINGS frame, then a HEADERS frame's worth of bytes.
    raw.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    raw.extend_from_slice(&[0, 0, 5, 1, 5, 0, 0, 0, 1, 0x82, 0x86, 0x84, 0x41, 0x8a]);
    let mut s = connect(l.e.proxy);
    s.write_all(&raw).unwrap();
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    let text = String::from_utf8_lossy(&back);
    assert!(
        back.is_empty() || text.starts_with("HTTP/1.1 4") || text.starts_with("HTTP/1.1 5"),
        "{text}"
    );
    let line = lines.one("h2 preface");
    assert_denied_line(&line, "malformed", None, "h2 preface");
    lines.done("h2");
    assert!(l.origin.requests().is_empty());
    assert_clean(&l);
}

fn ws_head(p: u16, path: &str) -> String {
    format!(
        "GET http://allowed.test:{p}{path} HTTP/1.1\r\nHost: allowed.test:{p}\r\n\
         Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}

/// WebSocket passes after the decision; frames the client sends right
/// behind the upgrade request (before the 101) reach the origin after the
/// handshake, and the line is written when the socket closes.
#[test]
fn websocket_with_data_right_after_the_upgrade() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    // A masked text frame "hello".
    let frame: &[u8] = &[
        0x81,
        0x85,
        1,
        2,
        3,
        4,
        b'h' ^ 1,
        b'e' ^ 2,
        b'l' ^ 3,
        b'l' ^ 4,
        b'o' ^ 1,
    ];
    let mut s = connect(l.e.proxy);
    let mut raw = ws_head(l.port(), "/public/switch").into_bytes();
    raw.extend_from_slice(frame);
    s.write_all(&raw).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 101);
    let mut back = vec![0u8; frame.len()];
    r.read_exact(&mut back).unwrap();
    assert_eq!(back, frame, "the early frame went through the upgrade");
    s.write_all(frame).unwrap();
    r.read_exact(&mut back).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut tail = Vec::new();
    let _ = r.read_to_end(&mut tail);
    let line = lines.one("websocket");
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["status"], 101);
    assert_eq!(line["bytes_up"], 2 * frame.len());
    // The origin saw the handshake, then exactly the frames.
    let raw = l.origin.bytes();
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(&raw[head_end..], [frame, frame].concat());
    lines.done("websocket");
    assert_clean(&l);
}

/// An origin that answers an upgrade with anything but 101 has not
/// switched: the connection stays HTTP/1.1, and bytes the client sends as
/// if it had switched are requests egressd decides (WebSocket smuggling).
#[test]
fn an_upgrade_the_origin_refused_does_not_open_a_tunnel() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let mut s = connect(l.e.proxy);
    // "/public/no" makes the origin answer 200, not 101.
    s.write_all(ws_head(p, "/public/no").as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 200);
    lines.one("refused upgrade");
    for smuggled in [
        format!("GET /admin HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n"),
        format!("GET http://allowed.test:{p}/admin HTTP/1.1\r\nHost: allowed.test:{p}\r\nConnection: close\r\n\r\n"),
    ] {
        s.write_all(smuggled.as_bytes()).unwrap();
        let resp = read_response(&mut r).expect("an answer from egressd");
        assert!(resp.status == 400 || resp.status == 403, "{}", resp.status);
        let line = lines.one(&smuggled);
        assert_eq!(line["decision"], "deny");
    }
    lines.done("refused upgrade");
    assert_clean(&l);
}

/// An upgrade to a destination or path no exception allows is refused
/// like any request; nothing after it is relayed.
#[test]
fn a_denied_upgrade_is_a_denied_request() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    refused(
        &mut lines,
        &ws_head(p, "/admin/switch"),
        403,
        "path_not_allowed",
    );
    let raw = ws_head(p, "/public/switch").replace("allowed.test", "evil.test");
    refused(&mut lines, &raw, 403, "no_exception");
    // Upgrade on HTTP/1.0 is not an upgrade.
    let raw = ws_head(p, "/public/switch").replace("HTTP/1.1\r\n", "HTTP/1.0\r\n");
    let r = try_request(l.e.proxy, raw.as_bytes()).unwrap();
    assert_ne!(r.status, 101);
    lines.one("http/1.0 upgrade");
    lines.done("denied upgrades");
    assert_eq!(l.origin.requests().len(), 1);
    assert_clean(&l);
}

/// Chromium sends `ws://host/x` through a proxy as `CONNECT host:80` and
/// a plain Upgrade request inside. With an exception that restricts paths
/// the upgrade is decided like any request (no CA needed) and bridged only
/// when allowed; the connection stays open after a refusal.
#[test]
fn websocket_inside_a_connect_is_decided_and_bridged() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let origin_form =
        |path: &str| ws_head(p, path).replacen(&format!("http://allowed.test:{p}"), "", 1);
    let mut s = connect(l.e.proxy);
    write!(
        s,
        "CONNECT allowed.test:{p} HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    assert_eq!((resp.status, resp.reason()), (200, None), "{}", resp.text());
    s.write_all(origin_form("/admin/switch").as_bytes())
        .unwrap();
    let resp = read_response(&mut r).unwrap();
    assert_eq!(
        (resp.status, resp.reason()),
        (403, Some("path_not_allowed"))
    );
    assert_denied_line(
        &lines.one("/admin"),
        "path_not_allowed",
        Some(403),
        "/admin",
    );
    s.write_all(origin_form("/public/switch").as_bytes())
        .unwrap();
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.status, 101);
    s.write_all(b"frames").unwrap();
    let mut back = [0u8; 6];
    r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"frames");
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut tail = Vec::new();
    let _ = r.read_to_end(&mut tail);
    let got = lines.next_n("websocket and tunnel", 2);
    let ws = got
        .iter()
        .find(|x| x["proto"] == "http")
        .expect("the websocket's line");
    assert_eq!(
        (&ws["status"], &ws["decision"]),
        (&101.into(), &"allow".into())
    );
    assert_eq!(ws["path"], "/public/switch");
    assert!(got.iter().any(|x| x["proto"] == "connect"), "{got:?}");
    lines.done("websocket in connect");
    assert_clean(&l);
}
