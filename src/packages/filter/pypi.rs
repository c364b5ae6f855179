//! PyPI's three index documents: the simple API as JSON (PEP 691, with PEP
//! 700's `versions` list) and as HTML (PEP 503 anchors), and the project
//! JSON (`/pypi/<p>/json`). Files are judged one by one, each with its own
//! `upload-time` (a wheel added to an old release later is as new as its
//! upload) and its sha256 against pins; a version is listed while one of
//! its files is. The HTML form carries no times: it takes the JSON form's
//! view and is filtered exactly as that form would be.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::json::{self, quote};
use super::{done, text, unfilterable, FilterError, Filtered, Hidden};
use crate::packages::classify::pypi_filename;
use crate::packages::decide::{NameRules, PackageReason};
use crate::packages::name::normalize;
use crate::packages::raw::parse_sha256_hex;
use crate::packages::stamp::parse_rfc3339;
use crate::packages::view::{listed_at, FileFacts, IndexView};
use crate::packages::Ecosystem;

fn bad(e: String) -> FilterError {
    FilterError::Unfilterable(e)
}

/// Why a file is not listed, if it is not.
fn judge(rules: &NameRules<'_>, version: &str, f: &FileFacts) -> Option<PackageReason> {
    match rules.version(version, f.published) {
        Err(h) => Some(h.reason),
        Ok(ok) if !ok.file_allowed(f.sha256.as_ref()) => Some(PackageReason::IntegrityMismatch),
        Ok(_) => None,
    }
}

/// The version a file of this project is of, if its name says so.
fn file_version(rules: &NameRules<'_>, filename: &str) -> Option<String> {
    let (n, v) = pypi_filename(filename)?;
    (normalize(Ecosystem::Pypi, &n).ok()? == rules.name).then_some(v)
}

/// Where a simple index (read at `pypi.org/simple/<p>/`, the URL the
/// client resolves its references against) lists a file.
fn simple_at(rules: &NameRules<'_>, reference: &str) -> Option<String> {
    listed_at("pypi.org", &format!("/simple/{}/", rules.name), reference)
}

/// Counts each version once, with the first reason that hid part of it.
#[derive(Default)]
struct VersionTally(BTreeMap<String, PackageReason>);

impl VersionTally {
    fn hide(&mut self, version: &str, r: PackageReason) {
        self.0
            .entry(IndexView::key(Ecosystem::Pypi, version))
            .or_insert(r);
    }
    fn hidden(&self) -> Hidden {
        let mut h = Hidden::default();
        for r in self.0.values() {
            h.add(*r);
        }
        h
    }
}

#[derive(Deserialize)]
struct SimpleFile {
    filename: String,
    url: Option<String>,
    #[serde(default)]
    hashes: HashMap<String, String>,
    #[serde(rename = "upload-time")]
    upload_time: Option<String>,
}

fn sha(h: Option<&String>) -> Option<[u8; 32]> {
    h.and_then(|s| parse_sha256_hex(s).ok())
}

/// `/simple/<p>/` as `application/vnd.pypi.simple.v1+json`.
pub fn simple_json(rules: &NameRules<'_>, body: &[u8]) -> Result<Filtered, FilterError> {
    let doc = text(body)?;
    let top = json::object(doc, json::top(doc).map_err(bad)?).map_err(bad)?;
    check_name(
        rules,
        top.get("name")
            .and_then(|m| json::as_str(m.value))
            .as_deref(),
    )?;
    let Some(files_m) = top.get("files") else {
        return unfilterable("simple JSON without files");
    };
    let files = json::array(doc, files_m.value).map_err(bad)?;
    let mut view = IndexView::new(Ecosystem::Pypi, rules.name.clone());
    let mut parsed = Vec::with_capacity(files.elems.len());
    for (raw, _, _) in &files.elems {
        let f: SimpleFile =
            serde_json::from_str(raw.get()).map_err(|e| bad(format!("file entry: {e}")))?;
        let facts = FileFacts {
            published: f.upload_time.as_deref().and_then(parse_rfc3339),
            sha256: sha(f.hashes.get("sha256")),
            at: f.url.as_deref().and_then(|u| simple_at(rules, u)),
            filename: f.filename,
        };
        let version = file_version(rules, &facts.filename);
        if let Some(v) = &version {
            view.add_file(v, facts.clone());
        }
        parsed.push((version, facts));
    }
    let mut tally = VersionTally::default();
    let mut kept_files = Vec::new();
    let mut listed: HashMap<String, bool> = HashMap::new();
    for (i, (version, facts)) in parsed.iter().enumerate() {
        let Some(v) = version else {
            tally.hide(&facts.filename, PackageReason::VersionNotApproved);
            continue;
        };
        let key = IndexView::key(Ecosystem::Pypi, v);
        match judge(rules, v, facts) {
            Some(r) => {
                tally.hide(v, r);
                listed.entry(key).or_insert(false);
            }
            None => {
                kept_files.push(i);
                listed.insert(key, true);
            }
        }
    }
    let mut edits = Vec::new();
    if kept_files.len() != files.elems.len() {
        let items: Vec<(usize, usize)> = files.elems.iter().map(|e| (e.1, e.2)).collect();
        let pieces = kept_files
            .iter()
            .map(|&i| doc[items[i].0..items[i].1].to_string());
        edits.push((
            files.start,
            files.end,
            json::rebuild_list(
                doc,
                files.start + 1,
                files.end - 1,
                &items,
                pieces,
                "[",
                "]",
            ),
        ));
    }
    if let Some(vm) = top.get("versions") {
        versions_edit(rules, doc, vm, &listed, &mut view, &mut tally, &mut edits)?;
    }
    let out = (!edits.is_empty()).then(|| json::splice(doc, edits));
    Ok(done(body, out, tally.hidden(), view))
}

