//! The proxy's edge parser for `host:port`: a request target's authority,
//! a CONNECT target, a `Host` header or an `:authority` becomes a [`Dest`]
//! (a normalised [`Target`] and a port) here, and nowhere else. `explain`
//! reads its TARGETs through the same function, so that what it says is
//! what the proxy would do.
//!
//! Owns the spelling rules of an authority (ports, brackets, userinfo) and
//! the check that `Host` agrees with the target. Does not own host names
//! themselves (`policy::host`, the one host parser).

use http::header::{self, HeaderMap, HeaderValue};

use crate::policy::host::{parse_target, HostError, Target};
use crate::policy::Reason;

/// A request target's destination, parsed at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dest {
    pub target: Target,
    pub port: u16,
}

/// Why an authority was refused. The texts are the deny notes' and
/// `explain`'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    #[error("userinfo in the request target is not allowed")]
    Userinfo,
    #[error("unterminated IPv6 literal")]
    UnterminatedIpv6,
    #[error("junk after IPv6 literal")]
    JunkAfterIpv6,
    /// `2001:db8::1:443`: which colon starts the port is a guess.
    #[error("an IPv6 address needs brackets ([2001:db8::1]:443)")]
    UnbracketedIpv6,
    #[error("a port is required")]
    PortRequired,
    #[error("invalid port {0:?}")]
    InvalidPort(String),
    #[error("port {0} is out of range")]
    PortOutOfRange(String),
    #[error("invalid host {host:?}: {error}")]
    Host { host: String, error: HostError },
}

/// Parses an authority (`host`, `host:port`, `[v6]:port`). Empty ports,
/// ports with leading zeros or signs, unbracketed IPv6 addresses and
/// userinfo are refused: spellings that parsers disagree on are attacks,
/// not typos.
pub fn parse_authority(auth: &str, default_port: Option<u16>) -> Result<Dest, AuthorityError> {
    if auth.contains('@') {
        return Err(AuthorityError::Userinfo);
    }
    let (host, port) = if let Some(rest) = auth.strip_prefix('[') {
        let end = rest.find(']').ok_or(AuthorityError::UnterminatedIpv6)?;
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(AuthorityError::JunkAfterIpv6),
        };
        (&auth[..end + 2], port)
    } else {
        match auth.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => return Err(AuthorityError::UnbracketedIpv6),
            Some((h, p)) => (h, Some(p)),
            None => (auth, None),
        }
    };
    let port = match port {
        None => default_port.ok_or(AuthorityError::PortRequired)?,
        Some(p) => parse_port(p)?,
    };
    let target = parse_target(host).map_err(|error| AuthorityError::Host {
        host: host.to_string(),
        error,
    })?;
    Ok(Dest { target, port })
}

/// Decimal digits, no sign, no leading zero, 1..=65535.
fn parse_port(p: &str) -> Result<u16, AuthorityError> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || (p.len() > 1 && p.starts_with('0'))
    {
        return Err(AuthorityError::InvalidPort(p.to_string()));
    }
    match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(AuthorityError::PortOutOfRange(p.to_string())),
    }
}

/// At most one `Host` header, one authority (not a list, which servers
/// read differently), and it names `dest` (a missing port means `dest`'s).
/// Err: the reason and detail to deny with.
pub(crate) fn check_host_headers(
    headers: &HeaderMap,
    dest: &Dest,
) -> Result<(), (Reason, Option<String>)> {
    check_host_headers_spelled(headers, dest, None)
}

/// [`check_host_headers`] for a `dest` parsed from `spelled` (with `dest`'s
/// port as the default): a `Host` spelled the same, byte for byte, names
/// it without being parsed again (the usual request, where the client
/// wrote the same authority twice).
pub(crate) fn check_host_headers_spelled(
    headers: &HeaderMap,
    dest: &Dest,
    spelled: Option<&str>,
) -> Result<(), (Reason, Option<String>)> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let (first, second): (Option<&HeaderValue>, _) = (hosts.next(), hosts.next());
    if second.is_some() {
        return Err((Reason::Malformed, Some("more than one Host header".into())));
    }
    if let Some(h) = first {
        if h.as_bytes().contains(&b',') {
            return Err((Reason::Malformed, Some("a list in the Host header".into())));
        }
        if spelled.is_some_and(|s| s.as_bytes() == h.as_bytes()) {
            return Ok(());
        }
        let agrees = h
            .to_str()
            .ok()
            .and_then(|h| parse_authority(h, Some(dest.port)).ok())
            .is_some_and(|hd| hd == *dest);
        if !agrees {
            return Err((Reason::HostMismatch, None));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        let d = parse_authority("Example.COM.", Some(80)).unwrap();
        assert_eq!(d.target.to_string(), "example.com");
        assert_eq!(d.port, 80);
        assert_eq!(parse_authority("[::1]:8080", None).unwrap().port, 8080);
        assert_eq!(
            parse_authority("0x7f.1:81", None)
                .unwrap()
                .target
                .to_string(),
            "127.0.0.1"
        );
        for bad in [
            "a.test:",
            "a.test:0080",
            "a.test:65616",
            "a.test:0",
            "u@a.test",
            "a.test:+80",
            "[::1",
            "[::1]x",
            "a.test: 80",
        ] {
            assert!(parse_authority(bad, Some(80)).is_err(), "{bad}");
        }
        assert!(parse_authority("a.test", None).is_err());
    }

    #[test]
    fn an_unbracketed_ipv6_address_is_refused_not_guessed() {
        // `::1` once read as [::]:1, `2001:db8::1:443` as [2001:db8::1]:443.
        for bad in ["::1", "2001:db8::1:443", "::ffff:127.0.0.1:80"] {
            assert_eq!(
                parse_authority(bad, Some(80)),
                Err(AuthorityError::UnbracketedIpv6),
                "{bad}"
            );
        }
        assert_eq!(
            parse_authority("[2001:db8::1]:443", None).unwrap().port,
            443
        );
    }
}
