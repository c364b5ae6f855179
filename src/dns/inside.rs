//! The sandbox's own addresses under transparent capture: each allowed name
//! answered through egressd gets an IPv4 address of its own in
//! [`INSIDE_NET`] (198.18.0.0/15, the range RFC 2544 sets aside for
//! benchmarking, so never a real destination), and no other address.
//!
//! Why: an HTTP/2 client (every browser) reuses a connection for another
//! name when both names resolve to the same address and the certificate
//! covers both ("connection coalescing"). A connection egressd passes
//! through without interception would then carry requests for a name whose
//! exception needs its methods and paths checked, and egressd would never
//! see them. With one address per name, no two names share an address
//! inside, so a client has no connection to coalesce onto; a connection to
//! a name's address is decided as that name, and a TLS server name that
//! differs is refused (`proxy::transparent`).
//!
//! Nothing is dialled at these addresses: a connection to one is decided by
//! the name, and the name is resolved again and its addresses checked, as
//! for a proxied request. So a stale or recycled entry can at worst judge a
//! connection as another allowed name — never reach an address of the
//! client's choosing.
//!
//! Bounded: the whole range (131 070 names); past that, the least recently
//! answered name gives its address up.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use crate::policy::canonical_ip;
use crate::policy::host::Host;

/// The range the addresses come from, and its prefix length.
pub const INSIDE_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 15);
/// Addresses handed out: the range without its first and last.
const SIZE: u32 = (1 << (32 - INSIDE_NET.1)) - 2;

/// Whether `ip` lies in [`INSIDE_NET`].
pub fn is_inside(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => {
            u32::from(v4) >> (32 - INSIDE_NET.1) == u32::from(INSIDE_NET.0) >> (32 - INSIDE_NET.1)
        }
        IpAddr::V6(_) => false,
    }
}

/// Names and their addresses, both ways.
#[derive(Default)]
pub(super) struct Pool {
    by_name: HashMap<Host, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, Host>,
    /// Least recently answered first.
    order: VecDeque<Ipv4Addr>,
    /// Addresses handed out so far (the next is this one's successor).
    used: u32,
}

impl Pool {
    /// `host`'s address, given now if it has none.
    pub(super) fn address(&mut self, host: &Host) -> Ipv4Addr {
        if let Some(&a) = self.by_name.get(host) {
            if let Some(i) = self.order.iter().rposition(|x| *x == a) {
                self.order.remove(i);
            }
            self.order.push_back(a);
            return a;
        }
        let a = if self.used < SIZE {
            self.used += 1;
            Ipv4Addr::from(u32::from(INSIDE_NET.0) + self.used)
        } else {
            let a = self.order.pop_front().expect("a full pool has entries");
            if let Some(old) = self.by_addr.remove(&a) {
                self.by_name.remove(&old);
            }
            a
        };
        self.by_name.insert(host.clone(), a);
        self.by_addr.insert(a, host.clone());
        self.order.push_back(a);
        a
    }

    /// The name `ip` was given to, if any.
    pub(super) fn name(&self, ip: IpAddr) -> Option<Host> {
        match canonical_ip(ip) {
            IpAddr::V4(v4) => self.by_addr.get(&v4).cloned(),
            IpAddr::V6(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::host::parse_host;

    fn h(s: &str) -> Host {
        parse_host(s).unwrap()
    }

    #[test]
    fn each_name_gets_its_own_address_and_keeps_it() {
        let mut p = Pool::default();
        let a = p.address(&h("allowed.test"));
        let b = p.address(&h("coalesce.test"));
        assert_ne!(a, b);
        assert_eq!(p.address(&h("allowed.test")), a);
        assert!(is_inside(a.into()) && is_inside(b.into()));
        assert_eq!(p.name(a.into()), Some(h("allowed.test")));
        assert_eq!(p.name(b.into()), Some(h("coalesce.test")));
        assert_eq!(p.name("198.18.9.9".parse().unwrap()), None);
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
    }

    #[test]
    fn the_range_is_198_18_slash_15() {
        for (ip, inside) in [
            ("198.18.0.1", true),
            ("198.19.255.254", true),
            ("198.17.255.255", false),
            ("198.20.0.0", false),
            ("::ffff:198.18.0.1", true),
            ("2001:db8::1", false),
        ] {
            assert_eq!(is_inside(ip.parse().unwrap()), inside, "{ip}");
        }
    }

    #[test]
    fn a_full_pool_recycles_the_least_recently_answered() {
        let mut p = Pool {
            used: SIZE - 1,
            ..Pool::default()
        };
        let last = p.address(&h("a.test"));
        assert_eq!(last, Ipv4Addr::new(198, 19, 255, 254));
        let b_first = {
            // Full now: b takes a's address (a was least recently answered).
            p.address(&h("b.test"))
        };
        assert_eq!(b_first, last);
        assert_eq!(p.name(last.into()), Some(h("b.test")));
        assert_ne!(p.address(&h("a.test")), Ipv4Addr::UNSPECIFIED);
        assert_eq!(p.by_name.len(), 1, "one address, one name");
    }
}
