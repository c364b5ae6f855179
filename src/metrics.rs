//! Prometheus metrics (the table in docs/metrics.md) and the
//! `/metrics`, `/healthz`, `/readyz` endpoint. One registry per process,
//! owned by [`Metrics`]; no label ever carries a destination or a client
//! address. The counters of requests are incremented by
//! `record::Recorder::record` only.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use arc_swap::{ArcSwap, ArcSwapOption};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;

use crate::packages::Ecosystem;
use crate::policy::matcher::Fnv;
use crate::policy::{Policy, Proto, Reason};
use crate::time::{unix_now, unix_now_millis};

/// The usage of one exception, shared by every policy generation that
/// holds the exception with the same owner, so a request counted under the
/// old policy while a reload swaps is not lost.
#[derive(Default)]
struct Usage {
    hits: AtomicU64,
    /// Unix milliseconds of the last hit; 0: none since start.
    last_hit_ms: AtomicU64,
}

/// The per-exception series of the serving policy:
/// `egressd_exception_hits_total{exception,owner}`,
/// `egressd_exception_last_hit_timestamp_seconds{exception}` and, for an
/// exception that expires, `egressd_exception_expiry_timestamp_seconds`.
///
/// Kept out of the Prometheus registry: a label set there costs a hashed
/// entry, two label strings and a proto per series, about 0.6 s and 75 MiB
/// for 100k exceptions at start-up and again at every reload. Here the
/// labels are the policy's own (the table holds the policy it counts for),
/// an exception's usage is two atomics, and the text is written straight
/// from them at scrape time.
#[derive(Default)]
struct ExceptionTable {
    policy: Option<Arc<Policy>>,
    /// By position in `policy.exceptions`.
    usage: Vec<Arc<Usage>>,
    /// FNV, the policy matcher's hasher: ids come from the policy, not
    /// from clients, so SipHash's flood resistance buys nothing on the one
    /// lookup every allowed request makes (callgrind: 0.4k of a cached
    /// DNS query's 11k instructions went to it).
    by_id: HashMap<Arc<str>, u32, BuildHasherDefault<Fnv>>,
}

impl ExceptionTable {
    fn usage(&self, id: &str) -> Option<&Usage> {
        let i = *self.by_id.get(id)?;
        Some(&self.usage[i as usize])
    }

    fn rows(&self) -> impl Iterator<Item = (&crate::policy::Exception, &Usage)> {
        let exceptions = self.policy.as_ref().map_or(&[][..], |p| &p.exceptions[..]);
        exceptions.iter().zip(self.usage.iter().map(|u| &**u))
    }

    /// The table for `policy`: an exception kept with the same owner keeps
    /// its usage; a new owner is a new hits series (at 0) that keeps the
    /// exception's last hit; a new exception starts at 0.
    fn next(&self, policy: &Arc<Policy>) -> ExceptionTable {
        let n = policy.exceptions.len();
        let mut usage = Vec::with_capacity(n);
        let mut by_id = HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default());
        let old_owner = |i: u32| {
            self.policy
                .as_ref()
                .map(|p| &p.exceptions[i as usize].owner)
        };
        for e in &policy.exceptions {
            let u = match self.by_id.get(&e.id) {
                Some(&i) if old_owner(i) == Some(&e.owner) => self.usage[i as usize].clone(),
                Some(&i) => Arc::new(Usage {
                    hits: AtomicU64::new(0),
                    last_hit_ms: AtomicU64::new(
                        self.usage[i as usize].last_hit_ms.load(Ordering::Relaxed),
                    ),
                }),
                None => Arc::default(),
            };
            // Ids are unique in a policy (the compiler checks); the first
            // wins should that ever change.
            by_id.entry(e.id.clone()).or_insert(usage.len() as u32);
            usage.push(u);
        }
        ExceptionTable {
            policy: Some(policy.clone()),
            usage,
            by_id,
        }
    }

    /// Appends the three families in the text exposition format. A family
    /// without rows is left out, as the registry leaves out empty ones.
    fn render(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        if self.usage.is_empty() {
            return;
        }
        out.extend_from_slice(
            b"# HELP egressd_exception_hits_total Requests each exception allowed.\n\
              # TYPE egressd_exception_hits_total counter\n",
        );
        for (e, u) in self.rows() {
            out.extend_from_slice(b"egressd_exception_hits_total{exception=\"");
            escape_label(&e.id, out);
            out.extend_from_slice(b"\",owner=\"");
            escape_label(&e.owner, out);
            let _ = writeln!(out, "\"}} {}", u.hits.load(Ordering::Relaxed));
        }
        out.extend_from_slice(
            b"# HELP egressd_exception_last_hit_timestamp_seconds When each exception last allowed a request (0: not since start).\n\
              # TYPE egressd_exception_last_hit_timestamp_seconds gauge\n",
        );
        for (e, u) in self.rows() {
            out.extend_from_slice(b"egressd_exception_last_hit_timestamp_seconds{exception=\"");
            escape_label(&e.id, out);
            let ms = u.last_hit_ms.load(Ordering::Relaxed);
            let _ = writeln!(out, "\"}} {}", ms as f64 / 1000.0);
        }
        if self.rows().all(|(e, _)| e.expires().is_none()) {
            return;
        }
        out.extend_from_slice(
            b"# HELP egressd_exception_expiry_timestamp_seconds When each expiring exception stops matching.\n\
              # TYPE egressd_exception_expiry_timestamp_seconds gauge\n",
        );
        for (e, _) in self.rows() {
            if let Some(t) = e.expires() {
                out.extend_from_slice(b"egressd_exception_expiry_timestamp_seconds{exception=\"");
                escape_label(&e.id, out);
                let _ = writeln!(out, "\"}} {}", t as f64);
            }
        }
    }
}

