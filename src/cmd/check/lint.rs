//! `egressd check`: warnings about a policy that loaded fine but says
//! something its authors probably did not mean — exceptions that have
//! expired or are about to, wildcards that never expire or that span a public
//! suffix anyone can register names under, exceptions an earlier one
//! shadows, `cidrs` that reach non-public ranges, client patterns that match
//! no client, and credentials injected on plain HTTP; and the package sets'
//! lints ([`crate::packages::compile::lints`]: a set whose ecosystem
//! is not gated, an expired set, an allow a deny covers, every version with
//! no release-age quarantine).
//!
//! `check` also runs the policy tests beside the policy ([`super::cases`]).
//!
//! Errors (anything that stops a policy from loading) are not found here but
//! by [`crate::policy::compile`]; lint only reads a compiled [`Policy`]. Every
//! warning is conservative: a shadowing report means the later exception can
//! certainly never be the one a decision names.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use psl::Psl;

use crate::packages::compile::{self as packages, PackageLintKind};
use crate::policy::addr;
use crate::policy::host::{is_strict_subdomain, HostPattern};
use crate::policy::{Exception, Policy};
use crate::time::format_date;

pub use crate::cmd::EXPIRY_WARNING_SECS;

/// Which rule a warning comes from (stable names, e.g. for tests or a
/// future per-exception suppression list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lint {
    Expired,
    Expiring,
    WildcardNoExpiry,
    PublicSuffixWildcard,
    Shadowed,
    NonPublicCidr,
    UnknownClient,
    CleartextInject,
    PackageNotEnforced,
    PackageSetExpired,
    PackageCoveredByDeny,
    PackageNoQuarantine,
    GitPushAnything,
}

impl Lint {
    pub const ALL: [Lint; 13] = [
        Lint::Expired,
        Lint::Expiring,
        Lint::WildcardNoExpiry,
        Lint::PublicSuffixWildcard,
        Lint::Shadowed,
        Lint::NonPublicCidr,
        Lint::UnknownClient,
        Lint::CleartextInject,
        Lint::PackageNotEnforced,
        Lint::PackageSetExpired,
        Lint::PackageCoveredByDeny,
        Lint::PackageNoQuarantine,
        Lint::GitPushAnything,
    ];

    /// What the warning means, in one sentence (SARIF's rule list shows it).
    pub fn describe(self) -> &'static str {
        match self {
            Lint::Expired => "The exception has expired and matches nothing.",
            Lint::Expiring => "The exception expires within 14 days.",
            Lint::WildcardNoExpiry => {
                "A wildcard exception never expires, so it is never reviewed."
            }
            Lint::PublicSuffixWildcard => {
                "A wildcard spans a public suffix: anyone can register names under it."
            }
            Lint::Shadowed => "An earlier exception allows everything this one does.",
            Lint::NonPublicCidr => "The exception's cidrs reach non-public address ranges.",
            Lint::UnknownClient => "A client pattern matches no client in settings.clients.",
            Lint::CleartextInject => "Credentials are injected on plain HTTP (port 80).",
            Lint::PackageNotEnforced => {
                "A package set's ecosystem is not in settings.packages.enforce: its registry is not gated."
            }
            Lint::PackageSetExpired => "The package set has expired and approves nothing.",
            Lint::PackageCoveredByDeny => {
                "A deny entry covers every version an allow entry approves."
            }
            Lint::PackageNoQuarantine => {
                "Every version of a package is approved with min_age 0: a compromised release installs at once."
            }
            Lint::GitPushAnything => {
                "A git: push may force-update every ref: history on any branch can be rewritten."
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Lint::Expired => "expired",
            Lint::Expiring => "expiring",
            Lint::WildcardNoExpiry => "wildcard_no_expiry",
            Lint::PublicSuffixWildcard => "public_suffix_wildcard",
            Lint::Shadowed => "shadowed",
            Lint::NonPublicCidr => "non_public_cidr",
            Lint::UnknownClient => "unknown_client",
            Lint::CleartextInject => "cleartext_inject",
            Lint::PackageNotEnforced => "package_not_enforced",
            Lint::PackageSetExpired => "package_set_expired",
            Lint::PackageCoveredByDeny => "package_covered_by_deny",
            Lint::PackageNoQuarantine => "package_no_quarantine",
            Lint::GitPushAnything => "git_push_anything",
        }
    }
}

