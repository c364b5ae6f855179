//! The policy: YAML files → validated [`Policy`] (one pure function,
//! [`compile`]) → a compiled matcher and the one [`Policy::decide`] function
//! every front-end asks. No I/O happens in `decide`; loading reads files and
//! the `${env:…}`/`${file:…}` values of injected headers, nothing else.
//!
//! The pure leaf of the crate: it uses nothing but `time`. It owns the
//! format (`raw`), validation (`compile/`), the one host parser (`host`),
//! addresses (`addr`), paths (`path`), the matcher, the decision values
//! (`decision`) and the pointer readers load (`PolicyHandle`). It does not
//! own reloading (`reload`), logging or counting (`record`), or any
//! network I/O.

pub mod addr;
pub mod body;
mod compile;
pub mod decision;
pub mod field;
pub mod git;
pub mod grant;
mod handle;
pub mod host;
pub mod matcher;
pub mod path;
pub mod qtype;
pub mod raw;
pub mod suggest;
pub mod upload;
pub mod yaml;

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use ipnet::IpNet;

use crate::packages;

pub use compile::{compile, compile_digested, digest_sources, Digests};
pub use decision::{enforced, Decision, Logged, Proto, Reason, Verdict};
pub use handle::PolicyHandle;
use host::{HostPattern, Target};
use matcher::Matcher;
pub use raw::{DenyRcode, MissingSni, Mode, PrivateDestinations, TunnelAction};

/// Ports an exception reaches when it names none.
pub const DEFAULT_PORTS: &[u16] = &[80, 443];
/// Upper bound on one policy file, so a runaway generator cannot exhaust memory.
pub const MAX_POLICY_FILE_BYTES: u64 = 64 << 20;

/// One error in a policy, located in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl Diagnostic {
    /// A YAML error, located where serde_yaml says it is.
    pub fn from_yaml(path: &Path, e: &serde_yaml_ng::Error) -> Diagnostic {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        let mut msg = e.to_string();
        // serde_yaml appends " at line L column C"; we print it as file:line:column.
        if let Some(i) = msg.find(" at line ") {
            msg.truncate(i);
        }
        Diagnostic {
            file: path.to_path_buf(),
            line,
            column,
            message: without_content(&msg),
        }
    }
}

/// A YAML error's message with nothing of the file's content: the value
/// in `invalid type: string "…"` (a key file, `/etc/shadow` linked in as a
/// policy would otherwise be printed), quoted values of other errors, and
/// a key that does not look like a mistyped field name. What was expected
/// stays, and the location says where.
fn without_content(msg: &str) -> String {
    for lead in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = msg.strip_prefix(lead) {
            let expected = rest.find(", expected").map_or("", |i| &rest[i..]);
            let kind = rest.split([' ', ',']).next().unwrap_or("");
            let kind = match kind {
                "string" | "integer" | "floating" | "boolean" | "map" | "sequence" | "unit"
                | "character" | "bytes" | "null" => kind,
                _ => "value",
            };
            return format!("{lead}{kind}{expected}");
        }
    }
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    // `name` (serde's unknown field or variant): kept when it reads as a
    // mistyped field name, the one thing a policy author needs from it.
    let mut first_tick = true;
    loop {
        let Some(i) = rest.find(['"', '`']) else {
            out.push_str(rest);
            break;
        };
        out.push_str(&rest[..i]);
        let q = rest.as_bytes()[i] as char;
        let body = &rest[i + 1..];
        let end = body.find(q).unwrap_or(body.len());
        let inner = &body[..end];
        let name_like = inner.len() <= 40
            && inner
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if q == '`' && (name_like || !first_tick) {
            out.push('`');
            out.push_str(inner);
            out.push('`');
        } else {
            out.push_str(if q == '`' {
                "(a key, not shown)"
            } else {
                "\"…\""
            });
        }
        if q == '`' {
            first_tick = false;
        }
        rest = body.get(end + 1..).unwrap_or("");
    }
    out
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.column,
            self.message
        )
    }
}

/// Everything wrong with a policy, each with file:line:column.
#[derive(Debug, Clone)]
pub struct LoadError(pub Vec<Diagnostic>);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {d}")?;
        }
        Ok(())
    }
}
impl std::error::Error for LoadError {}

impl LoadError {
    fn at(file: &Path, line: usize, column: usize, message: impl Into<String>) -> LoadError {
        LoadError(vec![Diagnostic {
            file: file.to_path_buf(),
            line,
            column,
            message: message.into(),
        }])
    }
}

/// DNS tunnel-detection thresholds (`settings.dns.tunnel`).
#[derive(Debug, Clone)]
pub struct TunnelSettings {
    pub action: TunnelAction,
    pub max_name_len: usize,
    pub max_label_len: usize,
    pub alert_unique_names: u32,
    pub alert_bytes: u64,
    pub alert_window_secs: u64,
    pub block_bytes: u64,
    pub block_window_secs: u64,
    /// New-name bytes per client and domain per day (a sliding 24 h).
    pub daily_bytes: u64,
    pub cooldown_secs: u64,
}

