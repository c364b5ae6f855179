//! Upload budgets (issue #38 item 3, DESIGN "Writes on allowed hosts",
//! `upload:`), against a running egressd with real curl and raw sockets:
//! a declared length over the budget refused before anything is forwarded
//! (`429 upload_budget`, the request id in the JSON answer), a chunked
//! body and a CONNECT tunnel cut where they cross, an intercepted
//! connection's requests charged, one client's budget never another's, the
//! count kept across a reload, and held across two replicas behind
//! HAProxy (`balance source`).
//!
//! Each test fails without `upload:` enforcement: the second upload would
//! pass (and reach the origin) instead of being refused or cut.

use std::io::{BufReader, Read, Write};
use std::net::Shutdown;
use std::process::Command;

use serde_json::Value;

use crate::forward::sha256_hex;
use crate::support::*;

const A_TOKEN: &str = "a-token";
const B_TOKEN: &str = "b-token";
/// `Basic` of `agent:a-token`, for raw requests.
const A_BASIC: &str = "YWdlbnQ6YS10b2tlbg==";

/// Two named clients (by token) and an exception for `api.test` (and
/// `echo.test`) on `ports` with a 1000-byte upload budget.
fn budget_policy(ports: &[u16]) -> PolicyYaml {
    policy()
        .client_token("agent-a", &sha256_hex(A_TOKEN.as_bytes()))
        .client_token("agent-b", &sha256_hex(B_TOKEN.as_bytes()))
        .exception("api")
        .hosts(&["api.test", "echo.test"])
        .cidr(LOOPBACK)
        .ports(ports)
        .upload("1000B", "1h")
}

fn budget_lab() -> Lab {
    lab()
        .names(&["api.test", "echo.test"])
        .start(|p| budget_policy(&[p.origin, p.echo]))
}

/// What curl got: status, reason header, request id header, body.
#[derive(Debug)]
struct Posted {
    status: u16,
    reason: Option<String>,
    request: Option<String>,
    body: String,
}

/// POSTs `n` bytes to `url` through `proxy` as the client of `token`, by
/// real curl (`Content-Length`, or chunked with `chunked`).
fn post(proxy: std::net::SocketAddr, token: &str, url: &str, n: usize, extra: &[&str]) -> Posted {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::write(&data, vec![b'u'; n]).unwrap();
    let out = Command::new(tool("curl"))
        .args(["-sS", "-i", "--max-time", "20", "--noproxy", ""])
        .arg("-x")
        .arg(format!("http://{proxy}"))
        .arg("--proxy-user")
        .arg(format!("agent:{token}"))
        .args(["-H", "Accept: application/json"])
        .arg("--data-binary")
        .arg(format!("@{}", data.display()))
        .args(extra)
        .arg(url)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("curl runs");
    parse_curl(&out)
}

fn parse_curl(out: &std::process::Output) -> Posted {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let a = curl_answer(&text)
        .unwrap_or_else(|| panic!("no status from curl: {text:?} {:?}", out.stderr));
    Posted {
        status: a.status,
        reason: a.header("x-egressd-reason"),
        request: a.header("x-egressd-request"),
        body: a.body.to_string(),
    }
}

fn url(l: &Lab, path: &str) -> String {
    format!("http://api.test:{}{path}", l.origin.addr.port())
}

/// The bytes the origin received in request bodies, all requests.
fn received(o: &Origin) -> usize {
    o.seen.lock().unwrap().iter().map(|s| s.body.len()).sum()
}

fn uploaded_metric(e: &Egressd, exception: &str) -> f64 {
    e.metric(&format!(
        "egressd_upload_bytes_total{{exception=\"{exception}\"}}"
    ))
    .unwrap_or(0.0)
}

/// The 429 answer: its reason header, and its JSON body naming the reason
/// and the request id the log line and header carry.
fn assert_budget_refusal(p: &Posted, e: &Egressd) -> Value {
    assert_eq!(p.status, 429, "{p:?}");
    assert_eq!(p.reason.as_deref(), Some("upload_budget"));
    let body: Value = serde_json::from_str(&p.body).expect("a JSON deny body");
    assert_eq!(body["reason"], "upload_budget");
    let id = p.request.clone().expect("X-Egressd-Request");
    assert_eq!(body["request"], id.as_str());
    let line = e.wait_line("the refusal's line", |l| l["id"] == id.as_str());
    assert_eq!(line["decision"], "deny");
    assert_eq!(line["reason"], "upload_budget");
    assert_eq!(line["status"], 429);
    assert_eq!(line["upload"]["crossed"], true);
    assert_eq!(line["upload"]["budget"], 1000);
    line
}

