//! Span-preserving JSON: the members of an object (or elements of an
//! array) with their byte ranges in the original document, so a filter can
//! drop or replace some and copy every other one byte for byte. serde_json
//! validates the document and hands out each value as a `&RawValue`
//! borrowed from the input; its offset is the pointer difference.
//!
//! A duplicate key in an object the gate reads is an error: JSON parsers
//! disagree on which one wins, so the gate and the client could read
//! different versions from one document.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// One `"key": value` of an object, with where it is in the document.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    pub key: Cow<'a, str>,
    pub value: &'a RawValue,
    /// Offset of the key's opening quote.
    pub key_start: usize,
    pub val_start: usize,
    pub val_end: usize,
}

/// An object's members in document order, and where its braces are.
#[derive(Debug, Clone)]
pub struct Object<'a> {
    /// Offset of `{`.
    pub start: usize,
    /// Offset just past `}`.
    pub end: usize,
    pub members: Vec<Member<'a>>,
}

impl<'a> Object<'a> {
    pub fn get(&self, key: &str) -> Option<&Member<'a>> {
        self.members.iter().find(|m| m.key == key)
    }
}

/// An array's elements with their spans.
#[derive(Debug, Clone)]
pub struct Array<'a> {
    pub start: usize,
    pub end: usize,
    pub elems: Vec<(&'a RawValue, usize, usize)>,
}

struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                let mut seen = HashSet::new();
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    let v: &'de RawValue = map.next_value()?;
                    if !seen.insert(k.clone()) {
                        return Err(de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

struct Elems<'a>(Vec<&'a RawValue>);

impl<'de> Deserialize<'de> for Elems<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Elems<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Elems<'de>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(v) = seq.next_element::<&'de RawValue>()? {
                    out.push(v);
                }
                Ok(Elems(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// Offset of `sub` in `base`; `sub` must be a subslice of it.
fn offset(base: &str, sub: &str) -> Result<usize, String> {
    let b = base.as_ptr() as usize;
    let s = sub.as_ptr() as usize;
    if s < b || s + sub.len() > b + base.len() {
        return Err("internal: value outside its document".into());
    }
    Ok(s - b)
}

/// The document's top-level value.
pub fn top(doc: &str) -> Result<&RawValue, String> {
    serde_json::from_str::<&RawValue>(doc).map_err(|e| e.to_string())
}

/// The document's members in one pass, with the members of the objects
/// under the top-level `nested` keys parsed in the same pass (a large
/// packument is read once, not once per level). The nested keys are not
/// in the returned top object's members; each nested object's span is
/// found from its members (an empty one has `start == end == 0`).
pub fn document_nested<'a>(
    doc: &'a str,
    nested: &[&str],
) -> Result<(Object<'a>, Vec<(String, Object<'a>)>), String> {
    let start = doc.len() - doc.trim_start().len();
    let end = doc.trim_end().len().max(start);
    let text = &doc[start..end];
    let mut de = serde_json::Deserializer::from_str(text);
    let (top, inner) =
        de::DeserializeSeed::deserialize(TopSeed { nested }, &mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    let obj = spans(doc, start, end, top)?;
    let mut out = Vec::with_capacity(inner.len());
    for (k, ms) in inner {
        let (s, e) = match (ms.first(), ms.last()) {
            (Some(f), Some(l)) => {
                let b = doc.as_bytes();
                let first = key_start_before(b, offset(doc, f.1.get())?)
                    .ok_or("internal: no key before a value")?;
                let mut s = first;
                while s > 0 && b[s - 1].is_ascii_whitespace() {
                    s -= 1;
                }
                let mut e = offset(doc, l.1.get())? + l.1.get().len();
                while e < b.len() && b[e].is_ascii_whitespace() {
                    e += 1;
                }
                if s == 0 || b[s - 1] != b'{' || b.get(e) != Some(&b'}') {
                    return Err("internal: nested object without braces".into());
                }
                (s - 1, e + 1)
            }
            _ => (0, 0),
        };
        out.push((k.into_owned(), spans(doc, s, e, ms)?));
    }
    Ok((obj, out))
}

type RawMembers<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

struct TopSeed<'k> {
    nested: &'k [&'k str],
}

impl<'de> de::DeserializeSeed<'de> for TopSeed<'_> {
    type Value = (RawMembers<'de>, Vec<(Cow<'de, str>, RawMembers<'de>)>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct V<'k>(&'k [&'k str]);
        impl<'de> Visitor<'de> for V<'_> {
            type Value = (RawMembers<'de>, Vec<(Cow<'de, str>, RawMembers<'de>)>);
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut top = Vec::new();
                let mut inner = Vec::new();
                let mut seen = HashSet::new();
                while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                    if !seen.insert(k.clone()) {
                        return Err(de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    if self.0.contains(&&*k) {
                        let Members(m) = map.next_value()?;
                        inner.push((k, m));
                    } else {
                        top.push((k, map.next_value::<&'de RawValue>()?));
                    }
                }
                Ok((top, inner))
            }
        }
        d.deserialize_map(V(self.nested))
    }
}

