//! The one fake upstream DNS server, and a DNS client for asking egressd.
//!
//! [`FakeDns`] listens on one 127.0.0.1 port over UDP and TCP, records every
//! query it receives (name as sent, type, transport, the whole message) and
//! answers from a table the test fills: A/AAAA, TXT, CNAME and HTTPS
//! records, an rcode, truncation over UDP, a delay, or silence, per name
//! or for every name below a `*.suffix`. A test that needs answers no
//! honest server gives (forged IDs, records for other names) installs a
//! script, which then answers instead of the table.
//!
//! Owns what the upstream says and what it was asked; not egressd's view
//! of it (tests read that from the decision log).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::svcb::{IpHint, SvcParamKey, SvcParamValue, SVCB};
use hickory_proto::rr::rdata::{CNAME, HTTPS, SOA, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::{connect, DEADLINE};

/// The TTL of every record the table answers with.
pub const TTL: u32 = 30;
/// The SOA minimum sent with NXDOMAIN: how long a negative answer may be
/// cached.
pub const NEGATIVE_TTL: u32 = 30;
/// How far the table follows CNAMEs into its own names.
const MAX_CHAIN: usize = 8;
/// How often the UDP loop looks at the stop flag.
const POLL: Duration = Duration::from_millis(200);

/// One query as the fake received it.
#[derive(Clone, Debug)]
pub struct Asked {
    /// As sent (case kept), without the trailing dot.
    pub name: String,
    pub qtype: RecordType,
    pub tcp: bool,
    pub message: Message,
}

/// What a script does with one query.
pub enum DnsAct {
    /// Send this message (its ID is set to the query's).
    Answer(Message),
    /// Send these bytes as they are.
    Raw(Vec<u8>),
    /// Say nothing.
    Silent,
}

type Script = dyn Fn(&Message, bool) -> DnsAct + Send + Sync;

/// What the table says for one name.
#[derive(Clone, Debug, Default)]
struct Entry {
    /// Answered when their type is the question's.
    records: Vec<RData>,
    /// Answered for any type, followed by what the target answers.
    cname: Option<Name>,
    rcode: Option<ResponseCode>,
    /// Over UDP: no answers and TC set, so the client retries over TCP.
    truncate: bool,
    delay: Option<Duration>,
    silent: bool,
}

#[derive(Default)]
struct State {
    /// Lower-case names, or `*.suffix`.
    zone: Mutex<HashMap<String, Entry>>,
    script: Mutex<Option<Arc<Script>>>,
    seen: Mutex<Vec<Asked>>,
    stop: AtomicBool,
}

/// A fake upstream DNS server; see the module header.
pub struct FakeDns {
    pub addr: SocketAddr,
    state: Arc<State>,
}

/// A UDP socket and a TCP listener on one 127.0.0.1 port (the port the
/// kernel picks for UDP may be taken for TCP: try again).
fn bind_pair() -> (UdpSocket, TcpListener) {
    for _ in 0..50 {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        if let Ok(tcp) = TcpListener::bind(udp.local_addr().unwrap()) {
            return (udp, tcp);
        }
    }
    panic!("no port free for both UDP and TCP on 127.0.0.1");
}

pub fn fake_dns() -> FakeDns {
    let (udp, tcp) = bind_pair();
    let addr = udp.local_addr().unwrap();
    udp.set_read_timeout(Some(POLL)).unwrap();
    let state = Arc::new(State::default());
    let s = state.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while !s.stop.load(Ordering::Relaxed) {
            let Ok((n, peer)) = udp.recv_from(&mut buf) else {
                continue;
            };
            let (out, delay) = s.reply(&buf[..n], false);
            let Some(out) = out else { continue };
            match delay {
                None => {
                    let _ = udp.send_to(&out, peer);
                }
                // A slow answer holds up only itself.
                Some(d) => {
                    let sock = udp.try_clone().unwrap();
                    thread::spawn(move || {
                        thread::sleep(d);
                        let _ = sock.send_to(&out, peer);
                    });
                }
            }
        }
    });
    let s = state.clone();
    thread::spawn(move || {
        for c in tcp.incoming() {
            let Ok(mut c) = c else { continue };
            let s = s.clone();
            thread::spawn(move || loop {
                let mut len = [0u8; 2];
                if c.read_exact(&mut len).is_err() {
                    return;
                }
                let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                if c.read_exact(&mut q).is_err() {
                    return;
                }
                let (out, delay) = s.reply(&q, true);
                if let Some(d) = delay {
                    thread::sleep(d);
                }
                if let Some(out) = out {
                    let mut framed = (out.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&out);
                    if c.write_all(&framed).is_err() {
                        return;
                    }
                }
            });
        }
    });
    FakeDns { addr, state }
}