impl Default for TunnelSettings {
    fn default() -> Self {
        TunnelSettings {
            action: TunnelAction::Block,
            max_name_len: 120,
            max_label_len: 63,
            alert_unique_names: 50,
            alert_bytes: 512,
            alert_window_secs: 600,
            // Information bytes (src/dns/tunnel.rs). 1400 an hour: tunnels
            // fitted to the caps move at most 980 B before the block, and the
            // benign corpus (examples/tunnel_eval.rs) passes down to 1170.
            block_bytes: 1400,
            block_window_secs: 3600,
            daily_bytes: 8192,
            cooldown_secs: 3600,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DnsSettings {
    pub deny_rcode: DenyRcode,
    pub tunnel: TunnelSettings,
    pub cache_min_ttl: u64,
    pub cache_max_ttl: u64,
}

/// `settings.limits`: each client's share, and the header timeout. Read
/// when a connection is accepted, so that a reload applies to the
/// connections that come after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections per client (named client by source, else source
    /// address), [`MIN_CONNECTIONS_PER_CLIENT`]..=[`MAX_CONNECTIONS_PER_CLIENT`].
    pub connections_per_client: u32,
    /// Seconds a client has to send a request head,
    /// [`MIN_HEADER_TIMEOUT_SECS`]..=[`MAX_HEADER_TIMEOUT_SECS`].
    pub header_timeout_secs: u64,
    /// Seconds a client may keep its receive window shut (an HTTP/2
    /// stream's flow-control window) while egressd holds data for it;
    /// past it the stream is reset, with a line.
    /// [`MIN_STALL_TIMEOUT_SECS`]..=[`MAX_STALL_TIMEOUT_SECS`].
    pub stall_timeout_secs: u64,
    /// Decision lines per second one client gets written one by one (after
    /// a burst of ten seconds' worth); past it that second's further
    /// decisions are summed into one `rate_limited` line. [`MIN_LOG_LINES_PER_CLIENT_PER_SEC`]..=
    /// [`MAX_LOG_LINES_PER_CLIENT_PER_SEC`].
    pub log_lines_per_client_per_sec: u32,
}

pub const DEFAULT_CONNECTIONS_PER_CLIENT: u32 = 1024;
pub const MIN_CONNECTIONS_PER_CLIENT: u32 = 1;
/// The proxy's bound on all connections together (`proxy::MAX_CONNECTIONS`):
/// a larger share would be no share.
pub const MAX_CONNECTIONS_PER_CLIENT: u32 = 16_384;
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;
pub const MIN_HEADER_TIMEOUT_SECS: u64 = 1;
pub const MAX_HEADER_TIMEOUT_SECS: u64 = 300;
pub const DEFAULT_STALL_TIMEOUT_SECS: u64 = 30;
pub const MIN_STALL_TIMEOUT_SECS: u64 = 1;
pub const MAX_STALL_TIMEOUT_SECS: u64 = 300;
pub const DEFAULT_LOG_LINES_PER_CLIENT_PER_SEC: u32 = 1000;
pub const MIN_LOG_LINES_PER_CLIENT_PER_SEC: u32 = 1;
pub const MAX_LOG_LINES_PER_CLIENT_PER_SEC: u32 = 1_000_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_per_client: DEFAULT_CONNECTIONS_PER_CLIENT,
            header_timeout_secs: DEFAULT_HEADER_TIMEOUT_SECS,
            stall_timeout_secs: DEFAULT_STALL_TIMEOUT_SECS,
            log_lines_per_client_per_sec: DEFAULT_LOG_LINES_PER_CLIENT_PER_SEC,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    pub private_destinations: PrivateDestinations,
    pub stale_after_secs: u64,
    pub contact: String,
    pub dns: DnsSettings,
    pub missing_sni: MissingSni,
    pub limits: Limits,
    /// `settings.grants`: the ceiling of every grant.
    pub grants: grant::GrantSettings,
    /// Where the settings block was, if any (for lint messages).
    pub location: Option<(PathBuf, usize)>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::Enforce,
            private_destinations: PrivateDestinations::Deny,
            stale_after_secs: 90 * 86400,
            contact: "your security team".into(),
            dns: DnsSettings {
                deny_rcode: DenyRcode::Refused,
                tunnel: TunnelSettings::default(),
                cache_min_ttl: 5,
                cache_max_ttl: 86400,
            },
            missing_sni: MissingSni::ExactOnly,
            limits: Limits::default(),
            grants: grant::GrantSettings::default(),
            location: None,
        }
    }
}

/// A named identity (`settings.clients`).
#[derive(Debug, Clone)]
pub struct Client {
    pub id: Arc<str>,
    pub sources: Vec<IpNet>,
    pub token_sha256: Option<[u8; 32]>,
}

/// An index into [`Policy::clients`], valid for the policy that produced it.
pub type ClientIdx = u32;

/// A header egressd adds on the way out; its value never leaves egressd's logs.
#[derive(Clone)]
pub struct InjectedHeader {
    pub name: HeaderName,
    pub value: HeaderValue,
}
impl fmt::Debug for InjectedHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: <redacted>", self.name)
    }
}

/// A validated exception.
///
/// The rules most exceptions do not use live behind one optional box
/// ([`Rules`]), so that an exception naming only hosts, addresses and
/// ports is 128 bytes, not 256: a 100k-exception policy is that list.
#[derive(Debug)]
pub struct Exception {
    pub id: Arc<str>,
    pub owner: Arc<str>,
    pub reason: Box<str>,
    pub hosts: Box<[HostPattern]>,
    pub cidrs: Box<[IpNet]>,
    pub ports: Arc<[u16]>,
    /// The file it is in: one allocation per file, shared by its exceptions.
    pub file: Arc<Path>,
    pub line: usize,
    /// `None` when it uses none of them.
    rules: Option<Box<Rules>>,
}

