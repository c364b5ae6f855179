//! The attack suite (issue 6): every known way around an egress proxy, tried
//! against a real `egressd serve` over real sockets. Each attack asserts four
//! things: the answer (status and `X-Egressd-Reason`, or DNS rcode), that
//! nothing reached a canary or a denied origin, that no denied name reached
//! the fake upstream DNS, and that the decision log has exactly one line
//! for it, saying why.
//!
//! One file per class of attack:
//!
//! | file | class |
//! |---|---|
//! | `literals.rs` | IP literals in every spelling, metadata addresses |
//! | `hostnames.rs` | host-name games: case, dots, labels, IDN, encodings |
//! | `targets.rs` | request-target vs `Host`, userinfo, schemes, ports, egressd itself |
//! | `connect.rs` | CONNECT authorities, pipelining, SNI, non-TLS bytes |
//! | `rebinding.rs` | DNS rebinding, time-of-check/time-of-use, redirects |
//! | `smuggling.rs` | CL.TE, TE.CL, framing tricks, pipelining (origin bytes checked) |
//! | `upgrades.rs` | h2c, HTTP/2 prior knowledge, WebSocket |
//! | `dns.rs` | the resolver: packet abuse, floods, hostile upstream answers |
//! | `faults.rs` | resets, dead upstreams, reload storms, drain, rotation, full sink |
//! | `log_stall.rs` | a decision log that stops taking lines: stalled FIFO, `/dev/full`, full tmpfs |
//!
//! The fixtures here are the suite's own: an origin that records the raw
//! bytes it receives and answers by script, a scripted upstream DNS server
//! (UDP and TCP) whose answers can be made hostile mid-test, and a cursor
//! over the decision log that hands out one new line per attempt.

use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use serde_json::Value;

pub use crate::support::*;

mod connect;
mod dns;
mod faults;
mod hostnames;
mod literals;
mod log_stall;
mod rebinding;
mod smuggling;
mod targets;
mod upgrades;

// ---------------------------------------------------------------- log cursor

/// The decision log's complete lines. A line the writer is still writing
/// (no newline yet) is left for the next read: under load a reader can
/// see half of one.
pub fn complete_lines(e: &Egressd) -> Vec<Value> {
    let text = std::fs::read_to_string(&e.log_path).unwrap_or_default();
    let done = text.rfind('\n').map_or("", |i| &text[..=i]);
    done.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("bad log line {l:?}: {err}")))
        .collect()
}

/// Hands out decision-log lines one attempt at a time: [`Lines::one`] waits
/// for the next line and fails if more than one appeared, so every attempt
/// is pinned to exactly its own line.
pub struct Lines<'a> {
    e: &'a Egressd,
    seen: usize,
}

