//! `egressd report` and `egressd check --against` on decision logs generated
//! here — plain and gzip, with known counts — through the real binary; the
//! HTML report rendered in a real headless browser (Debian's chromium) when
//! one is installed; and the throughput measurement (ignored by default:
//! `cargo test --release --test it -- --ignored --nocapture report::throughput`).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use egressd::time::{format_date, format_rfc3339_millis, unix_now};
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::support::{missing, on_path, scratch, Scratch};

const DAY: i64 = 86400;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_egressd")
}

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(bin());
    for a in args {
        c.arg(a);
    }
    c.env_remove("EGRESSD_POLICY");
    c.output().expect("run egressd")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A policy with one exception in each state the report distinguishes.
fn policy(now: i64) -> String {
    format!(
        r##"settings:
  stale_after: 60d
  contact: "#sec"
  clients:
    - id: ci-runner
      sources: [10.8.0.0/16]
exceptions:
  - id: pypi
    owner: python-platform
    reason: pip installs
    ticket: SEC-1
    hosts: [pypi.org, files.pythonhosted.org]
    ports: [443]
  - id: npm
    owner: web-platform
    reason: npm installs
    hosts: [registry.npmjs.org]
    ports: [443]
  - id: old-mirror
    owner: infra
    reason: the mirror before the move
    ticket: SEC-9
    hosts: [mirror.example.net]
  - id: never
    owner: data
    reason: nobody asked
    hosts: [never.example.org]
  - id: gone
    owner: ml
    reason: trial
    expires: {gone}
    hosts: [models.example.com]
  - id: soon
    owner: ml
    reason: trial two
    expires: {soon}
    hosts: [weights.example.com]
"##,
        gone = format_date(now - 10 * DAY),
        soon = format_date(now + 5 * DAY + DAY),
    )
}

/// Deterministic pseudo-random numbers (xorshift64*), no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Line<'a> {
    ts: i64,
    client: &'a str,
    src: &'a str,
    proto: &'a str,
    host: &'a str,
    port: u16,
    decision: &'a str,
    reason: &'a str,
    exception: Option<&'a str>,
    path: Option<&'a str>,
}

impl Line<'_> {
    fn json(&self) -> String {
        let q = |s: Option<&str>| s.map_or("null".to_string(), |s| format!("{s:?}"));
        let (method, path) = match self.proto {
            "connect" => ("\"CONNECT\"".to_string(), "null".to_string()),
            "dns" => ("null".to_string(), "null".to_string()),
            _ => ("\"GET\"".to_string(), q(self.path.or(Some("/")))),
        };
        let dns = if self.proto == "dns" {
            format!(
                r#","qname":{:?},"qtype":"A","rcode":{:?}"#,
                self.host,
                if self.decision == "allow" {
                    "NOERROR"
                } else {
                    "REFUSED"
                }
            )
        } else {
            String::new()
        };
        format!(
            r#"{{"ts":"{}","client":{:?},"src":"{}:40000","proto":"{}","host":{},"port":{},"addr":null,"method":{method},"path":{path},"decision":"{}","reason":"{}","exception":{},"owner":null,"mode":"enforce","status":{},"bytes_up":10,"bytes_down":20,"duration_ms":3{dns}}}"#,
            format_rfc3339_millis(self.ts * 1000 + 123),
            self.client,
            self.src,
            self.proto,
            if self.proto == "dns" {
                "null".to_string()
            } else {
                format!("{:?}", self.host)
            },
            if self.proto == "dns" {
                "null".to_string()
            } else {
                self.port.to_string()
            },
            self.decision,
            self.reason,
            q(self.exception),
            if self.decision == "allow" { 200 } else { 403 },
        )
    }
}

