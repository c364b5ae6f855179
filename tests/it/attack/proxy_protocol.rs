//! `serve --dns-proxy-protocol`: a PROXY protocol v2 header names a DNS
//! query's client only when it comes from a listed balancer. A client that
//! sends one itself cannot take another client's identity (and budget, and
//! line); a listed balancer's query without one is refused, never answered
//! as the balancer's.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use hickory_proto::op::Message;
use hickory_proto::rr::RecordType;

use super::*;

/// A v2 PROXY header for a UDP query from `client`.
fn header(client: SocketAddr) -> Vec<u8> {
    let SocketAddr::V4(c) = client else {
        unreachable!()
    };
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x12, 0, 12]);
    h.extend_from_slice(&c.ip().octets());
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&c.port().to_be_bytes());
    h.extend_from_slice(&53u16.to_be_bytes());
    h
}

/// Sends `bytes` from `ip` to `to`: the reply, if one comes.
fn send_from(ip: [u8; 4], to: SocketAddr, bytes: &[u8]) -> Option<Message> {
    let s = UdpSocket::bind((Ipv4Addr::from(ip), 0)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    s.send_to(bytes, to).unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = s.recv_from(&mut buf).ok()?;
    Message::from_vec(&buf[..n]).ok()
}

#[test]
fn a_proxy_header_is_believed_only_from_a_listed_balancer() {
    let l = lab()
        .names(&["allowed.test"])
        .egressd(|b| b.arg("--dns-proxy-protocol").arg("127.0.0.5"))
        .start(|_| {
            policy()
                .setting("private_destinations", "allow")
                .client_from("victim", &["127.0.0.66/32"])
                .exception("a")
                .host("allowed.test")
                .client("victim")
        });
    let e = &l.e;
    let q = dns_query("allowed.test", RecordType::A).to_vec().unwrap();
    let victim: SocketAddr = "127.0.0.66:5353".parse().unwrap();

    // An attacker (not listed) claims the victim's address: the header is
    // not read, so the datagram is no DNS query; nothing is answered as the
    // victim, and no line names the victim.
    let mut forged = header(victim);
    forged.extend_from_slice(&q);
    let r = send_from([127, 0, 0, 9], e.dns, &forged);
    assert!(
        r.as_ref().is_none_or(|m| m.answers.is_empty()),
        "answered a forged header: {r:?}"
    );
    // Plainly, the attacker is itself, and not allowed.
    let r = send_from([127, 0, 0, 9], e.dns, &q).expect("an answer");
    assert_dns_denied(&r, "client_not_allowed", "allowed.test");

    // The listed balancer, for the victim: answered, logged as the victim.
    let mut proxied = header(victim);
    proxied.extend_from_slice(&q);
    let r = send_from([127, 0, 0, 5], e.dns, &proxied).expect("an answer");
    assert!(!r.answers.is_empty(), "{r:?}");
    let line = e.wait_line("the victim's line", |l| {
        l["qname"] == "allowed.test" && l["decision"] == "allow"
    });
    assert_eq!(
        (&line["client"], &line["src"]),
        (&"victim".into(), &"127.0.0.66:5353".into())
    );

    // The listed balancer without a header: refused, not answered as the
    // balancer, with a line saying why.
    assert!(send_from([127, 0, 0, 5], e.dns, &q).is_none());
    let line = e.wait_line("the unproxied line", |l| {
        l["reason"] == "malformed"
            && l["src"]
                .as_str()
                .is_some_and(|s| s.starts_with("127.0.0.5:"))
    });
    assert!(
        line["note"]
            .as_str()
            .unwrap()
            .contains("--dns-proxy-protocol source"),
        "{line}"
    );
    // Over TCP: the header first, then length-prefixed queries.
    let tcp_from = |ip: [u8; 4], first: &[u8]| -> Option<Message> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let mut s = rt.block_on(async {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(SocketAddr::from((Ipv4Addr::from(ip), 0)))
                .unwrap();
            sock.connect(e.dns).await.unwrap().into_std().unwrap()
        });
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut out = first.to_vec();
        out.extend_from_slice(&(q.len() as u16).to_be_bytes());
        out.extend_from_slice(&q);
        s.write_all(&out).unwrap();
        let mut len = [0u8; 2];
        s.read_exact(&mut len).ok()?;
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut buf).ok()?;
        Message::from_vec(&buf).ok()
    };
    let tcp_victim: SocketAddr = "127.0.0.66:6000".parse().unwrap();
    let r = tcp_from([127, 0, 0, 5], &header(tcp_victim)).expect("an answer over TCP");
    assert!(!r.answers.is_empty(), "{r:?}");
    e.wait_line("the victim's TCP line", |l| {
        l["src"] == "127.0.0.66:6000" && l["client"] == "victim" && l["decision"] == "allow"
    });
    assert!(tcp_from([127, 0, 0, 5], &[]).is_none(), "no header: closed");
    let r = tcp_from([127, 0, 0, 9], &header(tcp_victim));
    assert!(r.as_ref().is_none_or(|m| m.answers.is_empty()), "{r:?}");

    // Every line that names the victim came through the balancer for it.
    for l in e.log_lines().iter().filter(|l| l["client"] == "victim") {
        let src = l["src"].as_str().unwrap();
        assert!(src == "127.0.0.66:5353" || src == "127.0.0.66:6000", "{l}");
    }
}
