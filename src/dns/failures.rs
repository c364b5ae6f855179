//! Resolution failures, remembered for a while (RFC 9520).
//!
//! When every upstream failed for a (name, type) — SERVFAIL, REFUSED, no
//! answer in time, garbage — the next queries for it get that failure back
//! without asking again, until the hold ends. A zone that refuses AAAA, or
//! an upstream that is down, then costs one upstream resolution per hold
//! rather than one per query (each of which may wait the whole resolution
//! deadline). The first failure is held [`FIRST_HOLD`], the RFC's minimum;
//! a failure that follows the end of the last hold within [`MAX_HOLD`] is
//! held twice as long as that one, up to [`MAX_HOLD`]. That is below the
//! RFC's ceiling of five minutes, which bounds how long a name stays failed
//! after its upstream recovers. An answer (positive or negative) forgets
//! the name's failures.
//!
//! Bounded by [`MAX_ENTRIES`]: when full, entries whose backoff is over go
//! first, then those no longer held; a failure that still finds no room is
//! not remembered (the next query asks the upstreams again: more upstream
//! traffic, never a wrong answer).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::by_name::ByNameType;
use super::error::ResolveError;
use crate::policy::host::Host;

/// How long a first failure is held.
pub const FIRST_HOLD: Duration = Duration::from_secs(1);
/// The longest hold, and how long after a hold a new failure still counts
/// as consecutive (and doubles it).
pub const MAX_HOLD: Duration = Duration::from_secs(30);
/// (name, type) failures remembered at most.
pub const MAX_ENTRIES: usize = 10_000;

struct Held {
    error: ResolveError,
    until: Instant,
    hold: Duration,
}

impl Held {
    /// Whether this entry can still matter: held, or recent enough to
    /// double the next hold.
    fn live(&self, now: Instant) -> bool {
        now < self.until + MAX_HOLD
    }
}

/// The failures the resolver remembers. Only consulted on a cache miss.
#[derive(Default)]
pub(super) struct Failures {
    map: Mutex<ByNameType<Held>>,
}

