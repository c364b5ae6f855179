//! egressd's own index fetches: the index a download is decided by, read
//! as egressd's own logged request through the one upstream path.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};

use crate::packages::classify::{self, index_location, IndexForm};
use crate::packages::compile::{Mirror, PackagePolicy};
use crate::packages::filter::{self, MAX_INDEX_BYTES};
use crate::packages::name::PackageName;
use crate::packages::view::IndexView;
use crate::packages::Ecosystem;
use crate::policy::host::parse_target;
use crate::policy::{self, ClientIdx, Policy, Proto, Reason};
use crate::proxy::dest::Dest;
use crate::proxy::tls_origins::UpstreamAddr;
use crate::proxy::upstream;
use crate::proxy::ProxyCtx;
use crate::record::{Event, PackageLine, UpstreamFailure};

use super::*;

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

/// The view of `serves.name`'s index, read by egressd itself (cached).
pub(super) async fn own_index(
    by: OnBehalf<'_>,
    pkgs: &PackagePolicy,
    eco: Ecosystem,
    serves: Serves<'_>,
) -> Result<Arc<IndexView>, String> {
    let name = serves.name;
    if let Some(v) = by.ctx.package_views.get(eco, name) {
        return Ok(v);
    }
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
        && matches!(&got, Err(e) if e.contains("404"))
    {
        let dashed = name.as_str().replace('_', "-");
        let path = classify::cargo_index_path(&dashed);
        got = own_fetch(by, eco, (loc.host, &path, loc.accept), serves, mirror, true).await;
    }
    let (head, doc) = got?;
    let ct = head.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let form =
        IndexForm::from_content_type(loc.form, ct).ok_or_else(|| format!("content type {ct:?}"))?;
    let times = if eco == Ecosystem::Go {
        let versions = go_versions(&doc);
        Some(go_times(by, serves, &versions, mirror).await)
    } else {
        None
    };
    let rules = pkgs.rules(by.client, eco, name, by.now);
    let f = filter::filter(&rules, form, &doc, times.as_ref()).map_err(|e| e.to_string())?;
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
) -> Result<(HeaderMap, Vec<u8>), String> {
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
            ev.error = Some(why.clone());
        }
    }
    by.ctx.recorder.record(ev);
    result
}