/// `egressd_grants{state}`: the serving policy's grants by state now (a
/// grant expires or is used up between reloads, so the states are counted
/// at scrape time, not at load).
fn render_grants(serving: Option<&Policy>, out: &mut Vec<u8>) {
    use std::io::Write;
    let now = unix_now();
    let (mut active, mut used_up, mut expired) = (0u64, 0u64, 0u64);
    for (e, g) in serving.iter().flat_map(|p| p.grants()) {
        if e.is_expired(now) {
            expired += 1;
        } else if g.used_up() {
            used_up += 1;
        } else {
            active += 1;
        }
    }
    out.extend_from_slice(
        b"# HELP egressd_grants Grants in the serving policy, by state.\n\
          # TYPE egressd_grants gauge\n",
    );
    for (state, n) in [
        ("active", active),
        ("used_up", used_up),
        ("expired", expired),
    ] {
        let _ = writeln!(out, "egressd_grants{{state=\"{state}\"}} {n}");
    }
}

/// A label value in the text format: backslash, double quote and line
/// feed escaped.
fn escape_label(v: &str, out: &mut Vec<u8>) {
    for &b in v.as_bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            _ => out.push(b),
        }
    }
}

/// The kinds of `egressd_overload_total{what}`: HTTP/2 streams (each holds
/// the upstream connection opened for it, so they are the upstream count
/// too), TCP DNS connections, DNS queries past a client's share of those
/// waiting for the resolver, decision-log lines past a client's rate, and
/// proxy client connections.
pub const OVERLOAD_WHAT: [&str; 5] = [
    "streams",
    "tcp_dns",
    "dns_queries",
    "log_rate",
    "connections",
];

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub denied: IntCounterVec,
    pub dns_tunnel: IntCounterVec,
    /// `egressd_overload_total{what}`: refusals and reclaims that keep a
    /// bound shared fairly ([`Metrics::overloaded`]); no client label.
    pub overload: IntCounterVec,
    pub reloads: IntCounterVec,
    pub policy_exceptions: IntGauge,
    pub log_write_errors: IntCounter,
    pub log_lines_lost: IntCounter,
    pub duration: HistogramVec,
    pub active: IntGaugeVec,
    pub bytes: IntCounterVec,
    pub upstream_errors: IntCounterVec,
    pub dns_cache: IntCounterVec,
    pub policy_loaded_at: Gauge,
    /// Package requests by ecosystem, set (`-`: none), decision and reason
    /// (`exception` when allowed). No package label: names are unbounded.
    pub package_decisions: IntCounterVec,
    pub git_pushes: IntCounterVec,
    /// Bytes charged to `upload:` budgets, by exception.
    pub upload_bytes: IntCounterVec,
    pub package_versions_hidden: IntCounterVec,
    /// Requests allowed by a grant (each took one of its uses). No label:
    /// which grant is in the log.
    pub grant_uses: IntCounter,
    /// Per-exception series of the serving policy. A request decided under
    /// an exception that a reload has since removed finds no row and
    /// cannot bring its series back.
    live: ArcSwap<ExceptionTable>,
    /// The policy serving requests now, for `egressd_grants`. Set after the
    /// swap, where `live` is synced before it: a grant revoked by a reload
    /// leaves the gauge only once requests no longer match it.
    serving: ArcSwapOption<Policy>,
    /// Series handles resolved once, so counting a request takes no label
    /// hashing and no lock: [proto][allow, deny], [proto][reason], [proto].
    hot_requests: Vec<[IntCounter; 2]>,
    hot_denied: Vec<Vec<Option<IntCounter>>>,
    hot_duration: Vec<prometheus::Histogram>,
    hot_bytes: [IntCounter; 2],
    /// Serialises `sync_policy` (one reloader, but be explicit).
    sync: Mutex<()>,
    ready: AtomicBool,
}

