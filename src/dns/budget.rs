//! DNS tunnel detection: a per-client budget of the information new
//! subdomain text carries.
//!
//! A name carries data to whoever runs its zone only through the labels the
//! sender chose. An exact host leaves no choice; a wildcard (`*.example.com`,
//! `api-*.example.com`) leaves the labels left of its fixed suffix. So only
//! names an exception allowed through a wildcard are judged here, in three
//! ways:
//!
//! 1. **Hard per-name limits**: a name longer than `max_name_len`, or a label
//!    in the wildcard's part longer than `max_label_len`, is a tunnel on its
//!    own (no ordinary service needs that room).
//! 2. **Not a host name**: a name below an allowed wildcard with bytes outside
//!    letters, digits, `-` and `_` is data and nothing else (the server finds
//!    these before they are a [`Host`] and reports them through
//!    [`TunnelDetector::strike`]). It is refused, and the wildcard is refused
//!    for that client for `cooldown` like a spent budget: every tunnel tool
//!    probes what the resolver lets through this way before it settles on an
//!    encoding (iodine's first probe carries `ä`, dns2tcp's names an `=`), so
//!    refusing the probe's zone ends the handshake before it starts.
//! 3. **Budget**: per client, every *new* name is charged to two domains —
//!    the wildcard's fixed suffix and the name's registered domain (public
//!    suffix list, private section included) — with what its labels left of
//!    that domain add to what the budget has already seen (see [`Cost`]).
//!    Repeats of a name seen in the last day cost nothing, so ordinary
//!    re-resolution never adds up. Above `alert_bytes` or
//!    `alert_unique_names` per `alert_window` the name is allowed and
//!    reported; a name that would take a domain past `block_bytes` per
//!    `block_window` or past `daily_bytes` per day is refused, and the domain
//!    stays refused for that client for `cooldown` (so a tunnel cannot resume
//!    as the window slides). After the cool-down the hourly count starts
//!    again, the daily one does not: a slow drip under the hourly budget, or
//!    bursts an hour apart, move at most `daily_bytes` a day.
//!
//! Charging both domains matters: data spread over many registrable names
//! below one wildcard (`<data>.bucket-N.s3.amazonaws.com`) adds up at the
//! wildcard, and data spread over two wildcards of one zone
//! (`*.a.evil.test`, `*.b.evil.test`) adds up at the registered domain.
//!
//! **What a name costs** is an upper bound on the information it adds, in
//! bytes, not its length. Ordinary names repeat themselves (`us-east-1`, an
//! account id, a namespace, `prod`); tunnel payloads never do (they are
//! compressed or encrypted). So a name is written as tokens between `.`, `-`
//! and `_`, and charged what that writing takes: per token 3 bits (what
//! follows it, and whether it is new); a token the budget has seen, log2 of
//! how many it has seen; a new one 8 bits (alphabet, length) and log2 of its
//! alphabet per character — digits 10, hex 16, letters 26, both 36 —
//! weighed by how encoded the name looks ([`encoded_weight`], at most
//! [`MAX_WEIGHT`]). Whatever the encoding, a name cannot carry more than it
//! costs, so `block_bytes` and `daily_bytes` bound the data itself, and a
//! tunnel that first fills the dictionary gains nothing. The weight only
//! makes random-looking text spend the budget faster; nothing is refused for
//! its looks alone — hex-encoded data looks exactly like an ordinary cloud
//! host name, and ordinary cloud host names look random.
//!
//! Memory is bounded: [`MAX_DOMAINS`] (client, domain) budgets, each holding
//! at most [`MAX_NAMES_PER_DOMAIN`] names and all together [`MAX_TOTAL_NAMES`],
//! each name remembering at most [`MAX_TOKENS_PER_NAME`] tokens; the least
//! recently used budgets go first. The detector takes `now` as a parameter
//! and does no I/O, so it is tested with injected time.
//!
//! Not counted: *which* already-seen names a client re-resolves, and when.
//! Repeats are free so that ordinary clients never run out, which leaves the
//! order of re-resolutions (each at most once per cached TTL) as a slow
//! channel this budget does not measure.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::policy::host::{is_strict_subdomain, Host, HostPattern};
use crate::policy::{Exception, TunnelAction, TunnelSettings};

/// (client, domain) budgets kept at once.
pub const MAX_DOMAINS: usize = 16_384;
/// Names remembered per budget (only reachable with `action: log` or a very
/// large budget; the oldest are forgotten first).
pub const MAX_NAMES_PER_DOMAIN: usize = 8_192;
/// Names remembered across all budgets (~40 MiB with their tokens).
pub const MAX_TOTAL_NAMES: usize = 1 << 18;
/// Tokens a name adds to its budget's dictionary; the rest of a long name is
/// charged as new each time (dearer, never cheaper).
pub const MAX_TOKENS_PER_NAME: usize = 8;
/// The most a name's bytes are multiplied by for looking encoded.
pub const MAX_WEIGHT: f64 = 1.5;
/// The daily budget's window.
pub const DAY_SECS: i64 = 86_400;
/// Labels shorter than this in total are never weighted: there is no
/// statistic worth the name in a dozen characters.
const MIN_WEIGHTED_LEN: usize = 16;

/// What the detector concluded about one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelOutcome {
    /// Nothing unusual (or not a wildcard match, or detection is off).
    Ok,
    /// Suspicious: logged and counted (`action="log"`), but allowed.
    Alert,
    /// Refused with reason `dns_tunnel` (`action="block"`).
    Block,
}

/// An outcome and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub outcome: TunnelOutcome,
    pub note: Option<String>,
}

impl Assessment {
    fn ok() -> Assessment {
        Assessment {
            outcome: TunnelOutcome::Ok,
            note: None,
        }
    }
}

