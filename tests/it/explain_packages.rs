//! `egressd explain pkg:…` through the real binary: the package gate's
//! decision for a name (its index) or a version, the set, the reason, "did
//! you mean", and the exit status (0 allowed, 1 denied, 2 bad target).

use std::path::Path;
use std::process::Command;

use crate::support::scratch;

const POLICY: &str = r##"settings:
  contact: "#security"
  packages: { enforce: [pypi, npm, cargo, go], min_age: 3d }
exceptions:
  - id: registries
    owner: platform
    reason: package registries
    hosts: [pypi.org, registry.npmjs.org, index.crates.io, proxy.golang.org]
packages:
  - id: py-runtime
    owner: python-platform
    reason: vetted runtime deps
    ecosystem: pypi
    min_age: 7d
    allow:
      - requests >=2.31,<3
      - { name: certifi, versions: "==2024.8.30", sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" }
    deny:
      - { name: requests, versions: "==2.32.0", reason: broken release }
      - ultralytics
  - id: js
    owner: web
    reason: front-end
    ecosystem: npm
    allow: ["@types/node ^20.0.0", left-pad]
  - id: rs
    owner: rust
    reason: tools
    ecosystem: cargo
    allow: ["serde_json ^1.0"]
  - id: goset
    owner: go
    reason: tools
    ecosystem: go
    allow: ["golang.org/x/text >=v0.14.0"]
"##;

fn explain(policy: &Path, target: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["explain", "--policy"])
        .arg(policy)
        .arg(target)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap();
    (out.status.code().unwrap(), text)
}

#[test]
fn explain_pkg_names_the_set_or_the_reason_and_exits_like_request_explain() {
    let dir = scratch();
    dir.file("p.yaml", POLICY);
    let p = dir.dir();

    let (code, out) = explain(p, "pkg:pypi/requests@2.32.3");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("(1 exception, 4 package sets in 1 file, mode enforce)"),
        "{out}"
    );
    assert!(out.contains("package: pypi requests@2.32.3"), "{out}");
    assert!(out.contains("ALLOW  by package set py-runtime ("), "{out}");
    assert!(out.contains("entry    requests >=2.31,<3"), "{out}");
    assert!(
        out.contains("min_age  7d: checked at request time against the registry's publish time"),
        "{out}"
    );
    assert!(
        out.contains("registry: https://pypi.org/simple/requests/"),
        "{out}"
    );
    assert!(out.contains("ALLOW  by exception registries"), "{out}");
    assert!(out.contains("result:  allowed"), "{out}");

    // PEP 503 normalisation: the same package.
    let (code, out) = explain(p, "pkg:pypi/Requests@2.32.3");
    assert_eq!(code, 0, "{out}");

    let (code, out) = explain(p, "pkg:pypi/requests@1.0");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DENY   package_version_not_approved"), "{out}");
    assert!(out.contains("approved >=2.31,<3"), "{out}");
    assert!(out.contains("result:  denied"), "{out}");
    assert!(out.contains("#security"), "{out}");

    let (code, out) = explain(p, "pkg:pypi/requests@2.32.0");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DENY   package_denied"), "{out}");
    assert!(out.contains("because  broken release"), "{out}");

    let (code, out) = explain(p, "pkg:pypi/reqeusts@2.32.3");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DENY   package_not_approved"), "{out}");
    assert!(out.contains("did you mean requests?"), "{out}");

    let (code, out) = explain(p, "pkg:pypi/ultralytics");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("package_denied"), "{out}");

    // Without a version: the index, and what it is filtered to.
    let (code, out) = explain(p, "pkg:pypi/requests");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("package: pypi requests (its index)"), "{out}");
    assert!(out.contains("ALLOW  the index, filtered"), "{out}");
    assert!(out.contains("requests >=2.31,<3 — set py-runtime"), "{out}");
    assert!(out.contains("minus deny requests ==2.32.0"), "{out}");

    let (code, out) = explain(p, "pkg:pypi/certifi@2024.8.30");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("only files with one of 1 pinned digest download"),
        "{out}"
    );

    // npm scopes, cargo's -/_ and Go module paths.
    let (code, out) = explain(p, "pkg:npm/@types/node@20.11.0");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ALLOW  by package set js"), "{out}");
    assert!(
        out.contains("registry: https://registry.npmjs.org/@types%2fnode"),
        "{out}"
    );
    let (code, out) = explain(p, "pkg:npm/@types/node@18.0.0");
    assert_eq!(code, 1, "{out}");
    let (code, out) = explain(p, "pkg:cargo/serde-json@1.0.100");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ALLOW  by package set rs"), "{out}");
    let (code, out) = explain(p, "pkg:go/golang.org/x/text@v0.14.0");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("registry: https://proxy.golang.org/golang.org/x/text/@v/list"),
        "{out}"
    );
    let (code, out) = explain(p, "pkg:go/golang.org/x/text@v0.13.0");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("package_version_not_approved"), "{out}");

    // Bad targets: usage (2) with the forms.
    for bad in [
        "pkg:maven/junit",
        "pkg:pypi",
        "pkg:pypi/requests@",
        "pkg:pypi/requests@not a version",
    ] {
        let (code, out) = explain(p, bad);
        assert_eq!(code, 2, "{bad}: {out}");
        assert!(out.contains("pkg:ECOSYSTEM/NAME[@VERSION]"), "{bad}: {out}");
    }
}

#[test]
fn explain_pkg_says_when_the_registry_host_is_not_allowed_or_not_gated() {
    let dir = scratch();
    // No exception for the registries, and npm not enforced.
    dir.file(
        "p.yaml",
        &POLICY.replace("[pypi, npm, cargo, go]", "[pypi]").replace(
            "hosts: [pypi.org, registry.npmjs.org, index.crates.io, proxy.golang.org]",
            "hosts: [registry.npmjs.org]",
        ),
    );
    let p = dir.dir();
    let (code, out) = explain(p, "pkg:pypi/requests@2.32.3");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("ALLOW  by package set py-runtime"), "{out}");
    assert!(out.contains("DENY   no_exception"), "{out}");
    assert!(out.contains("one for pypi.org is needed too"), "{out}");
    // npm is not gated: the sets do not decide, the exceptions do.
    let (code, out) = explain(p, "pkg:npm/lodash@4.17.21");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("npm is not in settings.packages.enforce"),
        "{out}"
    );
    assert!(out.contains("package_not_approved"), "{out}");
}
