//! The layering rule of `lib.rs`, enforced: every `crate::…` path in a
//! module's source must name a module its layer may use. An import that
//! points up fails here; it is a design question, not a shortcut.
//!
//! Read as text (the `use` lines and inline `crate::` paths, comments
//! skipped): no parsing of Rust, and no way for the rule to rot unnoticed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module and what of the crate it may use. A module not listed
/// fails the test: a new module gets a place in the layers when it is
/// made. Modules listed in `TOP` may also use each other.
const RULES: &[(&str, &[&str])] = &[
    // The bottom: the clock and the stop signal, used everywhere.
    ("time", &[]),
    ("shutdown", &[]),
    // The pure leaves: no I/O, nothing above them. The policy compiles and
    // holds the package gate's sets; the gate's knowledge uses the policy's
    // leaf files (the host parser, the shared raw fields) and never the
    // policy's compile or decision (the cycle test below holds that).
    ("policy", &["time", "packages"]),
    ("packages", &["time", "policy"]),
    // The registry and the log sink. The sink counts its own write
    // errors, so log may use metrics (never the other way).
    ("metrics", &["policy", "packages", "time"]),
    ("log", &["policy", "packages", "time", "metrics"]),
    // What a write carries (git pushes, bodies), read and judged: pure,
    // on the policy's compiled rules.
    ("writes", &["policy", "time"]),
    // The one log-and-count.
    ("record", &["policy", "packages", "time", "metrics", "log"]),
    // Certificates for interception; below the proxy that uses them.
    ("tls", &["policy", "time"]),
    // The front-ends. The proxy resolves through the DNS resolver; DNS
    // never reaches into the proxy.
    (
        "dns",
        &[
            "policy", "packages", "time", "shutdown", "metrics", "log", "record",
        ],
    ),
    (
        "proxy",
        &[
            "policy", "packages", "time", "shutdown", "metrics", "log", "record", "tls", "dns",
            "writes",
        ],
    ),
    // The tests that read `src/` as text share this file's walker.
    ("fn_length", &["layering"]),
];

/// The top: wiring, reload, the commands and the launcher. They may use
/// everything, and one another; nothing below may use them.
const TOP: &[&str] = &["app", "reload", "cmd", "launcher", "cli", "main", "lib"];

/// The proxy's modules, lowest first: each may use only those before it
/// (and the context in `proxy/mod.rs`). The edges (forward, tunnel, mitm,
/// transparent) sit on the shared steps, never the other way round.
const PROXY: &[&str] = &[
    "chunks",
    "held",
    "rewind",
    "dest",
    "respond",
    "scrub",
    "matched",
    "admit",
    "streams",
    "sni",
    "relay",
    "upload",
    "listeners",
    "upstream",
    "pool",
    "tls_origins",
    "origin",
    "gate",
    "body_rules",
    "writes",
    "exchange",
    "mitm",
    "tunnel",
    "forward",
    "fast",
    "accept",
    "transparent",
];

/// The crate's own `src/`.
pub(crate) fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file below `dir`, sorted: the one walker of the tests that
/// read the source as text (this one and `fn_length.rs`), which report
/// through [`assert_none`].
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// The top-level module a file belongs to (`proxy/relay/pipe.rs` → `proxy`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("file below src");
    let first = rel.components().next().expect("non-empty path");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_string()
}

/// The text of a file without its comments (line comments and doc
/// comments: they may name modules in prose and links).
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let code = match line.find("//") {
            // `"http://…"`: a `//` after an odd number of quotes is in a string.
            Some(i) if line[..i].matches('"').count() % 2 == 0 => &line[..i],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The text after each `root` (`crate::`, `super::`) in `code` that starts
/// a path: not the tail of a longer name (`mycrate::`) nor a later segment
/// of one (`super::super::`).
fn after_each<'a>(code: &'a str, root: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(root) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + root.len()..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            out.push(rest);
        }
    }
    out
}

/// Every top-level module named by a `crate::` (or, in `main.rs`,
/// `egressd::`) path in `code`, grouped imports (`crate::{a, b::c}`)
/// included.
fn uses_of(code: &str, root: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for rest in after_each(code, root) {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let end = group
                .find(|c| match c {
                    '{' => {
                        depth += 1;
                        false
                    }
                    '}' if depth == 0 => true,
                    '}' => {
                        depth -= 1;
                        false
                    }
                    _ => false,
                })
                .unwrap_or(group.len());
            let mut depth = 0;
            let mut item = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        let name = first_ident(item.trim());
                        if !name.is_empty() && name != "self" {
                            found.insert(name.to_string());
                        }
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        } else {
            let name = first_ident(rest);
            if !name.is_empty() {
                found.insert(name.to_string());
            }
        }
    }
    found
}

