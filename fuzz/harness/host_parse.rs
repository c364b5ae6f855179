//! The one host parser and its neighbours: targets, patterns, authorities,
//! paths, address classes. Invariants: parsing is idempotent (the
//! normalised form parses to itself), names are well-formed DNS names,
//! a pattern matches what it says, and no spelling the OS would dial as
//! an IPv4 address is ever taken for a name (checked against glibc's
//! `inet_aton`, which `getaddrinfo` and so `ToSocketAddrs` use).

use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use egressd::policy::addr::{classify, classify_v4};
use egressd::policy::host::{
    parse_host, parse_ipv4_loose, parse_target, HostPattern, Target, MAX_LABEL_LEN, MAX_NAME_LEN,
};
use egressd::policy::path::normalize_path;
use egressd::proxy::dest::parse_authority;

use super::Bytes;

extern "C" {
    fn inet_aton(cp: *const libc::c_char, inp: *mut libc::in_addr) -> libc::c_int;
}

/// What the OS would dial for `s` as an IPv4 literal, if anything.
pub fn os_ipv4(s: &str) -> Option<Ipv4Addr> {
    let c = CString::new(s).ok()?;
    let mut out = libc::in_addr { s_addr: 0 };
    // SAFETY: a NUL-terminated string and a valid out pointer.
    let ok = unsafe { inet_aton(c.as_ptr(), &mut out) };
    (ok != 0).then(|| Ipv4Addr::from(u32::from_be(out.s_addr)))
}

pub fn run(data: &[u8]) {
    if data.len() > 4096 {
        return;
    }
    let s = String::from_utf8_lossy(data);
    let s = s.as_ref();
    target(s);
    pattern(s);
    authority(s);
    path(s);
    embeddings(data);
}

fn well_formed(name: &str) {
    assert!(!name.is_empty() && name.len() <= MAX_NAME_LEN, "{name:?}");
    assert!(!name.ends_with('.'), "{name:?}");
    for l in name.split('.') {
        assert!(!l.is_empty() && l.len() <= MAX_LABEL_LEN, "{name:?}");
        assert!(
            l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'),
            "{name:?}"
        );
    }
}

fn target(s: &str) {
    let parsed = parse_target(s);
    match &parsed {
        Ok(Target::Name(h)) => {
            well_formed(h.as_str());
            // Idempotent, and still a name: a normalised name never turns
            // into an address (e.g. through IDNA mapping of digits and dots).
            assert_eq!(
                parse_target(h.as_str()),
                Ok(Target::Name(h.clone())),
                "{s:?} normalised to {h}, which parses differently"
            );
            assert_eq!(parse_host(h.as_str()).as_ref(), Ok(h));
        }
        Ok(t @ Target::Ip(ip)) => {
            assert_eq!(parse_target(&t.to_string()), Ok(t.clone()), "{s:?}");
            if let IpAddr::V6(v6) = ip {
                assert!(v6.to_ipv4_mapped().is_none(), "{s:?}: mapped form kept");
            }
        }
        Err(_) => {}
    }
    // What glibc would dial as an IPv4 address is never a name to egressd,
    // and where egressd reads an address it is the same one.
    let plain = s.strip_suffix('.').unwrap_or(s);
    if !plain.is_empty()
        && plain
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b'x' || b == b'X')
    {
        if let Some(os) = os_ipv4(plain) {
            match &parsed {
                Ok(Target::Ip(IpAddr::V4(a))) => assert_eq!(*a, os, "{s:?}"),
                Ok(Target::Name(h)) => {
                    panic!("{s:?} is {os} to the OS but the name {h} to egressd")
                }
                Ok(Target::Ip(other)) => panic!("{s:?}: {other} vs {os}"),
                Err(_) => {}
            }
        }
        // egressd may read as an address what glibc would not (e.g. "0x",
        // which glibc leaves to the resolver as a name): such a target is
        // judged as that address and never resolved, which fails closed.
        // It must never read a different address than glibc does.
        if let (Some(a), Some(os)) = (parse_ipv4_loose(plain), os_ipv4(plain)) {
            assert_eq!(a, os, "{plain:?}");
        }
    }
}

fn pattern(s: &str) {
    let Ok(p) = HostPattern::parse(s) else {
        return;
    };
    let again = HostPattern::parse(&p.to_string());
    assert_eq!(again.as_ref(), Ok(&p), "{s:?} → {p}");
    let fixed = p.fixed_suffix().clone();
    well_formed(fixed.as_str());
    match &p {
        HostPattern::Exact(h) => assert!(p.matches(h)),
        HostPattern::Subdomains(sfx) => {
            assert!(!p.matches(sfx), "{p} matches its apex");
            if let Ok(below) = parse_host(&format!("x.{sfx}")) {
                assert!(p.matches(&below), "{p} misses {below}");
            }
            if let Ok(beside) = parse_host(&format!("x{sfx}")) {
                assert!(!p.matches(&beside), "{p} matches {beside}");
            }
        }
        HostPattern::LabelGlob {
            prefix,
            suffix,
            rest,
        } => {
            assert!(!p.matches(rest), "{p} matches {rest}");
            if let Ok(n) = parse_host(&format!("{prefix}{suffix}.{rest}")) {
                assert!(p.matches(&n), "{p} misses {n}");
            }
            if let Ok(n) = parse_host(&format!("{prefix}{suffix}.x.{rest}")) {
                assert!(!p.matches(&n), "{p} spans two labels: {n}");
            }
        }
    }
}

fn authority(s: &str) {
    let Ok(d) = parse_authority(s, Some(80)) else {
        return;
    };
    assert_ne!(d.port, 0, "{s:?}");
    assert!(!s.contains('@'), "{s:?}: userinfo accepted");
    let again = parse_authority(&format!("{}:{}", d.target, d.port), None);
    assert_eq!(again.as_ref(), Ok(&d), "{s:?}");
}

fn path(s: &str) {
    // Request paths reach normalize_path through http's URI parser, which
    // admits visible ASCII only (raw UTF-8 bytes there would be re-read as
    // Latin-1 chars: not a reachable input, so not checked).
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return;
    }
    let Ok(p) = normalize_path(s) else {
        return;
    };
    assert!(p.starts_with('/'), "{s:?} → {p:?}");
    assert!(!p.contains("//"), "{s:?} → {p:?}");
    assert!(!p.contains('?') && !p.contains('#'), "{s:?} → {p:?}");
    assert!(
        !p.split('/').any(|seg| seg == "." || seg == ".."),
        "{s:?} → {p:?}"
    );
    assert_eq!(normalize_path(&p).as_ref(), Ok(&p), "{s:?}: not idempotent");
}

/// An IPv6 address embedding an IPv4 one is judged as that IPv4 address.
fn embeddings(data: &[u8]) {
    let mut b = Bytes::new(data);
    let v4 = Ipv4Addr::new(b.byte(), b.byte(), b.byte(), b.byte());
    let o = v4.octets();
    let want = classify_v4(v4);
    let u = u32::from(v4);
    let forms = [
        v4.to_ipv6_mapped(),
        Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, (u >> 16) as u16, u as u16),
        Ipv6Addr::new(0x2002, (u >> 16) as u16, u as u16, 0, 0, 0, 0, 1),
        Ipv6Addr::new(
            0x2001,
            0,
            0x4136,
            0xe378,
            0x8000,
            0x63bf,
            !u16::from_be_bytes([o[0], o[1]]),
            !u16::from_be_bytes([o[2], o[3]]),
        ),
    ];
    for v6 in forms {
        assert_eq!(classify(IpAddr::V6(v6)), want, "{v6} embeds {v4}");
    }
}
