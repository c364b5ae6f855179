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
fn graphql_op() {
    assert!(replay("graphql_op", DIRS, harness::graphql_op::run) >= 10);
}

#[test]
fn git_push() {
    assert!(replay("git_push", DIRS, harness::git_push::run) >= 5);
}

/// The git gate's readers on many pushes near real ones: each seed (real
/// `git pack-objects` packs behind ref-update commands) with bytes
/// replaced, inserted, removed or cut, by a fixed-seed generator. The
/// harness's invariants hold on each (no panic, all or nothing).
#[test]
fn git_push_on_mutated_pushes() {
    let seeds: Vec<Vec<u8>> = inputs(&["seeds"], "git_push")
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .filter(|s| s.len() > 8)
        .collect();
    assert!(seeds.len() >= 4);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for round in 0..3000 {
        let mut p = seeds[round % seeds.len()].clone();
        for _ in 0..1 + next(4) {
            let at = next(p.len());
            match next(4) {
                0 => p[at] = next(256) as u8,
                1 => p.insert(at, next(256) as u8),
                2 if p.len() > 1 => {
                    p.remove(at);
                }
                _ => p.truncate(at.max(1)),
            }
        }
        let r = std::panic::catch_unwind(|| harness::git_push::run(&p));
        assert!(r.is_ok(), "round {round} breaks an invariant");
    }
}

#[test]
fn dns_packet() {
    assert!(replay("dns_packet", DIRS, harness::dns_packet::run) > 0);
}

#[test]
fn package_classify() {
    assert!(replay("package_classify", DIRS, harness::package_classify::run) > 0);
}

#[test]
fn http1_fast() {
    assert!(replay("http1_fast", DIRS, harness::http1_fast::run) > 0);
}

/// The fast path against hyper on many heads near the ones clients send:
/// each seed mutated (bytes replaced, inserted, removed; header lines
/// doubled, cased, dropped) by a fixed-seed generator. Every head the fast
/// path takes must read the same to hyper (`harness::http1_fast`); the
/// count of heads it took keeps the test from passing by taking none.
#[test]
fn http1_fast_agrees_with_hyper_on_mutated_heads() {
    const INTERESTING: &[u8] = b"\r\n \t:;,_-@#?%/\\\"\x00\x7f\x80\xffaAzZ09.[]";
    let seeds: Vec<Vec<u8>> = inputs(&["seeds"], "http1_fast")
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert!(!seeds.is_empty());
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let (mut tried, mut taken) = (0, 0);
    for round in 0..6000 {
        let mut h = seeds[round % seeds.len()].clone();
        for _ in 0..1 + next(3) {
            let at = next(h.len());
            match next(6) {
                0 => h[at] = INTERESTING[next(INTERESTING.len())],
                1 => h.insert(at, INTERESTING[next(INTERESTING.len())]),
                2 if h.len() > 1 => {
                    h.remove(at);
                }
                3 => h[at] = h[at].to_ascii_uppercase(),
                4 => {
                    // A header line again, elsewhere in the head.
                    let lines: Vec<usize> = (1..h.len()).filter(|&i| h[i - 1] == b'\n').collect();
                    if lines.len() > 1 {
                        let from = lines[next(lines.len() - 1)];
                        let end = h[from..]
                            .iter()
                            .position(|b| *b == b'\n')
                            .map(|e| from + e + 1);
                        if let Some(end) = end {
                            let line = h[from..end].to_vec();
                            let to = lines[next(lines.len())];
                            h.splice(to..to, line);
                        }
                    }
                }
                _ => {
                    let extra: &[u8] = match next(6) {
                        0 => b"Content-Length: 5\r\n",
                        1 => b"Transfer-Encoding: chunked\r\n",
                        2 => b"Content_Length: 5\r\n",
                        3 => b"Connection: close, x-a\r\n",
                        4 => b"Host: other.test\r\n",
                        _ => b" folded\r\n",
                    };
                    let lines: Vec<usize> = (1..h.len()).filter(|&i| h[i - 1] == b'\n').collect();
                    if let Some(&to) = lines.get(next(lines.len().max(1))) {
                        h.splice(to..to, extra.iter().copied());
                    }
                }
            }
        }
        tried += 1;
        if egressd::proxy::fast::reading(&h).is_some() {
            taken += 1;
        }
        let r = std::panic::catch_unwind(|| harness::http1_fast::run(&h));
        assert!(
            r.is_ok(),
            "the fast path and hyper disagree on {:?}",
            String::from_utf8_lossy(&h)
        );
    }
    assert!(
        taken > tried / 10,
        "the fast path took {taken} of {tried} heads"
    );
}
