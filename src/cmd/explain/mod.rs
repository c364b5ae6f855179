//! `egressd explain`: which exception allows a target, and why nothing does
//! otherwise. It builds the same [`Request`] values the front-ends build
//! (plain HTTP, CONNECT, the request inside an intercepted tunnel, a DNS
//! query) and asks the same [`Policy::decide`], so its answer is the
//! proxy's answer — except for what depends on the network: explain never
//! resolves names, so for a name it states the private-address rule rather
//! than applying it. IP-literal targets get the full address check.

mod body;
mod git;
mod package;

use std::io::{self, Write};
use std::net::IpAddr;
use std::path::Path;

use crate::policy::host::Target;
use crate::policy::{
    addr, qtype, ClientIdx, Decision, Exception, Policy, PrivateDestinations, Proto, Reason,
    Verdict,
};
use crate::time::{format_date, unix_now};

use super::offline::{Ctx, Kind, Query};

/// Exit status: the target is allowed.
pub const ALLOWED: i32 = 0;
/// Exit status: the target is denied.
pub const DENIED: i32 = 1;
/// Exit status: bad target, unknown client, or a policy that does not load.
pub const USAGE: i32 = 2;

/// How many exceptions a `no_exception` answer offers as hints.
const MAX_HINTS: usize = 3;

/// `egressd explain [--policy P] [--client ID] TARGET`, as parsed.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[arg(long, env = "EGRESSD_POLICY", default_value = "policy/")]
    pub policy: std::path::PathBuf,
    /// Decide as this client (an id from settings.clients).
    #[arg(long)]
    pub client: Option<String>,
    /// `https://host/path`, `http://host:port/path`, `host:port`, `GET http://…`,
    /// `dns:name[/TYPE]`, or `pkg:pypi/requests@2.32.3` (`pkg:npm/@scope/name@1.0.0`,
    /// `pkg:cargo/serde`, `pkg:go/golang.org/x/text@v0.14.0`; no version: the index).
    #[arg(required = true, num_args = 1..=2)]
    pub target: Vec<String>,
    /// A request body (a file) to judge against the `body:` rules of the
    /// exceptions that allow the request: `explain 'POST https://host/path' --body FILE`.
    #[arg(long, value_name = "FILE")]
    pub body: Option<std::path::PathBuf>,
}

/// `egressd explain`: the command's entry (its answer, errors included,
/// goes to `out`).
pub fn main(args: Args, out: &mut dyn Write, _err: &mut dyn Write) -> super::Exit {
    let target = args.target.join(" ");
    let body = match &args.body {
        None => None,
        Some(f) => match std::fs::read(f) {
            Ok(b) => Some(b),
            Err(e) => {
                let _ = writeln!(out, "error: --body {}: {e}", f.display());
                return USAGE.into();
            }
        },
    };
    run_explain_with(
        &args.policy,
        args.client.as_deref(),
        &target,
        body.as_deref(),
        out,
    )
    .into()
}

/// `egressd explain [--policy P] [--client ID] TARGET`. Returns the exit
/// status: 0 allowed, 1 denied, 2 usage or policy error. The answer is for
/// egressd as it runs by default, without TLS interception; what
/// interception would change is printed alongside.
pub fn run_explain(
    policy_path: &Path,
    client: Option<&str>,
    target: &str,
    out: &mut dyn Write,
) -> i32 {
    run_explain_with(policy_path, client, target, None, out)
}

/// [`run_explain`], and with `body` what the `body:` rules make of it.
pub fn run_explain_with(
    policy_path: &Path,
    client: Option<&str>,
    target: &str,
    body: Option<&[u8]>,
    out: &mut dyn Write,
) -> i32 {
    let policy = match crate::policy::load(policy_path) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(out, "{e}");
            let _ = writeln!(
                out,
                "{}: policy does not load; run `egressd check {}`",
                policy_path.display(),
                policy_path.display()
            );
            return USAGE;
        }
    };
    let sets = match policy.packages.sets.len() {
        0 => String::new(),
        1 => ", 1 package set".into(),
        n => format!(", {n} package sets"),
    };
    let _ = writeln!(
        out,
        "policy:  {} ({} exception{}{sets} in {} file{}, mode {})",
        policy_path.display(),
        policy.exceptions.len(),
        if policy.exceptions.len() == 1 {
            ""
        } else {
            "s"
        },
        policy.files.len(),
        if policy.files.len() == 1 { "" } else { "s" },
        policy.settings.mode.as_str()
    );
    match body {
        Some(b) => body::explain(&policy, client, target, b, unix_now(), out),
        None => explain(&policy, client, target, unix_now(), out),
    }
}

