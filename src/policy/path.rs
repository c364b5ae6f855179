//! Request-path normalisation for `paths:` rules. A path is matched in one
//! canonical form, so that `/simple/%2e%2e/admin`, `/simple/../admin` and
//! `/simple\..\admin` cannot slip past `/simple/**`. Forms whose meaning
//! differs between servers are refused (400) instead of guessed at.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path must start with '/'")]
    NotAbsolute,
    #[error("path contains a dot-segment ('.' or '..'), which servers resolve differently")]
    DotSegment,
    #[error("path contains an encoded '/', '\\\\' or NUL, or a backslash")]
    EncodedSeparator,
    #[error("path contains a malformed percent-escape")]
    BadEscape,
}

use globset::{Glob, GlobSet, GlobSetBuilder};

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Returns the canonical path (no query) used for matching: unreserved
/// percent-escapes decoded (RFC 3986 §6.2.2.2), upper-case hex elsewhere,
/// repeated slashes collapsed. Refuses dot-segments (also encoded, also with
/// `;params`), encoded separators and backslashes.
pub fn normalize_path(raw: &str) -> Result<String, PathError> {
    let path = raw.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let (h, l) = match (
                bytes.get(i + 1).and_then(|b| hex(*b)),
                bytes.get(i + 2).and_then(|b| hex(*b)),
            ) {
                (Some(h), Some(l)) => (h, l),
                _ => return Err(PathError::BadEscape),
            };
            let v = h << 4 | l;
            if v == b'/' || v == b'\\' || v == 0 {
                return Err(PathError::EncodedSeparator);
            }
            if unreserved(v) {
                out.push(v as char);
            } else {
                out.push('%');
                out.push(char::from_digit(h as u32, 16).unwrap().to_ascii_uppercase());
                out.push(char::from_digit(l as u32, 16).unwrap().to_ascii_uppercase());
            }
            i += 3;
            continue;
        }
        if b == b'\\' {
            return Err(PathError::EncodedSeparator);
        }
        if b == b'/' && out.ends_with('/') {
            i += 1;
            continue;
        }
        out.push(b as char);
        i += 1;
    }
    for seg in out.split('/') {
        let bare = seg.split(';').next().unwrap_or("");
        if bare == "." || bare == ".." {
            return Err(PathError::DotSegment);
        }
    }
    Ok(out)
}

/// A compiled `paths:` list. The shapes policies use most are matched
/// directly, with exactly globset's meaning (`literal_separator` on):
/// a literal path (equality), `/lit/**` (everything below `/lit/`, as
/// globset's prefix strategy) and one `*` within literals (`*` never
/// crosses `/`). Anything else goes to a [`GlobSet`] of its own.
/// Matching is an OR over the patterns either way.
#[derive(Debug)]
pub struct PathSet {
    fast: Vec<FastPath>,
    slow: Option<GlobSet>,
}

#[derive(Debug)]
enum FastPath {
    Exact(Box<str>),
    /// Ends with `/`.
    Below(Box<str>),
    Star(Box<str>, Box<str>),
}

impl FastPath {
    /// `pattern` must already be a valid glob.
    fn parse(pattern: &str) -> Option<FastPath> {
        const META: &[char] = &['*', '?', '[', ']', '{', '}', '\\'];
        if !pattern.contains(META) {
            return Some(FastPath::Exact(pattern.into()));
        }
        if let Some(head) = pattern.strip_suffix("/**") {
            if !head.contains(META) {
                return Some(FastPath::Below(format!("{head}/").into()));
            }
        }
        let (head, tail) = pattern.split_once('*')?;
        if head.contains(META) || tail.contains(META) {
            return None;
        }
        Some(FastPath::Star(head.into(), tail.into()))
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            FastPath::Exact(p) => path == &**p,
            FastPath::Below(p) => path.starts_with(&**p),
            FastPath::Star(head, tail) => {
                path.len() >= head.len() + tail.len()
                    && path.starts_with(&**head)
                    && path.ends_with(&**tail)
                    && !path.as_bytes()[head.len()..path.len() - tail.len()].contains(&b'/')
            }
        }
    }
}

