//! What the resolver answered, remembered for transparent capture: for each
//! client, which allowed names each answered address came from, until the
//! answer's TTL runs out (but at least [`MIN_REMEMBER`]). A captured TCP
//! connection that carries no name of its own (no TLS server name, no HTTP
//! `Host`: SSH, a database protocol) is decided by the name its client
//! resolved through egressd for the address it connects to.
//!
//! Only the *name* comes from here. The connection itself still goes
//! through the decision and the address checks for that name
//! (`proxy::transparent`), so a stale or wrong entry can only pick which
//! allowed name a connection is judged as, never an address to dial.
//!
//! Bounded: [`MAX_ENTRIES`] (client, address) pairs of at most
//! [`MAX_NAMES_PER_ADDR`] names each; expired entries are dropped as new
//! ones come, and when full the one closest to expiry goes first. Off
//! unless a transparent listener is served: `egressd serve` remembers
//! nothing.
//!
//! A client is its source address, every loopback address counting as one
//! client: inside a sandbox, lookups come from 127.0.0.1 while an IPv6
//! connection comes from ::1, and both are the same sandbox.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::inside::{is_inside, Pool};
use crate::policy::canonical_ip;
use crate::policy::host::Host;

/// (client, address) pairs remembered at once, all clients together.
pub const MAX_ENTRIES: usize = 16_384;
/// Names remembered for one address (a CDN address serves many); the most
/// recently answered are kept.
pub const MAX_NAMES_PER_ADDR: usize = 4;
/// Shortest memory of an answer, whatever its TTL: programs keep addresses
/// a little past the TTL (connection pools, language runtimes' own caches),
/// and a longer memory risks nothing but judging a connection by a name
/// the client did resolve to that address.
pub const MIN_REMEMBER: Duration = Duration::from_secs(60);
/// Longest memory of an answer.
pub const MAX_REMEMBER: Duration = Duration::from_secs(86_400);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ClientKey {
    Loopback,
    Addr(IpAddr),
}

impl ClientKey {
    fn of(src: IpAddr) -> ClientKey {
        let src = canonical_ip(src);
        if src.is_loopback() {
            ClientKey::Loopback
        } else {
            ClientKey::Addr(src)
        }
    }
}

type Key = (ClientKey, IpAddr);

struct Entry {
    /// Most recently answered first, each with its own expiry.
    names: Vec<(Host, Instant)>,
    /// The latest of the names' expiries.
    expires: Instant,
}

#[derive(Default)]
struct Table {
    map: HashMap<Key, Entry>,
    by_expiry: BTreeSet<(Instant, Key)>,
}

impl Table {
    fn purge_expired(&mut self, now: Instant) {
        while let Some(&(at, key)) = self.by_expiry.first() {
            if at > now {
                break;
            }
            self.by_expiry.pop_first();
            self.map.remove(&key);
        }
    }

    fn insert(&mut self, key: Key, host: &Host, ttl: Duration, now: Instant) {
        self.purge_expired(now);
        let expires = now + ttl.clamp(MIN_REMEMBER, MAX_REMEMBER);
        if let Some(e) = self.map.get_mut(&key) {
            self.by_expiry.remove(&(e.expires, key));
            e.names.retain(|(h, at)| h != host && *at > now);
            e.names.insert(0, (host.clone(), expires));
            e.names.truncate(MAX_NAMES_PER_ADDR);
            e.expires = e.names.iter().map(|(_, at)| *at).max().unwrap_or(expires);
            self.by_expiry.insert((e.expires, key));
            return;
        }
        if self.map.len() >= MAX_ENTRIES {
            if let Some((_, oldest)) = self.by_expiry.pop_first() {
                self.map.remove(&oldest);
            }
        }
        self.map.insert(
            key,
            Entry {
                names: vec![(host.clone(), expires)],
                expires,
            },
        );
        self.by_expiry.insert((expires, key));
    }

