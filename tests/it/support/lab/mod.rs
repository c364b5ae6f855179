//! The [`Lab`]: the one fixture of the suite that puts egressd between a
//! client and what stands behind it. An origin, a canary and an echo server
//! on loopback, a fake upstream DNS that answers the lab's names with the
//! origin's address, a scratch dir, and egressd started against that DNS
//! with the policy the test writes:
//!
//! ```ignore
//! let l = lab()
//!     .names(&["allowed.test", "evil.test"])
//!     .start(|ports| policy().exception("origin").host("allowed.test").cidr(LOOPBACK).port(ports.origin));
//! ```
//!
//! What differs between tests is how the lab is built, not its type:
//! - where egressd runs: served on loopback ([`LabBuilder::start`]), as
//!   `egressd run` around each script ([`LabBuilder::around_run`], then
//!   [`Lab::run`], `run.rs`), or in the gate of three network namespaces
//!   ([`LabBuilder::netns`], `netns.rs`: real DNS tunnel tools that have no
//!   way out but egressd);
//! - what stands behind it: the origin (any [`Listener`]), and with
//!   [`LabBuilder::registry`] the fake package registries (`registry.rs`),
//!   driven by [`Lab::curl`] (`curl.rs`) and read with [`Lab::line_for`]
//!   and [`Lab::metric`];
//! - whether egressd intercepts ([`LabBuilder::intercept`]): a CA of its
//!   own in the lab's scratch dir, trusting the far side's CA.
//!
//! Owns the wiring between the fixtures; not the fixtures themselves (see
//! `origin.rs`, `dns.rs`, `process.rs`, `registry.rs`) nor what a test
//! asserts about them, beyond [`Lab::assert_clean`].

mod curl;
pub mod netns;
mod run;

pub use netns::in_fresh_netns;
pub use run::{run_lab, GO_PREFIX};

use std::fmt::Display;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use self::netns::{Netns, Server};
use super::{
    assert_only_asked, ca_init, canary, echo_on, egressd, fake_dns, origin, registry_behind,
    scratch, Builder, Canary, Egressd, FakeDns, Listener, Origin, Registry, Scratch,
};

/// The loopback range, as an exception's `cidrs` names it: names in a lab
/// resolve to loopback addresses, which egressd refuses unless listed.
pub const LOOPBACK: &str = "127.0.0.0/8";

/// egressd and what it talks to; see the module header.
pub struct Lab<O = Origin> {
    /// The lab's `egressd serve` (on loopback, or in the netns gate).
    pub e: Served,
    pub dns: FakeDns,
    pub origin: O,
    /// Nothing may reach it; on 127.0.0.1 unless the test placed it.
    pub canary: Canary,
    /// A TCP echo server on 127.0.0.1, for tunnels.
    pub echo: SocketAddr,
    /// The fake package registry, when the lab has one.
    registry: Option<Registry>,
    /// egressd's interception CA, when it intercepts.
    ca: Option<Intercept>,
    /// The Rust toolchain shown to `egressd run` (a lab around `run`).
    toolchain: Option<PathBuf>,
    /// The namespaces, when egressd runs in their gate (after `e`: egressd
    /// stops before its namespace goes).
    netns: Option<Netns>,
    /// Last: the processes above may have files in it.
    scratch: Scratch,
}

/// The lab's `egressd serve`, read as an [`Egressd`]. A lab around
/// `egressd run` ([`LabBuilder::around_run`]) serves none: it starts one
/// per [`Lab::run`], and reading this is a test's mistake.
pub struct Served(Option<Egressd>);

impl Deref for Served {
    type Target = Egressd;
    fn deref(&self) -> &Egressd {
        self.0
            .as_ref()
            .expect("a lab around `egressd run` serves no egressd: use Lab::run")
    }
}

impl DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Egressd {
        self.0
            .as_mut()
            .expect("a lab around `egressd run` serves no egressd: use Lab::run")
    }
}

impl Served {
    /// The egressd itself, for a test that keeps it apart from its lab.
    pub fn into_inner(self) -> Egressd {
        self.0
            .expect("a lab around `egressd run` serves no egressd: use Lab::run")
    }
}

