//! What a deny answer offers the agent that hit it: the `egressd explain`
//! command that reproduces the decision, and the YAML stub of an exception
//! that would allow exactly this request, for a person to review.
//!
//! Built only from facts the policy decided on — destination, port,
//! method, normalised path without its query, and the id of a named
//! client — never from headers, tokens or query strings the client sent,
//! so an answer cannot carry a secret back into a log or a pull request.
//! `owner:` and `reason:` stay empty: a policy refuses to load until a
//! person fills them in, so a stub cannot be merged unreviewed.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::decision::{Proto, Reason};
use super::host::parse_host;
use crate::time::format_date;

/// How far ahead the suggested review date lies.
const REVIEW_AFTER_SECS: i64 = 90 * 86400;

/// The request a denial was about, as the policy saw it.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub proto: Proto,
    /// The target as the policy parsed it: a host name or an IP literal
    /// (IPv6 with or without brackets).
    pub host: &'a str,
    pub port: u16,
    pub method: Option<&'a str>,
    /// The normalised path, no query; `None` for a CONNECT.
    pub path: Option<&'a str>,
    /// A named client's id (`None` for `-`).
    pub client: Option<&'a str>,
    /// The resolved address the denial was about, if any.
    pub addr: Option<IpAddr>,
}

/// The exception the decision found closest (what did not match in it).
#[derive(Debug, Clone, Copy)]
pub struct Closest<'a> {
    pub id: &'a str,
    pub owner: &'a str,
}

/// Whether an exception could change the outcome for `reason`: the
/// policy's own denials. Refusals egressd makes beside the policy
/// (malformed input, a stalled log, overload, a forged Host or SNI,
/// tunnelling) are not fixed by an exception, and get no stub.
pub fn exception_can_allow(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::NoException
            | Reason::Expired
            | Reason::GrantUsedUp
            | Reason::PrivateAddress
            | Reason::ClientNotAllowed
            | Reason::PortNotAllowed
            | Reason::MethodNotAllowed
            | Reason::PathNotAllowed
    )
}

/// `host` as it goes into a URL or `host:port` (IPv6 in brackets).
fn authority_host(host: &str) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{bare}]")
    } else {
        bare.to_string()
    }
}

fn target_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Single-quoted for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `egressd explain` command that makes the same decision, for the
/// policy reasons (see [`exception_can_allow`]) and `inspection_required`.
pub fn explain_command(a: &Asked, reason: Reason) -> Option<String> {
    if !exception_can_allow(reason) && reason != Reason::InspectionRequired {
        return None;
    }
    let host = authority_host(a.host);
    let target = match a.proto {
        Proto::Connect => format!("{host}:{}", a.port),
        Proto::Http | Proto::Tls => {
            let (scheme, default_port) = if a.proto == Proto::Tls {
                ("https", 443)
            } else {
                ("http", 80)
            };
            let port = if a.port == default_port {
                String::new()
            } else {
                format!(":{}", a.port)
            };
            let method = a.method.unwrap_or("GET");
            let path = a.path.unwrap_or("/").trim_end_matches('…');
            format!("{method} {scheme}://{host}{port}{path}")
        }
        Proto::Dns => return None,
    };
    let mut cmd = String::from("egressd explain");
    if let Some(c) = a.client {
        let _ = write!(cmd, " --client {}", shell_quote(c));
    }
    let _ = write!(cmd, " {}", shell_quote(&target));
    Some(cmd)
}

/// Whether `path` can stand in `paths:` as itself: complete (not cut for
/// the log) and free of the pattern syntax.
fn literal_path(path: &str) -> bool {
    !path.ends_with('…')
        && path.starts_with('/')
        && !path
            .bytes()
            .any(|b| matches!(b, b'*' | b'?' | b'[' | b']' | b'{' | b'}' | b'\\' | b'"'))
        && !path.chars().any(char::is_control)
}

