//! `egressd run --transparent`: programs that ignore the proxy variables
//! (curl --noproxy, raw Python sockets, UDP senders) inside a real sandbox.
//!
//! Every test runs in a network namespace of its own, made here (only
//! `lo`), in which the stand-in origins listen on TEST-NET addresses
//! (192.0.2.10; 192.0.2.77 for a canary) put on that `lo`. Those must be
//! non-loopback addresses: the sandbox's capture rules leave loopback
//! alone. The fake upstream DNS answers `allowed.test` with 192.0.2.10;
//! inside the sandbox egressd answers each allowed name with an address of
//! its own (198.18.0.x, `dns::inside`) and dials the name's checked
//! address, local to the test's namespace; nothing leaves it. Making that namespace takes root; without it
//! these tests fail and say so.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::support::sandbox::{need_unprivileged_userns, run, udp_canary, Outcome};
use crate::support::tls::{test_pki, tls_origin_on, TlsOrigin};
use crate::support::*;

/// Where the stand-in origins listen, in the test's namespace.
const ORIGIN_IP: &str = "192.0.2.10";
/// A second address there: a canary that must never be dialled.
const CANARY_IP: &str = "192.0.2.77";
/// An address nobody resolved and nothing listens on.
const UNRESOLVED_IP: &str = "192.0.2.99";
/// The first address egressd gives a name inside the sandbox: every name
/// gets one of its own (`dns::inside`), and egressd dials the name's
/// checked address ([`ORIGIN_IP`]) instead.
const INSIDE_FIRST: &str = "198.18.0.1";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Runs `f` on a thread of its own in a fresh network namespace holding
/// only `lo` (127.0.0.1, ::1, [`ORIGIN_IP`], [`CANARY_IP`]). Everything
/// `f` binds, and every process it starts, lives in that namespace. Making
/// one needs root.
fn in_test_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    in_fresh_netns(name, &[ORIGIN_IP, CANARY_IP], f)
}

/// A server that speaks first, as SSH does: a banner line, then an echo.
fn banner_on(ip: IpAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c2 = conns.clone();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            c2.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                if c.write_all(b"SSH-2.0-egressd-test\r\n").is_err() {
                    return;
                }
                let mut buf = [0u8; 1024];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, conns)
}

/// The stand-ins one test needs, all in the test's namespace.
struct World {
    dns: FakeDns,
    http: Origin,
    tls: TlsOrigin,
    banner: SocketAddr,
    banner_conns: Arc<AtomicUsize>,
    /// The test CA's certificate, where the sandbox can read it.
    ca_file: PathBuf,
    _ca_dir: tempfile::TempDir,
}

fn world() -> World {
    let dns = fake_dns();
    dns.set("allowed.test", &[ORIGIN_IP]);
    dns.set("denied.test", &[ORIGIN_IP]);
    let http = origin_on(ip(ORIGIN_IP), 0);
    let pki = test_pki();
    let tls = tls_origin_on(
        ip(ORIGIN_IP),
        pki.leaf(&["allowed.test", "denied.test"]),
        &[b"http/1.1"],
    );
    let (banner, banner_conns) = banner_on(ip(ORIGIN_IP));
    let ca_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ca_file = ca_dir.path().join("origin-ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    // Shown with --ro to a CMD that has no host privilege: world-readable.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(ca_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    World {
        dns,
        http,
        tls,
        banner,
        banner_conns,
        ca_file,
        _ca_dir: ca_dir,
    }
}

impl World {
    fn policy(&self) -> String {
        format!(
            r##"
settings:
  contact: "#sec-test"
exceptions:
  - id: stand-ins
    owner: test-team
    reason: the test's local origins, reached by name
    hosts: [allowed.test]
    cidrs: [{ORIGIN_IP}/32]
    ports: [{}, {}, {}]
"##,
            self.http.addr.port(),
            self.tls.port(),
            self.banner.port()
        )
    }

