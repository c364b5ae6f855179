//! The package gate with real clients: `pip`, `npm`, `cargo` and `go` run
//! inside `egressd run` and install from the fake public registries of
//! `support/registry.rs` (HTTPS on 127.77.0.x:443, their own test CA),
//! which egressd reaches because its upstream DNS fake answers
//! `pypi.org`, `registry.npmjs.org`, `index.crates.io`, `proxy.golang.org`
//! and their file hosts with that address. egressd intercepts (`--ca-dir`)
//! and trusts the registries' CA (`--upstream-ca`); the clients trust
//! egressd's CA through the variables `egressd run` sets (`PIP_CERT`,
//! `REQUESTS_CA_BUNDLE`, `npm_config_cafile`, `NODE_EXTRA_CA_CERTS`,
//! `CARGO_HTTP_CAINFO`, `SSL_CERT_FILE`) and reach it through
//! `HTTPS_PROXY`: no client is configured for a mirror or a proxy by hand.
//!
//! One lab serves the whole module: a [`Lab`](crate::support::Lab) built
//! around `egressd run`, its registry and fake DNS made once
//! ([`run_lab`](crate::support::run_lab)); each test publishes packages under names of its own and runs its own
//! `egressd run` with its own policy.
//!
//! Go: `GOPROXY` is left at its default (`https://proxy.golang.org,direct`).
//! `GONOSUMDB` names the lab's module prefix: the checksum database's
//! answers are signed with sum.golang.org's private key, which no test can
//! forge, and a company serving its own modules sets exactly this for
//! them; go still records and checks `go.sum`.
//!
//! `EGRESSD_LAB_SHOW=1` prints what each client printed.
//!
//! Needs root (port 443, namespaces) and the clients (`tests/setup`
//! installs them); without either a test fails and says what is missing.

mod bench;
mod cache;
mod clients;
mod listed;
mod mirrors;
mod publish;
mod scenarios;

use crate::support::sandbox::Outcome;
use crate::support::*;

/// Fails `test` unless `tool` is installed.
pub(crate) fn have(tool: &str, test: &str) {
    assert!(
        on_path(tool).is_some(),
        "{test}: {}",
        crate::support::missing(tool)
    );
}

/// The exceptions that let the registries' hosts in (on the lab's
/// loopback address), inspected so each request is its own decision.
pub(crate) fn registry_exceptions() -> String {
    let mut y = String::from("exceptions:\n");
    for (id, hosts) in [
        ("pypi", "[pypi.org, files.pythonhosted.org]"),
        ("npm", "[registry.npmjs.org]"),
        ("crates", "[index.crates.io, static.crates.io, crates.io]"),
        ("go", "[proxy.golang.org, sum.golang.org]"),
    ] {
        y.push_str(&format!(
            "  - id: {id}\n    owner: platform\n    reason: the {id} registry\n    \
             hosts: {hosts}\n    cidrs: [127.0.0.0/8]\n    ports: [443]\n    paths: [\"/**\"]\n"
        ));
    }
    y
}

/// The registry exceptions with the gate on for every ecosystem
/// (`min_age: 3d`), and the `packages:` sets in `sets` (YAML list items).
pub(crate) fn gated(sets: &str) -> String {
    format!(
        "settings:\n  contact: \"#pkg-help\"\n  packages: {{ enforce: [pypi, npm, cargo, go], min_age: 3d }}\n\
         {}packages:\n{sets}",
        registry_exceptions()
    )
}

/// One `packages:` set: `allow` items as YAML flow items.
pub(crate) fn set(id: &str, eco: &str, allow: &[&str]) -> String {
    let items: Vec<String> = allow.iter().map(|a| format!("      - {a}\n")).collect();
    format!(
        "  - id: {id}\n    owner: platform\n    reason: the lab's approved {eco} packages\n    \
         ecosystem: {eco}\n    allow:\n{}",
        items.concat()
    )
}

/// An outcome's output and its decision log, for a failure message.
pub(crate) fn ctx(r: &Outcome) -> String {
    let lines: Vec<String> = r.log_lines().iter().map(|l| l.to_string()).collect();
    format!("{}\n--- decisions\n{}", r.context(), lines.join("\n"))
}
