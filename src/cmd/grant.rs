//! `egressd grant`: a denied request (found by its id in the decision log)
//! becomes a grant — the narrowest exception that allows exactly what was
//! denied, for one client, until its TTL or its uses run out — written as
//! one file in the grants directory, which `serve` watches like the policy.
//! `--list`, `--revoke`, `--promote` (DESIGN "Grants: the friction loop").
//!
//! Owns finding the line, building the grant, and the grant files. Does not
//! own the ceiling (`policy::grant`) or counting uses (`reload::grants`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::report::read;
use super::Exit;
use crate::policy::grant::{check_ceiling, Candidate, GRANTABLE};
use crate::policy::{self, Policy, Reason, Source};
use crate::reload::grants::{lock_file, read_uses, state_file, write_atomic};
use crate::time::{format_rfc3339_millis, unix_now};

/// `egressd grant ID --ttl D [--uses N] [--client C|--any-client] --owner WHO --reason WHY`,
/// `egressd grant --list`, `--revoke GRANT`, `--promote GRANT`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("action").args(["request", "list", "revoke", "promote"]).required(true)))]
pub struct GrantArgs {
    /// The denied request's id (its log line's `id`, the deny answer's X-Egressd-Request).
    #[arg(value_name = "ID")]
    pub request: Option<String>,
    /// How long the grant lives (`30m`, `2h`); at most settings.grants.max_ttl.
    #[arg(long, value_name = "DUR", value_parser = super::report::parse_since, requires = "request")]
    pub ttl: Option<u64>,
    /// How many requests it allows (default: until it expires).
    #[arg(long, value_name = "N", requires = "request")]
    pub uses: Option<u32>,
    /// Grant to this client instead of the one denied.
    #[arg(
        long,
        value_name = "ID",
        conflicts_with = "any_client",
        requires = "request"
    )]
    pub client: Option<String>,
    /// Grant to every client, not only the one denied.
    #[arg(long, requires = "request")]
    pub any_client: bool,
    /// Who answers for the grant (its `owner`).
    #[arg(long, requires = "request")]
    pub owner: Option<String>,
    /// Why it is needed (its `reason`).
    #[arg(long, requires = "request")]
    pub reason: Option<String>,
    /// List the grants: state, uses, expiry.
    #[arg(long)]
    pub list: bool,
    /// Remove a grant: it matches nothing from the next request on.
    #[arg(long, value_name = "GRANT")]
    pub revoke: Option<String>,
    /// Print the permanent exception a grant stands for, for a pull request.
    #[arg(long, value_name = "GRANT")]
    pub promote: Option<String>,
    #[arg(long, env = "EGRESSD_POLICY", default_value = "policy/")]
    pub policy: PathBuf,
    /// The grants directory (default: <policy>/grants/).
    #[arg(long, env = "EGRESSD_GRANTS", value_name = "DIR")]
    pub grants: Option<PathBuf>,
    /// The decision log holding the denied line (default: serve's --log).
    #[arg(long, env = "EGRESSD_LOG", value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// The running egressd's metrics listener, asked for its recent
    /// denials when no log file holds the line (default: serve's
    /// --metrics-listen, 127.0.0.1:9464).
    #[arg(long, value_name = "URL", requires = "request")]
    pub from: Option<String>,
}

/// `egressd grant`: the command's entry.
pub fn main(args: GrantArgs, out: &mut dyn Write, err: &mut dyn Write) -> Exit {
    match run(&args, out) {
        Ok(()) => Exit::OK,
        Err(e) => {
            let _ = writeln!(err, "egressd grant: {e}");
            Exit::FAILED
        }
    }
}

fn run(args: &GrantArgs, out: &mut dyn Write) -> Result<(), String> {
    let dir = policy::grants_dir(&args.policy, args.grants.as_deref()).ok_or_else(|| {
        format!(
            "{} is one file: give --grants DIR for its grants",
            args.policy.display()
        )
    })?;
    if args.list {
        return list(args, &dir, out);
    }
    if let Some(id) = &args.revoke {
        return revoke(&dir, id, out);
    }
    if let Some(id) = &args.promote {
        return promote(args, &dir, id, out);
    }
    let request = args
        .request
        .as_deref()
        .ok_or("give the denied request's ID")?;
    grant(args, &dir, request, out)
}

/// The serving policy as `serve` would load it, grants included.
fn load(args: &GrantArgs, extra: Option<Source>) -> Result<Policy, String> {
    let mut sources = policy::read_sources_with(&args.policy, args.grants.as_deref())
        .map_err(|e| e.to_string())?;
    sources.extend(extra);
    policy::compile(&sources, &|n| std::env::var(n).ok()).map_err(|e| e.to_string())
}

