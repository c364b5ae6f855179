//! A fleet (issue #39 item 6, DESIGN "Grants", docs/grants.md "Grants on a
//! fleet"): two egressd replicas behind real balancers on loopback — HAProxy
//! for the proxy port (`balance source`), dnsdist for DNS (a Lua policy
//! hashing the client's address) — each pinning a client to one replica, as
//! docs/grants.md configures them.
//!
//! - A client's DNS tunnel budget holds through dnsdist: it is spent on one
//!   replica only, and past it the client is refused through the balancer
//!   (the other replica, which that client never meets, has spent nothing).
//!   dnsdist names the client in a PROXY protocol header, so egressd keeps
//!   the budget of the sandbox, not of dnsdist: a neighbour behind the same
//!   dnsdist keeps its own.
//! - A grant's uses hold through HAProxy, and a replica killed with SIGKILL
//!   loses no grant: the replicas share one grants directory, the client is
//!   moved to the survivor, which serves the grant from the count the dead
//!   one kept on disk.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::dns::tunnel_name;
use crate::forward::sha256_hex;
use crate::support::*;

const TOKEN: &str = "fleet-token";

fn free_tcp() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A loopback port free for UDP and TCP both.
fn free_udp_tcp() -> SocketAddr {
    loop {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = u.local_addr().unwrap();
        if TcpListener::bind(a).is_ok() {
            return a;
        }
    }
}

/// The policy every replica serves: a named client, an API host the test
/// grants, and a CDN wildcard a DNS tunnel could hide under.
fn fleet_policy() -> String {
    policy()
        .setting("private_destinations", "allow")
        .client_token("agent-a", &sha256_hex(TOKEN.as_bytes()))
        .exception("cdn")
        .owner("platform")
        .reason("a CDN wildcard")
        .host("*.cdn.test")
        .yaml()
}

/// Two replicas, each with its own copy of the policy (as pods mounting one
/// ConfigMap) and one grants directory they share (a shared volume).
struct Fleet {
    dir: tempfile::TempDir,
    replicas: Vec<Option<Egressd>>,
    /// The replicas' upstream resolver, kept alive with them.
    _dns: FakeDns,
    origin: Origin,
}

impl Fleet {
    fn start() -> Fleet {
        let dns = fake_dns();
        let origin = origin();
        dns.set("api.test", &["127.0.0.1"]);
        dns.set("*.cdn.test", &["127.0.0.9"]);
        let dir = tempfile::tempdir().unwrap();
        let grants = dir.path().join("grants");
        std::fs::create_dir(&grants).unwrap();
        let replicas = (0..2)
            .map(|i| {
                let p = dir.path().join(format!("policy-{i}"));
                std::fs::create_dir(&p).unwrap();
                std::fs::write(p.join("p.yaml"), fleet_policy()).unwrap();
                Some(
                    egressd()
                        .dns(dns.addr)
                        .policy_path(&p)
                        .arg("--grants")
                        .arg(&grants.display().to_string())
                        // dnsdist, on 127.0.0.1, names each query's client.
                        .arg("--dns-proxy-protocol")
                        .arg("127.0.0.1/32")
                        .log(&dir.path().join(format!("r{i}.log")).display().to_string())
                        .start(),
                )
            })
            .collect();
        Fleet {
            dir,
            replicas,
            _dns: dns,
            origin,
        }
    }

    fn r(&self, i: usize) -> &Egressd {
        self.replicas[i].as_ref().expect("a live replica")
    }

    fn grants(&self) -> std::path::PathBuf {
        self.dir.path().join("grants")
    }

