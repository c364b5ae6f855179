//! The tunnel budget against generated tunnels and a benign corpus, with
//! simulated time: shared by the tests beside it and by
//! `examples/tunnel_eval.rs` (which prints the tables), so both measure the
//! same thing.
//!
//! Tunnels: a known 20 KiB payload encoded as base32, base64url and hex in
//! the query shapes of iodine, dnscat2 and dns2tcp, at the tools' default
//! sizes and fitted under the name caps, sent as bursts and as slow drips.
//! Benign: `benign_names.txt`, resolved the way clients resolve (first use,
//! then again every TTL), per workload for an hour, all at once for an hour,
//! and all day with new names every hour. Everything goes through
//! `Resolver::tunnel_assess`, the function the DNS server and the HTTP proxy
//! both call.

#![allow(dead_code)]

use std::sync::Arc;

use egressd::dns::{Resolver, TunnelOutcome};
use egressd::metrics::Metrics;
use egressd::policy::host::{parse_host, Target};
use egressd::policy::Proto;
use egressd::policy::{from_yaml, Exception, Policy, Request};

pub const PAYLOAD_BYTES: usize = 20 * 1024;
/// What a burst may move before the block (issue 14).
pub const BURST_TARGET: usize = 1024;
/// What a drip may move in a day per client per wildcard (issue 14).
pub const DAY_TARGET: usize = 8 * 1024;
/// Simulated start time (any fixed instant: the detector only compares).
pub const T0: i64 = 1_800_000_000;
pub const DAY: i64 = 86_400;

pub const BENIGN: &str = include_str!("benign_names.txt");

/// Tunnel targets (wildcards an attacker's zone sits under) and the
/// wildcards real policies carry, for the benign corpus.
/// The one source address the evaluation's queries come from (one budget).
const LOCAL: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

const EXCEPTIONS: &str = r#"
exceptions:
  - { id: partner, owner: eval, reason: eval, hosts: ["*.partner-api.example"] }
  - { id: zone-a, owner: eval, reason: eval, hosts: ["*.a.zone.example"] }
  - { id: zone-b, owner: eval, reason: eval, hosts: ["*.b.zone.example"] }
  - id: aws
    owner: eval
    reason: eval
    hosts: ["*.amazonaws.com", "*.on.aws", "*.amazoncognito.com", "*.ec2.internal"]
  - id: cdn
    owner: eval
    reason: eval
    hosts: ["*.cloudfront.net", "*.akamaiedge.net", "*.akamai.net", "*.akamaized.net", "*.fastly.net",
            "*.azureedge.net", "*.azurefd.net", "*.googleusercontent.com", "*.cloudflarestorage.com",
            "*.r2.dev", "*.workers.dev", "*.pages.dev", "*.b-cdn.net"]
  - { id: k8s, owner: eval, reason: eval, hosts: ["*.svc.cluster.local", "*.pod.cluster.local"] }
  - id: packages
    owner: eval
    reason: eval
    hosts: ["*.githubusercontent.com", "*.docker.io", "*.docker.com", "*.npmjs.org", "*.pythonhosted.org",
            "*.crates.io", "*.rust-lang.org", "*.golang.org", "*.pkg.dev", "*.gcr.io", "*.azurecr.io",
            "*.jfrog.io", "*.quay.io", "*.debian.org", "*.ubuntu.com", "*.fedoraproject.org",
            "*.alpinelinux.org", "*.rubygems.org", "*.maven.org", "*.gradle.org", "*.nuget.org",
            "*.anaconda.org", "*.anaconda.com", "*.hashicorp.com", "*.terraform.io", "*.k8s.io", "*.helm.sh",
            "*.bitnami.com", "*.nodesource.com", "*.nodejs.org", "*.microsoft.com", "*.azul.com", "*.java.net",
            "*.nvidia.com"]
  - id: telemetry
    owner: eval
    reason: eval
    hosts: ["*.sentry.io", "*.datadoghq.com", "*.datadoghq.eu", "*.newrelic.com", "*.nr-data.net",
            "*.honeycomb.io", "*.grafana.net", "*.segment.io", "*.segment.com", "*.amplitude.com",
            "*.mixpanel.com", "*.launchdarkly.com", "*.bugsnag.com", "*.rollbar.com", "*.found.io", "*.es.io",
            "*.splunkcloud.com", "*.lightstep.com", "*.posthog.com", "*.betterstack.com", "*.axiom.co",
            "*.highlight.io", "*.signoz.cloud", "*.browser-intake-datadoghq.com"]
  - { id: acme, owner: eval, reason: eval, hosts: ["*.acme-corp.com", "*.acme-dns.io"], dns_types: [TXT] }
  - id: clouds
    owner: eval
    reason: eval
    hosts: ["*.googleapis.com", "*.run.app", "*.cloudfunctions.net", "*.appspot.com", "*.firebaseio.com",
            "*.web.app", "*.firebaseapp.com", "*.windows.net", "*.azurewebsites.net", "*.azure-api.net",
            "*.azure.com", "*.azure.net", "*.azmk8s.io", "*.visualstudio.com"]
  - id: saas
    owner: eval
    reason: eval
    hosts: ["*.vercel.app", "*.netlify.app", "*.herokuapp.com", "*.fly.dev", "*.onrender.com",
            "*.supabase.co", "*.neon.tech", "*.upstash.io", "*.mongodb.net", "*.snowflakecomputing.com",
            "*.databricks.com", "*.atlassian.net", "*.atlassian.com", "*.huggingface.co", "*.hf.co",
            "*.okta.com", "*.salesforce.com", "*.zendesk.com", "*.slack.com", "*.pagerduty.com",
            "*.stripe.com", "*.cloudflareaccess.com", "*.auth0.com", "*.accounts.dev", "*.office.com",
            "*.sharepoint.com"]
