//! A browsing agent in a box: Debian's Chromium, headless, under
//! `egressd run`, driven over the DevTools protocol on
//! `--remote-debugging-pipe` by `cdp.py` (no debugging port, nothing
//! downloaded), keeping its own sandbox (no `--no-sandbox`).
//!
//! The probe page (`probe.html`, served by `origin.py`) holds controls that
//! must load and probes that must fail, and reports which did. Around it,
//! in a network namespace made here (only `lo`): the page's origin and an
//! HTTP/2 TLS origin on 192.0.2.10 (one certificate for tls.test,
//! allowed.test and coalesce.test), canaries on 192.0.2.77 (TCP 80 and 443,
//! UDP 443 and 3478) and on 169.254.169.254:80 (the metadata address), and a
//! fake upstream DNS that answers the denied names with the canary's
//! address. Each run checks: every control loaded, every probe failed in
//! the page, each denied probe that reaches egressd has its deny line, the
//! canaries got nothing, and the upstream DNS was never asked a denied
//! name. Runs: explicit proxy, `--transparent`, and Chromium left idle with
//! and without the recommended flags ([`QUIET`]).
//!
//! Needs root for the namespace and `chromium` (`tests/setup` installs
//! it); without either a test fails and says what is missing.

use std::net::{IpAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::sandbox::{run, Outcome};
use crate::support::tls::{test_pki, tls_origin_at, TlsOrigin};
use crate::support::*;

const ORIGIN_IP: &str = "192.0.2.10";
const CANARY_IP: &str = "192.0.2.77";
const METADATA_IP: &str = "169.254.169.254";
const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/browser");

/// Names the page's allowed controls use (all on [`ORIGIN_IP`]).
const ALLOWED: &[&str] = &[
    "page.test",
    "tls.test",
    "allowed.test",
    "coalesce.test",
    "wsrule.test",
];
/// Names only the probes use: never to be resolved upstream.
const DENIED: &[&str] = &[
    "denied.test",
    "redirected.test",
    "beacon.test",
    "prefetch.test",
    "preconnect.test",
    "doh.test",
];

/// The flags that switch Chromium's own background traffic off (docs/launcher.md,
/// "Browsing agents", says which flag silences what).
pub(crate) const QUIET: &[&str] = &[
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-client-side-phishing-detection",
    "--disable-domain-reliability",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,CertificateTransparencyComponentUpdater",
];

/// Fails `test` unless Chromium is installed and runs.
fn need_chromium(test: &str) {
    let ok = Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{test}: {}", missing("chromium"));
}

/// Runs `f` on a thread in a fresh network namespace holding only `lo`
/// with [`ORIGIN_IP`], [`CANARY_IP`] and [`METADATA_IP`] on it (root
/// makes it).
fn in_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    in_fresh_netns(name, &[ORIGIN_IP, CANARY_IP, METADATA_IP], f)
}

