//! The network-namespace part of a [`Lab`](super::Lab) built with
//! [`LabBuilder::netns`](super::LabBuilder::netns), for real DNS tunnel
//! tools ([`Netns`]): three network namespaces the test makes, joined by
//! veth pairs, nothing else reachable.
//!
//! ```text
//!  agent (client tool) ── 10.77.N.0/30 ── gate (egressd) ── 10.78.N.0/30 ── auth (tunnel server)
//!   tun 10.79.N.2                          DNS on .1:53                      relay .2:53 → 127.0.0.1:5300
//! ```
//!
//! The agent has a route to the gate only, and the gate forwards nothing, so
//! the client tool's one way out is egressd's DNS listener. In the auth
//! namespace a relay in front of the tunnel server records every query that
//! reached the authoritative side (the bytes that left), and listeners count
//! what came out of the tunnel (UDP through iodine's tun, TCP through
//! dns2tcp's resource). egressd itself is the lab's one `egressd serve`
//! (`process.rs`), started in the gate ([`Netns::serve_in_gate`]).
//! Dropping the lab kills its processes by id and deletes its namespaces.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hickory_proto::op::Message;

use crate::support::Builder;

/// The zone the tunnel server is authoritative for.
pub const ZONE: &str = "t.tunnel.test";
pub const PASSWORD: &str = "lab-secret-1";
/// Where the tunnel server listens inside the auth namespace.
const SERVER_PORT: u16 = 5300;
/// The UDP port a tunnel listener waits on inside the auth namespace.
pub const TUN_PORT: u16 = 9999;
/// The TCP port of dns2tcp's resource inside the auth namespace.
pub const RESOURCE_PORT: u16 = 7007;

/// Fails `test` unless the lab can run here: `binaries` installed, root and
/// iproute2 for network namespaces, a tunnel device.
pub fn need(test: &str, binaries: &[&str]) {
    for b in binaries {
        crate::support::installed(b);
    }
    crate::support::need_root(test, "network namespaces");
    let ok = Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{test}: `ip netns` fails: {}",
        crate::support::missing("ip")
    );
    assert!(
        Path::new("/dev/net/tun").exists(),
        "{test} needs /dev/net/tun (iodine's tunnel device)"
    );
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread inside namespace `ns`: sockets it makes belong there
/// (and keep working from any thread afterwards).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(format!("/run/netns/{ns}")).expect("netns file");
            // SAFETY: setns on this thread only, with a valid open fd; the
            // thread ends right after `f`, so nothing else runs in it.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread")
    })
}

/// Runs `f` on a thread of its own in a fresh network namespace holding
/// only `lo` (127.0.0.1, ::1 and `ips`), for the sandbox and browser tests
/// whose origins stand at addresses of their own. Everything `f` binds,
/// and every process it starts, lives in that namespace. Making one needs
/// root: without it the test fails saying so.
pub fn in_fresh_netns<T: Send + 'static>(
    name: &str,
    ips: &[&str],
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let mut cmds = vec![vec![
        "link".to_string(),
        "set".into(),
        "lo".into(),
        "up".into(),
    ]];
    for ip in ips {
        cmds.push(
            ["addr", "add", &format!("{ip}/32"), "dev", "lo"]
                .map(String::from)
                .to_vec(),
        );
    }
    let h = thread::spawn(move || -> std::io::Result<T> {
        // SAFETY: unshare with one flag and no pointers. CLONE_NEWNET
        // moves the calling thread alone; threads and processes it starts
        // from here on inherit its namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for args in cmds {
            let out = Command::new(crate::support::tool("ip"))
                .args(&args)
                .output()?;
            if !out.status.success() {
                return Err(std::io::Error::other(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
        }
        Ok(f())
    });
    match h.join() {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            crate::support::need_root(name, "a network namespace of the test's own");
            panic!("{name}: root could not make the test's network namespace: {e}");
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A child process whose stderr and stdout lines are collected.
pub struct Proc {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(ns: &str, argv: &[String]) -> Proc {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Proc { child, lines }
    }

    pub fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    pub fn said(&self, what: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(what))
    }

    /// Waits until the output has `what` or `deadline` passes.
    pub fn wait_for(&self, what: &str, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            if self.said(what) {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.said(what)
    }

    pub fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One query that reached the authoritative side.
#[derive(Clone, Debug)]
pub struct Arrived {
    pub name: String,
}

/// A UDP relay in front of the tunnel server that records every query.
struct Relay {
    seen: Arc<Mutex<Vec<Arrived>>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn start(ns: &str, listen: SocketAddr, server: SocketAddr) -> Relay {
        let (front, back) = in_netns(ns, || {
            let front = UdpSocket::bind(listen).expect("relay listen");
            let back = UdpSocket::bind("127.0.0.1:0").expect("relay back");
            back.connect(server).unwrap();
            (front, back)
        });
        for s in [&front, &back] {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let asker: Arc<Mutex<HashMap<u16, SocketAddr>>> = Arc::default();
        let front = Arc::new(front);
        let back = Arc::new(back);
        {
            let (front, back, seen, stop, asker) = (
                front.clone(),
                back.clone(),
                seen.clone(),
                stop.clone(),
                asker.clone(),
            );
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = front.recv_from(&mut buf) else {
                        continue;
                    };
                    if n < 12 {
                        continue;
                    }
                    if let Ok(m) = Message::from_vec(&buf[..n]) {
                        if let Some(q) = m.queries.first() {
                            seen.lock().unwrap().push(Arrived {
                                name: q.name().to_ascii().trim_end_matches('.').to_lowercase(),
                            });
                        }
                    }
                    let id = u16::from_be_bytes([buf[0], buf[1]]);
                    asker.lock().unwrap().insert(id, from);
                    let _ = back.send(&buf[..n]);
                }
            });
        }
        {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut buf = [0u8; 65535];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = back.recv(&mut buf) else { continue };
                    if n < 12 {
                        continue;
                    }
                    let id = u16::from_be_bytes([buf[0], buf[1]]);
                    if let Some(to) = asker.lock().unwrap().get(&id).copied() {
                        let _ = front.send_to(&buf[..n], to);
                    }
                }
            });
        }
        Relay { seen, stop }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Counts UDP datagrams arriving on a port (what came out of a tunnel).
struct UdpCounter {
    got: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl UdpCounter {
    fn start(ns: &str, port: u16) -> UdpCounter {
        let sock = in_netns(ns, || {
            UdpSocket::bind(("0.0.0.0", port)).expect("tun listener")
        });
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let got = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, st) = (got.clone(), stop.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !st.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    g.fetch_add(n, Ordering::Relaxed);
                }
            }
        });
        UdpCounter { got, stop }
    }
}

