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
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    let yaml = r#"
exceptions:
  - id: origin
    owner: t
    reason: the origin behind the corporate proxy
    hosts: [allowed.test]
    cidrs: [127.0.0.0/8]
    ports: [8080]
"#;
    let e = egressd()
        .policy("p.yaml", yaml)
        .dns(dns.addr)
        .env(
            "EGRESSD_UPSTREAM_PROXY",
            &format!("http://egressd:c0rp%40ss@127.0.0.1:{}", corp.addr.port()),
        )
        .start();
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
    let echo = echo_on("127.0.0.1".parse().unwrap(), 0);
    // The corporate proxy is another egressd that knows us by token.
    let corp_yaml = format!(
        r#"
settings:
  clients:
    - id: egressd-a
      token_sha256: "{}"
exceptions:
  - id: from-egressd-a
    owner: corp
    reason: egressd-a's tunnels
    clients: [egressd-a]
    cidrs: [127.0.0.0/8]
    ports: [{p}]
"#,
        sha256_hex(b"corp-token"),
        p = echo.port()
    );
    let corp = egressd().policy("corp.yaml", &corp_yaml).start();
    let dns = fake_dns();
    dns.set("echo.test", &["127.0.0.1"]);
    let yaml = format!(
        "exceptions:\n  - id: echo\n    owner: t\n    reason: r\n    hosts: [echo.test]\n    cidrs: [127.0.0.0/8]\n    ports: [{}]\n",
        echo.port()
    );
    let auth = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(auth.path(), "egressd-a:corp-token\n").unwrap();
    let e = egressd()
        .policy("p.yaml", &yaml)
        .dns(dns.addr)
        .arg("--upstream-proxy")
        .arg(&format!("http://{}", corp.proxy))
        .arg("--upstream-proxy-auth-file")
        .arg(auth.path().to_str().unwrap())
        .start();
    let mut s = connect(e.proxy);
    write!(s, "CONNECT echo.test:{} HTTP/1.1\r\n\r\n", echo.port()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    s.write_all(b"through two proxies").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    r.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"through two proxies");
    let line = corp.wait_line("corp's line", |l| l["proto"] == "connect");
    assert_eq!(line["client"], "egressd-a");
    assert_eq!(
        line["host"], "127.0.0.1",
        "the corporate proxy was given the checked address"
    );
    assert_eq!(line["decision"], "allow");
    // A denied CONNECT never reaches the corporate proxy.
    let r = e.request("CONNECT evil.test:443 HTTP/1.1\r\n\r\n");
    assert_eq!(r.status, 403);
    let lines = corp.log_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
}

#[test]
fn a_refusing_upstream_proxy_is_a_502_not_a_direct_route() {
    let echo = echo_on("127.0.0.1".parse().unwrap(), 0);
    // The corporate proxy allows nothing.
    let corp = egressd()
        .policy(
            "corp.yaml",
            "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [x.test]\n",
        )
        .start();
    let dns = fake_dns();
    dns.set("echo.test", &["127.0.0.1"]);
    let yaml = format!(
        "exceptions:\n  - id: echo\n    owner: t\n    reason: r\n    hosts: [echo.test]\n    cidrs: [127.0.0.0/8]\n    ports: [{}]\n",
        echo.port()
    );
    let e = egressd()
        .policy("p.yaml", &yaml)
        .dns(dns.addr)
        .arg("--upstream-proxy")
        .arg(&format!("http://{}", corp.proxy))
        .start();
    let r = e.request(&format!(
        "CONNECT echo.test:{} HTTP/1.1\r\n\r\n",
        echo.port()
    ));
    assert_eq!(r.status, 502);
    let line = e.wait_line("502 line", |l| l["proto"] == "connect");
    assert!(
        line["error"].as_str().unwrap().contains("refused CONNECT"),
        "{line}"
    );
}
