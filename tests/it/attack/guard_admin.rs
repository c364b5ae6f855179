//! The guard of `egressd run`, continued: egressd's admin listeners seen
//! from inside the box. A separate `egressd serve` runs on the host (its
//! proxy on loopback, its metrics on every address) and holds a denial of
//! another client's; from a command inside `egressd run` (default flags,
//! and `--transparent`), the box lists every socket its network namespace
//! holds, dials that serve's ports on every address it can name (its own
//! loopback, the host's addresses, the ports egressd would have by
//! default), and asks its proxy for them by address, by name, and through
//! CONNECT. Reached means the serve answered: its `/denials` line (which
//! names the other client's host) or its `/metrics` text.
//!
//! With the default policy every way is refused by the sandbox's network
//! (only `lo`) and the proxy's address checks. With a policy whose `cidrs`
//! open the host's loopback and addresses on those very ports (a local dev
//! server's exception written too wide), an egressd listener is still
//! refused: every egressd names its listeners to the others on the host
//! (`proxy::listeners`), and a proxy never dials one; so too in report
//! mode, which lets every other non-public address through.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::sandbox::{run, Outcome};
use crate::support::{fake_dns, http_request};

/// A separate `egressd serve` on the host: its proxy and resolver on
/// loopback, its metrics listener on every address (as a scraper would
/// have it), and the id of a denial it keeps.
struct HostServe {
    child: Child,
    proxy: SocketAddr,
    dns: SocketAddr,
    metrics: u16,
    denied_id: String,
    _dir: tempfile::TempDir,
}

