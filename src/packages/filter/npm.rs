//! npm packuments, full (`application/json`, with `time`) and abbreviated
//! (`application/vnd.npm.install-v1+json`, without). Held versions move,
//! byte for byte, under `policyRestrictions.versions` with a `message`:
//! npm (npm-pick-manifest) then prefers unrestricted versions and, when
//! only a restricted one fits, fails with E403 and that message instead of
//! a bare "no matching version". Dist-tags that point at a held version
//! are dropped and `latest` is re-pointed to the newest allowed version
//! (releases before pre-releases). `time` keeps `created`, `modified` and
//! the kept versions.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use super::json::{self, quote, Object};
use super::{done, text, unfilterable, FilterError, Filtered, Hidden};
use crate::packages::decide::{NameRules, PackageReason};
use crate::packages::stamp::parse_rfc3339;
use crate::packages::view::{listed_at, FileFacts, IndexView};
use crate::packages::Ecosystem;

/// Held versions the message names (the newest ones); the rest are counted.
pub const MESSAGE_VERSIONS: usize = 3;

fn bad(e: String) -> FilterError {
    FilterError::Unfilterable(e)
}

/// A version's `dist.tarball`, only that read.
#[derive(serde::Deserialize)]
struct VersionDist {
    dist: Option<Dist>,
}

#[derive(serde::Deserialize)]
struct Dist {
    tarball: Option<String>,
}

/// Where a version's `dist.tarball` is (npm takes it as an absolute URL).
fn tarball_at(version: &serde_json::value::RawValue) -> Option<String> {
    let v: VersionDist = serde_json::from_str(version.get()).ok()?;
    listed_at("registry.npmjs.org", "/", &v.dist?.tarball?)
}

