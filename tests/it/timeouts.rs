//! Every wait has its bound, tested: an egressd runs in this test's own
//! runtime (`app::start`) under paused time, so that a ten-minute idle
//! timeout passes in no time, and each test fails if its timeout were
//! removed (the connection would stay open past the bound). Also here: the
//! connection permit a tunnel keeps after hyper lets go of the connection,
//! and the drain at shutdown that waits for it.
//!
//! Real sockets on 127.0.0.1 throughout; the destinations are listeners
//! this file opens (or, for port 443, a fake upstream proxy in front of a
//! documentation address that is never dialled).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use egressd::app::{self, Listeners, Running};
use egressd::cli::{Cli, Command};
use egressd::proxy::mitm::HANDSHAKE_TIMEOUT;
use egressd::proxy::sni::HELLO_TIMEOUT;
use egressd::proxy::{HEADER_READ_TIMEOUT, IDLE_TIMEOUT, RESPONSE_TIMEOUT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout, Instant};

use crate::support::read_log;

/// A margin around each bound: long enough that nothing else is due in it.
const MARGIN: Duration = Duration::from_secs(2);

/// An egressd running in this runtime, and the files it was given.
struct InProcess {
    running: Running,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl InProcess {
    async fn start(policy: &str, extra: &[&str]) -> InProcess {
        let dir = tempfile::tempdir().unwrap();
        let policy_path = dir.path().join("policy.yaml");
        std::fs::write(&policy_path, policy).unwrap();
        let log = dir.path().join("decisions.log");
        let mut argv = vec![
            "egressd".to_string(),
            "serve".into(),
            "--policy".into(),
            policy_path.display().to_string(),
            "--log".into(),
            log.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--dns-listen".into(),
            "127.0.0.1:0".into(),
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
            // Never asked: every destination here is an address.
            "--upstream-dns".into(),
            "127.0.0.1:9".into(),
        ];
        argv.extend(extra.iter().map(|a| a.to_string()));
        let Command::Serve(args) = Cli::parse_from(argv).command else {
            unreachable!("a serve command line")
        };
        let listeners = Listeners::bind(&args).await.unwrap();
        let running = app::start(&args, listeners).await.unwrap();
        InProcess {
            running,
            log,
            _dir: dir,
        }
    }

    /// Every decision-log line written so far.
    fn lines(&self) -> Vec<serde_json::Value> {
        assert!(
            self.running.log.flush(Duration::from_secs(10)),
            "log flushed"
        );
        read_log(&self.log)
    }

    /// Opens a CONNECT tunnel to `target` and reads the 200.
    async fn tunnel(&self, target: &str) -> TcpStream {
        let mut c = TcpStream::connect(self.running.proxy).await.unwrap();
        let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        c.write_all(head.as_bytes()).await.unwrap();
        let head = read_head(&mut c).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        c
    }
}

/// A response head, byte by byte up to the blank line (nothing after it
/// is consumed).
async fn read_head(c: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = timeout(Duration::from_secs(30), c.read(&mut byte))
            .await
            .expect("a response head in time")
            .unwrap();
        assert_eq!(n, 1, "closed before the head ended: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// Asserts that `c` stays open (no byte, no end) for `open`, and is closed
/// by egressd within [`MARGIN`] after that.
async fn closed_after(c: &mut TcpStream, open: Duration) {
    let mut buf = [0u8; 256];
    let started = Instant::now();
    match timeout(open, c.read(&mut buf)).await {
        Err(_) => {}
        Ok(r) => panic!("closed early, after {:?}: {r:?}", started.elapsed()),
    }
    let end = timeout(MARGIN * 2, async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        end.is_ok(),
        "still open {:?} after the bound",
        started.elapsed().saturating_sub(open)
    );
}

/// A listener that answers nothing: it reads what it is sent and keeps
/// the connection open.
async fn silent_origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            held.push(s);
        }
    });
    addr
}

