//! The serde mirror of a policy file. Unknown keys are errors. Fields whose
//! syntax can be checked alone (host patterns, CIDRs, ports, dates, ids) are
//! parsed here, inside deserialisation, so that their errors carry the
//! file:line:column of the offending value.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::host::HostPattern;
use crate::time::{parse_date, parse_duration};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    pub settings: Option<RawSettings>,
    #[serde(default)]
    pub exceptions: Vec<RawException>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    pub mode: Option<Mode>,
    pub private_destinations: Option<PrivateDestinations>,
    pub stale_after: Option<DurationField>,
    pub contact: Option<String>,
    #[serde(default)]
    pub clients: Vec<RawClient>,
    pub dns: Option<RawDns>,
    pub tls: Option<RawTls>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PrivateDestinations {
    #[default]
    Deny,
    Allow,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClient {
    pub id: IdField,
    #[serde(default)]
    pub sources: Vec<CidrField>,
    pub token_sha256: Option<Sha256Field>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDns {
    pub deny_rcode: Option<DenyRcode>,
    pub tunnel: Option<RawTunnel>,
    pub cache_min_ttl: Option<DurationField>,
    pub cache_max_ttl: Option<DurationField>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DenyRcode {
    #[default]
    Refused,
    Nxdomain,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTunnel {
    pub action: Option<TunnelAction>,
    pub max_name_len: Option<usize>,
    pub max_label_len: Option<usize>,
    pub alert_unique_names: Option<u32>,
    pub alert_bytes: Option<u64>,
    pub alert_window: Option<DurationField>,
    pub block_bytes: Option<u64>,
    pub block_window: Option<DurationField>,
    pub daily_bytes: Option<u64>,
    pub cooldown: Option<DurationField>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TunnelAction {
    #[default]
    Block,
    Log,
    Off,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// What to do with a CONNECT to 443 whose ClientHello has no SNI or uses ECH.
    pub missing_sni: Option<MissingSni>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MissingSni {
    /// Allowed only when the CONNECT host matched an exact (non-wildcard) host.
    #[default]
    ExactOnly,
    Deny,
    Allow,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawException {
    pub id: IdField,
    pub owner: Option<String>,
    pub reason: Option<String>,
    pub ticket: Option<String>,
    pub expires: Option<DateField>,
    pub clients: Option<Vec<String>>,
    #[serde(default)]
    pub hosts: Vec<PatternField>,
    #[serde(default)]
    pub cidrs: Vec<CidrField>,
    pub ports: Option<Vec<PortField>>,
    pub methods: Option<Vec<MethodField>>,
    pub paths: Option<Vec<String>>,
    pub dns_types: Option<Vec<QTypeField>>,
    pub inject: Option<RawInject>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInject {
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

macro_rules! validated {
    ($name:ident, $inner:ty, $parse:expr) => {
        #[derive(Debug, Clone)]
        pub struct $name(pub $inner);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Validate inside the visitor: an error raised there is
                // located at this scalar, one raised after `String::deserialize`
                // returns only at the enclosing list or mapping.
                struct V;
                impl<'de> de::Visitor<'de> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<$name, E> {
                        let f: fn(&str) -> Result<$inner, String> = $parse;
                        f(s).map($name).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

validated!(IdField, String, |s| {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    {
        Ok(s.to_string())
    } else {
        Err(format!("invalid id {s:?}: use [a-z0-9._-]+"))
    }
});
validated!(PatternField, HostPattern, |s| HostPattern::parse(s)
    .map_err(|e| e.to_string()));
validated!(CidrField, IpNet, |s| {
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
});
validated!(DateField, i64, |s| parse_date(s).ok_or_else(|| format!(
    "invalid date {s:?}: expected YYYY-MM-DD or RFC 3339 (2027-03-01T12:00:00Z)"
)));
validated!(DurationField, u64, |s| parse_duration(s).ok_or_else(
    || format!("invalid duration {s:?}: expected a number with s, m, h or d (90d)")
));
validated!(MethodField, String, |s| {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
        Ok(s.to_ascii_uppercase())
    } else {
        Err(format!("invalid method {s:?}"))
    }
});
validated!(Sha256Field, [u8; 32], |s| {
    let s = s.trim();
    let mut out = [0u8; 32];
    if s.len() != 64 {
        return Err("token_sha256 must be 64 hex digits".into());
    }
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let hex = std::str::from_utf8(chunk).map_err(|_| "token_sha256 must be hex".to_string())?;
        out[i] = u8::from_str_radix(hex, 16)
            .map_err(|_| "token_sha256 must be 64 hex digits".to_string())?;
    }
    Ok(out)
});
validated!(QTypeField, u16, |s| super::qtype::parse_qtype(s)
    .ok_or_else(|| format!("unknown DNS record type {s:?}")));

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