/// The labelled counters, in the order `Metrics::new` takes them: name,
/// help, labels.
const COUNTER_VECS: [(&str, &str, &[&str]); 12] = [
    (
        "egressd_requests_total",
        "Requests and queries decided.",
        &["proto", "decision"],
    ),
    (
        "egressd_denied_total",
        "Denials by reason.",
        &["proto", "reason"],
    ),
    (
        "egressd_dns_tunnel_suspected_total",
        "DNS names judged to carry tunnelled data, by action taken.",
        &["action"],
    ),
    (
        "egressd_overload_total",
        "Work refused or reclaimed to keep a bound shared fairly, by what was bounded.",
        &["what"],
    ),
    (
        "egressd_policy_reloads_total",
        "Policy reloads by result.",
        &["result"],
    ),
    (
        "egressd_bytes_total",
        "Bytes relayed (up: to destinations).",
        &["direction"],
    ),
    (
        "egressd_upstream_errors_total",
        "Failures reaching destinations or upstream DNS, by kind.",
        &["proto", "kind"],
    ),
    (
        "egressd_dns_cache_total",
        "DNS cache lookups by result.",
        &["result"],
    ),
    (
        "egressd_git_pushes_total",
        "git pushes judged under a git: exception, by result (allow or the reason).",
        &["exception", "result"],
    ),
    (
        "egressd_package_decisions_total",
        "Package requests decided by the package gate.",
        &["ecosystem", "set", "decision", "reason"],
    ),
    (
        "egressd_package_versions_hidden_total",
        "Versions filtered out of index documents, by reason.",
        &["ecosystem", "set", "reason"],
    ),
    (
        "egressd_upload_bytes_total",
        "Bytes clients sent upstream under an exception's upload: budget (request bodies, tunnel bytes).",
        &["exception"],
    ),
];

/// The plain counters, in the order `Metrics::new` takes them: name, help.
const COUNTERS: [(&str, &str); 3] = [
    ("egressd_log_write_errors_total", "Failed decision-log writes."),
    (
        "egressd_log_lines_lost_total",
        "Decision lines the log did not take, shown on stderr instead (prefixed `egressd: unwritten decision:`).",
    ),
    ("egressd_grant_uses_total", "Requests allowed by a grant."),
];

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

/// Registers `c` in `r`, and returns it.
fn registered<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone())).expect("unique");
    c
}

/// Makes the series a scrape should show at 0 before anything happened.
fn warm(
    requests: &IntCounterVec,
    active: &IntGaugeVec,
    dns_tunnel: &IntCounterVec,
    overload: &IntCounterVec,
    reloads: &IntCounterVec,
    bytes: &IntCounterVec,
) {
    for p in ["http", "connect", "tls", "dns"] {
        for d in ["allow", "deny"] {
            requests.with_label_values(&[p, d]);
        }
        active.with_label_values(&[p]);
    }
    for a in ["block", "log"] {
        dns_tunnel.with_label_values(&[a]);
    }
    for w in OVERLOAD_WHAT {
        overload.with_label_values(&[w]);
    }
    for res in ["ok", "error"] {
        reloads.with_label_values(&[res]);
    }
    for d in ["up", "down"] {
        bytes.with_label_values(&[d]);
    }
}

