//! Raw sets and settings → a validated [`PackagePolicy`]: one pure
//! function, [`compile`], that the main policy compile calls with what it
//! already has (the files' text, the exception ids, the client list, and its
//! `${env:…}`/`${file:…}` expander). Names are normalised per ecosystem,
//! constraints parsed in the ecosystem's syntax, ids checked for
//! uniqueness across sets and exceptions, mirrors' URLs and headers
//! checked. Every error carries file:line:column; errors that concern a
//! value the serde mirror could not check alone (a name, a constraint:
//! both need the set's `ecosystem`) are located by finding the value in the
//! file's text below its set's `id:`.
//!
//! Owns: the validated model and its lints. Does not own: reading files,
//! expanding secrets (the caller's closure does), deciding (`decide`).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use globset::Glob;
use http::{HeaderName, HeaderValue};

use super::name::{normalize, PackageName};
use super::raw::{RawPackageSet, RawPackageSettings, TimeUnknown};
use super::version::{split_entry, Constraint};
use super::Ecosystem;
use crate::policy::host::parse_target;

/// One error in the package part of a policy, located in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageDiagnostic {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for PackageDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// A warning for `egressd check`: the policy loads, but says something its
/// author probably did not mean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageLint {
    pub file: PathBuf,
    pub line: usize,
    pub set: Arc<str>,
    pub kind: PackageLintKind,
    pub message: String,
}

/// Which rule a [`PackageLint`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackageLintKind {
    /// The set's ecosystem is not in `settings.packages.enforce`.
    NotEnforced,
    /// The set is past its `expires`.
    SetExpired,
    /// An allow entry a deny entry fully covers.
    CoveredByDeny,
    /// Every version approved with `min_age` 0.
    NoQuarantine,
}

/// The files' `packages:` lists, as the main compile parsed them.
pub struct SetSource<'a> {
    pub file: &'a Path,
    pub text: &'a str,
    pub sets: &'a [RawPackageSet],
}

/// Everything [`compile`] needs from the rest of the policy.
pub struct CompileInput<'a> {
    pub files: &'a [SetSource<'a>],
    /// `settings.packages` with the file (path, text) it is in.
    pub settings: Option<(&'a Path, &'a str, &'a RawPackageSettings)>,
    /// `settings.clients` ids in order: a set's `clients:` patterns resolve
    /// to indexes into this list (the main policy's `ClientIdx`).
    pub clients: &'a [&'a str],
    /// The file of an exception with this id, if there is one (ids are
    /// unique across exceptions and sets).
    pub exception_id: &'a dyn Fn(&str) -> Option<PathBuf>,
    /// Expands `${env:…}`/`${file:…}` in a mirror's injected header value.
    pub expand: &'a dyn Fn(&str) -> Result<String, String>,
    /// `settings.contact`, shown in every deny message.
    pub contact: &'a str,
}

/// A header added to requests sent to a mirror; never shown to the sandbox.
#[derive(Clone)]
pub struct MirrorHeader {
    pub name: HeaderName,
    pub value: HeaderValue,
}

impl fmt::Debug for MirrorHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: <redacted>", self.name)
    }
}

/// `settings.packages.mirrors.<ecosystem>`: where that ecosystem's
/// registry requests are sent instead.
#[derive(Debug, Clone)]
pub struct Mirror {
    pub ecosystem: Ecosystem,
    /// `https` or `http`.
    pub scheme: http::uri::Scheme,
    /// The mirror's host (normalised like every policy host) and port.
    pub host: String,
    pub port: u16,
    /// The URL's path, always ending in `/` (`/api/pypi/pypi/simple/`).
    pub path: String,
    pub inject: Vec<MirrorHeader>,
}

/// `settings.packages`, validated.
#[derive(Debug, Clone, Default)]
pub struct PackageSettings {
    pub enforce: Vec<Ecosystem>,
    /// Versions published less than this ago are held back (default 0).
    pub min_age_secs: u64,
    pub time_unknown: TimeUnknown,
    pub mirrors: Vec<Mirror>,
}

impl PackageSettings {
    pub fn enforces(&self, eco: Ecosystem) -> bool {
        self.enforce.contains(&eco)
    }
    pub fn mirror(&self, eco: Ecosystem) -> Option<&Mirror> {
        self.mirrors.iter().find(|m| m.ecosystem == eco)
    }
}

