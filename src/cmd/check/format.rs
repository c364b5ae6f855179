//! The four ways `check` prints a [`Checked`]: text for people, one JSON
//! document for scripts, GitHub Actions workflow commands (an annotation on
//! each finding's line) and SARIF 2.1.0 for code-scanning UIs. Each renders
//! the same findings; none decides anything.

use std::io::{self, Write};
use std::path::{Component, Path};

use serde_json::{json, Value};

use super::against::{largest_first, Replayed};
use super::lint::Lint;
use super::{plural, Checked, Level, RULE_POLICY_ERROR, RULE_TEST_FAILED, RULE_TEST_INVALID};

/// Replayed changes turned into annotations, per direction: GitHub shows
/// at most 10 warnings per step, the rest are summarised in one notice.
pub const MAX_CHANGE_ANNOTATIONS: usize = 10;

/// The text format (`egressd check`'s output before there were formats):
/// load errors on `err` as `error: file:line:col: …`; else warnings and a
/// summary on `out`, then the policy tests.
pub fn text(c: &Checked, out: &mut dyn Write, err: &mut dyn Write) {
    let Some((exceptions, files)) = c.loaded else {
        for f in &c.findings {
            let _ = writeln!(
                err,
                "error: {}:{}:{}: {}",
                f.file.display(),
                f.line,
                f.column,
                f.message
            );
        }
        let n = c.findings.len();
        let _ = writeln!(
            err,
            "{}: {n} error{}, policy not loaded",
            c.policy.display(),
            plural(n)
        );
        return;
    };
    let lints: Vec<_> = c.findings.iter().filter(|f| is_lint(f.rule)).collect();
    for w in &lints {
        let _ = writeln!(
            out,
            "{}:{}: warning: {}",
            w.file.display(),
            w.line,
            w.message
        );
    }
    let w = lints.len();
    let _ = writeln!(
        out,
        "{}: {exceptions} exception{} in {files} file{}, 0 errors, {w} warning{}",
        c.policy.display(),
        plural(exceptions),
        plural(files),
        plural(w)
    );
    super::cases::print(&c.tests, out, err);
}

fn is_lint(rule: &str) -> bool {
    Lint::ALL.iter().any(|l| l.as_str() == rule)
}

fn summary(c: &Checked) -> String {
    let t = super::cases::total(&c.tests);
    match c.loaded {
        None => format!(
            "{}: {} error{}, policy not loaded",
            c.policy.display(),
            c.count(Level::Error),
            plural(c.count(Level::Error))
        ),
        Some((e, f)) => format!(
            "{}: {e} exception{} in {f} file{}, {} warning{}; policy tests: {} passed, {} failed{}",
            c.policy.display(),
            plural(e),
            plural(f),
            c.count(Level::Warning),
            plural(c.count(Level::Warning)),
            t.passed,
            t.failed,
            if t.errors > 0 {
                format!(", {} file{} invalid", t.errors, plural(t.errors))
            } else {
                String::new()
            }
        ),
    }
}

