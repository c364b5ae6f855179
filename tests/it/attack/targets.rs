//! The request target against everything else in the request: a `Host`
//! header that disagrees, userinfo and fragment tricks, schemes other than
//! `http`, port spellings, other request-target forms, and requests aimed
//! at egressd's own listeners.

use super::*;

fn lab() -> Lab {
    crate::support::lab()
        .names(&["allowed.test", "evil.test"])
        .start(|ports| {
            policy()
                .exception("allowed")
                .reason("the test origin")
                .host("allowed.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
        })
}

fn assert_clean(l: &Lab, origin_requests: usize) {
    assert_eq!(l.origin.count(), origin_requests, "origin requests");
    l.assert_clean(&["allowed.test"]);
}

#[test]
fn a_host_header_naming_anything_else_is_refused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let (o, c) = (l.port(), l.canary_port());
    let target = format!("http://allowed.test:{o}/");
    for host in [
        "evil.test".to_string(),
        format!("evil.test:{o}"),
        format!("allowed.test:{c}"),
        "allowed.test:80".to_string(),
        format!("allowed.test.evil.test:{o}"),
        format!("evil.test@allowed.test:{o}"),
        format!("allowed.test:{o}@evil.test"),
        format!("allowed.test:0{o}"),
        format!("allowed.test:{o}:{o}"),
        format!("127.0.0.1:{o}"),
        format!("allowed.test/:{o}"),
        format!("allowed.test%2f:{o}"),
        String::new(),
    ] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let line = refused(&mut lines, &raw, 403, "host_mismatch");
        assert_eq!(line["host"], "allowed.test", "Host: {host}");
    }
    // A denied target with an allowed Host is still the denied target.
    let raw = format!(
        "GET http://evil.test:{c}/ HTTP/1.1\r\nHost: allowed.test:{o}\r\nConnection: close\r\n\r\n"
    );
    refused(&mut lines, &raw, 403, "host_mismatch");
    // Two Host headers, even two equal ones, are refused rather than picked from.
    for second in [format!("evil.test:{c}"), format!("allowed.test:{o}")] {
        let raw = format!(
            "GET {target} HTTP/1.1\r\nHost: allowed.test:{o}\r\nHost: {second}\r\nConnection: close\r\n\r\n"
        );
        refused(&mut lines, &raw, 400, "malformed");
    }
    // Header syntax tricks never reach the Host check: the parser refuses them.
    for raw in [
        format!("GET {target} HTTP/1.1\r\nHost : evil.test\r\nConnection: close\r\n\r\n"),
        format!("GET {target} HTTP/1.1\r\nHost: allowed.test:{o}\r\n evil.test\r\nConnection: close\r\n\r\n"),
        format!("GET {target} HTTP/1.1\r\n Host: evil.test\r\nConnection: close\r\n\r\n"),
        format!("GET {target} HTTP/1.1\r\nHost:\0evil.test\r\nConnection: close\r\n\r\n"),
    ] {
        refused(&mut lines, &raw, 400, "malformed");
    }
    // Controls: the same name spelled differently agrees, and the origin
    // gets egressd's own Host header, once.
    for host in [
        format!("ALLOWED.TEST.:{o}"),
        format!("allowed.test:{o}"),
        "allowed.test".into(),
    ] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        assert_eq!(
            try_request(l.e.proxy, raw.as_bytes()).unwrap().status,
            200,
            "{host}"
        );
        lines.one(&host);
        let seen = l.origin.last().unwrap();
        assert_eq!(
            seen.header("host"),
            Some(format!("allowed.test:{o}").as_str())
        );
        assert_eq!(
            seen.headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
                .count(),
            1
        );
    }
    lines.done("host headers");
    assert_clean(&l, 3);
}

