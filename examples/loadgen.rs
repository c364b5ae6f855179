//! Load generator for `benches/load/run`: the parts wrk cannot do.
//!
//! Every mode talks to one address (`--to`, a proxy or the origin itself);
//! with `--connect HOST:PORT` it first opens a CONNECT tunnel through it.
//! Each run is bounded by `--secs` (or `--hold`) and prints one JSON object.
//!
//! ```text
//! loadgen latency --to ADDR --url http://host/path [--proxy] --rate R --secs S
//! loadgen bulk    --to ADDR --host H --path /big [--connect H:P] [--ca PEM] --secs S
//! loadgen tls     --to ADDR --sni H --ca ca.pem [--connect H:P] --conns N --secs S
//!                 [--keepalive [--h2]] [--resume] [--path /p] [--requests N]
//! loadgen idle    --to ADDR --connect H:P --n N --hold S
//! ```
//!
//! Only for loopback benchmarking: no retries, no redirects, HTTP/1.1 with a
//! Content-Length body (what nginx sends for static files).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest wait for any one response head or connect.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response head accepted.
const MAX_HEAD: usize = 16 << 10;

struct Args(Vec<String>);

impl Args {
    fn get(&self, name: &str) -> Option<&str> {
        let flag = format!("--{name}");
        self.0
            .iter()
            .position(|a| *a == flag)
            .and_then(|i| self.0.get(i + 1))
            .map(String::as_str)
    }
    fn req(&self, name: &str) -> &str {
        self.get(name)
            .unwrap_or_else(|| die(&format!("missing --{name}")))
    }
    fn num(&self, name: &str, default: f64) -> f64 {
        self.get(name)
            .map(|v| v.parse().unwrap_or_else(|_| die(&format!("bad --{name}"))))
            .unwrap_or(default)
    }
    fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| *a == format!("--{name}"))
    }
}

fn die(msg: &str) -> ! {
    eprintln!("loadgen: {msg}");
    std::process::exit(2)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(mode) = argv.first().cloned() else {
        die("usage: loadgen latency|bulk|tls|idle --to ADDR ...")
    };
    let args = Args(argv);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async {
        match mode.as_str() {
            "latency" => latency(&args).await,
            "bulk" => bulk(&args).await,
            "tls" => tls(&args).await,
            "idle" => idle(&args).await,
            m => die(&format!("unknown mode {m}")),
        }
    });
    match out {
        Ok(json) => println!("{json}"),
        Err(e) => die(&format!("{mode}: {e}")),
    }
}

fn addr(args: &Args) -> SocketAddr {
    args.req("to")
        .parse()
        .unwrap_or_else(|_| die("--to takes IP:PORT"))
}

async fn connect(to: SocketAddr) -> io::Result<TcpStream> {
    let s = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(to))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Opens a CONNECT tunnel to `authority` over `s`; fails on anything but 200.
async fn tunnel(s: &mut TcpStream, authority: &str) -> io::Result<()> {
    let req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut head = Vec::with_capacity(256);
    let mut b = [0u8; 1];
    // Byte by byte: nothing past the head may be swallowed.
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD || s.read(&mut b).await? == 0 {
            return Err(io::Error::other("CONNECT: no complete response"));
        }
        head.push(b[0]);
    }
    let status = std::str::from_utf8(&head)
        .ok()
        .and_then(|h| h.split(' ').nth(1))
        .unwrap_or("");
    if status != "200" {
        return Err(io::Error::other(format!("CONNECT answered {status}")));
    }
    Ok(())
}

