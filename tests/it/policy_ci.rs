//! examples/policy-ci/ as it will run: the workflow passes GitHub's workflow
//! schema (check-jsonschema's bundled copy), its `run:` steps (all but the
//! two that need GitHub: installing from the image, fetching the log) run
//! in a policy repository made here with this build of egressd on PATH, and
//! the pre-commit hooks' commands do too. A broken policy fails the lint
//! step and the commit hook.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_yaml_ng::Value;

use super::validators;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policy-ci")
}

/// Steps that only work on GitHub (pull the image, download the log);
/// the test provides their results itself.
const GITHUB_ONLY: &[&str] = &["install", "fetch-log"];

/// A policy repository: the shipped policy and its tests, and a gzip log of
/// recent traffic in which one exception the policy no longer has allowed
/// requests.
fn policy_repo() -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    let policy = repo.path().join("policy");
    fs::create_dir_all(&policy).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    for e in fs::read_dir(&shipped).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            fs::copy(&p, policy.join(p.file_name().unwrap())).unwrap();
        }
    }
    let line = |host: &str, exception: &str| {
        format!(
            "{{\"ts\":\"2027-01-01T00:00:00.000Z\",\"client\":\"-\",\"src\":\"10.1.1.1:5\",\"proto\":\"connect\",\"host\":\"{host}\",\"port\":443,\"addr\":null,\"method\":\"CONNECT\",\"path\":null,\"decision\":\"allow\",\"reason\":\"exception\",\"exception\":\"{exception}\",\"owner\":\"t\",\"mode\":\"enforce\",\"status\":200,\"bytes_up\":1,\"bytes_down\":2,\"duration_ms\":3}}\n"
        )
    };
    let f = fs::File::create(repo.path().join("recent-decisions.log.gz")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    gz.write_all(line("pypi.org", "pypi").as_bytes()).unwrap();
    for _ in 0..2 {
        gz.write_all(line("retired.example.com", "retired").as_bytes())
            .unwrap();
    }
    gz.finish().unwrap();
    repo
}

fn bash(script: &str, dir: &Path, summary: &Path) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_egressd")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("GITHUB_STEP_SUMMARY", summary)
        .env("GITHUB_EVENT_NAME", "pull_request")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The workflow's steps that run commands: (name, id, script).
fn run_steps() -> Vec<(String, String, String)> {
    let wf: Value = serde_yaml_ng::from_str(
        &fs::read_to_string(example().join(".github/workflows/egressd-policy.yml")).unwrap(),
    )
    .unwrap();
    let steps = wf["jobs"]["check"]["steps"].as_sequence().unwrap();
    steps
        .iter()
        .filter_map(|s| {
            let run = s.get("run")?.as_str()?.to_string();
            let name = s["name"].as_str().unwrap_or("?").to_string();
            let id = s
                .get("id")
                .and_then(|i| i.as_str())
                .unwrap_or("")
                .to_string();
            Some((name, id, run))
        })
        .collect()
}

