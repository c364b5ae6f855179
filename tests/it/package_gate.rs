//! The package gate on the wire, driven by curl through an intercepting
//! egressd to the fake registries of `support/registry.rs` (HTTPS on
//! 127.77.0.x:443, their own CA given with `--upstream-ca`; the public
//! names answered by the fake DNS). Each test makes its own registry and
//! egressd, and shows what the gate changes: without it every filtered
//! document would carry the held versions, every denied file would come
//! from the registry, and no line would name a package.
//!
//! Needs root (the registries' port 443); without it a test fails and
//! says so.

use crate::support::*;

const JSON: &str = "application/vnd.pypi.simple.v1+json";
const CONTACT: &str = "#security";

/// The exceptions that let the registries' hosts in. No `paths:`: an
/// enforced ecosystem is intercepted because it is enforced.
fn exceptions() -> String {
    let mut y = String::from("exceptions:\n");
    for (id, hosts) in [
        ("pypi", "[pypi.org, files.pythonhosted.org]"),
        ("npm", "[registry.npmjs.org]"),
        ("go", "[proxy.golang.org]"),
    ] {
        y.push_str(&format!(
            "  - id: {id}\n    owner: platform\n    reason: the {id} registry\n    \
             hosts: {hosts}\n    cidrs: [127.0.0.0/8]\n    ports: [443]\n"
        ));
    }
    y
}

/// The sets most tests use: `requests` (3 days old at least), `left-pad`,
/// one Go module, plus whatever `extra` lists under `packages:`.
fn sets(extra: &str) -> String {
    format!(
        r#"packages:
  - id: py
    owner: python-platform
    reason: vetted runtime deps
    ecosystem: pypi
    min_age: 3d
    allow:
      - requests
{extra}  - id: js
    owner: web-platform
    reason: vetted
    ecosystem: npm
    min_age: 3d
    allow: [left-pad]
  - id: gomods
    owner: go-team
    reason: vetted
    ecosystem: go
    min_age: 0d
    allow: ["git.lab.example/ok >=v2.0.0"]
"#
    )
}

fn policy_yaml(extra_sets: &str, extra_settings: &str) -> String {
    format!(
        "{}settings:\n  contact: \"{CONTACT}\"\n  packages:\n    enforce: [pypi, npm, go]\n{extra_settings}{}",
        exceptions(),
        sets(extra_sets)
    )
}

/// A fresh registry with `publish` done, then egressd with `policy(reg)`;
/// Needs root (the registry listens on port 443).
fn start(
    test: &str,
    publish: impl FnOnce(&Registry),
    policy: impl FnOnce(&Registry) -> String,
) -> Lab {
    start_with(test, publish, policy, "", |b| b)
}

/// [`start`], egressd also trusting `extra_ca` and started as `more` says.
fn start_with(
    test: &str,
    publish: impl FnOnce(&Registry),
    policy: impl FnOnce(&Registry) -> String,
    extra_ca: &str,
    more: impl FnOnce(Builder) -> Builder,
) -> Lab {
    need_root(test, "the fake registry listens on port 443");
    let l = lab().registry(extra_ca).egressd(more);
    publish(l.reg());
    let yaml = policy(l.reg());
    l.start(|_| yaml)
}

fn url(host: &str, path: &str) -> String {
    format!("https://{host}{path}")
}

/// A PyPI file URL (hash layout) for a file the registry does not have.
fn made_up_file(file: &str) -> String {
    format!("/packages/aa/bb/{}/{file}", "c".repeat(60))
}

fn path_of(u: &str) -> String {
    let rest = u.split_once("://").unwrap().1;
    rest[rest.find('/').unwrap()..].to_string()
}

// ---------------------------------------------------------------- index documents

