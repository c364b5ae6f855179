//! The serving step of `upload:` budgets (DESIGN "Writes on allowed
//! hosts"): what a client sends upstream under an exception with
//! `upload:` is charged to that client's window of it
//! (`policy::upload`), keyed by the named client, else the source address.
//!
//! - A request whose declared length (`Content-Length`, or a body already
//!   read whole) would cross the budget is refused before anything is
//!   forwarded: `429 upload_budget`.
//! - Any other body is charged frame by frame as it goes (`held`); the
//!   frame that would cross is not passed on, the request to the origin
//!   is aborted, and the client gets the same `429` if no answer had
//!   begun.
//! - A tunnel egressd does not look into is charged for every byte the
//!   client sends (its TLS bytes), copied in user space (`relay`), and cut
//!   at the read that would cross. Inside an intercepted connection every
//!   request is decided on its own, and its body is charged to the
//!   exception that allowed it.
//!
//! In `mode: report` nothing is refused or cut: the bytes are charged past
//! the budget and the line says it was crossed. Every line under a budget
//! carries `upload: {budget, used, crossed}`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use http::{header, Request};

use super::held::{Cap, Charge, ReqBody};
use super::respond::Stop;
use crate::policy::upload::{size_text as bytes, window_text as per, Refused, UploadRule};
use crate::policy::{Decision, Mode, Reason};
use crate::record::{Event, UploadLine};
use crate::time::unix_now;

/// One request's or connection's view of its client's budget under the
/// exception that allowed it.
pub(crate) struct Budget {
    rule: UploadRule,
    client: Box<str>,
    enforce: bool,
    line: Arc<UploadLine>,
}

impl Budget {
    /// The budget `d`'s exception sets for `ev`'s client, if any; `ev`
    /// gains its `upload` field.
    pub(crate) fn of(d: &Decision<'_>, ev: &mut Event, mode: Mode) -> Option<Arc<Budget>> {
        let rule = d.exception?.upload()?.clone();
        // Named client, else source address (DESIGN "Bounds"); the two
        // never collide, whatever a client's id looks like.
        let client = if &*ev.client == "-" {
            format!("addr {}", ev.src.ip())
        } else {
            format!("client {}", ev.client)
        };
        let line = Arc::new(UploadLine {
            budget: rule.bytes,
            ..UploadLine::default()
        });
        line.used.store(rule.used(&client, unix_now()), Relaxed);
        ev.upload = Some(line.clone());
        Some(Arc::new(Budget {
            rule,
            client: client.into(),
            enforce: mode == Mode::Enforce,
            line,
        }))
    }

    /// Whether `n` more bytes fit the window now (nothing charged).
    fn fits(&self, n: u64) -> bool {
        let used = self.rule.used(&self.client, unix_now());
        self.line.used.store(used, Relaxed);
        used.saturating_add(n) <= self.rule.bytes
    }

    /// What a refusal says: the budget and what the window holds (never
    /// what was sent).
    fn detail(&self, what: &str) -> String {
        format!(
            "{what}: this client may send {} per {} under the exception, and has sent {} in the window",
            bytes(self.rule.bytes),
            per(self.rule.per_secs),
            bytes(self.line.used.load(Relaxed)),
        )
    }
}

impl Charge for Budget {
    fn take(&self, n: u64) -> bool {
        let now = unix_now();
        let r = if self.enforce {
            self.rule.charge(&self.client, n, now)
        } else {
            self.rule.charge_anyway(&self.client, n, now)
        };
        match r {
            Ok(used) => {
                self.line.used.store(used, Relaxed);
                self.line.uncounted.fetch_add(n, Relaxed);
                if used > self.rule.bytes {
                    self.line.crossed.store(true, Relaxed);
                }
                true
            }
            Err(Refused::Crossed { used }) => {
                self.line.used.store(used, Relaxed);
                self.line.crossed.store(true, Relaxed);
                false
            }
            // No window could be kept for this client: nothing goes
            // uncounted, in either mode.
            Err(Refused::Full) => {
                self.line.crossed.store(true, Relaxed);
                false
            }
        }
    }
}

/// Puts `req` under its exception's budget, if it has one: refused
/// (`Err`, the detail) when its declared length would cross it, otherwise
/// its body charged as it goes.
pub(crate) fn meter(
    req: Request<ReqBody>,
    ev: &mut Event,
    d: &Decision<'_>,
    mode: Mode,
) -> Result<Request<ReqBody>, Stop> {
    let Some(b) = Budget::of(d, ev, mode) else {
        return Ok(req);
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.max(req.body().known_len()) {
        if n > 0 && !b.fits(n) {
            b.line.crossed.store(true, Relaxed);
            let detail = b.detail(&format!(
                "the request body ({n} bytes) would cross the budget"
            ));
            if b.enforce {
                return Err(Stop::Deny(Reason::UploadBudget, Some(detail)));
            }
            ev.add_note(Some(format!("report mode: {detail}")));
        }
    }
    let mut req = req;
    req.extensions_mut().insert(Cap(b.clone()));
    Ok(req.map(|body| ReqBody::Charged(Box::new(body), b)))
}

/// The refusal for a request whose body was cut at its budget, if that is
/// why it failed.
pub(crate) fn cut(ev: &Event) -> Option<Stop> {
    let line = ev.upload.as_ref()?;
    if !line.crossed.load(Relaxed) {
        return None;
    }
    let detail = format!(
        "the body crossed the budget as it was sent and was cut there: this client may send {} per window under the exception, and has sent {}",
        bytes(line.budget),
        bytes(line.used.load(Relaxed)),
    );
    Some(Stop::Deny(Reason::UploadBudget, Some(detail)))
}

/// The budget of a tunnel or captured connection `d` allowed, as the
/// relay charges it.
pub(crate) fn tunnel(d: &Decision<'_>, ev: &mut Event, mode: Mode) -> Option<Arc<dyn Charge>> {
    Budget::of(d, ev, mode).map(|b| b as Arc<dyn Charge>)
}
