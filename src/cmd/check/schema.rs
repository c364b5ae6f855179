//! `egressd schema`: the JSON Schema of a policy file, for editors (the
//! `yaml-language-server` modeline in each policy file) and CI validators.
//!
//! Generated from the serde mirror that parses the policy
//! ([`crate::policy::raw`]), so the schema cannot drift from the parser:
//! unknown keys are refused (`additionalProperties: false` from
//! `deny_unknown_fields`), enums list the parser's words, and the field docs
//! are the descriptions. It owns only the rendering; what a valid policy is
//! stays with `policy` (cross-file rules such as unique ids and one
//! `settings:` are checked by `egressd check`, not by the schema).
//!
//! Draft 7: the draft editors' YAML language servers and most CI validators
//! implement fully.

use schemars::generate::SchemaSettings;

use crate::policy::raw::RawFile;

/// Where the repository ships the output of `egressd schema`, relative to
/// its root (a test keeps the two equal).
pub const SHIPPED_PATH: &str = "schema/policy.schema.json";

/// The policy file's JSON Schema.
pub fn policy_schema() -> serde_json::Value {
    let mut schema = SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<RawFile>();
    schema.insert("title".into(), "egressd policy file".into());
    let mut v = schema.to_value();
    unwrap_descriptions(&mut v);
    v
}

/// Doc comments are wrapped at 100 columns; an editor's hover wraps on its
/// own, so a single line break becomes a space (paragraphs stay).
fn unwrap_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    serde_json::Value::String(s) if k == "description" => {
                        *s = s
                            .split("\n\n")
                            .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                            .collect::<Vec<_>>()
                            .join("\n\n");
                    }
                    _ => unwrap_descriptions(v),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

/// [`policy_schema`] as `egressd schema` prints it: pretty JSON and a newline.
pub fn render() -> String {
    let mut s = serde_json::to_string_pretty(&policy_schema()).expect("a schema serialises");
    s.push('\n');
    s
}