/// The simple JSON's `versions` list without the versions none of whose
/// files is kept (a version without files judged on its own).
fn versions_edit(
    rules: &NameRules<'_>,
    doc: &str,
    vm: &json::Member<'_>,
    listed: &HashMap<String, bool>,
    view: &mut IndexView,
    tally: &mut VersionTally,
    edits: &mut Vec<(usize, usize, String)>,
) -> Result<(), FilterError> {
    let arr = json::array(doc, vm.value).map_err(bad)?;
    let mut keep = Vec::new();
    for (i, (raw, _, _)) in arr.elems.iter().enumerate() {
        let Some(v) = json::as_str(raw) else {
            return unfilterable("versions entry is not a string");
        };
        view.add_version(&v, None);
        let key = IndexView::key(Ecosystem::Pypi, &v);
        let ok = match listed.get(&key) {
            Some(any_kept) => *any_kept,
            // A version without files: judged on its own (no time).
            None => match rules.version(&v, None) {
                Ok(_) => true,
                Err(h) => {
                    tally.hide(&v, h.reason);
                    false
                }
            },
        };
        if ok {
            keep.push(i);
        }
    }
    if keep.len() != arr.elems.len() {
        let items: Vec<(usize, usize)> = arr.elems.iter().map(|e| (e.1, e.2)).collect();
        let pieces = keep
            .iter()
            .map(|&i| doc[items[i].0..items[i].1].to_string());
        edits.push((
            arr.start,
            arr.end,
            json::rebuild_list(doc, arr.start + 1, arr.end - 1, &items, pieces, "[", "]"),
        ));
    }
    Ok(())
}

fn check_name(rules: &NameRules<'_>, name: Option<&str>) -> Result<(), FilterError> {
    match name.map(|n| normalize(Ecosystem::Pypi, n)) {
        Some(Ok(n)) if n == rules.name => Ok(()),
        Some(_) => unfilterable(format!("index of {name:?}, not of {}", rules.name)),
        None => unfilterable("index without a project name"),
    }
}

/// One `<a …>…</a>` of a PEP 503 page.
struct Anchor {
    /// The span to remove when the file is hidden (the anchor, a `<br>`
    /// after it, and its line when nothing else is on it).
    cut: (usize, usize),
    href: String,
}

fn lower_starts(b: &[u8], at: usize, pat: &str) -> bool {
    b.get(at..at + pat.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(pat.as_bytes()))
}

fn find_ci(b: &[u8], from: usize, pat: &str) -> Option<usize> {
    (from..b.len().saturating_sub(pat.len() - 1)).find(|&i| lower_starts(b, i, pat))
}

/// What goes with the anchor from `lt` to the `</a` closed at
/// `close_end`: a `<br>` right after it, and the whole line when the
/// anchor is all there is on it.
fn anchor_cut(b: &[u8], lt: usize, close_end: usize) -> (usize, usize) {
    let ws = |c: u8| c == b' ' || c == b'\t' || c == b'\r';
    let mut end = close_end + 1;
    // `<br>`, `<br/>`, `<br />` right after the anchor goes with it.
    let mut j = end;
    while b.get(j).is_some_and(|c| ws(*c)) {
        j += 1;
    }
    if lower_starts(b, j, "<br") {
        if let Some(e) = tag_end(b, j) {
            end = e + 1;
        }
    }
    // The whole line goes when the anchor is all there is on it. Only
    // blanks are scanned, so a page on one long line stays linear.
    let mut ls = lt;
    while ls > 0 && ws(b[ls - 1]) {
        ls -= 1;
    }
    let mut le = end;
    while le < b.len() && ws(b[le]) {
        le += 1;
    }
    let alone_before = ls == 0 || b[ls - 1] == b'\n';
    if alone_before && le < b.len() && b[le] == b'\n' {
        (ls, le + 1)
    } else if alone_before && le == b.len() {
        (ls, le)
    } else {
        (lt, end)
    }
}

