//! `egressd check`: a policy's errors, its lint warnings, and its policy
//! tests (`tests.yaml` beside it), with the exit code CI reads.
//!
//! A command on top of the crate: it reads a compiled policy and decides
//! cases through `explain`'s target forms. It owns the warnings ([`lint`])
//! and the case runner ([`cases`]); it does not own loading or deciding
//! (`policy`).

pub mod cases;
pub mod lint;
pub mod schema;

use std::io::Write;
use std::path::Path;

use crate::policy;
use crate::time::unix_now;
use lint::lint;

/// `egressd check POLICY`: prints errors (exit 1) or warnings and a summary,
/// then runs the policy tests (exit 1 if one fails; else 0).
pub fn run_check(path: &Path, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    check_at(path, unix_now(), out, err)
}

/// [`run_check`] as of a given time (tests).
pub fn check_at(path: &Path, now: i64, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let policy = match policy::load(path) {
        Ok(p) => p,
        Err(e) => {
            for d in &e.0 {
                let _ = writeln!(err, "error: {d}");
            }
            let n = e.0.len();
            let _ = writeln!(
                err,
                "{}: {n} error{}, policy not loaded",
                path.display(),
                plural(n)
            );
            return 1;
        }
    };
    let warnings = lint(&policy, now);
    for w in &warnings {
        let _ = writeln!(out, "{w}");
    }
    let (e, f, w) = (policy.exceptions.len(), policy.files.len(), warnings.len());
    let _ = writeln!(
        out,
        "{}: {e} exception{} in {f} file{}, 0 errors, {w} warning{}",
        path.display(),
        plural(e),
        plural(f),
        plural(w)
    );
    // Policy tests (tests.yaml) beside the policy: a failing case fails the check.
    let t = cases::run(&cases::test_files(path), &policy, now, out, err);
    if t.failed > 0 || t.errors > 0 {
        return 1;
    }
    0
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
