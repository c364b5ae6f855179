//! Admission: the step every proxied request passes before anything about
//! it is decided. The decision log must be writable (egressd serves nothing
//! it cannot record: `503 log_unavailable`), and the client is identified,
//! by its Proxy-Authorization token or else its source address; a token
//! that names no client is refused (`client_not_allowed`), never taken for
//! an anonymous request.
//!
//! An admitted request is promised its one line: its event, published here
//! ([`Draft`]) once the policy decided, is written if the client goes away
//! before the answer ([`Unanswered`]).
//!
//! Owns reading the token, naming the client in the event, and that
//! promise. Does not own who the clients are (`Policy::identify`) or what
//! they may reach.

use std::sync::Arc;

use http::Request;

use super::respond::Stop;
use crate::policy::{ClientIdx, Policy, Reason, UnknownToken};
use crate::record::{Event, Recorder};
use crate::shutdown::{Holder, Permit};

/// The whole step, for a request that carries its own token: the log is
/// writable, then the client is identified and named in `ev`.
pub(crate) fn admit<B>(
    rec: &Recorder,
    policy: &Policy,
    ev: &mut Event,
    req: &Request<B>,
) -> Result<Option<ClientIdx>, Stop> {
    accepting(rec)?;
    client_of(policy, ev, req)
}

/// The client a request comes from, by the token it carries or else its
/// source, named in `ev`. A client its token names is known only now: its
/// connection counts against that client's share too (`overloaded` past
/// it), as it counts against its source's since it was accepted.
pub(crate) fn client_of<B>(
    policy: &Policy,
    ev: &mut Event,
    req: &Request<B>,
) -> Result<Option<ClientIdx>, Stop> {
    let token = request_token(req)
        .map_err(|e| Stop::Deny(Reason::ClientNotAllowed, Some(e.to_string())))?;
    let client = identify(policy, ev, token.as_deref())?;
    let conn = req.extensions().get::<Permit>();
    if let (Some(_), Some(id), Some(conn)) = (&token, policy.client_id(client), conn) {
        let max = policy.settings.limits.connections_per_client;
        if !conn.count_against(Holder::Named(id.clone()), max) {
            let detail = format!("client {id} already has {max} connections open, its share");
            return Err(Stop::Deny(Reason::Overloaded, Some(detail)));
        }
    }
    Ok(client)
}

/// Refuses while the decision log cannot be written.
pub(crate) fn accepting(rec: &Recorder) -> Result<(), Stop> {
    if rec.accepting() {
        Ok(())
    } else {
        Err(Stop::Deny(Reason::LogUnavailable, None))
    }
}

/// The client `ev` comes from (its `src`), by `token` if one was
/// presented, named in `ev`.
pub(crate) fn identify(
    policy: &Policy,
    ev: &mut Event,
    token: Option<&[u8]>,
) -> Result<Option<ClientIdx>, Stop> {
    let client = policy
        .identify(ev.src.ip(), token)
        .map_err(|e| Stop::Deny(Reason::ClientNotAllowed, Some(e.to_string())))?;
    if let Some(id) = policy.client_id(client) {
        ev.client = id.clone();
    }
    Ok(client)
}

/// The request's event as it stood when the policy decided, published by
/// the front-end (through the request's extensions) so that a request
/// whose client goes away before the answer still gets its one line.
#[derive(Clone, Default)]
pub(crate) struct Draft(Arc<std::sync::Mutex<Option<Event>>>);

impl Draft {
    /// Publishes `ev` for the request `req` carries a draft for.
    pub(crate) fn publish<B>(req: &Request<B>, ev: &Event) {
        if let Some(d) = req.extensions().get::<Draft>() {
            *d.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(ev.clone());
        }
    }
}

/// Writes the draft when the request's future is dropped before it
/// answered: hyper drops it when the client disconnects while egressd is
/// resolving, connecting or waiting for the origin's response head. Every
/// path that answers records its own line and completes the future first.
pub(crate) struct Unanswered {
    draft: Draft,
    rec: Recorder,
    armed: bool,
}

impl Unanswered {
    /// Gives `req` a draft for its front-end to publish, and this guard
    /// over it.
    pub(crate) fn arm<B>(req: &mut Request<B>, rec: &Recorder) -> Unanswered {
        let draft = Draft::default();
        req.extensions_mut().insert(draft.clone());
        Unanswered {
            draft,
            rec: rec.clone(),
            armed: true,
        }
    }

    /// The request was answered (and recorded its own line).
    pub(crate) fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ev = self
            .draft
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut ev) = ev {
            ev.status = None;
            ev.error = Some("client went away before the answer".into());
            self.rec.record(ev);
        }
    }
}

/// The Proxy-Authorization token a request presents, if any (an
/// unparsable header counts as an unknown token).
pub(crate) fn request_token<B>(req: &Request<B>) -> Result<Option<Vec<u8>>, UnknownToken> {
    req.headers()
        .get(http::header::PROXY_AUTHORIZATION)
        .map(|v| proxy_token(v.as_bytes()).ok_or(UnknownToken))
        .transpose()
}

/// The token in `Basic base64(user:token)` (or `user:` with the token as
/// user), or `Bearer token`.
pub fn proxy_token(v: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let (scheme, rest) = s.split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return (!rest.is_empty()).then(|| rest.as_bytes().to_vec());
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64_decode(rest)?;
    let colon = raw.iter().position(|b| *b == b':')?;
    let (user, pass) = (&raw[..colon], &raw[colon + 1..]);
    let tok = if pass.is_empty() { user } else { pass };
    (!tok.is_empty()).then(|| tok.to_vec())
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return None,
        } as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        // "agent:s3cret"
        assert_eq!(proxy_token(b"Basic YWdlbnQ6czNjcmV0").unwrap(), b"s3cret");
        // "s3cret:"
        assert_eq!(proxy_token(b"Basic czNjcmV0Og==").unwrap(), b"s3cret");
        assert_eq!(proxy_token(b"Bearer abc").unwrap(), b"abc");
        assert!(proxy_token(b"Digest x").is_none());
        assert!(proxy_token(b"Basic !!!").is_none());
    }
}