/// A fake DNS that answers by `script` from the start.
pub fn scripted_dns(script: impl Fn(&Message, bool) -> DnsAct + Send + Sync + 'static) -> FakeDns {
    let dns = fake_dns();
    dns.set_script(script);
    dns
}

impl State {
    /// The bytes to send for one query (`None`: stay silent), and how long
    /// to wait first.
    fn reply(&self, bytes: &[u8], tcp: bool) -> (Option<Vec<u8>>, Option<Duration>) {
        let Ok(q) = Message::from_vec(bytes) else {
            return (None, None);
        };
        let Some(question) = q.queries.first().cloned() else {
            return (None, None);
        };
        let asked = question.name().to_ascii();
        self.seen.lock().unwrap().push(Asked {
            name: asked.trim_end_matches('.').to_string(),
            qtype: question.query_type(),
            tcp,
            message: q.clone(),
        });
        let script = self.script.lock().unwrap().clone();
        if let Some(script) = script {
            let out = match script(&q, tcp) {
                DnsAct::Answer(mut m) => {
                    m.metadata.id = q.metadata.id;
                    m.to_vec().ok()
                }
                DnsAct::Raw(b) => Some(b),
                DnsAct::Silent => None,
            };
            return (out, None);
        }
        let zone = self.zone.lock().unwrap();
        let Some(entry) = lookup(&zone, &qname(&q)) else {
            let mut r = response_to(&q);
            r.metadata.response_code = ResponseCode::NXDomain;
            r.add_authority(soa());
            return (r.to_vec().ok(), None);
        };
        if entry.silent {
            return (None, None);
        }
        let mut r = response_to(&q);
        if let Some(rcode) = entry.rcode {
            r.metadata.response_code = rcode;
        } else if entry.truncate && !tcp {
            r.metadata.truncation = true;
        } else {
            answer(&zone, entry, question.name(), question.query_type(), &mut r);
        }
        (r.to_vec().ok(), entry.delay)
    }
}

/// The entry for `name`: its own, or the closest `*.suffix` above it.
fn lookup<'a>(zone: &'a HashMap<String, Entry>, name: &str) -> Option<&'a Entry> {
    if let Some(e) = zone.get(name) {
        return Some(e);
    }
    let mut rest = name;
    while let Some((_, parent)) = rest.split_once('.') {
        if let Some(e) = zone.get(&format!("*.{parent}")) {
            return Some(e);
        }
        rest = parent;
    }
    None
}

/// Adds `entry`'s records for `qtype`, owned by `owner`; a CNAME is
/// followed into the table (as a recursive resolver would put the chain in
/// one answer).
fn answer<'a>(
    zone: &'a HashMap<String, Entry>,
    mut entry: &'a Entry,
    owner: &Name,
    qtype: RecordType,
    r: &mut Message,
) {
    let mut owner = owner.clone();
    for _ in 0..MAX_CHAIN {
        let Some(target) = &entry.cname else { break };
        r.add_answer(Record::from_rdata(
            owner.clone(),
            TTL,
            RData::CNAME(CNAME(target.clone())),
        ));
        owner = target.clone();
        let key = target.to_ascii().trim_end_matches('.').to_ascii_lowercase();
        match lookup(zone, &key) {
            Some(next) => entry = next,
            None => return,
        }
    }
    for data in &entry.records {
        if data.record_type() == qtype {
            r.add_answer(Record::from_rdata(owner.clone(), TTL, data.clone()));
        }
    }
}

