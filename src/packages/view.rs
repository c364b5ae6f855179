//! What a registry's index says about a package, independent of policy:
//! each version's publish time and files (name, time, sha256). The filters
//! build it from the upstream document they filter (and it is what the
//! decision authorises downloads against), so "the filtered index lists
//! this file" and "the download is allowed" are one computation.
//!
//! Owns: the facts and their lookup by version and filename. Does not own:
//! parsing documents (`filter`), judging versions (`decide`).

use std::collections::HashMap;

use super::name::PackageName;
use super::Ecosystem;

/// One downloadable file of a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFacts {
    pub filename: String,
    /// The file's own upload time (PyPI lists one per file: a file added
    /// to an old release later is as new as its upload).
    pub published: Option<i64>,
    pub sha256: Option<[u8; 32]>,
}

/// One version as the index lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionFacts {
    /// As the registry spells it.
    pub version: String,
    /// The registry's publish time (PyPI: the earliest of its files).
    pub published: Option<i64>,
    pub files: Vec<FileFacts>,
}

impl VersionFacts {
    pub fn file(&self, filename: &str) -> Option<&FileFacts> {
        self.files.iter().find(|f| f.filename == filename)
    }
}

/// A package's versions as one index document lists them.
#[derive(Debug, Clone)]
pub struct IndexView {
    pub ecosystem: Ecosystem,
    pub name: PackageName,
    versions: Vec<VersionFacts>,
    by_key: HashMap<String, usize>,
}

impl IndexView {
    pub fn new(ecosystem: Ecosystem, name: PackageName) -> IndexView {
        IndexView {
            ecosystem,
            name,
            versions: Vec::new(),
            by_key: HashMap::new(),
        }
    }

    /// The key two spellings of one version share: PEP 440's normal form
    /// for PyPI (`2024.08.30` is `2024.8.30`), the string elsewhere.
    pub fn key(eco: Ecosystem, version: &str) -> String {
        match eco {
            Ecosystem::Pypi => version
                .parse::<pep440_rs::Version>()
                .map(|v| v.to_string())
                .unwrap_or_else(|_| version.to_string()),
            _ => version.to_string(),
        }
    }

    fn entry(&mut self, version: &str) -> &mut VersionFacts {
        let key = Self::key(self.ecosystem, version);
        let i = match self.by_key.get(&key) {
            Some(&i) => i,
            None => {
                self.versions.push(VersionFacts {
                    version: version.to_string(),
                    published: None,
                    files: Vec::new(),
                });
                self.by_key.insert(key, self.versions.len() - 1);
                self.versions.len() - 1
            }
        };
        &mut self.versions[i]
    }

    /// Records a version (with no files yet, e.g. PEP 700's `versions`).
    pub fn add_version(&mut self, version: &str, published: Option<i64>) {
        let v = self.entry(version);
        if let Some(t) = published {
            v.published = Some(v.published.map_or(t, |p| p.min(t)));
        }
    }

    /// Records a file; the version's time becomes the earliest file time.
    pub fn add_file(&mut self, version: &str, file: FileFacts) {
        let t = file.published;
        let v = self.entry(version);
        v.files.push(file);
        if let Some(t) = t {
            v.published = Some(v.published.map_or(t, |p| p.min(t)));
        }
    }

    pub fn version(&self, version: &str) -> Option<&VersionFacts> {
        self.by_key
            .get(&Self::key(self.ecosystem, version))
            .map(|&i| &self.versions[i])
    }

    pub fn versions(&self) -> &[VersionFacts] {
        &self.versions
    }

    /// The file of this name in any version.
    pub fn file(&self, filename: &str) -> Option<(&VersionFacts, &FileFacts)> {
        self.versions
            .iter()
            .find_map(|v| v.file(filename).map(|f| (v, f)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::name::normalize;

    #[test]
    fn versions_are_found_by_any_spelling_and_take_the_earliest_time() {
        let mut v = IndexView::new(
            Ecosystem::Pypi,
            normalize(Ecosystem::Pypi, "certifi").unwrap(),
        );
        let f = |n: &str, t| FileFacts {
            filename: n.into(),
            published: Some(t),
            sha256: None,
        };
        v.add_file("2024.08.30", f("certifi-2024.8.30.tar.gz", 200));
        v.add_file("2024.8.30", f("certifi-2024.8.30-py3-none-any.whl", 100));
        let facts = v.version("2024.8.30").unwrap();
        assert_eq!(facts.published, Some(100));
        assert_eq!(facts.files.len(), 2);
        assert!(v.file("certifi-2024.8.30.tar.gz").is_some());
        assert!(v.version("2024.8.31").is_none());
    }
}