#[test]
fn a_declared_length_that_would_cross_is_refused_before_forwarding_per_client() {
    let l = budget_lab();
    let e = &l.e;
    assert_eq!(
        e.metric("egressd_upload_bytes_total{exception=\"api\"}"),
        Some(0.0),
        "a budget's series exists from the start"
    );
    let first = post(e.proxy, A_TOKEN, &url(&l, "/up"), 600, &[]);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(received(&l.origin), 600);
    let ok_line = e.wait_line("the first upload's line", |l| {
        l["path"] == "/up" && l["decision"] == "allow"
    });
    assert_eq!(ok_line["upload"]["used"], 600);
    assert_eq!(ok_line["upload"]["crossed"], false);

    let second = post(e.proxy, A_TOKEN, &url(&l, "/up2"), 600, &[]);
    assert_budget_refusal(&second, e);
    assert_eq!(
        l.origin.count(),
        1,
        "the refused upload never reached the origin"
    );
    // Small enough to fit what is left: still allowed.
    let small = post(e.proxy, A_TOKEN, &url(&l, "/small"), 400, &[]);
    assert_eq!(small.status, 200, "{small:?}");
    let over = post(e.proxy, A_TOKEN, &url(&l, "/one-more"), 1, &[]);
    assert_eq!(over.status, 429, "{over:?}");

    // Another client has its own budget.
    let b = post(e.proxy, B_TOKEN, &url(&l, "/b"), 1000, &[]);
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(received(&l.origin), 2000);
    eventually("the metric counts what was sent", || {
        (uploaded_metric(e, "api") == 2000.0).then_some(())
    });
}

#[test]
fn a_chunked_body_is_cut_where_it_crosses() {
    let l = budget_lab();
    let e = &l.e;
    let port = l.origin.addr.port();
    let mut s = connect(e.proxy);
    write!(
        s,
        "POST http://api.test:{port}/chunked HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: Basic {A_BASIC}\r\nAccept: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    let chunk = |s: &mut std::net::TcpStream, n: usize| {
        let mut c = format!("{n:x}\r\n").into_bytes();
        c.extend(std::iter::repeat_n(b'c', n));
        c.extend_from_slice(b"\r\n");
        s.write_all(&c)
    };
    chunk(&mut s, 600).unwrap();
    // The first 600 bytes are charged (the metric counts them once the
    // line is written; here the window is what matters): send the rest.
    let _ = chunk(&mut s, 600);
    let _ = s.write_all(b"0\r\n\r\n");
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).expect("an answer");
    assert_eq!(resp.status, 429, "{}", resp.text());
    assert_eq!(resp.header("x-egressd-reason"), Some("upload_budget"));
    let body: Value = serde_json::from_slice(&resp.body).unwrap();
    assert_eq!(body["reason"], "upload_budget");
    let id = resp.header("x-egressd-request").unwrap().to_string();
    assert_eq!(body["request"], id.as_str());
    let line = e.wait_line("the cut request's line", |l| l["id"] == id.as_str());
    assert_eq!(line["reason"], "upload_budget");
    assert_eq!(line["upload"]["crossed"], true);
    assert!(
        line["bytes_up"].as_u64().unwrap() <= 1000,
        "no more than the budget went upstream: {line}"
    );
    // The origin never saw a complete request: the body was cut.
    assert_eq!(l.origin.count(), 0);
    // And the window holds what went: a further upload of 500 is refused.
    let more = post(e.proxy, A_TOKEN, &url(&l, "/after"), 500, &[]);
    assert_eq!(more.status, 429, "{more:?}");
}

