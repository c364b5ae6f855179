//! `egressd check`: a policy's errors, its lint warnings, and its policy
//! tests (`tests.yaml` beside it), with the exit code CI reads; with
//! `--against LOG…`, what the policy would change for recent traffic.
//!
//! A command on top of the crate: it reads a compiled policy and decides
//! cases through `explain`'s target forms. It owns the warnings ([`mod@lint`]),
//! the case runner ([`cases`]), the findings every output format is
//! rendered from ([`Checked`], [`format`]) and the policy's JSON Schema
//! ([`schema`]); it does not own loading or deciding (`policy`), nor the
//! replay of logs (`report::replay`).
//!
//! Every format reports the same findings and exits the same way: 1 when
//! the policy does not load or a policy test fails, else 0; warnings and
//! replayed changes never fail a check.

pub mod against;
pub mod cases;
pub mod format;
pub mod lint;
pub mod schema;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::policy;
use crate::time::unix_now;
use lint::lint;

/// How `check` prints what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// `file:line:col: …` for people (errors on stderr).
    #[default]
    Text,
    /// One JSON document on stdout, for scripts.
    Json,
    /// GitHub Actions workflow commands: each finding is an annotation on its line.
    Github,
    /// SARIF 2.1.0, for code-scanning UIs.
    Sarif,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The check fails.
    Error,
    /// Printed; the check still passes.
    Warning,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warning",
        }
    }
}

/// Rule of a policy that does not load (a [`policy::Diagnostic`]).
pub const RULE_POLICY_ERROR: &str = "policy_error";
/// Rule of a policy test whose decision is not the expected one.
pub const RULE_TEST_FAILED: &str = "policy_test_failed";
/// Rule of a policy-test file that cannot be read or parsed.
pub const RULE_TEST_INVALID: &str = "policy_test_invalid";

/// One thing `check` found, at a place in a file. `line` and `column`
/// are 1-based; 0 when unknown (a file that cannot be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub level: Level,
    /// A [`lint::Lint`] name or one of the `RULE_*` constants.
    pub rule: &'static str,
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Everything one `check` found, before it is printed.
#[derive(Debug, Clone)]
pub struct Checked {
    pub policy: PathBuf,
    /// Exceptions and files of the policy, when it loaded.
    pub loaded: Option<(usize, usize)>,
    /// Load errors; or lint warnings, then policy-test problems.
    pub findings: Vec<Finding>,
    /// Policy tests (none when the policy did not load).
    pub tests: Vec<cases::FileOutcome>,
}

impl Checked {
    pub fn count(&self, level: Level) -> usize {
        self.findings.iter().filter(|f| f.level == level).count()
    }

    /// 1 when the policy does not load or a policy test fails; else 0.
    pub fn exit_code(&self) -> i32 {
        if self.loaded.is_none() || self.count(Level::Error) > 0 {
            1
        } else {
            0
        }
    }
}

/// Loads, lints and tests the policy at `path` as of `now`.
pub fn collect(path: &Path, now: i64) -> Checked {
    let mut checked = Checked {
        policy: path.to_path_buf(),
        loaded: None,
        findings: Vec::new(),
        tests: Vec::new(),
    };
    let policy = match policy::load(path) {
        Ok(p) => p,
        Err(e) => {
            checked.findings =
                e.0.into_iter()
                    .map(|d| Finding {
                        level: Level::Error,
                        rule: RULE_POLICY_ERROR,
                        file: d.file,
                        line: d.line,
                        column: d.column,
                        message: d.message,
                    })
                    .collect();
            return checked;
        }
    };
    checked.loaded = Some((policy.exceptions.len(), policy.files.len()));
    checked
        .findings
        .extend(lint(&policy, now).into_iter().map(|w| Finding {
            level: Level::Warning,
            rule: w.kind.as_str(),
            file: w.file,
            line: w.line,
            column: 0,
            message: w.message,
        }));
    checked.tests = cases::evaluate(&cases::test_files(path), &policy, now);
    for t in &checked.tests {
        match &t.result {
            Ok(c) => checked
                .findings
                .extend(c.failures.iter().map(|fail| Finding {
                    level: Level::Error,
                    rule: RULE_TEST_FAILED,
                    file: t.file.clone(),
                    line: fail.line,
                    column: 0,
                    message: format!("FAIL {}", fail.message()),
                })),
            Err(e) => {
                let (line, column, message) = match e {
                    cases::FileError::Read(e) => (0, 0, format!("cannot read: {e}")),
                    cases::FileError::Parse {
                        line,
                        column,
                        message,
                    } => (*line, *column, message.clone()),
                };
                checked.findings.push(Finding {
                    level: Level::Error,
                    rule: RULE_TEST_INVALID,
                    file: t.file.clone(),
                    line,
                    column,
                    message,
                });
            }
        }
    }
    checked
}