/// The denied line's facts.
#[derive(Debug)]
struct Denied {
    client: String,
    proto: String,
    host: String,
    port: Option<u16>,
    method: Option<String>,
    path: Option<String>,
    reason: String,
}

/// The facts of `line` when it is the deny line of request `id` (either
/// log format).
fn denied_in(line: &[u8], id: &str) -> Result<Option<Denied>, String> {
    if id.is_empty() || !line.windows(id.len()).any(|w| w == id.as_bytes()) {
        return Ok(None);
    }
    let Ok(l) = read::parse_line(line) else {
        return Ok(None);
    };
    if l.id.as_deref() != Some(id) || l.allowed() {
        return Ok(None);
    }
    let s = |v: &Option<std::borrow::Cow<'_, str>>| v.as_deref().map(str::to_string);
    let host = s(&l.host)
        .or_else(|| s(&l.qname))
        .ok_or_else(|| format!("request {id} names no host"))?;
    Ok(Some(Denied {
        client: l.client().to_string(),
        proto: l.proto.to_string(),
        host,
        port: l.port,
        method: s(&l.method),
        path: s(&l.path),
        reason: l.reason().to_string(),
    }))
}

/// Finds the deny line of `id` in `log` (egressd's format or OCSF, plain
/// or gzip).
fn find(log: &Path, id: &str) -> Result<Option<Denied>, String> {
    let mut r = read::open(log).map_err(|e| format!("cannot read {}: {e}", log.display()))?;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = r
            .read_until(b'\n', &mut buf)
            .map_err(|e| format!("reading {}: {e}", log.display()))?;
        if n == 0 {
            return Ok(None);
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if let Some(d) = denied_in(line, id)? {
            return Ok(Some(d));
        }
    }
}

/// `--from`'s default: serve's metrics listener as `EGRESSD_METRICS_LISTEN`
/// gives it, else serve's default.
fn default_from() -> String {
    std::env::var("EGRESSD_METRICS_LISTEN").unwrap_or_else(|_| "127.0.0.1:9464".into())
}

/// Asks the running egressd at `from` (its metrics listener) for the line
/// of denied request `id` it keeps: `Ok(None)` when it keeps none.
fn ask_running(from: &str, id: &str) -> Result<Option<Denied>, String> {
    use std::io::Read;
    let hostport = from
        .strip_prefix("http://")
        .unwrap_or(from)
        .trim_end_matches('/');
    if hostport.contains(['/', '?', '@', '#'])
        || (from.contains("://") && !from.starts_with("http://"))
    {
        return Err(format!(
            "--from {from:?}: give the metrics listener as http://HOST:PORT"
        ));
    }
    if !crate::record::RequestId::looks_like(id) {
        return Err(format!("{id:?} is not a request id (12 characters)"));
    }
    let mut stream = connect_running(from, hostport)?;
    write!(
        stream,
        "GET /denials?id={id} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("asking the running egressd at {hostport}: {e}"))?;
    let mut resp = Vec::new();
    stream
        .take(1 << 20)
        .read_to_end(&mut resp)
        .map_err(|e| format!("reading the running egressd's answer: {e}"))?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("{hostport} did not answer as egressd's metrics listener"))?;
    let head = String::from_utf8_lossy(&resp[..split]);
    let body = &resp[split + 4..];
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    match status {
        200 => {
            let line = body.strip_suffix(b"\n").unwrap_or(body);
            denied_in(line, id)?
                .map(Some)
                .ok_or_else(|| format!("{hostport} answered a line that is not request {id}'s"))
        }
        404 => Ok(None),
        _ => Err(format!(
            "the running egressd at {hostport} answered {status}: {}",
            String::from_utf8_lossy(body).trim()
        )),
    }
}

/// A connection to the metrics listener at `hostport` (an unspecified
/// address, a listener on every address, is reached on loopback), with
/// read and write timeouts set.
fn connect_running(from: &str, hostport: &str) -> Result<std::net::TcpStream, String> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
    let addrs: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .map_err(|e| format!("--from {from:?}: {e}"))?
        .collect();
    let timeout = std::time::Duration::from_secs(5);
    let mut last = None;
    for a in addrs {
        let a = match a.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), a.port())
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), a.port())
            }
            _ => a,
        };
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(timeout));
                let _ = s.set_write_timeout(Some(timeout));
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "cannot reach the running egressd at {hostport}: {}",
        last.map_or("no address".into(), |e| e.to_string())
    ))
}