/// The fixed log the report tests count against. Returns the lines and
/// what they add up to.
fn fixed_log(now: i64) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |l: Line| out.push(l.json());
    // pypi: 300 hits over the last 30 days by ci-runner and one anonymous client.
    for i in 0..300 {
        push(Line {
            ts: now - (i % 30) * DAY - 3600,
            client: if i % 3 == 0 { "-" } else { "ci-runner" },
            src: if i % 3 == 0 { "10.9.0.4" } else { "10.8.0.7" },
            proto: "connect",
            host: if i % 2 == 0 {
                "pypi.org"
            } else {
                "files.pythonhosted.org"
            },
            port: 443,
            decision: "allow",
            reason: "exception",
            exception: Some("pypi"),
            path: None,
        });
    }
    // npm: 40 hits, some over DNS.
    for i in 0..40 {
        push(Line {
            ts: now - (i % 10) * DAY - 60,
            client: "ci-runner",
            src: "10.8.0.7",
            proto: if i % 4 == 0 { "dns" } else { "connect" },
            host: "registry.npmjs.org",
            port: 443,
            decision: "allow",
            reason: "exception",
            exception: Some("npm"),
            path: None,
        });
    }
    // old-mirror: used 90 and 100 days ago only (stale_after is 60d).
    for d in [90, 100] {
        push(Line {
            ts: now - d * DAY,
            client: "ci-runner",
            src: "10.8.0.7",
            proto: "http",
            host: "mirror.example.net",
            port: 80,
            decision: "allow",
            reason: "exception",
            exception: Some("old-mirror"),
            path: Some("/debian/"),
        });
    }
    // Denied: example.com from two names, a port mismatch on pypi, an IP,
    // and a hostile path that must come out escaped.
    for i in 0..50 {
        push(Line {
            ts: now - (i % 5) * DAY - 10,
            client: if i % 2 == 0 { "ci-runner" } else { "-" },
            src: if i % 2 == 0 { "10.8.0.7" } else { "10.9.0.4" },
            proto: if i % 5 == 0 { "dns" } else { "connect" },
            host: if i % 2 == 0 {
                "api.example.com"
            } else {
                "cdn.example.com"
            },
            port: 443,
            decision: "deny",
            reason: "no_exception",
            exception: None,
            path: None,
        });
    }
    for _ in 0..7 {
        push(Line {
            ts: now - 2 * DAY,
            client: "ci-runner",
            src: "10.8.0.7",
            proto: "http",
            host: "pypi.org",
            port: 80,
            decision: "deny",
            reason: "port_not_allowed",
            exception: Some("pypi"),
            path: Some("/simple/"),
        });
    }
    for _ in 0..3 {
        push(Line {
            ts: now - DAY,
            client: "-",
            src: "10.9.0.4",
            proto: "http",
            host: "evil.example.org",
            port: 80,
            decision: "deny",
            reason: "no_exception",
            exception: None,
            path: Some("/<script>alert(1)</script>"),
        });
    }
    push(Line {
        ts: now - DAY,
        client: "-",
        src: "10.9.0.4",
        proto: "connect",
        host: "203.0.113.9",
        port: 8443,
        decision: "deny",
        reason: "no_exception",
        exception: None,
        path: None,
    });
    push(Line {
        ts: now - DAY,
        client: "-",
        src: "10.9.0.4",
        proto: "dns",
        host: "aGVsbG8.tunnel.example.com",
        port: 53,
        decision: "deny",
        reason: "dns_tunnel",
        exception: None,
        path: None,
    });
    // Old enough to fall outside --since 30d.
    push(Line {
        ts: now - 200 * DAY,
        client: "-",
        src: "10.9.0.4",
        proto: "connect",
        host: "ancient.example.io",
        port: 443,
        decision: "deny",
        reason: "no_exception",
        exception: None,
        path: None,
    });
    out
}

/// Writes `lines` split over a plain file and a gzip file made of two
/// members (as `cat a.gz b.gz` leaves it), with two lines that are not
/// decision-log lines in the plain one.
fn write_logs(dir: &Scratch, lines: &[String]) -> (PathBuf, PathBuf) {
    let half = lines.len() / 2;
    let plain = dir.path("decisions.log");
    let mut f = fs::File::create(&plain).unwrap();
    for l in &lines[..half] {
        writeln!(f, "{l}").unwrap();
    }
    writeln!(f, "not json at all").unwrap();
    writeln!(f, "{{\"ts\":\"2027-01-01T00:00:00Z\"}}").unwrap();
    let gz = dir.path("decisions.log.1.gz");
    let mut data = Vec::new();
    let quarter = half + (lines.len() - half) / 2;
    for part in [&lines[half..quarter], &lines[quarter..]] {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        for l in part {
            writeln!(e, "{l}").unwrap();
        }
        data.extend(e.finish().unwrap());
    }
    fs::write(&gz, data).unwrap();
    (plain, gz)
}

fn setup() -> (Scratch, PathBuf, PathBuf, PathBuf, i64) {
    let now = unix_now();
    let dir = scratch();
    let pol = dir.file("policy/policy.yaml", &policy(now));
    let _ = pol;
    let (plain, gz) = write_logs(&dir, &fixed_log(now));
    let p = dir.path("policy");
    (dir, p, plain, gz, now)
}

