//! Plain-HTTP forwarding: allowed and denied requests, the address guard,
//! ports, methods, paths, clients, expiry, report mode.

use std::io::{BufReader, Write};

use crate::support::*;

/// allowed.test on `port`, owned by test-team, with a contact to name in
/// deny pages.
fn origin_policy(port: u16) -> PolicyYaml {
    policy()
        .contact("#sec-test")
        .exception("origin")
        .owner("test-team")
        .reason("the local origin")
        .ticket("SEC-1")
        .host("allowed.test")
        .cidr(LOOPBACK)
        .port(port)
}

#[test]
fn allowed_request_reaches_origin_rewritten_and_is_logged() {
    let l = lab()
        .names(&["allowed.test"])
        .start(|ports| origin_policy(ports.origin));
    let (e, o, dns, port) = (&l.e, &l.origin, &l.dns, l.port());
    let r = e.request(&format!(
        "GET http://Allowed.Test:{port}/x?q=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nProxy-Connection: keep-alive\r\nConnection: close, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: 5\r\n\r\n"
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "hello from origin /x?q=1");
    assert_eq!(r.header("via"), Some("1.1 egressd"));
    assert!(
        r.header("keep-alive").is_none(),
        "hop-by-hop response header forwarded"
    );
    let seen = o.last().unwrap();
    assert_eq!(seen.target, "/x?q=1", "origin got origin-form");
    assert_eq!(
        seen.header("host"),
        Some(format!("allowed.test:{port}").as_str())
    );
    assert_eq!(seen.header("via"), Some("1.1 egressd"));
    for h in ["x-hop", "proxy-connection", "keep-alive"] {
        assert!(seen.header(h).is_none(), "{h} forwarded");
    }
    let line = e.wait_line("allow line", |l| l["proto"] == "http");
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["reason"], "exception");
    assert_eq!(line["exception"], "origin");
    assert_eq!(line["owner"], "test-team");
    assert_eq!(line["host"], "allowed.test");
    assert_eq!(line["port"], port);
    assert_eq!(line["addr"], format!("127.0.0.1:{port}"));
    assert_eq!(line["method"], "GET");
    assert_eq!(line["path"], "/x");
    assert_eq!(line["status"], 200);
    assert_eq!(line["client"], "-");
    assert!(line["src"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(line["bytes_down"], "hello from origin /x?q=1".len());
    assert_eq!(
        dns.count("allowed.test"),
        2,
        "one A and one AAAA lookup: {:?}",
        dns.names()
    );
}

#[test]
fn keep_alive_and_pooling_and_request_bodies() {
    let l = lab()
        .names(&["allowed.test"])
        .start(|ports| origin_policy(ports.origin));
    let (e, o, port) = (&l.e, &l.origin, l.port());
    let mut s = connect(e.proxy);
    let mut r = BufReader::new(s.try_clone().unwrap());
    for i in 0..5 {
        let body = format!("payload-{i}");
        write!(
            s,
            "POST http://allowed.test:{port}/post/{i} HTTP/1.1\r\nHost: allowed.test:{port}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let resp = read_response(&mut r).expect("response on the same connection");
        assert_eq!(resp.status, 200);
        assert_eq!(o.last().unwrap().body, body.as_bytes());
    }
    // Chunked upload is streamed through.
    write!(
        s,
        "PUT http://allowed.test:{port}/chunked HTTP/1.1\r\nHost: allowed.test:{port}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    assert_eq!(o.last().unwrap().body, b"hello world");
    assert!(
        o.connections.load(std::sync::atomic::Ordering::SeqCst) <= 2,
        "origin connections are pooled"
    );
    let lines = eventually("6 lines", || {
        let l = e.log_lines();
        (l.len() >= 6).then_some(l)
    });
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[0]["bytes_up"], "payload-0".len());
}

#[test]
fn denied_destination_gets_403_reason_and_log_line_and_nothing_leaves() {
    let l = lab()
        .names(&["evil.test"])
        .start(|ports| origin_policy(ports.canary));
    let (e, c, dns) = (&l.e, &l.canary, &l.dns);
    let r = e.get(&format!("http://evil.test:{}/steal", c.addr.port()));
    assert_eq!(r.status, 403);
    assert_eq!(r.reason(), Some("no_exception"));
    let body = r.text();
    assert!(
        body.contains("evil.test") && body.contains("#sec-test") && body.contains("no_exception"),
        "{body}"
    );
    let line = e.wait_line("deny line", |l| l["decision"] == "deny");
    assert_eq!(line["reason"], "no_exception");
    assert_eq!(line["status"], 403);
    assert_eq!(line["host"], "evil.test");
    assert!(line["exception"].is_null());
    assert_eq!(c.hits(), 0);
    assert_eq!(dns.count("evil.test"), 0, "a denied name is never resolved");
}

#[test]
fn label_boundaries_and_case_do_not_confuse_the_matcher() {
    let l = lab()
        .names(&[
            "allowed.test.evil.test",
            "evilallowed.test",
            "x.allowed.test",
        ])
        .start(|ports| origin_policy(ports.canary));
    let (e, c, dns) = (&l.e, &l.canary, &l.dns);
    for host in [
        "allowed.test.evil.test",
        "evilallowed.test",
        "x.allowed.test",
        "allowed.test%2eevil.test",
    ] {
        let r = e.get(&format!("http://{host}:{}/", c.addr.port()));
        assert!(r.status == 403 || r.status == 400, "{host}: {}", r.status);
    }
    assert_eq!(c.hits(), 0);
    assert!(dns.names().is_empty(), "{:?}", dns.names());
}

#[test]
fn allowed_name_resolving_to_private_or_metadata_address_is_refused() {
    let l = lab().names(&["rebind.test"]).start(|ports| {
        policy()
            .exception("no-cidrs")
            .reason("names without private ranges")
            .hosts(&["rebind.test", "meta.test"])
            .port(ports.canary)
            .exception("some-cidrs")
            .reason("only loopback")
            .host("mixed.test")
            .cidr(LOOPBACK)
            .port(ports.canary)
    });
    l.dns.set("meta.test", &["169.254.169.254"]);
    l.dns.set("mixed.test", &["10.1.2.3", "127.0.0.1"]);
    let (e, c) = (&l.e, &l.canary);
    for host in ["rebind.test", "meta.test"] {
        let r = e.get(&format!("http://{host}:{}/", c.addr.port()));
        assert_eq!(r.status, 403, "{host}");
        assert_eq!(r.reason(), Some("private_address"), "{host}");
    }
    assert_eq!(c.hits(), 0, "nothing reached the canary");
    // mixed: 10.1.2.3 is refused, 127.0.0.1 is in cidrs → dialled.
    let r = e.get(&format!("http://mixed.test:{}/", c.addr.port()));
    assert_ne!(r.status, 403, "{}", r.text());
    assert_eq!(c.hits(), 1);
    let line = e.wait_line("mixed line", |l| l["host"] == "mixed.test");
    assert_eq!(line["addr"], format!("127.0.0.1:{}", c.addr.port()));
    assert!(
        line["note"].as_str().unwrap().contains("10.1.2.3"),
        "{line}"
    );
    let meta = e.wait_line("meta line", |l| l["host"] == "meta.test");
    assert_eq!(meta["reason"], "private_address");
    assert_eq!(meta["decision"], "deny");
}

#[test]
fn ip_literals_in_odd_spellings_are_the_address_dialled() {
    let l = lab().start(|ports| {
        policy()
            .exception("loopback-origin")
            .reason("the test origin by address")
            .cidr("127.0.0.1/32")
            .port(ports.origin)
    });
    let (e, o, c) = (&l.e, &l.origin, &l.canary);
    for spelling in [
        "127.0.0.1",
        "2130706433",
        "0x7f000001",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
    ] {
        let r = e.get(&format!("http://{spelling}:{}/", o.addr.port()));
        assert_eq!(r.status, 200, "{spelling}: {}", r.text());
    }
    // The canary's port is not excepted; private spellings of it stay denied.
    for spelling in [
        "127.0.0.1",
        "2130706433",
        "0x7f.1",
        "0",
        "0.0.0.0",
        "[::1]",
        "[::]",
        "[::ffff:7f00:1]",
    ] {
        let r = e.get(&format!("http://{spelling}:{}/", c.addr.port()));
        assert_eq!(r.status, 403, "{spelling}");
    }
    // Metadata address spellings: never an exception.
    for spelling in [
        "169.254.169.254",
        "0xa9fea9fe",
        "2852039166",
        "169.254.43518",
        "[::ffff:169.254.169.254]",
        "[fd00:ec2::254]",
    ] {
        let r = e.get(&format!("http://{spelling}/latest/meta-data/"));
        assert_eq!(r.status, 403, "{spelling}");
    }
    assert_eq!(c.hits(), 0);
    assert!(l.dns.names().is_empty(), "a literal was resolved");
}

#[test]
fn ports_methods_and_paths_on_plain_http() {
    let l = lab().names(&["pkgs.test"]).start(|ports| {
        policy()
            .exception("pkgs-read")
            .reason("read-only package index")
            .host("pkgs.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
            .methods(&["GET", "HEAD"])
            .path("/simple/**")
    });
    let (e, o, p) = (&l.e, &l.origin, l.port());
    assert_eq!(
        e.get(&format!("http://pkgs.test:{p}/simple/requests/"))
            .status,
        200
    );
    let r = e.request(&format!("POST http://pkgs.test:{p}/simple/x HTTP/1.1\r\nHost: pkgs.test:{p}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"));
    assert_eq!((r.status, r.reason()), (403, Some("method_not_allowed")));
    let r = e.get(&format!("http://pkgs.test:{p}/admin"));
    assert_eq!((r.status, r.reason()), (403, Some("path_not_allowed")));
    for sneaky in [
        "/simple/../admin",
        "/simple/%2e%2e/admin",
        "/simple/..;/admin",
        "/simple/%2fadmin",
        "/simple\\..\\admin",
        "/simple/%252e%252e/admin",
        "/simple/%c0%ae%c0%ae/admin",
        "/simple/x/..%09/admin",
        "/simple/x/%20../admin",
    ] {
        let r = e.get(&format!("http://pkgs.test:{p}{sneaky}"));
        assert_eq!(r.status, 400, "{sneaky}");
        assert_eq!(r.reason(), Some("malformed"));
    }
    e.wait_line("every refusal on record", |_| {
        let refused = e
            .log_lines()
            .iter()
            .filter(|l| l["status"] == 400 && l["reason"] == "malformed")
            .count();
        refused == 9
    });
    // The spelling the client sent is not what the origin gets: the
    // path the rule matched is.
    assert_eq!(
        e.get(&format!("http://pkgs.test:{p}//simple//%72equests/"))
            .status,
        200
    );
    assert_eq!(o.last().unwrap().target, "/simple/requests/");
    let r = e.get(&format!("http://pkgs.test:{}/simple/", p + 1));
    assert_eq!((r.status, r.reason()), (403, Some("port_not_allowed")));
    assert_eq!(o.count(), 2, "only the allowed requests reached the origin");
}

#[test]
fn clients_by_source_and_by_token() {
    let l = lab().names(&["ci.test", "agent.test"]).start(|ports| {
        policy()
            .client_token("agent-a", &sha256_hex(b"agent-token"))
            .client_from("ci-runner", &[LOOPBACK])
            .exception("ci-only")
            .reason("ci")
            .client("ci-*")
            .host("ci.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
            .exception("agent-only")
            .reason("agent")
            .client("agent-a")
            .host("agent.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
    });
    let (e, o, p) = (&l.e, &l.origin, l.port());
    // By source: 127.0.0.1 is ci-runner.
    assert_eq!(e.get(&format!("http://ci.test:{p}/")).status, 200);
    let r = e.get(&format!("http://agent.test:{p}/"));
    assert_eq!((r.status, r.reason()), (403, Some("client_not_allowed")));
    // By token (Basic agent:agent-token).
    let req = |host: &str, auth: &str| {
        e.request(&format!(
            "GET http://{host}:{p}/ HTTP/1.1\r\nHost: {host}:{p}\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n"
        ))
    };
    assert_eq!(
        req("agent.test", "Basic YWdlbnQ6YWdlbnQtdG9rZW4=").status,
        200
    );
    let r = req("ci.test", "Basic YWdlbnQ6YWdlbnQtdG9rZW4=");
    assert_eq!((r.status, r.reason()), (403, Some("client_not_allowed")));
    let r = req("agent.test", "Basic YWdlbnQ6d3Jvbmc=");
    assert_eq!((r.status, r.reason()), (403, Some("client_not_allowed")));
    let line = e.wait_line("agent line", |l| {
        l["client"] == "agent-a" && l["decision"] == "allow"
    });
    assert_eq!(line["exception"], "agent-only");
    let text = std::fs::read_to_string(&e.log_path).unwrap();
    assert!(
        !text.contains("agent-token") && !text.contains("YWdlbnQ6YWdlbnQtdG9rZW4"),
        "token in the log"
    );
    assert!(!o
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.header("proxy-authorization").is_some()));
}

#[test]
fn expiry_takes_effect_at_the_instant_without_reload() {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3;
    let l = lab().names(&["soon.test"]).start(|ports| {
        policy()
            .exception("soon-gone")
            .reason("expires in three seconds")
            .expires(&rfc3339(at))
            .host("soon.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
            .exception("long-gone")
            .reason("expired long ago")
            .with("expires", "2020-01-01")
            .host("old.test")
            .port(ports.origin)
    });
    let (e, p) = (&l.e, l.port());
    let r = e.get(&format!("http://old.test:{p}/"));
    assert_eq!((r.status, r.reason()), (403, Some("exception_expired")));
    assert_eq!(e.get(&format!("http://soon.test:{p}/")).status, 200);
    eventually("expiry", || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        (now > at).then_some(())
    });
    let r = e.get(&format!("http://soon.test:{p}/"));
    assert_eq!((r.status, r.reason()), (403, Some("exception_expired")));
    assert!(
        e.metric(r#"egressd_exception_expiry_timestamp_seconds{exception="soon-gone"}"#)
            .unwrap() as u64
            == at
    );
}

#[test]
fn report_mode_logs_would_be_denials_and_allows_them() {
    let l = lab().names(&["unlisted.test"]).start(|ports| {
        policy()
            .mode("report")
            .setting("private_destinations", "allow")
            .exception("something-else")
            .reason("unrelated")
            .host("other.test")
            .port(ports.origin)
    });
    let e = &l.e;
    let r = e.get(&format!("http://unlisted.test:{}/", l.port()));
    assert_eq!(r.status, 200);
    let line = e.wait_line("report line", |l| l["host"] == "unlisted.test");
    assert_eq!(line["decision"], "deny");
    assert_eq!(line["mode"], "report");
    assert_eq!(line["reason"], "no_exception");
    assert_eq!(line["status"], 200);
}

#[test]
fn malformed_and_non_proxy_requests_get_400_and_a_line() {
    let l = lab().start(|ports| origin_policy(ports.canary));
    let (e, c) = (&l.e, &l.canary);
    let cases = [
        "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n".to_string(),
        format!("GET ftp://allowed.test:{}/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n", c.addr.port()),
        format!("GET http://user:pw@allowed.test:{}/ HTTP/1.1\r\nConnection: close\r\n\r\n", c.addr.port()),
        "GET http://allowed.test:/ HTTP/1.1\r\nConnection: close\r\n\r\n".to_string(),
        "GET http://allowed.test:0080/ HTTP/1.1\r\nConnection: close\r\n\r\n".to_string(),
        "GET http://allowed.test:65616/ HTTP/1.1\r\nConnection: close\r\n\r\n".to_string(),
        "GARBAGE\r\n\r\n".to_string(),
        "GET http://allowed.test/ HTTP/1.1\r\nBad Header\r\n\r\n".to_string(),
    ];
    for raw in &cases {
        let r = e.request(raw);
        assert_eq!(r.status, 400, "{raw:?}");
    }
    let lines = eventually("a line per malformed request", || {
        let l = e.log_lines();
        (l.len() >= cases.len()).then_some(l)
    });
    assert_eq!(lines.len(), cases.len());
    assert!(
        lines
            .iter()
            .all(|l| l["reason"] == "malformed" && l["decision"] == "deny"),
        "{lines:?}"
    );
    assert_eq!(c.hits(), 0);
    assert!(l.dns.names().is_empty(), "{:?}", l.dns.names());
}

#[test]
fn host_header_must_agree_with_the_target() {
    let l = lab()
        .names(&["allowed.test"])
        .start(|ports| origin_policy(ports.canary));
    let (e, c, p) = (&l.e, &l.canary, l.canary_port());
    let r = e.request(&format!(
        "GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!((r.status, r.reason()), (403, Some("host_mismatch")));
    let r = e.request(&format!(
        "GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: allowed.test:{p}\r\nHost: evil.test\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(r.status, 400);
    assert_eq!(c.hits(), 0);
}

#[test]
fn requests_aimed_at_egressd_itself_are_refused() {
    let l = lab().names(&["self.test"]).start(|_| origin_policy(1));
    let e = &l.e;
    // Only now are egressd's own ports known: point an exception at them.
    let own = policy()
        .exception("self")
        .reason("try to loop")
        .host("self.test")
        .cidr(LOOPBACK)
        .ports(&[e.proxy.port(), e.metrics.port()]);
    atomic_write(&e.policy_dir.join("p.yaml"), &own.yaml());
    eventually("reload", || {
        (e.metric(r#"egressd_policy_reloads_total{result="ok"}"#)? >= 1.0).then_some(())
    });
    for port in [e.proxy.port(), e.metrics.port()] {
        for host in ["self.test", "127.0.0.1", "2130706433"] {
            let r = e.get(&format!("http://{host}:{port}/metrics"));
            assert_eq!(
                (r.status, r.reason()),
                (403, Some("loop_detected")),
                "{host}:{port}"
            );
        }
        // 0.0.0.0 (which Linux dials as the local host) is not in cidrs.
        let r = e.get(&format!("http://0.0.0.0:{port}/metrics"));
        assert_eq!(r.status, 403);
    }
    let line = e.wait_line("loop line", |l| l["host"] == "self.test");
    assert_eq!(line["reason"], "loop_detected");
}

pub fn sha256_hex(b: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

pub fn rfc3339(secs: u64) -> String {
    egressd::time::format_rfc3339_millis(secs as i64 * 1000)
        .split('.')
        .next()
        .unwrap()
        .to_string()
        + "Z"
}