/// A test that restarts the lab's egressd its own way puts it here.
impl From<Egressd> for Served {
    fn from(e: Egressd) -> Served {
        Served(Some(e))
    }
}

/// What an intercepting egressd is given: its own CA (`--ca-dir`) and the
/// bundle it trusts the far side with (`--upstream-ca`), both in the lab's
/// scratch dir.
struct Intercept {
    certs: PathBuf,
    upstream: PathBuf,
}

/// Where a lab's fixtures listen (all on loopback).
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub origin: u16,
    pub canary: u16,
    pub echo: u16,
}

/// The fixtures of a [`Lab`] before egressd starts.
pub struct LabBuilder<O> {
    origin: O,
    canary: Canary,
    echo: SocketAddr,
    dns: FakeDns,
    names: Vec<String>,
    egressd: Builder,
    registry: Option<Registry>,
    ca: Option<Intercept>,
    netns: Option<Netns>,
    scratch: Scratch,
}

/// A lab whose origin is an [`Origin`] on 127.0.0.1.
pub fn lab() -> LabBuilder<Origin> {
    lab_with(origin())
}

/// A lab around `origin` (a raw origin, a TLS origin, one on another
/// loopback address).
pub fn lab_with<O: Listener>(origin: O) -> LabBuilder<O> {
    let dns = fake_dns();
    LabBuilder {
        origin,
        canary: canary(),
        echo: echo_on(Ipv4Addr::LOCALHOST.into(), 0),
        egressd: egressd().dns(dns.addr),
        dns,
        names: Vec::new(),
        registry: None,
        ca: None,
        netns: None,
        scratch: scratch(),
    }
}

impl<O: Listener> LabBuilder<O> {
    /// Names the fake DNS answers with the origin's address.
    pub fn names(mut self, names: &[&str]) -> Self {
        self.names.extend(names.iter().map(|n| n.to_string()));
        self
    }
    /// egressd intercepting: a CA of its own (`egressd ca init` in the
    /// scratch dir, `--ca-dir`), trusting `upstream_ca` (PEM) for the far
    /// side (`--upstream-ca`).
    pub fn intercept(mut self, upstream_ca: &str) -> Self {
        let certs = self.scratch.path("certs");
        ca_init(&certs);
        let upstream = self.scratch.file("upstream-ca.pem", upstream_ca);
        self.egressd = std::mem::take(&mut self.egressd)
            .env("EGRESSD_CA_DIR", certs.to_str().unwrap())
            .env("EGRESSD_UPSTREAM_CA", upstream.to_str().unwrap());
        self.ca = Some(Intercept { certs, upstream });
        self
    }
    /// The fake package registry on port 443 (so: root), its public names
    /// answered by the lab's DNS, and egressd intercepting
    /// ([`intercept`](Self::intercept)), trusting the registry's CA and
    /// `extra_ca` (PEM).
    pub fn registry(mut self, extra_ca: &str) -> Self {
        let reg = registry_behind(&self.dns);
        self = self.intercept(&format!("{}{extra_ca}", reg.ca_pem));
        self.registry = Some(reg);
        self
    }
    /// The registry of [`registry`](Self::registry), to publish into
    /// before egressd starts.
    pub fn reg(&self) -> &Registry {
        self.registry.as_ref().expect("a lab with .registry()")
    }
    /// egressd in network namespaces (lab `n`, 1..=250; see `netns.rs`):
    /// the client tool in the agent namespace, egressd in the gate (its DNS
    /// listener on [`Netns::egressd_dns`]), the tunnel server `server` in
    /// auth behind a relay that is egressd's upstream DNS. Needs root.
    pub fn netns(mut self, n: u8, server: Server) -> Self {
        let mut ns = Netns::new(n, self.scratch.dir());
        ns.server(server);
        self.egressd = ns.serve_in_gate(std::mem::take(&mut self.egressd));
        self.netns = Some(ns);
        self
    }
    /// This canary instead of the one on 127.0.0.1.
    pub fn canary(mut self, c: Canary) -> Self {
        self.canary = c;
        self
    }
    /// Anything more about how egressd starts: a log path, environment,
    /// arguments, another upstream DNS.
    pub fn egressd(mut self, f: impl FnOnce(Builder) -> Builder) -> Self {
        self.egressd = f(self.egressd);
        self
    }
    /// The fixtures' ports, for a policy written before egressd starts.
    pub fn ports(&self) -> Ports {
        Ports {
            origin: self.origin.addr().port(),
            canary: self.canary.addr.port(),
            echo: self.echo.port(),
        }
    }

