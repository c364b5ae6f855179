//! Short functions, enforced: no function in `src/` is longer than
//! [`MAX_LINES`] lines, from its `fn` line to its closing brace. A longer
//! one fails here, named by file, line and length; it is a function to
//! split into named steps, not a limit to raise.
//!
//! Read as text, in the spirit of `layering.rs` (whose walker it
//! shares): comments, strings and character literals are blanked, then
//! braces counted. Test code is not measured: an item under `#[cfg(test)]`
//! or `#[test]`, and a file that its parent declares as a
//! `#[cfg(test)] mod`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::layering::{assert_none, rust_files, src_dir};

/// The longest a function in `src/` may be.
const MAX_LINES: usize = 80;

/// One function as measured: where it starts (1-based) and how many lines
/// it spans.
#[derive(Debug, PartialEq)]
struct Measured {
    name: String,
    line: usize,
    lines: usize,
}

/// The span of a literal or comment starting at `i` (its length in
/// bytes), or `None` when `i` starts plain code.
fn literal_len(b: &[u8], i: usize) -> Option<usize> {
    let rest = &b[i..];
    let after_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    if rest.starts_with(b"//") {
        return Some(rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len()));
    }
    if rest.starts_with(b"/*") {
        let mut depth = 0;
        let mut j = 0;
        while j < rest.len() {
            if rest[j..].starts_with(b"/*") {
                depth += 1;
                j += 2;
            } else if rest[j..].starts_with(b"*/") {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    break;
                }
            } else {
                j += 1;
            }
        }
        return Some(j);
    }
    if !after_ident {
        // Raw strings: r"…", r#"…"#, br"…", cr"…".
        let start = usize::from(rest.starts_with(b"br") || rest.starts_with(b"cr"));
        if rest.get(start) == Some(&b'r') {
            let hashes = rest[start + 1..].iter().take_while(|&&c| c == b'#').count();
            let open = start + 1 + hashes;
            if rest.get(open) == Some(&b'"') {
                let mut close = vec![b'"'];
                close.extend(std::iter::repeat_n(b'#', hashes));
                let end = rest[open + 1..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(rest.len(), |p| open + 1 + p + close.len());
                return Some(end);
            }
        }
    }
    // A string ("…", and the `"` of b"…" and c"…").
    if rest[0] == b'"' {
        let mut j = 1;
        while j < rest.len() && rest[j] != b'"' {
            j += if rest[j] == b'\\' { 2 } else { 1 };
        }
        return Some((j + 1).min(rest.len()));
    }
    if rest[0] == b'\'' {
        // A character literal ('x', '\n', '\u{1F600}'), not a lifetime.
        if rest.get(1) == Some(&b'\\') {
            return rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3);
        }
        let ch = std::str::from_utf8(&rest[1..rest.len().min(6)])
            .ok()
            .or_else(|| std::str::from_utf8(&rest[1..rest.len().min(5)]).ok())
            .and_then(|s| s.chars().next());
        if let Some(c) = ch {
            let n = c.len_utf8();
            if rest.get(1 + n) == Some(&b'\'') {
                return Some(n + 2);
            }
        }
    }
    None
}

/// `text` with its comments, strings and character literals blanked
/// (newlines kept, so lines keep their numbers).
fn blank(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match literal_len(b, i) {
            Some(n) => {
                let n = n.max(1).min(b.len() - i);
                out.extend(
                    b[i..i + n]
                        .iter()
                        .map(|&c| if c == b'\n' { c } else { b' ' }),
                );
                i += n;
            }
            None => {
                out.push(if b[i].is_ascii() { b[i] } else { b' ' });
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .expect("ascii")
        .lines()
        .map(str::to_string)
        .collect()
}

/// The name of the function a line starts, if it starts one.
fn fn_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let qualifier = w.starts_with("pub")
            || matches!(w, "const" | "async" | "unsafe" | "extern" | "default")
            || w.starts_with('"');
        if w == "fn" {
            let name = words.next()?;
            let end = name
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            return (end > 0).then(|| &name[..end]);
        }
        if !qualifier {
            return None;
        }
    }
    None
}

