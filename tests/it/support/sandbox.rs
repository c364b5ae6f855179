//! `egressd run` as a real process for the sandbox tests (launcher,
//! sandbox, transparent, browser, packages): [`run()`] builds the command
//! line, [`Run::cmd`] runs it and returns its [`Outcome`] (exit code,
//! output, decision log). Also the rootless and no-cgroup variants.

use std::ffi::OsString;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::{is_root, missing, need_for_script, tool};

/// How long one `egressd run` may take before the test kills it.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The launcher's pid (its cgroup is named after it).
    pub pid: u32,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Outcome {
    /// The lines that end each request or connection: a connection's
    /// close line (checked to pair with its open line), never its open
    /// line (see `log::ending`).
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        super::log::ending(super::read_log(&self.log_path))
    }
    pub fn line(&self, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.log_lines()
            .into_iter()
            .find(|l| pred(l))
            .unwrap_or_else(|| panic!("no such log line in {:?}", self.log_lines()))
    }
    pub fn context(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// An `egressd run` invocation.
pub struct Run {
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    policy: Option<String>,
    dns: Option<SocketAddr>,
    as_nobody: bool,
    cwd: Option<PathBuf>,
    /// `--policy` given instead of the run's own directory.
    policy_at: Option<PathBuf>,
    /// No `--log`: the launcher's default.
    default_log: bool,
}

pub fn run() -> Run {
    Run {
        args: Vec::new(),
        env: Vec::new(),
        policy: None,
        dns: None,
        as_nobody: false,
        cwd: None,
        policy_at: None,
        default_log: false,
    }
}

impl Run {
    pub fn policy(mut self, yaml: &str) -> Self {
        self.policy = Some(yaml.to_string());
        self
    }
    pub fn dns(mut self, addr: SocketAddr) -> Self {
        self.dns = Some(addr);
        self
    }
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    /// Runs the launcher as uid/gid 65534 with no supplementary groups.
    pub fn unprivileged(mut self) -> Self {
        self.as_nobody = true;
        self
    }
    /// Runs the launcher in `dir` (default: an empty directory of its own,
    /// which the sandbox shows read-write).
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Passes `--policy path` instead of the run's own policy directory.
    pub fn policy_at(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy_at = Some(path.into());
        self
    }
    /// Leaves `--log` out (the launcher picks a file outside the sandbox).
    pub fn default_log(mut self) -> Self {
        self.default_log = true;
        self
    }

    /// Runs `egressd run … -- cmd…` and waits for it.
    pub fn cmd(self, cmd: &[&str]) -> Outcome {
        // What CMD runs must be installed: a missing one fails here, naming
        // its install, not inside as `sh: curl: not found`.
        if let Some(first) = cmd.first() {
            need_for_script(first);
        }
        if let [sh, "-c", script, ..] = cmd {
            if sh.ends_with("sh") {
                need_for_script(script);
            }
        }
        // --transparent drives nft, unless the test names its own (--nft)
        // or asks for a refusal that comes first (--connect).
        let has = |flag: &str| self.args.iter().any(|a| a == flag);
        if has("--transparent") && !has("--nft") && !has("--connect") {
            tool("nft");
        }
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("decisions.log");
        let policy_dir = dir.path().join("policy");
        std::fs::create_dir(&policy_dir).unwrap();
        // The working directory the sandbox shows: beside the policy and
        // the log, which the sandbox does not show.
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(
            policy_dir.join("p.yaml"),
            self.policy.as_deref().unwrap_or("exceptions: []\n"),
        )
        .unwrap();
        if self.as_nobody {
            use std::os::unix::fs::PermissionsExt;
            for (p, mode) in [
                (dir.path(), 0o777),
                (policy_dir.as_path(), 0o755),
                (policy_dir.join("p.yaml").as_path(), 0o644),
            ] {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            std::os::unix::fs::chown(&work, Some(65534), Some(65534)).unwrap();
        }
        let bin = env!("CARGO_BIN_EXE_egressd");
        let mut c = if self.as_nobody {
            let mut c = Command::new(tool("setpriv"));
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin]);
            c.env("HOME", "/nonexistent");
            c
        } else {
            Command::new(bin)
        };
        c.arg("run")
            .arg("--policy")
            .arg(self.policy_at.as_deref().unwrap_or(&policy_dir));
        if !self.default_log && !self.args.iter().any(|a| a == "--log") {
            c.arg("--log").arg(&log_path);
        }
        c.arg("--upstream-dns")
            .arg(
                self.dns
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "127.0.0.1:9".into()),
            )
            .args(&self.args)
            .arg("--")
            .args(cmd)
            .current_dir(self.cwd.as_deref().unwrap_or(&work))
            .env_remove("EGRESSD_POLICY")
            .env_remove("EGRESSD_CA_DIR")
            .env_remove("EGRESSD_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        let start = Instant::now();
        let mut child = c.spawn().expect("spawn egressd run");
        let pid = child.id();
        let mut out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let t_out = thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let t_err = thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > RUN_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "egressd run did not finish within {RUN_DEADLINE:?}; stderr: {}",
                    t_err.join().unwrap()
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        let elapsed = start.elapsed();
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Outcome {
            code,
            stdout: t_out.join().unwrap(),
            stderr: t_err.join().unwrap(),
            elapsed,
            pid,
            log_path,
            _dir: dir,
        }
    }
}

/// A UDP socket that counts the datagrams it receives.
pub fn udp_canary(ip: IpAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let addr = s.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let end = Instant::now() + Duration::from_secs(120);
        while Instant::now() < end {
            if s.recv_from(&mut buf).is_ok() {
                h.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (addr, hits)
}

/// `egressd run` where no cgroup can be had, so that the rlimit fallback
/// is what bounds CMD: as root, run as uid 65534 (whom no cgroup is
/// delegated to). Fails `test` where that cannot be done.
pub fn without_cgroups(test: &str) -> Run {
    if is_root() {
        need_unprivileged_userns(test);
        run().unprivileged()
    } else {
        run()
    }
}

/// The launcher's one line saying the limits are per process.
pub const FALLBACK_NOTE: &str = "so limits are per process";

/// Fails `test` unless uid 65534 may create a user namespace here.
pub fn need_unprivileged_userns(test: &str) {
    if let Err(why) = unprivileged_userns() {
        panic!("{test}: {why}");
    }
}

/// Whether uid 65534 may create a user namespace here; the reason if not.
pub fn unprivileged_userns() -> Result<(), String> {
    if !is_root() {
        return Err("the test is not running as root, so it cannot switch to uid 65534: run the README's test command as root".into());
    }
    let out = Command::new(tool("setpriv"))
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "unshare",
            "--user",
            "--map-root-user",
            "true",
        ])
        .output()
        .map_err(|e| format!("cannot run setpriv/unshare ({e}): {}", missing("setpriv")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "this kernel does not let an unprivileged user create a user namespace: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