impl PathSet {
    /// From globs already validated (and built with `literal_separator`).
    pub fn new(globs: Vec<Glob>) -> PathSet {
        let mut fast = Vec::new();
        let mut slow = GlobSetBuilder::new();
        let mut any_slow = false;
        for g in globs {
            match FastPath::parse(g.glob()) {
                Some(f) => fast.push(f),
                None => {
                    slow.add(g);
                    any_slow = true;
                }
            }
        }
        let slow = any_slow.then(|| slow.build().unwrap_or_else(|_| GlobSet::empty()));
        PathSet { fast, slow }
    }

    pub fn is_match(&self, path: &str) -> bool {
        self.fast.iter().any(|f| f.matches(path))
            || self.slow.as_ref().is_some_and(|g| g.is_match(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        assert_eq!(normalize_path("/simple/pip/").unwrap(), "/simple/pip/");
        assert_eq!(normalize_path("/simple//pip?x=1").unwrap(), "/simple/pip");
        assert_eq!(normalize_path("/%73imple/%7e").unwrap(), "/simple/~");
        assert_eq!(
            normalize_path("/a%2fb").unwrap_err(),
            PathError::EncodedSeparator
        );
        assert_eq!(normalize_path("/a/%c3%a9").unwrap(), "/a/%C3%A9");
    }

    #[test]
    fn traversal_is_refused() {
        for p in [
            "/repos/../admin",
            "/repos/%2e%2e/admin",
            "/repos/%2E./admin",
            "/repos/..;/admin",
            "/repos/.;x/admin",
            "/repos/./x",
            "/repos\\..\\admin",
            "/repos/%5c../admin",
            "/a%00b",
            "/a%zz",
            "relative",
            "/..",
        ] {
            assert!(normalize_path(p).is_err(), "{p}");
        }
    }

    /// The direct shapes agree with globset on every pattern × path here.
    #[test]
    fn path_set_agrees_with_globset() {
        let patterns = [
            "/",
            "/simple/**",
            "/**",
            "/v1/**",
            "/simple/*/",
            "/a/*",
            "/*",
            "/a*b/c",
            "/a/b",
            "/a/b/",
            "/x/*.tar.gz",
            "/a/**/b",
            "/a/?",
            "/a/[bc]",
            "/{a,b}/c",
            "/a\\*b",
            "/a/**/**",
            "/a/*/*",
            "/a**",
            "/**/x",
        ];
        let mut paths = vec![
            String::new(),
            "/".into(),
            "/a".into(),
            "/a/".into(),
            "/a/b".into(),
            "/a/b/".into(),
            "/a/b/c".into(),
            "/ab".into(),
            "/axb/c".into(),
            "/ab/c".into(),
            "/a/xb/c".into(),
            "/simple".into(),
            "/simple/".into(),
            "/simple/pip/".into(),
            "/simple/pip".into(),
            "/simple/a/b/".into(),
            "/v1".into(),
            "/v1/".into(),
            "/v1/x\ny".into(),
            "/x/pkg.tar.gz".into(),
            "/x/a/pkg.tar.gz".into(),
            "/x/.tar.gz".into(),
            "/a/c".into(),
            "/b/c".into(),
            "/a*b".into(),
            "/a/x/b".into(),
            "/a/x/y/b".into(),
            "/q/x".into(),
        ];
        for p in patterns {
            paths.push(p.to_string());
        }
        for p in patterns {
            let g = globset::GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .unwrap();
            let mut reference = GlobSetBuilder::new();
            reference.add(g.clone());
            let reference = reference.build().unwrap();
            let ours = PathSet::new(vec![g]);
            for path in &paths {
                assert_eq!(
                    ours.is_match(path),
                    reference.is_match(path),
                    "pattern {p:?} path {path:?}"
                );
            }
        }
    }
}