/// The line on which the item starting at `from` ends: its matching
/// closing brace, or the `;` of a body-less item (`None`: no body).
fn item_end(lines: &[String], from: usize) -> Option<(usize, bool)> {
    let mut depth = 0usize;
    let mut opened = false;
    for (j, line) in lines.iter().enumerate().skip(from) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => {
                    depth = depth.saturating_sub(1);
                    if opened && depth == 0 {
                        return Some((j, true));
                    }
                }
                ';' if !opened => return Some((j, false)),
                _ => {}
            }
        }
    }
    None
}

/// The line ranges of test code in a file: items under `#[cfg(test)]` or
/// `#[test]`.
fn test_ranges(lines: &[String]) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    for (k, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") || t.starts_with("#[test]") {
            if let Some((end, _)) = item_end(lines, k + 1) {
                ranges.push((k, end));
            }
        }
    }
    ranges
}

/// Every function of `text` outside test code.
fn measure(text: &str) -> Vec<Measured> {
    let lines = blank(text);
    let tests = test_ranges(&lines);
    let mut found = Vec::new();
    for (k, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        if tests.iter().any(|&(a, b)| (a..=b).contains(&k)) {
            continue;
        }
        if let Some((end, true)) = item_end(&lines, k) {
            found.push(Measured {
                name: name.to_string(),
                line: k + 1,
                lines: end - k + 1,
            });
        }
    }
    found
}

/// Files declared `#[cfg(test)] mod name;` by their parent: test code.
fn test_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("readable source");
        let dir = file.parent().expect("a parent");
        let stem = file.file_stem().expect("a name").to_string_lossy();
        let base = if ["mod", "lib", "main"].contains(&stem.as_ref()) {
            dir.to_path_buf()
        } else {
            dir.join(stem.as_ref())
        };
        let mut words = text.split_whitespace();
        while let Some(w) = words.next() {
            if w != "#[cfg(test)]" {
                continue;
            }
            let mut next = words.next();
            if next.is_some_and(|n| n.starts_with("pub")) {
                next = words.next();
            }
            if next == Some("mod") {
                if let Some(name) = words.next().and_then(|n| n.strip_suffix(';')) {
                    out.insert(base.join(format!("{name}.rs")));
                    out.insert(base.join(name));
                }
            }
        }
    }
    out
}

/// Every function in `src/` over [`MAX_LINES`], longest first, as
/// `file:line name (N lines)`.
fn too_long() -> Vec<String> {
    let src = src_dir();
    let files = rust_files(&src);
    let tests = test_files(&files);
    let mut over = Vec::new();
    for file in &files {
        if tests.iter().any(|t| file.starts_with(t)) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        let rel = file.strip_prefix(&src).expect("below src").display();
        for m in measure(&text).into_iter().filter(|m| m.lines > MAX_LINES) {
            over.push((
                m.lines,
                format!("src/{rel}:{} {} ({} lines)", m.line, m.name, m.lines),
            ));
        }
    }
    over.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    over.into_iter().map(|(_, s)| s).collect()
}

#[test]
fn no_function_in_src_is_over_80_lines() {
    assert_none(
        &too_long(),
        &format!("functions over {MAX_LINES} lines (split them into named steps)"),
    );
}

#[test]
fn the_reader_measures_what_it_should() {
    let body: String = (0..90)
        .map(|i| format!("    let x{i} = \"}}\";\n"))
        .collect();
    let text = format!(
        "/// fn not_me() {{\npub(crate) async fn long(a: u8) -> u8 {{\n{body}    a\n}}\n\
         fn short() {{ let c = '{{'; let s = r#\"}}\"#; let z = c\"}}\"; }}\n\
         fn declared();\n\
         #[cfg(test)]\nmod tests {{\n    fn in_tests() {{\n{body}    }}\n}}\n\
         impl X {{\n    pub fn method<'a>(&'a self) {{\n        x\n    }}\n}}\n"
    );
    let found = measure(&text);
    let names: Vec<_> = found.iter().map(|m| (m.name.as_str(), m.lines)).collect();
    assert_eq!(names, [("long", 93), ("short", 1), ("method", 3)]);
    assert_eq!(found[0].line, 2);
}