"#;

/// The evaluation's exceptions with `settings` (a YAML document holding at
/// most a `settings:` key; `None`: the shipped defaults).
pub fn policy(settings: Option<&str>) -> Policy {
    let mut policy = from_yaml(EXCEPTIONS).expect("the evaluation policy compiles");
    if let Some(text) = settings {
        policy.settings = from_yaml(text)
            .unwrap_or_else(|e| panic!("settings: {e}"))
            .settings;
    }
    policy
}

// ------------------------------------------------------------ generated tunnels

/// A deterministic payload that looks like compressed data (xorshift).
pub fn payload() -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..PAYLOAD_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[derive(Clone, Copy)]
pub enum Encoding {
    Base32,
    Base64Url,
    Base64Std,
    Hex,
}

impl Encoding {
    fn bits(self) -> usize {
        match self {
            Encoding::Base32 => 5,
            Encoding::Base64Url | Encoding::Base64Std => 6,
            Encoding::Hex => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Encoding::Base32 => "base32",
            Encoding::Base64Url => "base64url",
            Encoding::Base64Std => "base64",
            Encoding::Hex => "hex",
        }
    }

    pub fn encode(self, data: &[u8]) -> String {
        let alphabet: &[u8] = match self {
            Encoding::Base32 => b"abcdefghijklmnopqrstuvwxyz234567",
            Encoding::Base64Url => {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
            }
            Encoding::Base64Std => {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
            }
            Encoding::Hex => b"0123456789abcdef",
        };
        let bits = self.bits() as u32;
        let mut out = String::new();
        let (mut acc, mut have) = (0u32, 0u32);
        for &b in data {
            acc = (acc << 8) | b as u32;
            have += 8;
            while have >= bits {
                out.push(alphabet[((acc >> (have - bits)) & ((1 << bits) - 1)) as usize] as char);
                have -= bits;
            }
            acc &= (1 << have) - 1;
        }
        if have > 0 {
            out.push(alphabet[((acc << (bits - have)) & ((1 << bits) - 1)) as usize] as char);
        }
        out
    }
}

/// One generated tunnel: names with the payload bytes each carries, and the
/// seconds between queries.
pub struct Tunnel {
    pub label: String,
    pub names: Vec<(String, usize)>,
    pub per_query: usize,
    pub interval: f64,
    /// A burst is held to [`BURST_TARGET`]; a drip to [`DAY_TARGET`] a day.
    pub burst: bool,
}