/// An exception's less common rules; empty ones are `None` or empty.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    pub ticket: Option<Box<str>>,
    /// Unix seconds at which it stops matching.
    pub expires: Option<i64>,
    /// `None`: every client. `Some`: the clients whose id matched a pattern.
    pub clients: Option<Box<[ClientIdx]>>,
    pub client_patterns: Option<Box<[String]>>,
    pub methods: Option<Box<[String]>>,
    /// Shared between exceptions with the same pattern list.
    pub paths: Option<Arc<path::PathSet>>,
    pub path_patterns: Box<[String]>,
    pub dns_types: Box<[u16]>,
    pub inject: Box<[InjectedHeader]>,
    /// Set for a grant (a file of the grants directory).
    pub grant: Option<grant::Grant>,
    /// `git:`: the smart-HTTP endpoints of these repositories only.
    pub git: Option<Arc<git::GitRules>>,
    /// `upload:`: the budget, and the ledger it is charged to.
    pub upload: Option<upload::UploadRule>,
    /// `body:`: the request body is read and judged before forwarding.
    pub body: Option<Arc<body::BodyRules>>,
}

impl Rules {
    fn is_empty(&self) -> bool {
        self.ticket.is_none()
            && self.expires.is_none()
            && self.clients.is_none()
            && self.client_patterns.is_none()
            && self.methods.is_none()
            && self.paths.is_none()
            && self.path_patterns.is_empty()
            && self.dns_types.is_empty()
            && self.inject.is_empty()
            && self.grant.is_none()
            && self.git.is_none()
            && self.upload.is_none()
            && self.body.is_none()
    }
}

impl Exception {
    /// Builds an exception; `rules` are boxed only if any is set.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: Arc<str>,
        owner: Arc<str>,
        reason: Box<str>,
        hosts: Box<[HostPattern]>,
        cidrs: Box<[IpNet]>,
        ports: Arc<[u16]>,
        (file, line): (Arc<Path>, usize),
        rules: Rules,
    ) -> Exception {
        Exception {
            id,
            owner,
            reason,
            hosts,
            cidrs,
            ports,
            file,
            line,
            rules: (!rules.is_empty()).then(|| Box::new(rules)),
        }
    }

    /// Its less common rules; `None` for most exceptions.
    pub fn rules(&self) -> Option<&Rules> {
        self.rules.as_deref()
    }

    pub fn ticket(&self) -> Option<&str> {
        self.rules()?.ticket.as_deref()
    }

    /// Unix seconds at which it stops matching.
    pub fn expires(&self) -> Option<i64> {
        self.rules()?.expires
    }

    /// `None`: every client. `Some`: the clients whose id matched a pattern.
    pub fn clients(&self) -> Option<&[ClientIdx]> {
        self.rules()?.clients.as_deref()
    }

    pub fn client_patterns(&self) -> Option<&[String]> {
        self.rules()?.client_patterns.as_deref()
    }

    pub fn methods(&self) -> Option<&[String]> {
        self.rules()?.methods.as_deref()
    }

    pub fn paths(&self) -> Option<&Arc<path::PathSet>> {
        self.rules()?.paths.as_ref()
    }

    pub fn path_patterns(&self) -> &[String] {
        self.rules().map_or(&[], |r| &r.path_patterns)
    }

    pub fn dns_types(&self) -> &[u16] {
        self.rules().map_or(&[], |r| &r.dns_types)
    }

    pub fn inject(&self) -> &[InjectedHeader] {
        self.rules().map_or(&[], |r| &r.inject)
    }

    /// Makes this exception the grant `g` (compile only).
    pub(crate) fn set_grant(&mut self, g: grant::Grant) {
        self.rules.get_or_insert_with(Box::default).grant = Some(g);
    }

    /// The grant this exception is, if it is one.
    pub fn grant(&self) -> Option<&grant::Grant> {
        self.rules()?.grant.as_ref()
    }

    /// `git:`, when set.
    pub fn git(&self) -> Option<&git::GitRules> {
        self.rules()?.git.as_deref()
    }

    /// `upload:`, when set.
    pub fn upload(&self) -> Option<&upload::UploadRule> {
        self.rules()?.upload.as_ref()
    }

    /// `body:`, when set.
    pub fn body(&self) -> Option<&body::BodyRules> {
        self.rules()?.body.as_deref()
    }

    /// Whether an opaque tunnel cannot enforce this exception (it restricts
    /// what happens inside HTTP, or adds credentials to it).
    pub fn needs_inspection(&self) -> bool {
        self.methods().is_some()
            || self.paths().is_some()
            || !self.inject().is_empty()
            || self.git().is_some()
            || self.body().is_some()
    }

    pub fn is_expired(&self, now: i64) -> bool {
        matches!(self.expires(), Some(t) if now >= t)
    }

    /// Whether this exception lets a resolved or literal address be dialled.
    pub fn reaches_addr(&self, ip: IpAddr) -> bool {
        self.cidrs.iter().any(|n| n.contains(&ip))
    }
}

/// What a front-end asks about: one value for every protocol.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub proto: Proto,
    pub client: Option<ClientIdx>,
    pub target: &'a Target,
    /// Destination port; ignored for DNS.
    pub port: u16,
    /// HTTP method (plain HTTP and inside interception), with the
    /// methods its override headers name.
    pub method: Option<Method<'a>>,
    /// Normalised path (see [`path::normalize_path`]).
    pub path: Option<&'a str>,
    /// DNS query type.
    pub qtype: Option<u16>,
    /// CONNECT only: whether TLS interception is available.
    pub can_intercept: bool,
}

/// An HTTP request's method, and the methods its override headers
/// (`X-HTTP-Method-Override` and kin) name: many frameworks run the
/// override instead of the method, so an exception's `methods` must allow
/// every one of them.
#[derive(Debug, Clone, Copy)]
pub struct Method<'a> {
    pub name: &'a str,
    /// As the headers spell them; matched without regard to case (the
    /// frameworks that honour them upper-case them first).
    pub overrides: &'a [String],
}

