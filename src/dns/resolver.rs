//! The upstream DNS client and its cache, shared by the DNS front-end and the
//! HTTP proxy's lookups.
//!
//! Every upstream query is built here from a [`Host`] — lower-cased, fully
//! qualified, a fresh random ID, RD set, EDNS0 — so nothing a client sent is
//! relayed, no search domain or hosts file ever applies, and a name is only
//! sent once some exception allowed it (callers decide first). Replies are
//! accepted only from the server asked, with the ID and question asked;
//! anything else is ignored until the attempt times out. UDP falls back to
//! TCP on truncation; each upstream is tried in order, [`UPSTREAM_ROUNDS`]
//! times, every attempt bounded by [`UPSTREAM_ATTEMPT_TIMEOUT`] and the whole
//! resolution by [`RESOLVE_DEADLINE`].
//!
//! The cache is keyed by (name, type), holds positive and negative answers
//! for their TTL clamped to `settings.dns.cache_min_ttl..=cache_max_ttl`, and
//! is bounded by [`MAX_CACHE_ENTRIES`]. Concurrent misses for one key share
//! one upstream query. A resolution that failed is held for a while and
//! answered with its failure, without asking again (`failures`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use prometheus::IntCounter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::OnceCell;
use tokio::time::{timeout, Instant};

use super::answers::AnswerMemory;
use super::budget::TunnelDetector;
use super::by_name::ByNameType;
pub use super::error::ResolveError;
use super::failures::Failures;
use crate::metrics::Metrics;
use crate::policy::host::Host;
use crate::policy::{qtype, DnsSettings, Policy};
use crate::record::{Attempts, UpstreamFailure};

/// One UDP exchange with one upstream.
pub const UPSTREAM_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// One TCP exchange (after a truncated UDP reply).
pub const UPSTREAM_TCP_TIMEOUT: Duration = Duration::from_secs(3);
/// Everything one resolution may take, retries included.
pub const RESOLVE_DEADLINE: Duration = Duration::from_secs(5);
/// How many times each upstream is tried.
pub const UPSTREAM_ROUNDS: usize = 2;
/// The UDP payload size we advertise and answer with (DNS flag day 2020).
pub const EDNS_PAYLOAD: u16 = 1232;
/// Largest UDP reply we read from an upstream.
const UPSTREAM_RECV_BUF: usize = 4096;
/// (name, type) answers kept.
pub const MAX_CACHE_ENTRIES: usize = 100_000;
/// CNAMEs followed within one answer.
pub const MAX_CNAME_CHAIN: usize = 8;

/// An upstream answer, as cached: the records for the question (the CNAME
/// chain from the name and the records it ends in) and, for negative
/// answers, the SOA that says for how long.
#[derive(Debug)]
pub(super) struct Answer {
    pub rcode: ResponseCode,
    pub records: Vec<Record>,
    pub authority: Vec<Record>,
}

/// A resolution: the answer and the TTL to serve it with.
pub(super) struct Lookup {
    pub answer: Arc<Answer>,
    pub ttl: u32,
}

struct Entry {
    answer: Arc<Answer>,
    expires: Instant,
}

type Cache = ByNameType<Entry>;

type Shared = Arc<OnceCell<Result<(Arc<Answer>, u32), ResolveError>>>;

/// The resolver: upstreams, cache, and the tunnel budget. Shared as an `Arc`.
pub struct Resolver {
    upstreams: Vec<SocketAddr>,
    metrics: Arc<Metrics>,
    cache: Mutex<Cache>,
    inflight: Mutex<HashMap<(Host, u16), Shared>>,
    failures: Failures,
    tunnel: Mutex<TunnelDetector>,
    answers: AnswerMemory,
    /// `egressd_dns_cache_total{result="hit"|"miss"|"failure"}`, resolved
    /// once; `failure`: answered with a held failure.
    cache_hits: IntCounter,
    cache_misses: IntCounter,
    cache_failures: IntCounter,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Resolver {
    pub fn new(upstreams: Vec<SocketAddr>, metrics: Arc<Metrics>) -> Arc<Resolver> {
        Arc::new(Resolver {
            cache_hits: metrics.dns_cache.with_label_values(&["hit"]),
            cache_misses: metrics.dns_cache.with_label_values(&["miss"]),
            cache_failures: metrics.dns_cache.with_label_values(&["failure"]),
            upstreams,
            metrics,
            cache: Mutex::new(Cache::default()),
            inflight: Mutex::new(HashMap::new()),
            failures: Failures::default(),
            tunnel: Mutex::new(TunnelDetector::new()),
            answers: AnswerMemory::default(),
        })
    }

    pub(super) fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    pub(super) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(super) fn tunnel_detector(&self) -> MutexGuard<'_, TunnelDetector> {
        lock(&self.tunnel)
    }

