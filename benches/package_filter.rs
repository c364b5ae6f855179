//! What filtering an index document costs (issue 15's target: a 5 MB npm
//! packument in under 20 ms). The packument is synthetic but shaped like a
//! large real one: 3,300 versions, each manifest ~2.5 KB (dependencies,
//! scripts, dist with integrity, shasum, signatures, tarball), a `time`
//! entry per version, dist-tags. The policy approves one major with a 3-day
//! quarantine, so most versions move under `policyRestrictions` (the most
//! work: every held manifest is copied there) and `latest` is re-pointed.
//!
//! `cargo bench --bench package_filter` (add `-- --quick` for a rough pass).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use egressd::packages::classify::IndexForm;
use egressd::packages::compile::{compile, CompileInput, SetSource};
use egressd::packages::filter::filter;
use egressd::packages::name::normalize;
use egressd::packages::raw::RawPackageSet;
use egressd::packages::Ecosystem;

const NOW: i64 = 1_800_000_000;
const VERSIONS: usize = 3_300;

fn iso(t: i64) -> String {
    egressd::packages::stamp::format_rfc3339(t)
}

fn packument() -> String {
    let mut versions = Vec::with_capacity(VERSIONS);
    let mut times = Vec::with_capacity(VERSIONS);
    for i in 0..VERSIONS {
        let v = format!("{}.{}.{}", i / 400, (i / 20) % 20, i % 20);
        let deps: Vec<String> = (0..25)
            .map(|d| format!("\"dep-number-{d}\":\"^{}.{}.0\"", d % 7, i % 13))
            .collect();
        versions.push(format!(
            "\"{v}\":{{\"name\":\"big-package\",\"version\":\"{v}\",\"description\":\"A package with a long history of releases and many dependencies\",\"main\":\"index.js\",\"scripts\":{{\"test\":\"node test.js\",\"build\":\"tsc -p .\"}},\"dependencies\":{{{}}},\"license\":\"MIT\",\"_id\":\"big-package@{v}\",\"_nodeVersion\":\"20.11.0\",\"_npmVersion\":\"10.2.4\",\"dist\":{{\"integrity\":\"sha512-{}==\",\"shasum\":\"{}\",\"tarball\":\"https://registry.npmjs.org/big-package/-/big-package-{v}.tgz\",\"fileCount\":42,\"unpackedSize\":123456,\"signatures\":[{{\"keyid\":\"SHA256:jl3bwswu80PjjokCgh0o2w5c2U4LhQAE57gj9cz1kzA\",\"sig\":\"MEUCIQ{}\"}}]}},\"maintainers\":[{{\"name\":\"someone\",\"email\":\"someone@example.com\"}}],\"directories\":{{}}}}",
            deps.join(","),
            "A".repeat(86),
            "0".repeat(40),
            "B".repeat(90),
        ));
        times.push(format!(
            "\"{v}\":\"{}\"",
            iso(NOW - (VERSIONS - i) as i64 * 3600 * 6)
        ));
    }
    format!(
        "{{\"_id\":\"big-package\",\"_rev\":\"1234-abcdef\",\"name\":\"big-package\",\"dist-tags\":{{\"latest\":\"4.19.19\",\"next\":\"4.19.19\"}},\"versions\":{{{}}},\"time\":{{\"created\":\"{}\",\"modified\":\"{}\",{}}},\"maintainers\":[],\"readme\":\"{}\",\"license\":\"MIT\"}}",
        versions.join(","),
        iso(0),
        iso(NOW),
        times.join(","),
        "x".repeat(20_000)
    )
}

fn bench(c: &mut Criterion) {
    let yaml = "packages:\n  - id: js\n    owner: o\n    reason: r\n    ecosystem: npm\n    min_age: 3d\n    allow: [\"big-package ^3\"]\n";
    #[derive(serde::Deserialize)]
    struct Doc {
        packages: Vec<RawPackageSet>,
    }
    let doc: Doc = serde_yaml_ng::from_str(yaml).unwrap();
    let file = PathBuf::from("bench.yaml");
    let files = [SetSource {
        file: Path::new(&file),
        text: yaml,
        sets: &doc.packages,
    }];
    let policy = compile(&CompileInput {
        files: &files,
        settings: None,
        clients: &[],
        exception_id: &|_| None,
        expand: &|v| Ok(v.to_string()),
        contact: "#security",
    })
    .unwrap();
    let name = normalize(Ecosystem::Npm, "big-package").unwrap();
    let rules = policy.rules(None, Ecosystem::Npm, &name, NOW);
    let body = packument();
    let f = filter(&rules, IndexForm::NpmFull, body.as_bytes(), None).unwrap();
    eprintln!(
        "packument: {:.2} MB, {} versions hidden, filtered to {:.2} MB",
        body.len() as f64 / 1e6,
        f.hidden.total(),
        f.body.len() as f64 / 1e6
    );
    let mut g = c.benchmark_group("package_filter");
    g.sample_size(30).measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("npm_full_5mb", |b| {
        b.iter(|| filter(&rules, IndexForm::NpmFull, black_box(body.as_bytes()), None).unwrap())
    });
    // What the filter's work is made of, for comparison: validating the
    // document once, and the ETag digest of the output.
    g.bench_function("serde_json_validate_5mb", |b| {
        b.iter(|| {
            serde_json::from_str::<&serde_json::value::RawValue>(black_box(&body))
                .unwrap()
                .get()
                .len()
        })
    });
    g.bench_function("json_document_5mb", |b| {
        b.iter(|| {
            egressd::packages::filter::json::document(black_box(&body))
                .unwrap()
                .members
                .len()
        })
    });
    let top = egressd::packages::filter::json::document(&body).unwrap();
    let versions = top.get("versions").unwrap().value;
    g.bench_function("json_versions_object_5mb", |b| {
        b.iter(|| {
            egressd::packages::filter::json::object(&body, black_box(versions))
                .unwrap()
                .members
                .len()
        })
    });
    let keys: Vec<String> = egressd::packages::filter::json::object(&body, versions)
        .unwrap()
        .members
        .iter()
        .map(|m| m.key.to_string())
        .collect();
    g.bench_function("rules_version_3300", |b| {
        b.iter(|| {
            keys.iter()
                .filter(|k| rules.version(k, Some(NOW - 86400 * 10)).is_ok())
                .count()
        })
    });
    g.bench_function("etag_5mb", |b| {
        b.iter(|| egressd::packages::filter::etag(black_box(body.as_bytes())))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