impl Drop for HostServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn host_serve() -> HostServe {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, "exceptions: []\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("serve")
        .arg("--policy")
        .arg(&policy)
        .args(["--listen", "127.0.0.1:0", "--dns-listen", "127.0.0.1:0"])
        .args([
            "--metrics-listen",
            "0.0.0.0:0",
            "--upstream-dns",
            "127.0.0.1:9",
        ])
        .arg("--log")
        .arg(dir.path().join("decisions.log"))
        .env_remove("EGRESSD_POLICY")
        .env_remove("EGRESSD_CA_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.starts_with("egressd: listening") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the host's egressd serve started");
    let field = |name: &str| crate::support::announced(&line, name);
    let (proxy, dns, metrics) = (field("proxy"), field("dns"), field("metrics").port());
    // Another client's denial, which the serve keeps for `egressd grant`.
    let r = http_request(
        proxy,
        b"GET http://denied.test/secret-path HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 403);
    let denied_id = r.header("x-egressd-request").unwrap().to_string();
    // On the host, the serve answers it: the marker is real.
    let local = SocketAddr::from(([127, 0, 0, 1], metrics));
    let got = http_request(
        local,
        format!("GET /denials?id={denied_id} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(got.status, 200);
    assert!(String::from_utf8_lossy(&got.body).contains("denied.test"));
    HostServe {
        child,
        proxy,
        dns,
        metrics,
        denied_id,
        _dir: dir,
    }
}

/// The host's own interface addresses (not loopback, not link-local).
fn host_addrs() -> Vec<String> {
    let out = Command::new(crate::support::tool("ip"))
        .args(["-o", "addr", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|t| *t == "inet" || *t == "inet6")?;
            let ip: std::net::IpAddr = w.next()?.split('/').next()?.parse().ok()?;
            let link_local = match ip {
                std::net::IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
                std::net::IpAddr::V4(v4) => v4.is_link_local(),
            };
            (!ip.is_loopback() && !link_local).then(|| ip.to_string())
        })
        .collect()
}

/// The probe CMD runs: the sockets of its network namespace, direct dials,
/// and requests through its proxy. Prints `LISTEN`, `REACHED` and `PROXY`
/// lines; `DONE` at the end.
const PROBE: &str = r#"
import json, socket, sys
a = json.loads(sys.argv[1])
ID, M, P, D, HOSTS = a['id'], a['metrics'], a['proxy'], a['dns'], a['hosts']
PORTS = [M, P, D, 9464, 8053]

def listening():
    for proto, states in (('tcp', {'0A'}), ('udp', None)):
        for v6 in (False, True):
            name = '/proc/net/' + proto + ('6' if v6 else '')
            try:
                lines = open(name).read().splitlines()[1:]
            except OSError as e:
                print('UNREADABLE', name, e); continue
            for l in lines:
                f = l.split()
                addr, port = f[1].split(':')
                if states and f[3] not in states: continue
                raw = bytes.fromhex(addr)
                if v6:
                    raw = b''.join(raw[i:i+4][::-1] for i in range(0, 16, 4))
                    ip = '[' + socket.inet_ntop(socket.AF_INET6, raw) + ']'
                else:
                    ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
                print('LISTEN', proto, ip + ':' + str(int(port, 16)))

def served(text):
    # The serve's own answers: the other client's denial, or its metrics.
    return 'denied.test' in text or '# HELP egressd' in text

def exchange(ip, port, head, then=None):
    fam = socket.AF_INET6 if ':' in ip else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((ip, port))
    except OSError as e:
        return None, type(e).__name__
    out = b''
    try:
        s.sendall(head.encode())
        while True:
            b = s.recv(65536)
            if not b: break
            out += b
            if then and b'\r\n\r\n' in out and out.startswith(b'HTTP/1.1 200'):
                s.sendall(then.encode()); then = None; out += b'|'
    except OSError:
        pass
    s.close()
    return out.decode('latin1'), None

def get(path, host='x'):
    return 'GET ' + path + ' HTTP/1.1\r\nHost: ' + host + '\r\nConnection: close\r\n\r\n'

listening()
for ip in ['127.0.0.1', '127.0.0.2', '::1', '0.0.0.0'] + HOSTS:
    for port in PORTS:
        for path in ['/denials?id=' + ID, '/metrics']:
            text, err = exchange(ip, port, get(path))
            if text is not None and served(text):
                print('REACHED', ip, port, path)
            else:
                print('DIRECT', ip, port, path, err or text.split('\r\n')[0])

def via_proxy(label, head, then=None):
    text, err = exchange('127.0.0.1', 3128, head, then)
    if text is None:
        print('PROXY', label, 'refused', err); return
    status = text.split('\r\n')[0]
    reason = [l for l in text.split('\r\n') if l.lower().startswith('x-egressd-reason')]
    print('REACHED' if served(text) else 'PROXY', label, '|', status, '|', ''.join(reason))

names = ['127.0.0.1', 'admin.test', 'localhost', '127.1', '2130706433', '[::1]',
         '[::ffff:127.0.0.1]', '0.0.0.0'] + ['[' + h + ']' if ':' in h else h for h in HOSTS]
for port in [M, P]:
    for n in names:
        for path in ['/denials?id=' + ID, '/metrics']:
            url = 'http://' + n + ':' + str(port) + path
            via_proxy('GET ' + url, 'GET ' + url + ' HTTP/1.1\r\nHost: ' + n + ':' + str(port) + '\r\nConnection: close\r\n\r\n')
        auth = n + ':' + str(port)
        via_proxy('CONNECT ' + auth, 'CONNECT ' + auth + ' HTTP/1.1\r\nHost: ' + auth + '\r\n\r\n',
                  then=get('/denials?id=' + ID, auth))
for port in a.get('open', []):
    url = 'http://127.0.0.1:' + str(port) + '/'
    via_proxy('OPEN ' + url, get(url, '127.0.0.1:' + str(port)))
print('DONE')
"#;

/// Runs the probe in `r` against `serve`; `open` are ports of plain
/// origins the policy opens (their answers are printed as `OPEN`).
fn probe(r: crate::support::sandbox::Run, serve: &HostServe, open: &[u16]) -> Outcome {
    let arg = serde_json::json!({
        "id": serve.denied_id,
        "metrics": serve.metrics,
        "proxy": serve.proxy.port(),
        "dns": serve.dns.port(),
        "hosts": host_addrs(),
        "open": open,
    });
    r.cmd(&["python3", "-c", PROBE, &arg.to_string()])
}

/// Checks the probe's report: it finished, the namespace holds exactly
/// `listeners`, nothing reached the serve, and every request through the
/// proxy for the serve's ports was refused.
fn assert_nothing_reached(r: &Outcome, listeners: &[&str]) {
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("\nDONE"), "{}", r.context());
    let mut seen: Vec<&str> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("LISTEN "))
        .collect();
    seen.sort_unstable();
    let mut want = listeners.to_vec();
    want.sort_unstable();
    assert_eq!(seen, want, "{}", r.context());
    let reached: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("REACHED") || l.starts_with("UNREADABLE"))
        .collect();
    assert!(reached.is_empty(), "{reached:#?}\n{}", r.context());
    let proxied: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("PROXY ") && !l.starts_with("PROXY OPEN"))
        .collect();
    // 2 ports × at least the 8 loopback spellings × (2 GETs + CONNECT).
    assert!(proxied.len() >= 2 * 8 * 3, "{}", r.context());
    for l in &proxied {
        assert!(l.contains("| HTTP/1.1 403 "), "{l}\n{}", r.context());
    }
    assert!(!r.stdout.contains("secret-path"), "{}", r.context());
}

/// The default policy plus a name for the serve's ports, without `cidrs`:
/// the name resolves to loopback, which only `cidrs` would open.
fn named(serve: &HostServe) -> String {
    format!(
        "exceptions:\n  - id: admin\n    owner: t\n    reason: t\n    hosts: [admin.test]\n    \
         ports: [{}, {}]\n",
        serve.metrics,
        serve.proxy.port()
    )
}

const INSIDE: [&str; 3] = ["tcp 127.0.0.1:3128", "tcp 127.0.0.1:53", "udp 127.0.0.1:53"];
const CAPTURE: [&str; 2] = ["tcp 127.0.0.1:3129", "tcp [::1]:3129"];

