//! `--upstream-proxy`: allowed requests and tunnels leave through a
//! corporate proxy, naming the address egressd checked; denied ones never
//! reach it; egressd's proxy credentials go to the proxy, the client's never.

use std::io::{BufReader, Read, Write};
use std::net::Shutdown;

use crate::forward::sha256_hex;
use crate::support::*;

#[test]
fn plain_http_goes_to_the_upstream_proxy_in_absolute_form_with_our_credentials() {
    // A recording stand-in for the corporate proxy: it answers every request.
    let corp = origin();
    let upstream = format!("http://egressd:c0rp%40ss@127.0.0.1:{}", corp.addr.port());
    let l = lab_with(corp)
        .names(&["allowed.test"])
        .egressd(|b| b.env("EGRESSD_UPSTREAM_PROXY", &upstream))
        .start(|_| {
            policy()
                .exception("origin")
                .reason("the origin behind the corporate proxy")
                .host("allowed.test")
                .cidr(LOOPBACK)
                .port(8080)
        });
    let (e, corp) = (&l.e, &l.origin);
    let r = e.request(
        "GET http://allowed.test:8080/x?y=1 HTTP/1.1\r\nHost: allowed.test:8080\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = corp.last().expect("the corporate proxy saw the request");
    assert_eq!(
        seen.target, "http://127.0.0.1:8080/x?y=1",
        "absolute form, checked address"
    );
    assert_eq!(seen.header("host"), Some("allowed.test:8080"));
    // "egressd:c0rp@ss"
    assert_eq!(
        seen.header("proxy-authorization"),
        Some("Basic ZWdyZXNzZDpjMHJwQHNz")
    );
    // Denied: the corporate proxy never hears of it.
    let before = corp.count();
    let r = e.get("http://evil.test:8080/");
    assert_eq!(r.status, 403);
    assert_eq!(corp.count(), before);
    assert!(e.stderr_text().contains("leaving through upstream proxy"));
    assert!(!e.stderr_text().contains("c0rp"), "credentials printed");
}

#[test]
fn tunnels_chain_through_an_upstream_proxy_that_authenticates_us() {
    let fixtures = lab().names(&["echo.test"]);
    let echo = fixtures.ports().echo;
    // The corporate proxy is another egressd that knows us by token.
    let corp_policy = policy()
        .client_token("egressd-a", &sha256_hex(b"corp-token"))
        .exception("from-egressd-a")
        .owner("corp")
        .reason("egressd-a's tunnels")
        .client("egressd-a")
        .cidr(LOOPBACK)
        .port(echo);
    let corp = egressd().policy("corp.yaml", &corp_policy.yaml()).start();
    let auth = scratch();
    let auth_file = auth.file("auth", "egressd-a:corp-token\n");
    let l = fixtures
        .egressd(|b| {
            b.arg("--upstream-proxy")
                .arg(&format!("http://{}", corp.proxy))
                .arg("--upstream-proxy-auth-file")
                .arg(auth_file.to_str().unwrap())
        })
        .start(|_| echo_policy(echo));
    let e = &l.e;
    let mut s = connect(e.proxy);
    write!(s, "CONNECT echo.test:{echo} HTTP/1.1\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    s.write_all(b"through two proxies").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    r.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"through two proxies");
    // The tunnel's close line: written once both sides are done, which may
    // be just after the echo came back.
    let line = corp.wait_line("corp's close line", |l| {
        l["proto"] == "connect" && l["event"] == "close"
    });
    assert_eq!(line["client"], "egressd-a");
    assert_eq!(
        line["host"], "127.0.0.1",
        "the corporate proxy was given the checked address"
    );
    assert_eq!(line["decision"], "allow");
    // A denied CONNECT never reaches the corporate proxy.
    let r = e.request("CONNECT evil.test:443 HTTP/1.1\r\n\r\n");
    assert_eq!(r.status, 403);
    let lines = ending_lines(&corp);
    assert_eq!(lines.len(), 1, "{lines:?}");
}

#[test]
fn a_refusing_upstream_proxy_is_a_502_not_a_direct_route() {
    // The corporate proxy allows nothing.
    let corp = egressd()
        .policy(
            "corp.yaml",
            &policy()
                .exception("x")
                .owner("o")
                .reason("r")
                .host("x.test")
                .yaml(),
        )
        .start();
    let l = lab()
        .names(&["echo.test"])
        .egressd(|b| {
            b.arg("--upstream-proxy")
                .arg(&format!("http://{}", corp.proxy))
        })
        .start(|ports| echo_policy(ports.echo));
    let e = &l.e;
    let r = e.request(&format!(
        "CONNECT echo.test:{} HTTP/1.1\r\n\r\n",
        l.echo_port()
    ));
    assert_eq!(r.status, 502);
    let line = e.wait_line("502 line", |l| l["proto"] == "connect");
    assert!(
        line["error"].as_str().unwrap().contains("refused CONNECT"),
        "{line}"
    );
}

/// echo.test on the echo server's `port`.
fn echo_policy(port: u16) -> PolicyYaml {
    policy()
        .exception("echo")
        .reason("r")
        .host("echo.test")
        .cidr(LOOPBACK)
        .port(port)
}
