//! `egressd report`: the exception review, from decision logs. It streams
//! any number of plain or gzip logs ([`read`]) through bounded counters
//! ([`stats`]), sets the counts beside the policy, and renders one
//! [`Report`] as text, JSON or a self-contained HTML page ([`render`]):
//!
//! - every exception with its owner, reason, ticket and expiry, its hits,
//!   last use and the clients using it;
//! - exceptions unused for `settings.stale_after` (candidates for removal),
//!   expired ones and those expiring soon, and the hottest;
//! - the most-denied destinations grouped by registered domain, each with a
//!   ready-to-edit YAML exception stub ([`stub`]);
//! - for the package gate: approved packages unused for `stale_after`, and
//!   the most-denied package names with "did you mean".
//!
//! It also holds [`replay`], which `egressd check --against` uses to decide
//! logged requests again under a proposed policy. Nothing here serves
//! traffic or writes logs.

pub mod html;
pub mod read;
pub mod replay;
pub mod stats;
pub mod stub;
pub mod text;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cmd::EXPIRY_WARNING_SECS;
use crate::policy::Policy;
use crate::time::{format_date, format_rfc3339_millis, unix_now};
use stats::{Pruned, Stats};

/// Exit status: report written.
pub const OK: i32 = 0;
/// Exit status: a log could not be read.
pub const INPUT_ERROR: i32 = 1;
/// Exit status: bad arguments or a policy that does not load.
pub const USAGE: i32 = 2;

/// How many exceptions the "hottest" list names.
pub const HOTTEST: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Html,
}

/// `egressd report [--policy P] [--since 30d] [--format text|json|html] LOG…`
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    #[arg(long, env = "EGRESSD_POLICY", default_value = "policy/")]
    pub policy: PathBuf,
    /// Only lines from this long ago until now (`30d`, `12h`, `2w`).
    #[arg(long = "since", value_name = "DUR", value_parser = parse_since)]
    pub since_secs: Option<u64>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// How many denied destinations to list.
    #[arg(long, default_value_t = 25)]
    pub top: usize,
    /// Decision logs, plain or gzip (`-` reads stdin).
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,
}

pub fn parse_since(s: &str) -> Result<u64, String> {
    crate::time::parse_duration(s)
        .ok_or_else(|| format!("{s:?} is not a duration: write e.g. 30d, 12h, 2w"))
}

/// `egressd report`: the command's entry.
pub fn main(opts: Options, out: &mut dyn Write, err: &mut dyn Write) -> super::Exit {
    run_report(&opts, out, err).into()
}

/// The review, ready to render. Its JSON form is `--format json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub generated_at: String,
    pub policy: PolicySummary,
    pub input: Input,
    pub totals: Totals,
    /// Per day: allowed and denied.
    pub daily: Vec<DayCount>,
    /// Every exception of the policy, in load order.
    pub exceptions: Vec<ExceptionRow>,
    /// Exception ids in the logs that the policy does not have (removed or
    /// renamed since, or logs from another policy).
    pub unknown_exceptions: Vec<UnknownException>,
    /// Ids of exceptions unused for `stale_after`: removal candidates.
    pub stale: Vec<String>,
    /// Ids unused in these logs, which cover less than `stale_after`: not
    /// yet proof of staleness.
    pub unused_recently: Vec<String>,
    pub expired: Vec<String>,
    /// Ids expiring within 14 days.
    pub expiring: Vec<String>,
    /// Ids with the most hits, most first.
    pub hottest: Vec<String>,
    /// The most-denied destinations, most first.
    pub denied: Vec<DeniedRow>,
    /// Distinct denied destinations tracked (may exceed `denied.len()`).
    pub denied_destinations: usize,
    /// Denials no exception could fix (malformed, tunnels, …), by reason;
    /// package denials are in `packages`.
    pub other_denials: BTreeMap<String, u64>,
    /// The package gate's review.
    pub packages: PackagesReport,
    /// Grants: each with its state and use, and the destinations granted
    /// most often (candidates for a permanent exception).
    pub grants: GrantsReport,
    pub limits: LimitNotes,
}

