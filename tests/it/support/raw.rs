//! Raw requests and raw sockets for the attack tests: request heads
//! written by hand (so that every byte is the one meant), a writer beside
//! the reader for bodies egressd answers before it has read them, and
//! connections and queries from a chosen loopback source address (one
//! client of a shared egressd, as its source identifies it).

use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::thread::JoinHandle;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;

use super::{
    dns_query, ede_text, host_of, read_response, without_request_id, Lab, Lines, Listener,
    Response, DEADLINE,
};

/// An absolute-form request for `path` on `host` at the lab's origin,
/// `extra` header lines after the Host header, and the empty line.
pub fn head_on<O: Listener>(
    l: &Lab<O>,
    host: &str,
    method: &str,
    path: &str,
    extra: &str,
) -> String {
    let p = l.port();
    format!("{method} http://{host}:{p}{path} HTTP/1.1\r\nHost: {host}:{p}\r\n{extra}\r\n")
}

/// [`head_on`] `allowed.test`, the name the labs' exceptions allow.
pub fn head<O: Listener>(l: &Lab<O>, method: &str, path: &str, extra: &str) -> String {
    head_on(l, "allowed.test", method, path, extra)
}

/// Writes `raw` to `s` on a thread of its own, so that the caller can
/// read the answer egressd gives before it has read everything (a write
/// that fails once egressd closed is not an error).
pub fn write_beside(s: &TcpStream, raw: impl AsRef<[u8]> + Send + 'static) -> JoinHandle<()> {
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let _ = w.write_all(raw.as_ref());
    })
}

/// A TCP connection to `to` from the loopback address `from`.
pub fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
    }
    let s = RT.with(|rt| {
        rt.block_on(async {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(SocketAddr::from((from, 0))).unwrap();
            sock.connect(to).await.unwrap().into_std().unwrap()
        })
    });
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s
}

/// One `GET` through the proxy from `from`, answered within `wait`.
pub fn get_from(from: Ipv4Addr, proxy: SocketAddr, url: &str, wait: Duration) -> Response {
    let mut s = connect_from(from, proxy);
    s.set_read_timeout(Some(wait)).unwrap();
    let host = host_of(url);
    s.write_all(
        format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    read_response(&mut BufReader::new(s))
        .unwrap_or_else(|| panic!("no answer to GET {url} from {from} within {wait:?}"))
}

/// One UDP query for `n` from `from`, answered within `wait`.
pub fn ask_from(from: Ipv4Addr, server: SocketAddr, n: &str, wait: Duration) -> Message {
    let s = UdpSocket::bind((from, 0)).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.send_to(&dns_query(n, RecordType::A).to_vec().unwrap(), server)
        .unwrap();
    let mut buf = vec![0u8; 65535];
    let (len, _) = s
        .recv_from(&mut buf)
        .unwrap_or_else(|e| panic!("no answer to {n} from {from} within {wait:?}: {e}"));
    Message::from_vec(&buf[..len]).unwrap()
}

/// `n` requests and `n` queries for `allowed.test` from `from`, each
/// answered (`200`, `NOERROR` with records) within `wait`.
pub fn assert_served(
    from: Ipv4Addr,
    proxy: SocketAddr,
    dns: SocketAddr,
    url: &str,
    n: usize,
    wait: Duration,
) {
    for i in 0..n {
        let r = get_from(from, proxy, url, wait);
        assert_eq!(r.status, 200, "request {i} from {from}: {}", r.text());
        let a = ask_from(from, dns, "allowed.test", wait);
        assert_eq!(
            a.metadata.response_code,
            ResponseCode::NoError,
            "query {i} from {from}: {a}"
        );
        assert!(!a.answers.is_empty(), "query {i} from {from}: {a}");
    }
}

/// The next `n` replies on `s`, each a refusal for being over the share
/// (`REFUSED`, EDE `egressd: overloaded`), received within [`DEADLINE`].
pub fn recv_overloaded(s: &UdpSocket, n: usize) {
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = vec![0u8; 65535];
    for i in 0..n {
        let (len, _) = s.recv_from(&mut buf).expect("a refusal at once");
        let r = Message::from_vec(&buf[..len]).unwrap();
        assert_eq!(
            r.metadata.response_code,
            ResponseCode::Refused,
            "reply {i}: {r}"
        );
        assert_eq!(
            ede_text(&r).map(|t| without_request_id(&t)).as_deref(),
            Some("egressd: overloaded"),
            "reply {i}"
        );
    }
}

/// `r` is a `503 overloaded`, and the next line says so for `client`.
pub fn assert_overloaded_for(r: &Response, lines: &mut Lines, client: &str) {
    assert_eq!(
        (r.status, r.reason()),
        (503, Some("overloaded")),
        "{}",
        r.text()
    );
    let line = lines.one("the refusal");
    assert_eq!(
        (line["reason"].as_str(), line["client"].as_str()),
        (Some("overloaded"), Some(client)),
        "{line}"
    );
}
