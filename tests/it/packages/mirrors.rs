//! Mirrors with real clients (issue 37, item 5): `settings.packages.mirrors`
//! sends the public registry's requests to a mirror, whatever way the
//! mirror's documents name its files. `pip download` and `npm install` run
//! inside `egressd run`, configured for the public registry only, against
//! a mirror (`mirror.test`, the lab registry under another name) whose
//! documents name files
//!
//! - by absolute URL on the mirror's own host
//!   (`https://mirror.test/api/pypi/pypi/packages/…`, as devpi and some
//!   Artifactory and Nexus setups do): egressd rewrites them to the public
//!   file host with the same path and routes those back to the mirror;
//! - by relative URL (`../../packages/packages/…`, Artifactory's layout,
//!   in PEP 691 JSON and in PEP 503 HTML): the client resolves them against
//!   `pypi.org/simple/<p>/`, and egressd maps them under the mirror's path
//!   as it maps the index;
//! - (npm, which takes tarball URLs only absolute) by the public registry's
//!   own URL, as a mirror that keeps its upstream's documents does;
//! - (cargo) in its `config.json`'s `dl`, on its own host.
//!
//! Every file is fetched from the mirror, none from the public registry,
//! and each download is authorised where the filtered index lists it.

use serde_json::Value;

use super::*;

const MIRROR_PYPI: &str = "/api/pypi/pypi/";
const MIRROR_NPM: &str = "/api/npm/npm/";
const MIRROR_CARGO: &str = "/api/cargo/";
const PEP691: &str = "application/vnd.pypi.simple.v1+json";
const OLD: std::time::Duration = DAY.saturating_mul(30);

/// The lab's policy with PyPI and npm served by `mirror.test`.
fn mirrored(sets: &str) -> String {
    format!(
        "settings:\n  contact: \"#pkg-help\"\n  packages:\n    enforce: [pypi, npm, cargo, go]\n    \
         min_age: 3d\n    mirrors:\n      \
         pypi: {{ url: \"https://{MIRROR_HOST}{MIRROR_PYPI}simple/\" }}\n      \
         npm: {{ url: \"https://{MIRROR_HOST}{MIRROR_NPM}\" }}\n      \
         cargo: {{ url: \"https://{MIRROR_HOST}{MIRROR_CARGO}\" }}\n{}packages:\n{sets}",
        registry_exceptions()
    )
}

/// The lab with `mirror.test` resolving to its registry.
fn mirror_lab(test: &str) -> &'static Lab {
    let l = run_lab(test);
    l.dns.set(MIRROR_HOST, &[&l.reg().ip()]);
    l
}