#[test]
fn a_connect_tunnel_is_cut_when_the_client_crosses_its_budget() {
    let l = budget_lab();
    let e = &l.e;
    let p = l.echo.port();
    let mut s = connect(e.proxy);
    write!(
        s,
        "CONNECT echo.test:{p} HTTP/1.1\r\nHost: echo.test:{p}\r\nProxy-Authorization: Basic {A_BASIC}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    // The next 600 would cross 1000: the tunnel is cut, they never reach
    // the echo server (so nothing more comes back), and it closes.
    echoed_then_cut(&mut s, &mut r, b't');
    let line = e.wait_line("the tunnel's close line", |l| {
        l["proto"] == "connect" && l["event"] == "close"
    });
    assert_eq!(line["exception"], "api");
    assert_eq!(line["bytes_up"], 600);
    assert_eq!(line["upload"]["crossed"], true);
    assert_eq!(line["upload"]["used"], 600);
    assert!(
        line["error"]
            .as_str()
            .unwrap_or("")
            .contains("upload budget"),
        "{line}"
    );
    eventually("the metric counts the tunnel's bytes", || {
        (uploaded_metric(e, "api") == 600.0).then_some(())
    });
    // Client B's tunnel is not affected.
    let mut b = connect(e.proxy);
    write!(
        b,
        "CONNECT echo.test:{p} HTTP/1.1\r\nProxy-Authorization: Basic YWdlbnQ6Yi10b2tlbg==\r\n\r\n"
    )
    .unwrap();
    let mut br = BufReader::new(b.try_clone().unwrap());
    assert_eq!(read_response(&mut br).unwrap().status, 200);
    b.write_all(&[b'b'; 900]).unwrap();
    let mut back = vec![0u8; 900];
    br.read_exact(&mut back).unwrap();
}

#[test]
fn a_reload_that_keeps_the_exception_keeps_the_count() {
    let l = budget_lab();
    let e = &l.e;
    assert_eq!(post(e.proxy, A_TOKEN, &url(&l, "/a"), 700, &[]).status, 200);
    let reloads = |e: &Egressd| {
        e.metric("egressd_policy_reloads_total{result=\"ok\"}")
            .unwrap_or(0.0)
    };
    let before = reloads(e);
    // The same exception (its file rewritten, another exception added).
    let ports = [l.origin.addr.port(), l.echo.port()];
    atomic_write(
        &e.policy_dir.join("p.yaml"),
        &budget_policy(&ports)
            .exception("other")
            .host("other.test")
            .yaml(),
    );
    eventually("the reload", || (reloads(e) > before).then_some(()));
    let after = post(e.proxy, A_TOKEN, &url(&l, "/b"), 700, &[]);
    assert_budget_refusal(&after, e);
    assert_eq!(l.origin.count(), 1);
}

/// Inside an intercepted connection every request is decided on its own
/// and its body charged: with a declared length (refused before it is
/// forwarded) and streamed without one over HTTP/2 (cut).
#[test]
fn requests_inside_an_intercepted_connection_are_charged() {
    let dir = tempfile::tempdir().unwrap();
    let pki = tls::test_pki();
    let origin = tls::tls_origin(pki.leaf(&["api.test"]), &[b"h2", b"http/1.1"]);
    let l = lab_with(origin)
        .names(&["api.test"])
        .intercept(&pki.ca_pem)
        .start(|p| {
            policy()
                .client_token("agent-a", &sha256_hex(A_TOKEN.as_bytes()))
                .exception("api")
                .host("api.test")
                .cidr(LOOPBACK)
                .port(p.origin)
                .path("/**")
                .upload("1000B", "1h")
        });
    let e = &l.e;
    let u = |path: &str| format!("https://api.test:{}{path}", l.origin.port());
    let ca = l.ca_pem();
    let tls_post = |path: &str, n: usize, extra: &[&str]| {
        let data = dir.path().join("data");
        std::fs::write(&data, vec![b'i'; n]).unwrap();
        let out = Command::new(tool("curl"))
            .args(["-sS", "-i", "--max-time", "20", "--noproxy", ""])
            .arg("-x")
            .arg(format!("http://{}", e.proxy))
            .arg("--proxy-user")
            .arg(format!("agent:{A_TOKEN}"))
            .arg("--cacert")
            .arg(&ca)
            .args(["-H", "Accept: application/json", "--http1.1"])
            .args(extra)
            .arg("--data-binary")
            .arg(format!("@{}", data.display()))
            .arg(u(path))
            .output()
            .unwrap();
        parse_curl(&out)
    };
    let first = tls_post("/one", 600, &[]);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(l.origin.count(), 1);
    let second = tls_post("/two", 600, &[]);
    assert_budget_refusal(&second, e);
    assert_eq!(l.origin.count(), 1, "refused before it was forwarded");
    // Streamed, no declared length (chunked to egressd): cut.
    let streamed = tls_post("/three", 600, &["-H", "Transfer-Encoding: chunked"]);
    let line = assert_budget_refusal(&streamed, e);
    // The origin may have seen the request's head; none of its body went.
    assert_eq!(line["bytes_up"], 0, "{line}");
}

/// Two egressd replicas behind HAProxy (`balance source`): a client
/// always meets the same replica, so its budget holds across the
/// balancer; the other replica never counts its bytes.
#[test]
fn fleet_an_upload_budget_holds_across_haproxy_balance_source() {
    let f = fleet(|port| budget_policy(&[port]).yaml());
    let u = format!("http://api.test:{}/up", f.origin.addr.port());
    let statuses: Vec<u16> = (0..4)
        .map(|_| post(f.front, A_TOKEN, &u, 400, &[]).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 429, 429],
        "one budget across the balancer"
    );
    assert_eq!(received(&f.origin), 800);
    let counted: Vec<f64> = f
        .replicas
        .iter()
        .map(|r| uploaded_metric(r, "api"))
        .collect();
    let mut sorted = counted.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(
        sorted,
        [0.0, 800.0],
        "one replica counted it all: {counted:?}"
    );
}

