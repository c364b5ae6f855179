//! Answering one query: the one place a DNS packet becomes a decision.
//!
//! Every packet that carries a DNS header becomes exactly one decision event.
//! A query of the common shape is parsed once by the codec ([`codec::parse`]),
//! its client identified once (the [`Who`] the receive loop made), and
//! decided once ([`Handler::take`]); then it is answered at once (refused
//! before the policy, denied by it, or allowed with its answer in the
//! [`AnswerCache`]), or, allowed and not cached, handed on as it is (a
//! [`Pending`]: the packet, its name, its decision's exception and its
//! event) to wait for the resolver ([`Handler::finish`]): a cache miss
//! starts nothing over. Anything else takes the general path through
//! hickory-server's [`Request`] ([`Handler::process_general`]), which
//! decides the same way and also answers malformed input:
//!
//! - denied (by the policy, the tunnel budget, or an answer made only of
//!   non-public addresses): `REFUSED` (or `NXDOMAIN` by
//!   `settings.dns.deny_rcode`) with an Extended DNS Error (RFC 8914) code 15
//!   "Blocked" whose text is `egressd: <reason> request <id>`, the id being
//!   the query's decision line's (for `egressd grant`). A denied name is
//!   never sent upstream.
//! - allowed: a fresh query upstream (through the cache); A/AAAA records that
//!   the exception may not reach are removed (rebinding protection), and
//!   `SERVFAIL` when the upstreams fail (logged as an error, not a decision).
//! - malformed (undecodable, several questions, a non-QUERY opcode, a class
//!   other than IN, a name outside `[A-Za-z0-9_-]`): `FORMERR` or `REFUSED`.
//!   A name that breaks hostname syntax or length below an allowed wildcard is
//!   reason `dns_tunnel`, like any other name shaped to carry data.
//!
//! Does not own the receive loops and their bounds (`server`), the wire
//! format of the common query (`codec`) or resolving (`resolver`).

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use hickory_proto::op::{
    Edns, Header, HeaderCounts, Message, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::rdata::svcb::{SvcParamValue, SVCB};
use hickory_proto::rr::{DNSClass, Name, RData, Record};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncoder};
use hickory_server::net::xfer::Protocol;
use hickory_server::net::NetError;
use hickory_server::server::{Request, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder};

use super::answer_cache::{AnswerCache, Key};
use super::budget::{under_wildcard, TunnelOutcome};
use super::codec::{self, Packet, EDE_BLOCKED, EDE_OTHER, EDNS_EDE};
use super::resolver::{rcode_name, Lookup, EDNS_PAYLOAD};
use super::Resolver;
use crate::policy::host::{parse_host, Host, HostError, Target};
use crate::policy::qtype::qtype_mnemonic;
use crate::policy::{
    enforced, ClientIdx, Decision, DenyRcode, Exception, Policy, PolicyHandle, Proto, Reason,
    Request as PolicyRequest, TunnelAction,
};
use crate::record::{Event, Recorder, RequestId};
use crate::shutdown::{Holder, Permit, Permits};
use crate::time::unix_now;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
thread_local! {
    /// Decisions this thread made, and clients it identified: what the
    /// tests count a query's work by (with the codec's parses).
    pub(super) static DECISIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    pub(super) static IDENTIFIED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Answers queries. Shared by the receive loops (an `Arc`).
pub(super) struct Handler {
    pub policy: Arc<PolicyHandle>,
    pub resolver: Arc<Resolver>,
    pub recorder: Recorder,
    /// Allowed answers as sent, for the queries that ask them again.
    pub cache: AnswerCache,
}

/// Who asks: the policy snapshot a query is decided by, the client its
/// source names, and the source. Made once per packet, by the receive loop.
pub(super) struct Who {
    pub policy: Arc<Policy>,
    pub client: Option<ClientIdx>,
    pub src: SocketAddr,
}

impl Who {
    /// Whose share the query counts against: the named client, else the
    /// address.
    pub fn holder(&self) -> Holder {
        match self.policy.client_id(self.client) {
            Some(id) => Holder::Named(id.clone()),
            None => Holder::addr(self.src.ip()),
        }
    }

    /// The queries in flight one client may hold under this policy: the
    /// smaller of `per_client` and `settings.limits.connections_per_client`.
    pub fn share(&self, per_client: u32) -> u32 {
        per_client.min(self.policy.settings.limits.connections_per_client)
    }

    /// Notes the policy's mode and the client in `ev`.
    fn note(&self, ev: &mut Event) {
        note_who(ev, &self.policy, self.client);
    }
}

/// Where a query in flight takes its slot: the bound on queries in flight
/// and each client's share of it.
#[derive(Clone, Copy)]
pub(super) struct Slots<'a> {
    pub permits: &'a Permits,
    pub per_client: u32,
}

