//! The DNS front-end: the UDP and TCP receive loops, and the bounds that
//! come before any work.
//!
//! We run our own receive loops rather than hickory's `Server` so that the
//! bounds come before the work: a query that waits for an upstream holds a
//! slot of [`MAX_INFLIGHT`] and of its client's share (the named client its
//! source identifies, else its address: [`MAX_INFLIGHT_PER_CLIENT`], or
//! `settings.limits.connections_per_client` if smaller), otherwise it is
//! answered `REFUSED`, reason `overloaded`, inline. TCP connections are
//! capped per client address ([`MAX_TCP_PER_CLIENT`]) and in all
//! ([`MAX_TCP_CONNECTIONS`]), and the total is shared fairly: when it is
//! full, a new connection from an address under its share takes the slot
//! of the address holding the most (an idle connection first), which is
//! closed with a line (reason `overloaded`). Both bounds are [`Permits`],
//! the app's: its drain at shutdown waits for them ([`Bounds::drained`]).
//!
//! Each packet is read once: the loop identifies its client once ([`Who`]),
//! the handler parses and decides it once ([`Handler::take`]), and a query
//! that waits for the resolver continues from that ([`Handler::finish`]),
//! inline when the resolver's cache has it, else on a task of its own.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::net::xfer::Protocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::timeout;

use super::answer::{Handler, Pending, Scratch, Slots, Step};
use super::answer_cache::AnswerCache;
use super::batch::{Inbox, Outbox};
use super::proxied::{self, Header, ProxySources};
use super::Resolver;
use crate::policy::{PolicyHandle, Proto, Reason};
use crate::record::{Event, Recorder};
use crate::shutdown::{Admission, Holder, Permit, Permits, Shutdown};

/// Queries being answered at once, from all clients together.
pub const MAX_INFLIGHT: u32 = 1024;
/// Queries being answered at once for one client (a named client, else an
/// address; an IPv6 client is its /64): one client cannot starve the others.
pub const MAX_INFLIGHT_PER_CLIENT: u32 = 64;
/// Open TCP connections, in all and per client address.
pub const MAX_TCP_CONNECTIONS: u32 = 256;
pub const MAX_TCP_PER_CLIENT: u32 = 16;
/// A TCP connection with no new query for this long is closed.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Reading the rest of a TCP query, or writing its answer.
pub const TCP_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed UDP receive (an ICMP error for an earlier reply).
const UDP_ERROR_PAUSE: Duration = Duration::from_millis(5);
/// Pause after a failed TCP accept (out of descriptors), instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Largest UDP query read; anything longer arrives cut and fails to parse.
const MAX_UDP_QUERY: usize = 4096;
/// Most UDP packets read in one go (one recvmmsg) before the receive loop
/// looks at TCP accepts and the shutdown again.
const UDP_BURST: usize = super::batch::BATCH;

/// What DNS holds open: queries waiting for an upstream (in all and per
/// client) and TCP connections (in all, shared fairly, and per address).
/// Made by the app, which waits on them when it drains.
#[derive(Clone, Debug)]
pub struct Bounds(Arc<Both>);

#[derive(Debug)]
struct Both {
    queries: Permits,
    tcp: Permits,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds::new(MAX_INFLIGHT, MAX_TCP_CONNECTIONS)
    }
}

impl Bounds {
    /// `queries` in flight and `tcp` connections in all.
    pub fn new(queries: u32, tcp: u32) -> Bounds {
        Bounds(Arc::new(Both {
            queries: Permits::new(queries),
            tcp: Permits::new(tcp),
        }))
    }

    /// Resolves once no query is in flight and no TCP connection open.
    pub async fn drained(&self) {
        self.0.queries.drained().await;
        self.0.tcp.drained().await;
    }

    /// TCP connections open now.
    pub fn tcp_open(&self) -> usize {
        self.0.tcp.in_use()
    }

    fn slots(&self) -> Slots<'_> {
        Slots {
            permits: &self.0.queries,
            per_client: MAX_INFLIGHT_PER_CLIENT,
        }
    }
}

/// Serves DNS on `udp` and `tcp` within `bounds` until `shutdown` fires
/// (or its trigger is gone). Queries in flight and open TCP connections
/// then finish on their own tasks: the caller's drain waits for them
/// ([`Bounds::drained`]); TCP connections close at their next query.
pub async fn serve(
    udp: UdpSocket,
    tcp: TcpListener,
    policy: Arc<PolicyHandle>,
    resolver: Arc<Resolver>,
    recorder: Recorder,
    bounds: Bounds,
    shutdown: impl Into<Shutdown>,
) -> anyhow::Result<()> {
    let none = ProxySources::default();
    serve_proxied(
        (udp, tcp),
        policy,
        resolver,
        recorder,
        bounds,
        none,
        shutdown,
    )
    .await
}

