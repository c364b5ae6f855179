//! Independent validators the schema, SARIF and workflow tests run egressd's
//! output through. They are outside tools on purpose: a schema checked only
//! by the code that wrote it proves little.
//!
//! `check-jsonschema` (PyPI) is found through `EGRESSD_CHECK_JSONSCHEMA` or
//! `PATH`; `tests/setup` installs it. A missing validator fails the test
//! with the command that installs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `check-jsonschema` executable; `test` fails when it is absent.
pub fn check_jsonschema(test: &str) -> PathBuf {
    let found = std::env::var_os("EGRESSD_CHECK_JSONSCHEMA")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join("check-jsonschema"))
                .find(|p| p.is_file())
        });
    found.unwrap_or_else(|| {
        panic!(
            "{test}: {} (or set EGRESSD_CHECK_JSONSCHEMA)",
            crate::support::missing("check-jsonschema")
        )
    })
}

/// Validates `instances` against `schema`; the validator's output (JSON)
/// and whether every instance passed.
pub fn validate(tool: &Path, schema: &Path, instances: &[PathBuf]) -> (bool, serde_json::Value) {
    let o = run(Command::new(tool)
        .args(["--output-format", "json", "--schemafile"])
        .arg(schema)
        .args(instances));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "check-jsonschema printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.success(), v)
}

/// The files the validator found errors in (from [`validate`]'s output).
pub fn failed_files(report: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = report["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(report["parse_errors"].as_array().into_iter().flatten())
        .filter_map(|e| e["filename"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Checks `schema` itself against its metaschema.
pub fn check_metaschema(tool: &Path, schema: &Path) -> Output {
    run(Command::new(tool).arg("--check-metaschema").arg(schema))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()))
}