/// An `allow:` entry, validated.
#[derive(Debug, Clone)]
pub struct AllowEntry {
    pub name: PackageName,
    /// The name as the policy wrote it ("did you mean" shows this).
    pub written: String,
    pub versions: Constraint,
    /// This entry's own `min_age`, if any.
    pub min_age_secs: Option<u64>,
    /// Pinned files: with pins, only files with one of these digests download.
    pub sha256: Vec<[u8; 32]>,
    pub line: usize,
}

/// A `deny:` entry, validated. Denies beat every allow in every set, for
/// every client, also after their set expired (a deny is never loosened by
/// time).
#[derive(Debug, Clone)]
pub struct DenyEntry {
    pub name: PackageName,
    pub written: String,
    pub versions: Constraint,
    pub reason: Option<String>,
    pub line: usize,
}

/// A validated approved set.
#[derive(Debug, Clone)]
pub struct PackageSet {
    pub id: Arc<str>,
    pub owner: Arc<str>,
    pub reason: String,
    pub ticket: Option<String>,
    /// Unix seconds from which it approves nothing.
    pub expires: Option<i64>,
    pub ecosystem: Ecosystem,
    /// `None`: every client. `Some`: indexes of the clients it applies to.
    pub clients: Option<Vec<u32>>,
    pub client_patterns: Option<Vec<String>>,
    pub min_age_secs: Option<u64>,
    pub allow: Vec<AllowEntry>,
    pub deny: Vec<DenyEntry>,
    pub file: PathBuf,
    pub line: usize,
}

impl PackageSet {
    pub fn is_expired(&self, now: i64) -> bool {
        self.expires.is_some_and(|e| now >= e)
    }
    pub fn applies_to(&self, client: Option<u32>) -> bool {
        match (&self.clients, client) {
            (None, _) => true,
            (Some(list), Some(c)) => list.contains(&c),
            (Some(_), None) => false,
        }
    }
}

/// Where an entry is: (set index, entry index) into [`PackagePolicy::sets`].
pub type EntryRef = (u32, u32);

/// The package part of a compiled policy.
#[derive(Debug, Clone, Default)]
pub struct PackagePolicy {
    pub settings: PackageSettings,
    pub sets: Vec<PackageSet>,
    pub contact: String,
    pub(crate) allows: HashMap<(Ecosystem, PackageName), Vec<EntryRef>>,
    pub(crate) denies: HashMap<(Ecosystem, PackageName), Vec<EntryRef>>,
}

impl PackagePolicy {
    pub fn set(&self, id: &str) -> Option<&PackageSet> {
        self.sets.iter().find(|s| &*s.id == id)
    }
    pub fn allow_entry(&self, (s, e): EntryRef) -> (&PackageSet, &AllowEntry) {
        let set = &self.sets[s as usize];
        (set, &set.allow[e as usize])
    }
    pub fn deny_entry(&self, (s, e): EntryRef) -> (&PackageSet, &DenyEntry) {
        let set = &self.sets[s as usize];
        (set, &set.deny[e as usize])
    }
    /// The allow entries naming `name`, in policy order.
    pub fn allows_of(&self, eco: Ecosystem, name: &PackageName) -> &[EntryRef] {
        self.allows
            .get(&(eco, name.clone()))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
    /// The deny entries naming `name`, in policy order.
    pub fn denies_of(&self, eco: Ecosystem, name: &PackageName) -> &[EntryRef] {
        self.denies
            .get(&(eco, name.clone()))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
    /// The `min_age` that applies to an entry: its own, else its set's,
    /// else `settings.packages.min_age`.
    pub fn min_age_of(&self, set: &PackageSet, entry: &AllowEntry) -> u64 {
        entry
            .min_age_secs
            .or(set.min_age_secs)
            .unwrap_or(self.settings.min_age_secs)
    }
    /// Every set id, for the main compile's cross-check with exception ids
    /// that are compiled after the sets.
    pub fn set_ids(&self) -> impl Iterator<Item = &str> {
        self.sets.iter().map(|s| &*s.id)
    }
}

/// Finds values in a file's text, for errors serde could not locate.
struct Locator<'t> {
    lines: Vec<&'t str>,
}

impl<'t> Locator<'t> {
    fn new(text: &'t str) -> Self {
        Locator {
            lines: text.lines().collect(),
        }
    }