/// One warning, located at the exception it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub file: PathBuf,
    pub line: usize,
    pub kind: Lint,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: warning: {}",
            self.file.display(),
            self.line,
            self.message
        )
    }
}

/// Every warning for `policy` as of `now` (Unix seconds), ordered by file
/// and line.
pub fn lint(policy: &Policy, now: i64) -> Vec<Warning> {
    let mut out = Vec::new();
    for e in &policy.exceptions {
        let mut warn = |kind: Lint, message: String| {
            out.push(Warning {
                file: e.file.to_path_buf(),
                line: e.line,
                kind,
                message,
            })
        };
        expiry(e, now, &mut warn);
        wildcards(e, &mut warn);
        cidrs(e, &mut warn);
        clients(policy, e, &mut warn);
        if let Some(push) = e.git().and_then(|g| g.push.as_ref()) {
            if push.force
                && push
                    .ref_patterns
                    .iter()
                    .any(|r| r == "**" || r == "refs/**")
            {
                warn(
                    Lint::GitPushAnything,
                    format!(
                        "exception {:?}: git push.refs allows every ref and force: true: an agent may \
                         rewrite the history of main and every other branch; list the refs it writes \
                         (refs/heads/agent/**) or drop force",
                        e.id
                    ),
                );
            }
        }
        if !e.inject().is_empty() && e.ports.contains(&80) {
            let also = if e.ports.len() == 1 {
                "only port 80"
            } else {
                "port 80"
            };
            warn(
                Lint::CleartextInject,
                format!(
                    "exception {:?} injects credentials ({}) and allows {also}: on plain HTTP they \
                     cross the network unencrypted; set ports: [443]",
                    e.id,
                    header_names(e)
                ),
            );
        }
    }
    shadowed(policy, now, &mut out);
    out.extend(
        packages::lints(&policy.packages, now)
            .into_iter()
            .map(|l| Warning {
                file: l.file,
                line: l.line,
                kind: match l.kind {
                    PackageLintKind::NotEnforced => Lint::PackageNotEnforced,
                    PackageLintKind::SetExpired => Lint::PackageSetExpired,
                    PackageLintKind::CoveredByDeny => Lint::PackageCoveredByDeny,
                    PackageLintKind::NoQuarantine => Lint::PackageNoQuarantine,
                },
                message: l.message,
            }),
    );
    out.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    out
}