/// The denied request `id`: from the log file when one is given and holds
/// it, else from the running egressd's recent denials.
fn locate(args: &GrantArgs, id: &str) -> Result<Denied, String> {
    let log = args.log.as_ref().filter(|l| l.as_os_str() != "-");
    if let Some(log) = log {
        if let Some(d) = find(log, id)? {
            return Ok(d);
        }
    }
    let from = args.from.clone().unwrap_or_else(default_from);
    match ask_running(&from, id) {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(match log {
            Some(l) => format!(
                "no denied request {id} in {} nor among the recent denials of the running egressd at {from} (is it the log serve writes? a denial no grant can lift is not kept)",
                l.display()
            ),
            None => format!(
                "no denied request {id} among the recent denials of the running egressd at {from} (give --log FILE for an older one; a denial no grant can lift is not kept)"
            ),
        }),
        Err(e) => Err(match log {
            Some(l) => format!("no denied request {id} in {}, and {e}", l.display()),
            None => format!("{e} (or give --log FILE, the decision log that holds the denied line)"),
        }),
    }
}

fn grant(args: &GrantArgs, dir: &Path, request: &str, out: &mut dyn Write) -> Result<(), String> {
    let ttl = args.ttl.ok_or("give --ttl DUR (30m, 2h)")?;
    let owner = nonempty(args.owner.as_deref(), "--owner WHO")?;
    let reason = nonempty(args.reason.as_deref(), "--reason WHY")?;
    let d = locate(args, request)?;
    let policy = load(args, None)?;
    let now = unix_now();
    let ceiling = Candidate {
        hosts: std::slice::from_ref(&d.host),
        has_cidrs: false,
        has_inject: false,
        ttl_secs: ttl as i64,
        max_uses: args.uses,
    };
    check_ceiling(&ceiling, &policy.settings.grants).map_err(|r| r.to_string())?;
    if !GRANTABLE.iter().any(|r| r.as_str() == d.reason) {
        return Err(format!(
            "request {request} was denied for {}, which a grant cannot change",
            d.reason
        ));
    }
    let (client, method, path) = scope(args, &policy, &d)?;
    let id = grant_id();
    let g = GrantFile {
        id: &id,
        owner,
        reason,
        expires: now + ttl as i64,
        client: client.as_deref(),
        host: &d.host,
        port: if d.proto == "dns" { None } else { d.port },
        method: method.as_deref(),
        path: path.as_deref(),
        from_request: request,
        granted_by: &granted_by(),
        granted_at: now,
        max_uses: args.uses,
    };
    let file = dir.join(format!("{id}.yaml"));
    let text = g.yaml();
    // The reload must take it: compiled with the policy before it is
    // written, so a grant the policy would refuse is never on disk.
    load(
        args,
        Some(Source {
            path: file.clone(),
            text: text.clone(),
            grant: true,
        }),
    )?;
    write_atomic(&file, text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    say_granted(out, &g, &d, &file);
    Ok(())
}

/// Who and what the grant covers: the client (`--client`, every client
/// with `--any-client`, else the denied request's), and the method or
/// path when that was what the denial named.
#[allow(clippy::type_complexity)]
fn scope(
    args: &GrantArgs,
    policy: &Policy,
    d: &Denied,
) -> Result<(Option<String>, Option<String>, Option<String>), String> {
    let client = match (&args.client, args.any_client, d.client.as_str()) {
        (Some(c), _, _) => Some(c.clone()),
        (None, true, _) | (None, false, "-") => None,
        (None, false, c) => Some(c.to_string()),
    };
    if let Some(c) = &client {
        if !policy.clients.iter().any(|k| &*k.id == c) {
            return Err(format!("no client {c:?} in settings.clients"));
        }
    }
    let method = (d.reason == Reason::MethodNotAllowed.as_str())
        .then(|| d.method.clone())
        .flatten();
    let path = match (d.reason == Reason::PathNotAllowed.as_str(), &d.path) {
        (true, Some(p)) if p.contains(['*', '?', '[', ']', '{', '}', '\\']) => {
            return Err(format!(
                "the path {p:?} holds glob characters: write this exception by hand"
            ))
        }
        (true, Some(p)) => Some(p.clone()),
        _ => None,
    };
    Ok((client, method, path))
}

/// What was granted, to whom, until when, and where it is written.
fn say_granted(out: &mut dyn Write, g: &GrantFile<'_>, d: &Denied, file: &Path) {
    let w = |out: &mut dyn Write, s: String| {
        let _ = writeln!(out, "{s}");
    };
    w(out, format!("granted {}: {}", g.id, g.what()));
    match g.client {
        Some(c) => w(out, format!("  to client {c}")),
        None if d.client == "-" => w(
            out,
            "  to every client: the denied request came from no named client".into(),
        ),
        None => w(out, "  to every client (--any-client)".into()),
    }
    w(
        out,
        format!(
            "  until {}{}",
            format_rfc3339_millis(g.expires * 1000),
            match g.max_uses {
                Some(n) => format!(", {n} use{}", if n == 1 { "" } else { "s" }),
                None => String::new(),
            }
        ),
    );
    w(out, format!("  written to {}", file.display()));
}

fn nonempty<'a>(v: Option<&'a str>, flag: &str) -> Result<&'a str, String> {
    v.map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("give {flag}"))
}

