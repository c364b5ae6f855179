//! A raw HTTP/1.1 client: requests written byte for byte (attacks need
//! requests no library would send) and responses read by hand.
//!
//! Owns the client side of a connection; not the listeners (`origin.rs`).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};

use super::DEADLINE;

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        header_of(&self.headers, name)
    }
    pub fn reason(&self) -> Option<&str> {
        self.header("x-egressd-reason")
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s
}

/// One request on a new connection; reads one response.
pub fn http_request(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut r = BufReader::new(s);
    read_response(&mut r).expect("a response")
}

/// Reads one HTTP/1.1 response (Content-Length, chunked, or to EOF).
pub fn read_response(r: &mut impl BufRead) -> Option<Response> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
    let headers = read_head(r)?
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect::<Option<Vec<_>>>()?;
    let get = |n: &str| header_of(&headers, n);
    let mut body = Vec::new();
    if (100..200).contains(&status) && status != 101 {
        return read_response(r);
    }
    if status == 204 || status == 304 || status == 101 {
    } else if let Some(cl) = get("content-length") {
        body.resize(cl.parse().ok()?, 0);
        r.read_exact(&mut body).ok()?;
    } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        body = read_chunked(r)?;
    } else if status != 200 || get("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
        let _ = r.read_to_end(&mut body);
    }
    Some(Response {
        status,
        headers,
        body,
    })
}

/// The header lines of a message, up to the empty line; `None` at EOF
/// before it.
pub fn read_head(r: &mut impl BufRead) -> Option<Vec<String>> {
    let mut lines = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            return Some(lines);
        }
        lines.push(h.to_string());
    }
}

/// A chunked body, decoded (chunk extensions ignored, no trailers).
pub fn read_chunked(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut sz = String::new();
        r.read_line(&mut sz).ok()?;
        let n = usize::from_str_radix(sz.trim().split(';').next()?, 16).ok()?;
        let mut chunk = vec![0; n + 2];
        r.read_exact(&mut chunk).ok()?;
        if n == 0 {
            return Some(body);
        }
        body.extend_from_slice(&chunk[..n]);
    }
}

/// Sends `raw` on a new connection to `addr` and reads one response, or
/// `None` when the connection closed without one.
pub fn try_request(addr: SocketAddr, raw: &[u8]) -> Option<Response> {
    let mut s = connect(addr);
    s.write_all(raw).ok()?;
    let mut r = BufReader::new(s);
    read_response(&mut r)
}

/// Sends `raw` and reads responses until the proxy closes the connection:
/// every response it gave there, in order. The write side stays open (the
/// proxy may close on a half-close before answering everything), so the
/// last request in `raw` should close the connection (`Connection: close`,
/// a refused CONNECT, or framing that forces a close).
pub fn all_responses(addr: SocketAddr, raw: &[u8]) -> Vec<Response> {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut r = BufReader::new(s);
    let mut out = Vec::new();
    while let Some(resp) = read_response(&mut r) {
        let close = resp
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        out.push(resp);
        if close {
            break;
        }
    }
    out
}

/// `GET url` with a Host header naming `host`, as one raw request.
pub fn get_raw(url: &str) -> String {
    format!(
        "GET {url} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        host_of(url)
    )
}

/// `CONNECT authority` with no Host header.
pub fn connect_raw(authority: &str) -> String {
    format!("CONNECT {authority} HTTP/1.1\r\n\r\n")
}

/// The authority of an absolute URL.
pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map(|x| x.1).unwrap_or(url);
    rest.split('/').next().unwrap_or(rest)
}

/// The first value of header `name` (any case) in `headers`.
pub fn header_of<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// What `curl -i` printed: the last response (past a `100 Continue`, and
/// past the CONNECT's `200` when curl tunnels), its head and its body.
pub struct CurlAnswer<'a> {
    pub status: u16,
    pub head: &'a str,
    pub body: &'a str,
}

impl CurlAnswer<'_> {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Reads `curl -i`'s output; `None` when it holds no status line.
pub fn curl_answer(text: &str) -> Option<CurlAnswer<'_>> {
    let mut rest = text;
    while let Some((_, after)) = rest.split_once("\r\n\r\n") {
        if !after.starts_with("HTTP/") {
            break;
        }
        rest = after;
    }
    let (head, body) = rest.split_once("\r\n\r\n").unwrap_or((rest, ""));
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some(CurlAnswer { status, head, body })
}
