//! A request body judged against `body:` rules (DESIGN "Writes on
//! allowed hosts", "Precise semantics of writes"). Pure: the body arrives
//! whole (the proxy read it, bounded); the answer is allow, or a reason
//! with a detail that names the pointer or the GraphQL field, never a
//! value the body holds.
//!
//! What the origin reads is what is judged. A JSON reader that keeps the
//! last of two equal keys (serde_json does) would judge one value while
//! another origin acts on the first, so duplicate keys are refused at any
//! depth, and so are keys equal but for case (Go's `encoding/json` matches
//! object keys to fields without regard to case). GraphQL documents are
//! parsed with `apollo-parser`, behind a scan that refuses nesting deeper
//! than [`MAX_DEPTH`] before the parser recurses, and a token bound.

use std::collections::HashSet;
use std::fmt;

use apollo_parser::cst;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::policy::body::{BodyRules, GraphqlRules, MAX_DEPTH};
use crate::policy::{Exception, Reason};

/// The most tokens a GraphQL document may have (a `gh` query has a few
/// hundred): the parser's tree is about a hundred bytes a token, so this
/// bounds its memory whatever `max_bytes` allows.
pub const MAX_GRAPHQL_TOKENS: usize = 100_000;

/// Why a body was refused: the reason and a sentence naming the pointer
/// or field (never the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub detail: String,
}

impl Refusal {
    fn not_allowed(detail: impl Into<String>) -> Refusal {
        Refusal {
            reason: Reason::BodyNotAllowed,
            detail: detail.into(),
        }
    }

    /// The body is longer than `max` bytes.
    pub fn too_large(max: u64) -> Refusal {
        Refusal {
            reason: Reason::BodyTooLarge,
            detail: format!("the body is larger than body: max_bytes ({max} bytes)"),
        }
    }
}

/// Judges `body` (whole, as the origin will read it) against `rules`.
pub fn judge(rules: &BodyRules, body: &[u8]) -> Result<(), Refusal> {
    judge_scored(rules, body).map_err(|(r, _)| r)
}

/// [`judge`], with how far a refused body got (the rules it passed): of
/// several exceptions that refuse, the one that came closest answers.
fn judge_scored(rules: &BodyRules, body: &[u8]) -> Result<(), (Refusal, usize)> {
    if body.len() as u64 > rules.max_bytes {
        return Err((Refusal::too_large(rules.max_bytes), 0));
    }
    if rules.json.is_empty() && rules.graphql.is_none() {
        return Ok(());
    }
    let v = read_json(body).map_err(|e| {
        (
            Refusal::not_allowed(format!("the body is not JSON: {e}")),
            0,
        )
    })?;
    let mut passed = 1;
    if let Some(g) = &rules.graphql {
        judge_graphql(g, &v).map_err(|r| (r, passed))?;
        passed += 1;
    }
    for r in rules.json.iter() {
        let label = if r.pointer.is_empty() {
            "the body"
        } else {
            r.pointer.as_str()
        };
        match v.pointer(&r.pointer) {
            None => {
                let r = Refusal::not_allowed(format!("body: json: {label} is missing"));
                return Err((r, passed));
            }
            Some(got) if !r.expect.matches(got) => {
                let r =
                    Refusal::not_allowed(format!("body: json: {label} is not {}", r.expect.show()));
                return Err((r, passed));
            }
            Some(_) => passed += 1,
        }
    }
    Ok(())
}