/// The grants part of the review (DESIGN "Grants: the friction loop").
#[derive(Debug, Serialize)]
pub struct GrantsReport {
    /// The policy's grants, in load order.
    pub grants: Vec<GrantRow>,
    /// Destinations by how many grants allowed them (in the policy or in
    /// the logs, revoked ones included), most first.
    pub granted_most_often: Vec<GrantedRow>,
}

#[derive(Debug, Serialize)]
pub struct GrantRow {
    pub id: String,
    pub destination: String,
    /// `active`, `unused` (active, nothing used it in these logs),
    /// `used_up` or `expired`.
    pub state: &'static str,
    /// Requests it allowed in these logs.
    pub uses: u64,
    pub max_uses: Option<u32>,
    pub expires: Option<String>,
    pub owner: String,
    pub reason: String,
    pub from_request: String,
    pub granted_by: String,
}

#[derive(Debug, Serialize)]
pub struct GrantedRow {
    pub destination: String,
    pub grants: usize,
}

/// The package gate's part of the review.
#[derive(Debug, Serialize)]
pub struct PackagesReport {
    /// Approved sets in the policy.
    pub sets: usize,
    /// Ecosystems in `settings.packages.enforce`.
    pub enforce: Vec<&'static str>,
    /// Every allow entry with its use, in policy order.
    pub approved: Vec<ApprovedRow>,
    /// Allow entries whose package nothing fetched for `stale_after`:
    /// removal candidates (as `set/name`).
    pub stale: Vec<String>,
    /// Unused in these logs, which cover less than `stale_after`.
    pub unused_recently: Vec<String>,
    /// The most-denied package names, most first.
    pub denied: Vec<DeniedPackageRow>,
    /// Distinct denied package names tracked.
    pub denied_names: usize,
}