impl<'a> From<&'a str> for Method<'a> {
    /// A method with no override.
    fn from(name: &'a str) -> Method<'a> {
        Method {
            name,
            overrides: &[],
        }
    }
}

impl Method<'_> {
    /// Whether `methods` allows the method and every override.
    fn allowed_by(&self, methods: &[String]) -> bool {
        methods.iter().any(|m| m == self.name)
            && self
                .overrides
                .iter()
                .all(|o| methods.iter().any(|m| m.eq_ignore_ascii_case(o)))
    }
}

/// How far a candidate exception got before it failed; the furthest one
/// explains a denial best.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Expired,
    UsedUp,
    Client,
    Port,
    Qtype,
    Method,
    Path,
    GitRepo,
    GitPush,
    Inspection,
}

/// `git:` allows the smart-HTTP endpoints of its repositories, each with
/// its method, and nothing else on the host; `git-receive-pack` only
/// with `push:` (its `info/refs` advertisement is judged by the proxy,
/// which sees the query).
fn git_stage(g: &git::GitRules, req: &Request<'_>) -> Result<(), Stage> {
    let Some((repo, ep)) = req.path.and_then(git::endpoint) else {
        return Err(Stage::Path);
    };
    match req.method {
        Some(m) if m.allowed_by(&[ep.method().to_string()]) => {}
        _ => return Err(Stage::Method),
    }
    if !g.allows_repo(repo) {
        return Err(Stage::GitRepo);
    }
    if ep == git::Endpoint::ReceivePack && g.push.is_none() {
        return Err(Stage::GitPush);
    }
    Ok(())
}

impl Stage {
    fn reason(self) -> Reason {
        match self {
            Stage::Expired => Reason::Expired,
            Stage::UsedUp => Reason::GrantUsedUp,
            Stage::Client => Reason::ClientNotAllowed,
            Stage::Port => Reason::PortNotAllowed,
            Stage::Qtype => Reason::QtypeNotAllowed,
            Stage::Method => Reason::MethodNotAllowed,
            Stage::Path => Reason::PathNotAllowed,
            Stage::GitRepo => Reason::GitRepoNotAllowed,
            Stage::GitPush => Reason::GitPushNotAllowed,
            Stage::Inspection => Reason::InspectionRequired,
        }
    }
}

/// A loaded, validated, compiled policy. Immutable; reload builds a new one.
pub struct Policy {
    pub settings: Settings,
    pub clients: Vec<Client>,
    pub exceptions: Vec<Exception>,
    pub files: Vec<PathBuf>,
    /// Hash of every file's name and bytes ([`Digests::policy`]); reload
    /// skips identical content.
    pub digest: [u8; 32],
    matcher: Matcher,
    /// The approved package sets and `settings.packages` (empty without them).
    pub packages: packages::compile::PackagePolicy,
    /// Each file's name, content digest and exceptions, in `files` order:
    /// what the next compile needs to take an unchanged file's exceptions
    /// from this policy instead of parsing the file again.
    compiled_files: Vec<compile::FileRecord>,
    /// Set by [`Policy::serve_only`]: every request and query is this
    /// client's.
    only_client: Option<ClientIdx>,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("exceptions", &self.exceptions.len())
            .field("files", &self.files)
            .finish()
    }
}

