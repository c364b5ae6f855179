//! The lab itself, before any package rule: each real client installs
//! through an intercepting egressd with plain exceptions for the registry
//! hosts, and every request it made is one allowed, inspected decision.
//! If these fail, the scenario tests prove nothing.

use super::*;

/// Shell for a fresh venv whose packages `python3 -m pip` installs (the
/// system pip, pointed at the venv: no network needed to make it).
pub(crate) fn pip_install(args: &str) -> String {
    format!(
        "set -e\n/usr/bin/python3 -m venv --without-pip /tmp/v\n\
         /usr/bin/python3 -m pip --python /tmp/v/bin/python install --no-cache-dir \
         --disable-pip-version-check --no-input {args}\n"
    )
}

/// Shell for a fresh venv whose packages `uv pip` installs (uv trusts
/// egressd's CA through `SSL_CERT_FILE`, which `egressd run` sets).
pub(crate) fn uv_install(args: &str) -> String {
    format!(
        "set -e\n/usr/bin/python3 -m venv --without-pip /tmp/v\n\
         uv pip install --no-cache --python /tmp/v/bin/python {args}\n"
    )
}

/// Shell for a fresh npm project in /tmp/app.
pub(crate) fn npm_project() -> &'static str {
    "set -e\nmkdir -p /tmp/app && cd /tmp/app\n\
     echo '{\"name\":\"app\",\"version\":\"1.0.0\",\"private\":true}' > package.json\n"
}

/// Shell for a fresh cargo project in /tmp/app depending on `deps`
/// (Cargo.toml lines), with a CARGO_HOME of its own (crates.io's default
/// sparse index).
pub(crate) fn cargo_project(deps: &str) -> String {
    format!(
        "set -e\nexport CARGO_HOME=/tmp/cargo-home\nmkdir -p /tmp/app/src && cd /tmp/app\n\
         printf '[package]\\nname = \"app\"\\nversion = \"0.1.0\"\\nedition = \"2021\"\\n\\n[dependencies]\\n{deps}\\n' > Cargo.toml\n\
         touch src/lib.rs\n"
    )
}

/// Shell for a fresh Go module in /tmp/app.
pub(crate) fn go_project() -> &'static str {
    "set -e\nmkdir -p /tmp/app && cd /tmp/app\ngo mod init lab.test/app >/dev/null 2>&1\n"
}

/// Every line `r` logged for the registry hosts was an inspected allow.
fn all_allowed_inspected(r: &Outcome, host: &str) -> usize {
    let lines: Vec<_> = r
        .log_lines()
        .into_iter()
        .filter(|l| l["host"] == host)
        .collect();
    for l in &lines {
        assert_eq!(l["decision"], "allow", "{l}\n{}", ctx(r));
    }
    assert!(
        lines.iter().any(|l| l["proto"] == "tls"),
        "no inspected request to {host}: {lines:#?}"
    );
    lines.len()
}

