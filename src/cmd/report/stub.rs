//! The ready-to-edit YAML exception a reviewer pastes under `exceptions:`
//! for a denied destination. `owner:` and `reason:` are left empty on
//! purpose: the policy refuses to load until a person fills them in, so a
//! stub cannot be merged unreviewed.

use crate::policy::host::parse_host;
use crate::policy::qtype;
use crate::policy::suggest::{stub_id, Stub};

use super::stats::DeniedUse;

/// Host names listed exactly before the stub suggests a wildcard instead.
const MAX_EXACT_HOSTS: usize = 8;

/// The stub for the denials to `domain` (a registered domain or an IP
/// address), written by [`Stub::yaml`] as deny answers' stubs are.
pub fn denied_stub(domain: &str, d: &DeniedUse, now: i64) -> String {
    let mut st = Stub::new(stub_id(domain, d.is_ip));
    let reasons: Vec<String> = d.reasons.iter().map(|(r, n)| format!("{r} ×{n}")).collect();
    st.above.push(format!(
        "{} denial{} of {domain} from {} client{}{}: {}",
        d.count,
        if d.count == 1 { "" } else { "s" },
        d.clients.items.len(),
        if d.clients.items.len() == 1 { "" } else { "s" },
        if d.clients.more { " or more" } else { "" },
        reasons.join(", ")
    ));
    for e in &d.near.items {
        st.above.push(format!(
            "exception {e} already names this destination; widening it may be the smaller change"
        ));
    }
    if d.is_ip {
        ip_lines(&mut st, domain);
    } else {
        host_lines(&mut st, domain, d);
    }
    let mut ports = d.ports.clone();
    ports.sort_unstable();
    if !ports.is_empty() {
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        st.key("ports", format!("[{}]", list.join(", ")));
    } else {
        st.note("only DNS queries were denied: the hosts above are answered; ports default to [80, 443]");
    }
    let extra: Vec<String> = d
        .qtypes
        .iter()
        .filter_map(|t| qtype::parse_qtype(t))
        .filter(|t| !qtype::DEFAULT_ALLOWED.contains(t) && !qtype::NEVER_ALLOWED.contains(t))
        .map(qtype::qtype_name)
        .collect();
    if !extra.is_empty() {
        st.key("dns_types", format!("[{}]", extra.join(", ")));
    }
    for (r, hint) in [
        (
            "method_not_allowed",
            "methods: were refused: add the methods the task needs",
        ),
        (
            "path_not_allowed",
            "paths: were refused: add the paths the task needs",
        ),
        (
            "inspection_required",
            "the exception naming it restricts methods/paths: serve with --ca-dir, or allow the host without them",
        ),
        (
            "client_not_allowed",
            "an exception names it for other clients: add clients: [...] here or widen that one",
        ),
    ] {
        if d.reasons.contains_key(r) {
            st.note(hint);
        }
    }
    st.yaml(now)
}

/// `cidrs:` for an IP address, with a warning if it is non-public.
fn ip_lines(st: &mut Stub, domain: &str) {
    let prefix = if domain.contains(':') { 128 } else { 32 };
    if let Ok(ip) = domain.parse::<std::net::IpAddr>() {
        if crate::policy::addr::classify(ip).is_some() {
            st.note(format!(
                "{ip} is a non-public address: make sure reaching it from a sandbox is meant"
            ));
        }
        st.key("cidrs", format!("[{ip}/{prefix}]"));
    }
}

/// `hosts:` for the names denied under `domain`: exactly, or a wildcard
/// when there are many.
fn host_lines(st: &mut Stub, domain: &str, d: &DeniedUse) {
    // Only names that parse as hosts reach the YAML: a forged log line
    // cannot inject keys into the stub.
    let hosts: Vec<String> = d
        .hosts
        .sorted()
        .into_iter()
        .filter_map(|(h, _)| parse_host(&h).ok().map(|h| h.to_string()))
        .collect();
    let reg_ok = parse_host(domain).is_ok();
    if (hosts.len() > MAX_EXACT_HOSTS || d.hosts.more) && reg_ok {
        st.note(format!(
            "{}{} names under {domain} were denied; list the exact ones you need if you can",
            hosts.len(),
            if d.hosts.more { "+" } else { "" }
        ));
        if hosts.iter().any(|h| h == domain) {
            st.key("hosts", format!("[{domain}, \"*.{domain}\"]"));
        } else {
            st.key("hosts", format!("[\"*.{domain}\"]"));
        }
    } else if hosts.is_empty() {
        st.todo("hosts", "[]", "TODO: no valid host name in the log lines");
    } else {
        st.key("hosts", format!("[{}]", hosts.join(", ")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::report::stats::Stats;
    use crate::policy::from_yaml;

    const NOW: i64 = 1_800_000_000;

    fn stub_for(lines: &[&str], domain: &str) -> String {
        let mut s = Stats::new(None);
        for l in lines {
            s.add(&serde_json::from_str(l).unwrap());
        }
        denied_stub(domain, &s.destinations[domain], NOW)
    }

    /// Filling in owner and reason is all a stub needs to load.
    fn loads_once_filled(stub: &str) {
        let filled = stub
            .replace("owner:     #", "owner: team #")
            .replace("reason:    #", "reason: because #");
        let p = from_yaml(&format!("exceptions:\n{filled}"))
            .unwrap_or_else(|e| panic!("{e}\n{filled}"));
        assert_eq!(p.exceptions.len(), 1);
        let unfilled = from_yaml(&format!("exceptions:\n{stub}")).unwrap_err();
        assert!(unfilled.to_string().contains("no owner"), "{unfilled}");
    }

    #[test]
    fn names_and_ports() {
        let st = stub_for(
            &[
                r#"{"ts":"2027-01-01T00:00:00Z","client":"ci","proto":"connect","host":"api.example.com","port":443,"decision":"deny","reason":"no_exception"}"#,
                r#"{"ts":"2027-01-01T00:00:00Z","client":"ci","proto":"dns","qname":"cdn.example.com","qtype":"TXT","decision":"deny","reason":"no_exception"}"#,
            ],
            "example.com",
        );
        assert!(st.contains("- id: example.com"), "{st}");
        assert!(
            st.contains("hosts: [api.example.com, cdn.example.com]"),
            "{st}"
        );
        assert!(st.contains("ports: [443]"), "{st}");
        assert!(st.contains("dns_types: [TXT]"), "{st}");
        assert!(st.contains("expires: 2027-04-15"), "{st}");
        loads_once_filled(&st);
    }

    #[test]
    fn many_names_become_a_wildcard_and_ips_cidrs() {
        let lines: Vec<String> = (0..12)
            .map(|i| format!(r#"{{"ts":"2027-01-01T00:00:00Z","proto":"connect","host":"n{i}.example.org","port":443,"decision":"deny","reason":"no_exception"}}"#))
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let st = stub_for(&refs, "example.org");
        assert!(st.contains("hosts: [\"*.example.org\"]"), "{st}");
        loads_once_filled(&st);
        let st = stub_for(
            &[
                r#"{"ts":"2027-01-01T00:00:00Z","proto":"connect","host":"10.1.2.3","port":8443,"decision":"deny","reason":"private_address"}"#,
            ],
            "10.1.2.3",
        );
        assert!(st.contains("cidrs: [10.1.2.3/32]"), "{st}");
        assert!(st.contains("non-public"), "{st}");
        loads_once_filled(&st);
    }
}