#[test]
fn json_report_counts_exactly() {
    let (_dir, pol, plain, gz, _) = setup();
    let o = run(&[
        &"report",
        &"--policy",
        &pol,
        &"--format",
        &"json",
        &plain,
        &gz,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("2 lines not understood") && err.contains("decisions.log:"),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["input"]["unreadable"], 2);
    assert_eq!(r["input"]["files"].as_array().unwrap().len(), 2);
    assert_eq!(r["totals"]["allowed"], 342);
    assert_eq!(r["totals"]["denied"], 50 + 7 + 3 + 1 + 1 + 1);
    let ex = |id: &str| {
        r["exceptions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .unwrap()
            .clone()
    };
    let pypi = ex("pypi");
    assert_eq!(pypi["hits"], 300);
    assert_eq!(pypi["owner"], "python-platform");
    assert_eq!(pypi["ticket"], "SEC-1");
    assert_eq!(pypi["status"], "active");
    assert_eq!(pypi["near_denials"], 7);
    assert_eq!(pypi["days_since_use"], 0);
    let clients: Vec<&str> = pypi["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        clients.contains(&"ci-runner") && clients.contains(&"10.9.0.4"),
        "{clients:?}"
    );
    assert_eq!(pypi["daily"].as_array().unwrap().len(), 30);
    assert_eq!(ex("npm")["hits"], 40);
    assert_eq!(ex("old-mirror")["status"], "stale");
    assert_eq!(ex("old-mirror")["days_since_use"], 90);
    assert_eq!(
        r["stale"],
        serde_json::json!(["old-mirror", "never", "soon"])
    );
    assert_eq!(r["expired"], serde_json::json!(["gone"]));
    assert_eq!(r["expiring"], serde_json::json!(["soon"]));
    assert_eq!(ex("soon")["status"], "expiring");
    assert_eq!(
        r["hottest"],
        serde_json::json!(["pypi", "npm", "old-mirror"])
    );
    let denied = r["denied"].as_array().unwrap();
    assert_eq!(denied[0]["domain"], "example.com");
    assert_eq!(denied[0]["count"], 50);
    assert_eq!(denied[0]["clients"].as_array().unwrap().len(), 2);
    assert_eq!(denied[0]["hosts"][0][1], 25);
    let stub = denied[0]["stub"].as_str().unwrap();
    assert!(
        stub.contains("hosts: [api.example.com, cdn.example.com]"),
        "{stub}"
    );
    assert!(stub.contains("ports: [443]"), "{stub}");
    assert_eq!(denied[1]["domain"], "pypi.org");
    assert_eq!(denied[1]["reasons"]["port_not_allowed"], 7);
    assert_eq!(denied[1]["near_exceptions"], serde_json::json!(["pypi"]));
    assert_eq!(r["other_denials"]["dns_tunnel"], 1);
    assert!(denied.iter().any(|d| d["domain"] == "203.0.113.9"));
    assert!(denied.iter().any(|d| d["domain"] == "example.io"));
}

#[test]
fn since_limits_the_window() {
    let (_dir, pol, plain, gz, _) = setup();
    let o = run(&[
        &"report",
        &"--policy",
        &pol,
        &"--since",
        &"30d",
        &"--format",
        &"json",
        &plain,
        &gz,
    ]);
    assert!(o.status.success());
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    // The two old-mirror hits (90, 100 days) and the 200-day-old denial drop out.
    assert_eq!(r["input"]["before_window"], 3);
    assert_eq!(r["totals"]["allowed"], 340);
    assert!(!r["denied"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["domain"] == "example.io"));
    // 30 days of logs are less than stale_after (60d): unused, not stale.
    assert_eq!(
        r["unused_recently"],
        serde_json::json!(["old-mirror", "never", "soon"])
    );
    assert!(r["limits"]["notes"][0]
        .as_str()
        .unwrap()
        .contains("less than stale_after"));
}

#[test]
fn text_report_reads_stdin_and_names_what_to_remove_and_add() {
    let (_dir, pol, _, _, now) = setup();
    let mut child = Command::new(bin())
        .args(["report", "--policy"])
        .arg(&pol)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let data = fixed_log(now).join("\n");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(data.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    let out = stdout(&o);
    for want in [
        "== Exceptions (6)",
        "pypi  [active]  owner python-platform  ticket SEC-1",
        "== Unused for stale_after (60d): candidates for removal",
        "== Expired (1)",
        "== Expiring within 14 days (1)",
        "== Hottest",
        "== Most-denied destinations",
        "example.com",
        "stub (paste under exceptions:, fill in owner and reason):",
        "  - id: example.com",
        "owner:     # TODO",
        "dns_tunnel 1",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    // A path from a sandbox cannot put terminal escapes on a reviewer's screen.
    assert!(!out.contains('\x1b'));
}

#[test]
fn bad_input_is_an_error_naming_the_file() {
    let (dir, pol, _, _, _) = setup();
    let missing = dir.path("nope.log");
    let o = run(&[&"report", &"--policy", &pol, &missing]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope.log"));
    let bad = dir.file("bad/policy.yaml", "exceptions:\n  - id: x\n");
    let o = run(&[&"report", &"--policy", &bad, &missing]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&[&"report", &"--since", &"soon", &missing]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a duration"));
    let gz = dir.path("truncated.gz");
    fs::write(&gz, b"\x1f\x8b\x08\x00").unwrap();
    let o = run(&[&"report", &"--policy", &pol, &gz]);
    assert_eq!(o.status.code(), Some(1));
}

/// The HTML page is one self-contained file: no external reference, a CSP
/// that forbids loading any, and log contents escaped.
#[test]
fn html_report_is_self_contained_and_escaped() {
    let (dir, pol, plain, gz, _) = setup();
    let o = run(&[
        &"report",
        &"--policy",
        &pol,
        &"--format",
        &"html",
        &plain,
        &gz,
    ]);
    assert!(o.status.success());
    let html = stdout(&o);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("default-src 'none'"));
    for external in ["src=", "href=", "url(", "@import", "<link", "<iframe"] {
        assert!(
            !html.contains(external),
            "{external} in the page: it must not load anything"
        );
    }
    assert!(!html.contains("<script>alert(1)"), "log content unescaped");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_eq!(html.matches("<script>").count(), 1, "only our own script");
    assert!(html.contains("<svg id=\"decisions-chart\""));
    assert!(html.contains("<svg class=\"spark\""));
    let page = dir.path("report.html");
    fs::write(&page, &html).unwrap();
    render_in_browser(&dir, &page);
}

/// Headless, and quiet: no first-run, sync, component updates or
/// reporting, and anything Chromium itself tries to fetch goes to a dead
/// local port.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-pings",
    "--proxy-server=http://127.0.0.1:9",
];

fn find_chromium() -> PathBuf {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find_map(on_path)
        .unwrap_or_else(|| panic!("{}", missing("chromium")))
}

/// Loads the page in headless Chromium and checks what rendered: the
/// computed table rows, and the summary line that only the page's own
/// script adds (so the script ran under the page's CSP).
fn render_in_browser(dir: &Scratch, page: &Path) {
    let chromium = find_chromium();
    let profile = dir.path("chromium-profile");
    fs::create_dir_all(&profile).unwrap();
    let url = format!("file://{}", page.display());
    let mut cmd = Command::new(&chromium);
    cmd.args(CHROMIUM_FLAGS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(&url);
    let o = cmd.output().expect("run chromium");
    let dom = stdout(&o);
    assert!(
        dom.contains("id=\"egressd-summary\""),
        "the page's script did not run; chromium said:\n{}\n{dom}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        dom.contains("Rendered 6 exception rows and 5 denied-destination rows."),
        "{dom}"
    );
    assert!(dom.contains("data-rendered=\"yes\""));
    assert!(!dom.contains("<script>alert(1)"));
    // And a screenshot, for a person to look at when it matters.
    let shot = dir.path("report.png");
    let o = Command::new(&chromium)
        .args(CHROMIUM_FLAGS)
        .arg("--window-size=1280,2000")
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .expect("run chromium");
    let png = fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot ({e}): {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
    if let Some(keep) = std::env::var_os("EGRESSD_KEEP_REPORT") {
        let _ = fs::copy(page, Path::new(&keep).join("report.html"));
        let _ = fs::copy(&shot, Path::new(&keep).join("report.png"));
    }
}

#[test]
fn check_against_prints_newly_denied_and_newly_allowed() {
    let (dir, _pol, plain, gz, now) = setup();
    // The proposal drops npm and adds example.com's API.
    let proposed = policy(now)
        .replace(
            "  - id: npm\n    owner: web-platform\n    reason: npm installs\n    hosts: [registry.npmjs.org]\n    ports: [443]\n",
            "",
        )
        .replace(
            "exceptions:\n",
            "exceptions:\n  - id: example-api\n    owner: app\n    reason: the task calls it\n    hosts: [api.example.com]\n    ports: [443]\n",
        );
    let prop = dir.file("proposed/policy.yaml", &proposed);
    let prop_dir = prop.parent().unwrap();
    let o = run(&[&"check", &"--against", &plain, &gz, &prop_dir]);
    let out = stdout(&o);
    // The check itself still warns about the expired exception; replay adds no failure.
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("newly denied 40, newly allowed 25"), "{out}");
    assert!(
        out.contains("CONNECT registry.npmjs.org:443  was allowed by npm, now denied no_exception"),
        "{out}"
    );
    assert!(
        out.contains("dns registry.npmjs.org A  was allowed by npm, now denied no_exception"),
        "{out}"
    );
    assert!(
        out.contains(
            "CONNECT api.example.com:443  was denied no_exception, now allowed by example-api"
        ),
        "{out}"
    );
    assert!(out.contains("not replayable"), "{out}");
    assert!(out.contains("dns_tunnel 1"), "{out}");
}

#[test]
fn check_fails_on_a_failing_policy_test() {
    let (dir, pol, _, _, _) = setup();
    dir.file(
        "policy/tests.yaml",
        "tests:\n  - target: https://pypi.org/\n    expect: allow\n    exception: pypi\n  - name: npm over plain http\n    target: http://registry.npmjs.org/\n    expect: allow\n",
    );
    let o = run(&[&"check", &pol]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("tests.yaml:5: FAIL npm over plain http: http://registry.npmjs.org/: expected allow, got deny (port_not_allowed, closest npm)"),
        "{out}"
    );
    assert!(out.contains("2 cases, 1 passed, 1 failed"), "{out}");
}

/// The shipped policy's tests pass, and its test file rejects unknown keys
/// as policy files do.
#[test]
fn shipped_policy_tests_pass_and_are_strict() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    let o = run(&[&"check", &shipped]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("tests.yaml:") && out.contains(" 0 failed"),
        "{out}"
    );
    let dir = scratch();
    for f in fs::read_dir(&shipped).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            fs::copy(&f, dir.path(f.file_name().unwrap().to_str().unwrap())).unwrap();
        }
    }
    let tests = fs::read_to_string(shipped.join("tests.yaml")).unwrap();
    let typo = tests.replacen(
        "    expect: allow\n",
        "    expect: allow\n    exepction: pypi\n",
        1,
    );
    fs::write(dir.path("tests.yaml"), typo).unwrap();
    let o = run(&[&"check", &dir.dir()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown field `exepction`"));
}

/// A realistic mix for the throughput measurement: ~80 % allowed, many
/// clients, a long tail of denied names.
fn bulk_line(r: &mut Rng, now: i64, buf: &mut String) {
    const ALLOWED: &[(&str, &str)] = &[
        ("pypi.org", "pypi"),
        ("files.pythonhosted.org", "pypi"),
        ("registry.npmjs.org", "npm"),
    ];
    let ts = now - r.below(30 * DAY as u64) as i64;
    let client = format!("agent-{}", r.below(500));
    let src = format!("10.{}.{}.{}", r.below(4), r.below(250), r.below(250));
    buf.clear();
    let l = if r.below(10) < 8 {
        let (h, e) = ALLOWED[r.below(ALLOWED.len() as u64) as usize];
        Line {
            ts,
            client: &client,
            src: &src,
            proto: if r.below(4) == 0 { "dns" } else { "connect" },
            host: h,
            port: 443,
            decision: "allow",
            reason: "exception",
            exception: Some(e),
            path: None,
        }
        .json()
    } else {
        let host = format!("h{}.d{}.example.com", r.below(20), r.below(5000));
        Line {
            ts,
            client: &client,
            src: &src,
            proto: if r.below(3) == 0 { "http" } else { "connect" },
            host: &host,
            port: 443,
            decision: "deny",
            reason: "no_exception",
            exception: None,
            path: Some("/v1/things"),
        }
        .json()
    };
    buf.push_str(&l);
    buf.push('\n');
}

/// Measures report throughput on 2,000,000 generated lines (plain and
/// gzip). Run with `--release`; prints lines/s and peak memory.
#[test]
#[ignore = "measurement: cargo test --release --test it -- --ignored --nocapture report::throughput"]
fn throughput() {
    let n: u64 = std::env::var("EGRESSD_REPORT_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let now = unix_now();
    let dir = scratch();
    let pol = dir.file("policy/policy.yaml", &policy(now));
    let _ = pol;
    let plain = dir.path("big.log");
    let gz = dir.path("big.log.gz");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut f = std::io::BufWriter::new(fs::File::create(&plain).unwrap());
    let mut z = GzEncoder::new(
        std::io::BufWriter::new(fs::File::create(&gz).unwrap()),
        Compression::fast(),
    );
    let mut buf = String::new();
    let t = Instant::now();
    for _ in 0..n {
        bulk_line(&mut rng, now, &mut buf);
        f.write_all(buf.as_bytes()).unwrap();
        z.write_all(buf.as_bytes()).unwrap();
    }
    f.flush().unwrap();
    z.finish().unwrap().flush().unwrap();
    let size = fs::metadata(&plain).unwrap().len();
    let gz_size = fs::metadata(&gz).unwrap().len();
    println!(
        "generated {n} lines ({:.0} MiB plain, {:.0} MiB gzip) in {:.1?}",
        size as f64 / 1048576.0,
        gz_size as f64 / 1048576.0,
        t.elapsed()
    );
    let p = dir.path("policy");
    for (what, log) in [("plain", &plain), ("gzip", &gz)] {
        let t = Instant::now();
        let o = Command::new("/usr/bin/time")
            .args(["-f", "%M"])
            .arg(bin())
            .args(["report", "--format", "json", "--policy"])
            .arg(&p)
            .arg(log)
            .output()
            .or_else(|_| {
                Command::new(bin())
                    .args(["report", "--format", "json", "--policy"])
                    .arg(&p)
                    .arg(log)
                    .output()
            })
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["input"]["lines"], n);
        let rss_kib = String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .and_then(|l| l.trim().parse::<u64>().ok());
        println!(
            "report {what}: {n} lines in {secs:.2} s = {:.2} M lines/s ({:.0} MiB/s of log text), peak RSS {}",
            n as f64 / secs / 1e6,
            size as f64 / secs / 1048576.0,
            rss_kib.map_or("?".into(), |k| format!("{} MiB", k / 1024))
        );
    }
}

/// One package-gate line as the proxy logs it (DESIGN "Log field").
fn package_line(
    ts: i64,
    decision: &str,
    reason: &str,
    (eco, name, version, set): (&str, &str, Option<&str>, Option<&str>),
    origin: Option<&str>,
) -> String {
    let q = |s: Option<&str>| s.map_or("null".to_string(), |s| format!("{s:?}"));
    let host = if eco == "pypi" {
        "pypi.org"
    } else {
        "registry.npmjs.org"
    };
    format!(
        r#"{{"ts":"{}","client":"ci-runner","src":"10.8.0.7:40000","proto":"tls","host":"{host}","port":443,"method":"GET","path":"/simple/{name}/","decision":"{decision}","reason":"{reason}","exception":"registries","owner":"platform","mode":"enforce","status":{},"package":{{"ecosystem":"{eco}","name":"{name}","version":{},"set":{}}}{}}}"#,
        format_rfc3339_millis(ts * 1000),
        if decision == "allow" { 200 } else { 403 },
        q(version),
        q(set),
        origin.map_or(String::new(), |o| format!(r#","origin":"{o}""#)),
    )
}

#[test]
fn package_sections_name_stale_approvals_and_denied_names_with_did_you_mean() {
    let now = unix_now();
    let dir = scratch();
    dir.file(
        "policy/p.yaml",
        r##"settings:
  stale_after: 30d
  packages: { enforce: [pypi, npm] }
exceptions:
  - id: registries
    owner: platform
    reason: package registries
    hosts: [pypi.org, files.pythonhosted.org, registry.npmjs.org]
packages:
  - id: py
    owner: python
    reason: runtime
    ecosystem: pypi
    allow: ["requests >=2.31", urllib3, numpy]
  - id: js
    owner: web
    reason: front-end
    ecosystem: npm
    allow: [left-pad]
"##,
    );
    let mut lines = Vec::new();
    for i in 0..4 {
        lines.push(package_line(
            now - 2 * DAY - i,
            "allow",
            "exception",
            ("pypi", "requests", None, Some("py")),
            None,
        ));
    }
    lines.push(package_line(
        now - 60 * DAY,
        "allow",
        "exception",
        ("pypi", "urllib3", Some("2.2.0"), Some("py")),
        None,
    ));
    // Only egressd itself fetched left-pad's packument: not a use.
    lines.push(package_line(
        now - DAY,
        "allow",
        "exception",
        ("npm", "left-pad", None, Some("js")),
        Some("egressd"),
    ));
    for _ in 0..5 {
        lines.push(package_line(
            now - DAY,
            "deny",
            "package_not_approved",
            ("pypi", "reqeusts", Some("2.32.3"), None),
            None,
        ));
    }
    for _ in 0..3 {
        lines.push(package_line(
            now - DAY,
            "deny",
            "package_version_not_approved",
            ("pypi", "requests", Some("1.0"), Some("py")),
            None,
        ));
    }
    lines.push(package_line(
        now - DAY,
        "deny",
        "package_not_approved",
        ("npm", "lodash", None, None),
        None,
    ));
    let log = dir.path("decisions.log");
    fs::write(&log, lines.join("\n") + "\n").unwrap();
    let pol = dir.path("policy");

    let o = run(&[&"report", &"--policy", &pol, &"--format", &"json", &log]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let p = &r["packages"];
    assert_eq!(p["sets"], 2);
    assert_eq!(p["enforce"], serde_json::json!(["pypi", "npm"]));
    assert_eq!(
        p["stale"],
        serde_json::json!(["py/urllib3", "py/numpy", "js/left-pad"])
    );
    let requests = &p["approved"][0];
    assert_eq!(requests["name"], "requests");
    assert_eq!(requests["status"], "active");
    assert_eq!(requests["hits"], 4);
    assert_eq!(requests["days_since_use"], 2);
    assert_eq!(p["approved"][1]["days_since_use"], 60);
    let denied = p["denied"].as_array().unwrap();
    assert_eq!(p["denied_names"], 3);
    assert_eq!(denied[0]["name"], "reqeusts");
    assert_eq!(denied[0]["count"], 5);
    assert_eq!(denied[0]["did_you_mean"], "requests");
    assert_eq!(denied[0]["versions"], serde_json::json!(["2.32.3"]));
    assert_eq!(denied[1]["name"], "requests");
    assert_eq!(denied[1]["reasons"]["package_version_not_approved"], 3);
    assert_eq!(denied[1]["did_you_mean"], serde_json::Value::Null);
    assert_eq!(denied[1]["sets"], serde_json::json!(["py"]));
    assert_eq!(denied[2]["name"], "lodash");
    assert_eq!(denied[2]["versions"], serde_json::json!(["-"]));
    // Package denials are the gate's, not destinations that need an exception.
    assert_eq!(r["denied"], serde_json::json!([]));
    assert_eq!(r["other_denials"], serde_json::json!({}));

    let o = run(&[&"report", &"--policy", &pol, &log]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    assert!(
        text.contains("== Packages: 4 approved entries in 2 sets, enforce [pypi, npm]"),
        "{text}"
    );
    assert!(
        text.contains("unused for stale_after (30d), candidates for removal:"),
        "{text}"
    );
    assert!(text.contains("py/urllib3 pypi (*, "), "{text}");
    assert!(
        text.contains("js/left-pad npm (*, ") && text.contains("never fetched in these logs"),
        "{text}"
    );
    assert!(
        text.contains(
            "1. pypi reqeusts  5 denials  (package_not_approved 5)  — did you mean requests?"
        ),
        "{text}"
    );
    assert!(
        text.contains("2. pypi requests  3 denials  (package_version_not_approved 3)\n"),
        "{text}"
    );

    let o = run(&[&"report", &"--policy", &pol, &"--format", &"html", &log]);
    assert!(o.status.success());
    let html = stdout(&o);
    assert!(
        html.contains("<h2 id=\"packages\">Packages (4 approved entries in 2 sets"),
        "{html}"
    );
    assert!(html.contains("Most-denied packages (top 3 of 3)"), "{html}");
    assert!(html.contains("<td>requests</td>"), "{html}");
}

/// `count` CONNECTs to registry.npmjs.org:443 allowed by npm, each a
/// long-lived connection's open and close line (the close carrying its
/// bytes), interleaved as a busy log has them, in `ocsf` or egressd's
/// format; and one short request.
fn open_close_log(now: i64, count: usize, ocsf: bool) -> String {
    use egressd::policy::{Logged, Proto, Reason};
    use egressd::record::{Event, Phase};
    use std::sync::Arc;
    let write = |ev: &Event, out: &mut Vec<u8>| {
        if ocsf {
            ev.write_ocsf(out)
        } else {
            ev.write_json(out)
        }
    };
    let mut opened = Vec::new();
    for i in 0..count {
        let mut ev = Event::new(Proto::Connect, "10.8.3.7:40000".parse().unwrap());
        ev.ts_ms = (now - 60) * 1000 + i as i64;
        ev.client = Arc::from("ci-runner");
        ev.host = Some("registry.npmjs.org".into());
        ev.port = Some(443);
        ev.method = Some("CONNECT".into());
        ev.decision = Logged::Allow;
        ev.reason = Reason::Exception;
        ev.exception = Some(Arc::from("npm"));
        ev.owner = Some(Arc::from("web-platform"));
        ev.status = Some(200);
        opened.push(ev);
    }
    let mut out = Vec::new();
    for ev in &mut opened {
        ev.event = Some(Phase::Open);
        write(ev, &mut out);
    }
    let mut short = Event::new(Proto::Connect, "10.8.3.7:40001".parse().unwrap());
    short.ts_ms = (now - 30) * 1000;
    short.host = Some("pypi.org".into());
    short.port = Some(443);
    short.method = Some("CONNECT".into());
    short.decision = Logged::Allow;
    short.reason = Reason::Exception;
    short.exception = Some(Arc::from("pypi"));
    write(&short, &mut out);
    for ev in &mut opened {
        ev.event = Some(Phase::Close);
        ev.bytes_up = 1000;
        ev.bytes_down = 50_000;
        ev.duration_ms = 3_600_000;
        write(ev, &mut out);
    }
    String::from_utf8(out).unwrap()
}

/// A long-lived connection is one request to the report and the replay,
/// whichever format its two lines are in: decided by its open line, its
/// close line passed over.
#[test]
fn report_and_replay_count_a_connection_with_two_lines_once() {
    let now = unix_now();
    let dir = scratch();
    dir.file("policy/policy.yaml", &policy(now));
    let pol = dir.path("policy");
    let proposed = policy(now).replace(
        "  - id: npm\n    owner: web-platform\n    reason: npm installs\n    hosts: [registry.npmjs.org]\n    ports: [443]\n",
        "",
    );
    let prop = dir.file("proposed/policy.yaml", &proposed);
    for ocsf in [false, true] {
        let log = dir.file(
            &format!("open-close-{ocsf}.log"),
            &open_close_log(now, 4, ocsf),
        );
        assert_eq!(fs::read_to_string(&log).unwrap().lines().count(), 9);
        let o = run(&[&"report", &"--policy", &pol, &"--format", &"json", &log]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(r["input"]["unreadable"], 0, "ocsf {ocsf}");
        assert_eq!(r["totals"]["allowed"], 5, "ocsf {ocsf}: {r:#}");
        let npm = r["exceptions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == "npm")
            .unwrap()
            .clone();
        assert_eq!(npm["hits"], 4, "ocsf {ocsf}");
        let o = run(&[&"check", &"--against", &log, &prop.parent().unwrap()]);
        let out = stdout(&o);
        assert!(
            out.contains("newly denied 4, newly allowed 0"),
            "ocsf {ocsf}: {out}"
        );
    }
}

/// Exceptions written in flow style (`- {id: …}`, one or two per line) are
/// located on their own lines, as block-style ones are, by `explain`, the
/// text and HTML reports and the stale and expired lists (they all said
/// `p.yaml:1` for a flow-style one).
#[test]
fn flow_and_block_exceptions_are_located_on_their_lines() {
    let now = unix_now();
    let dir = scratch();
    dir.file(
        "policy/p.yaml",
        &format!(
            r#"settings:
  stale_after: 2d
  clients:
    - {{id: pypi, sources: [10.8.0.0/16]}}
exceptions:
  - id: blocky
    owner: a
    reason: b
    hosts: [block.test]
  - {{id: pypi, owner: a, reason: b, hosts: [pypi.test]}}

  - {{owner: a, id: "npm", reason: 'b, id: x', hosts: [npm.test]}}
  - {{id: gone, owner: a, reason: b, hosts: [gone.test], expires: {gone}}}
"#,
            gone = format_date(now - 10 * DAY),
        ),
    );
    let pol = dir.path("policy");
    let file = pol.join("p.yaml");
    let at = |line: usize| format!("{}:{line}", file.display());
    for (host, line) in [("block.test", 6), ("pypi.test", 10), ("npm.test", 12)] {
        let o = run(&[&"explain", &"--policy", &pol, &format!("https://{host}/")]);
        let out = stdout(&o);
        assert!(o.status.success(), "{out}");
        assert!(
            out.contains(&format!("({})", at(line))),
            "{host}: want {} in\n{out}",
            at(line)
        );
    }
    // One use of `blocky` 5 days ago: the logs reach back past stale_after,
    // so the unused ones are stale.
    let log = dir.path("decisions.log");
    let used = Line {
        ts: now - 5 * DAY,
        client: "-",
        src: "10.9.0.4",
        proto: "connect",
        host: "block.test",
        port: 443,
        decision: "allow",
        reason: "exception",
        exception: Some("blocky"),
        path: None,
    };
    fs::write(&log, used.json() + "\n").unwrap();
    let o = run(&[&"report", &"--policy", &pol, &log]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    for (id, line) in [("blocky", 6), ("pypi", 10), ("npm", 12), ("gone", 13)] {
        assert!(
            out.contains(&format!("at {}\n", at(line))),
            "{id}: want at {} in\n{out}",
            at(line)
        );
    }
    let section = |name: &str| {
        let start = out
            .find(name)
            .unwrap_or_else(|| panic!("no {name:?} in\n{out}"));
        let rest = &out[start..];
        rest[..rest[1..].find("\n==").map_or(rest.len(), |e| e + 1)].to_string()
    };
    let stale = section("== Unused for stale_after");
    for line in [6, 10, 12] {
        assert!(stale.contains(&at(line)), "want {} in\n{stale}", at(line));
    }
    let expired = section("== Expired");
    assert!(expired.contains(&format!("({})", at(13))), "{expired}");
    assert!(!out.contains(&format!("{}\n", at(1))) && !out.contains(&format!("({})", at(1))));
    let o = run(&[&"report", &"--policy", &pol, &"--format", &"html", &log]);
    let html = stdout(&o);
    assert!(o.status.success());
    for line in [6, 10, 12, 13] {
        assert!(
            html.contains(&at(line)),
            "want {} in the HTML report",
            at(line)
        );
    }
    assert!(!html.contains(&format!("{}<", at(1))) && !html.contains(&format!("{}\"", at(1))));
}