    /// Starts egressd with the policy `policy` writes (given the fixtures'
    /// ports) as `p.yaml`.
    pub fn start<Y: Display>(self, policy: impl FnOnce(Ports) -> Y) -> Lab<O> {
        self.start_with(|ports, b| b.policy("p.yaml", &policy(ports).to_string()))
    }

    /// Starts egressd as `f` configures it (given the fixtures' ports), for
    /// a test that writes its own policy files.
    pub fn start_with(mut self, f: impl FnOnce(Ports, Builder) -> Builder) -> Lab<O> {
        let b = std::mem::take(&mut self.egressd);
        let b = f(self.ports(), b);
        self.finish(Some(b.start()), None)
    }

    /// The lab without an `egressd serve`: each [`Lab::run`] starts
    /// `egressd run` around a script, with the policy it is given, against
    /// the lab's DNS and registry, the Rust toolchain shown read-only.
    pub fn around_run(self) -> Lab<O> {
        let sysroot = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .expect("rustc --print sysroot");
        let toolchain = PathBuf::from(String::from_utf8(sysroot.stdout).unwrap().trim());
        self.finish(None, Some(toolchain))
    }

    fn finish(self, e: Option<Egressd>, toolchain: Option<PathBuf>) -> Lab<O> {
        let ip = self.origin.addr().ip().to_string();
        for n in &self.names {
            self.dns.set(n, &[&ip]);
        }
        Lab {
            e: Served(e),
            dns: self.dns,
            origin: self.origin,
            canary: self.canary,
            echo: self.echo,
            registry: self.registry,
            ca: self.ca,
            toolchain,
            netns: self.netns,
            scratch: self.scratch,
        }
    }
}

impl<O: Listener> Lab<O> {
    /// The origin's port.
    pub fn port(&self) -> u16 {
        self.origin.addr().port()
    }
    pub fn canary_port(&self) -> u16 {
        self.canary.addr.port()
    }
    pub fn echo_port(&self) -> u16 {
        self.echo.port()
    }
    /// The fake package registry ([`LabBuilder::registry`]).
    pub fn reg(&self) -> &Registry {
        self.registry.as_ref().expect("a lab with .registry()")
    }
    fn ca(&self) -> &Intercept {
        self.ca
            .as_ref()
            .expect("an intercepting lab (.intercept() or .registry())")
    }
    /// egressd's interception CA directory (`--ca-dir`).
    pub fn ca_dir(&self) -> &Path {
        &self.ca().certs
    }
    /// egressd's interception CA certificate, for a client to trust.
    pub fn ca_pem(&self) -> PathBuf {
        self.ca().certs.join("ca.pem")
    }
    /// The bundle egressd trusts the far side with (`--upstream-ca`).
    pub fn upstream_ca(&self) -> &Path {
        &self.ca().upstream
    }
    /// The lab's scratch space, for a client's files.
    pub fn scratch_dir(&self) -> &Path {
        self.scratch.dir()
    }
    /// The namespaces of a lab built with [`LabBuilder::netns`].
    pub fn ns(&self) -> &Netns {
        self.netns.as_ref().expect("a lab with .netns()")
    }
    pub fn ns_mut(&mut self) -> &mut Netns {
        self.netns.as_mut().expect("a lab with .netns()")
    }
    /// Nothing reached the canary, and the fake DNS was asked about no
    /// name but `allowed` (a denied name must never be resolved).
    pub fn assert_clean(&self, allowed: &[&str]) {
        assert_eq!(self.canary.hits(), 0, "the canary was reached");
        assert_only_asked(&self.dns, allowed);
    }
}
