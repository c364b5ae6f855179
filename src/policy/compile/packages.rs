//! `packages:` of every file and `settings.packages`: handed to the package
//! compile ([`crate::packages::compile::compile`]) with what it needs
//! from the rest of the policy (client ids, exception ids, the secret
//! expander, the contact); its located errors become the policy's.

use std::collections::HashMap;
use std::path::Path;

use super::exceptions::expand_secret;
use super::{Errors, File};
use crate::packages::compile::{compile, CompileInput, PackagePolicy, SetSource};
use crate::policy::{Client, Diagnostic, Exception, Settings};

/// The package part of the policy; empty when no file has sets and the
/// settings have no `packages:` (files copied from the previous policy
/// have neither).
pub(super) fn packages(
    files: &[File<'_, '_>],
    settings: &Settings,
    clients: &[Client],
    exceptions: &[Exception],
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Errors,
) -> PackagePolicy {
    let parsed = || files.iter().filter_map(|f| Some((f.src, f.raw()?)));
    let sets: Vec<SetSource<'_>> = parsed()
        .filter(|(_, f)| !f.packages.is_empty())
        .map(|(src, f)| SetSource {
            file: &src.path,
            text: &src.text,
            sets: &f.packages,
        })
        .collect();
    // The first file with settings: a second is already an error.
    let raw_settings = parsed().find_map(|(src, f)| {
        let p = f.settings.as_ref()?.packages.as_ref()?;
        Some((src.path.as_path(), src.text.as_str(), p))
    });
    if sets.is_empty() && raw_settings.is_none() {
        return PackagePolicy::default();
    }
    let exception_files: HashMap<&str, &Path> =
        exceptions.iter().map(|e| (&*e.id, &*e.file)).collect();
    let client_ids: Vec<&str> = clients.iter().map(|c| &*c.id).collect();
    let input = CompileInput {
        files: &sets,
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