#[test]
fn workflow_is_a_valid_github_workflow() {
    let tool = validators::check_jsonschema("workflow_is_a_valid_github_workflow");
    let o = Command::new(tool)
        .args(["--builtin-schema", "vendor.github-workflows"])
        .arg(example().join(".github/workflows/egressd-policy.yml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn workflow_steps_run_against_a_policy_repository() {
    let repo = policy_repo();
    let summary = repo.path().join("summary.md");
    let steps = run_steps();
    let ran: Vec<&str> = steps
        .iter()
        .filter(|(_, id, _)| !GITHUB_ONLY.contains(&id.as_str()))
        .map(|(name, _, _)| name.as_str())
        .collect();
    assert!(ran.len() >= 3, "{ran:?}");
    let mut log = String::new();
    for (name, id, script) in &steps {
        if GITHUB_ONLY.contains(&id.as_str()) {
            continue;
        }
        let o = bash(script, repo.path(), &summary);
        assert!(o.status.success(), "step {name:?} failed:\n{}", text(&o));
        log.push_str(&text(&o));
    }
    // The replay named the exception that is gone, as an annotation and
    // in the job summary.
    assert!(
        log.contains("::warning title=egressd check --against%3A would be newly denied::2 × CONNECT retired.example.com:443: was allowed by retired"),
        "{log}"
    );
    let written = fs::read_to_string(&summary).unwrap();
    assert!(
        written.contains("newly denied 2, newly allowed 0"),
        "{written}"
    );
    assert!(written.starts_with("### egressd"), "{written}");
    // The SARIF file the upload step sends is there and is SARIF.
    let sarif: serde_json::Value =
        serde_json::from_slice(&fs::read(repo.path().join("egressd.sarif")).unwrap()).unwrap();
    assert_eq!(sarif["version"], "2.1.0");

    // A broken policy: the lint step fails with an annotation on the line,
    // and the SARIF step still leaves its file for the upload.
    fs::write(
        repo.path().join("policy/50-broken.yaml"),
        "exceptions:\n  - id: typo\n    owner: o\n    reason: r\n    hots: [x.example.com]\n",
    )
    .unwrap();
    let lint = steps
        .iter()
        .find(|(_, _, s)| s.contains("--format github policy/") && !s.contains("--against"))
        .expect("a lint step");
    let o = bash(&lint.2, repo.path(), &summary);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(
            "::error file=policy/50-broken.yaml,line=5,col=5,title=egressd policy_error::"
        ),
        "{}",
        text(&o)
    );
    fs::remove_file(repo.path().join("egressd.sarif")).unwrap();
    let sarif_step = steps
        .iter()
        .find(|(_, _, s)| s.contains("--format sarif"))
        .unwrap();
    let o = bash(&sarif_step.2, repo.path(), &summary);
    assert!(o.status.success(), "{}", text(&o));
    let sarif: serde_json::Value =
        serde_json::from_slice(&fs::read(repo.path().join("egressd.sarif")).unwrap()).unwrap();
    assert_eq!(sarif["runs"][0]["results"][0]["ruleId"], "policy_error");
}

/// The hooks of `.pre-commit-hooks.yaml`, and the same hooks in the
/// `repo: local` configuration: (id, entry + args).
fn hooks(file: &str, local: bool) -> Vec<(String, String)> {
    let v: Value =
        serde_yaml_ng::from_str(&fs::read_to_string(example().join(file)).unwrap()).unwrap();
    let list = if local {
        v["repos"][0]["hooks"].clone()
    } else {
        v
    };
    list.as_sequence()
        .unwrap()
        .iter()
        .map(|h| {
            for key in ["id", "name", "entry", "language"] {
                assert!(h.get(key).is_some(), "{file}: a hook without {key}");
            }
            assert_eq!(h["language"].as_str(), Some("system"));
            assert_eq!(h["pass_filenames"].as_bool(), Some(false));
            let args: Vec<&str> = h["args"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            (
                h["id"].as_str().unwrap().to_string(),
                format!("{} {}", h["entry"].as_str().unwrap(), args.join(" ")),
            )
        })
        .collect()
}

#[test]
fn pre_commit_hooks_run_check_and_the_replay() {
    let published = hooks(".pre-commit-hooks.yaml", false);
    assert_eq!(published, hooks(".pre-commit-config.yaml", true));
    let ids: Vec<&str> = published.iter().map(|h| h.0.as_str()).collect();
    assert_eq!(ids, ["egressd-check", "egressd-check-against"]);
    let repo = policy_repo();
    let summary = repo.path().join("summary.md");
    for (id, cmd) in &published {
        let o = bash(cmd, repo.path(), &summary);
        assert!(o.status.success(), "{id}: {cmd}\n{}", text(&o));
        if id == "egressd-check-against" {
            assert!(
                text(&o).contains("CONNECT retired.example.com:443  was allowed by retired"),
                "{}",
                text(&o)
            );
        }
    }
    // A failing policy test stops the commit.
    let tests = repo.path().join("policy/tests.yaml");
    let mut t = fs::read_to_string(&tests).unwrap();
    t.push_str("  - target: https://example.org/\n    expect: allow\n");
    fs::write(&tests, t).unwrap();
    let o = bash(&published[0].1, repo.path(), &summary);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("FAIL https://example.org/"),
        "{}",
        text(&o)
    );
}
