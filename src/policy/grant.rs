//! Grants (DESIGN "Grants: the friction loop"): an exception made from one
//! denied request, that expires after its TTL and after N uses. Pure: the
//! ceiling ([`check_ceiling`]) every grant must stay under, the grant's
//! facts ([`Grant`]) and its use counter ([`GrantUses`]), which is shared
//! across reloads by the layer that owns state (`reload::grants`) and told
//! of each use through a [`UseSink`] so it can be kept on disk.
//!
//! Owns what a grant may be and how a use is taken. Does not own grant
//! files (`cmd::grant` writes them, `read_sources` reads them) or where the
//! counts are kept.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::addr;
use super::host::{parse_target, HostPattern, Target};
use super::Reason;

/// Denials a grant can lift: those where no exception allowed the request.
/// The others (a tunnel, a private address, a package rule, malformed
/// input) stay whatever exception is added.
pub const GRANTABLE: &[Reason] = &[
    Reason::NoException,
    Reason::Expired,
    Reason::GrantUsedUp,
    Reason::ClientNotAllowed,
    Reason::PortNotAllowed,
    Reason::MethodNotAllowed,
    Reason::PathNotAllowed,
];

/// `settings.grants.max_ttl` when the policy sets none.
pub const DEFAULT_MAX_TTL_SECS: u64 = 24 * 3600;

/// `settings.grants`: the ceiling no grant may pass.
#[derive(Debug, Clone)]
pub struct GrantSettings {
    pub max_ttl_secs: u64,
    /// `None`: a grant may go without a use limit.
    pub max_uses: Option<u32>,
    /// Hosts no grant may name (patterns as in `hosts:`).
    pub never: Vec<HostPattern>,
}

impl Default for GrantSettings {
    fn default() -> Self {
        GrantSettings {
            max_ttl_secs: DEFAULT_MAX_TTL_SECS,
            max_uses: None,
            never: Vec::new(),
        }
    }
}

/// What a grant would allow, as the ceiling judges it: taken from the
/// command's flags, or from a grant file at load.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// The hosts it names, as written (the denied target, for the command).
    pub hosts: &'a [String],
    pub has_cidrs: bool,
    pub has_inject: bool,
    pub ttl_secs: i64,
    pub max_uses: Option<u32>,
}

/// A ceiling rule a grant broke: its name (as `settings.grants` and the
/// README call it) and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: &'static str,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refused by the grant ceiling ({}): {}",
            self.rule, self.message
        )
    }
}

/// Checks a grant against the ceiling; the first rule it breaks.
pub fn check_ceiling(c: &Candidate<'_>, s: &GrantSettings) -> Result<(), Refusal> {
    let refuse = |rule, message: String| Err(Refusal { rule, message });
    if c.has_inject {
        return refuse("inject", "a grant never adds credentials (inject:)".into());
    }
    if c.has_cidrs {
        return refuse(
            "cidrs",
            "a grant never names destination ranges (cidrs:), so it never reaches a private or metadata address".into(),
        );
    }
    if c.hosts.len() != 1 {
        return refuse(
            "one_host",
            format!("a grant names exactly one host, not {}", c.hosts.len()),
        );
    }
    let written = c.hosts[0].trim();
    if written.contains('*') {
        return refuse(
            "wildcard",
            format!("{written} is a wildcard; a grant names one host"),
        );
    }
    let name = match parse_target(written) {
        Ok(Target::Ip(ip)) if !addr::is_public(ip) => {
            return refuse(
                "private_destination",
                format!("{ip} is a private, loopback, link-local or metadata address"),
            )
        }
        Ok(Target::Ip(ip)) => {
            return refuse(
                "ip_literal",
                format!("{ip} is an address: a grant names a host, and carries no cidrs"),
            )
        }
        Ok(Target::Name(h)) => h,
        Err(e) => return refuse("host", format!("{written:?} is not a host name: {e}")),
    };
    if is_public_suffix(name.as_str()) {
        return refuse(
            "public_suffix",
            format!("{name} is a public suffix: anyone can register names under it"),
        );
    }
    let name = name.as_str();
    if let Some(n) = s.never.iter().find(|n| never_covers(n, name)) {
        return refuse("never", format!("{name} is on settings.grants.never ({n})"));
    }
    if c.ttl_secs <= 0 {
        return refuse("max_ttl", "a grant's TTL must be positive".into());
    }
    if c.ttl_secs as u64 > s.max_ttl_secs {
        return refuse(
            "max_ttl",
            format!(
                "TTL {} is over settings.grants.max_ttl {}",
                crate::time::format_duration(c.ttl_secs as u64),
                crate::time::format_duration(s.max_ttl_secs)
            ),
        );
    }
    match (c.max_uses, s.max_uses) {
        (Some(0), _) => refuse("max_uses", "a grant of 0 uses allows nothing".into()),
        (Some(n), Some(max)) if n > max => refuse(
            "max_uses",
            format!("{n} uses is over settings.grants.max_uses {max}"),
        ),
        (None, Some(max)) => refuse(
            "max_uses",
            format!("settings.grants.max_uses is {max}: give --uses N"),
        ),
        _ => Ok(()),
    }
}

