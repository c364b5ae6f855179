//! The forward proxy's fast path (`src/proxy/fast.rs`) end to end: the
//! answers it relays in every framing an origin uses, the 502s for
//! answers framed two ways, the hand-off to hyper in the middle of a kept
//! connection, pooled origin connections an origin closed while idle, and
//! one line per request throughout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use crate::support::*;

fn allow(port: u16) -> PolicyYaml {
    policy()
        .exception("origin")
        .host("allowed.test")
        .cidr(LOOPBACK)
        .port(port)
}

fn raw_lab(script: impl Fn(&Seen) -> Act + Send + Sync + 'static) -> Lab<RawOrigin> {
    lab_with(raw_origin(script))
        .names(&["allowed.test"])
        .start(|ports| allow(ports.origin))
}

fn get(l: &Lab<RawOrigin>, path: &str, extra: &str) -> String {
    let p = l.port();
    format!("GET http://allowed.test:{p}{path} HTTP/1.1\r\nHost: allowed.test:{p}\r\n{extra}\r\n")
}

/// The origin's answer for each path, in the framing the path names.
fn framings(r: &Seen) -> Act {
    let body = match r.target.as_str() {
        "/chunked" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kept: 1\r\n\r\n\
                       5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
            .to_string(),
        "/length" => "HTTP/1.1 203 Partial Thing\r\nContent-Length: 11\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\r\nhello world".to_string(),
        "/empty" => "HTTP/1.1 204 No Content\r\n\r\n".to_string(),
        "/interim" => "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string(),
        "/both" => "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_string(),
        "/two-lengths" => "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_string(),
        "/gzip-chunked" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n".to_string(),
        "/bad-chunk" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n".to_string(),
        other => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{other}", other.len()),
    };
    Act::Reply(body.into_bytes())
}

#[test]
fn every_framing_an_origin_uses_reaches_the_client_whole_with_one_line_each() {
    let l = raw_lab(framings);
    let mut lines = Lines::new(&l.e);
    let mut s = connect(l.e.proxy);
    let mut r = BufReader::new(s.try_clone().unwrap());
    // One kept connection, one request after the other.
    for (path, status, body) in [
        ("/chunked", 200, "hello world"),
        ("/length", 203, "hello world"),
        ("/empty", 204, ""),
        ("/interim", 200, "ok"),
    ] {
        s.write_all(get(&l, path, "").as_bytes()).unwrap();
        let resp = read_response(&mut r).unwrap_or_else(|| panic!("no answer for {path}"));
        assert_eq!(resp.status, status, "{path}: {}", resp.text());
        assert_eq!(resp.text(), body, "{path}");
        assert_eq!(resp.header("via"), Some("1.1 egressd"), "{path}");
        assert!(
            resp.header("x-hop").is_none(),
            "{path}: a header Connection names"
        );
        let line = lines.one(path);
        assert_eq!(line["decision"], "allow", "{path}");
        assert_eq!(line["status"], status, "{path}");
        assert_eq!(line["bytes_down"], body.len(), "{path}");
        assert_eq!(line["path"], path);
        assert!(line["error"].is_null(), "{path}: {line}");
    }
    // The reason phrase is the origin's; trailers and extensions are not
    // forwarded (re-framed by egressd).
    s.write_all(get(&l, "/chunked", "").as_bytes()).unwrap();
    let mut head = read_head(&mut r).unwrap();
    assert_eq!(head.remove(0), "HTTP/1.1 200 OK");
    assert!(
        head.iter().any(|h| h.eq_ignore_ascii_case("x-kept: 1")),
        "{head:?}"
    );
    let mut raw = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        raw.extend_from_slice(line.as_bytes());
        if line == "\r\n" && raw.ends_with(b"0\r\n\r\n") {
            break;
        }
    }
    assert_eq!(raw, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    lines.one("chunked again");
    s.write_all(get(&l, "/length", "").as_bytes()).unwrap();
    let head = read_head(&mut r).unwrap();
    assert_eq!(head[0], "HTTP/1.1 203 Partial Thing");
    let mut body = [0u8; 11];
    r.read_exact(&mut body).unwrap();
    lines.one("length again");
    // Every request went to the origin on one connection.
    assert_eq!(l.origin.raw.lock().unwrap().len(), 1);
    lines.done("framings");
}

