//! Strict framing (RFC 9112 §6) and method overrides (issue 14, items 3, 4
//! and the `Host` list of 8): what hyper lets through on its own and
//! egressd refuses or rewrites on top. The origin records the raw bytes it
//! gets, so each test sees exactly what egressd forwarded.
//!
//! The exception allows GET/POST/PUT on `/public/**` of allowed.test; open.test
//! has an exception with no `methods` (override headers pass untouched there).

use std::io::{BufReader, Write};
use std::net::TcpStream;

use super::*;

/// The origin's script: `/public/ambiguous-*` get an answer framed two
/// ways, everything else `200` with the target as body.
fn script(r: &Seen) -> Act {
    let two = |framing: &str, body: &str| {
        Act::Reply(format!("HTTP/1.1 200 OK\r\n{framing}\r\n{body}").into_bytes())
    };
    match r.target.as_str() {
        "/public/ambiguous-clte" => two(
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            // By Content-Length: "5\r\nhe"; by chunked: "hello", then a
            // second, smuggled response for the next request on the connection.
            "5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
        ),
        "/public/ambiguous-tecl" => two(
            "Transfer-Encoding: chunked\r\nContent-Length: 0\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
        ),
        "/public/ambiguous-cl" => two("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"),
        "/public/ambiguous-cl-list" => two("Content-Length: 5, 6\r\n", "hello!"),
        _ => ok_reply(r),
    }
}