#[test]
fn pip_installs_through_egressd_intercepting() {
    let test = "packages::clients::pip";
    let l = run_lab(test);
    l.reg()
        .publish(Eco::Pypi, "lab-beta", "2.0.0", 30 * DAY, &[]);
    l.reg().publish(
        Eco::Pypi,
        "Lab_Alpha",
        "1.0.0",
        30 * DAY,
        &[("lab-beta", ">=2")],
    );
    l.reg().publish(
        Eco::Pypi,
        "Lab_Alpha",
        "1.1.0",
        20 * DAY,
        &[("lab-beta", ">=2")],
    );
    let r = l.run(
        &registry_exceptions(),
        &format!(
            "{}/tmp/v/bin/python -c 'import lab_alpha, lab_beta; print(\"installed\", lab_alpha.__version__, lab_beta.__version__)'",
            pip_install("'lab-alpha>=1,<2'")
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(r.stdout.contains("installed 1.1.0 2.0.0"), "{}", ctx(&r));
    all_allowed_inspected(&r, "pypi.org");
    all_allowed_inspected(&r, "files.pythonhosted.org");
    // pip read the JSON form and the wheel's .metadata (PEP 658), then the wheel.
    let hits = l.reg().hits_for("lab-alpha");
    assert!(
        hits.iter().any(|h| h
            .accept
            .as_deref()
            .is_some_and(|a| a.contains("vnd.pypi.simple.v1+json"))),
        "{hits:#?}"
    );
}

#[test]
fn npm_installs_through_egressd_intercepting() {
    let test = "packages::clients::npm";
    have("npm", test);
    let l = run_lab(test);
    l.reg()
        .publish(Eco::Npm, "lab-right", "3.1.0", 30 * DAY, &[]);
    l.reg().publish(
        Eco::Npm,
        "lab-left",
        "1.0.0",
        30 * DAY,
        &[("lab-right", "^3.0.0")],
    );
    // npm asks for `/@lab%2fscoped`: the scope separator, not an encoded `/`.
    l.reg()
        .publish(Eco::Npm, "@lab/scoped", "1.2.0", 30 * DAY, &[]);
    let r = l.run(
        &registry_exceptions(),
        &format!(
            "{}npm install --no-audit --no-fund --no-update-notifier lab-left@^1 @lab/scoped@^1\n\
             node -e 'console.log(\"installed\", require(\"lab-left\"), require(\"lab-right\"), require(\"@lab/scoped\"))'",
            npm_project()
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout.contains("installed 1.0.0 3.1.0 1.2.0"),
        "{}",
        ctx(&r)
    );
    all_allowed_inspected(&r, "registry.npmjs.org");
}

#[test]
fn cargo_locks_and_fetches_through_egressd_intercepting() {
    let test = "packages::clients::cargo";
    let l = run_lab(test);
    l.reg()
        .publish(Eco::Cargo, "lab-leaf", "0.3.1", 30 * DAY, &[]);
    l.reg().publish(
        Eco::Cargo,
        "lab-crate",
        "1.0.0",
        30 * DAY,
        &[("lab-leaf", "^0.3")],
    );
    l.reg().publish(
        Eco::Cargo,
        "lab-crate",
        "1.4.0",
        20 * DAY,
        &[("lab-leaf", "^0.3")],
    );
    let r = l.run(
        &registry_exceptions(),
        &format!(
            "{}cargo generate-lockfile\ncargo fetch\n\
             grep -A1 '^name = \"lab-' Cargo.lock\nls $CARGO_HOME/registry/cache/*/",
            cargo_project("lab-crate = \"1\"")
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout
            .contains("name = \"lab-crate\"\nversion = \"1.4.0\""),
        "{}",
        r.context()
    );
    assert!(r.stdout.contains("lab-leaf-0.3.1.crate"), "{}", ctx(&r));
    all_allowed_inspected(&r, "index.crates.io");
    all_allowed_inspected(&r, "static.crates.io");
}

#[test]
fn go_gets_through_egressd_intercepting() {
    let test = "packages::clients::go";
    have("go", test);
    let l = run_lab(test);
    let left = format!("{GO_PREFIX}/acme/Left");
    l.reg().publish(Eco::Go, &left, "v1.0.0", 30 * DAY, &[]);
    l.reg().publish(Eco::Go, &left, "v1.2.0", 20 * DAY, &[]);
    let r = l.run(
        &registry_exceptions(),
        &format!(
            "{}go get {left}@latest\ncat go.mod\ngrep -c {left} go.sum",
            go_project()
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout.contains(&format!("require {left} v1.2.0")),
        "{}",
        r.context()
    );
    all_allowed_inspected(&r, "proxy.golang.org");
    // The `!` case encoding reached the proxy.
    assert!(!l.reg().hits_for("/acme/%21left/@v/").is_empty());
}

#[test]
fn uv_installs_through_egressd_intercepting() {
    let test = "packages::clients::uv";
    have("uv", test);
    let l = run_lab(test);
    l.reg().publish(Eco::Pypi, "uv-dep", "0.9.0", 30 * DAY, &[]);
    l.reg()
        .publish(Eco::Pypi, "uv-top", "1.0.0", 30 * DAY, &[("uv-dep", "<1")]);
    let r = l.run(
        &registry_exceptions(),
        &format!(
            "{}/tmp/v/bin/python -c 'import uv_top, uv_dep; print(\"installed\", uv_top.__version__, uv_dep.__version__)'",
            uv_install("uv-top")
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(r.stdout.contains("installed 1.0.0 0.9.0"), "{}", ctx(&r));
    all_allowed_inspected(&r, "pypi.org");
    all_allowed_inspected(&r, "files.pythonhosted.org");
}

#[test]
fn pnpm_installs_through_egressd_intercepting() {
    let test = "packages::clients::pnpm";
    have("pnpm", test);
    let l = run_lab(test);
    l.reg()
        .publish(Eco::Npm, "pn-right", "2.0.1", 30 * DAY, &[]);
    l.reg().publish(
        Eco::Npm,
        "pn-left",
        "1.3.0",
        30 * DAY,
        &[("pn-right", "^2")],
    );
    let r = l.run(
        &registry_exceptions(),
        &format!(
            "{}pnpm add pn-left@^1\n\
             node -e 'console.log(\"installed\", require(\"pn-left\"))'",
            npm_project()
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(r.stdout.contains("installed 1.3.0"), "{}", ctx(&r));
    all_allowed_inspected(&r, "registry.npmjs.org");
}
