//! What TLS interception costs beside a plain CONNECT tunnel, measured in
//! one run on loopback: an in-process egressd (`app::start`, the code
//! `serve` runs, with a decision log file) in front of a local TLS origin
//! that serves both paths on two ports. One exception tunnels the first
//! port untouched; the other has `paths:`, so its port is intercepted.
//!
//! Rows: new tunnels with a TLS handshake and nothing else (handshakes/s),
//! new tunnels with one GET, and GETs on kept-alive HTTP/1.1 and HTTP/2
//! tunnels (requests/s). The leaf cache is warmed before measuring; the cost
//! of minting a leaf (a cache miss) is printed on its own.
//!
//! `cargo bench --bench mitm` (`-- --secs N --conns N` to change the run).
//! Client, proxy and origin share the machine's cores, so read the ratios
//! more than the absolute numbers.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use egressd::cli::{Cli, Command};
use egressd::policy::host::parse_target;
use egressd::tls::{init_ca, CertAuthority, InitOptions};
use http::Request;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

struct Opts {
    secs: u64,
    conns: usize,
}

fn opts() -> Opts {
    let mut o = Opts { secs: 3, conns: 8 };
    let args: Vec<String> = std::env::args().collect();
    for w in args.windows(2) {
        match w[0].as_str() {
            "--secs" => o.secs = w[1].parse().expect("--secs N"),
            "--conns" => o.conns = w[1].parse().expect("--conns N"),
            _ => {}
        }
    }
    o
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(o));
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS origin on `listener` answering every request with a short body.
fn origin(listener: std::net::TcpListener, config: Arc<rustls::ServerConfig>) {
    listener.set_nonblocking(true).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        let l = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                        b"hello from the bench origin\n",
                    ))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
}

async fn run(o: Opts) {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    init_ca(&InitOptions {
        dir: certs.clone(),
        days: 30,
        force: false,
    })
    .unwrap();

    // The origin's own CA and a certificate for 127.0.0.1.
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let origin_ca = ca_params.self_signed(&ca_key).unwrap();
    let origin_ca_path = dir.path().join("origin-ca.pem");
    std::fs::write(&origin_ca_path, origin_ca.pem()).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let mut sc = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    sc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let sc = Arc::new(sc);
    let plain_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mitm_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_port = plain_l.local_addr().unwrap().port();
    let mitm_port = mitm_l.local_addr().unwrap().port();
    origin(plain_l, sc.clone());
    origin(mitm_l, sc);

    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            r#"
exceptions:
  - id: tunnelled
    owner: bench
    reason: host-only rule, tunnelled untouched
    cidrs: [127.0.0.0/8]
    ports: [{plain_port}]
  - id: intercepted
    owner: bench
    reason: path rule, intercepted
    cidrs: [127.0.0.0/8]
    ports: [{mitm_port}]
    methods: [GET]
    paths: ["/bench/**"]
"#
        ),
    )
    .unwrap();
    let log = dir.path().join("decisions.log");
    let cli = Cli::try_parse_from([
        "egressd",
        "serve",
        "--policy",
        policy.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--dns-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--upstream-dns",
        "127.0.0.1:9",
        "--log",
        log.to_str().unwrap(),
        "--ca-dir",
        certs.to_str().unwrap(),
        "--upstream-ca",
        origin_ca_path.to_str().unwrap(),
    ])
    .unwrap();
    let Command::Serve(args) = cli.command else {
        unreachable!()
    };
    let listeners = egressd::app::Listeners::bind(&args).await.unwrap();
    let running = egressd::app::start(&args, listeners).await.unwrap();
    let proxy = running.proxy;

    // The client trusts both CAs: the origin's (plain tunnels reach it) and
    // egressd's (intercepted tunnels end at egressd).
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(certs.join("ca.pem")).unwrap())
        .unwrap();
    roots.add(origin_ca.der().clone()).unwrap();
    let roots = Arc::new(roots);
    let client_config = |alpn: &[u8]| {
        let mut c = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        c.alpn_protocols = vec![alpn.to_vec()];
        // Every handshake is a full one: resumption would hide the cost.
        c.resumption = rustls::client::Resumption::disabled();
        Arc::new(c)
    };
    let h1 = client_config(b"http/1.1");
    let h2 = client_config(b"h2");

    let ep = |port: u16| Endpoint {
        proxy,
        target: format!("127.0.0.1:{port}"),
    };
    let (plain, mitm) = (Arc::new(ep(plain_port)), Arc::new(ep(mitm_port)));
    // Warm up: mint the leaf, fill the pools, check both paths answer 200.
    for e in [&plain, &mitm] {
        let mut s = e.h1(&h1).await.expect("warm-up connection");
        assert_eq!(s.get().await.expect("warm-up request"), 200);
    }

    println!(
        "egressd TLS interception vs plain CONNECT — loopback, {} concurrent clients, {} s per cell\n",
        o.conns, o.secs
    );
    println!(
        "{:<44} {:>14} {:>14} {:>8}",
        "", "plain CONNECT", "intercepted", "ratio"
    );
    let dur = Duration::from_secs(o.secs);
    let row = |name: &str, p: Rate, m: Rate| {
        println!(
            "{:<44} {:>12.0}/s {:>12.0}/s {:>8.2}{}",
            name,
            p.per_sec,
            m.per_sec,
            m.per_sec / p.per_sec,
            if p.errors + m.errors > 0 {
                format!("  ({} + {} errors)", p.errors, m.errors)
            } else {
                String::new()
            }
        )
    };

    let hs = |e: Arc<Endpoint>, c: Arc<rustls::ClientConfig>| async move {
        e.handshake(&c).await.map(|_| ())
    };
    let p = measure(o.conns, dur, {
        let (e, c) = (plain.clone(), h1.clone());
        move |_| hs(e.clone(), c.clone())
    })
    .await;
    let m = measure(o.conns, dur, {
        let (e, c) = (mitm.clone(), h1.clone());
        move |_| hs(e.clone(), c.clone())
    })
    .await;
    row("TLS handshakes (new tunnel each)", p, m);

    let one = |e: Arc<Endpoint>, c: Arc<rustls::ClientConfig>| async move {
        let mut s = e.h1(&c).await?;
        s.get().await.map(|_| ())
    };
    let p = measure(o.conns, dur, {
        let (e, c) = (plain.clone(), h1.clone());
        move |_| one(e.clone(), c.clone())
    })
    .await;
    let m = measure(o.conns, dur, {
        let (e, c) = (mitm.clone(), h1.clone());
        move |_| one(e.clone(), c.clone())
    })
    .await;
    row("new tunnel + handshake + 1 GET", p, m);

    let p = keep_alive(&plain, &h1, o.conns, dur, false).await;
    let m = keep_alive(&mitm, &h1, o.conns, dur, false).await;
    row("GETs on kept-alive HTTP/1.1 tunnels", p, m);
    let p = keep_alive(&plain, &h2, o.conns, dur, true).await;
    let m = keep_alive(&mitm, &h2, o.conns, dur, true).await;
    row("GETs on kept-alive HTTP/2 tunnels", p, m);

    // A cache miss: what one leaf costs to mint (P-256 key + signature).
    let (ca, _) = CertAuthority::load(&certs).unwrap();
    let n = 200;
    let t = Instant::now();
    for i in 0..n {
        let target = parse_target(&format!("host{i}.bench.test")).unwrap();
        ca.mint(&target).unwrap();
    }
    println!(
        "\nleaf minting (leaf-cache miss): {:.0} µs per leaf, single thread",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    running.shutdown().await;
}