/// One name charged to a budget.
struct Charge {
    at: i64,
    hash: u64,
    cost: u32,
    /// The tokens this name added to the budget's dictionary.
    tokens: Box<[u32]>,
}

/// One client's budget for one domain: the names charged within the longest
/// window (a day, or `block_window` if longer), in time order.
struct Budget {
    charges: VecDeque<Charge>,
    seen: HashSet<u64>,
    tokens: HashSet<u32>,
    /// The cost of every charge held.
    bytes: u64,
    /// The charges within `block_window`, after `hourly_from`.
    hourly: Span,
    /// The charges within `alert_window`.
    recent: Span,
    /// The hourly count starts after this instant (the last block).
    hourly_from: i64,
    blocked_until: i64,
    last_used: i64,
}

/// A running total of a budget's newest charges (the last `len` of them),
/// so a check costs the same with 10 names in the window as with 8,000.
#[derive(Default, Clone, Copy)]
struct Span {
    /// The window it was counted for.
    secs: i64,
    len: usize,
    bytes: u64,
}

impl Span {
    /// Drops the charges at or before `cutoff`. A window other than the one
    /// counted for (a reloaded policy) is counted again.
    fn slide(&mut self, charges: &VecDeque<Charge>, secs: i64, cutoff: i64) {
        if self.secs != secs {
            *self = Span {
                secs,
                ..Span::default()
            };
            for c in charges.iter().rev().take_while(|c| c.at > cutoff) {
                self.len += 1;
                self.bytes += c.cost as u64;
            }
            return;
        }
        while self.len > 0 {
            let c = &charges[charges.len() - self.len];
            if c.at > cutoff {
                break;
            }
            self.len -= 1;
            self.bytes -= c.cost as u64;
        }
    }

    fn push(&mut self, cost: u32) {
        self.len += 1;
        self.bytes += cost as u64;
    }

    /// The oldest of `held` charges, costing `cost`, is being dropped.
    fn forget_oldest(&mut self, held: usize, cost: u32) {
        if self.len == held {
            self.len -= 1;
            self.bytes -= cost as u64;
        }
    }
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            charges: VecDeque::new(),
            seen: HashSet::new(),
            tokens: HashSet::new(),
            bytes: 0,
            hourly: Span::default(),
            recent: Span::default(),
            hourly_from: i64::MIN,
            blocked_until: i64::MIN,
            last_used: i64::MIN,
        }
    }
}

impl Budget {
    fn expire(&mut self, now: i64, keep: i64, total: &mut usize) {
        while self.charges.front().is_some_and(|c| c.at <= now - keep) {
            self.pop_front(total);
        }
    }

    /// Brings the running totals to `now`.
    fn slide(&mut self, now: i64, block_window: i64, alert_window: i64) {
        let cutoff = (now - block_window).max(self.hourly_from);
        self.hourly.slide(&self.charges, block_window, cutoff);
        self.recent
            .slide(&self.charges, alert_window, now - alert_window);
    }

    fn pop_front(&mut self, total: &mut usize) {
        let held = self.charges.len();
        let c = self.charges.pop_front().expect("caller checked");
        self.hourly.forget_oldest(held, c.cost);
        self.recent.forget_oldest(held, c.cost);
        self.seen.remove(&c.hash);
        for t in c.tokens.iter() {
            self.tokens.remove(t);
        }
        self.bytes -= c.cost as u64;
        *total -= 1;
    }

    /// Bytes charged within the last day (all held, unless a longer
    /// `block_window` keeps more).
    fn daily(&self, now: i64, keep: i64) -> u64 {
        if keep == DAY_SECS {
            return self.bytes;
        }
        let cutoff = now - DAY_SECS;
        self.charges
            .iter()
            .rev()
            .take_while(|c| c.at > cutoff)
            .map(|c| c.cost as u64)
            .sum()
    }
}

/// What one name costs a budget, and the tokens it would add.
struct Cost {
    bytes: u64,
    tokens: Vec<u32>,
}

/// Bits for what follows every token: a separator (`.`, `-`, `_`) or the
/// end (2), and whether the next token is new or from the dictionary (1).
const TOKEN_BITS: f64 = 3.0;
/// Bits a new token adds besides its characters: its alphabet (2) and its
/// length (6: a label holds at most 63 bytes).
const NEW_TOKEN_BITS: f64 = 8.0;

impl Cost {
    /// An upper bound on the information `text` (a name's labels left of
    /// the budget's domain) carries, in bytes, its characters weighed by
    /// `weight` ([`encoded_weight`]); tokens are hashed with the detector's
    /// key. A name is written as tokens between separators; a token seen in
    /// the budget (or earlier in this name) is one entry of a dictionary of
    /// `n` entries, `log2 n` bits; a new token is its alphabet, its length
    /// and `log2` of the alphabet's size per character — digits 10, hex 16,
    /// letters 26, letters and digits 36.
    fn of(text: &str, weight: f64, budget: Option<&Budget>, hasher: &RandomState) -> Cost {
        let known = budget.map_or(0, |b| b.tokens.len());
        let mut bits = 0.0f64;
        let mut tokens: Vec<u32> = Vec::new();
        for t in text.split(|c: char| is_separator(c as u8)) {
            bits += TOKEN_BITS;
            if t.is_empty() {
                bits += NEW_TOKEN_BITS;
                continue;
            }
            let h = hasher.hash_one(t) as u32;
            if budget.is_some_and(|b| b.tokens.contains(&h)) || tokens.contains(&h) {
                bits += ((known + tokens.len()).max(2) as f64).log2().ceil();
            } else {
                bits += NEW_TOKEN_BITS + t.len() as f64 * alphabet_bits(t) * weight;
                tokens.push(h);
            }
        }
        tokens.truncate(MAX_TOKENS_PER_NAME);
        Cost {
            bytes: (bits / 8.0).ceil() as u64,
            tokens,
        }
    }
}

