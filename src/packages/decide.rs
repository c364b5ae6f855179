//! The one package decision (DESIGN "Which reason"): given the policy, the
//! client, a classified request, `now`, and for a download the index's
//! [`IndexView`], allow or deny with the reason, the set that decided, and
//! "did you mean" for an unapproved name close to an approved one.
//!
//! Precedence, each sentence a test below:
//! 1. A `deny` entry of any set, for any client, expired or not, beats
//!    every allow: without versions it denies the name, with versions
//!    those versions (`package_denied`).
//! 2. A name no applicable set (client matches, not expired) allows is
//!    `package_not_approved`; if only expired sets allow it,
//!    `package_set_expired`.
//! 3. An index of an approved name is allowed, and filtered.
//! 4. A download (or per-version metadata) needs the index view: a version
//!    or file the index does not list is `package_not_listed`.
//! 5. The version must satisfy an applicable allow entry's constraint and
//!    be at least that entry's `min_age` old by the registry's time; the
//!    first entry that admits it wins. Otherwise the reason is the nearest
//!    miss: `package_too_new` (a constraint matched, the version is too
//!    young), `package_time_unknown` (a constraint matched, no time and
//!    `time_unknown: deny`; `min_age: 0d` needs no time), else
//!    `package_version_not_approved`.
//! 6. With sha256 pins on the admitting entries, only a file whose index
//!    digest is pinned downloads (`package_integrity_mismatch`); the
//!    caller also checks the body against [`PackageDecision::verify_sha256`].
//!
//! Owns: that order. Does not own: the response (the proxy maps a reason to
//! a status and body), filtering documents (`filter`), which uses
//! [`NameRules`] so a filtered index and a download agree.

use super::classify::{IndexForm, Kind, PackageRef};
use super::compile::{AllowEntry, DenyEntry, PackagePolicy, PackageSet};
use super::name::PackageName;
use super::raw::TimeUnknown;
use super::version::Version;
use super::view::{FileFacts, IndexView};
use super::Ecosystem;

/// Largest edit distance "did you mean" suggests across.
pub const DID_YOU_MEAN_DISTANCE: usize = 2;

/// The package reasons of DESIGN; `as_str` is the log's and
/// `X-Egressd-Reason`'s spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PackageReason {
    NotApproved,
    VersionNotApproved,
    TooNew,
    TimeUnknown,
    Denied,
    SetExpired,
    NotListed,
    IntegrityMismatch,
    IndexUnfilterable,
    Unparseable,
    /// A publish (npm `PUT`, a PyPI upload, `cargo publish`) no exception
    /// names.
    Publish,
}

impl PackageReason {
    pub const ALL: [PackageReason; 11] = [
        PackageReason::NotApproved,
        PackageReason::VersionNotApproved,
        PackageReason::TooNew,
        PackageReason::TimeUnknown,
        PackageReason::Denied,
        PackageReason::SetExpired,
        PackageReason::NotListed,
        PackageReason::IntegrityMismatch,
        PackageReason::IndexUnfilterable,
        PackageReason::Unparseable,
        PackageReason::Publish,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PackageReason::NotApproved => "package_not_approved",
            PackageReason::VersionNotApproved => "package_version_not_approved",
            PackageReason::TooNew => "package_too_new",
            PackageReason::TimeUnknown => "package_time_unknown",
            PackageReason::Denied => "package_denied",
            PackageReason::SetExpired => "package_set_expired",
            PackageReason::NotListed => "package_not_listed",
            PackageReason::IntegrityMismatch => "package_integrity_mismatch",
            PackageReason::IndexUnfilterable => "package_index_unfilterable",
            PackageReason::Unparseable => "package_unparseable",
            PackageReason::Publish => "package_publish",
        }
    }

    /// The HTTP status DESIGN gives it: 502 for an index egressd could not
    /// filter (the registry's fault), 403 for every policy denial. The
    /// policy's status table ([`Reason::status`](crate::policy::Reason::status))
    /// reads the package reasons' statuses here.
    pub fn status(self) -> u16 {
        match self {
            PackageReason::IndexUnfilterable => 502,
            _ => 403,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny(PackageReason),
    /// A download or per-version document of an approved name: decide again
    /// with the package's [`IndexView`] (the caller fetches the index the
    /// client did not ask for first, as egressd's own request).
    NeedIndex,
}

/// The package decision for one request.
#[derive(Debug, Clone)]
pub struct PackageDecision<'p> {
    pub verdict: Verdict,
    /// The set that allowed, or whose entry held or denied.
    pub set: Option<&'p PackageSet>,
    /// For `package_not_approved`: an approved name (as the policy wrote
    /// it) within [`DID_YOU_MEAN_DISTANCE`] edits.
    pub did_you_mean: Option<&'p str>,
    /// For `package_denied`: the deny entry's `reason:`.
    pub deny_reason: Option<&'p str>,
    /// An allowed index: filter the response (in the form its
    /// `Content-Type` says, see [`IndexForm::from_content_type`]).
    pub filter: Option<IndexForm>,
    /// An allowed download with sha256 pins: the body's digest must be one
    /// of these, or the transfer is cut (`package_integrity_mismatch`).
    pub verify_sha256: Vec<[u8; 32]>,
}