/// Filters a packument. `abbreviated`: `None` for the full form (times
/// from its own `time`), `Some(times)` for the abbreviated form.
pub fn packument(
    rules: &NameRules<'_>,
    body: &[u8],
    abbreviated: Option<Option<&IndexView>>,
) -> Result<Filtered, FilterError> {
    let doc = text(body)?;
    // One pass over the document: `versions` (nearly all of it) and `time`
    // are read with the top level.
    let (top, nested) = json::document_nested(doc, &["versions", "time"]).map_err(bad)?;
    match top.get("name").and_then(|m| json::as_str(m.value)) {
        Some(n) if n == rules.name.as_str() => {}
        Some(n) => return unfilterable(format!("packument of {n:?}, not of {}", rules.name)),
        None => return unfilterable("packument without a name"),
    }
    let mut versions = None;
    let mut time_obj = None;
    for (k, o) in &nested {
        match k.as_str() {
            "versions" => versions = Some(o),
            _ if abbreviated.is_none() => time_obj = Some(o),
            _ => {}
        }
    }
    let Some(versions) = versions else {
        return unfilterable("packument without versions");
    };
    let Judged {
        view,
        hidden,
        kept,
        held,
    } = judge(rules, versions, abbreviated, time_obj);
    let kept_names: Vec<&str> = kept.iter().map(|&i| &*versions.members[i].key).collect();
    let newest = newest(&kept_names);
    let kept_set: HashSet<&str> = kept_names.iter().copied().collect();
    let mut edits: Vec<(usize, usize, Vec<Cow<'_, str>>)> = Vec::new();

    // dist-tags: drop those pointing at a held version, re-point latest.
    if let Some(tags_m) = top.get("dist-tags") {
        let tags = json::object(doc, tags_m.value).map_err(bad)?;
        if let Some(pieces) = dist_tags(doc, &tags, &kept_set, newest) {
            edits.push((tags.start, tags.end, pieces));
        }
    }

    if !held.is_empty() {
        let pieces = kept.iter().map(|&i| {
            let m = &versions.members[i];
            Cow::Borrowed(&doc[m.key_start..m.val_end])
        });
        edits.push((versions.start, versions.end, rebuild(doc, versions, pieces)));
        if let Some(t) = time_obj.filter(|t| !t.members.is_empty()) {
            let held_names: HashSet<&str> = held
                .iter()
                .map(|(i, _)| &*versions.members[*i].key)
                .collect();
            let pieces = t
                .members
                .iter()
                .filter(|m| !held_names.contains(&*m.key))
                .map(|m| Cow::Borrowed(&doc[m.key_start..m.val_end]));
            edits.push((t.start, t.end, rebuild(doc, t, pieces)));
        }
        let mut restrictions = restrictions(rules, doc, &top, versions, &held, &hidden)?;
        match top.get("policyRestrictions") {
            Some(m) => edits.push((m.val_start, m.val_end, restrictions)),
            None => {
                // Just before the document's closing brace.
                let at = top.end - 1;
                restrictions.insert(0, Cow::Owned(format!(",{}:", quote("policyRestrictions"))));
                edits.push((at, at, restrictions));
            }
        }
    }
    let out = (!edits.is_empty()).then(|| json::splice_pieces(doc, edits));
    Ok(done(body, out, hidden, view))
}

/// Each version judged, and the index view the judging saw.
struct Judged {
    view: IndexView,
    hidden: Hidden,
    /// Indexes into `versions.members`.
    kept: Vec<usize>,
    held: Vec<(usize, PackageReason)>,
}

/// Judges every version, published at the time the full form's `time`
/// gives (`abbreviated`: `None`) or the abbreviated form's view has.
fn judge(
    rules: &NameRules<'_>,
    versions: &Object<'_>,
    abbreviated: Option<Option<&IndexView>>,
    time_obj: Option<&Object<'_>>,
) -> Judged {
    let times_of: HashMap<&str, Option<i64>> = time_obj
        .map(|t| {
            t.members
                .iter()
                .map(|m| {
                    (
                        &*m.key,
                        json::as_str(m.value).and_then(|s| parse_rfc3339(&s)),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let bare = rules
        .name
        .as_str()
        .rsplit('/')
        .next()
        .unwrap_or(rules.name.as_str());
    let mut view = IndexView::new(Ecosystem::Npm, rules.name.clone());
    let mut hidden = Hidden::default();
    let mut kept: Vec<usize> = Vec::new();
    let mut held: Vec<(usize, PackageReason)> = Vec::new();
    for (i, m) in versions.members.iter().enumerate() {
        let published = match abbreviated {
            None => times_of.get(&*m.key).copied().flatten(),
            Some(t) => t.and_then(|t| t.version(&m.key)).and_then(|f| f.published),
        };
        view.add_file(
            &m.key,
            FileFacts {
                filename: format!("{bare}-{}.tgz", m.key),
                published,
                sha256: None,
                at: tarball_at(m.value),
            },
        );
        match rules.version(&m.key, published) {
            Ok(_) => kept.push(i),
            Err(h) => {
                hidden.add(h.reason);
                held.push((i, h.reason));
            }
        }
    }

    Judged {
        view,
        hidden,
        kept,
        held,
    }
}

/// The dist-tags without those pointing at a held version, `latest`
/// re-pointed to `newest` (`None`: nothing to change).
fn dist_tags<'d>(
    doc: &'d str,
    tags: &Object<'_>,
    kept: &HashSet<&str>,
    newest: Option<&str>,
) -> Option<Vec<Cow<'d, str>>> {
    let mut pieces: Vec<Cow<'_, str>> = Vec::new();
    let mut changed = false;
    for m in &tags.members {
        let target = json::as_str(m.value);
        let ok = target.as_deref().is_some_and(|t| kept.contains(t));
        if ok {
            pieces.push(Cow::Borrowed(&doc[m.key_start..m.val_end]));
        } else if m.key == "latest" {
            changed = true;
            if let Some(n) = newest {
                pieces.push(Cow::Owned(format!("{}:{}", quote("latest"), quote(n))));
            }
        } else {
            changed = true;
        }
    }
    changed.then(|| rebuild(doc, tags, pieces))
}

fn rebuild<'d>(
    doc: &'d str,
    obj: &Object<'_>,
    pieces: impl IntoIterator<Item = Cow<'d, str>>,
) -> Vec<Cow<'d, str>> {
    let items: Vec<(usize, usize)> = obj
        .members
        .iter()
        .map(|m| (m.key_start, m.val_end))
        .collect();
    json::rebuild_pieces(doc, obj.start + 1, obj.end - 1, &items, pieces, "{", "}")
}

/// The newest version, releases before pre-releases.
fn newest<'a>(versions: &[&'a str]) -> Option<&'a str> {
    let mut parsed: Vec<(nodejs_semver::Version, &str)> = versions
        .iter()
        .filter_map(|v| nodejs_semver::Version::parse(v).ok().map(|p| (p, *v)))
        .collect();
    parsed.sort_by(|a, b| (!a.0.is_prerelease(), &a.0).cmp(&(!b.0.is_prerelease(), &b.0)));
    parsed.last().map(|(_, v)| *v)
}