/// The request and denial series the serving path counts in, made once:
/// `[allow, deny]` by `Proto::index`, and denials by proto and
/// `Reason::index`.
#[allow(clippy::type_complexity)]
fn hot_decisions(
    requests: &IntCounterVec,
    denied: &IntCounterVec,
) -> (Vec<[IntCounter; 2]>, Vec<Vec<Option<IntCounter>>>) {
    let hot_requests = Proto::ALL
        .iter()
        .map(|p| {
            [
                requests.with_label_values(&[p.as_str(), "allow"]),
                requests.with_label_values(&[p.as_str(), "deny"]),
            ]
        })
        .collect();
    let hot_denied = Proto::ALL
        .iter()
        .map(|p| {
            // By `Reason::index`; an exception never denies, so it has
            // no series made in advance.
            Reason::ALL
                .iter()
                .map(|r| {
                    (*r != Reason::Exception)
                        .then(|| denied.with_label_values(&[p.as_str(), r.as_str()]))
                })
                .collect()
        })
        .collect();
    (hot_requests, hot_denied)
}

impl Metrics {
    /// Counts one refusal or reclaim in `egressd_overload_total{what}`
    /// (`what` one of [`OVERLOAD_WHAT`]).
    pub fn overloaded(&self, what: &str) {
        debug_assert!(OVERLOAD_WHAT.contains(&what), "{what}");
        self.overload.with_label_values(&[what]).inc();
    }
    /// Counts `n` in `egressd_overload_total{what}` (one of
    /// [`OVERLOAD_WHAT`]).
    pub fn count_overload(&self, what: &str, n: u64) {
        self.overload.with_label_values(&[what]).inc_by(n);
    }

    pub fn new() -> Arc<Metrics> {
        let r = Registry::new();
        let [requests, denied, dns_tunnel, overload, reloads, bytes, upstream_errors, dns_cache, git_pushes, package_decisions, package_versions_hidden, upload_bytes] =
            COUNTER_VECS.map(|(name, help, labels)| counter_vec(&r, name, help, labels));
        let policy_exceptions = registered(
            &r,
            IntGauge::new(
                "egressd_policy_exceptions",
                "Exceptions in the serving policy.",
            )
            .expect("valid"),
        );
        let [log_write_errors, log_lines_lost, grant_uses] = COUNTERS
            .map(|(name, help)| registered(&r, IntCounter::new(name, help).expect("valid")));
        let duration = registered(
            &r,
            HistogramVec::new(
                HistogramOpts::new(
                    "egressd_request_duration_seconds",
                    "Time from request to the end of its answer or tunnel.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    10.0, 60.0, 300.0,
                ]),
                &["proto"],
            )
            .expect("valid"),
        );
        let active = registered(
            &r,
            IntGaugeVec::new(
                Opts::new("egressd_active_connections", "Open client connections."),
                &["proto"],
            )
            .expect("valid"),
        );
        let policy_loaded_at = registered(
            &r,
            Gauge::new(
                "egressd_policy_loaded_timestamp_seconds",
                "When the serving policy was loaded.",
            )
            .expect("valid"),
        );
        warm(&requests, &active, &dns_tunnel, &overload, &reloads, &bytes);
        let (hot_requests, hot_denied) = hot_decisions(&requests, &denied);
        Arc::new(Metrics {
            hot_requests,
            hot_denied,
            hot_duration: Proto::ALL
                .map(|p| duration.with_label_values(&[p.as_str()]))
                .into(),
            hot_bytes: ["up", "down"].map(|d| bytes.with_label_values(&[d])),
            registry: r,
            requests,
            denied,
            dns_tunnel,
            overload,
            reloads,
            policy_exceptions,
            log_write_errors,
            log_lines_lost,
            duration,
            active,
            bytes,
            upstream_errors,
            dns_cache,
            policy_loaded_at,
            package_decisions,
            git_pushes,
            upload_bytes,
            package_versions_hidden,
            grant_uses,
            live: ArcSwap::from_pointee(ExceptionTable::default()),
            serving: ArcSwapOption::empty(),
            sync: Mutex::new(()),
            ready: AtomicBool::new(false),
        })
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Makes the per-exception series match the serving policy: every
    /// exception present (at 0 if new), removed exceptions' series gone.
    pub fn sync_policy(&self, policy: &Arc<Policy>) {
        let _guard = self.sync.lock().unwrap_or_else(|e| e.into_inner());
        let next = self.live.load().next(policy);
        // Requests hold the table only while counting one hit: wait (bounded)
        // until they let go, so that the old table is freed here, on the
        // reloader thread, and not by a request.
        let old = self.live.swap(Arc::new(next));
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(50);
        while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        drop(old);
        self.policy_exceptions.set(policy.exceptions.len() as i64);
        self.policy_loaded_at.set(unix_now() as f64);
        // Budgets are on the dashboard from the start, at 0.
        for e in policy.exceptions.iter().filter(|e| e.upload().is_some()) {
            self.upload_bytes.with_label_values(&[&*e.id]);
        }
    }

