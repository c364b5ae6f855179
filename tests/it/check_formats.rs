//! `egressd check --format text|json|github|sarif`, run as the binary: every
//! format reports the same findings at the same file:line:col and exits the
//! same way; `github` prints workflow commands GitHub turns into annotations
//! (escaped), `sarif` passes the OASIS SARIF 2.1.0 schema (vendored under
//! tests/data/sarif/, checked with check-jsonschema), and `--against` shows
//! what a change would newly deny in each format.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::validators;

const FORMATS: [&str; 4] = ["text", "json", "github", "sarif"];

/// A policy directory that loads with one warning and one failing policy
/// test, and one (with a comma in its name) that does not load.
struct Fixture {
    _tmp: tempfile::TempDir,
    warns: PathBuf,
    broken: PathBuf,
    log: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let warns = tmp.path().join("policy");
    fs::create_dir_all(&warns).unwrap();
    fs::write(
        warns.join("a.yaml"),
        "exceptions:\n  - id: wild\n    owner: web\n    reason: docs\n    hosts: [\"*.example.net\"]\n    ports: [443]\n",
    )
    .unwrap();
    fs::write(
        warns.join("tests.yaml"),
        "tests:\n  - target: https://docs.example.net/\n    expect: allow\n  - name: not pypi\n    target: https://pypi.org/\n    expect: allow\n",
    )
    .unwrap();
    let broken = tmp.path().join("broken,policy");
    fs::create_dir_all(&broken).unwrap();
    fs::write(
        broken.join("p.yaml"),
        "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [\"*.*.x\"]\n  - id: y\n    owner: o\n    reason: r\n    hosts: [y.example.com]\n    colour: blue\n",
    )
    .unwrap();
    // Recent traffic: pypi.org was allowed by an exception the policy no
    // longer has; docs.example.net was denied and is now allowed.
    let log = tmp.path().join("decisions.log");
    let line = |host: &str, decision: &str, reason: &str, exception: &str| {
        format!(
            "{{\"ts\":\"2027-01-01T00:00:00.000Z\",\"client\":\"-\",\"src\":\"10.1.1.1:5\",\"proto\":\"connect\",\"host\":\"{host}\",\"port\":443,\"addr\":null,\"method\":\"CONNECT\",\"path\":null,\"decision\":\"{decision}\",\"reason\":\"{reason}\",\"exception\":{exception},\"owner\":null,\"mode\":\"enforce\",\"status\":200,\"bytes_up\":1,\"bytes_down\":2,\"duration_ms\":3}}\n"
        )
    };
    let mut text = String::new();
    for _ in 0..3 {
        text.push_str(&line("pypi.org", "allow", "exception", "\"pypi\""));
    }
    text.push_str(&line("docs.example.net", "deny", "no_exception", "null"));
    fs::write(&log, text).unwrap();
    Fixture {
        _tmp: tmp,
        warns,
        broken,
        log,
    }
}

