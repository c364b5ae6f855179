//! `--log-format ocsf`: every decision egressd writes is a valid OCSF 1.8.0
//! event, checked against the schema's own class, object and profile
//! definitions (vendored under tests/data/ocsf/, source named there): the
//! class by `class_uid`, what it and its parents define (extends, includes,
//! profiles listed in `metadata.profiles`), required attributes, no
//! attribute the schema does not define, dictionary types and ranges,
//! integer enum ids and their caption siblings, object constraints, and
//! the uid arithmetic. A real `egressd serve --log-format ocsf` writes such
//! events for HTTP, CONNECT and DNS, and `egressd report` reads them: the
//! same traffic logged in both formats gives the same report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use egressd::policy::{Logged, Mode, Proto, Reason};
use egressd::record::Event;
use hickory_proto::rr::RecordType;
use serde_json::Value;

use crate::attack::{ask_udp, dns_query};
use crate::support::*;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ocsf")
}

fn read_json(rel: &str) -> Value {
    let p = data().join(rel);
    let text = fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (vendor it from the OCSF schema repository, see tests/data/ocsf/README.md)",
            p.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

/// One attribute of a class or object, resolved through the dictionary.
#[derive(Debug, Clone, Default)]
struct Attr {
    requirement: String,
    /// The profile that brings it, if any.
    profile: Option<String>,
    /// A dictionary type (`string_t`) or an object name.
    ty: String,
    is_array: bool,
    /// Enum ids (integer-typed) or values (string-typed), with captions.
    enums: BTreeMap<String, String>,
    sibling: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct Shape {
    attrs: BTreeMap<String, Attr>,
    at_least_one: Vec<String>,
    just_one: Vec<String>,
}

struct Schema {
    dictionary: serde_json::Map<String, Value>,
    types: serde_json::Map<String, Value>,
    objects: HashMap<String, Shape>,
}

impl Schema {
    fn load() -> Schema {
        let d = read_json("dictionary.json");
        Schema {
            dictionary: d["attributes"].as_object().unwrap().clone(),
            types: d["types"]["attributes"].as_object().unwrap().clone(),
            objects: HashMap::new(),
        }
    }

    /// The attributes of a definition file: its parent's, its includes'
    /// (a profile's marked with the profile), then its own, each merged
    /// with the dictionary entry of the same name.
    fn shape(&self, rel: &str, parent_dir: &str) -> Shape {
        let def = read_json(rel);
        let mut shape = match def["extends"].as_str() {
            None | Some("object") => Shape::default(),
            Some(parent) if parent_dir == "objects" => {
                self.shape(&format!("objects/{parent}.json"), "objects")
            }
            Some("base_event") => self.shape("events/base_event.json", "events"),
            Some(parent) => self.shape(&format!("events/network/{parent}.json"), "events"),
        };
        let attrs = def["attributes"].as_object().unwrap();
        for inc in attrs
            .get("$include")
            .and_then(|i| i.as_array())
            .into_iter()
            .flatten()
        {
            let inc = inc.as_str().unwrap();
            let included = read_json(inc);
            let profile = (included["meta"] == "profile")
                .then(|| included["name"].as_str().unwrap().to_string());
            for (name, a) in included["attributes"].as_object().unwrap() {
                self.merge(&mut shape, name, a, profile.clone());
            }
        }
        for (name, a) in attrs {
            if name != "$include" {
                self.merge(&mut shape, name, a, None);
            }
        }
        if let Some(c) = def.get("constraints") {
            let list = |k: &str| -> Vec<String> {
                c.get(k)
                    .and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect()
            };
            shape.at_least_one = list("at_least_one");
            shape.just_one = list("just_one");
        }
        shape
    }

    fn merge(&self, shape: &mut Shape, name: &str, a: &Value, profile: Option<String>) {
        let dict = self
            .dictionary
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not in the vendored dictionary"));
        let entry = shape.attrs.entry(name.to_string()).or_insert_with(|| Attr {
            requirement: "optional".into(),
            profile: profile.clone(),
            ty: dict["type"].as_str().unwrap().to_string(),
            is_array: dict["is_array"].as_bool().unwrap_or(false),
            sibling: dict["sibling"].as_str().map(str::to_string),
            ..Attr::default()
        });
        if let Some(r) = a["requirement"].as_str() {
            entry.requirement = r.to_string();
        }
        for src in [&dict["enum"], &a["enum"]] {
            for (k, v) in src.as_object().into_iter().flatten() {
                entry
                    .enums
                    .insert(k.clone(), v["caption"].as_str().unwrap_or("").to_string());
            }
        }
    }

    fn object(&mut self, name: &str) -> Shape {
        if !self.objects.contains_key(name) {
            let s = self.shape(&format!("objects/{name}.json"), "objects");
            self.objects.insert(name.to_string(), s);
        }
        self.objects[name].clone()
    }

    /// The base type, range and regex-free checks of a dictionary type.
    fn base_type(&self, ty: &str) -> (String, Option<(i64, i64)>) {
        let mut t = ty.to_string();
        let mut range = None;
        for _ in 0..8 {
            let Some(def) = self.types.get(&t) else { break };
            if let Some(r) = def["range"].as_array() {
                range = Some((r[0].as_i64().unwrap(), r[1].as_i64().unwrap()));
            }
            match def["type"].as_str() {
                Some(parent) => t = parent.to_string(),
                None => break,
            }
        }
        (t, range)
    }

    /// Every error in `v` against `shape`, at `at`.
    fn check(
        &mut self,
        shape: &Shape,
        v: &Value,
        at: &str,
        profiles: &BTreeSet<String>,
    ) -> Vec<String> {
        let mut errs = Vec::new();
        let Some(obj) = v.as_object() else {
            return vec![format!("{at}: not an object")];
        };
        for (k, x) in obj {
            let Some(a) = shape.attrs.get(k) else {
                errs.push(format!(
                    "{at}.{k}: not an attribute of this class or object"
                ));
                continue;
            };
            if let Some(p) = &a.profile {
                if !profiles.contains(p) {
                    errs.push(format!(
                        "{at}.{k}: belongs to profile {p}, which metadata.profiles does not list"
                    ));
                }
            }
            if a.is_array {
                match x.as_array() {
                    Some(items) => {
                        for (i, item) in items.iter().enumerate() {
                            errs.extend(self.check_value(
                                a,
                                item,
                                &format!("{at}.{k}[{i}]"),
                                profiles,
                            ));
                        }
                    }
                    None => errs.push(format!("{at}.{k}: not an array")),
                }
            } else {
                errs.extend(self.check_value(a, x, &format!("{at}.{k}"), profiles));
            }
            if let (Some(sib), Some(id)) = (&a.sibling, x.as_i64()) {
                if let (Some(caption), Some(given)) = (a.enums.get(&id.to_string()), obj.get(sib)) {
                    if id != 99 && given.as_str() != Some(caption.as_str()) {
                        errs.push(format!(
                            "{at}.{sib}: {given} is not {k} {id}'s caption {caption:?}"
                        ));
                    }
                }
            }
        }
        for (k, a) in &shape.attrs {
            let applies = a.profile.as_ref().is_none_or(|p| profiles.contains(p));
            if a.requirement == "required" && applies && !obj.contains_key(k) {
                errs.push(format!("{at}.{k}: required"));
            }
        }
        if !shape.at_least_one.is_empty() && !shape.at_least_one.iter().any(|k| obj.contains_key(k))
        {
            errs.push(format!(
                "{at}: needs at least one of {:?}",
                shape.at_least_one
            ));
        }
        if !shape.just_one.is_empty()
            && shape
                .just_one
                .iter()
                .filter(|k| obj.contains_key(*k))
                .count()
                != 1
        {
            errs.push(format!("{at}: needs exactly one of {:?}", shape.just_one));
        }
        errs
    }

    fn check_value(
        &mut self,
        a: &Attr,
        x: &Value,
        at: &str,
        profiles: &BTreeSet<String>,
    ) -> Vec<String> {
        if !a.ty.ends_with("_t") {
            if a.ty == "object" {
                return if x.is_object() {
                    vec![]
                } else {
                    vec![format!("{at}: not an object")]
                };
            }
            let shape = self.object(&a.ty);
            return self.check(&shape, x, at, profiles);
        }
        let (base, range) = self.base_type(&a.ty);
        let ok = match base.as_str() {
            "string_t" => x.is_string(),
            "integer_t" => x.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            "long_t" => x.is_i64() || x.is_u64(),
            "float_t" => x.is_number(),
            "boolean_t" => x.is_boolean(),
            "json_t" => true,
            other => return vec![format!("{at}: unknown base type {other}")],
        };
        if !ok {
            return vec![format!("{at}: {x} is not a {} ({base})", a.ty)];
        }
        let mut errs = Vec::new();
        if let (Some((lo, hi)), Some(n)) = (range, x.as_i64()) {
            if n < lo || n > hi {
                errs.push(format!("{at}: {n} is outside {}'s range {lo}..={hi}", a.ty));
            }
        }
        if a.ty == "ip_t" && x.as_str().unwrap().parse::<IpAddr>().is_err() {
            errs.push(format!("{at}: {x} is not an IP address"));
        }
        if base == "integer_t" && !a.enums.is_empty() && !a.enums.contains_key(&x.to_string()) {
            errs.push(format!(
                "{at}: {x} is not one of the enum ids {:?}",
                a.enums.keys()
            ));
        }
        errs
    }

    /// Every error in one event.
    fn validate(&mut self, ev: &Value) -> Vec<String> {
        let class_uid = ev["class_uid"].as_u64().unwrap_or(0);
        let (file, caption) = match class_uid {
            4001 => ("events/network/network_activity.json", "Network Activity"),
            4002 => ("events/network/http_activity.json", "HTTP Activity"),
            4003 => ("events/network/dns_activity.json", "DNS Activity"),
            other => return vec![format!("class_uid {other} is not one egressd writes")],
        };
        let class = read_json(file);
        let network = read_json("events/network/network.json");
        let categories = read_json("categories.json");
        let category = &categories["attributes"][network["category"].as_str().unwrap()];
        let mut errs = Vec::new();
        let want_class = category["uid"].as_u64().unwrap() * 1000 + class["uid"].as_u64().unwrap();
        if class_uid != want_class {
            errs.push(format!("class_uid {class_uid} is not {want_class}"));
        }
        if ev["category_uid"] != category["uid"] || ev["category_name"] != category["caption"] {
            errs.push(format!("category is not {category}"));
        }
        if ev["class_name"] != caption || class["caption"] != caption {
            errs.push(format!("class_name is not {caption}"));
        }
        let activity = ev["activity_id"].as_u64().unwrap_or(u64::MAX);
        if ev["type_uid"].as_u64() != Some(class_uid * 100 + activity) {
            errs.push(format!(
                "type_uid {} is not class_uid * 100 + activity_id",
                ev["type_uid"]
            ));
        }
        let profiles: BTreeSet<String> = ev["metadata"]["profiles"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str().map(str::to_string))
            .collect();
        let mut shape = self.shape(file, "events");
        // The schema compiler gives each class its own uid and its
        // category's as the enums of these two (the dictionary has only 0).
        for (attr, uid, caption) in [
            ("class_uid", want_class, caption.to_string()),
            (
                "category_uid",
                category["uid"].as_u64().unwrap(),
                category["caption"].as_str().unwrap().to_string(),
            ),
        ] {
            if let Some(a) = shape.attrs.get_mut(attr) {
                a.enums.insert(uid.to_string(), caption);
            }
        }
        errs.extend(self.check(&shape, ev, "$", &profiles));
        errs
    }
}

/// Events of every kind egressd writes: each protocol, allowed, denied,
/// report-mode, failed upstream, IPv6, named clients, odd methods, fields
/// missing as they are on malformed input.
fn sample_events() -> Vec<Event> {
    let mut out = Vec::new();
    for proto in Proto::ALL {
        for (i, decision) in [Logged::Allow, Logged::Deny].into_iter().enumerate() {
            for report in [false, true] {
                let src = if i == 0 {
                    "10.8.3.7:51234"
                } else {
                    "[2001:db8::7]:5353"
                };
                let mut ev = Event::new(proto, src.parse().unwrap());
                ev.ts_ms = 1_795_982_400_123 + i as i64;
                ev.decision = decision;
                ev.reason = if decision == Logged::Allow {
                    Reason::Exception
                } else {
                    Reason::PortNotAllowed
                };
                ev.mode = if report { Mode::Report } else { Mode::Enforce };
                ev.exception = Some(Arc::from("pypi"));
                ev.owner = Some(Arc::from("python \"platform\""));
                if report {
                    ev.client = Arc::from("ci-runner");
                }
                match proto {
                    Proto::Dns => {
                        ev.qname = Some("pypi.org".into());
                        ev.qtype = Some("AAAA".into());
                        ev.rcode = Some(
                            if decision == Logged::Allow {
                                "NOERROR"
                            } else {
                                "REFUSED"
                            }
                            .into(),
                        );
                    }
                    _ => {
                        ev.host = Some("pypi.org".into());
                        ev.port = Some(443);
                        ev.addr = Some("151.101.0.223:8443".parse().unwrap());
                        ev.method = Some(
                            if proto == Proto::Connect {
                                "CONNECT"
                            } else {
                                "GET"
                            }
                            .into(),
                        );
                        if proto != Proto::Connect {
                            ev.path = Some("/simple/requests/".into());
                        }
                        ev.status = Some(if decision == Logged::Allow { 200 } else { 403 });
                        ev.bytes_up = 512;
                        ev.bytes_down = 81234;
                    }
                }
                out.push(ev);
            }
        }
    }
    // Malformed input: little is known.
    let mut ev = Event::new(Proto::Http, "127.0.0.1:4000".parse().unwrap());
    ev.set_denied(Reason::Malformed);
    ev.status = Some(400);
    out.push(ev);
    // An upstream failure, a note, an unlisted method, an IP-literal host.
    let mut ev = Event::new(Proto::Tls, "127.0.0.1:4001".parse().unwrap());
    ev.decision = Logged::Allow;
    ev.reason = Reason::Exception;
    ev.host = Some("2001:db8::1".into());
    ev.port = Some(443);
    ev.method = Some("PROPFIND".into());
    ev.path = Some("/dav".into());
    ev.note = Some("intercepted".into());
    ev.error = Some("connect: refused".into());
    out.push(ev);
    let mut ev = Event::new(Proto::Connect, "127.0.0.1:4002".parse().unwrap());
    ev.decision = Logged::Allow;
    ev.reason = Reason::Exception;
    ev.host = Some("example.org".into());
    ev.port = Some(443);
    ev.fail_upstream(egressd::record::UpstreamFailure::Timeout, "no answer");
    out.push(ev);
    // Long-lived connections' open and close lines: a tunnel, and a
    // WebSocket (an HTTP request that became a connection).
    for proto in [Proto::Connect, Proto::Tls] {
        for phase in [egressd::record::Phase::Open, egressd::record::Phase::Close] {
            let mut ev = Event::new(proto, "127.0.0.1:4004".parse().unwrap());
            ev.decision = Logged::Allow;
            ev.reason = Reason::Exception;
            ev.exception = Some(Arc::from("ws"));
            ev.host = Some("ws.example".into());
            ev.port = Some(443);
            ev.addr = Some("127.0.0.1:443".parse().unwrap());
            ev.status = Some(if proto == Proto::Tls { 101 } else { 200 });
            if proto == Proto::Tls {
                ev.method = Some("GET".into());
                ev.path = Some("/socket".into());
            }
            ev.event = Some(phase);
            if phase == egressd::record::Phase::Close {
                ev.bytes_up = 10;
                ev.bytes_down = 20;
            }
            out.push(ev);
        }
    }
    let mut ev = Event::new(Proto::Dns, "127.0.0.1:4003".parse().unwrap());
    ev.qname = Some("x.example".into());
    ev.qtype = Some("TYPE65280".into());
    ev.rcode = Some("SERVFAIL".into());
    ev.set_denied(Reason::UpstreamError);
    out.push(ev);
    out
}

fn ocsf_line(ev: &Event) -> Value {
    let mut b = Vec::new();
    ev.write_ocsf(&mut b);
    assert_eq!(b.iter().filter(|c| **c == b'\n').count(), 1, "one line");
    serde_json::from_slice(&b).unwrap()
}

#[test]
fn every_kind_of_event_is_valid_ocsf() {
    let mut schema = Schema::load();
    let events = sample_events();
    let mut classes = BTreeSet::new();
    for ev in &events {
        let v = ocsf_line(ev);
        let errs = schema.validate(&v);
        assert!(errs.is_empty(), "{errs:#?}\nin {v:#}");
        classes.insert(v["class_uid"].as_u64().unwrap());
    }
    assert_eq!(classes.into_iter().collect::<Vec<_>>(), [4001, 4002, 4003]);
}

/// The validator is not a rubber stamp: each kind of mistake is caught.
#[test]
fn the_validator_refuses_broken_events() {
    let mut schema = Schema::load();
    let good = ocsf_line(&sample_events()[0]);
    type Breakage = Box<dyn Fn(&mut Value)>;
    let broken: Vec<(&str, Breakage)> = vec![
        (
            "required",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("time");
            }),
        ),
        (
            "not an attribute",
            Box::new(|v| v["colour"] = "blue".into()),
        ),
        (
            "not an attribute",
            Box::new(|v| v["src_endpoint"]["colour"] = "blue".into()),
        ),
        ("enum ids", Box::new(|v| v["disposition_id"] = 42.into())),
        ("caption", Box::new(|v| v["disposition"] = "Fine".into())),
        ("is not a", Box::new(|v| v["time"] = "yesterday".into())),
        (
            "range",
            Box::new(|v| v["src_endpoint"]["port"] = 70000.into()),
        ),
        (
            "IP address",
            Box::new(|v| v["src_endpoint"]["ip"] = "ten.eight".into()),
        ),
        (
            "metadata.profiles",
            Box::new(|v| v["metadata"]["profiles"] = serde_json::json!([])),
        ),
        ("type_uid", Box::new(|v| v["type_uid"] = 400100.into())),
        (
            "required",
            Box::new(|v| {
                v["metadata"].as_object_mut().unwrap().remove("product");
            }),
        ),
        (
            "at least one",
            Box::new(|v| v["policy"] = serde_json::json!({"is_applied": true})),
        ),
    ];
    for (want, f) in broken {
        let mut v = good.clone();
        f(&mut v);
        let errs = schema.validate(&v);
        assert!(errs.iter().any(|e| e.contains(want)), "{want}: {errs:?}");
    }
}

