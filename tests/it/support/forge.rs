//! A fake forge API over TLS (h2 and http/1.1 by ALPN): REST
//! `POST /repos/{owner}/{repo}/pulls` and `POST /graphql`, answering only
//! requests that carry [`FORGE_AUTH`] (a credential only egressd holds),
//! and recording every request with its whole body — so a test can say
//! exactly what reached the origin, and that a refused one did not.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::tls::{serve_https, server_config};
use super::Listener;

pub const FORGE_HOST: &str = "api.git.example.test";
pub const FORGE_AUTH: &str = "Bearer forge-token-only-egressd-holds";

/// One request as the forge received it.
#[derive(Debug, Clone)]
pub struct ForgeSeen {
    pub method: String,
    pub path: String,
    pub version: String,
    pub authorized: bool,
    pub body: Vec<u8>,
}

pub struct Forge {
    pub addr: SocketAddr,
    /// The forge's CA (give it to egressd as its upstream CA).
    pub ca_pem: String,
    seen: Arc<Mutex<Vec<ForgeSeen>>>,
}

impl Listener for Forge {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Forge {
    pub fn requests(&self) -> Vec<ForgeSeen> {
        self.seen.lock().unwrap().clone()
    }
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

pub fn forge() -> Forge {
    let pki = super::tls::test_pki();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let config = server_config(pki.leaf(&[FORGE_HOST]), &[b"h2", b"http/1.1"]);
    serve_https(l, config, 1, move |req| handle(req, s2.clone()));
    Forge {
        addr,
        ca_pem: pki.ca_pem,
        seen,
    }
}

/// What GitHub Enterprise's `/api/graphql` answers to the three requests
/// `gh pr create` makes (the repository, an open pull request for the
/// branch, the `createPullRequest` mutation), enough for gh to go on.
fn as_github_enterprise(seen: &Mutex<Vec<ForgeSeen>>) -> &'static str {
    let last = seen
        .lock()
        .unwrap()
        .last()
        .map(|s| s.body.clone())
        .unwrap_or_default();
    let query = serde_json::from_slice::<serde_json::Value>(&last)
        .ok()
        .and_then(|v| v["query"].as_str().map(str::to_owned))
        .unwrap_or_default();
    if query.contains("createPullRequest") {
        r#"{"data":{"createPullRequest":{"pullRequest":{"id":"PR_7","url":"https://api.git.example.test/acme/widgets/pull/7"}}}}"#
    } else if query.contains("PullRequestForBranch") {
        r#"{"data":{"repository":{"pullRequests":{"nodes":[]}}}}"#
    } else if query.contains("repository(") {
        r#"{"data":{"repository":{"id":"R_1","name":"widgets","owner":{"login":"acme"},"hasIssuesEnabled":true,"description":"","hasWikiEnabled":false,"viewerPermission":"WRITE","defaultBranchRef":{"name":"main"},"isPrivate":false,"parent":null,"mergeCommitAllowed":true,"rebaseMergeAllowed":true,"squashMergeAllowed":true}}}"#
    } else {
        r#"{"data":{}}"#
    }
}

async fn handle(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<ForgeSeen>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let version = format!("{:?}", req.version());
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == FORGE_AUTH.as_bytes());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    seen.lock().unwrap().push(ForgeSeen {
        method: method.clone(),
        path: path.clone(),
        version,
        authorized,
        body,
    });
    let (status, text) = if !authorized {
        (StatusCode::UNAUTHORIZED, r#"{"message":"Bad credentials"}"#)
    } else if method == "POST" && path.ends_with("/pulls") {
        (StatusCode::CREATED, r#"{"number":7,"draft":true}"#)
    } else if method == "POST" && path == "/graphql" {
        (StatusCode::OK, r#"{"data":{}}"#)
    } else if method == "POST" && path == "/api/graphql" {
        (StatusCode::OK, as_github_enterprise(&seen))
    } else {
        (StatusCode::NOT_FOUND, r#"{"message":"Not Found"}"#)
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)))
        .unwrap())
}