    /// Starts (or stops) remembering answers, and answering each allowed
    /// name with its own address inside the sandbox: on while a
    /// transparent listener is served ([`AnswerMemory::remember_answers`]).
    pub fn remember_answers(&self, on: bool) {
        self.answers.remember_answers(on)
    }

    /// Whether answers are remembered (transparent capture).
    pub(super) fn remembering_answers(&self) -> bool {
        self.answers.remembering_answers()
    }

    /// The records answered to the sandbox for `host`
    /// ([`AnswerMemory::inside_records`]).
    pub fn inside_records(
        &self,
        records: Vec<Record>,
        host: &Host,
        qtype: u16,
        rcode: ResponseCode,
    ) -> Vec<Record> {
        self.answers.inside_records(records, host, qtype, rcode)
    }

    /// The name whose own address inside the sandbox `ip` is, if any.
    pub fn inside_name(&self, ip: IpAddr) -> Option<Host> {
        self.answers.inside_name(ip)
    }

    /// Remembers that the DNS front-end answered `ip` to `client` for
    /// `host`, with `ttl` seconds to live.
    pub fn remember_answer(&self, client: IpAddr, ip: IpAddr, host: &Host, ttl: u32) {
        self.answers.remember_answer(client, ip, host, ttl)
    }

    /// The allowed names that `client` resolved to `ip` through this
    /// egressd, most recent first ([`AnswerMemory::recall`]).
    pub fn recall(&self, client: IpAddr, ip: IpAddr) -> Vec<Host> {
        self.answers.recall(client, ip)
    }

    /// A + AAAA for a name, via the cache; never /etc/hosts, never search
    /// domains; our own timeout and retry. Addresses are returned unchecked:
    /// the caller classifies each one before dialling it. For callers with
    /// no request to charge failed upstream attempts to (tools, tests); a
    /// request resolves through [`Resolver::lookup_ip_for`].
    pub async fn lookup_ip(
        &self,
        host: &Host,
        policy: &Policy,
    ) -> Result<Vec<IpAddr>, ResolveError> {
        self.lookup_ip_for(host, policy, &mut Attempts::default())
            .await
    }

    /// [`Resolver::lookup_ip`], noting each failed upstream exchange in
    /// `attempts` (the request's event, which `Recorder::record` counts).
    pub async fn lookup_ip_for(
        &self,
        host: &Host,
        policy: &Policy,
        attempts: &mut Attempts,
    ) -> Result<Vec<IpAddr>, ResolveError> {
        let s = &policy.settings.dns;
        let (mut for_a, mut for_aaaa) = (Attempts::default(), Attempts::default());
        let (a, aaaa) = tokio::join!(
            self.resolve(host, qtype::A, s, &mut for_a),
            self.resolve(host, qtype::AAAA, s, &mut for_aaaa)
        );
        attempts.add(&for_a);
        attempts.add(&for_aaaa);
        let mut out: Vec<IpAddr> = Vec::new();
        let mut err = None;
        for r in [a, aaaa] {
            match r {
                Ok(l) => {
                    for ip in l.answer.records.iter().filter_map(|r| r.data.ip_addr()) {
                        if !out.contains(&ip) {
                            out.push(ip);
                        }
                    }
                }
                Err(e) => err = err.or(Some(e)),
            }
        }
        if !out.is_empty() {
            return Ok(out);
        }
        Err(err.unwrap_or(ResolveError::NoAddresses))
    }

    /// The cached answer for (name, type), if one is fresh (counted as a
    /// cache hit). [`Resolver::resolve`] asks the upstreams otherwise.
    pub(super) fn cached(&self, host: &Host, qtype: u16) -> Option<Lookup> {
        let (answer, ttl) = self.cache_get(host, qtype)?;
        self.cache_hits.inc();
        Some(Lookup { answer, ttl })
    }