/// The members of the document itself (an object), in one pass.
pub fn document(doc: &str) -> Result<Object<'_>, String> {
    document_nested(doc, &[]).map(|(top, _)| top)
}

/// The members of `raw` (an object inside `base`) with their spans.
pub fn object<'a>(base: &'a str, raw: &'a RawValue) -> Result<Object<'a>, String> {
    members(base, raw.get())
}

fn members<'a>(base: &'a str, text: &'a str) -> Result<Object<'a>, String> {
    let Members(ms) = serde_json::from_str::<Members<'a>>(text).map_err(|e| e.to_string())?;
    let start = offset(base, text)?;
    spans(base, start, start + text.len(), ms)
}

fn spans<'a>(
    base: &'a str,
    start: usize,
    end: usize,
    ms: RawMembers<'a>,
) -> Result<Object<'a>, String> {
    let mut members = Vec::with_capacity(ms.len());
    for (key, value) in ms {
        let val_start = offset(base, value.get())?;
        let val_end = val_start + value.get().len();
        let key_start = key_start_before(base.as_bytes(), val_start)
            .ok_or("internal: no key before a value")?;
        members.push(Member {
            key,
            value,
            key_start,
            val_start,
            val_end,
        });
    }
    Ok(Object {
        start,
        end,
        members,
    })
}

/// The elements of `raw` (an array inside `base`) with their spans.
pub fn array<'a>(base: &'a str, raw: &'a RawValue) -> Result<Array<'a>, String> {
    let text = raw.get();
    let Elems(es) = serde_json::from_str::<Elems<'a>>(text).map_err(|e| e.to_string())?;
    let start = offset(base, text)?;
    let mut elems = Vec::with_capacity(es.len());
    for v in es {
        let s = offset(base, v.get())?;
        elems.push((v, s, s + v.get().len()));
    }
    Ok(Array {
        start,
        end: start + text.len(),
        elems,
    })
}

/// The opening quote of the key whose value starts at `val_start`:
/// back over blanks, `:`, blanks, to the closing quote, then back to the
/// first `"` not escaped (preceded by an even number of backslashes).
fn key_start_before(b: &[u8], val_start: usize) -> Option<usize> {
    let mut i = val_start;
    let ws = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r');
    while i > 0 && ws(b[i - 1]) {
        i -= 1;
    }
    if i == 0 || b[i - 1] != b':' {
        return None;
    }
    i -= 1;
    while i > 0 && ws(b[i - 1]) {
        i -= 1;
    }
    if i == 0 || b[i - 1] != b'"' {
        return None;
    }
    i -= 1; // at the closing quote
    let mut j = i;
    while j > 0 {
        j -= 1;
        if b[j] == b'"' {
            let mut k = j;
            let mut slashes = 0;
            while k > 0 && b[k - 1] == b'\\' {
                slashes += 1;
                k -= 1;
            }
            if slashes % 2 == 0 {
                return Some(j);
            }
        }
    }
    None
}

/// Rebuilds a list of spans (an object's members or an array's
/// elements): the opening text up to the first item, the kept items in
/// order joined by the original separator, the closing text after the last.
/// `items[i] = (start, end)`; `pieces` the text of each kept item.
pub fn rebuild_list(
    base: &str,
    open_end: usize,
    close_start: usize,
    items: &[(usize, usize)],
    pieces: impl IntoIterator<Item = impl AsRef<str>>,
    open: &str,
    close: &str,
) -> String {
    let pieces: Vec<String> = pieces.into_iter().map(|p| p.as_ref().to_string()).collect();
    rebuild_pieces(
        base,
        open_end,
        close_start,
        items,
        pieces.iter().map(|p| Cow::Borrowed(p.as_str())),
        open,
        close,
    )
    .concat()
}

/// [`rebuild_list`] as pieces to concatenate, borrowing what it copies
/// from `base` (one copy of a large object instead of three).
pub fn rebuild_pieces<'a>(
    base: &'a str,
    open_end: usize,
    close_start: usize,
    items: &[(usize, usize)],
    pieces: impl IntoIterator<Item = Cow<'a, str>>,
    open: &'a str,
    close: &'a str,
) -> Vec<Cow<'a, str>> {
    let sep = match items {
        [a, b, ..] => &base[a.1..b.0],
        _ => ",",
    };
    let (lead, trail) = match (items.first(), items.last()) {
        (Some(f), Some(l)) => (&base[open_end..f.0], &base[l.1..close_start]),
        _ => ("", ""),
    };
    let mut out = vec![Cow::Borrowed(open)];
    let mut any = false;
    for p in pieces {
        out.push(Cow::Borrowed(if any { sep } else { lead }));
        any = true;
        out.push(p);
    }
    if any {
        out.push(Cow::Borrowed(trail));
    }
    out.push(Cow::Borrowed(close));
    out
}