fn header_names(e: &Exception) -> String {
    e.inject()
        .iter()
        .map(|h| h.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn expiry(e: &Exception, now: i64, warn: &mut impl FnMut(Lint, String)) {
    let Some(t) = e.expires() else { return };
    if now >= t {
        warn(
            Lint::Expired,
            format!(
                "exception {:?} expired on {} and matches nothing; renew or remove it",
                e.id,
                format_date(t)
            ),
        );
    } else if t - now <= EXPIRY_WARNING_SECS {
        let days = (t - now + 86399) / 86400;
        let when = if days <= 1 {
            "within a day".to_string()
        } else {
            format!("in {days} days")
        };
        warn(
            Lint::Expiring,
            format!(
                "exception {:?} expires {when} ({}); renew it or let its owner ({}) know",
                e.id,
                format_date(t),
                e.owner
            ),
        );
    }
}

fn wildcards(e: &Exception, warn: &mut impl FnMut(Lint, String)) {
    let wild: Vec<&HostPattern> = e.hosts.iter().filter(|h| h.is_wildcard()).collect();
    if wild.is_empty() {
        return;
    }
    if e.expires().is_none() {
        let list = wild
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        warn(
            Lint::WildcardNoExpiry,
            format!(
                "exception {:?} is a never-expiring wildcard ({list}): a wildcard grants a whole \
                 namespace, give it expires: so it is reviewed",
                e.id
            ),
        );
    }
    for h in wild {
        if let Some(suffix) = public_suffix_under(h) {
            let section = match suffix.1 {
                psl::Type::Private => "a public suffix whose names are handed out to tenants",
                psl::Type::Icann => "a public suffix where anyone can register a name",
            };
            warn(
                Lint::PublicSuffixWildcard,
                format!(
                    "exception {:?}: {h} spans {}, {section}; list the exact names (or \
                     *.yourname.{}) instead",
                    e.id, suffix.0, suffix.0
                ),
            );
        }
    }
}

/// The public suffix a wildcard's `*` ranges over, if any: the names it
/// matches are then registrable by anyone, not only by one organisation.
/// Found by asking the public suffix list (with its private section) about
/// a name the wildcard matches: if that name's public suffix reaches the
/// wildcard's own label, or is exactly its fixed part, the `*` picks the
/// registrant.
fn public_suffix_under(p: &HostPattern) -> Option<(String, psl::Type)> {
    let fixed = p.fixed_suffix().as_str();
    let probe = match p {
        HostPattern::Exact(_) => return None,
        HostPattern::Subdomains(_) => format!("x.{fixed}"),
        HostPattern::LabelGlob { prefix, suffix, .. } => format!("{prefix}x{suffix}.{fixed}"),
    };
    let s = psl::List.suffix(probe.as_bytes())?;
    let typ = s.typ()?;
    let len = s.as_bytes().len();
    if len >= fixed.len() {
        let shown = if len > fixed.len() {
            format!("*.{fixed}")
        } else {
            fixed.to_string()
        };
        return Some((shown, typ));
    }
    None
}

fn clients(policy: &Policy, e: &Exception, warn: &mut impl FnMut(Lint, String)) {
    let Some(patterns) = e.client_patterns() else {
        return;
    };
    if policy.clients.is_empty() {
        warn(
            Lint::UnknownClient,
            format!(
                "exception {:?} is limited to clients {patterns:?}, but settings.clients defines \
                 none, so it matches nothing",
                e.id
            ),
        );
        return;
    }
    for p in patterns {
        let Ok(glob) = globset::Glob::new(p) else {
            continue;
        };
        let m = glob.compile_matcher();
        if !policy.clients.iter().any(|c| m.is_match(&*c.id)) {
            let known = policy
                .clients
                .iter()
                .map(|c| &*c.id)
                .collect::<Vec<_>>()
                .join(", ");
            warn(
                Lint::UnknownClient,
                format!(
                    "exception {:?}: client pattern {p:?} matches no client in settings.clients \
                     (defined: {known})",
                    e.id
                ),
            );
        }
    }
}

/// A non-public range with what it is, for messages.
struct Range {
    net: IpNet,
    what: &'static str,
    /// Where the IPv4 address sits inside an IPv6 range that embeds one.
    embeds_v4_at: Option<u8>,
}

fn v4(a: [u8; 4], len: u8, what: &'static str) -> Range {
    Range {
        net: IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), len).expect("valid prefix")),
        what,
        embeds_v4_at: None,
    }
}

fn v6(s: &str, len: u8, what: &'static str, embeds_v4_at: Option<u8>) -> Range {
    Range {
        net: IpNet::V6(Ipv6Net::new(s.parse().expect("valid address"), len).expect("valid prefix")),
        what,
        embeds_v4_at,
    }
}

