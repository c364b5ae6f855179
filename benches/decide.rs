//! What one decision costs as a policy grows, what a (re)load costs, and
//! what parsing a request's host costs. Policies are generated as YAML text
//! and compiled through `policy::compile`, the path a real load takes.
//!
//! The mix, per ten exceptions: five exact hosts (two names each), two
//! `*.suffix` wildcards, one `api-*` label glob, one CIDR (/24, /28 or /32)
//! with a name, and one client-scoped exception with methods and paths.
//!
//! `compile/N` is the whole load; `yaml/N` its YAML part alone (the fast
//! front end, `policy::yaml`), `serde_yaml/N` serde_yaml_ng on the same text.
//!
//! `cargo bench --bench decide` (add `-- --quick` for a rough pass). Sample
//! sizes are small so the whole run takes a few minutes on two shared cores.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use egressd::policy::host::{parse_target, Target};
use egressd::policy::Proto;
use egressd::policy::{compile, Policy, Request, Source};

const SIZES: &[usize] = &[1_000, 10_000, 100_000];
/// Mid-2026: before every generated expiry.
const NOW: i64 = 1_780_000_000;

fn policy_yaml(n: usize) -> String {
    let mut y = String::with_capacity(n * 120);
    y.push_str(
        "settings:\n  clients:\n    - id: ci-runner\n      sources: [10.8.0.0/16]\n    \
         - id: agent-a\n      sources: [10.9.0.0/16]\nexceptions:\n",
    );
    for i in 0..n {
        y.push_str(&format!(
            "  - id: e{i}\n    owner: team{}\n    reason: generated\n",
            i % 37
        ));
        match i % 10 {
            0..=4 => y.push_str(&format!(
                "    hosts: [svc{i}.team{}.example{}.com, cdn{i}.example{}.net]\n",
                i % 97,
                i % 1000,
                i % 1000
            )),
            5 | 6 => y.push_str(&format!(
                "    expires: 2030-01-01\n    hosts: [\"*.t{i}.corp{}.net\"]\n    ports: [443]\n",
                i % 50
            )),
            7 => y.push_str(&format!(
                "    expires: 2030-01-01\n    hosts: [\"api-*.r{i}.cloud{}.io\"]\n    ports: [443]\n",
                i % 20
            )),
            8 => {
                let len = [24, 28, 32][i / 10 % 3];
                y.push_str(&format!(
                    "    hosts: [db{i}.example.org]\n    cidrs: [{}/{len}]\n    ports: [443, 5432]\n",
                    cidr_addr(i)
                ))
            }
            _ => y.push_str(&format!(
                "    clients: [\"ci-*\"]\n    hosts: [pkg{i}.mirror{}.example.org]\n    \
                 methods: [GET, HEAD]\n    paths: [\"/v1/**\", \"/simple/*/\"]\n",
                i % 31
            )),
        }
    }
    y
}

/// A distinct public /24 per CIDR exception (44.x.y.0); the address inside
/// it that the hit case asks about is `.0`.
fn cidr_addr(i: usize) -> String {
    let k = i / 10;
    format!("44.{}.{}.0", (k >> 8) & 0xff, k & 0xff)
}

fn build(n: usize) -> Policy {
    let sources = [Source {
        path: PathBuf::from("bench.yaml"),
        text: policy_yaml(n),
        grant: false,
    }];
    compile(&sources, &|_| None).expect("generated policy compiles")
}

/// Index of a generated exception of kind `k` near the middle.
fn mid(n: usize, k: usize) -> usize {
    n / 2 / 10 * 10 + k
}

struct Case {
    name: &'static str,
    proto: Proto,
    target: Target,
    port: u16,
    method: Option<&'static str>,
    path: Option<&'static str>,
    client: Option<u32>,
    /// Expected outcome, checked once so a broken generator is noticed.
    allowed: bool,
}

