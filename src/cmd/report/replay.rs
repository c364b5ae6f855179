//! `egressd check --against LOG… POLICY`: decides every logged request
//! again under a proposed policy and prints what would change — requests
//! that were allowed and would now be denied, and the reverse — grouped by
//! destination with counts, clients and the exceptions involved.
//!
//! Each line becomes a TARGET in `explain`'s forms and goes through
//! [`crate::cmd::offline::decide_target`], so the replay decides exactly as
//! `explain` and the proxy do. What depends on the network or on state is
//! not replayed: name resolution (`private_address` for names), tunnel
//! budgets (`dns_tunnel`), SNI and Host checks, overload, malformed input
//! and log failures. Those lines are counted as not replayable.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::cmd::offline::decide_target;
use crate::policy::{ClientIdx, Logged, Policy};

use super::read::{bracket, strip_port, LogLine};
use super::text::{clean, thousands};

/// Distinct changed destinations itemised per direction.
pub const MAX_CHANGES: usize = 10_000;
/// Changed destinations printed per direction.
const SHOWN: usize = 50;

/// Reasons whose lines are not policy decisions a replay can repeat.
const NOT_REPLAYED: &[&str] = &[
    "malformed",
    "log_unavailable",
    "loop_detected",
    "overloaded",
    "host_mismatch",
    "sni_mismatch",
    "dns_tunnel",
    "upstream_error",
];

/// One group of changed decisions: same request shape, same before/after.
#[derive(Debug, Default, Clone)]
pub struct Change {
    pub count: u64,
    pub clients: Vec<String>,
    pub clients_more: bool,
    pub example: String,
}

/// Key of a change: the request shape without its path, then what it was
/// and what it becomes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChangeKey {
    pub what: String,
    pub before: String,
    pub after: String,
}

#[derive(Debug, Default)]
pub struct Replay {
    pub lines: u64,
    pub replayed: u64,
    pub unchanged: u64,
    /// Allowed by another exception than before (still allowed).
    pub other_exception: u64,
    pub not_replayable: BTreeMap<String, u64>,
    pub newly_denied: HashMap<ChangeKey, Change>,
    pub newly_allowed: HashMap<ChangeKey, Change>,
    pub newly_denied_total: u64,
    pub newly_allowed_total: u64,
    /// Changes beyond [`MAX_CHANGES`] distinct groups (counted, not itemised).
    pub untracked: u64,
}

/// What a line asked for, as `decide_target` reads it (the target,
/// whether inside an intercepted tunnel) and as the report names it;
/// `Err(why)` when a replay cannot ask it again.
fn target_of(l: &LogLine<'_>, dest: &str) -> Result<(String, bool, String), String> {
    let port = l.port.unwrap_or(0);
    let method = l.method.as_deref().unwrap_or("GET");
    let path = l.path.as_deref().unwrap_or("/");
    let host = bracket(dest);
    match &*l.proto {
        "dns" => Ok((
            format!("dns:{dest}/{}", l.qtype.as_deref().unwrap_or("A")),
            false,
            format!("dns {dest} {}", l.qtype.as_deref().unwrap_or("A")),
        )),
        "connect" => Ok((
            format!("{host}:{port}"),
            l.note.as_deref().is_some_and(|n| n.contains("intercept")),
            format!("CONNECT {host}:{port}"),
        )),
        "http" => Ok((
            format!("{method} http://{host}:{port}{path}"),
            false,
            format!("{method} http://{host}:{port}"),
        )),
        "tls" => Ok((
            format!("{method} https://{host}:{port}{path}"),
            true,
            format!("{method} https://{host}:{port} (intercepted)"),
        )),
        other => Err(format!("proto {other}")),
    }
}