fn first_ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Every (file, module it uses) that breaks the rule.
fn violations() -> Vec<String> {
    let src = src_dir();
    let files = rust_files(&src);
    let rules: BTreeMap<&str, &[&str]> = RULES.iter().copied().collect();
    let mut bad = Vec::new();
    for file in files {
        let module = module_of(&src, &file);
        if module == "layering" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("source is readable");
        let code = code_of(&text);
        let mut used = uses_of(&code, "crate::");
        if module == "main" {
            used.extend(uses_of(&code, "egressd::"));
        }
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        for dep in used {
            if dep == module {
                continue;
            }
            let known = rules.contains_key(dep.as_str()) || TOP.contains(&dep.as_str());
            let ok = if TOP.contains(&module.as_str()) {
                known
            } else {
                match rules.get(module.as_str()) {
                    Some(allowed) => allowed.contains(&dep.as_str()),
                    None => {
                        bad.push(format!("{rel}: module {module} has no place in the layers"));
                        break;
                    }
                }
            };
            if !ok {
                bad.push(format!("{rel}: {module} uses {dep}"));
            }
        }
    }
    bad
}

/// Every (file, proxy module it uses) that breaks [`PROXY`]'s order.
fn proxy_violations() -> Vec<String> {
    let src = src_dir();
    let proxy = src.join("proxy");
    let files = rust_files(&proxy);
    let rank = |m: &str| PROXY.iter().position(|p| *p == m);
    let mut bad = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&proxy).unwrap();
        let module = module_of(&proxy, &file);
        if module == "mod" {
            continue; // the shared context
        }
        let Some(mine) = rank(&module) else {
            bad.push(format!("proxy/{}: not in the proxy's order", rel.display()));
            continue;
        };
        let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
        let mut used = uses_of(&code, "crate::proxy::");
        // `super::` names a sibling only in a file directly below proxy/
        // (or a folder's mod.rs); deeper, it is the folder's own.
        let depth = rel.components().count();
        if depth == 1 || rel.ends_with("mod.rs") && depth == 2 {
            used.extend(uses_of(&code, "super::"));
        }
        let names: BTreeSet<&str> = PROXY.iter().copied().collect();
        for dep in used.iter().filter(|d| names.contains(d.as_str())) {
            if dep != &module && rank(dep) > Some(mine) {
                bad.push(format!("proxy/{}: {module} uses {dep}", rel.display()));
            }
        }
    }
    bad
}

/// Fails with `what` and every item of `found`, one a line, unless there
/// is none: how the tests that read the source report.
#[track_caller]
pub(crate) fn assert_none(found: &[String], what: &str) {
    assert!(found.is_empty(), "{what}:\n{}", found.join("\n"));
}

#[test]
fn the_proxy_is_a_one_way_graph() {
    assert_none(&proxy_violations(), "proxy imports against the order");
}

#[test]
fn every_import_points_down() {
    assert_none(&violations(), "imports against the layers");
}

#[test]
fn the_reader_finds_every_form_of_path() {
    let code = code_of(
        "use crate::policy::{Decision, Reason};\n\
         use crate::{dns, proxy::{self, dest}};\n\
         let x = crate::time::unix_now(); // crate::launcher in a comment\n\
         let u = \"http://a.test\"; crate::app::run();\n\
         use mycrate::report;\n",
    );
    let got: Vec<String> = uses_of(&code, "crate::").into_iter().collect();
    assert_eq!(got, ["app", "dns", "policy", "proxy", "time"]);
}

#[test]
fn an_upward_import_is_caught() {
    // The rule itself, on a made-up violation: policy may use time only.
    let rules: BTreeMap<&str, &[&str]> = RULES.iter().copied().collect();
    let used = uses_of(&code_of("use crate::record::Event;\n"), "crate::");
    assert!(used.iter().any(|d| !rules["policy"].contains(&d.as_str())));
}

