//! The forward proxy's fast path against hyper (`src/proxy/fast.rs`):
//! every request head the fast path takes, hyper's server (configured as
//! egressd configures it) also takes, as the same method and target, with
//! the same headers (less the hop-by-hop ones the fast path drops and the
//! `Host` it checks), the same connection persistence, and ending at the
//! same byte: a request put right behind it is the next request hyper
//! reads, not a body. A head the fast path does not take goes to hyper
//! anyway, so only what it takes needs to agree.

use std::sync::{Arc, Mutex};

use egressd::proxy::fast::reading;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

const SENTINEL: &[u8] = b"GET http://sentinel.test/next HTTP/1.1\r\nhost: sentinel.test\r\n\r\n";

type Seen = Arc<Mutex<Vec<(Method, Uri, Version, HeaderMap)>>>;

/// The requests hyper's HTTP/1 server reads from `input` (sent whole, the
/// connection left open): until it has read `want`, closed the connection,
/// or a second passed (only a disagreement waits that long).
pub fn hyper_reads(input: &[u8], want: usize) -> Vec<(Method, Uri, Version, HeaderMap)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let enough = Arc::new(tokio::sync::Notify::new());
    let e2 = enough.clone();
    rt.block_on(async move {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client.write_all(input).await.unwrap();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (s, e) = (s2.clone(), e2.clone());
            async move {
                let (p, _) = req.into_parts();
                let mut s = s.lock().unwrap();
                s.push((p.method, p.uri, p.version, p.headers));
                if s.len() >= want {
                    e.notify_one();
                }
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"ok",
                ))))
            }
        });
        // As `proxy::accept::serve_http1` builds it.
        let conn = hyper::server::conn::http1::Builder::new()
            .max_buf_size(egressd::proxy::MAX_HEADER_BYTES)
            .max_header_size(egressd::proxy::MAX_HEADER_BYTES)
            .keep_alive(true)
            .serve_connection(TokioIo::new(server), svc)
            .with_upgrades();
        // The client half stays open (not read: answers fit the duplex).
        tokio::select! {
            _ = conn => {}
            _ = enough.notified() => {}
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
        drop(client);
    });
    let v = std::mem::take(&mut *seen.lock().unwrap());
    v
}

pub fn run(data: &[u8]) {
    if data.len() > 70_000 {
        return;
    }
    let Some(fast) = reading(data) else { return };
    let head = &data[..fast.head_len];
    let mut input = head.to_vec();
    input.extend_from_slice(SENTINEL);
    let want = if fast.keep_alive { 2 } else { 1 };
    let seen = hyper_reads(&input, want);
    let show = || String::from_utf8_lossy(head).into_owned();
    assert!(
        !seen.is_empty(),
        "the fast path took a head hyper refuses: {:?}",
        show()
    );
    let (method, uri, version, headers) = &seen[0];
    assert_eq!(method.as_str(), fast.method, "method of {:?}", show());
    assert_eq!(*uri, fast.uri, "target of {:?}", show());
    assert_eq!(*version, Version::HTTP_11, "version of {:?}", show());
    // Where the head ends: the sentinel is hyper's next request (unless
    // the request closes the connection, when there is no next one).
    assert_eq!(
        seen.len(),
        want,
        "hyper did not read the request behind {:?} as the next one",
        show()
    );
    if fast.keep_alive {
        assert_eq!(seen[1].1, "http://sentinel.test/next", "after {:?}", show());
    }
    // The headers: hyper's, less Host and the hop-by-hop ones, are the
    // forwarded ones (as multisets of lower-case name and value).
    let hop = [
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "proxy-authenticate",
    ];
    let mut theirs: Vec<(String, Vec<u8>)> = headers
        .iter()
        .filter(|(n, _)| !hop.contains(&n.as_str()))
        .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
        .collect();
    let mut ours: Vec<(String, Vec<u8>)> = fast
        .forwarded
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
        .collect();
    theirs.sort();
    ours.sort();
    assert_eq!(ours, theirs, "headers of {:?}", show());
    // Persistence: `Connection: close` (any token list naming it) ends
    // the connection for both.
    let closes = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
    assert_eq!(fast.keep_alive, !closes, "persistence of {:?}", show());
}
