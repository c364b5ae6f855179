//! Address classes. Decides whether an IP address is publicly routable, by
//! the IANA special-purpose registries, judging IPv6 addresses that embed an
//! IPv4 address (mapped, compatible, NAT64, 6to4, Teredo) by the embedded one.
//!
//! Everything non-public is refused unless an exception lists its range in
//! `cidrs`: that is the SSRF guard (metadata endpoints, the host's own
//! services, the office network).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not public; `None` from [`classify`] means public.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonPublic {
    Unspecified,
    Loopback,
    Private,
    LinkLocal,
    Cgnat,
    Documentation,
    Benchmarking,
    Multicast,
    Reserved,
    UniqueLocal,
    /// Other IANA special-purpose ranges (192.0.0/24, 100::/64, …).
    SpecialPurpose,
}

impl NonPublic {
    pub fn as_str(self) -> &'static str {
        match self {
            NonPublic::Unspecified => "unspecified",
            NonPublic::Loopback => "loopback",
            NonPublic::Private => "private",
            NonPublic::LinkLocal => "link-local",
            NonPublic::Cgnat => "cgnat",
            NonPublic::Documentation => "documentation",
            NonPublic::Benchmarking => "benchmarking",
            NonPublic::Multicast => "multicast",
            NonPublic::Reserved => "reserved",
            NonPublic::UniqueLocal => "unique-local",
            NonPublic::SpecialPurpose => "special-purpose",
        }
    }
}

/// Classifies an address; `None` when it is globally reachable.
pub fn classify(ip: IpAddr) -> Option<NonPublic> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

pub fn is_public(ip: IpAddr) -> bool {
    classify(ip).is_none()
}

fn in4(ip: u32, net: [u8; 4], len: u32) -> bool {
    let n = u32::from_be_bytes(net);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    ip & mask == n & mask
}

pub fn classify_v4(ip: Ipv4Addr) -> Option<NonPublic> {
    let a = u32::from(ip);
    use NonPublic::*;
    let class = if a == 0 || in4(a, [0, 0, 0, 0], 8) {
        Unspecified
    } else if in4(a, [127, 0, 0, 0], 8) {
        Loopback
    } else if in4(a, [10, 0, 0, 0], 8)
        || in4(a, [172, 16, 0, 0], 12)
        || in4(a, [192, 168, 0, 0], 16)
    {
        Private
    } else if in4(a, [169, 254, 0, 0], 16) {
        LinkLocal
    } else if in4(a, [100, 64, 0, 0], 10) {
        Cgnat
    } else if in4(a, [192, 0, 2, 0], 24)
        || in4(a, [198, 51, 100, 0], 24)
        || in4(a, [203, 0, 113, 0], 24)
    {
        Documentation
    } else if in4(a, [198, 18, 0, 0], 15) {
        Benchmarking
    } else if in4(a, [224, 0, 0, 0], 4) {
        Multicast
    } else if in4(a, [240, 0, 0, 0], 4) {
        // includes 255.255.255.255
        Reserved
    } else if in4(a, [192, 0, 0, 0], 24) || in4(a, [192, 88, 99, 0], 24) {
        // IETF protocol assignments; deprecated 6to4 relay anycast
        SpecialPurpose
    } else {
        return None;
    };
    Some(class)
}

/// The IPv4 address an IPv6 address carries, for the forms that deliver to
/// that IPv4 host: IPv4-mapped, IPv4-compatible (deprecated, still routed by
/// some stacks), NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48),
/// 6to4 (2002::/16) and Teredo (2001::/32, client address obfuscated).
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    // ::a.b.c.d (IPv4-compatible), but not :: and ::1 themselves.
    if s[..6] == [0; 6] && u32::from(tail) > 1 {
        return Some(tail);
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        return Some(tail);
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        return Some(tail);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        return Some(Ipv4Addr::new(!o[12], !o[13], !o[14], !o[15]));
    }
    None
}

pub fn classify_v6(ip: Ipv6Addr) -> Option<NonPublic> {
    use NonPublic::*;
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    if let Some(v4) = embedded_v4(ip) {
        // An embedding of a public address is as public as that address; an
        // embedding of anything else is judged by what it reaches.
        return classify_v4(v4);
    }
    let s = ip.segments();
    let class = if s[0] & 0xfe00 == 0xfc00 {
        UniqueLocal
    } else if s[0] & 0xffc0 == 0xfe80 || s[0] & 0xffc0 == 0xfec0 {
        // link-local, and deprecated site-local
        LinkLocal
    } else if s[0] & 0xff00 == 0xff00 {
        Multicast
    } else if (s[0] == 0x2001 && s[1] == 0x0db8) || (s[0] == 0x3fff && s[1] & 0xf000 == 0) {
        // 2001:db8::/32 and 3fff::/20
        Documentation
    } else if s[0] == 0x0100 && s[1..4] == [0, 0, 0] {
        // discard-only 100::/64
        SpecialPurpose
    } else if s[0] == 0x2001 && s[1] < 0x0200 {
        // 2001::/23 IETF protocol assignments (benchmarking 2001:2::/48, ORCHID…)
        SpecialPurpose
    } else if s[0] & 0xe000 != 0x2000 {
        // Outside 2000::/3, nothing is globally unicast today.
        Reserved
    } else {
        return None;
    };
    Some(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Option<NonPublic> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn table() {
        use NonPublic::*;
        for (a, want) in [
            ("8.8.8.8", None),
            ("151.101.0.223", None),
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("10.1.2.3", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(Private)),
            ("169.254.169.254", Some(LinkLocal)),
            ("100.64.0.1", Some(Cgnat)),
            ("100.128.0.1", None),
            ("192.0.0.170", Some(SpecialPurpose)),
            ("192.0.2.1", Some(Documentation)),
            ("198.18.0.1", Some(Benchmarking)),
            ("198.51.100.7", Some(Documentation)),
            ("203.0.113.9", Some(Documentation)),
            ("224.0.0.1", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("255.255.255.255", Some(Reserved)),
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:169.254.169.254", Some(LinkLocal)),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some(Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(LinkLocal)),
            ("64:ff9b::808:808", None),
            ("2002:7f00:1::", Some(Loopback)),
            ("2002:a9fe:a9fe::1", Some(LinkLocal)),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", Some(Loopback)),
            ("fc00::1", Some(UniqueLocal)),
            ("fd00:ec2::254", Some(UniqueLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("ff02::1", Some(Multicast)),
            ("2001:db8::1", Some(Documentation)),
            ("100::1", Some(SpecialPurpose)),
            ("2a00:1450:4001:81d::200e", None),
            ("2606:4700::1111", None),
        ] {
            assert_eq!(c(a), want, "{a}");
        }
    }
}
