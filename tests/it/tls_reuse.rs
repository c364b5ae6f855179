//! What interception reuses, and that reuse never crosses what the policy
//! checked. Client side: a sandbox client that comes back resumes its TLS
//! session (no new handshake with egressd's leaf), but only in a tunnel to
//! the host the session was made for. Origin side: egressd keeps its
//! verified TLS connections to an origin and sends later requests over
//! them, but only requests for the same name at the same checked address.
//!
//! Real clients (rustls, blocking) through a real egressd to local TLS
//! origins on 127.0.0.2 and 127.0.0.3 that say, in every answer, which
//! address and which connection (and the SNI it was opened with) served it.

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::{HandshakeKind, NamedGroup};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use crate::support::tls::{provider, serve_tls, server_config, test_pki, CertKey};
use crate::support::*;

/// A TLS origin (http/1.1) on `at` answering `<local address> <SNI> <n>`,
/// n counting the TLS connections it accepted (1 for the first).
fn which_origin(at: SocketAddr, ck: CertKey) -> std::io::Result<SocketAddr> {
    let l = std::net::TcpListener::bind(at)?;
    let addr = l.local_addr()?;
    let conns = Arc::new(AtomicUsize::new(0));
    serve_tls(l, server_config(ck, &[b"http/1.1"]), 1, move |tls| {
        let n = conns.fetch_add(1, Ordering::SeqCst) + 1;
        let sni = tls.get_ref().1.server_name().unwrap_or("-").to_string();
        let who = format!("{} {sni} {n}", addr.ip());
        let svc = hyper::service::service_fn(move |_req| {
            let who = who.clone();
            async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(who)))) }
        });
        async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        }
    });
    Ok(addr)
}

