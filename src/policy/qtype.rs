//! DNS record types by mnemonic, kept apart from hickory so the policy can
//! name them without importing a DNS library.

const TYPES: &[(&str, u16)] = &[
    ("A", 1),
    ("NS", 2),
    ("CNAME", 5),
    ("SOA", 6),
    ("NULL", 10),
    ("PTR", 12),
    ("HINFO", 13),
    ("MX", 15),
    ("TXT", 16),
    ("AAAA", 28),
    ("LOC", 29),
    ("SRV", 33),
    ("NAPTR", 35),
    ("DS", 43),
    ("SSHFP", 44),
    ("RRSIG", 46),
    ("NSEC", 47),
    ("DNSKEY", 48),
    ("TLSA", 52),
    ("SVCB", 64),
    ("HTTPS", 65),
    ("SPF", 99),
    ("IXFR", 251),
    ("AXFR", 252),
    ("ANY", 255),
    ("URI", 256),
    ("CAA", 257),
];

pub const A: u16 = 1;
pub const AAAA: u16 = 28;

/// Types answered for any name an exception allows.
pub const DEFAULT_ALLOWED: &[u16] = &[1, 5, 28, 64, 65];
/// Types no exception can allow: zone transfers, ANY and NULL (a classic
/// tunnel carrier with no legitimate use by clients).
pub const NEVER_ALLOWED: &[u16] = &[10, 251, 252, 255];

pub fn parse_qtype(s: &str) -> Option<u16> {
    let up = s.trim().to_ascii_uppercase();
    if let Some((_, v)) = TYPES.iter().find(|(n, _)| *n == up) {
        return Some(*v);
    }
    up.strip_prefix("TYPE").and_then(|n| n.parse().ok())
}

pub fn qtype_name(v: u16) -> String {
    qtype_mnemonic(v).into_owned()
}

/// [`qtype_name`] without an allocation for the types that have a name.
pub fn qtype_mnemonic(v: u16) -> std::borrow::Cow<'static, str> {
    match TYPES.iter().find(|(_, t)| *t == v) {
        Some((n, _)) => std::borrow::Cow::Borrowed(n),
        None => std::borrow::Cow::Owned(format!("TYPE{v}")),
    }
}
