//! egressd's own index fetches: the index a download is decided by, read
//! as egressd's own logged request through the one upstream path
//! ([`origin::reach`]: pooled, checked and framed like a client's).

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap};
use http::Request;

use crate::packages::classify::{self, index_location, IndexForm};
use crate::packages::compile::Mirror;
use crate::packages::filter::{self, FilterError, MAX_INDEX_BYTES};
use crate::packages::name::PackageName;
use crate::packages::view::IndexView;
use crate::packages::Ecosystem;
use crate::policy::host::{parse_target, HostError};
use crate::policy::{self, ClientIdx, Exception, Policy, Proto, Reason};
use crate::proxy::dest::Dest;
use crate::proxy::held::ReqBody;
use crate::proxy::origin::{self, Scheme, Way};
use crate::proxy::respond::Stop;
use crate::proxy::tls_origins::UpstreamAddr;
use crate::proxy::upstream::{self, Reach};
use crate::proxy::ProxyCtx;
use crate::record::{Event, PackageLine, UpstreamFailure};

use super::*;

/// Why egressd could not read an index (or a Go `.mod`) for itself.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// The registry host is not a host name or address.
    #[error("{0}")]
    Host(#[from] HostError),
    /// The policy does not allow egressd's request either.
    #[error("{host} is not allowed ({reason})")]
    NotAllowed { host: String, reason: &'static str },
    /// The one upstream path refused or failed (checked addresses, the
    /// connection, the response head).
    #[error("{}", stop_message(.0))]
    Upstream(Stop),
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error("the registry answered {0}")]
    Status(u16),
    #[error("no response in time")]
    Timeout,
    #[error("content type {0:?}")]
    ContentType(Option<String>),
    /// The document could not be read (bounded, decoded) or filtered.
    #[error(transparent)]
    Index(#[from] FilterError),
}

/// What a [`Stop`] says, for the fetch's error.
fn stop_message(s: &Stop) -> String {
    match s {
        Stop::Deny(reason, None) => reason.as_str().to_string(),
        Stop::Deny(reason, Some(note)) => format!("{} ({note})", reason.as_str()),
        Stop::Decided => "refused by the policy".to_string(),
        Stop::BadMessage { detail, .. } => detail.clone(),
        Stop::Unreachable { message, .. } => message.clone(),
    }
}

/// What an own fetch is for, as its line says: the package, the set that
/// approved it in the decision the fetch serves, and (a Go `.mod`) the
/// version.
#[derive(Clone, Copy)]
pub(super) struct Serves<'a> {
    pub(super) name: &'a PackageName,
    pub(super) set: Option<&'a Arc<str>>,
    pub(super) version: Option<&'a str>,
}

/// The client request an own fetch is made for: egressd's fetch is decided
/// for the same client, port and time, and logged beside `parent`.
#[derive(Clone, Copy)]
pub(super) struct OnBehalf<'a> {
    pub(super) ctx: &'a ProxyCtx,
    pub(super) policy: &'a Policy,
    pub(super) client: Option<ClientIdx>,
    /// The registry port the client's request went to.
    pub(super) port: u16,
    pub(super) parent: &'a Event,
    pub(super) now: i64,
}

impl<'a> OnBehalf<'a> {
    /// On behalf of the allowed request `parent` is the line of.
    pub(super) fn of(at: &Allowed<'a>, parent: &'a Event) -> OnBehalf<'a> {
        OnBehalf {
            ctx: at.ctx,
            policy: at.policy,
            client: at.client,
            port: at.dest.port,
            parent,
            now: at.now,
        }
    }
}

