//! The policy as files: every shipped policy loads and is lint-clean, every
//! YAML file rejects unknown keys, load errors point at the right
//! file:line:column, directories merge, and `check` / `explain` say what
//! they should about small policies built here.

use std::fs;
use std::path::{Path, PathBuf};

use egressd::cmd::check::check_at;
use egressd::cmd::check::lint::{lint, Lint};
use egressd::cmd::explain::{explain, run_explain};
use egressd::policy::host::parse_target;
use egressd::policy::Proto;
use egressd::policy::{
    compile, load, read_sources, Diagnostic, LoadError, Policy, Request, Source,
};

use crate::support::{root, scratch};

/// 2027-01-15T08:00:00Z: a fixed "now" so expiry tests do not age.
const NOW: i64 = 1_800_000_000;

fn shipped() -> PathBuf {
    root().join("policy")
}

/// Every YAML file shipped under policy/, including the examples that the
/// directory load does not read.
fn shipped_yaml_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![shipped()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                && !is_policy_tests(&p)
            {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 5, "shipped policy files: {out:?}");
    out
}

/// Policy tests (`tests.yaml`, `*.tests.yaml`) sit beside policy files but
/// are not policy: `check` runs them (tests/it/report.rs covers them).
fn is_policy_tests(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.yaml" || name == "tests.yml" || name.ends_with(".tests.yaml")
}

fn env(_: &str) -> Option<String> {
    Some("test-secret".into())
}

fn compile_one(path: &Path, text: &str) -> Result<Policy, LoadError> {
    compile(
        &[Source {
            path: path.to_path_buf(),
            text: text.to_string(),
            grant: false,
        }],
        &env,
    )
}

fn load_err(path: &Path) -> Vec<Diagnostic> {
    match load(path) {
        Ok(_) => panic!("{} loaded, expected an error", path.display()),
        Err(e) => e.0,
    }
}

fn allowed(p: &Policy, proto: Proto, host: &str, port: u16) -> bool {
    let target = parse_target(host).unwrap();
    let req = Request {
        proto,
        client: None,
        target: &target,
        port,
        method: matches!(proto, Proto::Http).then(|| "GET".into()),
        path: matches!(proto, Proto::Http).then_some("/"),
        qtype: None,
        can_intercept: false,
    };
    p.decide(&req, NOW).is_allowed()
}

#[test]
fn shipped_policy_loads_and_is_lint_clean() {
    let p = load(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    assert!(p.files.len() >= 4, "{:?}", p.files);
    assert!(p.exceptions.len() >= 5);
    assert!(
        p.settings.location.is_some(),
        "settings in 00-settings.yaml"
    );
    for e in &p.exceptions {
        assert!(!e.owner.is_empty() && !e.reason.is_empty(), "{}", e.id);
        assert!(e.ticket().is_some(), "{} has no ticket", e.id);
    }
    let warnings = lint(&p, NOW);
    assert!(warnings.is_empty(), "{warnings:#?}");
    let warnings = lint(&p, egressd::time::unix_now());
    assert!(warnings.is_empty(), "{warnings:#?}");
}

#[test]
fn shipped_policy_allows_registries_without_interception() {
    let p = load(&shipped()).unwrap();
    for host in [
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
        "crates.io",
        "index.crates.io",
        "static.crates.io",
        "github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
    ] {
        assert!(allowed(&p, Proto::Connect, host, 443), "CONNECT {host}:443");
        assert!(allowed(&p, Proto::Dns, host, 53), "DNS {host}");
        assert!(!allowed(&p, Proto::Http, host, 80), "plain HTTP to {host}");
        assert!(!allowed(&p, Proto::Connect, host, 22), "CONNECT {host}:22");
    }
    for host in [
        "example.com",
        "evil-pypi.org",
        "gist.github.com",
        "169.254.169.254",
    ] {
        assert!(
            !allowed(&p, Proto::Connect, host, 443),
            "CONNECT {host}:443"
        );
    }
}

#[test]
fn every_example_policy_loads() {
    for f in shipped_yaml_files() {
        if f.parent() == Some(shipped().as_path()) {
            continue;
        }
        let sources = read_sources(&f).unwrap();
        let p = compile(&sources, &env).unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.exceptions.is_empty(), "{}", f.display());
        // Examples may carry deliberate warnings, explained in their comments;
        // never these.
        for w in lint(&p, NOW) {
            assert!(
                !matches!(
                    w.kind,
                    Lint::Expired | Lint::Expiring | Lint::Shadowed | Lint::UnknownClient
                ),
                "{w}"
            );
        }
    }
}