/// What the rules decided over several exceptions.
#[derive(Debug)]
pub enum Choice<'p> {
    Allow(&'p Exception),
    Refuse(&'p Exception, Refusal),
}

/// How much of a body to read to judge it under `cands` (the exceptions
/// that allow the request, in load order): `None` when the first has no
/// `body:` (nothing to read), else the largest `max_bytes` among them.
pub fn read_bound(cands: &[&Exception]) -> Option<u64> {
    cands.first()?.body()?;
    cands
        .iter()
        .filter_map(|e| e.body())
        .map(|b| b.max_bytes)
        .max()
}

/// The first of `cands` (in load order) that allows `body` decides; when
/// none does, the refusal of the one that came closest (passed the most
/// of its rules; the first of equals). `body` is `None` when it was
/// longer than [`read_bound`]: then only an exception without `body:`
/// allows it.
pub fn choose<'p>(cands: &[&'p Exception], body: Option<&[u8]>) -> Option<Choice<'p>> {
    let mut refused: Option<(&Exception, Refusal, usize)> = None;
    for &e in cands {
        let verdict = match (e.body(), body) {
            (None, _) => Ok(()),
            (Some(r), Some(b)) => judge_scored(r, b),
            (Some(r), None) => Err((Refusal::too_large(r.max_bytes), 0)),
        };
        match verdict {
            Ok(()) => return Some(Choice::Allow(e)),
            Err((r, score)) => {
                if refused.as_ref().is_none_or(|(_, _, s)| score > *s) {
                    refused = Some((e, r, score));
                }
            }
        }
    }
    refused.map(|(e, r, _)| Choice::Refuse(e, r))
}

/// A GraphQL request (`{"query": …, "operationName": …, "variables": …}`)
/// held to `g`.
fn judge_graphql(g: &GraphqlRules, v: &Value) -> Result<(), Refusal> {
    let obj = match v {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(Refusal::not_allowed(
                "a batched GraphQL request (an array of operations) is refused",
            ))
        }
        _ => return Err(Refusal::not_allowed("the body is not a GraphQL request")),
    };
    let Some(Value::String(query)) = obj.get("query") else {
        return Err(Refusal::not_allowed(
            "the GraphQL request has no query string (persisted queries are refused)",
        ));
    };
    let name = match obj.get("operationName") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(Refusal::not_allowed(
                "the GraphQL request's operationName is not a string",
            ))
        }
    };
    let op = operation(query, name).map_err(Refusal::not_allowed)?;
    match op.kind {
        OpKind::Query if g.queries => Ok(()),
        OpKind::Query => Err(Refusal::not_allowed(
            "body: graphql: query operations are not allowed",
        )),
        OpKind::Subscription => Err(Refusal::not_allowed(
            "body: graphql: subscriptions are not allowed",
        )),
        OpKind::Mutation => {
            if op.fields.is_empty() {
                return Err(Refusal::not_allowed("the mutation selects no field"));
            }
            match op
                .fields
                .iter()
                .find(|f| !g.mutations.iter().any(|m| m == *f))
            {
                Some(f) => Err(Refusal::not_allowed(format!(
                    "body: graphql: mutation field {f} is not allowed"
                ))),
                None => Ok(()),
            }
        }
    }
}

/// An operation's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Query,
    Mutation,
    Subscription,
}

/// The operation a GraphQL request runs: its type and top-level field
/// names (aliases ignored, fragment spreads and inline fragments at the
/// top level resolved), in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub kind: OpKind,
    pub name: Option<String>,
    pub fields: Vec<String>,
}

