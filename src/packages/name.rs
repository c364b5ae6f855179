//! Package names, normalised per ecosystem so that every spelling a client
//! or a policy author may use of one package is one [`PackageName`]:
//!
//! - PyPI (PEP 503): case-insensitive, and runs of `-`, `_`, `.` are one `-`
//!   (`Foo.Bar_baz` is `foo-bar-baz`).
//! - npm: a scope is written `@s/n` in policies and `@s/n`, `@s%2fn` or
//!   `@s%2Fn` in registry paths; all are `@s/n`. npm names are *not* folded
//!   to lower case: the registry keeps legacy mixed-case names (`JSONStream`)
//!   as packages of their own, so folding would merge two packages.
//! - cargo: crates.io treats `-`/`_` and case as the same crate; the
//!   normal form is lower case with `_` (`Serde-JSON` is `serde_json`).
//! - Go: module paths are case-sensitive; registry paths spell upper case
//!   as `!` + lower case (`github.com/!azure/x` is `github.com/Azure/x`).
//!
//! Owns: validating and normalising names, the Go `!` case encoding. Does
//! not own: where a name sits in a URL (`classify`), version syntax
//! (`version`).

use std::fmt;
use std::sync::Arc;

use super::Ecosystem;

/// Longest name accepted in any ecosystem (npm's limit is 214, Go module
/// paths have none; anything longer is not a package a policy names).
pub const MAX_NAME_LEN: usize = 512;

/// A normalised package name: equal names are the same package.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackageName(Arc<str>);

impl PackageName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PackageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PackageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// Why a name was refused, as a sentence for a policy author.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NameError(pub String);

/// Normalises `raw` as a name of `eco`, or says why it is not one.
pub fn normalize(eco: Ecosystem, raw: &str) -> Result<PackageName, NameError> {
    if raw.is_empty() {
        return Err(NameError("empty package name".into()));
    }
    if raw.len() > MAX_NAME_LEN {
        return Err(NameError(format!(
            "package name is longer than {MAX_NAME_LEN} bytes"
        )));
    }
    let s = match eco {
        Ecosystem::Pypi => pypi(raw)?,
        Ecosystem::Npm => npm(raw)?,
        Ecosystem::Cargo => cargo(raw)?,
        Ecosystem::Go => go(raw)?,
    };
    Ok(PackageName(s.into()))
}

fn pypi(raw: &str) -> Result<String, NameError> {
    // PEP 508: ASCII letters and digits at both ends, `-_.` inside.
    let b = raw.as_bytes();
    let ok_end = |c: u8| c.is_ascii_alphanumeric();
    if !ok_end(b[0]) || !ok_end(b[b.len() - 1]) {
        return Err(NameError(format!(
            "{raw:?} is not a PyPI name: it must start and end with a letter or digit"
        )));
    }
    let mut out = String::with_capacity(raw.len());
    let mut in_sep = false;
    for &c in b {
        match c {
            b'-' | b'_' | b'.' => {
                if !in_sep {
                    out.push('-');
                }
                in_sep = true;
            }
            c if c.is_ascii_alphanumeric() => {
                out.push(c.to_ascii_lowercase() as char);
                in_sep = false;
            }
            _ => {
                return Err(NameError(format!(
                    "{raw:?} is not a PyPI name: only letters, digits, '-', '_' and '.' (PEP 508)"
                )))
            }
        }
    }
    Ok(out)
}

/// The characters `encodeURIComponent` leaves alone, which is what npm
/// requires of a name (validate-npm-package-name).
fn npm_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-._~!'()*".contains(&c)
}