/// Inserts `line` before line number `at` (1-based).
fn insert_line(text: &str, at: usize, line: &str) -> String {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(at - 1, line);
    lines.join("\n") + "\n"
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Every place an unknown key can go: the top level, each mapping under
/// `settings:`, each exception. Returns (line to insert before, indent).
fn insertion_points(text: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut points = vec![(lines.len() + 1, 0)];
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        if let Some(rest) = t.strip_prefix("- id:") {
            let _ = rest;
            // Before the exception's second key, at the indentation of `id`.
            points.push((i + 2, indent_of(l) + 2));
        } else if t.ends_with(':') && !t.starts_with('-') && t != "headers:" {
            // (`headers:` maps header names to values: any key is valid there.)
            // A mapping opens: insert as its first key.
            if let Some(next) = lines[i + 1..]
                .iter()
                .find(|n| !n.trim().is_empty() && !n.trim_start().starts_with('#'))
            {
                let ind = indent_of(next);
                if ind > indent_of(l) && !next.trim_start().starts_with('-') {
                    points.push((i + 2, ind));
                }
            }
        }
    }
    points
}

#[test]
fn every_shipped_file_rejects_unknown_keys() {
    let mut checked = 0;
    for f in shipped_yaml_files() {
        let text = fs::read_to_string(&f).unwrap();
        compile_one(&f, &text).unwrap_or_else(|e| panic!("{e}"));
        for (at, indent) in insertion_points(&text) {
            let mutated = insert_line(&text, at, &format!("{}colour: blue", " ".repeat(indent)));
            let err = match compile_one(&f, &mutated) {
                Ok(_) => panic!(
                    "{}: unknown key at line {at} accepted:\n{mutated}",
                    f.display()
                ),
                Err(e) => e,
            };
            let d = &err.0[0];
            assert_eq!(d.file, f);
            assert_eq!(d.line, at, "{}: {err}\n{mutated}", f.display());
            assert_eq!(d.column, indent + 1, "{err}");
            assert!(d.message.contains("unknown field `colour`"), "{err}");
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} mutations");
}

const HEAD: &str = "exceptions:\n";

fn one(id: &str, body: &str) -> String {
    format!("  - id: {id}\n    owner: o\n    reason: r\n{body}")
}

/// (line, column) of each error for a one-file policy.
fn errors_at(text: &str) -> Vec<(usize, usize, String)> {
    let dir = scratch();
    let f = dir.file("p.yaml", text);
    load_err(&f)
        .into_iter()
        .map(|d| {
            assert_eq!(d.file, f);
            (d.line, d.column, d.message)
        })
        .collect()
}

#[test]
fn errors_carry_file_line_column() {
    // Line 1 is `exceptions:`, each `one` is 3 lines, then its body.
    let cases: &[(&str, &str, usize, usize, &str)] = &[
        ("bare star", "    hosts: [\"*\"]\n", 5, 13, "fixed suffix"),
        (
            "star dot",
            "    hosts: [\"*.\"]\n",
            5,
            13,
            "invalid host pattern",
        ),
        (
            "two stars",
            "    hosts: [\"a*b*.example.com\"]\n",
            5,
            13,
            "only one '*'",
        ),
        (
            "star star",
            "    hosts: [\"*.*.x\"]\n",
            5,
            13,
            "only allowed in the first label",
        ),
        (
            "second of list",
            "    hosts:\n      - ok.example.com\n      - \"*.*.x\"\n",
            7,
            9,
            "first label",
        ),
        (
            "bad cidr",
            "    cidrs: [10.0.0.0/33]\n",
            5,
            13,
            "invalid CIDR",
        ),
        (
            "host bits",
            "    cidrs: [10.0.0.1/8]\n",
            5,
            13,
            "did you mean 10.0.0.0/8",
        ),
        (
            "port 0",
            "    hosts: [a.example]\n    ports: [443, 0]\n",
            6,
            18,
            "port 0 is out of range",
        ),
        (
            "port 65536",
            "    hosts: [a.example]\n    ports: [65536]\n",
            6,
            13,
            "port 65536 is out of range",
        ),
        (
            "bad date",
            "    hosts: [a.example]\n    expires: 2027-02-30\n",
            6,
            14,
            "invalid date",
        ),
        (
            "unknown key",
            "    hosts: [a.example]\n    host: [b.example]\n",
            6,
            5,
            "unknown field `host`",
        ),
    ];
    for (what, body, line, col, msg) in cases {
        let text = format!("{HEAD}{}", one("x", body));
        let errs = errors_at(&text);
        assert_eq!(errs.len(), 1, "{what}: {errs:?}");
        let (l, c, m) = &errs[0];
        assert!(m.contains(msg), "{what}: {m}");
        assert_eq!((*l, *c), (*line, *col), "{what}: {m}\n{text}");
    }
}

#[test]
fn limits_are_read_in_range_and_their_errors_point_at_the_value() {
    let dir = scratch();
    let f = dir.file(
        "p.yaml",
        "settings:\n  limits:\n    connections_per_client: 8\n    header_timeout: 2m\nexceptions: []\n",
    );
    let p = compile_one(&f, &std::fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(
        (
            p.settings.limits.connections_per_client,
            p.settings.limits.header_timeout_secs
        ),
        (8, 120)
    );
    let p = compile_one(&f, "exceptions: []\n").unwrap();
    assert_eq!(
        (
            p.settings.limits.connections_per_client,
            p.settings.limits.header_timeout_secs
        ),
        (1024, 10),
        "the defaults"
    );
    let cases: &[(&str, usize, usize, &str)] = &[
        (
            "    connections_per_client: 0\n",
            3,
            29,
            "must be 1 to 16384",
        ),
        ("    connections_per_client: 16385\n", 3, 29, "not 16385"),
        (
            "    connections_per_client: -1\n",
            3,
            29,
            "must be 1 to 16384",
        ),
        ("    header_timeout: 0s\n", 3, 21, "out of range: 1s to 5m"),
        (
            "    header_timeout: 301s\n",
            3,
            21,
            "out of range: 1s to 5m",
        ),
        ("    header_timeout: soon\n", 3, 21, "invalid duration"),
        (
            "    header_timout: 5s\n",
            3,
            5,
            "unknown field `header_timout`",
        ),
    ];
    for (body, line, col, msg) in cases {
        let text = format!("settings:\n  limits:\n{body}exceptions: []\n");
        let errs = errors_at(&text);
        assert_eq!(errs.len(), 1, "{body}: {errs:?}");
        let (l, c, m) = &errs[0];
        assert!(m.contains(msg), "{body}: {m}");
        assert_eq!((*l, *c), (*line, *col), "{body}: {m}");
    }
}

#[test]
fn entry_errors_point_at_the_exception() {
    let text = format!(
        "{HEAD}{}  - id: nobody\n    reason: r\n    hosts: [b.example]\n  - id: why\n    owner: o\n    hosts: [c.example]\n",
        one("fine", "    hosts: [a.example]\n")
    );
    let errs = errors_at(&text);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert_eq!((errs[0].0, errs[0].1), (6, 5));
    assert!(errs[0].2.contains("\"nobody\" has no owner"), "{errs:?}");
    assert_eq!(errs[1].0, 9);
    assert!(errs[1].2.contains("\"why\" has no reason"), "{errs:?}");
}

#[test]
fn duplicate_ids_across_files() {
    let dir = scratch();
    dir.file(
        "a.yaml",
        &format!("{HEAD}{}", one("pypi", "    hosts: [pypi.org]\n")),
    );
    let b = dir.file(
        "b.yaml",
        &format!(
            "# second file\n{HEAD}{}{}",
            one("npm", "    hosts: [registry.npmjs.org]\n"),
            one("pypi", "    hosts: [files.pythonhosted.org]\n")
        ),
    );
    let errs = load_err(dir.dir());
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].file, b);
    assert_eq!((errs[0].line, errs[0].column), (7, 5));
    assert!(errs[0].message.contains("duplicate exception id \"pypi\""));
    assert!(errs[0].message.contains("a.yaml"), "{}", errs[0].message);
}