/// A listener that echoes what it reads, until the peer closes.
async fn echo_origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// An exception for loopback on `port`, by address.
fn loopback_policy(port: u16) -> String {
    format!(
        "exceptions:\n  - id: local\n    owner: tests\n    reason: r\n    cidrs: [127.0.0.0/8]\n    ports: [{port}]\n"
    )
}

/// The line that ends the request or connection with `key` = `value` (a
/// connection's close line, not its open line).
fn line_with<'a>(lines: &'a [serde_json::Value], key: &str, value: &str) -> &'a serde_json::Value {
    lines
        .iter()
        .find(|l| l[key] == value && l["event"] != "open")
        .unwrap_or_else(|| panic!("no line with {key}={value}: {lines:?}"))
}

#[tokio::test(start_paused = true)]
async fn a_request_head_that_does_not_end_in_time_closes_the_connection() {
    let e = InProcess::start(&loopback_policy(80), &[]).await;
    let mut c = TcpStream::connect(e.running.proxy).await.unwrap();
    c.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    closed_after(&mut c, HEADER_READ_TIMEOUT - MARGIN).await;
    e.running.shutdown().await;
}

/// The header timeout is one deadline from the moment the connection
/// waits for a request, however the head is split: a head begun half way
/// through it must still end by it (not get a fresh timeout of its own
/// when its first bytes arrive).
#[tokio::test(start_paused = true)]
async fn a_head_begun_late_must_still_end_within_the_header_timeout() {
    let e = InProcess::start(&loopback_policy(80), &[]).await;
    let mut c = TcpStream::connect(e.running.proxy).await.unwrap();
    tokio::time::sleep(HEADER_READ_TIMEOUT / 2).await;
    c.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\n")
        .await
        .unwrap();
    closed_after(&mut c, HEADER_READ_TIMEOUT / 2 - MARGIN).await;
    e.running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
    let e = InProcess::start(&loopback_policy(80), &[]).await;
    let mut c = TcpStream::connect(e.running.proxy).await.unwrap();
    closed_after(&mut c, HEADER_READ_TIMEOUT - MARGIN).await;
    e.running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_header_timeout_is_the_policys() {
    let policy = format!(
        "settings:\n  limits: {{ header_timeout: 45s }}\n{}",
        loopback_policy(80)
    );
    let e = InProcess::start(&policy, &[]).await;
    let mut c = TcpStream::connect(e.running.proxy).await.unwrap();
    c.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    closed_after(&mut c, Duration::from_secs(45) - MARGIN).await;
    e.running.shutdown().await;
}

/// A CONNECT whose exception needs inspection (`methods`), off port 443
/// so its plain HTTP is served inside the tunnel: both the wait for its
/// first bytes and the wait for a request head in it are the policy's
/// header timeout, not egressd's default.
#[tokio::test(start_paused = true)]
async fn the_header_timeout_inside_an_inspected_tunnel_is_the_policys() {
    let port = silent_origin().await.port();
    let policy = format!(
        "settings:\n  limits: {{ header_timeout: 45s }}\nexceptions:\n  - id: local\n    owner: tests\n    reason: r\n    cidrs: [127.0.0.0/8]\n    ports: [{port}]\n    methods: [GET]\n"
    );
    let e = InProcess::start(&policy, &[]).await;
    let target = format!("127.0.0.1:{port}");
    // Nothing sent after the CONNECT: is it TLS or HTTP?
    let mut c = e.tunnel(&target).await;
    closed_after(&mut c, Duration::from_secs(45) - MARGIN).await;
    // A request head that never ends, inside the tunnel.
    let mut c = e.tunnel(&target).await;
    c.write_all(format!("GET / HTTP/1.1\r\nHost: {target}\r\n").as_bytes())
        .await
        .unwrap();
    closed_after(&mut c, Duration::from_secs(45) - MARGIN).await;
    let lines = e.lines();
    let l = line_with(&lines, "error", "no first bytes in time");
    assert_eq!(l["proto"], "connect");
    e.running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_origin_that_does_not_answer_in_time_gets_a_504() {
    let origin = silent_origin().await;
    let e = InProcess::start(&loopback_policy(origin.port()), &[]).await;
    let mut c = TcpStream::connect(e.running.proxy).await.unwrap();
    let req = format!("GET http://{origin}/slow HTTP/1.1\r\nHost: {origin}\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let mut byte = [0u8; 1];
    assert!(
        timeout(RESPONSE_TIMEOUT - MARGIN, c.read(&mut byte))
            .await
            .is_err(),
        "answered before the response timeout"
    );
    let head = timeout(MARGIN * 2, read_head(&mut c))
        .await
        .expect("an answer once the response timeout passed");
    assert!(head.starts_with("HTTP/1.1 504"), "{head}");
    let lines = e.lines();
    let l = line_with(&lines, "path", "/slow");
    assert_eq!(l["status"], 504);
    assert_eq!(l["error"], "timeout: no response in time");
    e.running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_tunnel_with_no_byte_either_way_is_closed_when_idle() {
    let origin = echo_origin().await;
    let e = InProcess::start(&loopback_policy(origin.port()), &[]).await;
    let mut c = e.tunnel(&origin.to_string()).await;
    c.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
    closed_after(&mut c, IDLE_TIMEOUT - MARGIN).await;
    let lines = e.lines();
    let l = line_with(&lines, "proto", "connect");
    assert_eq!(l["error"], "tunnel: idle timeout");
    assert_eq!(
        (l["bytes_up"].as_u64(), l["bytes_down"].as_u64()),
        (Some(4), Some(4))
    );
    e.running.shutdown().await;
}

/// A fake upstream proxy: answers every CONNECT 200 and then holds the
/// tunnel open, saying nothing. egressd's checked address is never dialled.
async fn holding_upstream_proxy() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = l.accept().await {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if s.read(&mut byte).await.unwrap_or(0) == 0 {
                    break;
                }
                head.push(byte[0]);
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await;
            held.push(s);
        }
    });
    addr
}

#[tokio::test(start_paused = true)]
async fn a_tunnel_to_443_without_a_client_hello_in_time_is_closed() {
    let upstream = holding_upstream_proxy().await;
    let policy = "exceptions:\n  - id: doc\n    owner: tests\n    reason: r\n    cidrs: [192.0.2.0/24]\n    ports: [443]\n";
    let proxy_url = format!("http://{upstream}");
    let e = InProcess::start(policy, &["--upstream-proxy", &proxy_url]).await;
    let mut c = e.tunnel("192.0.2.1:443").await;
    closed_after(&mut c, HELLO_TIMEOUT - MARGIN).await;
    let lines = e.lines();
    let l = line_with(&lines, "proto", "connect");
    assert_eq!(
        (&l["decision"], &l["reason"]),
        (&"deny".into(), &"sni_mismatch".into())
    );
    assert_eq!(l["note"], "no ClientHello in time");
    e.running.shutdown().await;
}

/// An egressd with interception on, and an exception that needs it.
async fn intercepting() -> (InProcess, tempfile::TempDir) {
    let ca = tempfile::tempdir().unwrap();
    egressd::tls::init_ca(&egressd::tls::InitOptions {
        dir: ca.path().to_path_buf(),
        days: 30,
        force: false,
    })
    .unwrap();
    let policy = "exceptions:\n  - id: api\n    owner: tests\n    reason: r\n    hosts: [api.test]\n    ports: [443]\n    methods: [GET]\n";
    let ca_dir = ca.path().display().to_string();
    (InProcess::start(policy, &["--ca-dir", &ca_dir]).await, ca)
}

#[tokio::test(start_paused = true)]
async fn an_intercepted_tunnel_keeps_its_connection_permit_until_it_closes() {
    let (e, _ca) = intercepting().await;
    let c = e.tunnel("api.test:443").await;
    let m = e.running.metrics.clone();
    eventually("hyper let go of the connection", || {
        m.active.with_label_values(&["http"]).get() == 0
            && m.active.with_label_values(&["connect"]).get() == 1
    })
    .await;
    let held = e.running.connection_permits();
    drop(c);
    eventually("the closed tunnel gave its permit back", || {
        e.running.connection_permits() == held - 1
    })
    .await;
    e.running.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_intercepted_tunnel_without_a_client_hello_in_time_is_closed() {
    let (e, _ca) = intercepting().await;
    let mut c = e.tunnel("api.test:443").await;
    closed_after(&mut c, HANDSHAKE_TIMEOUT - MARGIN).await;
    let lines = e.lines();
    let l = line_with(&lines, "proto", "connect");
    assert_eq!(l["note"], "intercepted");
    assert_eq!(l["error"], "client TLS: no ClientHello in time");
    e.running.shutdown().await;
}

/// Polls `f` (each look lets the runtime run) until it holds; fails past
/// a bound of looks.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(start_paused = true)]
async fn a_tunnel_keeps_its_connection_permit_after_the_upgrade_and_the_drain_waits_for_it() {
    let origin = echo_origin().await;
    let e = InProcess::start(&loopback_policy(origin.port()), &[]).await;
    let m = e.running.metrics.clone();
    let gauge = move |p: &str| m.active.with_label_values(&[p]).get();
    let open_tunnel = || async {
        let mut c = e.tunnel(&origin.to_string()).await;
        c.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).await.unwrap();
        // hyper is done with the connection (its HTTP side has ended);
        // the tunnel is open.
        eventually("hyper let go of the connection", || {
            gauge("http") == 0 && gauge("connect") >= 1
        })
        .await;
        c
    };

    // The permit goes when the tunnel closes, not when hyper let go.
    let c = open_tunnel().await;
    let held = e.running.connection_permits();
    drop(c);
    eventually("the closed tunnel gave its permit back", || {
        e.running.connection_permits() == held - 1
    })
    .await;

    // The drain waits for an open tunnel...
    let c = open_tunnel().await;
    let started = Instant::now();
    let shutdown = tokio::spawn(e.running.shutdown());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !shutdown.is_finished(),
        "the drain did not wait for the tunnel"
    );
    // ...and ends as soon as the tunnel does.
    drop(c);
    timeout(Duration::from_secs(1), shutdown)
        .await
        .expect("the drain ended with the tunnel")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// An origin that switches every request to WebSocket and then echoes.
async fn websocket_origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let switch = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
                if s.write_all(switch.as_bytes()).await.is_ok() {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
        }
    });
    addr
}

#[tokio::test(start_paused = true)]
async fn a_websocket_keeps_its_connection_permit_until_it_closes() {
    let origin = websocket_origin().await;
    let e = InProcess::start(&loopback_policy(origin.port()), &[]).await;
    let mut c = TcpStream::connect(e.running.proxy).await.unwrap();
    let req = format!(
        "GET http://{origin}/ws HTTP/1.1\r\nHost: {origin}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    c.write_all(b"frame").await.unwrap();
    let mut got = [0u8; 5];
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"frame");
    let m = e.running.metrics.clone();
    eventually("hyper let go of the connection", || {
        m.active.with_label_values(&["http"]).get() == 0
    })
    .await;
    let held = e.running.connection_permits();
    drop(c);
    eventually("the closed WebSocket gave its permit back", || {
        e.running.connection_permits() == held - 1
    })
    .await;
    let lines = e.lines();
    let l = line_with(&lines, "path", "/ws");
    assert_eq!(
        (l["status"].as_u64(), l["bytes_up"].as_u64()),
        (Some(101), Some(5))
    );
    e.running.shutdown().await;
}
