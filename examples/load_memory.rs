//! What loading a policy costs, stage by stage: wall time and resident
//! memory (/proc/self/status VmRSS, and the peak VmHWM) after reading the
//! files, after compiling them, after the per-exception metric series
//! exist, and once the pages the compile freed are returned (what `serve`
//! holds when it is ready). Not a benchmark of record (that is benches/load/run's reload
//! section and `cargo bench --bench decide`); a probe for where memory goes.
//!
//! `cargo run --release --example load_memory -- POLICY [--twice]`
//! (`--twice` compiles a second time from scratch, as a SIGHUP reload does, and swaps).

use std::path::PathBuf;
use std::time::Instant;

use egressd::metrics::Metrics;
use egressd::policy::{self, PolicyHandle};

fn status(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn report(stage: &str, t0: Instant) {
    println!(
        "{stage:<22} {:>8.1} ms  RSS {:>6.1} MiB  peak {:>6.1} MiB",
        t0.elapsed().as_secs_f64() * 1e3,
        status("VmRSS:") as f64 / 1024.0,
        status("VmHWM:") as f64 / 1024.0
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().expect("usage: load_memory POLICY [--twice]"));
    let twice = args.next().as_deref() == Some("--twice");
    let t0 = Instant::now();
    report("start", t0);
    let sources = policy::read_sources(&path).expect("readable policy");
    report("read", t0);
    let p = std::sync::Arc::new(
        policy::compile(&sources, &|n| std::env::var(n).ok()).expect("valid policy"),
    );
    drop(sources);
    report("compiled", t0);
    let metrics = Metrics::new();
    metrics.sync_policy(&p);
    report("metric series", t0);
    egressd::reload::release_freed_memory();
    report("freed pages returned", t0);
    println!("{} exceptions", p.exceptions.len());
    let handle = PolicyHandle::new(p);
    if twice {
        let t1 = Instant::now();
        let sources = policy::read_sources(&path).expect("readable policy");
        let p = std::sync::Arc::new(
            policy::compile(&sources, &|n| std::env::var(n).ok()).expect("valid policy"),
        );
        drop(sources);
        report("recompiled", t1);
        metrics.sync_policy(&p);
        report("metric series again", t1);
        drop(handle.swap(p));
        report("old policy freed", t1);
    }
}
