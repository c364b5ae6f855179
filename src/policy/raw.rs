//! The serde mirror of a policy file. Unknown keys are errors. Fields whose
//! syntax can be checked alone (host patterns, CIDRs, ports, dates, ids) are
//! parsed here, inside deserialisation, so that their errors carry the
//! file:line:column of the offending value.
//!
//! The same types describe the policy's JSON Schema (`egressd schema`): the
//! `JsonSchema` derives read the serde attributes, the `///` comments become
//! the schema's descriptions, and each validated scalar states its syntax as
//! a pattern. A new raw type joins the schema by deriving `JsonSchema` beside
//! `Deserialize`; the schema never decides anything the parser does not.

use std::borrow::Cow;

use ipnet::IpNet;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::field::validated;
pub use super::field::{parse_size, DateField, DurationField, IdField, RawInject, SizeField};
use super::host::HostPattern;
use super::{
    MAX_CONNECTIONS_PER_CLIENT, MAX_HEADER_TIMEOUT_SECS, MAX_LOG_LINES_PER_CLIENT_PER_SEC,
    MAX_STALL_TIMEOUT_SECS, MIN_CONNECTIONS_PER_CLIENT, MIN_HEADER_TIMEOUT_SECS,
    MIN_LOG_LINES_PER_CLIENT_PER_SEC, MIN_STALL_TIMEOUT_SECS,
};
use crate::time::parse_duration;

/// One egressd policy file. A policy is a directory of such files (or one
/// file), merged; `settings` may appear in one file only, exception ids are
/// unique across all files, and unknown keys are errors.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    /// Settings for the whole policy (in at most one file of a directory).
    pub settings: Option<RawSettings>,
    /// What is allowed out. Everything no exception allows is denied.
    #[serde(default)]
    pub exceptions: Vec<RawException>,
    /// Approved package sets (DESIGN "Packages"): with an ecosystem in
    /// `settings.packages.enforce`, only the packages they approve install.
    #[serde(default)]
    pub packages: Vec<crate::packages::raw::RawPackageSet>,
}

/// Settings for the whole policy.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    /// `enforce` denies what no exception allows; `report` logs it as the
    /// denial it would be and lets it through (for trials). Default `enforce`.
    pub mode: Option<Mode>,
    /// Loopback, private, link-local (169.254.169.254), CGNAT, ULA, multicast
    /// and other non-public destinations: `deny` (default) unless the allowing
    /// exception lists the range in `cidrs`.
    pub private_destinations: Option<PrivateDestinations>,
    /// `egressd report` calls an exception stale when nothing used it for this
    /// long (default 90d).
    pub stale_after: Option<DurationField>,
    /// Who to ask for an exception: shown in every deny message.
    pub contact: Option<String>,
    /// Named clients, so that an exception can apply to some sandboxes only.
    #[serde(default)]
    pub clients: Vec<RawClient>,
    /// The DNS resolver: deny answers, tunnel detection, cache TTL bounds.
    pub dns: Option<RawDns>,
    /// TLS checks on CONNECT tunnels.
    pub tls: Option<RawTls>,
    /// Each client's share of egressd, and how long a request head may take.
    pub limits: Option<RawLimits>,
    /// The package gate: which ecosystems' registry traffic goes through it,
    /// the default `min_age`, and mirrors.
    pub packages: Option<crate::packages::raw::RawPackageSettings>,
    /// The ceiling no grant (`egressd grant`) may pass.
    pub grants: Option<RawGrantSettings>,
}

/// `settings.grants`: the ceiling of every grant (DESIGN "Grants").
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawGrantSettings {
    /// The longest TTL a grant may have (default 24h).
    pub max_ttl: Option<DurationField>,
    /// The most uses a grant may have; when set, every grant needs a use limit.
    #[schemars(range(min = 1))]
    pub max_uses: Option<u32>,
    /// Hosts no grant may name (a name, or `*.suffix`; a name also keeps out
    /// every name below it).
    #[serde(default)]
    pub never: Vec<PatternField>,
}

