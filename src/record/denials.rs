//! The package denials egressd answered, kept as a short tally so that
//! `egressd run` can say at exit which packages its command was refused
//! and why (DESIGN "Packages"). Some clients hide the reason: pip logs an
//! index's 403 only under `-vv` and prints "from versions: none", so for an
//! agent that installs a typo by name this is where "did you mean" shows.
//!
//! Bounded: at most [`MAX_ENTRIES`] distinct (package, reason) entries are
//! kept, each with its count; further distinct ones are only counted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use super::{Event, PackageLine};
use crate::policy::Logged;

/// Distinct denials kept by name; a command refused more than this many
/// different packages is told how many more there were.
pub const MAX_ENTRIES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    ecosystem: &'static str,
    name: String,
    version: Option<String>,
    reason: &'static str,
    did_you_mean: Option<String>,
}

#[derive(Debug, Default)]
struct Tally {
    entries: BTreeMap<Key, u64>,
    /// Denials of entries not kept (past [`MAX_ENTRIES`]).
    more: u64,
}

/// Package denials seen by one recorder (one egressd process).
#[derive(Debug, Default)]
pub struct PackageDenials {
    tally: Mutex<Tally>,
}

impl PackageDenials {
    /// Notes `ev` when it is a package request that was denied (not one
    /// report mode let through).
    pub fn note(&self, ev: &Event) {
        let Some(p) = ev.package.as_deref() else {
            return;
        };
        let (Some(reason), Logged::Deny) = (p.reason, ev.decision) else {
            return;
        };
        let key = key(p, reason.as_str());
        let mut t = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        let kept = t.entries.len();
        match t.entries.get_mut(&key) {
            Some(n) => *n += 1,
            None if kept < MAX_ENTRIES => {
                t.entries.insert(key, 1);
            }
            None => t.more += 1,
        }
    }

    /// How many denials were noted, kept or not.
    pub fn total(&self) -> u64 {
        let t = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        t.entries.values().sum::<u64>() + t.more
    }

    /// The summary `egressd run` prints on stderr, or `None` when nothing
    /// was denied: a heading line, then one line per package and reason.
    pub fn summary(&self, who: &str) -> Option<String> {
        let t = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        let total = t.entries.values().sum::<u64>() + t.more;
        if total == 0 {
            return None;
        }
        let mut s = format!(
            "{who}: egressd denied {total} package request{}:\n",
            if total == 1 { "" } else { "s" }
        );
        for (k, n) in &t.entries {
            let _ = write!(s, "  {} {}", k.ecosystem, k.name);
            if let Some(v) = &k.version {
                let _ = write!(s, "@{v}");
            }
            let _ = write!(s, ": {}", k.reason);
            if let Some(m) = &k.did_you_mean {
                let _ = write!(s, "; did you mean {m}?");
            }
            if *n > 1 {
                let _ = write!(s, " ({n} requests)");
            }
            s.push('\n');
        }
        if t.more > 0 {
            let _ = writeln!(
                s,
                "  and {} more, of other packages (see the decision log)",
                t.more
            );
        }
        Some(s)
    }
}

fn key(p: &PackageLine, reason: &'static str) -> Key {
    Key {
        ecosystem: p.ecosystem.as_str(),
        name: p.name.clone().unwrap_or_else(|| {
            if reason == "package_publish" {
                "(a publish)".into()
            } else {
                "(unreadable path)".into()
            }
        }),
        version: p.version.clone(),
        reason,
        did_you_mean: p.did_you_mean.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::decide::PackageReason;
    use crate::packages::Ecosystem;
    use crate::policy::Proto;

    fn denied(
        name: &str,
        version: Option<&str>,
        reason: PackageReason,
        dym: Option<&str>,
    ) -> Event {
        let mut ev = Event::new(Proto::Tls, "10.0.0.1:1".parse().unwrap());
        ev.decision = Logged::Deny;
        ev.package = Some(Box::new(PackageLine {
            ecosystem: Ecosystem::Pypi,
            name: Some(name.into()),
            version: version.map(str::to_string),
            set: None,
            reason: Some(reason),
            hidden: None,
            did_you_mean: dym.map(str::to_string),
        }));
        ev
    }

    #[test]
    fn denials_are_grouped_by_package_and_reason_with_did_you_mean() {
        let d = PackageDenials::default();
        assert_eq!(d.summary("egressd run"), None);
        let typo = denied(
            "reqeusts",
            None,
            PackageReason::NotApproved,
            Some("requests"),
        );
        d.note(&typo);
        d.note(&typo);
        d.note(&denied(
            "urllib3",
            Some("2.9.0"),
            PackageReason::TooNew,
            None,
        ));
        let s = d.summary("egressd run").unwrap();
        assert_eq!(
            s,
            "egressd run: egressd denied 3 package requests:\n  \
             pypi reqeusts: package_not_approved; did you mean requests? (2 requests)\n  \
             pypi urllib3@2.9.0: package_too_new\n"
        );
    }

    #[test]
    fn allowed_and_report_mode_requests_are_not_denials() {
        let d = PackageDenials::default();
        let mut ok = denied("requests", None, PackageReason::NotApproved, None);
        // Report mode logs the package reason on an allowed request.
        ok.decision = Logged::Allow;
        d.note(&ok);
        let mut plain = Event::new(Proto::Tls, "10.0.0.1:1".parse().unwrap());
        plain.decision = Logged::Deny;
        d.note(&plain);
        assert_eq!(d.total(), 0);
    }

    #[test]
    fn past_the_bound_denials_are_counted_not_kept() {
        let d = PackageDenials::default();
        for i in 0..MAX_ENTRIES + 5 {
            d.note(&denied(
                &format!("p{i}"),
                None,
                PackageReason::NotApproved,
                None,
            ));
        }
        assert_eq!(d.total(), MAX_ENTRIES as u64 + 5);
        let s = d.summary("x").unwrap();
        assert_eq!(s.lines().count(), 1 + MAX_ENTRIES + 1);
        assert!(
            s.ends_with("and 5 more, of other packages (see the decision log)\n"),
            "{s}"
        );
    }
}
