//! Raw YAML → validated, compiled [`Policy`]: the one pure function both
//! the first load and every reload go through ([`compile`]), one call per
//! concern: every file parsed (an empty one refused: it is a half-written
//! file), the settings ([`settings`]), the exceptions and the matcher over
//! them ([`exceptions`]), the package sets ([`packages`]). Every error is collected with its
//! file:line:column ([`locate`]); a policy with any error is refused whole.
//!
//! Owns validation. Does not own reading files (`read_sources`) or the
//! serde mirror of the format (`raw`).

mod exceptions;
mod locate;
mod packages;
mod settings;

use super::raw::RawFile;
use super::{Diagnostic, LoadError, Policy, Source};

/// Validates and compiles policy sources: the one function both the first
/// load and every reload go through. `env` supplies `${env:…}` values.
pub fn compile(
    sources: &[Source],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, LoadError> {
    compile_digested(sources, digest_sources(sources), env)
}

/// [`compile`] for a caller that already has `digest_sources(sources)`
/// (the reloader compares it first; hashing 13 MB twice is 20 ms).
pub fn compile_digested(
    sources: &[Source],
    digest: [u8; 32],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, LoadError> {
    let parsed = parse(sources)?;
    let mut errors = Errors::default();
    let (settings, clients) = settings::settings(&parsed, &mut errors);
    let (exceptions, matcher) = exceptions::exceptions(&parsed, &clients, env, &mut errors);
    let packages = packages::packages(&parsed, &settings, &clients, &exceptions, env, &mut errors);
    if !errors.0.is_empty() {
        return Err(LoadError(errors.0));
    }
    Ok(Policy {
        settings,
        clients,
        exceptions,
        files: sources.iter().map(|s| s.path.clone()).collect(),
        digest,
        matcher,
        packages,
    })
}

/// Every file as YAML; any file that is empty or does not parse stops the
/// compile here, with all such files reported.
fn parse(sources: &[Source]) -> Result<Vec<(&Source, RawFile)>, LoadError> {
    let mut errors: Vec<Diagnostic> = Vec::new();
    let mut parsed = Vec::new();
    for src in sources {
        if src.text.trim().is_empty()
            || src
                .text
                .lines()
                .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            errors.push(Diagnostic {
                file: src.path.clone(),
                line: 1,
                column: 1,
                message: "policy file is empty (a half-written file is refused; delete the file to remove it)".into(),
            });
            continue;
        }
        // The fast front end where it follows the file; serde_yaml_ng for
        // the rest, and for every error (its file:line:column).
        if let Some(f) = super::yaml::parse(&src.text) {
            parsed.push((src, f));
            continue;
        }
        match serde_yaml_ng::from_str::<RawFile>(&src.text) {
            Ok(f) => parsed.push((src, f)),
            Err(e) => errors.push(Diagnostic::from_yaml(&src.path, &e)),
        }
    }
    if !errors.is_empty() {
        return Err(LoadError(errors));
    }
    Ok(parsed)
}

/// The errors found so far, each located in its file.
#[derive(Default)]
struct Errors(Vec<Diagnostic>);

impl Errors {
    fn at(&mut self, src: &Source, (line, column): (usize, usize), message: String) {
        self.0.push(Diagnostic {
            file: src.path.clone(),
            line,
            column,
            message,
        });
    }
}

/// SHA-256 over every file's name and contents: equal digests, equal
/// policies. Names, not paths: the same policy read as `policy/` at start
/// and as its absolute path by the reloader is the same policy.
pub fn digest_sources(sources: &[Source]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for src in sources {
        let name = src.path.file_name().unwrap_or(src.path.as_os_str());
        ctx.update(name.to_string_lossy().as_bytes());
        ctx.update(&[0]);
        ctx.update(src.text.as_bytes());
        ctx.update(&[0]);
    }
    ctx.finish()
        .as_ref()
        .try_into()
        .expect("sha256 is 32 bytes")
}