#[test]
fn userinfo_fragments_and_odd_target_forms_are_malformed() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let (o, c) = (l.port(), l.canary_port());
    // Userinfo in any position, and separators a lax URL parser would take
    // for the end of the authority: refused before any decision.
    for url in [
        format!("http://evil.test@allowed.test:{o}/"),
        format!("http://allowed.test:{o}@evil.test:{c}/"),
        format!("http://user:pass@allowed.test:{o}/"),
        format!("http://@allowed.test:{o}/"),
        format!("http://allowed.test%40evil.test:{c}/"),
        format!("http://allowed.test:{o}\\@evil.test:{c}/"),
        format!("http://evil.test:{c}\\@allowed.test:{o}/"),
        format!("http://allowed.test:{o};@evil.test:{c}/"),
        format!("http:/allowed.test:{o}/"),
        format!("http:allowed.test:{o}/"),
        format!("http:///allowed.test:{o}/"),
        format!("//allowed.test:{o}/"),
        format!("http://[allowed.test]:{o}/"),
    ] {
        let raw =
            format!("GET {url} HTTP/1.1\r\nHost: allowed.test:{o}\r\nConnection: close\r\n\r\n");
        refused(&mut lines, &raw, 400, "malformed");
    }
    // After `#` or `?` comes the fragment or query, not a host: by RFC 3986
    // these name allowed.test (as curl would), and only it is reached.
    for (url, origin_target) in [
        (
            format!("http://allowed.test:{o}#@evil.test:{c}/"),
            "/".to_string(),
        ),
        (
            format!("http://allowed.test:{o}?@evil.test:{c}/"),
            format!("/?@evil.test:{c}/"),
        ),
    ] {
        let raw =
            format!("GET {url} HTTP/1.1\r\nHost: allowed.test:{o}\r\nConnection: close\r\n\r\n");
        assert_eq!(
            try_request(l.e.proxy, raw.as_bytes()).unwrap().status,
            200,
            "{url}"
        );
        assert_eq!(lines.one(&url)["host"], "allowed.test");
        assert_eq!(l.origin.last().unwrap().target, origin_target, "{url}");
    }
    // Other request-target forms on the proxy port.
    for raw in [
        "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n".to_string(),
        format!("GET /http://allowed.test:{o}/ HTTP/1.1\r\nHost: allowed.test:{o}\r\nConnection: close\r\n\r\n"),
        "OPTIONS * HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n".to_string(),
        format!("GET allowed.test:{o} HTTP/1.1\r\nHost: allowed.test:{o}\r\nConnection: close\r\n\r\n"),
        format!("GET http://allowed.test:{o}/ HTTP/1.1 extra\r\nConnection: close\r\n\r\n"),
        format!("GET  http://allowed.test:{o}/ HTTP/1.1\r\nConnection: close\r\n\r\n"),
        format!("GET http://allowed.test:{o}/ HTTP/9.9\r\nConnection: close\r\n\r\n"),
        format!("GET http://allowed.test:{o}/\r\n\r\n"),
    ] {
        refused(&mut lines, &raw, 400, "malformed");
    }
    lines.done("targets");
    assert_clean(&l, 2);
}

#[test]
fn only_http_is_proxied() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let o = l.port();
    for url in [
        format!("https://allowed.test:{o}/"),
        format!("ftp://allowed.test:{o}/"),
        format!("ws://allowed.test:{o}/"),
        format!("wss://allowed.test:{o}/"),
        format!("gopher://allowed.test:{o}/_GET%20/"),
        format!("dict://allowed.test:{o}/"),
        format!("ldap://allowed.test:{o}/"),
        format!("http+unix://allowed.test:{o}/"),
        format!("httpx://allowed.test:{o}/"),
        "file:///etc/passwd".to_string(),
        "file://allowed.test/etc/passwd".to_string(),
        "data:text/plain,hi".to_string(),
        "javascript:alert(1)".to_string(),
    ] {
        refused(&mut lines, &get_raw(&url), 400, "malformed");
    }
    // The scheme is case-insensitive (control).
    for url in [
        format!("HTTP://allowed.test:{o}/"),
        format!("hTtP://allowed.test:{o}/"),
    ] {
        assert_eq!(
            try_request(l.e.proxy, get_raw(&url).as_bytes())
                .unwrap()
                .status,
            200,
            "{url}"
        );
        lines.one(&url);
    }
    lines.done("schemes");
    assert_clean(&l, 2);
}