/// Explains `target` against an already loaded policy as of `now` (Unix
/// seconds); what [`run_explain`] does after loading.
pub fn explain(
    policy: &Policy,
    client: Option<&str>,
    target: &str,
    now: i64,
    out: &mut dyn Write,
) -> i32 {
    if let Some(spec) = target.trim().strip_prefix("git:") {
        let client_idx = client.and_then(|id| policy.clients.iter().position(|c| &*c.id == id));
        if client.is_some() && client_idx.is_none() {
            let _ = writeln!(
                out,
                "error: unknown client {:?}",
                client.unwrap_or_default()
            );
            return USAGE;
        }
        return git::explain(policy, client_idx.map(|i| i as ClientIdx), spec, now, out);
    }
    let query = match target.trim().strip_prefix("pkg:") {
        Some(spec) => package::PkgQuery::parse(spec).map(Asked::Package),
        None => Query::parse(target).map(Asked::Request),
    };
    let query = match query {
        Ok(q) => q,
        Err(msg) => {
            let _ = writeln!(out, "error: {msg}");
            let _ = writeln!(out, "{TARGET_FORMS}");
            return USAGE;
        }
    };
    let client_idx = match client {
        None => None,
        Some(id) => match policy.clients.iter().position(|c| &*c.id == id) {
            Some(i) => Some(i as ClientIdx),
            None => {
                let known: Vec<&str> = policy.clients.iter().map(|c| &*c.id).collect();
                let _ = writeln!(
                    out,
                    "error: unknown client {id:?}; settings.clients defines: {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                );
                return USAGE;
            }
        },
    };
    let ctx = Ctx {
        policy,
        client: client_idx,
        now,
    };
    let query = match query {
        Asked::Request(q) => q,
        Asked::Package(q) => {
            let answer = ctx
                .client_line(out)
                .and_then(|()| package::explain(policy, client_idx, &q, now, out));
            return match answer {
                Ok(true) => ALLOWED,
                Ok(false) => DENIED,
                Err(_) => USAGE,
            };
        }
    };
    match ctx.run(&query, out) {
        Ok(Answer::Allowed) => ALLOWED,
        Ok(Answer::Denied | Answer::OnlyIntercepted) => DENIED,
        Err(_) => USAGE,
    }
}

const TARGET_FORMS: &str = "TARGET is one of: https://host/path, http://host:port/path, \
     host:port, 'GET http://host/path', 'POST https://host/path', dns:name, dns:name/TXT, \
     pkg:ECOSYSTEM/NAME[@VERSION] (pkg:pypi/requests@2.32.3, pkg:npm/@scope/name@1.0.0, \
     pkg:cargo/serde, pkg:go/golang.org/x/text@v0.14.0), \
     git:push:HOST/OWNER/REPO:REF, git:fetch:HOST/OWNER/REPO";

/// What `explain` was asked about.
enum Asked {
    Request(Query),
    Package(package::PkgQuery),
}

/// The answer for egressd as it runs by default (no TLS interception).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Allowed,
    Denied,
    /// Denied by default, allowed when TLS interception is enabled.
    OnlyIntercepted,
}

impl Answer {
    fn from(allowed: bool) -> Answer {
        if allowed {
            Answer::Allowed
        } else {
            Answer::Denied
        }
    }
}

impl<'p> Ctx<'p> {
    /// `client:` and the blank line after it.
    fn client_line(&self, out: &mut dyn Write) -> io::Result<()> {
        let who = match self.client {
            Some(c) => format!("{} (--client)", self.policy.clients[c as usize].id),
            None if self.policy.exceptions.iter().any(|e| e.clients().is_some())
                || self
                    .policy
                    .packages
                    .sets
                    .iter()
                    .any(|s| s.clients.is_some()) =>
            {
                "anonymous (some exceptions or package sets are for named clients; ask with \
                 --client ID)"
                    .into()
            }
            None => "anonymous".into(),
        };
        writeln!(out, "client:  {who}")?;
        writeln!(out)
    }