/// [`serve`], reading the client of each query from `proxied` sources
/// (balancers) in a PROXY protocol v2 header ([`super::proxied`]).
pub async fn serve_proxied(
    (udp, tcp): (UdpSocket, TcpListener),
    policy: Arc<PolicyHandle>,
    resolver: Arc<Resolver>,
    recorder: Recorder,
    bounds: Bounds,
    proxied: ProxySources,
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
            cache: AnswerCache::default(),
        }),
        bounds,
        udp: Arc::new(udp),
        proxied: Arc::new(proxied),
    };
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
                        server.udp_query(pkt, src, &mut scratch, &mut outbox);
                    }
                    outbox.flush(&server.udp);
                }
                // Readiness was stale: wait again.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // ICMP errors for earlier replies and the like: not fatal.
                Err(_) => tokio::time::sleep(UDP_ERROR_PAUSE).await,
            },
            r = tcp.accept() => match r {
                Ok((stream, src)) => server.tcp_accepted(stream, src, &shutdown),
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
        }
    }
    Ok(())
}

/// What the receive loops share.
struct Loops {
    handler: Arc<Handler>,
    bounds: Bounds,
    udp: Arc<UdpSocket>,
    /// Balancers whose queries name their client in a PROXY header.
    proxied: Arc<ProxySources>,
}

impl Loops {
    /// One UDP packet: its client identified, then parsed and decided once
    /// ([`Handler::take`]). Denied and cached answers wait on nothing: they
    /// are answered here, into `outbox`, without a copy of the packet or a
    /// task per packet (a spawn and a scheduler pass). A query that waits
    /// for the resolver continues from its decision ([`Handler::finish`]):
    /// at once when the resolver's cache has it, else on a task of its own.
    fn udp_query(&self, raw: &[u8], src: SocketAddr, scratch: &mut Scratch, outbox: &mut Outbox) {
        // From a balancer: the client its header names (answered through
        // the balancer, at `src`).
        let (raw, client) = if self.proxied.trusts(src.ip()) {
            match proxied::parse(raw) {
                Ok((Header::Proxy(client), n)) => (&raw[n..], client),
                Ok((Header::Local, n)) => (&raw[n..], src),
                Err(e) => {
                    unproxied_line(
                        &self.handler,
                        src,
                        e.unwrap_or("a PROXY protocol header cut short"),
                    );
                    return;
                }
            }
        } else {
            (raw, src)
        };
        let who = self.handler.who(client);
        let slots = self.bounds.slots();
        match self
            .handler
            .take(raw, Protocol::Udp, who, Some(slots), scratch)
        {
            Step::Answered => outbox.push(&scratch.out, src),
            Step::Resolve(p) => self.udp_finish(p, src, outbox),
            Step::General(who) => {
                let slot = slots.take(&who);
                let overloaded = slot.is_none();
                let (h, raw) = (self.handler.clone(), raw.to_vec());
                let reply = async move {
                    let r = h.process_general(raw, who, Protocol::Udp, overloaded).await;
                    drop(slot);
                    r
                };
                self.udp_reply(Box::pin(reply), src, outbox);
            }
        }
    }

    /// A [`Pending`] UDP query: answered into `outbox` if the resolver's
    /// cache has it, else on its own task.
    fn udp_finish(&self, p: Box<Pending>, src: SocketAddr, outbox: &mut Outbox) {
        let h = self.handler.clone();
        let reply = async move { Some(h.finish(p).await) };
        self.udp_reply(Box::pin(reply), src, outbox);
    }

