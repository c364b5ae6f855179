//! Request smuggling: CL.TE, TE.CL, duplicate Content-Length, obfuscated
//! Transfer-Encoding, obs-fold, bare CR/LF, chunk-size abuse, and pipelined
//! requests, each of which must be decided on its own. The origin records
//! the raw bytes it gets: egressd re-frames every request, so the origin
//! must see exactly the requests egressd decided, framed one way only.
//!
//! The exception allows GET/POST/PUT on `/public/**` only: a request the
//! origin saw for `/admin` got past a decision.

use std::io::{BufReader, Write};

use super::*;

fn lab() -> Lab<RawOrigin> {
    lab_with(raw_origin(ok_reply))
        .names(&["allowed.test", "evil.test"])
        .start(|ports| {
            policy()
                .exception("public")
                .reason("the public half of the origin")
                .host("allowed.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .methods(&["GET", "POST", "PUT"])
                .path("/public/**")
        })
}

/// The origin saw no request for anything but `/public/…`, and nothing
/// framed two ways; nothing reached the canary; only allowed.test was
/// resolved.
fn assert_clean(l: &Lab<RawOrigin>) {
    for r in l.origin.requests() {
        assert!(r.target.starts_with("/public/"), "origin got {r:?}");
        assert_ne!(r.body, b"<ambiguous framing>", "origin got {r:?}");
        assert!(
            r.count("content-length") + r.count("transfer-encoding") <= 1,
            "two framings reached the origin: {r:?}"
        );
    }
    l.assert_clean(&["allowed.test"]);
}

/// Content-Length and Transfer-Encoding together: chunked wins, the
/// connection closes after the response, and what Content-Length would
/// have left over is never a request — at egressd or at the origin.
#[test]
fn cl_te_and_te_cl() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    // CL.TE: a front end reading Content-Length would forward the smuggled
    // request as body; one reading chunked would see it as the next request.
    for smuggled in [
        "GET /admin HTTP/1.1\r\nHost: allowed.test\r\n\r\n".to_string(),
        format!("GET http://allowed.test:{p}/admin HTTP/1.1\r\nHost: allowed.test:{p}\r\nConnection: close\r\n\r\n"),
    ] {
        let body = format!("0\r\n\r\n{smuggled}");
        let raw = head(&l,
            "POST",
            "/public/clte",
            &format!(
                "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                body.len()
            ),
        ) + &body;
        let got = all_responses(l.e.proxy, raw.as_bytes());
        assert_eq!(got.len(), 1, "the leftover was read as a request");
        assert_eq!(got[0].status, 200);
        assert_eq!(lines.one("CL.TE")["decision"], "allow");
        let last = l.origin.requests().pop().unwrap();
        assert_eq!(
            (last.target.as_str(), last.body.as_slice()),
            ("/public/clte", &b""[..])
        );
    }
    // TE.CL: a front end reading chunked forwards it all; one reading
    // Content-Length would stop after "5c\r\n" and see "GPOST /admin".
    let inner =
        format!("GPOST /admin HTTP/1.1\r\nHost: allowed.test:{p}\r\nContent-Length: 15\r\n\r\nx=1");
    let body = format!("{:x}\r\n{inner}\r\n0\r\n\r\n", inner.len());
    let raw = head(
        &l,
        "POST",
        "/public/tecl",
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
    ) + &body;
    let got = all_responses(l.e.proxy, raw.as_bytes());
    assert_eq!((got.len(), got[0].status), (1, 200));
    lines.one("TE.CL");
    let last = l.origin.requests().pop().unwrap();
    assert_eq!(last.target, "/public/tecl");
    assert_eq!(
        last.body,
        inner.as_bytes(),
        "the whole chunked body, as data"
    );
    assert_eq!(
        last.count("content-length"),
        0,
        "the client's Content-Length went on"
    );
    lines.done("cl/te");
    assert_eq!(l.origin.requests().len(), 3);
    assert_clean(&l);
}

#[test]
fn conflicting_or_odd_content_lengths_are_refused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for cl in [
        "Content-Length: 5\r\nContent-Length: 6\r\n",
        "Content-Length: 5\r\nContent-Length: 50\r\n",
        "Content-Length: 5, 6\r\n",
        "Content-Length: 5, 5\r\n",
        "Content-Length: +5\r\n",
        "Content-Length: -5\r\n",
        "Content-Length: 0x5\r\n",
        "Content-Length: 5.0\r\n",
        "Content-Length: 5 5\r\n",
        "Content-Length: 99999999999999999999999\r\n",
        "Content-Length:\r\n",
        "Content-Length : 5\r\n",
    ] {
        let raw = head(&l, "POST", "/public/cl", cl) + "hello";
        refused(&mut lines, &raw, 400, "malformed");
    }
    // Two equal values are one length: accepted, and the origin gets one.
    let raw = head(
        &l,
        "POST",
        "/public/cl",
        "Content-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n",
    ) + "hello";
    assert_eq!(try_request(l.e.proxy, raw.as_bytes()).unwrap().status, 200);
    lines.one("equal lengths");
    let last = l.origin.requests().pop().unwrap();
    assert_eq!(
        (last.count("content-length"), last.body.as_slice()),
        (1, &b"hello"[..])
    );
    lines.done("content-length");
    assert_clean(&l);
}