/// An exception id for `host`: the policy's id alphabet, `ip-` for IP
/// literals (also the report's stubs).
pub fn stub_id(host: &str, is_ip: bool) -> String {
    let id: String = host
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    if is_ip {
        format!("ip-{id}")
    } else {
        id
    }
}

fn cidr_of(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// One exception stub before it is written: the comments above it, its
/// id, and the lines after its fixed `owner:`, `reason:`, `ticket:` and
/// `expires:`. Deny answers and the report build one each; [`Stub::yaml`]
/// is the one place the YAML is laid out.
#[derive(Debug, Default)]
pub struct Stub {
    /// Comment lines above the entry, without `# `.
    pub above: Vec<String>,
    pub id: String,
    pub body: Vec<StubLine>,
}

/// One line of a stub's body.
#[derive(Debug)]
pub enum StubLine {
    /// `key: value`, and a trailing `# comment` (a TODO) if any.
    Key(&'static str, String, Option<String>),
    /// A `# comment` line.
    Note(String),
}

impl Stub {
    pub fn new(id: String) -> Stub {
        Stub {
            id,
            ..Stub::default()
        }
    }

    pub fn key(&mut self, key: &'static str, value: impl Into<String>) {
        self.body.push(StubLine::Key(key, value.into(), None));
    }

    /// `key: value   # comment`: a value a person has to complete.
    pub fn todo(
        &mut self,
        key: &'static str,
        value: impl Into<String>,
        comment: impl Into<String>,
    ) {
        self.body
            .push(StubLine::Key(key, value.into(), Some(comment.into())));
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.body.push(StubLine::Note(note.into()));
    }

    /// The YAML, indented to sit under `exceptions:`; `owner:` and
    /// `reason:` empty, `expires:` a review date from `now`.
    pub fn yaml(&self, now: i64) -> String {
        let mut y = String::new();
        for a in &self.above {
            let _ = writeln!(y, "  # {a}");
        }
        let _ = writeln!(y, "  - id: {}", self.id);
        let _ = writeln!(y, "    owner:     # TODO: the team answerable for it");
        let _ = writeln!(y, "    reason:    # TODO: why sandboxes need it");
        let _ = writeln!(y, "    ticket:    # optional: where it was approved");
        let _ = writeln!(
            y,
            "    expires: {}   # review date",
            format_date(now + REVIEW_AFTER_SECS)
        );
        for l in &self.body {
            let _ = match l {
                StubLine::Key(k, v, None) => writeln!(y, "    {k}: {v}"),
                StubLine::Key(k, v, Some(c)) => writeln!(y, "    {k}: {v}   # {c}"),
                StubLine::Note(n) => writeln!(y, "    # {n}"),
            };
        }
        y
    }
}

/// The YAML of one exception (indented to sit under `exceptions:`) that
/// would allow `a`, or `None` when no exception can (see
/// [`exception_can_allow`]) or the target is not a valid host.
pub fn exception_stub(
    a: &Asked,
    reason: Reason,
    closest: Option<Closest>,
    now: i64,
) -> Option<String> {
    if !exception_can_allow(reason) || a.proto == Proto::Dns {
        return None;
    }
    let ip = target_ip(a.host);
    // Only a name that parses as a host reaches the YAML: whatever else the
    // request carried cannot inject keys into the stub.
    let name = match ip {
        Some(_) => None,
        None => Some(parse_host(a.host).ok()?.to_string()),
    };
    let mut st = Stub::new(stub_id(
        name.as_deref()
            .unwrap_or(a.host.trim_start_matches('[').trim_end_matches(']')),
        ip.is_some(),
    ));
    if let Some(c) = closest {
        let what = match reason {
            Reason::Expired => "has expired: renewing it (a new expires) may be the smaller change",
            _ => "already names this destination: widening it may be the smaller change",
        };
        st.above
            .push(format!("exception {} (owner {}) {what}", c.id, c.owner));
    }
    if let Some(c) = a.client {
        if parse_client_id(c) {
            st.key("clients", format!("[{c}]"));
        }
    }
    destination(&mut st, a, reason, name.as_deref(), ip)?;
    st.key("ports", format!("[{}]", a.port));
    // Methods and paths are named only where the closest exception already
    // restricts them: on HTTPS a restriction needs interception, so adding
    // one to a new exception would turn an allow into inspection_required.
    if reason == Reason::MethodNotAllowed {
        if let Some(m) = a
            .method
            .filter(|m| m.bytes().all(|b| b.is_ascii_alphabetic()))
        {
            st.key("methods", format!("[{}]", m.to_ascii_uppercase()));
        }
    }
    if reason == Reason::PathNotAllowed {
        match a.path.filter(|p| literal_path(p)) {
            Some(p) => st.key("paths", format!("[\"{p}\"]")),
            None => st.todo("paths", "[]", "TODO: the paths the task needs"),
        }
    }
    Some(st.yaml(now))
}

/// The destination's keys: the host (and, for a private address, its
/// network) or the IP's network; `None` when there is neither.
fn destination(
    st: &mut Stub,
    a: &Asked,
    reason: Reason,
    name: Option<&str>,
    ip: Option<IpAddr>,
) -> Option<()> {
    match (name, ip) {
        (Some(n), _) => {
            st.key("hosts", format!("[{n}]"));
            if reason == Reason::PrivateAddress {
                match a.addr {
                    Some(addr) => {
                        st.note(format!(
                            "{addr} is a non-public address: make sure reaching it from a sandbox is meant"
                        ));
                        st.key("cidrs", format!("[{}]", cidr_of(addr)));
                    }
                    None => st.todo(
                        "cidrs",
                        "[]",
                        format!("TODO: the non-public address {n} resolves to, as a /32"),
                    ),
                }
            }
        }
        (None, Some(ip)) => {
            if crate::policy::addr::classify(ip).is_some() {
                st.note(format!(
                    "{ip} is a non-public address: make sure reaching it from a sandbox is meant"
                ));
            }
            st.key("cidrs", format!("[{}]", cidr_of(ip)));
        }
        (None, None) => return None,
    }
    Some(())
}

/// Client ids use the exception id alphabet; anything else stays out of
/// the YAML.
fn parse_client_id(c: &str) -> bool {
    !c.is_empty()
        && c.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::host::parse_target;
    use crate::policy::{from_yaml, Request};

    const NOW: i64 = 1_800_000_000;

    fn asked(proto: Proto, host: &'static str, port: u16) -> Asked<'static> {
        Asked {
            proto,
            host,
            port,
            method: Some("GET"),
            path: (proto != Proto::Connect).then_some("/v1/items"),
            client: None,
            addr: None,
        }
    }

    /// The stub loads once owner and reason are filled in, and not before.
    fn filled(stub: &str) -> crate::policy::Policy {
        let unfilled = from_yaml(&format!("exceptions:\n{stub}")).unwrap_err();
        assert!(unfilled.to_string().contains("no owner"), "{unfilled}");
        let text = stub
            .replace("owner:     #", "owner: team #")
            .replace("reason:    #", "reason: because #");
        from_yaml(&format!(
            "settings:\n  clients:\n    - {{id: agent-a, sources: [10.0.0.0/8]}}\nexceptions:\n{text}"
        ))
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn a_stub_allows_exactly_the_denied_request() {
        let a = asked(Proto::Connect, "api.example.com", 8443);
        let st = exception_stub(&a, Reason::NoException, None, NOW).unwrap();
        assert!(st.contains("- id: api.example.com"), "{st}");
        assert!(st.contains("hosts: [api.example.com]"), "{st}");
        assert!(st.contains("ports: [8443]"), "{st}");
        assert!(st.contains("expires: 2027-04-15"), "{st}");
        let p = filled(&st);
        let target = parse_target("api.example.com").unwrap();
        let connect = |port| Request {
            proto: Proto::Connect,
            client: None,
            target: &target,
            port,
            method: None,
            path: None,
            qtype: None,
            can_intercept: false,
        };
        assert!(p.decide(&connect(8443), NOW).is_allowed());
        assert!(!p.decide(&connect(443), NOW).is_allowed());
    }

    #[test]
    fn method_and_path_appear_only_where_the_exception_restricts_them() {
        let mut a = asked(Proto::Http, "api.example.com", 80);
        a.method = Some("POST");
        let st = exception_stub(&a, Reason::NoException, None, NOW).unwrap();
        assert!(!st.contains("methods:") && !st.contains("paths:"), "{st}");
        let c = Closest {
            id: "api",
            owner: "web",
        };
        let st = exception_stub(&a, Reason::MethodNotAllowed, Some(c), NOW).unwrap();
        assert!(st.contains("methods: [POST]"), "{st}");
        assert!(
            st.contains("exception api (owner web) already names"),
            "{st}"
        );
        filled(&st);
        let st = exception_stub(&a, Reason::PathNotAllowed, Some(c), NOW).unwrap();
        assert!(st.contains("paths: [\"/v1/items\"]"), "{st}");
        filled(&st);
        a.path = Some("/a/*/b");
        let st = exception_stub(&a, Reason::PathNotAllowed, Some(c), NOW).unwrap();
        assert!(st.contains("paths: []   # TODO"), "{st}");
    }

    #[test]
    fn ip_literals_become_cidrs_and_named_clients_clients() {
        let mut a = asked(Proto::Connect, "[fd00::7]", 443);
        a.client = Some("agent-a");
        let st = exception_stub(&a, Reason::PrivateAddress, None, NOW).unwrap();
        assert!(st.contains("cidrs: [fd00::7/128]"), "{st}");
        assert!(st.contains("non-public"), "{st}");
        assert!(st.contains("clients: [agent-a]"), "{st}");
        assert!(st.contains("- id: ip-fd00--7"), "{st}");
        filled(&st);
        let mut a = asked(Proto::Http, "db.internal.test", 80);
        a.addr = Some("10.1.2.3".parse().unwrap());
        let st = exception_stub(&a, Reason::PrivateAddress, None, NOW).unwrap();
        assert!(st.contains("hosts: [db.internal.test]"), "{st}");
        assert!(st.contains("cidrs: [10.1.2.3/32]"), "{st}");
        filled(&st);
    }

    #[test]
    fn refusals_no_exception_can_change_get_nothing() {
        let a = asked(Proto::Http, "api.example.com", 80);
        for r in [
            Reason::Malformed,
            Reason::LogUnavailable,
            Reason::Overloaded,
            Reason::HostMismatch,
            Reason::SniMismatch,
            Reason::DnsTunnel,
            Reason::InspectionRequired,
        ] {
            assert_eq!(exception_stub(&a, r, None, NOW), None, "{r:?}");
        }
        assert!(explain_command(&a, Reason::Malformed).is_none());
        assert!(explain_command(&a, Reason::InspectionRequired).is_some());
        // A target that is not a host name never reaches the YAML.
        let bad = asked(Proto::Http, "a b]: {x}", 80);
        assert_eq!(exception_stub(&bad, Reason::NoException, None, NOW), None);
    }

    #[test]
    fn explain_commands_are_quoted_and_name_the_client() {
        let mut a = asked(Proto::Tls, "api.example.com", 443);
        a.method = Some("DELETE");
        a.path = Some("/it's");
        a.client = Some("agent-a");
        assert_eq!(
            explain_command(&a, Reason::MethodNotAllowed).unwrap(),
            r"egressd explain --client 'agent-a' 'DELETE https://api.example.com/it'\''s'"
        );
        let a = asked(Proto::Connect, "::1", 8443);
        assert_eq!(
            explain_command(&a, Reason::NoException).unwrap(),
            "egressd explain '[::1]:8443'"
        );
        let a = asked(Proto::Http, "h.test", 8080);
        assert_eq!(
            explain_command(&a, Reason::NoException).unwrap(),
            "egressd explain 'GET http://h.test:8080/v1/items'"
        );
    }
}
