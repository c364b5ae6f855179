//! A fast front end for the block-style YAML subset policy files are
//! written in, in front of serde_yaml_ng.
//!
//! [`parse`] reads a file into a flat node list and deserialises the raw
//! mirror (`RawFile`) from it through the same `Deserialize` impls
//! serde_yaml_ng drives, calling the same visitor methods for the same
//! scalars. It recognises block mappings and sequences indented with
//! spaces, `# comments`, one-line flow collections (`[a, b]`, `{k: v}`),
//! one-line plain, single- and double-quoted scalars. Anything else (block
//! scalars, anchors, tags, multi-line scalars, tabs, document markers,
//! odd keys, escapes beyond the common ones), and every error a visitor
//! raises, makes it give up: the caller then parses with serde_yaml_ng,
//! whose result and located error are what the file gets. So a file this
//! parser accepts yields exactly what serde_yaml_ng yields, and a file with
//! an error gets serde_yaml_ng's file:line:column. The differential test
//! (tests/it/policy_files.rs) and the `policy_load` fuzz target hold it to
//! that.
//!
//! At 100k exceptions it reads a policy in a small fraction of
//! serde_yaml_ng's time, and holds 12 bytes per node instead of an event
//! per node with its own allocations.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, Visitor};
use serde::Deserialize;

use super::raw::RawFile;

/// The raw mirror of `text`, or `None` where this front end does not
/// follow the file (or the file has an error): parse it with serde_yaml_ng.
pub fn parse(text: &str) -> Option<RawFile> {
    let doc = Doc::read(text)?;
    let mut de = De {
        doc: &doc,
        pos: 0,
        depth: 0,
    };
    let file = RawFile::deserialize(&mut de).ok()?;
    (de.pos == doc.nodes.len()).then_some(file)
}

/// The differential check the tests and the `policy_load` fuzz target
/// run: `Ok(true)` where this front end read `text` and serde_yaml_ng read
/// the same, `Ok(false)` where it left `text` to serde_yaml_ng, `Err` (what
/// differs) where both read it and disagree, or only this one read it.
pub fn compare_with_serde_yaml(text: &str) -> Result<bool, String> {
    let Some(fast) = parse(text) else {
        return Ok(false);
    };
    match serde_yaml_ng::from_str::<RawFile>(text) {
        Ok(slow) => {
            let (fast, slow) = (format!("{fast:#?}"), format!("{slow:#?}"));
            if fast == slow {
                Ok(true)
            } else {
                Err(format!(
                    "read differently:\nfast: {fast}\nserde_yaml_ng: {slow}"
                ))
            }
        }
        Err(e) => Err(format!("accepted what serde_yaml_ng refuses: {e}")),
    }
}

/// Deepest nesting followed (serde_yaml_ng's own limit is 128).
const MAX_DEPTH: usize = 64;
/// Longest key followed (YAML caps implicit keys at 1024 characters).
const MAX_KEY: usize = 128;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `a`: the index past the subtree; `b`: the number of children
    /// (a mapping's are key, value, key, value…).
    Map,
    Seq,
    /// `a`, `b`: start and length of the text in the file.
    Plain,
    Quoted,
    /// A quoted scalar with escapes: `a` indexes `Doc::owned`.
    Owned,
}

#[derive(Clone, Copy)]
struct Node {
    kind: Kind,
    a: u32,
    b: u32,
}

struct Doc<'a> {
    text: &'a str,
    nodes: Vec<Node>,
    owned: Vec<String>,
}

/// A line with content (not blank, not only a comment).
#[derive(Clone, Copy)]
struct Line {
    start: usize,
    end: usize,
    indent: usize,
}

struct Reader<'a> {
    text: &'a str,
    b: &'a [u8],
    lines: Vec<Line>,
    li: usize,
    nodes: Vec<Node>,
    owned: Vec<String>,
    depth: usize,
}

/// Whether a character is one this front end leaves to libyaml: line
/// breaks other than `\n`, tabs, control characters, BOMs and non-
/// characters (libyaml refuses some and treats others as breaks).
fn unusual(c: char) -> bool {
    !matches!(c, '\n' | ' '..='~' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}')
}