/// What makes an exception a grant: only in files of the grants directory,
/// written by `egressd grant`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawGrant {
    /// The id of the denied request it was made from.
    pub from_request: String,
    /// Who ran `egressd grant`.
    pub granted_by: String,
    /// When it was made (RFC 3339); its TTL is `expires` minus this.
    pub granted_at: DateField,
    /// How many requests it allows; none: until it expires.
    #[schemars(range(min = 1))]
    pub max_uses: Option<u32>,
}

/// What a request no exception allows gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deny what no exception allows.
    #[default]
    Enforce,
    /// Allow it, and log it as the denial it would be.
    Report,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Report => "report",
        }
    }
}

/// Whether names may lead to non-public addresses without a `cidrs` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum PrivateDestinations {
    /// Non-public addresses only when the exception lists them in `cidrs`.
    #[default]
    Deny,
    /// Non-public addresses like any other (turns off the SSRF guard).
    Allow,
}

/// A named client: identified by source address, by the SHA-256 of the
/// password it sends in Proxy-Authorization, or both.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [
    {"required": ["sources"], "properties": {"sources": {"minItems": 1}}},
    {"required": ["token_sha256"]}
]))]
pub struct RawClient {
    /// The client's name in logs and in exceptions' `clients`.
    pub id: IdField,
    /// Source ranges this client connects from.
    #[serde(default)]
    pub sources: Vec<CidrField>,
    /// SHA-256 (hex) of the password the client sends in Proxy-Authorization.
    pub token_sha256: Option<Sha256Field>,
}

/// The DNS resolver's settings.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDns {
    /// The answer to a denied query (default `refused`).
    pub deny_rcode: Option<DenyRcode>,
    /// DNS tunnel detection: action and thresholds.
    pub tunnel: Option<RawTunnel>,
    /// Answers are cached at least this long.
    pub cache_min_ttl: Option<DurationField>,
    /// Answers are cached at most this long.
    pub cache_max_ttl: Option<DurationField>,
}

/// The response code of a denied DNS query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum DenyRcode {
    /// REFUSED, with Extended DNS Error 15 naming the reason.
    #[default]
    Refused,
    /// NXDOMAIN, with Extended DNS Error 15 naming the reason.
    Nxdomain,
}

/// DNS tunnel detection under allowed wildcards.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTunnel {
    /// What a suspected tunnel gets (default `block`).
    pub action: Option<TunnelAction>,
    /// Longest query name accepted under a wildcard, in bytes.
    pub max_name_len: Option<usize>,
    /// Longest label accepted under a wildcard, in bytes.
    pub max_label_len: Option<usize>,
    /// Distinct names per client and wildcard within `alert_window` that raise an alert.
    pub alert_unique_names: Option<u32>,
    /// Query-name bytes per client and wildcard within `alert_window` that raise an alert.
    pub alert_bytes: Option<u64>,
    /// The window the alert thresholds are counted over.
    pub alert_window: Option<DurationField>,
    /// Query-name bytes per client and wildcard within `block_window` past which queries are blocked.
    pub block_bytes: Option<u64>,
    /// The window the block threshold is counted over.
    pub block_window: Option<DurationField>,
    /// New-name information bytes per client and domain per day (a sliding 24 h).
    pub daily_bytes: Option<u64>,
    /// How long a blocked client and wildcard stay blocked.
    pub cooldown: Option<DurationField>,
}

/// What a suspected DNS tunnel gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum TunnelAction {
    /// Deny the queries (`dns_tunnel`).
    #[default]
    Block,
    /// Answer, and count and log the suspicion.
    Log,
    /// No tunnel detection.
    Off,
}

/// TLS checks on CONNECT tunnels.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// What to do with a CONNECT to 443 whose ClientHello has no SNI or uses ECH.
    pub missing_sni: Option<MissingSni>,
}