#[test]
fn pypi_indexes_are_filtered_and_kept_entries_are_byte_identical() {
    let g = start(
        "pypi_indexes_are_filtered_and_kept_entries_are_byte_identical",
        |r| {
            r.publish_all(
                Eco::Pypi,
                &[
                    ("requests", "2.31.0", 10 * DAY),
                    ("requests", "2.32.0", DAY),
                ],
            )
        },
        |_| policy_yaml("", ""),
    );
    let upstream = g
        .reg()
        .doc_body("pypi.org", "/simple/requests/", Some(JSON))
        .unwrap();
    let up: serde_json::Value = serde_json::from_slice(&upstream).unwrap();

    let r = g.curl(
        &["-H", &format!("Accept: {JSON}")],
        &url("pypi.org", "/simple/requests/"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let doc = r.json();
    let names: Vec<&str> = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["filename"].as_str().unwrap())
        .collect();
    assert!(names.iter().all(|n| n.contains("2.31.0")), "{names:?}");
    assert_eq!(
        names.len(),
        2,
        "the wheel and the sdist of 2.31.0: {names:?}"
    );
    assert_eq!(doc["versions"], serde_json::json!(["2.31.0"]));
    // Kept entries are the registry's bytes (hashes, times untouched).
    for f in up["files"].as_array().unwrap() {
        let raw = serde_json::to_string(f).unwrap();
        let kept = f["filename"].as_str().unwrap().contains("2.31.0");
        assert_eq!(r.text().contains(&raw), kept, "{raw}");
    }
    let etag = r.header("etag").expect("an ETag of its own");
    assert!(etag.starts_with("\"eg-"), "{etag}");
    assert!(r.header("last-modified").is_none());
    assert_ne!(
        r.body, upstream,
        "the client never sees the unfiltered document"
    );

    // The same project as PEP 503 HTML: the anchors of 2.31.0, as served.
    let upstream_html = String::from_utf8(
        g.reg()
            .doc_body("pypi.org", "/simple/requests/", Some("text/html"))
            .unwrap(),
    )
    .unwrap();
    let h = g.curl(
        &["-H", "Accept: text/html"],
        &url("pypi.org", "/simple/requests/"),
    );
    assert_eq!(h.status, 200, "{h:?}");
    for line in upstream_html.lines().filter(|l| l.contains("<a ")) {
        assert_eq!(h.text().contains(line), line.contains("2.31.0"), "{line}");
    }

    let lines = g.lines_for("/simple/requests/", 2);
    let own: Vec<_> = lines.iter().filter(|l| l["origin"] == "egressd").collect();
    assert!(
        own.is_empty(),
        "the JSON the client read timed the HTML: {own:?}"
    );
    for l in &lines {
        assert_eq!(l["decision"], "allow", "{l}");
        assert_eq!(l["exception"], "pypi");
        assert_eq!(
            l["package"],
            serde_json::json!({"ecosystem": "pypi", "name": "requests", "version": null,
                               "set": "py", "versions_hidden": 1})
        );
    }
    assert_eq!(lines.len(), 2, "one line per request");
    let hidden = [
        ("ecosystem", "pypi"),
        ("set", "py"),
        ("reason", "package_too_new"),
    ];
    assert_eq!(
        g.metric("egressd_package_versions_hidden_total", &hidden),
        2.0
    );
    let allowed = [
        ("ecosystem", "pypi"),
        ("set", "py"),
        ("decision", "allow"),
        ("reason", "exception"),
    ];
    assert_eq!(g.metric("egressd_package_decisions_total", &allowed), 2.0);
}

#[test]
fn npm_packuments_hold_new_versions_back_and_keep_the_rest_byte_identical() {
    let g = start(
        "npm_packuments_hold_new_versions_back_and_keep_the_rest_byte_identical",
        |r| {
            r.publish_all(
                Eco::Npm,
                &[("left-pad", "1.0.0", 10 * DAY), ("left-pad", "1.1.0", DAY)],
            )
        },
        |_| policy_yaml("", ""),
    );
    let upstream: serde_json::Value = serde_json::from_slice(
        &g.reg()
            .doc_body("registry.npmjs.org", "/left-pad", Some("application/json"))
            .unwrap(),
    )
    .unwrap();
    let r = g.curl(
        &["-H", "Accept: application/json"],
        &url("registry.npmjs.org", "/left-pad"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let doc = r.json();
    let versions: Vec<&String> = doc["versions"].as_object().unwrap().keys().collect();
    assert_eq!(versions, ["1.0.0"]);
    assert_eq!(doc["dist-tags"]["latest"], "1.0.0");
    assert!(
        doc["policyRestrictions"].to_string().contains("1.1.0"),
        "held back with a message: {doc}"
    );
    let kept = serde_json::to_string(&upstream["versions"]["1.0.0"]).unwrap();
    assert!(r.text().contains(&kept), "1.0.0 as the registry wrote it");
    // Over HTTP/2 too, byte for byte the same document.
    let h2 = g.curl(
        &["--http2", "-H", "Accept: application/json"],
        &url("registry.npmjs.org", "/left-pad"),
    );
    assert_eq!(h2.status, 200, "{h2:?}");
    assert!(h2.status_line.starts_with("HTTP/2"), "{}", h2.status_line);
    assert_eq!(h2.body, r.body);
    let lines = g.lines_for("/left-pad", 2);
    assert_eq!(lines.len(), 2, "one line per request");
    for l in lines {
        assert_eq!(l["package"]["set"], "js");
        assert_eq!(l["package"]["versions_hidden"], 1);
    }
}

// ---------------------------------------------------------------- denials, per client

#[test]
fn an_unapproved_name_is_refused_in_the_reason_phrase_pip_shows() {
    let g = start(
        "an_unapproved_name_is_refused_in_the_reason_phrase_pip_shows",
        |r| r.publish_all(Eco::Pypi, &[("requests", "2.31.0", 10 * DAY)]),
        |_| policy_yaml("", ""),
    );
    let file = made_up_file("reqests-2.31.0-py3-none-any.whl");
    let r = g.get(&url("files.pythonhosted.org", &file));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.status_line.trim_end(),
        "HTTP/1.1 403 Forbidden (egressd: package_not_approved reqests@2.31.0; did you mean requests?)"
    );
    assert_eq!(
        r.header("x-egressd-reason").as_deref(),
        Some("package_not_approved")
    );
    assert!(r.text().contains("did you mean requests?"), "{}", r.text());
    assert!(r.text().contains(CONTACT), "{}", r.text());
    assert!(
        g.reg().hits_for("reqests").is_empty(),
        "never sent to the registry"
    );
    let l = g.line_for(&file);
    assert_eq!(l["decision"], "deny");
    assert_eq!(l["reason"], "package_not_approved");
    assert_eq!(l["status"], 403);
    assert_eq!(
        l["package"],
        serde_json::json!({"ecosystem": "pypi", "name": "reqests", "version": "2.31.0", "set": null})
    );
    let denied = [
        ("ecosystem", "pypi"),
        ("set", "-"),
        ("decision", "deny"),
        ("reason", "package_not_approved"),
    ];
    assert_eq!(g.metric("egressd_package_decisions_total", &denied), 1.0);
}

#[test]
fn npm_denials_are_json_errors_and_go_denials_are_403_text() {
    let g = start(
        "npm_denials_are_json_errors_and_go_denials_are_403_text",
        |r| {
            r.publish_all(Eco::Npm, &[("left-pad", "1.0.0", 10 * DAY)]);
            r.publish_all(Eco::Go, &[("git.lab.example/ok", "v1.0.0", 10 * DAY)]);
        },
        |_| policy_yaml("", ""),
    );
    let r = g.get(&url("registry.npmjs.org", "/lef-pad"));
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let err = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        err.contains("package_not_approved") && err.contains("did you mean left-pad?"),
        "{err}"
    );
    assert!(err.contains(CONTACT), "{err}");

    // go reads a 404/410 from a proxy as "go direct": a denial is 403.
    for (path, reason) in [
        ("/git.lab.example/evil/@v/list", "package_not_approved"),
        (
            "/git.lab.example/evil/@v/v1.0.0.zip",
            "package_not_approved",
        ),
        // Approved from v2 on; the registry has only v1: nothing to point at.
        (
            "/git.lab.example/ok/@latest",
            "package_version_not_approved",
        ),
    ] {
        let r = g.get(&url("proxy.golang.org", path));
        assert_eq!(r.status, 403, "{path}: {r:?}");
        assert_eq!(
            r.header("x-egressd-reason").as_deref(),
            Some(reason),
            "{path}"
        );
        assert!(r.header("content-type").unwrap().starts_with("text/plain"));
        assert!(
            r.text()
                .starts_with("egressd denied GET https://proxy.golang.org"),
            "{}",
            r.text()
        );
    }
    assert!(g.reg().hits_for("evil").is_empty());
    // The list of an approved module is served, filtered (v1 held).
    let r = g.get(&url("proxy.golang.org", "/git.lab.example/ok/@v/list"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.text().trim(), "");
    assert_eq!(
        g.line_for("/git.lab.example/ok/@v/list")["package"]["versions_hidden"],
        1
    );
}

// ---------------------------------------------------------------- downloads

#[test]
fn a_download_before_any_index_is_authorised_by_egressds_own_fetch() {
    let g = start(
        "a_download_before_any_index_is_authorised_by_egressds_own_fetch",
        |r| {
            r.publish_all(
                Eco::Pypi,
                &[
                    ("requests", "2.31.0", 10 * DAY),
                    ("requests", "2.32.0", DAY),
                ],
            )
        },
        |_| policy_yaml("", ""),
    );
    let ok = g
        .reg()
        .pypi_url("requests", &wheel_name("requests", "2.31.0"));
    let r = g.get(&ok);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with(b"PK"), "the wheel itself");
    let own = g.line_for("/simple/requests/");
    assert_eq!(own["origin"], "egressd");
    assert_eq!(own["decision"], "allow");
    assert_eq!(own["exception"], "pypi");
    assert_eq!(own["status"], 200);
    assert_eq!(own["package"]["name"], "requests");
    // The fetch serves the download's decision: the set that approved it.
    assert_eq!(own["package"]["set"], "py", "{own}");
    let dl = g.line_for(&path_of(&ok));
    assert!(dl.get("origin").is_none(), "{dl}");
    assert_eq!(
        dl["package"],
        serde_json::json!({"ecosystem": "pypi", "name": "requests", "version": "2.31.0", "set": "py"})
    );
    // The download arrived first and waited for egressd's fetch: that
    // line is written first.
    let order: Vec<_> =
        g.e.log_lines()
            .into_iter()
            .filter(|l| l["proto"] == "tls")
            .collect();
    assert_eq!(order[0]["origin"], "egressd", "{order:?}");
    assert_eq!(order[1]["path"], path_of(&ok).as_str());

    // Decided on the view egressd keeps: no second index fetch.
    let too_new = g
        .reg()
        .pypi_url("requests", &wheel_name("requests", "2.32.0"));
    let r = g.get(&too_new);
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.header("x-egressd-reason").as_deref(),
        Some("package_too_new")
    );
    let missing = made_up_file("requests-9.9-py3-none-any.whl");
    let r = g.get(&url("files.pythonhosted.org", &missing));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.header("x-egressd-reason").as_deref(),
        Some("package_not_listed")
    );
    assert!(
        r.status_line.contains("package_not_listed requests@9.9"),
        "{}",
        r.status_line
    );
    assert_eq!(g.reg().hits_for("/simple/requests/").len(), 1);
    assert_eq!(g.reg().hits_for("requests-2.32.0").len(), 0);
    assert_eq!(g.reg().hits_for("requests-9.9").len(), 0);
    assert_eq!(g.line_for(&missing)["reason"], "package_not_listed");
}