/// Reads one response (head + Content-Length body) and returns
/// (status, body bytes). `buf` carries bytes read past the previous one.
async fn read_response<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    sink: bool,
) -> io::Result<(u16, u64)> {
    let mut chunk = vec![0u8; if sink { 256 << 10 } else { 16 << 10 }];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::other("response head too large"));
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed mid-head",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| io::Error::other("head not UTF-8"))?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("no status"))?;
    let len: u64 = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())
                .flatten()
        })
        .ok_or_else(|| io::Error::other("no Content-Length"))?;
    buf.drain(..end);
    let mut left = len;
    let have = (buf.len() as u64).min(left);
    buf.drain(..have as usize);
    left -= have;
    while left > 0 {
        let want = (chunk.len() as u64).min(left) as usize;
        let n = s.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed mid-body",
            ));
        }
        left -= n as u64;
    }
    Ok((status, len))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// One request on the kept connection, (re)connecting first when there is
/// none or the server closed it after its last response (tinyproxy closes
/// every client connection): the reconnect is part of what the client waits.
async fn request(
    conn: &mut Option<(TcpStream, Vec<u8>)>,
    to: SocketAddr,
    req: &[u8],
) -> io::Result<u16> {
    for attempt in 0..2 {
        let fresh = conn.is_none();
        if fresh {
            *conn = Some((connect(to).await?, Vec::new()));
        }
        let (s, buf) = conn.as_mut().expect("connected");
        let r = match s.write_all(req).await {
            Ok(()) => read_response(s, buf, false).await,
            Err(e) => Err(e),
        };
        match r {
            Ok((status, _)) => return Ok(status),
            // A kept connection the server had closed: once more on a new one.
            Err(_) if !fresh && attempt == 0 => *conn = None,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the second attempt returns")
}

/// Keep-alive GETs at a fixed rate over one connection; latency of each.
async fn latency(args: &Args) -> io::Result<String> {
    let to = addr(args);
    let url = args.req("url");
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| die("--url must be http://"));
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let target = if args.flag("proxy") { url } else { path };
    let req = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: loadgen\r\n\r\n");
    let rate = args.num("rate", 1000.0);
    let secs = args.num("secs", 5.0);
    let warm = args.num("warmup", 200.0) as usize;
    let mut conn = None;
    for _ in 0..warm {
        request(&mut conn, to, req.as_bytes()).await?;
    }
    let interval = Duration::from_secs_f64(1.0 / rate);
    let total = (rate * secs) as usize;
    let mut lat = Vec::with_capacity(total);
    let mut errors = 0u64;
    let start = tokio::time::Instant::now();
    // A server slower than the rate falls behind the schedule; past this
    // the run stops and reports how many requests it never sent, instead
    // of running on until the caller's timeout kills it.
    let give_up = start + Duration::from_secs_f64(secs * 1.5 + 5.0);
    let mut unsent = 0usize;
    for i in 0..total {
        if tokio::time::Instant::now() >= give_up {
            unsent = total - i;
            break;
        }
        tokio::time::sleep_until(start + interval * i as u32).await;
        let t = Instant::now();
        let status = request(&mut conn, to, req.as_bytes()).await?;
        lat.push(t.elapsed().as_nanos() as u64);
        if status != 200 {
            errors += 1;
        }
    }
    lat.sort_unstable();
    Ok(format!(
        "{{\"requests\":{},\"unsent\":{unsent},\"errors\":{errors},\"p50_us\":{:.1},\"p90_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1}}}",
        lat.len(),
        percentile(&lat, 0.50) as f64 / 1e3,
        percentile(&lat, 0.90) as f64 / 1e3,
        percentile(&lat, 0.99) as f64 / 1e3,
        percentile(&lat, 1.0) as f64 / 1e3,
    ))
}

/// One stream: GET a large body (through a CONNECT tunnel when asked),
/// again and again for `--secs`; MB/s over everything received.
async fn bulk(args: &Args) -> io::Result<String> {
    let to = addr(args);
    let host = args.req("host");
    let path = args.req("path");
    let secs = args.num("secs", 5.0);
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: loadgen\r\n\r\n");
    let mut s = connect(to).await?;
    if let Some(auth) = args.get("connect") {
        tunnel(&mut s, auth).await?;
    }
    // With --ca, the download runs over TLS to `host` (through the tunnel
    // when there is one): bytes a tunnel cannot read, as most are.
    if let Some(ca) = args.get("ca") {
        let mut cfg = (*tls_config(ca)).clone();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::other(format!("--host: {e}")))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, s)
            .await?;
        return bulk_on(tls, &req, secs).await;
    }
    bulk_on(s, &req, secs).await
}