    /// The (line, column) of each `id: <value>` below `packages:`, per value.
    fn ids(&self) -> HashMap<&'t str, Vec<(usize, usize)>> {
        let start = self
            .lines
            .iter()
            .position(|l| l.trim_end() == "packages:")
            .unwrap_or(0);
        let mut out: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
        for (n, line) in self.lines.iter().enumerate().skip(start) {
            let t = line.trim_start();
            let t2 = t.strip_prefix("- ").map(str::trim_start).unwrap_or(t);
            // `- { id: x, ... }` (flow form) too.
            let t2 = t2.strip_prefix("{ ").map(str::trim_start).unwrap_or(t2);
            if let Some(rest) = t2.strip_prefix("id:") {
                let v = rest
                    .split([',', '}', '#'])
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches(|c| c == '"' || c == '\'');
                out.entry(v)
                    .or_default()
                    .push((n + 1, line.len() - t2.len() + 1));
            }
        }
        out
    }

    /// The first occurrence of `needle` at or below `line` (1-based).
    fn find_after(&self, line: usize, needle: &str) -> (usize, usize) {
        for (n, l) in self.lines.iter().enumerate().skip(line.saturating_sub(1)) {
            if let Some(c) = l.find(needle) {
                return (n + 1, c + 1);
            }
        }
        (line.max(1), 1)
    }
}

/// Validates and compiles the package sets and settings.
pub fn compile(input: &CompileInput<'_>) -> Result<PackagePolicy, Vec<PackageDiagnostic>> {
    let mut errs = Errors(Vec::new());
    let settings = match input.settings {
        Some(found) => settings(found, input.expand, &mut errs),
        None => PackageSettings::default(),
    };
    let mut c = Sets::default();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for src in input.files {
        let loc = Locator::new(src.text);
        let ids = loc.ids();
        let mut after = 0;
        for raw in src.sets {
            let id = raw.id.0.as_str();
            let at = ids
                .get(id)
                .and_then(|v| v.iter().find(|(l, _)| *l > after))
                .copied()
                .unwrap_or((1, 1));
            after = after.max(at.0);
            if let Some(prev) = seen.get(id) {
                let msg = format!(
                    "duplicate package set id {id:?} (also in {})",
                    prev.display()
                );
                errs.at(src.file, at, msg);
                continue;
            }
            if let Some(prev) = (input.exception_id)(id) {
                let msg = format!(
                    "package set id {id:?} is also an exception id (in {}); ids are unique across both",
                    prev.display()
                );
                errs.at(src.file, at, msg);
                continue;
            }
            seen.insert(id.to_string(), src.file.to_path_buf());
            let here = Here {
                file: src.file,
                loc: &loc,
                at,
                id,
            };
            if let Some(set) = c.set(input, &here, raw, &mut errs) {
                c.sets.push(set);
            }
        }
    }
    if !errs.0.is_empty() {
        return Err(errs.0);
    }
    Ok(PackagePolicy {
        settings,
        sets: c.sets,
        contact: input.contact.to_string(),
        allows: c.allows,
        denies: c.denies,
    })
}

/// The diagnostics found so far.
struct Errors(Vec<PackageDiagnostic>);

impl Errors {
    fn at(&mut self, file: &Path, (line, column): (usize, usize), message: String) {
        self.0.push(PackageDiagnostic {
            file: file.to_path_buf(),
            line,
            column,
            message,
        });
    }
}

/// Where a set is written: its file, the file's locator, the set's
/// `id:` line and column, and its id.
struct Here<'a> {
    file: &'a Path,
    loc: &'a Locator<'a>,
    at: (usize, usize),
    id: &'a str,
}

impl Here<'_> {
    /// The first occurrence of `needle` at or below the set's line.
    fn find(&self, needle: &str) -> (usize, usize) {
        self.loc.find_after(self.at.0, needle)
    }
}

/// `settings.packages`, validated.
fn settings(
    (file, text, raw): (&Path, &str, &RawPackageSettings),
    expand: &dyn Fn(&str) -> Result<String, String>,
    errs: &mut Errors,
) -> PackageSettings {
    let mut settings = PackageSettings::default();
    let loc = Locator::new(text);
    let at = loc.find_after(1, "packages:");
    if let Some(e) = &raw.enforce {
        if e.is_empty() {
            errs.at(
                file,
                loc.find_after(at.0, "enforce"),
                "settings.packages.enforce: is empty; omit it to gate no ecosystem".into(),
            );
        }
        let mut e = e.clone();
        e.sort();
        e.dedup();
        settings.enforce = e;
    }
    if let Some(d) = &raw.min_age {
        settings.min_age_secs = d.0;
    }
    settings.time_unknown = raw.time_unknown.unwrap_or_default();
    for (&eco, m) in &raw.mirrors {
        let mat = loc.find_after(at.0, &m.url);
        match mirror(eco, m, expand) {
            Ok(mi) => settings.mirrors.push(mi),
            Err(msg) => errs.at(
                file,
                mat,
                format!("settings.packages.mirrors.{}: {msg}", eco.as_str()),
            ),
        }
    }
    settings
}

