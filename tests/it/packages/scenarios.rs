//! The package gate's scenarios (issue 15, item 9) with the real clients.
//! Each test publishes its own packages, approves some of them in a
//! `packages:` set, and runs the client inside `egressd run`; each asserts
//! something a gate-less egressd does not do (the same install through
//! plain exceptions resolves, installs or falls back differently), so each
//! fails without the gate.

use serde_json::Value;

use super::clients::{cargo_project, go_project, npm_project, pip_install};
use super::*;

/// Old enough for every `min_age` here.
const OLD: std::time::Duration = DAY.saturating_mul(30);
/// Younger than the lab's `min_age` of 3 days.
const YOUNG: std::time::Duration = std::time::Duration::from_secs(3600);

/// The log lines carrying a `package` field named `name`.
fn package_lines(r: &Outcome, name: &str) -> Vec<Value> {
    r.log_lines()
        .into_iter()
        .filter(|l| l["package"]["name"] == name)
        .collect()
}

/// A denial of `name` for `reason` was logged.
fn assert_denied(r: &Outcome, name: &str, reason: &str) -> Value {
    package_lines(r, name)
        .into_iter()
        .find(|l| l["decision"] == "deny" && l["reason"] == reason)
        .unwrap_or_else(|| panic!("no {reason} denial of {name}\n{}", ctx(r)))
}

// ---------------------------------------------------------------- ranges and min_age