/// The shape of a tool's upstream (client → server) query.
struct Shape {
    tool: &'static str,
    encoding: Encoding,
    /// Header characters before the data (tool's command/session/sequence).
    header: fn(usize) -> String,
    label_len: usize,
    max_name: usize,
}

fn iodine_header(seq: usize) -> String {
    // Command char, user id, then sequence/fragment in base32.
    let b32 = Encoding::Base32.encode(&[(seq >> 8) as u8, seq as u8]);
    format!("p0{}", &b32[..3])
}

fn dnscat2_header(seq: usize) -> String {
    // packet id, type MSG, session id, seq, ack — hex, 9 bytes.
    Encoding::Hex.encode(&[
        (seq >> 8) as u8 ^ 0x5a,
        seq as u8,
        0x01,
        0x12,
        0x34,
        (seq >> 8) as u8,
        seq as u8,
        0,
        0,
    ])
}

fn dns2tcp_header(seq: usize) -> String {
    format!("{:04x}", seq & 0xffff)
}

/// Cuts the payload into queries of this shape under `suffix`.
fn generate(
    shape: &Shape,
    payload: &[u8],
    suffix: &str,
    rotate: &dyn Fn(usize) -> String,
) -> (Vec<(String, usize)>, usize) {
    // The most payload bytes per query that keep the name within max_name.
    let fits = |k: usize, seq: usize| {
        let chars = (shape.header)(seq).len() + (k * 8).div_ceil(shape.encoding.bits());
        let labels = chars.div_ceil(shape.label_len);
        chars + labels + rotate(seq).len() + suffix.len() <= shape.max_name
    };
    let mut k = 1;
    while fits(k + 1, 0xffff) {
        k += 1;
    }
    let mut names = Vec::new();
    for (seq, chunk) in payload.chunks(k).enumerate() {
        let text = format!("{}{}", (shape.header)(seq), shape.encoding.encode(chunk));
        let labels: Vec<&str> = text
            .as_bytes()
            .chunks(shape.label_len)
            .map(|c| std::str::from_utf8(c).expect("ASCII"))
            .collect();
        names.push((
            format!("{}.{}{suffix}", labels.join("."), rotate(seq)),
            chunk.len(),
        ));
    }
    (names, k)
}

