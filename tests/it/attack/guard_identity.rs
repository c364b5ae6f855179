//! The guard of `egressd run` (issue 36), continued: the sandbox is a
//! client of its own, and an injected credential never comes back into it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use crate::support::sandbox::run;
use crate::support::{fake_dns, FakeDns};

/// A fake upstream DNS that answers `echo.test` with 127.0.0.1.
fn dns() -> FakeDns {
    let d = fake_dns();
    d.set("echo.test", &["127.0.0.1"]);
    d
}

/// An origin on the host's loopback that echoes the request's `X-Token`
/// in a response header and twice in the body, the body written in pieces
/// that split the value, so that it crosses read boundaries.
fn echoing_origin() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut token = String::new();
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        if k.eq_ignore_ascii_case("x-token") {
                            token = v.trim().to_string();
                        }
                    }
                }
                let body = format!("seen: {token} and again: {token}.\n");
                let mut w = conn;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Echo: {token}\r\n\r\n",
                    body.len()
                );
                let _ = w.write_all(head.as_bytes());
                let b = body.as_bytes();
                // Split inside each copy of the value.
                let cuts = [0, 10, 13, 30, 33, b.len()];
                for pair in cuts.windows(2) {
                    let (a, z) = (pair[0].min(b.len()), pair[1].min(b.len()));
                    let _ = w.write_all(&b[a..z]);
                    let _ = w.flush();
                    std::thread::sleep(Duration::from_millis(30));
                }
            });
        }
    });
    port
}

#[test]
fn an_echoed_injected_credential_is_replaced_and_trace_refused() {
    let port = echoing_origin();
    let secrets = tempfile::tempdir().unwrap();
    let token = "tok-echoed-5c1f9a77d2";
    let file = secrets.path().join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let policy = format!(
        r#"
exceptions:
  - id: echo
    owner: t
    reason: an origin that echoes what it is sent
    hosts: [echo.test]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
    inject: {{ headers: {{ X-Token: "${{file:{}}}" }} }}
"#,
        file.display()
    );
    let d = dns();
    let r = run().policy(&policy).dns(d.addr).cmd(&[
        "sh",
        "-c",
        &format!(
            "curl -s -i http://echo.test:{port}/; echo; \
             curl -s -o /dev/null -w 'trace %{{http_code}}\\n' -X TRACE http://echo.test:{port}/"
        ),
    ]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(!r.stdout.contains(token), "{}", r.context());
    assert!(!r.stdout.contains("5c1f9a77"), "{}", r.context());
    let stars = "*".repeat(token.len());
    assert!(
        r.stdout.contains(&format!("X-Echo: {stars}"))
            || r.stdout.contains(&format!("x-echo: {stars}")),
        "{}",
        r.context()
    );
    assert!(
        r.stdout
            .contains(&format!("seen: {stars} and again: {stars}.")),
        "{}",
        r.context()
    );
    assert!(r.stdout.contains("trace 403"), "{}", r.context());
    let line = r.line(|l| l["method"] == "GET" && l["host"] == "echo.test");
    assert!(line.to_string().contains("replaced 3 times"), "{line}");
}

#[test]
fn the_sandbox_is_a_client_of_its_own_never_a_loopback_source() {
    let port = echoing_origin();
    let policy = |clients: &str| {
        format!(
            r#"
settings:
  clients:
    - id: host-admin
      sources: [127.0.0.0/8, "::1/128"]
    - id: agents
      token_sha256: "0000000000000000000000000000000000000000000000000000000000000000"
exceptions:
  - id: admin-only
    owner: t
    reason: only the named client
    hosts: [echo.test]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
    clients: [{clients}]
"#
        )
    };
    let d = dns();
    let get = format!("curl -s -o /dev/null -w 'code %{{http_code}}\\n' http://echo.test:{port}/");
    // The host's loopback client is not the sandbox.
    let r = run()
        .policy(&policy("host-admin"))
        .dns(d.addr)
        .cmd(&["sh", "-c", &get]);
    assert!(r.stdout.contains("code 403"), "{}", r.context());
    let line = r.line(|l| l["host"] == "echo.test");
    assert_eq!(line["client"], "sandbox", "{line}");
    // --client names the sandbox: that client's exceptions apply.
    let r = run()
        .policy(&policy("agents"))
        .dns(d.addr)
        .arg("--client")
        .arg("agents")
        .cmd(&["sh", "-c", &get]);
    assert!(r.stdout.contains("code 200"), "{}", r.context());
    let line = r.line(|l| l["host"] == "echo.test");
    assert_eq!(line["client"], "agents", "{line}");
}