/// The non-public ranges of `addr.rs`, as ranges. A unit test checks each
/// against `addr::classify`, so the two cannot drift apart silently.
fn non_public_ranges() -> Vec<Range> {
    vec![
        v4([0, 0, 0, 0], 8, "unspecified"),
        v4([10, 0, 0, 0], 8, "private"),
        v4([100, 64, 0, 0], 10, "carrier-grade NAT"),
        v4([127, 0, 0, 0], 8, "loopback"),
        v4(
            [169, 254, 0, 0],
            16,
            "link-local, incl. cloud metadata 169.254.169.254",
        ),
        v4([172, 16, 0, 0], 12, "private"),
        v4([192, 0, 0, 0], 24, "IETF protocol assignments"),
        v4([192, 0, 2, 0], 24, "documentation"),
        v4([192, 88, 99, 0], 24, "6to4 relay anycast"),
        v4([192, 168, 0, 0], 16, "private"),
        v4([198, 18, 0, 0], 15, "benchmarking"),
        v4([198, 51, 100, 0], 24, "documentation"),
        v4([203, 0, 113, 0], 24, "documentation"),
        v4([224, 0, 0, 0], 4, "multicast"),
        v4([240, 0, 0, 0], 4, "reserved, incl. broadcast"),
        v6("::", 128, "unspecified", None),
        v6("::1", 128, "loopback", None),
        v6("::", 96, "IPv4-compatible, embeds IPv4", Some(96)),
        v6("::ffff:0:0", 96, "IPv4-mapped, embeds IPv4", Some(96)),
        v6("64:ff9b::", 96, "NAT64, embeds IPv4", Some(96)),
        v6("64:ff9b:1::", 48, "local-use NAT64, embeds IPv4", Some(96)),
        v6("100::", 64, "discard-only", None),
        v6("2001::", 32, "Teredo, embeds an obfuscated IPv4", None),
        v6("2001::", 23, "IETF protocol assignments", None),
        v6("2001:db8::", 32, "documentation", None),
        v6("2002::", 16, "6to4, embeds IPv4", Some(16)),
        v6("3fff::", 20, "documentation", None),
        v6("fc00::", 7, "unique-local", None),
        v6("fe80::", 10, "link-local", None),
        v6("fec0::", 10, "site-local (deprecated)", None),
        v6("ff00::", 8, "multicast", None),
    ]
}

/// The IPv4 network an IPv6 network inside an embedding range stands for,
/// when its prefix reaches into the embedded address.
fn embedded_net(net: &Ipv6Net, at: u8) -> Option<Ipv4Net> {
    if net.prefix_len() < at {
        return None;
    }
    let bits = u128::from(net.network());
    let shift = 128 - at as u32 - 32;
    let a = Ipv4Addr::from((bits >> shift) as u32);
    let len = (net.prefix_len() - at).min(32);
    Ipv4Net::new(a, len).ok().map(|n| n.trunc())
}

/// What non-public space a destination range reaches, as phrases: the
/// narrowest non-public range it lies inside, or the ranges it covers.
pub fn non_public_overlaps(net: &IpNet) -> Vec<String> {
    let mut inside: Option<(u8, String)> = None;
    let mut covers = Vec::new();
    for r in non_public_ranges() {
        if r.net.contains(net) {
            let phrase = match (net, r.embeds_v4_at) {
                // Judged by the IPv4 range it embeds, as addr.rs judges addresses.
                (IpNet::V6(n6), Some(at)) => match embedded_net(n6, at) {
                    Some(n4) => {
                        let inner = non_public_overlaps(&IpNet::V4(n4));
                        if inner.is_empty() {
                            continue;
                        }
                        format!("{} ({}: {n4}, which {})", r.net, r.what, inner.join("; "))
                    }
                    None => format!("{} ({})", r.net, r.what),
                },
                _ => format!("{} ({})", r.net, r.what),
            };
            if inside
                .as_ref()
                .is_none_or(|(len, _)| r.net.prefix_len() > *len)
            {
                inside = Some((r.net.prefix_len(), phrase));
            }
        } else if net.contains(&r.net) {
            covers.push(format!("{} ({})", r.net, r.what));
        }
    }
    let mut out = Vec::new();
    if let Some((_, i)) = inside {
        out.push(format!("is inside {i}"));
    } else if covers.is_empty() {
        if let Some(class) = addr::classify(net.network()) {
            out.push(format!("is inside non-public space ({})", class.as_str()));
        }
    }
    if !covers.is_empty() {
        const SHOWN: usize = 4;
        let n = covers.len();
        let mut s = format!("covers {}", covers[..n.min(SHOWN)].join(", "));
        if n > SHOWN {
            s.push_str(&format!(" and {} more non-public ranges", n - SHOWN));
        }
        out.push(s);
    }
    out
}