/// One JSON document: the findings, the policy tests, the replay, the exit code.
pub fn json(
    c: &Checked,
    replay: Option<&Replayed>,
    exit: i32,
    out: &mut dyn Write,
) -> io::Result<()> {
    let t = super::cases::total(&c.tests);
    let doc = json!({
        "policy": c.policy.display().to_string(),
        "loaded": c.loaded.is_some(),
        "exceptions": c.loaded.map(|l| l.0),
        "files": c.loaded.map(|l| l.1),
        "errors": c.count(Level::Error),
        "warnings": c.count(Level::Warning),
        "tests": {
            "files": c.tests.len(),
            "passed": t.passed,
            "failed": t.failed,
            "invalid_files": t.errors,
        },
        "findings": c.findings.iter().map(|f| json!({
            "level": f.level.as_str(),
            "rule": f.rule,
            "file": f.file.display().to_string(),
            "line": (f.line > 0).then_some(f.line),
            "column": (f.column > 0).then_some(f.column),
            "message": f.message,
        })).collect::<Vec<_>>(),
        "against": replay.map(replay_json),
        "exit": exit,
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
}

fn replay_json(r: &Replayed) -> Value {
    let changes = |map| {
        largest_first(map)
            .into_iter()
            .map(|(k, c)| {
                json!({
                    "request": k.what,
                    "before": k.before,
                    "after": k.after,
                    "count": c.count,
                    "clients": c.clients,
                    "more_clients": c.clients_more,
                    "example": c.example,
                })
            })
            .collect::<Vec<_>>()
    };
    let p = &r.replay;
    json!({
        "logs": r.logs.iter().map(|l| l.display().to_string()).collect::<Vec<_>>(),
        "lines": p.lines,
        "unreadable_lines": r.read.unreadable,
        "replayed": p.replayed,
        "unchanged": p.unchanged,
        "other_exception": p.other_exception,
        "not_replayable": p.not_replayable,
        "newly_denied_total": p.newly_denied_total,
        "newly_allowed_total": p.newly_allowed_total,
        "untracked": p.untracked,
        "newly_denied": changes(&p.newly_denied),
        "newly_allowed": changes(&p.newly_allowed),
    })
}

/// GitHub Actions workflow commands: `::error file=…,line=…,col=…::…` and
/// `::warning …` per finding, the replay's changes as annotations without
/// a file, then the summary as a plain log line.
pub fn github(c: &Checked, replay: Option<&Replayed>, out: &mut dyn Write) -> io::Result<()> {
    for f in &c.findings {
        let mut props = format!("file={}", gh_property(&f.file.display().to_string()));
        if f.line > 0 {
            props.push_str(&format!(",line={}", f.line));
        }
        if f.column > 0 {
            props.push_str(&format!(",col={}", f.column));
        }
        props.push_str(&format!(
            ",title={}",
            gh_property(&format!("egressd {}", f.rule))
        ));
        writeln!(
            out,
            "::{} {props}::{}",
            f.level.as_str(),
            gh_data(&f.message)
        )?;
    }
    if let Some(r) = replay {
        let p = &r.replay;
        for (kind, title, map) in [
            ("warning", "would be newly denied", &p.newly_denied),
            ("notice", "would be newly allowed", &p.newly_allowed),
        ] {
            let v = largest_first(map);
            for (k, ch) in v.iter().take(MAX_CHANGE_ANNOTATIONS) {
                let more = if ch.clients_more { ", …" } else { "" };
                let msg = format!(
                    "{} × {}: was {}, now {} (clients: {}{more}; e.g. {})",
                    ch.count,
                    k.what,
                    k.before,
                    k.after,
                    ch.clients.join(", "),
                    ch.example
                );
                writeln!(
                    out,
                    "::{kind} title={}::{}",
                    gh_property(&format!("egressd check --against: {title}")),
                    gh_data(&msg)
                )?;
            }
            if v.len() > MAX_CHANGE_ANNOTATIONS {
                writeln!(
                    out,
                    "::notice title={}::{}",
                    gh_property(&format!("egressd check --against: {title}")),
                    gh_data(&format!(
                        "… and {} more groups (see the job log)",
                        v.len() - MAX_CHANGE_ANNOTATIONS
                    ))
                )?;
            }
        }
        let policy = c.policy.display().to_string();
        p.print(&policy, &r.logs, out)?;
    }
    writeln!(out, "{}", summary(c))
}

/// A workflow command's message: `%`, CR and LF escaped.
fn gh_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// A workflow command's property value: as [`gh_data`], and `:` and `,`.
fn gh_property(s: &str) -> String {
    gh_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// The SARIF rules: every lint, and the errors `check` reports.
fn sarif_rules() -> Vec<(&'static str, &'static str, Level)> {
    let mut v = vec![
        (
            RULE_POLICY_ERROR,
            "The policy does not load: egressd would refuse it (and a reload keeps the last \
             good policy).",
            Level::Error,
        ),
        (
            RULE_TEST_FAILED,
            "A policy test (tests.yaml) expects another decision than the policy makes.",
            Level::Error,
        ),
        (
            RULE_TEST_INVALID,
            "A policy-test file cannot be read or parsed.",
            Level::Error,
        ),
    ];
    v.extend(
        Lint::ALL
            .iter()
            .map(|l| (l.as_str(), l.describe(), Level::Warning)),
    );
    v
}

/// A replay's summary and changes, as notifications of the invocation.
fn notifications(r: &Replayed) -> Vec<Value> {
    let mut notifications = Vec::new();
    let p = &r.replay;
    notifications.push(json!({
        "level": "note",
        "descriptor": { "id": "replay" },
        "message": { "text": format!(
            "replayed {} of {} logged decisions: {} newly denied, {} newly allowed",
            p.replayed, p.lines, p.newly_denied_total, p.newly_allowed_total
        ) },
    }));
    for (id, level, map) in [
        ("newly_denied", "warning", &p.newly_denied),
        ("newly_allowed", "note", &p.newly_allowed),
    ] {
        for (k, ch) in largest_first(map) {
            notifications.push(json!({
                "level": level,
                "descriptor": { "id": id },
                "message": { "text": format!(
                    "{} × {}: was {}, now {} (e.g. {})",
                    ch.count, k.what, k.before, k.after, ch.example
                ) },
            }));
        }
    }
    notifications
}

/// SARIF 2.1.0: one run of the `egressd` tool, its rules, a result per
/// finding at its file:line:col; replayed changes as notifications of the
/// invocation (they concern traffic, not a line of the policy).
pub fn sarif(
    c: &Checked,
    replay: Option<&Replayed>,
    exit: i32,
    out: &mut dyn Write,
) -> io::Result<()> {
    let rules = sarif_rules();
    let results: Vec<Value> = c
        .findings
        .iter()
        .map(|f| {
            let index = rules.iter().position(|r| r.0 == f.rule).unwrap_or(0);
            let mut region = serde_json::Map::new();
            if f.line > 0 {
                region.insert("startLine".into(), f.line.into());
                if f.column > 0 {
                    region.insert("startColumn".into(), f.column.into());
                }
            }
            let mut location = json!({
                "artifactLocation": { "uri": artifact_uri(&f.file) },
            });
            if !region.is_empty() {
                location["region"] = Value::Object(region);
            }
            json!({
                "ruleId": f.rule,
                "ruleIndex": index,
                "level": f.level.as_str(),
                "message": { "text": f.message },
                "locations": [{ "physicalLocation": location }],
            })
        })
        .collect();
    let notifications = replay.map(notifications).unwrap_or_default();
    let doc = json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "egressd",
                "semanticVersion": env!("CARGO_PKG_VERSION"),
                "rules": rules.iter().map(|(id, text, level)| json!({
                    "id": id,
                    "name": id,
                    "shortDescription": { "text": text },
                    "defaultConfiguration": { "level": level.as_str() },
                })).collect::<Vec<_>>(),
            }},
            "invocations": [{
                "executionSuccessful": true,
                "exitCode": exit,
                "toolExecutionNotifications": notifications,
            }],
            "results": results,
        }],
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
}