#[test]
fn port_spellings_parsers_disagree_on_are_refused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let o = l.port();
    let o_wrapped = o as u32 + 65536;
    for port in [
        format!("0{o}"),
        format!("00{o}"),
        "0080".to_string(),
        o_wrapped.to_string(),
        "65616".to_string(),
        "65536".to_string(),
        "99999999999999999999".to_string(),
        String::new(),
        "0".to_string(),
        format!("+{o}"),
        format!("-{o}"),
        format!("{o}a"),
        format!("0x{o:x}"),
        "1e2".to_string(),
        format!("{o}.0"),
        "\u{ff18}\u{ff10}".to_string(),
    ] {
        let url = format!("http://allowed.test:{port}/");
        refused(&mut lines, &get_raw(&url), 400, "malformed");
        refused(
            &mut lines,
            &connect_raw(&format!("allowed.test:{port}")),
            400,
            "malformed",
        );
    }
    // Valid ports the exception does not list.
    for port in ["80", "443", "65535", &(o + 1).to_string()] {
        let line = refused(
            &mut lines,
            &get_raw(&format!("http://allowed.test:{port}/")),
            403,
            "port_not_allowed",
        );
        assert_eq!(line["port"], port.parse::<u16>().unwrap());
    }
    // No port means 80.
    let line = refused(
        &mut lines,
        &get_raw("http://allowed.test/"),
        403,
        "port_not_allowed",
    );
    assert_eq!(line["port"], 80);
    lines.done("ports");
    assert_clean(&l, 0);
}

/// egressd as its own destination (proxy, resolver, metrics), by name, by
/// address spelling, and through CONNECT: refused, and each attempt is one
/// line (a loop would add the inner request's line).
#[test]
fn requests_aimed_at_egressd_itself_are_refused() {
    let l = crate::support::lab()
        .names(&["self.test"])
        .start(|_| policy().exception("x").reason("r").host("x.test"));
    l.dns.set("self6.test", &["::ffff:127.0.0.1"]);
    let e = &l.e;
    let ports = [e.proxy.port(), e.dns.port(), e.metrics.port()];
    let own = policy()
        .exception("self")
        .reason("try to loop through egressd")
        .hosts(&["self.test", "self6.test"])
        .cidr(LOOPBACK)
        .cidr("::ffff:127.0.0.0/104")
        .ports(&ports);
    atomic_write(&e.policy_dir.join("p.yaml"), &own.yaml());
    eventually("reload", || {
        (e.metric(r#"egressd_policy_reloads_total{result="ok"}"#)? >= 1.0).then_some(())
    });
    let mut lines = Lines::new(e);
    for port in ports {
        for host in [
            "self.test",
            "self6.test",
            "127.0.0.1",
            "2130706433",
            "0x7f.1",
            "127.1",
            "[::ffff:127.0.0.1]",
        ] {
            let line = refused(
                &mut lines,
                &get_raw(&format!("http://{host}:{port}/metrics")),
                403,
                "loop_detected",
            );
            assert!(line["addr"].is_null(), "{host}:{port}");
            refused(
                &mut lines,
                &connect_raw(&format!("{host}:{port}")),
                403,
                "loop_detected",
            );
        }
        // 0.0.0.0 is dialled as the local host, but is no exception's range.
        refused(
            &mut lines,
            &get_raw(&format!("http://0.0.0.0:{port}/")),
            403,
            "no_exception",
        );
    }
    lines.done("self");
    assert_only_asked(&l.dns, &["self.test", "self6.test"]);
}
