//! The git gate's cost per MB of pushed pack (issue #38, "the pack walk's
//! cost per MB"): `Pack::parse` (checksum, inflate every object, resolve
//! every delta, hash every object) and the whole judgement of a push
//! (`parse_request` + `judge`: refs, fast-forward, `deny_paths` over every
//! pushed commit's tree), over packs `git pack-objects` writes for a
//! generated history (needs `git`).
//!
//!     cargo bench --bench pack_walk
//!
//! Criterion reports each as time per pack and throughput (MiB/s); the
//! cost per MB is the inverse. Two histories: many small commits (source
//! code: each commit edits a few text files) and few large blobs.

use std::io::Write;
use std::process::{Command, Stdio};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use egressd::policy::git::{glob, PushRules};
use egressd::policy::path::PathSet;
use egressd::writes::git::{judge, parse_request};
use egressd::writes::pack::{Limits, Pack};
use egressd::writes::pktline;

/// A deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `lines` lines of source-like text: words from a small vocabulary (so
/// it compresses about as code does) with random numbers in it.
fn text(rng: &mut Rng, lines: usize) -> String {
    const WORDS: &[&str] = &[
        "let", "fn", "self", "return", "match", "if", "else", "value", "count", "buf", "len",
        "Some", "None", "Ok", "Err", "=>", "{", "}", "(", ")", ";", "&mut", "pub", "struct",
    ];
    let mut s = String::new();
    for _ in 0..lines {
        let n = 3 + rng.next() % 8;
        for _ in 0..n {
            s.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
            s.push(' ');
        }
        s.push_str(&format!("{}\n", rng.next() % 100_000));
    }
    s
}

/// A history of `commits` commits on a fresh repository, each editing
/// `files_per_commit` of `files` text files of about `lines` lines (every
/// tenth commit also in `src/ci/`), and the pack `git pack-objects`
/// writes for all of it, with the push body around it.
fn history(
    commits: usize,
    files: usize,
    files_per_commit: usize,
    lines: usize,
) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .current_dir(dir.path())
            .args(args)
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        out.stdout
    };
    git(&["init", "-q", "-b", "main"]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut bodies: Vec<String> = (0..files).map(|_| text(&mut rng, lines)).collect();
    let mut stream = Vec::new();
    for c in 0..commits {
        writeln!(stream, "commit refs/heads/main").unwrap();
        writeln!(stream, "committer bench <b@x> {} +0000", 1_700_000_000 + c).unwrap();
        let msg = format!("change {c}\n");
        write!(stream, "data {}\n{msg}", msg.len()).unwrap();
        for _ in 0..files_per_commit {
            let f = (rng.next() % files as u64) as usize;
            // Replace a tenth of the file's lines: a delta against its
            // last version.
            let mut ls: Vec<String> = bodies[f].lines().map(str::to_string).collect();
            for _ in 0..ls.len().div_ceil(10) {
                let i = (rng.next() % ls.len() as u64) as usize;
                ls[i] = text(&mut rng, 1).trim_end().to_string();
            }
            bodies[f] = ls.join("\n") + "\n";
            let dir = if c % 10 == 0 { "src/ci" } else { "src" };
            let path = format!("{dir}/f{:04}.rs", f);
            writeln!(stream, "M 100644 inline {path}").unwrap();
            write!(stream, "data {}\n{}", bodies[f].len(), bodies[f]).unwrap();
        }
        writeln!(stream).unwrap();
    }
    let mut fi = Command::new("git")
        .current_dir(dir.path())
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    fi.stdin.take().unwrap().write_all(&stream).unwrap();
    assert!(fi.wait().unwrap().success());
    let head = String::from_utf8(git(&["rev-parse", "main"])).unwrap();
    let mut po = Command::new("git")
        .current_dir(dir.path())
        .args([
            "pack-objects",
            "--stdout",
            "--revs",
            "--delta-base-offset",
            "-q",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    po.stdin.take().unwrap().write_all(head.as_bytes()).unwrap();
    let pack = po.wait_with_output().unwrap();
    assert!(pack.status.success());
    let mut body = Vec::new();
    let line = format!(
        "{} {} refs/heads/agent/bench\0report-status side-band-64k\n",
        "0".repeat(40),
        head.trim()
    );
    pktline::write(&mut body, line.as_bytes());
    pktline::flush(&mut body);
    body.extend_from_slice(&pack.stdout);
    (pack.stdout, body)
}

fn rules() -> PushRules {
    let deny = [".github/workflows/**", "src/ci/deny.yml"];
    PushRules {
        ref_patterns: vec!["refs/heads/agent/**".into()].into(),
        refs: PathSet::new(vec![glob("refs/heads/agent/**").unwrap()]),
        force: false,
        delete: false,
        deny_path_patterns: deny.iter().map(|s| s.to_string()).collect(),
        deny_paths: PathSet::new(deny.iter().map(|d| glob(d).unwrap()).collect()),
        max_bytes: 1 << 30,
    }
}

fn bench(c: &mut Criterion) {
    let rules = rules();
    let mut g = c.benchmark_group("pack");
    g.sample_size(10);
    for (name, commits, files, per, lines) in [
        // Source history: 2,000 commits editing two of 300 files each.
        ("source-2000-commits", 2000, 300, 2, 120),
        // Few commits of large files.
        ("large-files-50-commits", 50, 50, 10, 4000),
    ] {
        let (pack, body) = history(commits, files, per, lines);
        eprintln!(
            "{name}: pack {:.1} MiB, {} objects",
            pack.len() as f64 / (1 << 20) as f64,
            u32::from_be_bytes(pack[8..12].try_into().unwrap())
        );
        g.throughput(Throughput::Bytes(pack.len() as u64));
        g.bench_with_input(BenchmarkId::new("parse", name), &pack, |b, pack| {
            b.iter(|| {
                let p = Pack::parse(pack, Limits::for_pack(pack.len())).unwrap();
                assert_eq!(p.unresolved, 0);
                p
            })
        });
        g.bench_with_input(BenchmarkId::new("judge", name), &body, |b, body| {
            b.iter(|| {
                let req = parse_request(body).unwrap();
                let j = judge(&rules, &req);
                assert!(j.allowed(), "{:?}", j.refused);
                j
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
