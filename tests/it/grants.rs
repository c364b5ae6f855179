//! Grants (issue #39, DESIGN "Grants: the friction loop"), against a running
//! egressd with real curl: a denial's request id, `egressd grant` turning it
//! into a grant file that serve picks up, the grant's uses counted exactly
//! (under racing clients, across a restart), its TTL ending it without a
//! reload, revocation, the ceiling, tampered grant files, the report.
//!
//! Grants carry no `cidrs`, so they never reach a private address: the lab
//! (whose names resolve to loopback) runs with `private_destinations: allow`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use serde_json::Value;

use crate::forward::sha256_hex;
use crate::support::*;

const A_TOKEN: &str = "a-token";
const B_TOKEN: &str = "b-token";

fn base() -> PolicyYaml {
    policy()
        .setting("private_destinations", "allow")
        .client_token("agent-a", &sha256_hex(A_TOKEN.as_bytes()))
        .client_token("agent-b", &sha256_hex(B_TOKEN.as_bytes()))
}

/// A request through egressd by real curl: its status, its
/// `X-Egressd-Request`, its body.
struct Curl {
    status: u16,
    request: Option<String>,
    reason: Option<String>,
    body: String,
}

fn curl(e: &Egressd, url: &str, token: Option<&str>) -> Curl {
    let mut c = Command::new(tool("curl"));
    c.args(["-sS", "-i", "--max-time", "10", "--noproxy", ""])
        .arg("-x")
        .arg(format!("http://{}", e.proxy));
    if let Some(t) = token {
        c.arg("--proxy-user").arg(format!("agent:{t}"));
    }
    let out = c.arg(url).output().expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let a = curl_answer(&text)
        .unwrap_or_else(|| panic!("no status from curl: {text:?} {:?}", out.stderr));
    Curl {
        status: a.status,
        request: a.header("x-egressd-request"),
        reason: a.header("x-egressd-reason"),
        body: a.body.to_string(),
    }
}

/// Runs `egressd grant ARGS` against `e`'s policy and log.
fn grant_cmd(policy: &Path, log: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("grant")
        .args(args)
        .arg("--policy")
        .arg(policy)
        .arg("--log")
        .arg(log)
        .env_remove("EGRESSD_POLICY")
        .env_remove("EGRESSD_GRANTS")
        .env_remove("EGRESSD_LOG")
        .env("USER", "reviewer")
        .output()
        .expect("egressd grant runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn grant(e: &Egressd, args: &[&str]) -> (bool, String, String) {
    grant_cmd(&e.policy_dir, &e.log_path, args)
}

/// The grant id `egressd grant` printed (`granted g-…: …`).
fn granted_id(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("granted "))
        .and_then(|l| l.split(':').next())
        .unwrap_or_else(|| panic!("no grant in {out:?}"))
        .to_string()
}

/// Waits until serve's grants are, by state, `active`, `used_up`, `expired`.
fn wait_grants(e: &Egressd, active: u64, used_up: u64, expired: u64) {
    eventually("the grants to reload", || {
        let t = e.metrics_text();
        let n = |s: &str| metric_value(&t, &format!("egressd_grants{{state=\"{s}\"}}"));
        (n("active") == Some(active as f64)
            && n("used_up") == Some(used_up as f64)
            && n("expired") == Some(expired as f64))
        .then_some(())
    });
}

/// The deny line of request `id`, once it is written.
fn line_of(e: &Egressd, id: &str) -> Value {
    e.wait_line(&format!("the line of {id}"), |l| l["id"] == id)
}

