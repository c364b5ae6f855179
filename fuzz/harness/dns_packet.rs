//! DNS name and packet handling, end to end: egressd's resolver
//! (`dns::serve`) runs in-process on loopback against a fake upstream.
//! The input is a query packet for egressd and the records section of the
//! upstream's reply to whatever egressd asks. Checks: no panic (in any
//! task), a reply only ever to a packet with a query header and always
//! with its ID, and — under any query — no name the policy denies ever
//! reaches the upstream.
//!
//! Input layout: `[len: u8][query: len bytes][reply records: rest]`.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use egressd::dns::{self, Resolver};
use egressd::log::{LogSink, LogTarget};
use egressd::metrics::Metrics;
use egressd::policy::from_yaml;
use egressd::policy::PolicyHandle;
use egressd::record::Recorder;

const POLICY: &str = r#"
settings:
  dns:
    cache_min_ttl: 0s
    cache_max_ttl: 0s
    tunnel: { action: "off" }
exceptions:
  - id: exact
    owner: o
    reason: r
    hosts: [a.test, b.test]
    cidrs: [10.0.0.0/8]
    dns_types: [TXT, MX, SRV, CAA, PTR]
  - id: wild
    owner: o
    reason: r
    hosts: ["*.a.test"]
"#;

/// Whether the policy above allows `name` (as the upstream saw it).
fn allowed(name: &str) -> bool {
    name == "a.test" || name == "b.test" || name.ends_with(".a.test")
}

struct Env {
    _rt: tokio::runtime::Runtime,
    dns: SocketAddr,
    /// The records section the upstream appends to its next replies.
    tail: Arc<Mutex<Vec<u8>>>,
    /// Names that reached the upstream and should not have.
    leaked: Arc<Mutex<Vec<String>>>,
}

static ENV: OnceLock<Env> = OnceLock::new();
static PANICKED: AtomicBool = AtomicBool::new(false);
const RT_THREAD: &str = "egressd-under-fuzz";

/// The question section of a query egressd sent: its bytes and the name.
fn question(q: &[u8]) -> Option<(&[u8], String)> {
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *q.get(i)? as usize;
        if len == 0 {
            i += 1;
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(q.get(i + 1..i + 1 + len)?).to_ascii_lowercase());
        i += 1 + len;
    }
    Some((q.get(12..i + 4)?, labels.join(".")))
}

fn upstream(sock: UdpSocket, tail: Arc<Mutex<Vec<u8>>>, leaked: Arc<Mutex<Vec<String>>>) {
    let mut buf = [0u8; 4096];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let q = &buf[..n];
        let Some((question, name)) = question(q) else {
            continue;
        };
        if !allowed(&name) {
            leaked.lock().unwrap().push(name.clone());
        }
        let tail = tail.lock().unwrap().clone();
        // The fuzzed reply: our header (answer count from the tail's first
        // byte, the rest in the answer section), the question as asked.
        let mut reply = vec![q[0], q[1], 0x81, 0x80, 0, 1];
        let count = tail.first().copied().unwrap_or(0) as u16 % 16;
        reply.extend_from_slice(&count.to_be_bytes());
        reply.extend_from_slice(&[0, 0, 0, 0]);
        reply.extend_from_slice(question);
        reply.extend_from_slice(tail.get(1..).unwrap_or(&[]));
        let _ = sock.send_to(&reply, peer);
        // Then a plain empty answer, so that a reply egressd rightly
        // ignores does not leave it waiting for its timeout.
        let mut plain = vec![q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0];
        plain.extend_from_slice(question);
        let _ = sock.send_to(&plain, peer);
    }
}

fn setup() -> Env {
    let prev = std::panic::take_hook();
    // Only panics in egressd's own threads count: other tests in the same
    // process may panic on purpose.
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some(RT_THREAD) {
            PANICKED.store(true, Ordering::SeqCst);
        }
        prev(info);
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(RT_THREAD)
        .enable_all()
        .build()
        .unwrap();
    let up = UdpSocket::bind("127.0.0.1:0").unwrap();
    let up_addr = up.local_addr().unwrap();
    let tail = Arc::new(Mutex::new(Vec::new()));
    let leaked = Arc::new(Mutex::new(Vec::new()));
    let (t2, l2) = (tail.clone(), leaked.clone());
    thread::spawn(move || upstream(up, t2, l2));
    let dns = rt.block_on(async {
        let metrics = Metrics::new();
        let sink = LogSink::start(LogTarget::File("/dev/null".into()), metrics.clone()).unwrap();
        let recorder = Recorder::new(sink, metrics.clone());
        let policy = PolicyHandle::new(from_yaml(POLICY).unwrap());
        let resolver = Resolver::new(vec![up_addr], metrics);
        let (udp, tcp) = loop {
            let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            if let Ok(tcp) = tokio::net::TcpListener::bind(udp.local_addr().unwrap()).await {
                break (udp, tcp);
            }
        };
        let addr = udp.local_addr().unwrap();
        // The sender is leaked on purpose: the resolver serves until exit.
        let (tx, rx) = tokio::sync::watch::channel(false);
        std::mem::forget(tx);
        tokio::spawn(dns::serve(
            udp,
            tcp,
            policy,
            resolver,
            recorder,
            dns::Bounds::default(),
            rx,
        ));
        addr
    });
    Env {
        _rt: rt,
        dns,
        tail,
        leaked,
    }
}

pub fn run(data: &[u8]) {
    let env = ENV.get_or_init(setup);
    let Some((&len, rest)) = data.split_first() else {
        return;
    };
    let len = (len as usize).min(rest.len());
    let (query, tail) = rest.split_at(len);
    *env.tail.lock().unwrap() = tail.to_vec();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(query, env.dns).unwrap();
    // egressd stays silent for packets without a query header.
    let answered = query.len() >= 12 && query[2] & 0x80 == 0;
    let wait = if answered { 1000 } else { 5 };
    client
        .set_read_timeout(Some(Duration::from_millis(wait)))
        .unwrap();
    let mut buf = [0u8; 65535];
    if let Ok((n, _)) = client.recv_from(&mut buf) {
        assert!(
            answered,
            "answered a packet that is not a query: {query:02x?}"
        );
        assert!(n >= 12, "a reply shorter than a header");
        assert_eq!(buf[..2], query[..2], "the reply carries another ID");
        assert_eq!(buf[2] & 0x80, 0x80, "the reply is not a response");
    }
    let leaked = env.leaked.lock().unwrap().clone();
    assert!(
        leaked.is_empty(),
        "denied names reached upstream: {leaked:?}"
    );
    assert!(!PANICKED.load(Ordering::SeqCst), "a panic in egressd");
}