impl<'a> Lines<'a> {
    pub fn new(e: &'a Egressd) -> Lines<'a> {
        Lines {
            e,
            seen: complete_lines(e).len(),
        }
    }

    /// The one line the last attempt produced.
    pub fn one(&mut self, what: &str) -> Value {
        let mut got = self.next_n(what, 1);
        got.pop().unwrap()
    }

    /// The next `n` lines (exactly `n` new ones).
    pub fn next_n(&mut self, what: &str, n: usize) -> Vec<Value> {
        let seen = self.seen;
        let all = eventually(&format!("{n} log line(s) for {what}"), || {
            let l = complete_lines(self.e);
            (l.len() >= seen + n).then_some(l)
        });
        assert_eq!(
            all.len(),
            seen + n,
            "{what}: expected exactly {n} new line(s), got {:#?}",
            &all[seen..]
        );
        self.seen = all.len();
        all[seen..].to_vec()
    }

    /// No line beyond those handed out so far.
    pub fn done(&self, what: &str) {
        let l = complete_lines(self.e);
        assert_eq!(
            l.len(),
            self.seen,
            "{what}: unexpected extra lines {:#?}",
            &l[self.seen.min(l.len())..]
        );
    }
}

/// Asserts a line records a denial for `reason` (and `status`, when the
/// proxy answered one).
pub fn assert_denied_line(line: &Value, reason: &str, status: Option<u16>, what: &str) {
    assert_eq!(line["decision"], "deny", "{what}: {line}");
    assert_eq!(line["reason"], reason, "{what}: {line}");
    if let Some(s) = status {
        assert_eq!(line["status"], s, "{what}: {line}");
    }
}

// ---------------------------------------------------------------- raw client

/// Sends `raw` on a new connection to `addr` and reads one response, or
/// `None` when the connection closed without one.
pub fn try_request(addr: SocketAddr, raw: &[u8]) -> Option<Response> {
    let mut s = connect(addr);
    s.write_all(raw).ok()?;
    let mut r = BufReader::new(s);
    read_response(&mut r)
}

/// Sends `raw` and reads responses until the proxy closes the connection:
/// every response it gave there, in order. The write side stays open (the
/// proxy may close on a half-close before answering everything), so the
/// last request in `raw` should close the connection (`Connection: close`,
/// a refused CONNECT, or framing that forces a close).
pub fn all_responses(addr: SocketAddr, raw: &[u8]) -> Vec<Response> {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut r = BufReader::new(s);
    let mut out = Vec::new();
    while let Some(resp) = read_response(&mut r) {
        let close = resp
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        out.push(resp);
        if close {
            break;
        }
    }
    out
}

/// Sends an attack and checks the answer: `status`, and for 403 the
/// `X-Egressd-Reason`; then its one log line and that line's reason.
pub fn refused(lines: &mut Lines, raw: &str, status: u16, reason: &str) -> Value {
    let what = raw.lines().next().unwrap_or(raw).to_string();
    let r = try_request(lines.e.proxy, raw.as_bytes())
        .unwrap_or_else(|| panic!("{what}: no response at all"));
    assert_eq!(r.status, status, "{what}: {}", r.text());
    if status == 403 {
        assert_eq!(r.reason(), Some(reason), "{what}");
    }
    let line = lines.one(&what);
    assert_denied_line(&line, reason, Some(status), &what);
    line
}

/// `GET url` with a Host header naming `host`, as one raw request.
pub fn get_raw(url: &str) -> String {
    format!(
        "GET {url} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        host_of(url)
    )
}

/// `CONNECT authority` with no Host header.
pub fn connect_raw(authority: &str) -> String {
    format!("CONNECT {authority} HTTP/1.1\r\n\r\n")
}

/// The names the fake DNS was asked about, each once.
pub fn asked(dns: &FakeDns) -> Vec<String> {
    let mut n = dns.names();
    n.sort();
    n.dedup();
    n
}

/// Every name the fake upstream DNS saw is one of `allowed`.
pub fn assert_only_asked(dns: &FakeDns, allowed: &[&str]) {
    let stray: Vec<String> = asked(dns)
        .into_iter()
        .filter(|n| !allowed.contains(&n.as_str()))
        .collect();
    assert!(
        stray.is_empty(),
        "denied names reached upstream DNS: {stray:?}"
    );
}

// ---------------------------------------------------------------- resets

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

/// One request as a [`RawOrigin`] parsed it.
#[derive(Debug, Clone)]
pub struct RawReq {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// The body after transfer decoding.
    pub body: Vec<u8>,
}

impl RawReq {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    }
}

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

type Script = dyn Fn(&RawReq) -> Act + Send + Sync;
/// The bytes one connection brought, as they arrive.
type ConnBytes = Arc<Mutex<Vec<u8>>>;

/// An HTTP/1.1 origin that records every byte it receives (per connection)
/// and every request it could parse, and answers as its script says.
/// Its parser is strict (CRLF only, one framing header): what it records
/// is exactly what egressd sent.
pub struct RawOrigin {
    pub addr: SocketAddr,
    pub raw: Arc<Mutex<Vec<ConnBytes>>>,
    pub reqs: Arc<Mutex<Vec<RawReq>>>,
    /// When set, new connections are reset as soon as they are accepted.
    pub reset_on_accept: Arc<AtomicBool>,
}

/// `200 OK` whose body is the request target.
pub fn ok_reply(r: &RawReq) -> Act {
    Act::Reply(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}",
            r.target.len(),
            r.target
        )
        .into_bytes(),
    )
}

