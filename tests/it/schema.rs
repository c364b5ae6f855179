//! The policy's JSON Schema: `egressd schema` prints exactly the shipped
//! file, the schema is valid draft 7, every shipped and example policy
//! passes an independent validator (check-jsonschema), policies that use
//! every key pass it, and each policy in a corpus of mistakes is refused by
//! both the parser and the schema. Every shipped policy file points its
//! editor at the schema.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use egressd::policy::{compile, Source};

use super::validators;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn shipped_schema() -> PathBuf {
    root().join(egressd::cmd::check::schema::SHIPPED_PATH)
}

/// Policy files shipped under policy/ (with its examples), not policy tests.
fn shipped_policies() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root().join("policy")];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                dirs.push(p);
            } else if (name.ends_with(".yaml") || name.ends_with(".yml"))
                && !name.starts_with("tests.")
                && !name.contains(".tests.")
            {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 6, "{out:?}");
    out
}

/// The policies inside ```yaml blocks of the README, the manual (docs/)
/// and the examples' Markdown: those that are whole policy files (start
/// with `settings:` or `exceptions:`).
fn markdown_policies() -> Vec<(String, String)> {
    let mut docs = vec![root().join("README.md")];
    let mut dirs = vec![
        root().join("docs"),
        root().join("examples"),
        root().join("policy"),
    ];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                docs.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for doc in docs {
        let text = fs::read_to_string(&doc).unwrap();
        let mut block: Option<(usize, String)> = None;
        for (n, line) in text.lines().enumerate() {
            match &mut block {
                None if line.trim() == "```yaml" => block = Some((n + 1, String::new())),
                Some((start, body)) if line.trim() == "```" => {
                    let first = body
                        .lines()
                        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                        .unwrap_or("");
                    if first.starts_with("settings:") || first.starts_with("exceptions:") {
                        let rel = doc.strip_prefix(root()).unwrap().display().to_string();
                        out.push((format!("{rel}:{start}"), body.clone()));
                    }
                    block = None;
                }
                Some((_, body)) => {
                    body.push_str(line);
                    body.push('\n');
                }
                None => {}
            }
        }
    }
    out
}

