//! Index filtering (DESIGN "Two places, both enforced"): an index document
//! in, the same document with held versions removed out, plus the counts
//! of versions hidden per reason, a fresh `ETag`, and the registry's facts
//! (the [`IndexView`] downloads are authorised against).
//!
//! Kept entries are copied byte for byte: every format is read with its
//! byte spans (JSON through `json`, HTML anchors, text lines) and only the
//! spans of held entries are dropped or, where the format says so, edited
//! (npm: moved under `policyRestrictions`; cargo: `"yanked":true`). A
//! document that does not parse, has the wrong shape (another package's
//! document, duplicate keys, missing lists), or is over
//! [`MAX_INDEX_BYTES`] is [`FilterError::Unfilterable`]
//! (`package_index_unfilterable`): it is never passed through unfiltered.
//!
//! Documents without times (PEP 503 HTML, npm abbreviated; Go `@v/list`,
//! whose times are the `.mod` files' `Last-Modified`) take the view of
//! their timed form as `times`; without it every time is unknown and
//! `time_unknown` applies. [`NameRules::needs_times`] says whether times
//! matter at all.
//!
//! Owns: the formats. Does not own: which versions are held (`decide`'s
//! [`NameRules`]), decompression and the size bound on the wire (the
//! caller stops reading at [`MAX_INDEX_BYTES`]).

pub mod cargo;
pub mod go;
pub mod json;
pub mod npm;
pub mod pypi;

use super::classify::IndexForm;
use super::decide::{NameRules, PackageReason};
use super::view::IndexView;

/// Largest index document filtered, decompressed (DESIGN: 64 MiB).
pub const MAX_INDEX_BYTES: usize = 64 << 20;

/// How many versions hidden, per reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hidden([u32; PackageReason::ALL.len()]);

impl Hidden {
    pub fn add(&mut self, r: PackageReason) {
        let i = PackageReason::ALL
            .iter()
            .position(|x| *x == r)
            .expect("every reason is in ALL");
        self.0[i] += 1;
    }
    pub fn get(&self, r: PackageReason) -> u32 {
        PackageReason::ALL
            .iter()
            .position(|x| *x == r)
            .map_or(0, |i| self.0[i])
    }
    /// The log line's `versions_hidden`.
    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }
    /// The non-zero counts (for `egressd_package_versions_hidden_total`).
    pub fn iter(&self) -> impl Iterator<Item = (PackageReason, u32)> + '_ {
        PackageReason::ALL
            .iter()
            .zip(self.0.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| (*r, *n))
    }
}

/// A filtered index document.
#[derive(Debug, Clone)]
pub struct Filtered {
    pub body: Vec<u8>,
    /// Whether `body` differs from the upstream document.
    pub rewritten: bool,
    pub hidden: Hidden,
    /// The response's `ETag` (quoted), a digest of `body`: the caller
    /// answers every gated index with it in place of the upstream's, strips
    /// `If-None-Match`/`If-Modified-Since` towards the registry and answers
    /// `304` itself when the client's `If-None-Match` equals it, so a
    /// policy reload never leaves a client on a copy filtered by the old
    /// policy (and drops `Last-Modified` from rewritten documents).
    pub etag: String,
    /// The registry's facts from the upstream document, all versions.
    pub view: IndexView,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// Does not parse, wrong shape, or too large: `package_index_unfilterable` (502).
    #[error("index is unfilterable: {0}")]
    Unfilterable(String),
    /// Go `@latest` with no allowed version to point at: deny with this
    /// reason (403; go must not see a 404 and fall back to `direct`).
    #[error("no version is allowed ({})", .0.as_str())]
    NothingAllowed(PackageReason),
}

impl FilterError {
    pub fn reason(&self) -> PackageReason {
        match self {
            FilterError::Unfilterable(_) => PackageReason::IndexUnfilterable,
            FilterError::NothingAllowed(r) => *r,
        }
    }
}