#[test]
fn obfuscated_transfer_encodings_are_refused_or_normalised() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let body = "5\r\nhello\r\n0\r\n\r\n";
    for te in [
        "Transfer-Encoding: xchunked\r\n",
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "Transfer-Encoding: identity\r\n",
        "Transfer-Encoding: gzip\r\n",
        "Transfer-Encoding: \"chunked\"\r\n",
        "Transfer-Encoding: chunked;q=1\r\n",
        "Transfer-Encoding : chunked\r\n",
        "Transfer-Encoding: chunked\r\n ,identity\r\n",
        "Transfer-Encoding\r\n : chunked\r\n",
        "Transfer-Encoding:\x0bchunked\r\n",
        "Transfer-Encoding:\x0cchunked\r\n",
        " Transfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunk\r\n",
        "Transfer-Encoding: ch\0unked\r\n",
        // A coding before chunked on a second line (see framing.rs).
        "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
    ] {
        let raw = head(&l, "POST", "/public/te", te) + body;
        refused(&mut lines, &raw, 400, "malformed");
    }
    // A coding egressd does not decode before chunked: 501, not forwarded
    // with its coding lost.
    let raw = head(
        &l,
        "POST",
        "/public/te",
        "Transfer-Encoding: identity, chunked\r\n",
    ) + body;
    refused(&mut lines, &raw, 501, "malformed");
    // Spellings that do mean chunked are decoded and re-framed: the origin
    // gets one `chunked` and the decoded body.
    for te in [
        "Transfer-Encoding: CHUNKED\r\n",
        "transfer-encoding:\tchunked \r\n",
    ] {
        let raw = head(
            &l,
            "POST",
            "/public/te",
            &format!("{te}Connection: close\r\n"),
        ) + body;
        assert_eq!(
            try_request(l.e.proxy, raw.as_bytes()).unwrap().status,
            200,
            "{te:?}"
        );
        lines.one(te);
        let last = l.origin.requests().pop().unwrap();
        assert_eq!(last.body, b"hello", "{te:?}");
        assert_eq!(last.count("transfer-encoding"), 1, "{te:?}: {last:?}");
        assert_eq!(last.header("transfer-encoding"), Some("chunked"), "{te:?}");
    }
    lines.done("transfer-encoding");
    assert_clean(&l);
}

#[test]
fn obs_fold_bare_cr_and_bare_lf() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    for raw in [
        // obs-fold continuing a header, and folding a framing header
        head(&l, "GET", "/public/f", "X-A: a\r\n b\r\n"),
        head(&l, "POST", "/public/f", "Transfer-Encoding: identity\r\n chunked\r\n") + "0\r\n\r\n",
        head(&l, "GET", "/public/f", "X-A: a\r\n\tHost: evil.test\r\n"),
        // bare CR inside a header, and as a line end
        head(&l, "GET", "/public/f", "X-A: a\rTransfer-Encoding: chunked\r\n"),
        format!("GET http://allowed.test:{p}/public/f HTTP/1.1\rHost: allowed.test:{p}\r\n\r\n"),
        // NUL and DEL in a header value, control characters in a name
        head(&l, "GET", "/public/f", "X-A: a\0b\r\n"),
        head(&l, "GET", "/public/f", "X\x01A: a\r\n"),
        head(&l, "GET", "/public/f", "X-A: a\x7fb\r\n"),
        // a request line with a bare CR in the target
        format!("GET http://allowed.test:{p}/public/\r/admin HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n"),
    ] {
        refused(&mut lines, &raw, 400, "malformed");
    }
    // Bare LF line ends are read as line ends (as most servers do), and the
    // origin gets a canonical CRLF request: the two cannot disagree.
    let raw = format!(
        "GET http://allowed.test:{p}/public/lf HTTP/1.1\nHost: allowed.test:{p}\nX-A: 1\nConnection: close\n\n"
    );
    assert_eq!(try_request(l.e.proxy, raw.as_bytes()).unwrap().status, 200);
    lines.one("bare LF");
    let text = l.origin.text();
    assert!(text.starts_with("GET /public/lf HTTP/1.1\r\n"), "{text:?}");
    let b = text.as_bytes();
    assert!(
        (0..b.len()).all(|i| b[i] != b'\n' || (i > 0 && b[i - 1] == b'\r')),
        "a bare LF reached the origin: {text:?}"
    );
    lines.done("folds");
    assert_clean(&l);
}

