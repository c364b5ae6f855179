//! Denials an agent can act on (issue #18 item 4): the 403 body names the
//! `egressd explain` command that reproduces the decision and the YAML stub
//! of an exception that would allow the request; `Accept: application/json`
//! gets the same as JSON. Neither ever carries what the client sent beyond
//! the decided facts: no header, no token, no query string.

use std::process::Command;

use crate::forward::sha256_hex;
use crate::support::*;

/// The token agent-a presents (Basic agent:agent-token).
const AGENT_AUTH: &str = "Basic YWdlbnQ6YWdlbnQtdG9rZW4=";
/// Values the client sends that must never come back in an answer.
const SECRETS: [&str; 3] = [
    "query-secret-1",
    "header-secret-2",
    "YWdlbnQ6YWdlbnQtdG9rZW4",
];

fn method_limited(port: u16) -> PolicyYaml {
    policy()
        .contact("#sec-test")
        .client_token("agent-a", &sha256_hex(b"agent-token"))
        .exception("api-read")
        .owner("api-team")
        .reason("read the API")
        .host("api.test")
        .cidr(LOOPBACK)
        .port(port)
        .method("GET")
}

fn post(e: &Egressd, port: u16, accept: &str) -> Response {
    e.request(&format!(
        "POST http://api.test:{port}/v1/items?token=query-secret-1 HTTP/1.1\r\n\
         Host: api.test:{port}\r\nProxy-Authorization: {AGENT_AUTH}\r\n\
         Authorization: Bearer header-secret-2\r\nAccept: {accept}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    ))
}

fn assert_no_secret(body: &str) {
    for s in SECRETS {
        assert!(!body.contains(s), "the answer repeats {s:?}:\n{body}");
    }
}

/// Runs an `egressd explain` command line as the body gives it (its
/// arguments single-quoted for a shell), against `policy`.
fn run_explain(cmd: &str, policy: &std::path::Path) -> (i32, String) {
    let args = cmd
        .strip_prefix("egressd explain")
        .unwrap_or_else(|| panic!("not an explain command: {cmd}"));
    let sh = format!(
        "{} explain --policy '{}'{args}",
        env!("CARGO_BIN_EXE_egressd"),
        policy.display()
    );
    let out = Command::new("sh").arg("-c").arg(&sh).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Fills the stub's owner and reason, as the reviewer would.
fn filled(stub: &str) -> String {
    stub.replace("owner:     #", "owner: api-team #")
        .replace("reason:    #", "reason: writes are needed #")
}

#[test]
fn a_text_denial_reproduces_and_its_stub_allows_the_request() {
    let l = lab()
        .names(&["api.test"])
        .start(|ports| method_limited(ports.origin));
    let (e, o, port) = (&l.e, &l.origin, l.port());
    let r = post(e, port, "*/*");
    assert_eq!((r.status, r.reason()), (403, Some("method_not_allowed")));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    let body = r.text();
    assert_no_secret(&body);
    let paragraph = body.lines().next().unwrap();
    assert!(
        paragraph.starts_with(&format!(
            "egressd denied POST http://api.test:{port}/v1/items"
        )),
        "{body}"
    );
    assert!(paragraph.contains("ask #sec-test"), "{body}");
    let line = body
        .lines()
        .find_map(|l| l.strip_prefix("To see the decision: "))
        .unwrap_or_else(|| panic!("no explain command:\n{body}"));
    // The request's id follows as a shell comment: the line still pastes.
    let (cmd, id) = line.split_once("  # request ").expect("the request id");
    assert_eq!(Some(id), r.header("x-egressd-request"), "{body}");
    assert_eq!(
        cmd,
        format!("egressd explain --client 'agent-a' 'POST http://api.test:{port}/v1/items'")
    );
    let stub: String = body
        .split_once("left to fill in):\n\n")
        .unwrap_or_else(|| panic!("no stub:\n{body}"))
        .1
        .to_string();
    assert!(
        stub.contains("exception api-read (owner api-team)"),
        "{stub}"
    );
    assert!(stub.contains("clients: [agent-a]"), "{stub}");
    assert!(stub.contains("methods: [POST]"), "{stub}");
    assert!(stub.contains(&format!("ports: [{port}]")), "{stub}");
    assert_eq!(o.count(), 0, "the denied request reached the origin");

    // The command reproduces the proxy's decision on the same policy ...
    let (code, out) = run_explain(cmd, &e.policy_dir);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("method_not_allowed"), "{out}");
    // ... and the stub, once a person fills in owner and reason, allows it.
    // (The lab's origin is on loopback, which a real destination is not.)
    let with_stub = scratch();
    let added = format!("exceptions:\n{}    cidrs: [{LOOPBACK}]\n", filled(&stub));
    let dir = with_stub.dir().join("policy");
    std::fs::create_dir(&dir).unwrap();
    for f in std::fs::read_dir(&e.policy_dir).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("zz-stub.yaml"), &added).unwrap();
    let (code, out) = run_explain(cmd, &dir);
    assert_eq!(
        code, 0,
        "the filled stub does not allow it:\n{added}\n{out}"
    );

    // Applied to the running proxy, the same request goes through.
    atomic_write(&e.policy_dir.join("zz-stub.yaml"), &added);
    e.signal("HUP");
    let r = eventually("the reloaded policy allows the POST", || {
        let r = post(e, port, "*/*");
        (r.status == 200).then_some(r)
    });
    assert_eq!(r.status, 200);
    assert_eq!(o.count(), 1);
}

#[test]
fn json_is_answered_to_clients_that_ask_for_it() {
    let l = lab()
        .names(&["api.test"])
        .start(|ports| method_limited(ports.origin));
    let (e, port) = (&l.e, l.port());
    let mut lines = Lines::new(e);
    let r = post(e, port, "application/json, text/plain;q=0.5");
    assert_eq!((r.status, r.reason()), (403, Some("method_not_allowed")));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.text();
    assert_no_secret(&body);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["reason"], "method_not_allowed");
    assert_eq!(v["status"], 403);
    assert_eq!(v["contact"], "#sec-test");
    // The one line API clients print: the reason and the request to grant.
    let message = v["message"].as_str().unwrap();
    assert!(message.starts_with("egressd: method_not_allowed ("), "{v}");
    assert!(
        message.ends_with(&format!("request {}", v["request"].as_str().unwrap())),
        "{v}"
    );
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("not for this method"),
        "{v}"
    );
    assert!(
        v["explain"]
            .as_str()
            .unwrap()
            .starts_with("egressd explain --client 'agent-a'"),
        "{v}"
    );
    assert!(
        v["stub"].as_str().unwrap().contains("methods: [POST]"),
        "{v}"
    );
    // q=0 is a refusal of JSON, not a request for it.
    let r = post(e, port, "application/json;q=0, */*");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    // The log line is the same either way.
    for l in &lines.next_n("both denials", 2) {
        assert_denied_line(l, "method_not_allowed", Some(403), "the POST");
    }
}

