//! The compiled index from a destination to the exceptions that name it.
//! Exact hosts by one hash lookup; `*.suffix` by looking up each proper
//! suffix of the name on label boundaries (so `*.example.com` can never match
//! `evilexample.com`); `api-*.x.y` by the fixed rest of the name and a prefix /
//! suffix check on the first label; CIDRs by one hash lookup per prefix
//! length in use. Lookups never allocate.

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

/// `prefix*suffix` for the first label, and the exception it belongs to.
type LabelGlob = (Box<str>, Box<str>, u32);

#[derive(Default)]
pub struct Matcher {
    exact: FnvMap<Box<str>, Vec<u32>>,
    subdomains: FnvMap<Box<str>, Vec<u32>>,
    /// Keyed by the name without its first label.
    label_globs: FnvMap<Box<str>, Vec<LabelGlob>>,
    v4: Vec<(u8, FnvMap<u32, Vec<u32>>)>,
    v6: Vec<(u8, FnvMap<u128, Vec<u32>>)>,
}

impl Matcher {
    pub fn add_host(&mut self, pattern: &HostPattern, idx: u32) {
        match pattern {
            HostPattern::Exact(h) => self.exact.entry(h.as_str().into()).or_default().push(idx),
            HostPattern::Subdomains(h) => self
                .subdomains
                .entry(h.as_str().into())
                .or_default()
                .push(idx),
            HostPattern::LabelGlob {
                prefix,
                suffix,
                rest,
            } => self
                .label_globs
                .entry(rest.as_str().into())
                .or_default()
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
                if let Some(v) = self.exact.get(name) {
                    v.iter().for_each(|i| f(*i));
                }
                let mut rest = name;
                let mut first = true;
                while let Some(dot) = rest.find('.') {
                    let (label, after) = (&rest[..dot], &rest[dot + 1..]);
                    if !self.subdomains.is_empty() {
                        if let Some(v) = self.subdomains.get(after) {
                            v.iter().for_each(|i| f(*i));
                        }
                    }
                    if first && !self.label_globs.is_empty() {
                        if let Some(v) = self.label_globs.get(after) {
                            for (p, s, i) in v {
                                if label_glob_matches(p, s, label) {
                                    f(*i);
                                }
                            }
                        }
                    }
                    first = false;
                    rest = after;
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
