//! The one host parser. Every host name and host pattern that enters egressd
//! (policy files, request targets, CONNECT authorities, DNS question names,
//! TLS SNI) becomes a [`Host`] or [`HostPattern`] here, normalised the same
//! way: lower-case, no trailing dot, IDNs as A-labels, IP literals in every
//! spelling an OS accepts turned into the address that would be dialled.
//!
//! It does not decide anything; it only refuses what is not a host.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest DNS name we accept (RFC 1035, without the trailing dot).
pub const MAX_NAME_LEN: usize = 253;
/// Longest DNS label (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// A normalised DNS host name: lower-case ASCII, A-labels, no trailing dot,
/// every label 1..=63 bytes of `[a-z0-9_-]`, at most 253 bytes in all.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Host(Box<str>);

impl Host {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Labels from left to right.
    pub fn labels(&self) -> impl DoubleEndedIterator<Item = &str> {
        self.0.split('.')
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl fmt::Debug for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Host({})", self.0)
    }
}

/// What a request names as its destination: a DNS name or an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Name(Host),
    Ip(IpAddr),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Name(h) => f.write_str(h.as_str()),
            Target::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Target::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host is longer than {MAX_NAME_LEN} bytes")]
    TooLong,
    #[error("empty label in host")]
    EmptyLabel,
    #[error("label longer than {MAX_LABEL_LEN} bytes")]
    LabelTooLong,
    #[error("character {0:?} is not allowed in a host name")]
    BadChar(char),
    #[error("host is not a valid internationalised name")]
    BadIdn,
    #[error("malformed IP address literal")]
    BadIp,
    #[error("{0}")]
    BadPattern(String),
}

/// Parses a host as it appears in a request target, `Host` header, CONNECT
/// authority or SNI (without port, IPv6 already stripped of brackets by the
/// caller or given with them). IP literals are recognised in every spelling
/// `inet_aton` accepts (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`).
pub fn parse_target(input: &str) -> Result<Target, HostError> {
    if input.is_empty() {
        return Err(HostError::Empty);
    }
    if let Some(inner) = input.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(HostError::BadIp)?;
        return parse_ipv6_literal(inner).map(Target::Ip);
    }
    if input.contains(':') {
        return parse_ipv6_literal(input).map(Target::Ip);
    }
    let trimmed = input.strip_suffix('.').unwrap_or(input);
    if let Some(v4) = parse_ipv4_loose(trimmed) {
        return Ok(Target::Ip(IpAddr::V4(v4)));
    }
    // Something that looks numeric but is not a valid address (e.g. 1.2.3.256,
    // 0x1g) must not fall through to name resolution: a resolver or OS might
    // still interpret it. Refuse it outright.
    if looks_numeric(trimmed) {
        return Err(HostError::BadIp);
    }
    parse_host(input).map(Target::Name)
}

/// Parses a DNS host name (not an IP literal): lower-cases, strips one
/// trailing dot, converts Unicode to A-labels, and checks syntax and lengths.
pub fn parse_host(input: &str) -> Result<Host, HostError> {
    let s = input.strip_suffix('.').unwrap_or(input);
    if s.is_empty() {
        return Err(HostError::Empty);
    }
    let ascii: String = if s.is_ascii() {
        s.to_ascii_lowercase()
    } else {
        // UTS-46 processing maps Unicode dots (U+3002 etc.) to '.', folds case
        // and produces A-labels: the form DNS actually carries.
        idna::domain_to_ascii_strict(s).map_err(|_| HostError::BadIdn)?
    };
    check_name(&ascii)?;
    // A name never looks like an address: "１２７.０.０.１" maps to
    // "127.0.0.1", which every other parser reads as an IP literal.
    if looks_numeric(&ascii) {
        return Err(HostError::BadIp);
    }
    Ok(Host(ascii.into_boxed_str()))
}