impl<'p> PackageDecision<'p> {
    fn new(verdict: Verdict) -> Self {
        PackageDecision {
            verdict,
            set: None,
            did_you_mean: None,
            deny_reason: None,
            filter: None,
            verify_sha256: Vec::new(),
        }
    }
    fn deny(reason: PackageReason, set: Option<&'p PackageSet>) -> Self {
        PackageDecision {
            set,
            ..Self::new(Verdict::Deny(reason))
        }
    }
    pub fn reason(&self) -> Option<PackageReason> {
        match self.verdict {
            Verdict::Deny(r) => Some(r),
            _ => None,
        }
    }
}

/// The reason phrase of a package denial (DESIGN "Statuses"), the one
/// place pip shows: `Forbidden (egressd: <reason> <name>[@<version>][; did
/// you mean <name>?])`. Names and versions are ASCII by their parsers.
pub fn deny_phrase(
    reason: PackageReason,
    name: &str,
    version: Option<&str>,
    did_you_mean: Option<&str>,
) -> String {
    let mut s = format!("Forbidden (egressd: {} {name}", reason.as_str());
    if let Some(v) = version {
        s.push('@');
        s.push_str(v);
    }
    if let Some(d) = did_you_mean {
        s.push_str("; did you mean ");
        s.push_str(d);
        s.push('?');
    }
    s.push(')');
    s
}

/// A version the rules admit.
#[derive(Debug, Clone)]
pub struct VersionOk<'p> {
    pub set: &'p PackageSet,
    /// Pinned digests; empty when an admitting entry pins nothing.
    pub pins: Vec<[u8; 32]>,
}

impl VersionOk<'_> {
    /// Whether a file with this index digest may download.
    pub fn file_allowed(&self, sha256: Option<&[u8; 32]>) -> bool {
        match sha256 {
            _ if self.pins.is_empty() => true,
            Some(h) => self.pins.contains(h),
            // Pinned, and the index gives no sha256 (npm, Go): the body
            // check decides.
            None => true,
        }
    }
}

/// A version the rules hold back.
#[derive(Debug, Clone, Copy)]
pub struct Held<'p> {
    pub reason: PackageReason,
    pub set: Option<&'p PackageSet>,
}

/// The policy's rules for one (client, ecosystem, name) at `now`, resolved
/// once: a filter asks them for every version of a document.
#[derive(Debug, Clone)]
pub struct NameRules<'p> {
    policy: &'p PackagePolicy,
    pub ecosystem: Ecosystem,
    pub name: PackageName,
    now: i64,
    allows: Vec<(&'p PackageSet, &'p AllowEntry)>,
    expired: Vec<(&'p PackageSet, &'p AllowEntry)>,
    denies: Vec<(&'p PackageSet, &'p DenyEntry)>,
    /// [`NameRules::denies_only`]: only `deny:` entries hold a version.
    denies_only: bool,
}

/// Whether a download asked for at `at` (`None`: by name only) is where
/// the index lists `file` (its `.metadata` beside it). A file the index
/// lists without a place cannot be asked for at one.
fn listed_here(file: &FileFacts, at: Option<&str>, metadata: bool) -> bool {
    let Some(at) = at else {
        return true;
    };
    let Some(listed) = file.at.as_deref() else {
        return false;
    };
    if metadata {
        at.strip_suffix(".metadata") == Some(listed)
    } else {
        at == listed
    }
}