#[test]
fn the_box_reaches_no_egressd_listener_but_its_proxy_and_resolver() {
    let serve = host_serve();
    let d = fake_dns();
    d.set("admin.test", &["127.0.0.1"]);
    let r = probe(run().policy(&named(&serve)).dns(d.addr), &serve, &[]);
    assert_nothing_reached(&r, &INSIDE);
    // The name the policy allows resolves to loopback, where the serve
    // listens: refused before the address check (`private_address` next).
    let line = r.line(|l| l["host"] == "admin.test" && l["port"] == serve.metrics);
    assert_eq!(line["reason"], "loop_detected", "{line}");
}

#[test]
fn under_transparent_the_box_reaches_no_egressd_listener_either() {
    let serve = host_serve();
    let d = fake_dns();
    d.set("admin.test", &["127.0.0.1"]);
    let r = probe(
        run()
            .policy(&named(&serve))
            .dns(d.addr)
            .arg("--transparent"),
        &serve,
        &[],
    );
    let mut want = INSIDE.to_vec();
    want.extend(CAPTURE);
    assert_nothing_reached(&r, &want);
    let line = r.line(|l| l["host"] == "admin.test" && l["port"] == serve.metrics);
    assert_eq!(line["reason"], "loop_detected", "{line}");
}

/// A plain origin on the host's loopback: the service a policy opens
/// loopback for.
fn dev_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\ndev-server",
            );
        }
    });
    port
}

/// A policy that opens the host's loopback and addresses on the serve's
/// own ports, beside a dev server's: the dev server answers, no egressd
/// listener does.
fn too_wide(serve: &HostServe, dev: u16) -> String {
    let mut cidrs = vec!["127.0.0.0/8".to_string(), "::1/128".into()];
    for h in host_addrs() {
        cidrs.push(if h.contains(':') {
            format!("{h}/128")
        } else {
            format!("{h}/32")
        });
    }
    format!(
        r#"
exceptions:
  - id: host-services
    owner: t
    reason: a dev server on the host, written too wide
    hosts: [admin.test]
    cidrs: [{}]
    ports: [{}, {}, {}, {dev}]
"#,
        cidrs
            .iter()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(", "),
        serve.metrics,
        serve.proxy.port(),
        serve.dns.port(),
    )
}

#[test]
fn a_policy_that_opens_the_hosts_loopback_still_reaches_no_egressd_listener() {
    let serve = host_serve();
    let dev = dev_server();
    let d = fake_dns();
    d.set("admin.test", &["127.0.0.1"]);
    for transparent in [false, true] {
        let mut r = run().policy(&too_wide(&serve, dev)).dns(d.addr);
        let mut want = INSIDE.to_vec();
        if transparent {
            r = r.arg("--transparent");
            want.extend(CAPTURE);
        }
        let r = probe(r, &serve, &[dev]);
        // The policy does open loopback: the dev server answers.
        assert!(
            r.stdout
                .lines()
                .any(|l| l.starts_with("PROXY OPEN") && l.contains("| HTTP/1.1 200 ")),
            "{}",
            r.context()
        );
        assert_nothing_reached(&r, &want);
        let line = r.line(|l| {
            l["port"] == serve.metrics && l["host"] == "127.0.0.1" && l["method"] == "GET"
        });
        assert_eq!(line["reason"], "loop_detected", "{line}");
        assert!(
            line["note"]
                .as_str()
                .is_some_and(|n| n.contains("another egressd")),
            "{line}"
        );
    }
}

/// Report mode lets every would-be denial through, non-public addresses
/// included; an egressd listener stays refused, as egressd's own always
/// was.
#[test]
fn in_report_mode_the_box_still_reaches_no_egressd_listener() {
    let serve = host_serve();
    let d = fake_dns();
    d.set("admin.test", &["127.0.0.1"]);
    let policy = "settings:\n  mode: report\nexceptions: []\n";
    let r = probe(run().policy(policy).dns(d.addr), &serve, &[]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("\nDONE"), "{}", r.context());
    let reached: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("REACHED"))
        .collect();
    assert!(reached.is_empty(), "{reached:#?}\n{}", r.context());
    let ports = [serve.metrics, serve.proxy.port()];
    let lines: Vec<serde_json::Value> = r
        .log_lines()
        .into_iter()
        .filter(|l| ports.iter().any(|p| l["port"] == *p))
        .collect();
    // Every spelling of the host's addresses, by name and by CONNECT;
    // `localhost` is a name egressd asks upstream, which knows none.
    assert!(lines.len() >= 2 * 8 * 3, "{lines:#?}");
    for l in &lines {
        assert!(l["addr"].is_null(), "never dialled: {l}");
        if l["host"] != "localhost" {
            assert_eq!(
                (&l["reason"], &l["status"]),
                (&"loop_detected".into(), &403.into()),
                "{l}"
            );
        }
    }
}