/// Reads `doc` and selects the operation `name` names (or the only one).
/// Every error is a sentence naming no value.
pub fn operation(doc: &str, name: Option<&str>) -> Result<Operation, String> {
    check_depth(doc)?;
    let tree = apollo_parser::Parser::new(doc)
        .recursion_limit(MAX_DEPTH)
        .token_limit(MAX_GRAPHQL_TOKENS)
        .parse();
    if let Some(e) = tree.errors().next() {
        return Err(format!(
            "the GraphQL document does not parse: {} (at byte {})",
            e.message(),
            e.index()
        ));
    }
    let (ops, fragments) = definitions(&tree.document())?;
    let op_name = |o: &cst::OperationDefinition| o.name().map(|n| n.text().to_string());
    if ops.len() > 1 && ops.iter().any(|o| o.name().is_none()) {
        return Err("the GraphQL document holds an anonymous operation beside others".into());
    }
    let op = match name {
        Some(want) => {
            let mut hits = ops.iter().filter(|o| op_name(o).as_deref() == Some(want));
            match (hits.next(), hits.next()) {
                (Some(o), None) => o,
                (None, _) => return Err("operationName names no operation in the document".into()),
                (Some(_), Some(_)) => {
                    return Err("operationName names more than one operation".into())
                }
            }
        }
        None => match ops.as_slice() {
            [o] => o,
            [] => return Err("the GraphQL document holds no operation".into()),
            _ => {
                return Err(
                    "the GraphQL document holds several operations and no operationName".into(),
                )
            }
        },
    };
    let kind = match op.operation_type() {
        None => OpKind::Query,
        Some(t) if t.query_token().is_some() => OpKind::Query,
        Some(t) if t.mutation_token().is_some() => OpKind::Mutation,
        Some(t) if t.subscription_token().is_some() => OpKind::Subscription,
        Some(_) => return Err("an operation of an unknown type".into()),
    };
    let Some(set) = op.selection_set() else {
        return Err("the operation has no selection set".into());
    };
    let mut fields = Vec::new();
    let mut open = Vec::new();
    top_fields(&set, &fragments, &mut open, &mut fields)?;
    Ok(Operation {
        kind,
        name: op_name(op),
        fields,
    })
}

/// The document's operations and its named fragments; a type-system
/// definition or a fragment defined twice refuses it.
#[allow(clippy::type_complexity)]
fn definitions(
    document: &cst::Document,
) -> Result<
    (
        Vec<cst::OperationDefinition>,
        Vec<(String, cst::SelectionSet)>,
    ),
    String,
> {
    let mut ops = Vec::new();
    let mut fragments: Vec<(String, cst::SelectionSet)> = Vec::new();
    for d in document.definitions() {
        match d {
            cst::Definition::OperationDefinition(o) => ops.push(o),
            cst::Definition::FragmentDefinition(f) => {
                let n = f
                    .fragment_name()
                    .and_then(|n| n.name())
                    .map(|n| n.text().to_string());
                let (Some(n), Some(s)) = (n, f.selection_set()) else {
                    return Err("a GraphQL fragment without a name or selection".into());
                };
                if fragments.iter().any(|(m, _)| *m == n) {
                    return Err(format!("the GraphQL fragment {n} is defined twice"));
                }
                fragments.push((n, s));
            }
            _ => {
                return Err(
                    "the GraphQL document holds a type-system definition, not only operations"
                        .into(),
                )
            }
        }
    }
    Ok((ops, fragments))
}

/// The field names of `set`, fragment spreads and inline fragments
/// resolved (a spread of a fragment already open is a cycle: refused).
fn top_fields(
    set: &cst::SelectionSet,
    fragments: &[(String, cst::SelectionSet)],
    open: &mut Vec<String>,
    out: &mut Vec<String>,
) -> Result<(), String> {
    if open.len() > MAX_DEPTH {
        return Err("GraphQL fragments nest deeper than 64".into());
    }
    for s in set.selections() {
        match s {
            cst::Selection::Field(f) => {
                let Some(n) = f.name() else {
                    return Err("a GraphQL field without a name".into());
                };
                out.push(n.text().to_string());
            }
            cst::Selection::FragmentSpread(sp) => {
                let Some(n) = sp
                    .fragment_name()
                    .and_then(|n| n.name())
                    .map(|n| n.text().to_string())
                else {
                    return Err("a GraphQL fragment spread without a name".into());
                };
                if open.contains(&n) {
                    return Err(format!("the GraphQL fragment {n} spreads itself"));
                }
                let Some((_, inner)) = fragments.iter().find(|(m, _)| *m == n) else {
                    return Err(format!("the GraphQL fragment {n} is not defined"));
                };
                open.push(n);
                top_fields(inner, fragments, open, out)?;
                open.pop();
            }
            cst::Selection::InlineFragment(i) => {
                let Some(inner) = i.selection_set() else {
                    return Err("an inline fragment without a selection".into());
                };
                open.push(String::new());
                top_fields(&inner, fragments, open, out)?;
                open.pop();
            }
        }
    }
    Ok(())
}