#[derive(Debug, Serialize)]
pub struct ApprovedRow {
    pub set: String,
    pub ecosystem: &'static str,
    /// As the policy writes it.
    pub name: String,
    pub versions: String,
    pub file: String,
    pub line: usize,
    pub status: Status,
    pub hits: u64,
    pub last_used: Option<String>,
    pub days_since_use: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct DeniedPackageRow {
    pub ecosystem: String,
    /// Normalised, as logged.
    pub name: String,
    pub count: u64,
    pub reasons: BTreeMap<String, u64>,
    /// Versions asked for (`-`: the index).
    pub versions: Vec<String>,
    pub versions_more: bool,
    pub clients: Vec<String>,
    pub clients_more: bool,
    /// Sets that held or denied it.
    pub sets: Vec<String>,
    /// For an unapproved name: the approved name it is probably a typo of.
    pub did_you_mean: Option<String>,
    pub first_seen: String,
    pub last_seen: String,
}

#[derive(Debug, Serialize)]
pub struct PolicySummary {
    pub path: String,
    pub exceptions: usize,
    pub mode: &'static str,
    pub stale_after_days: u64,
    pub contact: String,
}

#[derive(Debug, Serialize)]
pub struct Input {
    pub files: Vec<String>,
    pub lines: u64,
    pub bytes: u64,
    pub unreadable: u64,
    pub first_unreadable: Option<String>,
    pub bad_timestamps: u64,
    /// `--since` as a start instant, if given.
    pub since: Option<String>,
    pub before_window: u64,
    pub in_window: u64,
    pub first_seen: Option<String>,
    pub last_seen: Option<String>,
    /// Days between the first line read and now.
    pub days_covered: f64,
}

#[derive(Debug, Serialize)]
pub struct Totals {
    pub allowed: u64,
    pub denied: u64,
    pub report_only_denied: u64,
    /// proto → [allowed, denied]
    pub by_proto: BTreeMap<String, [u64; 2]>,
    pub denied_by_reason: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct DayCount {
    pub day: String,
    pub allowed: u64,
    pub denied: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Used within `stale_after`.
    Active,
    /// Not used for `stale_after`.
    Stale,
    /// Not used in logs shorter than `stale_after`.
    UnusedRecently,
    Expiring,
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Stale => "stale",
            Status::UnusedRecently => "unused",
            Status::Expiring => "expiring",
            Status::Expired => "expired",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ExceptionRow {
    pub id: String,
    pub owner: String,
    pub reason: String,
    pub ticket: Option<String>,
    pub expires: Option<String>,
    pub expires_in_days: Option<i64>,
    pub file: String,
    pub line: usize,
    pub status: Status,
    pub hits: u64,
    pub first_used: Option<String>,
    pub last_used: Option<String>,
    pub days_since_use: Option<i64>,
    pub clients: Vec<String>,
    pub clients_more: bool,
    /// Busiest destinations it allowed, with counts.
    pub hosts: Vec<(String, u64)>,
    /// Denials that named it as the closest exception.
    pub near_denials: u64,
    /// (day, hits) for days with hits.
    pub daily: Vec<(String, u64)>,
}

#[derive(Debug, Serialize)]
pub struct UnknownException {
    pub id: String,
    pub owner: Option<String>,
    pub hits: u64,
    pub last_used: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DeniedRow {
    /// Registered domain, or an IP address.
    pub domain: String,
    pub count: u64,
    pub reasons: BTreeMap<String, u64>,
    pub clients: Vec<String>,
    pub clients_more: bool,
    pub hosts: Vec<(String, u64)>,
    pub hosts_more: bool,
    pub ports: Vec<u16>,
    pub qtypes: Vec<String>,
    pub examples: Vec<String>,
    /// Exceptions that named this destination but did not allow it.
    pub near_exceptions: Vec<String>,
    pub first_seen: String,
    pub last_seen: String,
    /// YAML to paste under `exceptions:`, owner and reason left empty.
    pub stub: String,
}

/// What was capped, in words, plus the raw numbers.
#[derive(Debug, Serialize)]
pub struct LimitNotes {
    pub max_destinations: usize,
    pub max_clients_listed: usize,
    pub pruned: Pruned,
    pub untracked_exception_hits: u64,
    pub notes: Vec<String>,
}

/// `egressd report …`: returns the exit status.
pub fn run_report(opts: &Options, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let policy = match crate::policy::load(&opts.policy) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            let _ = writeln!(
                err,
                "egressd report: policy {} does not load; run `egressd check {}`",
                opts.policy.display(),
                opts.policy.display()
            );
            return USAGE;
        }
    };
    let now = unix_now();
    let since = opts.since_secs.map(|s| now - s as i64);
    let mut stats = Stats::new(since);
    let read = match read::for_each_line(&opts.logs, |l, _| stats.add(l)) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "egressd report: {e}");
            return INPUT_ERROR;
        }
    };
    let report = build(&policy, &opts.policy, &stats, &read, opts.top, now);
    if let Some(u) = &report.input.first_unreadable {
        let _ = writeln!(
            err,
            "egressd report: {} line{} not understood as decision-log lines, the first at {u}",
            report.input.unreadable,
            if report.input.unreadable == 1 {
                ""
            } else {
                "s"
            }
        );
    }
    let res = match opts.format {
        Format::Text => text::render(&report, out),
        Format::Json => serde_json::to_writer_pretty(&mut *out, &report)
            .map_err(std::io::Error::other)
            .and_then(|_| writeln!(out)),
        Format::Html => html::render(&report, out),
    };
    match res {
        Ok(()) => OK,
        Err(e) => {
            let _ = writeln!(err, "egressd report: cannot write the report: {e}");
            INPUT_ERROR
        }
    }
}

fn ts(secs: i64) -> String {
    format_rfc3339_millis(secs * 1000)
        .trim_end_matches(".000Z")
        .to_string()
        + "Z"
}

fn day(d: i32) -> String {
    format_date(d as i64 * 86400)
}