#[test]
fn a_granted_request_passes_its_uses_for_its_client_then_is_denied_again() {
    let l = lab().names(&["api.test"]).start(|_| base());
    let (e, port) = (&l.e, l.port());
    let url = format!("http://api.test:{port}/v1/items");

    // The denial names its request: header, text body, log line.
    let denied = curl(e, &url, Some(A_TOKEN));
    assert_eq!(
        (denied.status, denied.reason.as_deref()),
        (403, Some("no_exception"))
    );
    let id = denied.request.clone().expect("X-Egressd-Request");
    assert_eq!(id.len(), 12, "{id}");
    assert!(
        denied.body.contains(&format!("# request {id}")),
        "{}",
        denied.body
    );
    assert!(
        denied.body.contains(&format!("egressd grant {id} --ttl")),
        "{}",
        denied.body
    );
    let line = line_of(e, &id);
    assert_eq!(
        (line["decision"].as_str(), line["client"].as_str()),
        (Some("deny"), Some("agent-a"))
    );
    // JSON answers carry it as "request".
    let json = e.request(&format!(
        "GET {url} HTTP/1.1\r\nHost: api.test:{port}\r\nAccept: application/json\r\n\
         Proxy-Authorization: Basic YWdlbnQ6YS10b2tlbg==\r\nConnection: close\r\n\r\n"
    ));
    let body: Value = serde_json::from_slice(&json.body).unwrap();
    assert_eq!(body["request"].as_str(), json.header("x-egressd-request"));

    let (ok, out, err) = grant(
        e,
        &[
            &id,
            "--ttl",
            "1h",
            "--uses",
            "2",
            "--owner",
            "data-team",
            "--reason",
            "fetch the items for task 7",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains(&format!("api.test:{port}")), "{out}");
    assert!(out.contains("to client agent-a"), "{out}");
    let gid = granted_id(&out);
    let file = e.policy_dir.join("grants").join(format!("{gid}.yaml"));
    let text = std::fs::read_to_string(&file).unwrap();
    for want in [
        "owner: \"data-team\"",
        "clients: [\"agent-a\"]",
        &format!("ports: [{port}]"),
        &format!("from_request: \"{id}\""),
        "granted_by: \"reviewer\"",
        "max_uses: 2",
    ] {
        assert!(text.contains(want), "{want} not in {text}");
    }
    assert!(!text.contains("cidrs"), "{text}");
    wait_grants(e, 1, 0, 0);

    // Another client stays denied (and takes no use).
    let b = curl(e, &url, Some(B_TOKEN));
    assert_eq!(
        (b.status, b.reason.as_deref()),
        (403, Some("client_not_allowed"))
    );
    // The client granted passes twice, each line naming the grant.
    for n in 1..=2 {
        let r = curl(e, &url, Some(A_TOKEN));
        assert_eq!(r.status, 200, "use {n}: {}", r.body);
    }
    let third = curl(e, &url, Some(A_TOKEN));
    assert_eq!(
        (third.status, third.reason.as_deref()),
        (403, Some("grant_used_up"))
    );
    let lines = complete_lines(e);
    let by_grant: Vec<&Value> = lines
        .iter()
        .filter(|l| l["grant"] == gid.as_str())
        .collect();
    assert_eq!(by_grant.len(), 2, "{lines:#?}");
    assert!(by_grant
        .iter()
        .all(|l| l["decision"] == "allow" && l["exception"] == gid.as_str()));
    wait_grants(e, 0, 1, 0);
    assert_eq!(e.metric("egressd_grant_uses_total"), Some(2.0));

    let (ok, list, err) = grant(e, &["--list"]);
    assert!(ok, "{err}");
    assert!(list.contains(&format!("{gid}  used_up")), "{list}");
    assert!(list.contains("uses 2/2"), "{list}");

    // Promoted: the permanent exception, owner and reason filled, no expiry.
    let (ok, promoted, err) = grant(e, &["--promote", &gid]);
    assert!(ok, "{err}");
    assert!(promoted.contains("owner: \"data-team\""), "{promoted}");
    assert!(
        promoted.contains("reason: \"fetch the items for task 7\""),
        "{promoted}"
    );
    assert!(
        !promoted.contains("expires") && !promoted.contains("grant:"),
        "{promoted}"
    );
    let reviewed = e.dir.path().join("reviewed");
    std::fs::create_dir(&reviewed).unwrap();
    std::fs::write(reviewed.join("p.yaml"), base().yaml()).unwrap();
    std::fs::write(reviewed.join("promoted.yaml"), &promoted).unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("check")
        .arg(&reviewed)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    // The report's grants section, from this log.
    let report = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["report", "--policy"])
        .arg(&e.policy_dir)
        .arg(&e.log_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("== Grants (1: 0 active, 1 used up, 0 expired, 0 unused)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{gid}  used_up  api.test:{port}  uses 2/2")),
        "{text}"
    );
    assert!(
        text.contains(&format!("1. api.test:{port}  1 grant")),
        "{text}"
    );
    l.assert_clean(&["api.test"]);
}