fn cidrs(e: &Exception, warn: &mut impl FnMut(Lint, String)) {
    for net in &e.cidrs {
        let found = non_public_overlaps(net);
        if !found.is_empty() {
            warn(
                Lint::NonPublicCidr,
                format!(
                    "exception {:?}: cidr {net} {}; names in hosts: may resolve there and IP \
                     literals in it are dialled — make sure that is meant",
                    e.id,
                    found.join(" and ")
                ),
            );
        }
    }
}

/// Whether pattern `a` matches every name pattern `b` matches.
fn host_covers(a: &HostPattern, b: &HostPattern) -> bool {
    use HostPattern::*;
    let below_or_eq = |name: &str, sfx: &str| name == sfx || is_strict_subdomain(name, sfx);
    match (a, b) {
        (Exact(x), Exact(y)) => x == y,
        (Exact(_), _) => false,
        (Subdomains(s), Exact(h)) => is_strict_subdomain(h.as_str(), s.as_str()),
        (Subdomains(s), Subdomains(t)) => below_or_eq(t.as_str(), s.as_str()),
        (Subdomains(s), LabelGlob { rest, .. }) => below_or_eq(rest.as_str(), s.as_str()),
        (LabelGlob { .. }, Exact(h)) => a.matches(h),
        (LabelGlob { .. }, Subdomains(_)) => false,
        (
            LabelGlob {
                prefix: p1,
                suffix: s1,
                rest: r1,
            },
            LabelGlob {
                prefix: p2,
                suffix: s2,
                rest: r2,
            },
        ) => r1 == r2 && p2.starts_with(&**p1) && s2.ends_with(&**s1),
    }
}

fn subset<T: PartialEq>(small: &[T], big: &[T]) -> bool {
    small.iter().all(|x| big.contains(x))
}

/// Whether `a` (earlier) allows every request `b` allows, so that `b` can
/// never be the exception a decision names. Conservative: unsure → false.
fn shadows(a: &Exception, b: &Exception, now: i64) -> bool {
    if a.is_expired(now) {
        return false;
    }
    // `b` would outlive `a` and be named once `a` expires.
    match (a.expires(), b.expires()) {
        (None, _) => {}
        (Some(ta), Some(tb)) if ta >= tb => {}
        _ => return false,
    }
    // `decide` prefers an exception that needs interception when interception
    // is on, and one that does not when it is off: only like shadows like.
    if a.needs_inspection() != b.needs_inspection() {
        return false;
    }
    // `git:` narrows what a host allows to some repositories' endpoints
    // and judges pushes: not compared here (unsure → false).
    if a.git().is_some() {
        return false;
    }
    // `body:` on `a` refuses some bodies a later exception may allow: the
    // body is judged over both (not compared here, unsure → false).
    if a.body().is_some() {
        return false;
    }
    match (a.clients(), b.clients()) {
        (None, _) => {}
        (Some(ca), Some(cb)) if subset(cb, ca) => {}
        _ => return false,
    }
    if !b
        .hosts
        .iter()
        .all(|hb| a.hosts.iter().any(|ha| host_covers(ha, hb)))
    {
        return false;
    }
    if !b
        .cidrs
        .iter()
        .all(|nb| a.cidrs.iter().any(|na| na.contains(nb)))
    {
        return false;
    }
    if !subset(&b.ports, &a.ports) || !subset(b.dns_types(), a.dns_types()) {
        return false;
    }
    match (a.methods(), b.methods()) {
        (None, _) => {}
        (Some(ma), Some(mb)) if subset(mb, ma) => {}
        _ => return false,
    }
    match (a.paths(), b.paths()) {
        (None, _) => {}
        (Some(_), Some(_)) => {
            let any = a.path_patterns().iter().any(|p| p == "/**");
            if !any && !subset(b.path_patterns(), a.path_patterns()) {
                return false;
            }
        }
        _ => return false,
    }
    true
}