#[test]
fn report_mode_indexes_hide_what_a_deny_entry_holds_and_nothing_else() {
    let g = start(
        "report_mode_indexes_hide_what_a_deny_entry_holds_and_nothing_else",
        |r| {
            r.publish_all(
                Eco::Pypi,
                &[
                    ("requests", "2.30.0", 10 * DAY),
                    ("requests", "2.31.0", 10 * DAY),
                    ("requests", "2.32.0", DAY),
                ],
            )
        },
        |_| {
            policy_yaml(
                "    deny:\n      - { name: requests, versions: \"==2.31.0\", reason: compromised release }\n",
                "  mode: report\n",
            )
        },
    );
    let r = g.curl(
        &["-H", &format!("Accept: {JSON}")],
        &url("pypi.org", "/simple/requests/"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    // The too-new 2.32.0 is only reported; the denied 2.31.0 is hidden, as
    // its download would be refused.
    assert_eq!(
        r.json()["versions"],
        serde_json::json!(["2.30.0", "2.32.0"]),
        "{}",
        r.text()
    );
    let l = g.line_for("/simple/requests/");
    assert_eq!(l["package"]["versions_hidden"], 1, "{l}");
    let denied = g
        .reg()
        .pypi_url("requests", &wheel_name("requests", "2.31.0"));
    let r = g.get(&denied);
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.header("x-egressd-reason").as_deref(),
        Some("package_denied")
    );
    let too_new = g
        .reg()
        .pypi_url("requests", &wheel_name("requests", "2.32.0"));
    let r = g.get(&too_new);
    assert_eq!(r.status, 200, "report mode lets it through: {r:?}");
    assert_eq!(g.line_for(&path_of(&too_new))["reason"], "package_too_new");
}

#[test]
fn a_file_that_does_not_match_its_pin_is_cut_short() {
    let pins = std::cell::RefCell::new((String::new(), String::new()));
    let g = start(
        "a_file_that_does_not_match_its_pin_is_cut_short",
        |r| {
            r.publish_all(
                Eco::Pypi,
                &[("certifi", "1.0", 10 * DAY), ("idna", "1.0", 10 * DAY)],
            );
            *pins.borrow_mut() = (
                r.sha256_of(Eco::Pypi, "certifi", &wheel_name("certifi", "1.0")),
                r.sha256_of(Eco::Pypi, "idna", &wheel_name("idna", "1.0")),
            );
        },
        |_| {
            let (c, i) = pins.borrow().clone();
            policy_yaml(
                &format!(
                    "      - {{ name: certifi, versions: \"==1.0\", sha256: \"{c}\" }}\n      - {{ name: idna, versions: \"==1.0\", sha256: \"{i}\" }}\n"
                ),
                "",
            )
        },
    );
    // The pinned file, as the registry has it: allowed, whole.
    let idna = g.reg().pypi_url("idna", &wheel_name("idna", "1.0"));
    let r = g.get(&idna);
    assert_eq!((r.status, r.code), (200, 0), "{r:?}");
    assert_eq!(g.line_for(&path_of(&idna))["decision"], "allow");
    // With pins, only pinned files download: idna's sdist is not pinned.
    let sdist = g.reg().pypi_url("idna", &sdist_name("idna", "1.0"));
    let r = g.get(&sdist);
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        r.header("x-egressd-reason").as_deref(),
        Some("package_integrity_mismatch")
    );
    assert!(g.reg().hits_for(&sdist_name("idna", "1.0")).is_empty());

    // The registry now serves other bytes under the pinned file's URL
    // (its index still lists the pinned digest).
    let certifi = g.reg().pypi_url("certifi", &wheel_name("certifi", "1.0"));
    let path = path_of(&certifi);
    let evil = vec![b'x'; 200_000];
    g.reg().put_raw(
        "files.pythonhosted.org",
        &path,
        "application/octet-stream",
        evil.clone(),
    );
    let r = g.get(&certifi);
    assert_ne!(r.code, 0, "curl saw the transfer fail: {r:?}");
    assert!(r.body.len() < evil.len(), "never the whole file");
    let l = g.line_for(&path);
    assert_eq!(l["decision"], "deny", "{l}");
    assert_eq!(l["reason"], "package_integrity_mismatch");
    assert_eq!(l["package"]["name"], "certifi");
    let cut = [
        ("ecosystem", "pypi"),
        ("decision", "deny"),
        ("reason", "package_integrity_mismatch"),
    ];
    // The unpinned sdist and the cut wheel.
    assert_eq!(g.metric("egressd_package_decisions_total", &cut), 2.0);
}

