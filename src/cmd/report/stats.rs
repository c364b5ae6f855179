//! Counting decision-log lines into bounded tables: per exception (hits,
//! first and last use, clients, busiest hosts, uses per day) and per denied
//! registered domain (count, reasons, clients, hosts, ports, record types,
//! example requests). Every table has a cap, so memory stays bounded
//! whatever the logs hold; when a cap is reached the report says so.
//!
//! The denied-destination table keeps its heaviest entries when full: it
//! drops the lighter half and remembers the largest count it dropped, which
//! bounds how far any later count can be low (lossy counting).

use std::collections::{BTreeMap, HashMap};

use super::read::{parse_ts, LogLine, LogPackage};

/// Distinct denied registered domains tracked at once.
pub const MAX_DESTINATIONS: usize = 20_000;
/// Distinct exception ids tracked (a policy has far fewer; forged or
/// foreign logs could name any number).
pub const MAX_EXCEPTIONS: usize = 50_000;
/// Clients listed per exception or destination.
pub const MAX_CLIENTS: usize = 32;
/// Host names listed per exception or destination.
pub const MAX_HOSTS: usize = 32;
/// Example requests kept per destination.
pub const MAX_EXAMPLES: usize = 3;
/// Ports and record types listed per destination.
pub const MAX_PORTS: usize = 16;
/// Distinct (ecosystem, name) pairs tracked for package use and for
/// package denials, each.
pub const MAX_PACKAGES: usize = 50_000;
/// Versions listed per denied package.
pub const MAX_VERSIONS: usize = 8;

/// Denial reasons a new or widened exception can fix: these make the map
/// of friction. Other denials (malformed input, tunnels, overload, the log
/// failing) are counted by reason only.
pub const FIXABLE: &[&str] = &[
    "no_exception",
    "exception_expired",
    "grant_used_up",
    "port_not_allowed",
    "client_not_allowed",
    "method_not_allowed",
    "path_not_allowed",
    "qtype_not_allowed",
    "inspection_required",
    "private_address",
];

/// A list of distinct strings that stops growing at `cap`, noting that
/// more were seen.
#[derive(Debug, Default, Clone)]
pub struct Capped {
    pub items: Vec<Box<str>>,
    pub more: bool,
}

impl Capped {
    fn add(&mut self, s: &str, cap: usize) {
        if self.items.iter().any(|x| &**x == s) {
            return;
        }
        if self.items.len() < cap {
            self.items.push(s.into());
        } else {
            self.more = true;
        }
    }
}

/// Counts per distinct string, up to `cap` strings.
#[derive(Debug, Default, Clone)]
pub struct CappedCounts {
    pub items: Vec<(Box<str>, u64)>,
    pub more: bool,
}

impl CappedCounts {
    fn add(&mut self, s: &str, cap: usize) {
        if let Some(x) = self.items.iter_mut().find(|(k, _)| &**k == s) {
            x.1 += 1;
        } else if self.items.len() < cap {
            self.items.push((s.into(), 1));
        } else {
            self.more = true;
        }
    }
    /// Heaviest first.
    pub fn sorted(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .items
            .iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }
}

/// Uses per day as (day number, count), appended in time order; logs are
/// nearly time-ordered, so the last entry is almost always the one to bump.
#[derive(Debug, Default, Clone)]
pub struct Daily(pub Vec<(i32, u32)>);

impl Daily {
    fn add(&mut self, day: i32) {
        if let Some(last) = self.0.last_mut() {
            if last.0 == day {
                last.1 = last.1.saturating_add(1);
                return;
            }
        }
        match self.0.binary_search_by_key(&day, |e| e.0) {
            Ok(i) => self.0[i].1 = self.0[i].1.saturating_add(1),
            Err(i) => self.0.insert(i, (day, 1)),
        }
    }
}