impl<'a> Doc<'a> {
    fn read(text: &'a str) -> Option<Doc<'a>> {
        if text.len() >= u32::MAX as usize {
            return None;
        }
        let b = text.as_bytes();
        // Only non-ASCII text needs the character check beyond bytes.
        if !text.is_ascii() && text.chars().any(unusual) {
            return None;
        }
        let mut lines = Vec::with_capacity(text.len() / 24);
        let mut start = 0;
        while start < b.len() {
            let end = memchr_nl(b, start);
            let line = &b[start..end];
            if line.iter().any(|&c| c < b' ' || c == 0x7f) {
                return None;
            }
            let indent = line.iter().take_while(|&&c| c == b' ').count();
            let content = &line[indent..];
            if indent == 0
                && (content.starts_with(b"---")
                    || content.starts_with(b"...")
                    || content.starts_with(b"%"))
            {
                return None;
            }
            if !content.is_empty() && content[0] != b'#' {
                lines.push(Line { start, end, indent });
            }
            start = end + 1;
        }
        let mut r = Reader {
            text,
            b,
            lines,
            li: 0,
            nodes: Vec::with_capacity(text.len() / 10),
            owned: Vec::new(),
            depth: 0,
        };
        let first = *r.lines.first()?;
        r.block_node(first.start + first.indent)?;
        if r.li != r.lines.len() {
            return None;
        }
        r.nodes.shrink_to_fit();
        Some(Doc {
            text,
            nodes: r.nodes,
            owned: r.owned,
        })
    }
}

fn memchr_nl(b: &[u8], from: usize) -> usize {
    b[from..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |i| from + i)
}

fn is_key_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'/')
}

/// Characters a plain scalar may not start with (YAML indicators).
fn is_indicator(c: u8) -> bool {
    b"-?:,[]{}#&*!|>'\"%@`".contains(&c)
}

impl<'a> Reader<'a> {
    fn line(&self) -> Option<Line> {
        self.lines.get(self.li).copied()
    }

    fn push(&mut self, kind: Kind, a: usize, b: usize) -> usize {
        self.nodes.push(Node {
            kind,
            a: a as u32,
            b: b as u32,
        });
        self.nodes.len() - 1
    }

