//! The serde mirror of `packages:` sets and `settings.packages` (DESIGN
//! "Packages"). Unknown keys are errors. What can be checked without the
//! set's ecosystem (ids, dates, durations, hashes, the shape of an entry) is
//! checked inside deserialisation so its error carries the value's
//! line:column; names and constraints need the ecosystem and are checked by
//! [`super::compile`], which locates them in the file text.
//!
//! `RawFile` (the main policy's serde mirror) gets
//! `#[serde(default)] packages: Vec<RawPackageSet>` and `RawSettings` gets
//! `packages: Option<RawPackageSettings>`.

use std::collections::BTreeMap;
use std::fmt;

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::Ecosystem;
use crate::policy::field::{DateField, DurationField, IdField, RawInject};

/// One approved package set: the packages of one ecosystem that may be
/// installed, who answers for them and why.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPackageSet {
    /// Unique across all files, exceptions included; names the set in logs,
    /// metrics and reports.
    pub id: IdField,
    /// The team answerable for the set (required).
    #[schemars(required, with = "String", pattern("\\S"))]
    pub owner: Option<String>,
    /// Why the set exists, for the next reviewer (required).
    #[schemars(required, with = "String", pattern("\\S"))]
    pub reason: Option<String>,
    /// Where the set was approved (a ticket id or URL).
    pub ticket: Option<String>,
    /// From this date on the set approves nothing (`package_set_expired`).
    pub expires: Option<DateField>,
    /// The registry the set's names belong to (required).
    // An `Option` so that its absence is reported at the set.
    #[schemars(required, with = "Ecosystem")]
    pub ecosystem: Option<Ecosystem>,
    /// Client id patterns (`ci-*`) the set applies to; default every client.
    #[schemars(length(min = 1))]
    pub clients: Option<Vec<String>>,
    /// Versions published less than this ago are held back; default
    /// `settings.packages.min_age`.
    pub min_age: Option<DurationField>,
    /// Approved packages: `name [constraint]` in the ecosystem's syntax, or
    /// `{name, versions, min_age, sha256}`.
    #[serde(default)]
    pub allow: Vec<RawAllow>,
    /// Denied packages or versions: beat every allow of every set.
    #[serde(default)]
    pub deny: Vec<RawDeny>,
}

/// `settings.packages`: the package gate.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPackageSettings {
    /// Ecosystems whose registry traffic goes through the gate (needs
    /// interception: without `--ca-dir` their CONNECTs are refused).
    #[schemars(length(min = 1))]
    pub enforce: Option<Vec<Ecosystem>>,
    /// Versions published less than this ago are held back (default 0d).
    pub min_age: Option<DurationField>,
    /// A version whose publish time the registry does not say: `deny`
    /// (default) or `allow`.
    pub time_unknown: Option<TimeUnknown>,
    /// Per ecosystem, a mirror to fetch from instead of the public registry.
    #[serde(default)]
    #[schemars(with = "MirrorsSchema")]
    pub mirrors: BTreeMap<Ecosystem, RawMirror>,
}

/// The schema of `mirrors:` (a map by ecosystem, spelled out so that each
/// key is described).
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct MirrorsSchema {
    /// Where PyPI requests (pypi.org, files.pythonhosted.org) are sent.
    pypi: Option<RawMirror>,
    /// Where npm registry requests are sent.
    npm: Option<RawMirror>,
    /// Where crates.io requests (index, downloads) are sent.
    cargo: Option<RawMirror>,
    /// Where Go module proxy requests are sent.
    go: Option<RawMirror>,
}

/// What to do with a version whose publish time the registry does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum TimeUnknown {
    /// Hold the version back (`package_time_unknown`).
    #[default]
    Deny,
    /// Treat it as old enough.
    Allow,
}

/// A mirror of one ecosystem's registry.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMirror {
    /// The mirror's index URL (`https://mirror.corp/api/pypi/pypi/simple/`).
    #[schemars(pattern("^https?://"))]
    pub url: String,
    /// Credentials sent to the mirror, never shown to the sandbox.
    pub inject: Option<RawInject>,
}

/// An `allow:` entry: `"name [constraint]"` or a mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawAllow {
    /// The name as written (the short form: before the first blank).
    pub name: String,
    /// The constraint as written; `None` for "any version".
    pub versions: Option<String>,
    pub min_age: Option<u64>,
    pub sha256: Vec<[u8; 32]>,
    /// Written as one string (`requests >=2`), split by the compile step,
    /// which knows the ecosystem's syntax.
    pub short: Option<String>,
}