#[test]
fn a_grant_ends_at_its_ttl_without_a_reload() {
    let l = lab().names(&["api.test"]).start(|_| base());
    let (e, port) = (&l.e, l.port());
    let url = format!("http://api.test:{port}/");
    let id = curl(e, &url, Some(A_TOKEN)).request.unwrap();
    line_of(e, &id);
    let (ok, out, err) = grant(e, &[&id, "--ttl", "6s", "--owner", "o", "--reason", "r"]);
    assert!(ok, "{err}");
    let gid = granted_id(&out);
    wait_grants(e, 1, 0, 0);
    let reloads = e.metric("egressd_policy_reloads_total{result=\"ok\"}");
    let file =
        std::fs::read_to_string(e.policy_dir.join("grants").join(format!("{gid}.yaml"))).unwrap();
    let expires = file
        .lines()
        .find_map(|l| l.trim().strip_prefix("expires: "))
        .unwrap()
        .to_string();
    assert_eq!(curl(e, &url, Some(A_TOKEN)).status, 200);
    // Polled, bounded: the state change is what is asserted.
    let end = Instant::now() + Duration::from_secs(15);
    let denied = loop {
        let r = curl(e, &url, Some(A_TOKEN));
        if r.status != 200 {
            break r;
        }
        assert!(Instant::now() < end, "the grant outlived its TTL");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        (denied.status, denied.reason.as_deref()),
        (403, Some("exception_expired"))
    );
    let line = line_of(e, denied.request.as_deref().unwrap());
    let ts = line["ts"].as_str().unwrap();
    assert!(
        ts[..19] >= expires[..19],
        "denied at {ts}, before expiry {expires}"
    );
    // No reload took it away: the clock did.
    assert_eq!(
        e.metric("egressd_policy_reloads_total{result=\"ok\"}"),
        reloads
    );
    wait_grants(e, 0, 0, 1);
}

#[test]
fn the_ceiling_refuses_naming_the_rule_and_writes_nothing() {
    let l = lab()
        .names(&["api.test", "blocked.test", "sub.vault.test"])
        .start(|_| {
            base().setting(
                "grants",
                "{ max_ttl: 2h, max_uses: 5, never: [blocked.test, vault.test] }",
            )
        });
    let (e, port) = (&l.e, l.port());
    let id_of = |url: &str| {
        let id = curl(e, url, Some(A_TOKEN)).request.unwrap();
        line_of(e, &id);
        id
    };
    let api = id_of(&format!("http://api.test:{port}/"));
    let blocked = id_of(&format!("http://blocked.test:{port}/"));
    let below = id_of(&format!("http://sub.vault.test:{port}/"));
    let metadata = id_of("http://169.254.169.254/latest/meta-data/");
    let cases: [(&str, &[&str], &str); 6] = [
        (&blocked, &["--ttl", "1h", "--uses", "1"], "(never)"),
        (&below, &["--ttl", "1h", "--uses", "1"], "(never)"),
        (
            &metadata,
            &["--ttl", "1h", "--uses", "1"],
            "(private_destination)",
        ),
        (&api, &["--ttl", "3h", "--uses", "1"], "(max_ttl)"),
        (&api, &["--ttl", "1h", "--uses", "6"], "(max_uses)"),
        (&api, &["--ttl", "1h"], "(max_uses)"),
    ];
    for (id, extra, rule) in cases {
        let mut args = vec![id, "--owner", "o", "--reason", "r"];
        args.extend_from_slice(extra);
        let (ok, out, err) = grant(e, &args);
        assert!(!ok, "granted {id} {extra:?}: {out}");
        assert!(err.contains(rule), "{rule} not named: {err}");
        let grants = e.policy_dir.join("grants");
        let written = std::fs::read_dir(&grants).map_or(0, |d| d.count());
        assert_eq!(written, 0, "{rule}: something was written");
    }
    let (ok, _, err) = grant(
        e,
        &[
            &api, "--ttl", "2h", "--uses", "5", "--owner", "o", "--reason", "r",
        ],
    );
    assert!(ok, "at the ceiling is allowed: {err}");
}

