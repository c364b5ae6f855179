//! What writing one decision line costs, in each `--log-format`: egressd's
//! own line (the hot path every request pays) and the OCSF event.
//!
//! `cargo bench --bench log_line` (add `-- --quick` for a rough pass).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use egressd::policy::{Logged, Proto, Reason};
use egressd::record::Event;

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

criterion_group!(benches, line);
criterion_main!(benches);
