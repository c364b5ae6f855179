//! A registry's mirror: where its requests go instead, its paths and the
//! URLs in its documents.

use std::net::SocketAddr;

use crate::packages::classify::{self, classify, Classified, Kind, PackageRef};
use crate::packages::compile::Mirror;
use crate::packages::decide::PackageReason;
use crate::packages::view::request_at;
use crate::policy::Proto;
use crate::proxy::respond;
use http::Response;

use super::fetch::{own_fetch_inner, OnBehalf};
use super::{enforced_deny, Allowed, Denied, Gate};
use crate::packages::Ecosystem;
use crate::policy::host::{parse_target, Target};
use crate::policy::Policy;
use crate::proxy::dest::Dest;
use crate::proxy::upstream;
use crate::proxy::ProxyCtx;
use crate::record::{Event, UpstreamFailure};

/// The mirror's host and port as a destination.
pub(crate) fn mirror_dest(m: &Mirror) -> Result<Dest, String> {
    let target = parse_target(&m.host).map_err(|e| format!("mirror host: {e}"))?;
    Ok(Dest {
        target,
        port: m.port,
    })
}

/// The mirror's addresses: resolved through egressd's resolver like any
/// name, but not judged by the exceptions (a mirror is configuration, as
/// `--upstream-proxy` is, and usually private); only egressd's own
/// listeners are refused.
pub(crate) async fn mirror_addrs(
    ctx: &ProxyCtx,
    policy: &Policy,
    dest: &Dest,
    ev: &mut Event,
) -> Result<Vec<SocketAddr>, String> {
    let ips = match &dest.target {
        Target::Ip(ip) => vec![*ip],
        Target::Name(h) => ctx
            .resolver
            .lookup_ip_for(h, policy, &mut ev.dns_attempts)
            .await
            .map_err(|e| {
                ev.fail_upstream(UpstreamFailure::Resolve, &e);
                format!("mirror {h}: {e}")
            })?,
    };
    let addrs: Vec<SocketAddr> = ips
        .into_iter()
        .map(|ip| SocketAddr::new(ip, dest.port))
        .filter(|a| {
            !upstream::is_own_listener(*a, &ctx.own_addrs)
                && !crate::proxy::listeners::another_egressd(*a)
        })
        .collect();
    if addrs.is_empty() {
        return Err("the mirror resolves to egressd itself".into());
    }
    Ok(addrs)
}

/// The mirror's path for a public registry request: the index root
/// (`/simple/` for PyPI, `/` elsewhere) replaced by the mirror URL's path;
/// requests to the file hosts keep their path (mirror documents' file URLs
/// were rewritten to the public file host with the mirror's path).
pub(crate) fn mirror_path(m: &Mirror, eco: Ecosystem, host: &str, path: &str) -> String {
    let base = mirror_base(m);
    if base != "/" && path.starts_with(base) {
        return path.to_string();
    }
    let index_root = match (eco, host) {
        (Ecosystem::Pypi, "pypi.org") => Some("/simple/"),
        (Ecosystem::Pypi, _) => None,
        (Ecosystem::Cargo, "static.crates.io" | "crates.io") => None,
        _ => Some("/"),
    };
    match index_root.and_then(|r| path.strip_prefix(r)) {
        Some(rest) => format!("{}{rest}", m.path),
        // Any other path on pypi.org is one the client resolved against
        // the index's URL from a relative reference in the mirror's
        // document (`../../packages/…` from `/simple/<p>/`): it is under
        // the mirror's base as the index is under its URL.
        None if (eco, host) == (Ecosystem::Pypi, "pypi.org") => {
            format!("{base}{}", path.strip_prefix('/').unwrap_or(path))
        }
        None => path.to_string(),
    }
}