impl Slots<'_> {
    /// Whether `who` may have one more query in flight now.
    pub fn has_room(&self, who: &Who) -> bool {
        self.permits
            .has_room(|| who.holder(), who.share(self.per_client))
    }

    /// A slot for `who`'s query, within its share.
    pub fn take(&self, who: &Who) -> Option<Permit> {
        self.permits
            .try_acquire(who.holder(), who.share(self.per_client))
    }
}

/// What [`Handler::take`] did with a packet.
pub(super) enum Step {
    /// Decided, logged, and its answer written into the scratch's `out`.
    Answered,
    /// Allowed and not in the answer cache: the resolver answers it.
    Resolve(Box<Pending>),
    /// Not of the common shape: nothing done, the general path takes it.
    General(Who),
}

/// A query of the common shape, parsed, identified and decided, its budget
/// spent and its slot taken, waiting for the resolver: handed on whole.
pub(super) struct Pending {
    packet: Packet,
    protocol: Protocol,
    who: Who,
    host: Host,
    /// The exception that allowed it (an index into the policy's
    /// exceptions: the decision outlives no borrow).
    exception: Option<usize>,
    ev: Event,
    /// Its share of the queries in flight, released when it is answered.
    _slot: Option<Permit>,
}

/// What the answers given at once reuse from query to query: the bytes
/// sent, the room of the event's two names (`qname`, `host`), and of a
/// refusal's EDE text.
pub(super) struct Scratch {
    pub out: Vec<u8>,
    qname: String,
    host: String,
    ede: String,
}

