//! Listeners on loopback that stand for the outside world: an origin that
//! records what reaches it ([`Origin`], lenient, answers
//! `hello from origin <target>`), an origin that records the raw bytes and
//! answers by script ([`RawOrigin`], strict: what it records is exactly
//! what egressd sent), a [`Canary`] that only counts (proof that nothing
//! reached a place it must not), and a TCP echo server for tunnels.
//!
//! Owns the far side of a connection; not how egressd gets there.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::{header_of, read_chunked, read_head, Listener};

/// How long an origin waits for the next byte of a request.
const ORIGIN_READ: Duration = Duration::from_secs(30);
/// How long a raw origin waits for the next byte.
const RAW_READ: Duration = Duration::from_secs(20);
/// How long a canary keeps reading from a connection that reached it.
const CANARY_READ: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------- origin

/// A request as an origin received it (either kind of origin).
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// The body after transfer decoding.
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        header_of(&self.headers, name)
    }
    /// How many times header `name` appears.
    pub fn count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
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
    let _ = conn.set_read_timeout(Some(ORIGIN_READ));
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
        // Lenient: a line that is no header is skipped, not refused.
        let Some(head) = read_head(&mut r) else {
            return;
        };
        let headers: Vec<(String, String)> = head
            .iter()
            .filter_map(|h| h.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let get = |n: &str| header_of(&headers, n);
        let mut body = Vec::new();
        if let Some(cl) = get("content-length") {
            body.resize(cl.parse().unwrap_or(0), 0);
            if r.read_exact(&mut body).is_err() {
                return;
            }
        } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            let Some(b) = read_chunked(&mut r) else {
                return;
            };
            body = b;
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
    try_canary_on(ip, port).expect("bind canary")
}

/// [`canary_on`], or the error when `ip:port` cannot be bound.
pub fn try_canary_on(ip: IpAddr, port: u16) -> io::Result<Canary> {
    let l = TcpListener::bind((ip, port))?;
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
                let _ = c.set_read_timeout(Some(CANARY_READ));
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
    Ok(Canary { addr, hits, bytes })
}

impl Canary {
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A TCP echo server (for CONNECT tunnels).
pub fn echo_on(ip: IpAddr, port: u16) -> SocketAddr {
    try_echo_on(ip, port).expect("bind echo")
}

/// [`echo_on`], or the error when `ip:port` cannot be bound (port 443
/// needs root or CAP_NET_BIND_SERVICE).
pub fn try_echo_on(ip: IpAddr, port: u16) -> io::Result<SocketAddr> {
    let l = TcpListener::bind((ip, port))?;
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => {
                            let _ = c.shutdown(Shutdown::Write);
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
    Ok(addr)
}

/// Closes `s` with a TCP RST instead of a FIN (SO_LINGER 0).
pub fn reset(s: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

// ---------------------------------------------------------------- raw origin

/// What a [`RawOrigin`] does with a request it parsed.
pub enum Act {
    /// Write these bytes (a whole response) and keep the connection.
    Reply(Vec<u8>),
    /// Write these bytes, then echo everything that follows (an upgrade).
    Switch(Vec<u8>),
    /// Reset the connection without answering.
    Reset,
    /// Write these bytes, then reset (a response cut short).
    Partial(Vec<u8>),
    /// Wait, then reply.
    Delay(Duration, Vec<u8>),
}

type Script = dyn Fn(&Seen) -> Act + Send + Sync;
/// The bytes one connection brought, as they arrive.
type ConnBytes = Arc<Mutex<Vec<u8>>>;

/// An HTTP/1.1 origin that records every byte it receives (per connection)
/// and every request it could parse, and answers as its script says.
/// Its parser is strict (CRLF only, one framing header): what it records
/// is exactly what egressd sent.
pub struct RawOrigin {
    pub addr: SocketAddr,
    pub raw: Arc<Mutex<Vec<ConnBytes>>>,
    pub reqs: Arc<Mutex<Vec<Seen>>>,
    /// When set, new connections are reset as soon as they are accepted.
    pub reset_on_accept: Arc<AtomicBool>,
}

/// `200 OK` whose body is the request target.
pub fn ok_reply(r: &Seen) -> Act {
    Act::Reply(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}",
            r.target.len(),
            r.target
        )
        .into_bytes(),
    )
}

pub fn raw_origin(script: impl Fn(&Seen) -> Act + Send + Sync + 'static) -> RawOrigin {
    raw_origin_on(Ipv4Addr::LOCALHOST.into(), 0, script)
}

pub fn raw_origin_on(
    ip: IpAddr,
    port: u16,
    script: impl Fn(&Seen) -> Act + Send + Sync + 'static,
) -> RawOrigin {
    let l = TcpListener::bind((ip, port)).expect("bind raw origin");
    let addr = l.local_addr().unwrap();
    let raw: Arc<Mutex<Vec<ConnBytes>>> = Arc::default();
    let reqs: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let reset_on_accept = Arc::new(AtomicBool::new(false));
    let script: Arc<Script> = Arc::new(script);
    let (raw2, reqs2, roa) = (raw.clone(), reqs.clone(), reset_on_accept.clone());
    thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { continue };
            if roa.load(Ordering::SeqCst) {
                reset(conn);
                continue;
            }
            let buf = Arc::new(Mutex::new(Vec::new()));
            raw2.lock().unwrap().push(buf.clone());
            let (reqs3, script) = (reqs2.clone(), script.clone());
            thread::spawn(move || serve_raw(conn, buf, reqs3, script));
        }
    });
    RawOrigin {
        addr,
        raw,
        reqs,
        reset_on_accept,
    }
}

