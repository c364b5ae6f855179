//! Lifetimes: one [`Shutdown`] signal that every accept loop, the DNS
//! server, the metrics endpoint and the reloader stop on, and the
//! [`Permits`] that bound what is open at once, in all and per
//! [`Holder`] (each client's share), and let a drain wait until nothing is
//! (rather than polling a gauge).
//!
//! A bottom-layer module like `time`: it imports nothing of the crate. It
//! owns no timeout; how long a drain may take is the caller's (`app`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

/// The stop signal, as the tasks that obey it hold it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// What fires the signal (`app`, on SIGTERM/SIGINT or `Running::shutdown`).
/// Dropping it fires it too: nothing may outlive the one who could stop it.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Shutdown {
    /// A signal not fired yet, and its trigger.
    pub fn new() -> (Trigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (Trigger(tx), Shutdown(rx))
    }

    /// Whether the signal has fired (or its trigger is gone).
    pub fn is_fired(&self) -> bool {
        *self.0.borrow() || self.0.has_changed().is_err()
    }

    /// Resolves once the signal fires (at once if it has), or once its
    /// trigger is gone. Cancel-safe: fit for a `select!` loop.
    pub async fn fired(&mut self) {
        loop {
            if *self.0.borrow_and_update() {
                return;
            }
            if self.0.changed().await.is_err() {
                return;
            }
        }
    }
}

/// A `watch` channel whose `true` means stop (what tasks were given before
/// this type; tests still drive the DNS server this way).
impl From<watch::Receiver<bool>> for Shutdown {
    fn from(rx: watch::Receiver<bool>) -> Shutdown {
        Shutdown(rx)
    }
}

impl Trigger {
    /// Fires the signal: every holder's [`Shutdown::fired`] resolves.
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}

/// A bound on things open at once (client connections, DNS queries), each
/// held as a [`Permit`] for as long as it lives, and on how many of them
/// one [`Holder`] holds.
///
/// The bound on all is shared fairly ([`Permits::try_admit`]): when it is
/// full, a holder under its share still gets a slot, reclaimed from the
/// holder that holds the most (an idle one of its permits first), so a few
/// holders cannot keep the total to themselves.
#[derive(Clone, Debug)]
pub struct Permits {
    sem: Arc<Semaphore>,
    max: u32,
    shares: Arc<Shares>,
}

/// Who a permit counts against besides the bound on all: a named client,
/// or a source address (an IPv6 one by its /64, what one host can usually
/// pick addresses from).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    Named(Arc<str>),
    Addr(IpAddr),
}

impl Holder {
    /// The holder for source address `ip` (an IPv4-mapped address is its
    /// IPv4 address).
    pub fn addr(ip: IpAddr) -> Holder {
        Holder::Addr(match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            },
            v4 => v4,
        })
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Named(id) => write!(f, "client {id}"),
            Holder::Addr(ip) => write!(f, "address {ip}"),
        }
    }
}

/// Permits held per holder.
#[derive(Debug, Default)]
struct Shares(Mutex<HashMap<Holder, Share>>);

/// One holder's share: how many permits count against it, and the live
/// ones it was the first holder of (those a reclaim may take).
#[derive(Debug, Default)]
struct Share {
    n: u32,
    first_of: Vec<Weak<Held>>,
}