/// Sets the counts beside the policy, as of `now`.
pub fn build(
    policy: &Policy,
    policy_path: &Path,
    stats: &Stats,
    read: &read::ReadStats,
    top: usize,
    now: i64,
) -> Report {
    let stale_after = policy.settings.stale_after_secs as i64;
    let covered_from = stats.first.unwrap_or(now);
    let covers_stale_window = now - covered_from >= stale_after;
    let (exceptions, lists) = exception_rows(policy, stats, now, covers_stale_window);
    let mut hot: Vec<&ExceptionRow> = exceptions.iter().filter(|e| e.hits > 0).collect();
    hot.sort_by(|a, b| b.hits.cmp(&a.hits).then_with(|| a.id.cmp(&b.id)));
    let hottest = hot.iter().take(HOTTEST).map(|e| e.id.clone()).collect();
    let denied = denied_rows(stats, top, now);
    let other_denials = stats
        .denied_by_reason
        .iter()
        .filter(|(r, _)| !stats::FIXABLE.contains(&&***r) && !r.starts_with("package_"))
        .map(|(r, n)| (r.to_string(), *n))
        .collect();
    let days_covered = ((now - covered_from).max(0) as f64 / 86400.0 * 10.0).round() / 10.0;
    let clients_cut =
        exceptions.iter().any(|e| e.clients_more) || denied.iter().any(|d| d.clients_more);
    let notes = notes(
        stats,
        clients_cut,
        covers_stale_window,
        days_covered,
        stale_after,
    );
    let Lists {
        stale,
        unused_recently,
        expired,
        expiring,
    } = lists;
    Report {
        generated_at: ts(now),
        policy: PolicySummary {
            path: policy_path.display().to_string(),
            exceptions: policy.exceptions.len(),
            mode: policy.settings.mode.as_str(),
            stale_after_days: policy.settings.stale_after_secs / 86400,
            contact: policy.settings.contact.clone(),
        },
        input: input(read, stats, days_covered),
        totals: totals(stats),
        daily: stats
            .daily
            .iter()
            .map(|(d, (a, n))| DayCount {
                day: day(*d),
                allowed: *a,
                denied: *n,
            })
            .collect(),
        exceptions,
        unknown_exceptions: unknown_exceptions(policy, stats),
        stale,
        unused_recently,
        expired,
        expiring,
        hottest,
        denied,
        denied_destinations: stats.destinations.len(),
        other_denials,
        packages: packages_report(policy, stats, top, now, covers_stale_window),
        grants: grants_report(policy, stats, top, now),
        limits: LimitNotes {
            max_destinations: stats::MAX_DESTINATIONS,
            max_clients_listed: stats::MAX_CLIENTS,
            pruned: stats.pruned,
            untracked_exception_hits: stats.untracked_exception_hits,
            notes,
        },
    }
}

/// The exceptions' lists by state, as ids.
#[derive(Default)]
struct Lists {
    stale: Vec<String>,
    unused_recently: Vec<String>,
    expired: Vec<String>,
    expiring: Vec<String>,
}

/// Each exception beside its use, and the lists it falls in.
fn exception_rows(
    policy: &Policy,
    stats: &Stats,
    now: i64,
    covers_stale_window: bool,
) -> (Vec<ExceptionRow>, Lists) {
    let stale_after = policy.settings.stale_after_secs as i64;
    let mut exceptions = Vec::with_capacity(policy.exceptions.len());
    let mut l = Lists::default();
    let (stale, unused_recently, expired, expiring) = (
        &mut l.stale,
        &mut l.unused_recently,
        &mut l.expired,
        &mut l.expiring,
    );
    for e in &policy.exceptions {
        let u = stats.exceptions.get(&*e.id);
        let last = u.and_then(|u| u.last);
        let unused_for_stale = match last {
            Some(t) => now - t >= stale_after,
            None => true,
        };
        let id = e.id.to_string();
        let status = if e.is_expired(now) {
            expired.push(id.clone());
            Status::Expired
        } else {
            let soon = e.expires().is_some_and(|t| t - now <= EXPIRY_WARNING_SECS);
            if soon {
                expiring.push(id.clone());
            }
            let s = if unused_for_stale && (last.is_some() || covers_stale_window) {
                stale.push(id.clone());
                Status::Stale
            } else if unused_for_stale {
                unused_recently.push(id.clone());
                Status::UnusedRecently
            } else {
                Status::Active
            };
            if soon {
                Status::Expiring
            } else {
                s
            }
        };
        exceptions.push(exception_row(e, u, id, status, now));
    }
    (exceptions, l)
}