async fn bulk_on<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &str,
    secs: f64,
) -> io::Result<String> {
    let mut buf = Vec::new();
    // One warm-up transfer (page cache, TCP windows). Each request is
    // flushed: over TLS a write may stay in the session's buffer until
    // then, and the download would wait for a request never sent.
    s.write_all(req.as_bytes()).await?;
    s.flush().await?;
    read_response(&mut s, &mut buf, true).await?;
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        s.write_all(req.as_bytes()).await?;
        s.flush().await?;
        let (status, len) = read_response(&mut s, &mut buf, true).await?;
        if status != 200 {
            return Err(io::Error::other(format!("status {status}")));
        }
        bytes += len;
        n += 1;
    }
    let t = start.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"transfers\":{n},\"bytes\":{bytes},\"secs\":{t:.3},\"mb_per_s\":{:.1}}}",
        bytes as f64 / t / 1e6
    ))
}

fn tls_config(ca: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap_or_else(|e| die(&format!("--ca: {e}"))) {
        roots
            .add(c.unwrap_or_else(|e| die(&format!("--ca: {e}"))))
            .unwrap_or_else(|e| die(&format!("--ca: {e}")));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(cfg)
}

/// TLS through a tunnel: each request a new connection, CONNECT, full
/// handshake (no resumption unless `--resume`), one GET, close — or, with
/// `--keepalive`, one tunnel per worker carrying GET after GET (HTTP/2
/// with `--h2`: one stream at a time, as HTTP/1.1 has one request).
/// Counts the handshakes that resumed a session.
async fn tls(args: &Args) -> io::Result<String> {
    let to = addr(args);
    let sni = args.req("sni").to_string();
    let path = args.get("path").unwrap_or("/").to_string();
    let h2 = args.flag("h2");
    let mut cfg = (*tls_config(args.req("ca"))).clone();
    if !args.flag("resume") {
        cfg.resumption = rustls::client::Resumption::disabled();
    }
    cfg.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let conns = args.num("conns", 8.0) as usize;
    let secs = args.num("secs", 5.0);
    let keepalive = args.flag("keepalive");
    if h2 && !keepalive {
        die("--h2 needs --keepalive");
    }
    let via = args.get("connect").map(str::to_string);
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let resumed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    // `--requests N`: stop after N requests in all (or at `--secs`), so a
    // profile's window holds a fixed count of them.
    let limit = args
        .get("requests")
        .map_or(u64::MAX, |_| args.num("requests", 0.0) as u64);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (connector, sni, via, path) =
            (connector.clone(), sni.clone(), via.clone(), path.clone());
        let (done, errors, resumed) = (done.clone(), errors.clone(), resumed.clone());
        tasks.push(tokio::spawn(async move {
            let req = format!("GET {path} HTTP/1.1\r\nHost: {sni}\r\nUser-Agent: loadgen\r\n\r\n");
            let name = ServerName::try_from(sni.clone()).expect("valid SNI");
            while Instant::now() < deadline && done.load(Ordering::Relaxed) < limit {
                let one = async {
                    let mut s = connect(to).await?;
                    if let Some(auth) = &via {
                        tunnel(&mut s, auth).await?;
                    }
                    let mut t = connector.connect(name.clone(), s).await?;
                    if t.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                        resumed.fetch_add(1, Ordering::Relaxed);
                    }
                    if h2 {
                        return h2_gets(t, &sni, &path, &done, deadline, limit).await;
                    }
                    let mut buf = Vec::new();
                    loop {
                        t.write_all(req.as_bytes()).await?;
                        let (status, _) = read_response(&mut t, &mut buf, false).await?;
                        if status != 200 {
                            return Err(io::Error::other(format!("status {status}")));
                        }
                        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if !keepalive || Instant::now() >= deadline || n >= limit {
                            break;
                        }
                    }
                    let _ = t.shutdown().await;
                    Ok::<_, io::Error>(())
                };
                let failed = match tokio::time::timeout(STEP_TIMEOUT, one).await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("timed out".to_string()),
                };
                if let Some(e) = failed {
                    if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("loadgen: tls: first error: {e}");
                    }
                }
            }
        }));
    }
    let start = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    let t = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    Ok(format!(
        "{{\"requests\":{n},\"errors\":{},\"resumed\":{},\"secs\":{t:.3},\"per_s\":{:.1}}}",
        errors.load(Ordering::Relaxed),
        resumed.load(Ordering::Relaxed),
        n as f64 / t
    ))
}