impl Shares {
    fn lock(&self) -> MutexGuard<'_, HashMap<Holder, Share>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Takes `held` off `holder`'s count in `map` (and off its reclaimable
/// list), dropping the entry once it is empty.
fn uncount(map: &mut HashMap<Holder, Share>, holder: Holder, held: *const Held) {
    if let std::collections::hash_map::Entry::Occupied(mut e) = map.entry(holder) {
        let share = e.get_mut();
        share.n = share.n.saturating_sub(1);
        share.first_of.retain(|w| w.as_ptr() != held);
        if share.n == 0 {
            e.remove();
        }
    }
}

/// One open thing's share of [`Permits`]. Clones share the one share: it
/// is released when the last clone goes, so a connection that hands its
/// socket to another task (an upgraded tunnel) hands a clone with it.
#[derive(Clone, Debug)]
pub struct Permit {
    share: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    /// Its slot of the bound on all; handed to another permit when this
    /// one is reclaimed.
    global: Mutex<Option<OwnedSemaphorePermit>>,
    shares: Arc<Shares>,
    /// The holders this permit counts against (one or two).
    holders: Mutex<Vec<Holder>>,
    /// Tasks that close what this permit holds once it is reclaimed
    /// ([`Permit::reclaimed`]): only a watched permit may be reclaimed.
    watchers: AtomicU32,
    /// Work in progress on it ([`Permit::busy`]): an idle permit (none)
    /// is reclaimed before a busy one.
    busy: AtomicU32,
    reclaimed: AtomicBool,
    wake: Notify,
}

impl Held {
    fn new(global: OwnedSemaphorePermit, shares: Arc<Shares>) -> Arc<Held> {
        Arc::new(Held {
            global: Mutex::new(Some(global)),
            shares,
            holders: Mutex::new(Vec::new()),
            watchers: AtomicU32::new(0),
            busy: AtomicU32::new(0),
            reclaimed: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let holders = std::mem::take(self.holders.get_mut().unwrap_or_else(|e| e.into_inner()));
        let me = self as *const Held;
        let mut map = self.shares.lock();
        for h in holders {
            uncount(&mut map, h, me);
        }
    }
}

impl Permit {
    /// Counts this permit (and its clones) against `holder`'s share too,
    /// of which at most `max` may be held: `false`, and nothing counted,
    /// when the share is full. Counting against a holder it already counts
    /// against is a no-op.
    pub fn count_against(&self, holder: Holder, max: u32) -> bool {
        let mut holders = self.share.holders.lock().unwrap_or_else(|e| e.into_inner());
        if holders.contains(&holder) {
            return true;
        }
        if self.share.reclaimed.load(Ordering::Acquire) {
            return false;
        }
        let mut map = self.share.shares.lock();
        let share = map.entry(holder.clone()).or_default();
        if share.n >= max {
            if share.n == 0 {
                map.remove(&holder);
            }
            return false;
        }
        share.n += 1;
        if holders.is_empty() {
            share.first_of.push(Arc::downgrade(&self.share));
        }
        holders.push(holder);
        true
    }

    /// Resolves once this permit was reclaimed for another holder
    /// ([`Permits::try_admit`]); meanwhile (while this future lives) the
    /// permit may be. What holds it should then close and say why.
    pub async fn reclaimed(&self) {
        struct Watching<'a>(&'a AtomicU32);
        impl Drop for Watching<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.share.watchers.fetch_add(1, Ordering::AcqRel);
        let _w = Watching(&self.share.watchers);
        loop {
            let woken = self.share.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.share.reclaimed.load(Ordering::Acquire) {
                return;
            }
            woken.await;
        }
    }

    /// Marks the permit busy (work in progress: a query or a request
    /// being answered) until the guard goes; a reclaim takes idle permits
    /// first.
    pub fn busy(&self) -> Busy {
        self.share.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.share.clone())
    }
}

/// A permit marked busy ([`Permit::busy`]).
pub struct Busy(Arc<Held>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What [`Permits::try_admit`] gave.
#[derive(Debug)]
pub enum Admission {
    /// A free slot.
    Admitted(Permit),
    /// The bound on all was full: the slot was taken from `from`, which
    /// held `held` (the most), and the permit that had it told to close.
    Reclaimed {
        permit: Permit,
        from: Holder,
        held: u32,
    },
    /// The holder already holds `max`, its share.
    OverShare,
    /// The bound on all is full and no holder holds more than this one
    /// (by two or more): nothing to reclaim fairly.
    Full,
}

/// One more count against each holder a [`Permit`] counts against, for
/// something its connection holds on its client's behalf (an HTTP/2
/// stream and its upstream connection); released when dropped.
#[derive(Debug)]
pub struct Extra {
    shares: Arc<Shares>,
    holders: Vec<Holder>,
}

impl Drop for Extra {
    fn drop(&mut self) {
        let mut map = self.shares.lock();
        for h in self.holders.drain(..) {
            if let std::collections::hash_map::Entry::Occupied(mut n) = map.entry(h) {
                let share = n.get_mut();
                share.n = share.n.saturating_sub(1);
                if share.n == 0 {
                    n.remove();
                }
            }
        }
    }
}

impl Permit {
    /// One more count against every holder this permit counts against,
    /// each of which may hold at most `max`: `None`, and nothing counted,
    /// when any of them is full.
    pub fn count_more(&self, max: u32) -> Option<Extra> {
        let holders = self
            .share
            .holders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut map = self.share.shares.lock();
        if holders.iter().any(|h| map.get(h).map_or(0, |s| s.n) >= max) {
            return None;
        }
        for h in &holders {
            map.entry(h.clone()).or_default().n += 1;
        }
        Some(Extra {
            shares: self.share.shares.clone(),
            holders,
        })
    }
}

impl Permits {
    pub fn new(max: u32) -> Permits {
        Permits {
            sem: Arc::new(Semaphore::new(max as usize)),
            max,
            shares: Arc::default(),
        }
    }

    /// The bound on all.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Waits for a free share of the bound on all, counted against no
    /// holder yet.
    pub async fn acquire(&self) -> Permit {
        let p = self
            .sem
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        Permit {
            share: Held::new(p, self.shares.clone()),
        }
    }

    /// A slot for `holder` if one is free and it holds fewer than `max`;
    /// never waits, never reclaims.
    pub fn try_acquire(&self, holder: Holder, max: u32) -> Option<Permit> {
        let p = self.sem.clone().try_acquire_owned().ok()?;
        let permit = Permit {
            share: Held::new(p, self.shares.clone()),
        };
        permit.count_against(holder, max).then_some(permit)
    }

    /// Whether [`Permits::try_acquire`] would give a slot now, without
    /// taking one. With nothing held by anyone it makes no holder (`who`
    /// is not called) and hashes nothing.
    pub fn has_room(&self, who: impl FnOnce() -> Holder, max: u32) -> bool {
        if self.sem.available_permits() == 0 {
            return false;
        }
        let map = self.shares.lock();
        if map.is_empty() {
            return true;
        }
        map.get(&who()).map_or(0, |s| s.n) < max
    }

    /// A slot for `holder`, at most `max` of them, shared fairly: when the
    /// bound on all is full, the holder that holds the most (at least two
    /// more than `holder`) gives up one permit, an idle one if it has one.
    /// Only permits whose holder watches for it ([`Permit::reclaimed`])
    /// are taken; the one taken is told at once, and its slot is
    /// `holder`'s from now on.
    pub fn try_admit(&self, holder: Holder, max: u32) -> Admission {
        let mut map = self.shares.lock();
        let held = map.get(&holder).map_or(0, |s| s.n);
        if held >= max {
            return Admission::OverShare;
        }
        let (global, reclaimed) = match self.sem.clone().try_acquire_owned() {
            Ok(p) => (p, None),
            Err(_) => match reclaim(&mut map, &holder, held) {
                Some((p, from, n)) => (p, Some((from, n))),
                None => return Admission::Full,
            },
        };
        drop(map);
        let permit = Permit {
            share: Held::new(global, self.shares.clone()),
        };
        let counted = permit.count_against(holder, max);
        debug_assert!(counted, "checked under the lock; a race only adds one");
        match reclaimed {
            None => Admission::Admitted(permit),
            Some((from, held)) => Admission::Reclaimed { permit, from, held },
        }
    }

    /// How many are held now.
    pub fn in_use(&self) -> usize {
        self.max as usize - self.sem.available_permits()
    }

    /// How many `holder` holds now.
    pub fn held_by(&self, holder: &Holder) -> u32 {
        self.shares.lock().get(holder).map_or(0, |s| s.n)
    }

    /// Resolves once no permit is held (every one released). New permits
    /// can be taken again afterwards.
    pub async fn drained(&self) {
        let all = self
            .sem
            .acquire_many(self.max)
            .await
            .expect("the semaphore is never closed");
        drop(all);
    }
}

/// Takes a slot from the holder in `map` that holds the most, if it holds
/// at least two more than `held` (what `holder` holds): its idle watched
/// permit if it has one, else a busy watched one. That permit is told it
/// was reclaimed and stops counting against anyone. The slot, the holder
/// it came from and what that holder held.
fn reclaim(
    map: &mut HashMap<Holder, Share>,
    holder: &Holder,
    held: u32,
) -> Option<(OwnedSemaphorePermit, Holder, u32)> {
    let mut order: Vec<(&Holder, u32)> = map
        .iter()
        .filter(|(h, s)| *h != holder && s.n > held + 1)
        .map(|(h, s)| (h, s.n))
        .collect();
    order.sort_unstable_by_key(|(_, n)| std::cmp::Reverse(*n));
    let (victim, from, n) = order.iter().find_map(|(h, n)| {
        let live: Vec<Arc<Held>> = map[*h]
            .first_of
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|p| p.watchers.load(Ordering::Acquire) > 0)
            .collect();
        let pick = live
            .iter()
            .find(|p| p.busy.load(Ordering::Acquire) == 0)
            .or(live.first())?;
        Some((pick.clone(), (*h).clone(), *n))
    })?;
    // The victim's own lock: taken without waiting (a `count_against` on
    // it holds it and waits for `map`), else it is not taken this time.
    let mut holders = victim.holders.try_lock().ok()?;
    let global = victim
        .global
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()?;
    victim.reclaimed.store(true, Ordering::Release);
    for h in std::mem::take(&mut *holders) {
        uncount(map, h, Arc::as_ptr(&victim));
    }
    drop(holders);
    victim.wake.notify_waiters();
    Some((global, from, n))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn fired_resolves_for_every_holder_and_after_the_fact() {
        let (trigger, mut a) = Shutdown::new();
        let mut b = a.clone();
        assert!(!a.is_fired());
        let waiting = tokio::spawn(async move { b.fired().await });
        trigger.fire();
        a.fired().await;
        waiting.await.unwrap();
        assert!(a.is_fired());
        a.fired().await; // again: at once
    }

    #[tokio::test]
    async fn a_dropped_trigger_stops_too() {
        let (trigger, mut s) = Shutdown::new();
        drop(trigger);
        tokio::time::timeout(Duration::from_secs(5), s.fired())
            .await
            .expect("fired once the trigger is gone");
    }

    #[tokio::test]
    async fn a_drain_waits_for_the_last_clone_of_each_permit() {
        let permits = Permits::new(4);
        let p = permits.acquire().await;
        let handed_on = p.clone();
        drop(p);
        assert_eq!(permits.in_use(), 1, "a clone still holds the share");
        let drain = permits.clone();
        let drained = tokio::spawn(async move { drain.drained().await });
        tokio::task::yield_now().await;
        assert!(!drained.is_finished());
        drop(handed_on);
        tokio::time::timeout(Duration::from_secs(5), drained)
            .await
            .expect("drained once the last clone went")
            .unwrap();
        assert_eq!(permits.in_use(), 0);
    }

    #[tokio::test]
    async fn a_share_bounds_one_holder_until_the_last_clone_goes() {
        let permits = Permits::new(16);
        let a = Holder::addr("127.0.0.2".parse().unwrap());
        let b = Holder::Named("b".into());
        let first = permits.acquire().await;
        assert!(first.count_against(a.clone(), 2));
        assert!(first.count_against(a.clone(), 2), "again: a no-op");
        let second = permits.acquire().await;
        assert!(second.count_against(a.clone(), 2));
        let third = permits.acquire().await;
        assert!(!third.count_against(a.clone(), 2), "a's share is full");
        assert!(third.count_against(b.clone(), 2), "b is not affected");
        assert_eq!(permits.held_by(&a), 2);
        let handed_on = first.clone();
        drop(first);
        assert_eq!(permits.held_by(&a), 2, "a clone still holds it");
        drop(handed_on);
        assert_eq!(permits.held_by(&a), 1);
        assert!(permits.acquire().await.count_against(a.clone(), 2));
        drop((second, third));
        assert_eq!((permits.held_by(&a), permits.held_by(&b)), (0, 0));
        assert_eq!(permits.in_use(), 0);
    }

    /// A full bound on all still admits a holder under its share: the
    /// holder with the most gives up an idle permit (not a busy one, not
    /// an unwatched one), which is told; a holder as small as the
    /// newcomer is never taken from.
    #[tokio::test]
    async fn a_full_total_is_reclaimed_from_the_largest_holder_idle_first() {
        let permits = Permits::new(4);
        let (big, small, new) = (
            Holder::addr("127.0.0.2".parse().unwrap()),
            Holder::addr("127.0.0.3".parse().unwrap()),
            Holder::addr("127.0.0.4".parse().unwrap()),
        );
        let admitted = |a: Admission| match a {
            Admission::Admitted(p) => p,
            other => panic!("{other:?}"),
        };
        let b: Vec<Permit> = (0..3)
            .map(|_| admitted(permits.try_admit(big.clone(), 16)))
            .collect();
        let s = admitted(permits.try_admit(small.clone(), 16));
        // Nobody watches yet: nothing can be reclaimed.
        assert!(matches!(
            permits.try_admit(new.clone(), 16),
            Admission::Full
        ));
        let busy = b[0].busy();
        let mut watch: Vec<_> = b
            .iter()
            .chain([&s])
            .map(|p| {
                let p = p.clone();
                tokio::spawn(async move { p.reclaimed().await })
            })
            .collect();
        tokio::task::yield_now().await;
        while b
            .iter()
            .chain([&s])
            .any(|p| p.share.watchers.load(Ordering::Acquire) == 0)
        {
            tokio::task::yield_now().await;
        }
        let got = match permits.try_admit(new.clone(), 16) {
            Admission::Reclaimed { permit, from, held } => {
                assert_eq!((from, held), (big.clone(), 3));
                permit
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(permits.in_use(), 4, "the slot changed hands");
        assert_eq!((permits.held_by(&big), permits.held_by(&new)), (2, 1));
        assert!(!b[0].share.reclaimed.load(Ordering::Acquire), "busy kept");
        let taken = b
            .iter()
            .position(|p| p.share.reclaimed.load(Ordering::Acquire))
            .expect("an idle one was taken");
        tokio::time::timeout(Duration::from_secs(5), &mut watch[taken])
            .await
            .expect("the reclaimed permit was told")
            .unwrap();
        drop(busy);
        // big holds 2, the next newcomer 0: one more is taken from big; then
        // big, small and the newcomers hold 1 or 2 each and nobody gives.
        let another = Holder::addr("127.0.0.5".parse().unwrap());
        let kept = permits.try_admit(another.clone(), 16);
        assert!(matches!(kept, Admission::Reclaimed { .. }), "{kept:?}");
        let last = Holder::addr("127.0.0.6".parse().unwrap());
        assert!(matches!(permits.try_admit(last, 16), Admission::Full));
        // Over its own share, whatever the total.
        assert!(matches!(
            permits.try_admit(new.clone(), 1),
            Admission::OverShare
        ));
        drop((b, s, got, kept));
        for (i, w) in watch.into_iter().enumerate() {
            w.abort();
            if i != taken {
                let _ = w.await;
            }
        }
        assert_eq!(permits.held_by(&big), 0);
        assert_eq!(permits.in_use(), 0);
    }

    #[test]
    fn an_ipv6_holder_is_its_64_and_a_mapped_address_its_ipv4() {
        let h = |s: &str| Holder::addr(s.parse().unwrap());
        assert_eq!(h("2001:db8::1"), h("2001:db8::ffff:2"));
        assert_ne!(h("2001:db8::1"), h("2001:db8:0:1::1"));
        assert_eq!(h("::ffff:10.0.0.1"), h("10.0.0.1"));
    }
}
