//! Reload in each write pattern, invalid edits, the decision-log sink
//! failing closed, and metrics after traffic.

use std::os::unix::fs::symlink;

use crate::support::*;

/// Exceptions `(id, host)` on `port`, each owned by `team-<id>`.
fn doc(port: u16, excs: &[(&str, &str)]) -> String {
    excs.iter()
        .fold(policy(), |p, (id, host)| {
            p.exception(id)
                .owner(&format!("team-{id}"))
                .reason(&format!("test {id}"))
                .host(host)
                .cidr(LOOPBACK)
                .port(port)
        })
        .yaml()
}

fn status(e: &Egressd, host: &str, port: u16) -> u16 {
    e.get(&format!("http://{host}:{port}/")).status
}

fn until_status(e: &Egressd, host: &str, port: u16, want: u16) {
    eventually(&format!("{host} → {want}"), || {
        (status(e, host, port) == want).then_some(())
    });
}

/// An origin that a.test, b.test and c.test resolve to; egressd is
/// started by each test, with its own policy files.
fn setup() -> LabBuilder<Origin> {
    lab().names(&["a.test", "b.test", "c.test"])
}

#[test]
fn reload_in_place_write_and_atomic_rename_and_file_removal() {
    let l = setup().start_with(|ports, b| {
        b.policy("a.yaml", &doc(ports.origin, &[("a", "a.test")]))
            .policy("b.yaml", &doc(ports.origin, &[("b", "b.test")]))
    });
    let (e, p) = (&l.e, l.port());
    assert_eq!(status(e, "a.test", p), 200);
    assert_eq!(status(e, "c.test", p), 403);
    // In-place write.
    std::fs::write(
        e.policy_dir.join("a.yaml"),
        doc(p, &[("a", "a.test"), ("c", "c.test")]),
    )
    .unwrap();
    until_status(e, "c.test", p, 200);
    // Editor-style atomic rename.
    atomic_write(&e.policy_dir.join("a.yaml"), &doc(p, &[("c", "c.test")]));
    until_status(e, "a.test", p, 403);
    assert_eq!(status(e, "c.test", p), 200);
    // Removing a file from the directory is a valid change.
    std::fs::remove_file(e.policy_dir.join("b.yaml")).unwrap();
    until_status(e, "b.test", p, 403);
    let m = e.metrics_text();
    assert!(
        metric_value(
            &m,
            r#"egressd_exception_hits_total{exception="b",owner="team-b"}"#
        )
        .is_none(),
        "removed exception's series kept"
    );
    assert_eq!(metric_value(&m, "egressd_policy_exceptions"), Some(1.0));
}

