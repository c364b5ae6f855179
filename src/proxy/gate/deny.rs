//! The gate's denials: in the channel each client shows (pip the reason
//! phrase, npm a JSON `error`, cargo and go a text body), or, in report
//! mode, noted on the line and given back to go on.

use http::header::{self, HeaderValue};
use http::Response;

use crate::packages::decide::{deny_phrase, PackageReason};
use crate::packages::Ecosystem;
use crate::policy::{Decision, Mode, Reason};
use crate::proxy::respond::{self, ProxyBody, Responder};
use crate::record::Event;

use super::*;

/// A package denial, as its client will show it.
pub(super) struct Denied<'a> {
    pub(super) eco: Ecosystem,
    pub(super) reason: PackageReason,
    pub(super) name: Option<&'a str>,
    pub(super) version: Option<&'a str>,
    pub(super) did_you_mean: Option<&'a str>,
    /// (id, owner) of the set that held or denied.
    pub(super) set: Option<(&'a str, &'a str)>,
    pub(super) detail: Option<String>,
}

impl Denied<'_> {
    /// Why, in a clause: what the reason means for this name.
    fn why(&self) -> String {
        let name = self.name.unwrap_or("this request");
        let nv = match self.version {
            Some(v) => format!("{name} {v}"),
            None => name.to_string(),
        };
        let mut s = match self.reason {
            PackageReason::NotApproved => {
                format!("no approved package set for this client lists {name}")
            }
            PackageReason::VersionNotApproved => {
                format!("{nv} is outside the versions its package set approves")
            }
            PackageReason::TooNew => {
                format!("{nv} was published more recently than its package set's min_age allows")
            }
            PackageReason::TimeUnknown => format!(
                "the registry gives no publish time for {nv}, and settings.packages.time_unknown is deny"
            ),
            PackageReason::Denied => format!("{nv} is denied by a package set"),
            PackageReason::SetExpired => {
                format!("the package set that approves {name} has expired")
            }
            PackageReason::NotListed => {
                format!("{nv} is not a file the filtered index of {name} lists")
            }
            PackageReason::IntegrityMismatch => {
                format!("{nv} does not match the sha256 its package set pins")
            }
            PackageReason::IndexUnfilterable => {
                format!("egressd could not filter the index of {name}")
            }
            PackageReason::Unparseable => {
                "egressd cannot read this registry request as a package".to_string()
            }
            PackageReason::Publish => {
                "publishing to this registry is not allowed: no exception names this method and registry path".to_string()
            }
        };
        if let Some(d) = &self.detail {
            s.push_str(": ");
            s.push_str(d);
        }
        if let Some(m) = self.did_you_mean {
            s.push_str(&format!("; did you mean {m}?"));
        }
        s
    }

    pub(super) fn phrase(&self) -> String {
        let p = deny_phrase(
            self.reason,
            self.name.unwrap_or("-"),
            self.version,
            self.did_you_mean,
        );
        // The phrase names the status it goes with: a 502 is no "Forbidden".
        match (self.reason.status(), p.strip_prefix("Forbidden")) {
            (502, Some(rest)) => format!("Bad Gateway{rest}"),
            _ => p,
        }
    }

    /// The text body (pip, cargo, go, and anyone else).
    pub(super) fn text(&self, what: &str, contact: &str) -> String {
        let why = self.why();
        let stop = if why.ends_with('?') { "" } else { "." };
        let mut body = format!(
            "egressd denied {what} ({}): {why}{stop}\n",
            self.reason.as_str()
        );
        if let Some((id, owner)) = self.set {
            body.push_str(&format!("Package set: {id} (owner {owner}).\n"));
        }
        if self.reason == PackageReason::Publish {
            body.push_str(&format!(
                "If this task needs to publish, ask {contact} for an exception naming the method and the registry path.\n"
            ));
        } else if self.reason.status() == 403 {
            body.push_str(&format!(
                "If this task needs it, ask {contact} to approve it in a package set, saying which package and why.\n"
            ));
        }
        body
    }

    /// The crates.io API's error document: cargo prints each `detail`
    /// ("the remote server responded with an error").
    pub(super) fn cargo_api_json(&self, what: &str, contact: &str) -> String {
        let detail = format!(
            "egressd denied {what} ({}): {}; ask {contact} for an exception naming it",
            self.reason.as_str(),
            self.why()
        );
        let mut v = serde_json::json!({ "errors": [{ "detail": detail }] }).to_string();
        v.push('\n');
        v
    }

    /// The npm registry's error document: npm prints its `error`.
    pub(super) fn npm_json(&self, what: &str, contact: &str) -> String {
        let mut msg = format!("egressd: {} {}", self.reason.as_str(), self.why());
        if let Some((id, _)) = self.set {
            msg.push_str(&format!(" (package set {id})"));
        }
        if self.reason == PackageReason::Publish {
            msg.push_str(&format!("; ask {contact} for an exception naming it"));
        } else if self.reason.status() == 403 {
            msg.push_str(&format!("; ask {contact} to approve it"));
        }
        let mut v = serde_json::json!({
            "error": msg,
            "reason": self.reason.as_str(),
            "denied": what,
            "set": self.set.map(|(id, _)| id),
            "did_you_mean": self.did_you_mean,
            "contact": contact,
        })
        .to_string();
        v.push('\n');
        v
    }
}