// ---------------------------------------------------------------- unfilterable indexes

#[test]
fn an_index_that_cannot_be_filtered_is_a_502_never_passed_on() {
    let g = start(
        "an_index_that_cannot_be_filtered_is_a_502_never_passed_on",
        |r| {
            r.put_raw(
                "pypi.org",
                "/simple/requests/",
                JSON,
                b"{\"files\": [ not json".to_vec(),
            );
            // 65 MiB of spaces once inflated, 65 small gzip members on the wire.
            let member = gzip(&vec![b' '; 1 << 20]);
            r.put_encoded(
                "registry.npmjs.org",
                "/left-pad",
                "application/json",
                "gzip",
                member.repeat(65),
            );
        },
        |_| policy_yaml("", ""),
    );
    let r = g.curl(
        &["-H", &format!("Accept: {JSON}")],
        &url("pypi.org", "/simple/requests/"),
    );
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(
        r.header("x-egressd-reason").as_deref(),
        Some("package_index_unfilterable")
    );
    assert!(!r.text().contains("not json"), "{}", r.text());
    let r = g.get(&url("registry.npmjs.org", "/left-pad"));
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.text().contains("64 MiB"), "{}", r.text());
    assert!(r.body.len() < 4096);
    for p in ["/simple/requests/", "/left-pad"] {
        let l = g.line_for(p);
        assert_eq!(l["reason"], "package_index_unfilterable", "{l}");
        assert_eq!(l["status"], 502);
    }
    // The registry was asked for gzip only.
    let h = &g.reg().hits_for("/left-pad")[0];
    assert_eq!(h.header("accept-encoding"), Some("gzip"));
}