/// Refuses a document whose `{`, `[` and `(` nest deeper than
/// [`MAX_DEPTH`], outside strings and comments, before a parser recurses
/// into it (apollo-parser bounds selection sets, not list and object
/// values).
fn check_depth(doc: &str) -> Result<(), String> {
    let b = doc.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'#' => {
                while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
            }
            b'"' if b[i..].starts_with(b"\"\"\"") => {
                i += 3;
                while i < b.len() && !b[i..].starts_with(b"\"\"\"") {
                    i += if b[i..].starts_with(b"\\\"\"\"") {
                        4
                    } else {
                        1
                    };
                }
                i += 2;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' | b'(' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "the GraphQL document nests deeper than {MAX_DEPTH}"
                    ));
                }
            }
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Reads a JSON document as the strictest origin would: duplicate keys
/// (also equal but for case) and nesting deeper than [`MAX_DEPTH`] are
/// errors.
pub fn read_json(b: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(b);
    let v = Reader { depth: 0 }.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// One JSON value at `depth`.
struct Reader {
    depth: usize,
}

impl Reader {
    fn inner<E: de::Error>(&self) -> Result<Reader, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format_args!(
                "the body nests deeper than {MAX_DEPTH}"
            )));
        }
        Ok(Reader {
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Reader {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// A key as it is compared for duplicates: lower case, and the two
/// characters Go's key matching also folds to ASCII (`ſ`, `K`).
fn folded(k: &str) -> String {
    k.chars()
        .flat_map(char::to_lowercase)
        .map(|c| match c {
            'ſ' => 's',
            '\u{212a}' => 'k',
            c => c,
        })
        .collect()
}

impl<'de> Visitor<'de> for Reader {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let r = self.inner()?;
            match seq.next_element_seed(r)? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen = HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            if !seen.insert(folded(&k)) {
                let shown: String = k.chars().take(64).collect();
                return Err(de::Error::custom(format_args!(
                    "the key {shown:?} appears twice in one object (keys are compared without \
                     regard to case); the origin might read either"
                )));
            }
            let v = map.next_value_seed(self.inner()?)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::body::{Expect, JsonRule};
    use crate::policy::git::glob;

    fn rules(json: &[(&str, Expect)], graphql: Option<GraphqlRules>) -> BodyRules {
        BodyRules {
            max_bytes: 1 << 20,
            json: json
                .iter()
                .map(|(p, e)| JsonRule {
                    pointer: p.to_string(),
                    expect: match e {
                        Expect::Glob { pattern, .. } => Expect::Glob {
                            pattern: pattern.clone(),
                            glob: glob(pattern).unwrap().compile_matcher(),
                        },
                        Expect::Number(n) => Expect::Number(n.clone()),
                        Expect::Bool(b) => Expect::Bool(*b),
                        Expect::Null => Expect::Null,
                    },
                })
                .collect(),
            graphql,
        }
    }

    fn g(s: &str) -> Expect {
        Expect::Glob {
            pattern: s.into(),
            glob: glob(s).unwrap().compile_matcher(),
        }
    }

    fn pr() -> BodyRules {
        rules(
            &[
                ("/head", g("agent/*")),
                ("/base", g("main")),
                ("/draft", Expect::Bool(true)),
            ],
            None,
        )
    }

    #[test]
    fn json_pointers_judge_the_draft_pr() {
        let r = pr();
        let ok = br#"{"title":"t","head":"agent/x","base":"main","draft":true}"#;
        assert_eq!(judge(&r, ok), Ok(()));
        let cases: [(&[u8], &str); 6] = [
            (
                br#"{"head":"main","base":"main","draft":true}"#,
                "/head is not",
            ),
            (
                br#"{"head":"agent/a/b","base":"main","draft":true}"#,
                "/head is not",
            ),
            (
                br#"{"head":"agent/x","base":"release","draft":true}"#,
                "/base is not",
            ),
            (
                br#"{"head":"agent/x","base":"main","draft":false}"#,
                "/draft is not true",
            ),
            (br#"{"head":"agent/x","base":"main"}"#, "/draft is missing"),
            (b"head=agent/x&base=main&draft=true", "not JSON"),
        ];
        for (body, want) in cases {
            let e = judge(&r, body).unwrap_err();
            assert_eq!(e.reason, Reason::BodyNotAllowed);
            assert!(e.detail.contains(want), "{}: {}", want, e.detail);
            // The value is never named.
            assert!(!e.detail.contains("release") && !e.detail.contains("agent/a/b"));
        }
    }

    #[test]
    fn duplicate_keys_at_any_depth_are_refused() {
        let r = pr();
        for body in [
            &br#"{"head":"agent/x","base":"main","draft":true,"head":"main"}"#[..],
            br#"{"head":"agent/x","base":"main","draft":true,"HEAD":"main"}"#,
            br#"{"head":"agent/x","base":"main","draft":true,"x":{"a":1,"a":2}}"#,
            br#"{"head":"agent/x","base":"main","draft":true,"x":[{"a":1,"A":2}]}"#,
        ] {
            let e = judge(&r, body).unwrap_err();
            assert!(e.detail.contains("appears twice"), "{}", e.detail);
        }
        let deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        assert!(read_json(deep.as_bytes()).is_err());
        let ok = format!("{}1{}", "[".repeat(64), "]".repeat(64));
        assert!(read_json(ok.as_bytes()).is_ok());
        assert!(read_json(b"{} x").is_err());
    }

    #[test]
    fn too_large_is_its_own_reason() {
        let mut r = pr();
        r.max_bytes = 10;
        let e = judge(&r, br#"{"head":"agent/x"}"#).unwrap_err();
        assert_eq!(e.reason, Reason::BodyTooLarge);
    }

    fn gq(queries: bool, mutations: &[&str]) -> BodyRules {
        rules(
            &[],
            Some(GraphqlRules {
                queries,
                mutations: mutations.iter().map(|m| m.to_string()).collect(),
            }),
        )
    }

    fn req(q: &str, name: Option<&str>) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"query": q, "operationName": name, "variables": {}}))
            .unwrap()
    }

    #[test]
    fn graphql_operations() {
        let create = gq(false, &["createPullRequest"]);
        let read = gq(true, &[]);
        let m = "mutation M($i: CreatePullRequestInput!) { createPullRequest(input: $i) { pullRequest { url } } }";
        assert_eq!(judge(&create, &req(m, None)), Ok(()));
        assert!(judge(&read, &req(m, None)).is_err());
        let merge =
            "mutation { mergePullRequest(input: {pullRequestId: \"x\"}) { clientMutationId } }";
        let e = judge(&create, &req(merge, None)).unwrap_err();
        assert!(e.detail.contains("mergePullRequest"), "{}", e.detail);
        // An alias does not rename the field.
        let alias = "mutation { createPullRequest: mergePullRequest(input: {}) { x } }";
        assert!(judge(&create, &req(alias, None)).is_err());
        // Fragments at the top level, named and inline, are resolved.
        let frag = "mutation { ...F } fragment F on Mutation { mergePullRequest(input: {}) { x } }";
        assert!(judge(&create, &req(frag, None)).is_err());
        let inline = "mutation { ... on Mutation { mergePullRequest(input: {}) { x } } }";
        assert!(judge(&create, &req(inline, None)).is_err());
        let cyc = "mutation { ...F } fragment F on Mutation { ...F }";
        assert!(judge(&create, &req(cyc, None)).is_err());
        // Queries.
        let q = "query { viewer { login } }";
        assert_eq!(judge(&read, &req(q, None)), Ok(()));
        assert_eq!(judge(&read, &req("{ viewer { login } }", None)), Ok(()));
        assert!(judge(&create, &req(q, None)).is_err());
        // Two operations: operationName selects; none is refused.
        let two = format!("query A {{ viewer {{ login }} }} {merge}")
            .replace("mutation {", "mutation B {");
        let e = judge(&read, &req(&two, None)).unwrap_err();
        assert!(e.detail.contains("several operations"), "{}", e.detail);
        assert_eq!(judge(&read, &req(&two, Some("A"))), Ok(()));
        assert!(judge(&read, &req(&two, Some("B"))).is_err());
        assert!(judge(&read, &req(&two, Some("C"))).is_err());
        // Subscriptions, batches, persisted queries, type definitions.
        assert!(judge(&read, &req("subscription { x }", None)).is_err());
        let batch = format!("[{}]", String::from_utf8(req(q, None)).unwrap());
        assert!(judge(&read, batch.as_bytes())
            .unwrap_err()
            .detail
            .contains("batched"));
        assert!(judge(&read, br#"{"extensions":{"persistedQuery":{}}}"#).is_err());
        assert!(judge(&read, &req("type Q { a: Int } query { a }", None)).is_err());
        assert!(judge(&read, &req("query { a ", None)).is_err());
    }

    #[test]
    fn graphql_nesting_is_bounded_before_parsing() {
        let read = gq(true, &[]);
        let deep = format!(
            "query {{ {} x {} }}",
            "a {".repeat(10_000),
            "}".repeat(10_000)
        );
        let e = judge(&read, &req(&deep, None)).unwrap_err();
        assert!(e.detail.contains("deeper than 64"), "{}", e.detail);
        let list = format!(
            "query {{ a(x: {}1{}) }}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(judge(&read, &req(&list, None)).is_err());
        // Braces inside strings and comments do not count.
        let s = format!(
            "query {{ a(x: \"{}\") # {}\n }}",
            "{".repeat(100),
            "[".repeat(100)
        );
        assert_eq!(judge(&read, &req(&s, None)), Ok(()));
        let block = format!("query {{ a(x: \"\"\"{}\"\"\") }}", "(".repeat(100));
        assert_eq!(judge(&read, &req(&block, None)), Ok(()));
    }

    #[test]
    fn the_first_exception_that_allows_decides() {
        let src = "exceptions:\n  - id: read\n    owner: o\n    reason: r\n    hosts: [api.x]\n    paths: [/graphql]\n    body: { graphql: { queries: true } }\n  - id: pr\n    owner: o\n    reason: r\n    hosts: [api.x]\n    paths: [/graphql]\n    body: { graphql: { mutations: [createPullRequest] } }\n";
        let p = crate::policy::from_yaml(src).unwrap();
        let cands: Vec<&Exception> = p.exceptions.iter().collect();
        assert_eq!(read_bound(&cands), Some(1 << 20));
        let m = req("mutation { createPullRequest(input: {}) { x } }", None);
        match choose(&cands, Some(&m)) {
            Some(Choice::Allow(e)) => assert_eq!(&*e.id, "pr"),
            other => panic!("{other:?}"),
        }
        let merge = req("mutation { mergePullRequest(input: {}) { x } }", None);
        match choose(&cands, Some(&merge)) {
            Some(Choice::Refuse(e, r)) => {
                assert_eq!(&*e.id, "read", "equals: the first answers");
                assert_eq!(r.reason, Reason::BodyNotAllowed);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(choose(&cands, None), Some(Choice::Refuse(_, _))));
    }
}