fn policy(port: u16) -> String {
    format!(
        "settings:\n  contact: \"#sec\"\nexceptions:\n  - id: origin\n    owner: test-team\n    reason: the local origin\n    hosts: [allowed.test]\n    cidrs: [127.0.0.0/8]\n    ports: [{port}]\n"
    )
}

/// A real egressd writes OCSF for HTTP, CONNECT and DNS decisions, one
/// line each, and `egressd report` reads the log.
#[test]
fn serve_writes_valid_ocsf_that_report_reads() {
    let o = origin();
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    let port = o.addr.port();
    let e = egressd()
        .policy("p.yaml", &policy(port))
        .dns(dns.addr)
        .arg("--log-format")
        .arg("ocsf")
        .start();
    let r = e.get(&format!("http://allowed.test:{port}/x"));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = e.get("http://denied.example/");
    assert_eq!(r.status, 403);
    let r = e.request("CONNECT denied.example:443 HTTP/1.1\r\nHost: denied.example:443\r\n\r\n");
    assert_eq!(r.status, 403);
    let _ = ask_udp(e.dns, &dns_query("allowed.test.", RecordType::A));
    let _ = ask_udp(e.dns, &dns_query("denied.example.", RecordType::A));
    let lines = eventually("five decision lines", || {
        let l = e.log_lines();
        (l.len() >= 5).then_some(l)
    });
    assert_eq!(lines.len(), 5, "{lines:#?}");
    let mut schema = Schema::load();
    for v in &lines {
        let errs = schema.validate(v);
        assert!(errs.is_empty(), "{errs:#?}\nin {v:#}");
    }
    let by = |class: u64, disposition: u64| {
        lines
            .iter()
            .filter(|v| v["class_uid"] == class && v["disposition_id"] == disposition)
            .count()
    };
    assert_eq!(
        (
            by(4002, 1),
            by(4002, 2),
            by(4001, 2),
            by(4003, 1),
            by(4003, 2)
        ),
        (1, 1, 1, 1, 1)
    );
    let allowed = lines
        .iter()
        .find(|v| v["class_uid"] == 4002 && v["disposition_id"] == 1)
        .unwrap();
    assert_eq!(allowed["policy"]["uid"], "origin");
    assert_eq!(allowed["policy"]["group"]["name"], "test-team");
    assert_eq!(allowed["dst_endpoint"]["hostname"], "allowed.test");
    assert_eq!(allowed["http_request"]["url"]["path"], "/x");
    assert_eq!(allowed["http_response"]["code"], 200);
    let refused = lines.iter().find(|v| v["class_uid"] == 4001).unwrap();
    assert_eq!(refused["status_code"], "no_exception");
    assert_eq!(refused["activity_name"], "Refuse");

    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["report", "--format", "json", "--policy"])
        .arg(&e.policy_dir)
        .arg(&e.log_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = report.to_string();
    assert!(text.contains("denied.example"), "{report:#}");
    assert_eq!(report["input"]["unreadable"], 0, "{report:#}");
    assert_eq!(report["input"]["lines"], 5, "{report:#}");
}