/// Bits per character of the smallest alphabet `token` is written in.
fn alphabet_bits(token: &str) -> f64 {
    let b = token.as_bytes();
    let size: f64 = if b.iter().all(u8::is_ascii_digit) {
        10.0
    } else if b.iter().all(u8::is_ascii_hexdigit) {
        16.0
    } else if b.iter().all(u8::is_ascii_alphabetic) {
        26.0
    } else {
        36.0
    };
    size.log2()
}

fn is_separator(b: u8) -> bool {
    matches!(b, b'.' | b'-' | b'_')
}

/// One domain a name is charged to, decided before anything is charged.
struct Pending<'a> {
    domain: &'a str,
    hash: u64,
    /// `None`: a repeat, free.
    cost: Option<Cost>,
}

/// The detector's state: budgets by client id, then by domain.
pub struct TunnelDetector {
    clients: HashMap<Arc<str>, HashMap<Box<str>, Budget>>,
    domains: usize,
    names: usize,
    /// Keyed hashing: a sender who could choose colliding names or tokens
    /// could make new ones look like repeats and never pay for them.
    hasher: RandomState,
}

/// A name too long, or with a label too long, to be a host name under
/// `*.suffix`: what the note says.
fn shape_note(s: &TunnelSettings, name: &str, variable: &str, suffix: &str) -> Option<String> {
    if name.len() > s.max_name_len {
        return Some(format!(
            "dns tunnel: name is {} bytes, over max_name_len {} under *.{suffix}",
            name.len(),
            s.max_name_len
        ));
    }
    if let Some(l) = variable.split('.').find(|l| l.len() > s.max_label_len) {
        return Some(format!(
            "dns tunnel: a {}-byte label is over max_label_len {} under *.{suffix}",
            l.len(),
            s.max_label_len
        ));
    }

    None
}

/// The first domain whose hourly or daily budget `pending` would exceed,
/// and the note that says so.
fn over_budget<'a>(
    s: &TunnelSettings,
    budgets: &HashMap<Box<str>, Budget>,
    pending: &[Pending<'a>],
    now: i64,
    keep: i64,
) -> Option<(&'a str, String)> {
    let block_window = s.block_window_secs.max(1) as i64;
    for p in pending {
        let Some(cost) = &p.cost else { continue };
        let b = budgets.get(p.domain);
        let hourly = b.map_or(0, |b| b.hourly.bytes);
        let daily = b.map_or(0, |b| b.daily(now, keep));
        if hourly + cost.bytes > s.block_bytes {
            return Some((p.domain, format!(
                "dns tunnel: new names under {} would exceed block_bytes {} per {block_window}s for this client ({hourly} spent)",
                p.domain, s.block_bytes
            )));
        }
        if daily + cost.bytes > s.daily_bytes {
            return Some((p.domain, format!(
                "dns tunnel: new names under {} would exceed daily_bytes {} per day for this client ({daily} spent)",
                p.domain, s.daily_bytes
            )));
        }
    }
    None
}

/// The alert a domain just charged is over (`alert_bytes` or
/// `alert_unique_names` in the alert window), if any.
fn alert(
    s: &TunnelSettings,
    budgets: &HashMap<Box<str>, Budget>,
    domains: &[&str],
) -> Option<Assessment> {
    let alert_window = s.alert_window_secs.max(1) as i64;
    for domain in domains {
        let Some(b) = budgets.get(*domain) else {
            continue;
        };
        let (bytes, names) = (b.recent.bytes, b.recent.len);
        if bytes > s.alert_bytes || names > s.alert_unique_names as usize {
            return Some(Assessment {
                outcome: TunnelOutcome::Alert,
                note: Some(format!(
                    "dns tunnel suspected: {names} new names, {bytes} bytes under {domain} in {alert_window}s for this client (alert at {} names or {} bytes)",
                    s.alert_unique_names, s.alert_bytes
                )),
            });
        }
    }
    None
}

impl Default for TunnelDetector {
    fn default() -> Self {
        Self::new()
    }
}

impl TunnelDetector {
    pub fn new() -> TunnelDetector {
        TunnelDetector {
            clients: HashMap::new(),
            domains: 0,
            names: 0,
            hasher: RandomState::new(),
        }
    }

    /// Judges `host`, which `exception` allowed for the client `client`
    /// (its id, or `-`), at unix time `now`; charges the budget if allowed.
    pub fn check(
        &mut self,
        s: &TunnelSettings,
        client: &str,
        host: &Host,
        exception: &Exception,
        now: i64,
    ) -> Assessment {
        if s.action == TunnelAction::Off {
            return Assessment::ok();
        }
        let Some(suffix) = wildcard_suffix(exception, host) else {
            return Assessment::ok();
        };
        let name = host.as_str();
        let variable = &name[..name.len() - suffix.len() - 1];
        let enforce = s.action == TunnelAction::Block;
        let verdict = |note: String| Assessment {
            outcome: if enforce {
                TunnelOutcome::Block
            } else {
                TunnelOutcome::Alert
            },
            note: Some(note),
        };
        if let Some(note) = shape_note(s, name, variable, suffix) {
            return verdict(note);
        }
        let block_window = s.block_window_secs.max(1) as i64;
        let alert_window = s.alert_window_secs.max(1) as i64;
        let keep = DAY_SECS.max(block_window).max(alert_window);
        let weight = encoded_weight(variable);
        if !self.clients.contains_key(client) {
            self.clients.insert(Arc::from(client), HashMap::new());
        }
        let budgets = self.clients.get_mut(client).expect("inserted above");

        // Decide against every domain before charging any.
        let mut pending = Vec::with_capacity(2);
        for (domain, text) in charged_domains(suffix, name) {
            let hash = self.hasher.hash_one(text);
            let b = budgets.get_mut(domain);
            if let Some(b) = &b {
                if enforce && b.blocked_until > now {
                    return verdict(format!(
                        "dns tunnel: {domain} is blocked for this client for {}s more (cool-down after the budget ran out)",
                        b.blocked_until - now
                    ));
                }
            }
            let b = b.map(|b| {
                b.last_used = now;
                b.expire(now, keep, &mut self.names);
                b.slide(now, block_window, alert_window);
                &*b
            });
            let cost = match b {
                Some(b) if b.seen.contains(&hash) => None,
                _ => Some(Cost::of(text, weight, b, &self.hasher)),
            };
            pending.push(Pending { domain, hash, cost });
        }
        if pending.iter().all(|p| p.cost.is_none()) {
            return Assessment::ok();
        }
        if let Some((domain, note)) = over_budget(s, budgets, &pending, now, keep) {
            if enforce {
                self.block(client, domain, s, now);
                return verdict(note);
            }
            // action: log — let it through, charged, and say so.
            self.charge(client, pending, now);
            return verdict(note);
        }
        let domains: Vec<&str> = pending.iter().map(|p| p.domain).collect();
        self.charge(client, pending, now);
        let budgets = self.clients.get(client).expect("charged above");
        alert(s, budgets, &domains).unwrap_or_else(Assessment::ok)
    }