    /// Prints the whole answer.
    fn run(&self, q: &Query, out: &mut dyn Write) -> io::Result<Answer> {
        self.client_line(out)?;
        let answer = match q.kind {
            Kind::Dns(t) => Answer::from(self.explain_dns(q, t, out)?),
            Kind::Http => Answer::from(self.explain_http(q, out)?),
            Kind::Https | Kind::Authority => self.explain_connect(q, out)?,
        };
        writeln!(out)?;
        match answer {
            Answer::Allowed => writeln!(out, "result:  allowed")?,
            Answer::OnlyIntercepted => writeln!(
                out,
                "result:  denied — allowed only when TLS interception is enabled (serve --ca-dir)"
            )?,
            Answer::Denied => {
                writeln!(out, "result:  denied")?;
                writeln!(
                    out,
                    "         to ask for an exception: {}",
                    self.policy.settings.contact
                )?;
            }
        }
        Ok(answer)
    }

    fn explain_http(&self, q: &Query, out: &mut dyn Write) -> io::Result<bool> {
        let assumed = if q.method_given {
            ""
        } else {
            "   (method GET assumed; ask 'POST http://…' for another)"
        };
        writeln!(out, "{} {}{assumed}", q.method, q.url())?;
        if let Err(e) = &q.path {
            writeln!(
                out,
                "  DENY   malformed: the proxy refuses this path with 400 ({e})"
            )?;
            return Ok(false);
        }
        let d = self.decide(&self.request(q, Proto::Http, false));
        if self.show(q, &d, out)? {
            self.address_check(q, &d, out)
        } else {
            self.address_note(q, out)?;
            Ok(false)
        }
    }

    fn explain_connect(&self, q: &Query, out: &mut dyn Write) -> io::Result<Answer> {
        writeln!(out, "CONNECT {}:{}", q.target, q.port)?;
        let plain = self.decide(&self.request(q, Proto::Connect, false));
        let ok = self.show(q, &plain, out)?;
        let with = self.decide(&self.request(q, Proto::Connect, true));
        let mut inner_ok = false;
        if with.verdict == Verdict::Intercept {
            let e = with.exception.expect("intercept names an exception");
            writeln!(out)?;
            writeln!(
                out,
                "with TLS interception (serve --ca-dir) the tunnel is opened and each request \
                 inside it is decided again, so that {}'s rules apply:",
                e.id
            )?;
            if q.kind == Kind::Authority {
                writeln!(
                    out,
                    "  (give https://{}:{}/path to ask about one)",
                    q.target, q.port
                )?;
            } else {
                let assumed = if q.method_given {
                    ""
                } else {
                    "   (method GET assumed)"
                };
                writeln!(out, "{} {}{assumed}", q.method, q.url())?;
                match &q.path {
                    Err(e) => writeln!(out, "  DENY   malformed: refused with 400 ({e})")?,
                    Ok(_) => {
                        let inner = self.decide(&self.request(q, Proto::Tls, true));
                        inner_ok = self.show(q, &inner, out)?;
                    }
                }
            }
        } else if q.kind == Kind::Https && plain.is_allowed() {
            writeln!(out)?;
            let what = if q.method_given {
                format!("{} {}", q.method, q.raw_path)
            } else {
                q.raw_path.clone()
            };
            writeln!(
                out,
                "inside the tunnel: {what} is not inspected — no exception for this destination \
                 restricts methods or paths, so the tunnel stays opaque even with interception"
            )?;
        }
        if q.kind == Kind::Https && q.port == 443 && plain.is_allowed() {
            writeln!(
                out,
                "note: the TLS server name (SNI) must be {} too, or the tunnel is closed \
                 (sni_mismatch)",
                q.target
            )?;
        }
        if ok {
            return Ok(Answer::from(self.address_check(q, &plain, out)?));
        }
        if inner_ok && self.address_check(q, &with, out)? {
            return Ok(Answer::OnlyIntercepted);
        }
        if !ok {
            self.address_note(q, out)?;
        }
        Ok(Answer::Denied)
    }