impl Default for Scratch {
    /// Room for the longest name and a typical answer from the start.
    fn default() -> Scratch {
        Scratch {
            out: Vec::with_capacity(512),
            qname: String::with_capacity(256),
            host: String::with_capacity(256),
            ede: String::with_capacity(64),
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
            ede: String::new(),
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

/// What to answer, before it is encoded.
struct Reply {
    rcode: ResponseCode,
    records: Vec<Record>,
    authority: Vec<Record>,
    /// Extended DNS Error: INFO-CODE and EXTRA-TEXT (`egressd: <reason>`;
    /// the request id is added where it is encoded, [`Reply::ede_into`]).
    ede: Option<(u16, Cow<'static, str>)>,
    /// The refused query's id, which the EDE text ends with.
    request: Option<RequestId>,
}

impl Reply {
    fn error(rcode: ResponseCode, ede: Option<(u16, Cow<'static, str>)>) -> Reply {
        Reply {
            rcode,
            records: Vec::new(),
            authority: Vec::new(),
            ede,
            request: None,
        }
    }

    /// A refusal of query `id`: its EDE text names it.
    fn of_request(mut self, id: RequestId) -> Reply {
        self.request = Some(id);
        self
    }

    /// The EDE, its text written into `buf` (kept by the caller, so a
    /// refusal on the fast path allocates nothing once `buf` has room):
    /// `egressd: <reason> request <id>`.
    fn ede_into<'b>(&self, buf: &'b mut String) -> Option<(u16, &'b str)> {
        let (code, text) = self.ede.as_ref()?;
        buf.clear();
        buf.push_str(text);
        if let Some(id) = self.request {
            buf.push_str(" request ");
            buf.push_str(std::str::from_utf8(&id.as_bytes()).expect("ASCII"));
        }
        Some((*code, buf.as_str()))
    }

    /// Whether the answer cache may keep this reply's bytes for other
    /// queries: an answer, never a refusal (whose EDE names one query).
    fn shareable(&self) -> bool {
        self.ede.is_none() && self.request.is_none()
    }
}

impl Handler {
    /// The policy snapshot a query from `src` is decided by, and its client:
    /// the one identification of a packet.
    pub fn who(&self, src: SocketAddr) -> Who {
        #[cfg(test)]
        IDENTIFIED.with(|n| n.set(n.get() + 1));
        let policy = self.policy.snapshot();
        let client = policy.identify(src.ip(), None).unwrap_or(None);
        Who {
            policy,
            client,
            src,
        }
    }

    /// One packet of the common shape, parsed once and decided once:
    /// answered here into `scratch.out` when that needs no upstream
    /// (refused before the policy, denied by it, refused by the tunnel
    /// budget, or allowed with its answer in the answer cache), else handed
    /// on as a [`Pending`] with its slot of `slots` (`None`: unbounded), or
    /// past the client's share refused `overloaded`. The decision is the
    /// same [`decide_query`] and the budget the same
    /// [`Handler::spend_budget`] as on the general path. Anything else
    /// returns [`Step::General`] having spent nothing, recorded nothing and
    /// changed nothing.
    pub fn take(
        &self,
        raw: &[u8],
        protocol: Protocol,
        who: Who,
        slots: Option<Slots<'_>>,
        scratch: &mut Scratch,
    ) -> Step {
        let overloaded = slots.is_some_and(|s| !s.has_room(&who));
        let Some(q) = codec::parse(raw) else {
            return Step::General(who);
        };
        let Ok(host) = parse_host(q.host_text(&mut [0; 256])) else {
            return Step::General(who);
        };
        let max_size = max_size(&q, protocol);
        let mut ev = Event::new(Proto::Dns, who.src);
        who.note(&mut ev);
        ev.qname = Some(reuse(&mut scratch.qname, host.as_str()));
        ev.qtype = Some(qtype_mnemonic(q.qtype));
        let reply = match self.refuse_early(&mut ev, overloaded) {
            Some(r) => r,
            None => {
                let now = unix_now();
                ev.host = Some(reuse(&mut scratch.host, host.as_str()));
                let policy = &who.policy;
                let (d, host) = decide_query(policy, who.client, host, q.qtype, &mut ev, now);
                if !d.is_allowed() {
                    deny(policy, d.reason, ev.id)
                } else {
                    let out = &mut scratch.out;
                    let cached = self.cached(policy, &q, &d, max_size, &mut ev, out);
                    // A miss takes its slot before it spends anything.
                    let slot = match (cached, slots) {
                        (false, Some(s)) => match s.take(&who) {
                            Some(p) => Some(p),
                            None => {
                                // Raced past its share: refused as if it
                                // had been full from the start.
                                scratch.keep(ev);
                                let mut ev = Event::new(Proto::Dns, who.src);
                                who.note(&mut ev);
                                ev.qname = Some(reuse(&mut scratch.qname, host.as_str()));
                                ev.qtype = Some(qtype_mnemonic(q.qtype));
                                let r = self.refuse_early(&mut ev, true).expect("overloaded");
                                drop(who);
                                return self.answer_with(&q, max_size, r, ev, scratch);
                            }
                        },
                        _ => None,
                    };
                    match self.spend_budget(&who, &host, &d, &mut ev, now) {
                        Err(refused) => refused,
                        Ok(()) if cached => {
                            self.resolver.count_cache_hit();
                            drop(who);
                            self.recorder.record_mut(&mut ev);
                            scratch.keep(ev);
                            return Step::Answered;
                        }
                        Ok(()) => {
                            let exception = d.exception.map(|e| exception_index(policy, e));
                            let ev = std::mem::replace(&mut ev, Event::new(Proto::Dns, who.src));
                            return Step::Resolve(Box::new(Pending {
                                packet: Packet::own(&q, raw),
                                protocol,
                                who,
                                host,
                                exception,
                                ev,
                                _slot: slot,
                            }));
                        }
                    }
                }
            }
        };
        drop(who);
        self.answer_with(&q, max_size, reply, ev, scratch)
    }

    /// Whether the answer cache held an answer to `q` as `d` allowed it
    /// (written into `out`, its code on `ev`). Never while answers are
    /// remembered for capture: each answer must pass through the resolver.
    fn cached(
        &self,
        policy: &Arc<Policy>,
        q: &codec::Query<'_>,
        d: &Decision<'_>,
        max_size: u16,
        ev: &mut Event,
        out: &mut Vec<u8>,
    ) -> bool {
        if self.resolver.remembering_answers() {
            return false;
        }
        let key = Key::new(q, d.exception);
        let at = std::time::Instant::now();
        match self.cache.answer(policy, &key, q, max_size, at, out) {
            Some(rcode) => {
                ev.rcode = Some(rcode_name(ResponseCode::from_low(rcode as u8)));
                true
            }
            None => false,
        }
    }

    /// Writes `reply` to `q` into `scratch.out` and records `ev`.
    fn answer_with(
        &self,
        q: &codec::Query<'_>,
        max_size: u16,
        reply: Reply,
        mut ev: Event,
        scratch: &mut Scratch,
    ) -> Step {
        let out = &mut scratch.out;
        let ede = reply.ede_into(&mut scratch.ede);
        let fits = codec::encode_into(
            out,
            q,
            reply.rcode,
            (&reply.records, &reply.authority),
            ede,
            max_size,
            EDNS_PAYLOAD,
        );
        if !fits {
            // A refusal is a header, the question (at most 259 bytes) and
            // an EDE: it fits 512 bytes, and without the EDE it surely does.
            codec::encode_into(
                out,
                q,
                reply.rcode,
                (&[], &[]),
                None,
                max_size,
                EDNS_PAYLOAD,
            );
        }
        ev.rcode = Some(rcode_name(reply.rcode));
        self.recorder.record_mut(&mut ev);
        scratch.keep(ev);
        Step::Answered
    }

    /// A [`Pending`] query answered: through the resolver (its cache, else
    /// the upstreams), the rebinding filter, the answer cache; recorded.
    /// Nothing is parsed or decided again.
    pub async fn finish(&self, p: Box<Pending>) -> Vec<u8> {
        let Pending {
            packet,
            protocol,
            who,
            host,
            exception,
            mut ev,
            _slot,
        } = *p;
        let q = packet.query();
        let policy = &who.policy;
        let exception = exception.map(|i| &policy.exceptions[i]);
        let (reply, keep) = self
            .lookup(policy, exception, host, q.qtype, &mut ev, who.src.ip())
            .await;
        let max_size = max_size(&q, protocol);
        let mut text = String::new();
        let ede = reply.ede_into(&mut text);
        let bytes = match codec::encode(
            &q,
            reply.rcode,
            &reply.records,
            &reply.authority,
            ede,
            max_size,
            EDNS_PAYLOAD,
        ) {
            Some(b) => {
                if let Some(k) = keep.filter(|_| reply.shareable()) {
                    if !self.resolver.remembering_answers() {
                        let key = Key::new(&q, k.exception);
                        self.cache
                            .store(policy, &key, &b, k.ttl, std::time::Instant::now());
                    }
                }
                b
            }
            // Too long for the client's UDP size: hickory truncates it.
            None => {
                self.encode_general(packet.raw(), who.src, protocol, &reply)
                    .await
            }
        };
        drop(who);
        ev.rcode = Some(rcode_name(reply.rcode));
        self.recorder.record(ev);
        bytes
    }

    /// One packet, any shape, the whole way: what TCP and the tests use.
    /// `overloaded` refuses it before the policy; `slots` bounds a query
    /// that waits.
    pub async fn process(
        &self,
        raw: Vec<u8>,
        src: SocketAddr,
        protocol: Protocol,
        overloaded: bool,
        slots: Option<Slots<'_>>,
    ) -> Option<Vec<u8>> {
        let who = self.who(src);
        let mut scratch = Scratch::empty();
        let step = if overloaded {
            self.take_overloaded(&raw, protocol, who, &mut scratch)
        } else {
            self.take(&raw, protocol, who, slots, &mut scratch)
        };
        match step {
            Step::Answered => Some(scratch.out),
            Step::Resolve(p) => Some(self.finish(p).await),
            Step::General(who) => {
                let slot = slots.map(|s| s.take(&who));
                let overloaded = overloaded || matches!(slot, Some(None));
                // Boxed: the rare path's state stays out of every query's future.
                Box::pin(self.process_general(raw, who, protocol, overloaded)).await
            }
        }
    }

    /// [`Handler::take`] for a client past its share: refused before the
    /// policy.
    fn take_overloaded(
        &self,
        raw: &[u8],
        protocol: Protocol,
        who: Who,
        scratch: &mut Scratch,
    ) -> Step {
        let Some(q) = codec::parse(raw) else {
            return Step::General(who);
        };
        let Ok(host) = parse_host(q.host_text(&mut [0; 256])) else {
            return Step::General(who);
        };
        let mut ev = Event::new(Proto::Dns, who.src);
        who.note(&mut ev);
        ev.qname = Some(reuse(&mut scratch.qname, host.as_str()));
        ev.qtype = Some(qtype_mnemonic(q.qtype));
        let r = self.refuse_early(&mut ev, true).expect("overloaded");
        drop(who);
        self.answer_with(&q, max_size(&q, protocol), r, ev, scratch)
    }

    /// A packet of any shape through hickory's `Request`, malformed ones
    /// included; the client is `who`'s, identified by the caller.
    pub async fn process_general(
        &self,
        raw: Vec<u8>,
        who: Who,
        protocol: Protocol,
        overloaded: bool,
    ) -> Option<Vec<u8>> {
        let header = match Header::read(&mut BinDecoder::new(&raw)) {
            Ok(h) => h,
            Err(_) => {
                self.record_malformed(&who, "shorter than a DNS header; not answered", None);
                return None;
            }
        };
        if header.metadata.message_type == MessageType::Response {
            // Answering responses would make us a reflector.
            self.record_malformed(&who, "a DNS response, not a query; not answered", None);
            return None;
        }
        codec::counted_parse();
        let request = match Request::from_bytes(raw, who.src, protocol) {
            Ok(r) => r,
            Err(e) => {
                let mut m = Message::error_msg(
                    header.metadata.id,
                    header.metadata.op_code,
                    ResponseCode::FormErr,
                );
                m.metadata.recursion_desired = header.metadata.recursion_desired;
                self.record_malformed(
                    &who,
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
        self.respond(&request, &who, sink.clone(), overloaded).await;
        let bytes = lock(&sink.out).take();
        bytes
    }

    fn record_malformed(&self, who: &Who, note: &str, rcode: Option<ResponseCode>) {
        let mut ev = Event::new(Proto::Dns, who.src);
        who.note(&mut ev);
        ev.set_denied(Reason::Malformed);
        ev.note = Some(note.to_string());
        ev.rcode = rcode.map(rcode_name);
        self.recorder.record(ev);
    }

    async fn respond<R: ResponseHandler>(
        &self,
        request: &Request,
        who: &Who,
        mut handle: R,
        overloaded: bool,
    ) -> ResponseInfo {
        let mut ev = Event::new(Proto::Dns, request.src());
        let reply = self.answer(request, who, &mut ev, overloaded).await;
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

    /// Decides and resolves one query of the general path, filling in the
    /// event as it goes.
    async fn answer(
        &self,
        request: &Request,
        who: &Who,
        ev: &mut Event,
        overloaded: bool,
    ) -> Option<Reply> {
        let meta = &request.metadata;
        who.note(ev);
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
        let now = unix_now();
        let host = match host_of(q.original().name()) {
            Ok(h) => h,
            Err(e) => return Some(self.bad_name(who, q.original().name(), &e, ev, now)),
        };
        ev.qname = Some(host.to_string());
        ev.host = Some(host.to_string());
        let policy = &who.policy;
        let (d, host) = decide_query(policy, who.client, host, qtype, ev, now);
        if !d.is_allowed() {
            return Some(deny(policy, d.reason, ev.id));
        }
        if let Err(refused) = self.spend_budget(who, &host, &d, ev, now) {
            return Some(refused);
        }
        let (reply, _keep) = self
            .lookup(policy, d.exception, host, qtype, ev, request.src().ip())
            .await;
        Some(reply)
    }

    /// Encodes `reply` through hickory, for answers [`codec::encode`] declines.
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
            self.recorder.metrics.overloaded("dns_queries");
            ev.set_denied(Reason::Overloaded);
            return Some(
                Reply::error(
                    ResponseCode::Refused,
                    Some((EDE_OTHER, ede_text(Reason::Overloaded))),
                )
                .of_request(ev.id),
            );
        }
        if !self.recorder.accepting() {
            // A denial like any other (DESIGN "DNS answers": `REFUSED`, EDE
            // 15 naming the reason), but never `NXDOMAIN` whatever
            // `deny_rcode` says: an outage says nothing about the name,
            // and a negative answer would be cached past it.
            ev.set_denied(Reason::LogUnavailable);
            return Some(
                Reply::error(
                    ResponseCode::Refused,
                    Some((EDE_BLOCKED, ede_text(Reason::LogUnavailable))),
                )
                .of_request(ev.id),
            );
        }
        None
    }

    /// Resolves an allowed name (`exception` allowed it): the upstream
    /// answer through the cache, and its rebinding filter. Shared by both
    /// wire paths, after their one decision.
    async fn lookup<'p>(
        &self,
        policy: &'p Policy,
        exception: Option<&'p Exception>,
        host: Host,
        qtype: u16,
        ev: &mut Event,
        src: IpAddr,
    ) -> (Reply, Option<Keep<'p>>) {
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
        match rebinding_filter(policy, exception, &lookup.answer.records, ev) {
            Ok((records, clean)) => {
                // Only an answer nothing was removed from (and nothing
                // noted about) is the same for the next query to get.
                let keep = clean.then_some(Keep {
                    exception,
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
        who: &Who,
        host: &Host,
        d: &Decision<'_>,
        ev: &mut Event,
        now: i64,
    ) -> Result<(), Reply> {
        let Some(e) = d.exception else { return Ok(()) };
        let policy = &who.policy;
        let (outcome, note) =
            self.resolver
                .tunnel_assess(policy, who.client, who.src.ip(), host, e, now);
        match outcome {
            TunnelOutcome::Ok => {}
            TunnelOutcome::Alert => ev.note = note,
            TunnelOutcome::Block => {
                let mode = policy.settings.mode;
                let blocked = Decision::deny(Reason::DnsTunnel, d.exception).under(mode);
                ev.set_decision(&blocked, mode);
                ev.note = note;
                if !blocked.is_allowed() {
                    return Err(deny(policy, Reason::DnsTunnel, ev.id));
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
            request: None,
        }
    }

    /// A name that is not a host name: `dns_tunnel` when it sits below a
    /// wildcard this client may use (data shaped to fit), else `malformed`.
    fn bad_name(&self, who: &Who, name: &Name, err: &HostError, ev: &mut Event, now: i64) -> Reply {
        let (policy, client) = (&who.policy, who.client);
        let labels: Vec<&[u8]> = name.iter().collect();
        if labels.is_empty() {
            ev.set_denied(Reason::NoException);
            return deny(policy, Reason::NoException, ev.id);
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
                if let Some(cooling) = self.resolver.tunnel_strike(
                    policy,
                    (client, who.src.ip()),
                    e,
                    &tail,
                    above,
                    now,
                ) {
                    note = format!("{note}; {cooling}");
                }
                ev.note = Some(note);
                self.resolver
                    .metrics()
                    .dns_tunnel
                    .with_label_values(&["block"])
                    .inc();
                deny(policy, Reason::DnsTunnel, ev.id)
            }
            None => {
                ev.set_denied(Reason::Malformed);
                ev.note = Some(format!("not a host name: {err}"));
                deny(policy, Reason::Malformed, ev.id)
            }
        }
    }
}

/// Where `e`, an exception of `policy` (every decision's exception is one
/// of `policy.exceptions`), sits among them.
fn exception_index(policy: &Policy, e: &Exception) -> usize {
    let base = policy.exceptions.as_ptr() as usize;
    let at = (e as *const Exception as usize).wrapping_sub(base) / std::mem::size_of::<Exception>();
    assert!(
        policy
            .exceptions
            .get(at)
            .is_some_and(|x| std::ptr::eq(x, e)),
        "a decision's exception is one of its policy's"
    );
    at
}

fn applies(e: &Exception, client: Option<ClientIdx>, now: i64) -> bool {
    !e.is_expired(now)
        && match e.clients() {
            None => true,
            Some(list) => client.is_some_and(|c| list.contains(&c)),
        }
}

/// An allowed answer that the answer cache may keep: the exception that
/// answered it, and the TTL its records were sent with.
struct Keep<'p> {
    exception: Option<&'p Exception>,
    ttl: u32,
}

/// The largest answer `q` may get over `protocol`.
fn max_size(q: &codec::Query<'_>, protocol: Protocol) -> u16 {
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
    #[cfg(test)]
    DECISIONS.with(|n| n.set(n.get() + 1));
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
    exception: Option<&Exception>,
    answer: &[Record],
    ev: &mut Event,
) -> Result<(Vec<Record>, bool), Reply> {
    let mut records = answer.to_vec();
    let filtered = filter_addresses(policy, exception, answer);
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
        let refused = Decision::deny(Reason::PrivateAddress, exception).under(mode);
        ev.set_decision(&refused, mode);
        ev.add_note(Some(format!(
            "every address is non-public and outside the exception's cidrs: {list}"
        )));
        if !report {
            return Err(deny(policy, Reason::PrivateAddress, ev.id));
        }
    } else if report {
        ev.add_note(Some(format!("would remove {cidrs}: {list}")));
    } else {
        ev.add_note(Some(format!("removed {cidrs}: {list}")));
        records.retain(|r| refused_by(policy, exception, r).is_empty());
    }
    Ok((records, false))
}

/// An Extended DNS Error's text: `egressd: <reason>`, made once per reason
/// (the request id is added when the reply is encoded, [`Reply::ede_into`]).
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

/// The answer to denied query `id`.
fn deny(policy: &Policy, reason: Reason, id: RequestId) -> Reply {
    let rcode = match policy.settings.dns.deny_rcode {
        DenyRcode::Refused => ResponseCode::Refused,
        DenyRcode::Nxdomain => ResponseCode::NXDomain,
    };
    Reply::error(rcode, Some((EDE_BLOCKED, ede_text(reason)))).of_request(id)
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
        let mut text = String::new();
        if let Some((code, text)) = reply.ede_into(&mut text) {
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
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use hickory_proto::op::{Message, OpCode, ResponseCode};
    use tokio::net::UdpSocket;

    use super::*;
    use crate::dns::alloc_count::allocations;

    /// An EDE text's request id: 12 characters of the id alphabet.
    fn is_request_id(id: &[u8]) -> bool {
        id.len() == RequestId::LEN
            && id
                .iter()
                .all(|b| b"0123456789abcdefghjkmnpqrstvwxyz".contains(b))
    }

    /// EDNS options with each EDE text's request id taken off (every query
    /// has its own), after checking it is one.
    fn without_ids(
        opts: &hickory_proto::rr::rdata::opt::OPT,
    ) -> Vec<(hickory_proto::rr::rdata::opt::EdnsCode, Vec<u8>)> {
        opts.as_ref()
            .iter()
            .map(|(code, o)| {
                let mut data = match o {
                    EdnsOption::Unknown(_, d) => d.clone(),
                    other => format!("{other:?}").into_bytes(),
                };
                if let Some(i) = data.windows(9).position(|w| w == b" request ") {
                    assert!(is_request_id(&data[i + 9..]), "{data:?}");
                    data.truncate(i);
                }
                (*code, data)
            })
            .collect()
    }

    /// The EDE text of an answer, if it has one.
    fn ede_of(m: &Message) -> Option<String> {
        let e = m.edns.as_ref()?;
        e.options().as_ref().iter().find_map(|(_, o)| match o {
            EdnsOption::Unknown(code, d) if *code == EDNS_EDE => {
                Some(String::from_utf8_lossy(&d[2..]).into_owned())
            }
            _ => None,
        })
    }

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
            cache: AnswerCache::default(),
        };
        let src: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let q = super::super::codec::tests::query;
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
            assert!(codec::parse(raw).is_some(), "common shape");
            // General first: it fills the cache both then answer from.
            let general = h
                .process_general(raw.clone(), h.who(src), Protocol::Udp, false)
                .await
                .expect("answered");
            let fast = h
                .process(raw.clone(), src, Protocol::Udp, false, None)
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
                assert_eq!(without_ids(ge.options()), without_ids(fe.options()));
            }
            // A refusal names its own query; an answer (cached or not) no one's.
            match (ede_of(&g), ede_of(&f)) {
                (Some(ge), Some(fe)) => assert_ne!(ge, fe, "each query its own id"),
                (None, None) => {}
                other => panic!("EDE on one path only: {other:?}"),
            }
            // Overloaded: refused by both, the same way.
            let g = h
                .process_general(raw.clone(), h.who(src), Protocol::Tcp, true)
                .await
                .unwrap();
            let f = h
                .process(raw.clone(), src, Protocol::Tcp, true, None)
                .await
                .unwrap();
            // The same answer but for the request id in the EDE text
            // (each query has its own).
            assert_eq!(g.len(), f.len(), "overloaded {raw:?}");
            let (g, f) = (
                Message::from_vec(&g).unwrap(),
                Message::from_vec(&f).unwrap(),
            );
            assert_eq!(g.metadata, f.metadata, "overloaded {raw:?}");
            assert_eq!(g.queries, f.queries, "overloaded {raw:?}");
            assert_eq!(
                g.edns.as_ref().map(|e| without_ids(e.options())),
                f.edns.as_ref().map(|e| without_ids(e.options())),
                "overloaded {raw:?}"
            );
        }
        // The allowed name was answered (not refused) and filtered to the
        // exception's cidrs; the denied one refused with its reason.
        let m = Message::from_vec(
            &h.process(queries[5].clone(), src, Protocol::Udp, false, None)
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
                // Each query its own id.
                if let Some(id) = v.get_mut("id") {
                    assert!(id.as_str().is_some_and(|i| is_request_id(i.as_bytes())));
                    *id = serde_json::Value::Null;
                }
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
            cache: AnswerCache::default(),
        };
        let src: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let q = super::super::codec::tests::query;
        let allowed = q(1, 0x0100, "AlLoWeD.test", 1, Some(1232));
        let denied = q(2, 0x0100, "denied.test", 1, Some(1232));
        // Fills the resolver's cache and the answer cache.
        let fresh = h
            .process(allowed.clone(), src, Protocol::Udp, false, None)
            .await
            .unwrap();
        let mut scratch = Scratch::default();
        let now = |raw: &[u8], scratch: &mut Scratch| {
            let who = h.who(src);
            allocations(|| {
                let r = h.take(raw, Protocol::Udp, who, None, scratch);
                assert!(matches!(r, Step::Answered));
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
        assert_eq!(ede_of(&got), None, "a cached answer names no query");
        let refused = now(&denied, &mut scratch);
        eprintln!("allocations per query: cached {hit}, denied {refused}");
        assert!(hit <= 1, "cached: {hit} allocations");
        assert!(refused <= 1, "denied: {refused} allocations");
        // The refusal names its query: the id its decision line has.
        let text = ede_of(&Message::from_vec(&scratch.out).unwrap()).expect("an EDE");
        let id = text
            .strip_prefix("egressd: no_exception request ")
            .expect(&text);
        assert!(is_request_id(id.as_bytes()), "{text}");
        assert!(sink.flush(Duration::from_secs(5)));
        let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
        let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
        assert_eq!(last["id"], id, "{last}");
    }
}