/// A file as a SARIF artifact URI: a relative path stays relative (code
/// scanning resolves it against the repository), an absolute one becomes
/// `file://`; bytes outside RFC 3986's unreserved set and `/` are
/// percent-encoded.
pub fn artifact_uri(path: &Path) -> String {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => parts.push(percent(&s.to_string_lossy())),
            Component::ParentDir => parts.push("..".to_string()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    let joined = parts.join("/");
    if path.is_absolute() {
        format!("file:///{joined}")
    } else {
        joined
    }
}

fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_command_escaping() {
        assert_eq!(gh_data("50% a\r\nb: c, d"), "50%25 a%0D%0Ab: c, d");
        assert_eq!(gh_property("dir,a/b:c%"), "dir%2Ca/b%3Ac%25");
    }

    #[test]
    fn artifact_uris() {
        assert_eq!(
            artifact_uri(Path::new("policy/10-python.yaml")),
            "policy/10-python.yaml"
        );
        assert_eq!(
            artifact_uri(Path::new("./p/a b#c.yaml")),
            "p/a%20b%23c.yaml"
        );
        assert_eq!(
            artifact_uri(Path::new("/srv/pol icy/x.yaml")),
            "file:///srv/pol%20icy/x.yaml"
        );
        assert_eq!(artifact_uri(Path::new("../x/ü.yaml")), "../x/%C3%BC.yaml");
    }
}