    fn close(&mut self, at: usize, count: usize) {
        let end = self.nodes.len() as u32;
        self.nodes[at].a = end;
        self.nodes[at].b = count as u32;
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// A block mapping or sequence whose first line's content starts at
    /// byte `off` of the current line.
    fn block_node(&mut self, off: usize) -> Option<()> {
        let line = self.line()?;
        let col = off - line.start;
        if self.is_dash(off, line.end) {
            self.block_seq(off, col)
        } else if self.key_end(off, line.end).is_some() {
            self.block_map(off, col)
        } else {
            None
        }
    }

    fn is_dash(&self, off: usize, end: usize) -> bool {
        off < end && self.b[off] == b'-' && (off + 1 == end || self.b[off + 1] == b' ')
    }

    /// `key:` at `off`: the key's end (where the colon is).
    fn key_end(&self, off: usize, end: usize) -> Option<usize> {
        let b = self.b;
        // A leading `/`: JSON pointers (`body: json:`) are keys too.
        if off >= end || !(b[off].is_ascii_alphanumeric() || b[off] == b'_' || b[off] == b'/') {
            return None;
        }
        let mut i = off;
        while i < end && is_key_byte(b[i]) {
            i += 1;
        }
        if i - off > MAX_KEY || i >= end || b[i] != b':' || (i + 1 < end && b[i + 1] != b' ') {
            return None;
        }
        Some(i)
    }

    fn skip_spaces(&self, mut i: usize, end: usize) -> usize {
        while i < end && self.b[i] == b' ' {
            i += 1;
        }
        i
    }

    fn block_map(&mut self, mut off: usize, col: usize) -> Option<()> {
        self.enter()?;
        let at = self.push(Kind::Map, 0, 0);
        let mut keys: Vec<&'a str> = Vec::new();
        loop {
            let line = self.line()?;
            let k = self.key_end(off, line.end)?;
            let key = &self.text[off..k];
            if key == "<<" || keys.contains(&key) {
                return None;
            }
            keys.push(key);
            self.push(Kind::Plain, off, k - off);
            let rest = self.skip_spaces(k + 1, line.end);
            if rest == line.end || self.b[rest] == b'#' {
                self.li += 1;
                match self.line() {
                    Some(n) if n.indent > col => self.block_node(n.start + n.indent)?,
                    Some(n) if n.indent == col && self.is_dash(n.start + n.indent, n.end) => {
                        self.block_seq(n.start + n.indent, col)?
                    }
                    _ => {
                        self.push(Kind::Plain, rest, 0);
                    }
                }
            } else if matches!(self.b[rest], b'|' | b'>') {
                self.block_scalar(rest, line.end, col)?;
            } else {
                self.inline(rest, line.end)?;
                self.li += 1;
            }
            match self.line() {
                Some(n) if n.indent == col => off = n.start + n.indent,
                Some(n) if n.indent > col => return None,
                _ => break,
            }
        }
        self.close(at, keys.len() * 2);
        self.depth -= 1;
        Some(())
    }

    fn block_seq(&mut self, mut off: usize, col: usize) -> Option<()> {
        self.enter()?;
        let at = self.push(Kind::Seq, 0, 0);
        let mut count = 0;
        loop {
            let line = self.line()?;
            let item = self.skip_spaces(off + 1, line.end);
            count += 1;
            if item == line.end || self.b[item] == b'#' {
                self.li += 1;
                match self.line() {
                    Some(n) if n.indent > col => self.block_node(n.start + n.indent)?,
                    _ => {
                        self.push(Kind::Plain, item, 0);
                    }
                }
            } else if self.is_dash(item, line.end) || self.key_end(item, line.end).is_some() {
                self.block_node(item)?;
            } else if matches!(self.b[item], b'|' | b'>') {
                self.block_scalar(item, line.end, col)?;
            } else {
                self.inline(item, line.end)?;
                self.li += 1;
            }
            match self.line() {
                Some(n) if n.indent == col && self.is_dash(n.start + n.indent, n.end) => {
                    off = n.start + n.indent
                }
                Some(n) if n.indent > col => return None,
                _ => break,
            }
        }
        self.close(at, count);
        self.depth -= 1;
        Some(())
    }

    /// A literal (`|`, `|-`) or folded (`>`, `>-`) block scalar whose
    /// header is at `off`, inside a collection at column `col`, in its
    /// plainest form: every line at one indentation, no blank line inside,
    /// no trailing space. Moves past its lines.
    fn block_scalar(&mut self, off: usize, end: usize, col: usize) -> Option<()> {
        let b = self.b;
        let folded = b[off] == b'>';
        let strip = off + 1 < end && b[off + 1] == b'-';
        let after = off + 1 + usize::from(strip);
        let rest = self.skip_spaces(after, end);
        if !(rest == end || (rest > after && b[rest] == b'#')) {
            return None;
        }
        let mut out = String::new();
        let mut indent = None;
        let mut start = end + 1;
        let mut stop = start;
        while start < b.len() {
            let e = memchr_nl(b, start);
            let line = &b[start..e];
            let n = line.iter().take_while(|&&c| c == b' ').count();
            if n == line.len() {
                // A blank line: the end of the scalar, unless more of it follows.
                let next = (e + 1..b.len()).find(|&i| b[i] != b' ' && b[i] != b'\n');
                let next_indent = next.map(|i| {
                    i - b[..i]
                        .iter()
                        .rposition(|&c| c == b'\n')
                        .map_or(0, |p| p + 1)
                });
                if indent.is_none() || next_indent.is_some_and(|k| k >= indent.unwrap_or(0)) {
                    return None;
                }
                break;
            }
            match indent {
                None if n > col => indent = Some(n),
                None => return None,
                Some(i) if n < i => break,
                Some(i) if n > i => return None,
                Some(_) => out.push(if folded { ' ' } else { '\n' }),
            }
            if line[line.len() - 1] == b' ' {
                return None;
            }
            out.push_str(&self.text[start + n..e]);
            start = e + 1;
            stop = start;
        }
        indent?;
        if !strip {
            out.push('\n');
        }
        self.owned.push(out);
        self.push(Kind::Owned, self.owned.len() - 1, 0);
        while self.line().is_some_and(|l| l.start < stop) {
            self.li += 1;
        }
        Some(())
    }

    /// A value that ends on its line: a flow collection, a quoted or a
    /// plain scalar, and nothing after it but a comment.
    fn inline(&mut self, off: usize, end: usize) -> Option<()> {
        let after = match self.b[off] {
            b'[' | b'{' => self.flow(off, end)?,
            b'"' | b'\'' => self.quoted(off, end)?,
            c if is_indicator(c) => return None,
            _ => {
                let mut stop = end;
                if let Some(i) = find(&self.b[off..end], b" #") {
                    stop = off + i;
                }
                let s = &self.b[off..stop];
                if find(s, b": ").is_some() {
                    return None;
                }
                let len = s.len() - s.iter().rev().take_while(|&&c| c == b' ').count();
                if self.b[off + len - 1] == b':' {
                    return None;
                }
                self.push(Kind::Plain, off, len);
                return Some(());
            }
        };
        let rest = self.skip_spaces(after, end);
        (rest == end || (rest > after && self.b[rest] == b'#')).then_some(())
    }

    /// A flow collection at `off`; returns the offset past it.
    fn flow(&mut self, off: usize, end: usize) -> Option<usize> {
        self.enter()?;
        let map = self.b[off] == b'{';
        let close = if map { b'}' } else { b']' };
        let at = self.push(if map { Kind::Map } else { Kind::Seq }, 0, 0);
        let mut keys: Vec<&'a str> = Vec::new();
        let mut count = 0;
        let mut i = self.skip_spaces(off + 1, end);
        if i < end && self.b[i] == close {
            i += 1;
        } else {
            loop {
                if map {
                    let k = self.key_end(i, end)?;
                    let key = &self.text[i..k];
                    if key == "<<" || keys.contains(&key) || k + 1 >= end {
                        return None;
                    }
                    keys.push(key);
                    self.push(Kind::Plain, i, k - i);
                    count += 1;
                    i = self.skip_spaces(k + 1, end);
                }
                i = self.flow_item(i, end)?;
                count += 1;
                i = self.skip_spaces(i, end);
                if i >= end {
                    return None;
                }
                match self.b[i] {
                    b',' => {
                        i = self.skip_spaces(i + 1, end);
                        if i >= end || self.b[i] == close {
                            return None;
                        }
                    }
                    c if c == close => {
                        i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.close(at, count);
        self.depth -= 1;
        Some(i)
    }

    fn flow_item(&mut self, i: usize, end: usize) -> Option<usize> {
        if i >= end {
            return None;
        }
        match self.b[i] {
            b'[' | b'{' => self.flow(i, end),
            b'"' | b'\'' => self.quoted(i, end),
            c if is_indicator(c) => None,
            _ => {
                let mut j = i;
                while j < end {
                    match self.b[j] {
                        b',' | b']' | b'}' => break,
                        b'[' | b'{' | b'#' => return None,
                        b':' if j + 1 == end
                            || matches!(
                                self.b[j + 1],
                                b' ' | b',' | b'[' | b']' | b'{' | b'}' | b'?'
                            ) =>
                        {
                            return None
                        }
                        _ => j += 1,
                    }
                }
                let len = self.b[i..j]
                    .iter()
                    .rposition(|&c| c != b' ')
                    .map_or(0, |p| p + 1);
                self.push(Kind::Plain, i, len);
                Some(j)
            }
        }
    }

    /// A quoted scalar that closes on its line; returns the offset past it.
    fn quoted(&mut self, off: usize, end: usize) -> Option<usize> {
        let q = self.b[off];
        let mut i = off + 1;
        let mut out: Option<String> = None;
        let mut run = i;
        loop {
            if i >= end {
                return None;
            }
            let c = self.b[i];
            if c == q {
                if q == b'\'' && i + 1 < end && self.b[i + 1] == b'\'' {
                    let o = out.get_or_insert_with(String::new);
                    o.push_str(&self.text[run..=i]);
                    i += 2;
                    run = i;
                    continue;
                }
                break;
            }
            if q == b'"' && c == b'\\' {
                let esc = match self.b.get(i + 1) {
                    Some(b'\\') => '\\',
                    Some(b'"') => '"',
                    Some(b'/') => '/',
                    Some(b'n') => '\n',
                    Some(b't') => '\t',
                    Some(b'r') => '\r',
                    _ => return None,
                };
                let o = out.get_or_insert_with(String::new);
                o.push_str(&self.text[run..i]);
                o.push(esc);
                i += 2;
                run = i;
                continue;
            }
            i += 1;
        }
        match out {
            None => {
                self.push(Kind::Quoted, off + 1, i - off - 1);
            }
            Some(mut o) => {
                o.push_str(&self.text[run..i]);
                self.owned.push(o);
                self.push(Kind::Owned, self.owned.len() - 1, 0);
            }
        }
        Some(i + 1)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Any visitor error, or a construct left to serde_yaml_ng: the caller
/// parses the file again with serde_yaml_ng, which reports it.
#[derive(Debug)]
pub struct GiveUp;

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("left to serde_yaml_ng")
    }
}
impl std::error::Error for GiveUp {}
impl de::Error for GiveUp {
    fn custom<T: fmt::Display>(_: T) -> GiveUp {
        GiveUp
    }
}

struct De<'d, 'a> {
    doc: &'d Doc<'a>,
    pos: usize,
    depth: usize,
}

type R<T> = Result<T, GiveUp>;

impl<'d, 'a> De<'d, 'a> {
    fn node(&self) -> R<Node> {
        self.doc.nodes.get(self.pos).copied().ok_or(GiveUp)
    }

    /// The scalar at `pos` (consumed): its text and whether it is plain.
    fn scalar(&mut self) -> R<(Cow<'a, str>, bool)> {
        let n = self.node()?;
        let text = self.doc.text;
        let s = match n.kind {
            Kind::Plain | Kind::Quoted => Cow::Borrowed(&text[n.a as usize..(n.a + n.b) as usize]),
            Kind::Owned => Cow::Owned(self.doc.owned[n.a as usize].clone()),
            Kind::Map | Kind::Seq => return Err(GiveUp),
        };
        self.pos += 1;
        Ok((s, n.kind == Kind::Plain))
    }

    /// Whether the node at `pos` is a plain null (`~`, `null`, empty).
    fn is_null(&self) -> R<bool> {
        let n = self.node()?;
        Ok(n.kind == Kind::Plain
            && matches!(
                &self.doc.text[n.a as usize..(n.a + n.b) as usize],
                "" | "~" | "null" | "Null" | "NULL"
            ))
    }

    fn skip(&mut self) -> R<()> {
        let n = self.node()?;
        self.pos = match n.kind {
            Kind::Map | Kind::Seq => n.a as usize,
            _ => self.pos + 1,
        };
        Ok(())
    }

    fn collection<V: Visitor<'a>>(&mut self, v: V, want: Kind) -> R<V::Value> {
        let n = self.node()?;
        if n.kind == Kind::Plain && n.b == 0 {
            // serde_yaml_ng reads an empty value as an empty collection.
            self.pos += 1;
            return if want == Kind::Map {
                v.visit_map(Items { de: self, left: 0 })
            } else {
                v.visit_seq(Items { de: self, left: 0 })
            };
        }
        if n.kind != want {
            return Err(GiveUp);
        }
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(GiveUp);
        }
        self.pos += 1;
        let left = n.b as usize;
        let out = if want == Kind::Map {
            v.visit_map(Items { de: self, left })?
        } else {
            v.visit_seq(Items { de: self, left })?
        };
        self.depth -= 1;
        if self.pos != n.a as usize {
            return Err(GiveUp);
        }
        Ok(out)
    }
}

/// Decimal digits without a leading zero that fit in u64: what
/// serde_yaml_ng reads as an unsigned integer. Anything else that might be
/// a number is left to it.
fn plain_u64(s: &str) -> Option<u64> {
    let ok = !s.is_empty()
        && s.bytes().all(|c| c.is_ascii_digit())
        && (s.len() == 1 || !s.starts_with('0'));
    if ok {
        s.parse().ok()
    } else {
        None
    }
}

/// Whether serde_yaml_ng could read a plain scalar as anything but a
/// string (null, bool, a number of any base, inf, nan).
fn maybe_not_str(s: &str) -> bool {
    let t = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = t.get(..3).map(str::to_ascii_lowercase);
    s.is_empty()
        || matches!(
            s,
            "~" | "null" | "Null" | "NULL" | "true" | "True" | "TRUE" | "false" | "False" | "FALSE"
        )
        || s.starts_with(['+', '-', '.'])
        || t.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        || matches!(lower.as_deref(), Some("inf" | "nan"))
}

impl<'de, 'd> Deserializer<'de> for &mut De<'d, 'de> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        let n = self.node()?;
        match n.kind {
            Kind::Map => self.collection(v, Kind::Map),
            Kind::Seq => self.collection(v, Kind::Seq),
            _ => {
                let (s, plain) = self.scalar()?;
                if !plain {
                    return visit_cow(v, s);
                }
                if let Some(n) = plain_u64(&s) {
                    return v.visit_u64(n);
                }
                // The YAML 1.2 core schema's booleans and nulls, as
                // serde_yaml_ng reads them (`body: json:` values).
                match &*s {
                    "true" | "True" | "TRUE" => return v.visit_bool(true),
                    "false" | "False" | "FALSE" => return v.visit_bool(false),
                    "~" | "null" | "Null" | "NULL" => return v.visit_unit(),
                    _ => {}
                }
                if maybe_not_str(&s) {
                    return Err(GiveUp);
                }
                visit_cow(v, s)
            }
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        let (s, plain) = self.scalar()?;
        match (&*s, plain) {
            ("true" | "True" | "TRUE", true) => v.visit_bool(true),
            ("false" | "False" | "FALSE", true) => v.visit_bool(false),
            _ => Err(GiveUp),
        }
    }

    fn deserialize_i8<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_i64(v)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_i64(v)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_i64(v)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        let (s, plain) = self.scalar()?;
        match plain_u64(&s).and_then(|n| i64::try_from(n).ok()) {
            Some(n) if plain => v.visit_i64(n),
            _ => Err(GiveUp),
        }
    }
    fn deserialize_u8<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_u64(v)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_u64(v)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_u64(v)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        let (s, plain) = self.scalar()?;
        match plain_u64(&s) {
            Some(n) if plain => v.visit_u64(n),
            _ => Err(GiveUp),
        }
    }
    fn deserialize_f32<V: Visitor<'de>>(self, _: V) -> R<V::Value> {
        Err(GiveUp)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, _: V) -> R<V::Value> {
        Err(GiveUp)
    }
    fn deserialize_char<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_str(v)
    }
    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        let (s, _) = self.scalar()?;
        visit_cow(v, s)
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_str(v)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, _: V) -> R<V::Value> {
        Err(GiveUp)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, _: V) -> R<V::Value> {
        Err(GiveUp)
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        if self.is_null()? {
            self.pos += 1;
            v.visit_none()
        } else {
            v.visit_some(self)
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        if self.is_null()? {
            self.pos += 1;
            v.visit_unit()
        } else {
            Err(GiveUp)
        }
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> R<V::Value> {
        self.deserialize_unit(v)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> R<V::Value> {
        v.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.collection(v, Kind::Seq)
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, v: V) -> R<V::Value> {
        self.deserialize_seq(v)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        v: V,
    ) -> R<V::Value> {
        self.deserialize_seq(v)
    }
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.collection(v, Kind::Map)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> R<V::Value> {
        self.deserialize_map(v)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> R<V::Value> {
        // Unit variants by name, as serde_yaml_ng reads an untagged scalar.
        let (s, _) = self.scalar()?;
        if s.is_empty() {
            return Err(GiveUp);
        }
        let d: de::value::StringDeserializer<GiveUp> = s.into_owned().into_deserializer();
        v.visit_enum(d)
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.deserialize_str(v)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> R<V::Value> {
        self.skip()?;
        v.visit_unit()
    }
}

fn visit_cow<'de, V: Visitor<'de>>(v: V, s: Cow<'de, str>) -> R<V::Value> {
    match s {
        Cow::Borrowed(b) => v.visit_borrowed_str(b),
        Cow::Owned(o) => v.visit_string(o),
    }
}

/// The children of a mapping or sequence.
struct Items<'x, 'd, 'a> {
    de: &'x mut De<'d, 'a>,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Items<'_, '_, 'de> {
    type Error = GiveUp;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> R<Option<T::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> de::MapAccess<'de> for Items<'_, '_, 'de> {
    type Error = GiveUp;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> R<Option<K::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }
    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> R<T::Value> {
        if self.left == 0 {
            return Err(GiveUp);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn same(text: &str) {
        assert_eq!(compare_with_serde_yaml(text), Ok(true), "{text}");
    }

    #[track_caller]
    fn gives_up(text: &str) {
        assert!(parse(text).is_none(), "fast parser took:\n{text}");
    }

    #[test]
    fn the_common_forms_read_as_serde_yaml_ng_reads_them() {
        same("exceptions:\n  - id: a\n    owner: o # who\n    reason: 'it''s' \n    hosts: [a.test, \"*.b.test\"]\n    ports: [443, \"8080\"]\n");
        same("exceptions:\n- id: a\n  owner: o\n  reason: r\n  hosts:\n  - a.test\n  -   b.test\n  cidrs: [fd00::/8, 10.0.0.0/8]\n");
        same("# top\nsettings:\n  mode: report\n  contact: \"#sec \\\"now\\\"\"\n  dns:\n    tunnel: {action: log, max_name_len: 100}\n  clients: []\nexceptions:\n");
        same("exceptions:\n  -\n    id: a\n    owner: o\n    reason: see http://x.test/a#b\n    hosts: [a.test]\n    inject:\n      headers:\n        X-Key: \"${env:K}\"\n");
        same("exceptions:\n  - id: a\n    owner:\n    reason: r\n    hosts: [a.test]\n    ports:\n    expires: 2030-01-01\n");
        same("exceptions:\n  - id: a\n    owner: o\n    reason: >-\n      two\n      # lines\n\n    hosts: [a.test]\n  - id: b\n    owner: |\n      x\n      y\n    reason: >\n      z\n    hosts: [b.test]\n");
    }

    #[test]
    fn what_it_does_not_follow_is_left_to_serde_yaml_ng() {
        for text in [
            "exceptions:\n  - id: a\n    reason: |+\n      text\n",
            "exceptions:\n  - id: a\n    reason: >-\n      text\n\n      more\n",
            "exceptions:\n  - id: a\n    reason: >-\n      text\n        more\n",
            "exceptions:\n  - id: &x a\n",
            "exceptions:\n\t- id: a\n",
            "---\nexceptions: []\n",
            "exceptions:\n  - id: a\n    reason: two\n      lines\n",
            "exceptions: [\n  a]\n",
            // Found by the policy_load fuzz target: a flow map left open at
            // the end of the text (no newline) read past the text's end.
            "settings: {}\nqettings: {",
            "settings: {",
            "settings: [",
            "exceptions:\n  - id: a\n    ports: [0443]\n",
            "exceptions:\n  - id: a\n    ports: [1e3]\n",
            "exceptions:\n  - id: a\n    owner: null\n    owner: x\n",
            "settings:\n  mode: !!str report\n",
            "\u{feff}exceptions: []\n",
            "exceptions:\r\n  - id: a\r\n",
        ] {
            gives_up(text);
        }
    }
}
