//! UDP datagrams read and written many per system call (`recvmmsg`,
//! `sendmmsg`).
//!
//! Under load, most of a DNS query's cost on loopback is the kernel's:
//! profiling denied queries under dnsperf put 78% of the listener's time
//! in the kernel, one `recvfrom` and one `sendto` per query. Reading up to
//! [`Inbox`]'s capacity of packets per call, and sending the answers given
//! without waiting in one call once that batch is done, pays the system
//! call's entry and the socket lookup once per batch. Each packet is still
//! its own query: decided, answered and logged on its own.
//!
//! Linux only; elsewhere the same interface reads and writes one datagram
//! per call.

use std::io;
use std::net::SocketAddr;
use std::ops::Range;

use tokio::net::UdpSocket;

/// Most datagrams read, or answers sent, in one call. No allocation per
/// call: the receiving headers are made once per [`Inbox`], the sending
/// ones are arrays of this many on the stack, of which only the entries a
/// call uses are written (zeroing all of them was 7 KB of stores a call,
/// a tenth of a cached answer's instructions when batches are small).
pub(super) const BATCH: usize = 32;

/// Datagrams received in one call, each in its own buffer.
pub(super) struct Inbox {
    bufs: Vec<Box<[u8]>>,
    got: Vec<(usize, SocketAddr)>,
    /// The senders' addresses, and the call's iovecs and headers, made once
    /// and pointing into `bufs` and `addrs`.
    #[cfg(target_os = "linux")]
    addrs: Box<[libc::sockaddr_storage]>,
    /// Only held: the headers point into it.
    #[cfg(target_os = "linux")]
    _iovs: Box<[libc::iovec]>,
    #[cfg(target_os = "linux")]
    hdrs: Box<[libc::mmsghdr]>,
}

// SAFETY: the raw pointers in `_iovs` and `hdrs` point only into this
// Inbox's own heap blocks (`bufs`' buffers, `addrs`, `_iovs`), which are
// allocated once in `new`, never reallocated or freed before the Inbox,
// and do not move when it moves. They are written through only by
// `recv_now` (`&mut self`); shared access only reads `bufs` and `got`.
#[cfg(target_os = "linux")]
unsafe impl Send for Inbox {}
// SAFETY: as for Send: nothing is written through a shared reference.
#[cfg(target_os = "linux")]
unsafe impl Sync for Inbox {}

impl Inbox {
    /// Room for `batch` (at most [`BATCH`]) datagrams of up to `size`
    /// bytes each (a longer one arrives cut to `size`).
    pub fn new(batch: usize, size: usize) -> Inbox {
        let batch = batch.clamp(1, BATCH);
        let mut bufs: Vec<Box<[u8]>> = (0..batch).map(|_| vec![0u8; size].into()).collect();
        #[cfg(target_os = "linux")]
        {
            // SAFETY (both zeroed values): sockaddr_storage and mmsghdr are
            // plain data; all zeroes is valid, and the fields that matter
            // are set here.
            let mut addrs: Box<[libc::sockaddr_storage]> =
                (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect();
            let mut iovs: Box<[libc::iovec]> = bufs
                .iter_mut()
                .map(|b| libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                })
                .collect();
            let hdrs = iovs
                .iter_mut()
                .zip(addrs.iter_mut())
                .map(|(iov, addr)| {
                    let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    h.msg_hdr.msg_name = (addr as *mut libc::sockaddr_storage).cast();
                    h.msg_hdr.msg_iov = iov;
                    h.msg_hdr.msg_iovlen = 1;
                    h
                })
                .collect();
            Inbox {
                bufs,
                got: Vec::with_capacity(batch),
                addrs,
                _iovs: iovs,
                hdrs,
            }
        }
        #[cfg(not(target_os = "linux"))]
        Inbox {
            bufs,
            got: Vec::with_capacity(batch),
        }
    }