/// `{"versions":{<held, verbatim>},"message":"…"}`, keeping what an
/// upstream (a curating mirror) already restricted.
fn restrictions<'d>(
    rules: &NameRules<'_>,
    doc: &'d str,
    top: &Object<'_>,
    versions: &Object<'_>,
    held: &[(usize, PackageReason)],
    hidden: &Hidden,
) -> Result<Vec<Cow<'d, str>>, FilterError> {
    let mut pieces: Vec<&'d str> = Vec::new();
    let mut upstream: HashSet<String> = HashSet::new();
    if let Some(m) = top.get("policyRestrictions") {
        let pr = json::object(doc, m.value).map_err(bad)?;
        if let Some(v) = pr.get("versions") {
            for m in json::object(doc, v.value).map_err(bad)?.members {
                upstream.insert(m.key.to_string());
                pieces.push(&doc[m.key_start..m.val_end]);
            }
        }
    }
    for (i, _) in held {
        let m = &versions.members[*i];
        if !upstream.contains(&*m.key) {
            pieces.push(&doc[m.key_start..m.val_end]);
        }
    }
    // Parsed once each: a comparator that parses is n log n parses.
    let mut held_versions: Vec<(Option<nodejs_semver::Version>, &str, PackageReason)> = held
        .iter()
        .map(|(i, r)| {
            let v = &*versions.members[*i].key;
            (nodejs_semver::Version::parse(v).ok(), v, *r)
        })
        .collect();
    held_versions.sort_by(|a, b| b.0.cmp(&a.0));
    let named: Vec<String> = held_versions
        .iter()
        .take(MESSAGE_VERSIONS)
        .map(|(_, v, r)| format!("{v} ({})", r.as_str()))
        .collect();
    let counts: Vec<String> = hidden
        .iter()
        .map(|(r, n)| format!("{}: {n}", r.as_str()))
        .collect();
    let message = format!(
        "egressd: {} version(s) of {} held back by package policy ({}); newest held: {}. Ask {} to approve a version.",
        hidden.total(),
        rules.name,
        counts.join(", "),
        named.join(", "),
        rules.contact()
    );
    let mut out: Vec<Cow<'d, str>> = Vec::with_capacity(2 * pieces.len() + 2);
    out.push(Cow::Borrowed("{\"versions\":{"));
    for (i, p) in pieces.into_iter().enumerate() {
        if i > 0 {
            out.push(Cow::Borrowed(","));
        }
        out.push(Cow::Borrowed(p));
    }
    out.push(Cow::Owned(format!("}},\"message\":{}}}", quote(&message))));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::classify::IndexForm;
    use crate::packages::compile::tests::compile_yaml;
    use crate::packages::compile::PackagePolicy;
    use crate::packages::filter::filter;
    use crate::packages::name::normalize;
    use crate::packages::testutil::Rng;
    use serde_json::Value;

    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 86400;

    fn policy(allow: &str) -> PackagePolicy {
        compile_yaml(
            &format!(
                "packages:\n  - id: js\n    owner: o\n    reason: r\n    ecosystem: npm\n    min_age: 3d\n    allow: [{allow}]\n    deny: [\"left-pad =1.1.0\"]\n"
            ),
            &[],
        )
        .unwrap()
    }

    fn ts(t: i64) -> String {
        crate::packages::stamp::format_rfc3339(t)
    }

    fn doc(name: &str, versions: &[(&str, i64)], latest: &str) -> String {
        let vs: Vec<String> = versions
            .iter()
            .map(|(v, _)| format!("\"{v}\": {{\"name\":\"{name}\",\"version\":\"{v}\",\"dist\":{{\"tarball\":\"https://registry.npmjs.org/{name}/-/{name}-{v}.tgz\",\"integrity\":\"sha512-x\"}}}}"))
            .collect();
        let tm: Vec<String> = versions
            .iter()
            .map(|(v, t)| format!("\"{v}\":\"{}\"", ts(*t)))
            .collect();
        format!(
            "{{\"_id\":\"{name}\",\"name\":\"{name}\",\"dist-tags\":{{\"latest\":\"{latest}\",\"next\":\"{latest}\"}},\n \"versions\": {{\n  {}\n }},\n \"time\":{{\"created\":\"{}\",\"modified\":\"{}\",{}}},\"readme\":\"hi\"}}",
            vs.join(",\n  "),
            ts(0),
            ts(NOW),
            tm.join(",")
        )
    }

    fn run(
        p: &PackagePolicy,
        name: &str,
        body: &str,
        form: IndexForm,
        times: Option<&IndexView>,
    ) -> Result<Filtered, FilterError> {
        let n = normalize(Ecosystem::Npm, name).unwrap();
        filter(
            &p.rules(None, Ecosystem::Npm, &n, NOW),
            form,
            body.as_bytes(),
            times,
        )
    }

    #[test]
    fn held_versions_move_under_policy_restrictions_and_latest_is_repointed() {
        let p = policy("\"left-pad ^1\"");
        let body = doc(
            "left-pad",
            &[
                ("1.0.0", NOW - 100 * DAY),
                ("1.1.0", NOW - 50 * DAY),
                ("1.2.0", NOW - 10 * DAY),
                ("1.3.0", NOW - DAY),
                ("2.0.0", NOW - 90 * DAY),
            ],
            "1.3.0",
        );
        let f = run(&p, "left-pad", &body, IndexForm::NpmFull, None).unwrap();
        assert!(f.rewritten);
        assert_eq!(f.hidden.get(PackageReason::TooNew), 1);
        assert_eq!(f.hidden.get(PackageReason::Denied), 1);
        assert_eq!(f.hidden.get(PackageReason::VersionNotApproved), 1);
        let v: Value = serde_json::from_slice(&f.body).unwrap();
        let kept: Vec<&String> = v["versions"].as_object().unwrap().keys().collect();
        assert_eq!(kept, ["1.0.0", "1.2.0"]);
        assert_eq!(v["dist-tags"], serde_json::json!({"latest": "1.2.0"}));
        let restricted: Vec<&String> = v["policyRestrictions"]["versions"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(restricted, ["1.1.0", "1.3.0", "2.0.0"]);
        let msg = v["policyRestrictions"]["message"].as_str().unwrap();
        assert!(
            msg.contains("3 version(s) of left-pad")
                && msg.contains("2.0.0 (package_version_not_approved)")
                && msg.contains("#security"),
            "{msg}"
        );
        let times: Vec<&String> = v["time"].as_object().unwrap().keys().collect();
        assert_eq!(times, ["1.0.0", "1.2.0", "created", "modified"]);
        assert_eq!(v["readme"], "hi");
        assert_eq!(f.etag, super::super::etag(&f.body));
        // The view keeps every version's facts, for downloads.
        assert_eq!(f.view.versions().len(), 5);
        assert_eq!(f.view.version("1.3.0").unwrap().published, Some(NOW - DAY));
    }

    #[test]
    fn nothing_held_is_passed_unchanged() {
        let p = policy("left-pad");
        let body = doc("left-pad", &[("1.0.0", NOW - 100 * DAY)], "1.0.0");
        let f = run(&p, "left-pad", &body, IndexForm::NpmFull, None).unwrap();
        assert!(!f.rewritten);
        assert_eq!(f.body, body.as_bytes());
        assert_eq!(f.hidden.total(), 0);
    }

    #[test]
    fn abbreviated_documents_use_the_full_forms_times() {
        let p = policy("left-pad");
        let full = doc(
            "left-pad",
            &[("1.0.0", NOW - 100 * DAY), ("1.1.1", NOW - DAY)],
            "1.1.1",
        );
        let fv = run(&p, "left-pad", &full, IndexForm::NpmFull, None).unwrap();
        let abbrev = r#"{"name":"left-pad","modified":"x","dist-tags":{"latest":"1.1.1"},"versions":{"1.0.0":{"version":"1.0.0"},"1.1.1":{"version":"1.1.1"}}}"#;
        let f = run(
            &p,
            "left-pad",
            abbrev,
            IndexForm::NpmAbbreviated,
            Some(&fv.view),
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&f.body).unwrap();
        assert_eq!(v["dist-tags"]["latest"], "1.0.0");
        assert_eq!(v["versions"].as_object().unwrap().len(), 1);
        // Both forms hide the same versions.
        let vf: Value = serde_json::from_slice(&fv.body).unwrap();
        assert_eq!(
            v["versions"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            vf["versions"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>()
        );
        // Without times, time_unknown (deny by default) holds everything.
        let f = run(&p, "left-pad", abbrev, IndexForm::NpmAbbreviated, None).unwrap();
        assert_eq!(f.hidden.get(PackageReason::TimeUnknown), 2);
        let v: Value = serde_json::from_slice(&f.body).unwrap();
        assert_eq!(v["dist-tags"], serde_json::json!({}));
    }

    #[test]
    fn wrong_shapes_are_unfilterable() {
        let p = policy("left-pad");
        for body in [
            "not json",
            "[]",
            r#"{"name":"other","versions":{}}"#,
            r#"{"versions":{}}"#,
            r#"{"name":"left-pad"}"#,
            r#"{"name":"left-pad","versions":[]}"#,
            r#"{"name":"left-pad","versions":{"1.0.0":{},"1.0.0":{}}}"#,
            r#"{"name":"left-pad","name":"left-pad","versions":{}}"#,
        ] {
            assert!(
                matches!(
                    run(&p, "left-pad", body, IndexForm::NpmFull, None),
                    Err(FilterError::Unfilterable(_))
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn upstream_restrictions_are_kept() {
        let p = policy("\"left-pad ^1\"");
        let body = r#"{"name":"left-pad","versions":{"1.0.0":{"a":1},"2.0.0":{"b":2}},"time":{"1.0.0":"2020-01-01T00:00:00Z","2.0.0":"2020-01-01T00:00:00Z"},"policyRestrictions":{"versions":{"0.9.0":{"c":3}},"message":"upstream"}}"#;
        let f = run(&p, "left-pad", body, IndexForm::NpmFull, None).unwrap();
        let v: Value = serde_json::from_slice(&f.body).unwrap();
        assert_eq!(
            v["policyRestrictions"]["versions"],
            serde_json::json!({"0.9.0": {"c": 3}, "2.0.0": {"b": 2}})
        );
    }

    /// Random packuments in random layouts: every kept version's member is
    /// byte-identical to the input's, every held one sits verbatim under
    /// policyRestrictions, the kept set is exactly what the rules admit, and
    /// the output is JSON.
    #[test]
    fn kept_entries_are_byte_identical() {
        let mut rng = Rng::new(17);
        let ranges = [
            "\"pkg ^1\"",
            "pkg",
            "\"pkg >=1.5.0 <3\"",
            "{ name: pkg, min_age: 0d }",
        ];
        for case in 0..200 {
            let p = policy(ranges[rng.below(ranges.len())]);
            let n = 1 + rng.below(30);
            let ws = [" ", "", "\n  ", "\t"];
            let mut vs = Vec::new();
            let mut tm = Vec::new();
            let mut versions = Vec::new();
            for i in 0..n {
                let v = format!(
                    "{}.{}.{}{}",
                    rng.below(3),
                    i,
                    rng.below(3),
                    if rng.chance(15) { "-beta.1" } else { "" }
                );
                if versions.contains(&v) {
                    continue;
                }
                let w = ws[rng.below(ws.len())];
                vs.push(format!(
                    "\"{v}\"{w}:{w}{{\"v\":\"{v}\",{w}\"n\":[{}, \"\\u00e9\\\"\"]}}",
                    rng.below(99)
                ));
                if rng.chance(90) {
                    tm.push(format!(
                        "\"{v}\":\"{}\"",
                        ts(NOW - rng.below(10) as i64 * DAY)
                    ));
                }
                versions.push(v);
            }
            let w = ws[rng.below(ws.len())];
            let body = format!(
                "{{{w}\"name\":{w}\"pkg\",\"dist-tags\":{{\"latest\":\"{}\"}},{w}\"versions\":{w}{{{w}{}{w}}},\"time\":{{{}}}{w}}}",
                versions[rng.below(versions.len())],
                vs.join(&format!(",{w}")),
                tm.join(",")
            );
            let f = run(&p, "pkg", &body, IndexForm::NpmFull, None).unwrap();
            let out = std::str::from_utf8(&f.body).unwrap();
            let v: Value =
                serde_json::from_str(out).unwrap_or_else(|e| panic!("case {case}: {e}\n{out}"));
            let name = normalize(Ecosystem::Npm, "pkg").unwrap();
            let rules = p.rules(None, Ecosystem::Npm, &name, NOW);
            let mut n_held = 0;
            for (ver, member) in versions.iter().zip(&vs) {
                let t = f.view.version(ver).unwrap().published;
                let admitted = rules.version(ver, t).is_ok();
                assert_eq!(
                    v["versions"].get(ver).is_some(),
                    admitted,
                    "case {case}: {ver}\n{body}"
                );
                assert!(
                    out.contains(member.as_str()),
                    "case {case}: {member} not verbatim\n{out}"
                );
                if !admitted {
                    n_held += 1;
                    assert!(
                        v["policyRestrictions"]["versions"].get(ver).is_some(),
                        "case {case}"
                    );
                }
            }
            assert_eq!(f.hidden.total(), n_held, "case {case}");
            if let Some(l) = v["dist-tags"]["latest"].as_str() {
                assert!(
                    v["versions"].get(l).is_some(),
                    "case {case}: latest {l} is held"
                );
            }
        }
    }
}
