//! The fuzz targets' inputs as plain tests: every seed (`fuzz/seeds/`) and
//! every input that once broke an invariant (`fuzz/regressions/`) goes
//! through the same check the fuzz target runs (`fuzz/harness/`), so
//! `cargo test` guards them without cargo-fuzz or a nightly toolchain.
//! A local `fuzz/corpus/` (what libFuzzer grew) is replayed too when present.
//!
//! A divergence found by fuzzing lands in `fuzz/regressions/<target>/` with
//! its fix, so it is replayed here for good.

#[path = "../../fuzz/harness/mod.rs"]
mod harness;

use std::path::{Path, PathBuf};

fn inputs(dirs: &[&str], target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(root.join(d).join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_file() && p.extension().is_none_or(|x| x != "py") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Runs `check` on every input of `target`; names the input that fails.
fn replay(target: &str, dirs: &[&str], check: fn(&[u8])) -> usize {
    let files = inputs(dirs, target);
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| check(&data));
        assert!(r.is_ok(), "{target}: {} breaks an invariant", f.display());
    }
    files.len()
}

const DIRS: &[&str] = &["seeds", "regressions", "corpus"];

#[test]
fn policy_load() {
    assert!(replay("policy_load", DIRS, harness::policy_load::run) > 0);
}

#[test]
fn host_parse() {
    assert!(replay("host_parse", DIRS, harness::host_parse::run) > 0);
}

#[test]
fn decide_model() {
    assert!(replay("decide_model", DIRS, harness::decide_model::run) > 0);
}

#[test]
fn dns_packet() {
    assert!(replay("dns_packet", DIRS, harness::dns_packet::run) > 0);
}

#[test]
fn package_classify() {
    assert!(replay("package_classify", DIRS, harness::package_classify::run) > 0);
}
