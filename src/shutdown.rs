//! Lifetimes: one [`Shutdown`] signal that every accept loop, the DNS
//! server, the metrics endpoint and the reloader stop on, and the
//! [`Permits`] that bound what is open at once and let a drain wait until
//! nothing is (rather than polling a gauge).
//!
//! A bottom-layer module like `time`: it imports nothing of the crate. It
//! owns no timeout; how long a drain may take is the caller's (`app`).

use std::sync::Arc;

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
/// [`Permit`] for as long as it lives.
#[derive(Clone, Debug)]
pub struct Permits {
    sem: Arc<Semaphore>,
    max: u32,
}

/// One open thing's share of [`Permits`]. Clones share the one share: it
/// is released when the last clone goes, so a connection that hands its
/// socket to another task (an upgraded tunnel) hands a clone with it.
#[derive(Clone, Debug)]
pub struct Permit {
    _share: Arc<OwnedSemaphorePermit>,
}

impl Permits {
    pub fn new(max: u32) -> Permits {
        Permits {
            sem: Arc::new(Semaphore::new(max as usize)),
            max,
        }
    }

    /// Waits for a free share.
    pub async fn acquire(&self) -> Permit {
        let p = self
            .sem
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        Permit {
            _share: Arc::new(p),
        }
    }

    /// How many are held now.
    pub fn in_use(&self) -> usize {
        self.max as usize - self.sem.available_permits()
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
}
