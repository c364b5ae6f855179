//! TLS interception end to end: `egressd ca init`, then curl, Python and a
//! rustls client through an intercepting egressd to a local TLS origin
//! whose certificate comes from a test CA made here (given to egressd with
//! `--upstream-ca`). Names resolve through the fake DNS to 127.0.0.1;
//! exceptions list the origins' real ports.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use crate::support::tls::*;
use crate::support::*;

const TOKEN: &str = "s3cret-gh-token-4242";

// ---------------------------------------------------------------- setup

struct Setup {
    e: Egressd,
    /// egressd's CA certificate (what a sandbox trusts).
    ca: PathBuf,
    /// h2 + http/1.1 origin for api.test and other.test.
    api: TlsOrigin,
    /// http/1.1-only origin for h1.test.
    h1: TlsOrigin,
    /// An origin whose certificate no trusted CA signed.
    bad: TlsOrigin,
    _dns: FakeDns,
    _dir: tempfile::TempDir,
}

fn ca_init(dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["ca", "init", "--dir"])
        .arg(dir)
        .output()
        .expect("run egressd ca init")
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let out = ca_init(&certs);
    assert!(out.status.success(), "ca init: {out:?}");
    let pki = test_pki();
    let upstream_ca = dir.path().join("origin-ca.pem");
    std::fs::write(&upstream_ca, &pki.ca_pem).unwrap();
    let names = [
        "api.test",
        "other.test",
        "h1.test",
        "plain.test",
        "api.github.com",
    ];
    let api = tls_origin(pki.leaf(&names), &[b"h2", b"http/1.1"]);
    let h1 = tls_origin(pki.leaf(&names), &[b"http/1.1"]);
    let bad = tls_origin(self_signed("bad.test"), &[b"http/1.1"]);
    let Lab {
        e,
        dns,
        origin: api,
        ..
    } = lab_with(api)
        .names(&names)
        .names(&["bad.test"])
        .egressd(|b| {
            b.env("EGRESSD_CA_DIR", certs.to_str().unwrap())
                .env("EGRESSD_UPSTREAM_CA", upstream_ca.to_str().unwrap())
                .env("GH_TOKEN", TOKEN)
        })
        .start(|ports| {
            let all = [ports.origin, h1.port(), bad.port()];
            policy()
                .exception("gh")
                .owner("platform")
                .reason("stand-in for api.github.com, token injected outside the sandbox")
                .hosts(&["api.test", "h1.test", "api.github.com"])
                .cidr(LOOPBACK)
                .ports(&all)
                .methods(&["GET", "HEAD"])
                .path("/repos/**")
                .path("/ws")
                .with(
                    "inject",
                    r#"{ headers: { Authorization: "Bearer ${env:GH_TOKEN}" } }"#,
                )
                .exception("other")
                .owner("platform")
                .reason("a second intercepted host (for fronting attempts)")
                .host("other.test")
                .cidr(LOOPBACK)
                .ports(&all)
                .path("/**")
                .exception("plain")
                .owner("platform")
                .reason("host-only rule, tunnelled untouched")
                .host("plain.test")
                .cidr(LOOPBACK)
                .ports(&all)
                .exception("badcert")
                .owner("platform")
                .reason("an origin with a certificate nobody signed")
                .host("bad.test")
                .cidr(LOOPBACK)
                .ports(&all)
                .path("/**")
        });
    Setup {
        e: e.into_inner(),
        ca: certs.join("ca.pem"),
        api,
        h1,
        bad,
        _dns: dns,
        _dir: dir,
    }
}

// ---------------------------------------------------------------- curl

#[derive(Debug)]
struct CurlOut {
    status: u16,
    version: String,
    headers: String,
    body: String,
    stderr: String,
}

impl CurlOut {
    fn reason(&self) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("x-egressd-reason")
                .then(|| v.trim().to_string())
        })
    }
}

