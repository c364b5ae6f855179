//! Fixtures for the integration tests. Everything binds 127.0.0.1:0 (or
//! another 127/8 address, or ::1); nothing leaves the machine.
//!
//! | file | owns |
//! |---|---|
//! | `lab.rs` | [`Lab`]: origin + canary + echo + fake DNS + egressd with a policy, in one call |
//! | `policy.rs` | [`policy()`]: a policy built in code, rendered as YAML (owner/reason defaults) |
//! | `process.rs` | [`egressd()`]: `egressd serve` as a real process, its log and metrics |
//! | `dns.rs` | [`fake_dns()`]: the one fake upstream DNS (UDP+TCP, a table or a script, counts what it is asked); a DNS client |
//! | `origin.rs` | [`origin()`], [`raw_origin()`], [`canary()`], [`echo_on()`]: the far side of a connection |
//! | `http.rs` | a raw HTTP/1.1 client: bytes as written, responses read by hand |
//! | `log.rs` | [`Lines`]: the decision log, one line per attempt; [`refused`] |
//!
//! Here too: [`eventually`] (poll with a deadline, never sleep and hope),
//! [`on_path`], [`scratch`] (a temp dir to write files in).

// Which fixture a module uses changes as modules change (the sandbox tests
// are being rewritten): an unused one is not an error here.
#![allow(dead_code)]

mod dns;
mod http;
mod lab;
mod log;
mod origin;
mod policy;
mod process;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

pub use dns::*;
pub use http::*;
pub use lab::*;
pub use log::*;
pub use origin::*;
pub use policy::*;
pub use process::*;

/// How long any wait in a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `f` until it returns Some, or panics after `DEADLINE` with `what`.
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > end {
            panic!("timed out waiting for {what}");
        }
        thread::sleep(POLL);
    }
}

/// Something listening on a socket: an origin, a canary, an echo server.
pub trait Listener {
    fn addr(&self) -> SocketAddr;
}

impl Listener for SocketAddr {
    fn addr(&self) -> SocketAddr {
        *self
    }
}

/// The first `name` on `$PATH`, for tests that drive a real client (and
/// say SKIPPED when it is not installed).
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The repository's root (where `policy/`, `deploy/`, `examples/` are).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A temp dir, removed on drop, with helpers to fill it.
pub struct Scratch(tempfile::TempDir);

pub fn scratch() -> Scratch {
    Scratch(tempfile::tempdir().expect("tempdir"))
}

impl Scratch {
    pub fn dir(&self) -> &Path {
        self.0.path()
    }
    /// `name` inside it (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    /// Writes `text` to `name` (parents created) and returns its path.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }
}