/// A `deny:` entry: `"name [constraint]"` or `{name, versions, reason}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDeny {
    pub name: String,
    pub versions: Option<String>,
    pub reason: Option<String>,
    pub short: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowMap {
    name: NameField,
    versions: Option<String>,
    min_age: Option<DurationField>,
    sha256: Option<Sha256List>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DenyMap {
    name: NameField,
    versions: Option<String>,
    reason: Option<String>,
}

/// A name: non-empty, no blanks (each ecosystem's rules come later).
struct NameField(String);

impl<'de> Deserialize<'de> for NameField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NameField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a package name")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<NameField, E> {
                check_name(s).map(NameField).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

fn check_name(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty package name".into());
    }
    if t.contains(char::is_whitespace) {
        return Err(format!(
            "package name {t:?} contains a blank (in the mapping form, the constraint goes in versions:)"
        ));
    }
    Ok(t.to_string())
}

/// `"name [constraint]"`: checked for a name part here, split later.
fn check_short(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty package entry".into());
    }
    Ok(t.to_string())
}

/// `sha256: <hex>` or `sha256: [<hex>, …]`.
struct Sha256List(Vec<[u8; 32]>);

pub fn parse_sha256_hex(s: &str) -> Result<[u8; 32], String> {
    let s = s.trim();
    let s = s.strip_prefix("sha256:").unwrap_or(s);
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("sha256 {s:?} must be 64 hex digits"));
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

impl<'de> Deserialize<'de> for Sha256List {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Sha256List;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sha256 hex digest or a list of them")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Sha256List, E> {
                parse_sha256_hex(s)
                    .map(|h| Sha256List(vec![h]))
                    .map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Sha256List, A::Error> {
                let mut out = Vec::new();
                while let Some(h) = seq.next_element::<HexField>()? {
                    out.push(h.0);
                }
                if out.is_empty() {
                    return Err(de::Error::custom(
                        "sha256: is an empty list; omit it to allow any file",
                    ));
                }
                Ok(Sha256List(out))
            }
        }
        d.deserialize_any(V)
    }
}

struct HexField([u8; 32]);
impl<'de> Deserialize<'de> for HexField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HexField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sha256 hex digest")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<HexField, E> {
                parse_sha256_hex(s).map(HexField).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

