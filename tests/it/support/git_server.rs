//! A loopback git server over TLS: `git http-backend` (CGI) over bare
//! repositories in a temp dir, for the git gate's tests. It demands a
//! credential (`Authorization: Basic …`) that only egressd holds, and
//! records every request it receives (method, path, query, body size,
//! `Git-Protocol`), so a test can show that a refused push never reached
//! it. Owns the far side of git traffic; not egressd's view of it.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::tls::{serve_https, server_config, test_pki_named};

/// The name the server's certificate carries.
pub const GIT_HOST: &str = "git.example.test";
/// The credential it demands (user `agent`, password `s3cret`), as the
/// `Authorization` value egressd injects.
pub const GIT_AUTH: &str = "Basic YWdlbnQ6czNjcmV0";

/// One request as the server received it.
#[derive(Clone, Debug)]
pub struct GitHit {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body_len: usize,
    pub git_protocol: Option<String>,
    pub authorized: bool,
}

pub struct GitServer {
    pub addr: SocketAddr,
    /// The CA that signed its certificate (PEM), for `--upstream-ca`.
    pub ca_pem: String,
    /// The directory of bare repositories (`acme/widgets.git`, …).
    pub root: PathBuf,
    hits: Arc<Mutex<Vec<GitHit>>>,
    _dir: tempfile::TempDir,
}

impl GitServer {
    pub fn hits(&self) -> Vec<GitHit> {
        self.hits.lock().unwrap().clone()
    }

    /// `POST …/git-receive-pack` requests that reached the server.
    pub fn receive_packs(&self) -> usize {
        self.hits()
            .iter()
            .filter(|h| h.method == "POST" && h.path.ends_with("/git-receive-pack"))
            .count()
    }

    /// The bare repository `name` (`acme/widgets`).
    pub fn repo(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.git"))
    }

    /// `git rev-parse` of `rev` in the bare repository `name`, `None` when
    /// it does not resolve.
    pub fn rev(&self, name: &str, rev: &str) -> Option<String> {
        let out = Command::new(crate::support::tool("git"))
            .arg("--git-dir")
            .arg(self.repo(name))
            .args(["rev-parse", "--verify", "-q", rev])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Every ref of the bare repository `name`, `ref id` per line.
    pub fn refs(&self, name: &str) -> String {
        let out = Command::new(crate::support::tool("git"))
            .arg("--git-dir")
            .arg(self.repo(name))
            .args(["for-each-ref", "--format=%(refname) %(objectname)"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Runs `git` with `args` in `dir`, panicking when it fails.
pub fn git_ok(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(crate::support::tool("git"))
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A server with bare repositories `repos` (`acme/widgets`), each holding
/// one commit on `main` (a README).
pub fn git_server(repos: &[&str]) -> GitServer {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repos");
    let seed = dir.path().join("seed");
    std::fs::create_dir_all(&seed).unwrap();
    git_ok(&seed, &["init", "-q", "-b", "main"]);
    std::fs::write(seed.join("README"), "widgets\n").unwrap();
    git_ok(&seed, &["add", "README"]);
    git_ok(
        &seed,
        &[
            "-c",
            "user.name=seed",
            "-c",
            "user.email=seed@x",
            "commit",
            "-qm",
            "seed",
        ],
    );
    for r in repos {
        let bare = root.join(format!("{r}.git"));
        std::fs::create_dir_all(&bare).unwrap();
        git_ok(&bare, &["init", "-q", "--bare", "-b", "main"]);
        git_ok(&bare, &["config", "http.receivepack", "true"]);
        git_ok(&seed, &["push", "-q", bare.to_str().unwrap(), "main"]);
    }
    let pki = test_pki_named("egressd test git CA");
    let config = server_config(pki.leaf(&[GIT_HOST]), &[b"h2", b"http/1.1"]);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let hits = Arc::new(Mutex::new(Vec::new()));
    let (h2, root2) = (hits.clone(), root.clone());
    serve_https(l, config, 2, move |req| {
        handle(req, h2.clone(), root2.clone())
    });
    GitServer {
        addr,
        ca_pem: pki.ca_pem,
        root,
        hits,
        _dir: dir,
    }
}

async fn handle(
    req: Request<Incoming>,
    hits: Arc<Mutex<Vec<GitHit>>>,
    root: PathBuf,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let authorized = header("authorization").as_deref() == Some(GIT_AUTH);
    let git_protocol = header("git-protocol");
    let content_type = header("content-type");
    let encoding = header("content-encoding");
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    hits.lock().unwrap().push(GitHit {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        body_len: body.len(),
        git_protocol: git_protocol.clone(),
        authorized,
    });
    if !authorized {
        return Ok(Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Basic realm=\"git\"")
            .body(Full::new(Bytes::from_static(b"credentials required\n")))
            .unwrap());
    }
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(crate::support::tool("git"));
        cmd.arg("http-backend")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("GIT_PROJECT_ROOT", &root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("REQUEST_METHOD", &method)
            .env("PATH_INFO", &path)
            .env("QUERY_STRING", &query)
            .env("REMOTE_USER", "agent")
            .env("REMOTE_ADDR", "127.0.0.1")
            .env("CONTENT_LENGTH", body.len().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(ct) = content_type {
            cmd.env("CONTENT_TYPE", ct);
        }
        if let Some(enc) = encoding {
            cmd.env("HTTP_CONTENT_ENCODING", enc);
        }
        if let Some(p) = git_protocol {
            cmd.env("GIT_PROTOCOL", p);
        }
        let mut child = cmd.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let feed = thread::spawn(move || {
            let _ = stdin.write_all(&body);
        });
        let out = child.wait_with_output().unwrap();
        let _ = feed.join();
        out.stdout
    })
    .await
    .unwrap();
    Ok(cgi_response(&out))
}

/// A CGI answer (headers, a blank line, the body) as an HTTP response.
fn cgi_response(out: &[u8]) -> Response<Full<Bytes>> {
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            out.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        });
    let Some((head_end, body_start)) = split else {
        return Response::builder()
            .status(500)
            .body(Full::new(Bytes::copy_from_slice(out)))
            .unwrap();
    };
    let mut b = Response::builder();
    for line in String::from_utf8_lossy(&out[..head_end]).lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            let code: u16 = v.split(' ').next().unwrap_or("500").parse().unwrap_or(500);
            b = b.status(code);
        } else {
            b = b.header(k.trim(), v);
        }
    }
    b.body(Full::new(Bytes::copy_from_slice(&out[body_start..])))
        .unwrap()
}