/// Broken chunk framing: the request fails, and nothing after the break is
/// ever a request at the origin.
#[test]
fn chunk_size_abuse() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let smuggled = format!(
        "GET http://allowed.test:{p}/admin HTTP/1.1\r\nHost: allowed.test:{p}\r\nConnection: close\r\n\r\n"
    );
    for chunks in [
        "fffffffffffffffff\r\nhello\r\n0\r\n\r\n".to_string(),
        "10000000000000000\r\nhello\r\n0\r\n\r\n".to_string(),
        "-1\r\nhello\r\n0\r\n\r\n".to_string(),
        "0x5\r\nhello\r\n0\r\n\r\n".to_string(),
        "+5\r\nhello\r\n0\r\n\r\n".to_string(),
        " 5\r\nhello\r\n0\r\n\r\n".to_string(),
        "5\r\nhelloEXTRA\r\n0\r\n\r\n".to_string(),
        "3\r\nhello\r\n0\r\n\r\n".to_string(),
        "5\nhello\n0\n\n".to_string(),
        "5\r\nhello0\r\n\r\n".to_string(),
        format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(70_000)),
        "g\r\nhello\r\n0\r\n\r\n".to_string(),
        "5\r\nhello\r\n0\r\nX-Trailer: 1\r\nTransfer-Encoding: chunked\r\n\r\n".to_string(),
    ] {
        let raw = head(
            &l,
            "POST",
            "/public/chunks",
            "Transfer-Encoding: chunked\r\n",
        ) + &chunks
            + &smuggled;
        let got = all_responses(l.e.proxy, raw.as_bytes());
        // Refused at the edge (400), or failed mid-body towards the origin
        // (502); or, where the framing is valid after all, answered once.
        assert!(got.len() <= 2, "{chunks:.40?}: {} responses", got.len());
        let logged = lines.next_n(&format!("{chunks:.40?}"), got.len().max(1));
        let line = &logged[0];
        if line["decision"] == "allow" {
            // Only a well-framed prefix was forwarded; whatever followed it
            // was decided on its own (it asks for /admin: path_not_allowed).
            if got.len() == 2 {
                assert_eq!(got[1].reason(), Some("path_not_allowed"), "{chunks:.40?}");
                assert_denied_line(&logged[1], "path_not_allowed", Some(403), "after");
            }
        } else {
            assert_eq!(line["reason"], "malformed", "{chunks:.40?}: {line}");
        }
    }
    lines.done("chunks");
    assert_clean(&l);
}

/// Several requests in one write: each gets its own decision, its own
/// answer, its own line; only the allowed ones reach the origin, in order.
#[test]
fn pipelined_requests_are_each_decided_on_their_own() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let raw = [
        head(&l, "GET", "/public/1", ""),
        format!("GET http://evil.test:{p}/public/x HTTP/1.1\r\nHost: evil.test:{p}\r\n\r\n"),
        head(&l, "GET", "/admin", ""),
        head(&l, "DELETE", "/public/1", ""),
        head(&l, "POST", "/public/2", "Content-Length: 4\r\n") + "body",
        head(&l, "GET", "/public/3", "Host: evil.test\r\n"),
        head(&l, "PUT", "/public/4", "Transfer-Encoding: chunked\r\n") + "3\r\nabc\r\n0\r\n\r\n",
        "GET /public/5 HTTP/1.1\r\nHost: allowed.test\r\n\r\n".to_string(),
        head(&l, "GET", "/public/6", "Connection: close\r\n"),
    ]
    .concat();
    let got: Vec<(u16, Option<String>)> = all_responses(l.e.proxy, raw.as_bytes())
        .iter()
        .map(|r| (r.status, r.reason().map(String::from)))
        .collect();
    let want: Vec<(u16, Option<String>)> = [
        (200, None),
        (403, Some("no_exception")),
        (403, Some("path_not_allowed")),
        (403, Some("method_not_allowed")),
        (200, None),
        (400, Some("malformed")),
        (200, None),
        (400, Some("malformed")),
        (200, None),
    ]
    .into_iter()
    .map(|(s, r)| (s, r.map(String::from)))
    .collect();
    assert_eq!(got, want);
    let logged: Vec<String> = lines
        .next_n("pipelined", want.len())
        .iter()
        .map(|x| x["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        logged,
        [
            "exception",
            "no_exception",
            "path_not_allowed",
            "method_not_allowed",
            "exception",
            "malformed",
            "exception",
            "malformed",
            "exception"
        ]
    );
    let seen: Vec<(String, Vec<u8>)> = l
        .origin
        .requests()
        .into_iter()
        .map(|r| (format!("{} {}", r.method, r.target), r.body))
        .collect();
    assert_eq!(
        seen,
        [
            ("GET /public/1".to_string(), b"".to_vec()),
            ("POST /public/2".into(), b"body".to_vec()),
            ("PUT /public/4".into(), b"abc".to_vec()),
            ("GET /public/6".into(), b"".to_vec()),
        ]
    );
    assert_clean(&l);
}

