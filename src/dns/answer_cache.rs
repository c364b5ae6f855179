//! Answers to allowed queries kept as the bytes that were sent.
//!
//! A query of the common shape ([`codec::parse`](super::codec::parse)) that
//! the policy allowed, whose budget was spent and whose answer came back
//! from the resolver without any address removed, leaves its encoded answer
//! here, keyed by (name in lower case, type, whether the client spoke EDNS,
//! the answering exception) within one policy snapshot. The next such query
//! is still decided (policy, tunnel budget, in-flight share) and logged like
//! any other; only then is its answer copied from here, with the query's id,
//! flags and question (0x20 case as asked) written over the stored ones and
//! every record's TTL lowered by the time the answer has been kept. No
//! hickory message is parsed or built, and nothing is allocated once the
//! output buffer has grown to an answer's size.
//!
//! Bounds: at most [`MAX_ENTRIES`] answers; at that size, the expired ones
//! go, and if none has, all go (refilled from the resolver's own cache at
//! one hickory encode each). An answer leaves when its TTL runs out (as the
//! resolver's entry it came from does), and every answer goes when the
//! policy snapshot changes (a reload), since any of them may now be decided
//! or filtered differently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::policy::{Exception, Policy};

use super::codec::{self, Query};

/// Answers kept, in all (names × types × EDNS or not × exception).
pub const MAX_ENTRIES: usize = 65_536;
/// A key: the lower-case wire name (at most 255 bytes), the type, the EDNS
/// flag and the exception's address.
const KEY_MAX: usize = 255 + 2 + 1 + 8;

/// One cache key, built on the stack.
pub(super) struct Key {
    buf: [u8; KEY_MAX],
    len: usize,
}