/// Checks hostname syntax on an already lower-cased ASCII name: in one
/// pass over its bytes (it runs for every DNS query), each label judged
/// when it ends, as empty, too long, then by its first bad character.
fn check_name(s: &str) -> Result<(), HostError> {
    if s.is_empty() {
        return Err(HostError::Empty);
    }
    if s.len() > MAX_NAME_LEN {
        return Err(HostError::TooLong);
    }
    let (mut len, mut bad) = (0usize, None);
    for b in s.bytes().chain(std::iter::once(b'.')) {
        if b != b'.' {
            len += 1;
            if bad.is_none()
                && !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            {
                bad = Some(b);
            }
            continue;
        }
        if len == 0 {
            return Err(HostError::EmptyLabel);
        }
        if len > MAX_LABEL_LEN {
            return Err(HostError::LabelTooLong);
        }
        if let Some(b) = bad {
            // The callers give ASCII: a byte is its character.
            return Err(HostError::BadChar(char::from(b)));
        }
        len = 0;
    }
    Ok(())
}

fn looks_numeric(s: &str) -> bool {
    // The last label decides: a name whose last label is all digits, or a hex
    // literal, is not a valid DNS name under any TLD and is an address attempt.
    let last = s.rfind('.').map_or(s, |dot| &s[dot + 1..]);
    !last.is_empty()
        && (last.bytes().all(|b| b.is_ascii_digit())
            || ((last.starts_with("0x") || last.starts_with("0X"))
                && last[2..].bytes().all(|b| b.is_ascii_hexdigit())))
}

/// `inet_aton` semantics: 1 to 4 parts, each decimal, octal (leading 0) or hex
/// (0x), the last part filling the remaining bytes.
pub fn parse_ipv4_loose(s: &str) -> Option<Ipv4Addr> {
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    // No allocation: this runs for every request's host and every name
    // in a policy.
    let mut nums = [0u64; 4];
    let mut n = 0;
    for p in s.split('.') {
        if n == 4 {
            return None;
        }
        nums[n] = parse_num_part(p)?;
        n += 1;
    }
    for v in &nums[..n - 1] {
        if *v > 255 {
            return None;
        }
    }
    let last_max: u64 = match n {
        1 => u32::MAX as u64,
        2 => 0xFF_FFFF,
        3 => 0xFFFF,
        _ => 0xFF,
    };
    if nums[n - 1] > last_max {
        return None;
    }
    let mut value: u32 = 0;
    for (i, v) in nums[..n - 1].iter().enumerate() {
        value |= (*v as u32) << (24 - 8 * i);
    }
    value |= nums[n - 1] as u32;
    Some(Ipv4Addr::from(value))
}

