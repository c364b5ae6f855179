//! `egressd explain git:push:HOST/REPO:REF` and `git:fetch:HOST/REPO`: the
//! git gate's answer for one ref (DESIGN "Writes on allowed hosts"), as
//! the request explain answers for a URL. What a push's pack holds (its
//! history, its paths) is only known when it is pushed: the answer says
//! which rules it will be held to.

use std::io::{self, Write};

use super::{ALLOWED, DENIED, USAGE};
use crate::cmd::offline::decide_target;
use crate::policy::{ClientIdx, Policy, Reason};

/// A `git:` target, read.
struct GitQuery<'a> {
    push: bool,
    host: &'a str,
    repo: &'a str,
    reference: Option<&'a str>,
}

fn parse(spec: &str) -> Result<GitQuery<'_>, String> {
    let (service, rest) = spec
        .split_once(':')
        .ok_or("expected git:push:HOST/OWNER/REPO:REF or git:fetch:HOST/OWNER/REPO")?;
    let push = match service {
        "push" => true,
        "fetch" => false,
        other => return Err(format!("unknown git service {other:?}: push or fetch")),
    };
    let (host, rest) = rest
        .split_once('/')
        .ok_or("expected HOST/OWNER/REPO after the service")?;
    let (repo, reference) = match rest.split_once(':') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    if host.is_empty() || repo.is_empty() {
        return Err("expected HOST/OWNER/REPO after the service".into());
    }
    if push && !reference.is_some_and(|r| r.starts_with("refs/")) {
        return Err(
            "a push names the ref it writes: git:push:HOST/OWNER/REPO:refs/heads/NAME".into(),
        );
    }
    Ok(GitQuery {
        push,
        host,
        repo: repo.trim_matches('/'),
        reference,
    })
}

/// Explains a `git:` target (the text after `git:`); returns the exit status.
pub fn explain(
    policy: &Policy,
    client: Option<ClientIdx>,
    spec: &str,
    now: i64,
    out: &mut dyn Write,
) -> i32 {
    let q = match parse(spec) {
        Ok(q) => q,
        Err(msg) => {
            let _ = writeln!(out, "error: {msg}");
            return USAGE;
        }
    };
    match answer(policy, client, &q, now, out) {
        Ok(true) => ALLOWED,
        Ok(false) => DENIED,
        Err(_) => USAGE,
    }
}

fn answer(
    policy: &Policy,
    client: Option<ClientIdx>,
    q: &GitQuery<'_>,
    now: i64,
    out: &mut dyn Write,
) -> io::Result<bool> {
    let url = if q.push {
        format!("POST https://{}/{}/git-receive-pack", q.host, q.repo)
    } else {
        format!("GET https://{}/{}/info/refs", q.host, q.repo)
    };
    writeln!(
        out,
        "asked:   {} {}/{} (as {url}, intercepted)",
        if q.push {
            "git push to"
        } else {
            "git fetch from"
        },
        q.host,
        q.repo
    )?;
    let d = match decide_target(policy, client, &url, true, now) {
        Ok(d) => d,
        Err(e) => {
            writeln!(out, "error: {e}")?;
            return Err(io::Error::other(e));
        }
    };
    let named = d
        .exception
        .map(|e| format!(" (exception {}, owner {})", e.id, e.owner))
        .unwrap_or_default();
    if !d.is_allowed() {
        writeln!(
            out,
            "verdict: deny, {}{named}: {}",
            d.reason.as_str(),
            d.reason.describe()
        )?;
        return Ok(false);
    }
    let Some(push) = d
        .exception
        .and_then(|e| e.git())
        .and_then(|g| g.push.as_ref())
        .filter(|_| q.push)
    else {
        let how = if d.exception.is_some_and(|e| e.git().is_some()) {
            "the git gate lets it fetch"
        } else {
            "no git: rules apply; every push to this host is forwarded as sent"
        };
        writeln!(out, "verdict: allow{named}: {how}")?;
        return Ok(true);
    };
    let r = q.reference.unwrap_or_default();
    if !push.refs.is_match(r) {
        let reason = Reason::GitRefNotAllowed;
        writeln!(
            out,
            "verdict: deny, {}{named}: {}",
            reason.as_str(),
            reason.describe()
        )?;
        writeln!(out, "refs:    {}", push.ref_patterns.join(", "))?;
        return Ok(false);
    }
    writeln!(out, "verdict: allow{named}: {r} may be created or updated")?;
    push_rules(push, out)?;
    Ok(true)
}

/// What a push that may update the ref must still be.
fn push_rules(push: &crate::policy::git::PushRules, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "rules:   {}; {}; push at most {} bytes",
        if push.force {
            "any update (force: true)"
        } else {
            "updates must be fast-forwards proven from the pushed commits (git_not_fast_forward)"
        },
        if push.delete {
            "deletion allowed"
        } else {
            "deletion refused (git_delete_not_allowed)"
        },
        push.max_bytes
    )?;
    if !push.deny_path_patterns.is_empty() {
        writeln!(
            out,
            "paths:   no pushed commit may add or change {} (git_path_denied)",
            push.deny_path_patterns.join(", ")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_yaml;

    fn run(spec: &str) -> (i32, String) {
        let p = from_yaml(
            "exceptions:\n  - id: w\n    owner: o\n    reason: r\n    hosts: [git.example.com]\n    git:\n      repos: [acme/widgets]\n      push:\n        refs: [\"refs/heads/agent/**\"]\n        deny_paths: [\".github/workflows/**\"]\n",
        )
        .unwrap();
        let mut out = Vec::new();
        let code = explain(&p, None, spec, 0, &mut out);
        (code, String::from_utf8(out).unwrap())
    }

    #[test]
    fn refs_repos_and_services() {
        let (c, o) = run("push:git.example.com/acme/widgets:refs/heads/agent/x");
        assert_eq!(c, ALLOWED, "{o}");
        assert!(o.contains("fast-forwards"), "{o}");
        assert!(o.contains(".github/workflows/**"), "{o}");
        let (c, o) = run("push:git.example.com/acme/widgets:refs/heads/main");
        assert_eq!(c, DENIED, "{o}");
        assert!(o.contains("git_ref_not_allowed"), "{o}");
        let (c, o) = run("push:git.example.com/acme/secret:refs/heads/agent/x");
        assert_eq!(c, DENIED, "{o}");
        assert!(o.contains("git_repo_not_allowed"), "{o}");
        let (c, o) = run("fetch:git.example.com/acme/widgets.git");
        assert_eq!(c, ALLOWED, "{o}");
        assert_eq!(run("push:git.example.com/acme/widgets").0, USAGE);
        assert_eq!(run("clone:x/y").0, USAGE);
    }
}