#[test]
fn a_tampered_grant_file_is_refused_and_the_last_good_policy_serves() {
    let l = lab().names(&["api.test"]).start(|_| base());
    let (e, port) = (&l.e, l.port());
    let url = format!("http://api.test:{port}/");
    let id = curl(e, &url, Some(A_TOKEN)).request.unwrap();
    line_of(e, &id);
    let (ok, out, err) = grant(e, &[&id, "--ttl", "1h", "--owner", "o", "--reason", "r"]);
    assert!(ok, "{err}");
    let gid = granted_id(&out);
    wait_grants(e, 1, 0, 0);
    let file = e.policy_dir.join("grants").join(format!("{gid}.yaml"));
    let good = std::fs::read_to_string(&file).unwrap();
    let hosts_line = good.lines().count();
    let tampered = [
        (
            good.replace("    hosts:", "    cidrs: [\"127.0.0.0/8\"]\n    hosts:"),
            "(cidrs)",
        ),
        (
            good.replace("[\"api.test\"]", "[\"*.api.test\"]"),
            "(wildcard)",
        ),
        (
            good.replace(
                "    hosts:",
                "    inject: { headers: { X-Key: k } }\n    hosts:",
            ),
            "(inject)",
        ),
        (good.replacen("expires: 20", "expires: 21", 1), "(max_ttl)"),
        (
            format!("{good}  - id: extra\n    owner: o\n    reason: r\n    hosts: [api.test]\n"),
            "exactly one exception",
        ),
    ];
    for (n, (text, why)) in tampered.iter().enumerate() {
        atomic_write(&file, text);
        eventually(&format!("tampered file {n} refused"), || {
            (e.metric("egressd_policy_reloads_total{result=\"error\"}") == Some(n as f64 + 1.0))
                .then_some(())
        });
        // The reason (stderr is read by a thread: it may trail the metric).
        let stderr = eventually(&format!("{why} named"), || {
            let t = e.stderr_text();
            t.matches(why).count().gt(&0).then_some(t)
        });
        assert!(stderr.contains(&format!("{}:", file.display())), "{stderr}");
        // The last good policy, with the grant as it was, keeps serving.
        let r = curl(e, &url, Some(A_TOKEN));
        assert_eq!(r.status, 200, "after tampering {n}: {}", r.body);
    }
    // Each refusal is located: file:line:column, a real line of the file.
    let stderr = e.stderr_text();
    let located = stderr
        .match_indices(&format!("{}:", file.display()))
        .all(|(i, m)| {
            let rest = &stderr[i + m.len()..];
            let line: String = rest.chars().take_while(char::is_ascii_digit).collect();
            line.parse::<usize>()
                .is_ok_and(|n| n >= 1 && n <= hosts_line + 2)
        });
    assert!(located, "{stderr}");
    // `grant:` outside the grants directory is refused too.
    let errors = e
        .metric("egressd_policy_reloads_total{result=\"error\"}")
        .unwrap();
    atomic_write(&file, &good);
    std::fs::write(
        e.policy_dir.join("forged.yaml"),
        good.replace(&gid, "forged"),
    )
    .unwrap();
    eventually("a forged grant refused", || {
        (e.metric("egressd_policy_reloads_total{result=\"error\"}") > Some(errors)).then_some(())
    });
    eventually("the forged grant's refusal named", || {
        e.stderr_text()
            .contains("only files of the grants directory")
            .then_some(())
    });
    assert_eq!(curl(e, &url, Some(A_TOKEN)).status, 200);
}