    /// A name below `exception`'s wildcard that is not a host name (its
    /// valid rightmost labels are `valid_tail`, with `labels_above` more to
    /// their left) was refused for `client`: with `action: block`, refuse the
    /// wildcard (and `valid_tail`'s registered domain) for the cool-down.
    /// Returns what to add to the log's note.
    pub fn strike(
        &mut self,
        s: &TunnelSettings,
        client: &str,
        exception: &Exception,
        valid_tail: &str,
        labels_above: usize,
        now: i64,
    ) -> Option<String> {
        if s.action != TunnelAction::Block {
            return None;
        }
        let suffix = suffix_above(exception, valid_tail, labels_above)?;
        let mut domains = vec![suffix];
        if let Some(rd) = psl::domain_str(valid_tail) {
            if rd != suffix {
                domains.push(rd);
            }
        }
        if !self.clients.contains_key(client) {
            self.clients.insert(Arc::from(client), HashMap::new());
        }
        for d in &domains {
            self.block(client, d, s, now);
        }
        Some(format!(
            "{} refused for this client for {}s",
            domains.join(" and "),
            s.cooldown_secs
        ))
    }

    /// Refuses `domain` for `client` (created by the caller) for the
    /// cool-down; the hourly count starts again after it, the daily does not.
    fn block(&mut self, client: &str, domain: &str, s: &TunnelSettings, now: i64) {
        let budgets = self.clients.get_mut(client).expect("created by the caller");
        if !budgets.contains_key(domain) {
            self.domains += 1;
        }
        let b = budgets.entry(domain.into()).or_default();
        b.hourly_from = now;
        b.hourly = Span {
            secs: b.hourly.secs,
            ..Span::default()
        };
        b.blocked_until = now + s.cooldown_secs as i64;
        b.last_used = now;
        self.bound();
    }

    fn charge(&mut self, client: &str, pending: Vec<Pending<'_>>, now: i64) {
        let budgets = self.clients.get_mut(client).expect("created by check");
        for p in pending {
            let Some(cost) = p.cost else { continue };
            let b = match budgets.get_mut(p.domain) {
                Some(b) => b,
                None => {
                    self.domains += 1;
                    budgets.entry(p.domain.into()).or_default()
                }
            };
            let bytes = cost.bytes.min(u32::MAX as u64) as u32;
            b.tokens.extend(cost.tokens.iter().copied());
            b.charges.push_back(Charge {
                at: now,
                hash: p.hash,
                cost: bytes,
                tokens: cost.tokens.into_boxed_slice(),
            });
            b.seen.insert(p.hash);
            b.bytes += bytes as u64;
            b.hourly.push(bytes);
            b.recent.push(bytes);
            b.last_used = now;
            self.names += 1;
            if b.charges.len() > MAX_NAMES_PER_DOMAIN {
                b.pop_front(&mut self.names);
            }
        }
        self.bound();
    }

    /// Evicts the least recently used budgets (unblocked ones first) until
    /// the table is within its bounds.
    fn bound(&mut self) {
        if self.domains <= MAX_DOMAINS && self.names <= MAX_TOTAL_NAMES {
            return;
        }
        let mut all: Vec<(bool, i64, Arc<str>, Box<str>)> = Vec::with_capacity(self.domains);
        for (c, m) in &self.clients {
            for (d, b) in m {
                all.push((
                    b.blocked_until > b.last_used,
                    b.last_used,
                    c.clone(),
                    d.clone(),
                ));
            }
        }
        all.sort_by_key(|k| (k.0, k.1));
        // Evict an eighth at a time so the sort is paid for rarely.
        let target_domains = MAX_DOMAINS - MAX_DOMAINS / 8;
        let target_names = MAX_TOTAL_NAMES - MAX_TOTAL_NAMES / 8;
        for (_, _, c, d) in all {
            if self.domains <= target_domains && self.names <= target_names {
                break;
            }
            if let Some(m) = self.clients.get_mut(&c) {
                if let Some(b) = m.remove(&d) {
                    self.domains -= 1;
                    self.names -= b.charges.len();
                }
                if m.is_empty() {
                    self.clients.remove(&c);
                }
            }
        }
    }

    /// Budgets and names currently tracked.
    #[cfg(test)]
    fn tracked(&self) -> (usize, usize) {
        (self.domains, self.names)
    }
}