/// A refused request's body is body, not the next request: a denied POST
/// (or one answered before its body, Expect: 100-continue) whose body is a
/// complete allowed request must not have that body executed.
#[test]
fn the_body_of_a_refused_request_is_never_a_request() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let inner = format!(
        "GET http://allowed.test:{p}/public/from-body HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n"
    );
    let chunked = format!("{:x}\r\n{inner}\r\n0\r\n\r\n", inner.len());
    for (head, body) in [
        (
            format!("POST http://evil.test:{p}/x HTTP/1.1\r\nHost: evil.test:{p}\r\nContent-Length: {}\r\n\r\n", inner.len()),
            inner.clone(),
        ),
        (head(&l, "POST", "/admin", &format!("Content-Length: {}\r\n", inner.len())), inner.clone()),
        (head(&l, "POST", "/admin", "Transfer-Encoding: chunked\r\n"), chunked.clone()),
        (
            head(&l, "POST", "/admin", &format!("Expect: 100-continue\r\nContent-Length: {}\r\n", inner.len())),
            inner.clone(),
        ),
    ] {
        let mut s = connect(l.e.proxy);
        s.write_all(head.as_bytes()).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let first = read_response(&mut r).unwrap();
        assert_eq!(first.status, 403, "{head:?}");
        // The client sends the body after all, then closes.
        let _ = s.write_all(body.as_bytes());
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut more = Vec::new();
        while let Some(x) = read_response(&mut r) {
            more.push(x.status);
        }
        assert!(more.is_empty(), "{head:?}: the body was answered as requests: {more:?}");
        lines.one(&head);
    }
    lines.done("bodies");
    assert!(l.origin.requests().is_empty(), "{:?}", l.origin.requests());
    assert_clean(&l);
}

/// Framing names spelled with `_` instead of `-` are other headers to a
/// strict parser, but CGI-style origins (and some frameworks) fold `_` and
/// `-` together. Forwarded to such an origin over a pooled connection, a
/// `Content_Length` or `Transfer_Encoding` is a smuggled second framing.
#[test]
fn framing_header_look_alikes_never_reach_the_origin() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for extra in [
        "Transfer_Encoding: chunked\r\nContent-Length: 5\r\n",
        "Content_Length: 0\r\nContent-Length: 5\r\n",
        "CONTENT_LENGTH: 0\r\nContent-Length: 5\r\n",
    ] {
        let raw = head(
            &l,
            "POST",
            "/public/u",
            &format!("{extra}Connection: close\r\n"),
        ) + "hello";
        let r = try_request(l.e.proxy, raw.as_bytes()).unwrap();
        assert_eq!(r.status, 200, "{extra:?}");
        assert_eq!(lines.one(extra)["decision"], "allow");
        let last = l.origin.requests().pop().unwrap();
        let lookalikes: Vec<&(String, String)> = last
            .headers
            .iter()
            .filter(|(k, _)| {
                let n = k.to_ascii_lowercase().replace('_', "-");
                k.contains('_') && (n == "content-length" || n == "transfer-encoding")
            })
            .collect();
        assert!(
            lookalikes.is_empty(),
            "{extra:?} reached the origin: {lookalikes:?}"
        );
        assert_eq!(
            (last.count("content-length"), last.body.as_slice()),
            (1, &b"hello"[..]),
            "{extra:?}"
        );
    }
    lines.done("look-alikes");
    assert_clean(&l);
}

/// Oversized heads are refused (431) and logged; nothing reaches the origin.
#[test]
fn oversized_heads_are_refused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let huge_header = head(
        &l,
        "GET",
        "/public/h",
        &format!("X-Big: {}\r\n", "a".repeat(256 << 10)),
    );
    let many_headers = head(&l, "GET", "/public/h", &"X-N: 1\r\n".repeat(200));
    let huge_target = format!(
        "GET http://allowed.test:{}/public/{} HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        l.port(),
        "a".repeat(256 << 10)
    );
    for raw in [huge_header, many_headers, huge_target] {
        let r = try_request(l.e.proxy, raw.as_bytes()).expect("an answer");
        assert_eq!(r.status, 431, "{:.60}", raw);
        let line = lines.one("oversized");
        assert_denied_line(&line, "malformed", Some(431), "oversized");
    }
    lines.done("oversized");
    assert!(l.origin.requests().is_empty());
    assert_clean(&l);
}
