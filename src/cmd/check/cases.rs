//! Policy tests: `tests.yaml` (and `*.tests.yaml`) beside the policy files,
//! run by `egressd check`, so a change to the exceptions is reviewed in CI
//! like code. Each case is a TARGET in `egressd explain`'s forms and the
//! decision expected for it:
//!
//! ```yaml
//! tests:
//!   - name: pip reaches PyPI            # optional
//!     target: https://pypi.org/simple/requests/
//!     expect: allow                     # allow | deny
//!     exception: pypi                   # optional: the exception named
//!   - target: dns:pypi.org/TXT
//!     client: ci-runner                 # optional: decide as this client
//!     intercept: false                  # optional: as with serve --ca-dir
//!     expect: deny
//!     reason: qtype_not_allowed         # optional: the reason logged
//! ```
//!
//! Cases are decided by [`crate::cmd::offline::decide_target`] as of now, so an
//! exception that expires makes its cases fail on the day it does. Unknown
//! keys are errors, as in policy files. A policy loaded from a directory
//! never reads these files as policy ([`crate::policy::read_sources`] skips them).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cmd::offline::decide_target;
use crate::policy::{ClientIdx, Logged, Policy};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTests {
    #[serde(default)]
    tests: Vec<RawCase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    #[serde(default)]
    name: Option<String>,
    target: String,
    #[serde(default)]
    client: Option<String>,
    #[serde(default)]
    intercept: bool,
    expect: Expect,
    #[serde(default)]
    exception: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Expect {
    Allow,
    Deny,
}

/// The policy-test files for a policy path: in a directory, `tests.yaml`,
/// `tests.yml` and `*.tests.yaml`/`*.tests.yml`; beside a single file
/// `x.yaml`, `x.tests.yaml`.
pub fn test_files(policy: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if policy.is_dir() {
        if let Ok(rd) = std::fs::read_dir(policy) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let is_test = name == "tests.yaml"
                    || name == "tests.yml"
                    || name.ends_with(".tests.yaml")
                    || name.ends_with(".tests.yml");
                if is_test && !name.starts_with('.') && e.path().is_file() {
                    out.push(e.path());
                }
            }
        }
    } else if let Some(stem) = policy
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".yaml").or_else(|| n.strip_suffix(".yml")))
    {
        let p = policy.with_file_name(format!("{stem}.tests.yaml"));
        if p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// What running the cases came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub passed: usize,
    pub failed: usize,
    /// Files that did not parse.
    pub errors: usize,
}

/// One failing case, located at its list item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub line: usize,
    pub name: Option<String>,
    pub target: String,
    /// `expected allow, got deny (no_exception)`.
    pub why: String,
}

impl Failure {
    /// `name: target: why`, as the text output prints it after `FAIL `.
    pub fn message(&self) -> String {
        let name = self
            .name
            .as_deref()
            .map(|n| format!("{n}: "))
            .unwrap_or_default();
        format!("{name}{}: {}", self.target, self.why)
    }
}

/// Why a test file ran no case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileError {
    Read(String),
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
}

/// One test file's cases, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOutcome {
    pub file: PathBuf,
    pub result: Result<FileCases, FileError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCases {
    pub cases: usize,
    pub passed: usize,
    pub failures: Vec<Failure>,
}

/// Decides every case in `files` against `policy` as of `now`.
pub fn evaluate(files: &[PathBuf], policy: &Policy, now: i64) -> Vec<FileOutcome> {
    files
        .iter()
        .map(|f| FileOutcome {
            file: f.clone(),
            result: evaluate_file(f, policy, now),
        })
        .collect()
}

fn evaluate_file(f: &Path, policy: &Policy, now: i64) -> Result<FileCases, FileError> {
    let text = std::fs::read_to_string(f).map_err(|e| FileError::Read(e.to_string()))?;
    let raw: RawTests = serde_yaml_ng::from_str(&text).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        let mut message = e.to_string();
        if let Some(i) = message.find(" at line ") {
            message.truncate(i);
        }
        FileError::Parse {
            line,
            column,
            message,
        }
    })?;
    let lines = case_lines(&text);
    let mut out = FileCases {
        cases: raw.tests.len(),
        passed: 0,
        failures: Vec::new(),
    };
    for (i, c) in raw.tests.iter().enumerate() {
        match check_case(policy, c, now) {
            Ok(()) => out.passed += 1,
            Err(why) => out.failures.push(Failure {
                line: lines.get(i).copied().unwrap_or(1),
                name: c.name.clone(),
                target: c.target.clone(),
                why,
            }),
        }
    }
    Ok(out)
}

/// What [`evaluate`]'s results add up to.
pub fn total(outcomes: &[FileOutcome]) -> Outcome {
    let mut t = Outcome::default();
    for o in outcomes {
        match &o.result {
            Ok(c) => {
                t.passed += c.passed;
                t.failed += c.failures.len();
            }
            Err(_) => t.errors += 1,
        }
    }
    t
}

/// Prints [`evaluate`]'s results as text: each failure as
/// `file:line: FAIL …` and a summary line per file on `out`, files that
/// cannot be read or parsed on `err`.
pub fn print(outcomes: &[FileOutcome], out: &mut dyn Write, err: &mut dyn Write) {
    for o in outcomes {
        let f = o.file.display();
        match &o.result {
            Err(FileError::Read(e)) => {
                let _ = writeln!(err, "error: {f}: cannot read: {e}");
            }
            Err(FileError::Parse {
                line,
                column,
                message,
            }) => {
                let _ = writeln!(err, "error: {f}:{line}:{column}: {message}");
            }
            Ok(c) => {
                for fail in &c.failures {
                    let _ = writeln!(out, "{f}:{}: FAIL {}", fail.line, fail.message());
                }
                let failed = c.failures.len();
                let _ = writeln!(
                    out,
                    "{f}: {} case{}, {} passed, {failed} failed",
                    c.cases,
                    if c.cases == 1 { "" } else { "s" },
                    c.passed
                );
            }
        }
    }
}