fn lab() -> Lab<RawOrigin> {
    lab_with(raw_origin(script))
        .names(&["allowed.test", "open.test", "evil.test"])
        .start(|ports| {
            policy()
                .exception("public")
                .reason("the public half of the origin")
                .host("allowed.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .methods(&["GET", "POST", "PUT"])
                .path("/public/**")
                .exception("open")
                .reason("any method")
                .host("open.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
        })
}

/// The origin saw no request for anything but `/public/…`, nothing framed
/// two ways; nothing reached the canary; no denied name was resolved.
fn assert_clean(l: &Lab<RawOrigin>) {
    for r in l.origin.requests() {
        assert!(r.target.starts_with("/public/"), "origin got {r:?}");
        assert_ne!(r.body, b"<ambiguous framing>", "origin got {r:?}");
    }
    l.assert_clean(&["allowed.test", "open.test"]);
}

/// `X-HTTP-Method-Override: DELETE` on an allowed `GET` is a `DELETE` to
/// the many frameworks that honour it: where the exception lists methods,
/// every method an override header names must be on the list too.
#[test]
fn method_override_headers_cannot_name_a_method_the_exception_does_not_allow() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for (method, extra) in [
        ("GET", "X-HTTP-Method-Override: DELETE\r\n"),
        ("POST", "X-HTTP-Method: DELETE\r\n"),
        ("POST", "X-Method-Override: PATCH\r\n"),
        ("POST", "x-http-method-override: delete\r\n"),
        ("POST", "X-HTTP-Method-Override: PUT, DELETE\r\n"),
        (
            "POST",
            "X-HTTP-Method-Override: PUT\r\nX-HTTP-Method-Override: DELETE\r\n",
        ),
        (
            "POST",
            "X-HTTP-Method-Override: PUT\r\nX-Method-Override: DELETE\r\n",
        ),
        ("GET", "X-HTTP-Method-Override: CONNECT\r\n"),
        ("GET", "X-HTTP-Method-Override: D\u{e9}LETE\r\n"),
    ] {
        let raw = head(
            &l,
            method,
            "/public/o",
            &format!("{extra}Content-Length: 0\r\n"),
        );
        refused(&mut lines, &raw, 403, "method_not_allowed");
    }
    // Naming an allowed method (any case), or nothing, passes, and the
    // header reaches the origin as sent.
    for extra in [
        "X-HTTP-Method-Override: PUT\r\n",
        "X-HTTP-Method: get\r\n",
        "X-Method-Override: POST, PUT\r\n",
        "X-HTTP-Method-Override: \r\n",
    ] {
        let raw = head(
            &l,
            "POST",
            "/public/o",
            &format!("{extra}Content-Length: 0\r\nConnection: close\r\n"),
        );
        let r = try_request(l.e.proxy, raw.as_bytes()).expect("an answer");
        assert_eq!(r.status, 200, "{extra:?}: {}", r.text());
        assert_eq!(lines.one(extra)["decision"], "allow");
        let last = l.origin.requests().pop().unwrap();
        let (name, value) = extra.trim_end().split_once(':').unwrap();
        assert_eq!(last.header(name), Some(value.trim()), "{extra:?}: {last:?}");
    }
    // An exception without `methods` allows any method, overridden or not.
    let raw = head_on(
        &l,
        "open.test",
        "GET",
        "/anything",
        "X-HTTP-Method-Override: DELETE\r\nConnection: close\r\n",
    );
    assert_eq!(try_request(l.e.proxy, raw.as_bytes()).unwrap().status, 200);
    lines.one("open");
    assert_eq!(
        l.origin
            .requests()
            .pop()
            .unwrap()
            .header("x-http-method-override"),
        Some("DELETE")
    );
    lines.done("overrides");
    let overridden: Vec<_> = l
        .origin
        .requests()
        .into_iter()
        .filter(|r| r.target == "/public/o")
        .collect();
    assert_eq!(overridden.len(), 4, "{overridden:?}");
    l.assert_clean(&["allowed.test", "open.test"]);
}

/// A request's `Transfer-Encoding` is one line whose only coding is
/// `chunked`: a repeated `chunked`, a second line, an empty list element or
/// a coding egressd does not decode is refused (400; 501 for a coding it
/// does not know), the connection closed, nothing forwarded. What a parser
/// makes of `chunked, chunked` or `gzip, chunked` differs between parsers.
#[test]
fn transfer_codings_other_than_one_chunked_are_refused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let body = "5\r\nhello\r\n0\r\n\r\n";
    let next = format!(
        "GET http://allowed.test:{p}/public/next HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n"
    );
    for (te, status) in [
        ("Transfer-Encoding: chunked, chunked\r\n", 400),
        ("Transfer-Encoding: chunked,chunked\r\n", 400),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            400,
        ),
        (
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
            400,
        ),
        ("Transfer-Encoding: ,chunked\r\n", 400),
        ("Transfer-Encoding: chunked,\r\n", 400),
        ("Transfer-Encoding: , chunked\r\n", 400),
        ("Transfer-Encoding: gzip\r\n", 400),
        (
            "Content-Length: 5\r\nTransfer-Encoding: chunked, chunked\r\n",
            400,
        ),
        (
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            400,
        ),
        ("Transfer-Encoding: gzip, chunked\r\n", 501),
        ("Transfer-Encoding: identity, chunked\r\n", 501),
        ("Transfer-Encoding: deflate,chunked\r\n", 501),
        (
            "Content-Length: 5\r\nTransfer-Encoding: x-custom, chunked\r\n",
            501,
        ),
    ] {
        let raw = head(&l, "POST", "/public/te", te) + body + &next;
        let got = all_responses(l.e.proxy, raw.as_bytes());
        let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses,
            [status],
            "{te:?}: the connection must close after the refusal"
        );
        let line = lines.one(te);
        assert_denied_line(&line, "malformed", Some(status), te);
    }
    lines.done("transfer codings");
    assert!(l.origin.requests().is_empty(), "{:?}", l.origin.requests());
    assert_clean(&l);
}

/// Content-Length and Transfer-Encoding together: forwarded chunked only,
/// no Content-Length, and the client's connection closed after the answer,
/// so what follows the chunked body is never read as a request.
#[test]
fn cl_te_is_forwarded_chunked_only_and_the_connection_closes() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let next = head(&l, "GET", "/public/after", "");
    for framing in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
        "Content-Length: 40\r\nTransfer-Encoding: CHUNKED\r\n",
    ] {
        let raw = head(&l, "POST", "/public/clte", framing) + "5\r\nhello\r\n0\r\n\r\n" + &next;
        let got = all_responses(l.e.proxy, raw.as_bytes());
        let statuses: Vec<u16> = got.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [200], "{framing:?}: the connection stayed open");
        assert_eq!(lines.one(framing)["decision"], "allow");
        let last = l.origin.requests().pop().unwrap();
        assert_eq!(last.target, "/public/clte", "{framing:?}");
        assert_eq!(last.body, b"hello", "{framing:?}");
        assert_eq!(last.count("content-length"), 0, "{framing:?}: {last:?}");
        assert_eq!(
            last.header("transfer-encoding"),
            Some("chunked"),
            "{framing:?}"
        );
    }
    lines.done("cl.te");
    assert_clean(&l);
}