impl Replay {
    /// Decides one logged line again under `policy` as of `now`.
    pub fn add(&mut self, policy: &Policy, l: &LogLine<'_>, now: i64) {
        if l.is_close() {
            // The connection is replayed once, from its open line.
            return;
        }
        self.lines += 1;
        let reason = l.reason();
        let skip =
            |s: &mut Replay, why: &str| *s.not_replayable.entry(why.to_string()).or_default() += 1;
        if NOT_REPLAYED.contains(&reason) {
            return skip(self, reason);
        }
        let Some(dest) = l.destination() else {
            return skip(self, "no destination");
        };
        let is_ip = dest.trim_matches(['[', ']']).parse::<IpAddr>().is_ok();
        if reason == "private_address" && !is_ip {
            // Depends on what the name resolved to; a replay does not resolve.
            return skip(self, "private_address (name)");
        }
        let (target, intercept, what) = match target_of(l, dest) {
            Ok(t) => t,
            Err(why) => return skip(self, &why),
        };
        let client = client_in(policy, l);
        let d = match decide_target(policy, client, &target, intercept, now) {
            Ok(d) => d,
            Err(_) => return skip(self, "unreadable target"),
        };
        self.replayed += 1;
        let was_allowed = l.allowed();
        let now_allowed = d.logged() == Logged::Allow;
        let before = describe(was_allowed, reason, l.exception.as_deref());
        let after = describe(now_allowed, d.reason.as_str(), d.exception.map(|e| &*e.id));
        let (map, total) = match (was_allowed, now_allowed) {
            (true, false) => (&mut self.newly_denied, &mut self.newly_denied_total),
            (false, true) => (&mut self.newly_allowed, &mut self.newly_allowed_total),
            (true, true) => {
                if l.exception.as_deref() != d.exception.map(|e| &*e.id) {
                    self.other_exception += 1;
                } else {
                    self.unchanged += 1;
                }
                return;
            }
            (false, false) => {
                self.unchanged += 1;
                return;
            }
        };
        *total += 1;
        let key = ChangeKey {
            what,
            before,
            after,
        };
        if !map.contains_key(&key) && map.len() >= MAX_CHANGES {
            self.untracked += 1;
            return;
        }
        let c = map.entry(key).or_insert_with(|| Change {
            example: l.example(),
            ..Change::default()
        });
        c.count += 1;
        let who = l.who();
        if !c.clients.iter().any(|x| x == who) {
            if c.clients.len() < 8 {
                c.clients.push(who.to_string());
            } else {
                c.clients_more = true;
            }
        }
    }

    /// Prints the summary and the changes, largest first.
    pub fn print(
        &self,
        policy_path: &str,
        logs: &[PathBuf],
        out: &mut dyn Write,
    ) -> io::Result<()> {
        writeln!(
            out,
            "replayed {} of {} logged decisions from {} log{} against {policy_path}",
            thousands(self.replayed),
            thousands(self.lines),
            logs.len(),
            if logs.len() == 1 { "" } else { "s" }
        )?;
        writeln!(
            out,
            "  unchanged {}, allowed by another exception {}, newly denied {}, newly allowed {}",
            thousands(self.unchanged),
            thousands(self.other_exception),
            thousands(self.newly_denied_total),
            thousands(self.newly_allowed_total)
        )?;
        if !self.not_replayable.is_empty() {
            let n: Vec<String> = self
                .not_replayable
                .iter()
                .map(|(k, v)| format!("{} {}", clean(k), thousands(*v)))
                .collect();
            writeln!(
                out,
                "  not replayable (depend on resolution, state or input, not the policy): {}",
                n.join(", ")
            )?;
        }
        for (title, map) in [
            ("newly denied", &self.newly_denied),
            ("newly allowed", &self.newly_allowed),
        ] {
            writeln!(out)?;
            writeln!(out, "{title} ({} groups):", map.len())?;
            if map.is_empty() {
                writeln!(out, "  none")?;
                continue;
            }
            let mut v: Vec<(&ChangeKey, &Change)> = map.iter().collect();
            v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
            for (k, c) in v.iter().take(SHOWN) {
                writeln!(
                    out,
                    "  {:>8}  {}  was {}, now {}",
                    thousands(c.count),
                    clean(&k.what),
                    clean(&k.before),
                    k.after
                )?;
                writeln!(
                    out,
                    "            clients: {}{}; e.g. {}",
                    c.clients
                        .iter()
                        .map(|x| clean(x))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if c.clients_more { ", …" } else { "" },
                    clean(&c.example)
                )?;
            }
            if v.len() > SHOWN {
                writeln!(out, "  … and {} more groups", v.len() - SHOWN)?;
            }
        }
        if self.untracked > 0 {
            writeln!(
                out,
                "\nnote: {} changes fell beyond {MAX_CHANGES} distinct groups and are counted, not listed",
                thousands(self.untracked)
            )?;
        }
        Ok(())
    }
}