/// What the logs say about one exception.
#[derive(Debug, Default, Clone)]
pub struct ExceptionUse {
    pub owner: Option<Box<str>>,
    pub hits: u64,
    pub first: Option<i64>,
    pub last: Option<i64>,
    pub clients: Capped,
    pub hosts: CappedCounts,
    pub daily: Daily,
    /// Denials that named this exception as the closest (wrong port,
    /// client, method, path, or expired).
    pub near_denials: u64,
}

/// What the logs say about denials to one registered domain.
#[derive(Debug, Default, Clone)]
pub struct DeniedUse {
    pub count: u64,
    pub reasons: BTreeMap<Box<str>, u64>,
    pub clients: Capped,
    pub hosts: CappedCounts,
    pub ports: Vec<u16>,
    pub qtypes: Vec<Box<str>>,
    pub examples: Vec<String>,
    /// Exceptions named as closest by these denials.
    pub near: Capped,
    pub first: i64,
    pub last: i64,
    /// The destination is an IP address (no registered domain).
    pub is_ip: bool,
}

/// What the logs say about one package the sandboxes fetched through the
/// gate (their own requests; egressd's fetches for itself do not count).
#[derive(Debug, Default, Clone)]
pub struct PackageUse {
    pub hits: u64,
    pub last: Option<i64>,
}

/// What the logs say about denials of one package name.
#[derive(Debug, Default, Clone)]
pub struct PackageDenied {
    pub count: u64,
    pub reasons: BTreeMap<Box<str>, u64>,
    /// `-` for the index.
    pub versions: Capped,
    pub clients: Capped,
    pub sets: Capped,
    pub first: i64,
    pub last: i64,
}

/// The package table's key: `ecosystem` and the normalised name.
pub type PackageKey = (Box<str>, Box<str>);

/// What the denied-destination table had to drop.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Pruned {
    pub destinations: u64,
    pub denials: u64,
    /// The largest count dropped: any count may be low by at most this.
    pub max_count: u64,
}

/// Every count the report is made of.
#[derive(Debug, Default)]
pub struct Stats {
    /// Lines before this instant (Unix seconds) are skipped.
    pub since: Option<i64>,
    pub in_window: u64,
    pub before_window: u64,
    pub bad_timestamps: u64,
    /// Close lines of long-lived connections: passed over, each
    /// connection being counted once, by its open line.
    pub closes: u64,
    pub first: Option<i64>,
    pub last: Option<i64>,
    pub allowed: u64,
    pub denied: u64,
    /// Denials logged under `mode: report` (they were let through).
    pub report_only: u64,
    pub by_proto: BTreeMap<Box<str>, (u64, u64)>,
    pub denied_by_reason: BTreeMap<Box<str>, u64>,
    /// Per day: (allowed, denied).
    pub daily: BTreeMap<i32, (u64, u64)>,
    pub exceptions: HashMap<Box<str>, ExceptionUse>,
    /// Hits on exception ids beyond [`MAX_EXCEPTIONS`].
    pub untracked_exception_hits: u64,
    pub destinations: HashMap<Box<str>, DeniedUse>,
    pub pruned: Pruned,
    /// Allowed package requests per (ecosystem, name).
    pub packages: HashMap<PackageKey, PackageUse>,
    /// Denied package requests per (ecosystem, name).
    pub package_denials: HashMap<PackageKey, PackageDenied>,
    /// Package lines beyond [`MAX_PACKAGES`] names, not counted by name.
    pub untracked_packages: u64,
    /// Grants seen allowing requests: grant id → the destination
    /// (`host:port`) it allowed.
    pub granted: HashMap<Box<str>, Box<str>>,
    ts_cache: Option<([u8; 10], i64)>,
}

impl Stats {
    pub fn new(since: Option<i64>) -> Stats {
        Stats {
            since,
            ..Stats::default()
        }
    }