/// The view of `serves.name`'s index, read by egressd itself (cached).
pub(super) async fn own_index(
    by: OnBehalf<'_>,
    eco: Ecosystem,
    serves: Serves<'_>,
) -> Result<Arc<IndexView>, FetchError> {
    let name = serves.name;
    if let Some(v) = by.ctx.package_views.get(eco, name) {
        return Ok(v);
    }
    let pkgs = &by.policy.packages;
    let loc = index_location(eco, name);
    let mirror = pkgs.settings.mirror(eco);
    let mut got = own_fetch(
        by,
        eco,
        (loc.host, &loc.path, loc.accept),
        serves,
        mirror,
        true,
    )
    .await;
    // The sparse index files a crate under its own spelling, which may
    // have `-` where the normal form has `_`.
    if eco == Ecosystem::Cargo
        && name.as_str().contains('_')
        && matches!(&got, Err(FetchError::Status(404)))
    {
        let dashed = name.as_str().replace('_', "-");
        let path = classify::cargo_index_path(&dashed);
        got = own_fetch(by, eco, (loc.host, &path, loc.accept), serves, mirror, true).await;
    }
    let (head, doc) = got?;
    // A mirror's URLs, as the client's copy of the index has them.
    let doc = match mirror {
        Some(m) => rewrite_mirror_urls(m, &doc),
        None => doc,
    };
    let ct = head.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let form = IndexForm::from_content_type(loc.form, ct)
        .ok_or_else(|| FetchError::ContentType(ct.map(str::to_string)))?;
    let times = if eco == Ecosystem::Go {
        let versions = go_versions(&doc);
        Some(go_times(by, serves, &versions, mirror).await)
    } else {
        None
    };
    let rules = pkgs.rules(by.client, eco, name, by.now);
    let f = filter::filter(&rules, form, &doc, times.as_ref())?;
    Ok(by.ctx.package_views.put(f.view))
}

/// One GET egressd makes for itself to a registry host (or its mirror),
/// decided and logged as its own request (`"origin": "egressd"`) on behalf
/// of `parent`'s client, its line's package being what `serves` says.
/// Returns the response head and the decoded body (`body: false`: the
/// head only, the body read and dropped).
pub(super) async fn own_fetch(
    by: OnBehalf<'_>,
    eco: Ecosystem,
    (host, path, accept): (&str, &str, &'static str),
    serves: Serves<'_>,
    mirror: Option<&Mirror>,
    body: bool,
) -> Result<(HeaderMap, Vec<u8>), FetchError> {
    let mut ev = Event::new(Proto::Tls, by.parent.src);
    ev.client = by.parent.client.clone();
    ev.origin = Some("egressd");
    ev.method = Some("GET".into());
    ev.path = Some(path.to_string());
    ev.package = Some(Box::new(PackageLine {
        ecosystem: eco,
        name: Some(serves.name.as_str().to_string()),
        version: serves.version.map(str::to_string),
        set: serves.set.cloned(),
        reason: None,
        hidden: None,
        did_you_mean: None,
    }));
    let result = own_fetch_inner(by, eco, (host, path, accept), &mut ev, mirror, body).await;
    if let Err(why) = &result {
        if ev.error.is_none() && ev.decision == policy::Logged::Allow {
            ev.error = Some(why.to_string());
        }
    }
    by.ctx.recorder.record(ev);
    result
}

/// [`own_fetch`]'s request, its line in `ev`: the way out (the mirror,
/// or the registry as the policy decides it for the client), then the
/// one upstream path, then the answer read (bounded).
pub(super) async fn own_fetch_inner(
    by: OnBehalf<'_>,
    eco: Ecosystem,
    (host, path, accept): (&str, &str, &'static str),
    ev: &mut Event,
    mirror: Option<&Mirror>,
    body: bool,
) -> Result<(HeaderMap, Vec<u8>), FetchError> {
    let way = match mirror {
        Some(m) => to_own_mirror(by, (eco, m), (host, path), ev).await?,
        None => to_registry(by, (host, path), ev).await?,
    };
    let req = Request::get(way.path.as_str())
        .header(header::ACCEPT, accept)
        .header(header::ACCEPT_ENCODING, "gzip")
        .header(
            header::USER_AGENT,
            concat!("egressd/", env!("CARGO_PKG_VERSION")),
        )
        .body(ReqBody::Held(None))?;
    let fetch = async {
        let sent = origin::reach(by.ctx, req, ev, way.way(), None)
            .await
            .map_err(|stop| {
                if let Stop::Unreachable { kind, message, .. } = &stop {
                    ev.fail_upstream(*kind, message);
                }
                FetchError::Upstream(stop)
            })?;
        read_answer(sent, ev, body).await
    };
    match tokio::time::timeout(OWN_FETCH_TIMEOUT, fetch).await {
        Ok(r) => r,
        Err(_) => {
            ev.fail_upstream(UpstreamFailure::Timeout, "no response in time");
            Err(FetchError::Timeout)
        }
    }
}

/// Where an own fetch goes: checked addresses, the path there, the
/// credentials it carries.
struct OwnWay<'a> {
    dest: Dest,
    addrs: Vec<SocketAddr>,
    scheme: Scheme,
    path: String,
    exception: Option<&'a Exception>,
    inject: &'a [crate::packages::compile::MirrorHeader],
}

impl OwnWay<'_> {
    fn way(&self) -> Way<'_> {
        Way {
            dest: &self.dest,
            scheme: self.scheme,
            addrs: &self.addrs,
            exception: self.exception,
            inject: self.inject,
        }
    }
}