/// The domains a name allowed through the wildcard `suffix` is charged to,
/// each with the text left of it: the suffix, and the name's registered
/// domain when that is another one.
fn charged_domains<'n>(suffix: &'n str, name: &'n str) -> Vec<(&'n str, &'n str)> {
    let mut out = vec![(suffix, &name[..name.len() - suffix.len() - 1])];
    if let Some(rd) = psl::domain_str(name) {
        if rd != suffix && rd.len() < name.len() {
            out.push((rd, &name[..name.len() - rd.len() - 1]));
        }
    }
    out
}

/// The fixed suffix of the most specific wildcard in `exception` that matches
/// `host`; `None` when an exact host matches (or no pattern does), in which
/// case the name is not budgeted at all.
pub(super) fn wildcard_suffix<'e>(exception: &'e Exception, host: &Host) -> Option<&'e str> {
    let mut best: Option<&str> = None;
    for p in &exception.hosts {
        if !p.matches(host) {
            continue;
        }
        match p {
            HostPattern::Exact(_) => return None,
            _ => {
                let s = p.fixed_suffix().as_str();
                if best.is_none_or(|b| s.len() > b.len()) {
                    best = Some(s);
                }
            }
        }
    }
    best
}

/// Whether `name` (made of labels that may break hostname syntax) sits under
/// a wildcard of `exception`: the labels right of the offending ones form a
/// valid name equal to or below a wildcard's fixed suffix.
pub fn under_wildcard(exception: &Exception, valid_tail: &str, labels_above: usize) -> bool {
    suffix_above(exception, valid_tail, labels_above).is_some()
}

/// The fixed suffix of the most specific wildcard of `exception` that a name
/// of `labels_above` labels (of any bytes) left of `valid_tail` sits under.
fn suffix_above<'e>(
    exception: &'e Exception,
    valid_tail: &str,
    labels_above: usize,
) -> Option<&'e str> {
    if labels_above == 0 {
        return None;
    }
    let mut best: Option<&str> = None;
    for p in &exception.hosts {
        let fits = match p {
            HostPattern::Exact(_) => false,
            HostPattern::Subdomains(s) => {
                valid_tail == s.as_str() || is_strict_subdomain(valid_tail, s.as_str())
            }
            HostPattern::LabelGlob { rest, .. } => labels_above == 1 && valid_tail == rest.as_str(),
        };
        if fits {
            let s = p.fixed_suffix().as_str();
            if best.is_none_or(|b| s.len() > b.len()) {
                best = Some(s);
            }
        }
    }
    best
}