    /// Counts one line.
    pub fn add(&mut self, l: &LogLine<'_>) {
        if l.is_close() {
            // Its connection was counted by its open line.
            self.closes += 1;
            return;
        }
        let Some(ts) = parse_ts(&l.ts, &mut self.ts_cache) else {
            self.bad_timestamps += 1;
            return;
        };
        if self.since.is_some_and(|s| ts < s) {
            self.before_window += 1;
            return;
        }
        self.in_window += 1;
        self.first = Some(self.first.map_or(ts, |f| f.min(ts)));
        self.last = Some(self.last.map_or(ts, |f| f.max(ts)));
        let day = ts.div_euclid(86400) as i32;
        let allowed = l.allowed();
        let proto = match self.by_proto.get_mut(&*l.proto) {
            Some(p) => p,
            None => self.by_proto.entry(l.proto.as_ref().into()).or_default(),
        };
        let daily = self.daily.entry(day).or_default();
        if allowed {
            self.allowed += 1;
            proto.0 += 1;
            daily.0 += 1;
        } else {
            self.denied += 1;
            proto.1 += 1;
            daily.1 += 1;
            if l.mode.as_deref() == Some("report") {
                self.report_only += 1;
            }
            bump(&mut self.denied_by_reason, l.reason());
        }
        if let (Some(g), Some(h), true) = (l.grant.as_deref(), l.host.as_deref(), allowed) {
            if !self.granted.contains_key(g) && self.granted.len() < MAX_EXCEPTIONS {
                let dest = match l.port {
                    Some(p) => format!("{h}:{p}"),
                    None => h.to_string(),
                };
                self.granted.insert(g.into(), dest.into());
            }
        }
        if let Some(id) = l.exception.as_deref() {
            let hit = allowed && l.reason() == "exception";
            self.exception(l, id, ts, day, hit);
        }
        if !allowed && FIXABLE.contains(&l.reason()) {
            self.destination(l, ts);
        }
        if let Some(p) = &l.package {
            // What egressd fetched for itself says nothing about use.
            if l.origin.as_deref() != Some("egressd") {
                self.package(l, p, allowed, ts);
            }
        }
    }

    fn package(&mut self, l: &LogLine<'_>, p: &LogPackage<'_>, allowed: bool, ts: i64) {
        let key: PackageKey = (p.ecosystem.as_ref().into(), p.name.as_ref().into());
        if allowed {
            let room = self.packages.len() < MAX_PACKAGES;
            match self.packages.get_mut(&key) {
                Some(u) => {
                    u.hits += 1;
                    u.last = Some(u.last.map_or(ts, |t| t.max(ts)));
                }
                None if room => {
                    self.packages.insert(
                        key,
                        PackageUse {
                            hits: 1,
                            last: Some(ts),
                        },
                    );
                }
                None => self.untracked_packages += 1,
            }
            return;
        }
        if !self.package_denials.contains_key(&key) && self.package_denials.len() >= MAX_PACKAGES {
            self.untracked_packages += 1;
            return;
        }
        let d = self
            .package_denials
            .entry(key)
            .or_insert_with(|| PackageDenied {
                first: ts,
                last: ts,
                ..PackageDenied::default()
            });
        d.count += 1;
        d.first = d.first.min(ts);
        d.last = d.last.max(ts);
        bump(&mut d.reasons, l.reason());
        d.versions
            .add(p.version.as_deref().unwrap_or("-"), MAX_VERSIONS);
        d.clients.add(l.who(), MAX_CLIENTS);
        if let Some(s) = p.set.as_deref() {
            d.sets.add(s, 8);
        }
    }

