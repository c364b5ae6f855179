//! `egressd run`: real sandboxes (user, mount, network, PID namespaces)
//! running curl and python3, with egressd embedded or `--connect`ed. Every
//! fixture listens on the host's loopback or on the host's own addresses;
//! inside the sandbox there is only `lo`, so nothing here can send a packet
//! off the machine (the one attempt at an outside address, 203.0.113.53, a
//! documentation address standing in for a public resolver, is made
//! only after the script inside has checked it sees no interface but `lo`).

use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use crate::support::sandbox::*;
use crate::support::*;

fn policy(port: u16) -> String {
    format!(
        r##"
settings:
  contact: "#sec-test"
exceptions:
  - id: origin
    owner: test-team
    reason: the local origin, reached by name
    hosts: [allowed.test]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
"##
    )
}

/// The first global-scope address of this host of the given family, if any.
fn host_address(v6: bool) -> Option<IpAddr> {
    let out = Command::new(crate::support::tool("ip"))
        .args([
            if v6 { "-6" } else { "-4" },
            "-o",
            "addr",
            "show",
            "scope",
            "global",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.position(|x| x == "inet" || x == "inet6")?;
            w.next()?.split('/').next()?.parse().ok()
        })
        .next()
}

// ---------------------------------------------------------------- egress through egressd

#[test]
fn curl_and_python_reach_an_allowed_origin_through_egressd_and_are_logged() {
    let o = origin();
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    let port = o.addr.port();
    let script = format!(
        "curl -sS http://allowed.test:{port}/curl && echo && \
         curl -sS --proxytunnel http://allowed.test:{port}/tunnel && echo && \
         python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://allowed.test:{port}/py\", timeout=10).read().decode())'"
    );
    let r = run()
        .policy(&policy(port))
        .dns(dns.addr)
        .cmd(&["sh", "-c", &script]);
    assert_eq!(r.code, 0, "{}", r.context());
    for path in ["/curl", "/tunnel", "/py"] {
        assert!(
            r.stdout.contains(&format!("hello from origin {path}")),
            "{path}: {}",
            r.context()
        );
    }
    let targets: Vec<String> = o
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.target.clone())
        .collect();
    assert_eq!(targets, ["/curl", "/tunnel", "/py"]);
    for proto in ["http", "connect"] {
        let l = r.line(|l| l["proto"] == proto && l["decision"] == "allow");
        assert_eq!(l["exception"], "origin");
        assert_eq!(l["host"], "allowed.test");
        assert_eq!(l["addr"], format!("127.0.0.1:{port}"));
        assert!(
            l["src"].as_str().unwrap().starts_with("127.0.0.1:"),
            "src is the sandbox's loopback: {l}"
        );
    }
    let http_lines = r
        .log_lines()
        .into_iter()
        .filter(|l| l["proto"] == "http")
        .count();
    // curl's and python's requests, and the plain HTTP request inside
    // curl's tunnel (checked as a proxy request is), each logged once.
    assert_eq!(http_lines, 3, "each request logged once");
}

#[test]
fn denied_targets_get_403_and_are_logged() {
    let o = origin();
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    dns.set("denied.test", &["127.0.0.1"]);
    let port = o.addr.port();
    let curl =
        format!("curl -s -o /dev/null -w 'curl=%{{http_code}}\\n' http://denied.test:{port}/x");
    let python = format!(
        r#"
import urllib.request, urllib.error
try:
    urllib.request.urlopen('http://denied.test:{port}/y', timeout=10)
    print('python=allowed')
except urllib.error.HTTPError as e:
    print('python=%d %s' % (e.code, e.headers.get('X-Egressd-Reason')))
"#
    );
    let script = format!("{curl}; python3 -c \"$1\"");
    let r = run()
        .policy(&policy(port))
        .dns(dns.addr)
        .cmd(&["sh", "-c", &script, "sh", &python]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("curl=403"), "{}", r.context());
    assert!(
        r.stdout.contains("python=403 no_exception"),
        "{}",
        r.context()
    );
    assert_eq!(o.count(), 0, "nothing reached the origin");
    let l = r.line(|l| l["host"] == "denied.test");
    assert_eq!(l["decision"], "deny");
    assert_eq!(l["reason"], "no_exception");
    assert_eq!(
        dns.count("denied.test"),
        0,
        "a denied name is never resolved"
    );
}