#[test]
fn a_directory_merges_in_name_order() {
    let dir = scratch();
    dir.file(
        "20-b.yaml",
        &format!("{HEAD}{}", one("b", "    hosts: [b.example]\n")),
    );
    dir.file(
        "10-a.yml",
        &format!(
            "settings:\n  mode: report\n{HEAD}{}",
            one("a", "    hosts: [a.example]\n")
        ),
    );
    dir.file("notes.txt", "not policy");
    dir.file(".hidden.yaml", "garbage: [");
    fs::create_dir(dir.path("sub")).unwrap();
    dir.file("sub/c.yaml", "garbage: [");
    let p = load(dir.dir()).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = p.exceptions.iter().map(|e| &*e.id).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(p.files.len(), 2);
    assert_eq!(p.settings.mode, egressd::policy::Mode::Report);
    assert!(p.exceptions[1].file.ends_with("20-b.yaml"));
    assert_eq!(p.exceptions[1].line, 2);
    assert_eq!(read_sources(dir.dir()).unwrap().len(), 2);
}

#[test]
fn settings_in_two_files_is_an_error() {
    let dir = scratch();
    dir.file("a.yaml", "settings:\n  mode: enforce\n");
    let b = dir.file("b.yaml", "# more\nsettings:\n  contact: x\n");
    let errs = load_err(dir.dir());
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].file, b);
    assert_eq!(errs[0].line, 2);
    assert!(
        errs[0].message.contains("one file only"),
        "{}",
        errs[0].message
    );
}