impl Policy {
    /// The one decision function. Pure: same policy, request and time give
    /// the same decision. Among the exceptions that allow the request, the
    /// first in load order (files sorted by name, then position) is named.
    pub fn decide(&self, req: &Request<'_>, now: i64) -> Decision<'_> {
        let mut allow: Option<u32> = None;
        let mut inspect: Option<u32> = None;
        let mut closest: Option<(Stage, u32)> = None;
        self.matcher.for_each_candidate(req.target, |i| {
            if allow.is_some_and(|a| a <= i) {
                return;
            }
            match self.evaluate(&self.exceptions[i as usize], req, now) {
                Ok(false) => allow = Some(i),
                Ok(true) => {
                    if inspect.is_none_or(|x| i < x) {
                        inspect = Some(i)
                    }
                }
                Err(stage) => {
                    if closest.is_none_or(|(s, x)| stage > s || (stage == s && i < x)) {
                        closest = Some((stage, i))
                    }
                }
            }
        });
        let decision = match (inspect, allow) {
            (Some(i), a) if req.can_intercept && a.is_none_or(|a| i < a) => Decision {
                verdict: Verdict::Intercept,
                reason: Reason::Exception,
                exception: Some(&self.exceptions[i as usize]),
                report_only: false,
            },
            (_, Some(i)) => Decision::allow(&self.exceptions[i as usize]),
            (Some(i), None) => Decision::deny(
                Reason::InspectionRequired,
                Some(&self.exceptions[i as usize]),
            ),
            (None, None) => match closest {
                Some((stage, i)) => {
                    Decision::deny(stage.reason(), Some(&self.exceptions[i as usize]))
                }
                None => Decision::deny(Reason::NoException, None),
            },
        };
        self.finish(decision)
    }

    /// [`Policy::decide`] for a request about to be served: when a grant
    /// allows it outright, one of the grant's uses is taken, exactly (of
    /// requests racing for the last use one wins; the others are decided
    /// again, and the used-up grant no longer matches). DNS answers and
    /// CONNECTs that will be intercepted take no use: the requests they
    /// lead to do. `decide` itself takes nothing (`explain`, replays).
    pub fn decide_to_serve(&self, req: &Request<'_>, now: i64) -> Decision<'_> {
        loop {
            let d = self.decide(req, now);
            let grant = d.exception.and_then(Exception::grant);
            match grant {
                Some(g)
                    if d.verdict == Verdict::Allow
                        && !d.report_only
                        && req.proto != Proto::Dns
                        && !g.take() => {}
                _ => return d,
            }
        }
    }

    /// Every exception that allows `req` (HTTP, or a request inside an
    /// intercepted tunnel), in load order: a rule the decision cannot see
    /// (`body:`) is judged over them, the first that allows deciding
    /// (DESIGN "Precise semantics of writes", several exceptions).
    pub fn allowing(&self, req: &Request<'_>, now: i64) -> Vec<&Exception> {
        let mut found: Vec<u32> = Vec::new();
        self.matcher.for_each_candidate(req.target, |i| {
            if self
                .evaluate(&self.exceptions[i as usize], req, now)
                .is_ok()
            {
                found.push(i);
            }
        });
        found.sort_unstable();
        found.dedup();
        found
            .into_iter()
            .map(|i| &self.exceptions[i as usize])
            .collect()
    }

    /// Lets `share` hand each grant the counter it counts in (the one
    /// kept for its id across reloads and restarts). Called before the
    /// policy serves.
    pub fn share_grant_uses(
        &mut self,
        mut share: impl FnMut(&Exception) -> Option<Arc<grant::GrantUses>>,
    ) {
        for e in &mut self.exceptions {
            if e.grant().is_none() {
                continue;
            }
            if let Some(uses) = share(e) {
                if let Some(g) = e.rules.as_mut().and_then(|r| r.grant.as_mut()) {
                    g.share(uses);
                }
            }
        }
    }

    /// Hands every exception with `upload:` its ledger: `share` gives the
    /// one an earlier policy charged under the same id, or `None` to keep
    /// the fresh one (then returned by `Exception::upload`).
    pub fn share_upload_ledgers(
        &mut self,
        mut share: impl FnMut(&Exception) -> Option<Arc<upload::UploadLedger>>,
    ) {
        for e in &mut self.exceptions {
            if e.upload().is_none() {
                continue;
            }
            if let Some(ledger) = share(e) {
                if let Some(u) = e.rules.as_mut().and_then(|r| r.upload.as_mut()) {
                    u.share(ledger);
                }
            }
        }
    }

    /// The grants among the exceptions.
    pub fn grants(&self) -> impl Iterator<Item = (&Exception, &grant::Grant)> {
        self.exceptions
            .iter()
            .filter_map(|e| e.grant().map(|g| (e, g)))
    }

    /// Applies the policy's mode to a decision made by the exceptions.
    fn finish<'p>(&'p self, d: Decision<'p>) -> Decision<'p> {
        d.under(self.settings.mode)
    }

    /// Ok(needs_inspection) when `e` allows `req`; else how far it got.
    fn evaluate(&self, e: &Exception, req: &Request<'_>, now: i64) -> Result<bool, Stage> {
        // A grant past its TTL or its uses matches nothing from that
        // moment: both are read here, at decide time, not at load.
        if e.is_expired(now) {
            return Err(Stage::Expired);
        }
        if e.grant().is_some_and(grant::Grant::used_up) {
            return Err(Stage::UsedUp);
        }
        if let Some(allowed) = e.clients() {
            match req.client {
                Some(c) if allowed.contains(&c) => {}
                _ => return Err(Stage::Client),
            }
        }
        match req.proto {
            Proto::Dns => {
                // A type no exception can allow fails here, at the type
                // stage: a name no exception covers is `no_exception`
                // whatever its type.
                let t = req.qtype.unwrap_or(qtype::A);
                if qtype::NEVER_ALLOWED.contains(&t)
                    || !qtype::DEFAULT_ALLOWED.contains(&t) && !e.dns_types().contains(&t)
                {
                    return Err(Stage::Qtype);
                }
                Ok(false)
            }
            Proto::Connect => {
                if !e.ports.contains(&req.port) {
                    return Err(Stage::Port);
                }
                if e.needs_inspection() || self.gated_target(req.target) {
                    return if req.can_intercept {
                        Ok(true)
                    } else {
                        Err(Stage::Inspection)
                    };
                }
                Ok(false)
            }
            Proto::Http | Proto::Tls => {
                if !e.ports.contains(&req.port) {
                    return Err(Stage::Port);
                }
                if let Some(methods) = e.methods() {
                    match req.method {
                        Some(m) if m.allowed_by(methods) => {}
                        _ => return Err(Stage::Method),
                    }
                }
                if let Some(paths) = e.paths() {
                    match req.path {
                        Some(p) if paths.is_match(p) => {}
                        _ => return Err(Stage::Path),
                    }
                }
                if let Some(g) = e.git() {
                    git_stage(g, req)?;
                }
                Ok(false)
            }
        }
    }

    /// Whether an address a name resolved to (or an IP literal) may be
    /// dialled under the exception that allowed the request.
    pub fn addr_allowed(&self, exception: Option<&Exception>, ip: IpAddr) -> bool {
        if self.settings.private_destinations == PrivateDestinations::Allow || addr::is_public(ip) {
            return true;
        }
        exception.is_some_and(|e| e.reaches_addr(ip))
    }

    /// Identifies a client by a Proxy-Authorization token (compared as
    /// SHA-256 digests in constant time) or else by source address.
    /// `Err(UnknownToken)` when a token was presented that matches no
    /// client: such a request is refused rather than treated as anonymous.
    pub fn identify(
        &self,
        src: IpAddr,
        token: Option<&[u8]>,
    ) -> Result<Option<ClientIdx>, UnknownToken> {
        if self.only_client.is_some() {
            return Ok(self.only_client);
        }
        if let Some(tok) = token {
            let digest = ring::digest::digest(&ring::digest::SHA256, tok);
            let mut found = None;
            for (i, c) in self.clients.iter().enumerate() {
                if let Some(want) = &c.token_sha256 {
                    if ct_eq(digest.as_ref(), want) && found.is_none() {
                        found = Some(i as ClientIdx);
                    }
                }
            }
            return found.map(Some).ok_or(UnknownToken);
        }
        let src = canonical_ip(src);
        Ok(self
            .clients
            .iter()
            .position(|c| c.sources.iter().any(|n| n.contains(&src)))
            .map(|i| i as ClientIdx))
    }

    /// The ecosystem whose package gate `host` is behind: a public registry
    /// host of an ecosystem in `settings.packages.enforce`. Every request to
    /// it goes through the gate, so a CONNECT to it needs interception, as
    /// an exception with `paths:` does.
    pub fn package_gated(&self, host: &str) -> Option<packages::Ecosystem> {
        packages::classify::registry_ecosystem(host)
            .filter(|&eco| self.packages.settings.enforces(eco))
    }

    fn gated_target(&self, target: &Target) -> bool {
        match target {
            Target::Name(h) => self.package_gated(h.as_str()).is_some(),
            Target::Ip(_) => false,
        }
    }

    /// Makes every request and query the client `id`'s, whatever its
    /// source address or token: the embedded egressd of `egressd run`
    /// serves one sandbox, whose traffic comes from a loopback of its own
    /// that a host client's `sources:` must never match. The policy's
    /// client of that id if it declares one (its exceptions' `clients:`
    /// name it), else a client of its own that no `clients:` list names.
    pub fn serve_only(&mut self, id: &str) {
        let i = match self.clients.iter().position(|c| &*c.id == id) {
            Some(i) => i,
            None => {
                self.clients.push(Client {
                    id: id.into(),
                    sources: Vec::new(),
                    token_sha256: None,
                });
                self.clients.len() - 1
            }
        };
        self.only_client = Some(i as ClientIdx);
    }

    pub fn client_id(&self, c: Option<ClientIdx>) -> Option<&Arc<str>> {
        c.and_then(|c| self.clients.get(c as usize)).map(|c| &c.id)
    }

    pub fn exception(&self, id: &str) -> Option<&Exception> {
        self.exceptions.iter().find(|e| &*e.id == id)
    }

    /// How many of its files the compile that built this policy parsed;
    /// the others were unchanged since the policy it replaced and their
    /// exceptions were taken from that one.
    pub fn files_parsed(&self) -> usize {
        self.compiled_files.iter().filter(|f| f.parsed).count()
    }
}

/// A Proxy-Authorization token that matches no client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the Proxy-Authorization token matches no client")]
pub struct UnknownToken;

/// IPv4-mapped IPv6 sources (dual-stack sockets) as the IPv4 address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One policy file's path and contents.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub path: PathBuf,
    pub text: String,
    /// A file of the grants directory: `grant:` is allowed (and required)
    /// in it, and it is held to `settings.grants`.
    pub grant: bool,
}

/// Reads a policy file, or every `*.yaml`/`*.yml` in a directory (sorted by
/// name, hidden files and Kubernetes' `..data` internals skipped).
///
/// A file in a directory that is a symlink must lead to a file inside that
/// directory (Kubernetes' `p.yaml -> ..data/p.yaml`), never out of it; files
/// are opened without following a link (`O_NOFOLLOW`, on the link's
/// target), so one swapped in between the check and the read is refused.
/// A file owned by someone other than the user running egressd or root is
/// refused: whoever owns it could change the policy.
pub fn read_sources(path: &Path) -> Result<Vec<Source>, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        // A newcomer's first run from another directory ends here.
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "; name the policy with --policy PATH (or EGRESSD_POLICY; `egressd check PATH`), \
             or start from the policy/ directory of egressd's repository"
        } else {
            ""
        };
        LoadError::at(path, 0, 0, format!("cannot read policy: {e}{hint}"))
    })?;
    let mut files = Vec::new();
    if meta.is_dir() {
        let dir = path
            .canonicalize()
            .map_err(|e| LoadError::at(path, 0, 0, format!("cannot read policy directory: {e}")))?;
        let rd = std::fs::read_dir(path)
            .map_err(|e| LoadError::at(path, 0, 0, format!("cannot read policy directory: {e}")))?;
        for entry in rd {
            let entry = entry.map_err(|e| {
                LoadError::at(path, 0, 0, format!("cannot read policy directory: {e}"))
            })?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
                continue;
            }
            if name == "tests.yaml" || name == "tests.yml" || name.ends_with(".tests.yaml") {
                continue;
            }
            let p = entry.path();
            let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
            if is_link {
                let target = p.canonicalize().ok();
                match target {
                    Some(t) if t.starts_with(&dir) && t.is_file() => files.push((p, t)),
                    Some(t) if !t.starts_with(&dir) => {
                        return Err(LoadError::at(
                            &p,
                            0,
                            0,
                            "is a symlink that leads out of the policy directory; egressd \
                             reads only files inside it",
                        ))
                    }
                    _ => {}
                }
            } else if p.is_file() {
                files.push((p.clone(), p));
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(LoadError::at(
                path,
                0,
                0,
                "policy directory holds no *.yaml or *.yml files",
            ));
        }
    } else {
        let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        files.push((path.to_path_buf(), real));
    }
    let mut out = Vec::with_capacity(files.len());
    for (f, real) in files {
        let text = read_policy_file(&real).map_err(|e| LoadError::at(&f, 0, 0, e))?;
        out.push(Source {
            path: f,
            text,
            grant: false,
        });
    }
    if meta.is_dir() {
        out.extend(read_grants(&path.join(GRANTS_DIR))?);
    }
    Ok(out)
}

