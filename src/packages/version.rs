//! Versions and version constraints, each in its ecosystem's own syntax and
//! with its ecosystem's own matching rules, through the crates those
//! ecosystems' tools use or mirror:
//!
//! | ecosystem | crate | syntax | pre-releases |
//! |---|---|---|---|
//! | PyPI | `pep440_rs` (uv's PEP 440) | `>=2.31,<3`, `~=1.4`, `==1.26.*` | only when a specifier names one (PEP 440) |
//! | npm | `nodejs-semver` (node-semver's rules) | `^4.17.0`, `>=18 <21 \|\| 22.x` | only when a comparator with the same `[major, minor, patch]` names one |
//! | cargo | `semver` (cargo's own) | `1.0`, `>=1.2, <2`, `=1.0.3` | likewise (cargo's rule) |
//! | Go | `semver` after Go's `v` form | `>=v1.2.0, <v2.0.0`, `v1.4.2` | always (pseudo-versions are pre-releases) |
//!
//! A name with no constraint approves every version, pre-releases included.
//! A version string the ecosystem cannot parse matches no constraint, not
//! even "any": resolvers skip such versions too, and a deny could not be
//! checked against it.
//!
//! Go has no crate for its module versions (`golang.org/x/mod/semver`);
//! Go's versions are SemVer 2.0 with a mandatory `v`, shorthands `v1`,
//! `v1.2` in constraints, and build metadata ignored in comparisons
//! (`+incompatible`), so [`GoVersion`] is the `semver` crate's `Version`
//! behind those three rules.
//!
//! Owns: parsing and matching. Does not own: which version a request names
//! (`classify`), publish times (`decide`).

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use super::Ecosystem;

/// A registry's version, parsed in its ecosystem's syntax.
#[derive(Debug, Clone)]
pub enum Version {
    Pypi(pep440_rs::Version),
    Npm(nodejs_semver::Version),
    Cargo(semver::Version),
    Go(GoVersion),
}

impl Version {
    pub fn parse(eco: Ecosystem, s: &str) -> Result<Version, String> {
        let bad = || format!("{s:?} is not a {} version", eco.as_str());
        Ok(match eco {
            Ecosystem::Pypi => Version::Pypi(pep440_rs::Version::from_str(s).map_err(|_| bad())?),
            Ecosystem::Npm => Version::Npm(nodejs_semver::Version::parse(s).map_err(|_| bad())?),
            Ecosystem::Cargo => Version::Cargo(semver::Version::parse(s).map_err(|_| bad())?),
            Ecosystem::Go => Version::Go(GoVersion::parse(s).ok_or_else(|| {
                format!("{s:?} is not a Go module version (vMAJOR.MINOR.PATCH[-pre][+build])")
            })?),
        })
    }

    pub fn is_prerelease(&self) -> bool {
        match self {
            Version::Pypi(v) => v.any_prerelease(),
            Version::Npm(v) => v.is_prerelease(),
            Version::Cargo(v) => !v.pre.is_empty(),
            Version::Go(v) => !v.v.pre.is_empty(),
        }
    }

    /// The ecosystem's precedence; versions of different ecosystems are
    /// not comparable (`None`).
    pub fn compare(&self, other: &Version) -> Option<Ordering> {
        Some(match (self, other) {
            (Version::Pypi(a), Version::Pypi(b)) => a.cmp(b),
            (Version::Npm(a), Version::Npm(b)) => a.cmp(b),
            (Version::Cargo(a), Version::Cargo(b)) => a.cmp_precedence(b),
            (Version::Go(a), Version::Go(b)) => a.cmp(b),
            _ => return None,
        })
    }
}

/// A Go module version: `v` + SemVer 2.0; build metadata (`+incompatible`)
/// does not take part in comparisons.
#[derive(Debug, Clone)]
pub struct GoVersion {
    pub v: semver::Version,
}