// ---------------------------------------------------------------- validators

#[test]
fn etags_are_the_filtered_documents_own_across_a_policy_reload() {
    let g = start(
        "etags_are_the_filtered_documents_own_across_a_policy_reload",
        |r| {
            r.publish_all(
                Eco::Pypi,
                &[
                    ("requests", "2.30.0", 10 * DAY),
                    ("requests", "2.31.0", 10 * DAY),
                ],
            )
        },
        |_| policy_yaml("", ""),
    );
    let index = url("pypi.org", "/simple/requests/");
    let accept = format!("Accept: {JSON}");
    let first = g.curl(&["-H", &accept], &index);
    assert_eq!(first.status, 200, "{first:?}");
    let e1 = first.header("etag").unwrap();
    let again = g.curl(
        &["-H", &accept, "-H", &format!("If-None-Match: {e1}")],
        &index,
    );
    assert_eq!(again.status, 304, "{again:?}");
    assert_eq!(again.header("etag").as_deref(), Some(e1.as_str()));
    // The registry never saw the client's validator: egressd answered it.
    let hits = g.reg().hits_for("/simple/requests/");
    assert_eq!(hits.len(), 2);
    assert!(
        hits.iter().all(|h| h.header("if-none-match").is_none()),
        "{hits:?}"
    );

    let reloads = || {
        g.e.metric("egressd_policy_reloads_total{result=\"ok\"}")
            .unwrap_or(0.0)
    };
    let before = reloads();
    let narrower = policy_yaml("", "").replace("      - requests\n", "      - requests <2.31\n");
    atomic_write(&g.e.policy_dir.join("p.yaml"), &narrower);
    eventually("the reload", || (reloads() > before).then_some(()));
    let after = g.curl(
        &["-H", &accept, "-H", &format!("If-None-Match: {e1}")],
        &index,
    );
    assert_eq!(
        after.status, 200,
        "a reload is never a 304 on the old filtering: {after:?}"
    );
    let e2 = after.header("etag").unwrap();
    assert_ne!(e1, e2);
    assert!(!after.text().contains("2.31.0"), "{}", after.text());
}