impl PackagePolicy {
    /// The rules that apply to `name` for `client` (an index into the
    /// policy's clients, `None` for an unnamed client) at `now`.
    pub fn rules(
        &self,
        client: Option<u32>,
        eco: Ecosystem,
        name: &PackageName,
        now: i64,
    ) -> NameRules<'_> {
        let mut allows = Vec::new();
        let mut expired = Vec::new();
        for &r in self.allows_of(eco, name) {
            let (set, entry) = self.allow_entry(r);
            if !set.applies_to(client) {
                continue;
            }
            if set.is_expired(now) {
                expired.push((set, entry));
            } else {
                allows.push((set, entry));
            }
        }
        let denies = self
            .denies_of(eco, name)
            .iter()
            .map(|&r| self.deny_entry(r))
            .collect();
        NameRules {
            policy: self,
            ecosystem: eco,
            name: name.clone(),
            now,
            allows,
            expired,
            denies,
            denies_only: false,
        }
    }

    /// The decision for a classified package request. `view`: the index of
    /// `r.name` as the registry (or mirror) serves it; needed for downloads
    /// and per-version metadata, ignored otherwise.
    pub fn decide<'p>(
        &'p self,
        client: Option<u32>,
        r: &PackageRef,
        now: i64,
        view: Option<&IndexView>,
    ) -> PackageDecision<'p> {
        let rules = self.rules(client, r.ecosystem, &r.name, now);
        if let Err(d) = rules.name_decision(client) {
            return d;
        }
        let first_set = rules.allows.first().map(|(s, _)| *s);
        let (filename, metadata, at) = match &r.kind {
            Kind::Index(form) => {
                return PackageDecision {
                    set: first_set,
                    filter: Some(*form),
                    ..PackageDecision::new(Verdict::Allow)
                }
            }
            Kind::Meta(m) if !m.version_scoped() => {
                return PackageDecision {
                    set: first_set,
                    ..PackageDecision::new(Verdict::Allow)
                }
            }
            Kind::Meta(_) => (None, false, None),
            Kind::Artifact(a) => (Some(a.filename.as_str()), a.metadata, a.at.as_deref()),
        };
        let Some(version) = r.version.as_deref() else {
            return PackageDecision::deny(PackageReason::NotListed, first_set);
        };
        let Some(view) = view.filter(|v| v.ecosystem == r.ecosystem && v.name == r.name) else {
            return PackageDecision {
                set: first_set,
                ..PackageDecision::new(Verdict::NeedIndex)
            };
        };
        let Some(facts) = view.version(version) else {
            return PackageDecision::deny(PackageReason::NotListed, first_set);
        };
        let file = match filename {
            Some(f) => match facts.file(f) {
                Some(file) if listed_here(file, at, metadata) => Some(file),
                _ => return PackageDecision::deny(PackageReason::NotListed, first_set),
            },
            None => None,
        };
        let published = file.and_then(|f| f.published).or(facts.published);
        version_decision(
            &rules,
            version,
            published,
            file,
            filename.is_some() && !metadata,
        )
    }

    /// "did you mean": the approved name (for this client, in a live set)
    /// nearest to `name` within [`DID_YOU_MEAN_DISTANCE`], ties to the
    /// first in policy order.
    pub fn did_you_mean(
        &self,
        client: Option<u32>,
        eco: Ecosystem,
        name: &PackageName,
        now: i64,
    ) -> Option<&str> {
        let n = name.as_str();
        let mut best: Option<(usize, &str)> = None;
        for set in &self.sets {
            if set.ecosystem != eco || !set.applies_to(client) || set.is_expired(now) {
                continue;
            }
            for a in &set.allow {
                let cand = a.name.as_str();
                // Cheap bound first: the distance is at least the length
                // difference, and this runs for every denied request.
                if cand.len().abs_diff(n.len()) > DID_YOU_MEAN_DISTANCE || cand == n {
                    continue;
                }
                let d = strsim::levenshtein(cand, n);
                if d <= DID_YOU_MEAN_DISTANCE && best.is_none_or(|(b, _)| d < b) {
                    best = Some((d, a.written.as_str()));
                }
            }
        }
        best.map(|(_, w)| w)
    }
}

