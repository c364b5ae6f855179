//! What the gate hands back to the request path: the request it is given
//! ([`Allowed`]), and the [`Route`] the request goes on, or the answer the
//! gate gave itself ([`Gate`]). A registry request served by its mirror is
//! reached through [`to_mirror`], the client's and egressd's own alike.

use std::net::SocketAddr;

use http::Response;

use crate::packages::compile::Mirror;
use crate::packages::Ecosystem;
use crate::policy::{ClientIdx, Decision, Policy};
use crate::proxy::dest::Dest;
use crate::proxy::origin::{unreachable, Scheme, Way};
use crate::proxy::respond::{ProxyBody, Responder, Stop};
use crate::proxy::upstream::Reach;
use crate::proxy::ProxyCtx;
use crate::record::{Event, UpstreamFailure};

use super::{mirror_addrs, mirror_dest, mirror_path, Plan};

/// A request the host decision allowed, and what serving it needs: the
/// gate, its index answers and the request path after them read it here.
#[derive(Clone, Copy)]
pub(crate) struct Allowed<'a> {
    pub ctx: &'a ProxyCtx,
    pub policy: &'a Policy,
    pub client: Option<ClientIdx>,
    pub dest: &'a Dest,
    /// The host decision that allowed it.
    pub decision: &'a Decision<'a>,
    pub now: i64,
    pub responder: &'a Responder<'a>,
}

impl<'a> Allowed<'a> {
    /// The destination to check, by the allowing exception's leave.
    pub(crate) fn reach(&self) -> Reach<'a> {
        Reach {
            dest: self.dest,
            exception: self.decision.exception,
            client: self.client,
            now: self.now,
        }
    }
}

/// How an allowed request goes on. Four shapes: plain (neither field),
/// a gated index (a [`super::PlanKind::Index`] plan: filtered before the client
/// sees it), a gated download (a [`super::PlanKind::Download`] plan: hashed as it
/// streams), and any of them through the ecosystem's mirror.
#[derive(Default)]
pub(crate) struct Route {
    /// The mirror that serves the request instead of the public registry.
    pub mirror: Option<(Ecosystem, Mirror)>,
    /// What is done with the answer; `None`: relayed as it comes.
    pub plan: Option<Plan>,
}

impl Route {
    /// The route of a request the gate let through with `plan`.
    pub(crate) fn of(plan: Plan) -> Route {
        Route {
            mirror: plan.mirror.clone().map(|m| (plan.eco, m)),
            plan: Some(plan),
        }
    }
}

/// What the gate makes of one request. `Go` is the large variant and the
/// common one: boxing it would allocate for every gated request, to save
/// stack in a value that lives for one step.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Gate {
    /// It goes on, by this route.
    Go(Route, Event),
    /// Answered here (a denial, egressd could not read what it needed, an
    /// index from egressd's cache): the line is recorded.
    Answered(Response<ProxyBody>),
}

/// A registry request's way to its ecosystem's mirror: the mirror's
/// addresses (resolved, not judged by the exceptions: see
/// [`mirror_addrs`]) and the request's path there.
pub(crate) struct ToMirror {
    pub dest: Dest,
    pub addrs: Vec<SocketAddr>,
    pub scheme: Scheme,
    pub path: String,
}

impl ToMirror {
    /// The way out for a request to `m` (its headers put in).
    pub(crate) fn way<'a>(&'a self, m: &'a Mirror) -> Way<'a> {
        Way {
            dest: &self.dest,
            scheme: self.scheme,
            addrs: &self.addrs,
            exception: None,
            inject: &m.inject,
        }
    }
}

/// [`ToMirror`] for a request to the public registry's `host` for `path`.
pub(crate) async fn to_mirror(
    ctx: &ProxyCtx,
    policy: &Policy,
    (eco, m): (Ecosystem, &Mirror),
    (host, path): (&str, &str),
    ev: &mut Event,
) -> Result<ToMirror, Stop> {
    let dest = mirror_dest(m).map_err(|why| unreachable(UpstreamFailure::Connect, why, false))?;
    let addrs = mirror_addrs(ctx, policy, &dest, ev)
        .await
        .map_err(|why| unreachable(UpstreamFailure::Resolve, why, false))?;
    // A mirror may be plain HTTP (configuration); registries are HTTPS.
    let scheme = if m.scheme == http::uri::Scheme::HTTP {
        Scheme::Http
    } else {
        Scheme::Https
    };
    Ok(ToMirror {
        path: mirror_path(m, eco, host, path),
        dest,
        addrs,
        scheme,
    })
}
