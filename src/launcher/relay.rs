//! `--connect` mode: the sandbox's proxy and resolver sockets lead to an
//! egressd that is already serving, by relaying bytes (TCP) and datagrams
//! (DNS over UDP) from outside the sandbox. The relay decides nothing: the
//! serving egressd sees every request, and identifies the sandbox by the
//! token in the proxy URL the sandbox was given. DNS carries no token, so
//! the serving egressd sees DNS queries as coming from the launcher's
//! address (its `sources:` clients apply).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Relayed TCP connections (proxy and DNS-over-TCP) open at once.
const MAX_CONNECTIONS: usize = 1024;
/// DNS-over-UDP queries awaiting an answer at once; more are dropped (the
/// client retries, as it would after a lost datagram).
const MAX_DNS_IN_FLIGHT: usize = 256;
/// Connecting to the serving egressd.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Waiting for the serving egressd's DNS answer.
const DNS_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest DNS message over UDP (EDNS payloads included).
const MAX_DATAGRAM: usize = 65_535;

/// The running relay; [`Relay::stop`] ends it.
pub struct Relay {
    tasks: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Relays `proxy` and `dns_tcp` to `to_proxy` / `to_dns` over TCP, and
    /// `dns_udp` to `to_dns` over UDP.
    pub fn start(
        proxy: TcpListener,
        dns_udp: UdpSocket,
        dns_tcp: TcpListener,
        to_proxy: SocketAddr,
        to_dns: SocketAddr,
    ) -> Relay {
        let conns = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        Relay {
            tasks: vec![
                tokio::spawn(relay_tcp(proxy, to_proxy, conns.clone())),
                tokio::spawn(relay_tcp(dns_tcp, to_dns, conns)),
                tokio::spawn(relay_udp(Arc::new(dns_udp), to_dns)),
            ],
        }
    }

    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

async fn relay_tcp(listener: TcpListener, to: SocketAddr, conns: Arc<Semaphore>) {
    loop {
        let Ok(permit) = conns.clone().acquire_owned().await else {
            return;
        };
        let mut inside = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, most likely: back off instead of spinning.
                eprintln!("egressd run: relay accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let _permit = permit;
            let mut outside =
                match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(to)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        eprintln!("egressd run: cannot reach egressd at {to}: {e}");
                        return;
                    }
                    Err(_) => {
                        eprintln!("egressd run: cannot reach egressd at {to}: timed out");
                        return;
                    }
                };
            let _ = copy_bidirectional(&mut inside, &mut outside).await;
        });
    }
}

async fn relay_udp(inside: Arc<UdpSocket>, to: SocketAddr) {
    let in_flight = Arc::new(Semaphore::new(MAX_DNS_IN_FLIGHT));
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, peer) = match inside.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(_) => {
                // An ICMP error for an earlier reply, say: nothing to do but
                // not spin either.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            continue;
        };
        let query = buf[..n].to_vec();
        let inside = inside.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let local: SocketAddr = if to.is_ipv4() {
                "0.0.0.0:0".parse().expect("literal")
            } else {
                "[::]:0".parse().expect("literal")
            };
            let Ok(sock) = UdpSocket::bind(local).await else {
                return;
            };
            if sock.connect(to).await.is_err() || sock.send(&query).await.is_err() {
                return;
            }
            let mut answer = vec![0u8; MAX_DATAGRAM];
            if let Ok(Ok(m)) = tokio::time::timeout(DNS_TIMEOUT, sock.recv(&mut answer)).await {
                let _ = inside.send_to(&answer[..m], peer).await;
            }
        });
    }
}
