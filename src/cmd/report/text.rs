//! The report for a terminal or a review comment. Log contents come from
//! sandboxes, so every string from a log is stripped of control characters
//! before it reaches the terminal.

use std::io::{self, Write};

use super::{ExceptionRow, Report, Status};

/// Strings from logs without control characters (no terminal escapes).
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn list(items: &[String], more: bool) -> String {
    if items.is_empty() {
        return "-".into();
    }
    let shown: Vec<String> = items.iter().take(6).map(|c| clean(c)).collect();
    let mut s = shown.join(", ");
    let hidden = items.len().saturating_sub(6);
    if hidden > 0 || more {
        s.push_str(&format!(
            " (+{}{})",
            hidden,
            if more { " or more" } else { "" }
        ));
    }
    s
}

fn last_use(e: &ExceptionRow) -> String {
    match (&e.last_used, e.days_since_use) {
        (Some(t), Some(0)) => format!("{} (today)", &t[..10]),
        (Some(t), Some(d)) => format!("{} ({d} days ago)", &t[..10]),
        _ => "never in these logs".into(),
    }
}

fn expiry(e: &ExceptionRow) -> String {
    match (&e.expires, e.expires_in_days) {
        (Some(d), Some(n)) if n < 0 => format!("expired {d}"),
        (Some(d), Some(n)) => format!("expires {d} (in {n} days)"),
        _ => "no expiry".into(),
    }
}

pub fn render(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    header(r, out)?;
    exceptions(r, out)?;
    lifecycle(r, out)?;
    hottest(r, out)?;
    grants(r, out)?;
    denied(r, out)?;
    if !r.other_denials.is_empty() {
        writeln!(out)?;
        let o: Vec<String> = r
            .other_denials
            .iter()
            .map(|(k, v)| format!("{} {}", clean(k), thousands(*v)))
            .collect();
        writeln!(
            out,
            "== Denials no exception fixes (malformed input, tunnels, overload, log failures): {}",
            o.join(", ")
        )?;
    }
    packages(r, out)?;
    closing(r, out)
}

/// The policy, the logs read and the decisions' totals.
fn header(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    let p = &r.policy;
    writeln!(
        out,
        "egressd report, {} — policy {} ({}, mode {}, stale_after {}d)",
        r.generated_at,
        clean(&p.path),
        plural(p.exceptions, "exception", "exceptions"),
        p.mode,
        p.stale_after_days
    )?;
    let i = &r.input;
    writeln!(
        out,
        "logs: {}, {} lines, {} → {} ({} days back){}",
        plural(i.files.len(), "file", "files"),
        thousands(i.lines),
        i.first_seen.as_deref().unwrap_or("-"),
        i.last_seen.as_deref().unwrap_or("-"),
        i.days_covered,
        match &i.since {
            Some(s) => format!("; since {s}: {} lines", thousands(i.in_window)),
            None => String::new(),
        }
    )?;
    if i.unreadable > 0 || i.bad_timestamps > 0 {
        writeln!(
            out,
            "      {} unreadable, {} without a timestamp",
            thousands(i.unreadable),
            thousands(i.bad_timestamps)
        )?;
    }
    let t = &r.totals;
    let reasons: Vec<String> = t
        .denied_by_reason
        .iter()
        .map(|(k, v)| format!("{} {}", clean(k), thousands(*v)))
        .collect();
    writeln!(
        out,
        "decisions: {} allowed, {} denied{}{}",
        thousands(t.allowed),
        thousands(t.denied),
        if t.report_only_denied > 0 {
            format!(
                " ({} of them let through by mode: report)",
                thousands(t.report_only_denied)
            )
        } else {
            String::new()
        },
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" — {}", reasons.join(", "))
        }
    )?;

    Ok(())
}

/// Every exception: status, owner, hits, clients, where it is written.
fn exceptions(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(out, "== Exceptions ({})", r.exceptions.len())?;
    for e in &r.exceptions {
        writeln!(
            out,
            "  {}  [{}]  owner {}  ticket {}  {}",
            e.id,
            e.status.as_str(),
            e.owner,
            e.ticket.as_deref().unwrap_or("-"),
            expiry(e)
        )?;
        writeln!(
            out,
            "      {} hits, last used {}, clients: {}",
            thousands(e.hits),
            last_use(e),
            list(&e.clients, e.clients_more)
        )?;
        if e.near_denials > 0 {
            writeln!(
                out,
                "      {} denials named it as closest (wrong port, client, method, path, or expired)",
                thousands(e.near_denials)
            )?;
        }
        writeln!(out, "      reason: {}", e.reason.replace('\n', " "))?;
        writeln!(out, "      at {}:{}", e.file, e.line)?;
    }

    Ok(())
}

