//! The DNS front-end: UDP and TCP listeners and the hickory-server
//! [`RequestHandler`] that answers each query.
//!
//! Every packet that carries a DNS header becomes exactly one decision event:
//! parsed with hickory-server's [`Request`], its one question turned into a
//! policy [`Request`](PolicyRequest) and decided by `Policy::decide`, then
//! answered:
//!
//! - denied (by the policy, the tunnel budget, or an answer made only of
//!   non-public addresses): `REFUSED` (or `NXDOMAIN` by
//!   `settings.dns.deny_rcode`) with an Extended DNS Error (RFC 8914) code 15
//!   "Blocked" whose text is `egressd: <reason>`. A denied name is never sent
//!   upstream.
//! - allowed: a fresh query upstream (through the cache); A/AAAA records that
//!   the exception may not reach are removed (rebinding protection), and
//!   `SERVFAIL` when the upstreams fail (logged as an error, not a decision).
//! - malformed (undecodable, several questions, a non-QUERY opcode, a class
//!   other than IN, a name outside `[A-Za-z0-9_-]`): `FORMERR` or `REFUSED`.
//!   A name that breaks hostname syntax or length below an allowed wildcard is
//!   reason `dns_tunnel`, like any other name shaped to carry data.
//!
//! We run our own receive loops rather than hickory's `Server` so that the
//! bounds come before the work: a query is only spawned once it holds a slot
//! of [`MAX_INFLIGHT`] and of its client's share (the named client its
//! source identifies, else its address: [`MAX_INFLIGHT_PER_CLIENT`], or
//! `settings.limits.connections_per_client` if smaller), otherwise it is
//! answered `REFUSED`, reason `overloaded`, inline; TCP
//! connections are capped per client and in all, and packets hickory would
//! reject before any handler runs are still logged as `malformed`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use hickory_proto::op::{
    Edns, Header, HeaderCounts, Message, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::rdata::svcb::{SvcParamValue, SVCB};
use hickory_proto::rr::{DNSClass, Name, RData, Record};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncoder};
use hickory_server::net::runtime::{Time, TokioTime};
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::timeout;

use super::batch::{Inbox, Outbox};
use super::budget::{under_wildcard, TunnelOutcome};
use super::fast;
use super::resolver::{rcode_name, Lookup, EDNS_PAYLOAD};
use super::wire::{Key, WireCache};
use super::Resolver;
use crate::policy::host::{parse_host, Host, HostError, Target};
use crate::policy::qtype::qtype_mnemonic;
use crate::policy::{
    enforced, ClientIdx, Decision, DenyRcode, Exception, Policy, PolicyHandle, Proto, Reason,
    Request as PolicyRequest, TunnelAction,
};
use crate::record::{Event, Recorder};
use crate::shutdown::{Holder, Shutdown};
use crate::time::unix_now;