fn curl(s: &Setup, args: &[&str], url: &str) -> CurlOut {
    let tmp = tempfile::tempdir().unwrap();
    let (h, b) = (tmp.path().join("h"), tmp.path().join("b"));
    let out = Command::new(tool("curl"))
        .args(["-sS", "--max-time", "20", "--noproxy", ""])
        .arg("--proxy")
        .arg(format!("http://{}", s.e.proxy))
        .arg("--cacert")
        .arg(&s.ca)
        .arg("-D")
        .arg(&h)
        .arg("-o")
        .arg(&b)
        .args(["-w", "%{http_code} %{http_version}"])
        .args(args)
        .arg(url)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("run curl");
    let w = String::from_utf8_lossy(&out.stdout).to_string();
    let (code, version) = w.split_once(' ').unwrap_or(("0", ""));
    CurlOut {
        status: code.parse().unwrap_or(0),
        version: version.to_string(),
        headers: std::fs::read_to_string(&h).unwrap_or_default(),
        body: std::fs::read_to_string(&b).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

fn url(host: &str, o: &TlsOrigin, path: &str) -> String {
    format!("https://{host}:{}{path}", o.port())
}

fn tls_lines(e: &Egressd) -> Vec<serde_json::Value> {
    e.log_lines()
        .into_iter()
        .filter(|l| l["proto"] == "tls")
        .collect()
}

fn raw_log(e: &Egressd) -> String {
    std::fs::read_to_string(&e.log_path).unwrap_or_default()
}

// ---------------------------------------------------------------- tests

#[test]
fn ca_init_writes_a_private_key_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let out = ca_init(&certs);
    assert!(out.status.success(), "{out:?}");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&certs.join("ca.key")), 0o600);
    assert_eq!(mode(&certs), 0o700);
    assert_eq!(mode(&certs.join("ca.pem")), 0o644);
    let key = std::fs::read_to_string(certs.join("ca.key")).unwrap();
    assert!(key.contains("PRIVATE KEY"));
    let again = ca_init(&certs);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(
        std::fs::read_to_string(certs.join("ca.key")).unwrap(),
        key,
        "the key was not replaced"
    );
}

/// The injected token does not come back into the box over either
/// protocol: an origin that echoes the request's Authorization, in a
/// header and in the body, answers with `*`s in its place (issue #36).
#[test]
fn an_echoed_injected_token_is_replaced_over_http1_and_http2() {
    tool("curl");
    let s = setup();
    // The whole injected value, `Bearer <token>`, byte for byte.
    let stars = "*".repeat("Bearer ".len() + TOKEN.len());
    for proto in ["--http1.1", "--http2"] {
        let r = curl(
            &s,
            &[proto, "-H", "x-echo: authorization"],
            &url("api.test", &s.api, "/repos/echo"),
        );
        assert_eq!(r.status, 200, "{proto}: {r:?}");
        let want = if proto == "--http2" { "2" } else { "1.1" };
        assert_eq!(r.version, want, "{proto}: {r:?}");
        assert!(
            r.body.contains(&format!("you sent: {stars}\n")),
            "{proto}: {r:?}"
        );
        assert!(
            r.headers
                .to_ascii_lowercase()
                .contains(&format!("x-echo-authorization: {stars}\r\n")),
            "{proto}: {r:?}"
        );
        assert!(
            !r.headers.contains(TOKEN) && !r.body.contains(TOKEN),
            "{proto}: {r:?}"
        );
        let seen = s.api.last().expect("origin reached");
        assert_eq!(
            seen.header("authorization"),
            Some(format!("Bearer {TOKEN}").as_str())
        );
    }
}