/// Applies non-overlapping `(start, end, replacement)` edits to `base`.
pub fn splice(base: &str, edits: Vec<(usize, usize, String)>) -> String {
    splice_pieces(
        base,
        edits
            .into_iter()
            .map(|(s, e, r)| (s, e, vec![Cow::Owned(r)]))
            .collect(),
    )
}

/// [`splice`] with each replacement given as pieces, written straight into
/// the output.
pub fn splice_pieces(base: &str, mut edits: Vec<(usize, usize, Vec<Cow<'_, str>>)>) -> String {
    edits.sort_by_key(|e| e.0);
    let cap = base.len()
        + edits
            .iter()
            .map(|e| e.2.iter().map(|p| p.len()).sum::<usize>())
            .sum::<usize>();
    let mut out = String::with_capacity(cap);
    let mut at = 0;
    for (s, e, r) in edits {
        out.push_str(&base[at..s]);
        for p in r {
            out.push_str(&p);
        }
        at = e;
    }
    out.push_str(&base[at..]);
    out
}

/// A JSON string literal.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

/// The string a raw value holds, if it is a string.
pub fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct S<'a>(#[serde(borrow)] Cow<'a, str>);
    serde_json::from_str::<S<'_>>(raw.get()).ok().map(|s| s.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_carry_their_exact_spans() {
        let doc = "{ \"a\" : 1,\n  \"b\\\"q\":{\"x\":[1, 2]} ,\"c\":\"s\\u0041\"}";
        let obj = object(doc, top(doc).unwrap()).unwrap();
        let texts: Vec<&str> = obj
            .members
            .iter()
            .map(|m| &doc[m.key_start..m.val_end])
            .collect();
        assert_eq!(
            texts,
            [
                "\"a\" : 1",
                "\"b\\\"q\":{\"x\":[1, 2]}",
                "\"c\":\"s\\u0041\""
            ]
        );
        assert_eq!(obj.members[1].key, "b\"q");
        assert_eq!(as_str(obj.members[2].value).as_deref(), Some("sA"));
        assert_eq!((obj.start, obj.end), (0, doc.len()));
        let inner = object(doc, obj.members[1].value).unwrap();
        let arr = array(doc, inner.members[0].value).unwrap();
        assert_eq!(
            arr.elems.iter().map(|e| &doc[e.1..e.2]).collect::<Vec<_>>(),
            ["1", "2"]
        );
    }

    #[test]
    fn nested_objects_are_read_in_the_same_pass() {
        let doc = " {\"name\":\"x\", \"versions\" : { \"1\":{\"a\":1} ,\"2\":[]\n} ,\"time\":{},\"z\":0} ";
        let (top, nested) = document_nested(doc, &["versions", "time"]).unwrap();
        assert_eq!(
            top.members.iter().map(|m| &*m.key).collect::<Vec<_>>(),
            ["name", "z"]
        );
        let (k, v) = &nested[0];
        assert_eq!(
            (k.as_str(), &doc[v.start..v.end]),
            ("versions", "{ \"1\":{\"a\":1} ,\"2\":[]\n}")
        );
        assert_eq!(
            &doc[v.members[1].key_start..v.members[1].val_end],
            "\"2\":[]"
        );
        assert_eq!((nested[1].1.start, nested[1].1.members.len()), (0, 0));
        assert!(
            document_nested(r#"{"versions":{},"versions":{}}"#, &["versions"])
                .unwrap_err()
                .contains("duplicate")
        );
        assert!(
            document_nested(r#"{"versions":{"1":{},"1":{}}}"#, &["versions"])
                .unwrap_err()
                .contains("duplicate")
        );
        assert!(document_nested(r#"{"versions":[]}"#, &["versions"]).is_err());
        assert!(document_nested(r#"{"a":1} x"#, &[]).is_err());
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let doc = r#"{"versions":{"1.0.0":{},"1.0.0":{"evil":true}}}"#;
        let obj = object(doc, top(doc).unwrap()).unwrap();
        assert!(object(doc, obj.members[0].value)
            .unwrap_err()
            .contains("duplicate"));
        // Escapes that spell the same key are the same key.
        let doc = r#"{"a":1,"\u0061":2}"#;
        assert!(object(doc, top(doc).unwrap()).is_err());
    }

    #[test]
    fn rebuilding_keeps_separators_and_edges() {
        let doc = "[\n  1,\n  2,\n  3\n]";
        let arr = array(doc, top(doc).unwrap()).unwrap();
        let items: Vec<(usize, usize)> = arr.elems.iter().map(|e| (e.1, e.2)).collect();
        let kept = ["1".to_string(), "3".to_string()];
        assert_eq!(
            rebuild_list(doc, arr.start + 1, arr.end - 1, &items, kept, "[", "]"),
            "[\n  1,\n  3\n]"
        );
        assert_eq!(
            rebuild_list(
                doc,
                arr.start + 1,
                arr.end - 1,
                &items,
                Vec::<String>::new(),
                "[",
                "]"
            ),
            "[]"
        );
        assert_eq!(
            splice("abcdef", vec![(4, 5, "X".into()), (1, 2, "".into())]),
            "acdXf"
        );
    }
}