/// The way to the ecosystem's mirror: configuration, not a destination
/// the exceptions decide; the line says allowed, by no exception, through
/// the mirror.
async fn to_own_mirror<'a>(
    by: OnBehalf<'_>,
    (eco, m): (Ecosystem, &'a Mirror),
    (host, path): (&str, &str),
    ev: &mut Event,
) -> Result<OwnWay<'a>, FetchError> {
    ev.decision = policy::Logged::Allow;
    ev.reason = Reason::Exception;
    ev.mode = by.policy.settings.mode;
    ev.add_note(Some(format!("mirror for {host}")));
    if let Ok(dest) = mirror_dest(m) {
        ev.host = Some(dest.target.to_string());
        ev.port = Some(dest.port);
    }
    let to = to_mirror(by.ctx, by.policy, (eco, m), (host, path), ev)
        .await
        .map_err(FetchError::Upstream)?;
    ev.path = Some(to.path.clone());
    Ok(OwnWay {
        dest: to.dest,
        addrs: to.addrs,
        scheme: to.scheme,
        path: to.path,
        exception: None,
        inject: &m.inject,
    })
}

/// The way to the registry: decided for the client as its own request
/// would be (a registry is HTTPS), its addresses checked.
async fn to_registry<'p>(
    by: OnBehalf<'p>,
    (host, path): (&str, &str),
    ev: &mut Event,
) -> Result<OwnWay<'p>, FetchError> {
    let dest = Dest {
        target: parse_target(host)?,
        port: by.port,
    };
    ev.host = Some(host.to_string());
    ev.port = Some(by.port);
    let preq = policy::Request {
        proto: Proto::Tls,
        client: by.client,
        target: &dest.target,
        port: by.port,
        method: Some(policy::Method {
            name: "GET",
            overrides: &[],
        }),
        path: Some(path),
        qtype: None,
        can_intercept: false,
    };
    let d = by.policy.decide(&preq, by.now);
    ev.set_decision(&d, by.policy.settings.mode);
    if !d.is_allowed() {
        ev.status = None;
        let (host, reason) = (host.to_string(), d.reason.as_str());
        return Err(FetchError::NotAllowed { host, reason });
    }
    let reach = Reach {
        dest: &dest,
        exception: d.exception,
        client: by.client,
        now: by.now,
    };
    let addrs = upstream::check_destination(by.ctx, by.policy, reach, ev)
        .await
        .map_err(FetchError::Upstream)?;
    Ok(OwnWay {
        dest,
        addrs,
        scheme: Scheme::Https,
        path: path.to_string(),
        exception: d.exception,
        inject: &[],
    })
}

/// The registry's answer to an own fetch: its head, and its body read
/// (bounded) and decoded (`body: false`: read and dropped). A whole body
/// gives the connection back to the pool.
async fn read_answer(
    sent: origin::Sent,
    ev: &mut Event,
    body: bool,
) -> Result<(HeaderMap, Vec<u8>), FetchError> {
    let origin::Sent { resp, lent, .. } = sent;
    if let Some(a) = resp.extensions().get::<UpstreamAddr>() {
        ev.addr = Some(a.0);
    }
    ev.status = Some(resp.status().as_u16());
    let (parts, b) = resp.into_parts();
    if !parts.status.is_success() {
        return Err(FetchError::Status(parts.status.as_u16()));
    }
    let raw = read_bounded(b, MAX_INDEX_BYTES).await?;
    if let Some(l) = lent {
        l.give_back();
    }
    ev.bytes_down = raw.len() as u64;
    if !body {
        return Ok((parts.headers, Vec::new()));
    }
    let doc = decode(parts.headers.get(header::CONTENT_ENCODING), raw)?;
    Ok((parts.headers, doc))
}