/// Queries being answered at once, from all clients together.
pub const MAX_INFLIGHT: usize = 1024;
/// Queries being answered at once for one client (a named client, else an
/// address; an IPv6 client is its /64): one client cannot starve the others.
pub const MAX_INFLIGHT_PER_CLIENT: usize = 64;
/// Open TCP connections, in all and per client address.
pub const MAX_TCP_CONNECTIONS: usize = 256;
pub const MAX_TCP_PER_CLIENT: usize = 16;
/// A TCP connection with no new query for this long is closed.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Reading the rest of a TCP query, or writing its answer.
pub const TCP_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long queries in flight may finish after shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause after a failed UDP receive (an ICMP error for an earlier reply).
const UDP_ERROR_PAUSE: Duration = Duration::from_millis(5);
/// Pause after a failed TCP accept (out of descriptors), instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Largest UDP query read; anything longer arrives cut and fails to parse.
const MAX_UDP_QUERY: usize = 4096;
/// Most UDP packets read in one go (one recvmmsg) before the receive loop
/// looks at TCP accepts, finished tasks and the shutdown again.
const UDP_BURST: usize = super::batch::BATCH;
/// RFC 8914 INFO-CODEs used here.
const EDE_OTHER: u16 = 0;
const EDE_BLOCKED: u16 = 15;
/// The EDNS option code of Extended DNS Errors.
pub(super) const EDNS_EDE: u16 = 15;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves DNS on `udp` and `tcp` until `shutdown` fires (or its trigger is
/// gone), then lets queries in flight finish for up to [`DRAIN_TIMEOUT`].
pub async fn serve(
    udp: UdpSocket,
    tcp: TcpListener,
    policy: Arc<PolicyHandle>,
    resolver: Arc<Resolver>,
    recorder: Recorder,
    shutdown: impl Into<Shutdown>,
) -> anyhow::Result<()> {
    let mut shutdown = shutdown.into();
    let listen = udp.local_addr()?;
    if let Some(up) = resolver.upstreams().iter().find(|up| is_self(listen, **up)) {
        anyhow::bail!(
            "upstream DNS {up} is egressd's own DNS listener ({listen}): every query would loop; \
             pass --upstream-dns with the real resolver"
        );
    }
    let server = Loops {
        handler: Arc::new(Handler {
            policy,
            resolver,
            recorder,
            wire: WireCache::default(),
        }),
        queries: Limiter::new(MAX_INFLIGHT, MAX_INFLIGHT_PER_CLIENT),
        conns: Limiter::new(MAX_TCP_CONNECTIONS, MAX_TCP_PER_CLIENT),
        udp: Arc::new(udp),
    };
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut inbox = Inbox::new(UDP_BURST, MAX_UDP_QUERY);
    let mut outbox = Outbox::default();
    // The answers given without a task are written here, and their events'
    // names kept in here, reusing their room from query to query.
    let mut scratch = Scratch::default();
    loop {
        tokio::select! {
            _ = shutdown.fired() => break,
            r = server.udp.readable() => match r.and_then(|()| inbox.recv(&server.udp)) {
                Ok(n) => {
                    // Up to UDP_BURST packets per read (recvmmsg), each
                    // decided and logged on its own; the answers given
                    // without waiting go out together (sendmmsg) once the
                    // batch is done. Then the select looks at accepts and
                    // the shutdown again. A burst does not charge tokio's
                    // cooperative budget per packet: doing so was measured
                    // (callgrind, denied queries, A/B twice) at 7.2k ->
                    // 8.6-9.2k instructions per query, the forced yields
                    // parking and waking the other worker.
                    for i in 0..n {
                        let (pkt, src) = inbox.get(i);
                        server.udp_query(pkt, src, &mut tasks, &mut scratch, &mut outbox).await;
                    }
                    outbox.flush(&server.udp);
                    // A burst can spawn up to UDP_BURST upstream tasks and
                    // the join branch below takes one per pass: finished
                    // tasks (their in-flight slots already returned) would
                    // pile up under a steady flood. Reap them all here.
                    while tasks.try_join_next().is_some() {}
                }
                // Readiness was stale: wait again.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // ICMP errors for earlier replies and the like: not fatal.
                Err(_) => tokio::time::sleep(UDP_ERROR_PAUSE).await,
            },
            r = tcp.accept() => match r {
                Ok((stream, src)) => server.tcp_accepted(stream, src, &shutdown, &mut tasks),
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    let _ = timeout(DRAIN_TIMEOUT, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.shutdown().await;
    Ok(())
}

/// What the receive loops share.
struct Loops {
    handler: Arc<Handler>,
    /// Queries being answered, in all and per client.
    queries: Arc<Limiter>,
    /// TCP connections open, in all and per client.
    conns: Arc<Limiter>,
    udp: Arc<UdpSocket>,
}

impl Loops {
    /// One UDP packet. Denied and cached answers wait on nothing: they are
    /// answered here ([`Handler::answer_now`], into `out`), without a copy
    /// of the packet or a task per packet (a spawn, a JoinSet slot and a
    /// scheduler pass). A query that must wait for an upstream continues in
    /// a task. Past the client's share, the refusal is answered inline: no
    /// task, no upstream.
    async fn udp_query(
        &self,
        raw: &[u8],
        src: SocketAddr,
        tasks: &mut JoinSet<()>,
        scratch: &mut Scratch,
        outbox: &mut Outbox,
    ) {
        let (policy, client) = self.handler.who(src.ip());
        // Answered at once, a query holds its slot only while this runs (no
        // await): whether the client has one free is all that matters, and
        // looking costs no insert and no removal.
        let overloaded = !self.queries.has_room(&policy, client, src.ip());
        if let Now::Answered = self.handler.answer_now(
            raw,
            src,
            Protocol::Udp,
            overloaded,
            (policy, client),
            scratch,
        ) {
            outbox.push(&scratch.out, src);
            return;
        }
        let permit = self
            .queries
            .try_acquire_share(&self.handler.policy, src.ip());
        let raw = raw.to_vec();
        let Some(permit) = permit else {
            if let Some(bytes) = self.handler.process(raw, src, Protocol::Udp, true).await {
                outbox.push(&bytes, src);
            }
            return;
        };
        let h = self.handler.clone();
        let mut query = Box::pin(async move { h.process(raw, src, Protocol::Udp, false).await });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match query.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(reply) => {
                drop(permit);
                if let Some(bytes) = reply {
                    outbox.push(&bytes, src);
                }
            }
            std::task::Poll::Pending => {
                let sock = self.udp.clone();
                tasks.spawn(async move {
                    let reply = query.await;
                    drop(permit);
                    if let Some(bytes) = reply {
                        let _ = sock.send_to(&bytes, src).await;
                    }
                });
            }
        }
    }

    /// One TCP connection, served on its own task while the client's share
    /// of connections lasts (else closed at once).
    fn tcp_accepted(
        &self,
        stream: TcpStream,
        src: SocketAddr,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) {
        let Some(permit) = self.conns.try_acquire(src.ip()) else {
            return;
        };
        let (h, q, sd) = (self.handler.clone(), self.queries.clone(), shutdown.clone());
        tasks.spawn(async move {
            tcp_connection(h, q, stream, src, sd).await;
            drop(permit);
        });
    }
}

/// Whether sending to `up` reaches our own listener at `listen`.
fn is_self(listen: SocketAddr, up: SocketAddr) -> bool {
    let (l, u) = (
        crate::policy::canonical_ip(listen.ip()),
        crate::policy::canonical_ip(up.ip()),
    );
    listen.port() == up.port()
        && (l == u || (l.is_unspecified() && (u.is_loopback() || u.is_unspecified())))
}

/// One TCP connection: length-prefixed queries answered in order.
async fn tcp_connection(
    handler: Arc<Handler>,
    queries: Arc<Limiter>,
    mut stream: TcpStream,
    src: SocketAddr,
    shutdown: Shutdown,
) {
    loop {
        if shutdown.is_fired() {
            return;
        }
        let mut len = [0u8; 2];
        match timeout(TCP_IDLE_TIMEOUT, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let mut raw = vec![0u8; u16::from_be_bytes(len) as usize];
        match timeout(TCP_IO_TIMEOUT, stream.read_exact(&mut raw)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let reply = match queries.try_acquire_share(&handler.policy, src.ip()) {
            Some(_permit) => handler.process(raw, src, Protocol::Tcp, false).await,
            None => handler.process(raw, src, Protocol::Tcp, true).await,
        };
        let Some(bytes) = reply else { continue };
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        framed.extend_from_slice(&bytes);
        match timeout(TCP_IO_TIMEOUT, stream.write_all(&framed)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}

/// Counts work in flight, in all and per client.
struct Limiter {
    global: Arc<Semaphore>,
    per_client: Mutex<HashMap<Holder, usize>>,
    per_client_max: usize,
}

/// Who holds a query's slot: the named client, else the address.
fn holder(policy: &Policy, client: Option<ClientIdx>, ip: IpAddr) -> Holder {
    match policy.client_id(client) {
        Some(id) => Holder::Named(id.clone()),
        None => Holder::addr(ip),
    }
}

/// A slot in a [`Limiter`], released on drop.
struct Permit {
    _global: OwnedSemaphorePermit,
    limiter: Arc<Limiter>,
    key: Holder,
}

impl Limiter {
    fn new(global: usize, per_client: usize) -> Arc<Limiter> {
        Arc::new(Limiter {
            global: Arc::new(Semaphore::new(global)),
            per_client: Mutex::new(HashMap::new()),
            per_client_max: per_client,
        })
    }

    /// A slot for client address `ip`.
    fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<Permit> {
        self.try_acquire_for(Holder::addr(ip), self.per_client_max)
    }

    /// A slot for the client `policy` names by source `ip` (else the
    /// address), within the share `settings.limits` leaves it.
    fn try_acquire_share(self: &Arc<Self>, policy: &PolicyHandle, ip: IpAddr) -> Option<Permit> {
        let p = policy.snapshot();
        let client = p.identify(ip, None).ok().flatten();
        self.try_acquire_for(holder(&p, client, ip), self.share(&p))
    }

    /// Whether [`Limiter::try_acquire_share`] would give `client` (by
    /// source `ip`) a slot now, without taking one. With nothing in flight
    /// (every query answered at once) it hashes nothing.
    fn has_room(&self, policy: &Policy, client: Option<ClientIdx>, ip: IpAddr) -> bool {
        if self.global.available_permits() == 0 {
            return false;
        }
        let map = lock(&self.per_client);
        if map.is_empty() {
            return true;
        }
        let held = map.get(&holder(policy, client, ip)).copied().unwrap_or(0);
        held < self.share(policy)
    }

    /// The slots one client may hold under `policy`.
    fn share(&self, policy: &Policy) -> usize {
        self.per_client_max
            .min(policy.settings.limits.connections_per_client as usize)
    }

    fn try_acquire_for(self: &Arc<Self>, key: Holder, max: usize) -> Option<Permit> {
        let global = self.global.clone().try_acquire_owned().ok()?;
        let mut map = lock(&self.per_client);
        let n = map.entry(key.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Permit {
            _global: global,
            limiter: self.clone(),
            key,
        })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut map = lock(&self.limiter.per_client);
        if let std::collections::hash_map::Entry::Occupied(mut n) = map.entry(self.key.clone()) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }
}

/// Answers queries: the one place a DNS packet becomes a decision.
pub(super) struct Handler {
    policy: Arc<PolicyHandle>,
    resolver: Arc<Resolver>,
    recorder: Recorder,
    /// Allowed answers as sent, for the queries that ask them again.
    wire: WireCache,
}

/// What the answers given at once reuse from query to query: the bytes
/// sent, and the room of the event's two names (`qname`, `host`).
pub(super) struct Scratch {
    out: Vec<u8>,
    qname: String,
    host: String,
}

impl Default for Scratch {
    /// Room for the longest name and a typical answer from the start.
    fn default() -> Scratch {
        Scratch {
            out: Vec::with_capacity(512),
            qname: String::with_capacity(256),
            host: String::with_capacity(256),
        }
    }
}

impl Scratch {
    /// No room yet: for one query (TCP, the general path).
    fn empty() -> Scratch {
        Scratch {
            out: Vec::new(),
            qname: String::new(),
            host: String::new(),
        }
    }

    /// Takes the names' room back from a recorded (or dropped) event.
    fn keep(&mut self, mut ev: Event) {
        if let Some(s) = ev.qname.take() {
            self.qname = s;
        }
        if let Some(s) = ev.host.take() {
            self.host = s;
        }
    }
}

/// `text` in the room of `spare` (taken from it): no allocation once it
/// has held a name as long.
fn reuse(spare: &mut String, text: &str) -> String {
    let mut s = std::mem::take(spare);
    s.clear();
    s.push_str(text);
    s
}

/// Notes in `ev` the policy's mode and the client a query comes from.
fn note_who(ev: &mut Event, policy: &Policy, client: Option<ClientIdx>) {
    ev.mode = policy.settings.mode;
    if let Some(id) = policy.client_id(client) {
        ev.client = id.clone();
    }
}

/// What [`Handler::answer_now`] did with a packet.
enum Now {
    /// Decided, logged, and its answer written.
    Answered,
    /// Nothing done: it takes the general or the waiting path.
    Later,
}

/// What to answer, before it is encoded.
struct Reply {
    rcode: ResponseCode,
    records: Vec<Record>,
    authority: Vec<Record>,
    /// Extended DNS Error: INFO-CODE and EXTRA-TEXT.
    ede: Option<(u16, Cow<'static, str>)>,
}

impl Reply {
    fn error(rcode: ResponseCode, ede: Option<(u16, Cow<'static, str>)>) -> Reply {
        Reply {
            rcode,
            records: Vec::new(),
            authority: Vec::new(),
            ede,
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response_handle: R,
    ) -> ResponseInfo {
        self.respond(request, response_handle, false).await
    }
}

impl Handler {
    /// One packet in, the bytes to send back (if any) out; one event recorded.
    async fn process(
        &self,
        raw: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
        overloaded: bool,
    ) -> Option<Vec<u8>> {
        let mut scratch = Scratch::empty();
        let who = self.who(src.ip());
        if let Now::Answered = self.answer_now(&raw, src, protocol, overloaded, who, &mut scratch) {
            return Some(scratch.out);
        }
        if let Some(q) = fast::parse(&raw) {
            // A name that is not a host name goes the general way, which
            // tells a tunnel's data from a malformed name.
            if let Ok(host) = parse_host(q.host_text(&mut [0; 256])) {
                return Some(
                    self.respond_fast(&q, host, &raw, src, protocol, overloaded)
                        .await,
                );
            }
        }
        // Boxed: the rare path's state stays out of every query's future.
        Box::pin(self.process_general(raw, src, protocol, overloaded)).await
    }

    /// [`Handler::process`] through hickory's `Request`: every shape of
    /// packet, malformed ones included.
    async fn process_general(
        &self,
        raw: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
        overloaded: bool,
    ) -> Option<Vec<u8>> {
        let header = match Header::read(&mut BinDecoder::new(&raw)) {
            Ok(h) => h,
            Err(_) => {
                self.record_malformed(src, "shorter than a DNS header; not answered", None);
                return None;
            }
        };
        if header.metadata.message_type == MessageType::Response {
            // Answering responses would make us a reflector.
            self.record_malformed(src, "a DNS response, not a query; not answered", None);
            return None;
        }
        let request = match Request::from_bytes(raw, src, protocol) {
            Ok(r) => r,
            Err(e) => {
                let mut m = Message::error_msg(
                    header.metadata.id,
                    header.metadata.op_code,
                    ResponseCode::FormErr,
                );
                m.metadata.recursion_desired = header.metadata.recursion_desired;
                self.record_malformed(
                    src,
                    &format!("undecodable query: {e}"),
                    Some(ResponseCode::FormErr),
                );
                return m.to_vec().ok();
            }
        };
        let max_size = match protocol {
            Protocol::Udp => request.max_payload().clamp(512, EDNS_PAYLOAD),
            _ => u16::MAX,
        };
        let sink = Encoded {
            max_size,
            out: Arc::new(Mutex::new(None)),
        };
        if overloaded {
            self.respond(&request, sink.clone(), true).await;
        } else {
            self.handle_request::<_, TokioTime>(&request, sink.clone())
                .await;
        }
        let bytes = lock(&sink.out).take();
        bytes
    }

    fn record_malformed(&self, src: SocketAddr, note: &str, rcode: Option<ResponseCode>) {
        let mut ev = Event::new(Proto::Dns, src);
        let (_policy, _client) = self.attribute(&mut ev, src.ip());
        ev.set_denied(Reason::Malformed);
        ev.note = Some(note.to_string());
        ev.rcode = rcode.map(rcode_name);
        self.recorder.record(ev);
    }

    async fn respond<R: ResponseHandler>(
        &self,
        request: &Request,
        mut handle: R,
        overloaded: bool,
    ) -> ResponseInfo {
        let mut ev = Event::new(Proto::Dns, request.src());
        let reply = self.answer(request, &mut ev, overloaded).await;
        let info = match &reply {
            Some(r) => send(request, r, &mut handle).await,
            None => ResponseInfo::from(Header {
                metadata: Metadata::response_from_request(&request.metadata),
                counts: HeaderCounts::default(),
            }),
        };
        ev.rcode = reply.map(|r| rcode_name(r.rcode));
        self.recorder.record(ev);
        info
    }

    /// Decides and resolves one query, filling in the event as it goes.
    async fn answer(&self, request: &Request, ev: &mut Event, overloaded: bool) -> Option<Reply> {
        let meta = &request.metadata;
        let (policy, client) = self.attribute(ev, request.src().ip());
        let questions = request.queries.queries();
        if let Some(q) = questions.first() {
            ev.qname = Some(display_name(q.original().name()));
            ev.qtype = Some(qtype_mnemonic(u16::from(q.query_type())));
        }
        if meta.message_type == MessageType::Response {
            ev.set_denied(Reason::Malformed);
            ev.note = Some("a DNS response, not a query; not answered".into());
            return None;
        }
        if let Some(r) = self.refuse_early(ev, overloaded) {
            return Some(r);
        }
        if meta.op_code != OpCode::Query {
            ev.set_denied(Reason::Malformed);
            ev.note = Some(format!("opcode {:?} is not answered", meta.op_code));
            return Some(Reply::error(ResponseCode::Refused, None));
        }
        let [q] = questions else {
            ev.set_denied(Reason::Malformed);
            ev.note = Some(format!(
                "{} questions in one query; exactly one is answered",
                questions.len()
            ));
            return Some(Reply::error(ResponseCode::FormErr, None));
        };
        if q.query_class() != DNSClass::IN {
            ev.set_denied(Reason::Malformed);
            ev.note = Some(format!("class {} is not answered", q.query_class()));
            return Some(Reply::error(ResponseCode::Refused, None));
        }
        let qtype = u16::from(q.query_type());
        let host = match host_of(q.original().name()) {
            Ok(h) => h,
            Err(e) => {
                let now = unix_now();
                return Some(self.bad_name(&policy, client, q.original().name(), &e, ev, now));
            }
        };
        ev.qname = Some(host.to_string());
        Some(
            self.answer_host(&policy, client, host, qtype, ev, request.src().ip())
                .await
                .0,
        )
    }

    /// The policy snapshot a query is decided by, and the client it comes
    /// from (by source address), noted in `ev` with the policy's mode.
    fn attribute(&self, ev: &mut Event, src: IpAddr) -> (Arc<Policy>, Option<ClientIdx>) {
        let (policy, client) = self.who(src);
        note_who(ev, &policy, client);
        (policy, client)
    }

    /// The policy snapshot a query is decided by, and the client it comes
    /// from (by source address).
    fn who(&self, src: IpAddr) -> (Arc<Policy>, Option<ClientIdx>) {
        let policy = self.policy.snapshot();
        let client = policy.identify(src, None).unwrap_or(None);
        (policy, client)
    }

    /// Answers at once, into `out`, a query of the common shape that needs
    /// no upstream: refused before the policy, denied by it, or allowed
    /// with its answer in the wire cache. The decision is the same
    /// [`decide_query`] and the budget the same [`Handler::spend_budget`]
    /// as on every other path, both before the cache is read; the event is
    /// recorded here. Anything else returns [`Now::Later`] having spent
    /// nothing, recorded nothing and changed nothing.
    fn answer_now(
        &self,
        raw: &[u8],
        src: SocketAddr,
        protocol: Protocol,
        overloaded: bool,
        (policy, client): (Arc<Policy>, Option<ClientIdx>),
        scratch: &mut Scratch,
    ) -> Now {
        let Some(q) = fast::parse(raw) else {
            return Now::Later;
        };
        let Ok(host) = parse_host(q.host_text(&mut [0; 256])) else {
            return Now::Later;
        };
        let max_size = max_size(&q, protocol);
        let mut ev = Event::new(Proto::Dns, src);
        note_who(&mut ev, &policy, client);
        ev.qname = Some(reuse(&mut scratch.qname, host.as_str()));
        ev.qtype = Some(qtype_mnemonic(q.qtype));
        let out = &mut scratch.out;
        let reply = match self.refuse_early(&mut ev, overloaded) {
            Some(r) => r,
            None => {
                let now = unix_now();
                ev.host = Some(reuse(&mut scratch.host, host.as_str()));
                let (d, host) = decide_query(&policy, client, host, q.qtype, &mut ev, now);
                if !d.is_allowed() {
                    deny(&policy, d.reason)
                } else {
                    if self.resolver.remembering_answers() {
                        scratch.keep(ev);
                        return Now::Later;
                    }
                    let key = Key::new(&q, d.exception);
                    let at = std::time::Instant::now();
                    let Some(rcode) = self.wire.answer(&policy, &key, &q, max_size, at, out) else {
                        scratch.keep(ev);
                        return Now::Later;
                    };
                    match self.spend_budget(&policy, client, &host, &d, &mut ev, now) {
                        Err(refused) => refused,
                        Ok(()) => {
                            self.resolver.count_cache_hit();
                            ev.rcode = Some(rcode_name(ResponseCode::from_low(rcode as u8)));
                            drop(policy);
                            self.recorder.record_mut(&mut ev);
                            scratch.keep(ev);
                            return Now::Answered;
                        }
                    }
                }
            }
        };
        drop(policy);
        let ede = reply.ede.as_ref().map(|(c, t)| (*c, t.as_ref()));
        let fits = fast::encode_into(
            out,
            &q,
            reply.rcode,
            &reply.records,
            &reply.authority,
            ede,
            max_size,
            EDNS_PAYLOAD,
        );
        if !fits {
            // A refusal is a header, the question (at most 259 bytes) and
            // an EDE: it fits 512 bytes, and without the EDE it surely does.
            fast::encode_into(out, &q, reply.rcode, &[], &[], None, max_size, EDNS_PAYLOAD);
        }
        ev.rcode = Some(rcode_name(reply.rcode));
        self.recorder.record_mut(&mut ev);
        scratch.keep(ev);
        Now::Answered
    }

    /// The common shape ([`fast::parse`]): decided by the same
    /// [`Handler::answer_host`], answered without building hickory messages.
    async fn respond_fast(
        &self,
        q: &fast::Query<'_>,
        host: Host,
        raw: &[u8],
        src: SocketAddr,
        protocol: Protocol,
        overloaded: bool,
    ) -> Vec<u8> {
        let mut ev = Event::new(Proto::Dns, src);
        let (policy, client) = self.attribute(&mut ev, src.ip());
        ev.qname = Some(host.to_string());
        ev.qtype = Some(qtype_mnemonic(q.qtype));
        let (reply, keep) = match self.refuse_early(&mut ev, overloaded) {
            Some(r) => (r, None),
            None => {
                self.answer_host(&policy, client, host, q.qtype, &mut ev, src.ip())
                    .await
            }
        };
        let max_size = max_size(q, protocol);
        let ede = reply.ede.as_ref().map(|(c, t)| (*c, t.as_ref()));
        let bytes = match fast::encode(
            q,
            reply.rcode,
            &reply.records,
            &reply.authority,
            ede,
            max_size,
            EDNS_PAYLOAD,
        ) {
            Some(b) => {
                if let Some(k) = keep {
                    if !self.resolver.remembering_answers() {
                        let key = Key::new(q, k.exception);
                        self.wire
                            .store(&policy, &key, &b, k.ttl, std::time::Instant::now());
                    }
                }
                b
            }
            // Too long for the client's UDP size: hickory truncates it.
            None => self.encode_general(raw, src, protocol, &reply).await,
        };
        drop(policy);
        ev.rcode = Some(rcode_name(reply.rcode));
        self.recorder.record(ev);
        bytes
    }

    /// Encodes `reply` through hickory, for answers [`fast::encode`] declines.
    async fn encode_general(
        &self,
        raw: &[u8],
        src: SocketAddr,
        protocol: Protocol,
        reply: &Reply,
    ) -> Vec<u8> {
        let servfail = || {
            let mut m = Message::error_msg(0, OpCode::Query, ResponseCode::ServFail);
            if let Some(id) = raw.get(..2) {
                m.metadata.id = u16::from_be_bytes([id[0], id[1]]);
            }
            m.to_vec().unwrap_or_default()
        };
        let Ok(request) = Request::from_bytes(raw.to_vec(), src, protocol) else {
            return servfail();
        };
        let max_size = match protocol {
            Protocol::Udp => request.max_payload().clamp(512, EDNS_PAYLOAD),
            _ => u16::MAX,
        };
        let mut sink = Encoded {
            max_size,
            out: Arc::new(Mutex::new(None)),
        };
        send(&request, reply, &mut sink).await;
        let out = lock(&sink.out).take();
        out.unwrap_or_else(servfail)
    }

    /// Refusals that come before the policy: too many queries in flight
    /// from this client, or a decision log that cannot be written.
    fn refuse_early(&self, ev: &mut Event, overloaded: bool) -> Option<Reply> {
        if overloaded {
            ev.set_denied(Reason::Overloaded);
            return Some(Reply::error(
                ResponseCode::Refused,
                Some((EDE_OTHER, ede_text(Reason::Overloaded))),
            ));
        }
        if !self.recorder.accepting() {
            // A denial like any other (DESIGN "DNS answers": `REFUSED`, EDE
            // 15 naming the reason), but never `NXDOMAIN` whatever
            // `deny_rcode` says: an outage says nothing about the name,
            // and a negative answer would be cached past it.
            ev.set_denied(Reason::LogUnavailable);
            return Some(Reply::error(
                ResponseCode::Refused,
                Some((EDE_BLOCKED, ede_text(Reason::LogUnavailable))),
            ));
        }
        None
    }

    /// Decides a well-formed question for `host` and resolves it when
    /// allowed: the policy, the tunnel budget, the upstream answer and its
    /// rebinding filter. Shared by both wire paths.
    async fn answer_host<'p>(
        &self,
        policy: &'p Policy,
        client: Option<ClientIdx>,
        host: Host,
        qtype: u16,
        ev: &mut Event,
        src: IpAddr,
    ) -> (Reply, Option<Keep<'p>>) {
        let now = unix_now();
        ev.host = Some(host.to_string());
        let (d, host) = decide_query(policy, client, host, qtype, ev, now);
        if !d.is_allowed() {
            return (deny(policy, d.reason), None);
        }
        if let Err(refused) = self.spend_budget(policy, client, &host, &d, ev, now) {
            return (refused, None);
        }
        // A cached answer waits on nothing; the upstream exchange's state
        // is boxed so it costs only the queries that need it.
        let lookup = match self.resolver.cached(&host, qtype) {
            Some(hit) => Ok(hit),
            None => {
                let s = &policy.settings.dns;
                Box::pin(self.resolver.resolve(&host, qtype, s, &mut ev.dns_attempts)).await
            }
        };
        let lookup = match lookup {
            Ok(l) => l,
            Err(e) => {
                ev.error = Some(e.to_string());
                return (Reply::error(ResponseCode::ServFail, None), None);
            }
        };
        match rebinding_filter(policy, &d, &lookup.answer.records, ev) {
            Ok((records, clean)) => {
                // Only an answer nothing was removed from (and nothing
                // noted about) is the same for the next query to get.
                let keep = clean.then_some(Keep {
                    exception: d.exception,
                    ttl: lookup.ttl,
                });
                (self.reply(records, &lookup, &host, qtype, src), keep)
            }
            Err(refused) => (refused, None),
        }
    }

    /// The client's tunnel budget, for a name an exception allowed: a name
    /// that spends too much is refused (`dns_tunnel`, in either mode:
    /// [`enforced`]), one that comes close is noted.
    fn spend_budget(
        &self,
        policy: &Policy,
        client: Option<ClientIdx>,
        host: &Host,
        d: &Decision<'_>,
        ev: &mut Event,
        now: i64,
    ) -> Result<(), Reply> {
        let Some(e) = d.exception else { return Ok(()) };
        let (outcome, note) = self.resolver.tunnel_assess(policy, client, host, e, now);
        match outcome {
            TunnelOutcome::Ok => {}
            TunnelOutcome::Alert => ev.note = note,
            TunnelOutcome::Block => {
                let mode = policy.settings.mode;
                let blocked = Decision::deny(Reason::DnsTunnel, d.exception).under(mode);
                ev.set_decision(&blocked, mode);
                ev.note = note;
                if !blocked.is_allowed() {
                    return Err(deny(policy, Reason::DnsTunnel));
                }
            }
        }
        Ok(())
    }

    /// The answer for an allowed name: every record at the cache's TTL, and
    /// its addresses remembered for transparent capture, which decides a
    /// connection that carries no name by the allowed name its client
    /// resolved to that address here.
    fn reply(
        &self,
        records: Vec<Record>,
        lookup: &Lookup,
        host: &Host,
        qtype: u16,
        src: IpAddr,
    ) -> Reply {
        let answer = &lookup.answer;
        // Under transparent capture: the name's own address (`inside`).
        let mut records = self
            .resolver
            .inside_records(records, host, qtype, answer.rcode);
        let mut authority = answer.authority.clone();
        for r in records.iter_mut().chain(authority.iter_mut()) {
            r.ttl = lookup.ttl;
        }
        for ip in records.iter().filter_map(|r| r.data.ip_addr()) {
            self.resolver.remember_answer(src, ip, host, lookup.ttl);
        }
        Reply {
            rcode: answer.rcode,
            records,
            authority,
            ede: None,
        }
    }

    /// A name that is not a host name: `dns_tunnel` when it sits below a
    /// wildcard this client may use (data shaped to fit), else `malformed`.
    fn bad_name(
        &self,
        policy: &Policy,
        client: Option<ClientIdx>,
        name: &Name,
        err: &HostError,
        ev: &mut Event,
        now: i64,
    ) -> Reply {
        let labels: Vec<&[u8]> = name.iter().collect();
        if labels.is_empty() {
            ev.set_denied(Reason::NoException);
            return deny(policy, Reason::NoException);
        }
        let under = if policy.settings.dns.tunnel.action == TunnelAction::Off {
            None
        } else {
            valid_tail(&labels).and_then(|(tail, above)| {
                policy
                    .exceptions
                    .iter()
                    .find(|e| applies(e, client, now) && under_wildcard(e, &tail, above))
                    .map(|e| (e, tail, above))
            })
        };
        match under {
            Some((e, tail, above)) => {
                let d = Decision::deny(Reason::DnsTunnel, Some(e)).under(policy.settings.mode);
                debug_assert!(
                    !d.is_allowed(),
                    "a name that is not a host name is never answered"
                );
                ev.set_decision(&d, policy.settings.mode);
                let mut note = format!(
                    "dns tunnel: name below an allowed wildcard is not a host name ({err})"
                );
                if let Some(cooling) = self
                    .resolver
                    .tunnel_strike(policy, client, e, &tail, above, now)
                {
                    note = format!("{note}; {cooling}");
                }
                ev.note = Some(note);
                self.resolver
                    .metrics()
                    .dns_tunnel
                    .with_label_values(&["block"])
                    .inc();
                deny(policy, Reason::DnsTunnel)
            }
            None => {
                ev.set_denied(Reason::Malformed);
                ev.note = Some(format!("not a host name: {err}"));
                deny(policy, Reason::Malformed)
            }
        }
    }
}

fn applies(e: &Exception, client: Option<ClientIdx>, now: i64) -> bool {
    !e.is_expired(now)
        && match e.clients() {
            None => true,
            Some(list) => client.is_some_and(|c| list.contains(&c)),
        }
}

/// An allowed answer that the wire cache may keep: the exception that
/// answered it, and the TTL its records were sent with.
struct Keep<'p> {
    exception: Option<&'p Exception>,
    ttl: u32,
}

/// The largest answer `q` may get over `protocol`.
fn max_size(q: &fast::Query<'_>, protocol: Protocol) -> u16 {
    match protocol {
        Protocol::Udp => q.max_payload().clamp(512, EDNS_PAYLOAD),
        _ => u16::MAX,
    }
}

/// The one decision for a query, noted in `ev`. The name goes into the
/// policy's request and comes back: no copy of it is made.
fn decide_query<'p>(
    policy: &'p Policy,
    client: Option<ClientIdx>,
    host: Host,
    qtype: u16,
    ev: &mut Event,
    now: i64,
) -> (Decision<'p>, Host) {
    let target = Target::Name(host);
    let req = PolicyRequest {
        proto: Proto::Dns,
        client,
        target: &target,
        port: 53,
        method: None,
        path: None,
        qtype: Some(qtype),
        can_intercept: false,
    };
    let d = policy.decide(&req, now);
    ev.set_decision(&d, policy.settings.mode);
    let Target::Name(host) = target else {
        unreachable!("made as a name above")
    };
    (d, host)
}

/// Rebinding protection: the answer's addresses that the exception may
/// not reach are removed; an answer made only of them is refused
/// (`private_address`). Both in either mode ([`enforced`]), as the proxy
/// refuses to dial them.
fn rebinding_filter(
    policy: &Policy,
    d: &Decision<'_>,
    answer: &[Record],
    ev: &mut Event,
) -> Result<(Vec<Record>, bool), Reply> {
    let mut records = answer.to_vec();
    let filtered = filter_addresses(policy, d.exception, answer);
    if filtered.refused.is_empty() {
        return Ok((records, true));
    }
    let mode = policy.settings.mode;
    let report = !enforced(mode, Reason::PrivateAddress);
    let list = filtered
        .refused
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let cidrs = "non-public addresses outside the exception's cidrs";
    if filtered.addresses > 0 && filtered.kept_addresses == 0 {
        let refused = Decision::deny(Reason::PrivateAddress, d.exception).under(mode);
        ev.set_decision(&refused, mode);
        ev.add_note(Some(format!(
            "every address is non-public and outside the exception's cidrs: {list}"
        )));
        if !report {
            return Err(deny(policy, Reason::PrivateAddress));
        }
    } else if report {
        ev.add_note(Some(format!("would remove {cidrs}: {list}")));
    } else {
        ev.add_note(Some(format!("removed {cidrs}: {list}")));
        records.retain(|r| refused_by(policy, d.exception, r).is_empty());
    }
    Ok((records, false))
}

/// An Extended DNS Error's text: `egressd: <reason>`, made once per reason.
fn ede_text(reason: Reason) -> Cow<'static, str> {
    static TEXTS: LazyLock<Vec<(Reason, String)>> = LazyLock::new(|| {
        Reason::ALL
            .iter()
            .map(|r| (*r, format!("egressd: {}", r.as_str())))
            .collect()
    });
    match TEXTS.iter().find(|(r, _)| *r == reason) {
        Some((_, text)) => Cow::Borrowed(text.as_str()),
        None => Cow::Owned(format!("egressd: {}", reason.as_str())),
    }
}

/// The answer to a denied query.
fn deny(policy: &Policy, reason: Reason) -> Reply {
    let rcode = match policy.settings.dns.deny_rcode {
        DenyRcode::Refused => ResponseCode::Refused,
        DenyRcode::Nxdomain => ResponseCode::NXDomain,
    };
    Reply::error(rcode, Some((EDE_BLOCKED, ede_text(reason))))
}

/// What rebinding protection finds in an answer.
struct Filtered {
    /// Addresses the exception may not reach, each once.
    refused: Vec<IpAddr>,
    /// A/AAAA records in the answer, and how many of them may stay.
    addresses: usize,
    kept_addresses: usize,
}

/// Finds the A/AAAA records the exception may not reach, and HTTPS/SVCB
/// records whose address hints name such addresses (a client may connect to
/// a hint). Copies nothing: the caller removes records only when needed.
fn filter_addresses(
    policy: &Policy,
    exception: Option<&Exception>,
    records: &[Record],
) -> Filtered {
    let mut f = Filtered {
        refused: Vec::new(),
        addresses: 0,
        kept_addresses: 0,
    };
    for r in records {
        let bad = refused_by(policy, exception, r);
        if matches!(r.data, RData::A(_) | RData::AAAA(_)) {
            f.addresses += 1;
            if bad.is_empty() {
                f.kept_addresses += 1;
            }
        }
        for ip in bad {
            if !f.refused.contains(&ip) {
                f.refused.push(ip);
            }
        }
    }
    f
}

/// The addresses in `r` (an A/AAAA record's, an HTTPS/SVCB record's hints)
/// that the exception may not reach.
fn refused_by(policy: &Policy, exception: Option<&Exception>, r: &Record) -> Vec<IpAddr> {
    match &r.data {
        RData::A(_) | RData::AAAA(_) => {
            let ip = r.data.ip_addr().expect("address record");
            if policy.addr_allowed(exception, ip) {
                Vec::new()
            } else {
                vec![ip]
            }
        }
        RData::HTTPS(h) => svcb_hints(&h.0)
            .filter(|ip| !policy.addr_allowed(exception, *ip))
            .collect(),
        RData::SVCB(s) => svcb_hints(s)
            .filter(|ip| !policy.addr_allowed(exception, *ip))
            .collect(),
        _ => Vec::new(),
    }
}

fn svcb_hints(s: &SVCB) -> impl Iterator<Item = IpAddr> + '_ {
    s.svc_params.iter().flat_map(|(_, v)| {
        let ips: Vec<IpAddr> = match v {
            SvcParamValue::Ipv4Hint(h) => h.0.iter().map(|a| IpAddr::V4(a.0)).collect(),
            SvcParamValue::Ipv6Hint(h) => h.0.iter().map(|a| IpAddr::V6(a.0)).collect(),
            _ => Vec::new(),
        };
        ips
    })
}

/// Encodes the reply with the request's question, as sent (0x20 case kept).
async fn send<R: ResponseHandler>(
    request: &Request,
    reply: &Reply,
    handle: &mut R,
) -> ResponseInfo {
    let mut meta = Metadata::response_from_request(&request.metadata);
    meta.response_code = reply.rcode;
    meta.recursion_available = true;
    // EDNS only to a client that spoke it (RFC 6891 §7).
    let edns = request.edns.as_ref().map(|_| {
        let mut e = Edns::new();
        e.set_max_payload(EDNS_PAYLOAD);
        if let Some((code, text)) = &reply.ede {
            let mut data = code.to_be_bytes().to_vec();
            data.extend_from_slice(text.as_bytes());
            e.options_mut().insert(EdnsOption::Unknown(EDNS_EDE, data));
        }
        e
    });
    let mut builder = MessageResponseBuilder::from_message_request(request);
    if let Some(e) = &edns {
        builder.edns(e);
    }
    let response = builder.build(meta, reply.records.iter(), reply.authority.iter(), [], []);
    match handle.send_response(response).await {
        Ok(info) => info,
        Err(_) => ResponseInfo::from(Header {
            metadata: meta,
            counts: HeaderCounts::default(),
        }),
    }
}

/// A [`ResponseHandler`] that encodes the response (truncating to `max_size`
/// as a UDP reply must) and keeps the bytes for the listener to send.
#[derive(Clone)]
struct Encoded {
    max_size: u16,
    out: Arc<Mutex<Option<Vec<u8>>>>,
}

#[async_trait::async_trait]
impl ResponseHandler for Encoded {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let meta = *response.metadata();
        let mut buf = Vec::with_capacity(512);
        let emitted = {
            let mut enc = BinEncoder::new(&mut buf);
            enc.set_max_size(self.max_size);
            response.destructive_emit(&mut enc)
        };
        let info = match emitted {
            Ok(info) => info,
            Err(_) => {
                // Could not encode: a bare SERVFAIL rather than silence.
                buf.clear();
                let mut m = Message::error_msg(meta.id, meta.op_code, ResponseCode::ServFail);
                m.metadata.recursion_desired = meta.recursion_desired;
                buf = m.to_vec()?;
                ResponseInfo::from(Header {
                    metadata: m.metadata,
                    counts: HeaderCounts::default(),
                })
            }
        };
        *lock(&self.out) = Some(buf);
        Ok(info)
    }
}

/// Whether a byte may appear in a host name label.
fn host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// The question name as a [`Host`]: labels of `[A-Za-z0-9_-]` only (a label
/// holding a `.` or any other byte is refused, not reinterpreted).
fn host_of(name: &Name) -> Result<Host, HostError> {
    let mut s = String::with_capacity(name.len());
    for (i, label) in name.iter().enumerate() {
        if let Some(b) = label.iter().find(|b| !host_byte(**b)) {
            return Err(HostError::BadChar(*b as char));
        }
        if i > 0 {
            s.push('.');
        }
        s.push_str(std::str::from_utf8(label).expect("checked ASCII"));
    }
    parse_host(&s)
}

/// The longest run of rightmost labels that forms a valid host name, and how
/// many labels stand left of it.
fn valid_tail(labels: &[&[u8]]) -> Option<(String, usize)> {
    (1..labels.len()).find_map(|i| {
        if labels[i..].iter().any(|l| !l.iter().all(|b| host_byte(*b))) {
            return None;
        }
        let joined: Vec<&str> = labels[i..]
            .iter()
            .map(|l| std::str::from_utf8(l).expect("ASCII"))
            .collect();
        parse_host(&joined.join("."))
            .ok()
            .map(|h| (h.to_string(), i))
    })
}

/// A question name for the log: lower-case, no trailing dot, bytes that are
/// not printable ASCII (and `.` or `\` inside a label) escaped as `\DDD`.
fn display_name(name: &Name) -> String {
    let mut s = String::new();
    for (i, label) in name.iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        for &b in label {
            if b.is_ascii_graphic() && b != b'.' && b != b'\\' {
                s.push(b.to_ascii_lowercase() as char);
            } else {
                s.push_str(&format!("\\{b:03}"));
            }
        }
    }
    if s.is_empty() {
        s.push('.');
    }
    s
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn name(labels: &[&[u8]]) -> Name {
        Name::from_labels(labels.iter().copied()).unwrap()
    }

    #[test]
    fn question_names() {
        assert_eq!(
            host_of(&name(&[b"WwW", b"Example", b"COM"]))
                .unwrap()
                .as_str(),
            "www.example.com"
        );
        assert_eq!(
            host_of(&name(&[b"_dmarc", b"example", b"com"]))
                .unwrap()
                .as_str(),
            "_dmarc.example.com"
        );
        for bad in [
            name(&[b"a.b", b"example", b"com"]),
            name(&[b"a b", b"example", b"com"]),
            name(&[b"a\0", b"com"]),
            name(&[b"caf\xc3\xa9", b"com"]),
            name(&[b"*", b"com"]),
        ] {
            assert!(host_of(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            display_name(&name(&[b"a.b", b"Ex\\", b"c\0m"])),
            "a\\046b.ex\\092.c\\000m"
        );
        assert_eq!(display_name(&Name::root()), ".");
    }

    #[test]
    fn tails() {
        let labels: Vec<&[u8]> = vec![b"bad label", b"x", b"cdn", b"test"];
        assert_eq!(valid_tail(&labels), Some(("x.cdn.test".to_string(), 1)));
        let labels: Vec<&[u8]> = vec![b"ok", b"bad!", b"cdn", b"test"];
        assert_eq!(valid_tail(&labels), Some(("cdn.test".to_string(), 2)));
        let labels: Vec<&[u8]> = vec![b"only"];
        assert_eq!(valid_tail(&labels), None);
    }

    /// A fake upstream on 127.0.0.1 answering every A query with two
    /// loopback addresses and a CNAME-free, SOA-free answer; AAAA empty.
    async fn fake_upstream() -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((n, src)) = sock.recv_from(&mut buf).await {
                let Ok(q) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut m = Message::response(q.metadata.id, OpCode::Query);
                m.metadata.recursion_available = true;
                m.add_queries(q.queries.clone());
                let query = &q.queries[0];
                if query.query_type() == hickory_proto::rr::RecordType::A {
                    for ip in [[127, 0, 0, 5], [127, 0, 0, 6]] {
                        m.add_answer(Record::from_rdata(
                            query.name().clone(),
                            300,
                            RData::A(std::net::Ipv4Addr::from(ip).into()),
                        ));
                    }
                }
                let _ = sock.send_to(&m.to_vec().unwrap(), src).await;
            }
        });
        addr
    }

    /// Both wire paths answer every query of the common shape alike: same
    /// header, question (0x20 case kept), records, EDNS and EDE, and the
    /// same decision-log line.
    #[tokio::test]
    async fn the_fast_path_answers_as_the_general_one() {
        use crate::log::{LogSink, LogTarget};
        use crate::metrics::Metrics;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let metrics = Metrics::new();
        let sink = LogSink::start(LogTarget::File(log.clone()), metrics.clone()).unwrap();
        let policy = crate::policy::from_yaml(
            "exceptions:\n\
             - id: ok\n  owner: t\n  reason: t\n  hosts: [allowed.test, '*.wild.test']\n  cidrs: [127.0.0.5/32]\n",
        )
        .unwrap();
        let h = Handler {
            policy: PolicyHandle::new(policy),
            resolver: Resolver::new(vec![fake_upstream().await], metrics.clone()),
            recorder: Recorder::new(sink.clone(), metrics),
            wire: WireCache::default(),
        };
        let src: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let q = super::fast::tests::query;
        let queries = [
            q(1, 0x0100, "denied.test", 1, None),
            q(2, 0x0100, "DeNiEd.TeSt", 1, Some(1232)),
            q(3, 0x0110, "x.denied.test", 28, Some(4096)),
            q(4, 0x0000, "denied.test", 16, Some(512)),
            q(5, 0x0100, "AlLoWeD.test", 1, None),
            q(6, 0x0100, "allowed.test", 1, Some(1232)),
            q(7, 0x0100, "allowed.test", 28, Some(1232)),
            q(8, 0x0100, "a.wild.test", 1, Some(1232)),
            q(9, 0x0100, "allowed.test", 16, Some(1232)),
            q(10, 0x0100, "allowed.test", 255, None),
        ];
        for raw in &queries {
            assert!(super::fast::parse(raw).is_some(), "common shape");
            // General first: it fills the cache both then answer from.
            let general = h
                .process_general(raw.clone(), src, Protocol::Udp, false)
                .await
                .expect("answered");
            let fast = h
                .process(raw.clone(), src, Protocol::Udp, false)
                .await
                .expect("answered");
            let (g, f) = (
                Message::from_vec(&general).unwrap(),
                Message::from_vec(&fast).unwrap(),
            );
            assert_eq!(g.metadata, f.metadata, "{raw:?}");
            assert_eq!(g.queries, f.queries);
            let strip = |rs: &[Record]| -> Vec<Record> {
                rs.iter()
                    .map(|r| {
                        let mut r = r.clone();
                        r.ttl = 0;
                        r
                    })
                    .collect()
            };
            assert_eq!(strip(&g.answers), strip(&f.answers));
            assert_eq!(strip(&g.authorities), strip(&f.authorities));
            assert_eq!(g.edns.is_some(), f.edns.is_some());
            if let (Some(ge), Some(fe)) = (&g.edns, &f.edns) {
                assert_eq!(ge.max_payload(), fe.max_payload());
                assert_eq!(ge.options(), fe.options());
            }
            // Overloaded: refused by both, the same way.
            let g = h
                .process_general(raw.clone(), src, Protocol::Tcp, true)
                .await
                .unwrap();
            let f = h
                .process(raw.clone(), src, Protocol::Tcp, true)
                .await
                .unwrap();
            assert_eq!(g, f, "overloaded {raw:?}");
        }
        // The allowed name was answered (not refused) and filtered to the
        // exception's cidrs; the denied one refused with its reason.
        let m = Message::from_vec(
            &h.process(queries[5].clone(), src, Protocol::Udp, false)
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1, "{:?}", m.answers);
        assert!(sink.flush(Duration::from_secs(5)));
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["ts"] = serde_json::Value::Null;
                v["duration_ms"] = serde_json::Value::Null;
                v
            })
            .collect();
        assert_eq!(lines.len(), queries.len() * 4 + 1);
        for pair in lines[..queries.len() * 4].chunks(2) {
            assert_eq!(pair[0], pair[1], "general and fast lines agree");
        }
        assert_eq!(lines[0]["reason"], "no_exception");
        assert_eq!(lines[0]["rcode"], "REFUSED");
        assert_eq!(lines[2]["reason"], "overloaded");
        assert_eq!(lines[16]["decision"], "allow");
        assert_eq!(lines[16]["qname"], "allowed.test");
        assert!(lines[16]["note"]
            .as_str()
            .is_some_and(|n| n.contains("127.0.0.6")));
    }

    /// Counts the allocations this thread makes (the test runner's other
    /// threads are not counted), allocating with egressd's own allocator.
    struct Counting;

    thread_local! {
        static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            unsafe { mimalloc::MiMalloc.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
            unsafe { mimalloc::MiMalloc.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
            ALLOCATIONS.with(|c| c.set(c.get() + 1));
            unsafe { mimalloc::MiMalloc.realloc(p, l, n) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// How many allocations `f` makes on this thread.
    pub(crate) fn allocations(f: impl FnOnce()) -> usize {
        let before = ALLOCATIONS.with(|n| n.get());
        f();
        ALLOCATIONS.with(|n| n.get()) - before
    }

    /// The allocations of a cached and of a denied answer: one, the parsed
    /// name (the policy's `Host`). The event's names reuse the scratch's
    /// room, and the line is written straight into the log's batch.
    #[tokio::test]
    async fn answers_given_at_once_allocate_only_the_parsed_name() {
        use crate::log::{LogSink, LogTarget};
        use crate::metrics::Metrics;
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let sink =
            LogSink::start(LogTarget::File(dir.path().join("log")), metrics.clone()).unwrap();
        let policy = crate::policy::from_yaml(
            "exceptions:\n\
             - id: ok\n  owner: t\n  reason: t\n  hosts: [allowed.test]\n  cidrs: [127.0.0.0/8]\n",
        )
        .unwrap();
        let h = Handler {
            policy: PolicyHandle::new(policy),
            resolver: Resolver::new(vec![fake_upstream().await], metrics.clone()),
            recorder: Recorder::new(sink.clone(), metrics),
            wire: WireCache::default(),
        };
        let src: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let q = super::fast::tests::query;
        let allowed = q(1, 0x0100, "AlLoWeD.test", 1, Some(1232));
        let denied = q(2, 0x0100, "denied.test", 1, Some(1232));
        // Fills the resolver's cache and the wire cache.
        let fresh = h
            .process(allowed.clone(), src, Protocol::Udp, false)
            .await
            .unwrap();
        let mut scratch = Scratch::default();
        let now = |raw: &[u8], scratch: &mut Scratch| {
            let who = h.who(src.ip());
            allocations(|| {
                let r = h.answer_now(raw, src, Protocol::Udp, false, who, scratch);
                assert!(matches!(r, Now::Answered));
            })
        };
        // The first of each fills the scratch's room and makes the
        // reason's EDE text.
        now(&allowed, &mut scratch);
        now(&denied, &mut scratch);
        let hit = now(&allowed, &mut scratch);
        let (got, want) = (
            Message::from_vec(&scratch.out).unwrap(),
            Message::from_vec(&fresh).unwrap(),
        );
        assert_eq!(got.metadata, want.metadata);
        assert_eq!(got.queries, want.queries);
        assert_eq!(got.answers.len(), 2);
        for (g, w) in got.answers.iter().zip(&want.answers) {
            assert_eq!((&g.name, &g.data), (&w.name, &w.data));
            assert!(
                g.ttl <= w.ttl && g.ttl + 1 >= w.ttl,
                "aged by whole seconds"
            );
        }
        let refused = now(&denied, &mut scratch);
        eprintln!("allocations per query: cached {hit}, denied {refused}");
        assert!(hit <= 1, "cached: {hit} allocations");
        assert!(refused <= 1, "denied: {refused} allocations");
        assert!(sink.flush(Duration::from_secs(5)));
    }

    #[test]
    fn own_listener_is_not_an_upstream() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(is_self(sa("127.0.0.1:53"), sa("127.0.0.1:53")));
        assert!(is_self(sa("0.0.0.0:53"), sa("127.0.0.1:53")));
        assert!(is_self(sa("[::]:8053"), sa("[::1]:8053")));
        assert!(!is_self(sa("127.0.0.1:8053"), sa("127.0.0.1:53")));
        assert!(!is_self(sa("127.0.0.1:53"), sa("127.0.0.53:53")));
    }

    #[test]
    fn limiter_bounds_per_client_and_in_all() {
        let l = Limiter::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let p1 = l.try_acquire(a).unwrap();
        let _p2 = l.try_acquire(a).unwrap();
        assert!(l.try_acquire(a).is_none());
        let _p3 = l.try_acquire(b).unwrap();
        assert!(l.try_acquire(b).is_none(), "global limit");
        drop(p1);
        assert!(l.try_acquire(a).is_some());
        // One IPv6 /64 is one client.
        let l = Limiter::new(3, 1);
        let _v6 = l.try_acquire("2001:db8::1".parse().unwrap()).unwrap();
        assert!(l.try_acquire("2001:db8::2".parse().unwrap()).is_none());
    }
}