    /// Counts a query answered from the server's answer cache as a cache hit,
    /// as it would have been one here.
    pub(super) fn count_cache_hit(&self) {
        self.cache_hits.inc();
    }

    /// One (name, type) through the cache. The caller has decided the name
    /// may be resolved. The upstream exchanges that failed are noted in
    /// `attempts` by the query that made them (not by those that joined it).
    pub(super) async fn resolve(
        &self,
        host: &Host,
        qtype: u16,
        s: &DnsSettings,
        attempts: &mut Attempts,
    ) -> Result<Lookup, ResolveError> {
        if let Some((answer, ttl)) = self.cache_get(host, qtype) {
            self.cache_hits.inc();
            return Ok(Lookup { answer, ttl });
        }
        if let Some(e) = self.failures.held(host, qtype, Instant::now()) {
            self.cache_failures.inc();
            return Err(e);
        }
        self.cache_misses.inc();
        let key = (host.clone(), qtype);
        let cell: Shared = lock(&self.inflight).entry(key.clone()).or_default().clone();
        let result = cell
            .get_or_init(|| async {
                // A query that finished just before we joined filled the
                // cache, or failed.
                if let Some(hit) = self.cache_get(host, qtype) {
                    return Ok(hit);
                }
                if let Some(e) = self.failures.held(host, qtype, Instant::now()) {
                    return Err(e);
                }
                let msg = match self.exchange(host, qtype, attempts).await {
                    Ok(msg) => msg,
                    Err(e) => {
                        self.failures.fail(host, qtype, e.clone(), Instant::now());
                        return Err(e);
                    }
                };
                self.failures.succeeded(host, qtype);
                let (answer, ttl) = digest(&msg, host, qtype, s);
                let answer = Arc::new(answer);
                self.cache_put(host, qtype, answer.clone(), ttl);
                Ok((answer, ttl))
            })
            .await
            .clone();
        {
            let mut inflight = lock(&self.inflight);
            if inflight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                inflight.remove(&key);
            }
        }
        result.map(|(answer, ttl)| Lookup { answer, ttl })
    }

    fn cache_get(&self, host: &Host, qtype: u16) -> Option<(Arc<Answer>, u32)> {
        let now = Instant::now();
        let mut c = lock(&self.cache);
        let e = c.get(host, qtype)?;
        let left = e.expires.saturating_duration_since(now).as_secs();
        if left == 0 {
            c.remove(host, qtype);
            return None;
        }
        Some((e.answer.clone(), left.min(u32::MAX as u64) as u32))
    }

    fn cache_put(&self, host: &Host, qtype: u16, answer: Arc<Answer>, ttl: u32) {
        if ttl == 0 {
            return;
        }
        let now = Instant::now();
        let entry = Entry {
            answer,
            expires: now + Duration::from_secs(ttl as u64),
        };
        let mut c = lock(&self.cache);
        if c.len() >= MAX_CACHE_ENTRIES {
            evict(&mut c, now);
        }
        c.insert(host, qtype, entry);
    }

    /// Asks the upstreams, in order and for [`UPSTREAM_ROUNDS`] rounds, until
    /// one gives a usable answer (NOERROR or NXDOMAIN).
    async fn exchange(
        &self,
        host: &Host,
        qtype: u16,
        attempts: &mut Attempts,
    ) -> Result<Message, ResolveError> {
        if self.upstreams.is_empty() {
            return Err(ResolveError::Upstream(
                "no upstream DNS server configured".into(),
            ));
        }
        let deadline = Instant::now() + RESOLVE_DEADLINE;
        let mut last = ResolveError::Timeout;
        for _ in 0..UPSTREAM_ROUNDS {
            for &up in &self.upstreams {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ResolveError::Timeout);
                }
                match self.attempt(up, host, qtype, deadline).await {
                    Ok(msg) => match msg.metadata.response_code {
                        ResponseCode::NoError | ResponseCode::NXDomain => return Ok(msg),
                        rc => {
                            attempts.fail(UpstreamFailure::Servfail);
                            last =
                                ResolveError::Upstream(format!("{up} answered {}", rcode_name(rc)));
                        }
                    },
                    Err(e) => {
                        attempts.fail(match e {
                            ResolveError::Timeout => UpstreamFailure::Timeout,
                            _ => UpstreamFailure::Io,
                        });
                        last = e;
                    }
                }
            }
        }
        Err(last)
    }

    /// One UDP exchange with `up`, and TCP when the reply is truncated.
    async fn attempt(
        &self,
        up: SocketAddr,
        host: &Host,
        qtype: u16,
        deadline: Instant,
    ) -> Result<Message, ResolveError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let (id, query) = build_query(host, qtype)?;
        let msg = timeout(
            left.min(UPSTREAM_ATTEMPT_TIMEOUT),
            udp_exchange(up, &query, id, host, qtype),
        )
        .await
        .map_err(|_| ResolveError::Timeout)??;
        if !msg.metadata.truncation {
            return Ok(msg);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let (id, query) = build_query(host, qtype)?;
        let msg = timeout(
            left.min(UPSTREAM_TCP_TIMEOUT),
            tcp_exchange(up, &query, id, host, qtype),
        )
        .await
        .map_err(|_| ResolveError::Timeout)??;
        // Truncated over TCP too: what came is not the whole answer, and
        // an empty NOERROR would read as "no such records".
        if msg.metadata.truncation {
            return Err(ResolveError::Upstream(format!(
                "{up}: reply truncated over TCP too"
            )));
        }
        Ok(msg)
    }
}