/// The stale, expired and expiring lists.
fn lifecycle(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    let p = &r.policy;
    let by_id = |id: &String| r.exceptions.iter().find(|e| &e.id == id);
    writeln!(out)?;
    writeln!(
        out,
        "== Unused for stale_after ({}d): candidates for removal ({})",
        p.stale_after_days,
        r.stale.len()
    )?;
    for id in &r.stale {
        if let Some(e) = by_id(id) {
            writeln!(
                out,
                "  {}  owner {}, last used {}  ({}:{})",
                e.id,
                e.owner,
                last_use(e),
                e.file,
                e.line
            )?;
        }
    }
    if !r.unused_recently.is_empty() {
        writeln!(
            out,
            "  not used in these logs, which cover less than stale_after: {}",
            r.unused_recently.join(", ")
        )?;
    }
    writeln!(out)?;
    writeln!(out, "== Expired ({})", r.expired.len())?;
    for id in &r.expired {
        if let Some(e) = by_id(id) {
            writeln!(
                out,
                "  {}  owner {}, {}: renew or remove  ({}:{})",
                e.id,
                e.owner,
                expiry(e),
                e.file,
                e.line
            )?;
        }
    }
    writeln!(out, "== Expiring within 14 days ({})", r.expiring.len())?;
    for id in &r.expiring {
        if let Some(e) = by_id(id) {
            writeln!(
                out,
                "  {}  owner {}, {}, {} hits  ({}:{})",
                e.id,
                e.owner,
                expiry(e),
                thousands(e.hits),
                e.file,
                e.line
            )?;
        }
    }

    Ok(())
}