/// Two such origins on one port, at 127.0.0.2 and 127.0.0.3.
fn two_origins(ck: impl Fn() -> CertKey) -> (SocketAddr, SocketAddr) {
    for _ in 0..20 {
        let a = which_origin("127.0.0.2:0".parse().unwrap(), ck()).unwrap();
        let at = SocketAddr::new("127.0.0.3".parse().unwrap(), a.port());
        if let Ok(b) = which_origin(at, ck()) {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

struct Setup {
    lab: Lab<SocketAddr>,
    ca: PathBuf,
    port: u16,
}

const NAMES: [&str; 3] = ["a.test", "b.test", "c.test"];
/// The origins' addresses, also CONNECTed to as literals (no SNI).
const ADDRS: [&str; 2] = ["127.0.0.2", "127.0.0.3"];

/// egressd intercepting `a.test`, `b.test` and `c.test` on the origins'
/// port (a path rule), and the origins' two addresses as literals,
/// trusting the origins' CA. a.test and c.test resolve to 127.0.0.2,
/// b.test to 127.0.0.3.
fn setup() -> Setup {
    let pki = test_pki();
    let (a, b) = two_origins(|| pki.leaf(&[&NAMES[..], &ADDRS[..]].concat()));
    let lab = lab_with(a)
        .names(&["a.test", "c.test"])
        .intercept(&pki.ca_pem)
        .start(|ports| {
            policy()
                .exception("inspected")
                .hosts(&NAMES)
                .cidr(LOOPBACK)
                .port(ports.origin)
                .path("/**")
                .exception("inspected-addresses")
                .cidr("127.0.0.2/32")
                .cidr("127.0.0.3/32")
                .port(ports.origin)
                .path("/**")
        });
    lab.dns.set("b.test", &[&b.ip().to_string()]);
    Setup {
        ca: lab.ca_pem(),
        port: a.port(),
        lab,
    }
}

/// A client config trusting egressd's CA, resuming through `store`.
fn client(ca: &Path, store: Arc<dyn ClientSessionStore>, tls12: bool) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    c.resumption = Resumption::store(store);
    Arc::new(c)
}

/// Through a new CONNECT tunnel to `host`: a TLS handshake named `host`
/// and one GET. Returns the body and how the handshake went.
fn get(s: &Setup, config: &Arc<rustls::ClientConfig>, host: &str) -> (String, HandshakeKind) {
    let authority = format!("{host}:{}", s.port);
    let mut tcp = connect(s.lab.e.proxy);
    write!(
        tcp,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(tcp.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "CONNECT {authority}: {status}");
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        if l.trim().is_empty() {
            break;
        }
    }
    assert!(r.buffer().is_empty(), "nothing after the CONNECT's answer");
    let conn = rustls::ClientConnection::new(
        config.clone(),
        ServerName::try_from(host.to_string()).unwrap(),
    )
    .unwrap();
    let mut t = rustls::StreamOwned::new(conn, tcp);
    write!(
        t,
        "GET /x HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    // Read to the end; egressd closes after the answer (it may do so
    // without close_notify once everything is sent).
    let _ = t.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "GET via {host}: {text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    let kind = t.conn.handshake_kind().expect("handshake done");
    (body, kind)
}

#[test]
fn a_returning_client_resumes_its_session_tls13_and_tls12() {
    let s = setup();
    for tls12 in [false, true] {
        let store = Arc::new(ClientSessionMemoryCache::new(32));
        let c = client(&s.ca, store, tls12);
        let (body, first) = get(&s, &c, "a.test");
        assert!(body.starts_with("127.0.0.2 a.test"), "{body}");
        assert_eq!(
            first,
            HandshakeKind::Full,
            "tls12={tls12}: nothing to resume yet"
        );
        for i in 0..3 {
            let (body, kind) = get(&s, &c, "a.test");
            assert!(body.starts_with("127.0.0.2 a.test"), "{body}");
            assert_eq!(
                kind,
                HandshakeKind::Resumed,
                "tls12={tls12}: connection {} of a returning client",
                i + 2
            );
        }
    }
    // Every request inside was still decided and logged.
    eventually("a tls line per request", || {
        let n = s
            .lab
            .e
            .log_lines()
            .into_iter()
            .filter(|l| l["proto"] == "tls" && l["decision"] == "allow")
            .count();
        (n == 8).then_some(())
    });
}

/// A client session store that offers whatever session it holds to any
/// server: what a client would do to carry a session made in a tunnel to
/// one host into a tunnel to another.
#[derive(Debug)]
struct OneForAll(ClientSessionMemoryCache);

fn any() -> ServerName<'static> {
    ServerName::try_from("any.invalid").unwrap()
}

impl ClientSessionStore for OneForAll {
    fn set_kx_hint(&self, _: ServerName<'static>, group: NamedGroup) {
        self.0.set_kx_hint(any(), group)
    }
    fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
        self.0.kx_hint(&any())
    }
    fn set_tls12_session(
        &self,
        _: ServerName<'static>,
        v: rustls::client::Tls12ClientSessionValue,
    ) {
        self.0.set_tls12_session(any(), v)
    }
    fn tls12_session(&self, _: &ServerName<'_>) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.0.tls12_session(&any())
    }
    fn remove_tls12_session(&self, _: &ServerName<'static>) {
        self.0.remove_tls12_session(&any())
    }
    fn insert_tls13_ticket(
        &self,
        _: ServerName<'static>,
        v: rustls::client::Tls13ClientSessionValue,
    ) {
        self.0.insert_tls13_ticket(any(), v)
    }
    fn take_tls13_ticket(
        &self,
        _: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.0.take_tls13_ticket(&any())
    }
}

#[test]
fn a_session_from_one_host_is_not_resumed_in_a_tunnel_to_another() {
    let s = setup();
    for tls12 in [false, true] {
        let c = client(
            &s.ca,
            Arc::new(OneForAll(ClientSessionMemoryCache::new(32))),
            tls12,
        );
        let (_, first) = get(&s, &c, "a.test");
        assert_eq!(first, HandshakeKind::Full);
        // The store does offer it back: to a.test it resumes...
        let (_, again) = get(&s, &c, "a.test");
        assert_eq!(
            again,
            HandshakeKind::Resumed,
            "tls12={tls12}: the store works"
        );
        // ...but a tunnel to c.test (same address, same origin port) gets a
        // full handshake on c.test's own leaf.
        let (body, other) = get(&s, &c, "c.test");
        assert!(body.starts_with("127.0.0.2 c.test"), "{body}");
        assert_eq!(
            other,
            HandshakeKind::Full,
            "tls12={tls12}: a.test's session resumed in a tunnel to c.test"
        );
    }
    // Address literals carry no SNI, so nothing in the ClientHello tells
    // the two tunnels apart: a session from the tunnel to 127.0.0.2 must
    // still not resume in the one to 127.0.0.3.
    for tls12 in [false, true] {
        let c = client(
            &s.ca,
            Arc::new(OneForAll(ClientSessionMemoryCache::new(32))),
            tls12,
        );
        let (body, first) = get(&s, &c, ADDRS[0]);
        assert!(body.starts_with("127.0.0.2 - "), "{body}");
        assert_eq!(first, HandshakeKind::Full);
        let (_, again) = get(&s, &c, ADDRS[0]);
        assert_eq!(
            again,
            HandshakeKind::Resumed,
            "tls12={tls12}: the store works"
        );
        let (body, other) = get(&s, &c, ADDRS[1]);
        assert!(body.starts_with("127.0.0.3 - "), "{body}");
        assert_eq!(
            other,
            HandshakeKind::Full,
            "tls12={tls12}: 127.0.0.2's session resumed in a tunnel to 127.0.0.3"
        );
    }
}

#[test]
fn pooled_origin_connections_serve_only_the_name_and_address_they_were_checked_for() {
    let s = setup();
    let c = client(&s.ca, Arc::new(ClientSessionMemoryCache::new(32)), false);
    // The first request opens a connection to a.test at 127.0.0.2; a
    // second tunnel's request to a.test goes over the same one: pooled.
    let (first, _) = get(&s, &c, "a.test");
    assert_eq!(first, "127.0.0.2 a.test 1");
    let (again, _) = get(&s, &c, "a.test");
    assert_eq!(again, "127.0.0.2 a.test 1", "origin connections are pooled");
    // b.test resolves elsewhere: its request reaches 127.0.0.3 on its own
    // connection, never a.test's pooled one.
    let (b, _) = get(&s, &c, "b.test");
    assert_eq!(
        b, "127.0.0.3 b.test 1",
        "b.test went over a.test's connection"
    );
    // c.test resolves to a.test's address: still its own connection, made
    // and verified for c.test (no coalescing of names on one connection).
    let (cc, _) = get(&s, &c, "c.test");
    assert_eq!(
        cc, "127.0.0.2 c.test 2",
        "c.test went over a.test's connection"
    );
    // And a.test's connection is still there, still a.test's alone.
    let (a, _) = get(&s, &c, "a.test");
    assert_eq!(a, "127.0.0.2 a.test 1");
}