impl Key {
    /// The key of `q` answered through `exception` (`None`: allowed with no
    /// exception, as report mode allows).
    pub fn new(q: &Query<'_>, exception: Option<&Exception>) -> Key {
        let name = q.name_wire();
        let mut buf = [0u8; KEY_MAX];
        let n = name.len();
        buf[..n].copy_from_slice(name);
        // Length bytes are at most 63, below b'A': only letters change.
        buf[..n].make_ascii_lowercase();
        buf[n..n + 2].copy_from_slice(&q.qtype.to_be_bytes());
        buf[n + 2] = u8::from(q.edns.is_some());
        let e = exception.map_or(0usize, |e| e as *const Exception as usize);
        buf[n + 3..n + 11].copy_from_slice(&(e as u64).to_be_bytes());
        Key { buf, len: n + 11 }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

struct Entry {
    /// The answer as first sent.
    bytes: Box<[u8]>,
    /// Where each answer and authority record's TTL sits in `bytes`.
    ttl_at: Box<[u16]>,
    /// The response code (the low four bits of the flags word).
    rcode: u16,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    /// The policy snapshot every entry was decided by. A `Weak` keeps its
    /// allocation (not the policy) alive, so a later snapshot never has
    /// the same address.
    snapshot: Weak<Policy>,
    map: HashMap<Box<[u8]>, Entry>,
}

impl Inner {
    /// Empties the cache when `policy` is not the snapshot it was filled by.
    fn align(&mut self, policy: &Arc<Policy>) {
        if self.snapshot.as_ptr() != Arc::as_ptr(policy) {
            self.map.clear();
            self.snapshot = Arc::downgrade(policy);
        }
    }
}

/// See the module documentation.
#[derive(Default)]
pub(super) struct AnswerCache {
    inner: Mutex<Inner>,
}

impl AnswerCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the kept answer for `key` to `q` into `out` (replacing what
    /// it held) and returns its response code, when there is one under
    /// `policy` that has not expired at `now` and fits `max_size`.
    pub fn answer(
        &self,
        policy: &Arc<Policy>,
        key: &Key,
        q: &Query<'_>,
        max_size: u16,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Option<u16> {
        let mut inner = self.lock();
        inner.align(policy);
        let e = inner.map.get(key.bytes())?;
        let left = e.expires.saturating_duration_since(now).as_secs();
        if left == 0 {
            inner.map.remove(key.bytes());
            return None;
        }
        if e.bytes.len() > usize::from(max_size) {
            return None;
        }
        out.clear();
        out.extend_from_slice(&e.bytes);
        let ttl = u32::try_from(left).unwrap_or(u32::MAX).to_be_bytes();
        for at in e.ttl_at.iter() {
            let at = usize::from(*at);
            out[at..at + 4].copy_from_slice(&ttl);
        }
        out[0..2].copy_from_slice(&q.id.to_be_bytes());
        out[2..4].copy_from_slice(&codec::answer_flags(q, e.rcode).to_be_bytes());
        out[12..12 + q.question.len()].copy_from_slice(q.question);
        Some(e.rcode)
    }

    /// Keeps `bytes`, the answer just sent for `key` under `policy`, for
    /// `ttl` seconds from `now`. Declines what it cannot patch.
    pub fn store(&self, policy: &Arc<Policy>, key: &Key, bytes: &[u8], ttl: u32, now: Instant) {
        if ttl == 0 {
            return;
        }
        let Some(ttl_at) = ttl_offsets(bytes) else {
            return;
        };
        let rcode = u16::from_be_bytes([bytes[2], bytes[3]]) & 0xf;
        let entry = Entry {
            bytes: bytes.into(),
            ttl_at: ttl_at.into(),
            rcode,
            expires: now + Duration::from_secs(u64::from(ttl)),
        };
        let mut inner = self.lock();
        inner.align(policy);
        if inner.map.len() >= MAX_ENTRIES && !inner.map.contains_key(key.bytes()) {
            inner.map.retain(|_, e| e.expires > now);
            if inner.map.len() >= MAX_ENTRIES {
                inner.map.clear();
            }
        }
        inner.map.insert(key.bytes().into(), entry);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().map.len()
    }
}

/// The offsets of the TTLs of the answer and authority records of the DNS
/// message `m` (not the OPT record's, which holds flags), or `None` when it
/// does not walk cleanly.
fn ttl_offsets(m: &[u8]) -> Option<Vec<u16>> {
    let be16 = |at: usize| Some(u16::from_be_bytes([*m.get(at)?, *m.get(at + 1)?]));
    let (qd, an, ns) = (be16(4)?, be16(6)?, be16(8)?);
    let mut at = 12;
    for _ in 0..qd {
        at = skip_name(m, at)? + 4;
    }
    let mut out = Vec::with_capacity(usize::from(an + ns));
    for _ in 0..an + ns {
        at = skip_name(m, at)?;
        let ttl = at + 4;
        let rdlen = usize::from(be16(at + 8)?);
        at += 10 + rdlen;
        if at > m.len() {
            return None;
        }
        out.push(u16::try_from(ttl).ok()?);
    }
    Some(out)
}

/// Where the name starting at `at` ends (labels, a pointer, or the root).
fn skip_name(m: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *m.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return (at + 2 <= m.len()).then_some(at + 2),
            l if l > 63 => return None,
            l => at += 1 + usize::from(l),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::tests::query;
    use super::*;
    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::rdata::{A, CNAME};
    use hickory_proto::rr::{Name, RData, Record};

    fn policy() -> Arc<Policy> {
        Arc::new(
            crate::policy::from_yaml(
                "exceptions:\n\
                 - id: a\n  owner: t\n  reason: t\n  hosts: [www.example.test]\n\
                 - id: b\n  owner: t\n  reason: t\n  hosts: [www.example.test]\n",
            )
            .unwrap(),
        )
    }

    /// The answer egressd would send for `raw`: an A record and a CNAME,
    /// both at `ttl`.
    fn answer(raw: &[u8], ttl: u32) -> Vec<u8> {
        let q = codec::parse(raw).unwrap();
        let name = |s: &str| Name::from_ascii(s).unwrap();
        let records = [
            Record::from_rdata(
                name("www.example.test."),
                ttl,
                RData::CNAME(CNAME(name("cdn.example.test."))),
            ),
            Record::from_rdata(
                name("cdn.example.test."),
                ttl,
                RData::A(A::new(192, 0, 2, 1)),
            ),
        ];
        codec::encode(&q, ResponseCode::NoError, &records, &[], None, 4096, 1232).unwrap()
    }

    #[test]
    fn a_hit_is_the_fresh_answer_with_the_querys_id_flags_case_and_ttl() {
        let (p, cache) = (policy(), AnswerCache::default());
        let e = &p.exceptions[0];
        let t0 = Instant::now();
        let first = query(0x1111, 0x0100, "www.example.test", 1, Some(1232));
        let q1 = codec::parse(&first).unwrap();
        cache.store(&p, &Key::new(&q1, Some(e)), &answer(&first, 300), 300, t0);
        // Asked again, in another case, with CD set, DO set and another
        // id, 100.5 s later.
        let again = query(0x2222, 0x0110, "WwW.eXaMpLe.TeSt", 1, Some(4096));
        let q2 = codec::parse(&again).unwrap();
        let mut out = Vec::new();
        let at = t0 + Duration::from_millis(100_500);
        let rcode = cache.answer(&p, &Key::new(&q2, Some(e)), &q2, 4096, at, &mut out);
        assert_eq!(rcode, Some(0));
        let want = answer(&again, 199);
        assert_eq!(out, want, "byte for byte the answer a fresh encode gives");
        assert_eq!(
            &out[12..12 + q2.question.len()],
            q2.question,
            "0x20 case echoed"
        );
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.id, 0x2222);
        assert!(m.metadata.checking_disabled && m.metadata.recursion_desired);
        assert!(m.answers.iter().all(|r| r.ttl == 199));
        assert!(m.edns.is_some(), "EDNS answered to an EDNS query");
        // Once the output buffer has an answer's room, a hit (key, lookup,
        // copy and patches) allocates nothing.
        let n = super::super::alloc_count::allocations(|| {
            let key = Key::new(&q2, Some(e));
            assert!(cache.answer(&p, &key, &q2, 4096, at, &mut out).is_some());
        });
        assert_eq!(n, 0, "allocations on a hit");
    }

    #[test]
    fn the_key_holds_type_edns_and_exception_and_ignores_case() {
        let (p, cache) = (policy(), AnswerCache::default());
        let (a, b) = (&p.exceptions[0], &p.exceptions[1]);
        let t0 = Instant::now();
        let raw = query(1, 0x0100, "www.example.test", 1, Some(1232));
        let q = codec::parse(&raw).unwrap();
        cache.store(&p, &Key::new(&q, Some(a)), &answer(&raw, 60), 60, t0);
        let mut out = Vec::new();
        let mut hit = |raw: &[u8], e| {
            let q = codec::parse(raw).unwrap();
            cache
                .answer(&p, &Key::new(&q, e), &q, 4096, t0, &mut out)
                .is_some()
        };
        assert!(hit(&query(2, 0, "WWW.EXAMPLE.TEST", 1, Some(512)), Some(a)));
        assert!(!hit(&raw, Some(b)), "another exception");
        assert!(!hit(&raw, None), "no exception");
        assert!(!hit(
            &query(2, 0, "www.example.test", 28, Some(1232)),
            Some(a)
        ));
        assert!(
            !hit(&query(2, 0, "www.example.test", 1, None), Some(a)),
            "no OPT record in the query: the EDNS answer does not fit it"
        );
    }

    #[test]
    fn an_answer_expires_with_its_ttl_and_is_not_sent_too_big() {
        let (p, cache) = (policy(), AnswerCache::default());
        let e = &p.exceptions[0];
        let t0 = Instant::now();
        let raw = query(1, 0x0100, "www.example.test", 1, Some(1232));
        let q = codec::parse(&raw).unwrap();
        let key = Key::new(&q, Some(e));
        let bytes = answer(&raw, 5);
        cache.store(&p, &key, &bytes, 5, t0);
        let mut out = Vec::new();
        let small = u16::try_from(bytes.len() - 1).unwrap();
        assert!(cache.answer(&p, &key, &q, small, t0, &mut out).is_none());
        let just = t0 + Duration::from_secs(4);
        assert!(cache.answer(&p, &key, &q, 4096, just, &mut out).is_some());
        let m = Message::from_vec(&out).unwrap();
        assert!(m.answers.iter().all(|r| r.ttl == 1), "{:?}", m.answers);
        // Under a whole second left counts as gone, as in the resolver's
        // cache: a TTL of 0 would not be kept by the client either.
        let gone = t0 + Duration::from_millis(4_500);
        assert!(cache.answer(&p, &key, &q, 4096, gone, &mut out).is_none());
        assert_eq!(cache.len(), 0, "the expired answer left");
        cache.store(&p, &key, &bytes, 0, t0);
        assert_eq!(cache.len(), 0, "a zero TTL is not kept");
    }

    #[test]
    fn a_reload_empties_it() {
        let (p, cache) = (policy(), AnswerCache::default());
        let t0 = Instant::now();
        let raw = query(1, 0x0100, "www.example.test", 1, None);
        let q = codec::parse(&raw).unwrap();
        let key = Key::new(&q, Some(&p.exceptions[0]));
        cache.store(&p, &key, &answer(&raw, 60), 60, t0);
        let mut out = Vec::new();
        assert!(cache.answer(&p, &key, &q, 512, t0, &mut out).is_some());
        // The same policy text, reloaded: another snapshot.
        let reloaded = policy();
        let key2 = Key::new(&q, Some(&reloaded.exceptions[0]));
        assert!(cache
            .answer(&reloaded, &key2, &q, 512, t0, &mut out)
            .is_none());
        assert_eq!(cache.len(), 0);
        // Even when the old snapshot's key is asked under the new one.
        assert!(cache
            .answer(&reloaded, &key, &q, 512, t0, &mut out)
            .is_none());
        drop(p);
        // A snapshot made after the old one was dropped is a new one too.
        cache.store(&reloaded, &key2, &answer(&raw, 60), 60, t0);
        let third = policy();
        let key3 = Key::new(&q, Some(&third.exceptions[0]));
        assert!(cache.answer(&third, &key3, &q, 512, t0, &mut out).is_none());
    }

    #[test]
    fn it_stays_bounded() {
        let (p, cache) = (policy(), AnswerCache::default());
        let e = &p.exceptions[0];
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES + 10 {
            let raw = query(1, 0, &format!("n{i}.example.test"), 1, None);
            let q = codec::parse(&raw).unwrap();
            cache.store(&p, &Key::new(&q, Some(e)), &raw, 60, t0);
            assert!(cache.len() <= MAX_ENTRIES);
        }
    }

    #[test]
    fn ttls_are_found_past_names_and_pointers() {
        let raw = query(1, 0x0100, "www.example.test", 1, Some(1232));
        let bytes = answer(&raw, 77);
        let at = ttl_offsets(&bytes).unwrap();
        assert_eq!(at.len(), 2);
        for a in at {
            let a = usize::from(a);
            assert_eq!(&bytes[a..a + 4], &77u32.to_be_bytes());
        }
        assert!(ttl_offsets(&bytes[..bytes.len() - 20]).is_none());
        assert!(ttl_offsets(&[0; 5]).is_none());
    }
}