/// Whether a `never` entry covers `name` (a pattern match, or the name
/// under an entry's apex: `never: [example.com]` also keeps out
/// `api.example.com`).
fn never_covers(n: &HostPattern, name: &str) -> bool {
    if let Ok(Target::Name(h)) = parse_target(name) {
        if n.matches(&h) {
            return true;
        }
    }
    let apex = n.to_string();
    let apex = apex.strip_prefix("*.").unwrap_or(&apex);
    name == apex || name.ends_with(&format!(".{apex}"))
}

/// Whether `name` is itself a public suffix (`co.uk`, `github.io`).
fn is_public_suffix(name: &str) -> bool {
    use psl::Psl;
    psl::List
        .suffix(name.as_bytes())
        .is_some_and(|s| s.as_bytes() == name.as_bytes() && s.is_known())
}

/// A grant's facts (`grant:` in its file) and its use counter.
#[derive(Debug)]
pub struct Grant {
    pub from_request: Box<str>,
    pub granted_by: Box<str>,
    /// Unix seconds at which it was made.
    pub granted_at: i64,
    pub max_uses: Option<u32>,
    uses: Arc<GrantUses>,
}

impl Grant {
    pub fn new(
        from_request: Box<str>,
        granted_by: Box<str>,
        granted_at: i64,
        max_uses: Option<u32>,
    ) -> Grant {
        Grant {
            from_request,
            granted_by,
            granted_at,
            max_uses,
            uses: Arc::default(),
        }
    }

    /// Uses taken so far.
    pub fn used(&self) -> u32 {
        self.uses.used.load(Ordering::Acquire)
    }

    /// Whether every use is taken: from that moment it matches nothing.
    pub fn used_up(&self) -> bool {
        self.max_uses.is_some_and(|m| self.used() >= m)
    }

