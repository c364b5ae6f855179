//! The install benchmark that `benches/load/packages` runs (ignored
//! otherwise: it measures, it asserts only that every install worked).
//! `pip install` of 30 wheels and `npm ci` of 200 packages from the lab's
//! fake registries, three ways: direct (no proxy: the host's client with
//! the registry names in a private `/etc/hosts`), through an intercepting
//! egressd with plain exceptions, and through the same egressd with the
//! package gate on (every name approved, so the work differs only by the
//! gate's filtering and authorisation). Only the install is timed, inside
//! the sandbox, so the sandbox's setup is not counted; each run starts
//! with empty caches. Prints the medians and their ratios as a Markdown
//! table.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::clients::npm_project;
use super::*;

const WHEELS: usize = 30;
const NPM_PACKAGES: usize = 200;

fn py_name(i: usize) -> String {
    format!("bench-py-{i:02}")
}
fn npm_name(i: usize) -> String {
    format!("bench-npm-{i:03}")
}

/// Shell that times `cmd` (nanoseconds, printed as `BENCH <ns>`).
fn timed(setup: &str, cmd: &str) -> String {
    format!("{setup}t0=$(date +%s%N)\n{cmd}\nt1=$(date +%s%N)\necho \"BENCH $((t1 - t0))\"\n")
}

fn bench_ns(stdout: &str, what: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("BENCH "))
        .unwrap_or_else(|| panic!("{what}: no timing in {stdout}"))
        .trim()
        .parse()
        .unwrap()
}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0
    }
}

struct Bench<'a> {
    l: &'a Lab,
    egressd: PathBuf,
    dir: tempfile::TempDir,
    /// System roots plus the registries' CA, for the direct runs.
    bundle: PathBuf,
    hosts: PathBuf,
}

impl Bench<'_> {
    /// The script run with the registry names in /etc/hosts and no proxy,
    /// its HOME and /tmp a tmpfs as in the sandbox (a disk would make the
    /// direct runs slower for a reason that is not egressd's).
    fn direct(&self, script: &str) -> (u64, String) {
        let home = tempfile::tempdir_in(self.dir.path()).unwrap();
        let inner = format!(
            "mount -t tmpfs tmpfs {h} && mount --bind {} /etc/hosts && cd {h} && exec sh -c \"$0\"",
            self.hosts.display(),
            h = home.path().display()
        );
        let b = self.bundle.to_str().unwrap();
        let out = Command::new(crate::support::tool("unshare"))
            .args(["--mount", "--propagation", "private", "sh", "-c", &inner])
            .arg(script.replace("/tmp/", &format!("{}/", home.path().display())))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", home.path())
            .envs(
                [
                    "SSL_CERT_FILE",
                    "REQUESTS_CA_BUNDLE",
                    "PIP_CERT",
                    "npm_config_cafile",
                ]
                .map(|k| (k, b)),
            )
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "direct run failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (bench_ns(&stdout, "direct"), stdout)
    }

    /// The script inside `egressd run` (the benchmark's egressd binary).
    fn through(&self, policy: &str, script: &str) -> (u64, String) {
        let d = tempfile::tempdir_in(self.dir.path()).unwrap();
        let pdir = d.path().join("policy");
        std::fs::create_dir(&pdir).unwrap();
        std::fs::write(pdir.join("p.yaml"), policy).unwrap();
        let work = d.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let out = Command::new(&self.egressd)
            .arg("run")
            .arg("--policy")
            .arg(&pdir)
            .arg("--log")
            .arg(d.path().join("decisions.log"))
            .arg("--upstream-dns")
            .arg(self.l.dns.addr.to_string())
            .arg("--ca-dir")
            .arg(self.l.ca_dir())
            .arg("--upstream-ca")
            .arg(self.l.upstream_ca())
            .args([
                "--env",
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "--timeout",
                "300s",
            ])
            .args(["--", "sh", "-c", script])
            .current_dir(&work)
            .env_remove("EGRESSD_POLICY")
            .env_remove("EGRESSD_CA_DIR")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "egressd run failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (bench_ns(&stdout, "egressd run"), stdout)
    }
}

fn system_bundle() -> &'static Path {
    [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ]
    .iter()
    .map(Path::new)
    .find(|p| p.is_file())
    .expect("a system CA bundle")
}

