//! No publishing through the package gate (issue #38 item 4, DESIGN
//! "Writes on allowed hosts"): with the ecosystem enforced, real
//! `npm publish` and `cargo publish`, and a PyPI-upload-shaped multipart
//! `POST` by curl (twine is not installed), are refused `package_publish`
//! in each client's own channel, and nothing reaches the registry; an
//! exception that names the method and the registry path lets a publish
//! through.
//!
//! Without the publish rule these requests are refused as
//! `package_unparseable` (npm, cargo) or not gated at all
//! (`upload.pypi.org`): each test fails on the old main.

use super::clients::cargo_project;
use super::*;

/// The gated policy with `first` (YAML list items) before the registry
/// exceptions: the first exception that allows a request decides it.
fn gated_with_first(first: &str, sets: &str) -> String {
    gated(sets).replacen("exceptions:\n", &format!("exceptions:\n{first}"), 1)
}

/// The writes the registry received (anything but GET and HEAD).
fn writes(l: &Lab, part: &str) -> Vec<Hit> {
    l.reg()
        .hits_for(part)
        .into_iter()
        .filter(|h| h.method != "GET" && h.method != "HEAD")
        .collect()
}

fn publish_lines(r: &Outcome) -> Vec<serde_json::Value> {
    r.log_lines()
        .into_iter()
        .filter(|l| l["reason"] == "package_publish")
        .collect()
}

#[test]
fn npm_publish_is_refused_package_publish_in_npm_s_channel() {
    let test = "packages::publish::npm";
    have("npm", test);
    let l = run_lab(test);
    let r = l.run(
        &gated(&set("npm-any", "npm", &["lab-pub-npm"])),
        "set -e\nmkdir -p /tmp/p && cd /tmp/p\n\
         echo '{\"name\":\"lab-pub-npm\",\"version\":\"1.0.0\"}' > package.json\n\
         echo '//registry.npmjs.org/:_authToken=not-a-real-token' > .npmrc\n\
         npm publish --no-update-notifier --registry https://registry.npmjs.org/\n",
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    // npm prints the registry's JSON `error`: egressd's reason and rule.
    assert!(r.stderr.contains("E403"), "{}", ctx(&r));
    assert!(r.stderr.contains("package_publish"), "{}", ctx(&r));
    assert!(
        writes(l, "lab-pub-npm").is_empty(),
        "the registry got a write"
    );
    let lines = publish_lines(&r);
    assert_eq!(lines.len(), 1, "{}", ctx(&r));
    assert_eq!(lines[0]["method"], "PUT");
    assert_eq!(lines[0]["status"], 403);
    assert_eq!(lines[0]["package"]["ecosystem"], "npm");
}

#[test]
fn cargo_publish_is_refused_package_publish_in_cargo_s_channel() {
    let test = "packages::publish::cargo";
    let l = run_lab(test);
    // The registry serves its config.json once it holds a crate.
    l.reg()
        .publish(Eco::Cargo, "lab-pub-seed", "1.0.0", 30 * DAY, &[]);
    let r = l.run(
        &gated(&set("cargo-any", "cargo", &["lab-pub-crate"])),
        &format!(
            "{}sed -i 's/^name = \"app\"/name = \"lab-pub-crate\"\\ndescription = \"d\"\\nlicense = \"MIT\"/' Cargo.toml\n\
             CARGO_REGISTRY_TOKEN=not-a-real-token cargo publish --no-verify --allow-dirty\n",
            cargo_project("")
        ),
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    // cargo prints each `errors[].detail` of the API's answer.
    assert!(r.stderr.contains("package_publish"), "{}", ctx(&r));
    assert!(
        writes(l, "/api/v1/crates").is_empty(),
        "the registry got a write"
    );
    let lines = publish_lines(&r);
    assert_eq!(lines.len(), 1, "{}", ctx(&r));
    assert_eq!(lines[0]["method"], "PUT");
    assert_eq!(lines[0]["path"], "/api/v1/crates/new");
}

#[test]
fn a_pypi_upload_is_refused_package_publish_in_the_reason_phrase() {
    let test = "packages::publish::pypi";
    let l = run_lab(test);
    l.dns.set("upload.pypi.org", &[&l.reg().ip()]);
    let upload_host =
        "  - id: pypi-upload\n    owner: platform\n    reason: the upload host, for the test\n    \
                       hosts: [upload.pypi.org]\n    cidrs: [127.0.0.0/8]\n    ports: [443]\n";
    // A PyPI-upload-shaped multipart POST (what twine sends).
    let r = l.run(
        &gated_with_first(upload_host, &set("py-any", "pypi", &["lab-pub-py"])),
        "set -e\nprintf 'not really a wheel' > /tmp/lab_pub_py-1.0.0-py3-none-any.whl\n\
         curl -sS --http1.1 -o /dev/null -w '%{http_code}\\n' -D /tmp/h \
         -F ':action=file_upload' -F 'protocol_version=1' -F 'name=lab-pub-py' -F 'version=1.0.0' \
         -F 'filetype=bdist_wheel' -F 'content=@/tmp/lab_pub_py-1.0.0-py3-none-any.whl' \
         https://upload.pypi.org/legacy/\ngrep '^HTTP/' /tmp/h | tail -1\n",
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(r.stdout.starts_with("403\n"), "{}", ctx(&r));
    // twine shows the status line's reason phrase.
    assert!(
        r.stdout
            .contains("Forbidden (egressd: package_publish /legacy/)"),
        "{}",
        ctx(&r)
    );
    assert!(writes(l, "/legacy").is_empty(), "the registry got a write");
    assert_eq!(publish_lines(&r).len(), 1, "{}", ctx(&r));
}

/// An exception that names the method and the path, listed first, lets
/// `npm publish` of that one package reach the registry; another package
/// is still refused.
#[test]
fn an_exception_naming_the_method_and_path_allows_that_publish() {
    let test = "packages::publish::allowed";
    have("npm", test);
    let l = run_lab(test);
    let publish =
        "  - id: npm-publish-ok\n    owner: platform\n    reason: publishing lab-pub-ok\n    \
                   hosts: [registry.npmjs.org]\n    cidrs: [127.0.0.0/8]\n    ports: [443]\n    \
                   methods: [PUT]\n    paths: [\"/lab-pub-ok\"]\n";
    let policy = gated_with_first(
        publish,
        &set("npm-any", "npm", &["lab-pub-ok", "lab-pub-no"]),
    );
    let script = |name: &str| {
        format!(
            "mkdir -p /tmp/{name} && cd /tmp/{name}\n\
             echo '{{\"name\":\"{name}\",\"version\":\"1.0.0\"}}' > package.json\n\
             echo '//registry.npmjs.org/:_authToken=not-a-real-token' > .npmrc\n\
             npm publish --no-update-notifier --registry https://registry.npmjs.org/ || true\n"
        )
    };
    let r = l.run(&policy, &script("lab-pub-ok"));
    let sent = writes(l, "lab-pub-ok");
    assert_eq!(sent.len(), 1, "{}", ctx(&r));
    assert_eq!(sent[0].method, "PUT");
    assert!(publish_lines(&r).is_empty(), "{}", ctx(&r));
    let r = l.run(&policy, &script("lab-pub-no"));
    assert!(writes(l, "lab-pub-no").is_empty(), "{}", ctx(&r));
    assert_eq!(publish_lines(&r).len(), 1, "{}", ctx(&r));
}
