//! The package part of a policy as `egressd serve` loads it: an enforced
//! ecosystem's registry hosts need interception, as `paths:` do.

use crate::support::*;

/// pypi.org and registry.npmjs.org allowed on 443 and the echo port, pypi
/// enforced by the package gate, one approved set.
fn gated_policy(echo: u16) -> String {
    let base = policy()
        .setting("packages", "{ enforce: [pypi], min_age: 3d }")
        .exception("registries")
        .reason("package registries")
        .hosts(&["pypi.org", "registry.npmjs.org"])
        .cidr(LOOPBACK)
        .ports(&[443, echo]);
    format!(
        "{base}packages:\n  - id: py-runtime\n    owner: python-platform\n    reason: vetted\n    ecosystem: pypi\n    allow: [\"requests >=2.31,<3\"]\n"
    )
}

#[test]
fn without_a_ca_a_connect_to_an_enforced_registry_is_inspection_required() {
    let l = lab()
        .names(&["pypi.org", "registry.npmjs.org"])
        .start(|ports| gated_policy(ports.echo));
    let e = &l.e;
    let r = e.request("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n");
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.reason(), Some("inspection_required"));
    let line = e.wait_line("the pypi CONNECT", |l| {
        l["proto"] == "connect" && l["host"] == "pypi.org"
    });
    assert_eq!(line["decision"], "deny");
    assert_eq!(line["reason"], "inspection_required");
    assert_eq!(line["exception"], "registries");
    // The same exception for a registry whose ecosystem is not enforced
    // still opens an opaque tunnel.
    let p = l.echo_port();
    let r = e.request(&format!(
        "CONNECT registry.npmjs.org:{p} HTTP/1.1\r\nHost: registry.npmjs.org:{p}\r\n\r\n"
    ));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(l.canary.hits(), 0);
}