    /// Replica `i`'s decision-log lines.
    fn lines(&self, i: usize) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join(format!("r{i}.log")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// HAProxy in front of the replicas' proxy ports, configured by the
    /// shipped `deploy/balancers/haproxy.cfg`: one replica per client
    /// address, health-checked, and a client whose replica is down moved to
    /// another.
    fn haproxy(&self) -> (Balancer, SocketAddr) {
        let front = free_tcp();
        let cfg = self.dir.path().join("haproxy.cfg");
        let text = shipped(
            "haproxy.cfg",
            &[
                ("10.0.0.10:3128", front.to_string()),
                ("10.0.0.11:3128", self.r(0).proxy.to_string()),
                ("10.0.0.12:3128", self.r(1).proxy.to_string()),
            ],
        );
        std::fs::write(&cfg, text).unwrap();
        (haproxy(&cfg, front), front)
    }

    /// dnsdist in front of the replicas' resolvers, configured by the
    /// shipped `deploy/balancers/dnsdist.conf`: a client's address hashed
    /// onto one replica.
    fn dnsdist(&self) -> (Balancer, SocketAddr) {
        let listen = free_udp_tcp();
        let cfg = self.dir.path().join("dnsdist.conf");
        let text = shipped(
            "dnsdist.conf",
            &[
                ("10.0.0.10:53", listen.to_string()),
                ("10.0.0.11:8053", self.r(0).dns.to_string()),
                ("10.0.0.12:8053", self.r(1).dns.to_string()),
                ("10.0.0.0/8", "127.0.0.0/8".to_string()),
            ],
        );
        std::fs::write(&cfg, text).unwrap();
        let child = Command::new(tool("dnsdist"))
            .args(["--supervised", "--disable-syslog", "-C"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsdist starts");
        // Up once both replicas are: clients from other loopback addresses
        // are spread over both. (egressd sees dnsdist's address for every
        // one of them; one ordinary name, asked again, costs no budget.)
        eventually("dnsdist sending to both replicas", || {
            for last in 2..=40u8 {
                let q = dns_query("www.cdn.test", RecordType::A);
                let _ = ask_from([127, 0, 0, last], listen, &q);
            }
            let met = |i: usize| {
                self.lines(i)
                    .iter()
                    .any(|l| l["qname"] == "www.cdn.test" && l["decision"] == "allow")
            };
            (met(0) && met(1)).then_some(())
        });
        (Balancer(child), listen)
    }
}

/// One UDP exchange from the loopback address `ip`: the reply's rcode.
fn ask_from(
    ip: [u8; 4],
    server: SocketAddr,
    q: &hickory_proto::op::Message,
) -> Option<ResponseCode> {
    let s = UdpSocket::bind((std::net::Ipv4Addr::from(ip), 0)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.send_to(&q.to_vec().ok()?, server).ok()?;
    let mut buf = vec![0u8; 4096];
    let (n, _) = s.recv_from(&mut buf).ok()?;
    let r = hickory_proto::op::Message::from_vec(&buf[..n]).ok()?;
    Some(r.metadata.response_code)
}

/// The shipped balancer configuration `deploy/balancers/NAME`, its example
/// addresses replaced by the test's (each must be there: the file is what
/// the documentation gives, and what runs here).
fn shipped(name: &str, replace: &[(&str, String)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/balancers")
        .join(name);
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in replace {
        assert!(text.contains(from), "{} names no {from}", path.display());
        text = text.replace(from, to);
    }
    assert!(!text.contains("10.0.0."), "an address left: {text}");
    text
}

/// A request through `front` as the named client: its status and
/// `X-Egressd-Request` (status 0: the balancer closed without an answer).
fn through(front: SocketAddr, url: &str) -> (u16, Option<String>, Option<String>) {
    let out = Command::new(tool("curl"))
        .args(["-sS", "-o", "/dev/null", "-D", "-", "--max-time", "10"])
        .arg("-x")
        .arg(format!("http://{front}"))
        .arg("--proxy-user")
        .arg(format!("agent:{TOKEN}"))
        .arg(url)
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    (
        status,
        header("x-egressd-request"),
        header("x-egressd-reason"),
    )
}

fn wait_active_grants(e: &Egressd, n: f64) {
    eventually("the grant to reload", || {
        (e.metric("egressd_grants{state=\"active\"}") == Some(n)).then_some(())
    });
}

#[test]
fn fleet_a_dns_tunnel_budget_is_spent_on_one_replica_and_holds_through_dnsdist() {
    let f = Fleet::start();
    let (_dd, front) = f.dnsdist();
    // The sandbox: its own loopback address, which dnsdist passes on in a
    // PROXY protocol header.
    const C: [u8; 4] = [127, 0, 0, 7];
    let src_of = |l: &serde_json::Value, ip: [u8; 4]| {
        l["src"]
            .as_str()
            .is_some_and(|s| s.starts_with(&format!("{}:", std::net::Ipv4Addr::from(ip))))
    };
    let tunnel_lines = |i: usize, ip: [u8; 4]| -> Vec<serde_json::Value> {
        f.lines(i)
            .into_iter()
            .filter(|l| {
                src_of(l, ip)
                    && l["qname"]
                        .as_str()
                        .is_some_and(|q| q.ends_with(".cdn.test") && q != "www.cdn.test")
            })
            .collect()
    };
    let mut blocked_at = None;
    for i in 0..200u32 {
        let (name, _) = tunnel_name(i, "cdn.test");
        let r = ask_from(C, front, &dns_query(&name, RecordType::A)).expect("an answer");
        if r == ResponseCode::Refused {
            blocked_at = Some(i);
            break;
        }
        assert_eq!(r, ResponseCode::NoError, "{name}");
    }
    let blocked_at = blocked_at.expect("the tunnel was never refused through dnsdist");
    assert!(blocked_at > 3, "refused at once: {blocked_at}");
    eprintln!("fleet: the tunnel was refused through dnsdist after {blocked_at} names");
    let (l0, l1) = (tunnel_lines(0, C), tunnel_lines(1, C));
    // Every name the client sent met one replica, which logged the client
    // (not dnsdist); the other spent nothing.
    let (serving, other) = if l1.is_empty() { (0, 1) } else { (1, 0) };
    let (served, unspent) = if serving == 0 { (l0, l1) } else { (l1, l0) };
    assert!(
        unspent.is_empty(),
        "the other replica met the client: {unspent:?}"
    );
    assert_eq!(served.len(), blocked_at as usize + 1);
    let refusal = served.last().unwrap();
    assert_eq!(
        (&refusal["reason"], &refusal["decision"]),
        (&"dns_tunnel".into(), &"deny".into())
    );
    assert!(refusal["note"].as_str().unwrap().contains("block_bytes"));
    // Past the budget the client stays refused through the balancer (the
    // domain's cool-down, on the replica it meets).
    for i in [500, 501, 502] {
        let q = dns_query(&tunnel_name(i, "cdn.test").0, RecordType::A);
        assert_eq!(ask_from(C, front, &q), Some(ResponseCode::Refused));
    }
    let refused = tunnel_lines(serving, C)
        .iter()
        .filter(|l| l["reason"] == "dns_tunnel")
        .count();
    assert_eq!(refused, 4);
    assert!(tunnel_lines(other, C).is_empty());
    // Another sandbox behind the same dnsdist, on the same replica, has its
    // own budget: egressd tells them apart by the header.
    let neighbour = eventually("a neighbour on the same replica", || {
        (8..=60u8).map(|last| [127, 0, 0, last]).find(|&ip| {
            let _ = ask_from(ip, front, &dns_query("www.cdn.test", RecordType::A));
            f.lines(serving)
                .iter()
                .any(|l| src_of(l, ip) && l["qname"] == "www.cdn.test")
        })
    });
    let q = dns_query(&tunnel_name(700, "cdn.test").0, RecordType::A);
    assert_eq!(ask_from(neighbour, front, &q), Some(ResponseCode::NoError));
    // What the pinning is for: the other replica holds an unspent budget
    // for the same client, which a balancer without affinity would hand out.
    let q = dns_query(&tunnel_name(600, "cdn.test").0, RecordType::A);
    assert_eq!(ask_from(C, f.r(other).dns, &q), Some(ResponseCode::NoError));
}

#[test]
fn fleet_a_grants_uses_hold_through_haproxy_and_a_killed_replica_loses_no_grant() {
    let mut f = Fleet::start();
    let (_ha, front) = f.haproxy();
    let url = format!("http://api.test:{}/", f.origin.addr().port());
    let (status, id, _) = through(front, &url);
    assert_eq!(status, 403);
    let id = id.unwrap();
    let serving = eventually("the denial on one replica", || {
        (0..2).find(|&i| f.lines(i).iter().any(|l| l["id"] == id.as_str()))
    });
    let other = 1 - serving;
    // Granted from the serving replica's recent denials, into the shared
    // grants directory: both replicas serve it.
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args([
            "grant", &id, "--ttl", "1h", "--uses", "3", "--owner", "o", "--reason", "r",
        ])
        .arg("--policy")
        .arg(f.dir.path().join(format!("policy-{serving}")))
        .arg("--grants")
        .arg(f.grants())
        .arg("--from")
        .arg(format!("http://{}", f.r(serving).metrics))
        .env_remove("EGRESSD_LOG")
        .env_remove("EGRESSD_POLICY")
        .env_remove("EGRESSD_GRANTS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gid = stdout
        .lines()
        .find_map(|l| l.strip_prefix("granted "))
        .and_then(|l| l.split(':').next())
        .unwrap()
        .to_string();
    wait_active_grants(f.r(0), 1.0);
    wait_active_grants(f.r(1), 1.0);

    assert_eq!(through(front, &url).0, 200);
    assert_eq!(through(front, &url).0, 200);
    let uses = |e: &Egressd| e.metric("egressd_grant_uses_total").unwrap();
    assert_eq!((uses(f.r(serving)), uses(f.r(other))), (2.0, 0.0));
    let state = f.grants().join(".state").join(format!("{gid}.uses"));
    assert_eq!(std::fs::read_to_string(&state).unwrap().trim(), "2");

    // The serving replica dies without a word.
    let mut dead = f.replicas[serving].take().unwrap();
    dead.signal("KILL");
    let _ = dead.child.wait();
    // HAProxy moves the client; a request the balancer could not place
    // reaches no replica and takes no use.
    let (status, _, _) = eventually("the client moved to the survivor", || {
        let r = through(front, &url);
        (r.0 != 0 && r.0 != 503).then_some(r)
    });
    assert_eq!(status, 200, "the third use, on the survivor");
    let (status, _, reason) = through(front, &url);
    assert_eq!(
        (status, reason.as_deref()),
        (403, Some("grant_used_up")),
        "three uses across the fleet, not three per replica"
    );
    assert_eq!(uses(f.r(other)), 1.0);
    assert_eq!(std::fs::read_to_string(&state).unwrap().trim(), "3");
    assert!(f.grants().join(format!("{gid}.yaml")).is_file());
    let moved = f
        .lines(other)
        .into_iter()
        .filter(|l| l["grant"] == gid.as_str())
        .count();
    assert_eq!(moved, 1, "the survivor served the grant once");
    drop(dead);
}