    fn explain_dns(&self, q: &Query, t: u16, out: &mut dyn Write) -> io::Result<bool> {
        writeln!(out, "DNS {} {}", q.target, qtype::qtype_name(t))?;
        let d = self.decide(&self.request(q, Proto::Dns, false));
        let ok = self.show(q, &d, out)?;
        if ok {
            writeln!(
                out,
                "answers: explain does not resolve names. egressd forwards the query; when every \
                 address in the answer is non-public (private, loopback, link-local, …) and \
                 outside the exception's cidrs the query is refused (private_address), and \
                 non-public addresses are dropped from mixed answers"
            )?;
            writeln!(
                out,
                "         names that look like data (long labels, tunnelling patterns) may still \
                 be refused (dns_tunnel)"
            )?;
        } else if d.reason == Reason::QtypeNotAllowed && qtype::NEVER_ALLOWED.contains(&t) {
            writeln!(
                out,
                "         zone transfers, ANY and NULL are never answered, whatever the policy"
            )?;
        }
        Ok(ok)
    }

    /// Prints one decision; Ok(allowed, report mode not counted).
    fn show(&self, q: &Query, d: &Decision<'_>, out: &mut dyn Write) -> io::Result<bool> {
        let allowed = d.is_allowed() && !d.report_only;
        match (d.verdict, d.report_only) {
            (Verdict::Deny, _) | (_, true) => {
                writeln!(
                    out,
                    "  DENY   {}: {}",
                    d.reason.as_str(),
                    d.reason.describe()
                )?;
                if let Some(e) = d.exception {
                    writeln!(out, "         closest: {}", location(e))?;
                    writeln!(out, "         {}", self.why_not(q, d.reason, e))?;
                } else if d.reason == Reason::NoException {
                    self.hints(q, out)?;
                }
                if d.report_only {
                    writeln!(
                        out,
                        "         mode: report — egressd lets this through and logs it as a \
                         denial; under mode: enforce it is refused"
                    )?;
                }
            }
            (Verdict::Allow, false) | (Verdict::Intercept, false) => {
                let e = d.exception.expect("an allow names its exception");
                writeln!(out, "  ALLOW  by exception {}", location(e))?;
                self.describe_exception(q, e, out)?;
            }
        }
        Ok(allowed)
    }

