//! `egressd explain 'POST https://host/path' --body FILE`: the request's
//! answer, then what `body:` rules make of FILE as the body (DESIGN
//! "Writes on allowed hosts"), judged by the function the proxy uses
//! over the same exceptions, so the two cannot disagree. `body:` needs
//! interception, so the body is judged as egressd with `--ca-dir` would.

use std::io::{self, Write};

use super::{location, ALLOWED, DENIED, USAGE};
use crate::cmd::offline::{Ctx, Kind, Query};
use crate::policy::body::BodyRules;
use crate::policy::{ClientIdx, Policy, Proto};
use crate::writes::body::{self, Choice};

/// Prints the body's verdict for `target` after [`super::explain`]'s
/// answer; returns the exit status for both.
pub fn explain(
    policy: &Policy,
    client: Option<&str>,
    target: &str,
    data: &[u8],
    now: i64,
    out: &mut dyn Write,
) -> i32 {
    let code = super::explain(policy, client, target, now, out);
    if code == USAGE {
        return code;
    }
    let client_idx = client
        .and_then(|id| policy.clients.iter().position(|c| &*c.id == id))
        .map(|i| i as ClientIdx);
    let q = match Query::parse(target) {
        Ok(q) => q,
        Err(_) => return code,
    };
    match judge(policy, client_idx, &q, data, now, out) {
        Ok(Some(true)) => ALLOWED,
        Ok(Some(false)) => DENIED,
        Ok(None) => code,
        Err(_) => USAGE,
    }
}

/// `Some(allowed)` when `body:` rules judged the body; `None` when none
/// apply (the request's own answer stands).
fn judge(
    policy: &Policy,
    client: Option<ClientIdx>,
    q: &Query,
    data: &[u8],
    now: i64,
    out: &mut dyn Write,
) -> io::Result<Option<bool>> {
    writeln!(out)?;
    writeln!(out, "body:    {} bytes", data.len())?;
    let proto = match q.kind {
        Kind::Http => Proto::Http,
        Kind::Https => Proto::Tls,
        Kind::Authority | Kind::Dns(_) => {
            writeln!(
                out,
                "         not judged: a body belongs to an http:// or https:// request"
            )?;
            return Ok(None);
        }
    };
    if q.path.is_err() {
        return Ok(None);
    }
    let ctx = Ctx {
        policy,
        client,
        now,
    };
    let cands = policy.allowing(&ctx.request(q, proto, true), now);
    let Some(bound) = body::read_bound(&cands) else {
        let why = match cands.first() {
            None => "no exception allows the request, so its body is never read".to_string(),
            Some(e) => format!(
                "exception {} has no body: rules; any body is forwarded",
                e.id
            ),
        };
        writeln!(out, "         not judged: {why}")?;
        return Ok(None);
    };
    let ruled = cands.iter().filter(|e| e.body().is_some()).count();
    writeln!(
        out,
        "         judged before forwarding against {} exception{} (the first that allows decides):",
        cands.len(),
        if cands.len() == 1 { "" } else { "s" }
    )?;
    for e in &cands {
        match e.body() {
            Some(b) => writeln!(out, "         - {}: {}", e.id, rules_line(b))?,
            None => writeln!(out, "         - {}: no body: rules", e.id)?,
        }
    }
    verdict(&cands, data, bound, ruled, out)
}

/// The first exception that allows the body, or the closest refusal, and
/// the result line; `None` when no rule judged it.
fn verdict(
    cands: &[&crate::policy::Exception],
    data: &[u8],
    bound: u64,
    ruled: usize,
    out: &mut dyn Write,
) -> io::Result<Option<bool>> {
    let whole = (data.len() as u64 <= bound).then_some(data);
    let allowed = match body::choose(cands, whole) {
        Some(Choice::Allow(e)) => {
            writeln!(out, "  ALLOW  by exception {}", location(e))?;
            if ruled > 1 || !std::ptr::eq(e, cands[0]) {
                writeln!(out, "         (its credentials are the ones injected)")?;
            }
            true
        }
        Some(Choice::Refuse(e, r)) => {
            writeln!(
                out,
                "  DENY   {}: {}",
                r.reason.as_str(),
                r.reason.describe()
            )?;
            writeln!(out, "         {}", r.detail)?;
            writeln!(out, "         closest: {}", location(e))?;
            false
        }
        None => return Ok(None),
    };
    writeln!(out)?;
    writeln!(
        out,
        "result:  body {} (with TLS interception, serve --ca-dir)",
        if allowed { "allowed" } else { "denied" }
    )?;
    Ok(Some(allowed))
}