/// A document egressd keeps (the registry allows it) is filtered by the
/// policy serving when it is answered, not the one that fetched it: a
/// reload that narrows the approved versions hides them from the kept
/// copy at once, without a trip to the registry.
#[test]
fn a_kept_index_is_filtered_by_the_policy_after_a_reload() {
    let g = start(
        "a_kept_index_is_filtered_by_the_policy_after_a_reload",
        |r| {
            r.publish_all(
                Eco::Pypi,
                &[
                    ("requests", "2.30.0", 10 * DAY),
                    ("requests", "2.31.0", 10 * DAY),
                ],
            );
            r.set_cache_control("pypi.org", "/simple/requests/", "max-age=600");
        },
        |_| policy_yaml("", ""),
    );
    let index = url("pypi.org", "/simple/requests/");
    let accept = format!("Accept: {JSON}");
    let first = g.curl(&["-H", &accept], &index);
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.text().contains("2.31.0"), "{}", first.text());
    let again = g.curl(&["-H", &accept], &index);
    assert_eq!(again.status, 200, "{again:?}");
    assert!(again.header("age").is_some(), "from the cache: {again:?}");
    assert_eq!(g.reg().hits_for("/simple/requests/").len(), 1);

    let reloads = || {
        g.e.metric("egressd_policy_reloads_total{result=\"ok\"}")
            .unwrap_or(0.0)
    };
    let before = reloads();
    let narrower = policy_yaml("", "").replace("      - requests\n", "      - requests <2.31\n");
    assert_ne!(narrower, policy_yaml("", ""));
    atomic_write(&g.e.policy_dir.join("p.yaml"), &narrower);
    eventually("the reload", || (reloads() > before).then_some(()));
    let after = g.curl(&["-H", &accept], &index);
    assert_eq!(after.status, 200, "{after:?}");
    assert!(after.header("age").is_some(), "from the cache: {after:?}");
    assert_eq!(g.reg().hits_for("/simple/requests/").len(), 1);
    assert!(after.text().contains("2.30.0"), "{}", after.text());
    assert!(!after.text().contains("2.31.0"), "{}", after.text());
    let lines = g.lines_for("/simple/requests/", 3);
    assert_eq!(lines.len(), 3, "one line per request: {lines:#?}");
    let line = &lines[2];
    assert!(
        line["note"]
            .as_str()
            .is_some_and(|n| n.contains("egressd's cache")),
        "{line:#}"
    );
    assert_eq!(line["package"]["versions_hidden"], 1, "{line:#}");
}

// ---------------------------------------------------------------- mirrors