/// Runs `check` at NOW; (exit, stdout, stderr).
fn check(path: &Path) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = check_at(path, NOW, &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn check_reports_errors_and_exits_1() {
    let dir = scratch();
    let f = dir.file(
        "p.yaml",
        &format!("{HEAD}{}", one("x", "    hosts: [\"*.*.x\"]\n")),
    );
    let (code, out, err) = check(dir.dir());
    assert_eq!(code, 1);
    assert!(out.is_empty(), "{out}");
    let want = format!("error: {}:5:13: ", f.display());
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains("1 error, policy not loaded"), "{err}");
}

#[test]
fn check_on_shipped_policy() {
    let (code, out, err) = check(&shipped());
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.is_empty(), "{err}");
    let mut lines = out.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .contains("exceptions in 5 files, 0 errors, 0 warnings"),
        "{out}"
    );
    // Then the shipped policy tests (tests.yaml), all passing.
    assert!(
        lines.next().unwrap().ends_with(" passed, 0 failed"),
        "{out}"
    );
}

#[test]
fn check_warns_for_each_class_with_file_and_line() {
    let dir = scratch();
    let a = dir.file(
        "a.yaml",
        &format!(
            "settings:\n  clients:\n    - id: ci-runner\n      sources: [10.8.0.0/16]\n{HEAD}{}{}{}{}",
            one("gone", "    expires: 2027-01-01\n    hosts: [a.example.com]\n"),         // line 6
            one("soon", "    expires: 2027-01-20\n    hosts: [b.example.com]\n"),         // line 11
            one("wild", "    hosts: [\"*.example.net\"]\n"),                               // line 16
            one("pages", "    expires: 2028-01-01\n    hosts: [\"*.s3.amazonaws.com\"]\n"), // line 20
        ),
    );
    let b = dir.file(
        "b.yaml",
        &format!(
            "{HEAD}{}{}{}{}",
            one("lan", "    cidrs: [169.254.0.0/16]\n"),                             // line 2
            one("who", "    clients: [agent-*]\n    hosts: [c.example.com]\n"),       // line 6
            one("tok", "    ports: [80]\n    hosts: [d.example.com]\n    inject:\n      headers: { Authorization: \"Bearer not-a-real-token\" }\n"), // line 11
            one("again", "    hosts: [x.example.net]\n    ports: [443]\n"),           // line 18
        ),
    );
    let (code, out, err) = check(dir.dir());
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    let expect = [
        (&a, 6, "\"gone\" expired on 2027-01-01"),
        (&a, 11, "\"soon\" expires in 5 days (2027-01-20)"),
        (
            &a,
            16,
            "\"wild\" is a never-expiring wildcard (*.example.net)",
        ),
        (&a, 20, "*.s3.amazonaws.com spans s3.amazonaws.com"),
        (
            &b,
            2,
            "cidr 169.254.0.0/16 is inside 169.254.0.0/16 (link-local",
        ),
        (&b, 6, "client pattern \"agent-*\" matches no client"),
        (
            &b,
            11,
            "injects credentials (authorization) and allows only port 80",
        ),
        (&b, 18, "\"again\" is shadowed by \"wild\""),
    ];
    assert_eq!(lines.len(), expect.len() + 1, "{out}");
    for ((file, line, msg), got) in expect.iter().zip(&lines) {
        let prefix = format!("{}:{line}: warning: ", file.display());
        assert!(got.starts_with(&prefix), "want {prefix}…\n got {got}");
        assert!(got.contains(msg), "want {msg:?}\n got {got}");
    }
    assert_eq!(
        lines[expect.len()],
        format!(
            "{}: 8 exceptions in 2 files, 0 errors, 8 warnings",
            dir.dir().display()
        )
    );
    let p = load(dir.dir()).unwrap();
    let kinds: Vec<Lint> = lint(&p, NOW).iter().map(|w| w.kind).collect();
    assert_eq!(
        kinds,
        [
            Lint::Expired,
            Lint::Expiring,
            Lint::WildcardNoExpiry,
            Lint::PublicSuffixWildcard,
            Lint::NonPublicCidr,
            Lint::UnknownClient,
            Lint::CleartextInject,
            Lint::Shadowed
        ]
    );
}