    fn exception(&mut self, l: &LogLine<'_>, id: &str, ts: i64, day: i32, hit: bool) {
        if !self.exceptions.contains_key(id) {
            if self.exceptions.len() >= MAX_EXCEPTIONS {
                if hit {
                    self.untracked_exception_hits += 1;
                }
                return;
            }
            self.exceptions.insert(id.into(), ExceptionUse::default());
        }
        let Some(e) = self.exceptions.get_mut(id) else {
            return;
        };
        if e.owner.is_none() {
            e.owner = l.owner.as_deref().map(Into::into);
        }
        if !hit {
            e.near_denials += 1;
            return;
        }
        e.hits += 1;
        e.first = Some(e.first.map_or(ts, |f| f.min(ts)));
        e.last = Some(e.last.map_or(ts, |f| f.max(ts)));
        e.clients.add(l.who(), MAX_CLIENTS);
        if let Some(h) = l.destination() {
            e.hosts.add(h, MAX_HOSTS);
        }
        e.daily.add(day);
    }

    fn destination(&mut self, l: &LogLine<'_>, ts: i64) {
        let Some(dest) = l.destination() else { return };
        let (key, is_ip) = registered_domain(dest);
        if !self.destinations.contains_key(&*key) && self.destinations.len() >= MAX_DESTINATIONS {
            self.prune();
        }
        let d = self
            .destinations
            .entry(key.into())
            .or_insert_with(|| DeniedUse {
                first: ts,
                last: ts,
                is_ip,
                ..DeniedUse::default()
            });
        d.count += 1;
        d.first = d.first.min(ts);
        d.last = d.last.max(ts);
        bump(&mut d.reasons, l.reason());
        d.clients.add(l.who(), MAX_CLIENTS);
        d.hosts.add(dest, MAX_HOSTS);
        if l.proto == "dns" {
            let t = l.qtype.as_deref().unwrap_or("A");
            if d.qtypes.len() < MAX_PORTS && !d.qtypes.iter().any(|x| &**x == t) {
                d.qtypes.push(t.into());
            }
        } else if let Some(p) = l.port {
            if d.ports.len() < MAX_PORTS && !d.ports.contains(&p) {
                d.ports.push(p);
            }
        }
        if let Some(e) = l.exception.as_deref() {
            d.near.add(e, 8);
        }
        if d.examples.len() < MAX_EXAMPLES {
            let ex = l.example();
            if !d.examples.contains(&ex) {
                d.examples.push(ex);
            }
        }
    }

    /// Drops the lighter half of the denied-destination table.
    fn prune(&mut self) {
        let mut counts: Vec<u64> = self.destinations.values().map(|d| d.count).collect();
        let mid = counts.len() / 2;
        let (_, median, _) = counts.select_nth_unstable(mid);
        let cut = *median;
        let before = self.destinations.len();
        let mut dropped = 0u64;
        let mut max = 0u64;
        self.destinations.retain(|_, d| {
            if d.count <= cut {
                dropped += d.count;
                max = max.max(d.count);
                false
            } else {
                true
            }
        });
        self.pruned.destinations += (before - self.destinations.len()) as u64;
        self.pruned.denials += dropped;
        self.pruned.max_count = self.pruned.max_count.max(max);
    }
}

fn bump(m: &mut BTreeMap<Box<str>, u64>, k: &str) {
    match m.get_mut(k) {
        Some(n) => *n += 1,
        None => {
            m.insert(k.into(), 1);
        }
    }
}