/// `mode: report`: nothing is refused; the line says the budget was crossed.
#[test]
fn report_mode_lets_the_upload_through_and_says_it_crossed() {
    let l = lab()
        .names(&["api.test"])
        .start(|p| budget_policy(&[p.origin]).mode("report"));
    let e = &l.e;
    assert_eq!(post(e.proxy, A_TOKEN, &url(&l, "/a"), 700, &[]).status, 200);
    let second = post(e.proxy, A_TOKEN, &url(&l, "/b"), 700, &[]);
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(received(&l.origin), 1400);
    let line = e.wait_line("the second upload's line", |l| l["path"] == "/b");
    assert_eq!(line["upload"]["crossed"], true, "{line}");
    assert_eq!(line["upload"]["used"], 1400);
}

/// `egressd check` names the file and line of a bad `upload:`.
#[test]
fn check_refuses_a_bad_upload_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    let check = |yaml: &str| {
        std::fs::write(&p, yaml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
            .arg("check")
            .arg(&p)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let head =
        "exceptions:\n  - id: api\n    owner: o\n    reason: r\n    hosts: [api.example.com]\n";
    let (code, text) = check(&format!("{head}    upload: {{ bytes: 0B, per: 40d }}\n"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("p.yaml:2:5"), "{text}");
    assert!(text.contains("upload: bytes must be at least 1B"), "{text}");
    assert!(
        text.contains("upload: per must be between 1s and 30d"),
        "{text}"
    );
    let (code, text) = check(&format!(
        "{head}    upload: {{ bytes: 1MiB, per: 1h, burst: 2 }}\n"
    ));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("p.yaml:6:"), "{text}");
    assert!(text.contains("unknown field `burst`"), "{text}");
    let (code, text) = check(&format!("{head}    upload: {{ bytes: 1MiB }}\n"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("per"), "{text}");
    let (code, text) = check(&format!("{head}    upload: {{ bytes: 10MiB, per: 1h }}\n"));
    assert_eq!(code, Some(0), "{text}");
}

/// A WebSocket origin: switches every request, then echoes.
fn websocket_origin() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let switch = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
                if s.write_all(switch.as_bytes()).is_ok() {
                    let mut r = s.try_clone().unwrap();
                    let _ = std::io::copy(&mut r, &mut s);
                }
            });
        }
    });
    addr
}

/// What a client sends on a WebSocket is charged too: the upgraded
/// connection is cut where it crosses the budget.
#[test]
fn a_websocket_is_cut_when_the_client_crosses_its_budget() {
    let ws = websocket_origin();
    let l = lab()
        .names(&["api.test"])
        .start(|_| budget_policy(&[ws.port()]));
    let e = &l.e;
    let mut s = connect(e.proxy);
    write!(
        s,
        "GET http://api.test:{p}/ws HTTP/1.1\r\nHost: api.test:{p}\r\nProxy-Authorization: Basic {A_BASIC}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        p = ws.port()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let head = read_head(&mut r).expect("an answer");
    assert!(head[0].starts_with("HTTP/1.1 101"), "{head:?}");
    echoed_then_cut(&mut s, &mut r, b'w');
    let line = e.wait_line("the WebSocket's close line", |l| {
        l["path"] == "/ws" && l["event"] == "close"
    });
    assert_eq!(line["bytes_up"], 600, "{line}");
    assert_eq!(line["upload"]["crossed"], true, "{line}");
}

/// Sends 600 bytes of `byte` that the echo server sends back, then 600
/// more that cross the budget: nothing more comes back, and the
/// connection closes.
fn echoed_then_cut(s: &mut std::net::TcpStream, r: &mut BufReader<std::net::TcpStream>, byte: u8) {
    s.write_all(&[byte; 600]).unwrap();
    let mut back = vec![0u8; 600];
    r.read_exact(&mut back).unwrap();
    let _ = s.write_all(&[byte; 600]);
    let _ = s.shutdown(Shutdown::Write);
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "bytes past the budget came back: {}",
        rest.len()
    );
}