fn explain_shipped(client: Option<&str>, target: &str) -> (i32, String) {
    let p = load(&shipped()).unwrap();
    let mut out = Vec::new();
    let code = explain(&p, client, target, NOW, &mut out);
    (code, String::from_utf8(out).unwrap())
}

#[test]
fn explain_on_shipped_policy() {
    let (code, out) = explain_shipped(None, "https://pypi.org/simple/requests/");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ALLOW  by exception pypi ("), "{out}");
    assert!(out.contains("10-python.yaml:"), "{out}");
    assert!(out.contains("owner    python-platform"), "{out}");
    assert!(out.contains("SEC-1201"), "{out}");

    let (code, out) = explain_shipped(None, "https://api.github.com/repos/o/r");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("no_exception: no exception allows this destination"),
        "{out}"
    );
    assert!(out.contains("github-git"), "{out}");
    assert!(out.contains("#security-exceptions"), "{out}");

    let (code, out) = explain_shipped(None, "registry.npmjs.org:22");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("it allows ports 443; not 22"), "{out}");

    let (code, out) = explain_shipped(None, "dns:static.crates.io/AAAA");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("crates-io"), "{out}");

    let (code, out) = explain_shipped(None, "http://169.254.169.254/latest/meta-data/");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cidrs"), "{out}");
}

