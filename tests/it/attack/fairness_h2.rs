//! What one client causes counts against its share (issue 41, item 1).
//!
//! The zero-window stall: a client intercepted over HTTP/2 sets
//! `SETTINGS_INITIAL_WINDOW_SIZE = 0`, opens every stream it may on a few
//! connections, each for a large body, and never sends a `WINDOW_UPDATE`.
//! Each stream held an upstream connection and a buffered chunk for the
//! 600 s idle timeout, beyond the client's share. Now each stream counts
//! against the share (the rest are refused `503 overloaded`), a connection
//! advertises at most 100 streams, and a stream whose client keeps its
//! window shut past `settings.limits.stall_timeout` is reset, with its
//! line. Meanwhile another client's intercepted requests are answered as
//! fast as when idle, and egressd's descriptors stay bounded.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::support::tls::{provider, serve_tls, server_config, test_pki, CertKey};

const HOG: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const OTHER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// Each client's share in this lab.
const SHARE: usize = 64;
/// The hog's HTTP/2 connections, each opening [`STREAMS`] streams.
const CONNS: usize = 4;
const STREAMS: usize = 100;
/// The body each of the hog's streams asks for.
const BIG: usize = 8 << 20;
/// The other client's requests per measurement.
const SAMPLES: usize = 30;

/// An HTTP/1.1 TLS origin: `/big` answers [`BIG`] bytes, anything else a
/// few.
fn big_origin(ck: CertKey) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let big = Bytes::from(vec![b'x'; BIG]);
    serve_tls(l, server_config(ck, &[b"http/1.1"]), 1, move |tls| {
        let big = big.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let body = if req.uri().path() == "/big" {
                big.clone()
            } else {
                Bytes::from_static(b"small")
            };
            async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
        });
        async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        }
    });
    addr
}

pub(super) struct Addr(pub SocketAddr);
impl Listener for Addr {
    fn addr(&self) -> SocketAddr {
        self.0
    }
}

pub(super) type H2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// An HTTP/2 connection from `from` through egressd's CONNECT to
/// `big.test:port`, intercepted (TLS with egressd's CA), with the stream
/// window `window`.
pub(super) async fn h2_through(
    from: Ipv4Addr,
    proxy: SocketAddr,
    port: u16,
    ca: &Path,
    window: Option<u32>,
) -> H2 {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((from, 0))).unwrap();
    let mut tcp = sock.connect(proxy).await.unwrap();
    tcp.write_all(
        format!("CONNECT big.test:{port} HTTP/1.1\r\nHost: big.test:{port}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(tcp.read(&mut b).await.unwrap(), 1, "CONNECT answer cut");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "CONNECT: {head}");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("big.test").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut b = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    if let Some(w) = window {
        b.initial_stream_window_size(w);
    }
    let (send, conn) = b.handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    send
}

pub(super) fn get(port: u16, path: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .uri(format!("https://big.test:{port}{path}"))
        .body(Empty::new())
        .unwrap()
}

/// `SAMPLES` small requests on a new connection from [`OTHER`], each
/// answered `200` in full: their latencies, sorted (the connection's set-up
/// is the first sample's).
async fn other_client(proxy: SocketAddr, port: u16, ca: &Path) -> Vec<Duration> {
    let t = Instant::now();
    let mut h2 = h2_through(OTHER, proxy, port, ca, None).await;
    let mut out = Vec::new();
    let mut start = t;
    for i in 0..SAMPLES {
        h2.ready().await.unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), h2.send_request(get(port, "/")))
            .await
            .unwrap_or_else(|_| panic!("the other client's request {i} not answered in 5s"))
            .unwrap();
        assert_eq!(resp.status(), 200, "the other client's request {i}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"small");
        out.push(start.elapsed());
        start = Instant::now();
    }
    out.sort();
    out
}

pub(super) fn p50(v: &[Duration]) -> Duration {
    v[v.len() / 2]
}

/// egressd's open descriptors and resident and peak memory (KiB).
fn footprint(pid: u32) -> (usize, u64, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (fds, kib("VmRSS:"), kib("VmHWM:"))
}

