//! What writing one decision line costs, in each `--log-format`: egressd's
//! own line (the hot path every request pays) and the OCSF event; and, for
//! a denied and an allowed DNS query (the cheapest requests, where the line
//! is the largest share), the line alone and the whole of
//! `Recorder::record`: the line, its metrics and the hand-off to the log
//! writer thread (which writes to a file in a temporary directory).
//!
//! `cargo bench --bench log_line` (add `-- --quick` for a rough pass).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use egressd::log::{LogSink, LogTarget};
use egressd::metrics::Metrics;
use egressd::policy::{Logged, Mode, Proto, Reason};
use egressd::record::{Event, Recorder};

/// A typical allowed CONNECT and a denied plain-HTTP request.
fn events() -> [Event; 2] {
    let mut a = Event::new(Proto::Connect, "10.8.3.7:51234".parse().unwrap());
    a.ts_ms = 1_795_982_400_123;
    a.client = Arc::from("ci-runner");
    a.host = Some("files.pythonhosted.org".into());
    a.port = Some(443);
    a.addr = Some("151.101.0.223:443".parse().unwrap());
    a.method = Some("CONNECT".into());
    a.decision = Logged::Allow;
    a.reason = Reason::Exception;
    a.exception = Some(Arc::from("pypi"));
    a.owner = Some(Arc::from("python-platform"));
    a.status = Some(200);
    a.bytes_up = 512;
    a.bytes_down = 81_234;
    a.duration_ms = 120;
    let mut d = Event::new(Proto::Http, "10.8.3.9:40000".parse().unwrap());
    d.ts_ms = 1_795_982_400_456;
    d.host = Some("telemetry.example.com".into());
    d.port = Some(80);
    d.method = Some("POST".into());
    d.path = Some("/v1/collect".into());
    d.set_denied(Reason::NoException);
    d.status = Some(403);
    [a, d]
}

/// A denied and an allowed (cached) DNS query, as the DNS front-end fills
/// them in.
fn dns_events() -> [Event; 2] {
    let mut d = Event::new(Proto::Dns, "127.0.0.1:40123".parse().unwrap());
    d.ts_ms = 1_795_982_400_789;
    d.host = Some("n417.denied.test".into());
    d.qname = Some("n417.denied.test".into());
    d.qtype = Some("A".into());
    d.set_denied(Reason::NoException);
    d.mode = Mode::Enforce;
    d.rcode = Some("REFUSED".into());
    let mut a = d.clone();
    a.host = Some("n417.allowed.test".into());
    a.qname = Some("n417.allowed.test".into());
    a.decision = Logged::Allow;
    a.reason = Reason::Exception;
    a.exception = Some(Arc::from("allow-417"));
    a.owner = Some(Arc::from("bench"));
    a.rcode = Some("NOERROR".into());
    [d, a]
}

fn dns(c: &mut Criterion) {
    let mut g = c.benchmark_group("log_line_dns");
    g.sample_size(50).measurement_time(Duration::from_secs(3));
    let [denied, allowed] = dns_events();
    for (name, ev) in [("denied", &denied), ("allowed", &allowed)] {
        g.bench_function(format!("line/{name}"), |b| {
            let mut out = Vec::with_capacity(512);
            b.iter(|| {
                out.clear();
                ev.write_json(&mut out);
                black_box(&out);
            })
        });
    }
    let dir = tempfile::tempdir().unwrap();
    let metrics = Metrics::new();
    let sink = LogSink::start(LogTarget::File(dir.path().join("log")), metrics.clone()).unwrap();
    let rec = Recorder::new(sink.clone(), metrics);
    for (name, ev) in [("denied", &denied), ("allowed", &allowed)] {
        g.bench_function(format!("record/{name}"), |b| {
            let mut ev = ev.clone();
            b.iter(|| {
                ev.started = Some(std::time::Instant::now());
                rec.record_mut(black_box(&mut ev));
            })
        });
    }
    g.finish();
    assert!(sink.flush(Duration::from_secs(10)));
}

fn line(c: &mut Criterion) {
    let evs = events();
    let mut g = c.benchmark_group("log_line");
    g.sample_size(50).measurement_time(Duration::from_secs(3));
    g.bench_function("egressd", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(512);
            for e in &evs {
                e.write_json(&mut out);
            }
            black_box(out)
        })
    });
    g.bench_function("ocsf", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(512);
            for e in &evs {
                e.write_ocsf(&mut out);
            }
            black_box(out)
        })
    });
    g.finish();
}

criterion_group!(benches, line, dns);
criterion_main!(benches);