/// The anchors of an HTML page, read as an HTML parser would: tags are
/// case-insensitive, attributes quoted or not, comments skipped, a `<` not
/// followed by a letter, `/`, `!` or `?` is text. A tag or comment that
/// never closes is unfilterable, and so is a page where some `<a` did not
/// become an anchor (markup the scanner and a client's parser could read
/// differently): a client must never see an anchor the gate did not.
fn anchors(doc: &str) -> Result<Vec<Anchor>, FilterError> {
    let b = doc.as_bytes();
    let mut out = Vec::new();
    let mut a_tags = 0;
    let mut i = 0;
    while let Some(lt) = memchr(b'<', b, i) {
        if lower_starts(b, lt, "<!--") {
            let Some(end) = find_ci(b, lt + 4, "-->") else {
                return unfilterable("unterminated comment");
            };
            i = end + 3;
            continue;
        }
        if !b
            .get(lt + 1)
            .is_some_and(|c| c.is_ascii_alphabetic() || b"/!?".contains(c))
        {
            i = lt + 1;
            continue;
        }
        let is_a = lower_starts(b, lt, "<a")
            && b.get(lt + 2)
                .is_some_and(|c| c.is_ascii_whitespace() || *c == b'>' || *c == b'/');
        let Some(gt) = tag_end(b, lt) else {
            return unfilterable("unterminated tag");
        };
        if !is_a {
            i = gt + 1;
            continue;
        }
        let href = attr(&doc[lt + 2..gt], "href").unwrap_or_default();
        let Some(close) = find_ci(b, gt + 1, "</a") else {
            return unfilterable("anchor without </a>");
        };
        let Some(close_end) = tag_end(b, close) else {
            return unfilterable("unterminated </a>");
        };
        let cut = anchor_cut(b, lt, close_end);
        out.push(Anchor { cut, href });
        i = close_end + 1;
    }
    // The cross-check: every `<a` outside comments, counted naively.
    let mut k = 0;
    while let Some(lt) = memchr(b'<', b, k) {
        if lower_starts(b, lt, "<!--") {
            k = find_ci(b, lt + 4, "-->").map_or(b.len(), |e| e + 3);
            continue;
        }
        if lower_starts(b, lt, "<a")
            && b.get(lt + 2)
                .is_some_and(|c| c.is_ascii_whitespace() || *c == b'>' || *c == b'/')
        {
            a_tags += 1;
        }
        k = lt + 1;
    }
    if a_tags != out.len() {
        return unfilterable("markup hides anchors from a simple reading");
    }
    Ok(out)
}

fn memchr(c: u8, b: &[u8], from: usize) -> Option<usize> {
    b.get(from..)?
        .iter()
        .position(|x| *x == c)
        .map(|p| from + p)
}

/// The `>` that closes the tag opening at `lt`, outside quoted values.
fn tag_end(b: &[u8], lt: usize) -> Option<usize> {
    let mut q: Option<u8> = None;
    for (i, &c) in b.iter().enumerate().skip(lt + 1) {
        match (q, c) {
            (Some(x), c) if c == x => q = None,
            (Some(_), _) => {}
            (None, b'"' | b'\'') => q = Some(c),
            (None, b'>') => return Some(i),
            _ => {}
        }
    }
    None
}

/// An attribute's value in a tag's attribute text, entities decoded.
fn attr(attrs: &str, name: &str) -> Option<String> {
    let b = attrs.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b'/') {
            i += 1;
        }
        let ns = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'=' && b[i] != b'>' {
            i += 1;
        }
        let n = &attrs[ns..i];
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if b.get(i) == Some(&b'=') {
            i += 1;
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            match b.get(i) {
                Some(&q @ (b'"' | b'\'')) => {
                    let s = i + 1;
                    let e = attrs[s..].find(q as char).map_or(b.len(), |p| s + p);
                    value = attrs[s..e].to_string();
                    i = e + 1;
                }
                _ => {
                    let s = i;
                    while i < b.len() && !b[i].is_ascii_whitespace() {
                        i += 1;
                    }
                    value = attrs[s..i].to_string();
                }
            }
        }
        if n.eq_ignore_ascii_case(name) {
            return Some(unescape_html(&value));
        }
        if ns == i {
            i += 1;
        }
    }
    None
}