/// Finds, for each exception, the first earlier one that shadows it. Earlier
/// exceptions are looked up through an index of what they name (by host
/// pattern and by network), so a 100k-exception policy is checked in about
/// the time it takes to load.
fn shadowed(policy: &Policy, now: i64, out: &mut Vec<Warning>) {
    let ex = &policy.exceptions;
    let index = Named::of(ex);
    let mut cands = Vec::new();
    for (j, b) in ex.iter().enumerate() {
        if b.is_expired(now) || b.clients().is_some_and(|c| c.is_empty()) {
            // Already reported as expired / matching no client.
            continue;
        }
        cands.clear();
        index.candidates(b, &mut cands);
        cands.sort_unstable();
        cands.dedup();
        if let Some(&i) = cands
            .iter()
            .take_while(|&&i| i < j)
            .find(|&&i| shadows(&ex[i], b, now))
        {
            let a = &ex[i];
            out.push(Warning {
                file: b.file.to_path_buf(),
                line: b.line,
                kind: Lint::Shadowed,
                message: format!(
                    "exception {:?} is shadowed by {:?} ({}:{}), which comes first and allows \
                     everything it allows, so it is never the exception a decision names; merge \
                     or remove one",
                    b.id,
                    a.id,
                    a.file.display(),
                    a.line
                ),
            });
        }
    }
}

/// The exceptions by what they name: host patterns by their fixed suffix
/// (exact names, `*.` subdomains, label globs) and networks.
struct Named<'p> {
    exact: HashMap<&'p str, Vec<usize>>,
    subs: HashMap<&'p str, Vec<usize>>,
    globs: HashMap<&'p str, Vec<usize>>,
    nets: HashMap<IpNet, Vec<usize>>,
}

impl<'p> Named<'p> {
    fn of(ex: &'p [crate::policy::Exception]) -> Self {
        let mut n = Named {
            exact: HashMap::new(),
            subs: HashMap::new(),
            globs: HashMap::new(),
            nets: HashMap::new(),
        };
        for (i, e) in ex.iter().enumerate() {
            for h in &e.hosts {
                let map = match h {
                    HostPattern::Exact(_) => &mut n.exact,
                    HostPattern::Subdomains(_) => &mut n.subs,
                    HostPattern::LabelGlob { .. } => &mut n.globs,
                };
                let v = map.entry(h.fixed_suffix().as_str()).or_default();
                if v.last() != Some(&i) {
                    v.push(i);
                }
            }
            for c in &e.cidrs {
                let v = n.nets.entry(*c).or_default();
                if v.last() != Some(&i) {
                    v.push(i);
                }
            }
        }
        n
    }

