//! The deployment files agree with the code and with each other: the
//! Kubernetes ConfigMap is the shipped policy, the PrometheusRule is the
//! rules file, every metric that alerts and the dashboard use is one
//! egressd exports, ports line up from Dockerfile to NetworkPolicy, the
//! Dockerfile's HEALTHCHECK works against a running egressd, and — where the
//! tools are installed — promtool checks and unit-tests the rules (and the
//! dashboard's queries) and systemd-analyze verifies the unit. A missing
//! tool fails the test with the command that installs it.

use std::collections::BTreeSet;
use std::fs;
use std::process::{Command, Stdio};

use serde_yaml_ng::Value;

use crate::support::{egressd, root, scratch, tool};

fn read(p: &str) -> String {
    fs::read_to_string(root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn yaml_docs(p: &str) -> Vec<Value> {
    let text = read(p);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{p}: {e}")))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The metric names src/metrics.rs registers, and which are histograms.
fn exported_metrics() -> (BTreeSet<String>, BTreeSet<String>) {
    let src = read("src/metrics.rs");
    let mut names = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find("\"egressd_") {
        let tail = &rest[i + 1..];
        let end = tail.find('"').unwrap();
        let name = &tail[..end];
        if name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            // HistogramOpts::new("name", …) registers a histogram.
            if rest[..i].trim_end().ends_with("HistogramOpts::new(") {
                histograms.insert(name.to_string());
            }
            names.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    assert!(names.len() >= 12, "{names:?}");
    assert!(histograms.contains("egressd_request_duration_seconds"));
    (names, histograms)
}

/// Every `egressd_…` token in `text`.
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(j) = text[i..].find("egressd_") {
        let start = i + j;
        let prev_ok = start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_lowercase() || b[end] == b'_') {
            end += 1;
        }
        if prev_ok {
            out.insert(text[start..end].to_string());
        }
        i = end.max(start + 1);
    }
    out
}

#[test]
fn every_metric_alerts_and_dashboards_use_is_exported() {
    let (names, histograms) = exported_metrics();
    let known = |m: &str| {
        names.contains(m)
            || ["_bucket", "_sum", "_count"].iter().any(|s| {
                m.strip_suffix(s)
                    .is_some_and(|base| histograms.contains(base))
            })
    };
    for f in [
        "deploy/prometheus/egressd.rules.yml",
        "deploy/kubernetes/prometheusrule.yaml",
        "deploy/grafana/egressd-dashboard.json",
    ] {
        let used = metric_tokens(&read(f));
        assert!(!used.is_empty(), "{f} names no metric");
        for m in &used {
            assert!(known(m), "{f}: {m} is not a metric src/metrics.rs exports");
        }
    }
}

#[test]
fn alert_rules_cover_the_issue() {
    let rules = &yaml_docs("deploy/prometheus/egressd.rules.yml")[0];
    let alerts: BTreeSet<&str> = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    for a in [
        "EgressdExceptionExpiringSoon",
        "EgressdExceptionUnused",
        "EgressdPolicyReloadFailed",
        "EgressdDnsTunnelSuspected",
        "EgressdLogSinkFailing",
        "EgressdDenySpike",
    ] {
        assert!(alerts.contains(a), "{a} missing: {alerts:?}");
    }
    let op = &yaml_docs("deploy/kubernetes/prometheusrule.yaml")[0];
    assert_eq!(
        op["spec"]["groups"], rules["groups"],
        "deploy/kubernetes/prometheusrule.yaml differs from deploy/prometheus/egressd.rules.yml"
    );
}

#[test]
fn dashboard_is_importable_json() {
    let d: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/egressd-dashboard.json")).unwrap();
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id");
        assert!(p["gridPos"]["w"].as_u64().unwrap() > 0);
        if p["type"] != "row" {
            // A datasource variable, never a UID from someone's Grafana.
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            assert!(!p["targets"].as_array().unwrap().is_empty());
        }
    }
    let titles: String = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap().to_lowercase())
        .collect::<Vec<_>>()
        .join("|");
    for want in [
        "protocol", "reason", "hits", "last use", "stale", "expiring", "tunnel", "reload",
        "latency", "package",
    ] {
        assert!(titles.contains(want), "no panel about {want}: {titles}");
    }
}