// ---------------------------------------------------------------- no other way out

#[test]
fn no_direct_route_to_the_host_or_anywhere_else() {
    let tcp_lo = canary();
    let (udp_lo, udp_lo_hits) = udp_canary("127.0.0.1".parse().unwrap());
    let mut tcp_targets = vec![("127.0.0.1".to_string(), tcp_lo.addr.port())];
    let mut canaries = vec![tcp_lo];
    let mut udp_targets = vec![("127.0.0.1".to_string(), udp_lo.port())];
    let mut udp_hits = vec![udp_lo_hits];
    let mut notes = Vec::new();
    for v6 in [false, true] {
        match host_address(v6) {
            Some(ip) => {
                let c = canary_on(ip, 0);
                tcp_targets.push((ip.to_string(), c.addr.port()));
                canaries.push(c);
                let (u, h) = udp_canary(ip);
                udp_targets.push((ip.to_string(), u.port()));
                udp_hits.push(h);
            }
            None => notes.push(format!(
                "no global IPv{} address on this host: that case is not exercised",
                if v6 { 6 } else { 4 }
            )),
        }
    }
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        let c = canary_on("::1".parse().unwrap(), 0);
        tcp_targets.push(("::1".to_string(), c.addr.port()));
        canaries.push(c);
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    let fmt = |v: &[(String, u16)]| {
        v.iter()
            .map(|(h, p)| format!("({h:?}, {p})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // The address outside the machine is tried only once the script has
    // seen that `lo` is the sandbox's only interface.
    let script = format!(
        r#"
import errno, json, socket
devs = [l.split(':')[0].strip() for l in open('/proc/self/net/dev').read().splitlines()[2:]]
assert devs == ['lo'], devs
out = {{}}
for host, port in [{tcp}, ("203.0.113.53", 53)]:
    fam = socket.AF_INET6 if ':' in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port)); out['tcp ' + host] = 'connected'
    except OSError as e:
        out['tcp ' + host] = errno.errorcode.get(e.errno, str(e))
for host, port in [{udp}]:
    fam = socket.AF_INET6 if ':' in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.sendto(b'leak', (host, port)); out['udp ' + host] = 'sent'
    except OSError as e:
        out['udp ' + host] = errno.errorcode.get(e.errno, str(e))
print(json.dumps(out))
"#,
        tcp = fmt(&tcp_targets),
        udp = fmt(&udp_targets),
    );
    let r = run().cmd(&["python3", "-c", &script]);
    assert_eq!(r.code, 0, "{}", r.context());
    let out: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|_| panic!("{}", r.context()));
    for (host, _) in &tcp_targets {
        let got = out[format!("tcp {host}")].as_str().unwrap();
        let want = if host == "127.0.0.1" || host == "::1" {
            "ECONNREFUSED" // the sandbox's own loopback, where nothing listens
        } else {
            "ENETUNREACH"
        };
        assert_eq!(got, want, "tcp {host}: {out}");
    }
    assert_eq!(out["tcp 203.0.113.53"], "ENETUNREACH", "{out}");
    for (host, _) in &udp_targets {
        let got = out[format!("udp {host}")].as_str().unwrap();
        if host != "127.0.0.1" {
            assert_eq!(got, "ENETUNREACH", "udp {host}: {out}");
        }
    }
    thread::sleep(Duration::from_millis(300));
    for c in &canaries {
        assert_eq!(c.hits(), 0, "a TCP connection reached {}", c.addr);
    }
    for (h, (host, _)) in udp_hits.iter().zip(&udp_targets) {
        assert_eq!(h.load(Ordering::SeqCst), 0, "a datagram reached {host}");
    }
}