/// Bounds that keep one client from starving the others.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Connections one client (a named client identified by source, else a
    /// source address) may hold open at once, tunnels included; past it a
    /// new connection gets `503 overloaded` (default 1024, 1 to 16384).
    pub connections_per_client: Option<ConnectionsField>,
    /// How long a client has to send a request head, from the connection's
    /// start or the end of its previous request (default 10s, 1s to 5m).
    pub header_timeout: Option<HeaderTimeoutField>,
    /// How long a client may keep its receive window shut on an
    /// intercepted HTTP/2 stream while egressd holds data for it; past it
    /// the stream is reset, with a line (default 30s, 1s to 5m).
    pub stall_timeout: Option<StallTimeoutField>,
    /// Decision lines per second written one by one for one client, after
    /// a burst of ten seconds' worth; past it the rest of each second's
    /// decisions are summed into one `rate_limited` line (default 1000, 1
    /// to 1000000).
    pub log_lines_per_client_per_sec: Option<LogRateField>,
}

/// `limits.log_lines_per_client_per_sec`: a whole number within its range.
#[derive(Debug, Clone, Copy)]
pub struct LogRateField(pub u32);

impl<'de> Deserialize<'de> for LogRateField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = LogRateField;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number of lines per second")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<LogRateField, E> {
                let range = MIN_LOG_LINES_PER_CLIENT_PER_SEC..=MAX_LOG_LINES_PER_CLIENT_PER_SEC;
                match u32::try_from(n) {
                    Ok(n) if range.contains(&n) => Ok(LogRateField(n)),
                    _ => Err(E::custom(format!(
                        "must be {MIN_LOG_LINES_PER_CLIENT_PER_SEC} to \
                         {MAX_LOG_LINES_PER_CLIENT_PER_SEC}, not {n}"
                    ))),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<LogRateField, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "must be {MIN_LOG_LINES_PER_CLIENT_PER_SEC} to \
                         {MAX_LOG_LINES_PER_CLIENT_PER_SEC}, not {n}"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for LogRateField {
    fn schema_name() -> Cow<'static, str> {
        "LogRateField".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A number of decision lines per second.",
            "type": "integer",
            "minimum": MIN_LOG_LINES_PER_CLIENT_PER_SEC,
            "maximum": MAX_LOG_LINES_PER_CLIENT_PER_SEC
        })
    }
}

/// `limits.connections_per_client`: a whole number within its range,
/// checked here so that an error points at the value.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionsField(pub u32);

impl<'de> Deserialize<'de> for ConnectionsField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ConnectionsField;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number of connections")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<ConnectionsField, E> {
                let range = MIN_CONNECTIONS_PER_CLIENT..=MAX_CONNECTIONS_PER_CLIENT;
                match u32::try_from(n) {
                    Ok(n) if range.contains(&n) => Ok(ConnectionsField(n)),
                    _ => Err(E::custom(format!(
                        "must be {MIN_CONNECTIONS_PER_CLIENT} to {MAX_CONNECTIONS_PER_CLIENT} \
                         (the proxy's bound on all connections), not {n}"
                    ))),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<ConnectionsField, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "must be {MIN_CONNECTIONS_PER_CLIENT} to {MAX_CONNECTIONS_PER_CLIENT}, not {n}"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for ConnectionsField {
    fn schema_name() -> Cow<'static, str> {
        "ConnectionsField".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A number of connections.",
            "type": "integer",
            "minimum": MIN_CONNECTIONS_PER_CLIENT,
            "maximum": MAX_CONNECTIONS_PER_CLIENT
        })
    }
}

/// A ClientHello without a server name (or with ECH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum MissingSni {
    /// Allowed only when the CONNECT host matched an exact (non-wildcard) host.
    #[default]
    ExactOnly,
    /// Always closed (`sni_mismatch`).
    Deny,
    /// Always allowed.
    Allow,
}