fn parse_num_part(p: &str) -> Option<u64> {
    if p.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        (h, 16)
    } else if p.len() > 1 && p.starts_with('0') {
        (&p[1..], 8)
    } else {
        (p, 10)
    };
    if digits.is_empty() {
        // "0x" alone is 0 for inet_aton.
        return if radix == 16 { Some(0) } else { None };
    }
    if digits.len() > 12 {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// IPv6 literal, possibly with a zone id (`fe80::1%eth0`, `%25` in URLs):
/// the zone is dropped, the address is what matters for classification.
fn parse_ipv6_literal(s: &str) -> Result<IpAddr, HostError> {
    let addr_part = match s.find('%') {
        Some(i) => &s[..i],
        None => s,
    };
    let v6 = addr_part
        .parse::<Ipv6Addr>()
        .map_err(|_| HostError::BadIp)?;
    // An IPv4-mapped address is dialled as the IPv4 address it maps.
    Ok(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}

/// A host pattern from a policy: exact, `*.suffix` (any depth, not the apex),
/// or one `*` inside the first label (`api-*.example.com`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HostPattern {
    Exact(Host),
    /// Any name strictly below the suffix.
    Subdomains(Host),
    /// First label `prefix*suffix`, rest exactly `rest`.
    LabelGlob {
        prefix: Box<str>,
        suffix: Box<str>,
        rest: Host,
    },
}

impl HostPattern {
    pub fn parse(input: &str) -> Result<HostPattern, HostError> {
        const ACCEPTED: &str =
            "accepted forms: example.com, *.example.com (any subdomain), api-*.example.com (one * in the first label)";
        let bad = |why: &str| {
            HostError::BadPattern(format!("invalid host pattern {input:?}: {why}; {ACCEPTED}"))
        };
        let s = input.trim();
        let s = s.strip_suffix('.').unwrap_or(s);
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if !s.contains('*') {
            return match parse_target(s) {
                Ok(Target::Name(h)) => Ok(HostPattern::Exact(h)),
                Ok(Target::Ip(_)) => Err(bad("IP addresses belong in cidrs:, not hosts:")),
                Err(e) => Err(bad(&e.to_string())),
            };
        }
        let (first, rest) = match s.split_once('.') {
            Some(x) => x,
            None => {
                return Err(bad(
                    "a wildcard needs a fixed suffix of at least two labels",
                ))
            }
        };
        if rest.contains('*') {
            return Err(bad("'*' is only allowed in the first label"));
        }
        let rest_host = parse_host(rest).map_err(|e| bad(&e.to_string()))?;
        if !rest_host.as_str().contains('.') {
            return Err(bad(
                "a wildcard needs a fixed suffix of at least two labels",
            ));
        }
        if first == "*" {
            return Ok(HostPattern::Subdomains(rest_host));
        }
        if first.matches('*').count() > 1 {
            return Err(bad("only one '*' per pattern"));
        }
        let (p, sfx) = first.split_once('*').expect("contains *");
        let p = p.to_ascii_lowercase();
        let sfx = sfx.to_ascii_lowercase();
        for c in p.chars().chain(sfx.chars()) {
            if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_') {
                return Err(bad(&format!(
                    "character {c:?} is not allowed in a host name"
                )));
            }
        }
        Ok(HostPattern::LabelGlob {
            prefix: p.into(),
            suffix: sfx.into(),
            rest: rest_host,
        })
    }

    pub fn matches(&self, host: &Host) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Subdomains(sfx) => is_strict_subdomain(host.as_str(), sfx.as_str()),
            HostPattern::LabelGlob {
                prefix,
                suffix,
                rest,
            } => match host.as_str().split_once('.') {
                Some((first, r)) => r == rest.as_str() && label_glob_matches(prefix, suffix, first),
                None => false,
            },
        }
    }

    /// The fixed part of the pattern: the whole name, or what follows the wildcard.
    pub fn fixed_suffix(&self) -> &Host {
        match self {
            HostPattern::Exact(h) | HostPattern::Subdomains(h) => h,
            HostPattern::LabelGlob { rest, .. } => rest,
        }
    }

    pub fn is_wildcard(&self) -> bool {
        !matches!(self, HostPattern::Exact(_))
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(h) => write!(f, "{h}"),
            HostPattern::Subdomains(h) => write!(f, "*.{h}"),
            HostPattern::LabelGlob {
                prefix,
                suffix,
                rest,
            } => write!(f, "{prefix}*{suffix}.{rest}"),
        }
    }
}

pub(crate) fn label_glob_matches(prefix: &str, suffix: &str, label: &str) -> bool {
    label.len() >= prefix.len() + suffix.len()
        && label.starts_with(prefix)
        && label.ends_with(suffix)
}