    /// `egressd run --transparent -- sh -c SCRIPT sh ARGS…`.
    fn run(&self, script: &str, args: &[&str]) -> Outcome {
        let mut cmd = vec!["sh", "-c", script, "sh"];
        cmd.extend_from_slice(args);
        run()
            .policy(&self.policy())
            .dns(self.dns.addr)
            .arg("--transparent")
            .arg("--ro")
            .arg(self.ca_file.parent().unwrap())
            .cmd(&cmd)
    }
}

fn lines_with(r: &Outcome, pred: impl Fn(&serde_json::Value) -> bool) -> Vec<serde_json::Value> {
    r.log_lines().into_iter().filter(|l| pred(l)).collect()
}

fn note(l: &serde_json::Value) -> &str {
    l["note"].as_str().unwrap_or("")
}

// ---------------------------------------------------------------- captured and allowed

#[test]
fn captures_curl_https_and_raw_sockets_that_ignore_the_proxy() {
    in_test_netns("captures_curl_https_and_raw_sockets…", || {
        let w = world();
        let (h, t) = (w.http.addr.port(), w.tls.port());
        let raw = format!(
            r#"
import socket
def get(addr, fam, path):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(addr)
    s.sendall(b'GET ' + path + b' HTTP/1.1\r\nHost: allowed.test:{h}\r\nConnection: close\r\n\r\n')
    data = b''
    while True:
        b = s.recv(4096)
        if not b:
            break
        data += b
    return data.decode().split('\r\n\r\n', 1)[1]
ip = socket.getaddrinfo('allowed.test', {h}, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
print('resolved', ip)
print(get((ip, {h}), socket.AF_INET, b'/raw'))
try:
    socket.socket(socket.AF_INET6).bind(('::1', 0))
except OSError:
    print('no ipv6')
else:
    print(get(('2001:db8::10', {h}), socket.AF_INET6, b'/raw6'))
"#
        );
        let script = format!(
            "curl --noproxy '*' -sS http://allowed.test:{h}/curl && echo && \
             curl --noproxy '*' -sS --cacert \"$1\" https://allowed.test:{t}/tls && echo && \
             python3 -c \"$2\""
        );
        let r = w.run(&script, &[w.ca_file.to_str().unwrap(), &raw]);
        assert_eq!(r.code, 0, "{}", r.context());
        for want in [
            "hello from origin /curl",
            "hello from tls origin /tls",
            &format!("resolved {INSIDE_FIRST}"),
            "hello from origin /raw",
        ] {
            assert!(r.stdout.contains(want), "{want}: {}", r.context());
        }
        let v6 = !r.stdout.contains("no ipv6");
        if v6 {
            assert!(
                r.stdout.contains("hello from origin /raw6"),
                "{}",
                r.context()
            );
        } else {
            eprintln!("note: no IPv6 in this kernel; IPv6 capture not exercised");
        }
        let targets: Vec<String> = w
            .http
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.target.clone())
            .collect();
        let mut want = vec!["/curl", "/raw"];
        if v6 {
            want.push("/raw6");
        }
        assert_eq!(targets, want);
        assert_eq!(w.tls.count(), 1);

        // Plain HTTP: one line per request, decided by Host.
        let http = lines_with(&r, |l| l["proto"] == "http");
        assert_eq!(http.len(), want.len(), "{http:?}");
        for l in &http {
            assert_eq!(l["decision"], "allow", "{l}");
            assert_eq!(l["exception"], "stand-ins");
            assert_eq!(l["host"], "allowed.test");
            assert_eq!(l["addr"], format!("{ORIGIN_IP}:{h}"));
            assert!(note(l).starts_with("transparent: to "), "{l}");
            assert!(note(l).ends_with("name from the Host header"), "{l}");
        }
        assert!(note(&http[0]).starts_with(&format!("transparent: to {INSIDE_FIRST}:{h},")));
        if v6 {
            assert!(note(&http[2]).starts_with(&format!("transparent: to [2001:db8::10]:{h},")));
        }
        // HTTPS: one line for the connection, decided by the server name.
        let l = r.line(|l| l["proto"] == "connect" && l["port"] == t);
        assert_eq!(l["decision"], "allow", "{l}");
        assert_eq!(l["host"], "allowed.test");
        assert_eq!(l["addr"], format!("{ORIGIN_IP}:{t}"));
        assert_eq!(
            note(&l),
            format!("transparent: to {INSIDE_FIRST}:{t}, name from the TLS server name")
        );
        assert!(l["bytes_up"].as_u64().unwrap() > 0 && l["bytes_down"].as_u64().unwrap() > 0);
    });
}

