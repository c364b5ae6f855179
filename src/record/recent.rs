//! The recent denials a grant could lift, kept in memory so that
//! `egressd grant ID` finds a denied request from the running egressd when
//! no log file holds it (the log on stdout, in a cluster's pipeline; DESIGN
//! "Grants"). Served as their decision-log lines on the metrics listener,
//! `/denials?id=ID`, to loopback peers only.
//!
//! Bounded: the last [`CAPACITY`] such denials that had their own line
//! (the per-client log rate bounds how fast one client can push others
//! out), in at most [`BYTES`] of lines; older ones are in the log only.
//! Kept without an allocation per denial (a denied DNS answer allocates
//! only its parsed name): the room is made at the first denial and reused.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::{Event, RequestId};
use crate::policy::grant::GRANTABLE;
use crate::policy::Logged;

/// Denials kept.
pub const CAPACITY: usize = 1024;
/// Room for their lines (a line is bounded by `rate::bound_fields`, a few
/// KiB at most; most are a few hundred bytes).
pub const BYTES: usize = 1 << 20;

/// The ring of recent grantable denials of one egressd.
#[derive(Debug, Default)]
pub struct RecentDenials {
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    /// The lines, one after another, wrapping to the start.
    bytes: Vec<u8>,
    /// Where the next line goes.
    next: usize,
    /// Each kept line's request and place in `bytes`, oldest first.
    lines: VecDeque<(RequestId, usize, usize)>,
    /// The line being written, its room reused.
    line: Vec<u8>,
}

impl Ring {
    fn push(&mut self, id: RequestId) {
        if self.bytes.is_empty() {
            self.bytes = vec![0; BYTES];
            self.lines = VecDeque::with_capacity(CAPACITY);
        }
        let len = self.line.len();
        if len > BYTES {
            return;
        }
        let mut at = self.next;
        if at + len > BYTES {
            // Wrap: the lines after `at` are the oldest; they go first.
            while self.lines.front().is_some_and(|&(_, s, _)| s >= at) {
                self.lines.pop_front();
            }
            at = 0;
        }
        while let Some(&(_, s, l)) = self.lines.front() {
            let overlaps = s < at + len && at < s + l;
            if !overlaps && self.lines.len() < CAPACITY {
                break;
            }
            self.lines.pop_front();
        }
        self.bytes[at..at + len].copy_from_slice(&self.line);
        self.lines.push_back((id, at, len));
        self.next = at + len;
    }
}

impl RecentDenials {
    /// Keeps `ev`'s line (egressd's own format, whatever the log's) when it
    /// is a denial a grant could lift.
    pub fn note(&self, ev: &Event) {
        if ev.decision != Logged::Deny || !GRANTABLE.contains(&ev.reason) {
            return;
        }
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut line = std::mem::take(&mut r.line);
        line.clear();
        ev.write_json(&mut line);
        while line.last() == Some(&b'\n') {
            line.pop();
        }
        r.line = line;
        r.push(ev.id);
    }

    /// The line of denied request `id`, if it is still kept.
    pub fn find(&self, id: &str) -> Option<String> {
        if !RequestId::looks_like(id) {
            return None;
        }
        let r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        r.lines
            .iter()
            .rev()
            .find(|(rid, _, _)| rid.as_bytes() == id.as_bytes())
            .map(|&(_, s, l)| String::from_utf8_lossy(&r.bytes[s..s + l]).into_owned())
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lines
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Proto, Reason};

    fn denied(reason: Reason) -> Event {
        let mut ev = Event::new(Proto::Http, "127.0.0.1:5000".parse().unwrap());
        ev.host = Some("api.example.test".into());
        ev.port = Some(80);
        ev.decision = Logged::Deny;
        ev.reason = reason;
        ev
    }

    #[test]
    fn keeps_grantable_denials_as_their_lines_and_forgets_the_oldest() {
        let ring = RecentDenials::default();
        let first = denied(Reason::NoException);
        ring.note(&first);
        let line = ring.find(&first.id.to_string()).expect("kept");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (&v["id"], &v["decision"], &v["host"]),
            (
                &first.id.to_string().into(),
                &"deny".into(),
                &"api.example.test".into()
            )
        );
        // A denial no grant can lift is not kept, nor an allowed request.
        let tunnel = denied(Reason::DnsTunnel);
        ring.note(&tunnel);
        let mut allowed = denied(Reason::Exception);
        allowed.decision = Logged::Allow;
        ring.note(&allowed);
        assert_eq!(ring.len(), 1);
        assert!(ring.find(&tunnel.id.to_string()).is_none());
        for _ in 0..CAPACITY {
            ring.note(&denied(Reason::NoException));
        }
        assert_eq!(ring.len(), CAPACITY);
        assert!(ring.find(&first.id.to_string()).is_none(), "pushed out");
        assert!(ring.find("not an id").is_none());
    }

    #[test]
    fn lines_stay_whole_as_the_room_wraps() {
        let ring = RecentDenials::default();
        let mut kept = Vec::new();
        // Lines of many lengths, far more bytes than the room holds.
        for i in 0..6000usize {
            let mut ev = denied(Reason::PathNotAllowed);
            ev.path = Some(format!("/{}", "p".repeat(i * 7 % 1900)));
            ring.note(&ev);
            kept.push((ev.id.to_string(), ev.path.clone().unwrap()));
        }
        assert!(ring.len() > 100 && ring.len() <= CAPACITY, "{}", ring.len());
        let mut found = 0;
        for (id, path) in kept.iter().rev().take(ring.len()) {
            let line = ring.find(id).expect("the newest are kept");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(
                (&v["id"], &v["path"]),
                (&id.as_str().into(), &path.as_str().into())
            );
            found += 1;
        }
        assert_eq!(found, ring.len());
        assert!(ring.find(&kept[0].0).is_none());
    }
}