#[test]
fn curl_method_and_path_rules_with_injected_token() {
    tool("curl");
    let s = setup();
    // Allowed: the origin sees the injected token, replacing the client's.
    let r = curl(
        &s,
        &["--http1.1", "-H", "Authorization: Bearer from-the-sandbox"],
        &url("api.test", &s.api, "/repos/x/y?page=2"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "hello from tls origin /repos/x/y?page=2");
    let seen = s.api.last().expect("origin reached");
    assert_eq!(seen.method, "GET");
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(
        seen.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("authorization"))
            .count(),
        1
    );
    // The origin speaks h2 to egressd: the authority is :authority alone
    // (a `host` beside it is a duplicate nginx answers 400).
    assert_eq!(seen.version, "HTTP/2.0");
    assert_eq!(
        seen.header(":authority"),
        Some(format!("api.test:{}", s.api.port()).as_str())
    );
    assert_eq!(seen.header("host"), None, "{seen:?}");
    assert!(!r.headers.contains(TOKEN) && !r.body.contains(TOKEN));

    // Denied inside the tunnel, with a reason; the origin never hears of it.
    let before = s.api.count();
    let r = curl(
        &s,
        &["--http1.1", "-X", "DELETE"],
        &url("api.test", &s.api, "/repos/x/y"),
    );
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.reason().as_deref(), Some("method_not_allowed"));
    assert!(
        r.body.contains("contact") || r.body.contains("ask"),
        "{r:?}"
    );
    let r = curl(&s, &["--http1.1"], &url("api.test", &s.api, "/admin"));
    assert_eq!(r.status, 403);
    assert_eq!(r.reason().as_deref(), Some("path_not_allowed"));
    assert_eq!(s.api.count(), before);

    let lines = eventually("three tls lines and their connect lines", || {
        let l = s.e.log_lines();
        (l.iter().filter(|l| l["proto"] == "tls").count() >= 3
            && l.iter().filter(|l| l["proto"] == "connect").count() >= 3)
            .then_some(l)
    });
    let tls: Vec<_> = lines.iter().filter(|l| l["proto"] == "tls").collect();
    assert_eq!(tls[0]["decision"], "allow");
    assert_eq!(tls[0]["exception"], "gh");
    assert_eq!(tls[0]["method"], "GET");
    assert_eq!(tls[0]["path"], "/repos/x/y");
    assert_eq!(tls[0]["host"], "api.test");
    assert_eq!(tls[0]["status"], 200);
    assert_eq!(tls[0]["addr"], s.api.addr.to_string());
    assert!(tls[0]["bytes_down"].as_u64().unwrap() > 0);
    assert_eq!(tls[1]["reason"], "method_not_allowed");
    assert_eq!(tls[2]["reason"], "path_not_allowed");
    let connect = lines
        .iter()
        .find(|l| l["proto"] == "connect" && l["event"] == "close")
        .unwrap();
    assert_eq!(connect["decision"], "allow");
    assert_eq!(connect["exception"], "gh");
    assert_eq!(connect["note"], "intercepted");
    assert!(connect["bytes_up"].as_u64().unwrap() > 0);
    assert!(!raw_log(&s.e).contains(TOKEN), "the token reached the log");
    assert!(!s.e.stderr_text().contains(TOKEN));
}

/// The issue's "done means": a GitHub-style exception, a stand-in origin
/// answering for api.github.com, a token the sandbox never sees.
#[test]
fn github_token_reaches_the_origin_and_delete_is_denied() {
    tool("curl");
    let s = setup();
    let r = curl(&s, &[], &url("api.github.com", &s.api, "/repos/x/y"));
    assert_eq!(r.status, 200, "{r:?}");
    let seen = s.api.last().unwrap();
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let r = curl(
        &s,
        &["-X", "DELETE"],
        &url("api.github.com", &s.api, "/repos/x/y"),
    );
    assert_eq!(r.status, 403);
    assert_eq!(r.reason().as_deref(), Some("method_not_allowed"));
    assert!(
        r.body
            .starts_with("egressd denied DELETE https://api.github.com:"),
        "{}",
        r.body
    );
    assert_eq!(s.api.count(), 1);
    assert!(!raw_log(&s.e).contains(TOKEN));
}