fn exception_row(
    e: &crate::policy::Exception,
    u: Option<&stats::ExceptionUse>,
    id: String,
    status: Status,
    now: i64,
) -> ExceptionRow {
    let last = u.and_then(|u| u.last);
    ExceptionRow {
        id,
        owner: e.owner.to_string(),
        reason: e.reason.to_string(),
        ticket: e.ticket().map(str::to_string),
        expires: e.expires().map(format_date),
        expires_in_days: e.expires().map(|t| (t - now).div_euclid(86400)),
        file: e.file.display().to_string(),
        line: e.line,
        status,
        hits: u.map_or(0, |u| u.hits),
        first_used: u.and_then(|u| u.first).map(ts),
        last_used: last.map(ts),
        days_since_use: last.map(|t| (now - t).div_euclid(86400)),
        clients: u.map_or(Vec::new(), |u| {
            u.clients.items.iter().map(|c| c.to_string()).collect()
        }),
        clients_more: u.is_some_and(|u| u.clients.more),
        hosts: u.map_or(Vec::new(), |u| u.hosts.sorted()),
        near_denials: u.map_or(0, |u| u.near_denials),
        daily: u.map_or(Vec::new(), |u| {
            u.daily
                .0
                .iter()
                .map(|(d, n)| (day(*d), *n as u64))
                .collect()
        }),
    }
}

/// Exceptions the logs name and the policy lacks, most hits first.
fn unknown_exceptions(policy: &Policy, stats: &Stats) -> Vec<UnknownException> {
    let mut unknown: Vec<UnknownException> = stats
        .exceptions
        .iter()
        .filter(|(id, u)| policy.exception(id).is_none() && u.hits > 0)
        .map(|(id, u)| UnknownException {
            id: id.to_string(),
            owner: u.owner.as_deref().map(str::to_string),
            hits: u.hits,
            last_used: u.last.map(ts),
        })
        .collect();
    unknown.sort_by(|a, b| b.hits.cmp(&a.hits).then_with(|| a.id.cmp(&b.id)));
    unknown
}

/// The `top` most-denied destinations, each with its stub.
fn denied_rows(stats: &Stats, top: usize, now: i64) -> Vec<DeniedRow> {
    let mut dests: Vec<(&str, &stats::DeniedUse)> =
        stats.destinations.iter().map(|(k, v)| (&**k, v)).collect();
    dests.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
    dests
        .iter()
        .take(top)
        .map(|(k, d)| DeniedRow {
            domain: k.to_string(),
            count: d.count,
            reasons: d.reasons.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
            clients: d.clients.items.iter().map(|c| c.to_string()).collect(),
            clients_more: d.clients.more,
            hosts: d.hosts.sorted(),
            hosts_more: d.hosts.more,
            ports: {
                let mut p = d.ports.clone();
                p.sort_unstable();
                p
            },
            qtypes: d.qtypes.iter().map(|q| q.to_string()).collect(),
            examples: d.examples.clone(),
            near_exceptions: d.near.items.iter().map(|c| c.to_string()).collect(),
            first_seen: ts(d.first),
            last_seen: ts(d.last),
            stub: stub::denied_stub(k, d, now),
        })
        .collect()
}

