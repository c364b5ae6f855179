//! The package part of a policy as `egressd serve` loads it: an enforced
//! ecosystem's registry hosts need interception, as `paths:` do.

use crate::support::*;

/// pypi.org and registry.npmjs.org allowed on 443 and the echo port, pypi
/// enforced by the package gate, one approved set.
fn gated_policy(echo: u16) -> PolicyYaml {
    policy()
        .setting("packages", "{ enforce: [pypi], min_age: 3d }")
        .exception("registries")
        .reason("package registries")
        .hosts(&["pypi.org", "registry.npmjs.org"])
        .cidr(LOOPBACK)
        .ports(&[443, echo])
        .package_set("py-runtime", "pypi")
        .owner("python-platform")
        .reason("vetted")
        .allow("requests >=2.31,<3")
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

/// `support::policy()` writes package sets that the parser reads as the
/// operator's YAML would be: the set allows what its `allow:` names, its
/// `deny:` holds, and an entry of a later list keeps its own section.
#[test]
fn package_sets_written_by_the_policy_builder_decide_as_written() {
    let p = policy()
        .setting("packages", "{ enforce: [pypi] }")
        .exception("registries")
        .host("pypi.org")
        .package_set("py-runtime", "pypi")
        .owner("python-platform")
        .allow("requests >=2.31,<3")
        .deny("ultralytics")
        .min_age("3d")
        .exception("npm")
        .host("registry.npmjs.org");
    let yaml = p.to_string();
    assert!(
        yaml.find("\nexceptions:\n").unwrap() < yaml.find("\npackages:\n").unwrap()
            && yaml.matches("  - id: ").count() == 3,
        "{yaml}"
    );
    let dir = scratch();
    dir.file("p.yaml", &yaml);
    let explain = |target: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_egressd"))
            .args(["explain", "--policy"])
            .arg(dir.dir())
            .arg(target)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        (o.status.code(), out)
    };
    let (code, out) = explain("pkg:pypi/requests@2.32.3");
    assert_eq!(code, Some(0), "{out}\n{yaml}");
    assert!(out.contains("ALLOW  by package set py-runtime ("), "{out}");
    assert!(
        out.contains("(2 exceptions, 1 package set in 1 file"),
        "{out}"
    );
    let (code, out) = explain("pkg:pypi/ultralytics@1.0");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("DENY   package_denied"), "{out}");
}
