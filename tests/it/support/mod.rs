//! Fixtures for the integration tests: an egressd process on loopback, a
//! local origin that records what reaches it, a fake upstream DNS server
//! that counts every query, a canary listener, and a raw HTTP client.
//! Everything binds 127.0.0.1:0 (or another 127/8 address); nothing leaves
//! the machine.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};

pub const DEADLINE: Duration = Duration::from_secs(10);

/// Polls `f` until it returns Some, or panics after `DEADLINE` with `what`.
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > end {
            panic!("timed out waiting for {what}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- egressd

pub struct Egressd {
    pub child: Child,
    pub proxy: SocketAddr,
    pub dns: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: tempfile::TempDir,
    pub policy_dir: PathBuf,
    pub log_path: PathBuf,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

pub struct Builder {
    files: Vec<(String, String)>,
    upstream_dns: Option<SocketAddr>,
    log: Option<String>,
    env: Vec<(String, String)>,
    args: Vec<String>,
    policy_file: bool,
}

pub fn egressd() -> Builder {
    Builder {
        files: Vec::new(),
        upstream_dns: None,
        log: None,
        env: Vec::new(),
        args: Vec::new(),
        policy_file: false,
    }
}

impl Builder {
    pub fn policy(mut self, name: &str, yaml: &str) -> Self {
        self.files.push((name.to_string(), yaml.to_string()));
        self
    }
    pub fn dns(mut self, upstream: SocketAddr) -> Self {
        self.upstream_dns = Some(upstream);
        self
    }
    pub fn log(mut self, path: &str) -> Self {
        self.log = Some(path.to_string());
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// An extra `serve` argument.
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_string());
        self
    }
    /// Pass the single policy file itself as --policy, not its directory.
    pub fn policy_as_file(mut self) -> Self {
        self.policy_file = true;
        self
    }

    pub fn start(self) -> Egressd {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy_dir = dir.path().join("policy");
        std::fs::create_dir(&policy_dir).unwrap();
        for (name, yaml) in &self.files {
            std::fs::write(policy_dir.join(name), yaml).unwrap();
        }
        let policy_arg = if self.policy_file {
            policy_dir.join(&self.files[0].0)
        } else {
            policy_dir.clone()
        };
        let log_path = dir.path().join("decisions.log");
        let log_arg = self
            .log
            .clone()
            .unwrap_or_else(|| log_path.display().to_string());
        // A DNS upstream nobody listens on unless the test brings one.
        let upstream = self
            .upstream_dns
            .unwrap_or_else(|| "127.0.0.1:9".parse().unwrap());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_egressd"));
        cmd.arg("serve")
            .arg("--policy")
            .arg(&policy_arg)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--dns-listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .arg("--upstream-dns")
            .arg(upstream.to_string())
            .arg("--log")
            .arg(&log_arg)
            .env_remove("EGRESSD_POLICY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn egressd");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = lines.clone();
        thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("egressd: listening") {
                    if let Some(t) = tx.take() {
                        let _ = t.send(line.clone());
                    }
                }
                l2.lock().unwrap().push(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("egressd did not start: {:?}", lines.lock().unwrap());
            }
        };
        let field = |name: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} in {line}"))
                .parse()
                .unwrap()
        };
        Egressd {
            proxy: field("proxy"),
            dns: field("dns"),
            metrics: field("metrics"),
            child,
            dir,
            policy_dir,
            log_path,
            stderr: lines,
        }
    }
}

