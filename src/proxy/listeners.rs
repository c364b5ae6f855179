//! egressd's TCP listeners, named to every other egressd of the host, so
//! that no egressd proxy dials one: not its own (`upstream::is_own_listener`
//! knows those), not another's.
//!
//! The case it closes: `egressd run` on a host where an `egressd serve`
//! also runs, under a policy whose `cidrs` open the host's loopback (or
//! its addresses) on that serve's ports. The embedded proxy dials from the
//! host's loopback, so the serve took the box for a command on the host:
//! its `/denials` (other clients' denied hosts, paths and identities), its
//! `/metrics`, and its proxy, where the box would be a loopback client
//! under another policy. A policy cannot say "loopback, but not egressd";
//! egressd says it for every policy.
//!
//! How: a process that binds listeners on the host ([`announce`], from
//! `app::Listeners::bind`) also binds, per TCP port, a Unix datagram socket
//! in the abstract namespace, `egressd-listener-tcp-PORT`. Abstract names
//! belong to the network namespace, need no file and no permission, and
//! vanish with the process, so the registry is never stale and is exactly
//! as wide as loopback is. Before dialling an address the policy allowed,
//! [`another_egressd`] asks whether the port is named (one `connect` on a
//! fresh datagram socket, which fails at once when it is not) and only
//! then whether the address is one of this host's (loopback and unspecified
//! are; another is if it can be bound). Public addresses are not asked
//! about (see [`another_egressd`]). A datagram socket is used because
//! it has no backlog to fill: the check never blocks.
//!
//! Not covered: a public address of this host (see [`another_egressd`]);
//! an egressd in another network namespace (whose loopback
//! the proxy cannot reach either); a port whose name a local process holds
//! first (then that process's holding decides, for local addresses only —
//! a local user can read the listener directly anyway).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};

/// The abstract name of TCP `port`'s listener.
fn name(port: u16) -> String {
    format!("egressd-listener-tcp-{port}")
}

/// The names this process holds; dropping it takes them back.
#[derive(Debug, Default)]
pub struct Announced {
    _held: Vec<UnixDatagram>,
}

/// Names the ports of `addrs` (this process's TCP listeners on the host)
/// to the host's other egressd processes. A name another process holds
/// already (an egressd on the same port at another address) stays theirs:
/// the port is named either way.
pub fn announce(addrs: &[SocketAddr]) -> io::Result<Announced> {
    let mut held = Vec::with_capacity(addrs.len());
    for a in addrs {
        let addr = UnixAddr::from_abstract_name(name(a.port()))?;
        match UnixDatagram::bind_addr(&addr) {
            Ok(s) => held.push(s),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot name the listener on {a} to other egressd processes: {e}"),
                ))
            }
        }
    }
    Ok(Announced { _held: held })
}

/// Whether `dest` is a listener of an egressd on this host. When the
/// answer cannot be had (no socket to ask with), it is yes: fail closed.
///
/// Only non-public addresses are asked about, those only `cidrs:` (or
/// `private_destinations: allow`) open: loopback, the host's private and
/// ULA addresses. A public address of this host is the world's to reach
/// already, and a peer there is not on loopback, so `/denials` refuses it;
/// asking would cost every ordinary dial three system calls (5.9 µs in a
/// debug build) where it now costs none.
pub fn another_egressd(dest: SocketAddr) -> bool {
    let ip = crate::policy::canonical_ip(dest.ip());
    !crate::policy::addr::is_public(ip) && port_named(dest.port()) && is_local(ip)
}

fn port_named(port: u16) -> bool {
    let Ok(addr) = UnixAddr::from_abstract_name(name(port)) else {
        return true;
    };
    let Ok(s) = UnixDatagram::unbound() else {
        return true;
    };
    s.connect_addr(&addr).is_ok()
}

/// Whether `ip` is an address of this host (as the proxy would reach it).
fn is_local(ip: IpAddr) -> bool {
    let ip = crate::policy::canonical_ip(ip);
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    // Only an address of this host can be bound (no IP_FREEBIND).
    match std::net::UdpSocket::bind(SocketAddr::new(ip, 0)) {
        Ok(_) => true,
        Err(e) => e.kind() != io::ErrorKind::AddrNotAvailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_port_on_a_local_address_is_another_egressd_until_the_name_goes() {
        // A port no test listens on, named here only.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), port);
        assert!(!another_egressd(at("127.0.0.1")));
        let held = announce(&[l.local_addr().unwrap()]).unwrap();
        for ip in [
            "127.0.0.1",
            "127.0.0.53",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
        ] {
            assert!(another_egressd(at(ip)), "{ip}");
        }
        // A remote address on the same port is another service.
        assert!(!another_egressd(at("192.0.2.77")));
        assert!(!another_egressd(SocketAddr::new(
            "127.0.0.1".parse().unwrap(),
            port.wrapping_add(1).max(1)
        )));
        // Announcing again (a second listener on the port) is no error.
        let again = announce(&[l.local_addr().unwrap()]).unwrap();
        drop(again);
        assert!(another_egressd(at("127.0.0.1")));
        drop(held);
        assert!(!another_egressd(at("127.0.0.1")));
    }

    /// What the check costs a dial whose port no egressd names (the usual
    /// case): `cargo test --lib listeners_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn listeners_cost() {
        let n = 100_000;
        for dest in ["151.101.0.223:443", "10.1.2.3:443"] {
            let dest: SocketAddr = dest.parse().unwrap();
            let t = std::time::Instant::now();
            for _ in 0..n {
                assert!(!another_egressd(dest));
            }
            println!("another_egressd({dest}): {:?} per dial", t.elapsed() / n);
        }
    }
}
