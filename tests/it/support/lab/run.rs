//! A lab for `egressd run` with the fake package registries: the
//! registry side of a [`Lab`](super::Lab) (`registry.rs`: the registries
//! on 127.77.0.x:443, their CA, egressd's interception CA) and its fake
//! DNS, without an `egressd serve`: each test runs its own sandbox, with
//! its own policy, against them. Made once per test binary ([`run_lab`]),
//! since the registries hold port 443.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::support::sandbox::{run, Outcome};
use crate::support::{behind_egressd, need_root, BehindEgressd, FakeDns, Registry};

/// Go modules in the lab live under this prefix (and `GONOSUMDB` names it).
pub const GO_PREFIX: &str = "git.lab.example";

/// The fake registries and their DNS for `egressd run`: what every
/// package-client test shares (one per test binary).
pub struct RunLab {
    pub reg: Registry,
    pub dns: FakeDns,
    /// egressd's interception CA (`--ca-dir`).
    pub certs: PathBuf,
    /// The registries' CA (`--upstream-ca`).
    pub reg_ca: PathBuf,
    /// The Rust toolchain, shown read-only inside so cargo runs there.
    toolchain: PathBuf,
    _dir: tempfile::TempDir,
}

static LAB: OnceLock<RunLab> = OnceLock::new();

/// The module's lab, made on first use; it needs root (port 443,
/// namespaces).
pub fn run_lab(test: &str) -> &'static RunLab {
    need_root(test, "the package lab: port 443, namespaces");
    LAB.get_or_init(make_lab)
}

fn make_lab() -> RunLab {
    let BehindEgressd {
        reg,
        dns,
        certs,
        reg_ca,
        dir,
    } = behind_egressd("");
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc --print sysroot");
    let toolchain = PathBuf::from(String::from_utf8(sysroot.stdout).unwrap().trim());
    RunLab {
        reg,
        dns,
        certs,
        reg_ca,
        toolchain,
        _dir: dir,
    }
}

impl RunLab {
    /// `egressd run` with `policy`, intercepting, running `script` in `sh`.
    pub fn run(&self, policy: &str, script: &str) -> Outcome {
        let cargo_bin = self.toolchain.join("bin");
        let path = format!("{}:/usr/local/bin:/usr/bin:/bin", cargo_bin.display());
        let r = run()
            .policy(policy)
            .dns(self.dns.addr)
            .arg("--ca-dir")
            .arg(&self.certs)
            .arg("--upstream-ca")
            .arg(&self.reg_ca)
            .arg("--ro")
            .arg(&self.toolchain)
            .arg("--env")
            .arg(format!("PATH={path}"))
            .arg("--env")
            .arg(format!("GONOSUMDB={GO_PREFIX}"))
            .arg("--env")
            .arg("GOFLAGS=-modcacherw")
            .arg("--timeout")
            .arg("55s")
            .cmd(&["sh", "-c", script]);
        // What each client printed, for the client matrix in docs/packages.md.
        if std::env::var_os("EGRESSD_LAB_SHOW").is_some() {
            eprintln!(
                "=== {script}\n--- stdout\n{}--- stderr\n{}",
                r.stdout, r.stderr
            );
        }
        r
    }
}