#[test]
fn run_explain_loads_and_reports_errors() {
    let mut out = Vec::new();
    let code = run_explain(
        &shipped(),
        None,
        "GET https://files.pythonhosted.org/packages/x.whl",
        &mut out,
    );
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("policy:  "), "{out}");

    let dir = scratch();
    dir.file("p.yaml", "exceptions: [");
    let mut out = Vec::new();
    let code = run_explain(dir.dir(), None, "https://pypi.org/", &mut out);
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("error: "), "{out}");

    let mut out = Vec::new();
    assert_eq!(
        run_explain(&shipped(), Some("ci-runner"), "https://pypi.org/", &mut out),
        2
    );
}

/// Package sets load with the exceptions: their lints are `check`
/// warnings at the set's or the entry's line, their errors located
/// `file:line:col` errors, their ids one space with exceptions'.
#[test]
fn check_warns_about_package_sets_and_locates_their_errors() {
    let dir = scratch();
    let sets = "packages:
  - id: js
    owner: web
    reason: front-end builds
    ecosystem: npm
    allow: [left-pad]
  - id: py
    owner: python
    reason: runtime
    ecosystem: pypi
    expires: 2027-01-01
    min_age: 1d
    allow:
      - \"lodash-not-python >=1\"
      - \"requests >=2,<3\"
    deny:
      - requests
";
    let f = dir.file(
        "p.yaml",
        &format!(
            "settings:\n  packages: {{ enforce: [pypi] }}\n{HEAD}{}{sets}",
            one("reg", "    hosts: [pypi.org]\n")
        ),
    );
    let (code, out, err) = check(dir.dir());
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    let expect = [
        (9, "package set \"js\" approves npm packages, but settings.packages.enforce does not list npm"),
        (13, "left-pad approves every version with min_age 0"),
        (14, "package set \"py\" has expired"),
        (22, "allow requests >=2,<3 is fully covered by deny requests "),
    ];
    assert_eq!(lines.len(), expect.len() + 1, "{out}");
    for ((line, msg), got) in expect.iter().zip(&lines) {
        let prefix = format!("{}:{line}: warning: ", f.display());
        assert!(got.starts_with(&prefix), "want {prefix}…\n got {got}");
        assert!(got.contains(msg), "want {msg:?}\n got {got}");
    }
    let p = load(dir.dir()).unwrap();
    let kinds: Vec<Lint> = lint(&p, NOW).iter().map(|w| w.kind).collect();
    assert_eq!(
        kinds,
        [
            Lint::PackageNotEnforced,
            Lint::PackageNoQuarantine,
            Lint::PackageSetExpired,
            Lint::PackageCoveredByDeny
        ]
    );

    // A bad constraint, an unknown key and an id an exception has: each
    // an error at its place, and the policy not loaded.
    let bad = sets
        .replace("[left-pad]", "[\"left-pad ^^1\"]")
        .replace("    min_age: 1d\n", "    min_age: 1d\n    allows: []\n")
        .replace("id: js", "id: reg");
    dir.file(
        "p.yaml",
        &format!(
            "settings:\n  packages: {{ enforce: [pypi] }}\n{HEAD}{}{bad}",
            one("reg", "    hosts: [pypi.org]\n")
        ),
    );
    let (code, out, err) = check(dir.dir());
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.starts_with(&format!(
            "error: {}:20:5: packages[1]: unknown field `allows`",
            f.display()
        )),
        "{err}"
    );
    dir.file(
        "p.yaml",
        &format!(
            "settings:\n  packages: {{ enforce: [pypi] }}\n{HEAD}{}{}",
            one("reg", "    hosts: [pypi.org]\n"),
            sets.replace("[left-pad]", "[\"left-pad ^^1\"]")
                .replace("id: py", "id: reg")
        ),
    );
    let (code, _, err) = check(dir.dir());
    assert_eq!(code, 1);
    let errs: Vec<&str> = err.lines().collect();
    assert_eq!(errs.len(), 3, "{err}");
    assert!(
        errs[0].starts_with(&format!("error: {}:13:", f.display()))
            && errs[0].contains("package set \"js\": left-pad: "),
        "{err}"
    );
    assert!(
        errs[1].starts_with(&format!(
            "error: {}:14:5: package set id \"reg\" is also an exception id",
            f.display()
        )),
        "{err}"
    );
}

