//! Policy loading: any bytes as a policy file. The fast YAML front end
//! (`policy::yaml`) reads it exactly as serde_yaml_ng does or leaves it to
//! serde_yaml_ng. Loading either fails with located diagnostics or yields
//! a policy that lint, explain and decide handle without panicking, whose
//! own hosts and ranges are decided consistently.

use std::net::IpAddr;

use egressd::cmd::check::lint;
use egressd::cmd::offline::decide_target;
use egressd::policy::host::{parse_target, HostPattern, Target};
use egressd::policy::{from_yaml, Request};
use egressd::policy::{Proto, Verdict};

/// A fixed "now" (2033-05-18): expiry is part of what is fuzzed.
const NOW: i64 = 2_000_000_000;

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The fast YAML front end reads what serde_yaml_ng reads, or leaves
    // the file to it.
    if let Err(e) = egressd::policy::yaml::compare_with_serde_yaml(text) {
        panic!("fast YAML front end: {e}");
    }
    let policy = match from_yaml(text) {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.0.is_empty(), "an error without a diagnostic");
            for d in &e.0 {
                assert!(d.line >= 1 && d.column >= 1, "unlocated diagnostic {d}");
                assert!(!d.message.is_empty());
            }
            return;
        }
    };
    let _ = lint::lint(&policy, NOW);
    for (i, e) in policy.exceptions.iter().enumerate() {
        assert!(!e.ports.is_empty(), "{}: no ports", e.id);
        for h in &e.hosts {
            // The name the pattern is built on, and one below it.
            let names = match h {
                HostPattern::Exact(n) => vec![n.to_string()],
                HostPattern::Subdomains(s) => vec![format!("x.{s}")],
                HostPattern::LabelGlob {
                    prefix,
                    suffix,
                    rest,
                } => vec![format!("{prefix}{suffix}.{rest}")],
            };
            for name in names {
                let Ok(target) = parse_target(&name) else {
                    continue;
                };
                check_named(&policy, i, &target, e.ports[0]);
                for t in [
                    format!("https://{name}/"),
                    format!("{name}:{}", e.ports[0]),
                    format!("dns:{name}"),
                    format!("GET http://{name}/x"),
                ] {
                    let _ = decide_target(&policy, None, &t, false, NOW);
                    let _ = decide_target(&policy, None, &t, true, NOW);
                }
            }
        }
        for net in &e.cidrs {
            let ip: IpAddr = net.network();
            check_named(&policy, i, &Target::Ip(ip), e.ports[0]);
        }
    }
}

/// A target exception `i` names, on one of its ports: whatever is decided,
/// an exception named as allowing it must really name it.
fn check_named(policy: &egressd::policy::Policy, _i: usize, target: &Target, port: u16) {
    for proto in [Proto::Http, Proto::Connect, Proto::Dns, Proto::Tls] {
        for intercept in [false, true] {
            let req = Request {
                proto,
                client: None,
                target,
                port,
                method: Some("GET".into()),
                path: Some("/"),
                qtype: Some(1),
                can_intercept: intercept,
            };
            let d = policy.decide(&req, NOW);
            if d.verdict != Verdict::Deny && !d.report_only {
                let e = d.exception.expect("an allow names its exception");
                let named = match target {
                    Target::Name(h) => e.hosts.iter().any(|p| p.matches(h)),
                    Target::Ip(ip) => e.cidrs.iter().any(|n| n.contains(ip)),
                };
                assert!(named, "{} allowed {target} without naming it", e.id);
                assert!(!e.is_expired(NOW), "expired {} allowed {target}", e.id);
            }
        }
    }
}