#[test]
fn egressd_dials_a_checked_address_of_the_name_never_the_original_destination() {
    in_test_netns("egressd_dials_a_checked_address…", || {
        let w = world();
        let (h, t) = (w.http.addr.port(), w.tls.port());
        // A listener on the address the client aims at, in the test's
        // namespace: were the original destination dialled, it would count.
        let canary_http = canary_on(ip(CANARY_IP), h);
        let canary_tls = canary_on(ip(CANARY_IP), t);
        let script = format!(
            "curl --noproxy '*' -sS --resolve allowed.test:{h}:{CANARY_IP} \
               http://allowed.test:{h}/spoofed && echo && \
             curl --noproxy '*' -sS --cacert \"$1\" --resolve allowed.test:{t}:{CANARY_IP} \
               https://allowed.test:{t}/spoofed-tls"
        );
        let r = w.run(&script, &[w.ca_file.to_str().unwrap()]);
        assert_eq!(r.code, 0, "{}", r.context());
        assert!(
            r.stdout.contains("hello from origin /spoofed"),
            "{}",
            r.context()
        );
        assert!(
            r.stdout.contains("hello from tls origin /spoofed-tls"),
            "{}",
            r.context()
        );
        thread::sleep(Duration::from_millis(200));
        assert_eq!(
            canary_http.hits(),
            0,
            "the original destination was dialled"
        );
        assert_eq!(canary_tls.hits(), 0, "the original destination was dialled");
        let l = r.line(|l| l["proto"] == "http");
        assert_eq!(l["addr"], format!("{ORIGIN_IP}:{h}"));
        assert!(
            note(&l).starts_with(&format!("transparent: to {CANARY_IP}:{h},")),
            "{l}"
        );
        let l = r.line(|l| l["proto"] == "connect");
        assert_eq!(l["decision"], "allow");
        assert_eq!(l["addr"], format!("{ORIGIN_IP}:{t}"));
        assert!(
            note(&l).contains(&format!(
                "{CANARY_IP} is not a checked address of allowed.test: connected to one that is"
            )),
            "{l}"
        );
    });
}

