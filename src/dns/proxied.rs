//! DNS behind a balancer (`serve --dns-proxy-protocol CIDR,…`): from the
//! listed sources — dnsdist with `useProxyProtocol=true`, say — every UDP
//! datagram and every TCP connection begins with a PROXY protocol v2 header
//! naming the client, and the client it names is the one identified,
//! budgeted and logged; the answer goes back to the balancer. From those
//! sources a header is required (a query without one is refused, logged
//! `malformed`: attributed to the balancer, one client's budget would be
//! every client's). From any other source no header is read, so a client
//! cannot claim another's address by sending one.
//!
//! Owns the trusted sources and reading the header. Does not own what is
//! done with the client (`answer`) or the loops (`server`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// The header's fixed start.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Signature, version and command, family and transport, length.
const FIXED: usize = 16;

/// The sources whose queries carry a PROXY protocol v2 header.
#[derive(Debug, Clone, Default)]
pub struct ProxySources(Vec<IpNet>);

impl ProxySources {
    pub fn new(nets: Vec<IpNet>) -> ProxySources {
        ProxySources(nets)
    }

    /// Whether queries from `src` must carry a header.
    pub fn trusts(&self, src: IpAddr) -> bool {
        let ip = src.to_canonical();
        self.0.iter().any(|n| n.contains(&ip))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// `PROXY`: the client's address and port.
    Proxy(SocketAddr),
    /// `LOCAL`: the balancer speaking for itself (a health check).
    Local,
}

/// Reads the header at the start of `b`: what it says and its length, or
/// why it is not one. `Err(None)` when `b` is a valid start but too short
/// (a stream that has more to send).
pub fn parse(b: &[u8]) -> Result<(Header, usize), Option<&'static str>> {
    if b.len() < FIXED {
        return if SIGNATURE.starts_with(&b[..b.len().min(12)]) {
            Err(None)
        } else {
            Err(Some("no PROXY protocol v2 signature"))
        };
    }
    if b[..12] != SIGNATURE {
        return Err(Some("no PROXY protocol v2 signature"));
    }
    let (version, command) = (b[12] >> 4, b[12] & 0x0f);
    if version != 2 {
        return Err(Some("not PROXY protocol version 2"));
    }
    let len = FIXED + usize::from(u16::from_be_bytes([b[14], b[15]]));
    if b.len() < len {
        return Err(None);
    }
    let body = &b[FIXED..len];
    match command {
        0 => return Ok((Header::Local, len)),
        1 => {}
        _ => return Err(Some("an unknown PROXY protocol command")),
    }
    let client = match b[13] >> 4 {
        1 if body.len() >= 12 => {
            let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
            SocketAddr::new(ip.into(), u16::from_be_bytes([body[8], body[9]]))
        }
        2 if body.len() >= 36 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&body[..16]);
            SocketAddr::new(
                Ipv6Addr::from(a).into(),
                u16::from_be_bytes([body[32], body[33]]),
            )
        }
        1 | 2 => return Err(Some("a PROXY protocol address block cut short")),
        _ => return Err(Some("a PROXY protocol header with no IP client")),
    };
    Ok((Header::Proxy(client), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(client: [u8; 4], port: u16) -> Vec<u8> {
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&[0x21, 0x12, 0, 12]);
        h.extend_from_slice(&client);
        h.extend_from_slice(&[10, 0, 0, 1]);
        h.extend_from_slice(&port.to_be_bytes());
        h.extend_from_slice(&53u16.to_be_bytes());
        h
    }

    #[test]
    fn reads_the_client_of_a_v4_and_a_v6_header_and_skips_tlvs() {
        let mut b = v4([10, 1, 2, 3], 5353);
        let n = b.len();
        b.extend_from_slice(b"dns query");
        assert_eq!(
            parse(&b),
            Ok((Header::Proxy("10.1.2.3:5353".parse().unwrap()), n))
        );
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&[0x21, 0x22, 0, 36 + 4]);
        h.extend_from_slice(&"fd00::7".parse::<Ipv6Addr>().unwrap().octets());
        h.extend_from_slice(&[0u8; 16]);
        h.extend_from_slice(&[0x13, 0x88, 0, 53]);
        h.extend_from_slice(&[0x04, 0, 1, 0]); // a TLV
        assert_eq!(
            parse(&h),
            Ok((Header::Proxy("[fd00::7]:5000".parse().unwrap()), h.len()))
        );
        let mut local = SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(parse(&local), Ok((Header::Local, 16)));
    }

    #[test]
    fn refuses_what_is_not_a_whole_v2_header() {
        assert_eq!(
            parse(b"\x12\x34\x01\x00 a plain DNS query"),
            Err(Some("no PROXY protocol v2 signature"))
        );
        let b = v4([10, 1, 2, 3], 1);
        assert_eq!(parse(&b[..10]), Err(None), "a stream's start");
        assert_eq!(parse(&b[..20]), Err(None));
        let mut v1 = b.clone();
        v1[12] = 0x11;
        assert!(parse(&v1).is_err());
        let mut unix = b.clone();
        unix[13] = 0x31;
        assert!(parse(&unix).is_err());
        let mut short = SIGNATURE.to_vec();
        short.extend_from_slice(&[0x21, 0x12, 0, 4, 1, 2, 3, 4]);
        assert_eq!(
            parse(&short),
            Err(Some("a PROXY protocol address block cut short"))
        );
        assert!(parse(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n").is_err());
    }

    #[test]
    fn trusts_only_the_listed_sources() {
        let s = ProxySources::new(vec!["127.0.0.1/32".parse().unwrap()]);
        assert!(s.trusts("127.0.0.1".parse().unwrap()));
        assert!(s.trusts("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!s.trusts("127.0.0.2".parse().unwrap()));
        assert!(!ProxySources::default().trusts("127.0.0.1".parse().unwrap()));
    }
}