#[test]
fn dns_inside_answers_only_allowed_names() {
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    dns.set("denied.test", &["127.0.0.1"]);
    let script = r#"
import socket
def addrs(name, **kw):
    try:
        return sorted({a[4][0] for a in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM, **kw)})
    except socket.gaierror as e:
        return 'gaierror %d' % e.errno
print('any', addrs('allowed.test'))
print('v4', addrs('allowed.test', family=socket.AF_INET))
print('addrconfig', addrs('allowed.test', family=socket.AF_INET, flags=socket.AI_ADDRCONFIG))
print('denied', addrs('denied.test'))
"#;
    let r = run()
        .policy(&policy(80))
        .dns(dns.addr)
        .cmd(&["python3", "-c", script]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("any ['127.0.0.1']"), "{}", r.context());
    assert!(r.stdout.contains("v4 ['127.0.0.1']"), "{}", r.context());
    // glibc skips the query under AI_ADDRCONFIG unless an IPv4 address
    // other than 127.0.0.1 exists: the sandbox's lo has 127.0.0.2 too.
    assert!(
        r.stdout.contains("addrconfig ['127.0.0.1']"),
        "{}",
        r.context()
    );
    assert!(r.stdout.contains("denied gaierror"), "{}", r.context());
    assert_eq!(
        dns.count("denied.test"),
        0,
        "a denied name is never sent upstream"
    );
    let l = r.line(|l| l["proto"] == "dns" && l["qname"] == "denied.test");
    assert_eq!(l["decision"], "deny");
    assert_eq!(l["rcode"], "REFUSED");
    let l = r.line(|l| l["proto"] == "dns" && l["qname"] == "allowed.test" && l["qtype"] == "A");
    assert_eq!(l["decision"], "allow");
}

// ---------------------------------------------------------------- nothing worth stealing

#[test]
fn credentials_set_outside_are_absent_inside() {
    let r = run()
        .env("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
        .env("GH_TOKEN", "ghp_secretvalue")
        .env("PASSED_TOKEN", "explicitly-passed")
        .env("SOME_SETTING", "not-on-the-allowlist")
        .env("LC_TIME", "C")
        .arg("--env")
        .arg("PASSED_TOKEN")
        .arg("--env")
        .arg("GREETING=hi")
        .cmd(&["env"]);
    assert_eq!(r.code, 0, "{}", r.context());
    for absent in [
        "AWS_SECRET_ACCESS_KEY",
        "GH_TOKEN",
        "SOME_SETTING",
        "aws-secret-value",
        "ghp_",
    ] {
        assert!(
            !r.stdout.contains(absent),
            "{absent} inside: {}",
            r.context()
        );
    }
    for present in [
        "PASSED_TOKEN=explicitly-passed",
        "GREETING=hi",
        "LC_TIME=C",
        "http_proxy=http://127.0.0.1:3128",
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "ALL_PROXY=http://127.0.0.1:3128",
        "NO_PROXY=localhost,127.0.0.1,::1",
        "no_proxy=localhost,127.0.0.1,::1",
    ] {
        assert!(
            r.stdout.lines().any(|l| l == present),
            "{present} missing: {}",
            r.context()
        );
    }
    let note = r
        .stderr
        .lines()
        .find(|l| l.contains("look like credentials"))
        .unwrap_or_else(|| panic!("no note: {}", r.context()));
    assert!(
        note.contains("AWS_SECRET_ACCESS_KEY") && note.contains("GH_TOKEN"),
        "{note}"
    );
    assert!(!note.contains("PASSED_TOKEN"), "{note}");
    assert!(
        !r.stderr.contains("aws-secret-value") && !r.stderr.contains("ghp_"),
        "values leaked"
    );
}

#[test]
fn cmd_has_no_capabilities_a_read_only_host_and_fresh_scratch() {
    let script = r#"
grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status
command -v ip >/dev/null || echo ip=missing
ip addr add 10.9.9.9/8 dev lo 2>/dev/null && echo addr=changed || echo addr=refused
ip link set lo down 2>/dev/null && echo link=changed || echo link=refused
ip route add default dev lo 2>/dev/null && echo route=changed || echo route=refused
touch /usr/egressd-test 2>/dev/null && echo usr=written || echo usr=read-only
echo "home=$HOME files=$(ls -A "$HOME" | wc -l)"
echo "run=$(ls -A /run | wc -l)"
touch /tmp/x "$HOME/x" && echo scratch=writable
echo "pid=$$"
cat /etc/resolv.conf
"#;
    let r = run().cmd(&["sh", "-c", script]);
    assert_eq!(r.code, 0, "{}", r.context());
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            r.stdout.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {}",
            r.context()
        );
    }
    assert!(
        !r.stdout.contains("ip=missing"),
        "iproute2 is needed: {}",
        r.context()
    );
    for want in [
        "addr=refused",
        "link=refused",
        "route=refused",
        "usr=read-only",
        "files=0",
        "run=0",
        "scratch=writable",
        "pid=2",
        "nameserver 127.0.0.1",
    ] {
        assert!(r.stdout.contains(want), "{want}: {}", r.context());
    }
    assert!(!Path::new("/usr/egressd-test").exists());
}