/// A generated policy in the shapes real ones take (the forms the fast
/// YAML front end must follow, not leave to serde_yaml_ng), `n` exceptions.
fn generated_policy(n: usize, seed: usize) -> String {
    let mut y = String::from(
        "# generated\nsettings:\n  mode: report\n  contact: \"#sec\"\n  stale_after: 30d\n  \
         private_destinations: deny\n  clients:\n    - id: ci-runner\n      sources: [10.8.0.0/16, \"fd00::/8\"]\n    \
         - id: agent-a\n      token_sha256: \"0000000000000000000000000000000000000000000000000000000000000000\"\n  \
         dns:\n    deny_rcode: nxdomain\n    cache_min_ttl: 5s\n    tunnel: { action: log, max_name_len: 100, alert_bytes: 600 }\n  \
         limits:\n    connections_per_client: 64\n    header_timeout: 10s\n  tls:\n    missing_sni: deny\n\nexceptions:\n",
    );
    for i in 0..n {
        let k = (i + seed) % 9;
        y.push_str(&format!("  - id: e{i}\n    owner: team{}\n", i % 7));
        match k {
            0 => y.push_str("    reason: >-\n      folded over\n      two lines\n"),
            1 => y.push_str(&format!("    reason: 'it''s {i}' # why\n")),
            2 => y.push_str("    reason: \"quoted \\\"inner\\\" text\"\n"),
            _ => y.push_str(&format!(
                "    reason: generated {i}, see https://t.test/{i}#x\n"
            )),
        }
        match k {
            0 | 5 => y.push_str(&format!("    hosts:\n      - a{i}.example.com\n      - \"*.w{i}.example.net\"\n")),
            1 => y.push_str(&format!("    hosts: [\"api-*.g{i}.example.io\"]\n    ports: [443, \"8443\"]\n")),
            2 => y.push_str(&format!("    cidrs: [10.{}.0.0/16, 2001:db8::/32]\n    hosts: []\n", i % 256)),
            3 => y.push_str(&format!(
                "    hosts: [p{i}.mirror.example.org]\n    clients: [\"ci-*\"]\n    methods: [GET, head]\n    \
                 paths: [\"/v1/**\", /simple/*/]\n    expires: 2030-01-01\n    ticket: SEC-{i}\n"
            )),
            4 => y.push_str(&format!(
                "    hosts: [t{i}.example.com]\n    dns_types: [TXT, mx]\n    inject:\n      headers:\n        X-Api-Key: \"${{env:KEY}}\"\n"
            )),
            _ => y.push_str(&format!("    hosts: [h{i}.example.com]\n    ports: [80]\n\n")),
        }
    }
    y
}

/// Every mutation of `text` one edit away along its lines: each deleted,
/// doubled, indented by one, dedented by one, its `: ` turned to `:`, a
/// value quoted, a tab put in.
fn mutations(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let join = |ls: Vec<String>| ls.join("\n") + "\n";
    for i in 0..lines.len() {
        let with = |f: &dyn Fn(&str) -> Vec<String>| {
            let mut ls: Vec<String> = Vec::new();
            for (j, l) in lines.iter().enumerate() {
                if i == j {
                    ls.extend(f(l));
                } else {
                    ls.push(l.to_string());
                }
            }
            join(ls)
        };
        out.push(with(&|_| vec![]));
        out.push(with(&|l| vec![l.to_string(), l.to_string()]));
        out.push(with(&|l| vec![format!(" {l}")]));
        out.push(with(&|l| {
            vec![l.strip_prefix(' ').unwrap_or(l).to_string()]
        }));
        out.push(with(&|l| vec![l.replacen(": ", ":", 1)]));
        out.push(with(&|l| vec![l.replacen(": ", ": \"", 1) + "\""]));
        out.push(with(&|l| vec![l.replacen(": ", ": '", 1) + "'"]));
        out.push(with(&|l| vec![l.replacen(' ', "\t", 1)]));
        out.push(with(&|l| vec![format!("{l} # c")]));
        out.push(with(&|l| vec![format!("{l}:")]));
        out.push(with(&|l| vec![l.replacen(", ", ",", 1)]));
        out.push(with(&|l| vec![l.replacen('[', "", 1)]));
    }
    out
}