impl<'p> NameRules<'p> {
    /// Whether the name itself may be served to this client.
    fn name_decision(&self, client: Option<u32>) -> Result<(), PackageDecision<'p>> {
        if let Some((set, d)) = self.denies.iter().find(|(_, d)| d.versions.is_any()) {
            return Err(PackageDecision {
                deny_reason: d.reason.as_deref(),
                ..PackageDecision::deny(PackageReason::Denied, Some(set))
            });
        }
        if !self.allows.is_empty() {
            return Ok(());
        }
        if let Some((set, _)) = self.expired.first() {
            return Err(PackageDecision::deny(PackageReason::SetExpired, Some(set)));
        }
        Err(PackageDecision {
            did_you_mean: self
                .policy
                .did_you_mean(client, self.ecosystem, &self.name, self.now),
            ..PackageDecision::deny(PackageReason::NotApproved, None)
        })
    }

    /// Whether any live allow entry applies (the name is approved and not
    /// denied outright).
    pub fn name_allowed(&self) -> bool {
        !self.allows.is_empty() && !self.denies.iter().any(|(_, d)| d.versions.is_any())
    }

    fn deny_reason_for(&self, version: &str) -> Option<&'p str> {
        let v = Version::parse(self.ecosystem, version).ok()?;
        self.denies
            .iter()
            .find(|(_, d)| d.versions.matches(&v))
            .and_then(|(_, d)| d.reason.as_deref())
    }

    /// The rules `mode: report` filters an index of an approved name by: a
    /// version is held only by a `deny:` entry (the one version denial
    /// report mode enforces, so the index never offers what a download
    /// would refuse); every other version is kept, unpinned. A name no live
    /// set approves keeps the ordinary rules (its index is not filtered).
    pub fn denies_only(&self) -> NameRules<'p> {
        NameRules {
            denies_only: true,
            ..self.clone()
        }
    }

    /// For [`NameRules::denies_only`]: what a version no `deny:` entry
    /// holds gets.
    fn kept(&self) -> Option<VersionOk<'p>> {
        let (set, _) = self.allows.first().filter(|_| self.denies_only)?;
        Some(VersionOk {
            set,
            pins: Vec::new(),
        })
    }

    /// The verdict on one version published at `published` (registry time,
    /// Unix seconds).
    pub fn version(
        &self,
        version: &str,
        published: Option<i64>,
    ) -> Result<VersionOk<'p>, Held<'p>> {
        let Ok(v) = Version::parse(self.ecosystem, version) else {
            if let Some(ok) = self.kept() {
                return Ok(ok);
            }
            return Err(Held {
                reason: PackageReason::VersionNotApproved,
                set: self.allows.first().map(|(s, _)| *s),
            });
        };
        self.parsed(&v, published)
    }

    /// [`NameRules::version`] for an already parsed version.
    pub fn parsed(&self, v: &Version, published: Option<i64>) -> Result<VersionOk<'p>, Held<'p>> {
        if let Some((set, _)) = self.denies.iter().find(|(_, d)| d.versions.matches(v)) {
            return Err(Held {
                reason: PackageReason::Denied,
                set: Some(set),
            });
        }
        if let Some(ok) = self.kept() {
            return Ok(ok);
        }
        let mut ok: Option<VersionOk<'p>> = None;
        let mut unpinned = false;
        let mut miss: Option<Held<'p>> = None;
        for &(set, entry) in &self.allows {
            if !entry.versions.matches(v) {
                continue;
            }
            let min_age = self.policy.min_age_of(set, entry);
            let age_ok = if min_age == 0 {
                Ok(())
            } else {
                match published {
                    Some(t) if self.now.saturating_sub(t) >= min_age as i64 => Ok(()),
                    Some(_) => Err(PackageReason::TooNew),
                    None if self.policy.settings.time_unknown == TimeUnknown::Allow => Ok(()),
                    None => Err(PackageReason::TimeUnknown),
                }
            };
            match age_ok {
                Ok(()) => {
                    let o = ok.get_or_insert_with(|| VersionOk {
                        set,
                        pins: Vec::new(),
                    });
                    if entry.sha256.is_empty() {
                        unpinned = true;
                    } else {
                        o.pins.extend(entry.sha256.iter().copied());
                    }
                }
                Err(reason) => {
                    // Too new beats time unknown: it is the more certain.
                    if miss.is_none_or(|m| {
                        m.reason == PackageReason::TimeUnknown && reason == PackageReason::TooNew
                    }) {
                        miss = Some(Held {
                            reason,
                            set: Some(set),
                        });
                    }
                }
            }
        }
        if let Some(mut o) = ok {
            if unpinned {
                o.pins.clear();
            }
            return Ok(o);
        }
        if let Some(m) = miss {
            return Err(m);
        }
        if let Some((set, _)) = self.expired.iter().find(|(_, e)| e.versions.matches(v)) {
            return Err(Held {
                reason: PackageReason::SetExpired,
                set: Some(set),
            });
        }
        Err(Held {
            reason: PackageReason::VersionNotApproved,
            set: self.allows.first().map(|(s, _)| *s),
        })
    }

    /// `settings.contact`, for messages in filtered documents.
    pub fn contact(&self) -> &str {
        &self.policy.contact
    }

    /// The `min_age` of every live entry that could admit a version.
    pub(crate) fn min_ages(&self) -> impl Iterator<Item = u64> + '_ {
        self.allows
            .iter()
            .filter(|_| !self.denies_only)
            .map(|(s, e)| self.policy.min_age_of(s, e))
    }
}