/// What the report could not hold or see, in sentences.
fn notes(
    stats: &Stats,
    clients_cut: bool,
    covers_stale_window: bool,
    days_covered: f64,
    stale_after: i64,
) -> Vec<String> {
    let mut notes = Vec::new();
    if stats.pruned.destinations > 0 {
        notes.push(format!(
            "more than {} distinct denied destinations: the {} lightest ({} denials) were dropped \
             as the table filled, so a count shown may be low by up to {}",
            stats::MAX_DESTINATIONS,
            stats.pruned.destinations,
            stats.pruned.denials,
            stats.pruned.max_count
        ));
    }
    if stats.untracked_packages > 0 {
        notes.push(format!(
            "more than {} distinct package names in the logs: {} package lines on further names \
             not counted",
            stats::MAX_PACKAGES,
            stats.untracked_packages
        ));
    }
    if stats.untracked_exception_hits > 0 {
        notes.push(format!(
            "more than {} distinct exception ids in the logs: {} hits on further ids not counted",
            stats::MAX_EXCEPTIONS,
            stats.untracked_exception_hits
        ));
    }
    if clients_cut {
        notes.push(format!(
            "client lists stop at {} per exception or destination (marked +more)",
            stats::MAX_CLIENTS
        ));
    }
    if !covers_stale_window {
        notes.push(format!(
            "the logs reach back {days_covered} days, less than stale_after ({} days): exceptions \
             unused in them are listed as unused, not stale",
            stale_after / 86400
        ));
    }
    notes
}

/// What was read.
fn input(read: &read::ReadStats, stats: &Stats, days_covered: f64) -> Input {
    Input {
        files: read.files.iter().map(|f| f.display().to_string()).collect(),
        lines: read.lines,
        bytes: read.bytes,
        unreadable: read.unreadable,
        first_unreadable: read.first_unreadable.clone(),
        bad_timestamps: stats.bad_timestamps,
        since: stats.since.map(ts),
        before_window: stats.before_window,
        in_window: stats.in_window,
        first_seen: stats.first.map(ts),
        last_seen: stats.last.map(ts),
        days_covered,
    }
}

/// The decisions counted.
fn totals(stats: &Stats) -> Totals {
    Totals {
        allowed: stats.allowed,
        denied: stats.denied,
        report_only_denied: stats.report_only,
        by_proto: stats
            .by_proto
            .iter()
            .map(|(p, (a, d))| (p.to_string(), [*a, *d]))
            .collect(),
        denied_by_reason: stats
            .denied_by_reason
            .iter()
            .map(|(r, n)| (r.to_string(), *n))
            .collect(),
    }
}

/// Each grant's state and use, and the destinations granted most often.
fn grants_report(policy: &Policy, stats: &Stats, top: usize, now: i64) -> GrantsReport {
    let mut by_dest: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut grants = Vec::new();
    for (e, g) in policy.grants() {
        let uses = stats.exceptions.get(&*e.id).map_or(0, |u| u.hits);
        let host = e.hosts.first().map(|h| h.to_string()).unwrap_or_default();
        let destination = match &e.ports[..] {
            [p] => format!("{host}:{p}"),
            _ => host,
        };
        let state = if e.is_expired(now) {
            "expired"
        } else if g
            .max_uses
            .is_some_and(|m| uses >= u64::from(m) || g.used() >= m)
        {
            "used_up"
        } else if uses == 0 {
            "unused"
        } else {
            "active"
        };
        by_dest
            .entry(destination.clone())
            .or_default()
            .insert(e.id.to_string());
        grants.push(GrantRow {
            id: e.id.to_string(),
            destination,
            state,
            uses,
            max_uses: g.max_uses,
            expires: e.expires().map(ts),
            owner: e.owner.to_string(),
            reason: e.reason.to_string(),
            from_request: g.from_request.to_string(),
            granted_by: g.granted_by.to_string(),
        });
    }
    for (id, dest) in &stats.granted {
        by_dest
            .entry(dest.to_string())
            .or_default()
            .insert(id.to_string());
    }
    let mut granted_most_often: Vec<GrantedRow> = by_dest
        .into_iter()
        .map(|(destination, ids)| GrantedRow {
            destination,
            grants: ids.len(),
        })
        .collect();
    granted_most_often.sort_by(|a, b| {
        b.grants
            .cmp(&a.grants)
            .then_with(|| a.destination.cmp(&b.destination))
    });
    granted_most_often.truncate(top);
    GrantsReport {
        grants,
        granted_most_often,
    }
}