/// The exceptions most used.
fn hottest(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(out, "== Hottest")?;
    let by_id = |id: &String| r.exceptions.iter().find(|e| &e.id == id);
    let total_hits: u64 = r.exceptions.iter().map(|e| e.hits).sum();
    for (n, id) in r.hottest.iter().enumerate() {
        if let Some(e) = by_id(id) {
            let days = r.input.days_covered.max(1.0);
            writeln!(
                out,
                "  {:>2}. {:<24} {:>12} hits  {:>5.1}%  ~{}/day  top: {}",
                n + 1,
                e.id,
                thousands(e.hits),
                100.0 * e.hits as f64 / total_hits.max(1) as f64,
                thousands((e.hits as f64 / days).round() as u64),
                e.hosts
                    .iter()
                    .take(3)
                    .map(|(h, c)| format!("{} ({})", clean(h), thousands(*c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
    }

    Ok(())
}

/// The most-denied destinations, each with a stub that would allow it.
fn denied(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "== Most-denied destinations (top {} of {})",
        r.denied.len(),
        r.denied_destinations
    )?;
    for (n, d) in r.denied.iter().enumerate() {
        let reasons: Vec<String> = d
            .reasons
            .iter()
            .map(|(k, v)| format!("{} {}", clean(k), thousands(*v)))
            .collect();
        writeln!(
            out,
            "  {:>2}. {}  {} denials  ({})",
            n + 1,
            clean(&d.domain),
            thousands(d.count),
            reasons.join(", ")
        )?;
        writeln!(out, "      clients: {}", list(&d.clients, d.clients_more))?;
        let hosts: Vec<String> = d
            .hosts
            .iter()
            .take(6)
            .map(|(h, c)| format!("{} ({})", clean(h), thousands(*c)))
            .collect();
        writeln!(
            out,
            "      names:   {}{}",
            hosts.join(", "),
            if d.hosts.len() > 6 || d.hosts_more {
                " …"
            } else {
                ""
            }
        )?;
        let ex: Vec<String> = d.examples.iter().map(|e| clean(e)).collect();
        writeln!(out, "      e.g.     {}", ex.join("; "))?;
        writeln!(
            out,
            "      seen     {} → {}",
            &d.first_seen[..10],
            &d.last_seen[..10]
        )?;
        writeln!(
            out,
            "      stub (paste under exceptions:, fill in owner and reason):"
        )?;
        for l in d.stub.lines() {
            writeln!(out, "      {}", clean(l))?;
        }
    }

    Ok(())
}

/// Exceptions the logs name and the policy lacks, the notes, the summary.
fn closing(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    if !r.unknown_exceptions.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "== In the logs but not in this policy (removed, renamed, or another policy)"
        )?;
        for u in r.unknown_exceptions.iter().take(20) {
            writeln!(
                out,
                "  {}  owner {}, {} hits, last used {}",
                clean(&u.id),
                clean(u.owner.as_deref().unwrap_or("-")),
                thousands(u.hits),
                u.last_used.as_deref().unwrap_or("-")
            )?;
        }
    }
    if !r.limits.notes.is_empty() {
        writeln!(out)?;
        writeln!(out, "== Notes")?;
        for n in &r.limits.notes {
            writeln!(out, "  {n}")?;
        }
    }
    let active = r
        .exceptions
        .iter()
        .filter(|e| e.status == Status::Active)
        .count();
    writeln!(out)?;
    writeln!(
        out,
        "summary: {} active, {} stale, {} expired, {} expiring, {} denied destinations",
        active,
        r.stale.len(),
        r.expired.len(),
        r.expiring.len(),
        r.denied_destinations
    )?;
    Ok(())
}

/// The package gate's sections: approved packages nothing fetched for
/// `stale_after`, and the most-denied names with "did you mean".
fn packages(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    let p = &r.packages;
    if p.sets == 0 && p.denied.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "== Packages: {} in {}, enforce [{}]",
        plural(p.approved.len(), "approved entry", "approved entries"),
        plural(p.sets, "set", "sets"),
        p.enforce.join(", ")
    )?;
    let stale: Vec<&super::ApprovedRow> = p
        .approved
        .iter()
        .filter(|a| a.status == Status::Stale)
        .collect();
    if !stale.is_empty() {
        writeln!(
            out,
            "  unused for stale_after ({}d), candidates for removal:",
            r.policy.stale_after_days
        )?;
        for a in stale {
            let last = match (&a.last_used, a.days_since_use) {
                (Some(t), Some(d)) => format!("last fetched {} ({d} days ago)", &t[..10]),
                _ => "never fetched in these logs".into(),
            };
            writeln!(
                out,
                "    {}/{} {} ({}, {}:{}) — {last}",
                clean(&a.set),
                clean(&a.name),
                a.ecosystem,
                clean(&a.versions),
                clean(&a.file),
                a.line
            )?;
        }
    }
    if !p.unused_recently.is_empty() {
        writeln!(
            out,
            "  unused in these logs (shorter than stale_after): {}",
            list(&p.unused_recently, false)
        )?;
    }
    denied_packages(p, out)
}

/// The most-denied package names, with "did you mean".
fn denied_packages(p: &super::PackagesReport, out: &mut dyn Write) -> io::Result<()> {
    if p.denied.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "  most-denied packages (top {} of {}):",
        p.denied.len(),
        p.denied_names
    )?;
    for (n, d) in p.denied.iter().enumerate() {
        let reasons: Vec<String> = d
            .reasons
            .iter()
            .map(|(k, v)| format!("{} {}", clean(k), thousands(*v)))
            .collect();
        let dym = d
            .did_you_mean
            .as_deref()
            .map(|m| format!("  — did you mean {}?", clean(m)))
            .unwrap_or_default();
        writeln!(
            out,
            "  {:>3}. {} {}  {} denials  ({}){dym}",
            n + 1,
            clean(&d.ecosystem),
            clean(&d.name),
            thousands(d.count),
            reasons.join(", ")
        )?;
        writeln!(
            out,
            "       versions {}  clients {}{}",
            list(&d.versions, d.versions_more),
            list(&d.clients, d.clients_more),
            if d.sets.is_empty() {
                String::new()
            } else {
                format!("  sets {}", list(&d.sets, false))
            }
        )?;
    }
    Ok(())
}

/// The grants section: each grant's state and uses, then the destinations
/// granted most often (a destination granted again and again wants a
/// permanent exception).
fn grants(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    let g = &r.grants;
    let count = |state: &str| g.grants.iter().filter(|x| x.state == state).count();
    writeln!(out)?;
    writeln!(
        out,
        "== Grants ({}: {} active, {} used up, {} expired, {} unused)",
        g.grants.len(),
        count("active"),
        count("used_up"),
        count("expired"),
        count("unused")
    )?;
    for x in &g.grants {
        writeln!(
            out,
            "  {}  {}  {}  uses {}/{}  until {}  owner {}, from request {}, granted by {}",
            x.id,
            x.state,
            clean(&x.destination),
            x.uses,
            x.max_uses.map_or("-".to_string(), |m| m.to_string()),
            x.expires.as_deref().unwrap_or("-"),
            clean(&x.owner),
            clean(&x.from_request),
            clean(&x.granted_by)
        )?;
    }
    writeln!(
        out,
        "== Granted most often (candidates for a permanent exception)"
    )?;
    for (n, d) in g.granted_most_often.iter().enumerate() {
        writeln!(
            out,
            "  {:>2}. {}  {}",
            n + 1,
            clean(&d.destination),
            plural(d.grants, "grant", "grants")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_cleaning() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(clean("a\x1b[31mb\n"), "a?[31mb?");
    }
}