impl Failures {
    fn lock(&self) -> MutexGuard<'_, ByNameType<Held>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The failure `host`/`qtype` is held with at `now`, if it is:
    /// [`ResolveError::Remembered`], saying when the upstreams will be asked
    /// again.
    pub(super) fn held(&self, host: &Host, qtype: u16, now: Instant) -> Option<ResolveError> {
        let m = self.lock();
        let h = m.get(host, qtype)?;
        let left = h
            .until
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())?;
        Some(ResolveError::Remembered(
            Box::new(h.error.clone()),
            left.as_millis().div_ceil(1000).max(1) as u64,
        ))
    }

    /// Remembers that `host`/`qtype` failed with `error` at `now`. Returns
    /// how long it is held, or `None` when there was no room.
    pub(super) fn fail(
        &self,
        host: &Host,
        qtype: u16,
        error: ResolveError,
        now: Instant,
    ) -> Option<Duration> {
        let mut m = self.lock();
        let previous = m.get(host, qtype);
        let hold = previous
            .filter(|h| h.live(now))
            .map_or(FIRST_HOLD, |p| (p.hold * 2).min(MAX_HOLD));
        if previous.is_none() {
            if m.len() >= MAX_ENTRIES {
                m.retain(|h| h.live(now));
            }
            if m.len() >= MAX_ENTRIES {
                m.retain(|h| h.until > now);
            }
            if m.len() >= MAX_ENTRIES {
                return None;
            }
        }
        let held = Held {
            error,
            until: now + hold,
            hold,
        };
        m.insert(host, qtype, held);
        Some(hold)
    }

    /// An answer came for `host`/`qtype`: its failures are forgotten.
    pub(super) fn succeeded(&self, host: &Host, qtype: u16) {
        let mut m = self.lock();
        if m.len() > 0 {
            m.remove(host, qtype);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::host::parse_host;
    use crate::policy::qtype;

    fn servfail() -> ResolveError {
        ResolveError::Upstream("127.0.0.1:53 answered SERVFAIL".into())
    }

    #[test]
    fn a_failure_is_held_then_asked_again() {
        let f = Failures::default();
        let h = parse_host("down.test").unwrap();
        let t0 = Instant::now();
        assert!(f.held(&h, qtype::A, t0).is_none());
        assert_eq!(f.fail(&h, qtype::A, servfail(), t0), Some(FIRST_HOLD));
        let e = f.held(&h, qtype::A, t0).expect("held");
        assert_eq!(e, ResolveError::Remembered(Box::new(servfail()), 1));
        assert!(e.to_string().contains("SERVFAIL"), "{e}");
        // Only that type: the name's A failed, its AAAA was not asked.
        assert!(f.held(&h, qtype::AAAA, t0).is_none());
        assert!(f.held(&h, qtype::A, t0 + FIRST_HOLD).is_none());
    }

    #[test]
    fn consecutive_failures_double_the_hold_up_to_the_ceiling() {
        let f = Failures::default();
        let h = parse_host("down.test").unwrap();
        let mut now = Instant::now();
        let mut holds = Vec::new();
        for _ in 0..8 {
            let hold = f.fail(&h, qtype::A, servfail(), now).unwrap();
            holds.push(hold.as_secs());
            // Asked again as soon as the hold ends, and failed again.
            now += hold;
        }
        assert_eq!(holds, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(f.fail(&h, qtype::A, servfail(), now), Some(MAX_HOLD));
        // What a client is told is the time left, rounded up.
        match f.held(&h, qtype::A, now + Duration::from_millis(100)) {
            Some(ResolveError::Remembered(_, left)) => assert_eq!(left, 30),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failure_long_after_the_last_starts_over_and_an_answer_forgets() {
        let f = Failures::default();
        let h = parse_host("flaky.test").unwrap();
        let t0 = Instant::now();
        f.fail(&h, qtype::A, servfail(), t0);
        let t1 = t0 + FIRST_HOLD;
        assert_eq!(f.fail(&h, qtype::A, servfail(), t1), Some(2 * FIRST_HOLD));
        // Quiet for longer than MAX_HOLD after that hold: a fresh start.
        let t2 = t1 + 2 * FIRST_HOLD + MAX_HOLD;
        assert_eq!(f.fail(&h, qtype::A, servfail(), t2), Some(FIRST_HOLD));
        f.fail(&h, qtype::AAAA, servfail(), t2);
        assert_eq!(f.len(), 2);
        f.succeeded(&h, qtype::A);
        assert!(f.held(&h, qtype::A, t2).is_none());
        assert!(f.held(&h, qtype::AAAA, t2).is_some());
        // The next failure after an answer is a first failure again.
        assert_eq!(f.fail(&h, qtype::A, servfail(), t2), Some(FIRST_HOLD));
    }

    #[test]
    fn the_memory_is_bounded_and_old_entries_make_room() {
        let f = Failures::default();
        let t0 = Instant::now();
        let name = |i: usize| parse_host(&format!("n{i}.down.test")).unwrap();
        for i in 0..MAX_ENTRIES {
            assert!(f.fail(&name(i), qtype::A, servfail(), t0).is_some());
        }
        // Full, and every entry still held: the next is not remembered.
        assert_eq!(f.fail(&name(MAX_ENTRIES), qtype::A, servfail(), t0), None);
        assert!(f.held(&name(MAX_ENTRIES), qtype::A, t0).is_none());
        assert_eq!(f.len(), MAX_ENTRIES);
        // Once the holds are over, the old entries give way.
        let later = t0 + FIRST_HOLD;
        assert!(f
            .fail(&name(MAX_ENTRIES), qtype::A, servfail(), later)
            .is_some());
        assert_eq!(f.len(), 1);
        assert!(f.held(&name(MAX_ENTRIES), qtype::A, later).is_some());
    }
}