/// How a mirror's PyPI index names its files.
#[derive(Clone, Copy)]
enum Names {
    /// `<origin>/api/pypi/pypi/packages/<h2>/<h2>/<h60>/<file>`, `origin`
    /// naming the mirror's host (`https://mirror.test`).
    Absolute(&'static str),
    /// `../../packages/packages/<h2>/<h2>/<h60>/<file>`, served as PEP 691
    /// JSON or (`html`) PEP 503 HTML.
    Relative { html: bool },
}

/// Puts `name`'s public PyPI index and files (published to the lab
/// registry) on the mirror, its files named as `names` says. Returns the
/// paths of its files on the mirror.
fn pypi_on_mirror(l: &Lab, name: &str, names: Names) -> Vec<String> {
    let public = "https://files.pythonhosted.org/";
    let json: Value = serde_json::from_slice(
        &l.reg()
            .doc_body("pypi.org", &format!("/simple/{name}/"), Some(PEP691))
            .unwrap(),
    )
    .unwrap();
    let (refer, html) = match names {
        Names::Absolute(origin) => (format!("{origin}{MIRROR_PYPI}"), false),
        Names::Relative { html } => ("../../packages/".to_string(), html),
    };
    let mut on_mirror = Vec::new();
    for f in json["files"].as_array().unwrap() {
        let url = f["url"].as_str().unwrap();
        let path = &url[public.len() - 1..];
        let mirror_path = match names {
            Names::Absolute(_) => format!("{MIRROR_PYPI}{}", &path[1..]),
            Names::Relative { .. } => format!("{MIRROR_PYPI}packages{path}"),
        };
        for suffix in ["", ".metadata"] {
            if let Some(b) =
                l.reg()
                    .doc_body("files.pythonhosted.org", &format!("{path}{suffix}"), None)
            {
                l.reg().put_raw(
                    MIRROR_HOST,
                    &format!("{mirror_path}{suffix}"),
                    "application/octet-stream",
                    b,
                );
            }
        }
        on_mirror.push(mirror_path);
    }
    let (ctype, doc) = if html {
        (
            "text/html",
            l.reg()
                .doc_body("pypi.org", &format!("/simple/{name}/"), Some("text/html")),
        )
    } else {
        (
            PEP691,
            l.reg()
                .doc_body("pypi.org", &format!("/simple/{name}/"), Some(PEP691)),
        )
    };
    let doc = String::from_utf8(doc.unwrap())
        .unwrap()
        .replace(public, &refer);
    assert!(!doc.contains("pythonhosted"), "{doc}");
    l.reg().put_raw(
        MIRROR_HOST,
        &format!("{MIRROR_PYPI}simple/{name}/"),
        ctype,
        doc.into_bytes(),
    );
    on_mirror
}

/// Requests for `part` that reached the public registry's names (not the
/// mirror's).
fn public_hits(l: &Lab, part: &str) -> Vec<String> {
    l.reg()
        .hits_for(part)
        .into_iter()
        .filter(|h| h.host != MIRROR_HOST)
        .map(|h| format!("{} {}", h.host, h.path))
        .collect()
}

/// `pip download` of `names` into /tmp/d, listing what it saved.
fn pip_download(names: &str) -> String {
    format!(
        "set -e\n/usr/bin/python3 -m pip download --no-cache-dir --disable-pip-version-check \
         --no-input --no-deps -d /tmp/d {names}\nls /tmp/d\n"
    )
}

/// Every wheel or tarball of `paths` was fetched from the mirror, through
/// egressd (pip takes the wheel, not the sdist).
fn each_fetched_from_mirror(l: &Lab, r: &Outcome, paths: &[String]) {
    for p in paths.iter().filter(|p| !p.ends_with(".tar.gz")) {
        let hits: Vec<_> = l
            .reg()
            .hits_for(p)
            .into_iter()
            .filter(|h| h.host == MIRROR_HOST && h.path == *p)
            .collect();
        assert!(
            !hits.is_empty(),
            "{p} was not fetched from the mirror\n{}",
            ctx(r)
        );
    }
}

#[test]
fn pip_downloads_through_a_mirror_whose_index_names_files_by_absolute_url() {
    let l = mirror_lab("packages::mirrors::pip_absolute");
    l.reg().publish(Eco::Pypi, "mi-abs", "1.0", OLD, &[]);
    l.reg().publish(Eco::Pypi, "mi-abs-lb", "1.0", OLD, &[]);
    let mut files = pypi_on_mirror(l, "mi-abs", Names::Absolute("https://mirror.test"));
    // A mirror behind a TLS-terminating proxy names itself `http://`, in
    // whatever case its configuration spells its name.
    files.extend(pypi_on_mirror(
        l,
        "mi-abs-lb",
        Names::Absolute("http://Mirror.Test"),
    ));
    let policy = mirrored(&set("py-lab", "pypi", &["mi-abs", "mi-abs-lb"]));
    let r = l.run(&policy, &pip_download("mi-abs mi-abs-lb"));
    assert_eq!(r.code, 0, "{}", ctx(&r));
    for w in [wheel_name("mi-abs", "1.0"), wheel_name("mi-abs-lb", "1.0")] {
        assert!(r.stdout.contains(&w), "{w}\n{}", ctx(&r));
    }
    each_fetched_from_mirror(l, &r, &files);
    assert_eq!(public_hits(l, "mi-abs"), Vec::<String>::new());
    assert_eq!(public_hits(l, "mi_abs"), Vec::<String>::new());
    // pip asked the public file host for the rewritten URL: the mirror's
    // path, allowed as the filtered index lists it.
    let dl = r
        .log_lines()
        .into_iter()
        .find(|l| l["host"] == "files.pythonhosted.org" && l["package"]["version"] == "1.0")
        .unwrap_or_else(|| panic!("no download line\n{}", ctx(&r)));
    assert_eq!(dl["decision"], "allow", "{dl}");
    assert!(
        dl["path"].as_str().unwrap().starts_with(MIRROR_PYPI),
        "{dl}"
    );
    // Nothing tried the mirror's host directly.
    assert!(
        !r.log_lines().iter().any(|l| l["decision"] == "deny"),
        "{}",
        ctx(&r)
    );
}

#[test]
fn pip_downloads_through_a_mirror_whose_index_names_files_by_relative_url() {
    let l = mirror_lab("packages::mirrors::pip_relative");
    l.reg().publish(Eco::Pypi, "mi-rel", "1.0", OLD, &[]);
    l.reg().publish(Eco::Pypi, "mi-rel-html", "2.0", OLD, &[]);
    let mut files = pypi_on_mirror(l, "mi-rel", Names::Relative { html: false });
    files.extend(pypi_on_mirror(
        l,
        "mi-rel-html",
        Names::Relative { html: true },
    ));
    // The HTML form has no times: its set asks for none.
    let policy = mirrored(&set(
        "py-lab",
        "pypi",
        &["mi-rel", "{ name: mi-rel-html, min_age: 0d }"],
    ));
    let r = l.run(&policy, &pip_download("mi-rel mi-rel-html"));
    assert_eq!(r.code, 0, "{}", ctx(&r));
    for w in [
        wheel_name("mi-rel", "1.0"),
        wheel_name("mi-rel-html", "2.0"),
    ] {
        assert!(r.stdout.contains(&w), "{w}\n{}", ctx(&r));
    }
    each_fetched_from_mirror(l, &r, &files);
    for part in ["mi-rel", "mi_rel"] {
        assert_eq!(public_hits(l, part), Vec::<String>::new());
    }
    // pip resolved the references against pypi.org/simple/<p>/.
    let dl = r
        .log_lines()
        .into_iter()
        .find(|l| {
            l["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/packages/packages/"))
        })
        .unwrap_or_else(|| panic!("no download line\n{}", ctx(&r)));
    assert_eq!(dl["host"], "pypi.org", "{dl}");
    assert_eq!(dl["decision"], "allow", "{dl}");
}