/// `Content-Length: 010` is 10 to one parser and 8 to another: the origin
/// gets the length egressd framed the body by, in canonical form.
#[test]
fn content_length_is_forwarded_in_canonical_form() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for (cl, body, want) in [
        ("Content-Length: 010\r\n", "0123456789", "10"),
        ("Content-Length: 0005\r\n", "hello", "5"),
        ("Content-Length: 05\r\nContent-Length: 5\r\n", "hello", "5"),
        ("Content-Length: 00\r\n", "", "0"),
    ] {
        let raw = head(
            &l,
            "POST",
            "/public/cl",
            &format!("{cl}Connection: close\r\n"),
        ) + body;
        let r = try_request(l.e.proxy, raw.as_bytes()).expect("an answer");
        assert_eq!(r.status, 200, "{cl:?}");
        lines.one(cl);
        let last = l.origin.requests().pop().unwrap();
        assert_eq!(last.count("content-length"), 1, "{cl:?}: {last:?}");
        assert_eq!(last.header("content-length"), Some(want), "{cl:?}");
        assert_eq!(last.body, body.as_bytes(), "{cl:?}");
    }
    lines.done("content-length");
    assert_clean(&l);
}

/// An origin answer framed two ways (Content-Length and chunked, or two
/// lengths) is a response-splitting attempt: the client gets `502`, never
/// a guess, and the origin connection is closed, never pooled, so what it
/// smuggled after the answer is never read as the next client's response.
#[test]
fn ambiguous_origin_answers_get_502_and_the_connection_is_not_reused() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    for path in [
        "/public/ambiguous-clte",
        "/public/ambiguous-tecl",
        "/public/ambiguous-cl",
        "/public/ambiguous-cl-list",
    ] {
        let raw = head(&l, "GET", path, "");
        let mut s = connect(l.e.proxy);
        s.write_all(raw.as_bytes()).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let first = read_response(&mut r).expect("an answer, not a closed connection");
        assert_eq!(first.status, 502, "{path}: {}", first.text());
        let line = lines.one(path);
        assert_eq!(line["status"], 502, "{path}: {line}");
        assert!(line["error"].as_str().is_some(), "{path}: {line}");
        // The next request, on the same client connection or a new one,
        // goes over a new origin connection and gets its own answer.
        let again = head(&l, "GET", "/public/fresh", "");
        s.write_all(again.as_bytes()).unwrap();
        let second = read_response(&mut r).expect("the client connection still serves");
        assert_eq!(
            (second.status, second.body.as_slice()),
            (200, &b"/public/fresh"[..]),
            "{path}"
        );
        lines.one("fresh");
        let fresh = head(&l, "GET", "/public/fresh2", "Connection: close\r\n");
        let third = try_request(l.e.proxy, fresh.as_bytes()).unwrap();
        assert_eq!(
            (third.status, third.body.as_slice()),
            (200, &b"/public/fresh2"[..]),
            "{path}"
        );
        lines.one("fresh2");
    }
    // No origin connection that carried an ambiguous answer carried
    // anything after it.
    for conn in l.origin.raw.lock().unwrap().iter() {
        let text = String::from_utf8_lossy(&conn.lock().unwrap()).into_owned();
        if let Some(i) = text.find("/public/ambiguous") {
            let after = &text[i..];
            assert_eq!(
                after.matches(" HTTP/1.1\r\n").count(),
                1,
                "reused: {text:?}"
            );
        }
    }
    lines.done("ambiguous answers");
    assert_clean(&l);
}

