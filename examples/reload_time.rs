//! What a reload costs when one file of a large policy directory changes:
//! wall time of [`Reloader::reload`] (read, digest, compile, metric series,
//! swap and free, the whole path a watcher event takes), and resident
//! memory (/proc/self/status VmRSS, and the peak VmHWM) after the first
//! load and after the reloads. Not a benchmark of record; a reproducible
//! probe for the reload figures in docs/performance.md.
//!
//! The policy is written into a fresh temporary directory: `00-settings.yaml`
//! (as `benches/load/run` writes it) and FILES files of PER_FILE exceptions
//! each, hosts as that generator writes them (exact `hNNNNN.exampleNNNNN.test`
//! names, every tenth a `*.exampleNNNNN.test` wildcard, each with
//! `cidrs: [127.0.0.0/8]`). Each round rewrites one file in the middle (one
//! exception's reason changes), renames it into place as a deploy would,
//! and reloads.
//!
//! `cargo run --release --example reload_time -- [--files 100] [--per-file 1000]
//! [--rounds 9] [--forced]` (`--forced` reloads as SIGHUP does).
//! `--write DIR` only writes the policy into DIR (for `egressd serve`:
//! `--files 1 --per-file 100000 --write DIR` is the 100k-exception policy
//! of the start-up memory figure).

use std::path::Path;
use std::time::Instant;

use egressd::metrics::Metrics;
use egressd::policy::{self, PolicyHandle};
use egressd::reload::{release_freed_memory, ReloadOutcome, Reloader};

fn status(key: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// One file of exceptions `first..first + n`; `round` goes into the first
/// exception's reason, so each round's file differs from the last.
fn exceptions_file(first: usize, n: usize, round: usize) -> String {
    let mut y = String::with_capacity(n * 130);
    y.push_str("exceptions:\n");
    for i in first..first + n {
        let host = if i % 10 != 0 {
            format!("h{i:05}.example{i:05}.test")
        } else {
            format!("\"*.example{i:05}.test\"")
        };
        let edit = if i == first && round > 0 {
            format!(" (edit {round})")
        } else {
            String::new()
        };
        y.push_str(&format!(
            "  - id: e{i}\n    owner: team{}\n    reason: benchmark filler {i}{edit}\n    hosts: [{host}]\n    cidrs: [127.0.0.0/8]\n",
            i % 50
        ));
    }
    y
}

/// Written beside the target and renamed over it (a hidden name, which
/// the policy reader skips).
fn write_atomically(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write policy file");
    std::fs::rename(&tmp, dir.join(name)).expect("rename policy file");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (mut files, mut per_file, mut rounds, mut forced) = (100usize, 1000usize, 9usize, false);
    let mut write_to = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = || -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .expect("a number after the flag")
        };
        match a.as_str() {
            "--files" => files = num(),
            "--per-file" => per_file = num(),
            "--rounds" => rounds = num(),
            "--forced" => forced = true,
            "--write" => write_to = Some(args.next().expect("a directory after --write")),
            _ => panic!(
                "usage: reload_time [--files N] [--per-file N] [--rounds N] [--forced] [--write DIR]"
            ),
        }
    }
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir: &Path = match &write_to {
        Some(d) => {
            std::fs::create_dir_all(d).expect("create the policy directory");
            Path::new(d)
        }
        None => tmp.path(),
    };
    let name = |f: usize| format!("{:03}-exceptions.yaml", f + 10);
    write_atomically(
        dir,
        "00-settings.yaml",
        "settings:\n  mode: enforce\n  contact: \"#bench\"\n  limits: { connections_per_client: 16384 }\n",
    );
    for f in 0..files {
        write_atomically(dir, &name(f), &exceptions_file(f * per_file, per_file, 0));
    }
    if write_to.is_some() {
        return;
    }

    let t0 = Instant::now();
    let p = std::sync::Arc::new(policy::load(dir).expect("valid policy"));
    let metrics = Metrics::new();
    metrics.sync_policy(&p);
    release_freed_memory();
    println!(
        "first load: {} exceptions in {} files, {:.0} ms; RSS {:.1} MiB, peak {:.1} MiB",
        p.exceptions.len(),
        p.files.len(),
        t0.elapsed().as_secs_f64() * 1e3,
        status("VmRSS:"),
        status("VmHWM:")
    );
    let handle = PolicyHandle::new(p);
    let mut reloader = Reloader::new(dir.to_path_buf(), handle.clone(), metrics);

    let changed = name(files / 2);
    let first = files / 2 * per_file;
    let mut ms = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        write_atomically(dir, &changed, &exceptions_file(first, per_file, round));
        let t = Instant::now();
        let outcome = reloader.reload(forced);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            matches!(outcome, ReloadOutcome::Swapped { .. }),
            "{outcome:?}"
        );
    }
    let e = handle.snapshot();
    assert!(e
        .exception(&format!("e{first}"))
        .is_some_and(|e| e.reason.ends_with(&format!("(edit {rounds})"))));
    println!(
        "reload after changing 1 of {} files{}: median {:.1} ms (min {:.1}, max {:.1}) over {rounds}; RSS {:.1} MiB, peak {:.1} MiB",
        files + 1,
        if forced { " (forced)" } else { "" },
        median(&mut ms),
        ms[0],
        ms[ms.len() - 1],
        status("VmRSS:"),
        status("VmHWM:")
    );
}