impl Egressd {
    /// Every decision-log line written so far, parsed.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line {l:?}: {e}")))
            .collect()
    }

    /// Waits for a log line satisfying `pred` and returns it.
    pub fn wait_line(
        &self,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        eventually(what, || self.log_lines().into_iter().find(|l| pred(l)))
    }

    pub fn metrics_text(&self) -> String {
        let r = http_request(
            self.metrics,
            b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
        String::from_utf8(r.body).unwrap()
    }

    /// The value of one sample, e.g. `egressd_requests_total{proto="http",decision="allow"}`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics_text(), series)
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Sends a request through the proxy and reads one response.
    pub fn get(&self, url: &str) -> Response {
        self.request(&format!(
            "GET {url} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            host_of(url)
        ))
    }

    pub fn request(&self, raw: &str) -> Response {
        http_request(self.proxy, raw.as_bytes())
    }
}

impl Drop for Egressd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map(|x| x.1).unwrap_or(url);
    rest.split('/').next().unwrap_or(rest)
}

/// Finds `series` (exact label text) in a Prometheus exposition.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        (name == series).then(|| v.parse().ok()).flatten()
    })
}

// ---------------------------------------------------------------- HTTP client

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn reason(&self) -> Option<&str> {
        self.header("x-egressd-reason")
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s
}

/// One request on a new connection; reads one response.
pub fn http_request(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut r = BufReader::new(s);
    read_response(&mut r).expect("a response")
}

/// Reads one HTTP/1.1 response (Content-Length, chunked, or to EOF).
pub fn read_response(r: &mut impl BufRead) -> Option<Response> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if (100..200).contains(&status) && status != 101 {
        return read_response(r);
    }
    if status == 204 || status == 304 || status == 101 {
    } else if let Some(cl) = get("content-length") {
        body.resize(cl.parse().ok()?, 0);
        r.read_exact(&mut body).ok()?;
    } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let mut sz = String::new();
            r.read_line(&mut sz).ok()?;
            let n = usize::from_str_radix(sz.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if status != 200 || get("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
        let _ = r.read_to_end(&mut body);
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

// ---------------------------------------------------------------- origin

/// A request as the origin received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A local HTTP/1.1 origin that records every request and answers
/// `hello from origin <target>` (keep-alive aware).
pub struct Origin {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub connections: Arc<AtomicUsize>,
}

pub fn origin() -> Origin {
    origin_on(Ipv4Addr::LOCALHOST.into(), 0)
}

pub fn origin_on(ip: IpAddr, port: u16) -> Origin {
    let l = TcpListener::bind((ip, port)).expect("bind origin");
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(AtomicUsize::new(0));
    let (s2, c2) = (seen.clone(), connections.clone());
    thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { continue };
            c2.fetch_add(1, Ordering::SeqCst);
            let s3 = s2.clone();
            thread::spawn(move || serve_origin_conn(conn, s3));
        }
    });
    Origin {
        addr,
        seen,
        connections,
    }
}

impl Origin {
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
    pub fn last(&self) -> Option<Seen> {
        self.seen.lock().unwrap().last().cloned()
    }
}

fn serve_origin_conn(conn: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if let Some(cl) = get("content-length") {
            body.resize(cl.parse().unwrap_or(0), 0);
            if r.read_exact(&mut body).is_err() {
                return;
            }
        } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            loop {
                let mut sz = String::new();
                r.read_line(&mut sz).unwrap_or(0);
                let n = usize::from_str_radix(sz.trim(), 16).unwrap_or(0);
                let mut chunk = vec![0; n + 2];
                if r.read_exact(&mut chunk).is_err() {
                    return;
                }
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        }
        let close = get("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
        let reply = if let Some(n) = target.strip_prefix("/big/") {
            vec![b'x'; n.parse().unwrap_or(0)]
        } else {
            format!("hello from origin {target}").into_bytes()
        };
        seen.lock().unwrap().push(Seen {
            method: method.clone(),
            target,
            headers,
            body,
        });
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Origin: yes\r\n\r\n",
            if method == "HEAD" { 0 } else { reply.len() }
        );
        if w.write_all(head.as_bytes()).is_err() {
            return;
        }
        if method != "HEAD" && w.write_all(&reply).is_err() {
            return;
        }
        if close {
            return;
        }
    }
}

