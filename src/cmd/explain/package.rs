//! `egressd explain pkg:ECOSYSTEM/NAME[@VERSION]`: the package gate's
//! decision for a package (its index, without a version) or one version,
//! by the same [`PackagePolicy::decide`] and [`NameRules`] the proxy calls,
//! and whether the exceptions let the sandbox reach the registry at all.
//!
//! What depends on the registry is stated, not applied: explain fetches
//! nothing, so a version's `min_age` is checked at request time against
//! the registry's publish time, and a version or file the index does not
//! list is `package_not_listed` only then.
//!
//! [`PackagePolicy::decide`]: crate::packages::compile::PackagePolicy::decide
//! [`NameRules`]: crate::packages::decide::NameRules

use std::io::{self, Write};

use crate::packages::classify::{index_location, Kind, PackageRef};
use crate::packages::compile::{PackagePolicy, PackageSet};
use crate::packages::decide::{PackageReason, Verdict};
use crate::packages::name::{normalize, PackageName};
use crate::packages::version::Version;
use crate::packages::Ecosystem;
use crate::policy::{enforced, ClientIdx, Policy, Reason};
use crate::time::format_date;

/// A parsed `pkg:` target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PkgQuery {
    pub ecosystem: Ecosystem,
    /// As written.
    pub written: String,
    pub name: PackageName,
    pub version: Option<String>,
}

pub(super) const PKG_FORMS: &str = "pkg:pypi/NAME[@VERSION], pkg:npm/[@SCOPE/]NAME[@VERSION], \
     pkg:cargo/NAME[@VERSION], pkg:go/MODULE[@vVERSION]";

impl PkgQuery {
    /// `ecosystem/name[@version]` (what follows `pkg:`). The version is
    /// after the last `@` that does not start the name (npm scopes).
    pub fn parse(spec: &str) -> Result<PkgQuery, String> {
        let spec = spec.trim();
        let (eco, rest) = spec
            .split_once('/')
            .ok_or_else(|| format!("pkg:{spec}: expected {PKG_FORMS}"))?;
        let ecosystem = Ecosystem::ALL
            .into_iter()
            .find(|e| e.as_str() == eco.to_ascii_lowercase())
            .ok_or_else(|| {
                format!("pkg:{spec}: unknown ecosystem {eco:?} (pypi, npm, cargo or go)")
            })?;
        let (written, version) = match rest.rfind('@') {
            Some(i) if i > 0 => {
                let v = &rest[i + 1..];
                if v.is_empty() {
                    return Err(format!("pkg:{spec}: empty version after '@'"));
                }
                (&rest[..i], Some(v.to_string()))
            }
            _ => (rest, None),
        };
        let name = normalize(ecosystem, written).map_err(|e| format!("pkg:{spec}: {}", e.0))?;
        if let Some(v) = &version {
            Version::parse(ecosystem, v).map_err(|e| format!("pkg:{spec}: {e}"))?;
        }
        Ok(PkgQuery {
            ecosystem,
            written: written.to_string(),
            name,
            version,
        })
    }
}

/// Prints the package answer; `Ok(true)` when the package and its
/// registry are allowed (a report-mode pass is not).
pub(super) fn explain(
    policy: &Policy,
    client: Option<ClientIdx>,
    q: &PkgQuery,
    now: i64,
    out: &mut dyn Write,
) -> io::Result<bool> {
    let pp = &policy.packages;
    let eco = q.ecosystem;
    let what = match &q.version {
        Some(v) => format!("{} {}@{v}", eco.as_str(), q.name.as_str()),
        None => format!("{} {} (its index)", eco.as_str(), q.name.as_str()),
    };
    writeln!(out, "package: {what}")?;
    let gated = pp.settings.enforces(eco);
    if gated {
        writeln!(
            out,
            "gate:    {} is enforced (settings.packages.enforce); egressd inspects its registry, \
             so it needs --ca-dir",
            eco.as_str()
        )?;
    } else {
        writeln!(
            out,
            "gate:    {} is not in settings.packages.enforce: the gate does not apply and the \
             exceptions alone decide (below: what the sets would say)",
            eco.as_str()
        )?;
    }
    writeln!(out)?;
    let package_ok = decide(pp, client, q, now, out)?;
    let package_ok = match package_ok {
        Ok(()) => true,
        Err(reason) => {
            let r = Reason::from(reason);
            if !enforced(policy.settings.mode, r) && gated {
                writeln!(
                    out,
                    "         mode: report — egressd lets this through and logs it as a denial; \
                     under mode: enforce it is refused"
                )?;
            }
            false
        }
    };
    writeln!(out)?;
    let registry_ok = registry(policy, client, q, now, out)?;
    writeln!(out)?;
    let allowed = registry_ok && (package_ok || !gated);
    if allowed {
        writeln!(out, "result:  allowed")?;
    } else {
        writeln!(out, "result:  denied")?;
        writeln!(
            out,
            "         to ask for it: {}",
            if policy.settings.contact.is_empty() {
                "the policy's owners"
            } else {
                &policy.settings.contact
            }
        )?;
    }
    Ok(allowed)
}