/// Inside interception a method override header is decided as a method
/// too, over HTTP/1.1 and HTTP/2 alike: `GET` with
/// `X-HTTP-Method-Override: DELETE` is a `DELETE` to the frameworks that
/// honour it (issue 14).
#[test]
fn method_override_headers_are_decided_inside_interception() {
    tool("curl");
    let s = setup();
    let target = url("api.test", &s.api, "/repos/x/y");
    for version in ["--http1.1", "--http2"] {
        for h in ["X-HTTP-Method-Override: DELETE", "X-Method-Override: PUT"] {
            let r = curl(&s, &[version, "-H", h], &target);
            assert_eq!(r.status, 403, "{version} {h}: {r:?}");
            assert_eq!(r.reason().as_deref(), Some("method_not_allowed"));
        }
        let r = curl(&s, &[version, "-H", "X-HTTP-Method: head"], &target);
        assert_eq!(r.status, 200, "{version}: {r:?}");
        assert_eq!(
            s.api.last().unwrap().header("x-http-method"),
            Some("head"),
            "an allowed override passes untouched"
        );
    }
    assert_eq!(
        s.api.count(),
        2,
        "only the allowed requests reached the origin"
    );
    let denied: Vec<_> = tls_lines(&s.e)
        .into_iter()
        .filter(|l| l["reason"] == "method_not_allowed")
        .collect();
    assert_eq!(denied.len(), 4, "{denied:#?}");
    for l in &denied {
        assert_eq!(
            (&l["method"], &l["status"]),
            (&"GET".into(), &403.into()),
            "{l}"
        );
        assert!(
            l["note"]
                .as_str()
                .is_some_and(|n| n.contains("method override")),
            "{l}"
        );
    }
}

/// Inside interception an HTTP/1.1 head over 64 KiB gets 431, as on the
/// proxy port (there hyper's read buffer bounds it: TLS hands the head
/// over a record at a time).
#[test]
fn heads_over_64_kib_get_431_inside_interception() {
    tool("curl");
    let s = setup();
    let target = url("api.test", &s.api, "/repos/x/y");
    let big = format!("X-Big: {}", "a".repeat(64 << 10));
    let r = curl(&s, &["--http1.1", "-H", &big], &target);
    assert_eq!(r.status, 431, "{r:?}");
    let fits = format!("X-Big: {}", "a".repeat(4 << 10));
    let r = curl(&s, &["--http1.1", "-H", &fits], &target);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(s.api.count(), 1);
    // The second line is written as its answer ends, by the log's writer
    // thread a moment later: waited for, then counted.
    let lines = eventually("both requests' lines", || {
        let l = tls_lines(&s.e);
        (l.len() >= 2).then_some(l)
    });
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(
        (&lines[0]["reason"], &lines[0]["status"]),
        (&"malformed".into(), &431.into())
    );
}

