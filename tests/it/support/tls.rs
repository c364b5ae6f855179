//! TLS for the tests: a test PKI (the origins' own CA, not egressd's) and
//! a local HTTPS origin (h2 and/or http/1.1 by ALPN) that records what it
//! was asked. `tests/it/tls.rs` and the transparent, browser and TLS-reuse
//! tests use them.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Listener;

// ---------------------------------------------------------------- test PKI

/// The origins' own CA (not egressd's), and certificates it signs.
pub struct TestPki {
    issuer: Issuer<'static, KeyPair>,
    pub ca_pem: String,
}

pub fn test_pki() -> TestPki {
    test_pki_named("egressd test origin CA")
}

/// A test CA whose certificate is named `cn` (the registry's, the git
/// server's: each far side has a CA of its own).
pub fn test_pki_named(cn: &str) -> TestPki {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = p.self_signed(&key).unwrap();
    TestPki {
        ca_pem: cert.pem(),
        issuer: Issuer::new(p, key),
    }
}

pub type CertKey = (CertificateDer<'static>, PrivateKeyDer<'static>);

impl TestPki {
    pub fn leaf(&self, names: &[&str]) -> CertKey {
        let key = KeyPair::generate().unwrap();
        let p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.der().clone(), pkcs8(&key))
    }
}

pub fn pkcs8(key: &KeyPair) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()))
}

/// A certificate for `name` that no CA vouches for.
pub fn self_signed(name: &str) -> CertKey {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.der().clone(), pkcs8(&key))
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

// ---------------------------------------------------------------- serving TLS

/// A server config for `cert`/`key` offering `alpn`, on ring.
pub fn server_config((cert, key): CertKey, alpn: &[&[u8]]) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// The TLS accept loop every test server shares: on a thread of its own, a
/// tokio runtime (`workers` threads; 1: one current-thread runtime) accepts
/// on `l`, completes the handshake with `config` and hands each connection
/// to `serve`. A failed handshake is dropped.
pub fn serve_tls<S, F>(
    l: std::net::TcpListener,
    config: rustls::ServerConfig,
    workers: usize,
    serve: S,
) where
    S: Fn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    l.set_nonblocking(true).unwrap();
    let serve = Arc::new(serve);
    thread::spawn(move || {
        let mut rt = if workers > 1 {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(workers);
            b
        } else {
            tokio::runtime::Builder::new_current_thread()
        };
        let rt = rt.enable_all().build().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((tcp, _)) = l.accept().await else {
                    continue;
                };
                let (acceptor, serve) = (acceptor.clone(), serve.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    serve(tls).await;
                });
            }
        });
    });
}

/// An HTTPS server on `l` ([`serve_tls`]): HTTP/1.1 or h2 by ALPN, with
/// upgrades, each request answered by `handle`.
///
/// Nagle is off on every connection, as PyPI's and npm's front ends have it
/// (and nginx, Go, Node): with it on, the answer to a request sent right
/// after the handshake waited for the client's delayed ACK of the session
/// tickets, 40 ms, for fast clients such as egressd's upstream side.
pub fn serve_https<H, F>(
    l: std::net::TcpListener,
    config: rustls::ServerConfig,
    workers: usize,
    handle: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    serve_tls(l, config, workers, move |tls| {
        let handle = handle.clone();
        async move {
            let _ = tls.get_ref().0.set_nodelay(true);
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(
                    TokioIo::new(tls),
                    hyper::service::service_fn(handle),
                )
                .await;
        }
    });
}

// ---------------------------------------------------------------- TLS origin

/// A request as the TLS origin received it.
#[derive(Debug, Clone)]
pub struct SeenTls {
    pub method: String,
    pub target: String,
    pub version: String,
    pub headers: Vec<(String, String)>,
}

impl SeenTls {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A local HTTPS origin (h2 and/or http/1.1 by ALPN) that records every
/// request, answers `hello from tls origin <target>`, and echoes bytes
/// after an `Upgrade`.
pub struct TlsOrigin {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<SeenTls>>>,
}

impl TlsOrigin {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
    pub fn last(&self) -> Option<SeenTls> {
        self.seen.lock().unwrap().last().cloned()
    }
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
    /// Every request's method and target, in order.
    pub fn requests(&self) -> Vec<(String, String)> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .map(|s| (s.method.clone(), s.target.clone()))
            .collect()
    }
}

impl Listener for TlsOrigin {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

pub fn tls_origin(ck: CertKey, alpn: &[&[u8]]) -> TlsOrigin {
    tls_origin_on("127.0.0.1".parse().unwrap(), ck, alpn)
}

/// [`tls_origin`] on another local address.
pub fn tls_origin_on(ip: std::net::IpAddr, ck: CertKey, alpn: &[&[u8]]) -> TlsOrigin {
    tls_origin_at(std::net::SocketAddr::new(ip, 0), ck, alpn)
}

/// A [`TlsOrigin`] on `at` (a fixed port, for a browser that is given URLs
/// without one).
pub fn tls_origin_at(at: std::net::SocketAddr, ck: CertKey, alpn: &[&[u8]]) -> TlsOrigin {
    let l = std::net::TcpListener::bind(at).unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    serve_https(l, server_config(ck, alpn), 1, move |req| {
        origin_handle(req, s2.clone())
    });
    TlsOrigin { addr, seen }
}

async fn origin_handle(
    mut req: Request<Incoming>,
    seen: Arc<Mutex<Vec<SeenTls>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    seen.lock().unwrap().push(SeenTls {
        method: req.method().to_string(),
        target: target.clone(),
        version: format!("{:?}", req.version()),
        // HTTP/2's :authority (the URI's, which hyper takes from it) is
        // kept as a header of that name, beside any `host`.
        headers: req
            .uri()
            .authority()
            .filter(|_| req.version() == http::Version::HTTP_2)
            .map(|a| (":authority".to_string(), a.to_string()))
            .into_iter()
            .chain(
                req.headers()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string())),
            )
            .collect(),
    });
    if let Some(proto) = req.headers().get(http::header::UPGRADE).cloned() {
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let Ok(up) = on.await else { return };
            let mut io = TokioIo::new(up);
            let mut buf = [0u8; 4096];
            while let Ok(n) = io.read(&mut buf).await {
                if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        return Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(http::header::UPGRADE, proto)
            .header(http::header::CONNECTION, "upgrade")
            .body(Full::new(Bytes::new()))
            .unwrap());
    }
    // `x-echo: authorization` asks for the request's Authorization back,
    // in a header and in the body, as a debug endpoint would echo it.
    let echo = req
        .headers()
        .get("x-echo")
        .filter(|v| v.as_bytes() == b"authorization")
        .and(req.headers().get(http::header::AUTHORIZATION))
        .cloned();
    let _ = req.into_body().collect().await;
    let mut resp = Response::builder().header("x-origin", "tls");
    let mut body = format!("hello from tls origin {target}");
    if let Some(v) = echo {
        body.push_str(&format!("\nyou sent: {}\n", v.to_str().unwrap_or("?")));
        resp = resp.header("x-echo-authorization", v);
    }
    Ok(resp.body(Full::new(Bytes::from(body))).unwrap())
}