#[test]
fn nameless_tcp_goes_by_the_name_the_sandbox_resolved_through_egressd() {
    in_test_netns("nameless_tcp_goes_by_the_name…", || {
        let w = world();
        let (b, h) = (w.banner.port(), w.http.addr.port());
        // The server speaks first: egressd waits briefly for client bytes,
        // then decides by the name it answered for this address.
        let script = format!(
            r#"
import socket
ip = socket.getaddrinfo('allowed.test', {b}, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
s = socket.create_connection((ip, {b}), 10)
s.settimeout(10)
print('banner', s.recv(100).decode().strip())
s.sendall(b'ping\n')
print('echo', s.recv(100).decode().strip())
s.close()
t = socket.create_connection(('{UNRESOLVED_IP}', {b}), 10)
t.settimeout(10)
try:
    print('unresolved', t.recv(100) or 'closed')
except ConnectionResetError:
    print('unresolved closed')
# The capture listener itself, dialled directly: not a way around.
c = socket.create_connection(('127.0.0.1', 3129), 10)
c.settimeout(10)
c.sendall(b'GET / HTTP/1.1\r\nHost: allowed.test:{h}\r\n\r\n')
try:
    print('direct', c.recv(100) or 'closed')
except ConnectionResetError:
    print('direct closed')
"#
        );
        let r = w.run("python3 -c \"$1\"", &[&script]);
        assert_eq!(r.code, 0, "{}", r.context());
        assert!(
            r.stdout.contains("banner SSH-2.0-egressd-test"),
            "{}",
            r.context()
        );
        assert!(r.stdout.contains("echo ping"), "{}", r.context());
        assert!(r.stdout.contains("unresolved closed"), "{}", r.context());
        assert!(r.stdout.contains("direct closed"), "{}", r.context());
        assert_eq!(w.http.count(), 0);
        assert_eq!(w.banner_conns.load(Ordering::SeqCst), 1);

        let l = r.line(|l| l["proto"] == "connect" && l["decision"] == "allow");
        assert_eq!(l["host"], "allowed.test");
        assert_eq!(l["exception"], "stand-ins");
        assert_eq!(l["addr"], format!("{ORIGIN_IP}:{b}"));
        assert_eq!(
            note(&l),
            format!(
                "transparent: to {INSIDE_FIRST}:{b}, name from the address egressd gave that \
                 name inside the sandbox"
            )
        );
        assert!(l["bytes_down"].as_u64().unwrap() >= 22, "{l}");
        let l = r.line(|l| l["proto"] == "connect" && l["decision"] == "deny");
        assert_eq!(l["host"], UNRESOLVED_IP);
        assert_eq!(l["reason"], "no_exception");
        assert_eq!(
            note(&l),
            format!("transparent: to {UNRESOLVED_IP}:{b}, no name (decided by the address)")
        );
        let l = r.line(|l| l["reason"] == "loop_detected");
        assert_eq!(l["port"], 3129);
        let connects = lines_with(&r, |l| l["proto"] == "connect").len();
        assert_eq!(connects, 3, "one line per connection");
    });
}

#[test]
fn each_name_has_its_own_address_inside_so_no_connection_is_shared_across_names() {
    in_test_netns("each_name_has_its_own_address_inside…", || {
        let w = world();
        let t = w.tls.port();
        let policy = format!(
            r#"
exceptions:
  - id: both
    owner: test-team
    reason: two names on one origin address
    hosts: [allowed.test, denied.test]
    cidrs: [{ORIGIN_IP}/32]
    ports: [{t}]
"#
        );
        // Both names of the world's certificate, both allowed here, on one
        // real address (what lets a browser coalesce): inside, two addresses; a connection to
        // allowed.test's address naming denied.test is refused.
        let script = format!(
            "a=$(getent ahostsv4 allowed.test | head -1 | cut -d' ' -f1); \
             b=$(getent ahostsv4 denied.test | head -1 | cut -d' ' -f1); \
             echo \"a=$a b=$b\"; \
             curl --noproxy '*' -sS --cacert \"$1\" https://denied.test:{t}/own && echo; \
             curl --noproxy '*' -sS --cacert \"$1\" --resolve denied.test:{t}:$a \
               https://denied.test:{t}/shared -o /dev/null -w 'shared=%{{http_code}}\\n' \
               || echo shared=refused"
        );
        let r = run()
            .policy(&policy)
            .dns(w.dns.addr)
            .arg("--transparent")
            .arg("--ro")
            .arg(w.ca_file.parent().unwrap())
            .cmd(&["sh", "-c", &script, "sh", w.ca_file.to_str().unwrap()]);
        assert_eq!(r.code, 0, "{}", r.context());
        assert!(
            r.stdout.contains("a=198.18.0.1 b=198.18.0.2"),
            "{}",
            r.context()
        );
        assert!(
            r.stdout.contains("hello from tls origin /own"),
            "{}",
            r.context()
        );
        assert!(r.stdout.contains("shared=refused"), "{}", r.context());
        assert_eq!(w.tls.count(), 1, "the shared connection reached nothing");
        let l = r.line(|l| l["reason"] == "sni_mismatch");
        assert_eq!(l["host"], "denied.test", "{l}");
        assert!(
            l["note"].as_str().unwrap().contains("is not allowed.test"),
            "{l}"
        );
    });
}

#[test]
fn tls_to_an_exception_with_path_rules_is_intercepted_with_the_sandboxs_ca() {
    in_test_netns("tls_to_an_exception_with_path_rules…", || {
        let w = world();
        let t = w.tls.port();
        // Outside /tmp (the sandbox's /tmp is its own), as `--ca-dir` needs.
        let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let certs = base.path().join("certs");
        ca_init(&certs);
        let policy = format!(
            r#"
exceptions:
  - id: inspected
    owner: test-team
    reason: path rules need interception
    hosts: [allowed.test]
    cidrs: [{ORIGIN_IP}/32]
    ports: [{t}]
    paths: ["/ok/**"]
"#
        );
        // No --cacert: the launcher makes the sandbox trust egressd's CA.
        let script = format!(
            "curl --noproxy '*' -sS https://allowed.test:{t}/ok/1 && echo && \
             curl --noproxy '*' -s -o /dev/null -w 'no=%{{http_code}}\\n' https://allowed.test:{t}/no"
        );
        let r = run()
            .policy(&policy)
            .dns(w.dns.addr)
            .arg("--transparent")
            .arg("--ca-dir")
            .arg(&certs)
            .arg("--upstream-ca")
            .arg(&w.ca_file)
            .cmd(&["sh", "-c", &script]);
        assert_eq!(r.code, 0, "{}", r.context());
        assert!(
            r.stdout.contains("hello from tls origin /ok/1"),
            "{}",
            r.context()
        );
        assert!(r.stdout.contains("no=403"), "{}", r.context());
        assert_eq!(w.tls.count(), 1, "only the allowed path reached the origin");
        let l = r.line(|l| l["proto"] == "tls" && l["path"] == "/ok/1");
        assert_eq!(l["decision"], "allow");
        assert_eq!(l["exception"], "inspected");
        let l = r.line(|l| l["proto"] == "tls" && l["path"] == "/no");
        assert_eq!(l["reason"], "path_not_allowed");
        let tunnels = lines_with(&r, |l| l["proto"] == "connect");
        assert_eq!(tunnels.len(), 2, "{tunnels:?}");
        for l in tunnels {
            assert_eq!(l["host"], "allowed.test");
            assert!(note(&l).contains("name from the TLS server name"), "{l}");
            assert!(note(&l).ends_with("; intercepted"), "{l}");
        }
    });
}

// ---------------------------------------------------------------- denied

#[test]
fn denied_names_are_refused_and_logged() {
    in_test_netns("denied_names_are_refused_and_logged", || {
        let w = world();
        let (h, t) = (w.http.addr.port(), w.tls.port());
        let script = format!(
            "curl --noproxy '*' -s -o /dev/null -w 'http=%{{http_code}}\\n' \
               --resolve denied.test:{h}:{ORIGIN_IP} http://denied.test:{h}/x; \
             curl --noproxy '*' -sS --cacert \"$1\" --resolve denied.test:{t}:{ORIGIN_IP} \
               https://denied.test:{t}/y && echo tls=passed || echo tls=refused; \
             curl --noproxy '*' -s -o /dev/null -w 'dns=%{{http_code}}\\n' http://denied.test:{h}/z; \
             true"
        );
        let r = w.run(&script, &[w.ca_file.to_str().unwrap()]);
        assert_eq!(r.code, 0, "{}", r.context());
        assert!(r.stdout.contains("http=403"), "{}", r.context());
        assert!(r.stdout.contains("tls=refused"), "{}", r.context());
        // Without --resolve, the name does not even resolve inside.
        assert!(r.stdout.contains("dns=000"), "{}", r.context());
        assert_eq!(w.http.count(), 0, "nothing reached the origin");
        assert_eq!(w.tls.count(), 0, "nothing reached the TLS origin");
        assert_eq!(
            w.dns.count("denied.test"),
            0,
            "a denied name is never resolved"
        );

        let l = r.line(|l| l["proto"] == "http" && l["host"] == "denied.test");
        assert_eq!(l["decision"], "deny");
        assert_eq!(l["reason"], "no_exception");
        assert_eq!(l["status"], 403);
        assert!(note(&l).starts_with("transparent: to "), "{l}");
        let l = r.line(|l| l["proto"] == "connect" && l["host"] == "denied.test");
        assert_eq!(l["decision"], "deny");
        assert_eq!(l["reason"], "no_exception");
        assert_eq!(l["port"], t);
        assert!(note(&l).ends_with("name from the TLS server name"), "{l}");
        let dns = r.line(|l| l["proto"] == "dns" && l["qname"] == "denied.test");
        assert_eq!(dns["decision"], "deny");
    });
}

/// The capture listener's refusal past a client's share: a captured
/// connection carries no request egressd could answer yet (it may be TLS
/// or anything), so it is closed with nothing written, and logged
/// `overloaded`. Closing the held connection gives the share back.
#[test]
fn a_captured_connection_past_the_clients_share_is_closed_and_logged() {
    in_test_netns("a_captured_connection_past_the_clients_share…", || {
        let w = world();
        let h = w.http.addr.port();
        let raw = format!(
            r#"
import socket, time
ip = socket.getaddrinfo('allowed.test', {h}, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
held = socket.create_connection((ip, {h}), timeout=10)
held.sendall(b'GET /held HTTP/1.1\r\nHost: allowed.test:{h}\r\n')
over = socket.create_connection((ip, {h}), timeout=10)
try:
    got = over.recv(4096)
    print('over:', 'closed' if got == b'' else repr(got))
except ConnectionResetError:
    print('over: closed')
held.close()
for attempt in range(100):
    s = socket.create_connection((ip, {h}), timeout=10)
    s.sendall(b'GET /after HTTP/1.1\r\nHost: allowed.test:{h}\r\nConnection: close\r\n\r\n')
    try:
        data = s.recv(4096)
    except ConnectionResetError:
        data = b''
    if data:
        print('after:', data.split(b'\r\n', 1)[0].decode())
        break
    time.sleep(0.05)
"#
        );
        let policy = w.policy().replace(
            "settings:\n",
            "settings:\n  limits: { connections_per_client: 1 }\n",
        );
        let r = run()
            .policy(&policy)
            .dns(w.dns.addr)
            .arg("--transparent")
            .cmd(&["python3", "-c", &raw]);
        assert_eq!(r.code, 0, "{}", r.context());
        assert!(r.stdout.contains("over: closed"), "{}", r.context());
        assert!(r.stdout.contains("after: HTTP/1.1 200"), "{}", r.context());
        let targets: Vec<String> = w
            .http
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.target.clone())
            .collect();
        assert_eq!(targets, ["/after"], "{}", r.context());
        let over = lines_with(&r, |l| l["reason"] == "overloaded");
        assert!(!over.is_empty(), "{}", r.context());
        let l = &over[0];
        assert_eq!(l["decision"], "deny", "{l}");
        assert!(l["status"].is_null(), "nothing was written: {l}");
        assert!(
            note(l).ends_with("already has 1 connections open, its share; closed"),
            "{l}"
        );
    });
}

#[test]
fn udp_other_than_dns_is_dropped_and_dns_anywhere_reaches_egressd() {
    in_test_netns("udp_other_than_dns_is_dropped…", || {
        let w = world();
        let (udp, hits) = udp_canary(ip(ORIGIN_IP));
        let hits443 = {
            // QUIC's port, on the origin's address.
            let s = std::net::UdpSocket::bind((ip(ORIGIN_IP), 443)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let hits = Arc::new(AtomicUsize::new(0));
            let h2 = hits.clone();
            thread::spawn(move || {
                let mut buf = [0u8; 2048];
                for _ in 0..300 {
                    if s.recv_from(&mut buf).is_ok() {
                        h2.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            hits
        };
        let script = format!(
            r#"
import errno, socket, struct
def send(host, port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(b'leak', (host, port))
        return 'sent'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
print('udp', send('{ORIGIN_IP}', {up}))
print('quic', send('{ORIGIN_IP}', 443))
q = struct.pack('!HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)
q += b''.join(bytes([len(l)]) + l for l in (b'allowed', b'test')) + b'\x00' + struct.pack('!HH', 1, 1)
d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
d.settimeout(10)
d.sendto(q, ('198.51.100.53', 53))
resp, src = d.recvfrom(512)
print('dns from', src[0], 'answer', socket.inet_ntoa(resp[-4:]))
"#,
            up = udp.port()
        );
        let r = w.run("python3 -c \"$1\"", &[&script]);
        assert_eq!(r.code, 0, "{}", r.context());
        // nftables drops them in the sandbox's output path: the sender is
        // told at once, and nothing arrives.
        assert!(r.stdout.contains("udp EPERM"), "{}", r.context());
        assert!(r.stdout.contains("quic EPERM"), "{}", r.context());
        assert!(
            r.stdout
                .contains(&format!("dns from 198.51.100.53 answer {INSIDE_FIRST}")),
            "{}",
            r.context()
        );
        thread::sleep(Duration::from_millis(300));
        assert_eq!(
            hits.load(Ordering::SeqCst),
            0,
            "a datagram reached the canary"
        );
        assert_eq!(hits443.load(Ordering::SeqCst), 0, "a datagram reached :443");
        let l = r.line(|l| l["proto"] == "dns" && l["qname"] == "allowed.test");
        assert_eq!(l["decision"], "allow");
    });
}

// ---------------------------------------------------------------- rootless

#[test]
fn rootless_capture_as_an_unprivileged_user() {
    need_unprivileged_userns("rootless_capture_as_an_unprivileged_user");
    in_test_netns("rootless_capture_as_an_unprivileged_user", || {
        let w = world();
        let h = w.http.addr.port();
        let script = format!(
            "id -u; grep CapEff /proc/self/status; \
             curl --noproxy '*' -sS http://allowed.test:{h}/nobody"
        );
        let r = run()
            .unprivileged()
            .policy(&w.policy())
            .dns(w.dns.addr)
            .arg("--transparent")
            .cmd(&["sh", "-c", &script]);
        assert_eq!(r.code, 0, "{}", r.context());
        assert!(
            r.stdout.starts_with("1000\n"),
            "uid 1000 inside: {}",
            r.context()
        );
        // CMD cannot change the rules: it holds no capability.
        assert!(
            r.stdout.contains("CapEff:\t0000000000000000"),
            "{}",
            r.context()
        );
        assert!(
            r.stdout.contains("hello from origin /nobody"),
            "{}",
            r.context()
        );
        let l = r.line(|l| l["proto"] == "http");
        assert_eq!(l["decision"], "allow");
        assert!(note(&l).starts_with("transparent: to "), "{l}");
    });
}

// ---------------------------------------------------------------- no nft, no sandbox

#[test]
fn without_nft_transparent_mode_refuses_with_125() {
    let r = run()
        .arg("--transparent")
        .arg("--nft")
        .arg("/nonexistent/nft")
        .cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(
        r.stderr.contains("--nft /nonexistent/nft"),
        "{}",
        r.context()
    );

    // An nft that fails (as one whose kernel refuses the rules would):
    // the sandbox is not started.
    let r = run()
        .arg("--transparent")
        .arg("--nft")
        .arg("/bin/false")
        .cmd(&["sh", "-c", "echo started"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(!r.stdout.contains("started"), "{}", r.context());
    assert!(
        r.stderr.contains("could not load the capture rules"),
        "{}",
        r.context()
    );

    let r = run()
        .arg("--transparent")
        .arg("--connect")
        .arg("127.0.0.1:1")
        .cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("--connect"), "{}", r.context());

    // nft not installed: hidden by an empty tmpfs over every directory
    // that has one, in a mount namespace of this command's own.
    need_root(
        "without_nft_transparent_mode_refuses_with_125",
        "hiding nft in a mount namespace",
    );
    let mut dirs: Vec<PathBuf> =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain(
                ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                    .iter()
                    .map(PathBuf::from),
            )
            .filter(|d| d.join("nft").exists())
            .filter_map(|d| d.canonicalize().ok())
            .collect();
    dirs.sort();
    dirs.dedup();
    let hide: String = dirs
        .iter()
        .map(|d| format!("mount -t tmpfs tmpfs {} && ", d.display()))
        .collect();
    let policy = tempfile::tempdir().unwrap();
    std::fs::write(policy.path().join("p.yaml"), "exceptions: []\n").unwrap();
    let out = Command::new(crate::support::tool("unshare"))
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "{hide}exec {} run --transparent --upstream-dns 127.0.0.1:9 --policy {} -- true",
            env!("CARGO_BIN_EXE_egressd"),
            policy.path().display()
        ))
        .env_remove("EGRESSD_NFT")
        .current_dir("/")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("--transparent needs nft"), "{stderr}");
    assert!(stderr.contains("no weaker fallback"), "{stderr}");
}