    /// Polls `reply` once: its bytes go into `outbox` if it is ready, else
    /// it finishes on a task that sends them itself.
    fn udp_reply<F>(&self, mut reply: std::pin::Pin<Box<F>>, src: SocketAddr, outbox: &mut Outbox)
    where
        F: Future<Output = Option<Vec<u8>>> + Send + 'static,
    {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match reply.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(bytes) => {
                if let Some(bytes) = bytes {
                    outbox.push(&bytes, src);
                }
            }
            std::task::Poll::Pending => {
                let sock = self.udp.clone();
                tokio::spawn(async move {
                    if let Some(bytes) = reply.await {
                        let _ = sock.send_to(&bytes, src).await;
                    }
                });
            }
        }
    }

    /// One TCP connection, served on its own task while its address's
    /// share and the fair share of the total last (else closed at once).
    /// When the total is full, the address holding the most gives up a
    /// connection for it.
    fn tcp_accepted(&self, stream: TcpStream, src: SocketAddr, shutdown: &Shutdown) {
        if self.proxied.trusts(src.ip()) {
            // The balancer's connection names its client first: admitted,
            // and served, as that client's.
            let (loops, sd) = (self.clone_parts(), shutdown.clone());
            tokio::spawn(async move {
                let mut stream = stream;
                match timeout(TCP_IO_TIMEOUT, read_header(&mut stream)).await {
                    Ok(Ok(Header::Proxy(client))) => loops.tcp_admitted(stream, client, &sd),
                    Ok(Ok(Header::Local)) => loops.tcp_admitted(stream, src, &sd),
                    Ok(Err(e)) => unproxied_line(&loops.handler, src, e),
                    Err(_) => {
                        unproxied_line(&loops.handler, src, "no PROXY protocol header in time")
                    }
                }
            });
            return;
        }
        self.tcp_admitted(stream, src, shutdown);
    }

    fn clone_parts(&self) -> Loops {
        Loops {
            handler: self.handler.clone(),
            bounds: self.bounds.clone(),
            udp: self.udp.clone(),
            proxied: self.proxied.clone(),
        }
    }

    /// A TCP connection of client `src`, admitted under its address's share.
    fn tcp_admitted(&self, stream: TcpStream, src: SocketAddr, shutdown: &Shutdown) {
        let metrics = &self.handler.recorder.metrics;
        let tcp = &self.bounds.0.tcp;
        let permit = match tcp.try_admit(Holder::addr(src.ip()), MAX_TCP_PER_CLIENT) {
            Admission::Admitted(p) => p,
            Admission::Reclaimed { permit, .. } => {
                metrics.overloaded("tcp_dns");
                permit
            }
            Admission::OverShare | Admission::Full => {
                metrics.overloaded("tcp_dns");
                return;
            }
        };
        let (h, b, sd) = (self.handler.clone(), self.bounds.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = tcp_connection(&h, &b, stream, src, &permit, sd) => {}
                () = permit.reclaimed() => reclaimed_line(&h, src, &b),
            }
        });
    }
}

/// Reads a PROXY protocol v2 header off the start of a TCP connection.
async fn read_header(stream: &mut TcpStream) -> Result<Header, &'static str> {
    let mut b = vec![0u8; 16];
    stream
        .read_exact(&mut b)
        .await
        .map_err(|_| "the connection closed before its PROXY protocol header")?;
    let rest = match proxied::parse(&b) {
        Ok((h, _)) => return Ok(h),
        Err(Some(e)) => return Err(e),
        Err(None) => usize::from(u16::from_be_bytes([b[14], b[15]])),
    };
    b.resize(16 + rest, 0);
    stream
        .read_exact(&mut b[16..])
        .await
        .map_err(|_| "the connection closed inside its PROXY protocol header")?;
    match proxied::parse(&b) {
        Ok((h, _)) => Ok(h),
        Err(e) => Err(e.unwrap_or("a PROXY protocol header cut short")),
    }
}

/// The line of a query from a `--dns-proxy-protocol` source without a
/// usable header: refused (nothing answered), attributed to the balancer.
fn unproxied_line(handler: &Handler, src: SocketAddr, why: &str) {
    let mut ev = Event::new(Proto::Dns, src);
    ev.set_denied(Reason::Malformed);
    ev.note = Some(format!(
        "{why}: queries from this --dns-proxy-protocol source must name their client"
    ));
    handler.recorder.record(ev);
}