fn check(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_egressd"));
    cmd.arg("check");
    for a in args {
        cmd.arg(a);
    }
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// (level, file, line, column, rule) of every finding, as each format
/// states them.
type Found = Vec<(String, String, usize, usize, String)>;

fn from_json(out: &str) -> Found {
    let v: Value = serde_json::from_str(out).unwrap();
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["level"].as_str().unwrap().to_string(),
                f["file"].as_str().unwrap().to_string(),
                f["line"].as_u64().unwrap_or(0) as usize,
                f["column"].as_u64().unwrap_or(0) as usize,
                f["rule"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("%2C", ",")
        .replace("%3A", ":")
        .replace("%0A", "\n")
        .replace("%0D", "\r")
        .replace("%25", "%")
}

fn from_github(out: &str) -> Found {
    out.lines()
        .filter(|l| l.starts_with("::error ") || l.starts_with("::warning "))
        .filter(|l| l.contains("file="))
        .map(|l| {
            let (head, _msg) = l[2..].split_once("::").unwrap();
            let (level, props) = head.split_once(' ').unwrap();
            let mut f = (level.to_string(), String::new(), 0, 0, String::new());
            for p in props.split(',') {
                let (k, v) = p.split_once('=').unwrap();
                let v = unescape(v);
                match k {
                    "file" => f.1 = v,
                    "line" => f.2 = v.parse().unwrap(),
                    "col" => f.3 = v.parse().unwrap(),
                    "title" => f.4 = v.strip_prefix("egressd ").unwrap().to_string(),
                    other => panic!("unexpected property {other} in {l}"),
                }
            }
            f
        })
        .collect()
}

fn from_sarif(out: &str) -> Found {
    let v: Value = serde_json::from_str(out).unwrap();
    let run = &v["runs"][0];
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    run["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let rule = r["ruleId"].as_str().unwrap().to_string();
            let i = r["ruleIndex"].as_u64().unwrap() as usize;
            assert_eq!(
                rules[i]["id"],
                rule.as_str(),
                "ruleIndex points at its rule"
            );
            let loc = &r["locations"][0]["physicalLocation"];
            let uri = loc["artifactLocation"]["uri"].as_str().unwrap();
            let file = uri.strip_prefix("file://").unwrap().replace("%2C", ",");
            (
                r["level"].as_str().unwrap().to_string(),
                file,
                loc["region"]["startLine"].as_u64().unwrap_or(0) as usize,
                loc["region"]["startColumn"].as_u64().unwrap_or(0) as usize,
                rule,
            )
        })
        .collect()
}

#[test]
fn every_format_reports_the_same_findings_and_exit_code() {
    let f = fixture();
    let a = f.warns.join("a.yaml").display().to_string();
    let tests = f.warns.join("tests.yaml").display().to_string();
    let p = f.broken.join("p.yaml").display().to_string();
    let cases: [(&Path, i32, Found); 2] = [
        (
            &f.warns,
            1,
            vec![
                ("warning".into(), a, 2, 0, "wildcard_no_expiry".into()),
                ("error".into(), tests, 4, 0, "policy_test_failed".into()),
            ],
        ),
        (
            &f.broken,
            1,
            vec![("error".into(), p, 5, 13, "policy_error".into())],
        ),
    ];
    for (dir, code, want) in cases {
        let default = check(&[&dir]);
        assert_eq!(default.status.code(), Some(code));
        for format in FORMATS {
            let o = check(&[&"--format", &format, &dir]);
            assert_eq!(o.status.code(), Some(code), "{format}: {}", stdout(&o));
            let got = match format {
                "text" => {
                    // The text format is the output `check` always had.
                    assert_eq!(o.stdout, default.stdout);
                    assert_eq!(o.stderr, default.stderr);
                    continue;
                }
                "json" => from_json(&stdout(&o)),
                "github" => from_github(&stdout(&o)),
                _ => from_sarif(&stdout(&o)),
            };
            assert_eq!(got, want, "{format} on {}", dir.display());
        }
    }
    // The shipped policy is clean in every format.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    for format in FORMATS {
        let o = check(&[&"--format", &format, &shipped]);
        assert_eq!(o.status.code(), Some(0), "{format}: {}", stdout(&o));
    }
}

#[test]
fn github_commands_are_annotations_with_escaped_values() {
    let f = fixture();
    let o = check(&[&"--format", &"github", &f.broken]);
    let out = stdout(&o);
    let first = out.lines().next().unwrap();
    // The comma in the directory's name must not end the `file` property.
    let file = f
        .broken
        .join("p.yaml")
        .display()
        .to_string()
        .replace(',', "%2C")
        .replace(':', "%3A");
    assert!(
        first.starts_with(&format!(
            "::error file={file},line=5,col=13,title=egressd policy_error::"
        )),
        "{first}"
    );
    assert!(
        first.contains("'*' is only allowed in the first label"),
        "{first}"
    );
    assert!(out.ends_with("1 error, policy not loaded\n"), "{out}");

    let o = check(&[&"--format", &"github", &f.warns]);
    let out = stdout(&o);
    assert!(
        out.contains(",line=2,title=egressd wildcard_no_expiry::exception \"wild\" is a never-expiring wildcard"),
        "{out}"
    );
    assert!(
        out.contains(",line=4,title=egressd policy_test_failed::FAIL not pypi: https://pypi.org/: expected allow, got deny (no_exception)"),
        "{out}"
    );
    assert!(out.contains("policy tests: 1 passed, 1 failed"), "{out}");
}

