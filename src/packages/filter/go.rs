//! Go's module proxy lists: `@v/list` (one version per line) filtered by
//! the versions' times, which the caller learns from each `.mod` file's
//! `Last-Modified` and passes as `times`; `@latest` recomputed from them
//! when the upstream's answer is held: the newest allowed release, else
//! pre-release. With no allowed version `@latest` is a denial (go reads a
//! 404/410 as "try the next proxy, or direct", so it must be a 403).

use serde::Deserialize;

use super::json::quote;
use super::{done, text, unfilterable, FilterError, Filtered, Hidden};
use crate::packages::decide::NameRules;
use crate::packages::stamp::format_rfc3339;
use crate::packages::version::GoVersion;
use crate::packages::view::{FileFacts, IndexView};
use crate::packages::Ecosystem;

fn time_of(times: Option<&IndexView>, v: &str) -> Option<i64> {
    times.and_then(|t| t.version(v)).and_then(|f| f.published)
}

/// `<module>/@v/list`.
pub fn list(
    rules: &NameRules<'_>,
    body: &[u8],
    times: Option<&IndexView>,
) -> Result<Filtered, FilterError> {
    let doc = text(body)?;
    let mut view = IndexView::new(Ecosystem::Go, rules.name.clone());
    let mut hidden = Hidden::default();
    let mut out = String::with_capacity(doc.len());
    for line in doc.split_inclusive('\n') {
        let v = line.trim();
        if v.is_empty() {
            out.push_str(line);
            continue;
        }
        if v.contains(char::is_whitespace) {
            return unfilterable("a list line with more than a version");
        }
        let published = time_of(times, v);
        view.add_file(
            v,
            FileFacts {
                filename: format!("{v}.zip"),
                published,
                sha256: None,
                at: None,
            },
        );
        match rules.version(v, published) {
            Ok(_) => out.push_str(line),
            Err(h) => hidden.add(h.reason),
        }
    }
    Ok(done(body, Some(out), hidden, view))
}

#[derive(Deserialize)]
struct Latest {
    #[serde(rename = "Version")]
    version: String,
}

/// `<module>/@latest`. `times`: the view of the module's `@v/list` with
/// `.mod` times (the candidates a recomputed answer is chosen from).
pub fn latest(
    rules: &NameRules<'_>,
    body: &[u8],
    times: Option<&IndexView>,
) -> Result<Filtered, FilterError> {
    let doc = text(body)?;
    let l: Latest = serde_json::from_str(doc)
        .map_err(|e| FilterError::Unfilterable(format!("@latest: {e}")))?;
    let mut view = times
        .cloned()
        .unwrap_or_else(|| IndexView::new(Ecosystem::Go, rules.name.clone()));
    let published = time_of(times, &l.version);
    if view.version(&l.version).is_none() {
        view.add_version(&l.version, published);
    }
    let held = match rules.version(&l.version, published) {
        Ok(_) => return Ok(done(body, None, Hidden::default(), view)),
        Err(h) => h,
    };
    let mut hidden = Hidden::default();
    hidden.add(held.reason);
    let best = view
        .versions()
        .iter()
        .filter(|f| rules.version(&f.version, f.published).is_ok())
        .filter_map(|f| {
            let g = GoVersion::parse(&f.version)?;
            let release = g.v.pre.is_empty();
            let compatible = !f.version.ends_with("+incompatible");
            Some(((release, compatible, g), f))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, f)| f.clone());
    let Some(best) = best else {
        return Err(FilterError::NothingAllowed(held.reason));
    };
    let mut out = format!("{{\"Version\":{}", quote(&best.version));
    if let Some(t) = best.published {
        out.push_str(&format!(",\"Time\":{}", quote(&format_rfc3339(t))));
    }
    out.push('}');
    Ok(done(body, Some(out), hidden, view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::classify::IndexForm;
    use crate::packages::compile::tests::compile_yaml;
    use crate::packages::compile::PackagePolicy;
    use crate::packages::decide::PackageReason;
    use crate::packages::filter::filter;
    use crate::packages::name::normalize;

    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 86400;

    fn policy() -> PackagePolicy {
        compile_yaml("packages:\n  - id: go\n    owner: o\n    reason: r\n    ecosystem: go\n    min_age: 3d\n    allow: [\"golang.org/x/text >=v0.3.0, <v1.0.0\"]\n", &[]).unwrap()
    }

    fn times(vs: &[(&str, i64)]) -> IndexView {
        let mut v = IndexView::new(
            Ecosystem::Go,
            normalize(Ecosystem::Go, "golang.org/x/text").unwrap(),
        );
        for (ver, t) in vs {
            v.add_version(ver, Some(*t));
        }
        v
    }

    #[test]
    fn list_and_latest() {
        let p = policy();
        let name = normalize(Ecosystem::Go, "golang.org/x/text").unwrap();
        let r = p.rules(None, Ecosystem::Go, &name, NOW);
        let t = times(&[
            ("v0.1.0", NOW - 900 * DAY),
            ("v0.3.0", NOW - 500 * DAY),
            ("v0.4.0-rc.1", NOW - 100 * DAY),
            ("v0.14.0", NOW - DAY),
        ]);
        let body = "v0.1.0\nv0.3.0\nv0.4.0-rc.1\nv0.14.0\nv1.0.0\n";
        let f = filter(&r, IndexForm::GoList, body.as_bytes(), Some(&t)).unwrap();
        assert_eq!(
            std::str::from_utf8(&f.body).unwrap(),
            "v0.3.0\nv0.4.0-rc.1\n"
        );
        assert_eq!(f.hidden.get(PackageReason::VersionNotApproved), 2);
        assert_eq!(f.hidden.get(PackageReason::TooNew), 1);
        let latest =
            r#"{"Version":"v0.14.0","Time":"2026-01-01T00:00:00Z","Origin":{"VCS":"git"}}"#;
        let f = filter(&r, IndexForm::GoLatest, latest.as_bytes(), Some(&t)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&f.body).unwrap();
        assert_eq!(v["Version"], "v0.3.0", "releases before pre-releases");
        assert_eq!(v["Time"], format_rfc3339(NOW - 500 * DAY));
        let ok = r#"{"Version":"v0.3.0","Time":"2020-01-01T00:00:00Z"}"#;
        let f = filter(&r, IndexForm::GoLatest, ok.as_bytes(), Some(&t)).unwrap();
        assert!(!f.rewritten);
        let none = times(&[("v0.14.0", NOW - DAY)]);
        assert_eq!(
            filter(&r, IndexForm::GoLatest, latest.as_bytes(), Some(&none)).unwrap_err(),
            FilterError::NothingAllowed(PackageReason::TooNew)
        );
        assert!(matches!(
            filter(&r, IndexForm::GoLatest, b"v0.1.0", None),
            Err(FilterError::Unfilterable(_))
        ));
        assert!(matches!(
            filter(&r, IndexForm::GoList, b"v0.1.0 extra\n", None),
            Err(FilterError::Unfilterable(_))
        ));
        // Without times, time_unknown (deny) holds every listed version.
        let f = filter(&r, IndexForm::GoList, body.as_bytes(), None).unwrap();
        assert_eq!(f.hidden.get(PackageReason::TimeUnknown), 3);
    }
}