/// Drops expired entries; if that is not enough, an arbitrary eighth.
fn evict(c: &mut Cache, now: Instant) {
    c.retain(|e| e.expires > now);
    if c.len() >= MAX_CACHE_ENTRIES - MAX_CACHE_ENTRIES / 8 {
        c.shed(c.len() / 8);
    }
}

fn io_err(up: SocketAddr, e: std::io::Error) -> ResolveError {
    ResolveError::Upstream(format!("{up}: {e}"))
}

/// A fresh query: random ID, RD, EDNS0, the name lower-cased and absolute.
fn build_query(host: &Host, qtype: u16) -> Result<(u16, Vec<u8>), ResolveError> {
    let name = Name::from_ascii(format!("{host}."))
        .map_err(|e| ResolveError::Upstream(format!("cannot encode name: {e}")))?;
    let mut msg = Message::query();
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(name, RecordType::from(qtype)));
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_PAYLOAD);
    msg.set_edns(edns);
    let bytes = msg
        .to_vec()
        .map_err(|e| ResolveError::Upstream(format!("cannot encode query: {e}")))?;
    Ok((msg.metadata.id, bytes))
}

/// The reply to our query, or `None` for anything else (another ID, not a
/// response, another question): such packets are ignored, not trusted.
fn parse_reply(bytes: &[u8], id: u16, host: &Host, qtype: u16) -> Option<Message> {
    let msg = Message::from_vec(bytes).ok()?;
    if msg.metadata.id != id || msg.metadata.message_type != MessageType::Response {
        return None;
    }
    match msg.queries.as_slice() {
        [q] => {
            let name = q.name().to_ascii();
            let same = name
                .strip_suffix('.')
                .unwrap_or(&name)
                .eq_ignore_ascii_case(host.as_str());
            (same && u16::from(q.query_type()) == qtype && q.query_class() == DNSClass::IN)
                .then_some(msg)
        }
        // Some servers drop the question from error replies.
        [] if !matches!(
            msg.metadata.response_code,
            ResponseCode::NoError | ResponseCode::NXDomain
        ) =>
        {
            Some(msg)
        }
        _ => None,
    }
}

/// Where to send from: loopback for a loopback upstream, else any address of
/// the upstream's family; port 0 so the kernel picks a random source port.
fn local_for(up: SocketAddr) -> SocketAddr {
    let ip: IpAddr = match (up.ip(), up.ip().is_loopback()) {
        (IpAddr::V4(_), true) => Ipv4Addr::LOCALHOST.into(),
        (IpAddr::V4(_), false) => Ipv4Addr::UNSPECIFIED.into(),
        (IpAddr::V6(_), true) => Ipv6Addr::LOCALHOST.into(),
        (IpAddr::V6(_), false) => Ipv6Addr::UNSPECIFIED.into(),
    };
    SocketAddr::new(ip, 0)
}

