//! What `body:` rules add to a request (DESIGN "Writes on allowed hosts"):
//! the judgement of a 100 KiB body, read whole, by a JSON rule (three
//! pointers on a REST pull request) and by a GraphQL rule (a
//! `createPullRequest` mutation with two pointers into its variables,
//! and a 100 KiB query document). `serde_json/100KiB` is serde_json's
//! plain read of the same JSON, the floor any JSON rule stands on.
//!
//! `cargo bench --bench body_rules` (add `-- --quick` for a rough pass).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use egressd::policy::body::BodyRules;
use egressd::policy::{from_yaml, Policy};
use egressd::writes::body::judge;

const SIZE: usize = 100 << 10;

fn policy() -> Policy {
    from_yaml(
        "exceptions:\n  - id: pr\n    owner: o\n    reason: r\n    hosts: [api.test]\n    methods: [POST]\n    body:\n      json: { /head: agent/*, /base: main, /draft: true }\n  - id: gql\n    owner: o\n    reason: r\n    hosts: [api.test]\n    methods: [POST]\n    body:\n      graphql: { queries: true, mutations: [createPullRequest] }\n      json: { /variables/input/headRefName: agent/*, /variables/input/draft: true }\n  - id: read\n    owner: o\n    reason: r\n    hosts: [api.test]\n    methods: [POST]\n    body: { graphql: { queries: true } }\n",
    )
    .expect("the bench policy loads")
}

/// A pull request whose description and labels make it `SIZE` bytes.
fn rest_body() -> Vec<u8> {
    let mut labels = Vec::new();
    let mut v = serde_json::json!({
        "title": "fix a typo", "head": "agent/fix-typo", "base": "main", "draft": true,
        "maintainer_can_modify": false,
    });
    let mut n = 0;
    while serde_json::to_vec(&v).unwrap().len() < SIZE / 2 {
        labels.push(serde_json::json!({"name": format!("label-{n}"), "color": "ededed", "id": n}));
        n += 1;
        v["labels"] = serde_json::Value::Array(labels.clone());
    }
    let len = serde_json::to_vec(&v).unwrap().len();
    v["body"] =
        serde_json::Value::String("line of a pull request description\n".repeat((SIZE - len) / 36));
    serde_json::to_vec(&v).unwrap()
}

const CREATE: &str = "mutation CreatePR($input: CreatePullRequestInput!) { createPullRequest(input: $input) { pullRequest { number url } } }";

/// `createPullRequest` whose body variable makes it `SIZE` bytes.
fn graphql_vars_body() -> Vec<u8> {
    let text = "line of a pull request description\n".repeat((SIZE - 300) / 36);
    serde_json::to_vec(&serde_json::json!({
        "query": CREATE, "operationName": "CreatePR",
        "variables": {"input": {"repositoryId": "R_1", "baseRefName": "main",
            "headRefName": "agent/x", "title": "t", "draft": true, "body": text}}
    }))
    .unwrap()
}

/// A query document of `SIZE` bytes (many aliased fields, as a tool that
/// batches reads writes them).
fn graphql_doc_body() -> Vec<u8> {
    let mut q = String::from("query Many {");
    let mut i = 0;
    // Each field's four quotes are escaped in the JSON: count them too.
    while q.len() + 4 * i < SIZE - 200 {
        q.push_str(&format!(
            " pr{i}: repository(owner: \"acme\", name: \"widgets\") {{ pullRequest(number: {i}) {{ title state }} }}"
        ));
        i += 1;
    }
    q.push_str(" }");
    serde_json::to_vec(&serde_json::json!({"query": q, "variables": {}})).unwrap()
}

fn rules<'p>(p: &'p Policy, id: &str) -> &'p BodyRules {
    p.exception(id).and_then(|e| e.body()).expect("rules")
}

fn bench(c: &mut Criterion) {
    let p = policy();
    let mut g = c.benchmark_group("body");
    g.sample_size(50).measurement_time(Duration::from_secs(4));
    let rest = rest_body();
    let vars = graphql_vars_body();
    let doc = graphql_doc_body();
    for (name, body) in [
        ("rest", &rest),
        ("graphql_vars", &vars),
        ("graphql_doc", &doc),
    ] {
        assert!(
            body.len() >= SIZE - 2048 && body.len() <= SIZE + 2048,
            "{name}: {}",
            body.len()
        );
    }
    assert!(judge(rules(&p, "pr"), &rest).is_ok());
    assert!(judge(rules(&p, "gql"), &vars).is_ok());
    let read = judge(rules(&p, "read"), &doc);
    assert!(read.is_ok(), "{read:?}");
    g.bench_function("serde_json/100KiB", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&rest)).unwrap())
    });
    g.bench_function("json_rule/100KiB", |b| {
        b.iter(|| judge(rules(&p, "pr"), black_box(&rest)))
    });
    g.bench_function("graphql_rule_vars/100KiB", |b| {
        b.iter(|| judge(rules(&p, "gql"), black_box(&vars)))
    });
    g.bench_function("graphql_rule_doc/100KiB", |b| {
        b.iter(|| judge(rules(&p, "read"), black_box(&doc)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