#[test]
fn eight_racing_requests_for_three_uses_get_three_and_the_count_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let policy_dir = dir.path().join("policy");
    std::fs::create_dir(&policy_dir).unwrap();
    std::fs::write(policy_dir.join("p.yaml"), base().yaml()).unwrap();
    let log = dir.path().join("decisions.log");
    let mut l = lab()
        .names(&["api.test"])
        .egressd(|b| b.log(&log.display().to_string()))
        .start_with(|_, b| b.policy_path(&policy_dir));
    let port = l.port();
    let url = format!("http://api.test:{port}/race");
    let id = curl(&l.e, &url, Some(A_TOKEN)).request.unwrap();
    eventually("the deny line", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains(&id))
    });
    let (ok, out, err) = grant_cmd(
        &policy_dir,
        &log,
        &[
            &id, "--ttl", "1h", "--uses", "3", "--owner", "o", "--reason", "r",
        ],
    );
    assert!(ok, "{err}");
    let gid = granted_id(&out);
    wait_grants(&l.e, 1, 0, 0);
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let e = &l.e;
        let hs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| curl(e, &url, Some(A_TOKEN)).status))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 403).count(),
        5,
        "{statuses:?}"
    );
    let state = policy_dir.join("grants/.state").join(format!("{gid}.uses"));
    assert_eq!(std::fs::read_to_string(&state).unwrap().trim(), "3");

    // A restart: the count is read back, the grant stays used up.
    l.e.signal("KILL");
    let _ = l.e.child.wait();
    l.e = egressd()
        .dns(l.dns.addr)
        .policy_path(&policy_dir)
        .log(&log.display().to_string())
        .start()
        .into();
    wait_grants(&l.e, 0, 1, 0);
    let r = curl(&l.e, &url, Some(A_TOKEN));
    assert_eq!(
        (r.status, r.reason.as_deref()),
        (403, Some("grant_used_up"))
    );
}

#[test]
fn a_revoked_grant_matches_nothing_from_the_next_request() {
    let l = lab().names(&["api.test"]).start(|_| base());
    let (e, port) = (&l.e, l.port());
    let url = format!("http://api.test:{port}/");
    let id = curl(e, &url, Some(A_TOKEN)).request.unwrap();
    line_of(e, &id);
    let (ok, out, err) = grant(e, &[&id, "--ttl", "1h", "--owner", "o", "--reason", "r"]);
    assert!(ok, "{err}");
    let gid = granted_id(&out);
    wait_grants(e, 1, 0, 0);
    assert_eq!(curl(e, &url, Some(A_TOKEN)).status, 200);
    let (ok, out, err) = grant(e, &["--revoke", &gid]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("revoked {gid}")), "{out}");
    assert!(!e
        .policy_dir
        .join("grants")
        .join(format!("{gid}.yaml"))
        .exists());
    wait_grants(e, 0, 0, 0);
    let r = curl(e, &url, Some(A_TOKEN));
    assert_eq!((r.status, r.reason.as_deref()), (403, Some("no_exception")));
    let (ok, _, err) = grant(e, &["--revoke", &gid]);
    assert!(!ok && err.contains("no grant"), "{err}");
}