/// [`deny`] in every mode: a refusal that is not the policy's.
pub(super) fn enforced_deny(
    ev: Event,
    d: Denied<'_>,
    host_decision: &Decision<'_>,
    responder: &Responder<'_>,
) -> Response<ProxyBody> {
    let mode = ev.mode;
    match deny(ev, d, host_decision, Mode::Enforce, responder) {
        Ok(r) => r,
        Err(mut ev) => {
            ev.mode = mode;
            let r = Response::new(respond::full(""));
            responder.rec.record(*ev);
            r
        }
    }
}

/// Answers a package denial and records the line — unless `mode` does not
/// enforce it (report mode): then the denial is noted in the event, given
/// back to go on.
pub(super) fn deny(
    mut ev: Event,
    d: Denied<'_>,
    host_decision: &Decision<'_>,
    mode: Mode,
    responder: &Responder<'_>,
) -> Result<Response<ProxyBody>, Box<Event>> {
    let reason = line_reason(d.reason);
    let decision = Decision::deny(reason, host_decision.exception).under(mode);
    ev.set_decision(&decision, mode);
    if decision.is_allowed() {
        return Err(Box::new(ev));
    }
    let what = (responder.what)();
    let (body, ctype) = match (d.eco, d.reason) {
        (Ecosystem::Npm, _) => (d.npm_json(&what, responder.contact), "application/json"),
        (Ecosystem::Cargo, PackageReason::Publish) => (
            d.cargo_api_json(&what, responder.contact),
            "application/json",
        ),
        _ => (
            d.text(&what, responder.contact),
            "text/plain; charset=utf-8",
        ),
    };
    let status = respond::status_for(Reason::from(d.reason));
    let mut resp = Response::new(respond::full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        respond::REASON_HEADER,
        HeaderValue::from_static(d.reason.as_str()),
    );
    if responder.close {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    // pip shows nothing of a failed download but its status line.
    if let Ok(p) = hyper::ext::ReasonPhrase::try_from(d.phrase().into_bytes()) {
        resp.extensions_mut().insert(p);
    }
    ev.status = Some(status.as_u16());
    ev.add_note(d.detail);
    responder.rec.record(ev);
    Ok(resp)
}

/// A write to the registry (`Classified::Publish`): passed on when the
/// exception that allowed the request names both its method (`methods:`)
/// and its path (`paths:`), which no exception for reading a registry
/// does; refused `package_publish` in the client's channel otherwise.
pub(super) fn publish(
    at: &Allowed<'_>,
    eco: Ecosystem,
    what: &'static str,
    path: &str,
    mut ev: Event,
) -> Gate {
    let reason = PackageReason::Publish;
    let mut line = package_line(eco, None, None);
    let named = at
        .decision
        .exception
        .is_some_and(|e| e.methods().is_some() && e.paths().is_some());
    if named {
        ev.package = Some(line);
        ev.add_note(Some(format!(
            "{what}, allowed: the exception names the method and the path"
        )));
        return Gate::Go(Route::default(), ev);
    }
    line.reason = Some(reason);
    ev.package = Some(line);
    let answer = Denied {
        eco,
        reason,
        name: Some(path),
        version: None,
        did_you_mean: None,
        set: None,
        detail: Some(what.to_string()),
    };
    let mode = at.policy.settings.mode;
    match deny(ev, answer, at.decision, mode, at.responder) {
        Ok(resp) => Gate::Answered(resp),
        Err(ev) => Gate::Go(Route::default(), *ev),
    }
}