/// What egressd's parser says about one file: `Ok` or its errors.
fn parse(name: &str, text: &str) -> Result<(), String> {
    compile(
        &[Source {
            path: PathBuf::from(name),
            text: text.to_string(),
            // The grants directory's files (`egressd grant` writes them).
            grant: name.starts_with("grant-"),
        }],
        &|_| Some("a-test-secret".to_string()),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

#[test]
fn egressd_schema_prints_the_shipped_file() {
    let o = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shipped = fs::read_to_string(shipped_schema()).unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout) == shipped,
        "{} is not what `egressd schema` prints: regenerate it with \
         `cargo run -q -- schema > {}`",
        egressd::cmd::check::schema::SHIPPED_PATH,
        egressd::cmd::check::schema::SHIPPED_PATH
    );
    let v: serde_json::Value = serde_json::from_str(&shipped).unwrap();
    assert_eq!(v["$schema"], "http://json-schema.org/draft-07/schema#");
    assert_eq!(v["additionalProperties"], false);
    // Descriptions come from the raw types' doc comments.
    let exc = &v["definitions"]["RawException"];
    assert_eq!(exc["additionalProperties"], false);
    assert!(exc["properties"]["owner"]["description"]
        .as_str()
        .unwrap()
        .contains("team answerable"));
    let required: Vec<&str> = exc["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(required, ["id", "owner", "reason"]);
}

/// Every object of the schema refuses unknown keys, and every key has a
/// description: a raw type added without `deny_unknown_fields` or docs
/// shows up here.
#[test]
fn every_object_is_closed_and_every_key_described() {
    let v = egressd::cmd::check::schema::policy_schema();
    let mut objects = 0;
    let mut stack = vec![("$".to_string(), &v)];
    while let Some((at, s)) = stack.pop() {
        if let Some(props) = s.get("properties").and_then(|p| p.as_object()) {
            if s.get("type") == Some(&serde_json::json!("object")) {
                objects += 1;
                let closed = s.get("additionalProperties") == Some(&serde_json::json!(false));
                assert!(closed, "{at} accepts unknown keys");
                for (k, p) in props {
                    assert!(
                        p.get("description").and_then(|d| d.as_str()).is_some(),
                        "{at}.{k} has no description (a /// comment on the field)"
                    );
                }
            }
        }
        match s {
            serde_json::Value::Object(m) => {
                stack.extend(m.iter().map(|(k, x)| (format!("{at}.{k}"), x)));
            }
            serde_json::Value::Array(a) => stack.extend(a.iter().map(|x| (at.clone(), x))),
            _ => {}
        }
    }
    assert!(objects >= 8, "only {objects} objects");
}

#[test]
fn schema_is_valid_draft_7() {
    let tool = validators::check_jsonschema("schema_is_valid_draft_7");
    let o = validators::check_metaschema(&tool, &shipped_schema());
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The `yaml-language-server` modeline, first line of every shipped policy
/// file, points at the shipped schema.
#[test]
fn shipped_policies_point_editors_at_the_schema() {
    let schema = fs::canonicalize(shipped_schema()).unwrap();
    for f in shipped_policies() {
        let text = fs::read_to_string(&f).unwrap();
        let first = text.lines().next().unwrap_or("");
        let rel = first
            .strip_prefix("# yaml-language-server: $schema=")
            .unwrap_or_else(|| panic!("{}: first line is not the modeline: {first}", f.display()));
        let target = fs::canonicalize(f.parent().unwrap().join(rel))
            .unwrap_or_else(|e| panic!("{}: {rel}: {e}", f.display()));
        assert_eq!(target, schema, "{}", f.display());
    }
}

/// Valid policies that between them use every key of the schema, in the
/// spellings the parser accepts (numeric-string ports, Unicode and
/// upper-case hosts, trailing dots, RFC 3339 times, lower-case record types).
const VALID: &[(&str, &str)] = &[
    (
        "everything.yaml",
        r##"settings:
  mode: report
  private_destinations: allow
  stale_after: 30d
  contact: "#security"
  clients:
    - id: ci-runner
      sources: [10.8.0.0/16, "fd00::/8", 192.0.2.7]
    - id: agent-a
      token_sha256: "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"
  dns:
    deny_rcode: nxdomain
    tunnel:
      action: log
      max_name_len: 120
      max_label_len: 50
      alert_unique_names: 200
      alert_bytes: 10000
      alert_window: 10m
      block_bytes: 50000
      daily_bytes: 200000
      block_window: 1h
      cooldown: 15m
    cache_min_ttl: 5s
    cache_max_ttl: 1d
  tls:
    missing_sni: deny
  limits:
    connections_per_client: 256
    header_timeout: 30s
    stall_timeout: 1m
    log_lines_per_client_per_sec: 500
exceptions:
  - id: pypi
    owner: python-platform
    reason: Python packages
    ticket: SEC-1
    expires: 2099-03-01
    clients: ["ci-*"]
    hosts: [pypi.org, "*.pythonhosted.org", "api-*.example.com", PyPI.Example.COM., bücher.example]
    ports: [443, "8443"]
    methods: [GET, head]
    paths: ["/simple/**"]
    dns_types: [TXT, mx, TYPE99]
    inject:
      headers: { Authorization: "Bearer ${env:PYPI_TOKEN}", X-Api-Key: plain }
  - id: lan.range_1
    owner: net
    reason: a lab range
    expires: "2099-01-01T12:00:00Z"
    cidrs: [10.20.0.0/16, "2001:db8::/32"]
  - id: widgets-agent
    owner: platform
    reason: agents push agent branches
    hosts: [git.example.com]
    git:
      repos: ["acme/widgets", "acme/*.git"]
      push:
        refs: ["refs/heads/agent/**"]
        force: false
        delete: true
        deny_paths: [".github/workflows/**"]
        max_bytes: 64MiB
  - id: uploads
    owner: platform
    reason: agents post to an API, metered
    hosts: [api.example.com]
    upload: { bytes: 10MiB, per: 1h }
  - id: widgets-draft-pr
    owner: platform
    reason: agents open draft pull requests
    hosts: [api.git.example.com]
    methods: [POST]
    paths: ["/repos/acme/widgets/pulls", "/graphql"]
    body:
      max_bytes: 1MiB
      json: { "/head": "agent/*", "/draft": true, "/n": 1, "/x": null }
      graphql: { queries: true, mutations: [createPullRequest] }
"##,
    ),
    (
        "packages.yaml",
        r##"settings:
  packages:
    enforce: [pypi, npm, cargo, go]
    min_age: 3d
    time_unknown: allow
    mirrors:
      pypi: { url: "https://mirror.corp/api/pypi/pypi/simple/", inject: { headers: { Authorization: "Bearer ${env:MIRROR}" } } }
      npm: { url: "https://mirror.corp/api/npm/npm/", inject: { headers: { Authorization: "Bearer ${env:MIRROR}" } } }
      cargo: { url: "https://mirror.corp/api/cargo/crates/", inject: { headers: { X-Token: "${env:MIRROR}" } } }
      go: { url: "http://goproxy.corp/", inject: { headers: {} } }
packages:
  - id: py-agent-runtime
    owner: python-platform
    reason: vetted runtime deps
    ticket: SEC-1301
    expires: 2099-06-01
    ecosystem: pypi
    clients: ["ci-*"]
    min_age: 7d
    allow:
      - requests >=2.31,<3
      - urllib3
      - { name: numpy, versions: ">=1.26", min_age: 0d }
      - { name: certifi, versions: "==2024.8.30", sha256: "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08" }
      - { name: idna, sha256: ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"] }
    deny:
      - { name: ultralytics, versions: "==8.3.41", reason: compromised release }
      - colorama <0.4
  - id: js
    owner: web
    reason: front-end builds
    ecosystem: npm
    allow: ["@types/node ^20.0.0", left-pad]
"##,
    ),
    ("only-settings.yaml", "settings:\n  mode: enforce\n"),
    (
        "grants-ceiling.yaml",
        "settings:\n  grants:\n    max_ttl: 12h\n    max_uses: 10\n    never: [vault.example.com, \"*.internal.example.com\"]\n",
    ),
    (
        "grant-g-0123456789.yaml",
        r##"exceptions:
  - id: g-0123456789
    owner: data-team
    reason: fetch the items for task 7
    expires: 2027-03-01T13:00:00Z
    hosts: [api.example.com]
    ports: [443]
    grant: {from_request: m991fcas167q, granted_by: alice, granted_at: 2027-03-01T12:00:00Z, max_uses: 3}
"##,
    ),
    ("empty-list.yaml", "exceptions: []\n"),
];

/// Mistakes the parser refuses; the schema must refuse each as well.
const INVALID: &[(&str, &str)] = &[
    ("unknown-body-key", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    body: { jsn: { /a: 1 } }\n"),
    ("body-json-list-value", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    body: { json: { /a: [1] } }\n"),
    ("body-json-pointer-no-slash", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    body: { json: { head: main } }\n"),
    ("unknown-top-key", "exception:\n  - id: x\n"),
    ("unknown-exception-key", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    host: [a.example.com]\n"),
    ("unknown-settings-key", "settings:\n  moed: enforce\n"),
    ("unknown-dns-key", "settings:\n  dns:\n    deny_code: refused\n"),
    ("unknown-tunnel-key", "settings:\n  dns:\n    tunnel: { action: block, max_len: 9 }\n"),
    ("unknown-client-key", "settings:\n  clients:\n    - id: a\n      source: [10.0.0.0/8]\n"),
    ("unknown-inject-key", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    inject: { header: { A: b } }\n"),
    ("exceptions-not-a-list", "exceptions:\n  id: x\n"),
    ("hosts-not-a-list", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: a.example.com\n"),
    ("port-a-word", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    ports: [443, https]\n"),
    ("port-out-of-range", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    ports: [70000]\n"),
    ("port-zero", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    ports: [\"0\"]\n"),
    ("ports-empty", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    ports: []\n"),
    ("tunnel-length-a-word", "settings:\n  dns:\n    tunnel: { max_name_len: long }\n"),
    ("mode-bad", "settings:\n  mode: enforcing\n"),
    ("unknown-limits-key", "settings:\n  limits: { connections: 5 }\n"),
    ("connections-per-client-zero", "settings:\n  limits: { connections_per_client: 0 }\n"),
    ("connections-per-client-too-many", "settings:\n  limits: { connections_per_client: 16385 }\n"),
    ("connections-per-client-a-word", "settings:\n  limits: { connections_per_client: many }\n"),
    ("header-timeout-zero", "settings:\n  limits: { header_timeout: 0s }\n"),
    ("header-timeout-too-long", "settings:\n  limits: { header_timeout: 1h }\n"),
    ("header-timeout-no-unit", "settings:\n  limits: { header_timeout: 10 }\n"),
    ("stall-timeout-too-long", "settings:\n  limits: { stall_timeout: 10m }\n"),
    ("log-rate-zero", "settings:\n  limits: { log_lines_per_client_per_sec: 0 }\n"),
    ("private-destinations-bad", "settings:\n  private_destinations: block\n"),
    ("rcode-bad", "settings:\n  dns:\n    deny_rcode: servfail\n"),
    ("tunnel-action-bad", "settings:\n  dns:\n    tunnel: { action: warn }\n"),
    ("missing-sni-bad", "settings:\n  tls:\n    missing_sni: exact\n"),
    ("host-bare-star", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"*\"]\n"),
    ("host-star-dot", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"*.\"]\n"),
    ("host-two-stars", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"*.*.example.com\"]\n"),
    ("host-inner-star", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"a.*.example.com\"]\n"),
    ("host-star-one-label", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"*.com\"]\n"),
    ("host-empty-label", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a..example.com]\n"),
    ("host-url", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"https://pypi.org/\"]\n"),
    ("host-with-port", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"pypi.org:443\"]\n"),
    ("host-ip", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [10.0.0.1]\n"),
    ("host-numeric", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"2130706433\"]\n"),
    ("host-space", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"pypi org\"]\n"),
    ("owner-missing", "exceptions:\n  - id: x\n    reason: r\n    hosts: [a.example.com]\n"),
    ("reason-empty", "exceptions:\n  - id: x\n    owner: o\n    reason: \"  \"\n    hosts: [a.example.com]\n"),
    ("id-missing", "exceptions:\n  - owner: o\n    reason: r\n    hosts: [a.example.com]\n"),
    ("id-upper-case", "exceptions:\n  - id: PyPI\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n"),
    ("no-hosts-no-cidrs", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    ports: [443]\n"),
    ("hosts-empty", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: []\n"),
    ("cidr-prefix-too-long", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    cidrs: [10.0.0.0/33]\n"),
    ("cidr-a-name", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    cidrs: [intranet]\n"),
    ("date-bad-month", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    expires: 2027-13-01\n"),
    ("date-words", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    expires: next year\n"),
    ("duration-words", "settings:\n  stale_after: 90 days\n"),
    ("method-with-path", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    methods: [\"GET /\"]\n"),
    ("methods-empty", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    methods: []\n"),
    ("path-relative", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    paths: [\"simple/**\"]\n"),
    ("clients-empty", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    clients: []\n"),
    ("qtype-unknown", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    dns_types: [TXTT]\n"),
    ("qtype-never-allowed", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    dns_types: [any]\n"),
    ("qtype-never-allowed-number", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    dns_types: [TYPE252]\n"),
    ("token-short", "settings:\n  clients:\n    - id: a\n      token_sha256: abc123\n"),
    ("client-without-identity", "settings:\n  clients:\n    - id: a\n"),
    ("client-empty-sources", "settings:\n  clients:\n    - id: a\n      sources: []\n"),
    ("header-name-with-space", "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.example.com]\n    inject: { headers: { \"Bad Header\": v } }\n"),
    ("settings-a-list", "settings:\n  - mode: enforce\n"),
    ("unknown-package-set-key", "packages:\n  - id: p\n    owner: o\n    reason: r\n    ecosystem: pypi\n    allow: [requests]\n    alow: [x]\n"),
    ("package-set-no-ecosystem", "packages:\n  - id: p\n    owner: o\n    reason: r\n    allow: [requests]\n"),
    ("package-set-no-owner", "packages:\n  - id: p\n    reason: r\n    ecosystem: pypi\n    allow: [requests]\n"),
    ("package-ecosystem-bad", "packages:\n  - id: p\n    owner: o\n    reason: r\n    ecosystem: rubygems\n    allow: [rails]\n"),
    ("package-allow-unknown-key", "packages:\n  - id: p\n    owner: o\n    reason: r\n    ecosystem: pypi\n    allow: [{ name: requests, version: \"==2\" }]\n"),
    ("package-sha256-short", "packages:\n  - id: p\n    owner: o\n    reason: r\n    ecosystem: pypi\n    allow: [{ name: requests, sha256: abc }]\n"),
    ("package-settings-unknown-key", "settings:\n  packages: { enforced: [pypi] }\n"),
    ("package-enforce-empty", "settings:\n  packages: { enforce: [] }\n"),
    ("package-enforce-bad", "settings:\n  packages: { enforce: [maven] }\n"),
    ("package-mirror-unknown-ecosystem", "settings:\n  packages: { mirrors: { maven: { url: \"https://m.corp/\" } } }\n"),
    ("package-time-unknown-bad", "settings:\n  packages: { time_unknown: maybe }\n"),
];

fn write_all(dir: &Path, files: &[(&str, &str)], ext: &str) -> Vec<PathBuf> {
    files
        .iter()
        .map(|(name, text)| {
            let p = dir.join(format!("{name}{ext}"));
            fs::write(&p, text).unwrap();
            p
        })
        .collect()
}

/// Every key path (`exceptions[].inject.headers`) that a YAML document uses.
fn key_paths(v: &serde_yaml_ng::Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_yaml_ng::Value::Mapping(m) => {
            for (k, x) in m {
                let k = k.as_str().unwrap_or("?");
                let p = if at.is_empty() {
                    k.to_string()
                } else {
                    format!("{at}.{k}")
                };
                // Header names are data, not keys of the schema.
                if !at.ends_with("inject.headers") {
                    out.insert(p.clone());
                    key_paths(x, &p, out);
                }
            }
        }
        serde_yaml_ng::Value::Sequence(s) => {
            for x in s {
                key_paths(x, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

/// Every key path the schema defines.
fn schema_paths(schema: &serde_json::Value) -> BTreeSet<String> {
    fn walk(
        s: &serde_json::Value,
        defs: &serde_json::Value,
        at: &str,
        out: &mut BTreeSet<String>,
        depth: usize,
    ) {
        assert!(depth < 24, "schema nests too deep at {at}");
        if let Some(r) = s.get("$ref").and_then(|r| r.as_str()) {
            let name = r.trim_start_matches("#/definitions/");
            return walk(&defs[name], defs, at, out, depth + 1);
        }
        for key in ["anyOf", "allOf", "oneOf"] {
            for x in s.get(key).and_then(|x| x.as_array()).into_iter().flatten() {
                walk(x, defs, at, out, depth + 1);
            }
        }
        if let Some(items) = s.get("items") {
            walk(items, defs, &format!("{at}[]"), out, depth + 1);
        }
        if s.get("type") == Some(&serde_json::json!("object"))
            || s.get("additionalProperties").is_some()
        {
            for (k, x) in s
                .get("properties")
                .and_then(|p| p.as_object())
                .into_iter()
                .flatten()
            {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                // Only keys with a schema of their own (not the `minItems`
                // refinements inside anyOf alternatives).
                if x.get("description").is_some() {
                    out.insert(p.clone());
                }
                walk(x, defs, &p, out, depth + 1);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(schema, &schema["definitions"], "", &mut out, 0);
    out
}

/// Both the parser and the validator accept every shipped policy, every
/// example policy in the docs, and valid policies that use every key; the
/// keys they use cover the schema.
#[test]
fn shipped_example_and_complete_policies_validate() {
    let tmp = tempfile::tempdir().unwrap();
    let mut files = shipped_policies();
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        parse(&f.display().to_string(), &text).unwrap();
    }
    let docs = markdown_policies();
    assert!(docs.len() >= 2, "{docs:?}");
    // The manual's policies are read too (docs/policy.md, dns.md, packages.md).
    let manual = docs
        .iter()
        .filter(|(at, _)| at.starts_with("docs/"))
        .count();
    assert!(manual >= 4, "{manual} policies read from docs/: {docs:?}");
    for (i, (at, text)) in docs.iter().enumerate() {
        parse(at, text).unwrap_or_else(|e| panic!("{at}: {e}"));
        let p = tmp.path().join(format!("doc-{i}.yaml"));
        fs::write(&p, text).unwrap();
        files.push(p);
    }
    let mut used = BTreeSet::new();
    for (name, text) in VALID {
        parse(name, text).unwrap_or_else(|e| panic!("{name}: {e}"));
        key_paths(&serde_yaml_ng::from_str(text).unwrap(), "", &mut used);
    }
    files.extend(write_all(tmp.path(), VALID, ""));
    let defined = schema_paths(&egressd::cmd::check::schema::policy_schema());
    let unused: Vec<&String> = defined.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "keys of the schema no valid sample uses (add them to VALID): {unused:?}"
    );
    let tool = validators::check_jsonschema("shipped_example_and_complete_policies_validate");
    let (ok, report) = validators::validate(&tool, &shipped_schema(), &files);
    assert!(
        ok,
        "the schema refuses policies egressd accepts: {report:#}"
    );
}

/// Each mistake is refused by egressd's parser and by the schema.
#[test]
fn mistakes_are_refused_by_parser_and_schema() {
    for (name, text) in INVALID {
        assert!(
            parse(name, text).is_err(),
            "{name}: the parser accepts it, so it is not a mistake:\n{text}"
        );
    }
    let tool = validators::check_jsonschema("mistakes_are_refused_by_parser_and_schema");
    let tmp = tempfile::tempdir().unwrap();
    let files = write_all(tmp.path(), INVALID, ".yaml");
    let (ok, report) = validators::validate(&tool, &shipped_schema(), &files);
    assert!(!ok);
    let failed = validators::failed_files(&report);
    let passed: Vec<&str> = INVALID
        .iter()
        .zip(&files)
        .filter(|(_, f)| !failed.contains(&f.display().to_string()))
        .map(|((name, _), _)| *name)
        .collect();
    assert!(
        passed.is_empty(),
        "the schema accepts what the parser refuses: {passed:?}"
    );
}