#[test]
fn ro_and_rw_binds() {
    let host = tempfile::tempdir().unwrap();
    let ro = host.path().join("ro");
    let rw = host.path().join("rw");
    std::fs::create_dir(&ro).unwrap();
    std::fs::create_dir(&rw).unwrap();
    std::fs::write(ro.join("in.txt"), "from the host").unwrap();
    let script = format!(
        "cat {ro}/in.txt; echo; \
         touch {ro}/new 2>/dev/null && echo ro=written || echo ro=refused; \
         echo out > {rw}/out.txt && echo rw=written",
        ro = ro.display(),
        rw = rw.display()
    );
    let r = run()
        .arg("--ro")
        .arg(&ro)
        .arg("--rw")
        .arg(&rw)
        .cmd(&["sh", "-c", &script]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("from the host"), "{}", r.context());
    assert!(r.stdout.contains("ro=refused"), "{}", r.context());
    assert!(r.stdout.contains("rw=written"), "{}", r.context());
    assert_eq!(
        std::fs::read_to_string(rw.join("out.txt")).unwrap(),
        "out\n"
    );
    assert!(!ro.join("new").exists());
}

// ---------------------------------------------------------------- bounds and exit status

#[test]
fn timeout_kills_a_setsid_grandchild_and_returns_124() {
    let marker = format!("egressd-timeout-marker-{}", std::process::id());
    let script = format!("setsid python3 -c 'import time; time.sleep(300)' {marker} & sleep 300");
    let r = run().arg("--timeout").arg("2s").cmd(&["sh", "-c", &script]);
    assert_eq!(r.code, 124, "{}", r.context());
    assert!(r.stderr.contains("timed out after 2s"), "{}", r.context());
    assert!(r.elapsed < Duration::from_secs(20), "took {:?}", r.elapsed);
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker) && !c.contains("setsid python3"))
        .collect();
    assert!(survivors.is_empty(), "still running: {survivors:?}");
}

#[test]
fn memory_limit_bites() {
    // The rlimit fallback: address space per process. (With a cgroup the
    // whole sandbox is bounded and killed instead: tests/it/sandbox.rs.)
    let r = without_cgroups("memory_limit_bites");
    let r = r.arg("--memory").arg("256M").cmd(&[
        "python3",
        "-c",
        "b = bytearray(64 << 20); print('64M ok'); b2 = bytearray(1 << 30); print('1G ok')",
    ]);
    assert!(
        is_root() || r.stderr.contains(FALLBACK_NOTE),
        "memory_limit_bites tests the rlimit fallback, and this user has a cgroup of its own: run it as root"
    );
    assert!(
        r.stderr
            .contains("--memory is each process's address space (RLIMIT_AS)"),
        "{}",
        r.context()
    );
    assert_eq!(r.code, 1, "{}", r.context());
    assert!(r.stdout.contains("64M ok"), "{}", r.context());
    assert!(!r.stdout.contains("1G ok"), "{}", r.context());
    assert!(r.stderr.contains("MemoryError"), "{}", r.context());
}