#[test]
fn a_head_answer_carries_the_length_and_no_body_and_the_connection_goes_on() {
    let l = raw_lab(framings);
    let mut s = connect(l.e.proxy);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let p = l.port();
    s.write_all(
        format!("HEAD http://allowed.test:{p}/abcdef HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let head = read_head(&mut r).unwrap();
    assert_eq!(head[0], "HTTP/1.1 200 OK");
    assert!(
        head.iter()
            .any(|h| h.eq_ignore_ascii_case("content-length: 7")),
        "{head:?}"
    );
    // The next answer starts right after the head: no body came.
    s.write_all(get(&l, "/next", "").as_bytes()).unwrap();
    let resp = read_response(&mut r).unwrap();
    assert_eq!(resp.text(), "/next");
    assert_eq!(l.origin.requests()[0].method, "HEAD");
}

/// Answers framed two ways (or in a coding egressd does not decode, or
/// with a broken chunk) are never relayed as they are: a 502 before the
/// head, an error line and a closed connection mid-body; the origin
/// connection that carried one is not used again.
#[test]
fn answers_framed_two_ways_are_refused_and_their_connection_dropped() {
    let l = raw_lab(framings);
    let mut lines = Lines::new(&l.e);
    for path in ["/both", "/two-lengths", "/gzip-chunked"] {
        let resp = http_request(l.e.proxy, get(&l, path, "").as_bytes());
        assert_eq!(resp.status, 502, "{path}: {}", resp.text());
        let line = lines.one(path);
        assert_eq!(line["status"], 502, "{path}");
        assert!(
            line["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{line}"
        );
    }
    // A chunk whose data runs past its size: a 502 when egressd sees it
    // before it sent the head (the whole answer came in one read, as
    // usually); otherwise the head went out and the client's connection
    // is closed short of a complete body. Never a body that ends.
    let mut s = connect(l.e.proxy);
    s.write_all(get(&l, "/bad-chunk", "").as_bytes()).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 502") || text.starts_with("HTTP/1.1 200 OK"),
        "{text}"
    );
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "a broken body ended as complete: {text}"
    );
    let line = lines.one("bad chunk");
    assert!(
        line["error"].as_str().is_some_and(|e| e.contains("CRLF")),
        "{line}"
    );
    // Each of the four went on a connection of its own.
    assert_eq!(l.origin.raw.lock().unwrap().len(), 4);
}

/// A kept connection on which the fast path serves a GET, then meets a
/// request it leaves to hyper (a POST with a body, then a denied GET):
/// hyper reads each from its first byte, and every request is decided,
/// answered and logged once.
#[test]
fn a_connection_moves_to_hyper_at_the_first_request_the_fast_path_leaves() {
    let l = raw_lab(ok_reply);
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let mut s = connect(l.e.proxy);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let post = format!(
        "POST http://allowed.test:{p}/form HTTP/1.1\r\nHost: allowed.test:{p}\r\nContent-Length: 4\r\n\r\nGET "
    );
    // Sent together: the POST's body looks like the start of a request.
    s.write_all(format!("{}{post}", get(&l, "/first", "")).as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut r).unwrap().text(), "/first");
    assert_eq!(read_response(&mut r).unwrap().text(), "/form");
    s.write_all(b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        .unwrap();
    let denied = read_response(&mut r).unwrap();
    assert_eq!(denied.status, 403);
    s.write_all(get(&l, "/last", "").as_bytes()).unwrap();
    assert_eq!(read_response(&mut r).unwrap().text(), "/last");
    let got: Vec<String> = lines
        .next_n("four requests", 4)
        .iter()
        .map(|l| format!("{} {} {}", l["method"], l["path"], l["decision"]))
        .collect();
    assert_eq!(
        got,
        [
            "\"GET\" \"/first\" \"allow\"",
            "\"POST\" \"/form\" \"allow\"",
            "\"GET\" \"/\" \"deny\"",
            "\"GET\" \"/last\" \"allow\""
        ]
    );
    let seen: Vec<(String, Vec<u8>)> = l
        .origin
        .requests()
        .into_iter()
        .map(|r| (r.target, r.body))
        .collect();
    assert_eq!(
        seen,
        [
            ("/first".to_string(), vec![]),
            ("/form".to_string(), b"GET ".to_vec()),
            ("/last".to_string(), vec![]),
        ]
    );
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

/// An origin on loopback that serves each connection it accepts on a
/// thread of its own with `serve` (the connection, and a reader of it);
/// its port, and how many connections it has accepted.
fn counting_origin(
    serve: impl Fn(TcpStream, &mut BufReader<TcpStream>) + Clone + Send + 'static,
) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = conns.clone();
    thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let serve = serve.clone();
            thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                serve(s, &mut r);
            });
        }
    });
    (port, conns)
}