impl GoVersion {
    /// A canonical module version, as registries list them.
    pub fn parse(s: &str) -> Option<GoVersion> {
        let rest = s.strip_prefix('v')?;
        semver::Version::parse(rest).ok().map(|v| GoVersion { v })
    }

    /// A version in a constraint: the canonical form or Go's shorthands
    /// `v1` and `v1.2` (which stand for `v1.0.0` and `v1.2.0`).
    fn parse_loose(s: &str) -> Option<GoVersion> {
        let rest = s.strip_prefix('v')?;
        let dots = rest.bytes().filter(|&c| c == b'.').count();
        let plain = rest.bytes().all(|c| c.is_ascii_digit() || c == b'.');
        let full = match dots {
            0 if plain => format!("{rest}.0.0"),
            1 if plain => format!("{rest}.0"),
            _ => rest.to_string(),
        };
        semver::Version::parse(&full).ok().map(|v| GoVersion { v })
    }
}

impl PartialEq for GoVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for GoVersion {}
impl PartialOrd for GoVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for GoVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.v.cmp_precedence(&other.v)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A version constraint. `Any` is a name written without one.
#[derive(Clone)]
pub enum Constraint {
    Any,
    Pypi(pep440_rs::VersionSpecifiers, String),
    Npm(nodejs_semver::Range, String),
    Cargo(semver::VersionReq, String),
    Go(Vec<(GoOp, GoVersion)>, String),
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Constraint({self})")
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constraint::Any => f.write_str("*"),
            Constraint::Pypi(_, s)
            | Constraint::Npm(_, s)
            | Constraint::Cargo(_, s)
            | Constraint::Go(_, s) => f.write_str(s),
        }
    }
}

impl Constraint {
    /// Parses `s` in `eco`'s constraint syntax. An empty or blank string
    /// is [`Constraint::Any`].
    pub fn parse(eco: Ecosystem, s: &str) -> Result<Constraint, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Constraint::Any);
        }
        let text = s.to_string();
        match eco {
            Ecosystem::Pypi => pep440_rs::VersionSpecifiers::from_str(s)
                .map(|v| Constraint::Pypi(v, text))
                .map_err(|e| format!("{s:?} is not a PEP 440 version specifier: {e}")),
            Ecosystem::Npm => nodejs_semver::Range::parse(s)
                .map(|r| Constraint::Npm(r, text))
                .map_err(|_| format!("{s:?} is not a node-semver range")),
            Ecosystem::Cargo => semver::VersionReq::parse(s)
                .map(|r| Constraint::Cargo(r, text))
                .map_err(|e| format!("{s:?} is not a cargo version requirement: {e}")),
            Ecosystem::Go => parse_go(s).map(|c| Constraint::Go(c, text)),
        }
    }

    /// Whether `v` satisfies the constraint under its ecosystem's rules.
    pub fn matches(&self, v: &Version) -> bool {
        match (self, v) {
            (Constraint::Any, _) => true,
            (Constraint::Pypi(spec, _), Version::Pypi(v)) => {
                // PEP 440: "Pre-releases of any kind ... are implicitly
                // excluded from all version specifiers, unless ... the
                // specifier itself includes a pre-release".
                spec.contains(v) && (!v.any_prerelease() || spec.iter().any(|s| s.any_prerelease()))
            }
            (Constraint::Npm(r, _), Version::Npm(v)) => r.satisfies(v),
            (Constraint::Cargo(r, _), Version::Cargo(v)) => r.matches(v),
            (Constraint::Go(cs, _), Version::Go(v)) => cs.iter().all(|(op, c)| {
                let o = v.cmp(c);
                match op {
                    GoOp::Eq => o == Ordering::Equal,
                    GoOp::Ne => o != Ordering::Equal,
                    GoOp::Lt => o == Ordering::Less,
                    GoOp::Le => o != Ordering::Greater,
                    GoOp::Gt => o == Ordering::Greater,
                    GoOp::Ge => o != Ordering::Less,
                }
            }),
            _ => false,
        }
    }

    pub fn is_any(&self) -> bool {
        matches!(self, Constraint::Any)
    }

    /// Whether every version this constraint admits, `other` admits too,
    /// as far as can be decided cheaply: `other` is `Any`, the same text,
    /// or (npm) a range that node-semver says covers this one. `false`
    /// means "not shown", not "not covered" (lints only).
    pub fn covered_by(&self, other: &Constraint) -> bool {
        match (self, other) {
            (_, Constraint::Any) => true,
            (Constraint::Npm(a, _), Constraint::Npm(b, _)) => b.allows_all(a),
            (a, b) => !a.is_any() && a.to_string() == b.to_string(),
        }
    }
}

