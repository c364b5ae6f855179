//! Prometheus metrics (the table in README's Metrics section) and the
//! `/metrics`, `/healthz`, `/readyz` endpoint. One registry per process,
//! owned by [`Metrics`]; no label ever carries a destination or a client
//! address. The counters of requests are incremented by
//! `record::Recorder::record` only.

use std::collections::HashMap;

use arc_swap::ArcSwap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;

use crate::policy::packages::Ecosystem;
use crate::policy::{Policy, Proto, Reason};
use crate::time::{unix_now, unix_now_millis};

/// The series of one exception: its owner label, hits and last hit.
struct ExceptionSeries {
    owner: Arc<str>,
    hits: IntCounter,
    last_hit: Gauge,
}

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub denied: IntCounterVec,
    pub exception_hits: IntCounterVec,
    pub exception_last_hit: GaugeVec,
    pub exception_expiry: GaugeVec,
    pub dns_tunnel: IntCounterVec,
    pub reloads: IntCounterVec,
    pub policy_exceptions: IntGauge,
    pub log_write_errors: IntCounter,
    pub duration: HistogramVec,
    pub active: IntGaugeVec,
    pub bytes: IntCounterVec,
    pub upstream_errors: IntCounterVec,
    pub dns_cache: IntCounterVec,
    pub policy_loaded_at: Gauge,
    /// Package requests by ecosystem, set (`-`: none), decision and reason
    /// (`exception` when allowed). No package label: names are unbounded.
    pub package_decisions: IntCounterVec,
    pub package_versions_hidden: IntCounterVec,
    /// Per-exception series of the serving policy, by id. Requests count
    /// through these handles: a request decided under an exception that a
    /// reload has since removed cannot bring its series back.
    live: ArcSwap<HashMap<Arc<str>, ExceptionSeries>>,
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

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let r = Registry::new();
        let requests = counter_vec(
            &r,
            "egressd_requests_total",
            "Requests and queries decided.",
            &["proto", "decision"],
        );
        let denied = counter_vec(
            &r,
            "egressd_denied_total",
            "Denials by reason.",
            &["proto", "reason"],
        );
        let exception_hits = counter_vec(
            &r,
            "egressd_exception_hits_total",
            "Requests each exception allowed.",
            &["exception", "owner"],
        );
        let exception_last_hit = GaugeVec::new(
            Opts::new(
                "egressd_exception_last_hit_timestamp_seconds",
                "When each exception last allowed a request (0: not since start).",
            ),
            &["exception"],
        )
        .expect("valid");
        r.register(Box::new(exception_last_hit.clone()))
            .expect("unique");
        let exception_expiry = GaugeVec::new(
            Opts::new(
                "egressd_exception_expiry_timestamp_seconds",
                "When each expiring exception stops matching.",
            ),
            &["exception"],
        )
        .expect("valid");
        r.register(Box::new(exception_expiry.clone()))
            .expect("unique");
        let dns_tunnel = counter_vec(
            &r,
            "egressd_dns_tunnel_suspected_total",
            "DNS names judged to carry tunnelled data, by action taken.",
            &["action"],
        );
        let reloads = counter_vec(
            &r,
            "egressd_policy_reloads_total",
            "Policy reloads by result.",
            &["result"],
        );
        let policy_exceptions = IntGauge::new(
            "egressd_policy_exceptions",
            "Exceptions in the serving policy.",
        )
        .expect("valid");
        r.register(Box::new(policy_exceptions.clone()))
            .expect("unique");
        let log_write_errors = IntCounter::new(
            "egressd_log_write_errors_total",
            "Failed decision-log writes.",
        )
        .expect("valid");
        r.register(Box::new(log_write_errors.clone()))
            .expect("unique");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "egressd_request_duration_seconds",
                "Time from request to the end of its answer or tunnel.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                60.0, 300.0,
            ]),
            &["proto"],
        )
        .expect("valid");
        r.register(Box::new(duration.clone())).expect("unique");
        let active = IntGaugeVec::new(
            Opts::new("egressd_active_connections", "Open client connections."),
            &["proto"],
        )
        .expect("valid");
        r.register(Box::new(active.clone())).expect("unique");
        let bytes = counter_vec(
            &r,
            "egressd_bytes_total",
            "Bytes relayed (up: to destinations).",
            &["direction"],
        );
        let upstream_errors = counter_vec(
            &r,
            "egressd_upstream_errors_total",
            "Failures reaching destinations or upstream DNS, by kind.",
            &["proto", "kind"],
        );
        let dns_cache = counter_vec(
            &r,
            "egressd_dns_cache_total",
            "DNS cache lookups by result.",
            &["result"],
        );
        let policy_loaded_at = Gauge::new(
            "egressd_policy_loaded_timestamp_seconds",
            "When the serving policy was loaded.",
        )
        .expect("valid");
        r.register(Box::new(policy_loaded_at.clone()))
            .expect("unique");
        let package_decisions = counter_vec(
            &r,
            "egressd_package_decisions_total",
            "Package requests decided by the package gate.",
            &["ecosystem", "set", "decision", "reason"],
        );
        let package_versions_hidden = counter_vec(
            &r,
            "egressd_package_versions_hidden_total",
            "Versions filtered out of index documents, by reason.",
            &["ecosystem", "set", "reason"],
        );
        for p in ["http", "connect", "tls", "dns"] {
            for d in ["allow", "deny"] {
                requests.with_label_values(&[p, d]);
            }
            active.with_label_values(&[p]);
        }
        for a in ["block", "log"] {
            dns_tunnel.with_label_values(&[a]);
        }
        for res in ["ok", "error"] {
            reloads.with_label_values(&[res]);
        }
        for d in ["up", "down"] {
            bytes.with_label_values(&[d]);
        }
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
        let hot_duration = Proto::ALL
            .iter()
            .map(|p| duration.with_label_values(&[p.as_str()]))
            .collect();
        let hot_bytes = [
            bytes.with_label_values(&["up"]),
            bytes.with_label_values(&["down"]),
        ];
        Arc::new(Metrics {
            hot_requests,
            hot_denied,
            hot_duration,
            hot_bytes,
            registry: r,
            requests,
            denied,
            exception_hits,
            exception_last_hit,
            exception_expiry,
            dns_tunnel,
            reloads,
            policy_exceptions,
            log_write_errors,
            duration,
            active,
            bytes,
            upstream_errors,
            dns_cache,
            policy_loaded_at,
            package_decisions,
            package_versions_hidden,
            live: ArcSwap::from_pointee(HashMap::new()),
            sync: Mutex::new(()),
            ready: AtomicBool::new(false),
        })
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Makes the per-exception series match the serving policy: every
    /// exception present at 0, removed exceptions' series dropped.
    pub fn sync_policy(&self, policy: &Policy) {
        let _guard = self.sync.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.live.load_full();
        let mut next = HashMap::with_capacity(policy.exceptions.len());
        for e in &policy.exceptions {
            let hits = self.exception_hits.with_label_values(&[&*e.id, &*e.owner]);
            let last_hit = self.exception_last_hit.with_label_values(&[&*e.id]);
            match e.expires {
                Some(t) => self
                    .exception_expiry
                    .with_label_values(&[&*e.id])
                    .set(t as f64),
                None => {
                    let _ = self.exception_expiry.remove_label_values(&[&*e.id]);
                }
            }
            next.insert(
                e.id.clone(),
                ExceptionSeries {
                    owner: e.owner.clone(),
                    hits,
                    last_hit,
                },
            );
        }
        for (id, s) in old.iter() {
            match next.get(id) {
                Some(n) if n.owner == s.owner => {}
                Some(_) => {
                    let _ = self.exception_hits.remove_label_values(&[id, &s.owner]);
                }
                None => {
                    let _ = self.exception_hits.remove_label_values(&[id, &s.owner]);
                    let _ = self.exception_last_hit.remove_label_values(&[id]);
                    let _ = self.exception_expiry.remove_label_values(&[id]);
                }
            }
        }
        drop(old);
        // Requests hold the map only while counting one hit: wait (bounded)
        // until they let go, so that the old map's series are freed here,
        // on the reloader thread, and not by a request.
        let old = self.live.swap(Arc::new(next));
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(50);
        while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        drop(old);
        self.policy_exceptions.set(policy.exceptions.len() as i64);
        self.policy_loaded_at.set(unix_now() as f64);
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
            if let Some(s) = self.live.load().get(id) {
                s.hits.inc();
                s.last_hit.set(unix_now_millis() as f64 / 1000.0);
            }
        }
        let (up, down) = bytes;
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

/// Serves `/metrics`, `/healthz` (process up) and `/readyz` (policy loaded,
/// decision log writable) until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    log_healthy: impl Fn() -> bool + Send + Sync + 'static,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let log_healthy = Arc::new(log_healthy);
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => { tokio::time::sleep(std::time::Duration::from_millis(50)).await; continue; }
            },
            _ = &mut shutdown => return,
        };
        let m = metrics.clone();
        let lh = log_healthy.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let m = m.clone();
                let lh = lh.clone();
                async move {
                    let (status, ctype, body) = match req.uri().path() {
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