/// Runs every case in `files` against `policy` as of `now`, printing each
/// failure as `file:line: FAIL …` and a summary line per file.
pub fn run(
    files: &[PathBuf],
    policy: &Policy,
    now: i64,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Outcome {
    let outcomes = evaluate(files, policy, now);
    print(&outcomes, out, err);
    total(&outcomes)
}

fn check_case(policy: &Policy, c: &RawCase, now: i64) -> Result<(), String> {
    let client = match &c.client {
        None => None,
        Some(id) => match policy.clients.iter().position(|x| &*x.id == id) {
            Some(i) => Some(i as ClientIdx),
            None => return Err(format!("client {id:?} is not in settings.clients")),
        },
    };
    let d = decide_target(policy, client, &c.target, c.intercept, now)?;
    let allowed = d.logged() == Logged::Allow;
    let got_ex = d.exception.map(|e| &*e.id);
    let got = match (allowed, got_ex) {
        (true, Some(e)) => format!("allow by {e}"),
        (true, None) => "allow".to_string(),
        (false, Some(e)) => format!("deny ({}, closest {e})", d.reason.as_str()),
        (false, None) => format!("deny ({})", d.reason.as_str()),
    };
    let want_allow = c.expect == Expect::Allow;
    let mut wrong = allowed != want_allow;
    if let Some(e) = &c.exception {
        wrong |= got_ex != Some(e.as_str());
    }
    if let Some(r) = &c.reason {
        wrong |= d.reason.as_str() != r;
    }
    if !wrong {
        return Ok(());
    }
    let mut want = if want_allow { "allow" } else { "deny" }.to_string();
    if let Some(r) = &c.reason {
        want.push_str(&format!(" ({r})"));
    }
    if let Some(e) = &c.exception {
        want.push_str(&format!(
            " {} {e}",
            if want_allow { "by" } else { "naming" }
        ));
    }
    Err(format!("expected {want}, got {got}"))
}

/// The line each case starts on: list items at the indentation of the
/// first item under `tests:`.
fn case_lines(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut in_tests = false;
    let mut indent: Option<usize> = None;
    for (n, l) in text.lines().enumerate() {
        let t = l.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let ind = l.len() - t.len();
        if ind == 0 {
            in_tests = t.starts_with("tests:");
            continue;
        }
        if in_tests && t.starts_with("- ") {
            match indent {
                None => {
                    indent = Some(ind);
                    out.push(n + 1);
                }
                Some(i) if i == ind => out.push(n + 1),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_yaml;

    const NOW: i64 = 1_800_000_000;

    fn run_text(cases: &str) -> (Outcome, String, String) {
        let p = from_yaml(
            "settings:\n  clients:\n    - id: ci\n      sources: [10.8.0.0/16]\nexceptions:\n  - id: pypi\n    owner: o\n    reason: r\n    hosts: [pypi.org]\n    ports: [443]\n  - id: gh-api\n    owner: o\n    reason: r\n    hosts: [api.github.com]\n    methods: [GET]\n  - id: ci-only\n    owner: o\n    reason: r\n    clients: [ci]\n    hosts: [artifacts.example.com]\n",
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "egressd-cases-{}-{}",
            std::process::id(),
            cases.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("tests.yaml");
        std::fs::write(&f, cases).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let o = run(&[f], &p, NOW, &mut out, &mut err);
        let _ = std::fs::remove_dir_all(&dir);
        (
            o,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn passing_and_failing_cases() {
        let (o, out, _) = run_text(
            "# comment\ntests:\n  - name: pip\n    target: https://pypi.org/simple/\n    expect: allow\n    exception: pypi\n  - target: http://pypi.org/\n    expect: deny\n    reason: port_not_allowed\n  - target: dns:pypi.org/TXT\n    expect: deny\n  - target: https://api.github.com/x\n    expect: deny\n    reason: inspection_required\n  - target: DELETE https://api.github.com/x\n    intercept: true\n    expect: deny\n    reason: method_not_allowed\n  - target: https://artifacts.example.com/\n    client: ci\n    expect: allow\n  - name: wrong on purpose\n    target: https://example.com/\n    expect: allow\n",
        );
        assert_eq!(
            o,
            Outcome {
                passed: 6,
                failed: 1,
                errors: 0
            },
            "{out}"
        );
        assert!(
            out.contains(
                "tests.yaml:22: FAIL wrong on purpose: https://example.com/: expected allow, got deny (no_exception)"
            ),
            "{out}"
        );
        assert!(out.contains("7 cases, 6 passed, 1 failed"), "{out}");
    }

    #[test]
    fn bad_files_are_errors() {
        let (o, _, err) = run_text(
            "tests:\n  - target: https://pypi.org/\n    expect: allow\n    colour: blue\n",
        );
        assert_eq!(o.errors, 1);
        assert!(err.contains("tests.yaml:4:"), "{err}");
        assert!(err.contains("unknown field `colour`"), "{err}");
        let (o, out, _) = run_text("tests:\n  - target: pypi.org\n    expect: allow\n  - target: https://pypi.org/\n    client: nobody\n    expect: allow\n");
        assert_eq!(o.failed, 2, "{out}");
        assert!(out.contains("has no port"), "{out}");
        assert!(out.contains("not in settings.clients"), "{out}");
    }
}