fn parse_go(s: &str) -> Result<Vec<(GoOp, GoVersion)>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let p = part.trim();
        let (op, rest) = [
            (">=", GoOp::Ge),
            ("<=", GoOp::Le),
            ("!=", GoOp::Ne),
            ("==", GoOp::Eq),
            (">", GoOp::Gt),
            ("<", GoOp::Lt),
            ("=", GoOp::Eq),
        ]
        .iter()
        .find_map(|(t, op)| p.strip_prefix(t).map(|r| (*op, r)))
        .unwrap_or((GoOp::Eq, p));
        let rest = rest.trim();
        let v = GoVersion::parse_loose(rest).ok_or_else(|| {
            format!("{s:?} is not a Go version constraint: {rest:?} is not a version like v1.2.3 (comparators >=, >, <=, <, =, != joined by ',')")
        })?;
        out.push((op, v));
    }
    Ok(out)
}

/// Splits a policy's `"name [constraint]"` entry at the first blank (or,
/// for PyPI and cargo, where the name may be followed directly by an
/// operator, at the first operator character: `requests>=2.31`).
pub fn split_entry(eco: Ecosystem, entry: &str) -> (&str, &str) {
    let s = entry.trim();
    let op_chars: &[char] = match eco {
        Ecosystem::Pypi => &[' ', '\t', '<', '>', '=', '!', '~', '('],
        Ecosystem::Cargo => &[' ', '\t', '<', '>', '=', '^', '~', '*'],
        Ecosystem::Npm | Ecosystem::Go => &[' ', '\t'],
    };
    match s.find(op_chars) {
        Some(i) => (&s[..i], s[i..].trim()),
        None => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(eco: Ecosystem, c: &str, v: &str) -> bool {
        Constraint::parse(eco, c)
            .unwrap()
            .matches(&Version::parse(eco, v).unwrap())
    }

    #[test]
    fn pep440_ranges_and_prereleases() {
        let e = Ecosystem::Pypi;
        assert!(m(e, ">=2.31,<3", "2.32.3"));
        assert!(!m(e, ">=2.31,<3", "3.0"));
        assert!(!m(e, ">=2.31,<3", "2.30"));
        // Pre-releases only when the specifier names one.
        assert!(!m(e, ">=2.31", "2.33.0rc1"));
        assert!(m(e, ">=2.33.0rc1", "2.33.0rc1"));
        assert!(m(e, "==1.26.*", "1.26.4"));
        assert!(m(e, "~=1.4", "1.9"));
        assert!(!m(e, "~=1.4", "2.0"));
        // Non-normalised spellings are the same version.
        assert!(m(e, "==2024.8.30", "2024.08.30"));
        assert!(m(e, "", "3.0.0a1"));
        assert!(Constraint::parse(e, "^1.0").is_err());
    }

    #[test]
    fn node_semver_ranges() {
        let e = Ecosystem::Npm;
        assert!(m(e, "^4.17.0", "4.17.21"));
        assert!(!m(e, "^4.17.0", "5.0.0"));
        assert!(m(e, ">=18 <21 || 22.x", "22.1.0"));
        assert!(!m(e, ">=18 <21 || 22.x", "21.0.0"));
        assert!(!m(e, "^1.0.0", "1.1.0-beta.1"));
        assert!(m(e, "^1.1.0-beta.0", "1.1.0-beta.1"));
        assert!(Constraint::parse(e, ">=>=").is_err());
    }

    #[test]
    fn cargo_requirements() {
        let e = Ecosystem::Cargo;
        assert!(m(e, "1.0", "1.0.200"));
        assert!(!m(e, "1.0", "2.0.0"));
        assert!(m(e, "=1.0.3", "1.0.3"));
        assert!(!m(e, "=1.0.3", "1.0.4"));
        assert!(m(e, ">=1.2, <2", "1.9.0"));
        assert!(!m(e, ">=1.2", "1.3.0-alpha"));
        assert!(Constraint::parse(e, "==1").is_err());
    }

    #[test]
    fn go_constraints() {
        let e = Ecosystem::Go;
        assert!(m(e, ">=v1.2.0, <v2.0.0", "v1.9.9"));
        assert!(!m(e, ">=v1.2.0, <v2.0.0", "v2.0.0"));
        assert!(m(e, ">=v1.2, <v2", "v1.2.0"));
        assert!(m(e, "v1.4.2", "v1.4.2"));
        assert!(m(e, "=v1.4.2", "v1.4.2"));
        assert!(!m(e, "v1.4.2", "v1.4.3"));
        // Pseudo-versions are pre-releases and still match ranges; like
        // Go, v0.0.0-<time>-<hash> sorts below v0.0.0.
        assert!(m(e, "<v1.0.0", "v0.0.0-20191109021931-daa7c04131f5"));
        assert!(!m(e, ">=v0.0.0", "v0.0.0-20191109021931-daa7c04131f5"));
        assert!(m(e, ">v1.2.3", "v1.2.4-0.20200101000000-abcdefabcdef"));
        // Build metadata is ignored, as Go's semver.Compare does.
        assert!(m(e, "=v2.0.0", "v2.0.0+incompatible"));
        for bad in ["1.2.3", "v1.2.3.4", ">=v01.2.3", "~v1", ">=v1.2-pre"] {
            assert!(Constraint::parse(e, bad).is_err(), "{bad}");
        }
        assert!(
            Version::parse(e, "v1.2").is_err(),
            "registries list canonical versions"
        );
    }

    #[test]
    fn entries_split_at_the_constraint() {
        assert_eq!(
            split_entry(Ecosystem::Pypi, "requests >=2.31,<3"),
            ("requests", ">=2.31,<3")
        );
        assert_eq!(
            split_entry(Ecosystem::Pypi, "requests>=2.31"),
            ("requests", ">=2.31")
        );
        assert_eq!(split_entry(Ecosystem::Pypi, "urllib3"), ("urllib3", ""));
        assert_eq!(
            split_entry(Ecosystem::Npm, "@types/node >=18 <21"),
            ("@types/node", ">=18 <21")
        );
        assert_eq!(split_entry(Ecosystem::Cargo, "serde^1"), ("serde", "^1"));
        assert_eq!(
            split_entry(Ecosystem::Go, "golang.org/x/text >=v0.3.0"),
            ("golang.org/x/text", ">=v0.3.0")
        );
    }

    #[test]
    fn coverage_for_lints() {
        let c = |e, s| Constraint::parse(e, s).unwrap();
        let e = Ecosystem::Npm;
        assert!(c(e, "^1.2.0").covered_by(&c(e, ">=1.0.0")));
        assert!(!c(e, ">=1.0.0").covered_by(&c(e, "^1.2.0")));
        assert!(c(Ecosystem::Pypi, ">=1").covered_by(&Constraint::Any));
        assert!(!Constraint::Any.covered_by(&c(Ecosystem::Pypi, ">=1")));
    }
}