/// `egressd check [POLICY] [--against LOG…] [--format F]`, as parsed.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Policy directory or file (default policy/). Policy tests beside it
    /// (tests.yaml, *.tests.yaml) are run too.
    pub policy: Option<PathBuf>,
    /// Replay these decision logs (plain or gzip) against the policy and
    /// print what would be newly denied or newly allowed. A last value that
    /// is a directory or a .yaml/.yml file is taken as POLICY.
    #[arg(long, value_name = "LOG", num_args = 1..)]
    pub against: Vec<PathBuf>,
    /// text (people), json (scripts), github (workflow annotations on
    /// each line), sarif (SARIF 2.1.0 for code scanning). Exit codes are
    /// the same in every format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

impl Args {
    /// What was asked: `check --against a.log b.log policy/` takes a last
    /// value that is a directory or a `.yaml`/`.yml` file as the policy;
    /// with none, `policy/`.
    pub fn options(self) -> Options {
        let Args {
            policy,
            mut against,
            format,
        } = self;
        let last_is_policy = against.len() > 1
            && against.last().is_some_and(|p| {
                p.is_dir() || p.extension().is_some_and(|e| e == "yaml" || e == "yml")
            });
        let policy = policy
            .or_else(|| last_is_policy.then(|| against.pop()).flatten())
            .unwrap_or_else(|| "policy/".into());
        Options {
            policy,
            against,
            format,
        }
    }
}

/// What `check` was asked, the policy resolved.
#[derive(Debug, Clone)]
pub struct Options {
    pub policy: PathBuf,
    pub against: Vec<PathBuf>,
    pub format: Format,
}

/// `egressd check`: the command's entry.
pub fn main(args: Args, out: &mut dyn Write, err: &mut dyn Write) -> super::Exit {
    run(&args.options(), out, err).into()
}

/// Runs `check` as the command line asked; returns the exit code.
pub fn run(opts: &Options, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    run_at(opts, unix_now(), out, err)
}

/// [`run`] as of a given time (tests).
pub fn run_at(opts: &Options, now: i64, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let checked = collect(&opts.policy, now);
    let mut code = checked.exit_code();
    if opts.format == Format::Text {
        format::text(&checked, out, err);
        if !opts.against.is_empty() {
            code = code.max(crate::cmd::report::replay::run_against(
                &opts.policy,
                &opts.against,
                out,
                err,
            ));
        }
        return code;
    }
    let replay =
        (!opts.against.is_empty()).then(|| against::replay(&opts.policy, &opts.against, now));
    if let Some(Err(e)) = &replay {
        let _ = writeln!(err, "egressd check --against: {e}");
        code = 1;
    }
    let replay = replay.as_ref().and_then(|r| r.as_ref().ok());
    let written = match opts.format {
        Format::Text => unreachable!("handled above"),
        Format::Json => format::json(&checked, replay, code, out),
        Format::Github => format::github(&checked, replay, out),
        Format::Sarif => format::sarif(&checked, replay, code, out),
    };
    if let Err(e) = written {
        let _ = writeln!(err, "egressd check: cannot write the output: {e}");
        return 1;
    }
    code
}

/// `egressd check POLICY`: prints errors (exit 1) or warnings and a summary,
/// then runs the policy tests (exit 1 if one fails; else 0).
pub fn run_check(path: &Path, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    check_at(path, unix_now(), out, err)
}

/// [`run_check`] as of a given time (tests).
pub fn check_at(path: &Path, now: i64, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let checked = collect(path, now);
    format::text(&checked, out, err);
    checked.exit_code()
}

pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