    /// `policy` serves requests from now on (called right after the swap,
    /// before the old policy is reaped: this drops the reference held here).
    pub fn serving(&self, policy: &Arc<Policy>) {
        self.serving.store(Some(policy.clone()));
    }

    pub fn observe_duration(&self, proto: Proto, secs: f64) {
        self.hot_duration[proto.index()].observe(secs);
    }

    /// Counts one finished request (called by `Recorder::record` only):
    /// `denied` with its `reason`, or allowed by the exception `hit`, and
    /// the bytes it moved.
    pub fn count(
        &self,
        proto: Proto,
        denied: bool,
        reason: Reason,
        hit: Option<&str>,
        bytes: (u64, u64),
    ) {
        let p = proto.index();
        self.hot_requests[p][denied as usize].inc();
        if denied {
            match self.hot_denied[p]
                .get(reason.index())
                .and_then(Option::as_ref)
            {
                Some(c) => c.inc(),
                None => self
                    .denied
                    .with_label_values(&[proto.as_str(), reason.as_str()])
                    .inc(),
            }
        }
        if let Some(id) = hit {
            if let Some(u) = self.live.load().usage(id) {
                u.hits.fetch_add(1, Ordering::Relaxed);
                u.last_hit_ms
                    .store(unix_now_millis().max(0) as u64, Ordering::Relaxed);
            }
        }
        self.count_bytes(bytes.0, bytes.1);
    }

    /// Counts bytes moved without a request: a long-lived connection's
    /// close (its request was counted at its open).
    pub fn count_bytes(&self, up: u64, down: u64) {
        if up > 0 {
            self.hot_bytes[0].inc_by(up);
        }
        if down > 0 {
            self.hot_bytes[1].inc_by(down);
        }
    }

    /// Counts `n` failures of `kind` reaching upstream (called by
    /// `Recorder::record` only).
    pub fn count_upstream_error(&self, proto: Proto, kind: &str, n: u64) {
        self.upstream_errors
            .with_label_values(&[proto.as_str(), kind])
            .inc_by(n);
    }

    /// Counts one package request (called by `Recorder::record` only).
    pub fn count_git_push(&self, exception: &str, result: &str) {
        self.git_pushes
            .with_label_values(&[exception, result])
            .inc();
    }

    /// Counts `n` bytes charged to an exception's upload budget (called
    /// by `Recorder::record` only).
    pub fn count_upload(&self, exception: &str, n: u64) {
        self.upload_bytes.with_label_values(&[exception]).inc_by(n);
    }

    pub fn count_package(&self, eco: Ecosystem, set: &str, decision: &str, reason: &str) {
        self.package_decisions
            .with_label_values(&[eco.as_str(), set, decision, reason])
            .inc();
    }

    /// Counts `n` versions a filtered index hid for `reason` (called by
    /// `Recorder::record` only).
    pub fn count_versions_hidden(&self, eco: Ecosystem, set: &str, reason: &str, n: u64) {
        self.package_versions_hidden
            .with_label_values(&[eco.as_str(), set, reason])
            .inc_by(n);
    }

    pub fn render(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 << 10);
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        let live = self.live.load();
        live.render(&mut buf);
        render_grants(self.serving.load().as_deref(), &mut buf);
        buf
    }
}

