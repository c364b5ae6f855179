//! `upload:` budgets (DESIGN "Writes on allowed hosts"): per client and
//! per exception, the bytes a client sent upstream in a sliding window of
//! `per`. PURE: the time is a parameter, nothing is logged or counted here.
//!
//! A ledger belongs to an exception *id*, not to one compiled policy: a
//! reload that keeps the exception hands the new policy the ledger the old
//! one charged (`Policy::share_upload_ledgers`), so a budget cannot be
//! reset by touching a policy file. What the window holds: at most
//! [`STEPS`] entries per client, each the bytes charged during one step of
//! `per / STEPS` (at least a second); an entry leaves the window once its
//! step started `per` ago. The window therefore slides in steps of
//! `per / 64`, and what it forgets at once is at most one step's bytes.
//!
//! Memory is bounded: [`MAX_CLIENTS`] windows per exception. A new client
//! past that bound (every window still holding bytes) is refused rather
//! than let through uncounted (fail closed).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Steps a window is kept in.
pub const STEPS: u64 = 64;
/// Clients one exception's ledger keeps a window for at once.
pub const MAX_CLIENTS: usize = 65_536;
/// Longest `per` a policy may set.
pub const MAX_PER_SECS: u64 = 30 * 86_400;

/// `upload:` on an exception, compiled: the budget and the ledger it is
/// charged to.
#[derive(Debug, Clone)]
pub struct UploadRule {
    /// Bytes a client may send per window.
    pub bytes: u64,
    /// The window, in seconds.
    pub per_secs: u64,
    ledger: Arc<UploadLedger>,
}

/// Why bytes were not charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// They would take the window past the budget; `used` is what it holds.
    Crossed { used: u64 },
    /// Every one of [`MAX_CLIENTS`] windows holds bytes: no room for a new
    /// client's.
    Full,
}

impl UploadRule {
    pub fn new(bytes: u64, per_secs: u64) -> UploadRule {
        UploadRule {
            bytes,
            per_secs,
            ledger: Arc::default(),
        }
    }

    /// The ledger this rule charges, to hand to the next policy.
    pub fn ledger(&self) -> &Arc<UploadLedger> {
        &self.ledger
    }

    /// Charges `ledger` from now on (a reload that kept the exception).
    pub fn share(&mut self, ledger: Arc<UploadLedger>) {
        self.ledger = ledger;
    }

    fn step(&self) -> i64 {
        (self.per_secs / STEPS).max(1) as i64
    }

    /// What `client`'s window holds at `now` (unix seconds).
    pub fn used(&self, client: &str, now: i64) -> u64 {
        let mut w = self.ledger.lock();
        match w.get_mut(client) {
            Some(win) => win.expire(now, self.per_secs as i64),
            None => 0,
        }
    }

    /// Charges `n` bytes to `client`'s window if they fit the budget, and
    /// returns what the window then holds.
    pub fn charge(&self, client: &str, n: u64, now: i64) -> Result<u64, Refused> {
        self.charge_as(client, n, now, false)
    }

    /// Charges `n` bytes even past the budget (report mode: the crossing
    /// is logged, the bytes still go); `Full` is still refused.
    pub fn charge_anyway(&self, client: &str, n: u64, now: i64) -> Result<u64, Refused> {
        self.charge_as(client, n, now, true)
    }

    fn charge_as(&self, client: &str, n: u64, now: i64, anyway: bool) -> Result<u64, Refused> {
        let per = self.per_secs as i64;
        let mut w = self.ledger.lock();
        if !w.contains_key(client) {
            if w.len() >= MAX_CLIENTS {
                w.retain(|_, win| win.expire(now, per) > 0);
            }
            if w.len() >= MAX_CLIENTS {
                return Err(Refused::Full);
            }
            w.insert(client.into(), Window::default());
        }
        let win = w.get_mut(client).expect("inserted above");
        let used = win.expire(now, per);
        let after = used.saturating_add(n);
        if after > self.bytes && !anyway {
            return Err(Refused::Crossed { used });
        }
        win.add(now, n, self.step());
        Ok(after)
    }
}

/// The windows of one exception's clients.
#[derive(Debug, Default)]
pub struct UploadLedger {
    windows: Mutex<HashMap<Box<str>, Window>>,
}

impl UploadLedger {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Window>> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Clients with a window (for tests and bounds).
    pub fn clients(&self) -> usize {
        self.lock().len()
    }
}

/// A size as a policy writes it (`10MiB`), when it is a whole number of
/// a unit; bytes (`1500B`) otherwise.
pub fn size_text(n: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= size && n % size == 0 {
            return format!("{}{unit}", n / size);
        }
    }
    format!("{n}B")
}