/// The sets compiled so far, and their entries by name.
#[derive(Default)]
struct Sets {
    sets: Vec<PackageSet>,
    allows: HashMap<(Ecosystem, PackageName), Vec<EntryRef>>,
    denies: HashMap<(Ecosystem, PackageName), Vec<EntryRef>>,
}

impl Sets {
    /// One set, validated (`None`: it cannot be compiled at all; what is
    /// wrong is in `errs`).
    fn set(
        &mut self,
        input: &CompileInput<'_>,
        here: &Here<'_>,
        raw: &RawPackageSet,
        errs: &mut Errors,
    ) -> Option<PackageSet> {
        let (id, file, at) = (here.id, here.file, here.at);
        let owner = raw.owner.as_deref().map(str::trim).unwrap_or("");
        if owner.is_empty() {
            errs.at(file, at, format!("package set {id:?} has no owner:"));
        }
        let reason = raw.reason.as_deref().map(str::trim).unwrap_or("");
        if reason.is_empty() {
            errs.at(file, at, format!("package set {id:?} has no reason:"));
        }
        let Some(eco) = raw.ecosystem else {
            errs.at(
                file,
                at,
                format!("package set {id:?} has no ecosystem: (pypi, npm, cargo or go)"),
            );
            return None;
        };
        if raw.allow.is_empty() && raw.deny.is_empty() {
            errs.at(
                file,
                at,
                format!("package set {id:?} has no allow: and no deny: entries"),
            );
        }
        let clients = set_clients(raw, input.clients, here, errs);
        let set_idx = self.sets.len() as u32;
        let allow = self.allow(eco, set_idx, &raw.allow, here, errs);
        let deny = self.deny(eco, set_idx, &raw.deny, here, errs);
        Some(PackageSet {
            id: id.into(),
            owner: owner.into(),
            reason: reason.to_string(),
            ticket: raw.ticket.clone(),
            expires: raw.expires.as_ref().map(|d| d.0),
            ecosystem: eco,
            clients,
            client_patterns: raw.clients.clone(),
            min_age_secs: raw.min_age.as_ref().map(|d| d.0),
            allow,
            deny,
            file: file.to_path_buf(),
            line: at.0,
        })
    }

    /// A set's `allow:` entries, each indexed by name.
    fn allow(
        &mut self,
        eco: Ecosystem,
        set_idx: u32,
        raw: &[super::raw::RawAllow],
        here: &Here<'_>,
        errs: &mut Errors,
    ) -> Vec<AllowEntry> {
        let (id, file) = (here.id, here.file);
        let mut allow = Vec::new();
        for a in raw {
            let (name_text, versions_text) = match &a.short {
                Some(s) => split_entry(eco, s),
                None => (a.name.as_str(), a.versions.as_deref().unwrap_or("")),
            };
            let eat = here.find(a.short.as_deref().unwrap_or(&a.name));
            let name = match normalize(eco, name_text) {
                Ok(n) => n,
                Err(e) => {
                    errs.at(file, eat, format!("package set {id:?}: {e}"));
                    continue;
                }
            };
            if a.short.is_none() && a.versions.as_deref().is_some_and(|v| v.trim().is_empty()) {
                errs.at(file, eat, format!("package set {id:?}: {name_text}: versions: is empty; omit it to allow every version"));
                continue;
            }
            let versions = match Constraint::parse(eco, versions_text) {
                Ok(c) => c,
                Err(e) => {
                    let vat = if versions_text.is_empty() {
                        eat
                    } else {
                        here.loc.find_after(eat.0, versions_text)
                    };
                    errs.at(file, vat, format!("package set {id:?}: {name_text}: {e}"));
                    continue;
                }
            };
            self.allows
                .entry((eco, name.clone()))
                .or_default()
                .push((set_idx, allow.len() as u32));
            allow.push(AllowEntry {
                name,
                written: name_text.to_string(),
                versions,
                min_age_secs: a.min_age,
                sha256: a.sha256.clone(),
                line: eat.0,
            });
        }
        allow
    }