/// Approved entries beside their use, and the most-denied names.
fn packages_report(
    policy: &Policy,
    stats: &Stats,
    top: usize,
    now: i64,
    covers_stale_window: bool,
) -> PackagesReport {
    let pp = &policy.packages;
    let stale_after = policy.settings.stale_after_secs as i64;
    let (mut approved, mut stale, mut unused_recently) = (Vec::new(), Vec::new(), Vec::new());
    for set in &pp.sets {
        for a in &set.allow {
            let key: stats::PackageKey = (set.ecosystem.as_str().into(), a.name.as_str().into());
            let u = stats.packages.get(&key);
            let last = u.and_then(|u| u.last);
            let unused = last.is_none_or(|t| now - t >= stale_after);
            let label = format!("{}/{}", set.id, a.written);
            let status = if set.is_expired(now) {
                Status::Expired
            } else if unused && (last.is_some() || covers_stale_window) {
                stale.push(label);
                Status::Stale
            } else if unused {
                unused_recently.push(label);
                Status::UnusedRecently
            } else {
                Status::Active
            };
            approved.push(ApprovedRow {
                set: set.id.to_string(),
                ecosystem: set.ecosystem.as_str(),
                name: a.written.clone(),
                versions: a.versions.to_string(),
                file: set.file.display().to_string(),
                line: a.line,
                status,
                hits: u.map_or(0, |u| u.hits),
                last_used: last.map(ts),
                days_since_use: last.map(|t| (now - t).div_euclid(86400)),
            });
        }
    }
    PackagesReport {
        sets: pp.sets.len(),
        enforce: pp.settings.enforce.iter().map(|e| e.as_str()).collect(),
        approved,
        stale,
        unused_recently,
        denied: denied_packages(policy, stats, top, now),
        denied_names: stats.package_denials.len(),
    }
}

/// The `top` most-denied package names, with "did you mean".
fn denied_packages(policy: &Policy, stats: &Stats, top: usize, now: i64) -> Vec<DeniedPackageRow> {
    use crate::packages::name::normalize;
    use crate::packages::Ecosystem;
    let pp = &policy.packages;
    let mut denied: Vec<(&stats::PackageKey, &stats::PackageDenied)> =
        stats.package_denials.iter().collect();
    denied.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
    // "did you mean" for any client the policy knows, the anonymous first.
    let clients = std::iter::once(None).chain((0..policy.clients.len() as u32).map(Some));
    denied
        .into_iter()
        .take(top)
        .map(|((eco, name), d)| {
            let did_you_mean = Ecosystem::ALL
                .into_iter()
                .find(|e| e.as_str() == &**eco)
                .filter(|_| d.reasons.contains_key("package_not_approved"))
                .and_then(|e| Some((e, normalize(e, name).ok()?)))
                .and_then(|(e, n)| {
                    clients
                        .clone()
                        .find_map(|c| pp.did_you_mean(c, e, &n, now))
                        .map(str::to_string)
                });
            DeniedPackageRow {
                ecosystem: eco.to_string(),
                name: name.to_string(),
                count: d.count,
                reasons: d.reasons.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
                versions: d.versions.items.iter().map(|v| v.to_string()).collect(),
                versions_more: d.versions.more,
                clients: d.clients.items.iter().map(|c| c.to_string()).collect(),
                clients_more: d.clients.more,
                sets: d.sets.items.iter().map(|c| c.to_string()).collect(),
                did_you_mean,
                first_seen: ts(d.first),
                last_seen: ts(d.last),
            }
        })
        .collect()
}