/// A request head is at most 64 KiB (DESIGN, "Bounds"): however it arrives.
#[test]
fn heads_over_64_kib_get_431() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    // One header value of 64 KiB, and many 1 KiB headers, each over the
    // bound in total, written in one go.
    let one = head(
        &l,
        "GET",
        "/public/h",
        &format!("X-Big: {}\r\n", "a".repeat(64 << 10)),
    );
    let many = head(
        &l,
        "GET",
        "/public/h",
        &format!("X-Pad: {}\r\n", "b".repeat(1 << 10)).repeat(70),
    );
    for raw in [one, many] {
        assert!(raw.len() > 64 << 10);
        let r = try_request(l.e.proxy, raw.as_bytes()).expect("an answer");
        assert_eq!(r.status, 431, "{} bytes", raw.len());
        let line = lines.one("oversized");
        assert_denied_line(&line, "malformed", Some(431), "oversized");
    }
    assert!(l.origin.requests().is_empty());
    // Under the bound is served.
    let fits = head(
        &l,
        "GET",
        "/public/fits",
        &format!("X-Big: {}\r\nConnection: close\r\n", "a".repeat(60 << 10)),
    );
    assert_eq!(try_request(l.e.proxy, fits.as_bytes()).unwrap().status, 200);
    lines.one("fits");
    lines.done("heads");
    assert_clean(&l);
}

/// A chunk extension carries nothing egressd forwards (extensions are
/// dropped), but it is a place to hide bytes and to make a parser buffer:
/// each size line is bounded (below), and a body's extensions together at
/// 16 KiB. Past either the request gets `400 malformed` and never
/// completes at the origin.
#[test]
fn a_bodys_extensions_over_16_kib_together_get_400() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    let next = format!(
        "GET http://allowed.test:{p}/public/next HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n"
    );
    let each = format!("1;x={}\r\na\r\n", "e".repeat(3 << 10));
    for chunks in [
        format!("{}0\r\n\r\n", each.repeat(6)),
        format!("5\r\nhello\r\n{}0\r\n\r\n", each.repeat(20)),
    ] {
        let raw =
            head(&l, "POST", "/public/ext", "Transfer-Encoding: chunked\r\n") + &chunks + &next;
        let s = connect(l.e.proxy);
        // Written beside the reader: egressd may answer before it has read
        // everything.
        let writer = write_beside(&s, raw);
        let mut r = BufReader::new(s);
        let got = read_response(&mut r).expect("an answer");
        assert_eq!(got.status, 400, "{}", got.text());
        assert!(
            read_response(&mut r).is_none(),
            "the connection stayed open"
        );
        writer.join().unwrap();
        let line = lines.one("extension");
        assert_denied_line(&line, "malformed", Some(400), "extension");
    }
    // A short extension is dropped, the body forwarded.
    let raw = head(
        &l,
        "POST",
        "/public/ext",
        "Transfer-Encoding: chunked\r\nConnection: close\r\n",
    ) + "5;name=value\r\nhello\r\n0\r\n\r\n";
    assert_eq!(try_request(l.e.proxy, raw.as_bytes()).unwrap().status, 200);
    lines.one("short extension");
    let done: Vec<Seen> = l.origin.requests();
    assert_eq!(
        done.len(),
        1,
        "a request with a large extension completed at the origin: {done:?}"
    );
    assert_eq!(done[0].body, b"hello");
    lines.done("extensions");
    assert_clean(&l);
}

/// A connection to egressd ready for requests on allowed.test: on the
/// proxy port (`inside`: false), or plain HTTP inside a CONNECT, which
/// the exception's `methods` make egressd serve itself (the code that
/// serves intercepted TLS). The request target for `path` in each.
fn open_for_requests(l: &Lab<RawOrigin>, inside: bool) -> (TcpStream, BufReader<TcpStream>) {
    let mut s = connect(l.e.proxy);
    let mut r = BufReader::new(s.try_clone().unwrap());
    if inside {
        let p = l.port();
        write!(
            s,
            "CONNECT allowed.test:{p} HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n"
        )
        .unwrap();
        assert_eq!(read_response(&mut r).expect("a CONNECT answer").status, 200);
    }
    (s, r)
}