/// Tracks one open connection in `egressd_active_connections`.
pub struct ActiveGuard(prometheus::IntGauge);
impl ActiveGuard {
    pub fn new(m: &Metrics, proto: Proto) -> ActiveGuard {
        let g = m.active.with_label_values(&[proto.as_str()]);
        g.inc();
        ActiveGuard(g)
    }
}
impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Serves `/metrics`, `/healthz` (process up), `/readyz` (policy loaded,
/// decision log writable) and, to loopback peers only, `/denials?id=ID`
/// (the line of a recent denial `denial` finds, for `egressd grant`) until
/// `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    log_healthy: impl Fn() -> bool + Send + Sync + 'static,
    denial: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let log_healthy = Arc::new(log_healthy);
    let denial = Arc::new(denial);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer): (_, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => { tokio::time::sleep(std::time::Duration::from_millis(50)).await; continue; }
            },
            _ = &mut shutdown => return,
        };
        let m = metrics.clone();
        let lh = log_healthy.clone();
        let dn = denial.clone();
        // The denials name clients, hosts and paths: only for a command on
        // this host, never for a scraper reaching the listener from afar.
        let local = peer.ip().to_canonical().is_loopback();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let m = m.clone();
                let lh = lh.clone();
                let dn = dn.clone();
                async move {
                    let (status, ctype, body) = match req.uri().path() {
                        "/denials" => denials(local, req.uri().query(), &*dn),
                        "/metrics" => (
                            StatusCode::OK,
                            "text/plain; version=0.0.4",
                            Bytes::from(m.render()),
                        ),
                        "/healthz" => (StatusCode::OK, "text/plain", Bytes::from_static(b"ok\n")),
                        "/readyz" => {
                            if m.ready.load(Ordering::Relaxed) && lh() {
                                (StatusCode::OK, "text/plain", Bytes::from_static(b"ready\n"))
                            } else {
                                (
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "text/plain",
                                    Bytes::from_static(b"not ready\n"),
                                )
                            }
                        }
                        _ => (
                            StatusCode::NOT_FOUND,
                            "text/plain",
                            Bytes::from_static(b"not found\n"),
                        ),
                    };
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(status)
                            .header("content-type", ctype)
                            .body(Full::new(body))
                            .expect("static response"),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// `/denials?id=ID`: the decision-log line of recent denied request ID.
fn denials(
    local: bool,
    query: Option<&str>,
    find: &dyn Fn(&str) -> Option<String>,
) -> (StatusCode, &'static str, Bytes) {
    let text = |status, s: String| (status, "text/plain", Bytes::from(s));
    if !local {
        return text(
            StatusCode::FORBIDDEN,
            "recent denials are served to loopback clients only\n".into(),
        );
    }
    let id = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("id="));
    let Some(id) = id.filter(|i| !i.is_empty()) else {
        return text(StatusCode::BAD_REQUEST, "give ?id=REQUEST\n".into());
    };
    match find(id) {
        Some(mut line) => {
            line.push('\n');
            (StatusCode::OK, "application/json", Bytes::from(line))
        }
        None => text(
            StatusCode::NOT_FOUND,
            format!("no denied request {id} among the recent denials this egressd keeps\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::GaugeVec;

    fn policy(yaml: &str) -> Arc<Policy> {
        Arc::new(crate::policy::from_yaml(yaml).unwrap())
    }

    const TWO: &str = "exceptions:
  - id: a
    owner: team-a
    reason: r
    hosts: [a.test]
  - id: b.q
    owner: 'x\\y \"z\"'
    reason: r
    hosts: [b.test]
    expires: 2030-01-02
";

    /// The families written from the table are what the registry's own
    /// encoder writes for the same series (the format scrapers parse).
    #[test]
    fn exception_families_match_the_registry_encoder() {
        let p = policy(TWO);
        let m = Metrics::new();
        m.sync_policy(&p);
        m.count(Proto::Http, false, Reason::Exception, Some("a"), (0, 0));
        m.count(Proto::Http, false, Reason::Exception, Some("a"), (0, 0));
        let table = m.live.load();
        let last = table
            .usage("a")
            .unwrap()
            .last_hit_ms
            .load(Ordering::Relaxed);
        assert!(last > 1_700_000_000_000);

        let r = Registry::new();
        let hits = counter_vec(
            &r,
            "egressd_exception_hits_total",
            "Requests each exception allowed.",
            &["exception", "owner"],
        );
        let gauge = |name: &str, help: &str| {
            let g = GaugeVec::new(Opts::new(name, help), &["exception"]).unwrap();
            r.register(Box::new(g.clone())).unwrap();
            g
        };
        let last_hit = gauge(
            "egressd_exception_last_hit_timestamp_seconds",
            "When each exception last allowed a request (0: not since start).",
        );
        let expiry = gauge(
            "egressd_exception_expiry_timestamp_seconds",
            "When each expiring exception stops matching.",
        );
        hits.with_label_values(&["a", "team-a"]).inc_by(2);
        hits.with_label_values(&["b.q", "x\\y \"z\""]);
        last_hit.with_label_values(&["a"]).set(last as f64 / 1000.0);
        last_hit.with_label_values(&["b.q"]);
        let b = p.exceptions.iter().find(|e| &*e.id == "b.q").unwrap();
        expiry
            .with_label_values(&["b.q"])
            .set(b.expires().unwrap() as f64);
        let mut want = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut want).unwrap();

        let mut got = Vec::new();
        table.render(&mut got);
        // The registry sorts families by name; the table writes them in a
        // fixed order. Compare them as sets of lines within each family.
        let families = |t: &[u8]| {
            let mut f: Vec<Vec<String>> = Vec::new();
            for l in String::from_utf8(t.to_vec()).unwrap().lines() {
                if l.starts_with("# HELP") {
                    f.push(Vec::new());
                }
                f.last_mut().unwrap().push(l.to_string());
            }
            for x in &mut f {
                x[2..].sort();
            }
            f.sort();
            f
        };
        assert_eq!(families(&got), families(&want));
        assert!(String::from_utf8(m.render())
            .unwrap()
            .contains("egressd_exception_hits_total{exception=\"a\",owner=\"team-a\"} 2\n"));
    }

    /// A reload keeps the counts of exceptions it keeps, drops removed
    /// ones, starts new ones (and a new owner's series) at 0, and a hit
    /// for a removed exception brings nothing back.
    #[test]
    fn reload_keeps_counts_by_id_and_owner() {
        let m = Metrics::new();
        m.sync_policy(&policy(TWO));
        m.count(Proto::Dns, false, Reason::Exception, Some("a"), (0, 0));
        m.count(Proto::Dns, false, Reason::Exception, Some("b.q"), (0, 0));
        m.sync_policy(&policy(
            "exceptions:
  - id: b.q
    owner: new-owner
    reason: r
    hosts: [b.test]
  - id: a
    owner: team-a
    reason: r
    hosts: [a.test]
  - id: c
    owner: team-c
    reason: r
    hosts: [c.test]
",
        ));
        m.count(Proto::Dns, false, Reason::Exception, Some("gone"), (0, 0));
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("egressd_exception_hits_total{exception=\"a\",owner=\"team-a\"} 1\n"));
        assert!(text
            .contains("egressd_exception_hits_total{exception=\"b.q\",owner=\"new-owner\"} 0\n"));
        assert!(text.contains("egressd_exception_hits_total{exception=\"c\",owner=\"team-c\"} 0\n"));
        assert!(!text.contains("owner=\"x\\\\y"));
        assert!(!text.contains("gone"));
        assert!(!text.contains("egressd_exception_expiry_timestamp_seconds"));
        let t = m.live.load();
        assert!(t.usage("b.q").unwrap().last_hit_ms.load(Ordering::Relaxed) > 0);
        assert_eq!(t.usage("c").unwrap().last_hit_ms.load(Ordering::Relaxed), 0);
        assert!(text.contains("egressd_policy_exceptions 3\n"));
    }

    #[test]
    fn recent_denials_are_served_to_loopback_peers_by_id_only() {
        let find =
            |id: &str| (id == "m991n6nvnthe").then(|| "{\"id\":\"m991n6nvnthe\"}".to_string());
        let (st, ctype, body) = denials(true, Some("id=m991n6nvnthe"), &find);
        assert_eq!((st, ctype), (StatusCode::OK, "application/json"));
        assert_eq!(&body[..], b"{\"id\":\"m991n6nvnthe\"}\n");
        assert_eq!(
            denials(true, Some("id=m991n6nvnthf"), &find).0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(denials(true, None, &find).0, StatusCode::BAD_REQUEST);
        assert_eq!(denials(true, Some("id="), &find).0, StatusCode::BAD_REQUEST);
        // A peer from afar (a scraper on the pod network) gets nothing.
        let (st, _, body) = denials(false, Some("id=m991n6nvnthe"), &find);
        assert_eq!(st, StatusCode::FORBIDDEN);
        assert!(!body.windows(12).any(|w| w == b"m991n6nvnthe"));
    }
}