/// One exception: what it allows, who answers for it and why it exists.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [
    {"required": ["hosts"], "properties": {"hosts": {"minItems": 1}}},
    {"required": ["cidrs"], "properties": {"cidrs": {"minItems": 1}}}
]))]
pub struct RawException {
    /// Unique across all files; names the exception in logs and metrics.
    pub id: IdField,
    /// The team answerable for the exception (required).
    #[schemars(required, with = "String", pattern("\\S"))]
    pub owner: Option<String>,
    /// Why the exception exists, for the next reviewer (required).
    #[schemars(required, with = "String", pattern("\\S"))]
    pub reason: Option<String>,
    /// Where the exception was approved (a ticket id or URL).
    pub ticket: Option<String>,
    /// From this date on the exception matches nothing.
    pub expires: Option<DateField>,
    /// Client id patterns (`ci-*`) the exception applies to; default every client.
    #[schemars(length(min = 1))]
    pub clients: Option<Vec<String>>,
    /// Destination names: `example.com` exactly, `*.example.com` any name
    /// below it (not the apex), `api-*.example.com` one `*` in the first label.
    #[serde(default)]
    pub hosts: Vec<PatternField>,
    /// Destination ranges: IP-literal targets inside are allowed, and names in
    /// `hosts` may resolve into them even when they are non-public.
    #[serde(default)]
    pub cidrs: Vec<CidrField>,
    /// Destination ports; default [80, 443].
    #[schemars(length(min = 1))]
    pub ports: Option<Vec<PortField>>,
    /// HTTP methods; default any (on HTTPS enforced with interception only).
    #[schemars(length(min = 1))]
    pub methods: Option<Vec<MethodField>>,
    /// Path globs (`/simple/**`); default any (on HTTPS enforced with interception only).
    #[schemars(length(min = 1), inner(pattern("^/")))]
    pub paths: Option<Vec<String>>,
    /// DNS record types answered beyond A, AAAA, CNAME, HTTPS and SVCB.
    pub dns_types: Option<Vec<QTypeField>>,
    /// Credentials added outside the sandbox (needs interception).
    pub inject: Option<RawInject>,
    /// Set by `egressd grant`: this exception is a grant (grants directory only).
    pub grant: Option<RawGrant>,
    /// Smart-HTTP git: the repositories fetched and what a push may write
    /// (needs interception). The exception then allows only those
    /// repositories' git endpoints on its hosts.
    pub git: Option<RawGit>,
    /// Upload budget: bytes a client may send through this exception per
    /// sliding window (request bodies, and what it sends into tunnels).
    pub upload: Option<RawUpload>,
    /// Request-body rules (needs interception): the body is read whole,
    /// bounded, and judged before anything is forwarded.
    pub body: Option<RawBody>,
}

/// `upload:` on an exception.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawUpload {
    /// Bytes per window, per client (`10MiB`).
    pub bytes: SizeField,
    /// The sliding window (`1h`), at most 30d.
    pub per: DurationField,
}

/// `body:` on an exception.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBody {
    /// The largest body read and judged; default 1MiB, at most 16MiB.
    pub max_bytes: Option<SizeField>,
    /// RFC 6901 pointer -> value: every pointer must exist; strings match
    /// by glob (as `paths:`), numbers, booleans and null by equality.
    #[serde(default)]
    #[schemars(schema_with = "json_rules_schema")]
    pub json: Option<std::collections::BTreeMap<String, serde_json::Value>>,
    /// The GraphQL operations allowed (the body is a GraphQL request).
    pub graphql: Option<RawGraphql>,
}

fn json_rules_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "RFC 6901 JSON pointer -> the value it must hold: a string (a glob, as paths:), a number, a boolean or null.",
        "type": "object",
        "minProperties": 1,
        "propertyNames": {"pattern": "^(/([^~]|~[01])*)*$"},
        "additionalProperties": {"type": ["string", "number", "boolean", "null"]}
    })
}

/// `body.graphql`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawGraphql {
    /// Query operations are allowed; default false.
    #[serde(default)]
    pub queries: bool,
    /// Top-level mutation fields allowed, by name (`createPullRequest`).
    #[serde(default)]
    pub mutations: Vec<String>,
}

/// `git:` on an exception.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawGit {
    /// Repositories as `owner/name` globs (`*` stops at `/`); `.git` optional.
    #[schemars(length(min = 1))]
    pub repos: Vec<String>,
    /// What a push may write; absent: fetch only.
    pub push: Option<RawPush>,
}

/// `git.push`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPush {
    /// Refs a push may create or update (`refs/heads/agent/**`); tags are refs too.
    #[schemars(length(min = 1))]
    pub refs: Vec<String>,
    /// Non-fast-forward updates; default false.
    #[serde(default)]
    pub force: bool,
    /// Ref deletions; default false.
    #[serde(default)]
    pub delete: bool,
    /// Paths (globs, `*` stops at `/`) pushed commits may not add or change.
    #[serde(default)]
    pub deny_paths: Vec<String>,
    /// The push request's size as the client sends it; default 64MiB, at most 1GiB.
    pub max_bytes: Option<SizeField>,
}