/// The same decisions logged in each format make the same report, in
/// every report format, and the same `check --against` replay.
#[test]
fn the_same_traffic_in_both_formats_gives_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let policy_dir = dir.path().join("policy");
    fs::create_dir_all(&policy_dir).unwrap();
    fs::write(
        policy_dir.join("p.yaml"),
        "exceptions:\n  - id: pypi\n    owner: python\n    reason: packages\n    hosts: [pypi.org, files.pythonhosted.org]\n    ports: [443]\n  - id: unused\n    owner: web\n    reason: nobody calls it\n    hosts: [quiet.example.com]\n",
    )
    .unwrap();
    let now = egressd::time::unix_now_millis();
    let mut events = Vec::new();
    for (i, ev) in sample_events().into_iter().enumerate() {
        let mut ev = ev;
        ev.ts_ms = now - 3_600_000 + i as i64 * 1000;
        events.push(ev);
    }
    for i in 0..30u16 {
        let mut ev = Event::new(
            Proto::Connect,
            format!("10.1.0.{}:4{i:03}", i % 7).parse().unwrap(),
        );
        ev.ts_ms = now - 60_000 + i64::from(i);
        ev.host = Some(format!("h{}.denied{}.example", i % 3, i % 5));
        ev.port = Some(443);
        ev.method = Some("CONNECT".into());
        ev.set_denied(Reason::NoException);
        ev.status = Some(403);
        events.push(ev);
    }
    let (mut plain, mut ocsf) = (Vec::new(), Vec::new());
    for ev in &events {
        ev.write_json(&mut plain);
        ev.write_ocsf(&mut ocsf);
    }
    let plain_log = dir.path().join("egressd.log");
    let ocsf_log = dir.path().join("ocsf.log");
    fs::write(&plain_log, &plain).unwrap();
    fs::write(&ocsf_log, &ocsf).unwrap();
    // A log that switched format midway reads as one.
    let mixed_log = dir.path().join("mixed.log");
    let half = plain
        .split(|b| *b == b'\n')
        .take(10)
        .collect::<Vec<_>>()
        .join(&b'\n');
    let mut mixed = half;
    mixed.push(b'\n');
    mixed.extend(
        ocsf.split(|b| *b == b'\n')
            .skip(10)
            .collect::<Vec<_>>()
            .join(&b'\n'),
    );
    fs::write(&mixed_log, &mixed).unwrap();

    let run = |args: &[&str], log: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_egressd"))
            .args(args)
            .arg(log)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let policy_arg = policy_dir.display().to_string();
    // What may differ: when the report was made, how many bytes the log
    // has (OCSF lines are longer), the log's name.
    let json = |log: &Path| {
        let mut v: Value = serde_json::from_str(&run(
            &["report", "--format", "json", "--policy", &policy_arg],
            log,
        ))
        .unwrap();
        v["generated_at"] = Value::Null;
        for k in ["bytes", "days_covered", "files"] {
            v["input"][k] = Value::Null;
        }
        v
    };
    let text = |log: &Path| {
        let t = run(&["report", "--policy", &policy_arg], log);
        t.lines().skip(2).collect::<Vec<_>>().join("\n")
    };
    let want = json(&plain_log);
    assert_eq!(want["input"]["lines"], events.len(), "{want:#}");
    assert_eq!(want["input"]["unreadable"], 0, "{want:#}");
    assert!(want["denied"].as_array().unwrap().len() >= 5, "{want:#}");
    assert_eq!(json(&ocsf_log), want, "report --format json");
    assert_eq!(json(&mixed_log), want, "report --format json, mixed log");
    let want_text = text(&plain_log);
    assert!(want_text.contains("pypi"), "{want_text}");
    assert_eq!(text(&ocsf_log), want_text, "report (text)");

    let against = |log: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_egressd"))
            .args(["check", "--format", "json", "--against"])
            .arg(log)
            .arg(&policy_dir)
            .output()
            .unwrap();
        let mut v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["against"]["logs"] = Value::Null;
        v["against"].clone()
    };
    let want = against(&plain_log);
    assert!(want["replayed"].as_u64().unwrap() > 30, "{want:#}");
    assert_eq!(against(&ocsf_log), want);
}