#[test]
fn file_size_and_cpu_limits_bite() {
    let r = run().arg("--file-size").arg("1M").cmd(&[
        "python3",
        "-c",
        "open('/tmp/f', 'wb').write(b'x' * (2 << 20))",
    ]);
    assert_ne!(r.code, 0, "{}", r.context());
    assert!(r.stderr.contains("File too large"), "{}", r.context());

    let r = run()
        .arg("--cpu")
        .arg("1")
        .cmd(&["sh", "-c", "while :; do :; done"]);
    assert_eq!(r.code, 128 + 24, "SIGXCPU: {}", r.context());
}

#[test]
fn exit_status_is_propagated() {
    assert_eq!(run().cmd(&["sh", "-c", "exit 7"]).code, 7);
    assert_eq!(run().cmd(&["true"]).code, 0);
    assert_eq!(run().cmd(&["sh", "-c", "kill -TERM $$"]).code, 128 + 15);
    let r = run().cmd(&["no-such-command-egressd"]);
    assert_eq!(r.code, 127, "{}", r.context());
    assert!(
        r.stderr.contains("cannot run no-such-command-egressd"),
        "{}",
        r.context()
    );
}

#[test]
fn setup_failures_exit_125_with_a_reason() {
    let r = run()
        .arg("--ro")
        .arg("/nonexistent/egressd-path")
        .cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(
        r.stderr.contains("--ro /nonexistent/egressd-path"),
        "{}",
        r.context()
    );

    let r = run().policy("exceptions: [oops\n").cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("invalid"), "{}", r.context());

    let r = run().arg("--rw").arg("/run").cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("cover"), "{}", r.context());

    // --pids used to be refused as root (the kernel exempts host uid 0
    // from RLIMIT_NPROC); CMD is never host root now, and a cgroup bounds
    // it (tests/it/sandbox.rs).
    if is_root() {
        let r = run().arg("--pids").arg("10").cmd(&["true"]);
        assert_eq!(r.code, 0, "{}", r.context());
    }
}

// ---------------------------------------------------------------- --connect

#[test]
fn connect_mode_relays_to_a_serving_egressd_as_a_named_client() {
    let o = origin();
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    dns.set("other.test", &["127.0.0.1"]);
    dns.set("shared.test", &["127.0.0.1"]);
    let port = o.addr.port();
    let yaml = format!(
        r##"
settings:
  clients:
    - id: agent-a
      token_sha256: "{}"
exceptions:
  - id: for-agent-a
    owner: t
    reason: only agent-a
    clients: [agent-a]
    hosts: [allowed.test]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
  - id: shared
    owner: t
    reason: every client
    hosts: [shared.test]
    cidrs: [127.0.0.0/8]
  - id: for-others
    owner: t
    reason: everyone but agent-a
    clients: [ci-*]
    hosts: [other.test]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
"##,
        crate::forward::sha256_hex(b"agent-a-token")
    );
    let e = egressd().policy("p.yaml", &yaml).dns(dns.addr).start();
    let script = format!(
        "curl -sS http://allowed.test:{port}/a; echo; \
         curl -s -o /dev/null -w 'other=%{{http_code}}\\n' http://other.test:{port}/b; \
         python3 -c \"import socket; print('dns', socket.getaddrinfo('shared.test', 80, socket.AF_INET)[0][4][0])\""
    );
    let r = run()
        .env("EGRESSD_TOKEN", "agent-a-token")
        .arg("--connect")
        .arg(e.proxy.to_string())
        .arg("--connect-dns")
        .arg(e.dns.to_string())
        .arg("--client")
        .arg("agent-a")
        .cmd(&["sh", "-c", &script]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("hello from origin /a"), "{}", r.context());
    assert!(r.stdout.contains("other=403"), "{}", r.context());
    assert!(r.stdout.contains("dns 127.0.0.1"), "{}", r.context());
    // DNS carries no token: the serving egressd decides lookups by the
    // launcher's source address (here: no named client).
    let l = e.wait_line("the lookup", |l| {
        l["proto"] == "dns" && l["qname"] == "shared.test"
    });
    assert_eq!(l["client"], "-");
    let l = e.wait_line("agent-a's request", |l| {
        l["proto"] == "http" && l["host"] == "allowed.test"
    });
    assert_eq!(l["client"], "agent-a");
    assert_eq!(l["exception"], "for-agent-a");
    let l = e.wait_line("the denied one", |l| l["host"] == "other.test");
    assert_eq!(l["reason"], "client_not_allowed");
    assert!(
        !std::fs::read_to_string(&e.log_path)
            .unwrap()
            .contains("agent-a-token"),
        "the token is never logged"
    );

    let r = run()
        .arg("--connect")
        .arg(e.proxy.to_string())
        .arg("--client")
        .arg("agent-a")
        .cmd(&["true"]);
    assert_eq!(r.code, 125, "no token: {}", r.context());
    assert!(r.stderr.contains("EGRESSD_TOKEN"), "{}", r.context());
}

