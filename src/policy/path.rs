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
}
