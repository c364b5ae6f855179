//! A [`Lab`] around `egressd run`: a lab's registry (the fake registries
//! on 127.77.0.x:443, their CA, egressd's interception CA) and its fake
//! DNS, without an `egressd serve`: each test runs its own
//! sandbox, with its own policy, against them ([`Lab::run`]). Made once per
//! test binary ([`run_lab`]), since the registries hold port 443.

use std::sync::OnceLock;

use super::{lab, Lab};
use crate::support::need_root;
use crate::support::sandbox::{run, Outcome};

/// Go modules in the lab live under this prefix (and `GONOSUMDB` names it).
pub const GO_PREFIX: &str = "git.lab.example";

static LAB: OnceLock<Lab> = OnceLock::new();

/// The package clients' lab, made on first use; it needs root (port 443,
/// namespaces).
pub fn run_lab(test: &str) -> &'static Lab {
    need_root(test, "the package lab: port 443, namespaces");
    LAB.get_or_init(|| lab().registry("").around_run())
}

impl Lab {
    /// `egressd run` with `policy`, intercepting, running `script` in `sh`.
    pub fn run(&self, policy: &str, script: &str) -> Outcome {
        let toolchain = self
            .toolchain
            .as_ref()
            .expect("a lab built with .around_run()");
        let cargo_bin = toolchain.join("bin");
        let path = format!("{}:/usr/local/bin:/usr/bin:/bin", cargo_bin.display());
        let r = run()
            .policy(policy)
            .dns(self.dns.addr)
            .arg("--ca-dir")
            .arg(self.ca_dir())
            .arg("--upstream-ca")
            .arg(self.upstream_ca())
            .arg("--ro")
            .arg(toolchain)
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
