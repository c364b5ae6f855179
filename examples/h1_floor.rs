//! The floor under any purpose-built HTTP/1 forward path: how fast a
//! Tokio + `httparse` forwarder is when it does nothing but parse and
//! relay. Issue #17 asked whether replacing hyper on egressd's forward path
//! with a path of our own on `httparse` would pay; this program is the
//! measuring instrument for that question, not a proxy. It decides nothing,
//! logs nothing, resolves nothing, checks no address and no framing beyond
//! what relaying a `Content-Length` response needs: every one of those a
//! real path would add back. So its GETs/s and CPU per GET bound from above
//! what such a path could reach on the same machine, runtime and sockets
//! (`benches/load/run --only http --floor`).
//!
//!     cargo run --release --example h1_floor -- LISTEN ORIGIN
//!
//! Absolute-form `GET http://name/path` requests on LISTEN are sent, in
//! origin form, to ORIGIN (an `IP:PORT`; the name is not looked at) over
//! one kept-alive origin connection per client connection. Anything it
//! does not understand closes the connection.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Heads larger than this close the connection (egressd's bound too).
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, origin] = args.as_slice() else {
        eprintln!("usage: h1_floor LISTEN ORIGIN");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().expect("LISTEN is IP:PORT");
    let origin: SocketAddr = origin.parse().expect("ORIGIN is IP:PORT");
    let l = TcpListener::bind(listen).await.expect("bind");
    loop {
        let Ok((c, _)) = l.accept().await else {
            continue;
        };
        let _ = c.set_nodelay(true);
        tokio::spawn(async move {
            let _ = serve(c, origin).await;
        });
    }
}

type Res = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn serve(mut client: TcpStream, origin: SocketAddr) -> Res {
    let mut up: Option<TcpStream> = None;
    let mut inbuf = Vec::with_capacity(8192);
    let mut upbuf = Vec::with_capacity(16 * 1024);
    let mut out = Vec::with_capacity(4096);
    loop {
        // Request head.
        let (head_len, path, keep) = loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&inbuf)? {
                httparse::Status::Complete(n) => {
                    let target = req.path.ok_or("no target")?;
                    let rest = target.strip_prefix("http://").ok_or("not absolute-form")?;
                    let path = rest.find('/').map_or("/", |i| &rest[i..]).to_string();
                    out.clear();
                    out.extend_from_slice(req.method.ok_or("no method")?.as_bytes());
                    out.push(b' ');
                    out.extend_from_slice(path.as_bytes());
                    out.extend_from_slice(b" HTTP/1.1\r\n");
                    let mut keep = req.version == Some(1);
                    for h in req.headers.iter() {
                        if h.name.eq_ignore_ascii_case("proxy-connection")
                            || h.name.eq_ignore_ascii_case("connection")
                        {
                            keep &= !h.value.eq_ignore_ascii_case(b"close");
                            continue;
                        }
                        if h.name.eq_ignore_ascii_case("content-length")
                            || h.name.eq_ignore_ascii_case("transfer-encoding")
                        {
                            return Err("request bodies are not relayed".into());
                        }
                        out.extend_from_slice(h.name.as_bytes());
                        out.extend_from_slice(b": ");
                        out.extend_from_slice(h.value);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"\r\n");
                    break (n, path, keep);
                }
                httparse::Status::Partial => {
                    if inbuf.len() >= MAX_HEAD {
                        return Err("head too large".into());
                    }
                    if client.read_buf(&mut inbuf).await? == 0 {
                        return Ok(());
                    }
                }
            }
        };
        let _ = path;
        inbuf.drain(..head_len);
        let upstream = match &mut up {
            Some(u) => u,
            None => {
                let u = TcpStream::connect(origin).await?;
                u.set_nodelay(true)?;
                up.insert(u)
            }
        };
        upstream.write_all(&out).await?;
        // Response head.
        let (head_len, body_len) = loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&upbuf)? {
                httparse::Status::Complete(n) => {
                    let len = resp
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
                        .ok_or("only Content-Length responses are relayed")?;
                    break (n, len);
                }
                httparse::Status::Partial => {
                    if upbuf.len() >= MAX_HEAD {
                        return Err("response head too large".into());
                    }
                    if upstream.read_buf(&mut upbuf).await? == 0 {
                        return Err("origin closed".into());
                    }
                }
            }
        };
        // Head and body as they came; the rest of the body streamed.
        let total = head_len + body_len;
        let have = upbuf.len().min(total);
        client.write_all(&upbuf[..have]).await?;
        upbuf.drain(..have);
        let mut left = total - have;
        while left > 0 {
            upbuf.clear();
            let n = upstream.read_buf(&mut upbuf).await?;
            if n == 0 {
                return Err("origin closed mid-body".into());
            }
            let take = n.min(left);
            client.write_all(&upbuf[..take]).await?;
            left -= take;
            upbuf.drain(..take);
        }
        if !keep {
            return Ok(());
        }
    }
}