/// Classifies a request to `eco`'s registry `host` as the gate reads it:
/// through the mirror's paths when there is one
/// ([`classify::classify_mirrored`]), and, for a download from the
/// ecosystems whose indexes list files by URL (PyPI, npm), with the place
/// it is asked for, so that it is authorised only where the filtered index
/// lists it. PyPI's legacy `/packages/<py>/<l>/<project>/<file>` paths on
/// the public file host are an alias PyPI itself redirects to the listed
/// path: those are authorised by name.
pub(super) fn classify_request(
    m: Option<&Mirror>,
    eco: Ecosystem,
    host: &str,
    method: &str,
    path: &str,
    accept: Option<&str>,
) -> Classified {
    let read_as = public_path(m, path);
    let mut c = match m {
        Some(_) => classify::classify_mirrored(eco, host, method, &read_as, accept),
        None => classify(Some(eco), host, method, &read_as, accept),
    };
    if let Classified::Package(PackageRef {
        kind: Kind::Artifact(a),
        ..
    }) = &mut c
    {
        let listed_by_url = matches!(eco, Ecosystem::Pypi | Ecosystem::Npm);
        if listed_by_url && !(m.is_none() && pypi_legacy_path(host, path)) {
            // npm reads `%2f` in a registry path as the scope separator
            // (`/@s%2fn/-/n-1.0.0.tgz` is `/@s/n/-/n-1.0.0.tgz`).
            let path = match eco {
                Ecosystem::Npm => {
                    std::borrow::Cow::Owned(path.replace("%2f", "/").replace("%2F", "/"))
                }
                _ => std::borrow::Cow::Borrowed(path),
            };
            a.at = Some(request_at(host, &path));
        }
    }
    c
}

/// A path of PyPI's legacy layout on its public file host.
fn pypi_legacy_path(host: &str, path: &str) -> bool {
    let hex = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let segs: Vec<&str> = path.split('/').collect();
    host.eq_ignore_ascii_case("files.pythonhosted.org")
        && matches!(segs.as_slice(), ["", "packages", a, b, _, _] if !(hex(a) && hex(b)))
}

/// Where a mirror keeps its documents and files: its URL's path, without
/// PyPI's `simple/` (`/api/pypi/simple/` keeps files under `/api/pypi/`).
pub(super) fn mirror_base(m: &Mirror) -> &str {
    match m.ecosystem {
        Ecosystem::Pypi => m.path.strip_suffix("simple/").unwrap_or(&m.path),
        _ => &m.path,
    }
}

/// The registry path a request names, for classifying it: a path under
/// the mirror's base (a URL egressd rewrote from a mirror's document) is
/// read without that base (`/api/pypi/packages/…` is `/packages/…`).
pub(super) fn public_path<'a>(m: Option<&Mirror>, path: &'a str) -> std::borrow::Cow<'a, str> {
    if let Some(m) = m {
        let base = mirror_base(m);
        if base != "/" {
            if let Some(rest) = path.strip_prefix(base) {
                return format!("/{rest}").into();
            }
        }
    }
    path.into()
}

/// The public host a mirror's absolute URLs are rewritten to: the
/// ecosystem's file host.
pub(super) fn public_file_host(eco: Ecosystem) -> &'static str {
    match eco {
        Ecosystem::Pypi => "files.pythonhosted.org",
        Ecosystem::Npm => "registry.npmjs.org",
        Ecosystem::Cargo => "static.crates.io",
        Ecosystem::Go => "proxy.golang.org",
    }
}

/// A mirror document with its absolute URLs into the mirror pointing at
/// the public file host with the same path, which egressd routes back to
/// the mirror. A URL is into the mirror when its host is the mirror's
/// (in any case) and its port the mirror's or none, in either scheme (a
/// mirror behind a TLS-terminating proxy often names itself `http://`),
/// also with JSON's escaped slashes (`https:\/\/mirror.corp\/…`).
pub(crate) fn rewrite_mirror_urls(m: &Mirror, doc: &[u8]) -> Vec<u8> {
    let to = public_file_host(m.ecosystem);
    let mut out = Vec::with_capacity(doc.len());
    let mut i = 0;
    while i < doc.len() {
        match mirror_url_at(m, &doc[i..]) {
            Some((len, slash)) => {
                out.extend_from_slice(b"https:");
                out.extend_from_slice(slash);
                out.extend_from_slice(slash);
                out.extend_from_slice(to.as_bytes());
                out.extend_from_slice(slash);
                i += len;
            }
            None => {
                out.push(doc[i]);
                i += 1;
            }
        }
    }
    out
}