pub(super) async fn own_fetch_inner(
    by: OnBehalf<'_>,
    eco: Ecosystem,
    (host, path, accept): (&str, &str, &'static str),
    ev: &mut Event,
    mirror: Option<&Mirror>,
    body: bool,
) -> Result<(HeaderMap, Vec<u8>), String> {
    let OnBehalf {
        ctx,
        policy,
        client,
        port,
        now,
        ..
    } = by;
    let (dest, addrs, upstream_path, inject) = match mirror {
        Some(m) => {
            let dest = mirror_dest(m)?;
            ev.host = Some(dest.target.to_string());
            ev.port = Some(dest.port);
            // Configuration, not a destination the exceptions decide: the
            // line says allowed, by no exception, through the mirror.
            ev.decision = policy::Logged::Allow;
            ev.reason = Reason::Exception;
            ev.mode = policy.settings.mode;
            ev.add_note(Some(format!("mirror for {host}")));
            let addrs = mirror_addrs(ctx, policy, &dest, ev).await?;
            let p = mirror_path(m, eco, host, path);
            ev.path = Some(p.clone());
            let inject = m
                .inject
                .iter()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect();
            (dest, addrs, p, inject)
        }
        None => {
            let target = parse_target(host).map_err(|e| e.to_string())?;
            let dest = Dest { target, port };
            ev.host = Some(host.to_string());
            ev.port = Some(port);
            let preq = policy::Request {
                proto: Proto::Tls,
                client,
                target: &dest.target,
                port,
                method: Some(policy::Method {
                    name: "GET",
                    overrides: &[],
                }),
                path: Some(path),
                qtype: None,
                can_intercept: false,
            };
            let d = policy.decide(&preq, now);
            ev.set_decision(&d, policy.settings.mode);
            if !d.is_allowed() {
                ev.status = None;
                return Err(format!("{host} is not allowed ({})", d.reason.as_str()));
            }
            let addrs =
                upstream::check_destination(ctx, policy, d.exception, client, &dest, ev, now)
                    .await
                    .map_err(|s| format!("{s:?}"))?;
            let inject: Vec<(HeaderName, HeaderValue)> = d
                .exception
                .map(|e| {
                    e.inject()
                        .iter()
                        .map(|h| (h.name.clone(), h.value.clone()))
                        .collect()
                })
                .unwrap_or_default();
            (dest, addrs, path.to_string(), inject)
        }
    };
    // A mirror may be plain HTTP (configuration); registries are HTTPS.
    let plain = mirror.is_some_and(|m| m.scheme == http::uri::Scheme::HTTP);
    let (scheme, default_port) = if plain { ("http", 80) } else { ("https", 443) };
    let authority = if dest.port == default_port {
        dest.target.to_string()
    } else {
        format!("{}:{}", dest.target, dest.port)
    };
    let mut req = Request::get(format!("{scheme}://{authority}{upstream_path}"))
        .header(header::HOST, &authority)
        .header(header::ACCEPT, accept)
        .header(header::ACCEPT_ENCODING, "gzip")
        .header(
            header::USER_AGENT,
            concat!("egressd/", env!("CARGO_PKG_VERSION")),
        )
        .header(header::VIA, "1.1 egressd")
        .body(
            Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed(),
        )
        .map_err(|e| e.to_string())?;
    for (n, v) in inject {
        req.headers_mut().insert(n, v);
    }
    let fetch = async {
        let sent = if plain {
            send_plain(ctx, addrs[0], req).await
        } else {
            let Some(origins) = ctx.tls_origins() else {
                return Err(
                    "interception is not enabled (egressd reads registries over TLS)".into(),
                );
            };
            let tls = origins
                .client(&dest, &addrs, false)
                .map_err(|e| format!("tls: {e}"))?;
            tls.request(req).await.map_err(|e| e.to_string())
        };
        let resp = sent.inspect_err(|e| ev.fail_upstream(UpstreamFailure::Connect, e))?;
        if let Some(a) = resp.extensions().get::<UpstreamAddr>() {
            ev.addr = Some(a.0);
        }
        ev.status = Some(resp.status().as_u16());
        let (parts, b) = resp.into_parts();
        if !parts.status.is_success() {
            return Err(format!("the registry answered {}", parts.status.as_u16()));
        }
        let raw = read_bounded(b, MAX_INDEX_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        ev.bytes_down = raw.len() as u64;
        if !body {
            return Ok((parts.headers, Vec::new()));
        }
        let doc =
            decode(parts.headers.get(header::CONTENT_ENCODING), raw).map_err(|e| e.to_string())?;
        Ok((parts.headers, doc))
    };
    match tokio::time::timeout(OWN_FETCH_TIMEOUT, fetch).await {
        Ok(r) => r,
        Err(_) => {
            ev.fail_upstream(UpstreamFailure::Timeout, "no response in time");
            Err("no response in time".into())
        }
    }
}

/// One GET over plain HTTP (a mirror configured as `http://`) on a
/// connection of its own: to the checked address, or through the upstream
/// proxy in absolute form naming that address.
pub(super) async fn send_plain(
    ctx: &ProxyCtx,
    addr: SocketAddr,
    mut req: Request<crate::proxy::tls_origins::OutBody>,
) -> Result<Response<hyper::body::Incoming>, String> {
    let stream = ctx
        .egress
        .connect_http(addr)
        .await
        .map_err(|e| e.to_string())?;
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri = match &ctx.egress {
        upstream::Egress::Direct => pq,
        upstream::Egress::Proxy(p) => {
            if let Some(auth) = &p.auth {
                req.headers_mut()
                    .insert(header::PROXY_AUTHORIZATION, auth.clone());
            }
            format!("http://{addr}{pq}")
        }
    };
    *req.uri_mut() = uri.parse().map_err(|e| format!("{e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| e.to_string())
}

// ---------------------------------------------------------------- mirrors