    /// A set's `deny:` entries, each indexed by name.
    fn deny(
        &mut self,
        eco: Ecosystem,
        set_idx: u32,
        raw: &[super::raw::RawDeny],
        here: &Here<'_>,
        errs: &mut Errors,
    ) -> Vec<DenyEntry> {
        let (id, file) = (here.id, here.file);
        let mut deny = Vec::new();
        for d in raw {
            let (name_text, versions_text) = match &d.short {
                Some(s) => split_entry(eco, s),
                None => (d.name.as_str(), d.versions.as_deref().unwrap_or("")),
            };
            let dat = here.find(d.short.as_deref().unwrap_or(&d.name));
            let name = match normalize(eco, name_text) {
                Ok(n) => n,
                Err(e) => {
                    errs.at(file, dat, format!("package set {id:?}: deny: {e}"));
                    continue;
                }
            };
            let versions = match Constraint::parse(eco, versions_text) {
                Ok(c) => c,
                Err(e) => {
                    let msg = format!("package set {id:?}: deny {name_text}: {e}");
                    errs.at(file, dat, msg);
                    continue;
                }
            };
            self.denies
                .entry((eco, name.clone()))
                .or_default()
                .push((set_idx, deny.len() as u32));
            deny.push(DenyEntry {
                name,
                written: name_text.to_string(),
                versions,
                reason: d.reason.clone(),
                line: dat.0,
            });
        }
        deny
    }
}

/// A set's `clients:` patterns resolved to indexes into `clients`
/// (`None`: every client).
fn set_clients(
    raw: &RawPackageSet,
    clients: &[&str],
    here: &Here<'_>,
    errs: &mut Errors,
) -> Option<Vec<u32>> {
    let (id, file, at) = (here.id, here.file, here.at);
    let pats = raw.clients.as_ref()?;
    if pats.is_empty() {
        errs.at(
            file,
            at,
            format!("package set {id:?}: clients: is empty; omit it to apply to every client"),
        );
        return None;
    }
    let mut idx = Vec::new();
    for p in pats {
        match Glob::new(p) {
            Ok(g) => {
                let m = g.compile_matcher();
                for (i, c) in clients.iter().enumerate() {
                    if m.is_match(c) && !idx.contains(&(i as u32)) {
                        idx.push(i as u32);
                    }
                }
            }
            Err(e) => errs.at(
                file,
                here.find(p),
                format!("package set {id:?}: bad client pattern {p:?}: {e}"),
            ),
        }
    }
    idx.sort_unstable();
    Some(idx)
}

fn mirror(
    eco: Ecosystem,
    m: &super::raw::RawMirror,
    expand: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Mirror, String> {
    let uri: http::Uri = m
        .url
        .trim()
        .parse()
        .map_err(|e| format!("url {:?} is not a URL: {e}", m.url))?;
    let scheme = match uri.scheme_str() {
        Some("https") => http::uri::Scheme::HTTPS,
        Some("http") => http::uri::Scheme::HTTP,
        _ => {
            return Err(format!(
                "url {:?} must start with https:// or http://",
                m.url
            ))
        }
    };
    let auth = uri
        .authority()
        .ok_or_else(|| format!("url {:?} has no host", m.url))?;
    if auth.as_str().contains('@') {
        return Err(format!(
            "url {:?} carries credentials; put them in inject.headers (they stay outside the sandbox)",
            m.url
        ));
    }
    if uri.query().is_some() {
        return Err(format!("url {:?} has a query string", m.url));
    }
    let host = parse_target(auth.host().trim_start_matches('[').trim_end_matches(']'))
        .map_err(|e| format!("url {:?}: {e}", m.url))?
        .to_string();
    let port = auth
        .port_u16()
        .unwrap_or(if scheme == http::uri::Scheme::HTTPS {
            443
        } else {
            80
        });
    let mut path = uri.path().to_string();
    if !path.ends_with('/') {
        path.push('/');
    }
    let mut inject = Vec::new();
    if let Some(inj) = &m.inject {
        for (name, value) in &inj.headers {
            let hn = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("invalid header name {name:?}"))?;
            let v = expand(value).map_err(|e| format!("inject {name}: {e}"))?;
            let mut hv = HeaderValue::from_str(&v)
                .map_err(|_| format!("value of header {name} is not a valid header value"))?;
            hv.set_sensitive(true);
            inject.push(MirrorHeader {
                name: hn,
                value: hv,
            });
        }
    }
    Ok(Mirror {
        ecosystem: eco,
        scheme,
        host,
        port,
        path,
        inject,
    })
}

