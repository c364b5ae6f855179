//! The offline decision: a TARGET as `egressd explain` takes it
//! (`https://host/path`, `host:port`, `GET http://…`, `dns:name/TYPE`),
//! read into the same [`Request`] values the front-ends build and decided
//! by the same [`Policy::decide`], without the network. `explain` prints
//! it, `check` runs policy tests with it and `report`'s replay
//! (`check --against`) re-decides logged requests with it, so the three
//! cannot disagree.

use crate::policy::host::{parse_target, Target};
use crate::policy::path::normalize_path;
use crate::policy::{qtype, ClientIdx, Decision, Policy, Proto, Reason, Request, Verdict};
use crate::proxy::dest::{parse_authority, AuthorityError, Dest};

/// The decision egressd makes for `target`, read as `explain` reads it,
/// without printing anything: for policy tests (`tests.yaml`) and for
/// replaying logged decisions (`check --against`). For an `https://` URL or
/// `host:port` it is the CONNECT decision; with `intercept` (egressd runs
/// with `--ca-dir`) and a CONNECT that would be intercepted, an `https://`
/// URL gets the decision on the request inside the tunnel. IP literals get
/// the private-address check; names are not resolved. `Err` says why the
/// target cannot be read.
pub fn decide_target<'p>(
    policy: &'p Policy,
    client: Option<ClientIdx>,
    target: &str,
    intercept: bool,
    now: i64,
) -> Result<Decision<'p>, String> {
    let q = Query::parse(target)?;
    let ctx = Ctx {
        policy,
        client,
        now,
    };
    let inside = |proto| match &q.path {
        Ok(_) => ctx.decide(&ctx.request(&q, proto, true)),
        Err(_) => Decision::deny(Reason::Malformed, None),
    };
    let d = match q.kind {
        Kind::Dns(_) => ctx.decide(&ctx.request(&q, Proto::Dns, false)),
        Kind::Http => inside(Proto::Http),
        Kind::Https | Kind::Authority => {
            let connect = ctx.decide(&ctx.request(&q, Proto::Connect, intercept));
            if connect.verdict == Verdict::Intercept && q.kind == Kind::Https {
                inside(Proto::Tls)
            } else {
                connect
            }
        }
    };
    if let Target::Ip(ip) = q.target {
        // The address guard holds in report mode too (`policy::enforced`).
        if d.is_allowed() && !policy.addr_allowed(d.exception, ip) {
            let guard = Decision::deny(Reason::PrivateAddress, None);
            return Ok(guard.under(policy.settings.mode));
        }
    }
    Ok(d)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Http,
    Https,
    /// `host:port`: a CONNECT to that authority.
    Authority,
    Dns(u16),
}

/// A parsed TARGET.
#[derive(Debug)]
pub(crate) struct Query {
    pub(crate) kind: Kind,
    pub(crate) target: Target,
    pub(crate) port: u16,
    /// Given, or GET for URLs.
    pub(crate) method: String,
    pub(crate) method_given: bool,
    /// Normalised path, or why the proxy would refuse it.
    pub(crate) path: Result<String, String>,
    pub(crate) raw_path: String,
}