fn npm(raw: &str) -> Result<String, NameError> {
    let bad = |why: &str| NameError(format!("{raw:?} is not an npm name: {why}"));
    let (scope, name) = match raw.strip_prefix('@') {
        Some(rest) => {
            let (scope, name) = split_npm_scope(rest)
                .ok_or_else(|| bad("a scoped name is @scope/name (or @scope%2fname in a URL)"))?;
            (Some(scope), name)
        }
        None => (None, raw),
    };
    for part in scope.iter().copied().chain([name]) {
        if part.is_empty() {
            return Err(bad("empty scope or name"));
        }
        if part.starts_with('.') || part.starts_with('_') {
            return Err(bad("it may not start with '.' or '_'"));
        }
        if !part.bytes().all(npm_char) {
            return Err(bad("only URL-safe characters (letters, digits, -._~!'()*)"));
        }
    }
    if name.len() + scope.map_or(0, |s| s.len() + 2) > 214 {
        return Err(bad("longer than 214 characters"));
    }
    Ok(match scope {
        Some(s) => format!("@{s}/{name}"),
        None => name.to_string(),
    })
}

/// `scope/name`, `scope%2fname`, `scope%2Fname` → (scope, name).
pub(crate) fn split_npm_scope(rest: &str) -> Option<(&str, &str)> {
    if let Some((s, n)) = rest.split_once('/') {
        return Some((s, n));
    }
    let i = rest.find("%2f").or_else(|| rest.find("%2F"))?;
    Some((&rest[..i], &rest[i + 3..]))
}

fn cargo(raw: &str) -> Result<String, NameError> {
    let b = raw.as_bytes();
    if b.len() > 64 {
        return Err(NameError(format!(
            "{raw:?} is not a crate name: longer than 64 characters"
        )));
    }
    if !b[0].is_ascii_alphabetic() {
        return Err(NameError(format!(
            "{raw:?} is not a crate name: it must start with a letter"
        )));
    }
    if !b
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    {
        return Err(NameError(format!(
            "{raw:?} is not a crate name: only letters, digits, '-' and '_'"
        )));
    }
    Ok(raw
        .bytes()
        .map(|c| match c {
            b'-' => '_',
            c => c.to_ascii_lowercase() as char,
        })
        .collect())
}

fn go(raw: &str) -> Result<String, NameError> {
    // A path written with `!` is in the registry's case encoding; one
    // without is as the module's go.mod spells it. Both name one module.
    let path = if raw.contains('!') {
        go_unescape(raw).ok_or_else(|| {
            NameError(format!(
                "{raw:?} is not a Go module path: '!' must be followed by a lower-case letter, and an escaped path has no upper case"
            ))
        })?
    } else {
        raw.to_string()
    };
    check_go_path(&path)
        .map_err(|why| NameError(format!("{raw:?} is not a Go module path: {why}")))?;
    Ok(path)
}

/// The module path rules of `golang.org/x/mod/module.CheckPath`, reduced to
/// what decides identity: non-empty `/`-separated elements of
/// `[A-Za-z0-9-._~]`, none starting or ending with `.`, and a first
/// element that is a lower-case domain name with a dot.
fn check_go_path(path: &str) -> Result<(), &'static str> {
    let mut elems = path.split('/');
    let first = elems.next().unwrap_or("");
    if !first.contains('.') {
        return Err("the first element must be a domain name (example.com/...)");
    }
    if first.starts_with('-')
        || !first
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
    {
        return Err("the domain must be lower-case letters, digits, '-' and '.'");
    }
    for e in path.split('/') {
        if e.is_empty() {
            return Err("empty path element");
        }
        if e.starts_with('.') || e.ends_with('.') {
            return Err("a path element may not start or end with '.'");
        }
        if !e
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-._~".contains(&c))
        {
            return Err("only letters, digits and -._~ in a path element");
        }
    }
    Ok(())
}

/// Decodes Go's case encoding (`!a` → `A`). `None` when the text is not a
/// valid encoding: a `!` not followed by a lower-case letter, or an upper
/// case letter (which the encoding never contains).
pub fn go_unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut bang = false;
    for c in s.chars() {
        if bang {
            if !c.is_ascii_lowercase() {
                return None;
            }
            out.push(c.to_ascii_uppercase());
            bang = false;
        } else if c == '!' {
            bang = true;
        } else if c.is_ascii_uppercase() {
            return None;
        } else {
            out.push(c);
        }
    }
    (!bang).then_some(out)
}