/// The node a file is in: a top-level file (`app`), or a folder's child
/// (`proxy/gate`, `policy/host`, `cmd/check`); a folder's `mod.rs` is
/// `folder/mod`.
fn node_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("file below src");
    let parts: Vec<String> = rel
        .components()
        .take(2)
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    parts.join("/")
}

/// Every `crate::a::b…` path in `code` as the node it names: `a/b` when
/// `a` is a folder with a child `b`, else `a/mod` (an item of the folder's
/// own `mod.rs`) or `a` (a top-level file).
fn node_uses(src: &Path, code: &str, root: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for rest in after_each(code, root) {
        for (first, second) in paths_of(rest) {
            found.insert(node_named(src, &first, second.as_deref()));
        }
    }
    found
}

/// The (first, second) segments of the use tree at the start of `s`:
/// `a::b`, `a::{b, c}`, `{a::b, c}`.
fn paths_of(s: &str) -> Vec<(String, Option<String>)> {
    let items = |s: &str| -> Vec<String> {
        let Some(group) = s.strip_prefix('{') else {
            return vec![s.to_string()];
        };
        let mut depth = 0;
        let mut item = String::new();
        let mut out = Vec::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(std::mem::take(&mut item).trim().to_string());
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        out.push(item.trim().to_string());
        out
    };
    let mut out = Vec::new();
    for item in items(s) {
        let first = first_ident(&item).to_string();
        if first.is_empty() || first == "self" {
            continue;
        }
        let after = item[first.len()..].strip_prefix("::").unwrap_or("");
        if after.is_empty() {
            out.push((first, None));
            continue;
        }
        for sub in items(after) {
            let second = first_ident(&sub).to_string();
            out.push((first.clone(), (!second.is_empty()).then_some(second)));
        }
    }
    out
}

fn node_named(src: &Path, first: &str, second: Option<&str>) -> String {
    let dir = src.join(first);
    if !dir.is_dir() {
        return first.to_string();
    }
    match second {
        Some(s)
            if s != "self" && (dir.join(s).is_dir() || dir.join(format!("{s}.rs")).is_file()) =>
        {
            format!("{first}/{s}")
        }
        _ => format!("{first}/mod"),
    }
}

/// The import graph of `src/` between nodes ([`node_of`]).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = src_dir();
    let files = rust_files(&src);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let node = node_of(&src, &file);
        if node == "layering" || node == "main" || node == "lib" {
            continue; // the root declares every module; main only dispatches
        }
        let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
        let mut used = node_uses(&src, &code, "crate::");
        // `super::x` in a folder's direct child names a sibling.
        let rel = file.strip_prefix(&src).unwrap();
        if rel.components().count() == 2 {
            let folder = node.split('/').next().unwrap().to_string();
            // (`super::super::x` is not a sibling: `after_each` skips the
            // second `super::`, which follows a `:`.)
            for rest in after_each(&code, "super::") {
                for (first, _) in paths_of(rest) {
                    if first != "super" && first != "self" {
                        used.insert(node_named(&src, &folder, Some(&first)));
                    }
                }
            }
        }
        used.remove(&node);
        g.entry(node).or_default().extend(used);
    }
    g
}

/// The cycles of `g`, each as a path that ends where it starts.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
        out: &mut Vec<String>,
    ) {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                0 => visit(m, g, state, stack, out),
                1 => {
                    let at = stack.iter().position(|s| s == m).expect("on the stack");
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    out.push(c.join(" → "));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    let mut out = Vec::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            visit(n, g, &mut state, &mut Vec::new(), &mut out);
        }
    }
    out
}

#[test]
fn there_is_no_cycle_anywhere_in_src() {
    assert_none(&cycles(&graph()), "import cycles");
}

#[test]
fn a_cycle_is_caught() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"][..]),
        ("c", &["a"][..]),
        ("d", &["a"][..]),
    ]
    .into_iter()
    .map(|(n, e)| (n.to_string(), e.iter().map(|s| s.to_string()).collect()))
    .collect();
    assert_eq!(cycles(&g), ["a → b → c → a"]);
    let src = src_dir();
    let used = node_uses(
        &src,
        "use crate::policy::{host::Target, Reason};\nuse crate::{time, proxy::gate::Plan};",
        "crate::",
    );
    let got: Vec<&str> = used.iter().map(String::as_str).collect();
    assert_eq!(got, ["policy/host", "policy/mod", "proxy/gate", "time"]);
}