impl Query {
    pub(crate) fn parse(input: &str) -> Result<Query, String> {
        let input = input.trim();
        if input.is_empty() {
            return Err("empty target".into());
        }
        if let Some(rest) = input.strip_prefix("dns:") {
            return Self::parse_dns(rest);
        }
        let mut words = input.split_whitespace();
        let (method, url) = match (words.next(), words.next(), words.next()) {
            (Some(u), None, None) => (None, u),
            (Some(m), Some(u), None) => {
                if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
                    return Err(format!("{m:?} is not an HTTP method"));
                }
                (Some(m.to_ascii_uppercase()), u)
            }
            _ => return Err(format!("cannot read {input:?} as a target")),
        };
        let (kind, rest) = match url.split_once("://") {
            Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
                "http" => (Kind::Http, rest),
                "https" => (Kind::Https, rest),
                other => {
                    return Err(format!(
                        "scheme {other}:// is not proxied; egressd takes http:// and https:// \
                         (and DNS queries, dns:name)"
                    ))
                }
            },
            None => (Kind::Authority, url),
        };
        let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, raw_path) = rest.split_at(split);
        let default_port = match kind {
            Kind::Http => Some(80),
            Kind::Https => Some(443),
            _ => None,
        };
        let Dest { target, port } = read_authority(authority, default_port)?;
        if kind == Kind::Authority {
            if !raw_path.is_empty() {
                return Err(format!(
                    "{url:?}: a path needs a scheme (https://{authority}{raw_path})"
                ));
            }
            if method.as_deref().is_some_and(|m| m != "CONNECT") {
                return Err("host:port is a CONNECT; give a URL to ask about a method".into());
            }
        }
        let raw_path = if raw_path.is_empty() || raw_path.starts_with(['?', '#']) {
            format!("/{raw_path}")
        } else {
            raw_path.to_string()
        };
        let path = normalize_path(&raw_path).map_err(|e| e.to_string());
        Ok(Query {
            kind,
            target,
            port,
            method_given: method.is_some(),
            method: method.unwrap_or_else(|| {
                if kind == Kind::Authority {
                    "CONNECT".into()
                } else {
                    "GET".into()
                }
            }),
            path,
            raw_path,
        })
    }

    fn parse_dns(rest: &str) -> Result<Query, String> {
        let (name, qt) = match rest.rsplit_once('/') {
            Some((n, t)) => (
                n,
                qtype::parse_qtype(t).ok_or_else(|| format!("unknown DNS record type {t:?}"))?,
            ),
            None => (rest, qtype::A),
        };
        let target = match parse_target(name) {
            Ok(t @ Target::Name(_)) => t,
            Ok(Target::Ip(_)) => {
                return Err(format!(
                    "dns:{name}: an address is not a DNS name (reverse lookups are \
                     dns:d.c.b.a.in-addr.arpa/PTR)"
                ))
            }
            Err(e) => return Err(format!("bad DNS name {name:?}: {e}")),
        };
        Ok(Query {
            kind: Kind::Dns(qt),
            target,
            port: 53,
            method: String::new(),
            method_given: false,
            path: Ok(String::new()),
            raw_path: String::new(),
        })
    }

    pub(crate) fn url(&self) -> String {
        let scheme = if self.kind == Kind::Http {
            "http"
        } else {
            "https"
        };
        let default = if self.kind == Kind::Http { 80 } else { 443 };
        let port = if self.port == default {
            String::new()
        } else {
            format!(":{}", self.port)
        };
        format!("{scheme}://{}{port}{}", self.target, self.raw_path)
    }
}

/// `host:port`, `[v6]:port`, or a bare host when a default port applies,
/// read by the proxy's own edge parser; its refusals are given with a hint
/// at what to write instead.
fn read_authority(a: &str, default_port: Option<u16>) -> Result<Dest, String> {
    if a.is_empty() {
        return Err("the target names no host".into());
    }
    parse_authority(a, default_port).map_err(|e| match e {
        AuthorityError::Userinfo => {
            "user info in the target (user@host) is refused by the proxy (400)".into()
        }
        AuthorityError::UnbracketedIpv6 => {
            format!("{a:?}: write IPv6 addresses in brackets, e.g. [2001:db8::1]:443")
        }
        AuthorityError::PortRequired => {
            format!("{a:?} has no port; write {a}:443, or https://{a}/ for a URL")
        }
        e => e.to_string(),
    })
}

pub(crate) struct Ctx<'p> {
    pub(crate) policy: &'p Policy,
    pub(crate) client: Option<ClientIdx>,
    pub(crate) now: i64,
}

impl<'p> Ctx<'p> {
    pub(crate) fn request<'a>(
        &self,
        q: &'a Query,
        proto: Proto,
        can_intercept: bool,
    ) -> Request<'a> {
        let http = matches!(proto, Proto::Http | Proto::Tls);
        Request {
            proto,
            client: self.client,
            target: &q.target,
            port: q.port,
            method: http.then(|| q.method.as_str().into()),
            path: if http { q.path.as_deref().ok() } else { None },
            qtype: match q.kind {
                Kind::Dns(t) => Some(t),
                _ => None,
            },
            can_intercept,
        }
    }

    pub(crate) fn decide(&self, req: &Request<'_>) -> Decision<'p> {
        self.policy.decide(req, self.now)
    }
}