pub(crate) fn unfilterable<T>(why: impl Into<String>) -> Result<T, FilterError> {
    Err(FilterError::Unfilterable(why.into()))
}

/// The quoted strong `ETag` of a (filtered) document body: its length
/// and CRC-32. An ETag only has to change when the body does; a collision
/// (one in 2^32 per change) would leave a client on its previous filtered
/// copy, which downloads are still authorised against afresh. CRC-32 runs
/// at memory speed (SHA-256 took a third of the 20 ms budget for a 5 MB
/// packument).
pub fn etag(body: &[u8]) -> String {
    format!("\"eg-{:08x}-{:x}\"", crc32fast::hash(body), body.len())
}

pub(crate) fn text(body: &[u8]) -> Result<&str, FilterError> {
    if body.len() > MAX_INDEX_BYTES {
        return unfilterable(format!(
            "{} bytes is over the {} MiB bound",
            body.len(),
            MAX_INDEX_BYTES >> 20
        ));
    }
    std::str::from_utf8(body).or_else(|_| unfilterable("not UTF-8"))
}

pub(crate) fn done(input: &[u8], out: Option<String>, hidden: Hidden, view: IndexView) -> Filtered {
    let (body, rewritten) = match out {
        Some(s) if s.as_bytes() != input => (s.into_bytes(), true),
        _ => (input.to_vec(), false),
    };
    Filtered {
        etag: etag(&body),
        body,
        rewritten,
        hidden,
        view,
    }
}

/// Filters one index document of `rules.name` in `form` (as its response's
/// `Content-Type` says, see [`IndexForm::from_content_type`]). `times`: the
/// view of the timed form, for the forms without times (ignored by the
/// others).
pub fn filter(
    rules: &NameRules<'_>,
    form: IndexForm,
    body: &[u8],
    times: Option<&IndexView>,
) -> Result<Filtered, FilterError> {
    if form.ecosystem() != rules.ecosystem {
        return unfilterable("document of another ecosystem");
    }
    let times = times.filter(|t| t.ecosystem == rules.ecosystem && t.name == rules.name);
    match form {
        IndexForm::PypiSimpleJson => pypi::simple_json(rules, body),
        IndexForm::PypiSimpleHtml => pypi::simple_html(rules, body, times),
        IndexForm::PypiJson => pypi::project_json(rules, body),
        IndexForm::NpmFull => npm::packument(rules, body, None),
        IndexForm::NpmAbbreviated => npm::packument(rules, body, Some(times)),
        IndexForm::CargoSparse => cargo::sparse(rules, body),
        IndexForm::GoList => go::list(rules, body, times),
        IndexForm::GoLatest => go::latest(rules, body, times),
    }
}

impl NameRules<'_> {
    /// Whether any entry that could admit a version has a `min_age`, so
    /// that publish times decide (else a document without times needs no
    /// timed companion).
    pub fn needs_times(&self) -> bool {
        self.min_ages().any(|a| a > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_counts_by_reason() {
        let mut h = Hidden::default();
        h.add(PackageReason::TooNew);
        h.add(PackageReason::TooNew);
        h.add(PackageReason::Denied);
        assert_eq!(h.get(PackageReason::TooNew), 2);
        assert_eq!(h.total(), 3);
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            vec![(PackageReason::TooNew, 2), (PackageReason::Denied, 1)]
        );
    }

    #[test]
    fn etags_are_quoted_digests_of_the_body() {
        let a = etag(b"a");
        // CRC-32 of "a" is e8b7be43 (the standard check value).
        assert_eq!(a, "\"eg-e8b7be43-1\"");
        assert_ne!(a, etag(b"b"));
        assert_eq!(a, etag(b"a"));
    }

    #[test]
    fn oversized_documents_are_refused() {
        let big = vec![b' '; MAX_INDEX_BYTES + 1];
        assert!(matches!(text(&big), Err(FilterError::Unfilterable(m)) if m.contains("64 MiB")));
    }
}
