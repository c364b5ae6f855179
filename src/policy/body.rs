//! An exception's `body:` rules, compiled (DESIGN "Writes on allowed
//! hosts", "Precise semantics of writes"). Pure: what a JSON pointer's
//! value must be and which GraphQL operations are allowed. Reading a body
//! (duplicate keys, GraphQL documents) is done above, in `writes::body`.

use globset::GlobMatcher;

/// Default `body.max_bytes`: 1 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
/// The largest `body.max_bytes` a policy may set: 16 MiB (the body is held
/// in memory while it is judged).
pub const MAX_MAX_BYTES: u64 = 16 << 20;
/// Nesting deeper than this (JSON arrays and objects, GraphQL selection
/// sets, lists and argument objects) is refused.
pub const MAX_DEPTH: usize = 64;

/// `body:` compiled.
#[derive(Debug)]
pub struct BodyRules {
    pub max_bytes: u64,
    /// `json:` pointers in the order written (sorted by pointer at load).
    pub json: Box<[JsonRule]>,
    pub graphql: Option<GraphqlRules>,
}

/// One `json:` entry: the value at `pointer` must be `expect`.
#[derive(Debug)]
pub struct JsonRule {
    /// RFC 6901, as written (`/variables/input/draft`).
    pub pointer: String,
    pub expect: Expect,
}

/// What a pointer's value must be.
#[derive(Debug)]
pub enum Expect {
    /// A string matching the glob (as `paths:`: `*` stops at `/`).
    Glob {
        pattern: String,
        glob: GlobMatcher,
    },
    /// A number equal to this one (compared as numbers: `1` and `1.0`
    /// are equal).
    Number(serde_json::Number),
    Bool(bool),
    Null,
}

/// `graphql:` compiled.
#[derive(Debug, Default)]
pub struct GraphqlRules {
    /// Query operations are allowed.
    pub queries: bool,
    /// The top-level mutation fields allowed (by field name, not alias).
    pub mutations: Box<[String]>,
}

impl Expect {
    /// Whether the JSON value `v` is what the rule asks for.
    pub fn matches(&self, v: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (self, v) {
            (Expect::Glob { glob, .. }, Value::String(s)) => glob.is_match(s),
            (Expect::Number(want), Value::Number(got)) => numbers_equal(want, got),
            (Expect::Bool(want), Value::Bool(got)) => want == got,
            (Expect::Null, Value::Null) => true,
            _ => false,
        }
    }

    /// The rule's value as the policy wrote it (for `explain`).
    pub fn show(&self) -> String {
        match self {
            Expect::Glob { pattern, .. } => format!("{pattern:?}"),
            Expect::Number(n) => n.to_string(),
            Expect::Bool(b) => b.to_string(),
            Expect::Null => "null".into(),
        }
    }
}

/// Integers exactly; otherwise as floating point, so that `1` and `1.0`
/// are the same number (as they are to the origin's JSON reader).
fn numbers_equal(a: &serde_json::Number, b: &serde_json::Number) -> bool {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return x == y;
    }
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// Whether `p` is an RFC 6901 pointer: empty (the whole document) or
/// `/`-separated tokens in which `~` is only ever `~0` or `~1`.
pub fn valid_pointer(p: &str) -> Result<(), String> {
    if !p.is_empty() && !p.starts_with('/') {
        return Err("a JSON pointer starts with '/' (RFC 6901)".into());
    }
    let b = p.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'~' && !matches!(b.get(i + 1), Some(b'0' | b'1')) {
            return Err("'~' in a JSON pointer must be '~0' or '~1' (RFC 6901)".into());
        }
    }
    Ok(())
}

/// Whether `name` is a GraphQL name (`[_A-Za-z][_0-9A-Za-z]*`).
pub fn valid_graphql_name(name: &str) -> bool {
    let mut c = name.bytes();
    matches!(c.next(), Some(b) if b == b'_' || b.is_ascii_alphabetic())
        && c.all(|b| b == b'_' || b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_by_kind() {
        let g = Expect::Glob {
            pattern: "agent/*".into(),
            glob: super::super::git::glob("agent/*")
                .unwrap()
                .compile_matcher(),
        };
        assert!(g.matches(&serde_json::json!("agent/x")));
        assert!(!g.matches(&serde_json::json!("agent/a/b")));
        assert!(!g.matches(&serde_json::json!(["agent/x"])));
        let one = Expect::Number(serde_json::Number::from(1));
        assert!(one.matches(&serde_json::json!(1)));
        assert!(one.matches(&serde_json::json!(1.0)));
        assert!(!one.matches(&serde_json::json!("1")));
        assert!(Expect::Bool(true).matches(&serde_json::json!(true)));
        assert!(!Expect::Bool(true).matches(&serde_json::json!("true")));
        assert!(Expect::Null.matches(&serde_json::Value::Null));
        assert!(!Expect::Null.matches(&serde_json::json!(false)));
    }

    #[test]
    fn pointers_and_names() {
        assert!(valid_pointer("/variables/input/draft").is_ok());
        assert!(valid_pointer("").is_ok());
        assert!(valid_pointer("/a~1b/~0").is_ok());
        assert!(valid_pointer("head").is_err());
        assert!(valid_pointer("/a~2").is_err());
        assert!(valid_pointer("/a~").is_err());
        assert!(valid_graphql_name("createPullRequest"));
        assert!(valid_graphql_name("_x1"));
        assert!(!valid_graphql_name("1x"));
        assert!(!valid_graphql_name("merge-pr"));
        assert!(!valid_graphql_name(""));
    }

    /// Each bad `body:` is an error at its exception's line.
    #[test]
    fn bad_body_rules_are_load_errors_at_their_line() {
        let head = "exceptions:\n  - id: ok\n    owner: o\n    reason: r\n    hosts: [a.test]\n  - id: bad\n    owner: o\n    reason: r\n    hosts: [b.test]\n";
        let cases = [
            (
                "    methods: [GET, HEAD]\n    body: { json: { /a: 1 } }\n",
                "send no body",
            ),
            ("    body: { json: { a: 1 } }\n", "starts with '/'"),
            ("    body: { json: { /a~2: 1 } }\n", "'~0' or '~1'"),
            (
                "    body: { json: { /a: [1] } }\n",
                "a value must be a string",
            ),
            ("    body: { json: { /a: \"[\" } }\n", "bad pattern"),
            ("    body: { max_bytes: 17MiB }\n", "between 1B and 16MiB"),
            ("    body: { graphql: {} }\n", "allows nothing"),
            (
                "    body: { graphql: { mutations: [merge-pr] } }\n",
                "not a GraphQL field name",
            ),
            ("    body: { jsn: {} }\n", "unknown field"),
            (
                "    git: { repos: [a/b] }\n    body: { json: { /a: 1 } }\n",
                "git: and body:",
            ),
        ];
        for (rule, want) in cases {
            let err = super::super::from_yaml(&format!("{head}{rule}")).unwrap_err();
            assert!(err.to_string().contains(want), "{rule}: {err}");
            assert!(err.0[0].line >= 6, "{rule}: {err}");
        }
        let ok = format!(
            "{head}    methods: [POST]\n    body: {{ max_bytes: 16MiB, json: {{ /head: agent/*, /n: 1.5, /d: true, /z: null }}, graphql: {{ queries: true }} }}\n"
        );
        let p = super::super::from_yaml(&ok).unwrap();
        let b = p.exception("bad").unwrap().body().unwrap();
        assert_eq!(b.max_bytes, MAX_MAX_BYTES);
        assert_eq!(b.json.len(), 4);
        assert!(p.exception("bad").unwrap().needs_inspection());
    }
}