impl Drop for UdpCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A TCP echo server that counts the bytes it was sent (dns2tcp's resource).
struct TcpCounter {
    got: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl TcpCounter {
    fn start(ns: &str, port: u16) -> TcpCounter {
        let l = in_netns(ns, || {
            TcpListener::bind(("127.0.0.1", port)).expect("resource")
        });
        l.set_nonblocking(true).unwrap();
        let got = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, st) = (got.clone(), stop.clone());
        thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let g = g.clone();
                        thread::spawn(move || {
                            c.set_nonblocking(false).unwrap();
                            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                            let mut buf = [0u8; 1024];
                            while let Ok(n) = c.read(&mut buf) {
                                if n == 0 {
                                    break;
                                }
                                g.fetch_add(n, Ordering::Relaxed);
                                let _ = std::io::Write::write_all(&mut c, &buf[..n]);
                            }
                        });
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        TcpCounter { got, stop }
    }
}

impl Drop for TcpCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Which tunnel server the auth namespace runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Server {
    Iodined,
    Dns2tcpd,
}

/// A lab's namespaces: egressd in the gate, the tunnel server behind its
/// relay in auth, counters for what leaves through the tunnel, and the
/// client tools the test starts.
pub struct Netns {
    pub n: u8,
    names: [String; 3],
    /// The lab's scratch dir (the tunnel server's configuration, its chroot).
    dir: PathBuf,
    procs: Vec<Proc>,
    relay: Option<Relay>,
    udp: Option<UdpCounter>,
    tcp: Option<TcpCounter>,
    /// egressd's DNS listener in the gate, the agent's one way out.
    pub egressd_dns: SocketAddr,
    /// The relay's address: the authoritative side as egressd sees it.
    pub auth_dns: SocketAddr,
}

impl Netns {
    pub fn agent(&self) -> &str {
        &self.names[0]
    }
    pub fn gate(&self) -> &str {
        &self.names[1]
    }
    pub fn auth(&self) -> &str {
        &self.names[2]
    }

    /// Namespaces and links for lab `n` (1..=250), unique to this process;
    /// files go in `dir`.
    pub fn new(n: u8, dir: &Path) -> Netns {
        let pid = std::process::id();
        // The lab exists (and its Drop cleans up) before anything is made.
        let lab = Netns {
            n,
            egressd_dns: format!("10.77.{n}.1:53").parse().unwrap(),
            auth_dns: format!("10.78.{n}.2:53").parse().unwrap(),
            names: ["a", "g", "s"].map(|r| format!("egd{pid}-{n}{r}")),
            dir: dir.to_path_buf(),
            procs: Vec::new(),
            relay: None,
            udp: None,
            tcp: None,
        };
        for ns in &lab.names {
            run(&["ip", "netns", "add", ns]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        let [a, g, s] = &lab.names;
        run(&[
            "ip", "link", "add", "va", "netns", a, "type", "veth", "peer", "name", "vg", "netns", g,
        ]);
        run(&[
            "ip", "link", "add", "vh", "netns", g, "type", "veth", "peer", "name", "vs", "netns", s,
        ]);
        for (ns, dev, addr) in [
            (a, "va", format!("10.77.{n}.2/30")),
            (g, "vg", format!("10.77.{n}.1/30")),
            (g, "vh", format!("10.78.{n}.1/30")),
            (s, "vs", format!("10.78.{n}.2/30")),
        ] {
            run(&["ip", "-n", ns, "addr", "add", &addr, "dev", dev]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        // The gate is not a router: the agent reaches egressd and nothing more.
        run(&[
            "ip",
            "netns",
            "exec",
            g,
            "sh",
            "-c",
            "echo 0 > /proc/sys/net/ipv4/ip_forward",
        ]);
        lab
    }

    /// Starts the tunnel server for [`ZONE`] in auth, behind the relay.
    pub fn server(&mut self, which: Server) {
        let listen: SocketAddr = format!("127.0.0.1:{SERVER_PORT}").parse().unwrap();
        let argv: Vec<String> = match which {
            Server::Iodined => [
                "/usr/sbin/iodined",
                "-f",
                "-c",
                "-P",
                PASSWORD,
                "-l",
                "127.0.0.1",
                "-p",
                &SERVER_PORT.to_string(),
                &format!("10.79.{}.1/27", self.n),
                ZONE,
            ]
            .map(String::from)
            .to_vec(),
            Server::Dns2tcpd => {
                let conf = self.dir.join("dns2tcpd.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "listen = 127.0.0.1\nport = {SERVER_PORT}\nuser = nobody\nchroot = {}\n\
                         domain = {ZONE}\nresources = echo:127.0.0.1:{RESOURCE_PORT}\n",
                        self.dir.display()
                    ),
                )
                .unwrap();
                self.tcp = Some(TcpCounter::start(self.auth(), RESOURCE_PORT));
                vec![
                    "/usr/bin/dns2tcpd".into(),
                    "-F".into(),
                    "-f".into(),
                    conf.display().to_string(),
                ]
            }
        };
        let p = Proc::spawn(self.auth(), &argv);
        let ready = match which {
            Server::Iodined => "Listening to dns",
            Server::Dns2tcpd => "Starting Server",
        };
        assert!(
            p.wait_for(ready, Instant::now() + Duration::from_secs(10)),
            "{which:?} did not start: {}",
            p.text()
        );
        self.procs.push(p);
        if which == Server::Iodined {
            self.udp = Some(UdpCounter::start(self.auth(), TUN_PORT));
        }
        self.relay = Some(Relay::start(self.auth(), self.auth_dns, listen));
    }

    /// `b` set to start egressd in the gate: its DNS listener on
    /// [`Netns::egressd_dns`], its upstream the relay.
    pub fn serve_in_gate(&self, b: Builder) -> Builder {
        b.wrap(&["ip", "netns", "exec", self.gate()])
            .dns_listen(self.egressd_dns)
            .dns(self.auth_dns)
    }

    /// Runs a client in `ns` (the agent's, or the gate's for a control that
    /// bypasses egressd).
    pub fn client(&mut self, ns: &str, argv: &[String]) -> usize {
        self.procs.push(Proc::spawn(ns, argv));
        self.procs.len() - 1
    }

    pub fn proc(&mut self, i: usize) -> &mut Proc {
        &mut self.procs[i]
    }

    /// Every query that reached the authoritative side so far.
    pub fn arrived(&self) -> Vec<Arrived> {
        self.relay
            .as_ref()
            .map(|r| r.seen.lock().unwrap().clone())
            .unwrap_or_default()
    }

    /// Bytes that came out of the tunnel on the server's side.
    pub fn tunnelled(&self) -> usize {
        self.udp
            .as_ref()
            .map_or(0, |c| c.got.load(Ordering::Relaxed))
            + self
                .tcp
                .as_ref()
                .map_or(0, |c| c.got.load(Ordering::Relaxed))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.relay.take();
        self.udp.take();
        self.tcp.take();
        // Processes first (by id), then the namespaces they lived in.
        self.procs.clear();
        for ns in &self.names {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The new names (each once) that reached the authoritative side, and the
/// bytes of their labels left of [`ZONE`].
pub fn new_name_bytes(arrived: &[Arrived]) -> (usize, usize) {
    let mut names: Vec<&str> = arrived.iter().map(|a| a.name.as_str()).collect();
    names.sort();
    names.dedup();
    let bytes = names
        .iter()
        .map(|n| n.len().saturating_sub(ZONE.len() + 1))
        .sum();
    (names.len(), bytes)
}