pub fn tunnels(payload: &[u8]) -> Vec<Tunnel> {
    let none = |_: usize| String::new();
    let mut out = Vec::new();
    let shapes = |label_len: usize, max_name: usize| {
        vec![
            Shape {
                tool: "iodine",
                encoding: Encoding::Base32,
                header: iodine_header,
                label_len: label_len.min(57),
                max_name,
            },
            Shape {
                tool: "iodine",
                encoding: Encoding::Base64Url,
                header: iodine_header,
                label_len: label_len.min(57),
                max_name,
            },
            Shape {
                tool: "dnscat2",
                encoding: Encoding::Hex,
                header: dnscat2_header,
                label_len,
                max_name,
            },
            Shape {
                tool: "dns2tcp",
                encoding: Encoding::Base64Url,
                header: dns2tcp_header,
                label_len,
                max_name,
            },
        ]
    };
    // The tools' defaults: 63-byte labels, names up to 253 bytes.
    for s in shapes(63, 253) {
        let (names, k) = generate(&s, payload, "partner-api.example", &none);
        out.push(Tunnel {
            label: format!("{} {} (tool default size)", s.tool, s.encoding.name()),
            names,
            per_query: k,
            interval: 0.1,
            burst: true,
        });
    }
    // Fitted under the default caps (labels <= 40, names <= 120).
    for s in shapes(40, 120) {
        let (names, k) = generate(&s, payload, "partner-api.example", &none);
        out.push(Tunnel {
            label: format!("{} {} (fitted to caps)", s.tool, s.encoding.name()),
            names,
            per_query: k,
            interval: 0.1,
            burst: true,
        });
    }
    let fitted = |tool, encoding, header: fn(usize) -> String| Shape {
        tool,
        encoding,
        header,
        label_len: 40,
        max_name: 120,
    };
    // Standard base64 breaks hostname syntax outright.
    let s = fitted("dns2tcp", Encoding::Base64Std, dns2tcp_header);
    let (names, k) = generate(&s, payload, "partner-api.example", &none);
    out.push(Tunnel {
        label: "dns2tcp base64 (standard alphabet)".into(),
        names,
        per_query: k,
        interval: 0.1,
        burst: true,
    });
    // Spread over two wildcards of one zone.
    let s = fitted("dnscat2", Encoding::Hex, dnscat2_header);
    let (names, k) = generate(&s, payload, "zone.example", &|seq| {
        if seq % 2 == 0 {
            "a.".into()
        } else {
            "b.".into()
        }
    });
    out.push(Tunnel {
        label: "dnscat2 hex, alternating *.a/*.b of one zone".into(),
        names,
        per_query: k,
        interval: 0.1,
        burst: true,
    });
    // A new registrable name (bucket) for every query below one wildcard.
    let s = fitted("iodine", Encoding::Base32, iodine_header);
    let (names, k) = generate(&s, payload, "s3.amazonaws.com", &|seq| {
        format!("bkt{seq:05}.")
    });
    out.push(Tunnel {
        label: "iodine base32, new S3 bucket name per query".into(),
        names,
        per_query: k,
        interval: 0.1,
        burst: true,
    });
    // Slow drips below the hourly budget, and one burst an hour.
    for (label, interval) in [
        ("iodine base32, 1 query / 4 min (drip)", 240.0),
        ("iodine base32, 1 query / 10 min (drip)", 600.0),
        ("iodine base32, 1 query / 30 min (drip)", 1800.0),
    ] {
        let s = fitted("iodine", Encoding::Base32, iodine_header);
        let (names, k) = generate(&s, payload, "partner-api.example", &none);
        out.push(Tunnel {
            label: label.into(),
            names,
            per_query: k,
            interval,
            burst: false,
        });
    }
    out
}

/// What a tunnel got through before the detector stopped it (or the
/// simulated time ran out).
pub struct Replay {
    /// The query (1-based) the detector first alerted on.
    pub first_alert: Option<usize>,
    pub allowed: usize,
    /// Payload bytes carried by allowed queries.
    pub leaked: usize,
    /// Name bytes of allowed queries.
    pub name_bytes: usize,
    pub stopped_by: &'static str,
    /// The most payload allowed within any 24 h.
    pub max_per_day: usize,
    pub hours: f64,
}

fn allowing_exception<'p>(
    policy: &'p Policy,
    target: &Target,
    qtype: u16,
) -> Option<&'p Exception> {
    let req = Request {
        proto: Proto::Dns,
        client: None,
        target,
        port: 53,
        method: None,
        path: None,
        qtype: Some(qtype),
        can_intercept: false,
    };
    let d = policy.decide(&req, T0);
    d.is_allowed().then_some(d.exception).flatten()
}

