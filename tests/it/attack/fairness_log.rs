//! Log volume per client is bounded (issue 41, item 4).
//!
//! Over HTTP/2 a long path is sent once and then referenced from the HPACK
//! table in a few bytes per request: without a bound, each reference cost
//! a line as long as the path (23 times the traffic). Now a logged field
//! is cut (paths at 2 KiB), and past
//! `settings.limits.log_lines_per_client_per_sec` a client's further
//! decisions in a second are summed into one `"event":"rate_limited"` line
//! with counts by decision and reason: every decision is on record as a
//! count, the flood's lines are bounded, and another client's lines are
//! still written one by one.
//!
//! And a connection egressd closes on the header timeout with part of a
//! request head has its line (a slowloris on the proxy port); one that
//! sent nothing made no request and closes quietly.

use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::fairness_h2::{get, h2_through, intercept_lab, p50};
use super::*;

const HOG: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const OTHER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// Lines per client per second in these labs.
const RATE: u64 = 20;
/// The hog's requests, over a few HTTP/2 connections.
const FLOOD: usize = 1200;

fn from(l: &serde_json::Value, ip: Ipv4Addr) -> bool {
    l["src"]
        .as_str()
        .is_some_and(|s| s.starts_with(&format!("{ip}:")) || s == ip.to_string())
}