/// The registrable domain of a name (public suffix list, private section
/// included), or an IP address as itself. Names without a registrable
/// domain (`localhost`, a bare TLD) group as themselves.
pub fn registered_domain(dest: &str) -> (String, bool) {
    use psl::Psl;
    let d = dest.trim_start_matches('[').trim_end_matches(']');
    if d.parse::<std::net::IpAddr>().is_ok() {
        return (d.to_string(), true);
    }
    let lower = d.to_ascii_lowercase();
    match psl::List.domain(lower.as_bytes()) {
        Some(r) => (String::from_utf8_lossy(r.as_bytes()).into_owned(), false),
        None => (lower, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(json: &str) -> LogLine<'_> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn domains() {
        assert_eq!(registered_domain("a.b.example.co.uk").0, "example.co.uk");
        assert_eq!(registered_domain("x.user.github.io").0, "user.github.io");
        assert_eq!(
            registered_domain("203.0.113.7"),
            ("203.0.113.7".into(), true)
        );
        assert_eq!(
            registered_domain("[2001:db8::1]"),
            ("2001:db8::1".into(), true)
        );
        assert_eq!(registered_domain("localhost").0, "localhost");
    }

    #[test]
    fn counts_and_caps() {
        let mut s = Stats::new(None);
        for i in 0..(MAX_DESTINATIONS + 10) {
            let j = format!(
                r#"{{"ts":"2026-11-29T20:00:00Z","proto":"connect","host":"h.d{i}.example","port":443,"decision":"deny","reason":"no_exception"}}"#
            );
            s.add(&line(&j));
            if i % 3 == 0 {
                s.add(&line(&j));
            }
        }
        assert!(s.pruned.destinations > 0);
        assert!(s.destinations.len() <= MAX_DESTINATIONS);
        // The heavier (counted twice) destinations survive the prune.
        assert!(s
            .destinations
            .values()
            .all(|d| d.count == 2 || d.count == 1));
        assert!(s.pruned.max_count >= 1);
        let hit = r#"{"ts":"2026-11-29T20:00:00Z","client":"ci","proto":"connect","host":"pypi.org","port":443,"decision":"allow","reason":"exception","exception":"pypi","owner":"py"}"#;
        s.add(&line(hit));
        s.add(&line(hit));
        let e = &s.exceptions["pypi"];
        assert_eq!((e.hits, &*e.clients.items[0]), (2, "ci"));
        assert_eq!(e.daily.0.len(), 1);
    }

    #[test]
    fn packages_count_the_sandboxes_requests_by_name() {
        let mut s = Stats::new(None);
        let ok = r#"{"ts":"2026-11-29T20:00:00Z","client":"ci","proto":"tls","host":"pypi.org","port":443,"decision":"allow","reason":"exception","exception":"pypi","package":{"ecosystem":"pypi","name":"requests","version":null,"set":"py","versions_hidden":2}}"#;
        s.add(&line(ok));
        s.add(&line(&ok.replace("20:00", "21:00")));
        // egressd's own index fetch is not a use.
        s.add(&line(
            &ok.replace("\"ts\"", "\"origin\":\"egressd\",\"ts\"")
                .replace("2026-11-29", "2026-12-01"),
        ));
        let u = &s.packages[&("pypi".into(), "requests".into())];
        assert_eq!(u.hits, 2);
        assert_eq!(u.last, parse_ts("2026-11-29T21:00:00Z", &mut None));
        let deny = r#"{"ts":"2026-11-29T20:00:00Z","client":"ci","proto":"tls","host":"pypi.org","port":443,"decision":"deny","reason":"package_not_approved","package":{"ecosystem":"pypi","name":"reqeusts","version":"2.32.3","set":null}}"#;
        s.add(&line(deny));
        s.add(&line(&deny.replace("\"2.32.3\"", "null")));
        let d = &s.package_denials[&("pypi".into(), "reqeusts".into())];
        assert_eq!(d.count, 2);
        assert_eq!(d.versions.items, vec!["2.32.3".into(), "-".into()]);
        assert_eq!(d.reasons["package_not_approved"], 2);
        assert!(
            s.destinations.is_empty(),
            "a package denial is not a missing exception"
        );
    }

    #[test]
    fn window() {
        let mut s = Stats::new(Some(1_800_000_000));
        s.add(&line(
            r#"{"ts":"2020-01-01T00:00:00Z","proto":"dns","qname":"x.example","decision":"deny","reason":"no_exception"}"#,
        ));
        s.add(&line(
            r#"{"ts":"garbage","proto":"dns","qname":"x.example","decision":"deny","reason":"no_exception"}"#,
        ));
        assert_eq!((s.before_window, s.bad_timestamps, s.in_window), (1, 1, 0));
    }
}