/// The gate's decision, printed; `Err(reason)` for a denial.
fn decide(
    pp: &PackagePolicy,
    client: Option<ClientIdx>,
    q: &PkgQuery,
    now: i64,
    out: &mut dyn Write,
) -> io::Result<Result<(), PackageReason>> {
    let eco = q.ecosystem;
    // The name first, as the proxy asks for an index.
    let index = PackageRef {
        ecosystem: eco,
        name: q.name.clone(),
        version: None,
        kind: Kind::Index(index_location(eco, &q.name).form),
    };
    let d = pp.decide(client, &index, now, None);
    if let Verdict::Deny(reason) = d.verdict {
        deny_line(reason, out)?;
        if let Some(s) = d.set {
            writeln!(out, "         set      {}", set_location(s))?;
        }
        if let Some(r) = d.deny_reason {
            writeln!(out, "         because  {r}")?;
        }
        if let Some(m) = d.did_you_mean {
            writeln!(out, "         did you mean {m}?")?;
        }
        return Ok(Err(reason));
    }
    let rules = pp.rules(client, eco, &q.name, now);
    let Some(version) = &q.version else {
        return index_allowed(pp, client, q, now, out).map(Ok);
    };
    let v = Version::parse(eco, version).expect("checked when parsed");
    // Epoch 0: old enough for any min_age; the real time is the registry's.
    match rules.parsed(&v, Some(0)) {
        Err(held) => {
            version_held(pp, client, q, &v, &held, now, out)?;
            Ok(Err(held.reason))
        }
        Ok(ok) => {
            version_allowed(pp, q, &v, &ok, now, out)?;
            Ok(Ok(()))
        }
    }
}

/// The index allowed: the entries that filter it.
fn index_allowed(
    pp: &PackagePolicy,
    client: Option<ClientIdx>,
    q: &PkgQuery,
    now: i64,
    out: &mut dyn Write,
) -> io::Result<()> {
    let eco = q.ecosystem;
    writeln!(
        out,
        "  ALLOW  the index, filtered to the versions these entries approve:"
    )?;
    for &r in pp.allows_of(eco, &q.name) {
        let (set, a) = pp.allow_entry(r);
        if !set.applies_to(client) || set.is_expired(now) {
            continue;
        }
        writeln!(
            out,
            "         {} {} — set {}{}",
            a.written,
            a.versions,
            set_location(set),
            min_age_note(pp.min_age_of(set, a))
        )?;
    }
    for &r in pp.denies_of(eco, &q.name) {
        let (set, d) = pp.deny_entry(r);
        writeln!(
            out,
            "         minus deny {} {} — set {}",
            d.written,
            d.versions,
            set_location(set)
        )?;
    }
    Ok(())
}

/// A version held: by which set, and why (the deny's reason, or what is
/// approved instead).
fn version_held(
    pp: &PackagePolicy,
    client: Option<ClientIdx>,
    q: &PkgQuery,
    v: &Version,
    held: &crate::packages::decide::Held<'_>,
    now: i64,
    out: &mut dyn Write,
) -> io::Result<()> {
    let eco = q.ecosystem;
    deny_line(held.reason, out)?;
    if let Some(s) = held.set {
        writeln!(out, "         set      {}", set_location(s))?;
    }
    if held.reason == PackageReason::Denied {
        if let Some(r) = pp
            .denies_of(eco, &q.name)
            .iter()
            .map(|&r| pp.deny_entry(r).1)
            .find(|d| d.versions.matches(v))
            .and_then(|d| d.reason.as_deref())
        {
            writeln!(out, "         because  {r}")?;
        }
    } else {
        let approved: Vec<String> = pp
            .allows_of(eco, &q.name)
            .iter()
            .map(|&r| pp.allow_entry(r))
            .filter(|(s, _)| s.applies_to(client) && !s.is_expired(now))
            .map(|(_, a)| a.versions.to_string())
            .collect();
        if !approved.is_empty() {
            writeln!(out, "         approved {}", approved.join(" | "))?;
        }
    }
    Ok(())
}

