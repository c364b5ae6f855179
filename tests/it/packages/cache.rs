//! Index documents served from egressd's own cache (issue 17, item 5):
//! an index the registry marks fresh (`Cache-Control: max-age`) is kept
//! and served again, filtered again, without a trip to the registry;
//! what the registry or the client rules out goes to the registry every
//! time.

use serde_json::Value;

use super::*;

const OLD: std::time::Duration = DAY.saturating_mul(30);
const YOUNG: std::time::Duration = std::time::Duration::from_secs(3600);

/// `curl` of npm packument `name` inside the sandbox with `flags`, then
/// the document's versions (and the headers' `age`) printed as
/// `<tag> <versions> age=<age>`.
fn fetch(tag: &str, name: &str, flags: &str) -> String {
    format!(
        "curl -sS -f {flags} -D /tmp/{tag}.h -o /tmp/{tag}.json https://registry.npmjs.org/{name}\n\
         python3 -c 'import json; d = json.load(open(\"/tmp/{tag}.json\")); \
         age = [l.split(\":\", 1)[1].strip() for l in open(\"/tmp/{tag}.h\") if l.lower().startswith(\"age:\")]; \
         print(\"{tag}\", sorted(d[\"versions\"]), \"age=\" + (age[0] if age else \"-\"))'\n"
    )
}

/// The registry's requests for `name`'s packument that came from the
/// sandbox's curl (egressd's own fetches have their own user agent).
fn client_trips(l: &Lab, name: &str) -> usize {
    l.reg()
        .hits_for(&format!("/{name}"))
        .iter()
        .filter(|h| {
            h.header("user-agent")
                .is_some_and(|u| u.starts_with("curl"))
        })
        .count()
}

#[test]
fn a_fresh_index_is_served_again_filtered_without_a_trip_to_the_registry() {
    let l = run_lab("packages::cache::fresh_index");
    for (name, cc) in [
        ("ic-kept", "public, max-age=300"),
        ("ic-nostore", "no-store"),
    ] {
        for (v, age) in [("1.0.0", OLD), ("2.0.0", OLD), ("2.1.0", YOUNG)] {
            l.reg().publish(Eco::Npm, name, v, age, &[]);
        }
        l.reg()
            .set_cache_control("registry.npmjs.org", &format!("/{name}"), cc);
    }
    let policy = gated(&set("npm-lab", "npm", &["ic-kept", "ic-nostore"]));
    let script = [
        fetch("first", "ic-kept", ""),
        fetch("again", "ic-kept", ""),
        // The client asks for the registry's answer.
        fetch("fresh", "ic-kept", "-H 'Cache-Control: max-age=0'"),
        // Another form is another document.
        fetch(
            "abbr",
            "ic-kept",
            "-H 'Accept: application/vnd.npm.install-v1+json'",
        ),
        // A request with credentials is neither answered from nor kept.
        fetch("authed", "ic-kept", "-H 'Authorization: Bearer t'"),
        fetch("ns1", "ic-nostore", ""),
        fetch("ns2", "ic-nostore", ""),
    ]
    .concat();
    let r = l.run(&policy, &script);
    assert_eq!(r.code, 0, "{}", ctx(&r));
    // Every answer filtered: 2.1.0 is younger than min_age.
    for tag in ["first", "again", "fresh", "abbr", "authed", "ns1", "ns2"] {
        assert!(
            r.stdout.contains(&format!("{tag} ['1.0.0', '2.0.0'] age=")),
            "{tag}\n{}",
            ctx(&r)
        );
    }
    // Only "again" came from the cache: four trips for ic-kept, two for
    // the document the registry said not to store.
    assert_eq!(client_trips(l, "ic-kept"), 4, "{}", ctx(&r));
    assert_eq!(client_trips(l, "ic-nostore"), 2, "{}", ctx(&r));
    assert!(
        r.stdout.contains("first ['1.0.0', '2.0.0'] age=-"),
        "{}",
        ctx(&r)
    );
    assert!(
        r.stdout.contains("again ['1.0.0', '2.0.0'] age=0")
            || r.stdout.contains("again ['1.0.0', '2.0.0'] age=1"),
        "{}",
        ctx(&r)
    );
    // Each request still its own decision and line; the cached answer's
    // line says where it came from and names no upstream address.
    let lines: Vec<Value> = r
        .log_lines()
        .into_iter()
        .filter(|l| l["package"]["name"] == "ic-kept" && l["origin"] != "egressd")
        .collect();
    assert_eq!(lines.len(), 5, "{lines:#?}");
    let cached: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["note"]
                .as_str()
                .is_some_and(|n| n.contains("answered from egressd's cache"))
        })
        .collect();
    assert_eq!(cached.len(), 1, "{lines:#?}");
    assert_eq!(cached[0]["decision"], "allow");
    assert_eq!(cached[0]["status"], 200);
    assert_eq!(
        cached[0]["package"]["versions_hidden"], 1,
        "{:#}",
        cached[0]
    );
    assert!(cached[0]["addr"].is_null(), "{:#}", cached[0]);

    // An exception that injects a credential: its answers are neither
    // kept nor served from a copy, even when the registry allows it.
    let npm = "  - id: npm\n";
    let injecting = policy.replacen(
        npm,
        &format!("{npm}    inject:\n      headers: {{ X-Registry-Key: \"k-1\" }}\n"),
        1,
    );
    assert_ne!(injecting, policy, "the npm exception is in the policy");
    let before = client_trips(l, "ic-kept");
    let r = l.run(
        &injecting,
        &[fetch("inj1", "ic-kept", ""), fetch("inj2", "ic-kept", "")].concat(),
    );
    assert_eq!(r.code, 0, "{}", ctx(&r));
    assert!(
        r.stdout.contains("inj2 ['1.0.0', '2.0.0'] age=-"),
        "{}",
        ctx(&r)
    );
    assert_eq!(client_trips(l, "ic-kept") - before, 2, "{}", ctx(&r));
}