#[test]
fn http2_both_sides_and_h2_to_an_http1_origin() {
    tool("curl");
    let s = setup();
    let r = curl(&s, &["--http2"], &url("api.test", &s.api, "/repos/h2"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.version, "2", "client side speaks h2");
    let seen = s.api.last().unwrap();
    assert_eq!(seen.version, "HTTP/2.0", "origin side speaks h2");
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let r = curl(&s, &["--http2"], &url("h1.test", &s.h1, "/repos/h1"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.version, "2");
    let seen = s.h1.last().unwrap();
    assert_eq!(seen.version, "HTTP/1.1");
    assert_eq!(
        seen.header("host"),
        Some(format!("h1.test:{}", s.h1.port()).as_str()),
        "an HTTP/1.1 origin gets Host from the URI"
    );
    let r = curl(
        &s,
        &["--http2", "-X", "POST"],
        &url("api.test", &s.api, "/repos/h2"),
    );
    assert_eq!(r.status, 403);
    assert_eq!(r.reason().as_deref(), Some("method_not_allowed"));
}

#[test]
fn host_or_authority_other_than_the_connect_host_is_refused() {
    tool("curl");
    let s = setup();
    let before = s.api.count();
    for v in ["--http1.1", "--http2"] {
        let r = curl(
            &s,
            &[v, "-H", &format!("Host: other.test:{}", s.api.port())],
            &url("api.test", &s.api, "/repos/x"),
        );
        assert_eq!(r.status, 403, "{v}: {r:?}");
        assert_eq!(r.reason().as_deref(), Some("host_mismatch"), "{v}");
    }
    assert_eq!(
        s.api.count(),
        before,
        "a fronted request reached the origin"
    );
    let line =
        s.e.wait_line("host_mismatch line", |l| l["reason"] == "host_mismatch");
    assert_eq!(line["proto"], "tls");
    assert_eq!(line["host"], "api.test");
}

#[test]
fn origin_with_an_untrusted_certificate_gets_502() {
    tool("curl");
    let s = setup();
    let r = curl(&s, &["--http1.1"], &url("bad.test", &s.bad, "/x"));
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(s.bad.count(), 0, "a request reached an unverified origin");
    let line = s.e.wait_line("502 line", |l| l["status"] == 502);
    assert_eq!(line["proto"], "tls");
    let err = line["error"].as_str().unwrap();
    assert!(err.contains("certificate"), "{err}");
}

#[test]
fn path_normalisation_attacks_get_400() {
    tool("curl");
    let s = setup();
    for p in [
        "/repos/../admin",
        "/repos/%2e%2e/admin",
        "/repos/%2E%2e/admin",
        "/repos/..;/admin",
        "/repos%2f..%2fadmin",
        "/repos/x%5c..%5c..%5cadmin",
        "/repos/./x",
        // What an origin that decodes twice, accepts overlong UTF-8 or
        // trims whitespace would read as /admin (issue #37).
        "/repos/%252e%252e/admin",
        "/repos/%c0%ae%c0%ae/admin",
        "/repos/x/..%09/admin",
        "/repos/x/%20../admin",
        "/repos/x/%ef%bc%8e%ef%bc%8e/admin",
        "/repos/x%252f..%252fadmin",
    ] {
        for proto in ["--http1.1", "--http2"] {
            let r = curl(&s, &[proto, "--path-as-is"], &url("api.test", &s.api, p));
            assert_eq!(r.status, 400, "{p} {proto}: {r:?}");
            assert_eq!(r.reason().as_deref(), Some("malformed"), "{p} {proto}");
        }
    }
    assert_eq!(s.api.count(), 0);
    // Harmless spellings are normalised, matched, and sent as matched: the
    // origin receives exactly the path the rule saw.
    let r = curl(
        &s,
        &["--http1.1", "--path-as-is"],
        &url("api.test", &s.api, "/%72epos//x?a=%2e%2e"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        s.api.last().unwrap().target,
        "/repos/x?a=%2e%2e",
        "sent as matched, the query as asked"
    );
    // The log is written by its own thread: wait for the line.
    s.e.wait_line("the normalised path logged", |l| {
        l["proto"] == "tls" && l["path"] == "/repos/x"
    });
}

#[test]
fn hosts_without_inspection_rules_are_tunnelled_untouched() {
    tool("curl");
    let s = setup();
    // plain.test's exception has no methods/paths/inject: the client talks
    // TLS with the origin itself, so it must trust the origin's CA.
    let r = curl(&s, &["--http1.1"], &url("plain.test", &s.api, "/any"));
    assert_ne!(r.status, 200, "egressd's CA must not be presented here");
    assert!(r.stderr.to_lowercase().contains("certificate"), "{r:?}");
    let line = s.e.wait_line("connect line", |l| l["proto"] == "connect");
    assert!(tls_lines(&s.e).is_empty());
    assert_eq!(line["exception"], "plain");
    assert!(line["note"].is_null(), "{line}");
}

#[test]
fn python_urllib_through_interception() {
    tool("python3");
    let s = setup();
    let script = r#"
import ssl, sys, urllib.request, urllib.error
proxy, cafile, url, method = sys.argv[1:5]
ctx = ssl.create_default_context(cafile=cafile)
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({"https": proxy}),
    urllib.request.HTTPSHandler(context=ctx))
try:
    with opener.open(urllib.request.Request(url, method=method), timeout=20) as r:
        print(r.status, "-", r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("X-Egressd-Reason"), e.read().decode().strip())
"#;
    let run = |method: &str, path: &str| -> String {
        let out = Command::new(tool("python3"))
            .arg("-c")
            .arg(script)
            .arg(format!("http://{}", s.e.proxy))
            .arg(&s.ca)
            .arg(url("api.test", &s.api, path))
            .arg(method)
            .env_remove("https_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("SSL_CERT_FILE")
            .output()
            .expect("run python3");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(
        run("GET", "/repos/py"),
        "200 - hello from tls origin /repos/py"
    );
    let denied = run("DELETE", "/repos/py");
    assert!(
        denied.starts_with("403 method_not_allowed egressd denied DELETE https://api.test"),
        "{denied}"
    );
    assert_eq!(
        s.api.last().unwrap().header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
}

// ---------------------------------------------------------------- raw TLS client

/// CONNECTs to `connect` through egressd, then starts TLS naming `sni`,
/// trusting egressd's CA. Returns the TLS stream (the handshake completes
/// on first use).
fn tls_through(
    s: &Setup,
    connect: &str,
    sni: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut tcp = crate::support::connect(s.e.proxy);
    write!(tcp, "CONNECT {connect} HTTP/1.1\r\nHost: {connect}\r\n\r\n").unwrap();
    let mut r = BufReader::new(tcp.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        if l.trim().is_empty() {
            break;
        }
    }
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_file(&s.ca).unwrap();
    roots.add(ca).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from(sni.to_string()).unwrap(),
    )
    .unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

#[test]
fn sni_other_than_the_connect_host_closes_an_intercepted_tunnel() {
    let s = setup();
    let mut t = tls_through(&s, &format!("api.test:{}", s.api.port()), "other.test");
    let res = t.write_all(b"GET /repos/x HTTP/1.1\r\nHost: other.test\r\n\r\n");
    let mut buf = Vec::new();
    let read = res.and_then(|_| t.read_to_end(&mut buf));
    assert!(read.is_err() || buf.is_empty(), "got {buf:?}");
    let line = s.e.wait_line("sni line", |l| l["reason"] == "sni_mismatch");
    assert_eq!(line["proto"], "connect");
    assert_eq!(line["decision"], "deny");
    assert_eq!(s.api.count(), 0);
}

/// An intercepted connection is on record once its client's handshake
/// passed: an open line while it is open, a close line with its bytes
/// (the same id) when it ends; each request inside keeps its one line.
#[test]
fn an_intercepted_connection_has_an_open_and_a_close_line() {
    let s = setup();
    let host = format!("api.test:{}", s.api.port());
    let mut t = tls_through(&s, &host, "api.test");
    write!(t, "GET /repos/x HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    let mut r = BufReader::new(t);
    let resp = read_response(&mut r).expect("a response");
    assert_eq!(resp.status, 200, "{resp:?}");
    let open = s.e.wait_line("open line", |l| l["event"] == "open");
    assert_eq!(open["proto"], "connect");
    assert_eq!(open["decision"], "allow");
    assert_eq!(open["exception"], "gh");
    assert_eq!(open["note"], "intercepted");
    assert_eq!(open["bytes_up"], 0);
    let inner =
        s.e.wait_line("the request's line", |l| l["path"] == "/repos/x");
    assert!(
        inner.get("event").is_none(),
        "a request keeps one line: {inner}"
    );
    assert!(
        !s.e.log_lines().iter().any(|l| l["event"] == "close"),
        "no close line while open"
    );
    drop(r);
    let close = s.e.wait_line("close line", |l| l["event"] == "close");
    assert_eq!(close["id"], open["id"]);
    assert_eq!(close["exception"], "gh");
    assert_eq!(close["port"], open["port"]);
    assert!(close["bytes_up"].as_u64().unwrap() > 0, "{close}");
    assert!(close["bytes_down"].as_u64().unwrap() > 0, "{close}");
    let connects =
        s.e.log_lines()
            .into_iter()
            .filter(|l| l["proto"] == "connect")
            .count();
    assert_eq!(connects, 2);
}

#[test]
fn websocket_upgrade_passes_after_the_decision() {
    let s = setup();
    let host = format!("api.test:{}", s.api.port());
    let mut t = tls_through(&s, &host, "api.test");
    write!(
        t,
        "GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(t);
    let resp = read_response(&mut r).expect("a response");
    assert_eq!(resp.status, 101, "{resp:?}");
    assert_eq!(resp.header("upgrade"), Some("websocket"));
    let seen = s.api.last().unwrap();
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(seen.header("upgrade"), Some("websocket"));
    r.get_mut().write_all(b"ping over the upgrade").unwrap();
    let mut back = [0u8; 21];
    r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping over the upgrade");
    // While the WebSocket is open its open line is on record, no bytes.
    let open = s.e.wait_line("ws open line", |l| {
        l["status"] == 101 && l["event"] == "open"
    });
    assert_eq!(open["proto"], "tls");
    assert_eq!(open["exception"], "gh");
    assert_eq!(open["path"], "/ws");
    assert_eq!(open["bytes_up"], 0);
    assert!(
        !s.e.log_lines()
            .iter()
            .any(|l| l["status"] == 101 && l["event"] == "close"),
        "no close line while open"
    );
    drop(r);
    let line = s.e.wait_line("ws close line", |l| {
        l["status"] == 101 && l["event"] == "close"
    });
    assert_eq!(
        line["id"], open["id"],
        "the close line pairs with the open line"
    );
    assert_eq!(line["proto"], "tls");
    assert_eq!(line["exception"], "gh");
    assert_eq!(line["bytes_up"], 21);
    assert_eq!(line["bytes_down"], 21);
    let ws_lines =
        s.e.log_lines()
            .into_iter()
            .filter(|l| l["status"] == 101)
            .count();
    assert_eq!(ws_lines, 2, "an open and a close line");

    // A denied upgrade never reaches the origin.
    let before = s.api.count();
    let mut t = tls_through(&s, &host, "api.test");
    write!(
        t,
        "GET /chat HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    .unwrap();
    let resp = read_response(&mut BufReader::new(t)).unwrap();
    assert_eq!(resp.status, 403);
    assert_eq!(s.api.count(), before);
}

/// With a CA too, a CONNECT whose first bytes are plain HTTP is served as
/// HTTP (it used to be taken for TLS to intercept and fail with "corrupt
/// message"): each request decided, the token injected, the tunnel kept.
#[test]
fn plain_http_inside_a_connect_is_served_with_a_ca_too() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    assert!(ca_init(&certs).status.success());
    let l = lab()
        .names(&["ws.test"])
        .egressd(|b| {
            b.env("EGRESSD_CA_DIR", certs.to_str().unwrap())
                .env("GH_TOKEN", TOKEN)
        })
        .start(|ports| {
            policy()
                .exception("ws")
                .reason("plain HTTP with path rules and a token")
                .host("ws.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .path("/ok/**")
                .with(
                    "inject",
                    r#"{ headers: { Authorization: "Bearer ${env:GH_TOKEN}" } }"#,
                )
        });
    let mut lines = Lines::new(&l.e);
    let o = l.port();
    let mut s = connect(l.e.proxy);
    write!(s, "CONNECT ws.test:{o} HTTP/1.1\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    for (path, status) in [("/ok/a", 200), ("/no", 403), ("/ok/b", 200)] {
        write!(s, "GET {path} HTTP/1.1\r\nHost: ws.test:{o}\r\n\r\n").unwrap();
        let resp = read_response(&mut r).unwrap_or_else(|| panic!("{path}: no answer"));
        assert_eq!(resp.status, status, "{path}: {}", resp.text());
        let line = lines.one(path);
        assert_eq!(line["proto"], "http", "{line}");
    }
    drop((s, r));
    lines.one("the tunnel");
    let seen = l.origin.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for x in &seen {
        assert_eq!(
            x.header("authorization"),
            Some(format!("Bearer {TOKEN}").as_str())
        );
    }
    assert!(!raw_log(&l.e).contains(TOKEN));
}
