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
    /// Where the index says the file is, as [`listed_at`] spells it
    /// (`files.pythonhosted.org/packages/…/x.whl`); a download is of this
    /// file only at this place. `None` where the index names files by
    /// name only (cargo, Go: their download paths are fixed by the name).
    pub at: Option<String>,
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

/// Where a file an index lists is: its reference (`href`, `url`,
/// `tarball`) resolved against the public URL the document is read at
/// (`base_host`, `base_path`), as `host/path` with the host in lower case,
/// dot segments resolved, the path percent-decoded and without query or
/// fragment. `None` for a reference that is not HTTP(S).
pub fn listed_at(base_host: &str, base_path: &str, reference: &str) -> Option<String> {
    let r = reference.trim();
    let r = r.split('#').next().unwrap_or(r);
    let r = r.split('?').next().unwrap_or(r);
    let lower = r.get(..8).unwrap_or(r).to_ascii_lowercase();
    let (host, path) = if let Some(rest) = lower
        .starts_with("https://")
        .then(|| &r[8..])
        .or_else(|| lower.starts_with("http://").then(|| &r[7..]))
        .or_else(|| r.strip_prefix("//"))
    {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        (authority_host(authority)?, path.to_string())
    } else if !r.starts_with('/') && r.split('/').next().is_some_and(|s| s.contains(':')) {
        // Another scheme (`file:`, `git+ssh:`): not a registry download.
        return None;
    } else if r.starts_with('/') {
        (base_host.to_ascii_lowercase(), r.to_string())
    } else {
        let dir = &base_path[..=base_path.rfind('/').unwrap_or(0)];
        (base_host.to_ascii_lowercase(), format!("{dir}{r}"))
    };
    Some(format!("{host}{}", decode_path(&remove_dots(&path))))
}

/// A download request as [`listed_at`] spells places: `host/path`, the
/// path percent-decoded, without query.
pub fn request_at(host: &str, path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    format!(
        "{}{}",
        host.trim_end_matches('.').to_ascii_lowercase(),
        decode_path(path)
    )
}

/// The host of a URL's authority (`user@host:port`), lower case.
fn authority_host(authority: &str) -> Option<String> {
    let a = authority.rsplit('@').next().unwrap_or(authority);
    let host = if a.starts_with('[') {
        &a[..=a.find(']')?]
    } else {
        a.split(':').next().unwrap_or(a)
    };
    (!host.is_empty()).then(|| host.trim_end_matches('.').to_ascii_lowercase())
}

/// RFC 3986's remove_dot_segments, on a path starting with `/`.
fn remove_dots(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    let last = segs.len().saturating_sub(1);
    for (i, s) in segs.iter().enumerate() {
        match *s {
            "." => {
                if i == last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// Every `%XX` decoded (lossy UTF-8): `+` and `%2B` are one file name.
/// Except `%2F` and `%25`, kept (upper case): an encoded `/` is not a
/// separator, and an encoded `%` not an escape, to a server that does not
/// decode twice.
fn decode_path(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(v @ (b'/' | b'%')) if b[i] == b'%' => {
                out.extend_from_slice(format!("%{v:02X}").as_bytes());
                i += 3;
            }
            Some(v) if b[i] == b'%' => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
            at: None,
        };
        v.add_file("2024.08.30", f("certifi-2024.8.30.tar.gz", 200));
        v.add_file("2024.8.30", f("certifi-2024.8.30-py3-none-any.whl", 100));
        let facts = v.version("2024.8.30").unwrap();
        assert_eq!(facts.published, Some(100));
        assert_eq!(facts.files.len(), 2);
        assert!(v.file("certifi-2024.8.30.tar.gz").is_some());
        assert!(v.version("2024.8.31").is_none());
    }

    #[test]
    fn listed_places_resolve_like_a_client_does() {
        let base = ("pypi.org", "/simple/requests/");
        let at = |r: &str| listed_at(base.0, base.1, r);
        assert_eq!(
            at("https://Files.PythonHosted.org:443/packages/aa/bb/x.whl#sha256=00").as_deref(),
            Some("files.pythonhosted.org/packages/aa/bb/x.whl")
        );
        assert_eq!(
            at("../../packages/packages/aa/x-1.0%2Bcpu.whl#sha256=00").as_deref(),
            Some("pypi.org/packages/packages/aa/x-1.0+cpu.whl")
        );
        assert_eq!(
            at("x.whl").as_deref(),
            Some("pypi.org/simple/requests/x.whl")
        );
        assert_eq!(at("/f/x.whl?t=1").as_deref(), Some("pypi.org/f/x.whl"));
        assert_eq!(
            at("//mirror.corp/a/./b/../x.whl").as_deref(),
            Some("mirror.corp/a/x.whl")
        );
        assert_eq!(at("../../../../x.whl").as_deref(), Some("pypi.org/x.whl"));
        assert_eq!(at("file:///etc/passwd"), None);
        assert_eq!(
            request_at("PyPI.org.", "/packages/packages/aa/x-1.0%2bcpu.whl"),
            "pypi.org/packages/packages/aa/x-1.0+cpu.whl"
        );
        // An encoded separator or escape is not the listed path.
        assert_eq!(
            request_at("pypi.org", "/packages/aa%2fbb/x%2525.whl"),
            "pypi.org/packages/aa%2Fbb/x%2525.whl"
        );
        assert_ne!(
            request_at("pypi.org", "/packages/aa%2fbb/x.whl"),
            at("/packages/aa/bb/x.whl").unwrap()
        );
    }
}