    /// The exceptions that could shadow `b` (any order, repeats): those
    /// naming its first host or a pattern above it, or a network holding
    /// its first network.
    fn candidates(&self, b: &crate::policy::Exception, cands: &mut Vec<usize>) {
        let get = |m: &HashMap<&str, Vec<usize>>, k: &str, acc: &mut Vec<usize>| {
            if let Some(v) = m.get(k) {
                acc.extend_from_slice(v);
            }
        };
        if let Some(h) = b.hosts.first() {
            let name = h.fixed_suffix().as_str();
            if let HostPattern::Exact(_) = h {
                get(&self.exact, name, cands);
                if let Some((_, rest)) = name.split_once('.') {
                    get(&self.globs, rest, cands);
                }
            } else {
                get(&self.subs, name, cands);
                if let HostPattern::LabelGlob { .. } = h {
                    get(&self.globs, name, cands);
                }
            }
            let mut rest = name;
            while let Some((_, r)) = rest.split_once('.') {
                get(&self.subs, r, cands);
                rest = r;
            }
        } else if let Some(n) = b.cidrs.first() {
            for len in (0..=n.prefix_len()).rev() {
                let sup = match n {
                    IpNet::V4(x) => IpNet::V4(Ipv4Net::new(x.network(), len).unwrap().trunc()),
                    IpNet::V6(x) => IpNet::V6(Ipv6Net::new(x.network(), len).unwrap().trunc()),
                };
                if let Some(v) = self.nets.get(&sup) {
                    cands.extend_from_slice(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_yaml;

    const NOW: i64 = 1_800_000_000; // 2027-01-15

    fn kinds(yaml: &str) -> Vec<(Lint, String)> {
        let p = from_yaml(yaml).unwrap_or_else(|e| panic!("{e}"));
        lint(&p, NOW)
            .into_iter()
            .map(|w| (w.kind, w.message))
            .collect()
    }

    fn ex(id: &str, body: &str) -> String {
        format!("  - id: {id}\n    owner: o\n    reason: r\n{body}")
    }

    #[test]
    fn ranges_agree_with_addr() {
        for r in non_public_ranges() {
            assert!(
                addr::classify(r.net.network()).is_some(),
                "{} is public by addr.rs",
                r.net
            );
        }
    }

    #[test]
    fn public_suffix_wildcards() {
        let ps = |s: &str| public_suffix_under(&HostPattern::parse(s).unwrap());
        assert!(ps("*.github.io").is_some());
        assert!(ps("*.s3.amazonaws.com").is_some());
        assert!(ps("*.herokuapp.com").is_some());
        assert!(ps("*.co.uk").is_some());
        assert!(ps("*.githubusercontent.com").is_some());
        assert!(ps("app-*.herokuapp.com").is_some());
        assert_eq!(
            ps("*.compute.amazonaws.com").unwrap().0,
            "*.compute.amazonaws.com"
        );
        assert!(ps("*.example.com").is_none());
        assert!(ps("*.myorg.github.io").is_none());
        assert!(ps("*.corp.internal").is_none());
        assert!(ps("api-*.example.co.uk").is_none());
    }

    #[test]
    fn cidr_overlaps() {
        let o = |s: &str| non_public_overlaps(&s.parse().unwrap());
        assert!(o("151.101.0.0/16").is_empty());
        assert!(o("2a04:4e42::/32").is_empty());
        assert!(o("10.1.0.0/16")[0].contains("10.0.0.0/8 (private)"));
        assert!(o("169.254.169.254/32")[0].contains("metadata"));
        let all = o("0.0.0.0/0").join(" ");
        assert!(all.contains("covers 0.0.0.0/8"), "{all}");
        assert!(all.contains("more non-public ranges"), "{all}");
        let ten = o("8.0.0.0/6").join(" ");
        assert!(ten.contains("covers 10.0.0.0/8 (private)"), "{ten}");
        assert!(
            o("::ffff:8.8.8.0/120").is_empty(),
            "{:?}",
            o("::ffff:8.8.8.0/120")
        );
        let mapped = o("::ffff:10.0.0.0/104").join(" ");
        assert!(mapped.contains("10.0.0.0/8 (private)"), "{mapped}");
        assert!(o("64:ff9b::808:808/128").is_empty());
        assert!(o("fd00::/8")[0].contains("unique-local"));
        assert!(o("4000::/16")[0].contains("reserved"));
    }

    #[test]
    fn each_rule() {
        let y = format!(
            "settings:\n  clients:\n    - id: ci-runner\n      sources: [10.8.0.0/16]\nexceptions:\n{}{}{}{}{}{}{}{}{}",
            ex("gone", "    expires: 2027-01-01\n    hosts: [a.example.com]\n"),
            ex("soon", "    expires: 2027-01-20\n    hosts: [b.example.com]\n"),
            ex("wild", "    hosts: [\"*.example.net\"]\n"),
            ex(
                "pages",
                "    expires: 2028-01-01\n    hosts: [\"*.github.io\"]\n"
            ),
            ex("lan", "    cidrs: [10.1.0.0/16]\n"),
            ex("who", "    clients: [agent-*]\n    hosts: [c.example.com]\n"),
            ex(
                "tok",
                "    ports: [80]\n    hosts: [d.example.com]\n    inject:\n      headers: { X-Token: abc }\n"
            ),
            ex(
                "push-all",
                "    hosts: [git.example.com]\n    git:\n      repos: [acme/w]\n      push: { refs: [\"**\"], force: true }\n"
            ),
            ex(
                "push-agent",
                "    hosts: [git.example.com]\n    git:\n      repos: [acme/w]\n      push: { refs: [\"refs/heads/agent/**\"], force: true }\n"
            ),
        );
        let got = kinds(&y);
        let want = [
            Lint::Expired,
            Lint::Expiring,
            Lint::WildcardNoExpiry,
            Lint::PublicSuffixWildcard,
            Lint::NonPublicCidr,
            Lint::UnknownClient,
            Lint::CleartextInject,
            Lint::GitPushAnything,
        ];
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            want,
            "{got:#?}"
        );
        assert!(got[0].1.contains("expired on 2027-01-01"));
        assert!(got[1].1.contains("in 5 days"));
        assert!(got[3].1.contains("github.io"));
        assert!(got[6].1.contains("only port 80"));
    }

    #[test]
    fn shadowing() {
        let y = format!(
            "exceptions:\n{}{}{}{}{}{}{}",
            ex("broad", "    expires: 2028-01-01\n    hosts: [\"*.example.com\", pypi.org]\n"),
            ex("narrow", "    expires: 2027-06-01\n    hosts: [api.example.com]\n    ports: [443]\n"),
            // Outlives `broad`: named after broad expires.
            ex("later", "    hosts: [web.example.com]\n"),
            // Restricts methods while broad does not: named at CONNECT with interception.
            ex("insp", "    expires: 2027-06-01\n    hosts: [x.example.com]\n    methods: [GET]\n"),
            ex("pypi2", "    expires: 2027-06-01\n    hosts: [pypi.org]\n    ports: [8443]\n"),
            ex("paths1", "    hosts: [pypi.org]\n    methods: [GET]\n    paths: [\"/simple/**\", \"/pkg/**\"]\n"),
            ex("paths2", "    hosts: [pypi.org]\n    methods: [GET]\n    paths: [\"/simple/**\"]\n"),
        );
        let p = from_yaml(&y).unwrap();
        let sh: Vec<String> = lint(&p, NOW)
            .into_iter()
            .filter(|w| w.kind == Lint::Shadowed)
            .map(|w| w.message)
            .collect();
        assert_eq!(sh.len(), 2, "{sh:#?}");
        assert!(sh[0].starts_with("exception \"narrow\" is shadowed by \"broad\""));
        assert!(sh[1].starts_with("exception \"paths2\" is shadowed by \"paths1\""));
    }

    #[test]
    fn host_coverage() {
        let c = |a: &str, b: &str| {
            host_covers(
                &HostPattern::parse(a).unwrap(),
                &HostPattern::parse(b).unwrap(),
            )
        };
        assert!(c("*.example.com", "a.example.com"));
        assert!(c("*.example.com", "*.a.example.com"));
        assert!(c("*.example.com", "*.example.com"));
        assert!(!c("*.example.com", "example.com"));
        assert!(!c("*.a.example.com", "*.example.com"));
        assert!(c("*.example.com", "api-*.example.com"));
        assert!(c("api-*.example.com", "api-eu-*.example.com"));
        assert!(c("api-*.example.com", "api-eu.example.com"));
        assert!(!c("api-*.example.com", "*.example.com"));
        assert!(!c("api-*.example.com", "web-*.example.com"));
        assert!(!c("a.example.com", "*.example.com"));
    }

    #[test]
    fn shadowing_by_cidr() {
        let y = format!(
            "exceptions:\n{}{}{}",
            ex("wide", "    cidrs: [203.0.113.0/24]\n"),
            ex("one", "    cidrs: [203.0.113.7/32]\n"),
            ex("other", "    cidrs: [198.51.100.0/24]\n"),
        );
        let p = from_yaml(&y).unwrap();
        let sh: Vec<_> = lint(&p, NOW)
            .into_iter()
            .filter(|w| w.kind == Lint::Shadowed)
            .collect();
        assert_eq!(sh.len(), 1);
        assert!(sh[0].message.contains("\"one\" is shadowed by \"wide\""));
    }
}