/// Warnings for `egressd check`: an allow a deny fully covers, an
/// ecosystem with sets that `enforce` does not gate, every version of a
/// name approved with no release-age quarantine, an expired set.
pub fn lints(p: &PackagePolicy, now: i64) -> Vec<PackageLint> {
    let mut out = Vec::new();
    let mut lint = |set: &PackageSet, line: usize, kind: PackageLintKind, message: String| {
        out.push(PackageLint {
            file: set.file.clone(),
            line,
            set: set.id.clone(),
            kind,
            message,
        })
    };
    for set in &p.sets {
        if !p.settings.enforces(set.ecosystem) {
            lint(set, set.line, PackageLintKind::NotEnforced, format!(
                "package set {:?} approves {} packages, but settings.packages.enforce does not list {}: that registry's traffic is not gated",
                set.id, set.ecosystem.as_str(), set.ecosystem.as_str()
            ));
        }
        if set.is_expired(now) {
            lint(
                set,
                set.line,
                PackageLintKind::SetExpired,
                format!("package set {:?} has expired: it approves nothing", set.id),
            );
        }
        for a in &set.allow {
            for &r in p.denies_of(set.ecosystem, &a.name) {
                let (dset, d) = p.deny_entry(r);
                if a.versions.covered_by(&d.versions) {
                    lint(set, a.line, PackageLintKind::CoveredByDeny, format!(
                        "package set {:?}: allow {} {} is fully covered by deny {} {} in set {:?}: it approves nothing",
                        set.id, a.written, a.versions, d.written, d.versions, dset.id
                    ));
                }
            }
            if a.versions.is_any() && p.min_age_of(set, a) == 0 {
                lint(set, a.line, PackageLintKind::NoQuarantine, format!(
                    "package set {:?}: {} approves every version with min_age 0: a compromised release installs the minute it is published (set min_age, or pin versions)",
                    set.id, a.written
                ));
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Doc {
        #[serde(default)]
        packages: Vec<RawPackageSet>,
        settings: Option<Settings>,
    }
    #[derive(serde::Deserialize)]
    struct Settings {
        packages: Option<RawPackageSettings>,
    }

    /// Compiles one YAML document holding `packages:` and `settings:`.
    pub(crate) fn compile_yaml(
        text: &str,
        clients: &[&str],
    ) -> Result<PackagePolicy, Vec<PackageDiagnostic>> {
        let doc: Doc = serde_yaml_ng::from_str(text).expect("yaml");
        let path = Path::new("p.yaml");
        let files = [SetSource {
            file: path,
            text,
            sets: &doc.packages,
        }];
        let settings = doc
            .settings
            .as_ref()
            .and_then(|s| s.packages.as_ref())
            .map(|s| (path, text, s));
        compile(&CompileInput {
            files: &files,
            settings,
            clients,
            exception_id: &|id| (id == "pypi").then(|| PathBuf::from("exceptions.yaml")),
            expand: &|v| Ok(v.replace("${env:TOKEN}", "s3cret")),
            contact: "#security",
        })
    }

    fn errors(text: &str) -> Vec<String> {
        compile_yaml(text, &[])
            .unwrap_err()
            .into_iter()
            .map(|d| d.to_string())
            .collect()
    }

    #[test]
    fn compiles_names_constraints_and_clients() {
        let p = compile_yaml(
            r#"
packages:
  - id: py
    owner: team
    reason: deps
    ecosystem: pypi
    clients: ["ci-*"]
    min_age: 7d
    allow:
      - Requests >=2.31,<3
      - zope.interface
      - { name: numpy, versions: ">=1.26", min_age: 0d }
    deny:
      - ultralytics ==8.3.41
  - id: js
    owner: team
    reason: deps
    ecosystem: npm
    allow: ["@types%2Fnode ^20"]
settings:
  packages:
    enforce: [npm, pypi, npm]
    min_age: 3d
    mirrors:
      pypi: { url: "https://mirror.corp/api/pypi", inject: { headers: { Authorization: "Bearer ${env:TOKEN}" } } }
"#,
            &["agent-a", "ci-1", "ci-2"],
        )
        .unwrap();
        assert_eq!(p.settings.enforce, vec![Ecosystem::Pypi, Ecosystem::Npm]);
        assert_eq!(p.settings.min_age_secs, 3 * 86400);
        let py = p.set("py").unwrap();
        assert_eq!(py.clients, Some(vec![1, 2]));
        assert_eq!(py.allow[0].name.as_str(), "requests");
        assert_eq!(py.allow[0].written, "Requests");
        assert_eq!(py.allow[1].name.as_str(), "zope-interface");
        assert_eq!(p.min_age_of(py, &py.allow[0]), 7 * 86400);
        assert_eq!(p.min_age_of(py, &py.allow[2]), 0);
        let js = p.set("js").unwrap();
        assert_eq!(js.allow[0].name.as_str(), "@types/node");
        assert_eq!(p.min_age_of(js, &js.allow[0]), 3 * 86400);
        let m = p.settings.mirror(Ecosystem::Pypi).unwrap();
        assert_eq!(
            (m.host.as_str(), m.port, m.path.as_str()),
            ("mirror.corp", 443, "/api/pypi/")
        );
        assert_eq!(m.inject[0].value.to_str().unwrap(), "Bearer s3cret");
        assert!(
            !format!("{m:?}").contains("s3cret"),
            "secrets are redacted in Debug"
        );
    }

    #[test]
    fn errors_are_located_at_their_entry() {
        let text = "packages:\n  - id: a\n    owner: o\n    reason: r\n    ecosystem: cargo\n    allow:\n      - serde ^1\n      - serde.json\n      - \"tokio >>1\"\n";
        let e = errors(text);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].starts_with("p.yaml:8:9: ") && e[0].contains("not a crate name"),
            "{e:?}"
        );
        assert!(
            e[1].starts_with("p.yaml:9:") && e[1].contains("cargo version requirement"),
            "{e:?}"
        );
    }

    #[test]
    fn ids_owner_reason_and_ecosystem_are_required_and_unique() {
        let text = r#"
packages:
  - id: a
    ecosystem: pypi
    allow: [x]
  - id: b
    owner: o
    reason: r
    allow: [x]
  - id: b
    owner: o
    reason: r
    ecosystem: npm
    allow: [x]
  - id: pypi
    owner: o
    reason: r
    ecosystem: pypi
    allow: [x]
"#;
        let e = errors(text);
        assert!(
            e.iter()
                .any(|m| m.starts_with("p.yaml:3:") && m.contains("no owner")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("p.yaml:3:") && m.contains("no reason")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("p.yaml:6:") && m.contains("no ecosystem")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("p.yaml:10:") && m.contains("duplicate package set id")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("p.yaml:15:") && m.contains("also an exception id")),
            "{e:?}"
        );
    }

    #[test]
    fn mirror_urls_are_checked() {
        for (url, want) in [
            ("ftp://m/", "https:// or http://"),
            ("https://u:p@m/", "credentials"),
            ("https://m/?a=1", "query"),
        ] {
            let text =
                format!("settings:\n  packages:\n    mirrors:\n      npm: {{ url: \"{url}\" }}\n");
            let e = errors(&text);
            assert!(
                e[0].starts_with("p.yaml:4:") && e[0].contains(want),
                "{url}: {e:?}"
            );
        }
    }

    #[test]
    fn lints_name_what_the_author_probably_did_not_mean() {
        let p = compile_yaml(
            r#"
packages:
  - id: a
    owner: o
    reason: r
    ecosystem: npm
    expires: 2020-01-01
    allow:
      - left-pad
      - "lodash ^4.17.0"
    deny:
      - "lodash >=4.0.0"
settings:
  packages:
    enforce: [pypi]
"#,
            &[],
        )
        .unwrap();
        let l: Vec<String> = lints(&p, 1_700_000_000)
            .into_iter()
            .map(|l| l.message)
            .collect();
        assert!(l.iter().any(|m| m.contains("does not list npm")), "{l:?}");
        assert!(l.iter().any(|m| m.contains("has expired")), "{l:?}");
        assert!(
            l.iter()
                .any(|m| m.contains("lodash ^4.17.0 is fully covered by deny lodash")),
            "{l:?}"
        );
        assert!(
            l.iter()
                .any(|m| m.contains("left-pad approves every version with min_age 0")),
            "{l:?}"
        );
        assert_eq!(l.len(), 4, "{l:?}");
    }
}