/// The fast YAML front end (policy::yaml) reads every policy exactly as
/// serde_yaml_ng does, or leaves it to serde_yaml_ng: the shipped policy,
/// the examples, the `policy_load` fuzz seeds and regressions, generated
/// policies, and every one-edit mutation of those. The policies people
/// write (shipped and generated) must take the fast path.
#[test]
fn the_fast_yaml_front_end_reads_every_policy_as_serde_yaml_ng_does() {
    use egressd::policy::yaml::compare_with_serde_yaml;
    let mut fast_path: Vec<(String, String)> = shipped_yaml_files()
        .into_iter()
        .map(|f| (f.display().to_string(), fs::read_to_string(&f).unwrap()))
        .collect();
    for (n, seed) in [(1, 0), (9, 0), (50, 3), (200, 7)] {
        fast_path.push((format!("generated {n}/{seed}"), generated_policy(n, seed)));
    }
    let mut others: Vec<(String, String)> = Vec::new();
    for dir in [
        "examples",
        "fuzz/seeds/policy_load",
        "fuzz/regressions/policy_load",
    ] {
        let mut dirs = vec![root().join(dir)];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if let Ok(t) = fs::read_to_string(&p) {
                    let policy_like = dir != "examples"
                        || matches!(p.extension().and_then(|x| x.to_str()), Some("yaml" | "yml"));
                    if policy_like {
                        others.push((p.display().to_string(), t));
                    }
                }
            }
        }
    }
    assert!(others.len() >= 15, "{}", others.len());
    for (name, text) in &fast_path {
        assert_eq!(compare_with_serde_yaml(text), Ok(true), "{name}");
    }
    let (mut taken, mut all) = (0, 0);
    for (name, text) in fast_path.iter().chain(&others) {
        let base = compare_with_serde_yaml(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        taken += usize::from(base);
        if text.len() > 20_000 {
            continue;
        }
        for m in mutations(text) {
            all += 1;
            match compare_with_serde_yaml(&m) {
                Ok(t) => taken += usize::from(t),
                Err(e) => panic!("{name}, mutated:\n{m}\n{e}"),
            }
        }
    }
    // The mutations exercise both sides: many still take the fast path.
    assert!(taken * 4 > all, "{taken} of {all} took the fast path");
}

/// The first run from a directory with no `policy/`: every command that
/// reads the policy says how to name one (`--policy`) and where one to
/// start from is, not only that the file is missing.
#[test]
fn a_missing_policy_names_the_flag_and_a_policy_to_start_from() {
    let dir = scratch();
    let bin = env!("CARGO_BIN_EXE_egressd");
    for args in [
        &["run", "--upstream-dns", "127.0.0.1:9", "--", "true"][..],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--dns-listen",
            "127.0.0.1:0",
        ][..],
        &["check"][..],
        &["explain", "https://pypi.org/"][..],
    ] {
        let o = std::process::Command::new(bin)
            .args(args)
            .current_dir(dir.dir())
            .env_remove("EGRESSD_POLICY")
            .output()
            .unwrap();
        // explain prints its answer, a failed load included, on stdout.
        let err = String::from_utf8_lossy(&o.stderr) + String::from_utf8_lossy(&o.stdout);
        assert!(!o.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("cannot read policy: No such file or directory")
                && err.contains("name the policy with --policy PATH")
                && err.contains("the policy/ directory of egressd's repository"),
            "{args:?}: {err}"
        );
    }
}