fn soa() -> Record {
    let soa = SOA::new(
        Name::from_ascii("ns.test.").unwrap(),
        Name::from_ascii("hostmaster.test.").unwrap(),
        1,
        3600,
        600,
        86400,
        NEGATIVE_TTL,
    );
    Record::from_rdata(
        Name::from_ascii("test.").unwrap(),
        NEGATIVE_TTL,
        RData::SOA(soa),
    )
}

fn addr_rdata(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(a) => RData::A(a.into()),
        IpAddr::V6(a) => RData::AAAA(a.into()),
    }
}

impl FakeDns {
    /// Changes the table's entry for `name` (lower-case, or `*.suffix` for
    /// every name below `suffix` that has no entry of its own).
    fn edit(&self, name: &str, f: impl FnOnce(&mut Entry)) {
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        f(self.state.zone.lock().unwrap().entry(key).or_default());
    }

    /// `name` answers A and AAAA with `ips` (its other records stay).
    pub fn set(&self, name: &str, ips: &[&str]) {
        let ips: Vec<IpAddr> = ips.iter().map(|s| s.parse().unwrap()).collect();
        self.edit(name, |e| {
            e.records
                .retain(|r| !matches!(r, RData::A(_) | RData::AAAA(_)));
            e.records.extend(ips.into_iter().map(addr_rdata));
        });
    }
    /// Adds a TXT record for `name`.
    pub fn txt(&self, name: &str, text: &str) {
        let data = RData::TXT(TXT::new(vec![text.to_string()]));
        self.edit(name, |e| e.records.push(data));
    }
    /// `name` is an alias of `target`; the answer carries the chain and
    /// whatever the table holds for `target`.
    pub fn cname(&self, name: &str, target: &str) {
        let target = Name::from_ascii(format!("{}.", target.trim_end_matches('.'))).unwrap();
        self.edit(name, |e| e.cname = Some(target));
    }
    /// Adds an HTTPS record for `name` (ServiceMode, target `.`) carrying
    /// `hints` as ipv4hint/ipv6hint.
    pub fn https(&self, name: &str, hints: &[&str]) {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for h in hints {
            match h.parse().unwrap() {
                IpAddr::V4(a) => v4.push(a.into()),
                IpAddr::V6(a) => v6.push(a.into()),
            }
        }
        let mut params = Vec::new();
        if !v4.is_empty() {
            params.push((SvcParamKey::Ipv4Hint, SvcParamValue::Ipv4Hint(IpHint(v4))));
        }
        if !v6.is_empty() {
            params.push((SvcParamKey::Ipv6Hint, SvcParamValue::Ipv6Hint(IpHint(v6))));
        }
        let data = RData::HTTPS(HTTPS(SVCB::new(1, Name::root(), params)));
        self.edit(name, |e| e.records.push(data));
    }
    /// `name` answers with `rcode` and nothing else.
    pub fn rcode(&self, name: &str, rcode: ResponseCode) {
        self.edit(name, |e| e.rcode = Some(rcode));
    }
    /// `name` answers from its records again, after [`FakeDns::rcode`].
    pub fn answer_again(&self, name: &str) {
        self.edit(name, |e| e.rcode = None);
    }
    /// Over UDP `name` answers empty with TC set; over TCP, in full.
    pub fn truncate(&self, name: &str) {
        self.edit(name, |e| e.truncate = true);
    }
    /// `name` is answered only after `d`.
    pub fn delay(&self, name: &str, d: Duration) {
        self.edit(name, |e| e.delay = Some(d));
    }
    /// `name` is never answered.
    pub fn silent(&self, name: &str) {
        self.edit(name, |e| e.silent = true);
    }