#[test]
fn reload_follows_a_kubernetes_style_symlink_swap() {
    // ConfigMap layout: policy/a.yaml → ..data/a.yaml, ..data → ..v1
    let l = setup().start_with(|ports, b| {
        b.policy("placeholder.yaml", &doc(ports.origin, &[("x", "x.test")]))
    });
    let (e, p) = (&l.e, l.port());
    let dir = &e.policy_dir;
    std::fs::create_dir(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/a.yaml"), doc(p, &[("a", "a.test")])).unwrap();
    symlink("..v1", dir.join("..data")).unwrap();
    symlink("..data/a.yaml", dir.join("a.yaml")).unwrap();
    std::fs::remove_file(dir.join("placeholder.yaml")).unwrap();
    until_status(e, "a.test", p, 200);
    // The swap: new version dir, then ..data replaced atomically by rename.
    std::fs::create_dir(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2/a.yaml"), doc(p, &[("b", "b.test")])).unwrap();
    symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    until_status(e, "b.test", p, 200);
    assert_eq!(status(e, "a.test", p), 403);
}

#[test]
fn invalid_edit_is_rejected_with_file_line_and_old_policy_serves() {
    let l =
        setup().start_with(|ports, b| b.policy("a.yaml", &doc(ports.origin, &[("a", "a.test")])));
    let (e, p) = (&l.e, l.port());
    let good = doc(p, &[("a", "a.test")]);
    let bad = format!("{good}    hosts_typo: [c.test]\n");
    // The key egressd must point at is on the line after the good ones.
    let at = format!("a.yaml:{}:", good.lines().count() + 1);
    std::fs::write(e.policy_dir.join("a.yaml"), &bad).unwrap();
    eventually("reload error counted", || {
        (e.metric(r#"egressd_policy_reloads_total{result="error"}"#)? >= 1.0).then_some(())
    });
    // stderr is read by another thread: wait for the report to arrive.
    eventually("the error on stderr with file:line", || {
        let err = e.stderr_text();
        (err.contains(&at) && err.contains("hosts_typo")).then_some(())
    });
    assert_eq!(status(e, "a.test", p), 200, "old policy keeps serving");
    // An empty file (a half-written save) is refused too.
    std::fs::write(e.policy_dir.join("a.yaml"), "").unwrap();
    eventually("second error", || {
        (e.metric(r#"egressd_policy_reloads_total{result="error"}"#)? >= 2.0).then_some(())
    });
    assert_eq!(status(e, "a.test", p), 200);
    // The policy path disappearing is an error, not an empty policy.
    std::fs::remove_file(e.policy_dir.join("a.yaml")).unwrap();
    eventually("third error", || {
        (e.metric(r#"egressd_policy_reloads_total{result="error"}"#)? >= 3.0).then_some(())
    });
    assert_eq!(status(e, "a.test", p), 200);
    // And a good edit is picked up afterwards.
    std::fs::write(e.policy_dir.join("a.yaml"), doc(p, &[("b", "b.test")])).unwrap();
    until_status(e, "b.test", p, 200);
}

#[test]
fn sighup_forces_a_reload_and_a_single_file_policy_reloads() {
    let l = setup().start_with(|ports, b| {
        b.policy("only.yaml", &doc(ports.origin, &[("a", "a.test")]))
            .policy_as_file()
    });
    let (e, p) = (&l.e, l.port());
    e.signal("HUP");
    eventually("forced reload", || {
        (e.metric(r#"egressd_policy_reloads_total{result="ok"}"#)? >= 1.0).then_some(())
    });
    atomic_write(&e.policy_dir.join("only.yaml"), &doc(p, &[("b", "b.test")]));
    until_status(e, "b.test", p, 200);
}

#[test]
fn log_sink_failure_fails_closed_with_503_and_counts() {
    let l = setup().start_with(|ports, b| {
        b.policy("a.yaml", &doc(ports.origin, &[("a", "a.test")]))
            .log("/dev/full")
    });
    let (e, o, p) = (&l.e, &l.origin, l.port());
    // The first request's line cannot be written (its answer is cut, not
    // completed off the record); from then on egressd refuses.
    let _ = try_request(
        e.proxy,
        format!("GET http://a.test:{p}/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    eventually("a counted write error", || {
        (e.metric("egressd_log_write_errors_total")? >= 1.0).then_some(())
    });
    let reached = o.count();
    for _ in 0..5 {
        let r = e.get(&format!("http://a.test:{p}/"));
        assert_eq!((r.status, r.reason()), (503, Some("log_unavailable")));
    }
    assert_eq!(
        o.count(),
        reached,
        "requests kept flowing while the log was down"
    );
    let errors = e.metric("egressd_log_write_errors_total").unwrap();
    assert!(errors >= 1.0);
    eventually("stderr report", || {
        e.stderr_text()
            .contains("cannot write decision log")
            .then_some(())
    });
    let ready = http_request(
        e.metrics,
        b"GET /readyz HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(ready.status, 503);
    assert!(
        o.count() <= 1,
        "requests kept flowing while the log was down"
    );
}

#[test]
fn log_sink_recovers_when_writes_work_again() {
    let fifo = log_fifo();
    // A reader must exist before egressd opens the FIFO for writing.
    let reader = fifo.open_reader();
    let l = setup().start_with(|ports, b| {
        b.policy("a.yaml", &doc(ports.origin, &[("a", "a.test")]))
            .log(fifo.arg())
    });
    let (e, p) = (&l.e, l.port());
    let r1 = reader.join().unwrap();
    drop(r1); // the pipe's reader goes away: writes now fail with EPIPE
    eventually("503 after the reader left", || {
        let raw =
            format!("GET http://a.test:{p}/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");
        // The first request after it has its answer cut (no answer).
        let r = try_request(e.proxy, raw.as_bytes())?;
        (r.status == 503).then_some(())
    });
    // A new reader appears: egressd reopens, writes what it held, serves again.
    let got = fifo.collect();
    eventually("200 again", || {
        (status(e, "a.test", p) == 200).then_some(())
    });
    eventually("the held lines written", || {
        String::from_utf8_lossy(&got.lock().unwrap())
            .contains("log_unavailable")
            .then_some(())
    });
}

#[test]
fn metrics_count_traffic_per_exception_with_bounded_labels() {
    let l = setup().start_with(|ports, b| {
        b.policy(
            "a.yaml",
            &doc(ports.origin, &[("a", "a.test"), ("unused", "never.test")]),
        )
    });
    let (e, p) = (&l.e, l.port());
    for _ in 0..3 {
        assert_eq!(status(e, "a.test", p), 200);
    }
    assert_eq!(status(e, "c.test", p), 403);
    e.wait_line("4 lines", |_| e.log_lines().len() >= 4);
    let m = e.metrics_text();
    let v = |s: &str| metric_value(&m, s).unwrap_or_else(|| panic!("no {s} in\n{m}"));
    assert_eq!(
        v(r#"egressd_exception_hits_total{exception="a",owner="team-a"}"#),
        3.0
    );
    assert_eq!(
        v(r#"egressd_exception_hits_total{exception="unused",owner="team-unused"}"#),
        0.0
    );
    assert_eq!(
        v(r#"egressd_requests_total{decision="allow",proto="http"}"#),
        3.0
    );
    assert_eq!(
        v(r#"egressd_requests_total{decision="deny",proto="http"}"#),
        1.0
    );
    assert_eq!(
        v(r#"egressd_denied_total{proto="http",reason="no_exception"}"#),
        1.0
    );
    assert!(v(r#"egressd_exception_last_hit_timestamp_seconds{exception="a"}"#) > 1.7e9);
    assert_eq!(
        v(r#"egressd_exception_last_hit_timestamp_seconds{exception="unused"}"#),
        0.0
    );
    assert_eq!(v("egressd_policy_exceptions"), 2.0);
    assert!(v(r#"egressd_request_duration_seconds_count{proto="http"}"#) >= 4.0);
    assert!(v(r#"egressd_bytes_total{direction="down"}"#) > 0.0);
    assert!(
        !m.contains("a.test") && !m.contains("127.0.0.1"),
        "a destination or address leaked into labels"
    );
    for path in ["/healthz", "/readyz"] {
        let r = http_request(
            e.metrics,
            format!("GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        assert_eq!(r.status, 200, "{path}");
    }
}

#[test]
fn sigusr1_reopens_the_log_after_rotation() {
    let l =
        setup().start_with(|ports, b| b.policy("a.yaml", &doc(ports.origin, &[("a", "a.test")])));
    let (e, p) = (&l.e, l.port());
    assert_eq!(status(e, "a.test", p), 200);
    e.wait_line("first line", |l| l["host"] == "a.test");
    let rotated = e.log_path.with_extension("log.1");
    std::fs::rename(&e.log_path, &rotated).unwrap();
    e.signal("USR1");
    // Lines go to a fresh file at the old path once the reopen is done.
    eventually("a line in the new file", || {
        let _ = status(e, "c.test", p);
        std::fs::read_to_string(&e.log_path)
            .ok()
            .filter(|t| t.contains("c.test"))
    });
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.contains("a.test"), "the rotated file kept its lines");
}