/// The decision on `version` (published at `published`, its `file` when
/// a file is asked for): held, a digest that does not match, or allowed
/// with the pins a `download` must match.
fn version_decision<'p>(
    rules: &NameRules<'p>,
    version: &str,
    published: Option<i64>,
    file: Option<&crate::packages::view::FileFacts>,
    download: bool,
) -> PackageDecision<'p> {
    match rules.version(version, published) {
        Err(h) => {
            let deny_reason = (h.reason == PackageReason::Denied)
                .then(|| rules.deny_reason_for(version))
                .flatten();
            PackageDecision {
                deny_reason,
                ..PackageDecision::deny(h.reason, h.set)
            }
        }
        Ok(ok) => {
            if let Some(f) = file {
                if !ok.file_allowed(f.sha256.as_ref()) {
                    return PackageDecision::deny(PackageReason::IntegrityMismatch, Some(ok.set));
                }
            }
            let verify = if download {
                ok.pins.clone()
            } else {
                Vec::new()
            };
            PackageDecision {
                set: Some(ok.set),
                verify_sha256: verify,
                ..PackageDecision::new(Verdict::Allow)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::classify::{classify, Classified};
    use crate::packages::compile::tests::compile_yaml;
    use crate::packages::name::normalize;
    use crate::packages::view::FileFacts;

    const DAY: i64 = 86400;
    const NOW: i64 = 1_800_000_000;

    const POLICY: &str = r#"
packages:
  - id: py
    owner: o
    reason: r
    ecosystem: pypi
    min_age: 7d
    allow:
      - requests >=2.31,<3
      - { name: numpy, versions: ">=1.26", min_age: 0d }
      - { name: certifi, versions: "==2024.8.30", sha256: "1111111111111111111111111111111111111111111111111111111111111111" }
      - ultralytics
    deny:
      - { name: ultralytics, versions: "==8.3.41", reason: compromised release }
  - id: py-ci
    owner: o
    reason: r
    ecosystem: pypi
    clients: ["ci-*"]
    allow: [pytest]
  - id: old
    owner: o
    reason: r
    ecosystem: pypi
    expires: 2020-01-01
    allow: [flask]
  - id: blocked
    owner: o
    reason: r
    ecosystem: npm
    deny: [{ name: event-stream, reason: "malware, 2018" }]
    allow: ["lodash ^4"]
  - id: go
    owner: o
    reason: r
    ecosystem: go
    allow: ["golang.org/x/text >=v0.3.0"]
settings:
  packages:
    enforce: [pypi, npm, go]
    time_unknown: deny
"#;

    fn policy() -> PackagePolicy {
        compile_yaml(POLICY, &["agent", "ci-1"]).unwrap()
    }

    fn pref(host: &str, path: &str) -> PackageRef {
        match classify(
            None,
            host,
            "GET",
            path,
            Some("application/vnd.pypi.simple.v1+json"),
        ) {
            Classified::Package(p) => p,
            other => panic!("{other:?}"),
        }
    }

    fn file(name: &str, t: Option<i64>, sha: Option<u8>) -> FileFacts {
        FileFacts {
            filename: name.into(),
            published: t,
            sha256: sha.map(|b| [b; 32]),
            at: None,
        }
    }

    fn view(eco: Ecosystem, name: &str, files: &[(&str, FileFacts)]) -> IndexView {
        let mut v = IndexView::new(eco, normalize(eco, name).unwrap());
        for (ver, f) in files {
            v.add_file(ver, f.clone());
        }
        v
    }

    fn reason(d: &PackageDecision<'_>) -> Option<&'static str> {
        d.reason().map(PackageReason::as_str)
    }

    const H: &str = "/packages/aa/bb/cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

    #[test]
    fn unapproved_names_say_did_you_mean() {
        let p = policy();
        let d = p.decide(None, &pref("pypi.org", "/simple/reqeusts/"), NOW, None);
        assert_eq!(reason(&d), Some("package_not_approved"));
        assert_eq!(d.did_you_mean, Some("requests"));
        let d = p.decide(None, &pref("pypi.org", "/simple/django/"), NOW, None);
        assert_eq!(
            (reason(&d), d.did_you_mean),
            (Some("package_not_approved"), None)
        );
        // A name approved for other clients only is not a suggestion.
        let d = p.decide(None, &pref("pypi.org", "/simple/pytset/"), NOW, None);
        assert_eq!(d.did_you_mean, None);
        let d = p.decide(Some(1), &pref("pypi.org", "/simple/pytset/"), NOW, None);
        assert_eq!(d.did_you_mean, Some("pytest"));
    }

    #[test]
    fn indexes_of_approved_names_are_allowed_and_filtered() {
        let p = policy();
        let d = p.decide(None, &pref("pypi.org", "/simple/Requests/"), NOW, None);
        assert_eq!(d.verdict, Verdict::Allow);
        assert_eq!(d.filter, Some(IndexForm::PypiSimpleJson));
        assert_eq!(d.set.map(|s| &*s.id), Some("py"));
    }

    #[test]
    fn clients_and_expiry() {
        let p = policy();
        let r = pref("pypi.org", "/simple/pytest/");
        assert_eq!(
            reason(&p.decide(Some(0), &r, NOW, None)),
            Some("package_not_approved")
        );
        assert_eq!(
            reason(&p.decide(None, &r, NOW, None)),
            Some("package_not_approved")
        );
        assert_eq!(p.decide(Some(1), &r, NOW, None).verdict, Verdict::Allow);
        let r = pref("pypi.org", "/simple/flask/");
        let d = p.decide(None, &r, NOW, None);
        assert_eq!(
            (reason(&d), d.set.map(|s| &*s.id)),
            (Some("package_set_expired"), Some("old"))
        );
    }

    #[test]
    fn report_rules_hold_only_what_a_deny_entry_holds() {
        let p = policy();
        let name = |n| normalize(Ecosystem::Pypi, n).unwrap();
        let rules = p.rules(None, Ecosystem::Pypi, &name("ultralytics"), NOW);
        let report = rules.denies_only();
        let held = |r: &NameRules<'_>, v, t| r.version(v, t).err().map(|h| h.reason);
        assert_eq!(
            held(&report, "8.3.41", Some(NOW - 30 * DAY)),
            Some(PackageReason::Denied)
        );
        // Too new, no time, unparseable: held by the ordinary rules, kept
        // by report's.
        for (v, t) in [
            ("8.3.42", Some(NOW)),
            ("8.3.42", None),
            ("not a version", None),
        ] {
            assert!(held(&rules, v, t).is_some(), "{v}");
            assert_eq!(held(&report, v, t), None, "{v}");
        }
        assert!(rules.needs_times() && !report.needs_times());
        // Pins are not asked (a mismatch is still cut on download).
        let certifi = p.rules(None, Ecosystem::Pypi, &name("certifi"), NOW);
        let ok = certifi.denies_only().version("2024.8.30", None).unwrap();
        assert!(ok.pins.is_empty());
    }

    #[test]
    fn a_deny_beats_every_allow() {
        let p = policy();
        let r = pref("registry.npmjs.org", "/event-stream");
        let d = p.decide(None, &r, NOW, None);
        assert_eq!(
            (reason(&d), d.deny_reason),
            (Some("package_denied"), Some("malware, 2018"))
        );
        let r = pref(
            "files.pythonhosted.org",
            &format!("{H}/ultralytics-8.3.41-py3-none-any.whl"),
        );
        let v = view(
            Ecosystem::Pypi,
            "ultralytics",
            &[(
                "8.3.41",
                file(
                    "ultralytics-8.3.41-py3-none-any.whl",
                    Some(NOW - 100 * DAY),
                    None,
                ),
            )],
        );
        let d = p.decide(None, &r, NOW, Some(&v));
        assert_eq!(
            (reason(&d), d.deny_reason),
            (Some("package_denied"), Some("compromised release"))
        );
    }

    #[test]
    fn downloads_need_the_index_and_must_be_listed() {
        let p = policy();
        let r = pref(
            "files.pythonhosted.org",
            &format!("{H}/requests-2.32.3-py3-none-any.whl"),
        );
        assert_eq!(p.decide(None, &r, NOW, None).verdict, Verdict::NeedIndex);
        let other = view(Ecosystem::Pypi, "numpy", &[]);
        assert_eq!(
            p.decide(None, &r, NOW, Some(&other)).verdict,
            Verdict::NeedIndex,
            "a view of another package is no view"
        );
        let v = view(
            Ecosystem::Pypi,
            "requests",
            &[(
                "2.32.3",
                file("requests-2.32.3.tar.gz", Some(NOW - 30 * DAY), None),
            )],
        );
        assert_eq!(
            reason(&p.decide(None, &r, NOW, Some(&v))),
            Some("package_not_listed")
        );
        let v = view(
            Ecosystem::Pypi,
            "requests",
            &[(
                "2.32.3",
                file(
                    "requests-2.32.3-py3-none-any.whl",
                    Some(NOW - 30 * DAY),
                    None,
                ),
            )],
        );
        let d = p.decide(None, &r, NOW, Some(&v));
        assert_eq!(
            (d.verdict, d.set.map(|s| &*s.id)),
            (Verdict::Allow, Some("py"))
        );
        let r = pref(
            "files.pythonhosted.org",
            &format!("{H}/requests-2.32.4-py3-none-any.whl"),
        );
        assert_eq!(
            reason(&p.decide(None, &r, NOW, Some(&v))),
            Some("package_not_listed")
        );
    }

    #[test]
    fn a_file_the_index_lists_at_a_place_is_listed_there_only() {
        let p = policy();
        let wheel = "requests-2.32.3-py3-none-any.whl";
        let listed = format!("files.pythonhosted.org{H}/{wheel}");
        let mut f = file(wheel, Some(NOW - 30 * DAY), None);
        f.at = Some(listed.clone());
        let v = view(Ecosystem::Pypi, "requests", &[("2.32.3", f)]);
        let asked = |at: Option<&str>, metadata: bool| {
            let mut r = pref("files.pythonhosted.org", &format!("{H}/{wheel}"));
            if let Kind::Artifact(a) = &mut r.kind {
                a.at = at.map(str::to_string);
                a.metadata = metadata;
            }
            p.decide(None, &r, NOW, Some(&v))
        };
        assert_eq!(asked(Some(&listed), false).verdict, Verdict::Allow);
        assert_eq!(
            asked(Some(&format!("{listed}.metadata")), true).verdict,
            Verdict::Allow
        );
        assert_eq!(asked(None, false).verdict, Verdict::Allow, "by name");
        let elsewhere = format!(
            "files.pythonhosted.org/packages/00/00/{}/{wheel}",
            "0".repeat(60)
        );
        for (at, metadata) in [
            (elsewhere.as_str(), false),
            (&*format!("{elsewhere}.metadata"), true),
            (&*format!("pypi.org{H}/{wheel}"), false),
            (&*listed, true),
        ] {
            assert_eq!(
                reason(&asked(Some(at), metadata)),
                Some("package_not_listed"),
                "{at}"
            );
        }
        // A file listed without a place cannot be asked for at one.
        let v = view(
            Ecosystem::Pypi,
            "requests",
            &[("2.32.3", file(wheel, Some(NOW - 30 * DAY), None))],
        );
        let mut r = pref("files.pythonhosted.org", &format!("{H}/{wheel}"));
        if let Kind::Artifact(a) = &mut r.kind {
            a.at = Some(listed.clone());
        }
        assert_eq!(
            reason(&p.decide(None, &r, NOW, Some(&v))),
            Some("package_not_listed")
        );
    }

    #[test]
    fn versions_are_held_by_constraint_age_and_time() {
        let p = policy();
        let wheel = |v: &str| format!("requests-{v}-py3-none-any.whl");
        let check = |v: &str, t: Option<i64>| {
            let r = pref("files.pythonhosted.org", &format!("{H}/{}", wheel(v)));
            let vw = view(
                Ecosystem::Pypi,
                "requests",
                &[(v, file(&wheel(v), t, None))],
            );
            reason(&p.decide(None, &r, NOW, Some(&vw)))
        };
        assert_eq!(check("2.32.3", Some(NOW - 8 * DAY)), None);
        assert_eq!(
            check("2.32.3", Some(NOW - 6 * DAY)),
            Some("package_too_new")
        );
        assert_eq!(
            check("2.32.3", Some(NOW + DAY)),
            Some("package_too_new"),
            "a time in the future is not old"
        );
        assert_eq!(check("2.32.3", None), Some("package_time_unknown"));
        assert_eq!(
            check("3.0.0", Some(NOW - 100 * DAY)),
            Some("package_version_not_approved")
        );
        assert_eq!(
            check("2.33.0rc1", Some(NOW - 100 * DAY)),
            Some("package_version_not_approved")
        );
        // min_age 0d needs no time.
        let r = pref("files.pythonhosted.org", &format!("{H}/numpy-2.0.0.tar.gz"));
        let vw = view(
            Ecosystem::Pypi,
            "numpy",
            &[("2.0.0", file("numpy-2.0.0.tar.gz", None, None))],
        );
        assert_eq!(p.decide(None, &r, NOW, Some(&vw)).verdict, Verdict::Allow);
    }

    #[test]
    fn a_late_file_of_an_old_release_is_as_new_as_its_upload() {
        let p = policy();
        let r = pref(
            "files.pythonhosted.org",
            &format!("{H}/requests-2.31.0-py3-none-any.whl"),
        );
        let vw = view(
            Ecosystem::Pypi,
            "requests",
            &[
                (
                    "2.31.0",
                    file("requests-2.31.0.tar.gz", Some(NOW - 300 * DAY), None),
                ),
                (
                    "2.31.0",
                    file("requests-2.31.0-py3-none-any.whl", Some(NOW - DAY), None),
                ),
            ],
        );
        assert_eq!(
            reason(&p.decide(None, &r, NOW, Some(&vw))),
            Some("package_too_new")
        );
    }

    #[test]
    fn sha256_pins() {
        let p = policy();
        let t = Some(NOW - 100 * DAY);
        let r = pref(
            "files.pythonhosted.org",
            &format!("{H}/certifi-2024.8.30-py3-none-any.whl"),
        );
        let ok = view(
            Ecosystem::Pypi,
            "certifi",
            &[(
                "2024.8.30",
                file("certifi-2024.8.30-py3-none-any.whl", t, Some(0x11)),
            )],
        );
        let d = p.decide(None, &r, NOW, Some(&ok));
        assert_eq!(
            (d.verdict, d.verify_sha256.clone()),
            (Verdict::Allow, vec![[0x11; 32]])
        );
        let bad = view(
            Ecosystem::Pypi,
            "certifi",
            &[(
                "2024.8.30",
                file("certifi-2024.8.30-py3-none-any.whl", t, Some(0x22)),
            )],
        );
        assert_eq!(
            reason(&p.decide(None, &r, NOW, Some(&bad))),
            Some("package_integrity_mismatch")
        );
        // The .metadata of a pinned file is authorised as the file, but its
        // body is metadata: no body digest to check.
        let r = pref(
            "files.pythonhosted.org",
            &format!("{H}/certifi-2024.8.30-py3-none-any.whl.metadata"),
        );
        let d = p.decide(None, &r, NOW, Some(&ok));
        assert_eq!((d.verdict, d.verify_sha256.len()), (Verdict::Allow, 0));
        assert_eq!(
            reason(&p.decide(None, &r, NOW, Some(&bad))),
            Some("package_integrity_mismatch")
        );
    }

    #[test]
    fn go_metadata_is_by_name_and_sum_lookups_by_version() {
        let p = policy();
        let info = pref("proxy.golang.org", "/golang.org/x/text/@v/v0.1.0.info");
        assert_eq!(p.decide(None, &info, NOW, None).verdict, Verdict::Allow);
        let lookup = pref("sum.golang.org", "/lookup/golang.org/x/text@v0.1.0");
        assert_eq!(
            p.decide(None, &lookup, NOW, None).verdict,
            Verdict::NeedIndex
        );
        let mut v = IndexView::new(
            Ecosystem::Go,
            normalize(Ecosystem::Go, "golang.org/x/text").unwrap(),
        );
        v.add_version("v0.1.0", Some(NOW - 999 * DAY));
        v.add_version("v0.14.0", Some(NOW - 999 * DAY));
        assert_eq!(
            reason(&p.decide(None, &lookup, NOW, Some(&v))),
            Some("package_version_not_approved")
        );
        let ok = pref("sum.golang.org", "/lookup/golang.org/x/text@v0.14.0");
        assert_eq!(p.decide(None, &ok, NOW, Some(&v)).verdict, Verdict::Allow);
        let other = pref("proxy.golang.org", "/golang.org/x/net/@v/v0.1.0.mod");
        assert_eq!(
            reason(&p.decide(None, &other, NOW, None)),
            Some("package_not_approved")
        );
    }

    #[test]
    fn reason_phrases() {
        assert_eq!(
            deny_phrase(
                PackageReason::NotApproved,
                "reqeusts",
                None,
                Some("requests")
            ),
            "Forbidden (egressd: package_not_approved reqeusts; did you mean requests?)"
        );
        assert_eq!(
            deny_phrase(PackageReason::TooNew, "requests", Some("2.32.3"), None),
            "Forbidden (egressd: package_too_new requests@2.32.3)"
        );
        assert_eq!(PackageReason::IndexUnfilterable.status(), 502);
        assert_eq!(
            PackageReason::ALL
                .iter()
                .filter(|r| r.status() == 403)
                .count(),
            10
        );
    }

    /// The decision against a brute-force reading of the rules above, on
    /// random policies, versions and times.
    #[test]
    fn version_rules_match_a_reference_model() {
        use crate::packages::testutil::Rng;
        let mut rng = Rng::new(5);
        let versions = ["1.0.0", "1.2.0", "2.0.0", "2.1.0-beta.1", "3.0.0"];
        let ranges = ["", "^1", ">=1.2.0", "<2.0.0", "=2.0.0", "^2.1.0-beta.0"];
        for case in 0..300 {
            let mut yaml = String::from("packages:\n");
            let mut model: Vec<(bool, bool, &str, Option<u64>)> = Vec::new(); // (deny, expired, range, min_age days)
            for i in 0..1 + rng.below(4) {
                let deny = rng.chance(25);
                let expired = rng.chance(20);
                let range = ranges[rng.below(ranges.len())];
                let age = if rng.chance(50) {
                    Some(rng.below(10) as u64)
                } else {
                    None
                };
                yaml.push_str(&format!(
                    "  - id: s{i}\n    owner: o\n    reason: r\n    ecosystem: npm\n"
                ));
                if expired {
                    yaml.push_str("    expires: 2020-01-01\n");
                }
                let entry = match age {
                    Some(a) if range.is_empty() => format!("{{ name: pkg, min_age: {a}d }}"),
                    Some(a) => format!("{{ name: pkg, versions: \"{range}\", min_age: {a}d }}"),
                    None if range.is_empty() => "pkg".to_string(),
                    None => format!("\"pkg {range}\""),
                };
                if deny {
                    let d = if range.is_empty() {
                        "pkg".to_string()
                    } else {
                        format!("\"pkg {range}\"")
                    };
                    yaml.push_str(&format!("    deny: [{d}]\n"));
                } else {
                    yaml.push_str(&format!("    allow: [{entry}]\n"));
                }
                model.push((deny, expired, range, age));
            }
            let unknown_allow = rng.chance(50);
            yaml.push_str(&format!(
                "settings:\n  packages:\n    min_age: 3d\n    time_unknown: {}\n",
                if unknown_allow { "allow" } else { "deny" }
            ));
            let p = compile_yaml(&yaml, &[]).unwrap();
            let name = normalize(Ecosystem::Npm, "pkg").unwrap();
            let rules = p.rules(None, Ecosystem::Npm, &name, NOW);
            for v in versions {
                let t = match rng.below(3) {
                    0 => None,
                    _ => Some(NOW - rng.below(10) as i64 * DAY - 1),
                };
                let got = rules.version(v, t).map(|_| ()).map_err(|h| h.reason);
                let parsed = Version::parse(Ecosystem::Npm, v).unwrap();
                let m = |r: &str| {
                    super::super::version::Constraint::parse(Ecosystem::Npm, r)
                        .unwrap()
                        .matches(&parsed)
                };
                let want = if model.iter().any(|(d, _, r, _)| *d && m(r)) {
                    Err(PackageReason::Denied)
                } else {
                    let live: Vec<_> = model
                        .iter()
                        .filter(|(d, e, r, _)| !d && !e && m(r))
                        .collect();
                    let age_ok = |a: &Option<u64>| {
                        let min = a.unwrap_or(3) as i64 * DAY;
                        match t {
                            _ if min == 0 => Ok(()),
                            Some(t) if NOW - t >= min => Ok(()),
                            Some(_) => Err(PackageReason::TooNew),
                            None if unknown_allow => Ok(()),
                            None => Err(PackageReason::TimeUnknown),
                        }
                    };
                    if live.iter().any(|(_, _, _, a)| age_ok(a).is_ok()) {
                        Ok(())
                    } else if live
                        .iter()
                        .any(|(_, _, _, a)| age_ok(a) == Err(PackageReason::TooNew))
                    {
                        Err(PackageReason::TooNew)
                    } else if !live.is_empty() {
                        Err(PackageReason::TimeUnknown)
                    } else if model.iter().any(|(d, e, r, _)| !d && *e && m(r)) {
                        Err(PackageReason::SetExpired)
                    } else {
                        Err(PackageReason::VersionNotApproved)
                    }
                };
                assert_eq!(got, want, "case {case}: {v} at {t:?}\n{yaml}");
            }
        }
    }
}