#[test]
fn pip_range_resolves_to_the_newest_allowed_and_skips_a_too_new_release() {
    let l = run_lab("packages::scenarios::pip_range");
    for (v, age) in [("1.0", OLD), ("1.5", OLD), ("1.6", YOUNG), ("2.0", OLD)] {
        l.reg().publish(Eco::Pypi, "sc-range", v, age, &[]);
    }
    let policy = gated(&set("py-lab", "pypi", &["sc-range >=1,<2"]));
    let r = l.run(
        &policy,
        &format!(
            "{}/tmp/v/bin/python -c 'import sc_range; print(\"installed\", sc_range.__version__)'",
            pip_install("sc-range")
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    // 2.0 is outside the range, 1.6 younger than min_age: 1.5.
    assert!(r.stdout.contains("installed 1.5\n"), "{}", ctx(&r));
    let index = package_lines(&r, "sc-range")
        .into_iter()
        .find(|l| l["path"] == "/simple/sc-range/")
        .unwrap_or_else(|| panic!("no index line\n{}", ctx(&r)));
    assert_eq!(index["package"]["versions_hidden"], 2, "{index}");
    assert!(l.reg().hits_for("sc_range-1.6").is_empty());
}

#[test]
fn npm_range_skips_a_too_new_release_and_latest_is_repointed() {
    let test = "packages::scenarios::npm_range";
    have("npm", test);
    let l = run_lab(test);
    for (v, age) in [("1.0.0", OLD), ("1.1.0", OLD), ("1.2.0", YOUNG)] {
        l.reg().publish(Eco::Npm, "sc-npm-young", v, age, &[]);
    }
    let policy = gated(&set("npm-lab", "npm", &["sc-npm-young"]));
    let r = l.run(
        &policy,
        &format!(
            "{}npm install --no-audit --no-fund --no-update-notifier sc-npm-young\n\
             node -e 'console.log(\"installed\", require(\"sc-npm-young\"))'\n\
             grep '\"sc-npm-young\"' package.json",
            npm_project()
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(r.stdout.contains("installed 1.1.0"), "{}", ctx(&r));
    // `npm install <name>` saves ^latest: latest was re-pointed to 1.1.0.
    assert!(r.stdout.contains("\"^1.1.0\""), "{}", ctx(&r));
}

#[test]
fn cargo_fresh_lock_skips_a_version_held_by_policy() {
    let l = run_lab("packages::scenarios::cargo_fresh_lock");
    for (v, age) in [("1.0.0", OLD), ("1.1.0", OLD), ("1.2.0", YOUNG)] {
        l.reg().publish(Eco::Cargo, "sc-crate", v, age, &[]);
    }
    let policy = gated(&set("crates-lab", "cargo", &["sc-crate"]));
    let r = l.run(
        &policy,
        &format!(
            "{}cargo generate-lockfile\ngrep -A1 '^name = \"sc-crate\"' Cargo.lock",
            cargo_project("sc-crate = \"1\"")
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout
            .contains("name = \"sc-crate\"\nversion = \"1.1.0\""),
        "{}",
        ctx(&r)
    );
}

#[test]
fn go_latest_skips_a_too_new_version() {
    let test = "packages::scenarios::go_latest";
    have("go", test);
    let l = run_lab(test);
    let m = format!("{GO_PREFIX}/acme/young");
    for (v, age) in [("v1.0.0", OLD), ("v1.1.0", OLD), ("v1.2.0", YOUNG)] {
        l.reg().publish(Eco::Go, &m, v, age, &[]);
    }
    let policy = gated(&set("go-lab", "go", &[&m]));
    let r = l.run(
        &policy,
        &format!("{}go get {m}@latest\ncat go.mod", go_project()),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout.contains(&format!("require {m} v1.1.0")),
        "{}",
        ctx(&r)
    );
}

// ---------------------------------------------------------------- pins of held versions fail at download

#[test]
fn pip_pinned_url_of_a_too_new_wheel_fails_with_the_reason_phrase() {
    let l = run_lab("packages::scenarios::pip_pin");
    l.reg().publish(Eco::Pypi, "sc-pin", "1.0", OLD, &[]);
    l.reg().publish(Eco::Pypi, "sc-pin", "1.1", YOUNG, &[]);
    let url = l.reg().pypi_url("sc-pin", &wheel_name("sc-pin", "1.1"));
    let sha = l
        .reg()
        .sha256_of(Eco::Pypi, "sc-pin", &wheel_name("sc-pin", "1.1"));
    let policy = gated(&set("py-lab", "pypi", &["sc-pin"]));
    // A lockfile with the file's URL and hash: no index in the way.
    let r = l.run(
        &policy,
        &format!(
            "echo 'sc-pin @ {url} --hash=sha256:{sha}' > /tmp/req.txt\n{}",
            pip_install("-r /tmp/req.txt")
        ),
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    let phrase = "Forbidden (egressd: package_too_new sc-pin@1.1)";
    assert!(
        r.stdout.contains(phrase) || r.stderr.contains(phrase),
        "{}",
        ctx(&r)
    );
    assert_denied(&r, "sc-pin", "package_too_new");
    assert!(
        l.reg().hits_for(&wheel_name("sc-pin", "1.1")).is_empty(),
        "the held wheel was fetched"
    );
}

#[test]
fn npm_ci_of_a_lockfile_pinning_an_unapproved_version_fails_with_the_json_error() {
    let test = "packages::scenarios::npm_pin";
    have("npm", test);
    let l = run_lab(test);
    l.reg().publish(Eco::Npm, "sc-npm-pin", "1.0.0", OLD, &[]);
    l.reg().publish(Eco::Npm, "sc-npm-pin", "2.0.0", OLD, &[]);
    let policy = gated(&set("npm-lab", "npm", &["sc-npm-pin ^1.0.0"]));
    // The lockfile a developer made before the policy: 2.0.0, integrity
    // and URL as npm wrote them (npm ci reads no packument).
    let script = format!(
        "{}npm install --no-audit --no-fund --package-lock-only sc-npm-pin@2.0.0 >/dev/null 2>&1 || true\n\
         test -f package-lock.json || exit 3\n",
        npm_project()
    );
    let lock = l.run(
        &registry_exceptions(),
        &format!("{script}cat package-lock.json"),
    );
    assert_eq!(lock.code, 0, "{}", ctx(&lock));
    let lockfile = lock.stdout.clone();
    assert!(lockfile.contains("sc-npm-pin-2.0.0.tgz"), "{lockfile}");
    let r = l.run(
        &policy,
        &format!(
            "{}cat > package-lock.json <<'EOF'\n{lockfile}\nEOF\n\
             sed -i 's/\"private\":true/\"private\":true,\"dependencies\":{{\"sc-npm-pin\":\"2.0.0\"}}/' package.json\n\
             npm ci --no-audit --no-fund --no-update-notifier",
            npm_project()
        ),
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stderr.contains("package_version_not_approved"),
        "{}",
        ctx(&r)
    );
    assert_denied(&r, "sc-npm-pin", "package_version_not_approved");
    // npm ci read no packument: egressd fetched it itself to decide.
    assert!(
        package_lines(&r, "sc-npm-pin")
            .iter()
            .any(|l| l["origin"] == "egressd" && l["package"]["version"].is_null()),
        "{}",
        ctx(&r)
    );
}

#[test]
fn cargo_locked_fetch_of_a_held_version_fails_with_the_text_body() {
    let l = run_lab("packages::scenarios::cargo_pin");
    l.reg()
        .publish(Eco::Cargo, "sc-crate-pin", "1.0.0", OLD, &[]);
    l.reg()
        .publish(Eco::Cargo, "sc-crate-pin", "1.1.0", YOUNG, &[]);
    // Locked before the policy (plain exceptions): 1.1.0.
    let lock = l.run(
        &registry_exceptions(),
        &format!(
            "{}cargo generate-lockfile -q\ncat Cargo.lock",
            cargo_project("sc-crate-pin = \"1\"")
        ),
    );
    assert_eq!(lock.code, 0, "{}", ctx(&lock));
    assert!(
        lock.stdout.contains("version = \"1.1.0\""),
        "{}",
        ctx(&lock)
    );
    let policy = gated(&set("crates-lab", "cargo", &["sc-crate-pin"]));
    let r = l.run(
        &policy,
        &format!(
            "{}cat > Cargo.lock <<'EOF'\n{}\nEOF\ncargo fetch --locked",
            cargo_project("sc-crate-pin = \"1\""),
            lock.stdout
        ),
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    assert!(r.stderr.contains("403"), "{}", ctx(&r));
    assert!(r.stderr.contains("package_too_new"), "{}", ctx(&r));
    // Cargo names are normalised with `_`.
    assert_denied(&r, "sc_crate_pin", "package_too_new");
}

#[test]
fn go_download_of_a_held_version_fails_with_the_text_body() {
    let test = "packages::scenarios::go_pin";
    have("go", test);
    let l = run_lab(test);
    let m = format!("{GO_PREFIX}/acme/pinned");
    l.reg().publish(Eco::Go, &m, "v1.0.0", OLD, &[]);
    l.reg().publish(Eco::Go, &m, "v1.1.0", YOUNG, &[]);
    let policy = gated(&set("go-lab", "go", &[&m]));
    let r = l.run(
        &policy,
        &format!(
            "{}go mod edit -require={m}@v1.1.0\ngo mod download {m}",
            go_project()
        ),
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    assert!(r.stderr.contains("403 Forbidden"), "{}", ctx(&r));
    assert!(r.stderr.contains("package_too_new"), "{}", ctx(&r));
    assert!(l.reg().hits_for("young/@v/v1.1.0.zip").is_empty());
}

// ---------------------------------------------------------------- unapproved names

#[test]
fn pip_typo_is_denied_and_its_download_says_did_you_mean() {
    let l = run_lab("packages::scenarios::pip_typo");
    l.reg().publish(Eco::Pypi, "requests", "2.32.3", OLD, &[]);
    l.reg().publish(Eco::Pypi, "reqeusts", "0.0.1", OLD, &[]);
    let url = l
        .reg()
        .pypi_url("reqeusts", &wheel_name("reqeusts", "0.0.1"));
    let policy = gated(&set("py-lab", "pypi", &["requests"]));
    let pip = "/usr/bin/python3 -m pip --python /tmp/v/bin/python install --no-cache-dir \
               --disable-pip-version-check --no-input";
    let r = l.run(
        &policy,
        &format!(
            "/usr/bin/python3 -m venv --without-pip /tmp/v\n\
             {pip} reqeusts || {pip} 'reqeusts @ {url}'"
        ),
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    // The index: pip says only "from versions: none".
    assert!(
        r.stderr
            .contains("No matching distribution found for reqeusts"),
        "{}",
        ctx(&r)
    );
    // A download (a lockfile's URL): the reason phrase, with the name meant.
    assert!(
        r.stderr.contains(
            "403 Client Error: Forbidden (egressd: package_not_approved reqeusts@0.0.1; did you mean requests?)"
        ),
        "{}",
        ctx(&r)
    );
    let lines = package_lines(&r, "reqeusts");
    assert_eq!(lines.len(), 2, "{}", ctx(&r));
    for line in &lines {
        assert_eq!(line["reason"], "package_not_approved", "{line}");
        assert_eq!(line["status"], 403, "{line}");
    }
    assert!(
        l.reg().hits_for("reqeusts").is_empty(),
        "the typo reached the registry"
    );
}

#[test]
fn npm_typo_is_denied_with_did_you_mean_in_the_json_error() {
    let test = "packages::scenarios::npm_typo";
    have("npm", test);
    let l = run_lab(test);
    l.reg().publish(Eco::Npm, "lodash", "4.17.21", OLD, &[]);
    let policy = gated(&set("npm-lab", "npm", &["lodash"]));
    let r = l.run(
        &policy,
        &format!(
            "{}npm install --no-audit --no-fund --no-update-notifier lodahs",
            npm_project()
        ),
    );
    assert_ne!(r.code, 0, "{}", ctx(&r));
    assert!(r.stderr.contains("did you mean lodash?"), "{}", ctx(&r));
    assert_denied(&r, "lodahs", "package_not_approved");
}

#[test]
fn go_gets_403_for_an_unapproved_module_and_does_not_fall_back_to_direct() {
    let test = "packages::scenarios::go_no_direct";
    have("go", test);
    let l = run_lab(test);
    let m = format!("{GO_PREFIX}/acme/unlisted");
    let policy = gated(&set("go-lab", "go", &[&format!("{GO_PREFIX}/acme/other")]));
    let r = l.run(&policy, &format!("{}go get {m}@latest", go_project()));
    assert_ne!(r.code, 0, "{}", ctx(&r));
    assert!(r.stderr.contains("403 Forbidden"), "{}", ctx(&r));
    // GOPROXY's `direct` is tried only after a 404 or 410: never here.
    let direct: Vec<_> = r
        .log_lines()
        .into_iter()
        .filter(|l| l["host"] == GO_PREFIX)
        .collect();
    assert!(direct.is_empty(), "go fell back to direct: {direct:#?}");
    assert!(l.reg().hits_for("/acme/unlisted").is_empty());
}

// ---------------------------------------------------------------- name variants, .metadata, legacy paths

/// `curl` inside the sandbox: one line per URL, `<status> <url>`.
fn curl_each(urls: &[String]) -> String {
    urls.iter()
        .map(|u| format!("curl -s -o /dev/null -w '%{{http_code}} {u}\\n' '{u}'\n"))
        .collect()
}

#[test]
fn pypi_name_variants_metadata_and_legacy_paths_meet_the_same_rule() {
    let l = run_lab("packages::scenarios::pypi_variants");
    l.reg().publish(Eco::Pypi, "Sc.Variant", "1.0", OLD, &[]);
    l.reg().publish(Eco::Pypi, "Sc.Variant", "1.1", YOUNG, &[]);
    l.reg().publish(Eco::Pypi, "sc-unlisted", "1.0", OLD, &[]);
    let policy = gated(&set("py-lab", "pypi", &["sc_variant"]));
    let old = wheel_name("sc-variant", "1.0");
    let young = wheel_name("sc-variant", "1.1");
    let other = wheel_name("sc-unlisted", "1.0");
    // (URL, status egressd answers or passes on).
    let cases = [
        ("https://pypi.org/simple/sc-variant/".to_string(), "200"),
        // pypi.org's own redirect to the PEP 503 form, passed on.
        ("https://pypi.org/simple/Sc.Variant/".into(), "301"),
        ("https://pypi.org/simple/SC__variant/".into(), "301"),
        (l.reg().pypi_url("Sc.Variant", &old), "200"),
        (
            format!("{}.metadata", l.reg().pypi_url("Sc.Variant", &old)),
            "200",
        ),
        (
            format!("https://files.pythonhosted.org/packages/py3/s/sc-variant/{old}"),
            "200",
        ),
        (l.reg().pypi_url("Sc.Variant", &young), "403"),
        (
            format!("{}.metadata", l.reg().pypi_url("Sc.Variant", &young)),
            "403",
        ),
        (
            format!("https://files.pythonhosted.org/packages/py3/s/sc-variant/{young}"),
            "403",
        ),
        ("https://pypi.org/simple/Sc_Unlisted/".into(), "403"),
        ("https://pypi.org/simple/sc.unlisted/".into(), "403"),
        (
            format!("{}.metadata", l.reg().pypi_url("sc-unlisted", &other)),
            "403",
        ),
        (
            format!("https://files.pythonhosted.org/packages/py3/s/sc-unlisted/{other}"),
            "403",
        ),
    ];
    let urls: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
    let r = l.run(&policy, &curl_each(&urls));
    assert_eq!(r.code, 0, "{}", ctx(&r));
    let want: Vec<String> = cases.iter().map(|(u, s)| format!("{s} {u}")).collect();
    let got: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(got, want, "{}", ctx(&r));
    // One rule for every spelling: each request names the normalised
    // project and the set (egressd's own fetches of the JSON form aside).
    let client = |name: &str| -> Vec<Value> {
        package_lines(&r, name)
            .into_iter()
            .filter(|l| l["origin"] != "egressd")
            .collect()
    };
    let variant = client("sc-variant");
    assert_eq!(variant.len(), 9, "{}", ctx(&r));
    for l in &variant {
        assert_eq!(l["package"]["set"], "py-lab", "{l}");
    }
    let held: Vec<_> = variant.iter().filter(|l| l["decision"] == "deny").collect();
    assert_eq!(held.len(), 3, "{}", ctx(&r));
    for l in held {
        assert_eq!(l["reason"], "package_too_new", "{l}");
    }
    let unlisted = client("sc-unlisted");
    assert_eq!(unlisted.len(), 4, "{}", ctx(&r));
    for l in &unlisted {
        assert_eq!(l["reason"], "package_not_approved", "{l}");
    }
    assert!(
        l.reg().hits_for("sc_unlisted").is_empty(),
        "an unapproved file reached the registry"
    );
    assert!(
        l.reg().hits_for("sc_variant-1.1").is_empty(),
        "a held file reached the registry"
    );
}

#[test]
fn npm_scope_encodings_and_both_packument_forms_agree() {
    let test = "packages::scenarios::npm_forms";
    have("npm", test);
    let l = run_lab(test);
    for (v, age) in [
        ("1.0.0", OLD),
        ("1.1.0", OLD),
        ("1.2.0", YOUNG),
        ("2.0.0", OLD),
    ] {
        l.reg().publish(Eco::Npm, "@sc/forms", v, age, &[]);
    }
    let policy = gated(&set("npm-lab", "npm", &["\"@sc/forms ^1\""]));
    let abbr = "application/vnd.npm.install-v1+json";
    let mut script = String::new();
    for (i, path) in ["@sc%2fforms", "@sc%2Fforms", "@sc/forms", "%40sc%2fforms"]
        .iter()
        .enumerate()
    {
        script.push_str(&format!(
            "curl -sS -f -o /tmp/full{i}.json https://registry.npmjs.org/{path}\n\
             curl -sS -f -H 'Accept: {abbr}' -o /tmp/abbr{i}.json https://registry.npmjs.org/{path}\n"
        ));
    }
    script.push_str(
        "python3 - <<'EOF'\nimport json\n\
         for i in range(4):\n\
         \x20   f = json.load(open('/tmp/full%d.json' % i)); a = json.load(open('/tmp/abbr%d.json' % i))\n\
         \x20   print('full', sorted(f['versions']), f['dist-tags'], sorted(f.get('policyRestrictions', {}).get('versions', {})))\n\
         \x20   print('abbr', sorted(a['versions']), a['dist-tags'])\nEOF\n\
         cd /tmp && npm init -y >/dev/null && npm install --no-audit --no-fund --no-update-notifier @sc/forms\n\
         node -e 'console.log(\"installed\", require(\"@sc/forms\"))'\n",
    );
    let r = l.run(&policy, &script);
    assert_eq!(r.code, 0, "{}", ctx(&r));
    // Held versions under policyRestrictions in the full form; the
    // abbreviated form lists exactly the same installable versions.
    let full = "full ['1.0.0', '1.1.0'] {'latest': '1.1.0'} ['1.2.0', '2.0.0']";
    let abbr_line = "abbr ['1.0.0', '1.1.0'] {'latest': '1.1.0'}";
    assert_eq!(r.stdout.matches(full).count(), 4, "{}", ctx(&r));
    assert_eq!(r.stdout.matches(abbr_line).count(), 4, "{}", ctx(&r));
    assert!(r.stdout.contains("installed 1.1.0"), "{}", ctx(&r));
}

// ---------------------------------------------------------------- the manual's worked example

/// docs/packages.md, "Worked example": three approved PyPI packages, one
/// installed with its dependencies, a typo denied with "did you mean", a
/// too-new release held back. Prints what pip and `egressd run` said.
#[test]
fn worked_example_three_approved_pypi_packages() {
    let l = run_lab("packages::scenarios::worked_example");
    l.reg().publish(Eco::Pypi, "urllib3", "2.2.3", OLD, &[]);
    l.reg().publish(Eco::Pypi, "certifi", "2024.8.30", OLD, &[]);
    let deps = [("urllib3", ">=1.21.1,<3"), ("certifi", ">=2017.4.17")];
    l.reg().publish(Eco::Pypi, "requests", "2.32.3", OLD, &deps);
    l.reg()
        .publish(Eco::Pypi, "requests", "2.33.0", YOUNG, &deps);
    l.reg().publish(Eco::Pypi, "reqeusts", "1.0.0", OLD, &[]);
    let policy = gated(
        "  - id: py-agent-runtime\n    owner: python-platform\n    reason: vetted runtime deps\n    \
         ecosystem: pypi\n    min_age: 3d\n    allow:\n      - requests >=2.31,<3\n      - urllib3\n      - certifi\n",
    );
    let pip = "/usr/bin/python3 -m pip --python /tmp/v/bin/python install --no-cache-dir \
               --disable-pip-version-check --no-input";
    let r = l.run(
        &policy,
        &format!(
            "/usr/bin/python3 -m venv --without-pip /tmp/v\n\
             echo '$ pip install requests'\n{pip} requests 2>&1\n\
             echo '$ pip install reqeusts'\n{pip} reqeusts 2>&1\n\
             echo '$ pip install -vv reqeusts | grep egressd'\n{pip} -vv reqeusts 2>&1 | grep egressd\n\
             echo '$ pip install requests==2.33.0'\n{pip} requests==2.33.0 2>&1\n\
             exit 0"
        ),
    );
    eprintln!(
        "WORKED EXAMPLE stdout:\n{}\nWORKED EXAMPLE stderr:\n{}",
        r.stdout, r.stderr
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout
            .contains("Successfully installed certifi-2024.8.30 requests-2.32.3 urllib3-2.2.3"),
        "{}",
        ctx(&r)
    );
    assert_denied(&r, "reqeusts", "package_not_approved");
    // pip logs an index's 403 only with -vv: the reason phrase.
    assert!(
        r.stdout.contains("403 Client Error: Forbidden (egressd: package_not_approved reqeusts; did you mean requests?)"),
        "{}",
        ctx(&r)
    );
    // 2.33.0 is hidden from the index: pip sees no such version.
    assert!(
        r.stdout
            .contains("No matching distribution found for requests==2.33.0"),
        "{}",
        ctx(&r)
    );
    let index = package_lines(&r, "requests")
        .into_iter()
        .find(|l| l["path"] == "/simple/requests/")
        .unwrap_or_else(|| panic!("no index line\n{}", ctx(&r)));
    assert_eq!(index["package"]["versions_hidden"], 1, "{index}");
}

// ---------------------------------------------------------------- uv and pnpm on a deny

#[test]
fn uv_pin_of_a_too_new_release_and_typo_are_denied() {
    let test = "packages::scenarios::uv_deny";
    have("uv", test);
    let l = run_lab(test);
    l.reg().publish(Eco::Pypi, "sc-uv", "1.0", OLD, &[]);
    l.reg().publish(Eco::Pypi, "sc-uv", "1.1", YOUNG, &[]);
    let url = l.reg().pypi_url("sc-uv", &wheel_name("sc-uv", "1.1"));
    let policy = gated(&set("py-lab", "pypi", &["sc-uv"]));
    let uv = "uv pip install --no-cache --python /tmp/v/bin/python";
    let r = l.run(
        &policy,
        &format!(
            "/usr/bin/python3 -m venv --without-pip /tmp/v\n\
             echo '$ uv pip install sc-uv'\n{uv} sc-uv 2>&1\n\
             echo '$ uv pip install sc-uw'\n{uv} sc-uw 2>&1\n\
             echo '$ uv pip install <url of sc-uv 1.1>'\n{uv} 'sc-uv @ {url}' 2>&1\nexit 0"
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(r.stdout.contains("+ sc-uv==1.0"), "{}", ctx(&r));
    assert_denied(&r, "sc-uw", "package_not_approved");
    assert_denied(&r, "sc-uv", "package_too_new");
    assert!(r.stdout.contains("403"), "{}", ctx(&r));
}

#[test]
fn pnpm_typo_is_denied_with_did_you_mean() {
    let test = "packages::scenarios::pnpm_typo";
    have("pnpm", test);
    let l = run_lab(test);
    l.reg().publish(Eco::Npm, "chalk", "5.3.0", OLD, &[]);
    let policy = gated(&set("npm-lab", "npm", &["chalk"]));
    let r = l.run(
        &policy,
        &format!(
            "{}echo '$ pnpm add chlak'\npnpm add chlak 2>&1 || true",
            npm_project()
        ),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert_denied(&r, "chlak", "package_not_approved");
    assert!(r.stdout.contains("did you mean chalk?"), "{}", ctx(&r));
}

// ---------------------------------------------------------------- egressd run's summary at exit

/// DESIGN, "Packages": `egressd run` prints its command's package denials
/// on stderr when it exits. For pip that is the only place the agent sees
/// "did you mean" for a typo it installs by name (pip hides an index's
/// 403 below -vv).
#[test]
fn egressd_run_prints_its_commands_package_denials_at_exit() {
    let l = run_lab("packages::scenarios::exit_summary");
    l.reg().publish(Eco::Pypi, "requests", "2.32.3", OLD, &[]);
    let policy = gated(&set("py-lab", "pypi", &["requests"]));
    let r = l.run(&policy, &pip_install("reqeusts"));
    assert_ne!(r.code, 0, "{}", ctx(&r));
    assert_denied(&r, "reqeusts", "package_not_approved");
    assert!(r.stderr.contains("reqeusts"), "{}", ctx(&r));
    assert!(r.stderr.contains("did you mean requests?"), "{}", ctx(&r));
}