/// Sends a tunnel's queries, each once, every `interval` seconds. Bursts
/// stop at the first refusal; drips keep trying for `days` simulated days
/// (a refused query is retried at the next tick).
pub fn replay(policy: &Policy, run: &Tunnel, days: i64) -> Replay {
    let resolver: Arc<Resolver> = Resolver::new(Vec::new(), Metrics::new());
    let mut r = Replay {
        first_alert: None,
        allowed: 0,
        leaked: 0,
        name_bytes: 0,
        stopped_by: "-",
        max_per_day: 0,
        hours: 0.0,
    };
    let mut allowed_at: Vec<(i64, usize)> = Vec::new();
    let mut next = 0usize;
    let mut tick = 0u64;
    while next < run.names.len() {
        let now = T0 + (tick as f64 * run.interval) as i64;
        tick += 1;
        if now - T0 > days * DAY {
            break;
        }
        r.hours = (now - T0) as f64 / 3600.0;
        let (name, bytes) = &run.names[next];
        let Ok(host) = parse_host(name) else {
            r.stopped_by = "syntax";
            break;
        };
        let target = Target::Name(host.clone());
        let e = allowing_exception(policy, &target, 1)
            .unwrap_or_else(|| panic!("eval bug: {name} is not allowed"));
        let (outcome, note) = resolver.tunnel_assess(policy, None, LOCAL, &host, e, now);
        if outcome == TunnelOutcome::Block {
            let note = note.unwrap_or_default();
            r.stopped_by = if note.contains("max_name_len") || note.contains("max_label_len") {
                "name caps"
            } else if note.contains("daily_bytes") {
                "daily budget"
            } else if note.contains("cool-down") {
                "cool-down"
            } else {
                "hourly budget"
            };
            if run.burst {
                break;
            }
            continue;
        }
        if outcome == TunnelOutcome::Alert && r.first_alert.is_none() {
            r.first_alert = Some(r.allowed + 1);
        }
        r.allowed += 1;
        r.leaked += bytes;
        r.name_bytes += name.len();
        allowed_at.push((now, *bytes));
        next += 1;
    }
    let mut start = 0;
    let mut sum = 0;
    for i in 0..allowed_at.len() {
        sum += allowed_at[i].1;
        while allowed_at[i].0 - allowed_at[start].0 >= DAY {
            sum -= allowed_at[start].1;
            start += 1;
        }
        r.max_per_day = r.max_per_day.max(sum);
    }
    r
}

// --------------------------------------------------------------- benign corpus

/// A workload: one client's names, re-resolved every `ttl` seconds.
#[derive(Clone)]
pub struct Workload {
    pub label: String,
    pub ttl: i64,
    pub names: Vec<String>,
}

/// The workloads of `benign_names.txt`.
pub fn workloads() -> Vec<Workload> {
    let mut out: Vec<Workload> = Vec::new();
    for line in BENIGN.lines().map(str::trim) {
        if let Some(head) = line.strip_prefix("## ") {
            let (label, ttl) = head.split_once(" | ").expect("## label | ttl");
            out.push(Workload {
                label: label.to_string(),
                ttl: ttl.parse().expect("ttl in seconds"),
                names: Vec::new(),
            });
        } else if !line.is_empty() && !line.starts_with('#') {
            out.last_mut()
                .expect("a name before the first workload")
                .names
                .push(line.to_string());
        }
    }
    out
}

/// Every name in the corpus, once.
pub fn corpus_names() -> Vec<String> {
    let mut all: Vec<String> = workloads().into_iter().flat_map(|w| w.names).collect();
    all.sort();
    all.dedup();
    all
}

/// One benign pattern's outcome.
#[derive(Default)]
pub struct BenignResult {
    pub names: usize,
    pub queries: usize,
    pub alerts: usize,
    pub blocked_queries: usize,
    pub blocked_names: Vec<String>,
}

/// One query: when, which name, its type.
type Query = (i64, String, u16);

fn qtype_of(name: &str) -> u16 {
    // DNS-01 challenges are TXT lookups; everything else asks for addresses.
    if name.starts_with("_acme-challenge.") || name.ends_with(".acme-dns.io") {
        16
    } else {
        1
    }
}

/// Each name comes into use at an even spread over the first 50 minutes
/// from `start` and is re-resolved every `ttl` until `start + secs`.
fn schedule(names: &[String], ttl: i64, start: i64, secs: i64, out: &mut Vec<Query>) {
    for (i, name) in names.iter().enumerate() {
        let mut t = start + (i as i64 * 3000) / names.len().max(1) as i64;
        while t < start + secs {
            out.push((t, name.clone(), qtype_of(name)));
            t += ttl.max(1);
        }
    }
}