/// The line of a TCP connection closed to give its slot to another client.
fn reclaimed_line(handler: &Handler, src: SocketAddr, bounds: &Bounds) {
    let mut ev = Event::new(Proto::Dns, src);
    ev.set_denied(Reason::Overloaded);
    ev.note = Some(format!(
        "TCP connection closed: all {} TCP DNS connections were open and this address held \
         the most of them; its slot went to another client under its share",
        bounds.0.tcp.max()
    ));
    handler.recorder.record(ev);
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

/// One TCP connection: length-prefixed queries answered in order, each
/// marking the connection busy (`permit`) while it is answered.
async fn tcp_connection(
    handler: &Handler,
    bounds: &Bounds,
    mut stream: TcpStream,
    src: SocketAddr,
    permit: &Permit,
    mut shutdown: Shutdown,
) {
    loop {
        let mut len = [0u8; 2];
        tokio::select! {
            r = timeout(TCP_IDLE_TIMEOUT, stream.read_exact(&mut len)) => match r {
                Ok(Ok(_)) => {}
                _ => return,
            },
            _ = shutdown.fired() => return,
        }
        let mut raw = vec![0u8; u16::from_be_bytes(len) as usize];
        match timeout(TCP_IO_TIMEOUT, stream.read_exact(&mut raw)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let busy = permit.busy();
        let reply = handler
            .process(raw, src, Protocol::Tcp, false, Some(bounds.slots()))
            .await;
        let Some(bytes) = reply else { continue };
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        framed.extend_from_slice(&bytes);
        match timeout(TCP_IO_TIMEOUT, stream.write_all(&framed)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        drop(busy);
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::dns::answer::{DECISIONS, IDENTIFIED};
    use crate::dns::codec::PARSES;

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
        let l = Permits::new(3);
        let addr = |s: &str| Holder::addr(s.parse::<IpAddr>().unwrap());
        let (a, b) = (addr("10.0.0.1"), addr("10.0.0.2"));
        let p1 = l.try_acquire(a.clone(), 2).unwrap();
        let _p2 = l.try_acquire(a.clone(), 2).unwrap();
        assert!(l.try_acquire(a.clone(), 2).is_none());
        let _p3 = l.try_acquire(b.clone(), 2).unwrap();
        assert!(l.try_acquire(b.clone(), 2).is_none(), "global limit");
        drop(p1);
        assert!(l.try_acquire(a.clone(), 2).is_some());
        // One IPv6 /64 is one client.
        let l = Permits::new(3);
        let _v6 = l.try_acquire(addr("2001:db8::1"), 1).unwrap();
        assert!(l.try_acquire(addr("2001:db8::2"), 1).is_none());
    }

    /// A cache miss on the UDP loop's own path: the packet is parsed once,
    /// its client identified once and the query decided once, from the
    /// receive loop to the answer sent; a cached answer after it, once
    /// each too.
    #[tokio::test]
    async fn a_cache_miss_parses_identifies_and_decides_once() {
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
        // An upstream that answers one A record, a little later: the miss
        // really waits (on a task) rather than being answered at once.
        let up = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let up_addr = up.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((n, from)) = up.recv_from(&mut buf).await {
                let q = hickory_proto::op::Message::from_vec(&buf[..n]).unwrap();
                let mut m = hickory_proto::op::Message::response(
                    q.metadata.id,
                    hickory_proto::op::OpCode::Query,
                );
                m.add_queries(q.queries.clone());
                m.add_answer(hickory_proto::rr::Record::from_rdata(
                    q.queries[0].name().clone(),
                    300,
                    hickory_proto::rr::RData::A(std::net::Ipv4Addr::new(127, 0, 0, 5).into()),
                ));
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = up.send_to(&m.to_vec().unwrap(), from).await;
            }
        });
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let src = client.local_addr().unwrap();
        let loops = Loops {
            handler: Arc::new(Handler {
                policy: PolicyHandle::new(policy),
                resolver: Resolver::new(vec![up_addr], metrics.clone()),
                recorder: Recorder::new(sink.clone(), metrics),
                cache: AnswerCache::default(),
            }),
            bounds: Bounds::default(),
            udp: Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap()),
            proxied: Arc::default(),
        };
        let count = || {
            (
                PARSES.with(|n| n.get()),
                IDENTIFIED.with(|n| n.get()),
                DECISIONS.with(|n| n.get()),
            )
        };
        let raw = crate::dns::codec::tests::query(7, 0x0100, "allowed.test", 1, None);
        let mut scratch = Scratch::default();
        let mut buf = [0u8; 512];
        for (what, waits) in [("miss", true), ("hit", false)] {
            let before = count();
            let mut outbox = Outbox::default();
            loops.udp_query(&raw, src, &mut scratch, &mut outbox);
            outbox.flush(&loops.udp);
            let n = timeout(Duration::from_secs(5), client.recv(&mut buf))
                .await
                .expect("answered")
                .unwrap();
            let m = hickory_proto::op::Message::from_vec(&buf[..n]).unwrap();
            assert_eq!(m.answers.len(), 1, "{what}");
            let after = count();
            let got = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
            eprintln!("{what}: parses, identifications, decisions = {got:?}");
            assert_eq!(got, (1, 1, 1), "{what}");
            assert_eq!(
                loops.bounds.0.queries.in_use(),
                0,
                "{what}: the slot is back"
            );
            let _ = waits;
        }
        assert!(sink.flush(Duration::from_secs(5)));
    }
}