async fn udp_exchange(
    up: SocketAddr,
    query: &[u8],
    id: u16,
    host: &Host,
    qtype: u16,
) -> Result<Message, ResolveError> {
    let sock = UdpSocket::bind(local_for(up))
        .await
        .map_err(|e| io_err(up, e))?;
    // A connected socket only receives from `up`.
    sock.connect(up).await.map_err(|e| io_err(up, e))?;
    sock.send(query).await.map_err(|e| io_err(up, e))?;
    let mut buf = vec![0u8; UPSTREAM_RECV_BUF];
    loop {
        let n = sock.recv(&mut buf).await.map_err(|e| io_err(up, e))?;
        if let Some(msg) = parse_reply(&buf[..n], id, host, qtype) {
            return Ok(msg);
        }
    }
}

async fn tcp_exchange(
    up: SocketAddr,
    query: &[u8],
    id: u16,
    host: &Host,
    qtype: u16,
) -> Result<Message, ResolveError> {
    let mut s = TcpStream::connect(up).await.map_err(|e| io_err(up, e))?;
    let mut framed = Vec::with_capacity(query.len() + 2);
    framed.extend_from_slice(&(query.len() as u16).to_be_bytes());
    framed.extend_from_slice(query);
    s.write_all(&framed).await.map_err(|e| io_err(up, e))?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.map_err(|e| io_err(up, e))?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.map_err(|e| io_err(up, e))?;
    parse_reply(&buf, id, host, qtype).ok_or_else(|| {
        ResolveError::Upstream(format!("{up}: reply over TCP does not match the query"))
    })
}

/// The part of a reply we keep, and how long to keep it.
fn digest(msg: &Message, host: &Host, qtype: u16, s: &DnsSettings) -> (Answer, u32) {
    let mut records = follow_chain(&msg.answers, host, qtype);
    // Before it is cached: no client is ever handed an ECH configuration.
    super::ech::strip_ech(&mut records);
    let complete = records.iter().any(|r| u16::from(r.record_type()) == qtype);
    let authority: Vec<Record> = if complete {
        Vec::new()
    } else {
        msg.authorities
            .iter()
            .filter(|r| r.record_type() == RecordType::SOA)
            .cloned()
            .collect()
    };
    let raw = if complete {
        records.iter().map(|r| r.ttl).min().unwrap_or(0)
    } else {
        authority
            .iter()
            .filter_map(|r| match &r.data {
                RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            })
            .min()
            .unwrap_or(0)
    };
    let ttl = (raw as u64).clamp(s.cache_min_ttl, s.cache_max_ttl.max(s.cache_min_ttl));
    let rcode = match msg.metadata.response_code {
        ResponseCode::NXDomain => ResponseCode::NXDomain,
        _ => ResponseCode::NoError,
    };
    (
        Answer {
            rcode,
            records,
            authority,
        },
        ttl.min(u32::MAX as u64) as u32,
    )
}

/// The records that answer `host`/`qtype`: CNAMEs from `host` onwards and the
/// `qtype` records of the name the chain ends at. Anything else an upstream
/// put in the answer section is not ours to pass on.
fn follow_chain(answers: &[Record], host: &Host, qtype: u16) -> Vec<Record> {
    let mut out = Vec::new();
    let Ok(mut current) = Name::from_ascii(format!("{host}.")) else {
        return out;
    };
    for _ in 0..=MAX_CNAME_CHAIN {
        let mut next = None;
        let mut found = false;
        for r in answers
            .iter()
            .filter(|r| r.dns_class == DNSClass::IN && r.name == current)
        {
            if u16::from(r.record_type()) == qtype {
                found = true;
                out.push(r.clone());
            } else if let RData::CNAME(c) = &r.data {
                if next.is_none() {
                    next = Some(c.0.clone());
                    out.push(r.clone());
                }
            }
        }
        match next {
            Some(n) if !found => current = n,
            _ => break,
        }
    }
    out
}