/// One exception's `body:` rules in a line.
fn rules_line(b: &BodyRules) -> String {
    let mut parts = vec![format!("max_bytes {}", b.max_bytes)];
    if let Some(g) = &b.graphql {
        let mut allows = Vec::new();
        if g.queries {
            allows.push("queries".to_string());
        }
        if !g.mutations.is_empty() {
            allows.push(format!("mutations {}", g.mutations.join(", ")));
        }
        parts.push(format!("graphql {}", allows.join(" and ")));
    }
    for r in b.json.iter() {
        parts.push(format!("json {} = {}", r.pointer, r.expect.show()));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_yaml;

    fn run(target: &str, body: &str) -> (i32, String) {
        let p = from_yaml(
            "exceptions:\n  - id: read\n    owner: o\n    reason: r\n    hosts: [api.x.test]\n    methods: [POST]\n    paths: [/graphql]\n    body: { graphql: { queries: true } }\n  - id: pr\n    owner: o\n    reason: r\n    hosts: [api.x.test]\n    methods: [POST]\n    paths: [/graphql, /repos/*/*/pulls]\n    body:\n      graphql: { mutations: [createPullRequest] }\n  - id: rest\n    owner: o\n    reason: r\n    hosts: [api.x.test]\n    methods: [POST]\n    paths: [/repos/*/*/pulls]\n    body: { json: { /head: agent/*, /draft: true } }\n",
        )
        .unwrap();
        let mut out = Vec::new();
        let code = explain(&p, None, target, body.as_bytes(), 0, &mut out);
        (code, String::from_utf8(out).unwrap())
    }

    #[test]
    fn the_body_is_judged_as_the_proxy_judges_it() {
        let t = "POST https://api.x.test/graphql";
        let (c, o) = run(
            t,
            r#"{"query":"mutation { createPullRequest(input: {}) { x } }"}"#,
        );
        assert_eq!(c, ALLOWED, "{o}");
        assert!(o.contains("ALLOW  by exception pr"), "{o}");
        let (c, o) = run(
            t,
            r#"{"query":"mutation { mergePullRequest(input: {}) { x } }"}"#,
        );
        assert_eq!(c, DENIED, "{o}");
        assert!(o.contains("body_not_allowed"), "{o}");
        assert!(o.contains("mergePullRequest"), "{o}");
        let t = "POST https://api.x.test/repos/acme/widgets/pulls";
        let (c, o) = run(t, r#"{"head":"agent/x","draft":true}"#);
        assert_eq!(c, ALLOWED, "the pr exception refuses, rest allows: {o}");
        assert!(o.contains("- rest: max_bytes"), "{o}");
        assert!(o.contains("ALLOW  by exception rest"), "{o}");
        let (c, o) = run(t, r#"{"head":"main","draft":true}"#);
        assert_eq!(c, DENIED, "{o}");
        assert!(o.contains("/head is not"), "{o}");
        assert!(o.contains("closest: rest"), "{o}");
        let (c, o) = run(
            t,
            r#"{"query":"mutation { createPullRequest(input: {}) { x } }"}"#,
        );
        assert_eq!(c, ALLOWED, "{o}");
        let (c, o) = run("POST https://api.x.test/other", "{}");
        assert_eq!(c, DENIED, "{o}");
        assert!(o.contains("never read"), "{o}");
    }
}
