//! The DNS resolver over real sockets on 127.0.0.1: the fake upstream
//! (`support::fake_dns`, which counts every query it receives), egressd's
//! `dns::serve` in-process, and the decision log read back as JSON.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

use egressd::dns::{self, ResolveError, Resolver, TunnelOutcome};
use egressd::log::{LogSink, LogTarget};
use egressd::metrics::Metrics;
use egressd::policy::host::parse_host;
use egressd::policy::PolicyHandle;
use egressd::policy::{from_yaml, Policy};
use egressd::record::Recorder;
use egressd::time::unix_now;

use crate::support::{
    ede, fake_dns, policy, read_log, without_request_id, FakeDns, PolicyYaml, LOOPBACK,
};

const LOCAL: &str = "127.0.0.1:0";
const WAIT: Duration = Duration::from_secs(5);

/// A UDP socket and a TCP listener on one 127.0.0.1 port (the kernel's
/// choice for UDP may be taken for TCP: try another).
async fn bind_pair() -> (UdpSocket, TcpListener, SocketAddr) {
    for _ in 0..50 {
        let udp = UdpSocket::bind(LOCAL).await.unwrap();
        let addr = udp.local_addr().unwrap();
        if let Ok(tcp) = TcpListener::bind(addr).await {
            return (udp, tcp, addr);
        }
    }
    panic!("no port free for both UDP and TCP on 127.0.0.1");
}

// ---------------------------------------------------------------- egressd

struct Egressd {
    addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
    resolver: Arc<Resolver>,
    policy: Arc<PolicyHandle>,
    metrics: Arc<Metrics>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(policy: PolicyYaml, up: &FakeDns) -> Egressd {
    start_with_log(policy, up, None).await
}

async fn start_with_log(policy: PolicyYaml, up: &FakeDns, log: Option<PathBuf>) -> Egressd {
    let upstream = up.addr;
    let dir = tempfile::tempdir().unwrap();
    let log = log.unwrap_or_else(|| dir.path().join("decisions.log"));
    let metrics = Metrics::new();
    let sink = LogSink::start(LogTarget::File(log.clone()), metrics.clone()).unwrap();
    let recorder = Recorder::new(sink, metrics.clone());
    let compiled = std::sync::Arc::new(from_yaml(&policy.yaml()).unwrap());
    metrics.sync_policy(&compiled);
    let policy = PolicyHandle::new(compiled);
    let resolver = Resolver::new(vec![upstream], metrics.clone());
    let (udp, tcp, addr) = bind_pair().await;
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(dns::serve(
        udp,
        tcp,
        policy.clone(),
        resolver.clone(),
        recorder,
        dns::Bounds::default(),
        rx,
    ));
    Egressd {
        addr,
        log,
        _dir: dir,
        resolver,
        policy,
        metrics,
        shutdown: tx,
        task,
    }
}

impl Egressd {
    fn lines(&self) -> Vec<Value> {
        read_log(&self.log)
    }