    /// Reads the datagrams waiting on `sock`, at most one batch, without
    /// waiting: `WouldBlock` when there are none (and `sock`'s readiness is
    /// cleared, so that `readable()` waits again).
    pub fn recv(&mut self, sock: &UdpSocket) -> io::Result<usize> {
        self.got.clear();
        sock.try_io(tokio::io::Interest::READABLE, || self.recv_now(sock))?;
        Ok(self.got.len())
    }

    /// The `i`th datagram read by the last [`Inbox::recv`], and its sender.
    pub fn get(&self, i: usize) -> (&[u8], SocketAddr) {
        let (n, src) = self.got[i];
        (&self.bufs[i][..n], src)
    }

    #[cfg(target_os = "linux")]
    fn recv_now(&mut self, sock: &UdpSocket) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let batch = self.bufs.len();
        // The kernel wrote each used header's address length: room for any
        // address again.
        for h in self.hdrs.iter_mut() {
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        }
        let hdrs = &mut self.hdrs;
        // SAFETY: every header points at a live buffer, iovec and address
        // of this Inbox, each as long as the length it states; the kernel
        // writes at most that much into each.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                batch as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for (h, addr) in self.hdrs.iter().zip(self.addrs.iter()).take(n as usize) {
            // A sender of another family (none on an IP socket) is skipped
            // by giving it an empty packet from an unspecified address,
            // which fails to parse and is answered nowhere.
            let src = to_socket_addr(addr).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            let len = (h.msg_len as usize).min(self.bufs[0].len());
            self.got.push((len, src));
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    fn recv_now(&mut self, sock: &UdpSocket) -> io::Result<()> {
        let (n, src) = sock.try_recv_from(&mut self.bufs[0])?;
        self.got.push((n, src));
        Ok(())
    }
}

/// Answers gathered while a batch of queries is handled, sent together.
#[derive(Default)]
pub(super) struct Outbox {
    bytes: Vec<u8>,
    msgs: Vec<(Range<usize>, SocketAddr)>,
}

impl Outbox {
    pub fn push(&mut self, answer: &[u8], to: SocketAddr) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(answer);
        self.msgs.push((start..self.bytes.len(), to));
    }

    /// Sends what was pushed, as far as the socket takes it without
    /// waiting. An answer the socket refuses (its buffer full, or an
    /// error for that destination) is dropped, as a lost datagram would
    /// be: the client asks again.
    pub fn flush(&mut self, sock: &UdpSocket) {
        let mut done = 0;
        while done < self.msgs.len() {
            match self.send_from(sock, done) {
                Ok(n) => done += n.max(1),
                // Nothing more goes out now; the client retries.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // The first one failed on its own (an unreachable
                // destination, say): skip it, send the rest.
                Err(_) => done += 1,
            }
        }
        self.bytes.clear();
        self.msgs.clear();
    }

    /// Sends the answers from index `from` on; how many went out.
    #[cfg(target_os = "linux")]
    fn send_from(&self, sock: &UdpSocket, from: usize) -> io::Result<usize> {
        use std::mem::MaybeUninit;
        use std::os::fd::AsRawFd;
        let msgs = &self.msgs[from..(from + BATCH).min(self.msgs.len())];
        // Only the entries this call sends are written, each in full.
        let mut addrs = [const { MaybeUninit::<libc::sockaddr_storage>::uninit() }; BATCH];
        let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; BATCH];
        let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; BATCH];
        for (i, (r, to)) in msgs.iter().enumerate() {
            // SAFETY: sockaddr_storage and mmsghdr are plain data; all
            // zeroes is valid, and the fields that matter are set below.
            let addr = addrs[i].write(unsafe { std::mem::zeroed() });
            let len = write_socket_addr(to, addr);
            let iov = iovs[i].write(libc::iovec {
                iov_base: self.bytes[r.clone()].as_ptr() as *mut libc::c_void,
                iov_len: r.len(),
            });
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (addr as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = len;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            hdrs[i].write(h);
        }
        sock.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: the first `msgs.len()` headers are initialised above
            // (the kernel reads no others); each points at a live address
            // and iovec, and every iovec into `self.bytes`, each as long as
            // it states; the kernel only reads them.
            let n = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                    msgs.len() as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn send_from(&self, sock: &UdpSocket, from: usize) -> io::Result<usize> {
        let (r, to) = &self.msgs[from];
        sock.try_send_to(&self.bytes[r.clone()], *to).map(|_| 1)
    }
}