    /// From now on `script` answers every query instead of the table.
    pub fn set_script(&self, script: impl Fn(&Message, bool) -> DnsAct + Send + Sync + 'static) {
        *self.state.script.lock().unwrap() = Some(Arc::new(script));
    }

    /// Every query received, in order.
    pub fn queries(&self) -> Vec<Asked> {
        self.state.seen.lock().unwrap().clone()
    }
    /// The name of every query received, in order, as sent.
    pub fn names(&self) -> Vec<String> {
        self.queries().into_iter().map(|q| q.name).collect()
    }
    /// How many queries for `name` (any type, any case) arrived.
    pub fn count(&self, name: &str) -> usize {
        self.queries()
            .iter()
            .filter(|q| q.name.eq_ignore_ascii_case(name.trim_end_matches('.')))
            .count()
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------- messages

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
    Record::from_rdata(name(owner), TTL, data)
}

/// The A or AAAA record for `ip`.
pub fn addr_rr(owner: &str, ip: &str) -> Record {
    rr(owner, addr_rdata(ip.parse().unwrap()))
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

// ---------------------------------------------------------------- client

/// A DNS query for `name` and `t`, with EDNS (so EDE text comes back).
pub fn dns_query(n: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.id = next_id();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name(n), t));
    m.set_edns(Edns::new());
    m
}

/// IDs that differ from query to query (no randomness needed, only that
/// two queries in flight do not share one).
fn next_id() -> u16 {
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

/// The Extended DNS Error (RFC 8914) of a reply: INFO-CODE and EXTRA-TEXT.
pub fn ede(r: &Message) -> Option<(u16, String)> {
    use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
    match r.edns.as_ref()?.option(EdnsCode::Unknown(15))? {
        EdnsOption::Unknown(15, data) if data.len() >= 2 => Some((
            u16::from_be_bytes([data[0], data[1]]),
            String::from_utf8_lossy(&data[2..]).into_owned(),
        )),
        _ => None,
    }
}

/// An EDE text without the request id egressd ends it with (`egressd:
/// <reason> request <id>` → `egressd: <reason>`). Every EDE egressd sends
/// names its refused query: the id must be there, spelled as one (12
/// characters of the id alphabet).
pub fn without_request_id(text: &str) -> String {
    let Some((r, id)) = text.rsplit_once(" request ") else {
        panic!("an EDE text without its request id: {text:?}")
    };
    assert!(is_request_id(id), "not a request id: {id:?} in {text:?}");
    r.to_string()
}

/// Whether `id` is spelled as a request id: 12 characters of
/// `0123456789abcdefghjkmnpqrstvwxyz`.
pub fn is_request_id(id: &str) -> bool {
    id.len() == 12
        && id
            .bytes()
            .all(|b| b"0123456789abcdefghjkmnpqrstvwxyz".contains(&b))
}

/// The request id an EDE text ends with.
pub fn ede_request_id(r: &Message) -> Option<String> {
    let text = ede_text(r)?;
    let (_, id) = text.rsplit_once(" request ")?;
    Some(id.to_string())
}

/// The Extended DNS Error text of a reply, if any.
pub fn ede_text(r: &Message) -> Option<String> {
    ede(r).map(|(_, text)| text)
}

/// A denied DNS answer: REFUSED and EDE "egressd: <reason>".
pub fn assert_dns_denied(r: &Message, reason: &str, what: &str) {
    assert_eq!(
        r.metadata.response_code,
        ResponseCode::Refused,
        "{what}: {r:?}"
    );
    assert_eq!(
        ede_text(r).map(|t| without_request_id(&t)).as_deref(),
        Some(format!("egressd: {reason}").as_str()),
        "{what}"
    );
    assert!(r.answers.is_empty(), "{what}: answers in a denial");
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
