//! cargo's sparse index files: one JSON object per line and version.
//! A held version's line gets `"yanked":true` (its `yanked` value
//! replaced, or the member added), so cargo's resolver skips it in a fresh
//! lock; every other line, and every other byte of a held line, is
//! unchanged. A `Cargo.lock` that pins a held version still resolves, and
//! its download is denied by the decision.

use serde::Deserialize;

use super::json;
use super::{done, text, unfilterable, FilterError, Filtered, Hidden};
use crate::packages::decide::{NameRules, PackageReason};
use crate::packages::name::normalize;
use crate::packages::raw::parse_sha256_hex;
use crate::packages::stamp::parse_rfc3339;
use crate::packages::view::{FileFacts, IndexView};
use crate::packages::Ecosystem;

#[derive(Deserialize)]
struct Line {
    name: String,
    vers: String,
    cksum: Option<String>,
    #[serde(default)]
    yanked: bool,
    pubtime: Option<String>,
}

/// Filters one sparse index file of `rules.name`.
pub fn sparse(rules: &NameRules<'_>, body: &[u8]) -> Result<Filtered, FilterError> {
    let doc = text(body)?;
    let mut view = IndexView::new(Ecosystem::Cargo, rules.name.clone());
    let mut hidden = Hidden::default();
    let mut edits = Vec::new();
    let mut at = 0;
    for line in doc.split_inclusive('\n') {
        let start = at;
        at += line.len();
        let content = line.trim_end_matches(['\n', '\r']);
        if content.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(content)
            .map_err(|e| FilterError::Unfilterable(format!("index line: {e}")))?;
        if normalize(Ecosystem::Cargo, &l.name).ok().as_ref() != Some(&rules.name) {
            return unfilterable(format!("index line of {:?}, not of {}", l.name, rules.name));
        }
        if view.version(&l.vers).is_some() {
            return unfilterable(format!("version {} listed twice", l.vers));
        }
        let facts = FileFacts {
            filename: format!("{}-{}.crate", rules.name, l.vers),
            published: l.pubtime.as_deref().and_then(parse_rfc3339),
            sha256: l.cksum.as_deref().and_then(|c| parse_sha256_hex(c).ok()),
            at: None,
        };
        view.add_file(&l.vers, facts.clone());
        if l.yanked {
            continue;
        }
        let reason = match rules.version(&l.vers, facts.published) {
            Err(h) => h.reason,
            Ok(ok) if !ok.file_allowed(facts.sha256.as_ref()) => PackageReason::IntegrityMismatch,
            Ok(_) => continue,
        };
        hidden.add(reason);
        let raw =
            json::top(&doc[start..start + content.len()]).map_err(FilterError::Unfilterable)?;
        let obj = json::object(doc, raw).map_err(FilterError::Unfilterable)?;
        match obj.get("yanked") {
            Some(m) => edits.push((m.val_start, m.val_end, "true".to_string())),
            None => {
                let at = obj.members.last().map_or(obj.start + 1, |m| m.val_end);
                let lead = if obj.members.is_empty() { "" } else { "," };
                edits.push((at, at, format!("{lead}\"yanked\":true")));
            }
        }
    }
    let out = (!edits.is_empty()).then(|| json::splice(doc, edits));
    Ok(done(body, out, hidden, view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::classify::IndexForm;
    use crate::packages::compile::tests::compile_yaml;
    use crate::packages::filter::filter;
    use crate::packages::testutil::Rng;

    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 86400;

    fn line(name: &str, v: &str, t: Option<i64>, yanked: bool) -> String {
        let pt = t.map_or(String::new(), |t| {
            format!(
                ",\"pubtime\":\"{}\"",
                crate::packages::stamp::format_rfc3339(t)
            )
        });
        format!("{{\"name\":\"{name}\",\"vers\":\"{v}\",\"deps\":[{{\"name\":\"x\",\"req\":\"^1\"}}],\"cksum\":\"{}\",\"features\":{{}},\"yanked\":{yanked},\"v\":2{pt}}}\n", "e".repeat(64))
    }

    #[test]
    fn held_versions_are_yanked_and_other_lines_untouched() {
        let p = compile_yaml("packages:\n  - id: rs\n    owner: o\n    reason: r\n    ecosystem: cargo\n    min_age: 3d\n    allow: [\"serde_json ^1\"]\n", &[]).unwrap();
        let name = normalize(Ecosystem::Cargo, "serde-json").unwrap();
        let r = p.rules(None, Ecosystem::Cargo, &name, NOW);
        let lines = [
            line("serde_json", "0.9.0", Some(NOW - 900 * DAY), false),
            line("serde_json", "1.0.0", Some(NOW - 90 * DAY), false),
            line("serde_json", "1.0.1", Some(NOW - 90 * DAY), true),
            line("serde_json", "1.0.2", Some(NOW - DAY), false),
            line("serde_json", "1.0.3", None, false).replace(",\"yanked\":false", ""),
        ];
        let body = lines.concat();
        let f = filter(&r, IndexForm::CargoSparse, body.as_bytes(), None).unwrap();
        let out: Vec<&str> = std::str::from_utf8(&f.body)
            .unwrap()
            .split_inclusive('\n')
            .collect();
        assert_eq!(
            out[0],
            lines[0].replace("\"yanked\":false", "\"yanked\":true")
        );
        assert_eq!(out[1], lines[1]);
        assert_eq!(out[2], lines[2], "already yanked: untouched, not counted");
        assert_eq!(
            out[3],
            lines[3].replace("\"yanked\":false", "\"yanked\":true")
        );
        assert!(out[4].ends_with(",\"yanked\":true}\n"), "{}", out[4]);
        assert_eq!(f.hidden.get(PackageReason::VersionNotApproved), 1);
        assert_eq!(f.hidden.get(PackageReason::TooNew), 1);
        assert_eq!(f.hidden.get(PackageReason::TimeUnknown), 1);
        assert_eq!(
            f.view.version("1.0.0").unwrap().files[0].filename,
            "serde_json-1.0.0.crate"
        );
        for bad in [
            "{\"name\":\"serde\",\"vers\":\"1.0.0\"}\n",
            "not json\n",
            &format!("{}{}", lines[1], lines[1]),
        ] {
            assert!(
                matches!(
                    filter(&r, IndexForm::CargoSparse, bad.as_bytes(), None),
                    Err(FilterError::Unfilterable(_))
                ),
                "{bad}"
            );
        }
    }

    /// Random index files: kept lines byte-identical, held lines differ
    /// only in their yanked value.
    #[test]
    fn kept_lines_are_byte_identical() {
        let p = compile_yaml("packages:\n  - id: rs\n    owner: o\n    reason: r\n    ecosystem: cargo\n    min_age: 3d\n    allow: [\"foo >=0.5, <2\"]\n", &[]).unwrap();
        let name = normalize(Ecosystem::Cargo, "foo").unwrap();
        let r = p.rules(None, Ecosystem::Cargo, &name, NOW);
        let mut rng = Rng::new(29);
        for case in 0..200 {
            let mut lines = Vec::new();
            for i in 0..1 + rng.below(25) {
                let t = if rng.chance(90) {
                    Some(NOW - rng.below(8) as i64 * DAY)
                } else {
                    None
                };
                lines.push(line(
                    "foo",
                    &format!("{}.{i}.0", rng.below(3)),
                    t,
                    rng.chance(10),
                ));
            }
            let body = lines.concat();
            let f = filter(&r, IndexForm::CargoSparse, body.as_bytes(), None).unwrap();
            let out: Vec<&str> = std::str::from_utf8(&f.body)
                .unwrap()
                .split_inclusive('\n')
                .collect();
            assert_eq!(out.len(), lines.len());
            let mut held = 0;
            for (o, l) in out.iter().zip(&lines) {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let vers = v["vers"].as_str().unwrap();
                let pre_yanked = v["yanked"].as_bool().unwrap();
                let t = f.view.version(vers).unwrap().published;
                if pre_yanked || r.version(vers, t).is_ok() {
                    assert_eq!(o, l, "case {case}");
                } else {
                    held += 1;
                    assert_eq!(
                        *o,
                        l.replace("\"yanked\":false", "\"yanked\":true"),
                        "case {case}"
                    );
                }
            }
            assert_eq!(f.hidden.total(), held);
        }
    }
}
