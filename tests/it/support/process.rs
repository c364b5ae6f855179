//! egressd as a real process: `egressd serve` on 127.0.0.1:0 with a policy
//! directory in a temp dir, its listening addresses read from stderr, its
//! decision log and metrics read back.
//!
//! Owns starting, signalling and stopping the process; not what the tests
//! send it (see `http.rs`, `dns.rs`) or how they read its log (`log.rs`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::{eventually, host_of, http_request, Response};

/// How long egressd may take to print its listening line.
const START: Duration = Duration::from_secs(30);
/// An upstream DNS address nobody listens on (the discard port), for a test
/// that brings no fake DNS.
const NO_DNS: &str = "127.0.0.1:9";

pub struct Egressd {
    pub child: Child,
    pub proxy: SocketAddr,
    pub dns: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: tempfile::TempDir,
    pub policy_dir: PathBuf,
    pub log_path: PathBuf,
    pub stderr: Arc<Mutex<Vec<String>>>,
    /// Set when egressd's stderr reached its end (it exited).
    pub stderr_closed: Arc<std::sync::atomic::AtomicBool>,
}

/// How `egressd serve` is started; [`Builder::start`] starts it.
#[derive(Default)]
pub struct Builder {
    files: Vec<(String, String)>,
    upstream_dns: Option<SocketAddr>,
    dns_listen: Option<SocketAddr>,
    log: Option<String>,
    env: Vec<(String, String)>,
    args: Vec<String>,
    policy_file: bool,
    policy_path: Option<PathBuf>,
    clean_env: bool,
    wrap: Vec<String>,
}

pub fn egressd() -> Builder {
    Builder::default()
}

impl Builder {
    /// A file `name` in the policy directory, holding `yaml` (a
    /// [`super::PolicyYaml`] renders with `.yaml()`).
    pub fn policy(mut self, name: &str, yaml: &str) -> Self {
        self.files.push((name.to_string(), yaml.to_string()));
        self
    }
    pub fn dns(mut self, upstream: SocketAddr) -> Self {
        self.upstream_dns = Some(upstream);
        self
    }
    /// Where egressd's DNS listener binds (default 127.0.0.1:0).
    pub fn dns_listen(mut self, at: SocketAddr) -> Self {
        self.dns_listen = Some(at);
        self
    }
    pub fn log(mut self, path: &str) -> Self {
        self.log = Some(path.to_string());
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// An extra `serve` argument.
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_string());
        self
    }
    /// Pass the single policy file itself as --policy, not its directory.
    pub fn policy_as_file(mut self) -> Self {
        self.policy_file = true;
        self
    }
    /// Pass this existing file or directory as --policy (the shipped
    /// `policy/`, say) instead of the files given here.
    pub fn policy_path(mut self, path: &Path) -> Self {
        self.policy_path = Some(path.to_path_buf());
        self
    }
    /// Start egressd under `argv` (say `unshare -m sh -c '…; exec "$0" "$@"'`),
    /// which is given egressd's path and arguments after its own and must
    /// exec them (the child's pid stays egressd's).
    pub fn wrap(mut self, argv: &[&str]) -> Self {
        self.wrap = argv.iter().map(|a| a.to_string()).collect();
        self
    }
    /// Start egressd with an empty environment (plus [`Builder::env`]), as
    /// a container or a service manager would.
    pub fn clean_env(mut self) -> Self {
        self.clean_env = true;
        self
    }

    pub fn start(self) -> Egressd {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy_dir = dir.path().join("policy");
        std::fs::create_dir(&policy_dir).unwrap();
        for (name, yaml) in &self.files {
            std::fs::write(policy_dir.join(name), yaml).unwrap();
        }
        let policy_arg = match &self.policy_path {
            Some(p) => p.clone(),
            None if self.policy_file => policy_dir.join(&self.files[0].0),
            None => policy_dir.clone(),
        };
        let log_path = dir.path().join("decisions.log");
        let log_arg = self
            .log
            .clone()
            .unwrap_or_else(|| log_path.display().to_string());
        let upstream = self.upstream_dns.unwrap_or_else(|| NO_DNS.parse().unwrap());
        let dns_listen = self
            .dns_listen
            .map_or_else(|| "127.0.0.1:0".to_string(), |a| a.to_string());
        let mut cmd = match self.wrap.split_first() {
            Some((prog, rest)) => {
                let mut c = Command::new(prog);
                c.args(rest).arg(env!("CARGO_BIN_EXE_egressd"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_egressd")),
        };
        if self.clean_env {
            cmd.env_clear();
        }
        cmd.arg("serve")
            .arg("--policy")
            .arg(&policy_arg)
            .args(["--listen", "127.0.0.1:0"])
            .arg("--dns-listen")
            .arg(dns_listen)
            .args(["--metrics-listen", "127.0.0.1:0"])
            .arg("--upstream-dns")
            .arg(upstream.to_string())
            .arg("--log")
            .arg(&log_arg)
            .env_remove("EGRESSD_POLICY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd.args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn egressd");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = lines.clone();
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c2 = closed.clone();
        thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("egressd: listening") {
                    if let Some(t) = tx.take() {
                        let _ = t.send(line.clone());
                    }
                }
                l2.lock().unwrap().push(line);
            }
            c2.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let line = match rx.recv_timeout(START) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("egressd did not start: {:?}", lines.lock().unwrap());
            }
        };
        let field = |name: &str| announced(&line, name);
        Egressd {
            proxy: field("proxy"),
            dns: field("dns"),
            metrics: field("metrics"),
            child,
            dir,
            policy_dir,
            log_path,
            stderr: lines,
            stderr_closed: closed,
        }
    }
}

impl Egressd {
    /// Every decision-log line written so far, parsed.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        super::read_log(&self.log_path)
    }

    /// Waits for a log line satisfying `pred` and returns it.
    pub fn wait_line(
        &self,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        eventually(what, || self.log_lines().into_iter().find(|l| pred(l)))
    }

    pub fn metrics_text(&self) -> String {
        let r = http_request(
            self.metrics,
            b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
        String::from_utf8(r.body).unwrap()
    }

    /// The value of one sample, e.g. `egressd_requests_total{proto="http",decision="allow"}`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics_text(), series)
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Sends a request through the proxy and reads one response.
    pub fn get(&self, url: &str) -> Response {
        self.request(&format!(
            "GET {url} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            host_of(url)
        ))
    }

    pub fn request(&self, raw: &str) -> Response {
        http_request(self.proxy, raw.as_bytes())
    }
}

impl Drop for Egressd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finds `series` (exact label text) in a Prometheus exposition.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        (name == series).then(|| v.parse().ok()).flatten()
    })
}

/// `egressd ca init --dir dir`: an interception CA for egressd, which
/// must succeed.
pub fn ca_init(dir: &Path) {
    let init = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["ca", "init", "--dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
}

/// Writes `text` to `path` the way an editor's atomic save does: a temp file
/// in the same directory renamed over the old one.
pub fn atomic_write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The address egressd's start-up line announces as `name=ADDR`.
pub fn announced(line: &str, name: &str) -> SocketAddr {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .parse()
        .unwrap()
}