pub fn raw_origin(script: impl Fn(&RawReq) -> Act + Send + Sync + 'static) -> RawOrigin {
    raw_origin_on(Ipv4Addr::LOCALHOST.into(), 0, script)
}

pub fn raw_origin_on(
    ip: IpAddr,
    port: u16,
    script: impl Fn(&RawReq) -> Act + Send + Sync + 'static,
) -> RawOrigin {
    let l = TcpListener::bind((ip, port)).expect("bind raw origin");
    let addr = l.local_addr().unwrap();
    let raw: Arc<Mutex<Vec<ConnBytes>>> = Arc::default();
    let reqs: Arc<Mutex<Vec<RawReq>>> = Arc::default();
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
    pub fn requests(&self) -> Vec<RawReq> {
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
    reqs: Arc<Mutex<Vec<RawReq>>>,
    script: Arc<Script>,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
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
            reqs.lock().unwrap().push(RawReq {
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
        let req = RawReq {
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

// ---------------------------------------------------------------- scripted DNS

/// What a [`ScriptedDns`] does with one query.
pub enum DnsAct {
    /// Send this message (its ID is set to the query's).
    Answer(Message),
    /// Send these bytes as they are.
    Raw(Vec<u8>),
    /// Say nothing.
    Silent,
}

type DnsScript = dyn Fn(&Message, bool) -> DnsAct + Send + Sync;

/// A fake upstream DNS server on one 127.0.0.1 port, UDP and TCP, that
/// records every query (name lower-cased, type, whether over TCP) and
/// answers as its script says. The script can be swapped mid-test.
pub struct ScriptedDns {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<(String, RecordType, bool)>>>,
    script: Arc<Mutex<Arc<DnsScript>>>,
    stop: Arc<AtomicBool>,
}

/// A response skeleton for `q`: same ID, question, RD; NOERROR.
pub fn response_to(q: &Message) -> Message {
    let mut r = Message::response(q.metadata.id, OpCode::Query);
    r.metadata.message_type = MessageType::Response;
    r.metadata.recursion_desired = q.metadata.recursion_desired;
    r.metadata.recursion_available = true;
    for x in &q.queries {
        r.add_query(x.clone());
    }
    r
}

/// An absolute name from dotted text, label by label (no syntax checks:
/// attacks need names a strict parser would refuse).
pub fn name(s: &str) -> Name {
    let labels: Vec<&[u8]> = s
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
        .map(str::as_bytes)
        .collect();
    Name::from_labels(labels).unwrap()
}

/// A record for `owner` (absolute, with the trailing dot) holding `data`.
pub fn rr(owner: &str, data: RData) -> Record {
    Record::from_rdata(name(owner), 30, data)
}

/// The A or AAAA record for `ip`.
pub fn addr_rr(owner: &str, ip: &str) -> Record {
    match ip.parse::<IpAddr>().unwrap() {
        IpAddr::V4(a) => rr(owner, RData::A(a.into())),
        IpAddr::V6(a) => rr(owner, RData::AAAA(a.into())),
    }
}

/// The question's name, lower-case without the trailing dot.
pub fn qname(q: &Message) -> String {
    q.queries
        .first()
        .map(|x| {
            x.name()
                .to_ascii()
                .trim_end_matches('.')
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

pub fn scripted_dns(
    script: impl Fn(&Message, bool) -> DnsAct + Send + Sync + 'static,
) -> ScriptedDns {
    let (udp, tcp) = loop {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        if let Ok(tcp) = TcpListener::bind(udp.local_addr().unwrap()) {
            break (udp, tcp);
        }
    };
    let addr = udp.local_addr().unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let script: Arc<Mutex<Arc<DnsScript>>> = Arc::new(Mutex::new(Arc::new(script)));
    let seen: Arc<Mutex<Vec<(String, RecordType, bool)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let answer = {
        let (script, seen) = (script.clone(), seen.clone());
        move |bytes: &[u8], tcp: bool| -> Option<Vec<u8>> {
            let q = Message::from_vec(bytes).ok()?;
            let t = q.queries.first().map(|x| x.query_type())?;
            seen.lock().unwrap().push((qname(&q), t, tcp));
            let s = script.lock().unwrap().clone();
            match s(&q, tcp) {
                DnsAct::Answer(mut m) => {
                    m.metadata.id = q.metadata.id;
                    m.to_vec().ok()
                }
                DnsAct::Raw(b) => Some(b),
                DnsAct::Silent => None,
            }
        }
    };
    let a2 = answer.clone();
    let s2 = stop.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while !s2.load(Ordering::Relaxed) {
            let Ok((n, peer)) = udp.recv_from(&mut buf) else {
                continue;
            };
            if let Some(out) = answer(&buf[..n], false) {
                let _ = udp.send_to(&out, peer);
            }
        }
    });
    thread::spawn(move || {
        for c in tcp.incoming() {
            let Ok(mut c) = c else { continue };
            let a3 = a2.clone();
            thread::spawn(move || loop {
                let mut len = [0u8; 2];
                if c.read_exact(&mut len).is_err() {
                    return;
                }
                let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                if c.read_exact(&mut q).is_err() {
                    return;
                }
                if let Some(out) = a3(&q, true) {
                    let mut framed = (out.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&out);
                    if c.write_all(&framed).is_err() {
                        return;
                    }
                }
            });
        }
    });
    ScriptedDns {
        addr,
        seen,
        script,
        stop,
    }
}

impl ScriptedDns {
    pub fn set_script(&self, script: impl Fn(&Message, bool) -> DnsAct + Send + Sync + 'static) {
        *self.script.lock().unwrap() = Arc::new(script);
    }
    pub fn names(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.0.clone())
            .collect()
    }
    pub fn count(&self, n: &str) -> usize {
        self.names().iter().filter(|x| *x == n).count()
    }
}

impl Drop for ScriptedDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------- DNS client

/// A DNS query for `name` and `t`, with EDNS (so EDE text comes back).
pub fn dns_query(n: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.id = rand_id();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name(n), t));
    m.set_edns(hickory_proto::op::Edns::new());
    m
}

fn rand_id() -> u16 {
    static N: AtomicUsize = AtomicUsize::new(0x2a51);
    (N.fetch_add(7919, Ordering::Relaxed) & 0xffff) as u16
}

/// Sends raw bytes over UDP; the reply, or `None` after `wait`.
pub fn udp_exchange(server: SocketAddr, bytes: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.send_to(bytes, server).unwrap();
    let mut buf = vec![0u8; 65535];
    let (n, _) = s.recv_from(&mut buf).ok()?;
    Some(buf[..n].to_vec())
}

pub fn ask_udp(server: SocketAddr, m: &Message) -> Message {
    let b = udp_exchange(server, &m.to_vec().unwrap(), DEADLINE).expect("a DNS reply");
    Message::from_vec(&b).expect("a parsable DNS reply")
}

/// One length-framed exchange over a new TCP connection.
pub fn ask_tcp(server: SocketAddr, m: &Message) -> Message {
    let mut s = connect(server);
    let q = m.to_vec().unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).unwrap();
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).unwrap();
    Message::from_vec(&buf).unwrap()
}

/// The Extended DNS Error text of a reply, if any.
pub fn ede_text(r: &Message) -> Option<String> {
    use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
    let edns = r.edns.as_ref()?;
    match edns.option(EdnsCode::Unknown(15))? {
        EdnsOption::Unknown(_, data) if data.len() >= 2 => {
            Some(String::from_utf8_lossy(&data[2..]).into_owned())
        }
        _ => None,
    }
}

/// A denied DNS answer: `rcode` and EDE "egressd: <reason>".
pub fn assert_dns_denied(r: &Message, reason: &str, what: &str) {
    assert_eq!(
        r.metadata.response_code,
        ResponseCode::Refused,
        "{what}: {r:?}"
    );
    assert_eq!(
        ede_text(r).as_deref(),
        Some(format!("egressd: {reason}").as_str()),
        "{what}"
    );
    assert!(r.answers.is_empty(), "{what}: answers in a denial");
}