/// GET after GET on one HTTP/2 connection until `deadline`, one stream at
/// a time.
async fn h2_gets(
    t: tokio_rustls::client::TlsStream<TcpStream>,
    sni: &str,
    path: &str,
    done: &AtomicU64,
    deadline: Instant,
    limit: u64,
) -> io::Result<()> {
    use http_body_util::{BodyExt, Empty};
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(t),
    )
    .await
    .map_err(io::Error::other)?;
    tokio::spawn(conn);
    let uri: http::Uri = format!("https://{sni}{path}")
        .parse()
        .map_err(io::Error::other)?;
    while Instant::now() < deadline && done.load(Ordering::Relaxed) < limit {
        let req = http::Request::get(uri.clone())
            .header(http::header::USER_AGENT, "loadgen")
            .body(Empty::<bytes::Bytes>::new())
            .map_err(io::Error::other)?;
        send.ready().await.map_err(io::Error::other)?;
        let step = async {
            let resp = send.send_request(req).await.map_err(io::Error::other)?;
            let status = resp.status();
            resp.into_body().collect().await.map_err(io::Error::other)?;
            Ok::<_, io::Error>(status)
        };
        let status = tokio::time::timeout(STEP_TIMEOUT, step)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "h2 response timed out"))??;
        if status != 200 {
            return Err(io::Error::other(format!("status {status}")));
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Opens `--n` CONNECT tunnels (in waves, not to overflow a backlog), says
/// `ready` on stderr, holds them idle for `--hold` seconds, then closes them.
async fn idle(args: &Args) -> io::Result<String> {
    let to = addr(args);
    let auth = args.req("connect").to_string();
    let n = args.num("n", 1000.0) as usize;
    let hold = args.num("hold", 10.0);
    let wave = args.num("wave", 200.0) as usize;
    let start = Instant::now();
    let mut held: Vec<TcpStream> = Vec::with_capacity(n);
    let mut failed = 0usize;
    while held.len() + failed < n {
        let k = wave.min(n - held.len() - failed);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..k {
            let auth = auth.clone();
            set.spawn(async move {
                let mut s = connect(to).await?;
                tunnel(&mut s, &auth).await?;
                Ok::<_, io::Error>(s)
            });
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(s)) => held.push(s),
                Ok(Err(e)) => {
                    if failed == 0 {
                        eprintln!("loadgen: idle: {e}");
                    }
                    failed += 1
                }
                Err(_) => failed += 1,
            }
        }
    }
    let opened = start.elapsed().as_secs_f64();
    eprintln!("ready {}", held.len());
    tokio::time::sleep(Duration::from_secs_f64(hold)).await;
    let open = held.len();
    drop(held);
    Ok(format!(
        "{{\"open\":{open},\"failed\":{failed},\"open_secs\":{opened:.2}}}"
    ))
}