/// An intercepting egressd (its CA: [`Lab::ca_pem`]) in front of
/// [`big_origin`] for `big.test`, allowed by an exception with a path rule
/// (`paths`, requests decided inside), `settings.limits` set to `limits`.
pub(super) fn intercept_lab(paths: &str, limits: &str) -> Lab<Addr> {
    let pki = test_pki();
    let origin = big_origin(pki.leaf(&["big.test"]));
    lab_with(Addr(origin))
        .names(&["big.test"])
        .intercept(&pki.ca_pem)
        .start(|ports| {
            policy()
                .exception("big")
                .host("big.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .path(paths)
                .setting("limits", limits)
        })
}

#[test]
fn zero_window_streams_count_against_the_share_and_are_reset() {
    let began = Instant::now();
    let il = intercept_lab(
        "/**",
        &format!("{{ connections_per_client: {SHARE}, stall_timeout: 3s }}"),
    );
    let (l, ca) = (&il, &il.ca_pem());
    let origin = l.origin.0;
    let (proxy, port, pid) = (l.e.proxy, origin.port(), l.e.child.id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let idle = rt.block_on(other_client(proxy, port, ca));
    let (fds0, rss0, _) = footprint(pid);

    // The hog: every stream it may, for a large body, window shut.
    let (statuses, hog) = rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..CONNS {
            conns.push(h2_through(HOG, proxy, port, ca, Some(0)).await);
        }
        let mut pending = Vec::new();
        for h2 in &mut conns {
            for _ in 0..STREAMS {
                let mut h2 = h2.clone();
                pending.push(tokio::spawn(async move {
                    h2.ready().await.ok()?;
                    let f = h2.send_request(get(port, "/big"));
                    tokio::time::timeout(Duration::from_secs(5), f)
                        .await
                        .ok()?
                        .ok()
                }));
            }
        }
        let mut statuses = Vec::new();
        let mut held = Vec::new();
        for p in pending {
            if let Some(resp) = p.await.unwrap() {
                statuses.push(resp.status().as_u16());
                held.push(resp);
            }
        }
        (statuses, (conns, held))
    });
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 503).count();
    let (fds1, rss1, _) = footprint(pid);
    let during = rt.block_on(other_client(proxy, port, ca));
    let (fds2, rss2, hwm) = footprint(pid);
    eprintln!(
        "hog: {ok} streams answered 200, {refused} refused 503; egressd fds {fds0} idle, \
         {} under attack; RSS {rss0} KiB idle, {} KiB under attack, peak {hwm} KiB",
        fds1.max(fds2),
        rss1.max(rss2)
    );
    eprintln!(
        "other client: p50 {:?} max {:?} idle; p50 {:?} max {:?} under attack",
        p50(&idle),
        idle.last().unwrap(),
        p50(&during),
        during.last().unwrap()
    );

    // The share holds: the hog's connections and streams together.
    assert!(
        ok + CONNS <= SHARE,
        "{ok} streams held an upstream connection each beyond a share of {SHARE}"
    );
    assert!(refused > 0, "the streams past the share are refused");
    assert!(
        fds1.max(fds2) <= fds0 + 2 * SHARE + 16,
        "egressd's descriptors grew from {fds0} to {} under one client's stalled streams",
        fds1.max(fds2)
    );
    // The other client is served as when idle (a loaded machine's slack
    // beside the factor of 2).
    let slack = Duration::from_millis(25);
    assert!(
        p50(&during) <= p50(&idle) * 2 + slack,
        "the other client's p50 went from {:?} to {:?}",
        p50(&idle),
        p50(&during)
    );
    assert!(
        *during.last().unwrap() <= Duration::from_secs(1),
        "the other client waited {:?}",
        during.last().unwrap()
    );

    // Past the stall bound the stalled streams are reset, each with its
    // line, and what they held is given back.
    let reset = eventually("a line for every stalled stream, reset", || {
        let lines: Vec<_> =
            l.e.log_lines()
                .into_iter()
                .filter(|l| {
                    l["path"] == "/big"
                        && l["status"] == 200
                        && l["error"]
                            .as_str()
                            .is_some_and(|e| e.contains("stream reset"))
                })
                .collect();
        (lines.len() >= ok).then_some(lines)
    });
    assert_eq!(reset.len(), ok);
    assert!(
        l.e.metric("egressd_overload_total{what=\"streams\"}")
            .unwrap_or(0.0)
            >= ok as f64
    );
    // Each refused stream is on record: its own line, or counted in its
    // second's `rate_limited` summary (400 decisions in a second are past
    // the default rate of lines).
    let lines = l.e.log_lines();
    let own = lines
        .iter()
        .filter(|l| l["reason"] == "overloaded" && l["status"] == 503)
        .count() as u64;
    let summed: u64 = lines
        .iter()
        .filter(|l| l["event"] == "rate_limited")
        .flat_map(|l| l["counts"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["reason"] == "overloaded")
        .map(|c| c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(
        own + summed,
        refused as u64,
        "each refused stream is on record"
    );
    eventually("the upstream connections given back", || {
        (footprint(pid).0 <= fds0 + CONNS + 8).then_some(())
    });
    drop(hog);
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "took {:?}",
        began.elapsed()
    );
}