/// Chunk-size lines (the size and its extensions) are bounded at 4 KiB
/// on every path a client's request body is read: past it the request
/// gets `400 malformed` with its line, the connection closes, and the
/// request never completes at the origin. hyper alone lets each of these
/// through (it bounds a body's extensions together, at 16 KiB).
#[test]
fn chunk_size_lines_over_4_kib_get_400_on_every_path() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    for inside in [false, true] {
        let target = |path: &str| match inside {
            true => path.to_string(),
            false => format!("http://allowed.test:{p}{path}"),
        };
        let post = |path: &str, extra: &str| {
            format!(
                "POST {} HTTP/1.1\r\nHost: allowed.test:{p}\r\nTransfer-Encoding: chunked\r\n{extra}\r\n",
                target(path)
            )
        };
        let next = format!(
            "GET {} HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n",
            target("/public/next")
        );
        let ext = |n: usize| "e".repeat(n);
        for (what, chunks) in [
            (
                "5 KiB extension",
                format!("5;x={}\r\nhello\r\n0\r\n\r\n", ext(5 << 10)),
            ),
            (
                "5 KiB extension on a later chunk",
                format!("5\r\nhello\r\n5;x={}\r\nworld\r\n0\r\n\r\n", ext(5 << 10)),
            ),
            (
                "5 KiB of leading zeros",
                format!("{}5\r\nhello\r\n0\r\n\r\n", "0".repeat(5 << 10)),
            ),
            (
                "1 MiB extension",
                format!("5;x={}\r\nhello\r\n0\r\n\r\n", ext(1 << 20)),
            ),
        ] {
            let what = format!("{what}, inside a CONNECT: {inside}");
            let raw = post("/public/ext", "") + &chunks + &next;
            let (s, mut r) = open_for_requests(&l, inside);
            // Written beside the reader: egressd answers before it has
            // read everything.
            let writer = write_beside(&s, raw);
            let got = read_response(&mut r).unwrap_or_else(|| panic!("{what}: no answer"));
            assert_eq!(got.status, 400, "{what}: {}", got.text());
            assert!(
                read_response(&mut r).is_none(),
                "{what}: the connection stayed open"
            );
            writer.join().unwrap();
            // Inside a CONNECT the tunnel's own line follows.
            let logged = lines.next_n(&what, 1 + usize::from(inside));
            let line = logged
                .iter()
                .find(|l| l["reason"] == "malformed")
                .unwrap_or_else(|| panic!("{what}: {logged:?}"));
            assert_denied_line(line, "malformed", Some(400), &what);
            assert!(line.to_string().contains("4 KiB"), "{what}: {line}");
        }
        // Up to the bound, the extension is dropped and the body forwarded.
        let raw = post("/public/ext-3k", "Connection: close\r\n")
            + &format!("5;x={}\r\nhello\r\n0\r\n\r\n", ext(3 << 10));
        let (mut s, mut r) = open_for_requests(&l, inside);
        s.write_all(raw.as_bytes()).unwrap();
        let got = read_response(&mut r).expect("an answer");
        assert_eq!(got.status, 200, "3 KiB, inside: {inside}: {}", got.text());
        drop((s, r));
        let logged = lines.next_n("3 KiB", 1 + usize::from(inside));
        assert!(
            logged.iter().all(|l| l["decision"] == "allow"),
            "{logged:?}"
        );
    }
    let done: Vec<(String, Vec<u8>)> = l
        .origin
        .requests()
        .into_iter()
        .map(|r| (r.target, r.body))
        .collect();
    let three_k = ("/public/ext-3k".to_string(), b"hello".to_vec());
    assert_eq!(
        done,
        [three_k.clone(), three_k],
        "only the requests within the bound completed at the origin"
    );
    lines.done("chunk-size lines");
    assert_clean(&l);
}

/// `Host: a, b` is a list, which `Host` never is (RFC 9110 §7.2): which
/// element a server reads differs. Malformed, like two Host lines.
#[test]
fn a_host_list_is_malformed() {
    let l = lab();
    let mut lines = Lines::new(&l.e);
    let p = l.port();
    for hosts in [
        format!("Host: allowed.test:{p}, evil.test\r\n"),
        format!("Host: evil.test, allowed.test:{p}\r\n"),
        format!("Host: allowed.test:{p},allowed.test:{p}\r\n"),
        format!("Host: allowed.test:{p}\r\nHost: evil.test\r\n"),
    ] {
        let raw = format!("GET http://allowed.test:{p}/public/h HTTP/1.1\r\n{hosts}\r\n");
        refused(&mut lines, &raw, 400, "malformed");
    }
    lines.done("host lists");
    assert!(l.origin.requests().is_empty());
    assert_clean(&l);
}