    fn get(&self, key: &Key, now: Instant) -> Vec<Host> {
        self.map
            .get(key)
            .map(|e| {
                e.names
                    .iter()
                    .filter(|(_, at)| *at > now)
                    .map(|(h, _)| h.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The remembered answers; one per resolver (`Resolver`), whose methods
/// of the same names call these.
#[derive(Default)]
pub(super) struct AnswerMemory {
    on: AtomicBool,
    table: Mutex<Table>,
    /// Each allowed name's own address inside the sandbox (`inside`).
    inside: Mutex<Pool>,
}

impl AnswerMemory {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn inside(&self) -> MutexGuard<'_, Pool> {
        self.inside.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AnswerMemory {
    /// Starts (or stops) remembering answers, and answering each allowed
    /// name with its own address (`inside`): on while a transparent
    /// listener is served.
    pub fn remember_answers(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
        if !on {
            *self.table() = Table::default();
            *self.inside() = Pool::default();
        }
    }

    /// Whether answers are remembered (transparent capture): each answer
    /// then has side effects per client, so none is served from the wire
    /// cache.
    pub fn remembering_answers(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The records answered to the sandbox for `host`, an allowed name, to
    /// a `qtype` query: as resolved when answers are not remembered; else
    /// its own address ([`inside`](super::inside)) and no other — the first
    /// A record's data replaced, no further A, no AAAA, no HTTPS or SVCB
    /// record (whose hints name real addresses); other records (CNAME, TXT,
    /// MX…) kept. An A query for a name that has no A record but exists
    /// (an IPv6-only name) gets its address too: egressd reaches the name
    /// over whichever family it has.
    pub fn inside_records(
        &self,
        records: Vec<Record>,
        host: &Host,
        qtype: u16,
        rcode: ResponseCode,
    ) -> Vec<Record> {
        if !self.on.load(Ordering::Relaxed) {
            return records;
        }
        let mut given = false;
        let mut out = Vec::with_capacity(records.len());
        for mut r in records {
            match r.data {
                RData::A(_) if !given => {
                    given = true;
                    r.data = RData::A(A(self.inside().address(host)));
                    out.push(r);
                }
                RData::A(_) | RData::AAAA(_) | RData::HTTPS(_) | RData::SVCB(_) => {}
                _ => out.push(r),
            }
        }
        let cname = out.iter().any(|r| matches!(r.data, RData::CNAME(_)));
        if !given && !cname && qtype == u16::from(RecordType::A) && rcode == ResponseCode::NoError {
            if let Ok(mut name) = Name::from_ascii(host.as_str()) {
                name.set_fqdn(true);
                let a = A(self.inside().address(host));
                out.push(Record::from_rdata(name, 0, RData::A(a)));
            }
        }
        out
    }

    /// The name whose own address inside the sandbox `ip` is, if any.
    pub fn inside_name(&self, ip: IpAddr) -> Option<Host> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        self.inside().name(ip)
    }

    /// Remembers that the DNS front-end answered `ip` to `client` for
    /// `host`, a name the policy allowed, with `ttl` seconds to live.
    pub fn remember_answer(&self, client: IpAddr, ip: IpAddr, host: &Host, ttl: u32) {
        let mem = self;
        if !mem.on.load(Ordering::Relaxed) {
            return;
        }
        let key = (ClientKey::of(client), canonical_ip(ip));
        mem.table().insert(
            key,
            host,
            Duration::from_secs(u64::from(ttl)),
            Instant::now(),
        );
    }

    /// The allowed names that `client` resolved to `ip` through this
    /// egressd and whose answers are still remembered, most recent first.
    pub fn recall(&self, client: IpAddr, ip: IpAddr) -> Vec<Host> {
        let mem = self;
        if !mem.on.load(Ordering::Relaxed) {
            return Vec::new();
        }
        if is_inside(ip) {
            return mem.inside().name(ip).into_iter().collect();
        }
        let key = (ClientKey::of(client), canonical_ip(ip));
        mem.table().get(&key, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::host::parse_host;

    fn h(s: &str) -> Host {
        parse_host(s).unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn key(client: &str, addr: &str) -> Key {
        (ClientKey::of(ip(client)), canonical_ip(ip(addr)))
    }

    #[test]
    fn remembers_per_client_most_recent_first_until_expiry() {
        let mut t = Table::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(300);
        t.insert(key("127.0.0.1", "192.0.2.10"), &h("a.test"), ttl, t0);
        t.insert(key("127.0.0.1", "192.0.2.10"), &h("b.test"), ttl, t0);
        t.insert(key("127.0.0.1", "192.0.2.10"), &h("a.test"), ttl, t0);
        // Every loopback source is the same client; others are not.
        assert_eq!(
            t.get(&key("::1", "192.0.2.10"), t0),
            [h("a.test"), h("b.test")]
        );
        assert!(t.get(&key("10.0.0.7", "192.0.2.10"), t0).is_empty());
        assert!(t.get(&key("127.0.0.1", "192.0.2.11"), t0).is_empty());
        // IPv4-mapped IPv6 is the IPv4 address.
        assert_eq!(t.get(&key("127.0.0.1", "::ffff:192.0.2.10"), t0).len(), 2);
        assert!(t
            .get(
                &key("127.0.0.1", "192.0.2.10"),
                t0 + ttl + Duration::from_secs(1)
            )
            .is_empty());
    }

    #[test]
    fn short_ttls_are_stretched_and_long_ones_capped() {
        let mut t = Table::default();
        let t0 = Instant::now();
        t.insert(
            key("127.0.0.1", "192.0.2.1"),
            &h("a.test"),
            Duration::ZERO,
            t0,
        );
        let k = key("127.0.0.1", "192.0.2.1");
        assert_eq!(
            t.get(&k, t0 + MIN_REMEMBER - Duration::from_secs(1)).len(),
            1
        );
        assert!(t.get(&k, t0 + MIN_REMEMBER).is_empty());
        t.insert(k, &h("a.test"), Duration::from_secs(u64::MAX / 4), t0);
        assert!(t.get(&k, t0 + MAX_REMEMBER).is_empty());
    }

    #[test]
    fn bounded_in_names_and_in_entries() {
        let mut t = Table::default();
        let t0 = Instant::now();
        let k = key("127.0.0.1", "192.0.2.1");
        for i in 0..10 {
            t.insert(k, &h(&format!("n{i}.test")), Duration::from_secs(100), t0);
        }
        let names = t.get(&k, t0);
        assert_eq!(names.len(), MAX_NAMES_PER_ADDR);
        assert_eq!(names[0], h("n9.test"));

        let mut t = Table::default();
        for i in 0..(MAX_ENTRIES as u32 + 10) {
            let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            // Later entries live longer, so the earliest go first.
            let ttl = Duration::from_secs(100 + u64::from(i));
            t.insert((ClientKey::Loopback, addr), &h("a.test"), ttl, t0);
        }
        assert_eq!(t.map.len(), MAX_ENTRIES);
        assert_eq!(t.by_expiry.len(), MAX_ENTRIES);
        let first = (ClientKey::Loopback, ip("10.0.0.0"));
        assert!(t.get(&first, t0).is_empty(), "the soonest to expire went");
        // Expired entries leave as new ones arrive.
        t.insert(
            key("127.0.0.1", "192.0.2.99"),
            &h("a.test"),
            Duration::from_secs(100),
            t0 + MAX_REMEMBER,
        );
        assert_eq!(t.map.len(), 1);
    }

    fn rec(owner: &str, data: RData) -> Record {
        let mut n = Name::from_ascii(owner).unwrap();
        n.set_fqdn(true);
        Record::from_rdata(n, 60, data)
    }

    #[test]
    fn inside_each_name_is_answered_with_its_own_address_only() {
        let r = AnswerMemory::default();
        let a = |s: &str| RData::A(A(s.parse().unwrap()));
        let aaaa = |s: &str| RData::AAAA(hickory_proto::rr::rdata::AAAA(s.parse().unwrap()));
        let upstream = vec![
            rec(
                "www.x.test",
                RData::CNAME(hickory_proto::rr::rdata::CNAME(
                    Name::from_ascii("cdn.test.").unwrap(),
                )),
            ),
            rec("cdn.test", a("192.0.2.1")),
            rec("cdn.test", a("192.0.2.2")),
            rec("cdn.test", aaaa("2001:db8::1")),
        ];
        let ok = ResponseCode::NoError;
        // Off (egressd serve): as resolved.
        assert_eq!(
            r.inside_records(upstream.clone(), &h("www.x.test"), 1, ok),
            upstream
        );
        r.remember_answers(true);
        let got = r.inside_records(upstream.clone(), &h("www.x.test"), 1, ok);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(got[0].data, RData::CNAME(_)));
        assert_eq!(got[1].data, a("198.18.0.1"));
        // Another name on the same real addresses: another address.
        let other = vec![rec("y.test", a("192.0.2.1"))];
        assert_eq!(
            r.inside_records(other, &h("y.test"), 1, ok)[0].data,
            a("198.18.0.2")
        );
        assert_eq!(r.inside_name(ip("198.18.0.1")), Some(h("www.x.test")));
        assert_eq!(
            r.recall(ip("127.0.0.1"), ip("198.18.0.2")),
            vec![h("y.test")]
        );
        // AAAA: no real address leaks.
        let v6 = vec![rec("y.test", aaaa("2001:db8::1"))];
        assert!(r
            .inside_records(v6.clone(), &h("y.test"), 28, ok)
            .is_empty());
        // An IPv6-only name still gets its address for an A query; a name
        // that does not exist gets none.
        let got = r.inside_records(Vec::new(), &h("v6only.test"), 1, ok);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data, a("198.18.0.3"));
        assert!(r
            .inside_records(Vec::new(), &h("nx.test"), 1, ResponseCode::NXDomain)
            .is_empty());
        // Off again: forgotten.
        r.remember_answers(false);
        assert_eq!(r.inside_name(ip("198.18.0.1")), None);
    }
}