#[test]
fn an_hpack_referenced_long_path_flood_is_cut_and_summarised() {
    let began = Instant::now();
    // Only /ok/** is allowed: the flood is refused inside the tunnel
    // (`path_not_allowed`), one decision each.
    let il = intercept_lab(
        "/ok/**",
        &format!("{{ log_lines_per_client_per_sec: {RATE} }}"),
    );
    let (l, ca, port) = (&il, &il.ca_pem(), il.port());
    let proxy = l.e.proxy;
    let long = format!("/denied/{}", "a".repeat(3900));
    let log_before = std::fs::metadata(&l.e.log_path).map_or(0, |m| m.len());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // The other client: intercepted GETs of an allowed path, one every
    // 50 ms, while the flood runs.
    let other = rt.spawn({
        let ca = ca.clone();
        async move {
            let mut h2 = h2_through(OTHER, proxy, port, &ca, None).await;
            let mut lat = Vec::new();
            for i in 0..40 {
                let t = Instant::now();
                h2.ready().await.unwrap();
                let r = h2
                    .send_request(get(port, &format!("/ok/{i}")))
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "the other client's request {i}");
                let _ = http_body_util::BodyExt::collect(r.into_body())
                    .await
                    .unwrap();
                lat.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            lat.sort();
            lat
        }
    });

    let flood_start = Instant::now();
    let statuses = rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..4 {
            conns.push(h2_through(HOG, proxy, port, ca, None).await);
        }
        let mut tasks = Vec::new();
        for (c, h2) in conns.into_iter().enumerate() {
            let long = long.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                let mut inflight = tokio::task::JoinSet::new();
                for i in 0..FLOOD / 4 {
                    if inflight.len() >= 50 {
                        got.push(inflight.join_next().await.unwrap().unwrap());
                    }
                    let mut h2 = h2.clone();
                    let path = long.clone();
                    inflight.spawn(async move {
                        h2.ready().await.unwrap();
                        let r = h2.send_request(get(port, &path)).await;
                        let r = r.unwrap_or_else(|e| panic!("conn {c} request {i}: {e}"));
                        r.status().as_u16()
                    });
                }
                while let Some(s) = inflight.join_next().await {
                    got.push(s.unwrap());
                }
                got
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    let flood_secs = flood_start.elapsed().as_secs_f64();
    assert_eq!(statuses.len(), FLOOD);
    assert!(statuses.iter().all(|s| *s == 403), "every request refused");
    let lat = rt.block_on(other).unwrap();

    // Every decision is on record: a line of its own or a count in a
    // summary, once the last second's summary is out.
    let lines = eventually("the flood on record", || {
        let lines = l.e.log_lines();
        let own = lines
            .iter()
            .filter(|x| from(x, HOG) && x["reason"] == "path_not_allowed")
            .count() as u64;
        let summed: u64 = summaries(&lines, HOG)
            .flat_map(|s| s["counts"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["reason"] == "path_not_allowed" && c["decision"] == "deny")
            .map(|c| c["count"].as_u64().unwrap())
            .sum();
        (own + summed >= FLOOD as u64).then_some((lines, own, summed))
    });
    let (lines, own, summed) = lines;
    let log_bytes = std::fs::metadata(&l.e.log_path).unwrap().len() - log_before;
    eprintln!(
        "flood: {FLOOD} requests in {flood_secs:.1}s; {own} lines of their own, {summed} summed \
         in {} rate_limited lines; log grew {log_bytes} bytes ({} per request); other client \
         p50 {:?} max {:?}",
        summaries(&lines, HOG).count(),
        log_bytes / FLOOD as u64,
        p50(&lat),
        lat.last().unwrap()
    );
    assert_eq!(own + summed, FLOOD as u64, "each decision counted once");
    // The hog's own lines are bounded by the burst (ten seconds' worth)
    // and the rate (the seconds the flood took, and one more for the
    // seconds it straddled), each line by the field bounds.
    let secs = flood_secs.ceil() as u64 + 1;
    assert!(
        own <= RATE * 10 + RATE * (secs + 1),
        "{own} lines of the hog's own in {flood_secs:.1}s, past a burst of {} and {RATE} a \
         second",
        RATE * 10
    );
    for x in lines
        .iter()
        .filter(|x| from(x, HOG) && x["path"].is_string())
    {
        let p = x["path"].as_str().unwrap();
        assert!(
            p.len() <= 2048 + 3 && p.ends_with('…'),
            "path of {} bytes",
            p.len()
        );
    }
    assert!(
        log_bytes <= own * 3072 + 4096 * secs + 300 * 40,
        "the log grew {log_bytes} bytes"
    );
    // The metric counts every decision summed (the hog's tunnels' own
    // lines among them), each summary written within a second or so.
    eventually("the metric and the summaries agree", || {
        let all_summed: u64 =
            l.e.log_lines()
                .iter()
                .filter(|x| x["event"] == "rate_limited")
                .map(|x| x["suppressed"].as_u64().unwrap())
                .sum();
        let metric = l.e.metric("egressd_overload_total{what=\"log_rate\"}");
        (all_summed >= summed && metric == Some(all_summed as f64)).then_some(())
    });
    // The other client's requests each have their line.
    let theirs = lines
        .iter()
        .filter(|x| from(x, OTHER) && x["event"].is_null())
        .count();
    assert_eq!(theirs, 40, "the other client's lines, one each");
    assert_eq!(summaries(&lines, OTHER).count(), 0);
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "took {:?}",
        began.elapsed()
    );
}

/// The `rate_limited` summaries of `ip`.
fn summaries(
    lines: &[serde_json::Value],
    ip: Ipv4Addr,
) -> impl Iterator<Item = &serde_json::Value> {
    lines
        .iter()
        .filter(move |x| x["event"] == "rate_limited" && from(x, ip))
}

#[test]
fn a_slowloris_on_the_proxy_port_has_its_line() {
    let l = lab().names(&["allowed.test"]).start(|ports| {
        policy()
            .exception("origin")
            .host("allowed.test")
            .cidr(LOOPBACK)
            .port(ports.origin)
            .setting("limits", "{ header_timeout: 2s }")
    });
    let t = Instant::now();
    // Part of a head, a byte at a time, never finished.
    let mut slow = connect_from(HOG, l.e.proxy);
    slow.write_all(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nX-a: ")
        .unwrap();
    // And a connection that sends nothing at all (closed too).
    let mut silent = connect_from(OTHER, l.e.proxy);
    let dripper = std::thread::spawn(move || {
        for _ in 0..40 {
            if slow.write_all(b"a").is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    let mut b = [0u8; 1];
    assert_eq!(
        silent.read(&mut b).unwrap_or(0),
        0,
        "the silent one is closed"
    );
    let closed = dripper.join().unwrap();
    assert!(closed, "the slowloris is closed by the header timeout");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "closed after {:?}",
        t.elapsed()
    );
    {
        let (ip, what) = (HOG, "the slowloris");
        let line = l.e.wait_line(&format!("{what}'s line"), |x| {
            from(x, ip) && x["reason"] == "malformed"
        });
        assert_eq!(line["decision"], "deny", "{what}: {line}");
        assert!(
            line["error"]
                .as_str()
                .is_some_and(|e| e.contains("header timeout")),
            "{what}: {line}"
        );
    }
    let slow_line = l.e.wait_line("", |x| from(x, HOG));
    assert!(slow_line["bytes_up"].as_u64().unwrap() > 50, "{slow_line}");
    // The silent one sent no request: it closes quietly.
    assert!(l.e.log_lines().iter().all(|x| !from(x, OTHER)));
}