/// Puts `name`'s public packument and tarball on the mirror, the
/// tarball URL on the mirror's host (`own_host`) or left on the public
/// registry's. Returns the tarball's path on the mirror.
fn npm_on_mirror(l: &Lab, name: &str, version: &str, own_host: bool) -> String {
    let public = "https://registry.npmjs.org/";
    let doc = l
        .reg()
        .doc_body(
            "registry.npmjs.org",
            &format!("/{name}"),
            Some("application/json"),
        )
        .unwrap();
    let mut doc = String::from_utf8(doc).unwrap();
    assert!(doc.contains("\"time\""), "the full form: {doc}");
    if own_host {
        doc = doc.replace(public, &format!("https://{MIRROR_HOST}{MIRROR_NPM}"));
    }
    let tgz = format!("{name}/-/{name}-{version}.tgz");
    let bytes = l
        .reg()
        .doc_body("registry.npmjs.org", &format!("/{tgz}"), None)
        .unwrap();
    let on_mirror = format!("{MIRROR_NPM}{tgz}");
    l.reg()
        .put_raw(MIRROR_HOST, &on_mirror, "application/octet-stream", bytes);
    l.reg().put_raw(
        MIRROR_HOST,
        &format!("{MIRROR_NPM}{name}"),
        "application/json",
        doc.into_bytes(),
    );
    on_mirror
}