/// `name` is below `suffix` on a label boundary, and not equal to it.
pub fn is_strict_subdomain(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Target {
        Target::Ip(s.parse().unwrap())
    }

    /// The one-pass `check_name` gives the same verdict, and the same
    /// error, as checking label by label: a reference written the plain
    /// way, over names built from the characters that matter (dots, bad
    /// characters, labels around the 63-byte limit, names around 253).
    #[test]
    fn check_name_agrees_with_a_label_by_label_check() {
        fn reference(s: &str) -> Result<(), HostError> {
            if s.is_empty() {
                return Err(HostError::Empty);
            }
            if s.len() > MAX_NAME_LEN {
                return Err(HostError::TooLong);
            }
            for label in s.split('.') {
                if label.is_empty() {
                    return Err(HostError::EmptyLabel);
                }
                if label.len() > MAX_LABEL_LEN {
                    return Err(HostError::LabelTooLong);
                }
                if let Some(c) = label.chars().find(|c| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '_')
                }) {
                    return Err(HostError::BadChar(c));
                }
            }
            Ok(())
        }
        let alphabet = b"ab9-_.$A ";
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut ok, mut errors) = (0, std::collections::HashSet::new());
        for _ in 0..50_000 {
            let len = (next() % 300) as usize;
            // Mostly letters, so long labels and long names occur.
            let name: String = (0..len)
                .map(|_| {
                    let r = next();
                    if r % 16 == 0 {
                        alphabet[(r / 16 % alphabet.len() as u64) as usize] as char
                    } else {
                        'a'
                    }
                })
                .collect();
            let want = reference(&name);
            assert_eq!(check_name(&name), want, "{name:?}");
            match want {
                Ok(()) => ok += 1,
                Err(e) => {
                    errors.insert(std::mem::discriminant(&e));
                }
            }
        }
        // The corpus reached every verdict.
        assert!(ok > 100, "only {ok} valid names");
        assert_eq!(errors.len(), 5, "not every error was reached");
    }

    #[test]
    fn ip_literals_in_every_spelling() {
        for (input, want) in [
            ("127.0.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("127.0.1", "127.0.0.1"),
            ("0", "0.0.0.0"),
            ("169.254.43518", "169.254.169.254"),
            ("0xa9fea9fe", "169.254.169.254"),
            ("127.0.0.1.", "127.0.0.1"),
            ("[::1]", "::1"),
            ("[::ffff:127.0.0.1]", "127.0.0.1"),
            ("[fe80::1%25eth0]", "fe80::1"),
        ] {
            assert_eq!(parse_target(input).unwrap(), ip(want), "{input}");
        }
    }

    #[test]
    fn numeric_non_addresses_are_refused() {
        for input in [
            "1.2.3.256",
            "4294967296",
            "1.2.3.4.5",
            "08.0.0.1",
            "[::1",
            "[zz]",
        ] {
            assert!(parse_target(input).is_err(), "{input}");
        }
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(parse_host("PyPI.Org.").unwrap().as_str(), "pypi.org");
        assert_eq!(
            parse_host("bücher.example").unwrap().as_str(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            parse_host("example\u{3002}com").unwrap().as_str(),
            "example.com"
        );
        for bad in [
            "",
            ".",
            "a..b",
            "a b",
            "a\0b",
            "a%2eb",
            "x.",
            &"a".repeat(64),
        ] {
            if bad == "x." {
                continue;
            }
            assert!(parse_host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn patterns() {
        let p = HostPattern::parse("*.Example.com.").unwrap();
        let h = |s| parse_host(s).unwrap();
        assert!(p.matches(&h("a.example.com")));
        assert!(p.matches(&h("a.b.example.com")));
        assert!(!p.matches(&h("example.com")));
        assert!(!p.matches(&h("evilexample.com")));
        assert!(!p.matches(&h("example.com.evil.test")));
        let g = HostPattern::parse("api-*.example.com").unwrap();
        assert!(g.matches(&h("api-eu.example.com")));
        assert!(g.matches(&h("api-.example.com")));
        assert!(!g.matches(&h("api-eu.x.example.com")));
        assert!(!g.matches(&h("web.example.com")));
        for bad in [
            "*",
            "*.",
            "*.com",
            "a*b*.x.com",
            "*.*.x",
            "a.*.x",
            "a..b",
            "1.2.3.4",
            "*x*.a.b",
            "",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
    }
}
