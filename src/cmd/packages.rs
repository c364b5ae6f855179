//! `egressd packages import LOCKFILE…`: the approved set a project's
//! lockfiles already pin, written as a `packages:` policy file for review.
//! The translation is the pure [`crate::packages::import`]; this
//! command reads the lockfiles and writes the YAML (stdout, or `--output`
//! atomically, so a policy directory never sees a half-written file).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::packages::import::{import, ImportSet};

/// Exit status: the set was written.
pub const OK: i32 = 0;
/// Exit status: a lockfile could not be read or translated.
pub const FAILED: i32 = 1;

/// `egressd packages …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Write an approved set pinning the exact versions (and sha256 of files,
    /// where the lockfile has them) of uv.lock, requirements*.txt with
    /// --hash, package-lock.json, npm-shrinkwrap.json, pnpm-lock.yaml,
    /// Cargo.lock and go.sum. One set per ecosystem.
    Import {
        /// The set's id (`<id>-<ecosystem>` each when the lockfiles span several).
        #[arg(long)]
        id: String,
        /// Who answers for these packages (the set's `owner`).
        #[arg(long)]
        owner: String,
        /// The set's `reason` (default: "pinned from <lockfiles>").
        #[arg(long)]
        reason: Option<String>,
        /// Write the YAML here (atomically) instead of to stdout.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
        #[arg(required = true, value_name = "LOCKFILE")]
        lockfiles: Vec<PathBuf>,
    },
}

/// `egressd packages`: the command's entry.
pub fn main(command: Command, out: &mut dyn Write, err: &mut dyn Write) -> super::Exit {
    let Command::Import {
        id,
        owner,
        reason,
        output,
        lockfiles,
    } = command;
    let args = ImportArgs {
        id: &id,
        owner: &owner,
        reason: reason.as_deref(),
        output: output.as_deref(),
        lockfiles: &lockfiles,
    };
    run_import(&args, out, err).into()
}

/// What `packages import` was asked for.
pub struct ImportArgs<'a> {
    pub id: &'a str,
    pub owner: &'a str,
    pub reason: Option<&'a str>,
    pub output: Option<&'a Path>,
    pub lockfiles: &'a [PathBuf],
}

/// Runs `egressd packages import`; errors go to `err` as `file:line: message`.
pub fn run_import(args: &ImportArgs, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let mut texts = Vec::with_capacity(args.lockfiles.len());
    for path in args.lockfiles {
        match std::fs::read_to_string(path) {
            Ok(t) => texts.push(t),
            Err(e) => {
                let _ = writeln!(err, "egressd: {}: {e}", path.display());
                return FAILED;
            }
        }
    }
    let files: Vec<(&Path, &str)> = args
        .lockfiles
        .iter()
        .map(PathBuf::as_path)
        .zip(texts.iter().map(String::as_str))
        .collect();
    let set = ImportSet {
        id: args.id,
        owner: args.owner,
        reason: args.reason,
    };
    let yaml = match import(&files, &set) {
        Ok(y) => y,
        Err(e) => {
            let _ = writeln!(err, "egressd: {e}");
            return FAILED;
        }
    };
    let written = match args.output {
        None => out
            .write_all(yaml.as_bytes())
            .map_err(|e| ("stdout".into(), e)),
        Some(path) => write_atomically(path, &yaml).map_err(|e| (path.display().to_string(), e)),
    };
    match written {
        Ok(()) => OK,
        Err((what, e)) => {
            let _ = writeln!(err, "egressd: {what}: {e}");
            FAILED
        }
    }
}

/// Writes `text` beside `path` and renames it over: a watcher reloading the
/// policy directory sees the old file or the whole new one.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the output needs a file name"))?;
    let tmp = dir
        .unwrap_or(Path::new("."))
        .join(format!(".{}.tmp", name.to_string_lossy()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
