//! Faults egressd must survive with nothing lost: origins that reset at
//! each stage, an upstream DNS that is down or silent, a storm of reloads
//! under load, SIGTERM with requests and tunnels in flight, log rotation
//! under load, and a decision-log sink that fails (closed, then recovering).

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use super::*;

/// The exception these tests need: `host` on `port`.
fn exception(host: &str, port: u16) -> PolicyYaml {
    policy()
        .exception("origin")
        .reason("the test origin")
        .host(host)
        .cidr(LOOPBACK)
        .port(port)
}

/// egressd wrote no panic to stderr.
fn assert_no_panic(e: &Egressd) {
    let err = e.stderr_text();
    assert!(!err.contains("panicked"), "egressd panicked:\n{err}");
}

#[test]
fn origin_resets_at_every_stage() {
    // The script reads the stage from the path.
    let origin = raw_origin(|r| {
        let stage = r.target.trim_start_matches('/');
        match stage {
            "reset-before-answer" => Act::Reset,
            "reset-mid-status" => Act::Partial(b"HTTP/1.1 20".to_vec()),
            "reset-mid-headers" => Act::Partial(b"HTTP/1.1 200 OK\r\nContent-Len".to_vec()),
            "reset-mid-body" => {
                Act::Partial(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly part".to_vec())
            }
            "reset-mid-chunk" => Act::Partial(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nonly".to_vec(),
            ),
            "garbage" => Act::Partial(b"SSH-2.0-nope\r\n\r\n".to_vec()),
            _ => ok_reply(r),
        }
    });
    let l = lab_with(origin)
        .names(&["origin.test"])
        .start(|ports| exception("origin.test", ports.origin));
    let (e, origin, p) = (&l.e, &l.origin, l.port());
    let mut lines = Lines::new(e);
    let get = |path: &str| {
        try_request(
            e.proxy,
            get_raw(&format!("http://origin.test:{p}/{path}")).as_bytes(),
        )
    };
    // Before any byte of a response: 502, and a line with the error.
    for stage in [
        "reset-before-answer",
        "reset-mid-status",
        "reset-mid-headers",
        "garbage",
    ] {
        let r = get(stage).expect("an answer");
        assert_eq!(r.status, 502, "{stage}");
        let line = lines.one(stage);
        assert!(line["error"].is_string(), "{stage}: {line}");
        assert_eq!(line["status"], 502, "{stage}");
    }
    // After the head: the client gets a cut-short body; the line says so.
    for stage in ["reset-mid-body", "reset-mid-chunk"] {
        let r = get(stage);
        assert!(
            r.as_ref().is_none_or(|r| r.status == 200),
            "{stage}: {:?}",
            r.map(|r| r.status)
        );
        let line = lines.one(stage);
        assert_eq!(line["status"], 200, "{stage}");
        assert!(
            line["error"]
                .as_str()
                .is_some_and(|e| e.contains("body") || e.contains("went away")),
            "{stage}: {line}"
        );
    }
    // Reset as soon as the connection is accepted.
    origin.reset_on_accept.store(true, Ordering::SeqCst);
    let r = get("ok").expect("an answer");
    assert_eq!(r.status, 502);
    assert!(lines.one("reset on accept")["error"].is_string());
    // A tunnel whose destination resets at once: the tunnel ends, one line.
    let mut s = connect(e.proxy);
    write!(s, "CONNECT origin.test:{p} HTTP/1.1\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let resp = read_response(&mut r).unwrap();
    if resp.status == 200 {
        let _ = s.write_all(b"hello");
        let mut rest = Vec::new();
        let _ = r.read_to_end(&mut rest);
    }
    lines.one("tunnel reset");
    // Still serving.
    origin.reset_on_accept.store(false, Ordering::SeqCst);
    assert_eq!(get("ok").unwrap().status, 200);
    lines.one("recovered");
    lines.done("resets");
    assert_no_panic(e);
}

#[test]
fn upstream_dns_down_or_silent() {
    // Down: nothing listens on the port. Silent: it reads and never answers.
    let silent = scripted_dns(|_, _| DnsAct::Silent);
    let down: std::net::SocketAddr = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let origin = origin();
    let p = origin.addr.port();
    let mut handles = Vec::new();
    for (what, upstream) in [("down", down), ("silent", silent.addr)] {
        handles.push(thread::spawn(move || {
            let e = egressd()
                .policy("p.yaml", &exception("name.test", p).yaml())
                .dns(upstream)
                .start();
            let mut lines = Lines::new(&e);
            let t = Instant::now();
            let r = try_request(
                e.proxy,
                get_raw(&format!("http://name.test:{p}/")).as_bytes(),
            )
            .unwrap();
            assert!(r.status == 502 || r.status == 504, "{what}: {}", r.status);
            let line = lines.one(what);
            assert!(
                line["error"]
                    .as_str()
                    .is_some_and(|x| x.contains("resolve")),
                "{what}: {line}"
            );
            let r =
                try_request(e.proxy, connect_raw(&format!("name.test:{p}")).as_bytes()).unwrap();
            assert!(r.status == 502 || r.status == 504, "{what}: {}", r.status);
            lines.one(what);
            let r = ask_udp(e.dns, &dns_query("name.test.", RecordType::A));
            assert_eq!(r.metadata.response_code, ResponseCode::ServFail, "{what}");
            let line = lines.one(what);
            assert_eq!(line["rcode"], "SERVFAIL");
            assert!(line["error"].is_string(), "{what}: {line}");
            // Bounded: three resolutions, each within egressd's 5 s deadline.
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{what}: {:?}",
                t.elapsed()
            );
            // Literal destinations do not need DNS and still work.
            let r = try_request(
                e.proxy,
                get_raw(&format!("http://127.0.0.1:{p}/")).as_bytes(),
            )
            .unwrap();
            assert_eq!(r.status, 200, "{what}");
            lines.one(what);
            lines.done(what);
            assert_no_panic(&e);
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    assert!(origin.count() >= 2);
}

/// Reloads every few milliseconds (file rewrites and SIGHUP) while four
/// clients send requests: no request fails, every request has its line.
#[test]
fn reload_storm_under_load_fails_no_request() {
    let l = crate::support::lab()
        .names(&["steady.test"])
        .start(|ports| exception("steady.test", ports.origin));
    let p = l.port();
    let e = Arc::new(l.e);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (e, stop, sent, failures) =
                (e.clone(), stop.clone(), sent.clone(), failures.clone());
            thread::spawn(move || {
                // Keep-alive connections, so requests span reloads.
                let mut s = connect(e.proxy);
                let mut r = BufReader::new(s.try_clone().unwrap());
                while !stop.load(Ordering::Relaxed) {
                    let req = format!(
                        "GET http://steady.test:{p}/x HTTP/1.1\r\nHost: steady.test:{p}\r\n\r\n"
                    );
                    s.write_all(req.as_bytes()).unwrap();
                    sent.fetch_add(1, Ordering::Relaxed);
                    match read_response(&mut r) {
                        Some(resp) if resp.status == 200 => {}
                        other => failures
                            .lock()
                            .unwrap()
                            .push(other.map(|x| (x.status, x.text()))),
                    }
                }
            })
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(4);
    let mut i = 0u32;
    while Instant::now() < end {
        // Two valid policies that both allow steady.test, alternating, plus
        // an unrelated exception whose id changes every time.
        let churn = exception("steady.test", p)
            .exception(&format!("churn-{i}"))
            .reason("churn")
            .host(&format!("churn{i}.test"));
        atomic_write(&e.policy_dir.join("p.yaml"), &churn.yaml());
        if i % 4 == 0 {
            e.signal("HUP");
        }
        i += 1;
        thread::sleep(Duration::from_millis(15));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent > 50, "only {sent} requests");
    let lines = eventually("a line per request", || {
        let l = complete_lines(&e);
        (l.len() >= sent).then_some(l)
    });
    assert_eq!(lines.len(), sent);
    assert!(lines.iter().all(|l| l["decision"] == "allow"));
    let ok = e
        .metric(r#"egressd_policy_reloads_total{result="ok"}"#)
        .unwrap();
    assert!(ok >= 10.0, "only {ok} reloads");
    assert_eq!(
        e.metric(r#"egressd_policy_reloads_total{result="error"}"#)
            .unwrap_or(0.0),
        0.0
    );
    assert_eq!(l.origin.count(), sent);
    assert_no_panic(&e);
}

/// SIGTERM: no new connections; a request in flight completes; a tunnel
/// keeps working through the grace period and is logged when it closes;
/// then the process exits with every line written.
#[test]
fn sigterm_drains_requests_and_tunnels_within_the_grace_period() {
    let slow = raw_origin(|r| {
        Act::Delay(
            Duration::from_millis(1500),
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}",
                r.target.len(),
                r.target
            )
            .into_bytes(),
        )
    });
    let mut l = lab_with(slow)
        .names(&["slow.test", "echo.test"])
        .start(|ports| {
            exception("slow.test", ports.origin)
                .exception("echo")
                .reason("r")
                .host("echo.test")
                .cidr(LOOPBACK)
                .port(ports.echo)
        });
    let (echo, slow) = (l.echo, &l.origin);
    let proxy = l.e.proxy;
    // A tunnel, open and working.
    let mut tunnel = connect(proxy);
    write!(tunnel, "CONNECT echo.test:{} HTTP/1.1\r\n\r\n", echo.port()).unwrap();
    let mut tr = BufReader::new(tunnel.try_clone().unwrap());
    assert_eq!(read_response(&mut tr).unwrap().status, 200);
    // A request in flight: the origin has it and answers in 1.5 s.
    let url = format!("http://slow.test:{}/inflight", slow.addr.port());
    let inflight = thread::spawn(move || try_request(proxy, get_raw(&url).as_bytes()));
    eventually("the origin to get the request", || {
        (!slow.requests().is_empty()).then_some(())
    });
    let t = Instant::now();
    l.e.signal("TERM");
    // New connections are refused once the listener is gone.
    eventually("the proxy to stop accepting", || {
        TcpStream::connect(proxy).is_err().then_some(())
    });
    // The tunnel still carries bytes during the grace period.
    tunnel.write_all(b"during grace").unwrap();
    let mut back = [0u8; 12];
    tr.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"during grace");
    let r = inflight
        .join()
        .unwrap()
        .expect("the in-flight request was answered");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "/inflight");
    // The client ends its tunnel; egressd has nothing left and exits.
    drop((tunnel, tr));
    let e = &mut l.e;
    let status = eventually("egressd to exit", || e.child.try_wait().unwrap());
    assert!(status.success(), "{status:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5 + 3),
        "took {:?} to exit",
        t.elapsed()
    );
    let lines = complete_lines(e);
    assert!(
        lines
            .iter()
            .any(|l| l["path"] == "/inflight" && l["status"] == 200),
        "{lines:#?}"
    );
    let tl = lines
        .iter()
        .find(|l| l["proto"] == "connect" && l["event"] == "close")
        .expect("the tunnel's close line");
    assert_eq!(tl["bytes_up"], 12);
    assert_no_panic(e);
}

/// A tunnel still open when the grace period ends is cut, and its line
/// must still be written: every request that reached egressd has one.
#[test]
fn a_tunnel_cut_at_the_end_of_the_grace_period_is_still_logged() {
    let mut l = crate::support::lab()
        .names(&["echo.test"])
        .start(|ports| exception("echo.test", ports.echo));
    let (echo, e) = (l.echo, &mut l.e);
    let mut tunnel = connect(e.proxy);
    write!(tunnel, "CONNECT echo.test:{} HTTP/1.1\r\n\r\n", echo.port()).unwrap();
    let mut tr = BufReader::new(tunnel.try_clone().unwrap());
    assert_eq!(read_response(&mut tr).unwrap().status, 200);
    tunnel.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    tr.read_exact(&mut back).unwrap();
    e.signal("TERM");
    let status = eventually("egressd to exit", || e.child.try_wait().unwrap());
    assert!(status.success());
    let lines = complete_lines(e);
    assert!(
        lines.iter().any(|l| l["proto"] == "connect"),
        "the cut tunnel has no line: {lines:#?}"
    );
}

/// Rotation (rename, SIGUSR1) twice while clients send requests: the
/// lines across the three files are exactly the requests sent.
#[test]
fn log_rotation_under_load_loses_no_line() {
    let l = crate::support::lab()
        .names(&["busy.test"])
        .start(|ports| exception("busy.test", ports.origin));
    let p = l.port();
    let e = Arc::new(l.e);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..3)
        .map(|i| {
            let (e, stop, sent) = (e.clone(), stop.clone(), sent.clone());
            thread::spawn(move || {
                let mut s = connect(e.proxy);
                let mut r = BufReader::new(s.try_clone().unwrap());
                while !stop.load(Ordering::Relaxed) {
                    // Allowed and denied alike produce lines.
                    let host = if i == 2 { "denied.test" } else { "busy.test" };
                    let req =
                        format!("GET http://{host}:{p}/r HTTP/1.1\r\nHost: {host}:{p}\r\n\r\n");
                    s.write_all(req.as_bytes()).unwrap();
                    read_response(&mut r).expect("a response");
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let rotated: Vec<std::path::PathBuf> = (1..=2)
        .map(|i| e.log_path.with_extension(format!("log.{i}")))
        .collect();
    for path in rotated.iter().rev() {
        thread::sleep(Duration::from_millis(700));
        // Move the current file aside; lines keep landing in it until the
        // reopen, then in a fresh file at the old path.
        std::fs::rename(&e.log_path, path).unwrap();
        e.signal("USR1");
        eventually("the reopened file", || e.log_path.exists().then_some(()));
    }
    thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let sent = sent.load(Ordering::Relaxed);
    // Complete lines only: the last may still be being written.
    let count = |p: &std::path::Path| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let done = text.rfind('\n').map_or("", |i| &text[..=i]);
        for l in done.lines() {
            serde_json::from_str::<serde_json::Value>(l).expect("a whole JSON line");
        }
        done.lines().count()
    };
    let total = eventually("every line", || {
        let n = count(&e.log_path) + rotated.iter().map(|p| count(p)).sum::<usize>();
        (n >= sent).then_some(n)
    });
    assert_eq!(total, sent, "lines across the rotated files");
    for p in &rotated {
        assert!(count(p) > 0, "{} got no lines", p.display());
    }
    assert_no_panic(&e);
}

/// While the log cannot be written, HTTP, CONNECT and DNS all fail closed
/// (503, 503, REFUSED) and nothing reaches a destination or the upstream
/// DNS; when it can again, every refusal's line is written.
#[test]
fn a_failing_log_sink_fails_closed_and_loses_no_line() {
    let fifo = log_fifo();
    let first_reader = fifo.open_reader();
    let l = crate::support::lab()
        .names(&["busy.test"])
        .egressd(|b| b.log(fifo.arg()))
        .start(|ports| exception("busy.test", ports.origin));
    let (e, origin, dns, p) = (&l.e, &l.origin, &l.dns, l.port());
    drop(first_reader.join().unwrap()); // writes now fail with EPIPE
    eventually("failing closed", || {
        let r = try_request(
            e.proxy,
            get_raw(&format!("http://busy.test:{p}/")).as_bytes(),
        )?;
        (r.status == 503).then_some(())
    });
    let before_origin = origin.count();
    let before_dns = dns.names().len();
    let mut refused = 0;
    for _ in 0..3 {
        let r = try_request(
            e.proxy,
            get_raw(&format!("http://busy.test:{p}/")).as_bytes(),
        )
        .unwrap();
        assert_eq!((r.status, r.reason()), (503, Some("log_unavailable")));
        let r = try_request(e.proxy, connect_raw(&format!("busy.test:{p}")).as_bytes()).unwrap();
        assert_eq!((r.status, r.reason()), (503, Some("log_unavailable")));
        let r = ask_udp(e.dns, &dns_query("busy.test.", RecordType::A));
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        refused += 3;
    }
    assert_eq!(origin.count(), before_origin, "a request went through");
    assert_eq!(dns.names().len(), before_dns, "a name was resolved");
    assert!(e.metric("egressd_log_write_errors_total").unwrap() >= 1.0);
    // A reader comes back: the held lines are written.
    let got = fifo.collect();
    let lines = eventually("the held lines", || {
        let text = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines
            .iter()
            .filter(|l| l["reason"] == "log_unavailable")
            .count()
            >= refused)
            .then_some(lines)
    });
    let by_proto = |p: &str| {
        lines
            .iter()
            .filter(|l| l["reason"] == "log_unavailable" && l["proto"] == p)
            .count()
    };
    // The probe requests while waiting to fail closed add http lines.
    assert!(by_proto("http") >= 3);
    assert_eq!(by_proto("connect"), 3);
    assert_eq!(by_proto("dns"), 3);
    assert_no_panic(e);
}

/// A client that goes away while egressd waits for the origin's answer:
/// the request reached the origin, so it must have its line.
#[test]
fn a_client_gone_before_the_origin_answers_still_gets_a_line() {
    let slow = raw_origin(|r| {
        Act::Delay(
            Duration::from_millis(800),
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}",
                r.target.len(),
                r.target
            )
            .into_bytes(),
        )
    });
    let l = lab_with(slow)
        .names(&["slow.test"])
        .start(|ports| exception("slow.test", ports.origin));
    let (e, slow, p) = (&l.e, &l.origin, l.port());
    let mut s = connect(e.proxy);
    s.write_all(get_raw(&format!("http://slow.test:{p}/abandoned")).as_bytes())
        .unwrap();
    eventually("the origin to get the request", || {
        (!slow.requests().is_empty()).then_some(())
    });
    drop(s);
    let line = eventually("the abandoned request's line", || {
        complete_lines(e)
            .into_iter()
            .find(|l| l["path"] == "/abandoned")
    });
    assert_eq!(line["decision"], "allow");
    assert_no_panic(e);
}

/// The same while egressd is still resolving the destination: a CONNECT
/// (and a plain request) whose client leaves during a slow lookup.
#[test]
fn a_client_gone_during_the_lookup_still_gets_a_line() {
    let silent = scripted_dns(|_, _| DnsAct::Silent);
    let e = egressd()
        .policy("p.yaml", &exception("slow.test", 443).yaml())
        .dns(silent.addr)
        .start();
    for raw in [
        connect_raw("slow.test:443"),
        get_raw("http://slow.test:443/abandoned"),
    ] {
        let mut s = connect(e.proxy);
        s.write_all(raw.as_bytes()).unwrap();
        let before = silent.names().len();
        eventually("egressd to ask upstream", || {
            (silent.names().len() > before).then_some(())
        });
        drop(s);
    }
    let lines = eventually("two lines", || {
        let l = complete_lines(&e);
        (l.len() >= 2).then_some(l)
    });
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_no_panic(&e);
}
