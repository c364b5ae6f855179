//! Where in a file an entry is: YAML errors carry their own location, but
//! errors about a whole entry (a duplicate id, a missing owner) are found
//! after parsing, and are located by their `key: value` entry, written in
//! block style (`- id: pypi` on its own line) or in flow style (`- {id:
//! pypi, owner: …}`, any number on a line).

use std::collections::HashMap;

/// Finds the line and column of `key: value` (as a YAML mapping entry,
/// quoted or not, block or flow style) for errors that concern a whole
/// entry, e.g. a duplicate id.
pub(super) fn locate(text: &str, key: &str, value: &str) -> (usize, usize) {
    for (n, line) in text.lines().enumerate() {
        if let Some((col, _)) = entries(line, key).find(|(_, v)| *v == value) {
            return (n + 1, col);
        }
    }
    (1, 1)
}

/// Every `key: value` mapping entry of a file, in document order: its
/// value and its (line, column).
pub(super) fn locate_all<'t>(text: &'t str, key: &str) -> Vec<(&'t str, (usize, usize))> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        out.extend(entries(line, key).map(|(col, v)| (v, (n + 1, col))));
    }
    out
}

/// The `key: value` entries of one line, each as its 1-based column and its
/// value (unquoted, without a comment or the flow punctuation after it).
/// A key is looked for where a mapping key can start: after the
/// indentation and any `- ` markers, and after a `{` or a `,` inside a
/// flow collection; quoted text is skipped.
fn entries<'l, 'k>(
    line: &'l str,
    key: &'k str,
) -> impl Iterator<Item = (usize, &'l str)> + use<'l, 'k> {
    let b = line.as_bytes();
    let mut i = 0;
    let mut depth = 0usize;
    let mut at_start = true;
    std::iter::from_fn(move || {
        while i < b.len() {
            if at_start {
                // Skip blanks and sequence markers to where a key can be.
                while i < b.len()
                    && (b[i] == b' ' || (b[i] == b'-' && b.get(i + 1).is_none_or(|c| *c == b' ')))
                {
                    i += 1;
                }
                at_start = false;
                if let Some(v) = entry_at(line, i, key, depth > 0) {
                    let col = i + 1;
                    i += key.len() + 1;
                    return Some((col, v));
                }
                continue;
            }
            match b[i] {
                b'#' if i == 0 || b[i - 1] == b' ' => i = b.len(),
                q @ (b'"' | b'\'') => {
                    i += 1;
                    while i < b.len() && b[i] != q {
                        i += if b[i] == b'\\' && q == b'"' { 2 } else { 1 };
                    }
                    i += 1;
                }
                b'{' | b'[' => {
                    depth += 1;
                    i += 1;
                    at_start = true;
                }
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    i += 1;
                }
                b',' if depth > 0 => {
                    i += 1;
                    at_start = true;
                }
                _ => i += 1,
            }
        }
        None
    })
}

/// The value of `key:` if it starts at byte `i` of `line`. In a flow
/// collection the value ends at a `,`, `}` or `]`.
fn entry_at<'l>(line: &'l str, i: usize, key: &str, flow: bool) -> Option<&'l str> {
    let rest = line.get(i..)?.strip_prefix(key)?.strip_prefix(':')?;
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    let v = rest.split(" #").next().unwrap_or("");
    let v = if flow {
        v.split([',', '}', ']']).next().unwrap_or("")
    } else {
        v
    };
    Some(v.trim().trim_matches(|c| c == '"' || c == '\''))
}

/// [`locate_all`]'s entries by value, each value's places in document
/// order.
pub(super) fn by_value<'t>(
    entries: &[(&'t str, (usize, usize))],
) -> HashMap<&'t str, Vec<(usize, usize)>> {
    let mut out: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
    for (v, at) in entries {
        out.entry(*v).or_default().push(*at);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_and_flow_entries() {
        let text = "exceptions:\n  - id: a # c\n    owner: o\n  - {id: b, owner: o}\n  - {owner: o, id: \"c\"}\n  - {reason: 'x, id: d', id: e}\n";
        let got: Vec<_> = locate_all(text, "id");
        assert_eq!(
            got,
            vec![("a", (2, 5)), ("b", (4, 6)), ("c", (5, 16)), ("e", (6, 26))]
        );
        assert_eq!(locate(text, "id", "c"), (5, 16));
        assert_eq!(locate(text, "exceptions", ""), (1, 1));
        assert_eq!(locate(text, "owner", "o"), (3, 5));
    }
}
