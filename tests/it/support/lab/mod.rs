//! A [`Lab`]: the preamble most integration tests share, in one call. An
//! origin, a canary and an echo server on loopback, a fake upstream DNS
//! that answers the lab's names with the origin's address, and egressd
//! started against that DNS with the policy the test writes:
//!
//! ```ignore
//! let l = lab()
//!     .names(&["allowed.test", "evil.test"])
//!     .start(|ports| policy().exception("origin").host("allowed.test").cidr(LOOPBACK).port(ports.origin));
//! ```
//!
//! With [`LabBuilder::registry`] the lab also holds the fake package
//! registry (`registry.rs`) behind an intercepting egressd: the package
//! gate's tests are labs too.
//!
//! Owns the wiring between the fixtures; not the fixtures themselves (see
//! `origin.rs`, `dns.rs`, `process.rs`, `registry.rs`) nor what a test
//! asserts about them, beyond [`Lab::assert_clean`].
//!
//! The labs of the suite, all here, each a builder for what its tests
//! need:
//! - [`lab`] / [`lab_with`]: `egressd serve` and its fixtures;
//!   [`LabBuilder::registry`] adds the fake package registries, and
//!   `curl.rs` drives such a lab as the package gate's tests do
//!   ([`Lab::curl`], [`Lab::line_for`], [`Lab::metric`]);
//! - [`run_lab`] (`run.rs`): the same registries and DNS for `egressd run`,
//!   one per test binary, for the real package clients;
//! - [`netns::NetnsLab`] (`netns.rs`): network namespaces the test makes,
//!   for real DNS tunnel tools that must have no way out but egressd.

mod curl;
pub mod netns;
mod run;

pub use run::{run_lab, RunLab, GO_PREFIX};

use std::fmt::Display;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use super::{
    assert_only_asked, canary, echo_on, egressd, fake_dns, origin, registry_side, Builder, Canary,
    Egressd, FakeDns, Listener, Origin, Registry, RegistrySide,
};

/// The loopback range, as an exception's `cidrs` names it: names in a lab
/// resolve to loopback addresses, which egressd refuses unless listed.
pub const LOOPBACK: &str = "127.0.0.0/8";

/// egressd and what it talks to; see the module header.
pub struct Lab<O = Origin> {
    pub e: Egressd,
    pub dns: FakeDns,
    pub origin: O,
    /// Nothing may reach it; on 127.0.0.1 unless the test placed it.
    pub canary: Canary,
    /// A TCP echo server on 127.0.0.1, for tunnels.
    pub echo: SocketAddr,
    /// The fake package registry, when the lab has one.
    pub registry: Option<RegistrySide>,
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
    registry: Option<RegistrySide>,
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
    }
}

impl<O: Listener> LabBuilder<O> {
    /// Names the fake DNS answers with the origin's address.
    pub fn names(mut self, names: &[&str]) -> Self {
        self.names.extend(names.iter().map(|n| n.to_string()));
        self
    }
    /// The fake package registry on port 443 (so: root), its public names
    /// answered by the lab's DNS, and egressd intercepting with a CA of its
    /// own (`--ca-dir`) and trusting the registry's and `extra_ca` (PEM).
    pub fn registry(mut self, extra_ca: &str) -> Self {
        let side = registry_side(&self.dns, extra_ca);
        self.egressd = std::mem::take(&mut self.egressd)
            .env("EGRESSD_CA_DIR", side.certs.to_str().unwrap())
            .env("EGRESSD_UPSTREAM_CA", side.reg_ca.to_str().unwrap());
        self.registry = Some(side);
        self
    }
    /// The registry of [`registry`](Self::registry), to publish into
    /// before egressd starts.
    pub fn reg(&self) -> &Registry {
        &self.registry.as_ref().expect("a lab with .registry()").reg
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
        let ip = self.origin.addr().ip().to_string();
        for n in &self.names {
            self.dns.set(n, &[&ip]);
        }
        Lab {
            e: b.start(),
            dns: self.dns,
            origin: self.origin,
            canary: self.canary,
            echo: self.echo,
            registry: self.registry,
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
    fn side(&self) -> &RegistrySide {
        self.registry.as_ref().expect("a lab with .registry()")
    }
    /// The fake package registry ([`LabBuilder::registry`]).
    pub fn reg(&self) -> &Registry {
        &self.side().reg
    }
    /// egressd's interception CA certificate, for a client to trust.
    pub fn ca_pem(&self) -> PathBuf {
        self.side().certs.join("ca.pem")
    }
    /// Scratch space of the registry side, for a client's files.
    pub fn scratch_dir(&self) -> &Path {
        self.side().dir.path()
    }
    /// Nothing reached the canary, and the fake DNS was asked about no
    /// name but `allowed` (a denied name must never be resolved).
    pub fn assert_clean(&self, allowed: &[&str]) {
        assert_eq!(self.canary.hits(), 0, "the canary was reached");
        assert_only_asked(&self.dns, allowed);
    }
}