    /// Takes one use, exactly: of any number of requests racing for the
    /// last use, one gets it. In memory, by a compare-and-swap on the
    /// shared counter; with a sink, under the sink's lock, from the higher
    /// of this process's count and the count the sink keeps (which other
    /// processes sharing the grants directory write too), and the sink has
    /// the new count before this returns, so a use is on disk before the
    /// request it allowed goes out.
    pub fn take(&self) -> bool {
        let u = &self.uses;
        let sink = u.sink.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sink) = &*sink {
            let mine = u.used.load(Ordering::Acquire);
            let taken = sink.take(mine, self.max_uses);
            let now = match taken {
                Ok(n) | Err(n) => n.max(mine),
            };
            // Raised, never lowered: a used-up grant stays used up here,
            // so the caller's next decision no longer matches it.
            u.used.fetch_max(now, Ordering::AcqRel);
            return taken.is_ok();
        }
        drop(sink);
        let mut cur = u.used.load(Ordering::Acquire);
        loop {
            if self.max_uses.is_some_and(|m| cur >= m) {
                return false;
            }
            match u
                .used
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// The counter this grant counts in.
    pub fn uses(&self) -> &Arc<GrantUses> {
        &self.uses
    }

    /// Counts in `uses` from now on (the one kept across reloads for this
    /// grant's id).
    pub fn share(&mut self, uses: Arc<GrantUses>) {
        self.uses = uses;
    }
}

impl Clone for Grant {
    fn clone(&self) -> Self {
        Grant {
            from_request: self.from_request.clone(),
            granted_by: self.granted_by.clone(),
            granted_at: self.granted_at,
            max_uses: self.max_uses,
            uses: self.uses.clone(),
        }
    }
}

/// Where a grant's count is kept: on disk, shared by every egressd that
/// serves the same grants directory.
pub trait UseSink: Send + Sync + std::fmt::Debug {
    /// Takes one use under a lock every process sharing the count holds
    /// for it: from the higher of `mine` (this process's count) and the
    /// count kept, unless that reaches `max`. `Ok(new count)` when a use
    /// was taken and kept, `Err(count)` when none is left.
    fn take(&self, mine: u32, max: Option<u32>) -> Result<u32, u32>;
}

/// One grant's use count, shared by every policy that holds the grant.
#[derive(Debug, Default)]
pub struct GrantUses {
    used: AtomicU32,
    sink: Mutex<Option<Box<dyn UseSink>>>,
}

impl GrantUses {
    /// A counter that starts at `used` (as kept on disk) and tells `sink`
    /// of every use.
    pub fn new(used: u32, sink: Option<Box<dyn UseSink>>) -> GrantUses {
        GrantUses {
            used: AtomicU32::new(used),
            sink: Mutex::new(sink),
        }
    }

    pub fn used(&self) -> u32 {
        self.used.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(host: &str) -> (Vec<String>, GrantSettings) {
        (vec![host.to_string()], GrantSettings::default())
    }

    fn check(
        hosts: &[String],
        s: &GrantSettings,
        ttl: i64,
        uses: Option<u32>,
    ) -> Result<(), &'static str> {
        check_ceiling(
            &Candidate {
                hosts,
                has_cidrs: false,
                has_inject: false,
                ttl_secs: ttl,
                max_uses: uses,
            },
            s,
        )
        .map_err(|r| r.rule)
    }

    #[test]
    fn the_ceiling_names_the_rule_each_grant_breaks() {
        let (h, mut s) = cand("api.example.com");
        assert_eq!(check(&h, &s, 3600, Some(3)), Ok(()));
        assert_eq!(check(&h, &s, 24 * 3600 + 1, Some(3)), Err("max_ttl"));
        s.max_uses = Some(2);
        assert_eq!(check(&h, &s, 3600, Some(3)), Err("max_uses"));
        assert_eq!(check(&h, &s, 3600, None), Err("max_uses"));
        s.never = vec![HostPattern::parse("example.com").unwrap()];
        assert_eq!(check(&h, &s, 3600, Some(1)), Err("never"));
        let s = GrantSettings::default();
        assert_eq!(
            check(&cand("*.example.com").0, &s, 60, None),
            Err("wildcard")
        );
        assert_eq!(
            check(&cand("169.254.169.254").0, &s, 60, None),
            Err("private_destination")
        );
        assert_eq!(
            check(&cand("10.1.2.3").0, &s, 60, None),
            Err("private_destination")
        );
        assert_eq!(check(&cand("co.uk").0, &s, 60, None), Err("public_suffix"));
        assert_eq!(
            check(&cand("github.io").0, &s, 60, None),
            Err("public_suffix")
        );
        assert_eq!(
            check(&cand("93.184.216.34").0, &s, 60, None),
            Err("ip_literal")
        );
        assert_eq!(check(&cand("pypi.org").0, &s, 60, None), Ok(()));
        let c = Candidate {
            hosts: &h,
            has_cidrs: false,
            has_inject: true,
            ttl_secs: 60,
            max_uses: None,
        };
        assert_eq!(check_ceiling(&c, &s).map_err(|r| r.rule), Err("inject"));
    }

    #[test]
    fn racing_takers_get_exactly_the_uses() {
        let g = Arc::new(Grant::new("r".into(), "me".into(), 0, Some(3)));
        let taken: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| g.take() as u32)).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(taken, 3);
        assert!(g.used_up());
        assert_eq!(g.used(), 3);
    }
}