/// `egressd check --against LOG… POLICY`: replays the logs against the
/// policy and prints what would change. Exit status 0, or 1 when the policy
/// does not load or a log cannot be read; changes alone do not fail it (a
/// reviewer reads them).
pub fn run_against(
    policy_path: &Path,
    logs: &[PathBuf],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let policy = match crate::policy::load(policy_path) {
        Ok(p) => p,
        Err(_) => {
            let _ = writeln!(
                err,
                "egressd check --against: {} does not load, nothing replayed",
                policy_path.display()
            );
            return 1;
        }
    };
    let now = crate::time::unix_now();
    let mut r = Replay::default();
    match super::read::for_each_line(logs, |l, _| r.add(&policy, l, now)) {
        Ok(st) => {
            if let Some(first) = &st.first_unreadable {
                let _ = writeln!(
                    err,
                    "egressd check --against: {} lines not understood, the first at {first}",
                    st.unreadable
                );
            }
        }
        Err(e) => {
            let _ = writeln!(err, "egressd check --against: {e}");
            return 1;
        }
    }
    let _ = writeln!(out);
    if r.print(&policy_path.display().to_string(), logs, out)
        .is_err()
    {
        return 1;
    }
    0
}

fn describe(allowed: bool, reason: &str, exception: Option<&str>) -> String {
    match (allowed, exception) {
        (true, Some(e)) => format!("allowed by {e}"),
        (true, None) => format!("allowed ({reason})"),
        (false, Some(e)) => format!("denied {reason} (closest {e})"),
        (false, None) => format!("denied {reason}"),
    }
}

/// The logged client in the proposed policy: by id if it still exists
/// there, otherwise by source address (a new `settings.clients` entry may
/// now name an anonymous client).
fn client_in(policy: &Policy, l: &LogLine<'_>) -> Option<ClientIdx> {
    let id = l.client();
    if id != "-" {
        if let Some(i) = policy.clients.iter().position(|c| &*c.id == id) {
            return Some(i as ClientIdx);
        }
    }
    let src: IpAddr = l.src.as_deref().map(strip_port)?.parse().ok()?;
    policy.identify(src, None).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_yaml;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn changes() {
        let p = from_yaml(
            "settings:\n  clients:\n    - id: ci\n      sources: [10.8.0.0/16]\nexceptions:\n  - id: npm\n    owner: o\n    reason: r\n    hosts: [registry.npmjs.org]\n    ports: [443]\n  - id: ci-only\n    owner: o\n    reason: r\n    clients: [ci]\n    hosts: [artifacts.example.com]\n",
        )
        .unwrap();
        let lines = [
            // was allowed by pypi, which the proposal drops
            r#"{"ts":"2027-01-01T00:00:00Z","client":"-","src":"10.1.1.1:5","proto":"connect","host":"pypi.org","port":443,"decision":"allow","reason":"exception","exception":"pypi"}"#,
            // was denied, now allowed
            r#"{"ts":"2027-01-01T00:00:00Z","client":"-","src":"10.1.1.1:5","proto":"connect","host":"registry.npmjs.org","port":443,"decision":"deny","reason":"no_exception"}"#,
            // anonymous before; the proposal names 10.8/16 as ci
            r#"{"ts":"2027-01-01T00:00:00Z","client":"-","src":"10.8.0.9:5","proto":"http","host":"artifacts.example.com","port":80,"method":"GET","path":"/a","decision":"deny","reason":"no_exception"}"#,
            r#"{"ts":"2027-01-01T00:00:00Z","client":"-","src":"10.1.1.1:5","proto":"dns","qname":"registry.npmjs.org","qtype":"A","decision":"allow","reason":"exception","exception":"npm"}"#,
            r#"{"ts":"2027-01-01T00:00:00Z","client":"-","src":"10.1.1.1:5","proto":"connect","host":"x.example","port":443,"decision":"deny","reason":"dns_tunnel"}"#,
        ];
        let mut r = Replay::default();
        for l in lines {
            r.add(&p, &serde_json::from_str(l).unwrap(), NOW);
        }
        assert_eq!(r.newly_denied_total, 1);
        assert_eq!(r.newly_allowed_total, 2);
        assert_eq!(r.unchanged, 1);
        assert_eq!(r.not_replayable["dns_tunnel"], 1);
        let mut out = Vec::new();
        r.print("p/", &[PathBuf::from("a.log")], &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("CONNECT pypi.org:443  was allowed by pypi, now denied no_exception"),
            "{out}"
        );
        assert!(out.contains("now allowed by ci-only"), "{out}");
    }
}