impl RawOrigin {
    pub fn requests(&self) -> Vec<Seen> {
        self.reqs.lock().unwrap().clone()
    }
    /// Everything received, all connections concatenated.
    pub fn bytes(&self) -> Vec<u8> {
        self.raw
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| b.lock().unwrap().clone())
            .collect()
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }
    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.raw.lock().unwrap().len()
    }
}

/// Reads from the socket into `buf` (and the shared raw record) until
/// `want` bytes are available past `pos`.
struct Feed {
    s: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    record: Arc<Mutex<Vec<u8>>>,
}

impl Feed {
    fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 16384];
        match self.s.read(&mut tmp) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                self.record.lock().unwrap().extend_from_slice(&tmp[..n]);
                true
            }
        }
    }
    fn line(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf[self.pos..].windows(2).position(|w| w == b"\r\n") {
                let l = String::from_utf8_lossy(&self.buf[self.pos..self.pos + i]).into_owned();
                self.pos += i + 2;
                return Some(l);
            }
            if !self.fill() {
                return None;
            }
        }
    }
    fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() - self.pos < n {
            if !self.fill() {
                return None;
            }
        }
        let v = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        Some(v)
    }
}

fn serve_raw(
    conn: TcpStream,
    record: Arc<Mutex<Vec<u8>>>,
    reqs: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Script>,
) {
    let _ = conn.set_read_timeout(Some(RAW_READ));
    let mut w = conn.try_clone().unwrap();
    let mut f = Feed {
        s: conn,
        buf: Vec::new(),
        pos: 0,
        record,
    };
    loop {
        let Some(start) = f.line() else { return };
        let mut parts = start.split(' ');
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let Some(h) = f.line() else { return };
            if h.is_empty() {
                break;
            }
            let Some((k, v)) = h.split_once(':') else {
                return;
            };
            headers.push((k.to_string(), v.trim().to_string()));
        }
        let get = |n: &str| -> Vec<String> {
            headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
                .collect()
        };
        let te = get("transfer-encoding");
        let cl = get("content-length");
        if !te.is_empty() && !cl.is_empty() {
            // Ambiguous framing reached the origin: record and stop.
            reqs.lock().unwrap().push(Seen {
                method,
                target,
                headers,
                body: b"<ambiguous framing>".to_vec(),
            });
            return;
        }
        let mut body = Vec::new();
        if te
            .iter()
            .any(|t| t.to_ascii_lowercase().contains("chunked"))
        {
            loop {
                let Some(sz) = f.line() else { return };
                let Ok(n) = usize::from_str_radix(sz.split(';').next().unwrap_or("").trim(), 16)
                else {
                    return;
                };
                if n == 0 {
                    // Trailers, then the empty line.
                    loop {
                        match f.line() {
                            Some(l) if l.is_empty() => break,
                            Some(_) => continue,
                            None => return,
                        }
                    }
                    break;
                }
                let Some(chunk) = f.take(n) else { return };
                body.extend_from_slice(&chunk);
                if f.take(2).as_deref() != Some(b"\r\n") {
                    return;
                }
            }
        } else if let Some(n) = cl.first() {
            let Ok(n) = n.parse::<usize>() else { return };
            let Some(b) = f.take(n) else { return };
            body = b;
        }
        let req = Seen {
            method,
            target,
            headers,
            body,
        };
        reqs.lock().unwrap().push(req.clone());
        match script(&req) {
            Act::Reply(bytes) => {
                if w.write_all(&bytes).is_err() {
                    return;
                }
            }
            Act::Delay(d, bytes) => {
                thread::sleep(d);
                if w.write_all(&bytes).is_err() {
                    return;
                }
            }
            Act::Switch(bytes) => {
                if w.write_all(&bytes).is_err() {
                    return;
                }
                // Whatever arrived with the request head belongs to the
                // new protocol: echo it, then everything after.
                let early = f.buf[f.pos..].to_vec();
                if !early.is_empty() && w.write_all(&early).is_err() {
                    return;
                }
                f.pos = f.buf.len();
                loop {
                    let before = f.buf.len();
                    if !f.fill() {
                        let _ = w.shutdown(Shutdown::Write);
                        return;
                    }
                    if w.write_all(&f.buf[before..]).is_err() {
                        return;
                    }
                    f.pos = f.buf.len();
                }
            }
            Act::Reset => {
                reset(w);
                return;
            }
            Act::Partial(bytes) => {
                let _ = w.write_all(&bytes);
                let _ = w.flush();
                reset(w);
                return;
            }
        }
    }
}

/// A listener and a canary at the same port on `canary_ip`, so that an
/// address judged as one but dialled as the other lands on the canary:
/// `make` is called until its port is free on `canary_ip` too.
pub fn beside<O: Listener>(canary_ip: &str, make: impl Fn() -> O) -> (O, Canary) {
    let ip: IpAddr = canary_ip.parse().unwrap();
    loop {
        let o = make();
        if let Ok(c) = try_canary_on(ip, o.addr().port()) {
            return (o, c);
        }
    }
}

impl Listener for Origin {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Listener for RawOrigin {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Listener for Canary {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}