/// `promtool check rules` and `promtool test rules` on the shipped files,
/// and every dashboard query parsed by promtool as a recording rule.
#[test]
fn promtool_checks_rules_and_dashboard_queries() {
    let promtool = tool("promtool");
    let dir = root().join("deploy/prometheus");
    let run = |args: &[&str]| {
        let o = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run(&["check", "rules", "egressd.rules.yml"]);
    run(&[
        "test",
        "rules",
        "egressd.rules.test.yml",
        "egressd.rules.stale.test.yml",
    ]);
    let d: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/egressd-dashboard.json")).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut n = 0;
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m")
                .replace("$__range", "1d");
            n += 1;
            rules.push_str(&format!(
                "      - record: dashboard:q{n}\n        expr: {}\n",
                serde_json::to_string(&expr).unwrap()
            ));
        }
    }
    let tmp = scratch();
    let f = tmp.path("dashboard.rules.yml");
    fs::write(&f, rules).unwrap();
    run(&["check", "rules", f.to_str().unwrap()]);
}

#[test]
fn configmap_is_the_shipped_policy_and_passes_check() {
    let cm = &yaml_docs("deploy/kubernetes/policy-configmap.yaml")[0];
    assert_eq!(cm["kind"], "ConfigMap");
    let data = cm["data"].as_mapping().unwrap();
    let tmp = scratch();
    let mut keys = BTreeSet::new();
    for (k, v) in data {
        let k = k.as_str().unwrap();
        let shipped = read(&format!("policy/{k}"));
        assert_eq!(
            v.as_str().unwrap(),
            shipped,
            "policy-configmap.yaml key {k} differs from policy/{k}: regenerate it (see its header)"
        );
        fs::write(tmp.path(k), v.as_str().unwrap()).unwrap();
        keys.insert(k.to_string());
    }
    for f in fs::read_dir(root().join("policy")).unwrap() {
        let name = f.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && !name.starts_with("tests") {
            assert!(
                keys.contains(&name),
                "policy/{name} is missing from the ConfigMap"
            );
        }
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = egressd::cmd::check::run_check(tmp.dir(), &mut out, &mut err);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
}

/// The ports, from the Dockerfile's environment to the NetworkPolicies.
#[test]
fn ports_agree_from_dockerfile_to_networkpolicy() {
    let docker = read("Dockerfile");
    for want in [
        "EGRESSD_LISTEN=0.0.0.0:3128",
        "EGRESSD_DNS_LISTEN=0.0.0.0:8053",
        "EGRESSD_METRICS_LISTEN=0.0.0.0:9464",
        "EXPOSE 3128/tcp 8053/udp 8053/tcp 9464/tcp",
        "cargo build --locked --release",
        "USER 10001:10001",
        "/healthz",
    ] {
        assert!(docker.contains(want), "Dockerfile lacks {want:?}");
    }
    let dep = &yaml_docs("deploy/kubernetes/deployment.yaml")[0];
    let spec = &dep["spec"]["template"]["spec"];
    assert!(dep["spec"]["replicas"].as_u64().unwrap() >= 2);
    let c = &spec["containers"][0];
    let env: Vec<(String, String)> = c["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let port_of = |var: &str| -> u64 {
        let v = &env.iter().find(|(k, _)| k == var).unwrap().1;
        assert!(v.starts_with("0.0.0.0:"), "{var}={v}");
        v.rsplit(':').next().unwrap().parse().unwrap()
    };
    let container: Vec<(String, u64, String)> = c["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["containerPort"].as_u64().unwrap(),
                p["protocol"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let named = |n: &str| container.iter().find(|p| p.0 == n).unwrap().1;
    assert_eq!(named("proxy"), port_of("EGRESSD_LISTEN"));
    assert_eq!(named("dns-udp"), port_of("EGRESSD_DNS_LISTEN"));
    assert_eq!(named("dns-tcp"), port_of("EGRESSD_DNS_LISTEN"));
    assert_eq!(named("metrics"), port_of("EGRESSD_METRICS_LISTEN"));
    // The ConfigMap is mounted as a directory where EGRESSD_POLICY points.
    let mount = &c["volumeMounts"][0];
    assert!(
        mount.get("subPath").is_none(),
        "subPath mounts never update"
    );
    assert_eq!(
        mount["mountPath"].as_str().unwrap(),
        env.iter().find(|(k, _)| k == "EGRESSD_POLICY").unwrap().1
    );
    assert_eq!(spec["volumes"][0]["configMap"]["name"], "egressd-policy");
    // Services point at named container ports.
    for svc in yaml_docs("deploy/kubernetes/services.yaml") {
        // A sandbox meets one replica: its grant uses and budgets are exact.
        if svc["metadata"]["name"] != "egressd-metrics" {
            assert_eq!(svc["spec"]["sessionAffinity"], "ClientIP", "{svc:?}");
        }
        for p in svc["spec"]["ports"].as_sequence().unwrap() {
            let t = p["targetPort"].as_str().unwrap();
            assert!(container.iter().any(|c| c.0 == t), "targetPort {t}");
        }
    }
    // NetworkPolicies name the container ports (they match after the Service's translation).
    let nps = yaml_docs("deploy/kubernetes/networkpolicies.yaml");
    let mut np_ports = BTreeSet::new();
    for np in &nps {
        for dir in ["ingress", "egress"] {
            for rule in np["spec"][dir].as_sequence().into_iter().flatten() {
                for p in rule["ports"].as_sequence().into_iter().flatten() {
                    np_ports.insert(p["port"].as_u64().unwrap());
                }
            }
        }
    }
    for p in [3128, 8053, 9464, 53] {
        assert!(np_ports.contains(&p), "no NetworkPolicy rule for port {p}");
    }
    let sandbox_egress = nps
        .iter()
        .find(|n| {
            n["metadata"]["namespace"] == "agent-sandboxes" && n["spec"]["egress"].is_sequence()
        })
        .expect("a sandbox egress policy");
    let rules = sandbox_egress["spec"]["egress"].as_sequence().unwrap();
    assert_eq!(rules.len(), 1, "sandboxes reach egressd only");
    assert!(rules[0]["to"][0]["ipBlock"].is_null());
}

/// Runs the Dockerfile's HEALTHCHECK command against a real `egressd serve`,
/// then against nothing.
#[test]
fn dockerfile_healthcheck_probes_healthz() {
    let docker = read("Dockerfile");
    let line = docker
        .lines()
        .find(|l| l.trim_start().starts_with("CMD [\"bash\""))
        .expect("HEALTHCHECK CMD");
    let argv: Vec<String> =
        serde_json::from_str(line.trim_start().trim_start_matches("CMD ")).unwrap();
    assert_eq!(argv[..2], ["bash", "-c"]);
    let bash = tool("bash");
    // The shipped policy, and nothing from the test's environment.
    let e = egressd()
        .policy_path(&root().join("policy"))
        .log("/dev/null")
        .clean_env()
        .start();
    let probe = |addr: &str| {
        Command::new(&bash)
            .args(&argv[1..])
            .env("EGRESSD_METRICS_LISTEN", addr)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    let addr = e.metrics.to_string();
    let healthy = probe(&addr);
    drop(e);
    assert!(
        healthy,
        "HEALTHCHECK failed against a running egressd at {addr}"
    );
    assert!(!probe(&addr), "HEALTHCHECK passed with nothing listening");
}

#[test]
fn systemd_unit_verifies() {
    let unit = read("deploy/systemd/egressd.service");
    for want in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=\n",
        "SystemCallFilter=@system-service",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(unit.contains(want), "unit lacks {want:?}");
    }
    let analyze = tool("systemd-analyze");
    // verify wants ExecStart to exist: point it at the binary under test.
    let tmp = scratch();
    let f = tmp.path("egressd.service");
    fs::write(
        &f,
        unit.replace("/usr/local/bin/egressd", env!("CARGO_BIN_EXE_egressd")),
    )
    .unwrap();
    let o = Command::new(analyze)
        .arg("verify")
        .arg(&f)
        .current_dir(tmp.dir())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    // Unknown keys are only warnings to systemd: any output is a failure here.
    assert!(
        o.status.success() && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
}
