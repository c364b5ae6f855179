//! `packages:` of every file and `settings.packages`: handed to the package
//! compile ([`crate::policy::packages::compile::compile`]) with what it needs
//! from the rest of the policy (client ids, exception ids, the secret
//! expander, the contact); its located errors become the policy's.

use std::collections::HashMap;
use std::path::Path;

use super::exceptions::expand_secret;
use super::Errors;
use crate::policy::packages::compile::{compile, CompileInput, PackagePolicy, SetSource};
use crate::policy::raw::RawFile;
use crate::policy::{Client, Diagnostic, Exception, Settings, Source};

/// The package part of the policy; empty when no file has sets and the
/// settings have no `packages:`.
pub(super) fn packages(
    parsed: &[(&Source, RawFile)],
    settings: &Settings,
    clients: &[Client],
    exceptions: &[Exception],
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Errors,
) -> PackagePolicy {
    let files: Vec<SetSource<'_>> = parsed
        .iter()
        .filter(|(_, f)| !f.packages.is_empty())
        .map(|(src, f)| SetSource {
            file: &src.path,
            text: &src.text,
            sets: &f.packages,
        })
        .collect();
    // The first file with settings: a second is already an error.
    let raw_settings = parsed.iter().find_map(|(src, f)| {
        let p = f.settings.as_ref()?.packages.as_ref()?;
        Some((src.path.as_path(), src.text.as_str(), p))
    });
    if files.is_empty() && raw_settings.is_none() {
        return PackagePolicy::default();
    }
    let exception_files: HashMap<&str, &Path> =
        exceptions.iter().map(|e| (&*e.id, &*e.file)).collect();
    let client_ids: Vec<&str> = clients.iter().map(|c| &*c.id).collect();
    let input = CompileInput {
        files: &files,
        settings: raw_settings,
        clients: &client_ids,
        exception_id: &|id| exception_files.get(id).map(|p| p.to_path_buf()),
        expand: &|v| expand_secret(v, env),
        contact: &settings.contact,
    };
    match compile(&input) {
        Ok(p) => p,
        Err(diags) => {
            errs.0.extend(diags.into_iter().map(|d| Diagnostic {
                file: d.file,
                line: d.line,
                column: d.column,
                message: d.message,
            }));
            PackagePolicy::default()
        }
    }
}