/// The grants directory's name inside a policy directory.
pub const GRANTS_DIR: &str = "grants";

/// Where a policy's grants live: `grants` when given (`--grants DIR`),
/// else `<policy>/grants/` for a policy directory; a one-file policy has
/// none unless given.
pub fn grants_dir(policy: &Path, grants: Option<&Path>) -> Option<PathBuf> {
    match grants {
        Some(g) => Some(g.to_path_buf()),
        None if policy.is_dir() => Some(policy.join(GRANTS_DIR)),
        None => None,
    }
}

/// Reads a policy with its grants from `grants` (`--grants DIR`) instead
/// of `<policy>/grants/`.
pub fn read_sources_with(path: &Path, grants: Option<&Path>) -> Result<Vec<Source>, LoadError> {
    let Some(g) = grants else {
        return read_sources(path);
    };
    let mut out = read_sources(path)?;
    // A policy directory's own grants/ is not read when --grants names
    // another: the grants are where the operator said they are.
    out.retain(|s| !s.grant);
    out.extend(read_grants(g)?);
    Ok(out)
}

/// Every `*.yaml` grant file in `dir` (sorted; hidden files, such as the
/// `.state/` of use counts, skipped). A missing directory holds no grants.
pub fn read_grants(dir: &Path) -> Result<Vec<Source>, LoadError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(LoadError::at(
                dir,
                0,
                0,
                format!("cannot read grants directory: {e}"),
            ))
        }
    };
    let mut files = Vec::new();
    for entry in rd {
        let entry = entry
            .map_err(|e| LoadError::at(dir, 0, 0, format!("cannot read grants directory: {e}")))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let p = entry.path();
        if p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let text = read_policy_file(&f).map_err(|e| LoadError::at(&f, 0, 0, e))?;
        out.push(Source {
            path: f,
            text,
            grant: true,
        });
    }
    Ok(out)
}