    /// Waits (with a deadline) until `n` lines are logged; returns them all.
    async fn wait_lines(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let lines = self.lines();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} log lines, have {}: {lines:#?}",
                lines.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends a packet that must get no reply: waits for its log line (the
    /// `n`th), then a moment for a reply that should not come.
    async fn assert_unanswered(&self, bytes: &[u8], n: usize) {
        let s = UdpSocket::bind(LOCAL).await.unwrap();
        s.send_to(bytes, self.addr).await.unwrap();
        let lines = self.wait_lines(n).await;
        assert_eq!(lines[n - 1]["reason"], "malformed");
        let mut buf = [0u8; 512];
        let late = timeout(Duration::from_millis(200), s.recv_from(&mut buf)).await;
        assert!(late.is_err(), "answered a packet that must not be answered");
    }

    /// A sample's value: `name` with every `label="value"` in `labels`.
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = String::from_utf8(self.metrics.render()).unwrap();
        text.lines()
            .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
            .find(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.parse().unwrap())
            .unwrap_or(0.0)
    }
}

// ---------------------------------------------------------------- client

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    let mut e = Edns::new();
    e.set_max_payload(1232);
    m.set_edns(e);
    m
}

async fn udp_raw(server: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let s = UdpSocket::bind(LOCAL).await.unwrap();
    s.send_to(bytes, server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    match timeout(Duration::from_secs(8), s.recv_from(&mut buf)).await {
        Ok(Ok((n, _))) => Some(buf[..n].to_vec()),
        _ => None,
    }
}

async fn tcp_raw(server: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(server).await.unwrap();
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    s.write_all(&framed).await.unwrap();
    let mut len = [0u8; 2];
    timeout(Duration::from_secs(8), s.read_exact(&mut len))
        .await
        .ok()?
        .ok()?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.ok()?;
    Some(buf)
}

async fn ask(server: SocketAddr, m: &Message) -> Message {
    let bytes = udp_raw(server, &m.to_vec().unwrap())
        .await
        .expect("an answer over UDP");
    let r = Message::from_vec(&bytes).unwrap();
    assert_eq!(r.metadata.id, m.metadata.id);
    assert_eq!(r.metadata.message_type, MessageType::Response);
    r
}

async fn ask_tcp(server: SocketAddr, m: &Message) -> Message {
    let bytes = tcp_raw(server, &m.to_vec().unwrap())
        .await
        .expect("an answer over TCP");
    Message::from_vec(&bytes).unwrap()
}

async fn udp(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    ask(server, &query(name, qtype)).await
}

fn addrs(r: &Message) -> Vec<IpAddr> {
    r.answers.iter().filter_map(|a| a.data.ip_addr()).collect()
}

fn assert_blocked(r: &Message, rcode: ResponseCode, reason: &str) {
    assert_eq!(r.metadata.response_code, rcode, "{r}");
    assert!(r.answers.is_empty(), "{r}");
    assert_eq!(
        ede(r).map(|(c, t)| (c, without_request_id(&t))),
        Some((15, format!("egressd: {reason}"))),
        "{r}"
    );
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn basic() -> PolicyYaml {
    policy()
        .exception("allowed")
        .owner("team-a")
        .reason("the one name tests may resolve")
        .host("allowed.test")
        .cidr(LOOPBACK)
}

/// Another exception, `id` for `host`, owned by `o`.
fn and(p: PolicyYaml, id: &str, host: &str) -> PolicyYaml {
    p.exception(id).owner("o").reason("r").host(host)
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn denied_names_never_reach_upstream() {
    let up = fake_dns();
    up.set("allowed.test", &["127.0.0.5"]);
    let e = start(basic(), &up).await;
    let denied = [
        "evil.test",
        "EVIL.test",
        "eViL.TeSt.",
        "allowed.test.evil.test",
        "allowed.test.evil.test.",
        "xallowed.test",
        "sub.allowed.test",
        "ALLOWED.TEST.EVIL.TEST",
    ];
    for name in denied {
        let r = udp(e.addr, name, RecordType::A).await;
        assert_blocked(&r, ResponseCode::Refused, "no_exception");
        // The question comes back exactly as asked (0x20 case included).
        assert_eq!(
            r.queries[0].name().to_ascii().trim_end_matches('.'),
            name.trim_end_matches('.')
        );
    }
    // TCP is held to the same answer.
    let r = ask_tcp(e.addr, &query("Evil.Test", RecordType::AAAA)).await;
    assert_blocked(&r, ResponseCode::Refused, "no_exception");
    assert_eq!(
        up.queries().len(),
        0,
        "denied names reached upstream: {:?}",
        up.queries()
    );

    // The upstream is live: the allowed name goes through.
    let r = udp(e.addr, "allowed.test", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs(&r), vec![ip("127.0.0.5")]);
    assert_eq!(up.queries().len(), 1);

    let lines = e.wait_lines(denied.len() + 2).await;
    let deny = &lines[2];
    assert_eq!(deny["proto"], "dns");
    assert_eq!(deny["qname"], "evil.test", "lower-case, no trailing dot");
    assert_eq!(deny["qtype"], "A");
    assert_eq!(deny["rcode"], "REFUSED");
    assert_eq!(deny["decision"], "deny");
    assert_eq!(deny["reason"], "no_exception");
    assert_eq!(deny["client"], "-");
    assert!(deny["src"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(lines[4]["qname"], "allowed.test.evil.test");
    let allow = lines.last().unwrap();
    assert_eq!(
        (
            &allow["decision"],
            &allow["reason"],
            &allow["exception"],
            &allow["owner"],
            &allow["rcode"]
        ),
        (
            &"allow".into(),
            &"exception".into(),
            &"allowed".into(),
            &"team-a".into(),
            &"NOERROR".into()
        )
    );
    assert_eq!(
        e.metric(
            "egressd_denied_total",
            &[("proto", "dns"), ("reason", "no_exception")]
        ),
        denied.len() as f64 + 1.0
    );
}

#[tokio::test]
async fn deny_rcode_nxdomain() {
    let up = fake_dns();
    let e = start(basic().setting("dns", "{ deny_rcode: nxdomain }"), &up).await;
    let r = udp(e.addr, "evil.test", RecordType::A).await;
    assert_blocked(&r, ResponseCode::NXDomain, "no_exception");
    let lines = e.wait_lines(1).await;
    assert_eq!(lines[0]["rcode"], "NXDOMAIN");
    assert_eq!(up.queries().len(), 0);
}

#[tokio::test]
async fn allowed_names_are_answered_and_cached() {
    let up = fake_dns();
    up.set("allowed.test", &["127.0.0.5", "127.0.0.6"]);
    let e = start(basic(), &up).await;
    let first = udp(e.addr, "allowed.test", RecordType::A).await;
    assert_eq!(addrs(&first), vec![ip("127.0.0.5"), ip("127.0.0.6")]);
    assert!(first.metadata.recursion_available);
    assert!(first.edns.is_some(), "EDNS answered with EDNS");
    // Case variants, trailing dot and TCP all hit the one cache entry.
    for (name, tcp) in [("ALLOWED.test.", false), ("aLLoWeD.TeSt", true)] {
        let m = query(name, RecordType::A);
        let r = if tcp {
            ask_tcp(e.addr, &m).await
        } else {
            ask(e.addr, &m).await
        };
        assert_eq!(addrs(&r), vec![ip("127.0.0.5"), ip("127.0.0.6")]);
        assert!(r.answers.iter().all(|a| a.ttl <= 300 && a.ttl > 0));
    }
    let seen = up.queries();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].name, "allowed.test", "sent lower-case");
    // Another type is another cache entry; NODATA is cached too.
    udp(e.addr, "allowed.test", RecordType::AAAA).await;
    let r = udp(e.addr, "allowed.test", RecordType::AAAA).await;
    assert_eq!(
        (r.metadata.response_code, r.answers.len()),
        (ResponseCode::NoError, 0)
    );
    assert_eq!(up.queries().len(), 2);
    assert_eq!(
        e.metric("egressd_dns_cache_total", &[("result", "hit")]),
        3.0
    );

    let lines = e.wait_lines(5).await;
    for l in &lines {
        assert_eq!(
            (&l["decision"], &l["exception"], &l["qname"]),
            (&"allow".into(), &"allowed".into(), &"allowed.test".into())
        );
    }
    assert_eq!(
        e.metric(
            "egressd_exception_hits_total",
            &[("exception", "allowed"), ("owner", "team-a")]
        ),
        5.0
    );
}

/// A query answered from the wire cache is decided, logged and counted
/// like any other: its id, flags and question (0x20 case) are its own, its
/// TTL has aged, and a reload that changes what the exception reaches
/// changes the answer at once.
#[tokio::test]
async fn a_cached_answer_is_still_decided_logged_and_counted() {
    let up = fake_dns();
    up.set("allowed.test", &["127.0.0.5", "127.0.0.6"]);
    let e = start(basic(), &up).await;
    let first = udp(e.addr, "allowed.test", RecordType::A).await;
    assert_eq!(addrs(&first), vec![ip("127.0.0.5"), ip("127.0.0.6")]);
    for (i, name) in ["AlLoWeD.tEsT", "allowed.test", "ALLOWED.TEST"]
        .iter()
        .enumerate()
    {
        let mut m = query(name, RecordType::A);
        m.metadata.id = 0x4000 + i as u16;
        m.metadata.checking_disabled = i == 1;
        let raw = m.to_vec().unwrap();
        let got = udp_raw(e.addr, &raw).await.expect("answered");
        let r = Message::from_vec(&got).unwrap();
        assert_eq!(r.metadata.id, 0x4000 + i as u16);
        assert_eq!(r.metadata.checking_disabled, i == 1);
        assert_eq!(
            &got[12..12 + name.len() + 6],
            &raw[12..12 + name.len() + 6],
            "the question comes back as asked"
        );
        assert_eq!(addrs(&r), vec![ip("127.0.0.5"), ip("127.0.0.6")]);
        assert!(r
            .answers
            .iter()
            .all(|a| a.ttl <= first.answers[0].ttl && a.ttl > 0));
        assert!(r.edns.is_some());
    }
    assert_eq!(up.queries().len(), 1, "answered from egressd's caches");
    let lines = e.wait_lines(4).await;
    for l in &lines {
        assert_eq!(
            (&l["decision"], &l["exception"], &l["qname"], &l["rcode"]),
            (
                &"allow".into(),
                &"allowed".into(),
                &"allowed.test".into(),
                &"NOERROR".into()
            )
        );
    }
    assert_eq!(
        e.metric(
            "egressd_exception_hits_total",
            &[("exception", "allowed"), ("owner", "team-a")]
        ),
        4.0
    );
    assert_eq!(
        e.metric("egressd_dns_cache_total", &[("result", "hit")]),
        3.0
    );

    // A reload: the same name, now allowed only to 127.0.0.5.
    let narrower = policy()
        .exception("allowed")
        .owner("team-a")
        .reason("narrower")
        .host("allowed.test")
        .cidr("127.0.0.5/32");
    e.policy.swap(from_yaml(&narrower.yaml()).unwrap());
    let r = udp(e.addr, "allowed.test", RecordType::A).await;
    assert_eq!(
        addrs(&r),
        vec![ip("127.0.0.5")],
        "the old answer is not served"
    );
    // And removed: refused, though its answer was cached a moment ago.
    e.policy
        .swap(from_yaml(&and(policy(), "other", "other.test").yaml()).unwrap());
    let r = udp(e.addr, "allowed.test", RecordType::A).await;
    assert_blocked(&r, ResponseCode::Refused, "no_exception");
    let lines = e.wait_lines(6).await;
    assert_eq!(lines[4]["decision"], "allow");
    assert!(lines[4]["note"]
        .as_str()
        .is_some_and(|n| n.contains("127.0.0.6")));
    assert_eq!(lines[5]["reason"], "no_exception");
}

#[tokio::test]
async fn negative_answers_are_cached() {
    let up = fake_dns();
    let e = start(and(policy(), "wild", "*.zone.test"), &up).await;
    for _ in 0..3 {
        let r = udp(e.addr, "missing.zone.test", RecordType::A).await;
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(r.authorities.len(), 1, "the SOA comes along");
        assert!(ede(&r).is_none(), "a real NXDOMAIN is not a block");
    }
    assert_eq!(up.queries().len(), 1);
    let lines = e.wait_lines(3).await;
    assert_eq!(
        (&lines[0]["decision"], &lines[0]["rcode"]),
        (&"allow".into(), &"NXDOMAIN".into())
    );
}

#[tokio::test]
async fn txt_needs_dns_types() {
    let up = fake_dns();
    up.txt("allowed.test", "v=spf1 -all");
    up.txt("txt.test", "hello");
    let e = start(and(basic(), "txt", "txt.test").dns_type("TXT"), &up).await;
    let r = udp(e.addr, "allowed.test", RecordType::TXT).await;
    assert_blocked(&r, ResponseCode::Refused, "qtype_not_allowed");
    for t in [
        RecordType::MX,
        RecordType::SRV,
        RecordType::NS,
        RecordType::SOA,
    ] {
        assert_blocked(
            &udp(e.addr, "allowed.test", t).await,
            ResponseCode::Refused,
            "qtype_not_allowed",
        );
    }
    assert_eq!(up.queries().len(), 0);
    let r = udp(e.addr, "txt.test", RecordType::TXT).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert!(matches!(&r.answers[0].data, RData::TXT(t) if &*t.txt_data[0] == b"hello"));
    assert_eq!(up.queries().len(), 1);
    let lines = e.wait_lines(6).await;
    assert_eq!(
        (
            &lines[0]["reason"],
            &lines[0]["exception"],
            &lines[0]["qtype"]
        ),
        (
            &"qtype_not_allowed".into(),
            &"allowed".into(),
            &"TXT".into()
        )
    );
}

#[tokio::test]
async fn never_allowed_types_and_reverse_zones() {
    let up = fake_dns();
    let p = and(basic(), "all", "*.allowed.test")
        .dns_type("TXT")
        .dns_type("PTR");
    let e = start(p, &up).await;
    for (name, t) in [
        ("allowed.test", RecordType::ANY),
        ("allowed.test", RecordType::AXFR),
        ("allowed.test", RecordType::IXFR),
        ("allowed.test", RecordType::NULL),
        ("x.allowed.test", RecordType::NULL),
        ("x.allowed.test", RecordType::ANY),
    ] {
        let r = udp(e.addr, name, t).await;
        assert_blocked(&r, ResponseCode::Refused, "qtype_not_allowed");
    }
    let r = ask_tcp(e.addr, &query("allowed.test", RecordType::AXFR)).await;
    assert_blocked(&r, ResponseCode::Refused, "qtype_not_allowed");
    for (name, t) in [
        ("1.0.0.127.in-addr.arpa", RecordType::PTR),
        ("5.0.0.127.in-addr.arpa", RecordType::A),
        (
            "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa",
            RecordType::PTR,
        ),
    ] {
        let r = udp(e.addr, name, t).await;
        assert_blocked(&r, ResponseCode::Refused, "no_exception");
    }
    assert_eq!(up.queries().len(), 0, "{:?}", up.queries());
    let lines = e.wait_lines(10).await;
    assert_eq!(lines[0]["qtype"], "ANY");
    assert_eq!(lines[1]["qtype"], "AXFR");
}

#[tokio::test]
async fn rebinding_answers_are_filtered() {
    let up = fake_dns();
    up.set("meta.test", &["169.254.169.254"]);
    up.set("mixed.test", &["93.184.216.34", "10.1.2.3", "127.0.0.1"]);
    up.set("inside.test", &["10.1.2.3"]);
    up.set(
        "v6.test",
        &["::ffff:169.254.169.254", "fd00::1", "2001:4860::1"],
    );
    let p = and(policy(), "web", "meta.test").hosts(&["mixed.test", "v6.test"]);
    let e = start(and(p, "office", "inside.test").cidr("10.0.0.0/8"), &up).await;

    let r = udp(e.addr, "meta.test", RecordType::A).await;
    assert_blocked(&r, ResponseCode::Refused, "private_address");

    let r = udp(e.addr, "mixed.test", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs(&r), vec![ip("93.184.216.34")]);

    let r = udp(e.addr, "inside.test", RecordType::A).await;
    assert_eq!(
        addrs(&r),
        vec![ip("10.1.2.3")],
        "the exception's cidrs reach it"
    );

    let r = udp(e.addr, "v6.test", RecordType::AAAA).await;
    assert_eq!(
        addrs(&r),
        vec![ip("2001:4860::1")],
        "mapped and ULA addresses removed"
    );

    let lines = e.wait_lines(4).await;
    assert_eq!(
        (
            &lines[0]["decision"],
            &lines[0]["reason"],
            &lines[0]["exception"],
            &lines[0]["rcode"]
        ),
        (
            &"deny".into(),
            &"private_address".into(),
            &"web".into(),
            &"REFUSED".into()
        )
    );
    assert!(lines[0]["note"]
        .as_str()
        .unwrap()
        .contains("169.254.169.254"));
    assert_eq!(
        (&lines[1]["decision"], &lines[1]["reason"]),
        (&"allow".into(), &"exception".into())
    );
    let note = lines[1]["note"].as_str().expect("a partial answer says so");
    assert!(
        note.contains("10.1.2.3") && note.contains("127.0.0.1") && !note.contains("93.184"),
        "{note}"
    );
    assert!(lines[2].get("note").is_none());
    assert_eq!(
        e.metric(
            "egressd_denied_total",
            &[("proto", "dns"), ("reason", "private_address")]
        ),
        1.0
    );
}

#[tokio::test]
async fn tcp_fallback_on_truncation() {
    let up = fake_dns();
    up.set("big.test", &["127.0.0.7"]);
    up.truncate("big.test");
    let e = start(and(policy(), "big", "big.test").cidr(LOOPBACK), &up).await;
    let r = udp(e.addr, "big.test", RecordType::A).await;
    assert_eq!(addrs(&r), vec![ip("127.0.0.7")]);
    let seen = up.queries();
    assert_eq!(
        seen.iter().map(|s| s.tcp).collect::<Vec<_>>(),
        vec![false, true],
        "{seen:?}"
    );
    assert!(seen
        .iter()
        .all(|s| s.name == "big.test" && s.qtype == RecordType::A));
}

#[tokio::test]
async fn large_answers_are_truncated_for_udp_clients() {
    let many: Vec<String> = (1..=120).map(|i| format!("127.0.1.{i}")).collect();
    let up = fake_dns();
    up.set(
        "many.test",
        &many.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let e = start(and(policy(), "many", "many.test").cidr(LOOPBACK), &up).await;
    // A client without EDNS gets at most 512 bytes, flagged truncated.
    let mut m = query("many.test", RecordType::A);
    m.edns = None;
    let bytes = udp_raw(e.addr, &m.to_vec().unwrap()).await.unwrap();
    assert!(bytes.len() <= 512, "{}", bytes.len());
    let r = Message::from_vec(&bytes).unwrap();
    assert!(r.metadata.truncation);
    // So it retries over TCP and gets everything (from the cache).
    let r = ask_tcp(e.addr, &m).await;
    assert_eq!(addrs(&r).len(), 120);
    assert!(!r.metadata.truncation);
    assert_eq!(up.count("many.test"), 1);
}

/// RFC 9520: a failed resolution is held for a second and answered from
/// memory, so a refusing zone or a dead upstream is asked once per hold, not
/// once per query; after the hold the upstream is asked again, and an answer
/// ends the failure.
#[tokio::test]
async fn a_failed_resolution_is_remembered_for_a_second() {
    let up = fake_dns();
    up.set("flaky.test", &["127.0.0.7"]);
    up.rcode("flaky.test", ResponseCode::Refused);
    let e = start(and(policy(), "f", "flaky.test").cidr(LOOPBACK), &up).await;
    let failed = Instant::now();
    let r = udp(e.addr, "flaky.test", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(up.count("flaky.test"), 2, "both rounds asked");
    // The upstream recovers, but the failure is held: answered from
    // memory, SERVFAIL again, the upstream not asked, and the log says so.
    up.answer_again("flaky.test");
    let r = udp(e.addr, "flaky.test", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(up.count("flaky.test"), 2, "held, not asked again");
    let lines = e.wait_lines(2).await;
    let why = lines[1]["error"].as_str().unwrap();
    assert!(
        why.contains("REFUSED") && why.contains("remembered"),
        "{why}"
    );
    assert_eq!(
        e.metric("egressd_dns_cache_total", &[("result", "failure")]),
        1.0
    );
    // Each exchange failed is counted once: none for the remembered one.
    assert_eq!(
        e.metric(
            "egressd_upstream_errors_total",
            &[("kind", "servfail"), ("proto", "dns")]
        ),
        2.0
    );
    // Another type of the same name was not what failed: asked at once.
    let r = udp(e.addr, "flaky.test", RecordType::AAAA).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(up.count("flaky.test"), 3);
    // Asked again once the hold is over (polled: each query before then
    // is answered from memory without reaching the upstream).
    let answered = loop {
        let r = udp(e.addr, "flaky.test", RecordType::A).await;
        if r.metadata.response_code == ResponseCode::NoError {
            break r;
        }
        assert!(failed.elapsed() < Duration::from_secs(10), "still failing");
        assert_eq!(up.count("flaky.test"), 3, "asked during the hold: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(failed.elapsed() >= Duration::from_millis(900));
    assert_eq!(addrs(&answered), ["127.0.0.7".parse::<IpAddr>().unwrap()]);
    assert_eq!(up.count("flaky.test"), 4);
}

/// The proxy's lookups go through the same memory: a request for a name
/// whose upstream fails does not make the next request wait for the
/// upstreams again.
#[tokio::test]
async fn proxy_lookups_of_a_failing_name_ask_once_per_hold() {
    let up = fake_dns();
    up.rcode("down.test", ResponseCode::ServFail);
    let e = start(and(policy(), "d", "down.test"), &up).await;
    let policy: Arc<Policy> = e.policy.snapshot();
    let host = parse_host("down.test").unwrap();
    let first = e.resolver.lookup_ip(&host, &policy).await.unwrap_err();
    assert!(matches!(first, ResolveError::Upstream(_)), "{first:?}");
    assert_eq!(up.count("down.test"), 4, "A and AAAA, two rounds each");
    let second = e.resolver.lookup_ip(&host, &policy).await.unwrap_err();
    assert!(matches!(second, ResolveError::Remembered(..)), "{second:?}");
    assert!(second.to_string().contains("SERVFAIL"), "{second}");
    assert_eq!(up.count("down.test"), 4, "held: not asked again");
    assert_eq!(
        e.metric("egressd_dns_cache_total", &[("result", "failure")]),
        2.0
    );
}

#[tokio::test]
async fn upstream_failures_are_servfail_and_logged_as_errors() {
    let up = fake_dns();
    up.rcode("fail.test", ResponseCode::ServFail);
    let e = start(and(policy(), "f", "fail.test"), &up).await;
    let r = udp(e.addr, "fail.test", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert!(ede(&r).is_none());
    // Both rounds asked the (only) upstream.
    assert_eq!(up.count("fail.test"), 2);
    let lines = e.wait_lines(1).await;
    assert_eq!(
        (
            &lines[0]["decision"],
            &lines[0]["reason"],
            &lines[0]["rcode"]
        ),
        (&"allow".into(), &"exception".into(), &"SERVFAIL".into())
    );
    assert!(lines[0]["error"].as_str().unwrap().contains("SERVFAIL"));
    assert_eq!(
        e.metric(
            "egressd_upstream_errors_total",
            &[("kind", "servfail"), ("proto", "dns")]
        ),
        2.0
    );
}

#[tokio::test]
async fn malformed_packets_get_an_error_and_no_crash() {
    let up = fake_dns();
    up.set("allowed.test", &["127.0.0.5"]);
    let e = start(basic(), &up).await;

    // Too short for a header: logged, not answered.
    e.assert_unanswered(&[0x12, 0x34, 0x01], 1).await;

    // A header promising a question that is not there.
    let bytes = udp_raw(e.addr, &[0xab, 0xcd, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let r = Message::from_vec(&bytes).unwrap();
    assert_eq!(
        (r.metadata.id, r.metadata.response_code),
        (0xabcd, ResponseCode::FormErr)
    );

    // A compression pointer to itself (a loop).
    let mut looped = vec![0xbe, 0xef, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    looped.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    let r = Message::from_vec(&udp_raw(e.addr, &looped).await.unwrap()).unwrap();
    assert_eq!(
        (r.metadata.id, r.metadata.response_code),
        (0xbeef, ResponseCode::FormErr)
    );
    // Over TCP too.
    let r = Message::from_vec(&tcp_raw(e.addr, &looped).await.unwrap()).unwrap();
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);

    // Two questions.
    let mut two = query("allowed.test", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("evil.test.").unwrap(),
        RecordType::A,
    ));
    assert_eq!(
        ask(e.addr, &two).await.metadata.response_code,
        ResponseCode::FormErr
    );

    // Not a QUERY.
    let mut notify = query("allowed.test", RecordType::SOA);
    notify.metadata.op_code = OpCode::Notify;
    assert_eq!(
        ask(e.addr, &notify).await.metadata.response_code,
        ResponseCode::Refused
    );

    // A response sent to us is not answered (no reflection).
    let mut resp = query("allowed.test", RecordType::A);
    resp.metadata.message_type = MessageType::Response;
    e.assert_unanswered(&resp.to_vec().unwrap(), 7).await;

    // Labels with bytes outside [A-Za-z0-9_-] are not host names.
    let mut odd = Message::query();
    odd.add_query(Query::query(
        Name::from_labels(vec![&b"a.b"[..], &b"test"[..]]).unwrap(),
        RecordType::A,
    ));
    odd.set_edns(Edns::new());
    assert_blocked(&ask(e.addr, &odd).await, ResponseCode::Refused, "malformed");

    // A classless CHAOS query.
    let mut ch = query("version.bind", RecordType::TXT);
    ch.queries[0].set_query_class(hickory_proto::rr::DNSClass::CH);
    assert_eq!(
        ask(e.addr, &ch).await.metadata.response_code,
        ResponseCode::Refused
    );

    // Still serving.
    assert_eq!(
        addrs(&udp(e.addr, "allowed.test", RecordType::A).await),
        vec![ip("127.0.0.5")]
    );
    assert_eq!(up.queries().len(), 1, "{:?}", up.queries());
    let lines = e.wait_lines(10).await;
    let malformed = lines.iter().filter(|l| l["reason"] == "malformed").count();
    assert_eq!((lines.len(), malformed), (10, 9), "{lines:#?}");
    assert!(lines
        .iter()
        .all(|l| l["src"].as_str().unwrap().starts_with("127.0.0.1:")));
}

/// Base32 (RFC 4648, lower case, no padding) of `data`.
fn base32(data: &[u8]) -> String {
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in data {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            out.push(ALPHA[((acc >> (bits - 5)) & 31) as usize] as char);
            bits -= 5;
        }
    }
    if bits > 0 {
        out.push(ALPHA[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// A tunnel name carrying chunk `i` of a pseudo-random payload: two labels of
/// base32 within the default caps (labels <= 40, name <= 120).
pub(crate) fn tunnel_name(i: u32, suffix: &str) -> (String, usize) {
    let mut x = 0x9e37_79b9u32.wrapping_mul(i + 1);
    let chunk: Vec<u8> = (0..45)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let enc = base32(&chunk);
    (
        format!("{}.{}.{suffix}", &enc[..36], &enc[36..]),
        chunk.len(),
    )
}

/// A CDN wildcard a tunnel could hide under, an exact host beside it, and
/// 127.0.0.1 as the named client `agent`.
fn tunnel() -> PolicyYaml {
    let p = policy()
        .client_from("agent", &["127.0.0.1/32"])
        .exception("cdn")
        .owner("platform")
        .reason("a CDN wildcard")
        .host("*.cdn.test")
        .cidr(LOOPBACK);
    and(p, "other", "exact.test").cidr(LOOPBACK)
}

#[tokio::test]
async fn a_tunnel_under_an_allowed_wildcard_is_blocked_within_the_budget() {
    let up = fake_dns();
    up.set("*.cdn.test", &["127.0.0.9"]);
    up.set("exact.test", &["127.0.0.10"]);
    let e = start(tunnel(), &up).await;
    let block_bytes = e.policy.snapshot().settings.dns.tunnel.block_bytes;

    // An ordinary name first: cached, and later refused in the cool-down.
    assert_eq!(
        addrs(&udp(e.addr, "www.cdn.test", RecordType::A).await),
        vec![ip("127.0.0.9")]
    );

    let mut leaked_payload = 0usize;
    let mut leaked_text = 0usize;
    let mut blocked_at = None;
    for i in 0..200u32 {
        let (name, payload) = tunnel_name(i, "cdn.test");
        let r = udp(e.addr, &name, RecordType::A).await;
        if r.metadata.response_code == ResponseCode::Refused {
            assert_blocked(&r, ResponseCode::Refused, "dns_tunnel");
            blocked_at = Some(i);
            break;
        }
        assert_eq!(addrs(&r), vec![ip("127.0.0.9")]);
        leaked_payload += payload;
        leaked_text += name.len() - ".cdn.test".len();
    }
    let blocked_at = blocked_at.expect("the tunnel was never blocked");
    assert!(blocked_at > 0);
    assert!(
        leaked_text as u64 <= block_bytes,
        "{leaked_text} bytes of names left before the block"
    );
    assert!(
        leaked_payload <= 1024,
        "{leaked_payload} bytes of payload left"
    );
    // Exactly the allowed tunnel names reached upstream; the blocked one did not.
    let below = up
        .queries()
        .iter()
        .filter(|s| s.name.ends_with(".cdn.test"))
        .count();
    assert_eq!(below, 1 + blocked_at as usize);
    assert_eq!(up.count(&tunnel_name(blocked_at, "cdn.test").0), 0);

    // Cool-down: the whole wildcard is refused for this client now, cached
    // names included; exact hosts are not affected.
    assert_blocked(
        &udp(e.addr, "www.cdn.test", RecordType::A).await,
        ResponseCode::Refused,
        "dns_tunnel",
    );
    assert_blocked(
        &udp(e.addr, &tunnel_name(1000, "cdn.test").0, RecordType::A).await,
        ResponseCode::Refused,
        "dns_tunnel",
    );
    assert_eq!(
        addrs(&udp(e.addr, "exact.test", RecordType::A).await),
        vec![ip("127.0.0.10")]
    );

    let lines = e.wait_lines(blocked_at as usize + 5).await;
    let block = lines.iter().find(|l| l["reason"] == "dns_tunnel").unwrap();
    assert_eq!(
        (
            &block["decision"],
            &block["exception"],
            &block["client"],
            &block["rcode"]
        ),
        (
            &"deny".into(),
            &"cdn".into(),
            &"agent".into(),
            &"REFUSED".into()
        )
    );
    assert!(block["note"].as_str().unwrap().contains("block_bytes"));
    assert!(e.metric("egressd_dns_tunnel_suspected_total", &[("action", "block")]) >= 3.0);
    assert!(
        e.metric("egressd_dns_tunnel_suspected_total", &[("action", "log")]) >= 1.0,
        "alerted before blocking"
    );
}

#[tokio::test]
async fn names_that_break_the_caps_or_syntax_under_a_wildcard_are_tunnels() {
    let up = fake_dns();
    up.set("*.cdn.test", &["127.0.0.9"]);
    // The default label cap is DNS's own 63; a policy can lower it.
    let capped = tunnel().setting("dns", "{ tunnel: { max_label_len: 40 } }");
    let e = start(capped, &up).await;
    let long_label = format!("{}.cdn.test", "a".repeat(50));
    assert_blocked(
        &udp(e.addr, &long_label, RecordType::A).await,
        ResponseCode::Refused,
        "dns_tunnel",
    );
    let long_name = format!("{}.cdn.test", ["abcdefghij"; 12].join("."));
    assert_blocked(
        &udp(e.addr, &long_name, RecordType::A).await,
        ResponseCode::Refused,
        "dns_tunnel",
    );

    let raw = |labels: Vec<&[u8]>| {
        let mut m = Message::query();
        m.add_query(Query::query(
            Name::from_labels(labels).unwrap(),
            RecordType::A,
        ));
        m.set_edns(Edns::new());
        m
    };
    let r = ask(
        e.addr,
        &raw(vec![&b"data+with/base64="[..], &b"cdn"[..], &b"test"[..]]),
    )
    .await;
    assert_blocked(&r, ResponseCode::Refused, "dns_tunnel");
    let r = ask(
        e.addr,
        &raw(vec![
            &b"data+with/base64="[..],
            &b"elsewhere"[..],
            &b"test"[..],
        ]),
    )
    .await;
    assert_blocked(&r, ResponseCode::Refused, "malformed");
    assert_eq!(up.queries().len(), 0);
    let lines = e.wait_lines(4).await;
    assert_eq!(
        (&lines[2]["reason"], &lines[2]["exception"]),
        (&"dns_tunnel".into(), &"cdn".into())
    );
    assert!(lines[2]["qname"]
        .as_str()
        .unwrap()
        .starts_with("data+with/base64="));
}

#[tokio::test]
async fn proxy_lookups_share_the_clients_budget() {
    let up = fake_dns();
    up.set("*.cdn.test", &["127.0.0.9"]);
    up.set("www.cdn.test", &["127.0.0.9", "::1"]);
    up.rcode("gone.cdn.test", ResponseCode::ServFail);
    let e = start(tunnel(), &up).await;
    let policy: Arc<Policy> = e.policy.snapshot();
    let client = policy.identify(ip("127.0.0.1"), None).unwrap();
    assert!(client.is_some(), "127.0.0.1 is the named client");
    let exception = policy.exception("cdn").unwrap();

    // lookup_ip: A + AAAA through the cache, fresh lower-case queries.
    let www = parse_host("WWW.cdn.test").unwrap();
    assert_eq!(
        e.resolver.lookup_ip(&www, &policy).await.unwrap(),
        vec![ip("127.0.0.9"), ip("::1")]
    );
    assert_eq!(e.resolver.lookup_ip(&www, &policy).await.unwrap().len(), 2);
    assert_eq!(
        up.count("www.cdn.test"),
        2,
        "one A and one AAAA, then cached"
    );
    let missing = parse_host("missing.elsewhere.test").unwrap();
    assert_eq!(
        e.resolver.lookup_ip(&missing, &policy).await,
        Err(ResolveError::NoAddresses)
    );
    let gone = parse_host("gone.cdn.test").unwrap();
    assert!(matches!(
        e.resolver.lookup_ip(&gone, &policy).await,
        Err(ResolveError::Upstream(_))
    ));

    // The proxy spends the budget for this client, name by name...
    let now = unix_now();
    let mut proxy_blocked = None;
    for i in 0..200u32 {
        let host = parse_host(&tunnel_name(i, "cdn.test").0).unwrap();
        match e
            .resolver
            .tunnel_check(&policy, client, ip("127.0.0.1"), &host, exception, now)
        {
            TunnelOutcome::Block => {
                proxy_blocked = Some(i);
                break;
            }
            _ => {
                e.resolver.lookup_ip(&host, &policy).await.unwrap();
            }
        }
    }
    assert!(proxy_blocked.is_some(), "the proxy side is budgeted too");
    // ...and the same client's own DNS queries are refused now.
    let r = udp(e.addr, &tunnel_name(500, "cdn.test").0, RecordType::A).await;
    assert_blocked(&r, ResponseCode::Refused, "dns_tunnel");
    // An anonymous client (another budget) is not.
    let fresh = parse_host(&tunnel_name(501, "cdn.test").0).unwrap();
    assert_eq!(
        e.resolver
            .tunnel_check(&policy, None, ip("127.0.0.2"), &fresh, exception, now),
        TunnelOutcome::Ok
    );
}

/// An upstream slow for one name holds up only that name: a query the same
/// client sends meanwhile is answered first, and the slow answer, late but
/// within one attempt's timeout, is waited for rather than asked again.
#[tokio::test]
async fn a_slow_upstream_name_holds_up_only_itself() {
    let up = fake_dns();
    up.set("allowed.test", &["127.0.0.5"]);
    up.set("slow.test", &["127.0.0.6"]);
    up.delay("slow.test", Duration::from_millis(700));
    let e = start(and(basic(), "slow", "slow.test").cidr(LOOPBACK), &up).await;
    let addr = e.addr;
    let slow = tokio::spawn(async move { udp(addr, "slow.test", RecordType::A).await });
    let deadline = Instant::now() + WAIT;
    while up.count("slow.test") == 0 {
        assert!(
            Instant::now() < deadline,
            "the slow query never went upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fast = udp(e.addr, "allowed.test", RecordType::A).await;
    assert_eq!(addrs(&fast), vec![ip("127.0.0.5")]);
    assert!(!slow.is_finished(), "the slow name's answer came first");
    let r = slow.await.unwrap();
    assert_eq!(addrs(&r), vec![ip("127.0.0.6")]);
    assert_eq!(up.count("slow.test"), 1, "{:?}", up.queries());
    let lines = e.wait_lines(2).await;
    assert_eq!(lines[0]["qname"], "allowed.test");
    assert_eq!(
        (&lines[1]["qname"], &lines[1]["rcode"]),
        (&"slow.test".into(), &"NOERROR".into())
    );
}

#[tokio::test]
async fn lookup_ip_times_out_on_a_silent_upstream() {
    let up = fake_dns();
    up.silent("slow.test");
    let resolver = Resolver::new(vec![up.addr], Metrics::new());
    let policy = from_yaml(&basic().yaml()).unwrap();
    let started = Instant::now();
    let r = resolver
        .lookup_ip(&parse_host("slow.test").unwrap(), &policy)
        .await;
    assert_eq!(r, Err(ResolveError::Timeout));
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "bounded by our own deadline"
    );
    // A and AAAA, each tried once per round.
    assert_eq!(up.count("slow.test"), 4);
}

#[tokio::test]
async fn one_client_cannot_hold_every_slot() {
    let up = fake_dns();
    up.silent("slow.test");
    up.set("allowed.test", &["127.0.0.5"]);
    let e = start(and(basic(), "slow", "slow.test"), &up).await;
    let sock = UdpSocket::bind(LOCAL).await.unwrap();
    let n = 100;
    for _ in 0..n {
        sock.send_to(&query("slow.test", RecordType::A).to_vec().unwrap(), e.addr)
            .await
            .unwrap();
    }
    // The queries over the per-client cap are refused at once, not queued.
    let mut refused = 0;
    let mut buf = vec![0u8; 4096];
    while let Ok(Ok((len, _))) =
        timeout(Duration::from_millis(1000), sock.recv_from(&mut buf)).await
    {
        let r = Message::from_vec(&buf[..len]).unwrap();
        if r.metadata.response_code == ResponseCode::Refused {
            assert_eq!(
                ede(&r).map(|(c, t)| (c, without_request_id(&t))),
                Some((0, "egressd: overloaded".into()))
            );
            refused += 1;
        }
        if refused == n - 64 {
            break;
        }
    }
    assert_eq!(refused, n - 64);
    // The slots come back once the slow queries give up.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = udp(e.addr, "allowed.test", RecordType::A).await;
        if r.metadata.response_code == ResponseCode::NoError {
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines = e.wait_lines(n).await;
    let overloaded = lines
        .iter()
        .filter(|l| l["reason"] == "overloaded" && l["qname"] == "slow.test");
    assert_eq!(overloaded.count(), n - 64);
}

#[tokio::test]
async fn log_failure_fails_closed() {
    assert!(
        std::path::Path::new("/dev/full").exists(),
        "this test writes its log to /dev/full, which this machine lacks"
    );
    let up = fake_dns();
    up.set("allowed.test", &["127.0.0.5"]);
    let e = start_with_log(basic(), &up, Some(PathBuf::from("/dev/full"))).await;
    // The first line cannot be written; from then on queries are refused
    // without going upstream.
    let deadline = Instant::now() + WAIT;
    let r = loop {
        let r = udp(e.addr, "allowed.test", RecordType::A).await;
        if r.metadata.response_code == ResponseCode::Refused {
            break r;
        }
        assert!(Instant::now() < deadline, "never failed closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        ede(&r).map(|(c, t)| (c, without_request_id(&t))),
        Some((15, "egressd: log_unavailable".into()))
    );
    let before = up.queries().len();
    udp(e.addr, "allowed.test", RecordType::AAAA).await;
    assert_eq!(up.queries().len(), before);
    assert!(e.metric("egressd_log_write_errors_total", &[]) >= 1.0);
}

#[tokio::test]
async fn refuses_itself_as_upstream() {
    let (udp, tcp, addr) = bind_pair().await;
    let metrics = Metrics::new();
    let dir = tempfile::tempdir().unwrap();
    let sink = LogSink::start(LogTarget::File(dir.path().join("log")), metrics.clone()).unwrap();
    let resolver = Resolver::new(vec![addr], metrics.clone());
    let policy = PolicyHandle::new(from_yaml(&basic().yaml()).unwrap());
    let (_tx, rx) = watch::channel(false);
    let r = timeout(
        WAIT,
        dns::serve(
            udp,
            tcp,
            policy,
            resolver,
            Recorder::new(sink, metrics),
            dns::Bounds::default(),
            rx,
        ),
    )
    .await;
    let err = r.expect("returns at once").expect_err("a loop is refused");
    assert!(err.to_string().contains("own DNS listener"), "{err}");
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let up = fake_dns();
    up.set("allowed.test", &["127.0.0.5"]);
    let e = start(basic(), &up).await;
    assert_eq!(
        addrs(&udp(e.addr, "allowed.test", RecordType::A).await),
        vec![ip("127.0.0.5")]
    );
    e.shutdown.send(true).unwrap();
    let done = timeout(Duration::from_secs(5), e.task)
        .await
        .expect("serve returned")
        .unwrap();
    assert!(done.is_ok());
}