    fn describe_exception(&self, q: &Query, e: &Exception, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "         owner    {}", e.owner)?;
        writeln!(out, "         reason   {}", e.reason)?;
        writeln!(out, "         ticket   {}", e.ticket().unwrap_or("-"))?;
        let expires = match e.expires() {
            None => "never".to_string(),
            Some(t) => {
                let days = (t - self.now).div_euclid(86400);
                format!("{} (in {days} days)", format_date(t))
            }
        };
        writeln!(out, "         expires  {expires}")?;
        let by = match &q.target {
            Target::Name(h) => e
                .hosts
                .iter()
                .find(|p| p.matches(h))
                .map(|p| format!("host {p}")),
            Target::Ip(ip) => e
                .cidrs
                .iter()
                .find(|n| n.contains(ip))
                .map(|n| format!("cidr {n}")),
        };
        if let Some(by) = by {
            writeln!(out, "         matched  {by}")?;
        }
        if let Some(u) = e.upload() {
            writeln!(
                out,
                "         upload   {} per {} per client (request bodies and tunnel bytes; past it 429 upload_budget, or the tunnel is cut)",
                crate::policy::upload::size_text(u.bytes),
                crate::policy::upload::window_text(u.per_secs)
            )?;
        }
        Ok(())
    }

    /// What about the closest exception did not match.
    fn why_not(&self, q: &Query, reason: Reason, e: &Exception) -> String {
        match reason {
            Reason::Expired => format!(
                "it names this destination but expired on {}",
                e.expires().map(format_date).unwrap_or_default()
            ),
            Reason::ClientNotAllowed => {
                let pats = e.client_patterns().unwrap_or_default().join(", ");
                let asked = match self.client {
                    Some(c) => format!("client {}", self.policy.clients[c as usize].id),
                    None => "no client (anonymous)".into(),
                };
                format!("it is only for clients [{pats}]; this request came from {asked}")
            }
            Reason::PortNotAllowed => format!(
                "it allows ports {}; not {}",
                join(e.ports.iter().map(|p| p.to_string())),
                q.port
            ),
            Reason::MethodNotAllowed => format!(
                "it allows methods {}; not {}",
                join(e.methods().into_iter().flatten().cloned()),
                q.method
            ),
            Reason::PathNotAllowed => format!(
                "it allows paths {}; {} matches none of them",
                join(e.path_patterns().iter().cloned()),
                q.path.as_deref().unwrap_or(&q.raw_path)
            ),
            Reason::QtypeNotAllowed => format!(
                "it answers {}{}; not {}",
                join(qtype::DEFAULT_ALLOWED.iter().map(|t| qtype::qtype_name(*t))),
                if e.dns_types().is_empty() {
                    " (add others with dns_types:)".to_string()
                } else {
                    format!(
                        " and its dns_types {}",
                        join(e.dns_types().iter().map(|t| qtype::qtype_name(*t)))
                    )
                },
                match q.kind {
                    Kind::Dns(t) => qtype::qtype_name(t),
                    _ => "?".into(),
                }
            ),
            Reason::InspectionRequired => format!(
                "it {}, which an opaque CONNECT tunnel cannot enforce; with TLS interception \
                 (serve --ca-dir) egressd would check each request inside",
                inspection_needs(e)
            ),
            other => other.describe().to_string(),
        }
    }

    /// For `no_exception`: exceptions naming hosts in the same registered
    /// domain — the usual cause is a missing sibling name (a CDN host, an
    /// API subdomain).
    fn hints(&self, q: &Query, out: &mut dyn Write) -> io::Result<()> {
        let Target::Name(host) = &q.target else {
            writeln!(
                out,
                "         an IP address is matched only by exceptions' cidrs, never by hosts"
            )?;
            return Ok(());
        };
        let want = registered_domain(host.as_str());
        let mut shown = 0;
        for e in &self.policy.exceptions {
            let near: Vec<String> = e
                .hosts
                .iter()
                .filter(|p| registered_domain(p.fixed_suffix().as_str()) == want)
                .map(|p| p.to_string())
                .collect();
            if near.is_empty() {
                continue;
            }
            if shown == 0 {
                writeln!(out, "         exceptions for other names under {want}:")?;
            }
            if shown == MAX_HINTS {
                writeln!(out, "           …")?;
                break;
            }
            writeln!(out, "           {} names {}", location(e), near.join(", "))?;
            shown += 1;
        }
        Ok(())
    }

    /// For a denied IP literal: what the private-address rule would add.
    fn address_note(&self, q: &Query, out: &mut dyn Write) -> io::Result<()> {
        if let Target::Ip(ip) = &q.target {
            if let Some(class) = addr::classify(*ip) {
                if self.policy.settings.private_destinations == PrivateDestinations::Deny {
                    writeln!(
                        out,
                        "address: {ip} is non-public ({}); besides matching, an exception must \
                         list it in cidrs for it to be dialled",
                        class.as_str()
                    )?;
                }
            }
        }
        Ok(())
    }

    /// For IP literals, the private-address rule as the proxy applies it;
    /// for names, the rule stated (explain does not resolve).
    fn address_check(&self, q: &Query, d: &Decision<'_>, out: &mut dyn Write) -> io::Result<bool> {
        let e = d.exception;
        match &q.target {
            Target::Ip(ip) => {
                let ip: IpAddr = *ip;
                let Some(class) = addr::classify(ip) else {
                    return Ok(true);
                };
                if self.policy.addr_allowed(e, ip) {
                    let why = if self.policy.settings.private_destinations
                        == PrivateDestinations::Allow
                    {
                        "settings.private_destinations is allow".to_string()
                    } else {
                        let id = e.map(|e| e.id.to_string()).unwrap_or_default();
                        format!("exception {id} lists it in cidrs")
                    };
                    writeln!(
                        out,
                        "address: {ip} is non-public ({}); dialled because {why}",
                        class.as_str()
                    )?;
                    Ok(true)
                } else {
                    writeln!(
                        out,
                        "  DENY   {}: {}",
                        Reason::PrivateAddress.as_str(),
                        Reason::PrivateAddress.describe()
                    )?;
                    writeln!(out, "         {ip} is {}", class.as_str())?;
                    Ok(false)
                }
            }
            Target::Name(host) => {
                let cidrs = match e {
                    Some(e) if !e.cidrs.is_empty() => {
                        format!(" ({})", join(e.cidrs.iter().map(|n| n.to_string())))
                    }
                    _ => " (it lists none)".into(),
                };
                if self.policy.settings.private_destinations == PrivateDestinations::Allow {
                    writeln!(
                        out,
                        "address: explain does not resolve names; settings.private_destinations \
                         is allow, so whatever {host} resolves to is dialled"
                    )?;
                } else {
                    writeln!(
                        out,
                        "address: explain does not resolve names. egressd resolves {host} once and \
                         dials only public addresses or ones inside the allowing exception's \
                         cidrs{cidrs}; a name that resolves only to private, loopback or \
                         link-local addresses is denied (private_address)"
                    )?;
                }
                Ok(true)
            }
        }
    }
}

