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
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

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

/// A bound on things open at once (client connections), each held as a
/// [`Permit`] for as long as it lives, and on how many of them one
/// [`Holder`] holds.
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

/// Permits held per holder.
#[derive(Debug, Default)]
struct Shares(Mutex<HashMap<Holder, u32>>);

impl Shares {
    fn lock(&self) -> MutexGuard<'_, HashMap<Holder, u32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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
    _global: OwnedSemaphorePermit,
    shares: Arc<Shares>,
    /// The holders this permit counts against (one or two).
    holders: Mutex<Vec<Holder>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let holders = std::mem::take(self.holders.get_mut().unwrap_or_else(|e| e.into_inner()));
        let mut map = self.shares.lock();
        for h in holders {
            if let std::collections::hash_map::Entry::Occupied(mut n) = map.entry(h) {
                *n.get_mut() -= 1;
                if *n.get() == 0 {
                    n.remove();
                }
            }
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
        let mut map = self.share.shares.lock();
        let n = map.entry(holder.clone()).or_insert(0);
        if *n >= max {
            if *n == 0 {
                map.remove(&holder);
            }
            return false;
        }
        *n += 1;
        holders.push(holder);
        true
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
            share: Arc::new(Held {
                _global: p,
                shares: self.shares.clone(),
                holders: Mutex::new(Vec::new()),
            }),
        }
    }

    /// How many are held now.
    pub fn in_use(&self) -> usize {
        self.max as usize - self.sem.available_permits()
    }

    /// How many `holder` holds now.
    pub fn held_by(&self, holder: &Holder) -> u32 {
        self.shares.lock().get(holder).copied().unwrap_or(0)
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

    #[test]
    fn an_ipv6_holder_is_its_64_and_a_mapped_address_its_ipv4() {
        let h = |s: &str| Holder::addr(s.parse().unwrap());
        assert_eq!(h("2001:db8::1"), h("2001:db8::ffff:2"));
        assert_ne!(h("2001:db8::1"), h("2001:db8:0:1::1"));
        assert_eq!(h("::ffff:10.0.0.1"), h("10.0.0.1"));
    }
}