#[test]
fn a_denied_connect_gets_a_stub_for_its_port_and_a_malformed_request_none() {
    let l = lab()
        .names(&["api.test", "other.test"])
        .start(|ports| method_limited(ports.origin));
    let e = &l.e;
    let r = e.request(
        "CONNECT other.test:8443 HTTP/1.1\r\nHost: other.test:8443\r\nAccept: application/json\r\n\r\n",
    );
    assert_eq!((r.status, r.reason()), (403, Some("no_exception")));
    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(v["explain"], "egressd explain 'other.test:8443'");
    let stub = v["stub"].as_str().unwrap();
    assert!(stub.contains("- id: other.test"), "{stub}");
    assert!(stub.contains("hosts: [other.test]"), "{stub}");
    assert!(stub.contains("ports: [8443]"), "{stub}");
    assert!(
        !stub.contains("clients:"),
        "an anonymous client is named: {stub}"
    );
    // What an exception cannot fix gets neither a command nor a stub.
    let r =
        e.request("GET /relative HTTP/1.1\r\nHost: api.test\r\nAccept: application/json\r\n\r\n");
    assert_eq!(r.status, 400);
    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(v["reason"], "malformed");
    assert!(v["explain"].is_null() && v["stub"].is_null(), "{v}");
    let r = e.request("GET /relative HTTP/1.1\r\nHost: api.test\r\n\r\n");
    assert!(!r.text().contains("egressd explain"), "{}", r.text());
}