#[test]
fn sarif_output_is_valid_sarif_2_1_0() {
    let f = fixture();
    let schema =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sarif/sarif-schema-2.1.0.json");
    let tmp = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    let runs: [(&str, Vec<&dyn AsRef<std::ffi::OsStr>>); 4] = [
        ("warns", vec![&f.warns]),
        ("broken", vec![&f.broken]),
        ("shipped", vec![&shipped]),
        ("against", vec![&"--against", &f.log, &f.warns]),
    ];
    for (name, args) in runs {
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"--format", &"sarif"];
        all.extend(args);
        let o = check(&all);
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {}", stdout(&o)));
        assert_eq!(v["version"], "2.1.0");
        assert_eq!(
            v["runs"][0]["invocations"][0]["exitCode"],
            o.status.code().unwrap()
        );
        let p = tmp.path().join(format!("{name}.sarif"));
        fs::write(&p, &o.stdout).unwrap();
        files.push(p);
    }
    // Replayed changes ride along as notifications.
    let against: Value = serde_json::from_slice(&fs::read(&files[3]).unwrap()).unwrap();
    let notes = against["runs"][0]["invocations"][0]["toolExecutionNotifications"]
        .as_array()
        .unwrap();
    assert!(
        notes.iter().any(|n| n["descriptor"]["id"] == "newly_denied"
            && n["message"]["text"]
                .as_str()
                .unwrap()
                .starts_with("3 × CONNECT pypi.org:443: was allowed by pypi")),
        "{notes:?}"
    );
    let tool = validators::check_jsonschema("sarif_output_is_valid_sarif_2_1_0");
    let (ok, report) = validators::validate(&tool, &schema, &files);
    assert!(ok, "SARIF that the 2.1.0 schema refuses: {report:#}");
    // The validator does refuse a document that breaks the schema.
    let bad = tmp.path().join("bad.sarif");
    let mut v: Value = serde_json::from_slice(&fs::read(&files[0]).unwrap()).unwrap();
    v["runs"][0]["results"][0]["level"] = "fatal".into();
    fs::write(&bad, serde_json::to_vec(&v).unwrap()).unwrap();
    let (ok, _) = validators::validate(&tool, &schema, &[bad]);
    assert!(!ok, "an invalid level passed the SARIF schema");
}

#[test]
fn against_shows_what_would_be_newly_denied_in_every_format() {
    let f = fixture();
    let json = check(&[&"--format", &"json", &"--against", &f.log, &f.warns]);
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    // The failing policy test still decides the exit code; the replay does not.
    assert_eq!(json.status.code(), Some(1));
    assert_eq!(v["exit"], 1);
    let a = &v["against"];
    assert_eq!(a["lines"], 4);
    assert_eq!(a["newly_denied_total"], 3);
    assert_eq!(a["newly_allowed_total"], 1);
    assert_eq!(a["newly_denied"][0]["request"], "CONNECT pypi.org:443");
    assert_eq!(a["newly_denied"][0]["before"], "allowed by pypi");
    assert_eq!(a["newly_denied"][0]["after"], "denied no_exception");
    assert_eq!(a["newly_allowed"][0]["after"], "allowed by wild");

    let gh = check(&[&"--format", &"github", &"--against", &f.log, &f.warns]);
    let out = stdout(&gh);
    assert!(
        out.contains("::warning title=egressd check --against%3A would be newly denied::3 × CONNECT pypi.org:443: was allowed by pypi, now denied no_exception"),
        "{out}"
    );
    assert!(
        out.contains("::notice title=egressd check --against%3A would be newly allowed::1 × CONNECT docs.example.net:443"),
        "{out}"
    );
    // The replay's own report follows, as the job log.
    assert!(out.contains("newly denied 3, newly allowed 1"), "{out}");

    let text = check(&[&"--against", &f.log, &f.warns]);
    assert!(stdout(&text)
        .contains("CONNECT pypi.org:443  was allowed by pypi, now denied no_exception"));

    // A log that cannot be read fails the check in every format.
    let missing = f.log.with_file_name("nope.log");
    for format in FORMATS {
        let o = check(&[&"--format", &format, &"--against", &missing, &f.warns]);
        assert_eq!(o.status.code(), Some(1), "{format}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("nope.log"),
            "{format}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