/// A TCP listener that only counts connections (and bytes): proof that
/// nothing reached a place it must not.
pub struct Canary {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    pub bytes: Arc<Mutex<Vec<u8>>>,
}

pub fn canary() -> Canary {
    canary_on(Ipv4Addr::LOCALHOST.into(), 0)
}

pub fn canary_on(ip: IpAddr, port: u16) -> Canary {
    let l = TcpListener::bind((ip, port)).expect("bind canary");
    let addr = l.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(Mutex::new(Vec::new()));
    let (h2, b2) = (hits.clone(), bytes.clone());
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            h2.fetch_add(1, Ordering::SeqCst);
            let b3 = b2.clone();
            thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    b3.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    Canary { addr, hits, bytes }
}

impl Canary {
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A TCP echo server (for CONNECT tunnels).
pub fn echo_on(ip: IpAddr, port: u16) -> SocketAddr {
    let l = TcpListener::bind((ip, port)).expect("bind echo");
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => {
                            let _ = c.shutdown(std::net::Shutdown::Write);
                            return;
                        }
                        Ok(n) => {
                            if c.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

// ---------------------------------------------------------------- fake DNS

/// A fake upstream DNS server on 127.0.0.1 (UDP) that answers A/AAAA from a
/// table and counts every query it receives, by lower-cased name.
pub struct FakeDns {
    pub addr: SocketAddr,
    pub records: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
    pub queries: Arc<Mutex<Vec<(String, RecordType)>>>,
    stop: Arc<AtomicBool>,
}

pub fn fake_dns() -> FakeDns {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let addr = sock.local_addr().unwrap();
    let records: Arc<Mutex<HashMap<String, Vec<IpAddr>>>> = Arc::new(Mutex::new(HashMap::new()));
    let queries = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (r2, q2, s2) = (records.clone(), queries.clone(), stop.clone());
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while !s2.load(Ordering::Relaxed) {
            let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let Ok(msg) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let Some(q) = msg.queries.first().cloned() else {
                continue;
            };
            let name = q
                .name()
                .to_ascii()
                .trim_end_matches('.')
                .to_ascii_lowercase();
            q2.lock().unwrap().push((name.clone(), q.query_type()));
            let mut resp = Message::response(msg.metadata.id, msg.metadata.op_code);
            resp.metadata.recursion_desired = msg.metadata.recursion_desired;
            resp.metadata.recursion_available = true;
            resp.add_query(q.clone());
            let table = r2.lock().unwrap();
            match table.get(&name) {
                None => {
                    resp.metadata.response_code = ResponseCode::NXDomain;
                }
                Some(ips) => {
                    for ip in ips {
                        let rdata = match (ip, q.query_type()) {
                            (IpAddr::V4(a), RecordType::A) => RData::A((*a).into()),
                            (IpAddr::V6(a), RecordType::AAAA) => RData::AAAA((*a).into()),
                            _ => continue,
                        };
                        resp.add_answer(Record::from_rdata(q.name().clone(), 30, rdata));
                    }
                }
            }
            drop(table);
            resp.metadata.message_type = MessageType::Response;
            if let Ok(bytes) = resp.to_vec() {
                let _ = sock.send_to(&bytes, peer);
            }
        }
    });
    FakeDns {
        addr,
        records,
        queries,
        stop,
    }
}

impl FakeDns {
    pub fn set(&self, name: &str, ips: &[&str]) {
        self.records.lock().unwrap().insert(
            name.to_string(),
            ips.iter().map(|s| s.parse().unwrap()).collect(),
        );
    }
    /// How many queries for `name` (any type) arrived.
    pub fn count(&self, name: &str) -> usize {
        self.queries
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .count()
    }
    pub fn names(&self) -> Vec<String> {
        self.queries
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Writes `text` to `path` the way an editor's atomic save does: a temp file
/// in the same directory renamed over the old one.
pub fn atomic_write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