/// A child process killed when dropped.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A UDP socket that counts datagrams for as long as the test runs.
fn udp_counter(ip: &str, port: u16) -> Arc<AtomicUsize> {
    let s = UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let end = Instant::now() + Duration::from_secs(180);
        while Instant::now() < end {
            if s.recv_from(&mut buf).is_ok() {
                h.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    hits
}

/// Everything outside the sandbox that one run needs.
struct Stage {
    dns: FakeDns,
    tls: TlsOrigin,
    _origin: Killed,
    seen: PathBuf,
    tcp_canaries: Vec<(String, Canary)>,
    udp_canaries: Vec<(String, Arc<AtomicUsize>)>,
    /// egressd's CA (`--ca-dir`).
    certs: PathBuf,
    /// The origins' CA, which Chromium is told to trust (`cdp.py --trust`).
    origin_ca: PathBuf,
    /// The same certificate as egressd's `--upstream-ca`: a file of its own,
    /// which the sandbox does not see (egressd's files are masked inside).
    upstream_ca: PathBuf,
    _dir: tempfile::TempDir,
}

fn stage() -> Stage {
    let dns = fake_dns();
    for n in ALLOWED {
        dns.set(n, &[ORIGIN_IP]);
    }
    for n in DENIED {
        dns.set(n, &[CANARY_IP]);
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let public = dir.path().join("public");
    std::fs::create_dir(&public).unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pki = test_pki();
    let origin_ca = public.join("origin-ca.pem");
    std::fs::write(&origin_ca, &pki.ca_pem).unwrap();
    std::fs::set_permissions(&origin_ca, std::fs::Permissions::from_mode(0o644)).unwrap();
    let upstream_ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&upstream_ca, &pki.ca_pem).unwrap();
    let tls = tls_origin_at(
        format!("{ORIGIN_IP}:443").parse().unwrap(),
        pki.leaf(&["tls.test", "allowed.test", "coalesce.test"]),
        &[b"h2", b"http/1.1"],
    );
    let certs = dir.path().join("certs");
    ca_init(&certs);
    let seen = dir.path().join("seen");
    std::fs::write(&seen, "").unwrap();
    let mut origin = Command::new(tool("python3"))
        .arg(Path::new(HERE).join("origin.py"))
        .args([ORIGIN_IP, "80"])
        .arg(&seen)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        // Listening once it says so.
        use std::io::BufRead;
        let mut line = String::new();
        let out = origin.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "listening");
    }
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let tcp_canaries = vec![
        (format!("{CANARY_IP}:80"), canary_on(ip(CANARY_IP), 80)),
        (format!("{CANARY_IP}:443"), canary_on(ip(CANARY_IP), 443)),
        (format!("{METADATA_IP}:80"), canary_on(ip(METADATA_IP), 80)),
    ];
    let udp_canaries = vec![
        (
            format!("udp {CANARY_IP}:3478 (STUN)"),
            udp_counter(CANARY_IP, 3478),
        ),
        (
            format!("udp {CANARY_IP}:443 (QUIC)"),
            udp_counter(CANARY_IP, 443),
        ),
    ];
    Stage {
        dns,
        tls,
        _origin: Killed(origin),
        seen,
        tcp_canaries,
        udp_canaries,
        certs,
        origin_ca,
        upstream_ca,
        _dir: dir,
    }
}

fn policy() -> String {
    let ex = |id: &str, host: &str, port: u16, extra: &str| {
        format!(
            "  - id: {id}\n    owner: test-team\n    reason: the browser test's {id}\n    \
             hosts: [{host}]\n    cidrs: [{ORIGIN_IP}/32]\n    ports: [{port}]\n{extra}"
        )
    };
    [
        "settings:\n  contact: \"#sec-test\"\nexceptions:\n".to_string(),
        ex("page", "page.test", 80, ""),
        ex("passthrough", "allowed.test", 443, ""),
        ex("inspected", "tls.test", 443, "    paths: [\"/ok/*\"]\n"),
        ex(
            "coalesce",
            "coalesce.test",
            443,
            "    methods: [GET]\n    paths: [\"/ok/*\"]\n",
        ),
        ex("wsrule", "wsrule.test", 80, "    paths: [\"/ws/ok*\"]\n"),
    ]
    .concat()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Proxy,
    Transparent,
}

impl Stage {
    /// `egressd run [--transparent] -- cdp.py …`: Chromium opens the probe
    /// page (or, with `url` None, idles for `idle` seconds).
    fn browse(&self, mode: Mode, url: Option<&str>, idle: u32, quiet: bool) -> Outcome {
        let cdp = format!("{HERE}/cdp.py");
        let idle = idle.to_string();
        let mut cmd: Vec<&str> = vec!["python3", &cdp, "--timeout", "60", "--idle", &idle];
        let trust = self.origin_ca.to_str().unwrap();
        cmd.extend(["--trust", trust]);
        if let Some(u) = url {
            cmd.extend(["--url", u, "--eval", "window.__results"]);
        }
        cmd.extend([
            "--",
            "chromium",
            "--headless",
            "--user-data-dir=/tmp/chromium",
            "--unsafely-treat-insecure-origin-as-secure=http://page.test",
            "--origin-to-force-quic-on=192.0.2.77:443",
        ]);
        if quiet {
            cmd.extend(QUIET);
        }
        let mut r = run()
            .policy(&policy())
            .dns(self.dns.addr)
            .arg("--ca-dir")
            .arg(&self.certs)
            .arg("--upstream-ca")
            .arg(&self.upstream_ca)
            .arg("--ro")
            .arg(HERE)
            .arg("--ro")
            .arg(self.origin_ca.parent().unwrap())
            .arg("--timeout")
            .arg("100s");
        match mode {
            // Chromium honours the proxy variables the sandbox sets: told
            // to ignore them, it connects directly, and is captured.
            Mode::Transparent => {
                r = r.arg("--transparent");
                cmd.push("--no-proxy-server");
            }
            Mode::Proxy => {
                cmd.extend([
                    "--proxy-server=http://127.0.0.1:3128",
                    "--proxy-bypass-list=<-loopback>",
                ]);
            }
        }
        r.cmd(&cmd)
    }