/// `g-` and ten random base32 characters.
fn grant_id() -> String {
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let mut b = [0u8; 10];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    let mut id = String::from("g-");
    id.extend(b.iter().map(|x| ALPHABET[(x & 31) as usize] as char));
    id
}

/// Who ran the command: `SUDO_USER`, else `USER`, else the name
/// `/etc/passwd` gives the uid, else the uid.
fn granted_by() -> String {
    if let Some(u) = ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    {
        return u;
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2] == uid).then(|| f[0].to_string())
            })
        })
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// A YAML string: JSON's double-quoted form is YAML's too.
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

struct GrantFile<'a> {
    id: &'a str,
    owner: &'a str,
    reason: &'a str,
    expires: i64,
    client: Option<&'a str>,
    host: &'a str,
    port: Option<u16>,
    method: Option<&'a str>,
    path: Option<&'a str>,
    from_request: &'a str,
    granted_by: &'a str,
    granted_at: i64,
    max_uses: Option<u32>,
}

fn instant(secs: i64) -> String {
    let t = format_rfc3339_millis(secs * 1000);
    // Whole seconds: `2026-12-07T20:00:00Z`.
    format!("{}Z", &t[..19])
}

impl GrantFile<'_> {
    fn what(&self) -> String {
        let mut s = String::new();
        if let Some(m) = self.method {
            s.push_str(m);
            s.push(' ');
        }
        s.push_str(self.host);
        if let Some(p) = self.port {
            s.push_str(&format!(":{p}"));
        }
        if let Some(p) = self.path {
            s.push_str(p);
        }
        s
    }

    /// The exception lines shared by a grant and its promotion.
    fn body(&self, out: &mut String) {
        if let Some(c) = self.client {
            out.push_str(&format!("    clients: [{}]\n", q(c)));
        }
        out.push_str(&format!("    hosts: [{}]\n", q(self.host)));
        if let Some(p) = self.port {
            out.push_str(&format!("    ports: [{p}]\n"));
        }
        if let Some(m) = self.method {
            out.push_str(&format!("    methods: [{}]\n", q(m)));
        }
        if let Some(p) = self.path {
            out.push_str(&format!("    paths: [{}]\n", q(p)));
        }
    }

    fn yaml(&self) -> String {
        let mut s = format!(
            "# A grant, written by `egressd grant` from denied request {}.\n\
             # It expires by itself; `egressd grant --promote {}` prints the permanent exception.\n\
             exceptions:\n  - id: {}\n    owner: {}\n    reason: {}\n    expires: {}\n",
            self.from_request,
            self.id,
            self.id,
            q(self.owner),
            q(self.reason),
            instant(self.expires),
        );
        self.body(&mut s);
        s.push_str(&format!(
            "    grant: {{from_request: {}, granted_by: {}, granted_at: {}",
            q(self.from_request),
            q(self.granted_by),
            instant(self.granted_at)
        ));
        if let Some(n) = self.max_uses {
            s.push_str(&format!(", max_uses: {n}"));
        }
        s.push_str("}\n");
        s
    }
}

/// How a grant stands now.
fn state(e: &policy::Exception, used: u32, now: i64) -> &'static str {
    let g = e.grant().expect("a grant");
    if e.is_expired(now) {
        "expired"
    } else if g.max_uses.is_some_and(|m| used >= m) {
        "used_up"
    } else {
        "active"
    }
}