/// Go's case encoding of a path or version (`A` → `!a`).
pub fn go_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        if c.is_ascii_uppercase() {
            out.push('!');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::testutil::Rng;

    fn n(eco: Ecosystem, s: &str) -> String {
        normalize(eco, s).unwrap().to_string()
    }

    #[test]
    fn pep503_folds_case_and_separator_runs() {
        assert_eq!(n(Ecosystem::Pypi, "Requests"), "requests");
        assert_eq!(n(Ecosystem::Pypi, "Foo.Bar_baz"), "foo-bar-baz");
        assert_eq!(n(Ecosystem::Pypi, "a-_.-b"), "a-b");
        assert_eq!(n(Ecosystem::Pypi, "zope.interface"), "zope-interface");
        for bad in ["-a", "a-", "a b", "a/b", "ä", ""] {
            assert!(normalize(Ecosystem::Pypi, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn npm_scopes_in_every_encoding_are_one_name() {
        for s in ["@types/node", "@types%2fnode", "@types%2Fnode"] {
            assert_eq!(n(Ecosystem::Npm, s), "@types/node", "{s}");
        }
        // Case is kept: JSONStream and jsonstream are different packages.
        assert_eq!(n(Ecosystem::Npm, "JSONStream"), "JSONStream");
        for bad in [
            "@types", "@/node", "@types/", ".hidden", "_x", "a/b", "a b", "a%20b",
        ] {
            assert!(normalize(Ecosystem::Npm, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cargo_dash_underscore_and_case_are_one_crate() {
        assert_eq!(n(Ecosystem::Cargo, "serde-json"), "serde_json");
        assert_eq!(n(Ecosystem::Cargo, "Serde_JSON"), "serde_json");
        for bad in ["1abc", "a.b", "-a", ""] {
            assert!(normalize(Ecosystem::Cargo, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn go_case_encoding_decodes_to_the_module_path() {
        assert_eq!(
            n(Ecosystem::Go, "github.com/!azure/azure-sdk-for-go"),
            "github.com/Azure/azure-sdk-for-go"
        );
        assert_eq!(
            n(Ecosystem::Go, "github.com/Azure/azure-sdk-for-go"),
            "github.com/Azure/azure-sdk-for-go"
        );
        assert_eq!(n(Ecosystem::Go, "golang.org/x/text"), "golang.org/x/text");
        for bad in [
            "github.com/!Azure/x",
            "github.com/!/x",
            "github.com/Azure!a",
            "github.com//x",
            "github.com/x/",
            "nodot/x",
            "GitHub.com/x",
            "github.com/.x",
            "github.com/x y",
        ] {
            assert!(normalize(Ecosystem::Go, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn go_escape_round_trips() {
        let mut rng = Rng::new(7);
        let alphabet = b"abcXYZ019-._~/";
        for _ in 0..2000 {
            let s: String = (0..rng.below(20))
                .map(|_| alphabet[rng.below(alphabet.len())] as char)
                .collect();
            let e = go_escape(&s);
            assert!(!e.bytes().any(|c| c.is_ascii_uppercase()), "{e}");
            assert_eq!(go_unescape(&e).as_deref(), Some(s.as_str()), "{s:?}");
        }
    }

    #[test]
    fn normalising_is_idempotent() {
        let mut rng = Rng::new(11);
        let alphabet = b"aZ09-_.@/%2fF!~";
        for _ in 0..5000 {
            let s: String = (0..1 + rng.below(16))
                .map(|_| alphabet[rng.below(alphabet.len())] as char)
                .collect();
            for eco in Ecosystem::ALL {
                if let Ok(p) = normalize(eco, &s) {
                    assert_eq!(normalize(eco, p.as_str()).as_ref(), Ok(&p), "{eco:?} {s:?}");
                }
            }
        }
    }
}