/// An origin that closes each connection a moment after answering (as
/// servers close idle keep-alive connections): the next request through
/// egressd finds its pooled connection gone and goes on a new one, with
/// no 502, sent once.
#[test]
fn a_pooled_connection_the_origin_closed_is_not_used() {
    let (port, conns) = counting_origin(|mut s, r| {
        if read_head(r).is_some() {
            let _ = s.write_all(OK);
        }
        // Closed after one answer, although it said keep-alive.
    });
    let l = lab().names(&["allowed.test"]).start(|_| allow(port));
    let mut lines = Lines::new(&l.e);
    let url = format!("http://allowed.test:{port}/");
    for i in 0..3 {
        let resp = http_request(
            l.e.proxy,
            format!("GET {url} HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n").as_bytes(),
        );
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        // Whether its close reached egressd before this request (the pooled
        // connection is seen closed) or after (the request meets a closed
        // connection and goes again on a new one), the answer is the same.
        assert_eq!(conns.load(Ordering::SeqCst), i + 1);
        let line = lines.one("get");
        assert_eq!(line["status"], 200);
    }
    assert_eq!(conns.load(Ordering::SeqCst), 3);
}

/// As many requests at once to one origin as a busy sandbox sends: every
/// origin connection they opened is kept, so the next burst of the same
/// size opens none. (With 64 kept per address, each burst past 64 opened
/// and closed a connection per request beyond it.)
#[test]
fn a_burst_of_concurrent_requests_leaves_every_origin_connection_pooled() {
    const AT_ONCE: usize = 100;
    // The origin answers only when AT_ONCE requests are waiting, so each
    // burst has AT_ONCE origin connections busy at the same moment.
    let all_in = Arc::new(std::sync::Barrier::new(AT_ONCE));
    let (port, conns) = counting_origin(move |mut s, r| {
        while read_head(r).is_some() {
            all_in.wait();
            if s.write_all(OK).is_err() {
                return;
            }
        }
    });
    let l = lab().names(&["allowed.test"]).start(|_| allow(port));
    let mut lines = Lines::new(&l.e);
    let burst = |round: usize| {
        let proxy = l.e.proxy;
        let clients: Vec<_> = (0..AT_ONCE)
            .map(|i| {
                thread::spawn(move || {
                    let req = format!(
                        "GET http://allowed.test:{port}/r{round}/{i} HTTP/1.1\r\n\
                         Host: allowed.test:{port}\r\n\r\n"
                    );
                    http_request(proxy, req.as_bytes()).status
                })
            })
            .collect();
        for c in clients {
            assert_eq!(c.join().unwrap(), 200, "round {round}");
        }
    };
    burst(1);
    // A request's line is written after its origin connection went back
    // to the pool: all lines in means all connections returned.
    let first = lines.next_n("the first burst", AT_ONCE);
    assert!(first.iter().all(|l| l["status"] == 200), "{first:?}");
    assert_eq!(conns.load(Ordering::SeqCst), AT_ONCE);
    burst(2);
    lines.next_n("the second burst", AT_ONCE);
    assert_eq!(
        conns.load(Ordering::SeqCst),
        AT_ONCE,
        "the second burst opened origin connections instead of reusing the pool's"
    );
}

/// Pipelined GETs, sent in one write: each answered in order, each its
/// own line.
#[test]
fn pipelined_gets_are_answered_in_order() {
    let l = raw_lab(ok_reply);
    let mut lines = Lines::new(&l.e);
    let mut s = connect(l.e.proxy);
    let all: String = (0..5).map(|i| get(&l, &format!("/p{i}"), "")).collect();
    s.write_all(all.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for i in 0..5 {
        assert_eq!(read_response(&mut r).unwrap().text(), format!("/p{i}"));
    }
    assert_eq!(lines.next_n("five", 5).len(), 5);
}
