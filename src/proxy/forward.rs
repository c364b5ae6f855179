//! Plain-HTTP forwarding of absolute-form requests (`GET http://host/path`):
//! the edge. The target is parsed into a `Dest`, the `Host` header must
//! agree with it, the path is normalised for `paths:` rules; then the
//! shared request path (`exchange::decide_and_forward`) decides it and
//! sends it to a checked address over a pooled connection.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use super::admit::admit;
use super::dest::{check_host_headers_spelled, parse_authority, Dest};
use super::exchange::{decide_and_forward, request_event, truncate_path, Inbound};
use super::origin::Scheme;
use super::respond::{self, ProxyBody, Responder, Stop};
use super::ProxyCtx;
use crate::policy::Proto;
use crate::record::Event;

pub async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    ctx: Arc<ProxyCtx>,
) -> Response<ProxyBody> {
    let policy = ctx.policy.snapshot();
    let mut ev = request_event(Proto::Http, peer, &req);
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let what = move || format!("{method} {}", truncate_path(&uri.to_string()));
    let responder = Responder {
        what: &what,
        contact: &policy.settings.contact,
        close: false,
        json: respond::wants_json(req.headers()),
        rec: &ctx.recorder,
    };
    let edge = admit(&ctx.recorder, &policy, &mut ev, &req)
        .and_then(|client| Ok((client, read_target(&req, &mut ev)?)));
    let (client, (dest, path)) = match edge {
        Ok(x) => x,
        Err(stop) => return responder.stop(ev, stop),
    };
    let inbound = Inbound {
        client,
        dest: &dest,
        path: &path,
        scheme: Scheme::Http,
    };
    decide_and_forward(&ctx, &policy, req, ev, inbound, &responder).await
}

/// The absolute-form target (`http://authority/path`), parsed: its
/// destination, noted in `ev`, and its normalised path. A `Host` header
/// that names another destination is a request for a different origin
/// riding on an allowed one: refused, not picked.
fn read_target<B>(req: &Request<B>, ev: &mut Event) -> Result<(Dest, String), Stop> {
    let uri = req.uri();
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(s) if s.eq_ignore_ascii_case("https") => {
            return Err(Stop::malformed("send https:// requests through CONNECT"))
        }
        Some(s) => return Err(Stop::malformed(format!("scheme {s:?} is not proxied"))),
        None => {
            return Err(Stop::malformed(
                "this is an HTTP proxy: requests must use an absolute target (http://host/path)",
            ))
        }
    }
    let authority = uri
        .authority()
        .ok_or_else(|| Stop::malformed("request target has no host"))?;
    let dest = parse_authority(authority.as_str(), Some(80)).map_err(Stop::malformed)?;
    ev.host = Some(dest.target.to_string());
    ev.port = Some(dest.port);
    check_host_headers_spelled(req.headers(), &dest, Some(authority.as_str()))
        .map_err(|(r, d)| Stop::Deny(r, d))?;
    let path = super::gate::policy_path(&dest.target, uri.path()).map_err(Stop::malformed)?;
    ev.path = Some(truncate_path(&path));
    Ok((dest, path))
}
