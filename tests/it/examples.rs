//! The client examples (examples/clients/) run behind a real `egressd serve`
//! on 127.0.0.1: an http:// request to a local origin that an exception
//! allows goes through, and an https:// CONNECT nothing allows is refused
//! with its reason read back from egressd. Python and Node are required
//! (`tests/setup` installs them).

use std::path::Path;
use std::process::Command;

use crate::support::{egressd, on_path, policy, raw_origin, root, tool, Act, Egressd, RawOrigin};

/// A plain-HTTP origin on 127.0.0.1 answering every request with `hello`.
fn hello_origin() -> RawOrigin {
    raw_origin(|_| {
        Act::Reply(
            b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n".to_vec(),
        )
    })
}

/// `egressd serve` on 127.0.0.1 with one exception: the local origin; and
/// the proxy URL a client is given.
fn egressd_for(origin_port: u16) -> (Egressd, String) {
    let p = policy()
        .contact("#egressd-examples")
        .exception("local-origin")
        .owner("tests")
        .reason("the examples' allowed request")
        .cidr("127.0.0.1/32")
        .port(origin_port);
    let e = egressd()
        .policy("policy.yaml", &p.yaml())
        .policy_as_file()
        .clean_env()
        .start();
    let proxy = format!("http://{}", e.proxy);
    (e, proxy)
}

fn run_example(program: &Path, script: &str, proxy: &str, allowed: &str) -> (bool, String) {
    let o = Command::new(program)
        .arg(root().join(script))
        .args([allowed, "https://example.com/"])
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env("HTTP_PROXY", proxy)
        .env("HTTPS_PROXY", proxy)
        .env("http_proxy", proxy)
        .env("https_proxy", proxy)
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn check_output(out: &str, allowed: &str) {
    assert!(
        out.contains(&format!("ALLOWED {allowed}: 200, 6 bytes")),
        "{out}"
    );
    assert!(
        out.contains("DENIED  https://example.com/: 403 no_exception"),
        "{out}"
    );
    // egressd's explanation, with the contact, reached the program.
    assert!(out.contains("#egressd-examples"), "{out}");
    assert!(
        out.contains("egressd explain https://example.com/"),
        "{out}"
    );
}

#[test]
fn python_client_behind_egressd() {
    let python = on_path("python3").expect("python3 (CI installs it)");
    let origin = hello_origin();
    let port = origin.addr.port();
    let (_e, proxy) = egressd_for(port);
    let allowed = format!("http://127.0.0.1:{port}/hello");
    let (ok, out) = run_example(
        &python,
        "examples/clients/python_client.py",
        &proxy,
        &allowed,
    );
    assert!(ok, "{out}");
    check_output(&out, &allowed);
}

#[test]
fn node_client_behind_egressd() {
    let node = tool("node");
    let origin = hello_origin();
    let port = origin.addr.port();
    let (_e, proxy) = egressd_for(port);
    let allowed = format!("http://127.0.0.1:{port}/hello");
    let (ok, out) = run_example(&node, "examples/clients/node_client.mjs", &proxy, &allowed);
    assert!(ok, "{out}");
    check_output(&out, &allowed);
}