#[test]
fn a_dns_denial_names_its_request_and_an_unnamed_clients_grant_is_every_clients() {
    let l = lab().names(&["dl.test"]).start(|_| base());
    let e = &l.e;
    let r = ask_udp(e.dns, &dns_query("dl.test", RecordType::A));
    assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    let id = ede_request_id(&r).expect("the EDE names the request");
    let line = line_of(e, &id);
    assert_eq!(
        (line["proto"].as_str(), line["client"].as_str()),
        (Some("dns"), Some("-"))
    );
    let (ok, out, err) = grant(e, &[&id, "--ttl", "1h", "--owner", "o", "--reason", "r"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("to every client: the denied request came from no named client"),
        "{out}"
    );
    wait_grants(e, 1, 0, 0);
    let r = ask_udp(e.dns, &dns_query("dl.test", RecordType::A));
    assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{r:?}");
    assert!(!r.answers.is_empty());
    // A DNS answer takes no use: a grant's uses are requests served.
    assert_eq!(e.metric("egressd_grant_uses_total"), Some(0.0));
}

/// Grants outside the policy (`--grants DIR`, for a read-only policy such
/// as a ConfigMap) are read and watched there.
#[test]
fn grants_in_their_own_directory_are_served() {
    let grants_dir = tempfile::tempdir().unwrap();
    let grants: PathBuf = grants_dir.path().join("grants");
    let l = lab()
        .names(&["api.test"])
        .egressd(|b| b.arg("--grants").arg(&grants.display().to_string()))
        .start(|_| base());
    let (e, port) = (&l.e, l.port());
    let url = format!("http://api.test:{port}/");
    let id = curl(e, &url, Some(A_TOKEN)).request.unwrap();
    line_of(e, &id);
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args([
            "grant", &id, "--ttl", "1h", "--uses", "1", "--owner", "o", "--reason", "r",
        ])
        .arg("--policy")
        .arg(&e.policy_dir)
        .arg("--grants")
        .arg(&grants)
        .arg("--log")
        .arg(&e.log_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!e.policy_dir.join("grants").exists());
    wait_grants(e, 1, 0, 0);
    assert_eq!(curl(e, &url, Some(A_TOKEN)).status, 200);
    assert_eq!(curl(e, &url, Some(A_TOKEN)).status, 403);
    assert!(grants.join(".state").is_dir());
}

/// A fleet (DESIGN "Grants", issue #39 item 6): two egressd replicas, each
/// with its own copy of the policy and grants (as pods mounting one
/// ConfigMap), behind a real HAProxy that pins a client to one replica by
/// source address (`balance source`, as the README documents). The grant's
/// uses are counted by the replica the client meets: through the balancer,
/// exactly N pass.
#[test]
fn fleet_a_client_pinned_by_haproxy_meets_one_replica_and_a_grant_keeps_its_uses() {
    let f = fleet(|_| base().yaml());
    let through = |token: &str| {
        let out = Command::new(tool("curl"))
            .args(["-sS", "-o", "/dev/null", "-D", "-", "--max-time", "10"])
            .arg("-x")
            .arg(format!("http://{}", f.front))
            .arg("--proxy-user")
            .arg(format!("agent:{token}"))
            .arg(format!("http://api.test:{}/", f.origin.addr().port()))
            .output()
            .unwrap();
        let head = String::from_utf8_lossy(&out.stdout).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let id = head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("x-egressd-request:")
                .map(|v| v.trim().to_string())
        });
        (status, id)
    };
    let (status, id) = through(A_TOKEN);
    assert_eq!(status, 403);
    let id = id.unwrap();
    // The replica the balancer chose holds the line.
    let serving = eventually("the deny line on one replica", || {
        (0..2).find(|&i| std::fs::read_to_string(f.log(i)).is_ok_and(|t| t.contains(&id)))
    });
    let (ok, out, err) = grant_cmd(
        &f.policy_dir(serving),
        &f.log(serving),
        &[
            &id, "--ttl", "1h", "--uses", "3", "--owner", "o", "--reason", "r",
        ],
    );
    assert!(ok, "{err}");
    let gid = granted_id(&out);
    // Distributed to every replica through the policy channel.
    let file = format!("grants/{gid}.yaml");
    let text = std::fs::read_to_string(f.policy_dir(serving).join(&file)).unwrap();
    let other = 1 - serving;
    std::fs::create_dir_all(f.policy_dir(other).join("grants")).unwrap();
    atomic_write(&f.policy_dir(other).join(&file), &text);
    for r in &f.replicas {
        wait_grants(r, 1, 0, 0);
    }
    let statuses: Vec<u16> = (0..6).map(|_| through(A_TOKEN).0).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 403, 403, 403],
        "pinned: exactly 3 uses"
    );
    let uses = |r: &Egressd| r.metric("egressd_grant_uses_total").unwrap();
    assert_eq!(
        (uses(&f.replicas[serving]), uses(&f.replicas[other])),
        (3.0, 0.0)
    );
}