fn list(args: &GrantArgs, dir: &Path, out: &mut dyn Write) -> Result<(), String> {
    let policy = load(args, None)?;
    let now = unix_now();
    let mut any = false;
    for (e, g) in policy.grants() {
        any = true;
        let used = read_uses(dir, &e.id);
        let hosts: Vec<String> = e.hosts.iter().map(|h| h.to_string()).collect();
        let ports: Vec<String> = e.ports.iter().map(|p| p.to_string()).collect();
        let _ = writeln!(
            out,
            "{}  {}  {}:{}  clients {}  uses {}/{}  until {}  owner {}  from request {}",
            e.id,
            state(e, used, now),
            hosts.join(","),
            ports.join(","),
            e.client_patterns()
                .map_or("every".to_string(), |c| c.join(",")),
            used,
            g.max_uses.map_or("-".to_string(), |m| m.to_string()),
            e.expires().map_or("-".into(), instant),
            e.owner,
            g.from_request,
        );
    }
    if !any {
        let _ = writeln!(out, "no grants in {}", dir.display());
    }
    Ok(())
}

/// The grant file of `id`: it must be in the grants directory.
fn grant_path(dir: &Path, id: &str) -> Result<PathBuf, String> {
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        || id.starts_with('.')
    {
        return Err(format!("{id:?} is not a grant id"));
    }
    let p = dir.join(format!("{id}.yaml"));
    if !p.is_file() {
        return Err(format!("no grant {id} in {}", dir.display()));
    }
    Ok(p)
}

fn revoke(dir: &Path, id: &str, out: &mut dyn Write) -> Result<(), String> {
    let p = grant_path(dir, id)?;
    std::fs::remove_file(&p).map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
    let _ = std::fs::remove_file(state_file(dir, id));
    let _ = std::fs::remove_file(lock_file(dir, id));
    let _ = writeln!(
        out,
        "revoked {id}: removed {} (serve stops matching it at its next reload, within 2 s)",
        p.display()
    );
    Ok(())
}

fn promote(args: &GrantArgs, dir: &Path, id: &str, out: &mut dyn Write) -> Result<(), String> {
    grant_path(dir, id)?;
    let policy = load(args, None)?;
    let e = policy
        .exceptions
        .iter()
        .find(|e| &*e.id == id && e.grant().is_some())
        .ok_or_else(|| format!("no grant {id}"))?;
    let g = e.grant().expect("a grant");
    let host = e.hosts.first().map(|h| h.to_string()).unwrap_or_default();
    let permanent = host.replace('.', "-");
    let mut s = format!(
        "# Promoted from grant {id} (request {}, granted by {}): review and add to the policy.\n\
         exceptions:\n  - id: {permanent}\n    owner: {}\n    reason: {}\n",
        g.from_request,
        g.granted_by,
        q(&e.owner),
        q(&e.reason),
    );
    let f = GrantFile {
        id,
        owner: &e.owner,
        reason: &e.reason,
        expires: 0,
        client: e
            .client_patterns()
            .and_then(|c| c.first())
            .map(String::as_str),
        host: &host,
        port: (e.ports[..] != policy::DEFAULT_PORTS[..]).then(|| e.ports[0]),
        method: e.methods().and_then(|m| m.first()).map(String::as_str),
        path: e.path_patterns().first().map(String::as_str),
        from_request: &g.from_request,
        granted_by: &g.granted_by,
        granted_at: g.granted_at,
        max_uses: g.max_uses,
    };
    f.body(&mut s);
    let _ = write!(out, "{s}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_file_compiles_as_the_grant_it_describes() {
        let g = GrantFile {
            id: "g-abc",
            owner: "alice",
            reason: "needs \"the\" API: now",
            expires: 1_900_000_000,
            client: Some("agent-a"),
            host: "api.example.com",
            port: Some(443),
            method: Some("POST"),
            path: Some("/v1/upload"),
            from_request: "0123456789ab",
            granted_by: "bob",
            granted_at: 1_900_000_000 - 3600,
            max_uses: Some(3),
        };
        let text = g.yaml();
        let settings = "settings:\n  clients:\n    - id: agent-a\n      sources: [10.0.0.0/8]\n";
        let p = policy::compile(
            &[
                Source {
                    path: "p.yaml".into(),
                    text: settings.into(),
                    grant: false,
                },
                Source {
                    path: "grants/g-abc.yaml".into(),
                    text,
                    grant: true,
                },
            ],
            &|_| None,
        )
        .unwrap();
        let e = &p.exceptions[0];
        assert_eq!(&*e.reason, "needs \"the\" API: now");
        assert_eq!(e.expires(), Some(1_900_000_000));
        assert_eq!(e.methods().unwrap(), ["POST"]);
        assert_eq!(e.path_patterns(), ["/v1/upload"]);
        let grant = e.grant().unwrap();
        assert_eq!(
            (grant.max_uses, &*grant.from_request),
            (Some(3), "0123456789ab")
        );
    }
}