/// OCSF lines go through the same sink: a log that cannot be written
/// fails closed exactly as with egressd's lines.
#[test]
fn an_unwritable_ocsf_log_fails_closed() {
    let o = origin();
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    let port = o.addr.port();
    let e = egressd()
        .policy("p.yaml", &policy(port))
        .dns(dns.addr)
        .arg("--log-format")
        .arg("ocsf")
        .log("/dev/full")
        .start();
    let url = format!("http://allowed.test:{port}/");
    // Its line cannot be written: the answer is cut, not completed off
    // the record.
    let _ = try_request(
        e.proxy,
        format!("GET {url} HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    eventually("a counted write error", || {
        (e.metric("egressd_log_write_errors_total")? >= 1.0).then_some(())
    });
    let reached = o.count();
    for _ in 0..3 {
        let r = e.get(&url);
        assert_eq!((r.status, r.reason()), (503, Some("log_unavailable")));
    }
    assert_eq!(
        o.count(),
        reached,
        "requests went through while the log was down"
    );
}

/// Report mode relaxes the allowlist only: a tunnel whose ClientHello names
/// another host is closed in either mode. Its CONNECT was answered `200`
/// before the hello was read, and the event says Blocked all the same.
#[test]
fn a_report_mode_sni_mismatch_is_blocked_whatever_the_status() {
    use egressd::proxy::sni::build_client_hello;
    use std::io::{BufReader, Read, Write};

    let echo = echo_on("127.0.0.1".parse().unwrap(), 0);
    let dns = fake_dns();
    dns.set("allowed.test", &["127.0.0.1"]);
    let port = echo.port();
    let p = policy(port).replace("settings:\n", "settings:\n  mode: report\n");
    let e = egressd()
        .policy("p.yaml", &p)
        .dns(dns.addr)
        .arg("--log-format")
        .arg("ocsf")
        .start();
    let mut s = connect(e.proxy);
    write!(s, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    s.write_all(&build_client_hello(Some("evil.test"), false))
        .unwrap();
    let mut back = Vec::new();
    let _ = r.read_to_end(&mut back);
    assert!(back.is_empty(), "the hello reached the echo server");
    let line = eventually("the tunnel's event", || e.log_lines().pop());
    let errs = Schema::load().validate(&line);
    assert!(errs.is_empty(), "{errs:#?}\nin {line:#}");
    assert_eq!(line["status_code"], "sni_mismatch", "{line:#}");
    assert_eq!(line["unmapped"]["egressd"]["mode"], "report", "{line:#}");
    assert_eq!(
        (
            line["action_id"].clone(),
            line["disposition_id"].clone(),
            line["disposition"].clone()
        ),
        (2.into(), 2.into(), "Blocked".into()),
        "{line:#}"
    );
}

/// A long-lived connection's two lines are Network Activity Open (1) and
/// Close (2), paired by `unmapped.egressd.id`, for a tunnel and a
/// WebSocket alike; a short request keeps its own class and activity.
#[test]
fn open_and_close_lines_are_network_activity_open_and_close() {
    let events = sample_events();
    let mut seen = Vec::new();
    for ev in events.iter().filter(|e| e.event.is_some()) {
        let v = ocsf_line(ev);
        assert_eq!(v["class_uid"], 4001, "{v:#}");
        let want = match ev.event.unwrap() {
            egressd::record::Phase::Open => (1, "Open"),
            egressd::record::Phase::Close => (2, "Close"),
        };
        assert_eq!(v["activity_id"], want.0);
        assert_eq!(v["activity_name"], want.1);
        assert_eq!(v["type_uid"], 400100 + want.0);
        assert_eq!(v["unmapped"]["egressd"]["id"], ev.id.to_string());
        assert_eq!(v["traffic"]["bytes"], ev.bytes_up + ev.bytes_down);
        if ev.proto == Proto::Tls {
            assert_eq!(v["url"]["path"], "/socket");
            assert_eq!(v["unmapped"]["egressd"]["method"], "GET");
            assert_eq!(v["unmapped"]["egressd"]["status"], 101);
        }
        seen.push(want.0);
    }
    assert_eq!(seen, [1, 2, 1, 2]);
    for ev in events.iter().filter(|e| e.event.is_none()) {
        let v = ocsf_line(ev);
        assert!(![1, 2].contains(&v["activity_id"].as_u64().unwrap()) || v["class_uid"] != 4001);
    }
}