/// One policy file, opened without following a link, its owner checked.
fn read_policy_file(p: &Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .map_err(|e| format!("cannot read: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    // The process's effective uid owns its /proc entry.
    let me = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "owned by uid {}, neither the user running egressd (uid {me}) nor root: whoever \
             owns a policy file can change what egressd allows; chown it",
            meta.uid()
        ));
    }
    if meta.len() > MAX_POLICY_FILE_BYTES {
        return Err(format!(
            "policy file is larger than {MAX_POLICY_FILE_BYTES} bytes"
        ));
    }
    let mut text = String::new();
    file.take(MAX_POLICY_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read: {e}"))?;
    Ok(text)
}

/// Reads and compiles a policy file or directory.
pub fn load(path: &Path) -> Result<Policy, LoadError> {
    let sources = read_sources(path)?;
    compile(&sources, &|name| std::env::var(name).ok())
}

/// Compiles one in-memory YAML document (tests, benches, `explain`).
pub fn from_yaml(text: &str) -> Result<Policy, LoadError> {
    compile(
        &[Source {
            path: PathBuf::from("<inline>"),
            text: text.to_string(),
            grant: false,
        }],
        &|_| None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_id_in_one_file_is_reported_at_the_duplicate() {
        let yaml = "settings:\n  clients:\n    - id: a\n      sources: [10.0.0.0/8]\nexceptions:\n  - id: a\n    owner: o\n    reason: r\n    hosts: [a.test]\n  - id: a\n    owner: o\n    reason: r\n    hosts: [b.test]\n";
        let err = from_yaml(yaml).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!((err.0[0].line, err.0[0].column), (10, 5), "{err}");
        assert!(err.0[0].message.contains("duplicate exception id"));
    }

    /// An exception written in flow style has no `id:` line of its own:
    /// the ones after it are still placed at their own lines, and a
    /// duplicate after it is reported where it is.
    #[test]
    fn exceptions_after_a_flow_style_one_keep_their_lines() {
        let yaml = "exceptions:\n  - {id: f, owner: o, reason: r, hosts: [f.test]}\n  - id: b\n    owner: o\n    reason: r\n    hosts: [b.test]\n  - id: b\n    owner: o\n    reason: r\n    hosts: [c.test]\n";
        let err = from_yaml(yaml).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!((err.0[0].line, err.0[0].column), (7, 5), "{err}");
        let renamed = yaml.replacen(
            "- id: b\n    owner: o\n    reason: r\n    hosts: [c.test]",
            "- id: c\n    owner: o\n    reason: r\n    hosts: [c.test]",
            1,
        );
        let ok = from_yaml(&renamed).unwrap();
        let lines: Vec<(&str, usize)> = ok.exceptions.iter().map(|e| (&*e.id, e.line)).collect();
        assert_eq!(lines[1..], [("b", 3), ("c", 7)]);
    }

    #[test]
    fn empty_lists_are_errors_not_silent_match_nothing() {
        for key in ["ports", "methods", "paths", "clients"] {
            let yaml = format!("exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.test]\n    {key}: []\n");
            let err = from_yaml(&yaml).unwrap_err();
            assert!(
                err.0[0].message.contains(&format!("{key}: is empty")),
                "{err}"
            );
        }
    }

    #[test]
    fn every_override_a_request_names_must_be_an_allowed_method() {
        let yaml = "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [a.test]\n    methods: [GET, POST]\n  - id: any\n    owner: o\n    reason: r\n    hosts: [b.test]\n";
        let p = from_yaml(yaml).unwrap();
        let ask = |host: &str, name: &str, overrides: &[&str]| {
            let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
            let target = host::parse_target(host).unwrap();
            let req = Request {
                proto: Proto::Http,
                client: None,
                target: &target,
                port: 80,
                method: Some(Method {
                    name,
                    overrides: &overrides,
                }),
                path: Some("/"),
                qtype: None,
                can_intercept: false,
            };
            p.decide(&req, 0).reason
        };
        assert_eq!(ask("a.test", "GET", &[]), Reason::Exception);
        assert_eq!(ask("a.test", "GET", &["post", "GET"]), Reason::Exception);
        assert_eq!(ask("a.test", "GET", &["DELETE"]), Reason::MethodNotAllowed);
        assert_eq!(
            ask("a.test", "GET", &["POST", "PUT"]),
            Reason::MethodNotAllowed
        );
        // The method itself is matched as it is spelled (methods are
        // case-sensitive); with no `methods`, nothing is checked.
        assert_eq!(ask("a.test", "get", &[]), Reason::MethodNotAllowed);
        assert_eq!(ask("b.test", "GET", &["DELETE"]), Reason::Exception);
    }

    #[test]
    fn missing_owner_points_at_its_exception_not_a_client() {
        let yaml = "settings:\n  clients:\n    - id: x\n      sources: [10.0.0.0/8]\nexceptions:\n  - id: x\n    reason: r\n    hosts: [a.test]\n";
        let err = from_yaml(yaml).unwrap_err();
        assert_eq!(err.0[0].line, 6, "{err}");
    }

    const PACKAGES: &str = "settings:
  clients:
    - id: ci-1
      sources: [10.8.0.0/16]
  packages: { enforce: [pypi], min_age: 3d }
exceptions:
  - id: pypi
    owner: o
    reason: r
    hosts: [pypi.org, files.pythonhosted.org, registry.npmjs.org]
packages:
  - id: py-runtime
    owner: o
    reason: r
    ecosystem: pypi
    clients: [\"ci-*\"]
    allow: [\"requests >=2.31,<3\"]
";

    fn connect<'p>(p: &'p Policy, host: &str, can_intercept: bool) -> Decision<'p> {
        let target = host::parse_target(host).unwrap();
        let req = Request {
            proto: Proto::Connect,
            client: None,
            target: &target,
            port: 443,
            method: None,
            path: None,
            qtype: None,
            can_intercept,
        };
        p.decide(&req, 0)
    }

    #[test]
    fn package_sets_and_settings_load_into_the_policy() {
        let p = from_yaml(PACKAGES).unwrap();
        assert_eq!(p.packages.sets.len(), 1);
        let set = &p.packages.sets[0];
        assert_eq!(&*set.id, "py-runtime");
        assert_eq!(set.clients.as_deref(), Some(&[0u32][..]));
        assert_eq!(p.packages.settings.min_age_secs, 3 * 86400);
        assert!(p.packages.settings.enforces(packages::Ecosystem::Pypi));
        assert!(!p.packages.settings.enforces(packages::Ecosystem::Npm));
        // No sets, no settings: an empty package policy.
        let none = from_yaml(
            "exceptions:\n  - id: x\n    owner: o\n    reason: r\n    hosts: [pypi.org]\n",
        )
        .unwrap();
        assert!(none.packages.sets.is_empty());
        assert!(none.packages.settings.enforce.is_empty());
        assert_eq!(none.package_gated("pypi.org"), None);
    }

    #[test]
    fn an_enforced_ecosystems_registry_hosts_need_interception() {
        let p = from_yaml(PACKAGES).unwrap();
        assert_eq!(p.package_gated("pypi.org"), Some(packages::Ecosystem::Pypi));
        assert_eq!(
            p.package_gated("Files.PythonHosted.org."),
            Some(packages::Ecosystem::Pypi)
        );
        assert_eq!(
            p.package_gated("registry.npmjs.org"),
            None,
            "npm is not enforced"
        );
        assert_eq!(p.package_gated("example.com"), None);
        let d = connect(&p, "pypi.org", false);
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Deny, Reason::InspectionRequired)
        );
        assert_eq!(d.exception.map(|e| &*e.id), Some("pypi"));
        let d = connect(&p, "pypi.org", true);
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Intercept, Reason::Exception)
        );
        // Not enforced: an opaque tunnel as before.
        let d = connect(&p, "registry.npmjs.org", false);
        assert_eq!(d.verdict, Verdict::Allow);
        // Report mode relaxes inspection_required like any allowlist denial.
        let report =
            from_yaml(&PACKAGES.replace("settings:\n", "settings:\n  mode: report\n")).unwrap();
        let d = connect(&report, "pypi.org", false);
        assert!(d.is_allowed() && d.report_only && d.reason == Reason::InspectionRequired);
    }

    #[test]
    fn package_errors_are_located_policy_errors() {
        let unknown = PACKAGES.replace(
            "    ecosystem: pypi\n",
            "    ecosystem: pypi\n    alow: [x]\n",
        );
        let err = from_yaml(&unknown).unwrap_err();
        assert_eq!((err.0[0].line, err.0[0].column), (16, 5), "{err}");
        assert!(err.0[0].message.contains("unknown field `alow`"), "{err}");

        let constraint = PACKAGES.replace(">=2.31,<3", "~~2");
        let err = from_yaml(&constraint).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!(err.0[0].line, 17, "{err}");
        assert!(err.0[0].message.contains("py-runtime"), "{err}");
        assert!(
            err.to_string().contains("<inline>:17:23: package set"),
            "{err}"
        );

        // One id space for exceptions and sets.
        let clash = PACKAGES.replace("  - id: py-runtime", "  - id: pypi");
        let err = from_yaml(&clash).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!((err.0[0].line, err.0[0].column), (12, 5), "{err}");
        assert!(err.0[0].message.contains("also an exception id"), "{err}");
    }
}
