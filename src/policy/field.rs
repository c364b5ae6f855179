//! The policy's validated scalar fields that the package gate's serde
//! mirror shares with the policy's own (`raw.rs`): ids, dates, durations,
//! the credentials an exception or a mirror injects. A leaf: it uses only
//! `time`, so `packages::raw` can use it while `policy::raw` uses
//! `packages::raw`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::time::{parse_date, parse_duration};

/// Credentials egressd adds to requests after they leave the sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawInject {
    /// Header name to value; values may hold `${env:NAME}` and `${file:PATH}`.
    #[serde(default)]
    #[schemars(extend("propertyNames" = {"pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"}))]
    pub headers: BTreeMap<String, String>,
}

macro_rules! validated {
    ($name:ident, $inner:ty, $parse:expr, $schema:expr) => {
        #[derive(Debug, Clone)]
        pub struct $name(pub $inner);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Validate inside the visitor: an error raised there is
                // located at this scalar, one raised after `String::deserialize`
                // returns only at the enclosing list or mapping.
                struct V;
                impl<'de> de::Visitor<'de> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<$name, E> {
                        let f: fn(&str) -> Result<$inner, String> = $parse;
                        f(s).map($name).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                let f: fn() -> Schema = $schema;
                f()
            }
        }
    };
}
pub(crate) use validated;

validated!(
    IdField,
    String,
    |s| {
        if !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        {
            Ok(s.to_string())
        } else {
            Err(format!("invalid id {s:?}: use [a-z0-9._-]+"))
        }
    },
    || json_schema!({
        "description": "An id: lower-case letters, digits, '.', '_' and '-'.",
        "type": "string",
        "pattern": "^[a-z0-9._-]+$"
    })
);
validated!(
    DateField,
    i64,
    |s| parse_date(s).ok_or_else(|| format!(
        "invalid date {s:?}: expected YYYY-MM-DD or RFC 3339 (2027-03-01T12:00:00Z)"
    )),
    date_schema
);
validated!(
    SizeField,
    u64,
    |s| parse_size(s).ok_or_else(|| format!(
        "invalid size {s:?}: expected a whole number and a unit, B, KiB, MiB or GiB (64MiB)"
    )),
    || json_schema!({
        "description": "A size: a whole number and a unit, B, KiB, MiB or GiB (64MiB).",
        "type": "string",
        "pattern": "^\\s*[0-9]+\\s*(B|KiB|MiB|GiB)\\s*$"
    })
);

/// `64MiB` → bytes; `None` for anything else (or an overflow).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let mult: u64 = match unit.trim() {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.parse::<u64>().ok()?.checked_mul(mult)
}

validated!(
    DurationField,
    u64,
    |s| parse_duration(s).ok_or_else(|| format!(
        "invalid duration {s:?}: expected a number with s, m, h or d (90d)"
    )),
    || json_schema!({
        "description": "A duration: a whole number and a unit, s, m, h, d or w (90d, 12h).",
        "type": "string",
        "pattern": "^\\s*[0-9]+[smhdw]\\s*$"
    })
);

fn date_schema() -> Schema {
    json_schema!({
        "description": "A date, YYYY-MM-DD (UTC midnight), or an RFC 3339 UTC time \
            (2027-03-01T12:00:00Z).",
        "type": "string",
        "pattern": "^\\s*(?:19[7-9][0-9]|[2-9][0-9]{3})-(?:0?[1-9]|1[0-2])-(?:0?[1-9]|[12][0-9]|3[01])\
            (?:[T ](?:[01]?[0-9]|2[0-3]):[0-5]?[0-9](?::(?:[0-5]?[0-9]|60))?(?:Z|\\+00:00))?\\s*$"
    })
}