fn unescape_html(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let semi = rest.find(';').filter(|&p| p <= 10);
        let ent = semi.map(|p| &rest[1..p]);
        let ch = match ent {
            Some("amp") => Some('&'),
            Some("lt") => Some('<'),
            Some("gt") => Some('>'),
            Some("quot") => Some('"'),
            Some("apos") | Some("#39") => Some('\''),
            Some(e) if e.starts_with("#x") || e.starts_with("#X") => {
                u32::from_str_radix(&e[2..], 16)
                    .ok()
                    .and_then(char::from_u32)
            }
            Some(e) if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match (ch, semi) {
            (Some(c), Some(p)) => {
                out.push(c);
                rest = &rest[p + 1..];
            }
            _ => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The file name and `#sha256=` of an anchor's href.
fn href_file(href: &str) -> (Option<String>, Option<[u8; 32]>) {
    let (url, frag) = href.split_once('#').unwrap_or((href, ""));
    let url = url.split('?').next().unwrap_or(url);
    let last = url.rsplit('/').next().unwrap_or("");
    let name = percent_decode(last).filter(|n| !n.is_empty());
    let sha = frag
        .strip_prefix("sha256=")
        .and_then(|h| parse_sha256_hex(h).ok());
    (name, sha)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `/simple/<p>/` as HTML (PEP 503), with the JSON form's view for times.
pub fn simple_html(
    rules: &NameRules<'_>,
    body: &[u8],
    times: Option<&IndexView>,
) -> Result<Filtered, FilterError> {
    let doc = text(body)?;
    if !doc.trim_start().starts_with('<') {
        return unfilterable("not an HTML document");
    }
    let anchors = anchors(doc)?;
    let mut view = IndexView::new(Ecosystem::Pypi, rules.name.clone());
    let mut tally = VersionTally::default();
    let mut edits = Vec::new();
    for a in &anchors {
        let (name, sha) = href_file(&a.href);
        let Some(filename) = name else {
            edits.push((a.cut.0, a.cut.1, String::new()));
            tally.hide(&a.href, PackageReason::VersionNotApproved);
            continue;
        };
        let timed = times.and_then(|t| t.file(&filename)).map(|(_, f)| f);
        let facts = FileFacts {
            published: timed.and_then(|f| f.published),
            sha256: sha.or(timed.and_then(|f| f.sha256)),
            at: simple_at(rules, &a.href),
            filename,
        };
        let Some(v) = file_version(rules, &facts.filename) else {
            edits.push((a.cut.0, a.cut.1, String::new()));
            tally.hide(&facts.filename, PackageReason::VersionNotApproved);
            continue;
        };
        view.add_file(&v, facts.clone());
        if let Some(r) = judge(rules, &v, &facts) {
            tally.hide(&v, r);
            edits.push((a.cut.0, a.cut.1, String::new()));
        }
    }
    let out = (!edits.is_empty()).then(|| json::splice(doc, edits));
    Ok(done(body, out, tally.hidden(), view))
}

#[derive(Deserialize)]
struct ProjectFile {
    filename: String,
    url: Option<String>,
    #[serde(default)]
    digests: HashMap<String, String>,
    upload_time_iso_8601: Option<String>,
    upload_time: Option<String>,
    #[serde(default)]
    yanked: bool,
}

/// `/pypi/<p>/json`: `releases` filtered, `urls` and `info.version` those
/// of the newest allowed version (releases before pre-releases, unyanked
/// before yanked; `urls: []` and `version: null` when none is allowed).
pub fn project_json(rules: &NameRules<'_>, body: &[u8]) -> Result<Filtered, FilterError> {
    let doc = text(body)?;
    let top = json::object(doc, json::top(doc).map_err(bad)?).map_err(bad)?;
    let Some(info_m) = top.get("info") else {
        return unfilterable("project JSON without info");
    };
    let info = json::object(doc, info_m.value).map_err(bad)?;
    check_name(
        rules,
        info.get("name")
            .and_then(|m| json::as_str(m.value))
            .as_deref(),
    )?;
    let Some(rel_m) = top.get("releases") else {
        return unfilterable("project JSON without releases");
    };
    let releases = json::object(doc, rel_m.value).map_err(bad)?;
    let mut view = IndexView::new(Ecosystem::Pypi, rules.name.clone());
    let mut tally = VersionTally::default();
    let kept = releases_kept(rules, doc, &releases, &mut view, &mut tally)?;
    let newest = kept
        .allowed
        .iter()
        .filter_map(|(v, files, yanked)| {
            let p = v.parse::<pep440_rs::Version>().ok()?;
            Some(((!*yanked, !p.any_prerelease(), p), v, files))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, v, files)| (v.clone(), files.clone()));
    let mut edits = Vec::new();
    if kept.changed {
        let items: Vec<(usize, usize)> = releases
            .members
            .iter()
            .map(|m| (m.key_start, m.val_end))
            .collect();
        edits.push((
            releases.start,
            releases.end,
            json::rebuild_list(
                doc,
                releases.start + 1,
                releases.end - 1,
                &items,
                kept.pieces,
                "{",
                "}",
            ),
        ));
    }
    newest_edits(&top, &info, newest, &view, &mut edits);
    let out = (!edits.is_empty()).then(|| json::splice(doc, edits));
    Ok(done(body, out, tally.hidden(), view))
}

/// What of a project's `releases` is kept.
struct Kept {
    /// Each release as it is to be written (`"v": [files…]`).
    pieces: Vec<String>,
    /// Whether any release lost a file or went.
    changed: bool,
    /// (version, kept file texts, all kept files yanked)
    allowed: Vec<(String, Vec<String>, bool)>,
}

/// Each release judged, file by file.
fn releases_kept(
    rules: &NameRules<'_>,
    doc: &str,
    releases: &json::Object<'_>,
    view: &mut IndexView,
    tally: &mut VersionTally,
) -> Result<Kept, FilterError> {
    let mut k = Kept {
        pieces: Vec::new(),
        changed: false,
        allowed: Vec::new(),
    };
    for m in &releases.members {
        let v = m.key.to_string();
        view.add_version(&v, None);
        let files = json::array(doc, m.value).map_err(bad)?;
        let (kept, yanked_all) = release_files(rules, &v, &files, view, tally)?;
        let kept_texts: Vec<String> = kept.iter().map(|&(s, e)| doc[s..e].to_string()).collect();
        if files.elems.is_empty() {
            match rules.version(&v, None) {
                Ok(_) => k.pieces.push(doc[m.key_start..m.val_end].to_string()),
                Err(h) => {
                    tally.hide(&v, h.reason);
                    k.changed = true;
                }
            }
            continue;
        }
        if kept.len() == files.elems.len() {
            k.pieces.push(doc[m.key_start..m.val_end].to_string());
        } else {
            k.changed = true;
            if kept.is_empty() {
                continue;
            }
            let items: Vec<(usize, usize)> = files.elems.iter().map(|e| (e.1, e.2)).collect();
            let arr = json::rebuild_list(
                doc,
                files.start + 1,
                files.end - 1,
                &items,
                kept_texts.clone(),
                "[",
                "]",
            );
            k.pieces
                .push(format!("{}{arr}", &doc[m.key_start..m.val_start]));
        }
        k.allowed.push((v, kept_texts, yanked_all));
    }
    Ok(k)
}

/// A release's files judged: the spans of those kept, and whether every
/// kept one is yanked.
fn release_files(
    rules: &NameRules<'_>,
    v: &str,
    files: &json::Array<'_>,
    view: &mut IndexView,
    tally: &mut VersionTally,
) -> Result<(Vec<(usize, usize)>, bool), FilterError> {
    let mut kept = Vec::new();
    let mut yanked_all = true;
    for (raw, s, e) in &files.elems {
        let f: ProjectFile =
            serde_json::from_str(raw.get()).map_err(|e| bad(format!("release file: {e}")))?;
        let published = f
            .upload_time_iso_8601
            .as_deref()
            .and_then(parse_rfc3339)
            .or_else(|| {
                f.upload_time
                    .as_deref()
                    .and_then(|t| parse_rfc3339(&format!("{t}Z")))
            });
        let facts = FileFacts {
            filename: f.filename,
            published,
            sha256: sha(f.digests.get("sha256")),
            at: f
                .url
                .as_deref()
                .and_then(|u| listed_at("pypi.org", &format!("/pypi/{}/json", rules.name), u)),
        };
        view.add_file(v, facts.clone());
        match judge(rules, v, &facts) {
            Some(r) => tally.hide(v, r),
            None => {
                yanked_all &= f.yanked;
                kept.push((*s, *e));
            }
        }
    }
    Ok((kept, yanked_all))
}

/// `info.version` and `urls` rewritten to the newest allowed version's,
/// unless they are that already.
fn newest_edits(
    top: &json::Object<'_>,
    info: &json::Object<'_>,
    newest: Option<(String, Vec<String>)>,
    view: &IndexView,
    edits: &mut Vec<(usize, usize, String)>,
) {
    let current = info
        .get("version")
        .and_then(|m| json::as_str(m.value))
        .map(|s| s.to_string());
    let new_version = newest.as_ref().map(|(v, _)| v.clone());
    let same_version = match (&current, &new_version) {
        (Some(c), Some(n)) => {
            IndexView::key(Ecosystem::Pypi, c) == IndexView::key(Ecosystem::Pypi, n)
        }
        _ => false,
    };
    if !same_version {
        if let Some(vm) = info.get("version") {
            let val = new_version.as_deref().map_or("null".to_string(), quote);
            edits.push((vm.val_start, vm.val_end, val));
        }
    }
    if let Some(um) = top.get("urls") {
        let newest_untouched = same_version
            && newest.as_ref().is_some_and(|(v, files)| {
                view.version(v)
                    .is_some_and(|f| f.files.len() == files.len())
            });
        if !newest_untouched {
            let files = newest.map(|(_, f)| f).unwrap_or_default();
            edits.push((um.val_start, um.val_end, format!("[{}]", files.join(","))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::classify::IndexForm;
    use crate::packages::compile::tests::compile_yaml;
    use crate::packages::compile::PackagePolicy;
    use crate::packages::filter::filter;
    use crate::packages::stamp::format_rfc3339;
    use crate::packages::testutil::Rng;
    use serde_json::Value;

    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 86400;

    fn policy(extra: &str) -> PackagePolicy {
        compile_yaml(
            &format!(
                "packages:\n  - id: py\n    owner: o\n    reason: r\n    ecosystem: pypi\n    min_age: 3d\n    allow:\n      - requests >=2.31,<3\n{extra}"
            ),
            &[],
        )
        .unwrap()
    }

    fn rules<'p>(p: &'p PackagePolicy, name: &str) -> NameRules<'p> {
        p.rules(
            None,
            Ecosystem::Pypi,
            &normalize(Ecosystem::Pypi, name).unwrap(),
            NOW,
        )
    }

    fn file_json(name: &str, v: &str, kind: &str, t: i64, sha: &str) -> String {
        let filename = if kind == "whl" {
            format!("{name}-{v}-py3-none-any.whl")
        } else {
            format!("{name}-{v}.tar.gz")
        };
        format!(
            "{{\"filename\":\"{filename}\",\"hashes\":{{\"sha256\":\"{sha}\"}},\"requires-python\":\">=3.8\",\"size\":1,\"upload-time\":\"{}\",\"url\":\"https://files.pythonhosted.org/packages/aa/bb/{}/{filename}\",\"yanked\":false}}",
            format_rfc3339(t),
            "c".repeat(60)
        )
    }

    fn simple(files: &[String], versions: &[&str]) -> String {
        let vs: Vec<String> = versions.iter().map(|v| quote(v)).collect();
        format!(
            "{{\"meta\":{{\"api-version\":\"1.1\",\"_last-serial\":1}},\"name\":\"requests\",\"files\":[\n{}\n],\"versions\":[{}]}}",
            files.join(",\n"),
            vs.join(", ")
        )
    }

    #[test]
    fn simple_json_drops_held_files_and_versions() {
        let p = policy("");
        let h = "a".repeat(64);
        let files = [
            file_json("requests", "2.30.0", "whl", NOW - 400 * DAY, &h),
            file_json("requests", "2.32.3", "whl", NOW - 40 * DAY, &h),
            file_json("requests", "2.32.3", "tgz", NOW - DAY, &h),
            file_json("requests", "2.32.4", "whl", NOW - DAY, &h),
        ];
        let body = simple(&files, &["2.30.0", "2.32.3", "2.32.4", "2.33.0"]);
        let f = filter(
            &rules(&p, "requests"),
            IndexForm::PypiSimpleJson,
            body.as_bytes(),
            None,
        )
        .unwrap();
        let out = std::str::from_utf8(&f.body).unwrap();
        let v: Value = serde_json::from_str(out).unwrap();
        let names: Vec<&str> = v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["filename"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["requests-2.32.3-py3-none-any.whl"]);
        assert!(out.contains(&files[1]), "kept entry verbatim");
        assert_eq!(v["versions"], serde_json::json!(["2.32.3"]));
        assert_eq!(f.hidden.get(PackageReason::VersionNotApproved), 1, "2.30.0");
        // 2.33.0 fits the constraint but has no file, so no time.
        assert_eq!(f.hidden.get(PackageReason::TimeUnknown), 1);
        assert_eq!(
            f.hidden.get(PackageReason::TooNew),
            2,
            "the late sdist of 2.32.3, and 2.32.4"
        );
        assert_eq!(v["meta"]["api-version"], "1.1");
        // The view has every file, with times and digests.
        assert_eq!(
            f.view
                .file("requests-2.32.4-py3-none-any.whl")
                .unwrap()
                .1
                .published,
            Some(NOW - DAY)
        );
    }

    #[test]
    fn pins_hide_unpinned_files() {
        let pin = "b".repeat(64);
        let p = policy(&format!("      - {{ name: certifi, versions: \"==2024.8.30\", min_age: 0d, sha256: [\"{pin}\"] }}\n"));
        let files = [
            file_json("certifi", "2024.8.30", "whl", NOW, &pin),
            file_json("certifi", "2024.8.30", "tgz", NOW, &"c".repeat(64)),
        ];
        let body =
            simple(&files, &["2024.8.30"]).replace("\"name\":\"requests\"", "\"name\":\"certifi\"");
        let f = filter(
            &rules(&p, "certifi"),
            IndexForm::PypiSimpleJson,
            body.as_bytes(),
            None,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&f.body).unwrap();
        assert_eq!(v["files"].as_array().unwrap().len(), 1);
        assert_eq!(v["versions"], serde_json::json!(["2024.8.30"]));
        assert_eq!(f.hidden.get(PackageReason::IntegrityMismatch), 1);
    }

    #[test]
    fn html_is_filtered_exactly_as_json() {
        let p = policy("");
        let h = "a".repeat(64);
        let files = [
            file_json("requests", "2.30.0", "whl", NOW - 400 * DAY, &h),
            file_json("requests", "2.32.3", "whl", NOW - 40 * DAY, &h),
            file_json("requests", "2.32.4", "whl", NOW - DAY, &h),
        ];
        let body = simple(&files, &[]);
        let r = rules(&p, "requests");
        let fj = filter(&r, IndexForm::PypiSimpleJson, body.as_bytes(), None).unwrap();
        let html = format!(
            "<!DOCTYPE html>\n<html>\n  <head><title>Links for requests</title></head>\n  <body>\n    <h1>Links for requests</h1>\n{}\n<!-- <a href=\"x\">hidden</a> -->\n  </body>\n</html>\n",
            ["2.30.0", "2.32.3", "2.32.4"]
                .iter()
                .map(|v| format!("    <a href=\"https://files.pythonhosted.org/packages/aa/bb/cc/requests-{v}-py3-none-any.whl#sha256={h}\" data-requires-python=\"&gt;=3.8\">requests-{v}-py3-none-any.whl</a><br />"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let fh = filter(
            &r,
            IndexForm::PypiSimpleHtml,
            html.as_bytes(),
            Some(&fj.view),
        )
        .unwrap();
        let out = std::str::from_utf8(&fh.body).unwrap();
        assert!(
            out.contains("requests-2.32.3-py3-none-any.whl</a><br />"),
            "{out}"
        );
        assert!(
            !out.contains("requests-2.30.0") && !out.contains("requests-2.32.4"),
            "{out}"
        );
        assert!(
            out.contains("<!-- <a href=\"x\">hidden</a> -->"),
            "comments are not anchors"
        );
        assert_eq!(fh.hidden, fj.hidden);
        // Lines of removed anchors go whole; the rest is untouched.
        assert_eq!(out.lines().count(), html.lines().count() - 2);
        // Without the JSON form's times, time_unknown holds every file.
        let fh = filter(&r, IndexForm::PypiSimpleHtml, html.as_bytes(), None).unwrap();
        assert_eq!(fh.hidden.get(PackageReason::TimeUnknown), 2);
    }

    #[test]
    fn html_anchors_in_any_spelling_are_read() {
        let p = policy("");
        let r = rules(&p, "requests");
        let html = "<html><body><A\nHREF=../../x/requests-3.0.0.tar.gz>requests-3.0.0.tar.gz</A><a href='requests-2.32.0.tar.gz?x#sha256=zz'>x</a></body></html>";
        let f = filter(&r, IndexForm::PypiSimpleHtml, html.as_bytes(), None).unwrap();
        let out = std::str::from_utf8(&f.body).unwrap();
        assert_eq!(out, "<html><body></body></html>");
        // A `<` that starts no tag is text: the anchor after it is read.
        let html = "<html>1 < 2 <a href=\"requests-3.0.0.tar.gz\">f</a></html>";
        let f = filter(&r, IndexForm::PypiSimpleHtml, html.as_bytes(), None).unwrap();
        assert_eq!(std::str::from_utf8(&f.body).unwrap(), "<html>1 < 2 </html>");
        for bad in [
            "<html><a href=x>",
            "<html><!-- <a>",
            "<html><a href=\"x>y</a>",
            "{\"files\":[]}",
            // An unquoted value with a quote: a parser ends it at the blank,
            // a quote-aware scan runs on and would swallow the next anchor.
            "<html><p title=x\"y><a href=\"requests-3.0.0.tar.gz\">f</a><i title=\"z\">",
        ] {
            assert!(
                matches!(
                    filter(&r, IndexForm::PypiSimpleHtml, bad.as_bytes(), None),
                    Err(FilterError::Unfilterable(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn project_json_points_info_and_urls_at_the_newest_allowed() {
        let p = policy("");
        let h = "a".repeat(64);
        let f = |v: &str, t: i64| {
            format!("{{\"filename\":\"requests-{v}-py3-none-any.whl\",\"digests\":{{\"sha256\":\"{h}\"}},\"upload_time\":\"x\",\"upload_time_iso_8601\":\"{}\",\"yanked\":false}}", format_rfc3339(t))
        };
        let body = format!(
            "{{\"info\":{{\"name\":\"requests\",\"summary\":\"s\",\"version\":\"2.32.4\"}},\"last_serial\":7,\"releases\":{{\"2.31.0\":[{}],\"2.32.3\":[{}],\"2.32.4\":[{}],\"3.0.0\":[]}},\"urls\":[{}],\"vulnerabilities\":[]}}",
            f("2.31.0", NOW - 300 * DAY),
            f("2.32.3", NOW - 30 * DAY),
            f("2.32.4", NOW - DAY),
            f("2.32.4", NOW - DAY)
        );
        let out = filter(
            &rules(&p, "requests"),
            IndexForm::PypiJson,
            body.as_bytes(),
            None,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(v["info"]["version"], "2.32.3");
        assert_eq!(v["info"]["summary"], "s");
        assert_eq!(
            v["releases"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["2.31.0", "2.32.3"]
        );
        assert_eq!(v["urls"][0]["filename"], "requests-2.32.3-py3-none-any.whl");
        assert_eq!(out.hidden.get(PackageReason::TooNew), 1);
        assert_eq!(out.hidden.get(PackageReason::VersionNotApproved), 1);
        assert!(std::str::from_utf8(&out.body)
            .unwrap()
            .contains(&f("2.31.0", NOW - 300 * DAY)));
        // Nothing allowed: no urls, no version.
        let p = policy("");
        let none = body.replace("2.3", "1.3");
        let out = filter(
            &rules(&p, "requests"),
            IndexForm::PypiJson,
            none.as_bytes(),
            None,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(
            (v["info"]["version"].clone(), v["urls"].clone()),
            (Value::Null, serde_json::json!([]))
        );
    }

    #[test]
    fn other_projects_documents_are_unfilterable() {
        let p = policy("");
        let r = rules(&p, "requests");
        for (form, body) in [
            (
                IndexForm::PypiSimpleJson,
                r#"{"name":"requestz","files":[]}"#,
            ),
            (IndexForm::PypiSimpleJson, r#"{"name":"requests"}"#),
            (
                IndexForm::PypiSimpleJson,
                r#"{"name":"requests","files":[{"url":"x"}]}"#,
            ),
            (
                IndexForm::PypiJson,
                r#"{"info":{"name":"other"},"releases":{}}"#,
            ),
            (IndexForm::PypiJson, r#"{"info":{"name":"requests"}}"#),
        ] {
            assert!(
                matches!(
                    filter(&r, form, body.as_bytes(), None),
                    Err(FilterError::Unfilterable(_))
                ),
                "{body}"
            );
        }
        // Spellings PEP 503 folds are the same project.
        let body = r#"{"name":"Requests","files":[]}"#;
        assert!(filter(&r, IndexForm::PypiSimpleJson, body.as_bytes(), None).is_ok());
    }

    /// Random simple JSON documents: kept file entries are byte-identical,
    /// the kept set is what the rules admit per file, and HTML built from
    /// the same files keeps the same files.
    #[test]
    fn kept_entries_are_byte_identical() {
        let mut rng = Rng::new(23);
        let p = policy("      - { name: requests, versions: \"==2.0.*\", min_age: 0d }\n");
        let r = rules(&p, "requests");
        for case in 0..200 {
            let mut files = Vec::new();
            for _ in 0..1 + rng.below(20) {
                let v = format!("2.{}.{}", rng.below(40), rng.below(3));
                let kind = if rng.chance(50) { "whl" } else { "tgz" };
                files.push((
                    v.clone(),
                    file_json(
                        "requests",
                        &v,
                        kind,
                        NOW - rng.below(8) as i64 * DAY,
                        &"d".repeat(64),
                    ),
                ));
            }
            files.sort();
            let mut seen = std::collections::HashSet::new();
            files.retain(|(_, t)| {
                seen.insert(t[..t.find(".whl").or(t.find(".tar")).unwrap()].to_string())
            });
            let texts: Vec<String> = files.iter().map(|f| f.1.clone()).collect();
            let body = simple(&texts, &[]);
            let f = filter(&r, IndexForm::PypiSimpleJson, body.as_bytes(), None).unwrap();
            let out = std::str::from_utf8(&f.body).unwrap();
            let v: Value = serde_json::from_str(out).unwrap();
            let kept: Vec<String> = v["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["filename"].as_str().unwrap().to_string())
                .collect();
            for (ver, t) in &files {
                let fv: Value = serde_json::from_str(t).unwrap();
                let name = fv["filename"].as_str().unwrap();
                let facts = f.view.file(name).unwrap().1.clone();
                let admitted = judge(&r, ver, &facts).is_none();
                assert_eq!(
                    kept.iter().any(|k| k == name),
                    admitted,
                    "case {case}: {name}"
                );
                if admitted {
                    assert!(out.contains(t.as_str()), "case {case}: not verbatim");
                }
            }
            let html: String = files
                .iter()
                .map(|(_, t)| {
                    let fv: Value = serde_json::from_str(t).unwrap();
                    format!(
                        "<a href=\"{}#sha256={}\">{}</a>\n",
                        fv["url"].as_str().unwrap(),
                        "d".repeat(64),
                        fv["filename"].as_str().unwrap()
                    )
                })
                .collect();
            let fh = filter(
                &r,
                IndexForm::PypiSimpleHtml,
                format!("<html>\n{html}</html>").as_bytes(),
                Some(&f.view),
            )
            .unwrap();
            let hout = std::str::from_utf8(&fh.body).unwrap();
            for k in &kept {
                assert!(
                    hout.contains(&format!(">{k}</a>\n")),
                    "case {case}: {k} lost from HTML"
                );
            }
            assert_eq!(hout.matches("<a ").count(), kept.len(), "case {case}");
        }
    }
}
