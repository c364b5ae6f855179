//! Where in a file an entry is: YAML errors carry their own location, but
//! errors about a whole entry (a duplicate id, a missing owner) are found
//! after parsing, and are located by their `key: value` line.

use std::collections::HashMap;

/// Finds the line of `key: value` (as a YAML mapping entry, quoted or not)
/// for errors that concern a whole entry, e.g. a duplicate id.
pub(super) fn locate(text: &str, key: &str, value: &str) -> (usize, usize) {
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let t2 = t.strip_prefix("- ").map(str::trim_start).unwrap_or(t);
        if let Some(rest) = t2.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
            let v = rest
                .split(" #")
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches(|c| c == '"' || c == '\'');
            if v == value {
                return (n + 1, line.len() - t2.len() + 1);
            }
        }
    }
    (1, 1)
}

/// Every `key: value` mapping entry of a file, in document order: its
/// value and its (line, column).
pub(super) fn locate_all<'t>(text: &'t str, key: &str) -> Vec<(&'t str, (usize, usize))> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let t2 = t.strip_prefix("- ").map(str::trim_start).unwrap_or(t);
        if let Some(rest) = t2.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
            let v = rest
                .split(" #")
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches(|c| c == '"' || c == '\'');
            out.push((v, (n + 1, line.len() - t2.len() + 1)));
        }
    }
    out
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