#[test]
#[ignore = "a benchmark: benches/load/packages runs it"]
fn install_benchmark() {
    let test = "packages::bench";
    have("npm", test);
    let l = run_lab(test);
    let runs: usize = std::env::var("EGRESSD_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let egressd = std::env::var_os("EGRESSD_BENCH_EGRESSD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_egressd")));
    let age = DAY * 30;
    for i in 0..WHEELS {
        l.reg().publish(Eco::Pypi, &py_name(i), "1.0.0", age, &[]);
    }
    for i in 0..NPM_PACKAGES {
        l.reg().publish(Eco::Npm, &npm_name(i), "1.0.0", age, &[]);
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle.pem");
    let mut pem = std::fs::read_to_string(system_bundle()).unwrap();
    pem.push_str(&l.reg().ca_pem);
    std::fs::write(&bundle, pem).unwrap();
    let hosts = dir.path().join("hosts");
    let mut h = String::from("127.0.0.1 localhost\n");
    for n in REGISTRY_HOSTS {
        h.push_str(&format!("{} {n}\n", l.reg().ip()));
    }
    std::fs::write(&hosts, h).unwrap();
    let b = Bench {
        l,
        egressd,
        dir,
        bundle,
        hosts,
    };

    // pip: 30 wheels into a fresh venv, no cache.
    let py: Vec<String> = (0..WHEELS).map(py_name).collect();
    let pip = timed(
        "set -e\n/usr/bin/python3 -m venv --without-pip /tmp/v\n",
        &format!(
            "/usr/bin/python3 -m pip --python /tmp/v/bin/python install -q --no-cache-dir \
             --disable-pip-version-check --no-input {}",
            py.join(" ")
        ),
    );
    // npm: a lockfile of 200 packages, made once; `npm ci` with an empty cache.
    let deps: Vec<String> = (0..NPM_PACKAGES)
        .map(|i| format!("\\\"{}\\\":\\\"^1.0.0\\\"", npm_name(i)))
        .collect();
    let package_json = format!(
        "echo \"{{\\\"name\\\":\\\"app\\\",\\\"version\\\":\\\"1.0.0\\\",\\\"private\\\":true,\\\"dependencies\\\":{{{}}}}}\" > package.json\n",
        deps.join(",")
    );
    let (_, lock) = b.direct(&timed(
        &format!("{}{package_json}", npm_project()),
        "npm install -q --no-audit --no-fund --package-lock-only --cache /tmp/npm-cache >/dev/null\ncat package-lock.json",
    ));
    let lock = &lock[lock.find('{').unwrap()..lock.rfind('}').unwrap() + 1];
    assert!(lock.contains(&npm_name(NPM_PACKAGES - 1)), "{lock}");
    let npm_ci = timed(
        &format!(
            "{}{package_json}cat > package-lock.json <<'EOF'\n{lock}\nEOF\n",
            npm_project()
        ),
        "npm ci -q --no-audit --no-fund --no-update-notifier --cache /tmp/npm-cache >/dev/null",
    );

    let plain = registry_exceptions();
    let py_allow: Vec<&str> = py.iter().map(String::as_str).collect();
    let npm: Vec<String> = (0..NPM_PACKAGES).map(npm_name).collect();
    let npm_allow: Vec<&str> = npm.iter().map(String::as_str).collect();
    let gate = gated(&format!(
        "{}{}",
        set("bench-py", "pypi", &py_allow),
        set("bench-npm", "npm", &npm_allow)
    ));
    let mut rows = Vec::new();
    for (what, script) in [
        (format!("pip install, {WHEELS} wheels"), &pip),
        (format!("npm ci, {NPM_PACKAGES} packages"), &npm_ci),
    ] {
        let mut t = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..runs {
            t[0].push(b.direct(script).0);
            t[1].push(b.through(&plain, script).0);
            t[2].push(b.through(&gate, script).0);
        }
        eprintln!(
            "{what}: runs (ns) direct {:?} intercepting {:?} gate {:?}",
            t[0], t[1], t[2]
        );
        let m: Vec<f64> = t.into_iter().map(median).collect();
        rows.push((what, m));
    }
    let s = |ns: f64| format!("{:.2} s", Duration::from_nanos(ns as u64).as_secs_f64());
    println!("\n| workload (median of {runs}) | direct | egressd, intercepting | egressd + gate | intercepting / direct | gate / direct | gate / intercepting |");
    println!("|---|---|---|---|---|---|---|");
    for (what, m) in rows {
        println!(
            "| {what} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            s(m[0]),
            s(m[1]),
            s(m[2]),
            m[1] / m[0],
            m[2] / m[0],
            m[2] / m[1]
        );
    }
}