/// At the start of `b`, a URL prefix into the mirror
/// (`scheme://host[:port]/`): its length and the slash it is spelled with
/// (`/` or `\/`).
fn mirror_url_at(m: &Mirror, b: &[u8]) -> Option<(usize, &'static [u8])> {
    if !matches!(b.first(), Some(b'h' | b'H')) {
        return None;
    }
    let lower = |n: usize| b.get(..n).map(<[u8]>::to_ascii_lowercase);
    let mut i = if lower(5)? == b"https" {
        5
    } else if lower(4)? == b"http" {
        4
    } else {
        return None;
    };
    if b.get(i) != Some(&b':') {
        return None;
    }
    i += 1;
    let slash: &'static [u8] = if b[i..].starts_with(b"//") {
        b"/"
    } else if b[i..].starts_with(b"\\/\\/") {
        b"\\/"
    } else {
        return None;
    };
    i += 2 * slash.len();
    let host = m.host.as_bytes();
    if !b.get(i..i + host.len())?.eq_ignore_ascii_case(host) {
        return None;
    }
    i += host.len();
    if b.get(i) == Some(&b':') {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        let port = std::str::from_utf8(&b[i + 1..i + 1 + digits]).ok()?;
        if port.parse::<u16>().ok()? != m.port {
            return None;
        }
        i += 1 + digits;
    }
    b[i..]
        .starts_with(slash)
        .then_some((i + slash.len(), slash))
}

/// cargo's `config.json` when cargo's registry has a mirror: the mirror's
/// own, read by egressd (its own line), with its URLs into the mirror
/// (`dl`, `api`) named as the public hosts like every mirror document's,
/// so cargo's downloads come back through egressd to the mirror. The line
/// of the client's request is recorded here.
pub(super) async fn cargo_config(at: &Allowed<'_>, m: &Mirror, mut ev: Event) -> Gate {
    const PATH: &str = "/config.json";
    let got = {
        let mut own = Event::new(Proto::Tls, ev.src);
        own.client = ev.client.clone();
        own.origin = Some("egressd");
        own.method = Some("GET".into());
        own.path = Some(PATH.into());
        let host = at.dest.target.to_string();
        let got = own_fetch_inner(
            OnBehalf::of(at, &ev),
            Ecosystem::Cargo,
            (&host, PATH, "application/json"),
            &mut own,
            Some(m),
            true,
        )
        .await;
        if let Err(why) = &got {
            own.error.get_or_insert_with(|| why.to_string());
        }
        at.ctx.recorder.record(own);
        got
    };
    match got {
        Ok((_, body)) => {
            let body = rewrite_mirror_urls(m, &body);
            ev.status = Some(200);
            ev.bytes_down = body.len() as u64;
            ev.add_note(Some(
                "the cargo mirror's config.json, its URLs named as the public hosts".into(),
            ));
            let resp = Response::builder()
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(respond::full(body))
                .expect("a static header");
            at.ctx.recorder.record(ev);
            Gate::Answered(resp)
        }
        Err(why) => {
            let answer = Denied {
                eco: Ecosystem::Cargo,
                reason: PackageReason::IndexUnfilterable,
                name: None,
                version: None,
                did_you_mean: None,
                set: None,
                detail: Some(format!(
                    "egressd could not read the mirror's config.json: {why}"
                )),
            };
            Gate::Answered(enforced_deny(ev, answer, at.decision, at.responder))
        }
    }
}

/// A mirror's answer as the client gets it: a `Location` into the mirror
/// named as the public registry, like the URLs in its documents (PyPI's
/// index pages on `pypi.org`, everything else on the file host), so a
/// client that follows it comes back through egressd to the mirror.
pub(crate) fn rewrite_mirror_location(m: &Mirror, headers: &mut http::HeaderMap) {
    let Some(loc) = headers.get(http::header::LOCATION) else {
        return;
    };
    let rewritten = rewrite_mirror_urls(m, loc.as_bytes());
    if rewritten == loc.as_bytes() {
        return;
    }
    let mut s = String::from_utf8_lossy(&rewritten).into_owned();
    if m.ecosystem == Ecosystem::Pypi {
        let index = format!("https://{}{}", public_file_host(m.ecosystem), m.path);
        if let Some(rest) = s.strip_prefix(&index) {
            s = format!("https://pypi.org/simple/{rest}");
        }
    }
    if let Ok(v) = http::HeaderValue::from_str(&s) {
        headers.insert(http::header::LOCATION, v);
    }
}

// ---------------------------------------------------------------- downloads