#[cfg(target_os = "linux")]
fn to_socket_addr(a: &libc::sockaddr_storage) -> Option<SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    match a.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, and
            // sockaddr_storage is large and aligned enough for it.
            let v4 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)),
                u16::from_be(v4.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let v6 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(v6.sin6_addr.s6_addr),
                u16::from_be(v6.sin6_port),
                u32::from_be(v6.sin6_flowinfo),
                v6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(target_os = "linux")]
/// Writes `a` into `s` (zeroed), returning the length that holds it.
fn write_socket_addr(a: &SocketAddr, s: &mut libc::sockaddr_storage) -> u32 {
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a
            // sockaddr_in; the family is set to match.
            let sin =
                unsafe { &mut *(s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &mut *(s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_flowinfo = v6.flowinfo().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    len as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many datagrams from several senders, v4 and v6, are read in one
    /// batch with their senders, and the answers reach each sender.
    #[tokio::test]
    async fn a_batch_is_read_and_answered_per_sender() {
        for listen in ["127.0.0.1:0", "[::1]:0"] {
            let server = UdpSocket::bind(listen).await.unwrap();
            let at = server.local_addr().unwrap();
            let mut clients = Vec::new();
            for i in 0..5u8 {
                let c = UdpSocket::bind(SocketAddr::new(at.ip(), 0)).await.unwrap();
                c.send_to(&[i; 3], at).await.unwrap();
                c.send_to(&[i + 100; 7], at).await.unwrap();
                clients.push(c);
            }
            let mut inbox = Inbox::new(32, 64);
            let mut seen = Vec::new();
            while seen.len() < 10 {
                server.readable().await.unwrap();
                let Ok(n) = inbox.recv(&server) else { continue };
                for i in 0..n {
                    let (pkt, src) = inbox.get(i);
                    seen.push((pkt.to_vec(), src));
                }
            }
            let mut out = Outbox::default();
            for (pkt, src) in &seen {
                let c = clients.iter().find(|c| c.local_addr().unwrap() == *src);
                assert!(c.is_some(), "sender {src} is one of the clients");
                let mut answer = pkt.clone();
                answer.push(0xAA);
                out.push(&answer, *src);
            }
            out.flush(&server);
            for (i, c) in clients.iter().enumerate() {
                let mut got = Vec::new();
                for _ in 0..2 {
                    let mut buf = [0u8; 64];
                    let n =
                        tokio::time::timeout(std::time::Duration::from_secs(5), c.recv(&mut buf))
                            .await
                            .expect("an answer arrives")
                            .unwrap();
                    got.push(buf[..n].to_vec());
                }
                got.sort();
                let i = i as u8;
                assert_eq!(
                    got,
                    vec![
                        [vec![i; 3], vec![0xAA]].concat(),
                        [vec![i + 100; 7], vec![0xAA]].concat()
                    ]
                );
            }
        }
    }

    /// A datagram longer than the buffer arrives cut to it, not as an
    /// error and not overrunning into the next buffer.
    #[tokio::test]
    async fn a_long_datagram_arrives_cut() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let at = server.local_addr().unwrap();
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.send_to(&[7u8; 100], at).await.unwrap();
        c.send_to(&[8u8; 5], at).await.unwrap();
        let mut inbox = Inbox::new(4, 16);
        let mut seen = Vec::new();
        while seen.len() < 2 {
            server.readable().await.unwrap();
            let Ok(n) = inbox.recv(&server) else { continue };
            for i in 0..n {
                seen.push(inbox.get(i).0.to_vec());
            }
        }
        assert_eq!(seen, vec![vec![7u8; 16], vec![8u8; 5]]);
    }
}
