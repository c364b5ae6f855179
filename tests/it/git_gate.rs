//! The git gate (DESIGN "Writes on allowed hosts"), with real `git`
//! through egressd (interception, `--ca-dir`) against a loopback TLS git
//! server running `git http-backend` over bare repositories; the server
//! demands a credential only egressd injects. Each refused push leaves
//! the upstream repository unchanged, the server receives no
//! `git-receive-pack` request, and git's own stderr names egressd's
//! reason. `a_plain_host_exception_lets_every_push_through` runs the same
//! pushes with the `git:` rules taken out: they land, so each refusal
//! below is the rules' doing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::*;

const CONTACT: &str = "#sec-git";

pub(crate) struct Setup {
    pub server: GitServer,
    pub e: Egressd,
    _dns: FakeDns,
    pub ca: PathBuf,
    pub dir: tempfile::TempDir,
}

pub(crate) fn git_rules() -> &'static str {
    r#"    git:
      repos: ["acme/widgets"]
      push:
        refs: ["refs/heads/agent/**"]
        deny_paths: [".github/workflows/**", ".gitlab-ci.yml"]
        max_bytes: 64KiB
"#
}

fn policy(port: u16, widgets_rules: &str) -> String {
    format!(
        r#"settings:
  contact: "{CONTACT}"
exceptions:
  - id: widgets-agent
    owner: platform
    reason: agents fetch acme/widgets and push agent/* branches
    hosts: [{GIT_HOST}]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
{widgets_rules}    inject: {{ headers: {{ Authorization: "{GIT_AUTH}" }} }}
  - id: docs-fetch
    owner: platform
    reason: agents read acme/docs
    hosts: [{GIT_HOST}]
    cidrs: [127.0.0.0/8]
    ports: [{port}]
    git:
      repos: ["acme/docs"]
    inject: {{ headers: {{ Authorization: "{GIT_AUTH}" }} }}
"#
    )
}

pub(crate) fn start(widgets_rules: &str) -> Setup {
    tool("git");
    tool("curl");
    let server = git_server(&["acme/widgets", "acme/docs", "acme/secret"]);
    let dns = fake_dns();
    dns.set(GIT_HOST, &["127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    ca_init(&certs);
    let upstream_ca = dir.path().join("git-ca.pem");
    std::fs::write(&upstream_ca, &server.ca_pem).unwrap();
    let e = egressd()
        .dns(dns.addr)
        .env("EGRESSD_CA_DIR", certs.to_str().unwrap())
        .env("EGRESSD_UPSTREAM_CA", upstream_ca.to_str().unwrap())
        .policy("p.yaml", &policy(server.addr.port(), widgets_rules))
        .start();
    Setup {
        server,
        e,
        _dns: dns,
        ca: certs.join("ca.pem"),
        dir,
    }
}

impl Setup {
    pub(crate) fn url(&self, repo: &str) -> String {
        format!("https://{GIT_HOST}:{}/{repo}.git", self.server.addr.port())
    }

    /// `git` through egressd, trusting egressd's CA only.
    fn git(&self, cwd: &Path, args: &[&str]) -> Output {
        Command::new(tool("git"))
            .current_dir(cwd)
            .args([
                "-c",
                &format!("http.proxy=http://{}", self.e.proxy),
                "-c",
                "user.name=agent",
                "-c",
                "user.email=agent@x",
                "-c",
                "credential.helper=",
            ])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_SSL_CAINFO", &self.ca)
            .env("HOME", self.dir.path())
            .env_remove("https_proxy")
            .env_remove("HTTPS_PROXY")
            .output()
            .unwrap()
    }

    /// A fresh clone of acme/widgets in `name`.
    fn clone(&self, name: &str) -> PathBuf {
        let out = self.git(
            self.dir.path(),
            &["clone", "-q", &self.url("acme/widgets"), name],
        );
        assert!(
            out.status.success(),
            "clone: {}\nlog: {:?}",
            stderr(&out),
            self.e.log_lines()
        );
        self.dir.path().join(name)
    }

    /// A push that must be refused with `reason`: git fails, its stderr
    /// names the reason, the server received no push, the repository's
    /// refs are as they were.
    fn refused(&self, work: &Path, args: &[&str], reason: &str) -> String {
        let before = self.server.refs("acme/widgets");
        let pushes = self.server.receive_packs();
        let out = self.git(work, args);
        let err = stderr(&out);
        assert!(!out.status.success(), "push {args:?} succeeded: {err}");
        assert!(
            err.contains(reason),
            "git's stderr does not name {reason}: {err}"
        );
        assert_eq!(
            self.server.receive_packs(),
            pushes,
            "the push reached upstream"
        );
        assert_eq!(self.server.refs("acme/widgets"), before, "upstream changed");
        err
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn commit_file(work: &Path, path: &str, content: &[u8], msg: &str) {
    let p = work.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, content).unwrap();
    git_ok(work, &["add", path]);
    git_ok(
        work,
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@x",
            "commit",
            "-qm",
            msg,
        ],
    );
}

#[test]
fn clone_and_an_agent_branch_land() {
    let s = start(git_rules());
    let work = s.clone("w");
    assert_eq!(
        std::fs::read_to_string(work.join("README")).unwrap(),
        "widgets\n"
    );
    // Every request upstream carried the credential egressd injected.
    assert!(s.server.hits().iter().all(|h| h.authorized));
    git_ok(&work, &["checkout", "-qb", "agent/x"]);
    // A file large enough that git would send its next version as a
    // delta against this one (which upstream then holds).
    let text: String = (0..2000)
        .map(|i| format!("line {i} of the notes\n"))
        .collect();
    commit_file(&work, "notes.txt", text.as_bytes(), "notes");
    let out = s.git(&work, &["push", "-q", "origin", "agent/x"]);
    assert!(out.status.success(), "push: {}", stderr(&out));
    let head = git_ok(&work, &["rev-parse", "HEAD"]).trim().to_string();
    assert_eq!(
        s.server.rev("acme/widgets", "refs/heads/agent/x"),
        Some(head.clone())
    );
    // A second commit on it, changing one line: a fast-forward egressd
    // proves from the pack. egressd's `no-thin` in the advertisement made
    // git include the delta's base (a thin pack would be unprovable).
    let changed = text.replace("line 7 of", "line seven of");
    commit_file(&work, "notes.txt", changed.as_bytes(), "more notes");
    let out = s.git(&work, &["push", "-q", "origin", "agent/x"]);
    assert!(out.status.success(), "push: {}", stderr(&out));
    let line = s.e.wait_line("the push's line", |l| {
        l["git"]["service"] == "push"
            && l["git"]["refs"][0]["ref"] == "refs/heads/agent/x"
            && l["git"]["refs"][0]["old"] == head.as_str()
    });
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["git"]["repo"], "acme/widgets.git");
    assert_eq!(line["git"]["refs"][0]["verdict"], "allow");
    assert!(line["git"]["pack_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        s.e.metric(r#"egressd_git_pushes_total{exception="widgets-agent",result="allow"}"#),
        Some(2.0)
    );
}

#[test]
fn pushes_the_rules_refuse_never_reach_upstream() {
    let s = start(git_rules());
    let work = s.clone("w");
    // main: not a ref the rules list.
    commit_file(&work, "src.txt", b"change\n", "to main");
    let err = s.refused(
        &work,
        &["push", "origin", "main"],
        "egressd: git_ref_not_allowed",
    );
    assert!(err.contains("remote: egressd: push refused"), "{err}");
    assert!(err.contains(CONTACT), "the contact is not named: {err}");
    // A tag.
    git_ok(&work, &["tag", "v1"]);
    s.refused(&work, &["push", "origin", "v1"], "git_ref_not_allowed");
    // Two refs, one bad: all or nothing.
    git_ok(&work, &["branch", "agent/two"]);
    let err = s.refused(
        &work,
        &["push", "origin", "agent/two", "main"],
        "git_ref_not_allowed",
    );
    assert!(err.contains("all or nothing"), "{err}");
    // A workflow file on an agent branch.
    git_ok(&work, &["checkout", "-qb", "agent/ci", "origin/main"]);
    commit_file(&work, ".github/workflows/ci.yml", b"on: push\n", "ci");
    let err = s.refused(&work, &["push", "origin", "agent/ci"], "git_path_denied");
    assert!(err.contains(".github/workflows/ci.yml"), "{err}");
    // The workflow in an intermediate commit, removed again in the last.
    git_ok(&work, &["rm", "-q", ".github/workflows/ci.yml"]);
    git_ok(
        &work,
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@x",
            "commit",
            "-qm",
            "gone",
        ],
    );
    s.refused(&work, &["push", "origin", "agent/ci"], "git_path_denied");
    // Over max_bytes (64 KiB): 200 KiB that does not compress.
    git_ok(&work, &["checkout", "-qb", "agent/big", "origin/main"]);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    commit_file(&work, "big.bin", &noise, "big");
    s.refused(&work, &["push", "origin", "agent/big"], "git_too_large");
    // The refusals are in the log, with the reason and the refs.
    let line = s.e.wait_line("the main push's line", |l| {
        l["reason"] == "git_ref_not_allowed" && l["git"]["refs"][0]["ref"] == "refs/heads/main"
    });
    assert_eq!(line["decision"], "deny");
    assert_eq!(line["status"], 200);
    assert!(
        s.e.metric(
            r#"egressd_git_pushes_total{exception="widgets-agent",result="git_ref_not_allowed"}"#
        )
        .unwrap()
            >= 3.0
    );
}

#[test]
fn force_pushes_and_deletes_are_refused() {
    let s = start(git_rules());
    let work = s.clone("w");
    git_ok(&work, &["checkout", "-qb", "agent/f"]);
    commit_file(&work, "a.txt", b"one\n", "one");
    let out = s.git(&work, &["push", "-q", "origin", "agent/f"]);
    assert!(out.status.success(), "push: {}", stderr(&out));
    // Rewrite it: a commit that does not lead back to the pushed one.
    git_ok(&work, &["reset", "-q", "--hard", "origin/main"]);
    commit_file(&work, "b.txt", b"two\n", "two");
    s.refused(
        &work,
        &["push", "--force", "origin", "agent/f"],
        "git_not_fast_forward",
    );
    s.refused(
        &work,
        &["push", "origin", ":agent/f"],
        "git_delete_not_allowed",
    );
}

#[test]
fn repos_not_listed_and_fetch_only_repos() {
    let s = start(git_rules());
    let before = s.server.hits().len();
    let out = s.git(
        s.dir.path(),
        &["clone", "-q", &s.url("acme/secret"), "secret"],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("403"), "{err}");
    // Nothing was asked upstream about it.
    assert!(s.server.hits()[before..]
        .iter()
        .all(|h| !h.path.contains("acme/secret")));
    s.e.wait_line("the refusal's line", |l| {
        l["reason"] == "git_repo_not_allowed"
    });
    // acme/docs is listed for fetching: a clone works, a push does not,
    // refused at info/refs before anything (or any credential) goes up.
    let out = s.git(s.dir.path(), &["clone", "-q", &s.url("acme/docs"), "docs"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = s.dir.path().join("docs");
    commit_file(&docs, "x.txt", b"x\n", "x");
    let hits = s.server.hits().len();
    let out = s.git(&docs, &["push", "origin", "main"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("403"), "{}", stderr(&out));
    assert!(
        s.server.hits()[hits..].is_empty(),
        "{:?}",
        &s.server.hits()[hits..]
    );
    s.e.wait_line("the push refusal's line", |l| {
        l["reason"] == "git_push_not_allowed"
    });
    // widgets' agent branch pushed to acme/docs (a second repo on the same
    // host): refused the same way, the credential never sent.
    let work = s.clone("w");
    let out = s.git(
        &work,
        &["push", &s.url("acme/docs"), "HEAD:refs/heads/agent/x"],
    );
    assert!(!out.status.success());
    assert!(s.server.hits()[hits..]
        .iter()
        .all(|h| !h.path.contains("acme/docs")));
    // Other paths on the host are not allowed by a git: exception.
    let r = s.e.request(&format!(
        "GET http://{GIT_HOST}:{}/acme/widgets.git/HEAD HTTP/1.1\r\nHost: {GIT_HOST}:{}\r\nConnection: close\r\n\r\n",
        s.server.addr.port(),
        s.server.addr.port()
    ));
    assert_eq!(r.status, 403);
}

#[test]
fn protocol_v2_fetches_pass() {
    let s = start(git_rules());
    let work = s.clone("w");
    let out = s.git(
        &work,
        &["-c", "protocol.version=2", "fetch", "-q", "origin"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = s.git(&work, &["-c", "protocol.version=2", "ls-remote", "origin"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("refs/heads/main"));
    assert!(s.server.hits().iter().any(|h| h.method == "POST"
        && h.path.ends_with("/git-upload-pack")
        && h.git_protocol.as_deref() == Some("version=2")));
}

/// The control: with a plain host exception (no `git:`), every push the
/// tests above see refused lands. Each of them fails without the rules.
#[test]
fn a_plain_host_exception_lets_every_push_through() {
    let s = start("");
    let work = s.clone("w");
    commit_file(&work, ".github/workflows/ci.yml", b"on: push\n", "ci");
    let out = s.git(&work, &["push", "-q", "origin", "main"]);
    assert!(out.status.success(), "{}", stderr(&out));
    git_ok(&work, &["tag", "v1"]);
    assert!(s
        .git(&work, &["push", "-q", "origin", "v1"])
        .status
        .success());
    git_ok(&work, &["reset", "-q", "--hard", "HEAD~1"]);
    assert!(s
        .git(&work, &["push", "-qf", "origin", "main"])
        .status
        .success());
    assert!(s
        .git(&work, &["push", "-q", "origin", ":v1"])
        .status
        .success());
    let out = s.git(
        s.dir.path(),
        &["clone", "-q", &s.url("acme/secret"), "secret"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(s.server.receive_packs() >= 4);
}