/// Runs queries (in time order) for one client through the detector.
fn run_queries(policy: &Policy, mut queries: Vec<Query>) -> BenignResult {
    queries.sort();
    let resolver = Resolver::new(Vec::new(), Metrics::new());
    let mut r = BenignResult::default();
    let mut names = std::collections::HashSet::new();
    for (now, name, qtype) in queries {
        let host = parse_host(&name).unwrap_or_else(|e| panic!("corpus bug: {name}: {e}"));
        let target = Target::Name(host.clone());
        let e = allowing_exception(policy, &target, qtype)
            .unwrap_or_else(|| panic!("corpus bug: {name} is not allowed under a wildcard"));
        names.insert(name.clone());
        r.queries += 1;
        match resolver.tunnel_check(policy, None, LOCAL, &host, e, now) {
            TunnelOutcome::Ok => {}
            TunnelOutcome::Alert => r.alerts += 1,
            TunnelOutcome::Block => {
                r.blocked_queries += 1;
                if !r.blocked_names.contains(&name) {
                    r.blocked_names.push(name);
                }
            }
        }
    }
    r.names = names.len();
    r
}

/// One workload as one client for an hour.
pub fn workload_hour(policy: &Policy, w: &Workload) -> BenignResult {
    let mut q = Vec::new();
    schedule(&w.names, w.ttl, T0, 3600, &mut q);
    run_queries(policy, q)
}

/// One busy client running every workload in the same hour.
pub fn busy_hour(policy: &Policy, all: &[Workload]) -> BenignResult {
    let mut q = Vec::new();
    for w in all {
        schedule(&w.names, w.ttl, T0, 3600, &mut q);
    }
    run_queries(policy, q)
}

/// Names a working client adds every hour besides its usual ones: preview
/// deployments, new pods, new CDN distributions, a new load balancer.
pub fn new_names_for_hour(hour: i64) -> Vec<String> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (hour as u64).wrapping_mul(0x2545_f491);
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let b36 = |n: usize, next: &mut dyn FnMut(u64) -> u64| -> String {
        (0..n)
            .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789"[next(36) as usize] as char)
            .collect()
    };
    let mut out = vec![
        format!("acme-web-{}-acme-team.vercel.app", b36(9, &mut next)),
        format!("acme-web-{}-acme-team.vercel.app", b36(9, &mut next)),
        format!("deploy-preview-{}--acme-docs.netlify.app", 1300 + hour),
    ];
    for _ in 0..4 {
        out.push(format!(
            "10-244-{}-{}.prod.pod.cluster.local",
            next(32),
            2 + next(250)
        ));
    }
    for _ in 0..3 {
        out.push(format!("d{}.cloudfront.net", b36(13, &mut next)));
    }
    if hour % 6 == 0 {
        out.push(format!(
            "internal-k8s-prod-ingress-{}-{}.us-east-1.elb.amazonaws.com",
            b36(10, &mut next),
            1_000_000_000 + next(1_000_000_000)
        ));
    }
    out
}

/// One client all day: `names` as hourly jobs (each job resolves them
/// again, every TTL for its first 50 minutes) and the hour's new names.
pub fn working_day(policy: &Policy, names: &[String], ttl: i64) -> BenignResult {
    let mut q = Vec::new();
    for hour in 0..24 {
        let start = T0 + hour * 3600;
        schedule(names, ttl.max(300), start, 3000, &mut q);
        schedule(&new_names_for_hour(hour), 300, start, 3600, &mut q);
    }
    run_queries(policy, q)
}

/// A generalist agent: a quarter of every workload's names.
pub fn generalist(all: &[Workload]) -> Workload {
    Workload {
        label: "generalist (every 4th name of each)".into(),
        ttl: 60,
        names: all
            .iter()
            .flat_map(|w| w.names.iter().step_by(4).cloned())
            .collect(),
    }
}

/// The realistic patterns, each one client, with what the budget did: each
/// workload for an hour and for a working day, and a generalist agent that
/// uses a bit of everything, for an hour and a day.
pub fn benign_patterns(policy: &Policy) -> Vec<(String, BenignResult)> {
    let all = workloads();
    let mut out = Vec::new();
    let mut each = all.clone();
    each.push(generalist(&all));
    for w in &each {
        out.push((format!("{} (1 h)", w.label), workload_hour(policy, w)));
        out.push((
            format!("{} (24 h + new names)", w.label),
            working_day(policy, &w.names, w.ttl),
        ));
    }
    out
}