/// How much a name's variable labels look like encoded data, as a factor in
/// `1.0..=MAX_WEIGHT` on the bytes they cost. Character classes, not
/// entropy: on a few dozen characters entropy barely separates hex from
/// words, while encoded data alternates letters and digits constantly and
/// lacks vowels (random base32 has ~16%, hex ~12%, names people pick ~35%).
/// Short names and hyphenated words weigh nothing extra.
pub fn encoded_weight(variable: &str) -> f64 {
    let text: Vec<u8> = variable.bytes().filter(u8::is_ascii_alphanumeric).collect();
    let n = text.len();
    if n < MIN_WEIGHTED_LEN {
        return 1.0;
    }
    let switches = text
        .windows(2)
        .filter(|w| w[0].is_ascii_digit() != w[1].is_ascii_digit())
        .count();
    let vowels = text.iter().filter(|b| b"aeiouAEIOU".contains(b)).count();
    let mix = (switches as f64 / n as f64 / 0.25).min(1.0);
    let unpronounceable = ((0.30 - vowels as f64 / n as f64) / 0.15).clamp(0.0, 1.0);
    // Longer runs are more telling than short ones.
    let length = ((n - MIN_WEIGHTED_LEN) as f64 / 32.0).min(1.0);
    1.0 + (MAX_WEIGHT - 1.0) * (0.5 * mix + 0.5 * unpronounceable) * length
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_yaml;
    use crate::policy::host::parse_host;

    fn policy(extra_settings: &str) -> crate::policy::Policy {
        from_yaml(&format!(
            "settings:\n  dns:\n    tunnel: {{ {extra_settings} }}\nexceptions:\n\
             - id: wild\n  owner: o\n  reason: r\n  hosts: [\"*.cdn.test\", exact.test, \"api-*.glob.test\", \"*.a.zone.test\", \"*.b.zone.test\"]\n"
        ))
        .unwrap()
    }

    fn check(
        d: &mut TunnelDetector,
        p: &crate::policy::Policy,
        client: &str,
        name: &str,
        now: i64,
    ) -> TunnelOutcome {
        let e = &p.exceptions[0];
        let h = parse_host(name).unwrap();
        assert!(
            e.hosts.iter().any(|x| x.matches(&h)),
            "{name} not allowed by the test policy"
        );
        d.check(&p.settings.dns.tunnel, client, &h, e, now).outcome
    }

    /// Distinct labels of one token each (nothing for the dictionary to
    /// share) that weigh exactly 1.0 (they read like words) and cost 31
    /// bytes to a budget.
    fn label(i: usize) -> String {
        let syllables: String = format!("{i:06}")
            .bytes()
            .map(|d| {
                let d = (d - b'0') as usize;
                format!("{}{}", &"bcdfghklmn"[d..=d], &"aeiouaeiou"[d..=d])
            })
            .collect();
        let l = format!("{syllables}servicenumberproductioneastregionwest");
        let cost = Cost::of(&l, encoded_weight(&l), None, &RandomState::new()).bytes;
        assert_eq!((l.len(), encoded_weight(&l), cost), (49, 1.0, 31), "{l}");
        l
    }

    #[test]
    fn exact_hosts_are_never_budgeted() {
        let p = policy("block_bytes: 10");
        let mut d = TunnelDetector::new();
        for t in 0..100 {
            assert_eq!(check(&mut d, &p, "-", "exact.test", t), TunnelOutcome::Ok);
        }
        assert_eq!(d.tracked(), (0, 0));
    }

    #[test]
    fn hard_limits_under_wildcards() {
        let p = policy("max_name_len: 40, max_label_len: 10");
        let mut d = TunnelDetector::new();
        assert_eq!(
            check(&mut d, &p, "-", "abcdefghij.cdn.test", 0),
            TunnelOutcome::Ok
        );
        assert_eq!(
            check(&mut d, &p, "-", "abcdefghijk.cdn.test", 0),
            TunnelOutcome::Block
        );
        assert_eq!(
            check(&mut d, &p, "-", "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.cdn.test", 0),
            TunnelOutcome::Ok
        );
        assert_eq!(
            check(
                &mut d,
                &p,
                "-",
                "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.cdn.test",
                0
            ),
            TunnelOutcome::Block
        );
        // The fixed suffix's own labels do not count against max_label_len.
        let p2 = from_yaml(
            "settings: { dns: { tunnel: { max_label_len: 5 } } }\nexceptions:\n\
             - { id: x, owner: o, reason: r, hosts: [\"*.longlabelhere.test\"] }\n",
        )
        .unwrap();
        assert_eq!(
            check(&mut d, &p2, "-", "abc.longlabelhere.test", 0),
            TunnelOutcome::Ok
        );
        // log: reported, not refused.
        let p3 = policy("action: log, max_label_len: 10");
        assert_eq!(
            check(&mut d, &p3, "-", "abcdefghijk.cdn.test", 0),
            TunnelOutcome::Alert
        );
        let p4 = policy("action: off, max_label_len: 10");
        assert_eq!(
            check(&mut d, &p4, "-", "abcdefghijk.cdn.test", 0),
            TunnelOutcome::Ok
        );
    }

    #[test]
    fn budget_blocks_new_names_then_cools_down() {
        let p = policy("block_bytes: 310, alert_bytes: 100000, alert_unique_names: 1000, cooldown: 1h, block_window: 1h");
        let mut d = TunnelDetector::new();
        // 10 names of 30 bytes fit (300 <= 310), the 11th does not.
        for i in 0..10 {
            assert_eq!(
                check(
                    &mut d,
                    &p,
                    "c1",
                    &format!("{}.cdn.test", label(i)),
                    i as i64
                ),
                TunnelOutcome::Ok,
                "{i}"
            );
        }
        // Repeats are free.
        for i in 0..10 {
            assert_eq!(
                check(&mut d, &p, "c1", &format!("{}.cdn.test", label(i)), 20),
                TunnelOutcome::Ok
            );
        }
        assert_eq!(
            check(&mut d, &p, "c1", &format!("{}.cdn.test", label(10)), 30),
            TunnelOutcome::Block
        );
        // Cool-down: even a name seen before is refused now.
        assert_eq!(
            check(&mut d, &p, "c1", &format!("{}.cdn.test", label(0)), 40),
            TunnelOutcome::Block
        );
        // Other clients have their own budget.
        assert_eq!(
            check(&mut d, &p, "c2", &format!("{}.cdn.test", label(10)), 40),
            TunnelOutcome::Ok
        );
        // Still blocked just before the cool-down ends, open after.
        assert_eq!(
            check(
                &mut d,
                &p,
                "c1",
                &format!("{}.cdn.test", label(0)),
                30 + 3599
            ),
            TunnelOutcome::Block
        );
        assert_eq!(
            check(
                &mut d,
                &p,
                "c1",
                &format!("{}.cdn.test", label(0)),
                30 + 3600
            ),
            TunnelOutcome::Ok
        );
    }

    #[test]
    fn window_slides() {
        let p = policy(
            "block_bytes: 100, block_window: 100s, alert_bytes: 100000, alert_unique_names: 1000",
        );
        let mut d = TunnelDetector::new();
        // 3 × 31 bytes per 100 s: fine forever as the window slides.
        for i in 0..60 {
            let t = (i / 3) as i64 * 101;
            assert_eq!(
                check(&mut d, &p, "-", &format!("{}.cdn.test", label(i)), t),
                TunnelOutcome::Ok,
                "{i}"
            );
        }
        // Names are remembered for the daily budget, and forgotten after it.
        assert_eq!(d.tracked().1, 60);
        let t = 19 * 101 + DAY_SECS;
        check(&mut d, &p, "-", &format!("{}.cdn.test", label(60)), t);
        assert!(d.tracked().1 <= 6);
    }

    #[test]
    fn registered_domain_adds_up_across_wildcards() {
        // *.a.zone.test and *.b.zone.test are separate wildcards of one zone.
        let p = policy("block_bytes: 200, alert_bytes: 100000, alert_unique_names: 1000");
        let mut d = TunnelDetector::new();
        let mut blocked_at = None;
        for i in 0..20 {
            let zone = if i % 2 == 0 { "a" } else { "b" };
            let name = format!("{}.{zone}.zone.test", label(i));
            if check(&mut d, &p, "-", &name, i as i64) == TunnelOutcome::Block {
                blocked_at = Some(i);
                break;
            }
        }
        // Each wildcard alone would take 6 names (6 × 31 = 186 bytes); the
        // zone, charged 33 bytes a name (label + ".a"), refuses the 7th.
        assert_eq!(blocked_at, Some(6));
    }

    #[test]
    fn alerts_before_blocking() {
        let p = policy("alert_unique_names: 5, alert_bytes: 100000, block_bytes: 100000");
        let mut d = TunnelDetector::new();
        let got: Vec<_> = (0..7)
            .map(|i| check(&mut d, &p, "-", &format!("{}.cdn.test", label(i)), 0))
            .collect();
        assert_eq!(&got[..5], &[TunnelOutcome::Ok; 5]);
        assert_eq!(&got[5..], &[TunnelOutcome::Alert; 2]);
    }

    #[test]
    fn log_action_never_blocks() {
        let p =
            policy("action: log, block_bytes: 50, alert_bytes: 100000, alert_unique_names: 1000");
        let mut d = TunnelDetector::new();
        let got: Vec<_> = (0..5)
            .map(|i| check(&mut d, &p, "-", &format!("{}.cdn.test", label(i)), 0))
            .collect();
        assert_eq!(
            got,
            vec![
                TunnelOutcome::Ok,
                TunnelOutcome::Alert,
                TunnelOutcome::Alert,
                TunnelOutcome::Alert,
                TunnelOutcome::Alert
            ]
        );
    }

    #[test]
    fn label_glob_is_budgeted_under_its_rest() {
        let p = policy("block_bytes: 40, alert_bytes: 100000, alert_unique_names: 1000");
        let mut d = TunnelDetector::new();
        assert_eq!(
            check(&mut d, &p, "-", "api-aaaaaaaaaaaaaaaaaaaa.glob.test", 0),
            TunnelOutcome::Ok
        );
        assert_eq!(
            check(&mut d, &p, "-", "api-eeeeeeeeeeeeeeeeeeee.glob.test", 0),
            TunnelOutcome::Ok
        );
        assert_eq!(
            check(&mut d, &p, "-", "api-oooooooooooooooooooo.glob.test", 0),
            TunnelOutcome::Block
        );
    }

    #[test]
    fn memory_is_bounded() {
        let p = policy(
            "block_bytes: 1000000000, daily_bytes: 1000000000, alert_bytes: 1000000000, alert_unique_names: 1000000000",
        );
        let mut d = TunnelDetector::new();
        for c in 0..(MAX_DOMAINS + 100) {
            check(&mut d, &p, &format!("client-{c}"), "x.cdn.test", c as i64);
        }
        assert!(d.tracked().0 <= MAX_DOMAINS);
        for i in 0..(MAX_NAMES_PER_DOMAIN + 10) {
            check(&mut d, &p, "one", &format!("n{i}.cdn.test"), 0);
        }
        let one = d.clients.get("one").unwrap().get("cdn.test").unwrap();
        assert_eq!(one.charges.len(), MAX_NAMES_PER_DOMAIN);
        assert_eq!(one.seen.len(), MAX_NAMES_PER_DOMAIN);
    }

    #[test]
    fn weights() {
        // Short or wordy names: no extra weight.
        for s in [
            "d111111abcdef8",
            "payments-api.prod",
            "internal-x-123456.us-east-1",
            "my-company-terraform-state-prod",
        ] {
            assert!(encoded_weight(s) < 1.15, "{s}: {}", encoded_weight(s));
        }
        // Long base32 / hex runs: close to the maximum.
        let b32 = "mfrggzdfmztwq2lknnwg23tpobyxe43uov3ho6dzpiytmnzq";
        let hex = "3f9a0c77d2e41b5a8c0f6e2d9b71a4c3e5f60718293a4b5c";
        assert!(encoded_weight(b32) > 1.3, "{}", encoded_weight(b32));
        assert!(encoded_weight(hex) > 1.3, "{}", encoded_weight(hex));
        assert!(encoded_weight(b32) <= MAX_WEIGHT);
    }

    /// `n` bytes of payload from `seed`, as base32 split into labels of at
    /// most 40: what a tunnel fitted to the caps sends.
    fn tunnel_name(seed: u64, n: usize, suffix: &str) -> String {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let data: Vec<u8> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let mut b32 = String::new();
        let (mut acc, mut bits) = (0u32, 0u32);
        for b in data {
            acc = (acc << 8) | b as u32;
            bits += 8;
            while bits >= 5 {
                b32.push(
                    b"abcdefghijklmnopqrstuvwxyz234567"[((acc >> (bits - 5)) & 31) as usize]
                        as char,
                );
                bits -= 5;
            }
            acc &= (1 << bits) - 1;
        }
        let labels: Vec<&str> = b32
            .as_bytes()
            .chunks(40)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!("{}.{suffix}", labels.join("."))
    }

    /// The most payload `sent` (time, bytes) holds within any 24 h.
    fn most_in_a_day(sent: &[(i64, usize)]) -> usize {
        sent.iter()
            .map(|&(t, _)| {
                sent.iter()
                    .filter(|&&(u, _)| u >= t && u < t + DAY_SECS)
                    .map(|&(_, b)| b)
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn defaults_hold_a_fitted_burst_to_a_kib() {
        let p = policy("");
        let s = &p.settings.dns.tunnel;
        let mut d = TunnelDetector::new();
        let mut moved = 0;
        let mut blocked = None;
        for i in 0..100 {
            let name = tunnel_name(i, 60, "cdn.test");
            assert!(name.len() <= s.max_name_len, "{name}");
            match check(&mut d, &p, "c", &name, i as i64) {
                TunnelOutcome::Block => {
                    blocked = Some(i);
                    break;
                }
                _ => moved += 60,
            }
        }
        assert!(blocked.is_some(), "never blocked");
        assert!(moved <= 1024, "{moved} bytes moved before the block");
        assert!(moved >= 512, "{moved}: the budget is not that tight");
    }

    #[test]
    fn a_drip_under_the_hourly_budget_meets_the_daily_one() {
        // One fitted query every 10 minutes: ~600 B an hour, far under the
        // hourly budget, 8 KiB within about 14 hours.
        let p = policy("");
        let s = p.settings.dns.tunnel.clone();
        let mut d = TunnelDetector::new();
        let e = &p.exceptions[0];
        let mut sent = Vec::new();
        let mut notes = Vec::new();
        let mut next = 0;
        for tick in 0..(3 * 144) {
            let now = tick * 600;
            let h = parse_host(&tunnel_name(next, 60, "cdn.test")).unwrap();
            let a = d.check(&s, "c", &h, e, now);
            if a.outcome == TunnelOutcome::Block {
                notes.push(a.note.unwrap());
                continue;
            }
            sent.push((now, 60));
            next += 1;
        }
        assert!(
            notes[0].contains("daily_bytes 8192"),
            "the daily budget stops it first: {}",
            notes[0]
        );
        let day = most_in_a_day(&sent);
        assert!(day <= s.daily_bytes as usize, "{day} bytes in a day");
        assert!(day >= 4096, "{day}: the daily budget is not that tight");
        // It resumes as the day slides, and stays bounded over three days.
        assert!(sent.iter().any(|&(t, _)| t > 2 * DAY_SECS), "never resumed");
    }

    #[test]
    fn bursts_after_each_cool_down_add_up_to_the_day() {
        let p = policy("");
        let mut d = TunnelDetector::new();
        let mut sent = Vec::new();
        let mut next = 0;
        // Far faster than allowed: a query every 10 s, for two days.
        for now in (0..(2 * DAY_SECS)).step_by(10) {
            let name = tunnel_name(next, 60, "cdn.test");
            if check(&mut d, &p, "c", &name, now) != TunnelOutcome::Block {
                sent.push((now, 60));
                next += 1;
            }
        }
        let day = most_in_a_day(&sent);
        assert!(day <= 8192, "{day} bytes in a day");
        let first_hour: usize = sent.iter().filter(|s| s.0 < 3600).map(|s| s.1).sum();
        assert!(first_hour <= 1024, "{first_hour} in the first hour");
    }

    #[test]
    fn repeated_tokens_cost_what_choosing_them_carries() {
        let p = policy("alert_bytes: 100000, alert_unique_names: 1000");
        let mut d = TunnelDetector::new();
        let spent = |d: &TunnelDetector| d.clients["c"]["cdn.test"].bytes;
        check(
            &mut d,
            &p,
            "c",
            "kafka-0.kafka-headless.streaming.cdn.test",
            0,
        );
        let first = spent(&d);
        check(
            &mut d,
            &p,
            "c",
            "kafka-1.kafka-headless.streaming.cdn.test",
            1,
        );
        let second = spent(&d) - first;
        // `kafka`, `headless` and `streaming` are known; `1` is new.
        assert!(first >= 16, "{first}");
        assert!(second <= 6, "{second}");
        // A repeat is free.
        check(
            &mut d,
            &p,
            "c",
            "kafka-1.kafka-headless.streaming.cdn.test",
            2,
        );
        assert_eq!(spent(&d), first + second);
    }

    #[test]
    fn a_dictionary_of_tokens_carries_no_more_than_it_pays() {
        // The tunnel first sends 256 three-letter tokens, then names made
        // only of them (a byte each): still held to the hourly budget.
        let p = policy("");
        let mut d = TunnelDetector::new();
        let token = |b: u8| format!("{}{}z", (b'a' + b / 16) as char, (b'a' + b % 16) as char);
        let mut moved = 0usize;
        let mut now = 0;
        for chunk in (0..=255u8).collect::<Vec<_>>().chunks(20) {
            let name = chunk.iter().map(|b| token(*b)).collect::<Vec<_>>();
            let name = format!("{}.cdn.test", name.join("."));
            if check(&mut d, &p, "c", &name, now) == TunnelOutcome::Block {
                break;
            }
            moved += chunk.len();
            now += 1;
        }
        let mut x = 7u32;
        loop {
            let bytes: Vec<u8> = (0..25)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (x >> 16) as u8
                })
                .collect();
            let name = bytes.iter().map(|b| token(*b)).collect::<Vec<_>>();
            let name = format!("{}.cdn.test", name.join("."));
            if check(&mut d, &p, "c", &name, now) == TunnelOutcome::Block {
                break;
            }
            moved += bytes.len();
            now += 1;
        }
        assert!(
            moved <= p.settings.dns.tunnel.block_bytes as usize,
            "{moved} bytes through the dictionary"
        );
    }

    #[test]
    fn a_name_that_is_not_a_host_name_cools_the_wildcard_down() {
        let p = policy("");
        let s = p.settings.dns.tunnel.clone();
        let e = &p.exceptions[0];
        let mut d = TunnelDetector::new();
        // `zh4daa-j\xe4ger.a.zone.test`: the valid tail is a.zone.test.
        let note = d.strike(&s, "c", e, "a.zone.test", 1, 100).unwrap();
        assert!(note.contains("a.zone.test and zone.test"), "{note}");
        assert!(note.contains("3600s"), "{note}");
        assert_eq!(
            check(&mut d, &p, "c", "www.a.zone.test", 101),
            TunnelOutcome::Block
        );
        // The zone's other wildcard too (one registered domain)...
        assert_eq!(
            check(&mut d, &p, "c", "www.b.zone.test", 101),
            TunnelOutcome::Block
        );
        // ...but not other zones, nor other clients.
        assert_eq!(
            check(&mut d, &p, "c", "www.cdn.test", 101),
            TunnelOutcome::Ok
        );
        assert_eq!(
            check(&mut d, &p, "other", "www.a.zone.test", 101),
            TunnelOutcome::Ok
        );
        // Open again after the cool-down.
        assert_eq!(
            check(&mut d, &p, "c", "www.a.zone.test", 3700),
            TunnelOutcome::Ok
        );
        // Names under no wildcard, `log` and `off` strike nothing.
        assert_eq!(d.strike(&s, "c", e, "exact.test", 1, 200), None);
        let log = policy("action: log");
        assert_eq!(
            d.strike(&log.settings.dns.tunnel, "c", e, "cdn.test", 1, 200),
            None
        );
        assert_eq!(
            check(&mut d, &p, "c", "www2.cdn.test", 201),
            TunnelOutcome::Ok
        );
        // A label glob takes one label only.
        assert!(d.strike(&s, "c", e, "glob.test", 2, 300).is_none());
        assert!(d.strike(&s, "c", e, "glob.test", 1, 300).is_some());
    }
}