validated!(
    PatternField,
    HostPattern,
    |s| HostPattern::parse(s).map_err(|e| e.to_string()),
    host_pattern_schema
);
validated!(
    CidrField,
    IpNet,
    |s| {
        let s = s.trim();
        match s.parse::<IpNet>() {
            Ok(n) if n.network() != n.addr() => Err(format!(
                "invalid CIDR {s:?}: host bits are set (did you mean {}?)",
                n.trunc()
            )),
            Ok(n) => Ok(n),
            Err(_) => s.parse::<std::net::IpAddr>().map(IpNet::from).map_err(|_| {
                format!("invalid CIDR {s:?}: expected an address or address/prefix like 10.0.0.0/8")
            }),
        }
    },
    cidr_schema
);
validated!(
    HeaderTimeoutField,
    u64,
    |s| match parse_duration(s) {
        Some(n) if (MIN_HEADER_TIMEOUT_SECS..=MAX_HEADER_TIMEOUT_SECS).contains(&n) => Ok(n),
        Some(_) => Err(format!("{s:?} is out of range: 1s to 5m")),
        None => Err(format!(
            "invalid duration {s:?}: expected a number with s, m, h or d (10s)"
        )),
    },
    || json_schema!({
        "description": "A duration from 1s to 5m: a whole number and a unit, s or m (10s, 1m).",
        "type": "string",
        "pattern": "^\\s*0*(([1-9][0-9]?|[12][0-9]{2}|300)s|[1-5]m)\\s*$"
    })
);
validated!(
    StallTimeoutField,
    u64,
    |s| match parse_duration(s) {
        Some(n) if (MIN_STALL_TIMEOUT_SECS..=MAX_STALL_TIMEOUT_SECS).contains(&n) => Ok(n),
        Some(_) => Err(format!("{s:?} is out of range: 1s to 5m")),
        None => Err(format!(
            "invalid duration {s:?}: expected a number with s, m, h or d (30s)"
        )),
    },
    || json_schema!({
        "description": "A duration from 1s to 5m: a whole number and a unit, s or m (30s, 1m).",
        "type": "string",
        "pattern": "^\\s*0*(([1-9][0-9]?|[12][0-9]{2}|300)s|[1-5]m)\\s*$"
    })
);
validated!(
    MethodField,
    String,
    |s| {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
            Ok(s.to_ascii_uppercase())
        } else {
            Err(format!("invalid method {s:?}"))
        }
    },
    || json_schema!({
        "description": "An HTTP method (GET, POST, …), any case.",
        "type": "string",
        "pattern": "^[A-Za-z-]+$"
    })
);
validated!(
    Sha256Field,
    [u8; 32],
    |s| {
        let s = s.trim();
        let mut out = [0u8; 32];
        if s.len() != 64 {
            return Err("token_sha256 must be 64 hex digits".into());
        }
        for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
            let hex =
                std::str::from_utf8(chunk).map_err(|_| "token_sha256 must be hex".to_string())?;
            out[i] = u8::from_str_radix(hex, 16)
                .map_err(|_| "token_sha256 must be 64 hex digits".to_string())?;
        }
        Ok(out)
    },
    || json_schema!({
        "description": "SHA-256 of the client's Proxy-Authorization password: 64 hex digits.",
        "type": "string",
        "pattern": "^\\s*[0-9A-Fa-f]{64}\\s*$"
    })
);
validated!(
    QTypeField,
    u16,
    |s| super::qtype::parse_qtype(s).ok_or_else(|| format!("unknown DNS record type {s:?}")),
    qtype_schema
);