    fn seen(&self) -> Vec<String> {
        std::fs::read_to_string(&self.seen)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }

    fn assert_canaries_silent(&self) {
        for (what, c) in &self.tcp_canaries {
            assert_eq!(c.hits(), 0, "the canary on {what} was reached");
        }
        // A datagram in flight is not waited for by anything else.
        thread::sleep(Duration::from_millis(300));
        for (what, n) in &self.udp_canaries {
            assert_eq!(
                n.load(Ordering::SeqCst),
                0,
                "the canary on {what} got datagrams"
            );
        }
    }
}

fn results(r: &Outcome) -> Value {
    let line = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("the driver printed no result\n{}", r.context()));
    serde_json::from_str(line).unwrap()
}

fn denied(lines: &[Value], pred: impl Fn(&Value) -> bool) -> bool {
    lines.iter().any(|l| l["decision"] == "deny" && pred(l))
}

/// One run of the probe page, with what both modes assert.
fn probe_page(mode: Mode) {
    let name = format!("browser::{mode:?}");
    need_chromium(&name);
    in_netns(&name.clone(), move || {
        let s = stage();
        let r = s.browse(mode, Some("http://page.test/"), 0, true);
        assert_eq!(r.code, 0, "{}", r.context());
        let v = results(&r);
        let lines = r.log_lines();
        let mut kinds = std::collections::BTreeMap::new();
        for l in &lines {
            let k = format!("{} {} {}", l["proto"], l["decision"], l["host"]);
            *kinds.entry(k).or_insert(0) += 1;
        }
        eprintln!("{name}: {:?}, decision lines: {kinds:#?}", r.elapsed);
        let mut table = Vec::new();
        for (name, res) in v["controls"].as_object().unwrap() {
            table.push(format!("control {name}: {}", res["detail"]));
        }
        for (name, res) in v["probes"].as_object().unwrap() {
            table.push(format!("probe {name}: {}", res["detail"]));
        }
        eprintln!("{mode:?}:\n  {}", table.join("\n  "));

        // Every control loaded.
        for (name, res) in v["controls"].as_object().unwrap() {
            assert_eq!(
                res["ok"], true,
                "control {name} did not load: {res}\n{table:#?}"
            );
        }
        let seen = s.seen();
        for want in [
            "GET page.test /img.svg",
            "GET page.test /data",
            "GET page.test /sw.js",
        ] {
            assert!(
                seen.iter().any(|l| l == want),
                "{want} not served: {seen:?}"
            );
        }
        assert!(
            s.tls
                .requests()
                .iter()
                .any(|(m, t)| m == "GET" && t.ends_with("/ok/1")),
            "the intercepted fetch did not reach the origin: {:?}",
            s.tls.requests()
        );
        assert!(
            lines.iter().any(|l| l["proto"] == "tls"
                && l["host"] == "tls.test"
                && l["path"] == "/ok/1"
                && l["decision"] == "allow"),
            "the intercepted fetch has no allow line"
        );

        // Every probe failed in the page.
        for (name, res) in v["probes"].as_object().unwrap() {
            assert_eq!(
                res["ok"], false,
                "probe {name} succeeded: {res}\n{table:#?}"
            );
        }
        // HTTP/2 coalescing: the POST never reached the origin, and egressd
        // decided it (intercepted, as coalesce.test's rules need).
        assert!(
            !s.tls.requests().iter().any(|(_, t)| t.ends_with("/secret")),
            "a request for coalesce.test reached the origin undecided: {:?}",
            s.tls.requests()
        );
        assert!(
            denied(&lines, |l| l["host"] == "coalesce.test"
                && l["method"] == "POST"
                && l["path"] == "/secret"),
            "no deny line for POST coalesce.test/secret: {lines:#?}"
        );
        // Deny lines for the probes that reach egressd.
        let host = |h: &'static str| move |l: &Value| l["host"] == h;
        for (what, ok) in [
            (
                "denied.test subresources and fetch",
                denied(&lines, host("denied.test")),
            ),
            ("the IP literal", denied(&lines, host(CANARY_IP))),
            ("the metadata address", denied(&lines, host(METADATA_IP))),
            ("DNS-over-HTTPS", denied(&lines, host("doh.test"))),
            (
                "the redirect's target",
                denied(&lines, host("redirected.test")),
            ),
            ("the beacon", denied(&lines, host("beacon.test"))),
        ] {
            assert!(ok, "no deny line for {what}: {lines:#?}");
        }
        assert!(seen.iter().any(|l| l == "GET page.test /redirect"));
        assert!(
            !seen.iter().any(|l| l.contains("/ws/no")),
            "the denied WebSocket path reached the origin: {seen:?}"
        );
        // Plain HTTP, captured or inside the CONNECT to port 80 that a
        // proxied ws:// becomes, is decided request by request.
        assert!(
            denied(&lines, |l| l["host"] == "wsrule.test"
                && l["path"] == "/ws/no"),
            "no deny line for ws://wsrule.test/ws/no: {lines:#?}"
        );
        s.assert_canaries_silent();
        assert_only_asked(&s.dns, ALLOWED);
    });
}