/// A version allowed: the set, its entry, what is still checked at
/// request time.
fn version_allowed(
    pp: &PackagePolicy,
    q: &PkgQuery,
    v: &Version,
    ok: &crate::packages::decide::VersionOk<'_>,
    now: i64,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(out, "  ALLOW  by package set {}", set_location(ok.set))?;
    writeln!(out, "         owner    {}", ok.set.owner)?;
    writeln!(out, "         reason   {}", ok.set.reason)?;
    let expires = ok
        .set
        .expires
        .map(|t| {
            format!(
                "{} (in {} days)",
                format_date(t),
                (t - now).div_euclid(86400)
            )
        })
        .unwrap_or_else(|| "never".into());
    writeln!(out, "         expires  {expires}")?;
    if let Some(a) = ok
        .set
        .allow
        .iter()
        .find(|a| a.name == q.name && a.versions.matches(v))
    {
        writeln!(
            out,
            "         entry    {} {} ({}:{})",
            a.written,
            a.versions,
            ok.set.file.display(),
            a.line
        )?;
        let min_age = pp.min_age_of(ok.set, a);
        if min_age > 0 {
            writeln!(
                out,
                "         min_age  {}: checked at request time against the registry's \
                 publish time (explain has no registry); a younger release is \
                 package_too_new",
                duration(min_age)
            )?;
        }
    }
    if !ok.pins.is_empty() {
        writeln!(
            out,
            "         sha256   only files with one of {} pinned digest{} download",
            ok.pins.len(),
            if ok.pins.len() == 1 { "" } else { "s" }
        )?;
    }
    writeln!(
        out,
        "         the version must also be listed in the registry's index \
         (else package_not_listed)"
    )?;
    Ok(())
}

/// Whether the sandbox may reach the registry's index host at all: the
/// exceptions' decision on the request inside an intercepted tunnel.
fn registry(
    policy: &Policy,
    client: Option<ClientIdx>,
    q: &PkgQuery,
    now: i64,
    out: &mut dyn Write,
) -> io::Result<bool> {
    let loc = index_location(q.ecosystem, &q.name);
    let url = format!("https://{}{}", loc.host, loc.path);
    // npm's `%2f` is the scope separator (DESIGN), not an encoded path
    // separator the proxy refuses: the exceptions see the scope's path.
    let asked = format!("https://{}{}", loc.host, loc.path.replacen("%2f", "/", 1));
    let d = match crate::cmd::offline::decide_target(policy, client, &asked, true, now) {
        Ok(d) => d,
        Err(e) => {
            writeln!(out, "registry: {url}: {e}")?;
            return Ok(false);
        }
    };
    match d.exception {
        Some(e) if d.is_allowed() && !d.report_only => {
            writeln!(out, "registry: {url}")?;
            writeln!(out, "  ALLOW  by exception {}", super::location(e))?;
            Ok(true)
        }
        _ => {
            writeln!(out, "registry: {url}")?;
            writeln!(
                out,
                "  DENY   {}: {}",
                d.reason.as_str(),
                d.reason.describe()
            )?;
            writeln!(
                out,
                "         host access comes from exceptions: one for {} is needed too",
                loc.host
            )?;
            Ok(false)
        }
    }
}

fn deny_line(reason: PackageReason, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "  DENY   {}: {}",
        reason.as_str(),
        Reason::from(reason).describe()
    )
}

fn set_location(s: &PackageSet) -> String {
    format!("{} ({}:{})", s.id, s.file.display(), s.line)
}

fn min_age_note(secs: u64) -> String {
    if secs == 0 {
        String::new()
    } else {
        format!(
            "; min_age {} (checked at request time against the registry's publish time)",
            duration(secs)
        )
    }
}

/// Seconds as the policy writes them: whole days, hours, minutes or seconds.
fn duration(secs: u64) -> String {
    for (unit, n) in [("d", 86400), ("h", 3600), ("m", 60)] {
        if secs % n == 0 {
            return format!("{}{unit}", secs / n);
        }
    }
    format!("{secs}s")
}
