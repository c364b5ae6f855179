//! Request-body rules (`body:`, DESIGN "Writes on allowed hosts") for a
//! forge API, end to end: curl through an intercepting egressd to a fake
//! forge over TLS (REST and GraphQL, h2 and http/1.1) that answers only
//! the credential egressd injects and records every body it receives.
//! Each refusal is checked at the origin (nothing arrived) as well as in
//! the answer and the line; `without_body_rules_every_write_reaches_the_forge`
//! sends the same bodies under the same exceptions without `body:`, and
//! they all arrive, so each refusal below is the rules' doing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

const CONTACT: &str = "#sec-forge";

pub(crate) const PR_PATH: &str = "/repos/acme/widgets/pulls";

/// The three exceptions of DESIGN's example, each with the credential.
pub(crate) fn forge_policy(port: u16, with_body: bool) -> String {
    let rule = |yaml: &str| {
        if with_body {
            yaml.to_string()
        } else {
            String::new()
        }
    };
    format!(
        r#"settings:
  contact: "{CONTACT}"
exceptions:
  - id: widgets-draft-pr
    owner: platform
    reason: agents open draft pull requests from agent/* branches
    hosts: [{FORGE_HOST}]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
    methods: [POST]
    paths: ["{PR_PATH}"]
{pr}    inject: {{ headers: {{ Authorization: "{FORGE_AUTH}" }} }}
  - id: widgets-graphql-read
    owner: platform
    reason: gh pr view reads through GraphQL
    hosts: [{FORGE_HOST}]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
    methods: [POST]
    paths: ["/graphql", "/api/graphql"]
{read}    inject: {{ headers: {{ Authorization: "{FORGE_AUTH}" }} }}
  - id: widgets-graphql-pr
    owner: platform
    reason: gh pr create opens a draft PR through GraphQL
    hosts: [{FORGE_HOST}]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
    methods: [POST]
    paths: ["/graphql", "/api/graphql"]
{gpr}    inject: {{ headers: {{ Authorization: "{FORGE_AUTH}" }} }}
"#,
        pr = rule(
            "    body:\n      max_bytes: 64KiB\n      json: { \"/head\": \"agent/*\", \"/base\": main, \"/draft\": true }\n"
        ),
        read = rule("    body: { graphql: { queries: true } }\n"),
        gpr = rule(
            "    body:\n      graphql: { mutations: [createPullRequest] }\n      json: { \"/variables/input/headRefName\": \"agent/*\", \"/variables/input/draft\": true }\n"
        ),
    )
}

pub(crate) struct Setup {
    pub lab: Lab<Forge>,
    pub ca: PathBuf,
    pub dir: tempfile::TempDir,
}

pub(crate) fn start(with_body: bool) -> Setup {
    tool("curl");
    let dir = tempfile::tempdir().unwrap();
    let f = forge();
    let forge_ca = f.ca_pem.clone();
    let lab = lab_with(f)
        .names(&[FORGE_HOST])
        .intercept(&forge_ca)
        .start(|ports| forge_policy(ports.origin, with_body));
    Setup {
        ca: lab.ca_pem(),
        lab,
        dir,
    }
}

#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub version: String,
    pub headers: String,
    pub body: String,
    /// curl's own complaints, for the failure message.
    #[allow(dead_code)]
    pub stderr: String,
}

impl Answer {
    pub fn reason(&self) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("x-egressd-reason")
                .then(|| v.trim().to_string())
        })
    }
}

impl Setup {
    pub fn url(&self, path: &str) -> String {
        format!("https://{FORGE_HOST}:{}{path}", self.lab.origin.addr.port())
    }

    /// `curl -X POST --data-binary @FILE` through egressd, trusting its CA.
    pub fn post_file(&self, version: &str, path: &str, file: &Path, extra: &[&str]) -> Answer {
        let (h, b) = (self.dir.path().join("h"), self.dir.path().join("b"));
        let _ = std::fs::remove_file(&h);
        let _ = std::fs::remove_file(&b);
        let out = Command::new(tool("curl"))
            .args(["-sS", "--max-time", "60", "--noproxy", ""])
            .arg("--proxy")
            .arg(format!("http://{}", self.lab.e.proxy))
            .arg("--cacert")
            .arg(&self.ca)
            .arg("-D")
            .arg(&h)
            .arg("-o")
            .arg(&b)
            .args(["-w", "%{http_code} %{http_version}", version])
            .args(["-H", "Content-Type: application/json"])
            .args(extra)
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg(self.url(path))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .expect("run curl");
        let w = String::from_utf8_lossy(&out.stdout).to_string();
        let (code, v) = w.split_once(' ').unwrap_or(("0", ""));
        Answer {
            status: code.parse().unwrap_or(0),
            version: v.to_string(),
            headers: std::fs::read_to_string(&h).unwrap_or_default(),
            body: std::fs::read_to_string(&b).unwrap_or_default(),
            stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        }
    }

    pub fn post(&self, version: &str, path: &str, body: &[u8]) -> Answer {
        let f = self.dir.path().join("req-body");
        std::fs::write(&f, body).unwrap();
        self.post_file(version, path, &f, &[])
    }

    /// The line of the last request to `path`.
    pub fn line(&self, path: &str) -> serde_json::Value {
        eventually("the request's line", || {
            self.lab
                .e
                .log_lines()
                .into_iter()
                .rev()
                .find(|l| l["proto"] == "tls" && l["path"] == path)
        })
    }

    /// A body the rules must refuse with `reason`, naming `names` and
    /// never `hidden`: nothing reaches the forge.
    pub fn refused(
        &self,
        version: &str,
        path: &str,
        body: &[u8],
        reason: &str,
        names: &str,
        hidden: &str,
    ) {
        let before = self.lab.origin.count();
        let a = self.post(version, path, body);
        let want = if reason == "body_too_large" { 413 } else { 403 };
        assert_eq!(a.status, want, "{a:?}");
        assert_eq!(a.reason().as_deref(), Some(reason), "{a:?}");
        assert!(a.body.contains(names), "the answer names {names}: {a:?}");
        assert!(!a.body.contains(hidden), "the answer names no value: {a:?}");
        let line = self.line(path);
        assert_eq!(line["decision"], "deny", "{line}");
        assert_eq!(line["reason"], reason, "{line}");
        let note = line["note"].as_str().unwrap_or_default();
        assert!(note.contains(names), "the line names {names}: {line}");
        assert!(!note.contains(hidden), "the line names no value: {line}");
        assert_eq!(
            self.lab.origin.count(),
            before,
            "nothing reached the forge: {:?}",
            self.lab.origin.requests()
        );
    }
}

pub(crate) fn pr(head: &str, base: &str, draft: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "title": "fix a typo", "head": head, "base": base, "draft": draft, "body": "agent"
    }))
    .unwrap()
}

pub(crate) fn gql(query: &str, name: Option<&str>, variables: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(
        &serde_json::json!({"query": query, "operationName": name, "variables": variables}),
    )
    .unwrap()
}

pub(crate) const CREATE_PR: &str = "mutation CreatePR($input: CreatePullRequestInput!) { createPullRequest(input: $input) { pullRequest { number url } } }";
pub(crate) const MERGE_PR: &str = "mutation Merge($id: ID!) { mergePullRequest(input: {pullRequestId: $id}) { pullRequest { merged } } }";
pub(crate) const VIEW_PR: &str =
    "query View { repository(owner: \"acme\", name: \"widgets\") { pullRequest(number: 7) { title } } }";

fn create_vars(head: &str, draft: bool) -> serde_json::Value {
    serde_json::json!({"input": {"repositoryId": "R_1", "baseRefName": "main", "headRefName": head, "title": "t", "draft": draft}})
}

#[test]
fn a_draft_pr_from_an_agent_branch_reaches_the_forge_with_the_credential() {
    let s = start(true);
    for version in ["--http1.1", "--http2"] {
        let body = pr("agent/fix-typo", "main", true);
        let a = s.post(version, PR_PATH, &body);
        assert_eq!(a.status, 201, "{a:?}");
        let want_v = if version == "--http2" { "2" } else { "1.1" };
        assert_eq!(a.version, want_v, "{a:?}");
        let seen = s.lab.origin.requests().pop().expect("the forge saw it");
        assert_eq!(seen.path, PR_PATH);
        assert!(seen.authorized, "egressd injected the credential");
        assert_eq!(seen.body, body, "the body arrives as the client sent it");
        let line = s.line(PR_PATH);
        assert_eq!(line["decision"], "allow", "{line}");
        assert_eq!(line["exception"], "widgets-draft-pr", "{line}");
    }
}

#[test]
fn pr_bodies_the_rules_refuse_never_reach_the_forge() {
    let s = start(true);
    for v in ["--http1.1", "--http2"] {
        let r = |body: &[u8], names: &str, hidden: &str| {
            s.refused(v, PR_PATH, body, "body_not_allowed", names, hidden)
        };
        r(&pr("main", "main", true), "/head", "\"main\" is");
        r(&pr("agent/a/b", "main", true), "/head", "agent/a/b");
        r(&pr("agent/x", "release-1.0", true), "/base", "release-1.0");
        r(&pr("agent/x", "main", false), "/draft", "false");
        r(br#"{"head":"agent/x","base":"main"}"#, "/draft", "agent/x");
        r(b"head=agent/x&base=main&draft=true", "not JSON", "agent/x");
        // Over max_bytes (64KiB): its own reason and status.
        let mut big = serde_json::json!({"head": "agent/x", "base": "main", "draft": true});
        big["body"] = serde_json::Value::String("x".repeat(70 << 10));
        s.refused(
            v,
            PR_PATH,
            &serde_json::to_vec(&big).unwrap(),
            "body_too_large",
            "max_bytes",
            "xxxx",
        );
    }
}

#[test]
fn graphql_reads_and_create_pr_pass_merge_and_two_operations_do_not() {
    let s = start(true);
    for v in ["--http2", "--http1.1"] {
        // A query: the first exception (queries) allows it.
        let a = s.post(v, "/graphql", &gql(VIEW_PR, None, serde_json::json!({})));
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(s.line("/graphql")["exception"], "widgets-graphql-read");
        // createPullRequest: the first refuses it, the second allows it,
        // and decides (its line names it).
        let body = gql(CREATE_PR, None, create_vars("agent/x", true));
        let a = s.post(v, "/graphql", &body);
        assert_eq!(a.status, 200, "{a:?}");
        let line = s.line("/graphql");
        assert_eq!(line["exception"], "widgets-graphql-pr", "{line}");
        let seen = s.lab.origin.requests().pop().unwrap();
        assert_eq!(seen.body, body);
        assert!(seen.authorized);
        // Refused: the merge mutation, an aliased merge, a create from
        // another branch or not as a draft, two operations without
        // operationName, a batch.
        let g = |body: Vec<u8>, names: &str, hidden: &str| {
            s.refused(v, "/graphql", &body, "body_not_allowed", names, hidden)
        };
        g(
            gql(MERGE_PR, None, serde_json::json!({"id": "PR_secret_id"})),
            "mutation field mergePullRequest",
            "PR_secret_id",
        );
        g(
            gql(
                "mutation { createPullRequest: mergePullRequest(input: {pullRequestId: \"PR_1\"}) { clientMutationId } }",
                None,
                serde_json::json!({}),
            ),
            "mergePullRequest",
            "PR_1",
        );
        g(
            gql(CREATE_PR, None, create_vars("main", true)),
            "/variables/input/headRefName",
            "\"main\" is",
        );
        g(
            gql(CREATE_PR, None, create_vars("agent/x", false)),
            "/variables/input/draft",
            "false is",
        );
        let two = format!("{VIEW_PR} {MERGE_PR}");
        g(
            gql(&two, None, serde_json::json!({})),
            "several operations",
            "acme",
        );
        // operationName selects: the query of the two is a read.
        let a = s.post(
            v,
            "/graphql",
            &gql(&two, Some("View"), serde_json::json!({})),
        );
        assert_eq!(a.status, 200, "{a:?}");
        g(
            gql(&two, Some("Merge"), serde_json::json!({})),
            "mergePullRequest",
            "acme",
        );
        let batch = format!(
            "[{}]",
            String::from_utf8(gql(VIEW_PR, None, serde_json::json!({}))).unwrap()
        );
        g(batch.into_bytes(), "batched", "widgets");
    }
}

#[test]
fn without_body_rules_every_write_reaches_the_forge() {
    let s = start(false);
    let bodies = [
        (PR_PATH, pr("main", "release-1.0", false)),
        (PR_PATH, b"head=main".to_vec()),
        (
            "/graphql",
            gql(MERGE_PR, None, serde_json::json!({"id": "PR_1"})),
        ),
        (
            "/graphql",
            gql(
                &format!("{VIEW_PR} {MERGE_PR}"),
                None,
                serde_json::json!({}),
            ),
        ),
    ];
    for (path, body) in bodies {
        let before = s.lab.origin.count();
        let a = s.post("--http2", path, &body);
        assert!(a.status == 201 || a.status == 200, "{a:?}");
        assert_eq!(s.lab.origin.count(), before + 1);
        assert_eq!(s.lab.origin.requests().pop().unwrap().body, body);
    }
}

/// Plain HTTP (no TLS): the body is judged as inside interception, and an
/// exception without `methods:` judges a GET's body too (the GET fast
/// path leaves such requests to the exchange path).
#[test]
fn plain_http_bodies_are_judged_too_and_a_get_cannot_carry_one_past() {
    let lab = lab().names(&["api.plain.test"]).start(|ports| {
        format!(
            "exceptions:\n  - id: plain-pr\n    owner: platform\n    reason: r\n    hosts: [api.plain.test]\n    cidrs: [127.0.0.0/8]\n    ports: [{}]\n    paths: [\"{PR_PATH}\"]\n    body: {{ json: {{ /head: agent/*, /draft: true }} }}\n",
            ports.origin
        )
    });
    let port = lab.origin.addr.port();
    let send = |method: &str, body: &str| {
        lab.e.request(&format!(
            "{method} http://api.plain.test:{port}{PR_PATH} HTTP/1.1\r\nHost: api.plain.test:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    };
    let ok = r#"{"head":"agent/x","draft":true}"#;
    let r = send("POST", ok);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(lab.origin.last().unwrap().body, ok.as_bytes());
    let before = lab.origin.count();
    for (method, body) in [
        ("POST", r#"{"head":"main","draft":true}"#),
        ("POST", r#"{"head":"agent/x","draft":true,"draft":false}"#),
        ("GET", r#"{"head":"main","draft":true}"#),
        ("GET", ""),
    ] {
        let r = send(method, body);
        assert_eq!(r.status, 403, "{method} {body}: {r:?}");
        assert_eq!(r.reason(), Some("body_not_allowed"), "{r:?}");
    }
    assert_eq!(lab.origin.count(), before, "nothing reached the origin");
}

/// `gh pr create`, GitHub's own CLI (Debian's `gh`), through egressd
/// against the fake forge as a GitHub Enterprise host (`GH_HOST`, its
/// GraphQL at `/api/graphql`), holding only a token of its own: egressd
/// injects the one the forge accepts. gh's three requests pass for a draft
/// from an `agent/` branch; a ready pull request is refused at the
/// mutation, gh exits non-zero saying so, and the forge never sees it.
#[test]
fn gh_pr_create_opens_a_draft_and_is_refused_a_ready_one() {
    let gh = tool("gh");
    let s = start(true);
    let home = s.dir.path().join("gh-home");
    std::fs::create_dir_all(&home).unwrap();
    let host = format!("{FORGE_HOST}:{}", s.lab.origin.addr.port());
    let create = |head: &str, draft: bool| {
        let mut cmd = Command::new(&gh);
        cmd.args(["pr", "create", "--repo"])
            .arg(format!("{host}/acme/widgets"))
            .args([
                "--head", head, "--base", "main", "--title", "fix", "--body", "agent",
            ]);
        if draft {
            cmd.arg("--draft");
        }
        let out = cmd
            .current_dir(&home)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("HTTPS_PROXY", format!("http://{}", s.lab.e.proxy))
            .env("SSL_CERT_FILE", &s.ca)
            .env("GH_HOST", &host)
            .env("GH_ENTERPRISE_TOKEN", "a-token-of-the-box")
            .env("GH_PROMPT_DISABLED", "1")
            .env("GH_NO_UPDATE_NOTIFIER", "1")
            .output()
            .expect("run gh");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, stdout, stderr) = create("agent/fix-typo", true);
    assert!(ok, "gh pr create --draft: {stdout}\n{stderr}");
    assert!(
        stdout.contains("/acme/widgets/pull/7"),
        "{stdout}\n{stderr}"
    );
    let seen = s.lab.origin.requests();
    let created: Vec<_> = seen
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains("createPullRequest"))
        .collect();
    assert_eq!(created.len(), 1, "{seen:?}");
    assert!(
        seen.iter().all(|r| r.authorized),
        "egressd's credential on every request: {seen:?}"
    );
    let line = s.line("/api/graphql");
    assert_eq!(line["exception"], "widgets-graphql-pr", "{line}");

    let before = s.lab.origin.count();
    let (ok, stdout, stderr) = create("agent/fix-typo", false);
    assert!(!ok, "a ready pull request was created: {stdout}\n{stderr}");
    eprintln!("gh pr create (not a draft) printed:\n{stderr}");
    // gh prints the answer's `message`: egressd's reason, naming the rule.
    assert!(
        stderr.contains("egressd: body_not_allowed") && stderr.contains("/variables/input/draft"),
        "gh shows egressd's answer: {stderr}"
    );
    let after = s.lab.origin.requests();
    assert!(
        after[before..]
            .iter()
            .all(|r| !String::from_utf8_lossy(&r.body).contains("createPullRequest")),
        "the refused mutation reached the forge: {after:?}"
    );
    let line = s.line("/api/graphql");
    assert_eq!(line["reason"], "body_not_allowed", "{line}");
    assert!(
        line["note"]
            .as_str()
            .unwrap_or_default()
            .contains("/variables/input/draft"),
        "{line}"
    );
}