/// Ports accept numbers or numeric strings; 1..=65535.
#[derive(Debug, Clone, Copy)]
pub struct PortField(pub u16);
impl<'de> Deserialize<'de> for PortField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor (not an untagged enum, which buffers the value and loses
        // its position) so that a bad port is reported at its own line:column.
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = PortField;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a port number 1-65535")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PortField, E> {
                if (1..=65535).contains(&v) {
                    Ok(PortField(v as u16))
                } else {
                    Err(E::custom(format!("port {v} is out of range 1-65535")))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PortField, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PortField, E> {
                match s.trim().parse::<i64>() {
                    Ok(v) => self.visit_i64(v),
                    Err(_) => Err(E::custom(format!("invalid port {s:?}"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for PortField {
    fn schema_name() -> Cow<'static, str> {
        "PortField".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A port, 1-65535: a number or a numeric string.",
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 65535},
                {"type": "string", "pattern": format!("^\\s*\\+?0*{U16_NONZERO}\\s*$")}
            ]
        })
    }
}

// The patterns below restate the parsers above for editors and CI
// validators (ECMA 262 syntax, as JSON Schema uses). Where a parser checks
// what no pattern can (a day past the month's end, host bits in a CIDR, an
// IDN that does not convert), the schema accepts and `egressd check` still
// refuses: the schema may be looser than the parser, never stricter.

/// 1..=65535 in decimal, without a sign or leading zeros.
const U16_NONZERO: &str =
    "(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
/// One character of a host label: what `parse_host` keeps in ASCII, and any
/// non-ASCII character (converted to an A-label at load).
const LABEL_CHAR: &str = "[-0-9A-Za-z_\\u0080-\\uFFFF]";

fn host_pattern_schema() -> Schema {
    let l = LABEL_CHAR;
    let label = format!("{l}{{1,63}}");
    json_schema!({
        "description": "A host: example.com exactly; *.example.com any name below it (not \
            the apex); api-*.example.com one '*' in the first label, with a fixed suffix of at \
            least two labels. Case and one trailing dot do not matter; IP addresses belong in \
            cidrs.",
        "type": "string",
        "maxLength": 260,
        "pattern": format!(
            "^\\s*(?:{label}(?:\\.{label})*|{l}*\\*{l}*(?:\\.{label}){{2,}})\\.?\\s*$"
        ),
        "not": {"pattern": "(?:^|\\.)\\s*(?:[0-9]+|0[xX][0-9A-Fa-f]*)\\.?\\s*$"}
    })
}

fn cidr_schema() -> Schema {
    let octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let v4 = format!("{octet}(?:\\.{octet}){{3}}(?:/(?:3[0-2]|[12]?[0-9]))?");
    let v6 = "[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?";
    json_schema!({
        "description": "A destination range, address/prefix (10.0.0.0/8, fd00::/8), or one \
            address. Host bits must be zero.",
        "type": "string",
        "pattern": format!("^\\s*(?:{v4}|{v6})\\s*$")
    })
}

/// The record types `parse_qtype` knows by name, and `TYPEnnn`, in any
/// case; minus those no exception may list.
fn qtype_schema() -> Schema {
    use super::qtype::{qtype_mnemonic, NEVER_ALLOWED};
    let any_case = |name: &str| -> String {
        name.chars()
            .map(|c| match c {
                c if c.is_ascii_alphabetic() => {
                    format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase())
                }
                c => c.to_string(),
            })
            .collect()
    };
    let named: Vec<String> = (0..=u16::MAX)
        .filter_map(|v| match qtype_mnemonic(v) {
            Cow::Borrowed(n) if !NEVER_ALLOWED.contains(&v) => Some(any_case(n)),
            _ => None,
        })
        .collect();
    let never: Vec<String> = NEVER_ALLOWED
        .iter()
        .map(|v| any_case(&qtype_mnemonic(*v)))
        .chain([format!(
            "{}\\+?0*(?:{})",
            any_case("TYPE"),
            NEVER_ALLOWED
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("|")
        )])
        .collect();
    json_schema!({
        "description": "A DNS record type by name (TXT, MX, SRV, …) or as TYPEnnn. NULL, ANY \
            and zone transfers (AXFR, IXFR) are never answered.",
        "type": "string",
        "pattern": format!(
            "^\\s*(?:{}|{}\\+?0*(?:0|{U16_NONZERO}))\\s*$",
            named.join("|"),
            any_case("TYPE")
        ),
        "not": {"pattern": format!("^\\s*(?:{})\\s*$", never.join("|"))}
    })
}
