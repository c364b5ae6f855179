//! The compiled index from a destination to the exceptions that name it.
//! Names are one table: the name itself and each proper suffix of it on a
//! label boundary are looked up once each (hashes of all of them come from
//! one right-to-left pass), giving exact hosts for the whole name,
//! `*.suffix` for proper suffixes (so `*.example.com` can never match
//! `evilexample.com`) and `api-*.x.y` for the rest after the first label,
//! with a prefix / suffix check on that label. CIDRs by one hash lookup per
//! prefix length in use. Lookups never allocate.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;

use super::host::{label_glob_matches, HostPattern, Target};

/// FNV-1a: the keys are short host names we built ourselves, not attacker
/// controlled table sizes, and SipHash costs more than the rest of a lookup.
/// Flooding is bounded by the policy author, not by requests.
#[derive(Default)]
pub struct Fnv(u64);
impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf29ce484222325
        } else {
            self.0
        };
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        self.0 = h;
    }
}
type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// The name index is keyed by [`suffix_hash`], already computed: hashing it
/// again would cost as much as the lookup.
#[derive(Default)]
struct Prehashed(u64);
impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const FNV_SEED: u64 = 0xcbf29ce484222325;

fn fnv_step(h: u64, b: u8) -> u64 {
    (h ^ b as u64).wrapping_mul(0x100000001b3)
}

/// Spreads FNV's weak low bits, which hashbrown uses to pick a bucket.
fn finish(h: u64) -> u64 {
    let h = (h ^ (h >> 29)).wrapping_mul(0xbf58476d1ce4e5b9);
    h ^ (h >> 32)
}

/// FNV-1a over the name's bytes from the last to the first: a lookup gets
/// the hash of every suffix of a name in one right-to-left pass.
fn suffix_hash(name: &str) -> u64 {
    finish(name.bytes().rev().fold(FNV_SEED, fnv_step))
}

/// `prefix*suffix` for the first label, and the exception it belongs to.
type LabelGlob = (Box<str>, Box<str>, u32);

/// Everything the policy says about one name: exceptions naming it exactly,
/// `*.name` ones, and `x*y.name` ones. Names with the same hash (in practice
/// never) are chained.
#[derive(Default)]
struct Entry {
    name: Box<str>,
    exact: Vec<u32>,
    subdomains: Vec<u32>,
    label_globs: Vec<LabelGlob>,
    collision: Option<Box<Entry>>,
}

#[derive(Default)]
pub struct Matcher {
    names: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    v4: Vec<(u8, FnvMap<u32, Vec<u32>>)>,
    v6: Vec<(u8, FnvMap<u128, Vec<u32>>)>,
}

impl Matcher {
    /// A matcher with room for `names` host patterns: growing the table by
    /// doubling moved every entry seven times on the way to 100k.
    pub fn with_room_for(names: usize) -> Matcher {
        Matcher {
            names: HashMap::with_capacity_and_hasher(names, Default::default()),
            ..Matcher::default()
        }
    }

    fn entry(&mut self, name: &str) -> &mut Entry {
        let mut e = self
            .names
            .entry(suffix_hash(name))
            .or_insert_with(|| Entry {
                name: name.into(),
                ..Entry::default()
            });
        while &*e.name != name {
            e = e.collision.get_or_insert_with(|| {
                Box::new(Entry {
                    name: name.into(),
                    ..Entry::default()
                })
            });
        }
        e
    }

    fn get(&self, hash: u64, name: &str) -> Option<&Entry> {
        let mut e = self.names.get(&hash)?;
        while &*e.name != name {
            e = e.collision.as_deref()?;
        }
        Some(e)
    }

    pub fn add_host(&mut self, pattern: &HostPattern, idx: u32) {
        match pattern {
            HostPattern::Exact(h) => self.entry(h.as_str()).exact.push(idx),
            HostPattern::Subdomains(h) => self.entry(h.as_str()).subdomains.push(idx),
            HostPattern::LabelGlob {
                prefix,
                suffix,
                rest,
            } => self
                .entry(rest.as_str())
                .label_globs
                .push((prefix.clone(), suffix.clone(), idx)),
        }
    }

    pub fn add_cidr(&mut self, net: &IpNet, idx: u32) {
        match net {
            IpNet::V4(n) => {
                let len = n.prefix_len();
                let key = u32::from(n.network());
                let pos = match self.v4.iter().position(|(l, _)| *l == len) {
                    Some(p) => p,
                    None => {
                        self.v4.push((len, FnvMap::default()));
                        self.v4.len() - 1
                    }
                };
                self.v4[pos].1.entry(key).or_default().push(idx);
            }
            IpNet::V6(n) => {
                let len = n.prefix_len();
                let key = u128::from(n.network());
                let pos = match self.v6.iter().position(|(l, _)| *l == len) {
                    Some(p) => p,
                    None => {
                        self.v6.push((len, FnvMap::default()));
                        self.v6.len() - 1
                    }
                };
                self.v6[pos].1.entry(key).or_default().push(idx);
            }
        }
    }

    /// Calls `f` with every exception index whose hosts or cidrs name `target`.
    /// Indices may repeat (an exception listing two patterns that both match).
    pub fn for_each_candidate(&self, target: &Target, mut f: impl FnMut(u32)) {
        match target {
            Target::Name(host) => {
                let name = host.as_str();
                let b = name.as_bytes();
                let first_dot = name.find('.');
                // One pass from the right: at each dot, `h` is the hash of
                // the name after it.
                let mut h = FNV_SEED;
                for i in (0..b.len()).rev() {
                    if b[i] == b'.' {
                        if let Some(e) = self.get(finish(h), &name[i + 1..]) {
                            e.subdomains.iter().for_each(|x| f(*x));
                            if first_dot == Some(i) {
                                let label = &name[..i];
                                for (p, s, x) in &e.label_globs {
                                    if label_glob_matches(p, s, label) {
                                        f(*x);
                                    }
                                }
                            }
                        }
                    }
                    h = fnv_step(h, b[i]);
                }
                if let Some(e) = self.get(finish(h), name) {
                    e.exact.iter().for_each(|i| f(*i));
                }
            }
            Target::Ip(IpAddr::V4(a)) => {
                let a = u32::from(*a);
                for (len, map) in &self.v4 {
                    let mask = if *len == 0 {
                        0
                    } else {
                        u32::MAX << (32 - *len as u32)
                    };
                    if let Some(v) = map.get(&(a & mask)) {
                        v.iter().for_each(|i| f(*i));
                    }
                }
            }
            Target::Ip(IpAddr::V6(a)) => {
                let a = u128::from(*a);
                for (len, map) in &self.v6 {
                    let mask = if *len == 0 {
                        0
                    } else {
                        u128::MAX << (128 - *len as u32)
                    };
                    if let Some(v) = map.get(&(a & mask)) {
                        v.iter().for_each(|i| f(*i));
                    }
                }
            }
        }
    }
}
