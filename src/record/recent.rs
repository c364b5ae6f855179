//! The recent denials a grant could lift, kept in memory so that
//! `egressd grant ID` finds a denied request from the running egressd when
//! no log file holds it (the log on stdout, in a cluster's pipeline; DESIGN
//! "Grants"). Served as their decision-log lines on the metrics listener,
//! `/denials?id=ID`, to loopback peers only.
//!
//! Bounded: the last [`CAPACITY`] such denials that had their own line
//! (the per-client log rate bounds how fast one client can push others
//! out); older ones are in the log only.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::{Event, RequestId};
use crate::policy::grant::GRANTABLE;
use crate::policy::Logged;

/// Denials kept.
pub const CAPACITY: usize = 1024;

/// The ring of recent grantable denials of one egressd.
#[derive(Debug, Default)]
pub struct RecentDenials {
    lines: Mutex<VecDeque<(RequestId, Box<str>)>>,
}

impl RecentDenials {
    /// Keeps `ev`'s line (egressd's own format, whatever the log's) when it
    /// is a denial a grant could lift.
    pub fn note(&self, ev: &Event) {
        if ev.decision != Logged::Deny || !GRANTABLE.contains(&ev.reason) {
            return;
        }
        let mut line = Vec::with_capacity(512);
        ev.write_json(&mut line);
        while line.last() == Some(&b'\n') {
            line.pop();
        }
        let Ok(line) = String::from_utf8(line) else {
            return;
        };
        let mut q = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == CAPACITY {
            q.pop_front();
        }
        q.push_back((ev.id, line.into_boxed_str()));
    }

    /// The line of denied request `id`, if it is still kept.
    pub fn find(&self, id: &str) -> Option<String> {
        if !RequestId::looks_like(id) {
            return None;
        }
        let q = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        q.iter()
            .rev()
            .find(|(r, _)| r.as_bytes() == id.as_bytes())
            .map(|(_, l)| l.to_string())
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).len()
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
}