/// A window as a policy writes it (`1h`).
pub fn window_text(s: u64) -> String {
    for (unit, size) in [("d", 86_400u64), ("h", 3600), ("m", 60)] {
        if s >= size && s % size == 0 {
            return format!("{}{unit}", s / size);
        }
    }
    format!("{s}s")
}

/// One client's window: (step start, bytes) oldest first, and their sum.
#[derive(Debug, Default)]
struct Window {
    steps: VecDeque<(i64, u64)>,
    total: u64,
}

impl Window {
    /// Drops the steps that started `per` or more before `now`; returns
    /// what is left.
    fn expire(&mut self, now: i64, per: i64) -> u64 {
        while let Some(&(t, b)) = self.steps.front() {
            if t + per > now {
                break;
            }
            self.steps.pop_front();
            self.total -= b;
        }
        self.total
    }

    fn add(&mut self, now: i64, n: u64, step: i64) {
        match self.steps.back_mut() {
            Some((t, b)) if now < *t + step => *b += n,
            _ => {
                self.steps.push_back((now, n));
                // Never more than STEPS entries: a clock that jumps merges
                // into the newest.
                while self.steps.len() > STEPS as usize + 1 {
                    let (_, b) = self.steps.pop_front().expect("longer than STEPS");
                    if let Some((_, next)) = self.steps.front_mut() {
                        *next += b;
                    }
                }
            }
        }
        self.total += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_windows_read_as_written() {
        assert_eq!(size_text(10 << 20), "10MiB");
        assert_eq!(size_text(1500), "1500B");
        assert_eq!(window_text(3600), "1h");
        assert_eq!(window_text(90), "90s");
    }

    #[test]
    fn a_budget_holds_per_client_and_slides() {
        let r = UploadRule::new(100, 3600);
        assert_eq!(r.charge("a", 60, 1000), Ok(60));
        assert_eq!(r.charge("a", 40, 1001), Ok(100));
        assert_eq!(r.charge("a", 1, 1002), Err(Refused::Crossed { used: 100 }));
        // Another client has its own window.
        assert_eq!(r.charge("b", 100, 1002), Ok(100));
        // Not yet an hour after the first bytes: still full.
        assert_eq!(r.charge("a", 1, 4599), Err(Refused::Crossed { used: 100 }));
        // The step of the first 100 bytes (started at 1000, 56 s long) left.
        assert_eq!(r.used("a", 4600), 0);
        assert_eq!(r.charge("a", 100, 4600), Ok(100));
    }

    #[test]
    fn the_window_slides_in_steps() {
        let r = UploadRule::new(1000, 640); // steps of 10 s
        r.charge("a", 100, 0).unwrap();
        r.charge("a", 100, 9).unwrap(); // same step
        r.charge("a", 100, 10).unwrap(); // next step
        assert_eq!(r.used("a", 639), 300);
        assert_eq!(r.used("a", 640), 100);
        assert_eq!(r.used("a", 650), 0);
    }

    #[test]
    fn report_mode_charges_past_the_budget() {
        let r = UploadRule::new(10, 60);
        assert_eq!(r.charge_anyway("a", 15, 0), Ok(15));
        assert_eq!(r.charge("a", 1, 1), Err(Refused::Crossed { used: 15 }));
    }

    #[test]
    fn a_shared_ledger_keeps_the_count() {
        let old = UploadRule::new(100, 3600);
        old.charge("a", 90, 0).unwrap();
        let mut new = UploadRule::new(100, 3600);
        new.share(old.ledger().clone());
        assert_eq!(new.charge("a", 20, 1), Err(Refused::Crossed { used: 90 }));
    }

    #[test]
    fn windows_are_bounded_and_full_fails_closed() {
        let r = UploadRule::new(10, 60);
        for i in 0..MAX_CLIENTS {
            r.charge(&i.to_string(), 1, 0).unwrap();
        }
        assert_eq!(r.charge("new", 1, 1), Err(Refused::Full));
        // Once the others' windows are empty, they make room.
        assert_eq!(r.charge("new", 1, 60), Ok(1));
        assert_eq!(r.ledger().clients(), 1);
    }

    #[test]
    fn a_jumping_clock_keeps_the_total() {
        let r = UploadRule::new(u64::MAX, 64 * 86_400);
        for t in 0..200 {
            r.charge("a", 1, t * 86_400 / 64 * 2).unwrap();
        }
        let w = r.ledger().lock();
        let win = &w["a"];
        assert!(win.steps.len() <= STEPS as usize + 1);
        assert_eq!(win.steps.iter().map(|s| s.1).sum::<u64>(), win.total);
    }
}