// ---------------------------------------------------------------- rootless

#[test]
fn rootless_as_an_unprivileged_user() {
    need_unprivileged_userns("rootless_as_an_unprivileged_user");
    let o = origin();
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    let port = o.addr.port();
    let script = format!(
        "id -u; curl -sS http://allowed.test:{port}/nobody; echo; \
         curl -s -o /dev/null -w 'denied=%{{http_code}}\\n' http://denied.test:{port}/; \
         grep CapEff /proc/self/status; \
         python3 -c 'import socket; socket.create_connection((\"203.0.113.53\", 53), 2)' 2>&1 | tail -1"
    );
    let r = run()
        .unprivileged()
        .policy(&policy(port))
        .dns(dns.addr)
        .cmd(&["sh", "-c", &script]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(
        r.stdout.starts_with("1000\n"),
        "uid 1000 inside: {}",
        r.context()
    );
    assert!(
        r.stdout.contains("hello from origin /nobody"),
        "{}",
        r.context()
    );
    assert!(r.stdout.contains("denied=403"), "{}", r.context());
    assert!(
        r.stdout.contains("CapEff:\t0000000000000000"),
        "{}",
        r.context()
    );
    assert!(
        r.stdout.contains("Network is unreachable"),
        "{}",
        r.context()
    );
    let l = r.line(|l| l["proto"] == "http" && l["decision"] == "allow");
    assert_eq!(l["exception"], "origin");

    // RLIMIT_NPROC binds an unprivileged user (never host root).
    let r = run().unprivileged().arg("--pids").arg("4").cmd(&[
        "sh",
        "-c",
        "for i in 1 2 3 4 5 6 7 8; do sleep 2 & done; wait; echo done",
    ]);
    assert!(
        r.stderr.contains("fork") || r.stderr.contains("Resource temporarily unavailable"),
        "{}",
        r.context()
    );
}

// ---------------------------------------------------------------- --ca-dir

#[test]
fn interception_ca_is_trusted_inside_and_its_key_is_hidden() {
    // In the working directory, which the sandbox shows: so the key is
    // hidden by the mask, not merely by being elsewhere.
    let base = tempfile::tempdir().unwrap();
    let certs = base.path().join("certs");
    ca_init(&certs);
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    // A plain-HTTP origin: egressd's TLS to it fails (502), which proves
    // the client's handshake with egressd succeeded first.
    let o = origin();
    let port = o.addr.port();
    let yaml = format!(
        r#"
exceptions:
  - id: inspected
    owner: t
    reason: path rules need interception
    hosts: [allowed.test]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
    paths: ["/**"]
"#
    );
    let script = format!(
        "cat {key} 2>/dev/null && echo key=readable || echo key=hidden; \
         echo \"SSL_CERT_FILE=$SSL_CERT_FILE\"; \
         curl -sS -o /dev/null -w 'curl=%{{http_code}} verify=%{{ssl_verify_result}}\\n' https://allowed.test:{port}/x; \
         python3 -c 'import urllib.request as u, urllib.error as e
try: u.urlopen(\"https://allowed.test:{port}/y\", timeout=10)
except e.HTTPError as x: print(\"python=%d\" % x.code)'; \
         echo chain=$(openssl s_client -proxy 127.0.0.1:3128 -connect allowed.test:{port} \
           -servername allowed.test -showcerts </dev/null 2>/dev/null | grep -c 'BEGIN CERT'); \
         stat -c 'nssdb=%u %a' $HOME/.pki/nssdb/cert9.db; \
         echo trust=$(certutil -L -d sql:$HOME/.pki/nssdb | awk '$1 == \"egressd\" {{print $2}}')",
        key = certs.join("ca.key").display()
    );
    let r = run()
        .policy(&yaml)
        .dns(dns.addr)
        .cwd(base.path())
        .arg("--ca-dir")
        .arg(&certs)
        .cmd(&[
            "sh",
            "-c",
            &format!("test -d {} && echo certs=there; {script}", certs.display()),
        ]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("certs=there"), "{}", r.context());
    assert!(r.stdout.contains("key=hidden"), "{}", r.context());
    assert!(
        r.stdout
            .contains("SSL_CERT_FILE=/run/egressd/ca-bundle.pem"),
        "{}",
        r.context()
    );
    assert!(r.stdout.contains("curl=502 verify=0"), "{}", r.context());
    assert!(r.stdout.contains("python=502"), "{}", r.context());
    // The leaf comes with the CA that signed it.
    assert!(r.stdout.contains("chain=2"), "{}", r.context());
    // Chromium's trust store: an NSS database in HOME, CMD's own, with
    // egressd's CA trusted for TLS servers (C) and nothing else.
    assert!(r.stdout.contains("nssdb=1000 600"), "{}", r.context());
    assert!(r.stdout.contains("trust=C,,\n"), "{}", r.context());
    let l = r.line(|l| l["proto"] == "tls" && l["path"] == "/x");
    assert_eq!(l["exception"], "inspected");
    assert_eq!(o.count(), 0);
}

// ---------------------------------------------------------------- failure modes

fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(marker) && !c.contains("egressd run"))
        .collect()
}

#[test]
fn when_the_launcher_dies_the_sandbox_dies_with_it() {
    let marker = format!("egressd-orphan-marker-{}", std::process::id());
    let policy = tempfile::tempdir().unwrap();
    std::fs::write(policy.path().join("p.yaml"), "exceptions: []\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args([
            "run",
            "--cwd",
            "none",
            "--upstream-dns",
            "127.0.0.1:9",
            "--policy",
        ])
        .arg(policy.path())
        .args([
            "--",
            "python3",
            "-c",
            "import time; time.sleep(300)",
            &marker,
        ])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("CMD to start", || {
        (!processes_with(&marker).is_empty()).then_some(())
    });
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    eventually("the sandbox to die with its launcher", || {
        processes_with(&marker).is_empty().then_some(())
    });
}

#[test]
fn without_user_namespaces_it_refuses_with_125_and_says_why() {
    // A user namespace whose own limit on nested user namespaces is 0
    // stands in for a kernel that forbids them.
    let probe = Command::new(crate::support::tool("unshare"))
        .args(["--user", "--map-root-user", "true"])
        .output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "without_user_namespaces…: cannot create the user namespace the test needs: {probe:?}"
    );
    // A policy that loads: the launcher reads it (and finds egressd's
    // files) before it makes any namespace.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, "exceptions: []\n").unwrap();
    let out = Command::new(crate::support::tool("unshare"))
        .args(["--user", "--map-root-user", "sh", "-c"])
        .arg(format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && exec {} run --cwd none --policy {} --upstream-dns 127.0.0.1:9 -- true",
            env!("CARGO_BIN_EXE_egressd"),
            policy.display()
        ))
        .current_dir("/")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("forbids unprivileged user namespaces"),
        "{stderr}"
    );
}