/// `egressd grant` run with `args` and nothing from the environment.
fn grant_bare(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("grant")
        .args(args)
        .env_remove("EGRESSD_POLICY")
        .env_remove("EGRESSD_GRANTS")
        .env_remove("EGRESSD_LOG")
        .env_remove("EGRESSD_METRICS_LISTEN")
        .env("USER", "reviewer")
        .output()
        .expect("egressd grant runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The log on stdout (a cluster's pipeline), no file to read it from:
/// `egressd grant ID --from` takes the denied line from the running
/// egressd's recent denials, served on its metrics listener.
#[test]
fn a_grant_from_the_running_egressds_recent_denials_needs_no_log_file() {
    let l = lab()
        .names(&["api.test"])
        .egressd(|b| b.log("-"))
        .start(|_| base());
    let (e, port) = (&l.e, l.port());
    let url = format!("http://api.test:{port}/data");
    let r = curl(e, &url, Some(A_TOKEN));
    assert_eq!(r.status, 403);
    let id = r.request.unwrap();
    assert!(!e.log_path.exists(), "no log file to read");

    // The endpoint: the denial's line, by its id.
    let ask = |q: &str| {
        http_request(
            e.metrics,
            format!("GET /denials{q} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").as_bytes(),
        )
    };
    let got = ask(&format!("?id={id}"));
    assert_eq!(got.status, 200);
    let line: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(
        (&line["id"], &line["client"], &line["reason"], &line["path"]),
        (
            &Value::from(id.as_str()),
            &"agent-a".into(),
            &"no_exception".into(),
            &"/data".into()
        )
    );
    assert_eq!(ask("?id=0000000000ab").status, 404);
    assert_eq!(ask("").status, 400);

    let from = format!("http://{}", e.metrics);
    let policy = e.policy_dir.display().to_string();
    let (ok, out, err) = grant_bare(&[
        &id, "--ttl", "1h", "--uses", "1", "--owner", "o", "--reason", "r", "--policy", &policy,
        "--from", &from,
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("to client agent-a"), "{out}");
    wait_grants(e, 1, 0, 0);
    assert_eq!(curl(e, &url, Some(A_TOKEN)).status, 200);
    let r = curl(e, &url, Some(A_TOKEN));
    assert_eq!(
        (r.status, r.reason.as_deref()),
        (403, Some("grant_used_up"))
    );
    // An id the running egressd does not keep: refused, nothing written.
    let (ok, _, err) = grant_bare(&[
        "0000000000ab",
        "--ttl",
        "1h",
        "--owner",
        "o",
        "--reason",
        "r",
        "--policy",
        &policy,
        "--from",
        &from,
    ]);
    assert!(!ok && err.contains("among the recent denials"), "{err}");
    // No egressd there: said so, and what to give instead.
    let (ok, _, err) = grant_bare(&[
        &id,
        "--ttl",
        "1h",
        "--owner",
        "o",
        "--reason",
        "r",
        "--policy",
        &policy,
        "--from",
        "http://127.0.0.1:9",
    ]);
    assert!(
        !ok && err.contains("cannot reach the running egressd") && err.contains("--log FILE"),
        "{err}"
    );
    let files = std::fs::read_dir(e.policy_dir.join("grants"))
        .unwrap()
        .filter(|f| {
            f.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".yaml")
        })
        .count();
    assert_eq!(files, 1);
}

/// A grants directory egressd cannot write (a ConfigMap, here a read-only
/// bind mount in egressd's own mount namespace): the grant serves, its uses
/// are counted in memory only, and egressd says so once on stderr.
#[test]
fn a_read_only_grants_directory_counts_in_memory_and_says_so() {
    need_root(
        "a_read_only_grants_directory_counts_in_memory_and_says_so",
        "a read-only bind mount in a mount namespace of its own",
    );
    let unshare = tool("unshare").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let grants = dir.path().join("grants");
    std::fs::create_dir(&grants).unwrap();
    let g = grants.display().to_string();
    // Writable first, to grant the denial.
    let l = lab()
        .names(&["api.test"])
        .egressd(|b| b.arg("--grants").arg(&g))
        .start(|_| base());
    let url = format!("http://api.test:{}/", l.port());
    let id = curl(&l.e, &url, Some(A_TOKEN)).request.unwrap();
    line_of(&l.e, &id);
    let policy = l.e.policy_dir.display().to_string();
    let log = l.e.log_path.display().to_string();
    let (ok, out, err) = grant_bare(&[
        &id, "--ttl", "1h", "--uses", "2", "--owner", "o", "--reason", "r", "--policy", &policy,
        "--grants", &g, "--log", &log,
    ]);
    assert!(ok, "{err}");
    let gid = granted_id(&out);
    wait_grants(&l.e, 1, 0, 0);

    let read_only = |dns: std::net::SocketAddr| {
        egressd()
            .dns(dns)
            .policy_path(&l.e.policy_dir)
            .arg("--grants")
            .arg(&g)
            .env("RO", &g)
            .wrap(&[
                &unshare,
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                r#"mount --bind "$RO" "$RO" && mount -o remount,bind,ro "$RO" "$RO" && exec "$0" "$@""#,
            ])
            .start()
    };
    let ro = read_only(l.dns.addr);
    wait_grants(&ro, 1, 0, 0);
    let r = curl(&ro, &url, Some(A_TOKEN));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(curl(&ro, &url, Some(A_TOKEN)).status, 200);
    let r = curl(&ro, &url, Some(A_TOKEN));
    assert_eq!(
        (r.status, r.reason.as_deref()),
        (403, Some("grant_used_up"))
    );
    let said = ro.stderr_text();
    assert_eq!(said.matches("is read-only").count(), 1, "said once: {said}");
    assert!(said.contains("kept in memory only"), "{said}");
    assert!(!said.contains("cannot keep"), "{said}");
    assert!(!grants.join(".state").join(format!("{gid}.uses")).exists());
    // In memory only: a restart counts again from what was kept (nothing).
    drop(ro);
    let ro = read_only(l.dns.addr);
    wait_grants(&ro, 1, 0, 0);
    assert_eq!(curl(&ro, &url, Some(A_TOKEN)).status, 200);
}

/// `--log-format ocsf`: a denial's event carries its request id, `egressd
/// grant` finds it in the OCSF log, and the events the grant allows carry
/// the grant's id; the report reads both back.
#[test]
fn ocsf_events_carry_the_request_id_and_the_grant() {
    let l = lab()
        .names(&["api.test"])
        .egressd(|b| b.arg("--log-format").arg("ocsf"))
        .start(|_| base());
    let (e, port) = (&l.e, l.port());
    let url = format!("http://api.test:{port}/o");
    let id = curl(e, &url, Some(A_TOKEN)).request.unwrap();
    let denied = e.wait_line("the OCSF denial", |v| {
        v["unmapped"]["egressd"]["id"] == id.as_str()
    });
    assert_eq!(denied["disposition_id"], 2);
    // Only the OCSF log can give it: no running egressd at --from.
    let (ok, out, err) = grant_bare(&[
        &id,
        "--ttl",
        "1h",
        "--uses",
        "1",
        "--owner",
        "o",
        "--reason",
        "r",
        "--policy",
        &e.policy_dir.display().to_string(),
        "--log",
        &e.log_path.display().to_string(),
        "--from",
        "http://127.0.0.1:9",
    ]);
    assert!(ok, "{err}");
    let gid = granted_id(&out);
    wait_grants(e, 1, 0, 0);
    assert_eq!(curl(e, &url, Some(A_TOKEN)).status, 200);
    let allowed = e.wait_line("the granted event", |v| {
        v["disposition_id"] == 1 && v["unmapped"]["egressd"]["grant"] == gid.as_str()
    });
    assert_eq!(allowed["policy"]["uid"], gid.as_str());
    // The report reads the grant from the OCSF log: revoked, the grant is
    // known from its use alone.
    let (ok, _, err) = grant_bare(&[
        "--revoke",
        &gid,
        "--policy",
        &e.policy_dir.display().to_string(),
    ]);
    assert!(ok, "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("report")
        .arg("--policy")
        .arg(&e.policy_dir)
        .arg(&e.log_path)
        .env_remove("EGRESSD_POLICY")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("api.test:{port}  1 grant")),
        "{text}"
    );
}