#[test]
fn npm_installs_through_a_mirror_naming_tarballs_on_its_own_host_or_the_public_one() {
    let l = mirror_lab("packages::mirrors::npm");
    l.reg().publish(Eco::Npm, "mi-npm-abs", "1.0.0", OLD, &[]);
    l.reg().publish(Eco::Npm, "mi-npm-pub", "1.0.0", OLD, &[]);
    let files = [
        npm_on_mirror(l, "mi-npm-abs", "1.0.0", true),
        npm_on_mirror(l, "mi-npm-pub", "1.0.0", false),
    ];
    let policy = mirrored(&set("npm-lab", "npm", &["mi-npm-abs", "mi-npm-pub"]));
    let r = l.run(
        &policy,
        &format!(
            "{}npm install --no-audit --no-fund --no-update-notifier mi-npm-abs mi-npm-pub\n\
             cat node_modules/mi-npm-abs/package.json node_modules/mi-npm-pub/package.json\n",
            clients::npm_project()
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    for n in ["mi-npm-abs", "mi-npm-pub"] {
        assert!(
            r.stdout.contains(&format!("\"name\": \"{n}\""))
                || r.stdout.contains(&format!("\"name\":\"{n}\"")),
            "{n} not installed\n{}",
            ctx(&r)
        );
        assert_eq!(public_hits(l, n), Vec::<String>::new());
    }
    each_fetched_from_mirror(l, &r, &files);
    // The packument npm kept names the public registry, never the mirror.
    let lock = r.stdout.contains(MIRROR_HOST);
    assert!(!lock, "{}", ctx(&r));
    let tarball = r
        .log_lines()
        .into_iter()
        .find(|l| l["path"] == format!("{MIRROR_NPM}mi-npm-abs/-/mi-npm-abs-1.0.0.tgz"))
        .unwrap_or_else(|| panic!("no tarball line\n{}", ctx(&r)));
    assert_eq!(tarball["host"], "registry.npmjs.org", "{tarball}");
    assert_eq!(tarball["decision"], "allow", "{tarball}");
}

#[test]
fn cargo_fetches_through_a_mirror_whose_config_names_its_own_host() {
    let l = mirror_lab("packages::mirrors::cargo");
    l.reg().publish(Eco::Cargo, "mi-crate", "1.2.0", OLD, &[]);
    let index = cargo_index_path("mi-crate");
    let lines = l.reg().doc_body("index.crates.io", &index, None).unwrap();
    l.reg().put_raw(
        MIRROR_HOST,
        &format!("{MIRROR_CARGO}{}", &index[1..]),
        "text/plain",
        lines,
    );
    let krate = l
        .reg()
        .doc_body("static.crates.io", "/crates/mi-crate/1.2.0/download", None)
        .unwrap();
    let on_mirror = format!("{MIRROR_CARGO}crates/mi-crate/1.2.0/download");
    l.reg()
        .put_raw(MIRROR_HOST, &on_mirror, "application/octet-stream", krate);
    l.reg().put_raw(
        MIRROR_HOST,
        &format!("{MIRROR_CARGO}config.json"),
        "application/json",
        format!(
            "{{\"dl\":\"https://{MIRROR_HOST}{MIRROR_CARGO}crates\",\"api\":\"https://{MIRROR_HOST}{MIRROR_CARGO}\"}}"
        )
        .into_bytes(),
    );
    let policy = mirrored(&set("crates-lab", "cargo", &["mi-crate"]));
    let r = l.run(
        &policy,
        &format!(
            "{}cargo generate-lockfile\ncargo fetch\nls $CARGO_HOME/registry/cache/*/\n",
            clients::cargo_project("mi-crate = \"1\"")
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(r.stdout.contains("mi-crate-1.2.0.crate"), "{}", ctx(&r));
    each_fetched_from_mirror(l, &r, std::slice::from_ref(&on_mirror));
    assert_eq!(public_hits(l, "mi-crate"), Vec::<String>::new());
    assert_eq!(public_hits(l, "mi/-c"), Vec::<String>::new());
    // cargo asked the public file host for the mirror's path.
    let dl = r
        .log_lines()
        .into_iter()
        .find(|l| l["path"] == on_mirror.as_str())
        .unwrap_or_else(|| panic!("no download line\n{}", ctx(&r)));
    assert_eq!(dl["host"], "static.crates.io", "{dl}");
    assert_eq!(dl["decision"], "allow", "{dl}");
    assert_eq!(dl["package"]["version"], "1.2.0", "{dl}");
}
