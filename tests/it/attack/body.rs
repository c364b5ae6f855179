//! Hostile bodies against `body:` rules: a GraphQL document nested 10,000
//! deep, JSON whose duplicate keys would let the rule judge one value
//! while the origin reads another, and bodies far past `max_bytes` (a
//! declared length and a chunked stream, HTTP/1.1 and HTTP/2). Each is
//! refused with its reason, the forge receives nothing, egressd's memory
//! stays bounded, and it goes on serving.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::forge_api::{gql, start, Setup, PR_PATH};

/// egressd's resident set and its high-water mark, KiB.
fn memory(s: &Setup) -> (u64, u64) {
    let pid = s.lab.e.child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// egressd still serves: an allowed draft PR goes through.
fn still_serves(s: &Setup) {
    let body = crate::forge_api::pr("agent/ok", "main", true);
    let a = s.post("--http1.1", PR_PATH, &body);
    assert_eq!(a.status, 201, "{a:?}");
}

#[test]
fn a_graphql_document_nested_ten_thousand_deep_is_refused_before_parsing() {
    let s = start(true);
    let (_, hwm0) = memory(&s);
    for v in ["--http1.1", "--http2"] {
        // Selection sets, list values and object values.
        let shapes = [
            format!(
                "query {{ {} id {} }}",
                "viewer {".repeat(10_000),
                "}".repeat(10_000)
            ),
            format!(
                "query {{ search(q: {}1{}) {{ id }} }}",
                "[".repeat(10_000),
                "]".repeat(10_000)
            ),
            format!(
                "mutation {{ createPullRequest(input: {}{}) {{ id }} }}",
                "{a: ".repeat(10_000),
                "}".repeat(10_000)
            ),
        ];
        for q in shapes {
            s.refused(
                v,
                "/graphql",
                &gql(&q, None, serde_json::json!({})),
                "body_not_allowed",
                "deeper than 64",
                "viewer {",
            );
        }
        // The JSON around it nested as deep.
        let deep = format!(
            "{{\"query\":\"{{ a }}\",\"variables\":{}1{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        s.refused(
            v,
            "/graphql",
            deep.as_bytes(),
            "body_not_allowed",
            "nests deeper than 64",
            "[[[[",
        );
    }
    let (_, hwm1) = memory(&s);
    assert!(
        hwm1 < hwm0 + 64 * 1024,
        "memory stayed bounded: {hwm0} KiB -> {hwm1} KiB"
    );
    still_serves(&s);
}

#[test]
fn json_duplicate_keys_are_refused_whichever_the_origin_would_read() {
    let s = start(true);
    let bodies: [&[u8]; 5] = [
        // serde_json keeps the last; many origins keep the first.
        br#"{"head":"main","base":"main","draft":true,"head":"agent/x"}"#,
        br#"{"head":"agent/x","base":"main","draft":true,"head":"main"}"#,
        // Go's encoding/json matches keys without regard to case.
        br#"{"head":"agent/x","base":"main","draft":true,"HEAD":"main"}"#,
        br#"{"head":"agent/x","base":"main","draft":true,"Draft":false}"#,
        // Deep inside, where no rule points.
        br#"{"head":"agent/x","base":"main","draft":true,"labels":[{"n":"a","n":"b"}]}"#,
    ];
    for v in ["--http1.1", "--http2"] {
        for b in bodies {
            s.refused(
                v,
                PR_PATH,
                b,
                "body_not_allowed",
                "appears twice",
                "agent/x",
            );
        }
    }
    // GraphQL: a second query key would hide a mutation behind a query.
    let smuggled = br#"{"query":"query { viewer { login } }","query":"mutation { mergePullRequest(input: {}) { x } }"}"#;
    s.refused(
        "--http2",
        "/graphql",
        smuggled,
        "body_not_allowed",
        "appears twice",
        "viewer",
    );
    still_serves(&s);
}

/// curl POSTing `len` bytes from its stdin, chunked (no length known).
fn chunked(s: &Setup, version: &str, len: usize) -> (u16, String) {
    let mut child = Command::new("curl")
        .args(["-sS", "--max-time", "60", "--noproxy", ""])
        .arg("--proxy")
        .arg(format!("http://{}", s.lab.e.proxy))
        .arg("--cacert")
        .arg(&s.ca)
        .args(["-o", "/dev/null", "-w", "%{http_code}", version])
        .args(["-H", "Content-Type: application/json"])
        .args(["-H", "Transfer-Encoding: chunked"])
        .args(["--data-binary", "@-"])
        .arg(s.url(PR_PATH))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b' '; 1 << 20];
        let _ =
            stdin.write_all(b"{\"head\":\"agent/x\",\"base\":\"main\",\"draft\":true,\"pad\":\"");
        let mut sent = 0;
        while sent < len {
            if stdin.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = writer.join();
    let code = String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0);
    (code, String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn a_huge_body_is_refused_unread_or_cut_and_never_forwarded() {
    let s = start(true);
    let (_, hwm0) = memory(&s);
    // A declared 256 MiB (a sparse file: curl reads only what it sends).
    let f = s.dir.path().join("huge.json");
    std::fs::File::create(&f)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    for v in ["--http1.1", "--http2"] {
        let a = s.post_file(v, PR_PATH, &f, &[]);
        if v == "--http1.1" {
            // curl asks `Expect: 100-continue` first: refused unsent.
            assert_eq!(a.status, 413, "{a:?}");
            assert_eq!(a.reason().as_deref(), Some("body_too_large"));
        } else {
            // HTTP/2 has no such question: the first 16 MiB are read and
            // dropped, then the answer, then the stream is cut.
            assert!(a.status == 413 || a.status == 0, "{a:?}");
        }
        let line = s.line(PR_PATH);
        assert_eq!(line["reason"], "body_too_large", "{line}");
        assert_eq!(line["exception"], "widgets-draft-pr", "{line}");
    }
    // 256 MiB with no declared length: read to the bound, the rest cut.
    for v in ["--http1.1", "--http2"] {
        let (code, err) = chunked(&s, v, 256 << 20);
        // curl may see the answer, or the connection cut while it sends:
        // either way nothing is forwarded and the line says why.
        assert!(code == 413 || code == 0, "{code} {err}");
        let line = s.line(PR_PATH);
        assert_eq!(line["reason"], "body_too_large", "{line}");
    }
    assert_eq!(
        s.lab.origin.count(),
        0,
        "nothing reached the forge: {:?}",
        s.lab.origin.requests().len()
    );
    let (_, hwm1) = memory(&s);
    assert!(
        hwm1 < hwm0 + 96 * 1024,
        "memory stayed bounded: {hwm0} KiB -> {hwm1} KiB"
    );
    still_serves(&s);
}