/// A response code's mnemonic, as the log writes it.
pub(super) fn rcode_name(rc: ResponseCode) -> Cow<'static, str> {
    Cow::Borrowed(match u16::from(rc) {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        6 => "YXDOMAIN",
        7 => "YXRRSET",
        8 => "NXRRSET",
        9 => "NOTAUTH",
        10 => "NOTZONE",
        16 => "BADVERS",
        n => return Cow::Owned(format!("RCODE{n}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::host::parse_host;
    use hickory_proto::rr::rdata::{A, CNAME, SOA};

    fn rec(name: &str, ttl: u32, data: RData) -> Record {
        Record::from_rdata(Name::from_ascii(name).unwrap(), ttl, data)
    }

    fn settings(min: u64, max: u64) -> DnsSettings {
        let mut s = crate::policy::Settings::default().dns;
        s.cache_min_ttl = min;
        s.cache_max_ttl = max;
        s
    }

    #[test]
    fn chain_is_followed_and_strays_dropped() {
        let h = parse_host("www.example.com").unwrap();
        let answers = vec![
            rec(
                "www.example.com.",
                300,
                RData::CNAME(CNAME(Name::from_ascii("edge.cdn.test.").unwrap())),
            ),
            rec("edge.cdn.test.", 60, RData::A(A::new(192, 0, 2, 1))),
            rec("stray.evil.test.", 60, RData::A(A::new(10, 0, 0, 1))),
        ];
        let got = follow_chain(&answers, &h, qtype::A);
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|r| !r.name.to_ascii().contains("stray")));
        // Asking for the CNAME itself stops there.
        assert_eq!(follow_chain(&answers, &h, 5).len(), 1);
        // Upper-case owner names from upstream still match.
        let upper = vec![rec("WWW.Example.COM.", 30, RData::A(A::new(192, 0, 2, 9)))];
        assert_eq!(follow_chain(&upper, &h, qtype::A).len(), 1);
    }

    #[test]
    fn cname_loops_end() {
        let h = parse_host("a.test").unwrap();
        let answers = vec![
            rec(
                "a.test.",
                30,
                RData::CNAME(CNAME(Name::from_ascii("b.test.").unwrap())),
            ),
            rec(
                "b.test.",
                30,
                RData::CNAME(CNAME(Name::from_ascii("a.test.").unwrap())),
            ),
        ];
        assert!(follow_chain(&answers, &h, qtype::A).len() <= MAX_CNAME_CHAIN + 1);
    }

    #[test]
    fn ttls_are_clamped_and_negative_answers_use_the_soa() {
        let h = parse_host("x.test").unwrap();
        let mut m = Message::response(1, hickory_proto::op::OpCode::Query);
        m.answers
            .push(rec("x.test.", 1, RData::A(A::new(192, 0, 2, 1))));
        assert_eq!(digest(&m, &h, qtype::A, &settings(5, 100)).1, 5);
        m.answers[0].ttl = 1_000_000;
        assert_eq!(digest(&m, &h, qtype::A, &settings(5, 100)).1, 100);

        let mut n = Message::response(1, hickory_proto::op::OpCode::Query);
        n.metadata.response_code = ResponseCode::NXDomain;
        let soa = SOA::new(
            Name::from_ascii("ns.test.").unwrap(),
            Name::from_ascii("host.test.").unwrap(),
            1,
            2,
            3,
            4,
            42,
        );
        n.authorities.push(rec("test.", 3600, RData::SOA(soa)));
        let (a, ttl) = digest(&n, &h, qtype::A, &settings(5, 86400));
        assert_eq!(
            (a.rcode, ttl, a.authority.len(), a.records.len()),
            (ResponseCode::NXDomain, 42, 1, 0)
        );
    }

    #[test]
    fn replies_must_match_the_query() {
        let h = parse_host("x.test").unwrap();
        let (id, q) = build_query(&h, qtype::A).unwrap();
        let mut m = Message::from_vec(&q).unwrap();
        // Our own query is not a reply.
        assert!(parse_reply(&q, id, &h, qtype::A).is_none());
        m.metadata.message_type = MessageType::Response;
        assert!(parse_reply(&m.to_vec().unwrap(), id, &h, qtype::A).is_some());
        assert!(parse_reply(&m.to_vec().unwrap(), id.wrapping_add(1), &h, qtype::A).is_none());
        assert!(parse_reply(&m.to_vec().unwrap(), id, &h, qtype::AAAA).is_none());
        let other = parse_host("y.test").unwrap();
        assert!(parse_reply(&m.to_vec().unwrap(), id, &other, qtype::A).is_none());
        // The name goes out lower-case and absolute, with EDNS and RD.
        let sent = Message::from_vec(&q).unwrap();
        assert_eq!(sent.queries[0].name().to_ascii(), "x.test.");
        assert!(sent.metadata.recursion_desired && sent.edns.is_some());
    }
}
