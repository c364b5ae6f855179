//! A fleet behind HAProxy: two `egressd serve` replicas, each with its own
//! copy of the policy (as pods mounting one ConfigMap) and its own log,
//! behind a real HAProxy on loopback that pins a client to one replica by
//! source address (`balance source`, as docs/grants.md configures it). For
//! the tests that show a client's state (a grant's uses, an upload budget)
//! holds across the balancer.
//!
//! Owns the replicas and the balancer; not what a test sends through them.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{egressd, eventually, fake_dns, origin, tool, Egressd, FakeDns, Origin};

/// Two replicas behind HAProxy, an origin and the fake DNS they resolve
/// `api.test` (to the origin) with.
pub struct Fleet {
    pub dns: FakeDns,
    pub origin: Origin,
    pub replicas: Vec<Egressd>,
    /// The balancer: the proxy address a client is given.
    pub front: SocketAddr,
    dirs: Vec<tempfile::TempDir>,
    _haproxy: Balancer,
}

/// A fleet whose replicas serve the policy `policy` writes, given the
/// origin's port.
pub fn fleet(policy: impl Fn(u16) -> String) -> Fleet {
    tool("haproxy");
    let dns = fake_dns();
    let origin = origin();
    dns.set("api.test", &["127.0.0.1"]);
    let yaml = policy(origin.addr.port());
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let replicas: Vec<Egressd> = dirs
        .iter()
        .map(|d| {
            let p = d.path().join("policy");
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("p.yaml"), &yaml).unwrap();
            egressd()
                .dns(dns.addr)
                .policy_path(&p)
                .log(&d.path().join("decisions.log").display().to_string())
                .start()
        })
        .collect();
    let front = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = dirs[0].path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 100\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend proxy\n  bind {front}\n  default_backend egressd\n\
             backend egressd\n  balance source\n  hash-type consistent\n  server r0 {}\n  server r1 {}\n",
            replicas[0].proxy, replicas[1].proxy
        ),
    )
    .unwrap();
    let haproxy = haproxy(&cfg, front);
    Fleet {
        dns,
        origin,
        replicas,
        front,
        dirs,
        _haproxy: haproxy,
    }
}

impl Fleet {
    /// Replica `i`'s policy directory.
    pub fn policy_dir(&self, i: usize) -> PathBuf {
        self.dirs[i].path().join("policy")
    }
    /// Replica `i`'s decision log.
    pub fn log(&self, i: usize) -> PathBuf {
        self.dirs[i].path().join("decisions.log")
    }
}

/// A balancer process, stopped when dropped.
pub struct Balancer(pub Child);

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// HAProxy as `cfg` configures it, once its frontend `front` accepts.
pub fn haproxy(cfg: &Path, front: SocketAddr) -> Balancer {
    let child = Command::new(tool("haproxy"))
        .arg("-db")
        .arg("-f")
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy starts");
    eventually("haproxy listening", || TcpStream::connect(front).ok());
    Balancer(child)
}