fn cases(n: usize) -> Vec<Case> {
    let t = |s: &str| parse_target(s).expect("valid bench host");
    let (e, w, g, c, p) = (mid(n, 0), mid(n, 5), mid(n, 7), mid(n, 8), mid(n, 9));
    let exact = format!("svc{e}.team{}.example{}.com", e % 97, e % 1000);
    let case = |name, proto, target, port, allowed| Case {
        name,
        proto,
        target,
        port,
        method: matches!(proto, Proto::Http).then_some("GET"),
        path: matches!(proto, Proto::Http).then_some("/"),
        client: None,
        allowed,
    };
    vec![
        case("http_hit_exact", Proto::Http, t(&exact), 80, true),
        Case {
            path: Some("/v1/packages/x"),
            client: Some(0),
            ..case(
                "http_hit_client_path",
                Proto::Http,
                t(&format!("pkg{p}.mirror{}.example.org", p % 31)),
                80,
                true,
            )
        },
        case("connect_hit_exact", Proto::Connect, t(&exact), 443, true),
        case(
            "connect_hit_wildcard",
            Proto::Connect,
            t(&format!("a.b.t{w}.corp{}.net", w % 50)),
            443,
            true,
        ),
        case(
            "connect_hit_glob",
            Proto::Connect,
            t(&format!("api-eu.r{g}.cloud{}.io", g % 20)),
            443,
            true,
        ),
        case(
            "connect_hit_cidr",
            Proto::Connect,
            t(&cidr_addr(c)),
            443,
            true,
        ),
        case("dns_hit_exact", Proto::Dns, t(&exact), 53, true),
        case(
            "http_miss",
            Proto::Http,
            t("nothing.unknown-domain.org"),
            80,
            false,
        ),
        case("http_miss_port", Proto::Http, t(&exact), 8080, false),
        case(
            "connect_miss_deep",
            Proto::Connect,
            t("a.b.c.d.e.f.g.example5.com"),
            443,
            false,
        ),
        case("connect_miss_ip", Proto::Connect, t("8.8.8.8"), 443, false),
        case(
            "dns_miss",
            Proto::Dns,
            t("x7k2.tunnel.attacker.example"),
            53,
            false,
        ),
    ]
}

fn request(c: &Case) -> Request<'_> {
    Request {
        proto: c.proto,
        client: c.client,
        target: &c.target,
        port: c.port,
        method: c.method.map(Into::into),
        path: c.path,
        qtype: (c.proto == Proto::Dns).then_some(1),
        can_intercept: false,
    }
}

fn decide(cr: &mut Criterion) {
    let mut group = cr.benchmark_group("decide");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for &n in SIZES {
        let policy = build(n);
        for c in cases(n) {
            let req = request(&c);
            assert_eq!(
                policy.decide(&req, NOW).is_allowed(),
                c.allowed,
                "{} at {n}",
                c.name
            );
            group.bench_with_input(BenchmarkId::new(c.name, n), &req, |b, req| {
                b.iter(|| black_box(policy.decide(black_box(req), NOW).verdict))
            });
        }
    }
    group.finish();
}

fn compile_time(cr: &mut Criterion) {
    let mut group = cr.benchmark_group("compile");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    for &n in SIZES {
        let sources = [Source {
            path: PathBuf::from("bench.yaml"),
            text: policy_yaml(n),
            grant: false,
        }];
        group.bench_with_input(BenchmarkId::from_parameter(n), &sources, |b, s| {
            b.iter(|| compile(black_box(s), &|_| None).expect("compiles"))
        });
    }
    group.finish();
}

/// The YAML part of `compile` alone (the raw mirror, host patterns
/// included), so compile's own share can be told apart: `yaml/N` is the
/// front end `compile` uses (`policy::yaml`, which takes these files
/// whole), `serde_yaml/N` serde_yaml_ng on the same text (what `compile`
/// falls back to, and used alone before).
fn yaml_time(cr: &mut Criterion) {
    for (name, fast) in [("yaml", true), ("serde_yaml", false)] {
        let mut group = cr.benchmark_group(name);
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(5));
        for &n in SIZES {
            let text = policy_yaml(n);
            assert!(egressd::policy::yaml::parse(&text).is_some());
            group.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, t| {
                b.iter(|| {
                    if fast {
                        egressd::policy::yaml::parse(black_box(t)).expect("parses")
                    } else {
                        serde_yaml_ng::from_str::<egressd::policy::raw::RawFile>(black_box(t))
                            .expect("parses")
                    }
                })
            });
        }
        group.finish();
    }
}

fn parse(cr: &mut Criterion) {
    let mut group = cr.benchmark_group("parse_target");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (name, input) in [
        ("name", "files.pythonhosted.org"),
        ("name_mixed_case_dot", "Files.PythonHosted.ORG."),
        ("idn", "bücher.example"),
        ("ipv4", "151.101.0.223"),
        ("ipv4_odd", "0x7f.1"),
        ("ipv6_mapped", "[::ffff:169.254.169.254]"),
    ] {
        group.bench_with_input(BenchmarkId::from_parameter(name), input, |b, s| {
            b.iter(|| parse_target(black_box(s)))
        });
    }
    group.finish();
}

criterion_group!(benches, decide, compile_time, yaml_time, parse);
criterion_main!(benches);