fn location(e: &Exception) -> String {
    format!("{} ({}:{})", e.id, e.file.display(), e.line)
}

fn join(it: impl Iterator<Item = String>) -> String {
    it.collect::<Vec<_>>().join(", ")
}

fn inspection_needs(e: &Exception) -> String {
    let mut parts = Vec::new();
    if let Some(m) = e.methods() {
        parts.push(format!("restricts methods to {}", m.join(", ")));
    }
    if e.paths().is_some() {
        parts.push(format!(
            "restricts paths to {}",
            e.path_patterns().join(", ")
        ));
    }
    if !e.inject().is_empty() {
        let names: Vec<&str> = e.inject().iter().map(|h| h.name.as_str()).collect();
        parts.push(format!("injects {}", names.join(", ")));
    }
    if e.body().is_some() {
        parts.push("judges request bodies (body:)".into());
    }
    parts.join(" and ")
}

/// The registrable domain (public suffix list, private section included),
/// or the name itself when it has none.
fn registered_domain(name: &str) -> String {
    use psl::Psl;
    match psl::List.domain(name.as_bytes()) {
        Some(d) => String::from_utf8_lossy(d.as_bytes()).into_owned(),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::from_yaml;

    const NOW: i64 = 1_800_000_000;

    const POLICY: &str = r##"
settings:
  contact: "#sec"
  clients:
    - id: ci-runner
      sources: [10.8.0.0/16]
    - id: agent-a
      sources: [10.9.0.0/16]
exceptions:
  - id: pypi
    owner: python-platform
    reason: pip installs
    ticket: SEC-1
    hosts: [pypi.org, files.pythonhosted.org]
    ports: [443]
  - id: gh-api
    owner: dev-tools
    reason: read-only API
    expires: 2028-01-01
    hosts: [api.github.com]
    methods: [GET]
    paths: ["/repos/**"]
  - id: gh
    owner: dev-tools
    reason: git clone
    hosts: [github.com]
    ports: [443]
  - id: ci-only
    owner: ci
    reason: artifacts
    clients: ["ci-*"]
    hosts: [artifacts.example.com]
  - id: old
    owner: x
    reason: y
    expires: 2020-01-01
    hosts: [old.example.com]
  - id: lan
    owner: infra
    reason: internal mirror
    hosts: [mirror.corp.example]
    cidrs: [10.20.0.0/16]
  - id: txt
    owner: mail
    reason: spf checks
    hosts: [example.org]
    dns_types: [TXT]
"##;

    fn run(client: Option<&str>, target: &str) -> (i32, String) {
        let p = from_yaml(POLICY).unwrap();
        let mut out = Vec::new();
        let code = explain(&p, client, target, NOW, &mut out);
        (code, String::from_utf8(out).unwrap())
    }

    #[test]
    fn allowed_names_the_exception() {
        let (code, out) = run(None, "https://pypi.org/simple/requests/");
        assert_eq!(code, ALLOWED, "{out}");
        assert!(out.contains("ALLOW  by exception pypi (<inline>:"), "{out}");
        assert!(out.contains("owner    python-platform"), "{out}");
        assert!(out.contains("ticket   SEC-1"), "{out}");
        assert!(out.contains("matched  host pypi.org"), "{out}");
        assert!(out.contains("does not resolve"), "{out}");
        assert!(out.contains("result:  allowed"), "{out}");
    }

    #[test]
    fn port_mismatch_names_closest() {
        let (code, out) = run(None, "http://pypi.org/simple/");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("port_not_allowed"), "{out}");
        assert!(out.contains("closest: pypi"), "{out}");
        assert!(out.contains("it allows ports 443; not 80"), "{out}");
        assert!(out.contains("#sec"), "{out}");
    }

    #[test]
    fn https_with_paths_needs_interception() {
        let (code, out) = run(None, "https://api.github.com/repos/x/y");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("inspection_required"), "{out}");
        assert!(out.contains("with TLS interception"), "{out}");
        assert!(out.contains("ALLOW  by exception gh-api"), "{out}");
        let (_, out) = run(None, "POST https://api.github.com/repos/x/y");
        assert!(out.contains("method_not_allowed"), "{out}");
        assert!(out.contains("it allows methods GET; not POST"), "{out}");
        let (_, out) = run(None, "https://api.github.com/user");
        assert!(out.contains("path_not_allowed"), "{out}");
    }

    #[test]
    fn no_exception_hints_siblings() {
        let (code, out) = run(None, "https://raw.github.com/x");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("no_exception"), "{out}");
        assert!(out.contains("under github.com"), "{out}");
        assert!(out.contains("gh-api"), "{out}");
        assert!(out.contains("names github.com"), "{out}");
    }

    #[test]
    fn clients() {
        let (code, out) = run(None, "https://artifacts.example.com/");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("client_not_allowed"), "{out}");
        assert!(out.contains("[ci-*]"), "{out}");
        let (code, out) = run(Some("ci-runner"), "https://artifacts.example.com/");
        assert_eq!(code, ALLOWED, "{out}");
        let (code, out) = run(Some("nobody"), "https://artifacts.example.com/");
        assert_eq!(code, USAGE, "{out}");
        assert!(out.contains("ci-runner, agent-a"), "{out}");
    }

    #[test]
    fn expired() {
        let (code, out) = run(None, "old.example.com:443");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("exception_expired"), "{out}");
        assert!(out.contains("expired on 2020-01-01"), "{out}");
    }

    #[test]
    fn ip_literals_and_private_addresses() {
        let (code, out) = run(None, "10.20.1.2:443");
        assert_eq!(code, ALLOWED, "{out}");
        assert!(out.contains("lists it in cidrs"), "{out}");
        let (code, out) = run(None, "http://2130706433/");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("an IP address is matched only by"), "{out}");
        let (code, out) = run(None, "https://[::1]:8443/");
        assert_eq!(code, DENIED, "{out}");
    }

    #[test]
    fn dns() {
        let (code, out) = run(None, "dns:files.pythonhosted.org");
        assert_eq!(code, ALLOWED, "{out}");
        assert!(out.contains("DNS files.pythonhosted.org A"), "{out}");
        let (code, out) = run(None, "dns:pypi.org/TXT");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("qtype_not_allowed"), "{out}");
        let (code, _) = run(None, "dns:example.org/TXT");
        assert_eq!(code, ALLOWED);
        let (code, out) = run(None, "dns:example.org/ANY");
        assert_eq!(code, DENIED);
        assert!(out.contains("never answered"), "{out}");
    }

    #[test]
    fn bad_targets() {
        for t in [
            "",
            "ftp://x.example/",
            "pypi.org",
            "https://user@pypi.org/",
            "dns:127.0.0.1",
            "GET POST http://x/",
            "https://pypi.org:0/",
            "2001:db8::1:443",
            "G@T http://x/",
        ] {
            let (code, out) = run(None, t);
            assert_eq!(code, USAGE, "{t}: {out}");
            assert!(out.contains("error:"), "{t}: {out}");
        }
        let (code, out) = run(None, "http://pypi.org/a/../b");
        assert_eq!(code, DENIED, "{out}");
        assert!(out.contains("malformed"), "{out}");
    }
}