struct Endpoint {
    proxy: SocketAddr,
    target: String,
}

/// One kept-alive client connection, h1 or h2.
enum Session {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Session {
    async fn get(&mut self) -> Result<u16, String> {
        let req = Request::get("/bench/x")
            .header(http::header::HOST, "127.0.0.1")
            .body(Empty::new())
            .unwrap();
        let resp = match self {
            Session::H1(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
            Session::H2(s) => {
                s.ready().await.map_err(|e| e.to_string())?;
                let (mut parts, body) = req.into_parts();
                parts.uri = "https://127.0.0.1/bench/x".parse().unwrap();
                parts.headers.remove(http::header::HOST);
                s.send_request(Request::from_parts(parts, body)).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        resp.into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("status {status}"));
        }
        Ok(status)
    }
}

impl Endpoint {
    async fn tunnel(&self) -> Result<TcpStream, String> {
        let mut s = TcpStream::connect(self.proxy)
            .await
            .map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        let req = format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n", t = self.target);
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        // Read the response head byte by byte: nothing after it is ours.
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b).await.map_err(|e| e.to_string())? == 0 {
                return Err("proxy closed".into());
            }
            head.push(b[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            return Err(String::from_utf8_lossy(&head).into_owned());
        }
        Ok(s)
    }

    async fn handshake(&self, c: &Arc<rustls::ClientConfig>) -> Result<Tls, String> {
        let tcp = self.tunnel().await?;
        let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
        tokio_rustls::TlsConnector::from(c.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())
    }

    async fn h1(&self, c: &Arc<rustls::ClientConfig>) -> Result<Session, String> {
        let tls = self.handshake(c).await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Session::H1(send))
    }

    async fn h2(&self, c: &Arc<rustls::ClientConfig>) -> Result<Session, String> {
        let tls = self.handshake(c).await?;
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Session::H2(send))
    }
}

#[derive(Clone, Copy)]
struct Rate {
    per_sec: f64,
    errors: u64,
}

/// Runs `op(task index)` back to back on `conns` tasks for `dur`.
async fn measure<F, Fut>(conns: usize, dur: Duration, op: F) -> Rate
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + dur;
    let tasks: Vec<_> = (0..conns)
        .map(|i| {
            let (op, done, errors) = (op.clone(), done.clone(), errors.clone());
            tokio::spawn(async move {
                while Instant::now() < end {
                    match op(i).await {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("first error: {e}");
                            }
                            0
                        }
                    };
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    Rate {
        per_sec: done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
        errors: errors.load(Ordering::Relaxed),
    }
}

/// GETs back to back on `conns` connections opened beforehand.
async fn keep_alive(
    e: &Arc<Endpoint>,
    c: &Arc<rustls::ClientConfig>,
    conns: usize,
    dur: Duration,
    h2: bool,
) -> Rate {
    let mut sessions = Vec::new();
    for _ in 0..conns {
        let s = if h2 { e.h2(c).await } else { e.h1(c).await };
        sessions.push(tokio::sync::Mutex::new(s.expect("session")));
    }
    let sessions = Arc::new(sessions);
    // Task i uses session i only: the lock is never contended.
    measure(conns, dur, move |i| {
        let sessions = sessions.clone();
        async move { sessions[i].lock().await.get().await.map(|_| ()) }
    })
    .await
}