#[test]
fn explicit_proxy_every_request_the_page_makes_is_a_decision() {
    probe_page(Mode::Proxy);
}

#[test]
fn transparent_every_connection_is_decided_and_h2_cannot_coalesce_across_names() {
    probe_page(Mode::Transparent);
}

#[test]
fn idle_chromium_background_traffic_is_silenced_by_the_flags_or_denied() {
    let name = "browser::idle";
    need_chromium(name);
    in_netns(name, || {
        let s = stage();
        let idle = |quiet| {
            let r = s.browse(Mode::Proxy, None, 8, quiet);
            assert_eq!(r.code, 0, "{}", r.context());
            let lines = r.log_lines();
            for l in &lines {
                assert_eq!(
                    l["decision"], "deny",
                    "Chromium's own request was allowed: {l}"
                );
            }
            lines
                .iter()
                .map(|l| format!("{} {}", l["host"].as_str().unwrap_or("-"), l["path"]))
                .collect::<Vec<_>>()
        };
        let loud = idle(false);
        let quiet = idle(true);
        eprintln!("idle without the flags: {loud:?}\nidle with the flags: {quiet:?}");
        // The control: without the flags Chromium does reach out (so this
        // test can tell the difference), and every request is denied.
        let has = |lines: &[String], host: &str| lines.iter().any(|l| l.starts_with(host));
        assert!(
            has(&loud, "clients2.google.com") || has(&loud, "redirector.gvt1.com"),
            "no network-time or component-download request without the flags: {loud:?}"
        );
        // With them: network time (NetworkTimeServiceQuerying) and
        // component downloads (--disable-component-update) are off; what
        // is left (the default search engine's preconnect, one update
        // check) is fewer, and denied like everything else.
        for host in ["clients2.google.com", "redirector.gvt1.com"] {
            assert!(!has(&quiet, host), "{host} despite the flags: {quiet:?}");
        }
        // Fewer hosts, not fewer requests: how many preconnects Chromium
        // makes to the one search engine varies from run to run.
        let hosts = |lines: &[String]| {
            let mut h: Vec<&str> = lines.iter().filter_map(|l| l.split(' ').next()).collect();
            h.sort_unstable();
            h.dedup();
            h.len()
        };
        assert!(hosts(&quiet) < hosts(&loud), "{quiet:?} vs {loud:?}");
        s.assert_canaries_silent();
    });
}

#[test]
fn chromium_keeps_its_own_sandbox_under_egressd_run() {
    need_chromium("browser::sandbox");
    let cdp = format!("{HERE}/cdp.py");
    let r = run().arg("--ro").arg(HERE).cmd(&[
        "python3",
        &cdp,
        "--url",
        "chrome://sandbox",
        "--eval",
        "document.body.innerText",
        "--",
        "chromium",
        "--headless",
        "--user-data-dir=/tmp/chromium",
    ]);
    assert_eq!(r.code, 0, "{}", r.context());
    let text = results(&r);
    let text = text.as_str().unwrap();
    for want in [
        "Layer 1 Sandbox\tNamespace",
        "PID namespaces\tYes",
        "Network namespaces\tYes",
        "Seccomp-BPF sandbox\tYes",
        "You are adequately sandboxed.",
    ] {
        assert!(
            text.contains(want),
            "{want:?} not in chrome://sandbox:\n{text}"
        );
    }
}