#[test]
fn a_mirror_gets_its_credential_and_the_sandbox_never_sees_it() {
    need_root(
        "a_mirror_gets_its_credential_and_the_sandbox_never_sees_it",
        "the fake registry listens on port 443",
    );
    const TOKEN: &str = "mirror-secret-7f3a";
    // The mirror: another registry, serving what it has under its own
    // path and its own absolute URLs, as Artifactory does.
    let mirror = try_registry().unwrap();
    mirror.publish_all(Eco::Pypi, &[("requests", "2.31.0", 10 * DAY)]);
    let wheel = wheel_name("requests", "2.31.0");
    let public_file = path_of(&mirror.pypi_url("requests", &wheel));
    let doc = String::from_utf8(
        mirror
            .doc_body("pypi.org", "/simple/requests/", Some(JSON))
            .unwrap(),
    )
    .unwrap()
    .replace(
        "https://files.pythonhosted.org/",
        &format!("https://{MIRROR_HOST}/api/pypi/"),
    );
    mirror.put_raw(
        MIRROR_HOST,
        "/api/pypi/simple/requests/",
        JSON,
        doc.into_bytes(),
    );
    let bytes = mirror
        .doc_body("files.pythonhosted.org", &public_file, None)
        .unwrap();
    let mirror_file = format!("/api/pypi{public_file}");
    mirror.put_raw(
        MIRROR_HOST,
        &mirror_file,
        "application/octet-stream",
        bytes.clone(),
    );
    let mirrors = format!(
        "    mirrors:\n      pypi: {{ url: \"https://{MIRROR_HOST}/api/pypi/simple/\", inject: {{ headers: {{ Authorization: \"Bearer ${{env:MIRROR_TOKEN}}\" }} }} }}\n"
    );
    let g = start_with(
        "a_mirror_gets_its_credential_and_the_sandbox_never_sees_it",
        |_| {},
        |_| policy_yaml("", &mirrors),
        &mirror.ca_pem,
        |b| b.env("MIRROR_TOKEN", TOKEN),
    );
    // Reached by its address, private as it is, with no exception for it.
    g.dns.set(MIRROR_HOST, &[&mirror.ip()]);

    let r = g.curl(
        &["-H", &format!("Accept: {JSON}")],
        &url("pypi.org", "/simple/requests/"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let rewritten = format!("https://files.pythonhosted.org/api/pypi{public_file}");
    assert!(r.text().contains(&rewritten), "{}", r.text());
    assert!(!r.text().contains(MIRROR_HOST), "{}", r.text());
    let dl = g.get(&rewritten);
    assert_eq!(dl.status, 200, "{dl:?}");
    assert_eq!(dl.body, bytes);

    for p in ["/api/pypi/simple/requests/", mirror_file.as_str()] {
        let h = mirror.hits_for(p);
        assert_eq!(h.len(), 1, "{p}: {:?}", mirror.hits());
        assert_eq!(
            h[0].header("authorization"),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        assert_eq!(h[0].host, MIRROR_HOST);
    }
    assert!(
        g.reg().hits().is_empty(),
        "the public registry is never asked"
    );
    for c in [&r, &dl] {
        assert!(!c.headers.contains(TOKEN) && !c.text().contains(TOKEN));
    }
    let log = std::fs::read_to_string(&g.e.log_path).unwrap();
    assert!(!log.contains(TOKEN), "the credential reached the log");
    let l = g.line_for(&format!("/api/pypi{public_file}"));
    assert_eq!(l["package"]["version"], "2.31.0");
}

// ---------------------------------------------------------------- Go's times

#[test]
fn go_lists_are_timed_by_each_mod_files_last_modified() {
    let g = start(
        "go_lists_are_timed_by_each_mod_files_last_modified",
        |r| {
            r.publish_all(
                Eco::Go,
                &[
                    ("git.lab.example/timed", "v1.0.0", 10 * DAY),
                    ("git.lab.example/timed", "v1.1.0", DAY),
                ],
            )
        },
        |_| {
            policy_yaml(
                "",
                "",
            )
            .replace(
                "    allow: [\"git.lab.example/ok >=v2.0.0\"]\n",
                "    allow: [\"git.lab.example/ok >=v2.0.0\"]\n  - id: gotimed\n    owner: go-team\n    reason: vetted\n    ecosystem: go\n    min_age: 3d\n    allow: [git.lab.example/timed]\n",
            )
        },
    );
    let list = g.get(&url("proxy.golang.org", "/git.lab.example/timed/@v/list"));
    assert_eq!(list.status, 200, "{list:?}");
    assert_eq!(list.text(), "v1.0.0\n", "v1.1.0 is a day old");
    // egressd read each version's .mod for its Last-Modified, as its own
    // requests.
    for v in ["v1.0.0", "v1.1.0"] {
        let p = format!("/git.lab.example/timed/@v/{v}.mod");
        let own = g.line_for(&p);
        assert_eq!(own["origin"], "egressd", "{own}");
        assert_eq!(own["status"], 200);
        assert_eq!(own["package"]["set"], "gotimed", "{own}");
        assert_eq!(own["package"]["version"], v, "{own}");
    }
    let l = g.line_for("/git.lab.example/timed/@v/list");
    assert_eq!(l["package"]["versions_hidden"], 1);
    assert_eq!(l["package"]["set"], "gotimed");
    // @latest points at the newest allowed version, not the registry's.
    let latest = g.get(&url("proxy.golang.org", "/git.lab.example/timed/@latest"));
    assert_eq!(latest.status, 200, "{latest:?}");
    assert_eq!(latest.json()["Version"], "v1.0.0", "{}", latest.text());
    // The download of the held version, and the times were not read again.
    let zip = g.get(&url(
        "proxy.golang.org",
        "/git.lab.example/timed/@v/v1.1.0.zip",
    ));
    assert_eq!(zip.status, 403, "{zip:?}");
    assert_eq!(
        zip.header("x-egressd-reason").as_deref(),
        Some("package_too_new")
    );
    assert_eq!(g.reg().hits_for("v1.1.0.mod").len(), 1);
    assert!(g.reg().hits_for("v1.1.0.zip").is_empty());
}

#[test]
fn a_plain_http_mirror_serves_downloads_egressd_authorised_through_it() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    type Served = Arc<Mutex<HashMap<String, (String, Vec<u8>)>>>;
    let served: Served = Arc::default();
    let s2 = served.clone();
    // A mirror on a private address, over plain HTTP, as an office
    // Artifactory often is.
    let mirror = raw_origin(move |r| {
        let found = s2.lock().unwrap().get(&r.target).cloned();
        Act::Reply(match found {
            Some((ctype, body)) => {
                let mut out = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                out.extend_from_slice(&body);
                out
            }
            None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        })
    });
    let base = format!("http://{}/pypi/", mirror.addr);
    let mut public_file = String::new();
    let g = start_with(
        "a_plain_http_mirror_serves_downloads_egressd_authorised_through_it",
        |r| {
            r.publish_all(Eco::Pypi, &[("requests", "2.31.0", 10 * DAY)]);
            let wheel = wheel_name("requests", "2.31.0");
            public_file = path_of(&r.pypi_url("requests", &wheel));
            let doc = String::from_utf8(
                r.doc_body("pypi.org", "/simple/requests/", Some(JSON))
                    .unwrap(),
            )
            .unwrap()
            .replace("https://files.pythonhosted.org/", &base);
            let file = r
                .doc_body("files.pythonhosted.org", &public_file, None)
                .unwrap();
            let mut m = served.lock().unwrap();
            m.insert(
                "/pypi/simple/requests/".into(),
                (JSON.into(), doc.into_bytes()),
            );
            m.insert(
                format!("/pypi{public_file}"),
                ("application/octet-stream".into(), file),
            );
        },
        |_| {
            policy_yaml(
                "",
                &format!(
                    "    mirrors:\n      pypi: {{ url: \"{base}simple/\", inject: {{ headers: {{ Authorization: \"Basic bWlycm9yOnB3\" }} }} }}\n"
                ),
            )
        },
        "",
        |b| b,
    );
    // The URL a client finds in the filtered index, asked for first.
    let file_url = format!("https://files.pythonhosted.org/pypi{public_file}");
    let r = g.get(&file_url);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with(b"PK"));
    let own = g.line_for("/pypi/simple/requests/");
    assert_eq!(own["origin"], "egressd", "{own}");
    assert_eq!(own["host"], "127.0.0.1");
    let seen = mirror.requests();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(
            s.header("authorization"),
            Some("Basic bWlycm9yOnB3"),
            "{s:?}"
        );
    }
    assert!(
        g.reg().hits().is_empty(),
        "the public registry is never asked"
    );
    assert!(!r.headers.contains("bWlycm9yOnB3"));
    // egressd's own index fetch goes the one upstream path: the pooled
    // connection it read the index on carries the download after it.
    assert_eq!(mirror.connections(), 1, "{seen:?}");
}