// The two entry forms are told apart by a visitor, not an untagged enum:
// an untagged enum buffers the value and its errors lose their position.
impl<'de> Deserialize<'de> for RawAllow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawAllow;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"name [constraint]\" or {name, versions, min_age, sha256}")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawAllow, E> {
                let short = check_short(s).map_err(E::custom)?;
                Ok(RawAllow {
                    name: String::new(),
                    versions: None,
                    min_age: None,
                    sha256: Vec::new(),
                    short: Some(short),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawAllow, A::Error> {
                let m = AllowMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawAllow {
                    name: m.name.0,
                    versions: m.versions,
                    min_age: m.min_age.map(|d| d.0),
                    sha256: m.sha256.map(|s| s.0).unwrap_or_default(),
                    short: None,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for RawDeny {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawDeny;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"name [constraint]\" or {name, versions, reason}")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawDeny, E> {
                let short = check_short(s).map_err(E::custom)?;
                Ok(RawDeny {
                    name: String::new(),
                    versions: None,
                    reason: None,
                    short: Some(short),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawDeny, A::Error> {
                let m = DenyMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawDeny {
                    name: m.name.0,
                    versions: m.versions,
                    reason: m.reason,
                    short: None,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for RawAllow {
    fn schema_name() -> Cow<'static, str> {
        "RawAllow".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let dur = g.subschema_for::<DurationField>();
        json_schema!({
            "description": "An approved package: \"name [constraint]\" (`requests >=2.31,<3`) \
                or a mapping. Constraints use the ecosystem's syntax.",
            "anyOf": [
                {"type": "string", "pattern": "\\S"},
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["name"],
                    "properties": {
                        "name": {
                            "description": "The package name, as the registry spells it \
                                (normalised per ecosystem when matched).",
                            "type": "string",
                            "pattern": "^\\s*\\S+\\s*$"
                        },
                        "versions": {
                            "description": "A version constraint in the ecosystem's syntax \
                                (`>=2.31,<3`, `^1.2.0`, `>=v1.2.0, <v2.0.0`); default any.",
                            "type": "string",
                            "pattern": "\\S"
                        },
                        "min_age": {
                            "description": "This entry's min_age, over the set's and the settings'.",
                            "allOf": [dur]
                        },
                        "sha256": {
                            "description": "Pinned file digests: only these files download.",
                            "anyOf": [
                                {"type": "string", "pattern": SHA256_PATTERN},
                                {"type": "array", "minItems": 1,
                                 "items": {"type": "string", "pattern": SHA256_PATTERN}}
                            ]
                        }
                    }
                }
            ]
        })
    }
}

impl JsonSchema for RawDeny {
    fn schema_name() -> Cow<'static, str> {
        "RawDeny".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A denied package, or versions of it: \"name [constraint]\" or a \
                mapping. Beats every allow.",
            "anyOf": [
                {"type": "string", "pattern": "\\S"},
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["name"],
                    "properties": {
                        "name": {
                            "description": "The package name.",
                            "type": "string",
                            "pattern": "^\\s*\\S+\\s*$"
                        },
                        "versions": {
                            "description": "The denied versions, in the ecosystem's syntax; \
                                default every version.",
                            "type": "string",
                            "pattern": "\\S"
                        },
                        "reason": {
                            "description": "Why it is denied (shown in the deny message).",
                            "type": "string"
                        }
                    }
                }
            ]
        })
    }
}

/// What [`parse_sha256_hex`] accepts.
const SHA256_PATTERN: &str = "^\\s*(?:sha256:)?[0-9A-Fa-f]{64}\\s*$";

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        packages: Vec<RawPackageSet>,
        settings: Option<Settings>,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Settings {
        packages: Option<RawPackageSettings>,
    }

    fn err_at(text: &str) -> (usize, usize, String) {
        let e = serde_yaml_ng::from_str::<Doc>(text).unwrap_err();
        let l = e.location().expect("located");
        (l.line(), l.column(), e.to_string())
    }

    const DESIGN_EXAMPLE: &str = r#"
packages:
  - id: py-agent-runtime
    owner: python-platform
    reason: vetted runtime deps
    ticket: SEC-1301
    expires: 2027-06-01
    ecosystem: pypi
    clients: ["ci-*"]
    min_age: 7d
    allow:
      - requests >=2.31,<3
      - urllib3
      - { name: numpy, versions: ">=1.26", min_age: 0d }
      - { name: certifi, versions: "==2024.8.30", sha256: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" }
    deny:
      - { name: ultralytics, versions: "==8.3.41", reason: compromised release }

settings:
  packages:
    enforce: [pypi, npm, cargo]
    min_age: 3d
    time_unknown: deny
    mirrors:
      pypi: { url: "https://mirror.corp/api/pypi/pypi/simple/",
              inject: { headers: { Authorization: "Bearer ${file:/run/secrets/mirror}" } } }
"#;

    #[test]
    fn design_example_parses() {
        let d: Doc = serde_yaml_ng::from_str(DESIGN_EXAMPLE).unwrap();
        let s = &d.packages[0];
        assert_eq!(s.id.0, "py-agent-runtime");
        assert_eq!(s.ecosystem, Some(Ecosystem::Pypi));
        assert_eq!(s.min_age.as_ref().map(|d| d.0), Some(7 * 86400));
        assert_eq!(s.allow[0].short.as_deref(), Some("requests >=2.31,<3"));
        assert_eq!(s.allow[2].name, "numpy");
        assert_eq!(s.allow[2].min_age, Some(0));
        assert_eq!(s.allow[3].sha256, vec![[0xaa; 32]]);
        assert_eq!(s.deny[0].reason.as_deref(), Some("compromised release"));
        let p = d.settings.unwrap().packages.unwrap();
        assert_eq!(
            p.enforce,
            Some(vec![Ecosystem::Pypi, Ecosystem::Npm, Ecosystem::Cargo])
        );
        assert_eq!(p.time_unknown, Some(TimeUnknown::Deny));
        assert!(p.mirrors[&Ecosystem::Pypi].inject.is_some());
    }

    #[test]
    fn errors_point_at_the_offending_value() {
        let text = "packages:\n  - id: a\n    allow:\n      - { name: x, sha256: [\"00\"] }\n";
        let (line, col, msg) = err_at(text);
        assert_eq!((line, col), (4, 29), "{msg}");
        assert!(msg.contains("64 hex digits"), "{msg}");

        let text = "packages:\n  - id: a\n    allow:\n      - { name: x, version: \">=1\" }\n";
        let (line, _, msg) = err_at(text);
        assert_eq!(line, 4, "{msg}");
        assert!(msg.contains("unknown field `version`"), "{msg}");

        let text = "packages:\n  - id: a\n    ecosystem: pip\n";
        let (line, col, msg) = err_at(text);
        assert_eq!((line, col), (3, 16), "{msg}");

        let text = "packages:\n  - id: a\n    min_age: 3 days\n";
        let (line, _, msg) = err_at(text);
        assert_eq!(line, 3, "{msg}");

        let text = "settings:\n  packages:\n    mirrors:\n      rubygems: { url: x }\n";
        let (line, _, msg) = err_at(text);
        assert_eq!(line, 4, "{msg}");

        let text = "packages:\n  - id: a\n    allow:\n      - { name: \"a b\" }\n";
        let (line, _, msg) = err_at(text);
        assert_eq!(line, 4, "{msg}");
        assert!(msg.contains("blank"), "{msg}");
    }

    #[test]
    fn sha256_takes_one_or_a_list() {
        let h = "ab".repeat(32);
        let text = format!(
            "packages:\n  - id: a\n    allow:\n      - {{ name: x, sha256: [{h}, \"sha256:{h}\"] }}\n"
        );
        let d: Doc = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(d.packages[0].allow[0].sha256, vec![[0xab; 32], [0xab; 32]]);
        let text = "packages:\n  - id: a\n    allow:\n      - { name: x, sha256: [] }\n";
        assert!(err_at(text).2.contains("empty list"));
    }
}
