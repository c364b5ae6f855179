//! Request-path normalisation for `paths:` rules. A path is matched in one
//! canonical form, so that `/simple/%2e%2e/admin`, `/simple/../admin` and
//! `/simple\..\admin` cannot slip past `/simple/**`. Forms whose meaning
//! differs between servers are refused (400) instead of guessed at: besides
//! the plain ones, what an origin that decodes twice, accepts overlong UTF-8
//! or trims whitespace would read as a dot-segment or a separator
//! (`%252e%252e`, `%c0%ae%c0%ae`, `..%09`, `%20..`).

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
    #[error("path contains an encoded control character")]
    ControlChar,
    #[error("path contains overlong UTF-8, which some servers decode to '.' or '/'")]
    Overlong,
    #[error("path is percent-encoded more than {NESTED_LEVELS} times over")]
    NestedEncoding,
}

/// How many decodings past the first [`normalize_path`] follows (`%252e`
/// needs one, `%25252e` two, …) before it refuses the path as nested.
const NESTED_LEVELS: usize = 3;

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
    if out.contains('%') {
        refuse_what_a_decoder_could_misread(&out)?;
    }
    Ok(out)
}

/// The canonical form keeps reserved escapes (`%25`, `%20`, `%C0`, …)
/// encoded, as the origin receives them. An origin may still decode them
/// once or twice more, accept overlong UTF-8 or trim whitespace and control
/// characters around a segment: each decoding of `canonical` (up to
/// [`NESTED_LEVELS`] past the first) must read as the same segments,
/// without a dot-segment, a separator, a control character or overlong
/// UTF-8.
fn refuse_what_a_decoder_could_misread(canonical: &str) -> Result<(), PathError> {
    let mut level = canonical.as_bytes().to_vec();
    for _ in 0..=NESTED_LEVELS {
        if !level.contains(&b'%') {
            return Ok(());
        }
        level = decode_once(&level)?;
        if has_overlong_utf8(&level) {
            return Err(PathError::Overlong);
        }
        for seg in level.split(|b| *b == b'/') {
            let bare = seg.split(|b| *b == b';').next().unwrap_or_default();
            if is_dot_segment(trim_blank(bare)) {
                return Err(PathError::DotSegment);
            }
        }
    }
    if level.contains(&b'%') && decode_once(&level).is_ok_and(|d| d != level) {
        return Err(PathError::NestedEncoding);
    }
    Ok(())
}

/// One percent-decoding of `s`. A `%` not followed by two hex digits
/// stays as it is (that is what a lenient decoder does); a decoded
/// separator, NUL or other control character refuses the path.
fn decode_once(s: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let escaped = match (s.get(i + 1), s.get(i + 2)) {
            (Some(h), Some(l)) if s[i] == b'%' => hex(*h).zip(hex(*l)),
            _ => None,
        };
        let Some((h, l)) = escaped else {
            out.push(s[i]);
            i += 1;
            continue;
        };
        let v = h << 4 | l;
        if v == b'/' || v == b'\\' {
            return Err(PathError::EncodedSeparator);
        }
        if v < 0x20 || v == 0x7f {
            return Err(PathError::ControlChar);
        }
        out.push(v);
        i += 3;
    }
    Ok(out)
}

/// UTF-8 sequences longer than needed (`C0 AE` for `.`, `E0 80 AF` for
/// `/`): invalid, and decoded by some servers anyway.
fn has_overlong_utf8(s: &[u8]) -> bool {
    s.windows(2).any(|w| {
        matches!(w[0], 0xC0 | 0xC1)
            || (w[0] == 0xE0 && w[1] < 0xA0 && w[1] >= 0x80)
            || (w[0] == 0xF0 && w[1] < 0x90 && w[1] >= 0x80)
    }) || s.last().is_some_and(|b| matches!(b, 0xC0 | 0xC1))
}

/// Whitespace and control characters some servers trim around a segment,
/// ASCII and the no-break spaces (U+00A0, U+3000).
fn trim_blank(mut seg: &[u8]) -> &[u8] {
    loop {
        seg = seg.trim_ascii();
        if let Some(rest) = seg
            .strip_prefix(b"\xC2\xA0")
            .or_else(|| seg.strip_prefix(b"\xE3\x80\x80"))
        {
            seg = rest;
        } else if let Some(rest) = seg
            .strip_suffix(b"\xC2\xA0")
            .or_else(|| seg.strip_suffix(b"\xE3\x80\x80"))
        {
            seg = rest;
        } else {
            return seg;
        }
    }
}

/// `.` or `..`, also spelled with the dots some servers fold to `.`
/// (fullwidth U+FF0E, one-dot leader U+2024, small full stop U+FE52).
fn is_dot_segment(seg: &[u8]) -> bool {
    let mut dots = 0;
    let mut rest = seg;
    while !rest.is_empty() {
        let n = [&b"."[..], b"\xEF\xBC\x8E", b"\xE2\x80\xA4", b"\xEF\xB9\x92"]
            .iter()
            .find(|d| rest.starts_with(d))
            .map(|d| d.len());
        match n {
            Some(n) => {
                dots += 1;
                rest = &rest[n..];
            }
            None => return false,
        }
    }
    matches!(dots, 1 | 2)
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

    /// What an origin that decodes twice, accepts overlong UTF-8 or trims
    /// whitespace would read as `..` or `/` (issue #37's encodings).
    #[test]
    fn ambiguous_encodings_are_refused() {
        use PathError::*;
        for (p, want) in [
            ("/repos/%252e%252e/admin", DotSegment),
            ("/repos/%252E%252E/admin", DotSegment),
            ("/repos/%25252e%25252e/admin", DotSegment),
            ("/repos/x%252fadmin", EncodedSeparator),
            ("/repos/x%255cadmin", EncodedSeparator),
            ("/repos/x%2500", ControlChar),
            ("/repos/%c0%ae%c0%ae/admin", Overlong),
            ("/repos/%C0%AE./admin", Overlong),
            ("/repos/x%c0%afadmin", Overlong),
            ("/repos/x%e0%80%afadmin", Overlong),
            ("/repos/x%f0%80%80%afadmin", Overlong),
            ("/repos/%25c0%25ae%25c0%25ae/admin", Overlong),
            ("/repos/x/..%09/admin", ControlChar),
            ("/repos/x/%20../admin", DotSegment),
            ("/repos/x/..%20/admin", DotSegment),
            ("/repos/x/%c2%a0..%c2%a0/admin", DotSegment),
            ("/repos/x/%ef%bc%8e%ef%bc%8e/admin", DotSegment),
            ("/repos/x/.%e2%80%a4/admin", DotSegment),
            ("/repos/x/%0d%0aX:%20y", ControlChar),
            ("/repos/x%7f", ControlChar),
            ("/repos/%2525252e%2525252e/admin", DotSegment),
            ("/repos/%252525252e%252525252e/admin", NestedEncoding),
        ] {
            assert_eq!(normalize_path(p), Err(want), "{p}");
        }
    }

    /// Escapes that decode to nothing ambiguous keep working.
    #[test]
    fn plain_escapes_still_pass() {
        for p in [
            "/a/%c3%a9t%c3%a9",
            "/a/file%20name.txt",
            "/a/100%25",
            "/a/100%25done",
            "/a/%25zz",
            "/a/x..y",
            "/a/...",
            "/a/%e9",
            "/a/%ef%bc%8e%ef%bc%8e%ef%bc%8e",
            "/a/%20",
        ] {
            assert!(normalize_path(p).is_ok(), "{p}: {:?}", normalize_path(p));
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
