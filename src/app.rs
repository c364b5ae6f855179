//! Wiring only: load the policy → start the log → bind → spawn the
//! front-ends and the reloader → wait for a signal → stop accepting →
//! drain (one [`Shutdown`] for everything; the drain waits on the proxy's
//! connection permits and DNS's bounds, `dns::Bounds`).
//!
//! [`start`] runs a whole egressd in the calling runtime and hands back
//! [`Running`]: the launcher embeds egressd this way, and tests run it
//! in-process (under paused time, for the timeouts).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tokio::net::{TcpListener, UdpSocket};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::log::{LogSink, LogTarget};
use crate::metrics::Metrics;
use crate::policy::PolicyHandle;
use crate::proxy::mitm::Interceptor;
use crate::proxy::upstream::{Egress, UpstreamProxy};
use crate::proxy::{self, ProxyCtx};
use crate::record::denials::PackageDenials;
use crate::record::Recorder;
use crate::reload::{Reloader, Stamp};
use crate::shutdown::{Permits, Shutdown, Trigger};
use crate::{dns, policy};

/// How long open connections get to finish after SIGTERM/SIGINT.
pub const DRAIN: Duration = Duration::from_secs(5);

/// Binds the resolver's UDP socket and a TCP listener on the same port.
/// With port 0 the kernel picks the UDP port, which may be taken for TCP:
/// then try another.
async fn bind_dns(addr: SocketAddr) -> Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..if addr.port() == 0 { 16 } else { 1 } {
        let udp = UdpSocket::bind(addr)
            .await
            .with_context(|| format!("cannot listen on udp {addr}"))?;
        let bound = udp.local_addr()?;
        match TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = Some((bound, e)),
        }
    }
    let (bound, e) = last.expect("at least one attempt");
    Err(anyhow::anyhow!("cannot listen on tcp {bound}: {e}"))
}

/// The sockets an egressd serves on. `serve` binds them from its flags; the
/// launcher may bind them elsewhere (inside a sandbox's namespace) first.
pub struct Listeners {
    pub proxy: TcpListener,
    pub dns_udp: UdpSocket,
    pub dns_tcp: TcpListener,
    pub metrics: Option<TcpListener>,
    /// `egressd run --transparent`: listeners whose connections were
    /// redirected to them by nftables (one per address family); they are
    /// served by `proxy::transparent`. `serve` has none.
    pub transparent: Vec<TcpListener>,
    /// `egressd run`: the one client behind these listeners (see
    /// `Policy::serve_only`); `serve` identifies clients by token or source.
    pub client: Option<Arc<str>>,
    /// The TCP listeners named to the host's other egressd processes, so
    /// that none dials them (`proxy::listeners`): `serve`'s. The launcher's
    /// listeners are inside the sandbox, where no other egressd dials from.
    pub announced: proxy::listeners::Announced,
}

impl Listeners {
    pub async fn bind(args: &ServeArgs) -> Result<Listeners> {
        let proxy = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let (dns_udp, dns_tcp) = bind_dns(args.dns_listen).await?;
        let metrics = TcpListener::bind(args.metrics_listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
        let tcp = [
            proxy.local_addr()?,
            dns_tcp.local_addr()?,
            metrics.local_addr()?,
        ];
        let announced = proxy::listeners::announce(&tcp)?;
        Ok(Listeners {
            proxy,
            dns_udp,
            dns_tcp,
            metrics: Some(metrics),
            transparent: Vec::new(),
            client: None,
            announced,
        })
    }
}

/// A started egressd: its addresses and the handles to steer it.
pub struct Running {
    pub proxy: SocketAddr,
    pub dns: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub exceptions: usize,
    pub upstreams: Vec<SocketAddr>,
    pub log: LogSink,
    pub metrics: Arc<Metrics>,
    /// The package requests denied so far (`egressd run` prints them at exit).
    pub package_denials: Arc<PackageDenials>,
    hup: mpsc::UnboundedSender<()>,
    /// For the last `rate_limited` summaries at the end.
    recorder: Arc<Recorder>,
    trigger: Trigger,
    /// One per open proxy connection (tunnels and upgrades included).
    connections: Permits,
    /// What DNS holds open (queries waiting for an upstream, TCP
    /// connections): the drain waits for them too.
    dns_bounds: dns::Bounds,
    /// Held while the listeners serve (`proxy::listeners`).
    _announced: proxy::listeners::Announced,
}

impl Running {
    /// Re-reads the policy now (what SIGHUP does).
    pub fn reload(&self) {
        let _ = self.hup.send(());
    }

    /// Connection permits held now: one per open client connection
    /// (tunnels, intercepted TLS and WebSockets included, for as long as
    /// they are open), plus the one each listener holds for its next
    /// client while it waits to accept.
    pub fn connection_permits(&self) -> usize {
        self.connections.in_use()
    }

    /// Stops accepting, then gives open connections (tunnels included) and
    /// DNS queries in flight up to [`DRAIN`] to finish: it waits on their
    /// permits, and returns as soon as the last one is gone.
    pub async fn shutdown(self) {
        self.trigger.fire();
        let (connections, dns) = (self.connections.clone(), self.dns_bounds.clone());
        let _ = tokio::time::timeout(DRAIN, async move {
            connections.drained().await;
            dns.drained().await;
        })
        .await;
        // Every line queued so far reaches the log, or stderr, before the
        // process exits: the decisions summed for a `rate_limited` line too.
        self.recorder.flush_rate_limited(true);
        let log = self.log.clone();
        let _ = tokio::task::spawn_blocking(move || log.finish(Duration::from_secs(2))).await;
    }
}

/// The policy as `serve` starts with it: read, compiled, narrowed to
/// `--client` when the sandbox's own, its grants' use counts shared.
fn load_policy(
    args: &ServeArgs,
    metrics: &Metrics,
    only_client: Option<&str>,
) -> Result<(
    Arc<PolicyHandle>,
    usize,
    Arc<crate::reload::grants::GrantStore>,
)> {
    let grants = policy::grants_dir(&args.engine.policy, args.engine.grants.as_deref());
    let mut pol = policy::read_sources_with(&args.engine.policy, args.engine.grants.as_deref())
        .and_then(|s| policy::compile(&s, &|n| std::env::var(n).ok()))
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}\negressd: policy {} is invalid",
                args.engine.policy.display()
            )
        })?;
    if let Some(id) = only_client {
        pol.serve_only(id);
    }
    // Grant use counts live beside the grants, so a restart keeps them.
    let grant_store = crate::reload::grants::GrantStore::new(grants);
    grant_store.share(&mut pol);
    let exceptions = pol.exceptions.len();
    let pol = Arc::new(pol);
    metrics.sync_policy(&pol);
    metrics.serving(&pol);
    let handle = PolicyHandle::new(pol);
    crate::reload::release_freed_memory();
    Ok((handle, exceptions, grant_store))
}

/// The way out: direct, or through `--upstream-proxy`.
fn egress(args: &ServeArgs) -> Result<Egress> {
    Ok(match &args.engine.upstream_proxy {
        None => Egress::Direct,
        Some(url) => {
            let p = UpstreamProxy::parse(url, args.engine.upstream_proxy_auth_file.as_deref())
                .map_err(|e| anyhow::anyhow!("--upstream-proxy: {e}"))?;
            eprintln!(
                "egressd: leaving through upstream proxy {}{}",
                p.display,
                if p.auth.is_some() {
                    " (with credentials)"
                } else {
                    ""
                }
            );
            Egress::Proxy(Arc::new(p))
        }
    })
}

/// TLS interception with `--ca-dir`.
fn interceptor(args: &ServeArgs, egress: &Egress) -> Result<Option<Arc<Interceptor>>> {
    let mitm = match &args.engine.ca_dir {
        None => None,
        Some(dir) => {
            let (m, warnings) =
                Interceptor::new(dir, args.engine.upstream_ca.as_deref(), egress.clone())
                    .with_context(|| format!("TLS interception (--ca-dir {})", dir.display()))?;
            for w in warnings {
                eprintln!("egressd: warning: {w}");
            }
            let ca = m.leaves.ca();
            eprintln!(
                "egressd: TLS interception on: {} ({}), valid until {}",
                ca.subject,
                ca.cert_path.display(),
                crate::time::format_date(ca.not_after)
            );
            Some(Arc::new(m))
        }
    };
    if mitm.is_none() && args.engine.upstream_ca.is_some() {
        eprintln!("egressd: warning: --upstream-ca has no effect without --ca-dir");
    }
    Ok(mitm)
}

/// The decision log (chained with `--log-key`) and the recorder on it,
/// rate-limited as the serving policy says.
fn log_and_recorder(
    args: &ServeArgs,
    metrics: &Arc<Metrics>,
    handle: &Arc<PolicyHandle>,
) -> Result<(LogSink, Recorder)> {
    let chain = args.engine.chain.chain()?;
    let log = LogSink::start(LogTarget::parse(&args.log), metrics.clone())
        .with_context(|| format!("cannot open decision log {}", args.log))?;
    if let Some(c) = chain {
        log.set_chain(c);
    }
    let rate_policy = handle.clone();
    let recorder = Recorder::new(log.clone(), metrics.clone())
        .with_format(args.engine.log_format)
        .with_log_rate(Box::new(move || {
            rate_policy
                .snapshot()
                .settings
                .limits
                .log_lines_per_client_per_sec
        }));
    Ok((log, recorder))
}

/// Serves DNS on its sockets until `shutdown`.
fn spawn_dns(
    (udp, tcp): (UdpSocket, TcpListener),
    handle: &Arc<PolicyHandle>,
    resolver: &Arc<dns::Resolver>,
    recorder: &Recorder,
    bounds: &dns::Bounds,
    shutdown: &Shutdown,
    proxied: Vec<ipnet::IpNet>,
) {
    let (h, r, rec, b, s) = (
        handle.clone(),
        resolver.clone(),
        recorder.clone(),
        bounds.clone(),
        shutdown.clone(),
    );
    tokio::spawn(async move {
        let proxied = dns::proxied::ProxySources::new(proxied);
        if let Err(e) = dns::serve_proxied((udp, tcp), h, r, rec, b, proxied, s).await {
            eprintln!("egressd: DNS resolver stopped: {e:#}");
        }
    });
}

/// egressd's own listening addresses (proxy, DNS, metrics, capture), in
/// that order: a request to one of them is refused, not looped.
fn own_addrs(
    proxy: &TcpListener,
    dns: &UdpSocket,
    metrics: Option<&TcpListener>,
    transparent: &[TcpListener],
) -> Result<Vec<SocketAddr>> {
    let mut own = vec![proxy.local_addr()?, dns.local_addr()?];
    own.extend(metrics.map(|l| l.local_addr()).transpose()?);
    for l in transparent {
        own.push(l.local_addr()?);
    }
    Ok(own)
}

/// Serves `/metrics` (and health from the log) until `shutdown`.
fn spawn_metrics(
    listener: TcpListener,
    metrics: &Arc<Metrics>,
    log: &LogSink,
    recorder: &Recorder,
    shutdown: &Shutdown,
) {
    let lh = log.clone();
    let recent = recorder.recent_denials.clone();
    let mut s = shutdown.clone();
    tokio::spawn(crate::metrics::serve(
        listener,
        metrics.clone(),
        move || lh.healthy(),
        move |id| recent.find(id),
        async move { s.fired().await },
    ));
}

/// What the proxy's tasks share: the policy, the recorder, the resolver,
/// the way out (`--upstream-proxy`), interception (`--ca-dir`), pools.
fn proxy_ctx(
    args: &ServeArgs,
    handle: &Arc<PolicyHandle>,
    recorder: &Recorder,
    resolver: &Arc<dns::Resolver>,
    own_addrs: Vec<SocketAddr>,
    connections: &Permits,
) -> Result<Arc<ProxyCtx>> {
    let egress = egress(args)?;
    let mitm = interceptor(args, &egress)?;
    Ok(Arc::new(ProxyCtx {
        policy: handle.clone(),
        recorder: recorder.clone(),
        resolver: resolver.clone(),
        own_addrs,
        http: proxy::pool::OriginPool::new(egress.clone()),
        pipes: Arc::new(proxy::relay::pipe::PipePool::standard()),
        egress,
        mitm,
        connections: connections.clone(),
        package_views: proxy::gate::Views::new(),
        index_cache: proxy::gate::index_cache::IndexCache::new(),
        raw_origins: proxy::RawPool::new(),
    }))
}

/// Loads the policy, starts the log, and serves on `listeners`: the proxy,
/// the resolver, metrics (if given) and the reloader, as tasks.
pub async fn start(args: &ServeArgs, listeners: Listeners) -> Result<Running> {
    let metrics = Metrics::new();
    let stamp = Stamp::of(&args.engine.policy);
    let only_client = listeners.client.clone();
    let (handle, exceptions, grant_store) = load_policy(args, &metrics, only_client.as_deref())?;

    let (log, recorder) = log_and_recorder(args, &metrics, &handle)?;
    let upstreams =
        dns::parse_upstreams(args.engine.upstream_dns.as_deref()).context("--upstream-dns")?;
    let resolver = dns::Resolver::new(upstreams.clone(), metrics.clone());

    let Listeners {
        proxy: proxy_l,
        dns_udp,
        dns_tcp,
        metrics: metrics_l,
        transparent: transparent_l,
        client: _,
        announced,
    } = listeners;
    let own_addrs = own_addrs(&proxy_l, &dns_udp, metrics_l.as_ref(), &transparent_l)?;
    let (proxy_addr, dns_addr) = (own_addrs[0], own_addrs[1]);
    let metrics_addr = metrics_l.as_ref().map(|_| own_addrs[2]);
    // Captured connections that carry no name are decided by the name the
    // client resolved through this egressd for that address.
    resolver.remember_answers(!transparent_l.is_empty());

    let (trigger, shutdown) = Shutdown::new();
    let connections = Permits::new(proxy::MAX_CONNECTIONS);
    tokio::spawn(summarise_rate_limited(recorder.clone(), shutdown.clone()));
    let ctx = proxy_ctx(args, &handle, &recorder, &resolver, own_addrs, &connections)?;
    for l in transparent_l {
        tokio::spawn(proxy::transparent::serve(l, ctx.clone(), shutdown.clone()));
    }
    tokio::spawn(proxy::serve(proxy_l, ctx, shutdown.clone()));
    let dns_bounds = dns::Bounds::default();
    spawn_dns(
        (dns_udp, dns_tcp),
        &handle,
        &resolver,
        &recorder,
        &dns_bounds,
        &shutdown,
        args.dns_proxy_protocol.clone(),
    );
    if let Some(ml) = metrics_l {
        spawn_metrics(ml, &metrics, &log, &recorder, &shutdown);
    }
    let (hup_tx, hup_rx) = mpsc::unbounded_channel();
    let reloader = Reloader::new(args.engine.policy.clone(), handle.clone(), metrics.clone())
        .loaded_from(stamp)
        .serving_only(only_client)
        .with_grants(args.engine.grants.clone(), grant_store);
    // Its own thread at the idle class, not a runtime worker: compiling a
    // large policy must not take CPU from requests (see policy::reload).
    reloader
        .spawn(hup_rx, shutdown)
        .context("cannot start the policy reloader thread")?;
    metrics.set_ready();
    Ok(Running {
        proxy: proxy_addr,
        dns: dns_addr,
        metrics_addr,
        exceptions,
        upstreams,
        log,
        metrics,
        package_denials: recorder.package_denials.clone(),
        hup: hup_tx,
        recorder: Arc::new(recorder),
        trigger,
        connections,
        dns_bounds,
        _announced: announced,
    })
}

/// Writes each second's `rate_limited` summaries once it has ended, until
/// `shutdown` fires (`Running::shutdown` writes the last ones).
async fn summarise_rate_limited(recorder: Recorder, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => recorder.flush_rate_limited(false),
            _ = shutdown.fired() => return,
        }
    }
}

/// `egressd serve`: bind from the flags, start, and steer by signals.
/// Returns the decision log, for the caller to flush once the runtime (and
/// with it every connection still open) is gone.
pub async fn serve(args: ServeArgs) -> Result<LogSink> {
    // Handlers before anything is announced: a SIGHUP that arrives early
    // must reload, not kill (its default action).
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let listeners = Listeners::bind(&args).await?;
    let running = start(&args, listeners).await?;
    eprintln!(
        "egressd: listening proxy={} dns={} metrics={} policy={} exceptions={} upstream_dns={}",
        running.proxy,
        running.dns,
        running
            .metrics_addr
            .map(|a| a.to_string())
            .unwrap_or_else(|| "-".into()),
        args.engine.policy.display(),
        running.exceptions,
        running
            .upstreams
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    loop {
        tokio::select! {
            _ = hup.recv() => running.reload(),
            _ = usr1.recv() => { eprintln!("egressd: reopening decision log"); running.log.reopen(); }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    eprintln!("egressd: shutting down");
    let log = running.log.clone();
    running.shutdown().await;
    Ok(log)
}

/// A CIDR, or one address (its /32 or /128).
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    let s = s.trim();
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s:?} is not an address or a CIDR"))
}

/// The flags of the egressd that serves: `serve`'s own, and those of the
/// one `run` embeds ([`EngineArgs`], declared once for both).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// HTTP proxy listen address.
    #[arg(long, env = "EGRESSD_LISTEN", default_value = "127.0.0.1:3128")]
    pub listen: SocketAddr,
    /// DNS resolver listen address (UDP and TCP).
    #[arg(long, env = "EGRESSD_DNS_LISTEN", default_value = "127.0.0.1:8053")]
    pub dns_listen: SocketAddr,
    /// Sources (balancers such as dnsdist with useProxyProtocol) whose DNS
    /// queries begin with a PROXY protocol v2 header naming the client:
    /// CIDRs, comma-separated. From them a header is required; from any
    /// other source none is read.
    #[arg(
        long,
        env = "EGRESSD_DNS_PROXY_PROTOCOL",
        value_name = "CIDR",
        value_delimiter = ',',
        value_parser = parse_net
    )]
    pub dns_proxy_protocol: Vec<ipnet::IpNet>,
    /// Metrics listen address (/metrics, /healthz, /readyz).
    #[arg(long, env = "EGRESSD_METRICS_LISTEN", default_value = "127.0.0.1:9464")]
    pub metrics_listen: SocketAddr,
    /// Decision log path; `-` is stdout.
    #[arg(long, env = "EGRESSD_LOG", default_value = "-")]
    pub log: String,
}

/// The flags `serve` and `run` share: what the egressd that decides reads
/// (for `run`, the one it embeds unless `--connect` names one).
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Policy directory or file.
    #[arg(long, env = "EGRESSD_POLICY", default_value = "policy/")]
    pub policy: PathBuf,
    /// Upstream DNS servers: IP or IP:PORT, comma-separated (default: /etc/resolv.conf's nameservers).
    #[arg(long, env = "EGRESSD_UPSTREAM_DNS")]
    pub upstream_dns: Option<String>,
    /// Decision lines as egressd's JSON or as OCSF events (for SIEMs).
    #[arg(
        long,
        env = "EGRESSD_LOG_FORMAT",
        value_enum,
        default_value = "egressd"
    )]
    pub log_format: crate::record::LogFormat,
    /// `--log-chain`, `--log-key`, `--log-checkpoint`: a verifiable decision log.
    #[command(flatten)]
    pub chain: crate::log::chain::ChainArgs,
    /// Where grants live (default: <policy>/grants/); for a read-only policy
    /// such as a ConfigMap.
    #[arg(long, env = "EGRESSD_GRANTS", value_name = "DIR")]
    pub grants: Option<PathBuf>,
    /// Directory holding the interception CA (`ca.pem`, `ca.key`); enables TLS interception.
    #[arg(long, env = "EGRESSD_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Extra CA certificates (PEM) to trust for origins, beside the system roots.
    #[arg(long, env = "EGRESSD_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,
    /// Leave through this proxy: http://[user:password@]host:port (prefer the
    /// environment variable for credentials, or --upstream-proxy-auth-file).
    #[arg(long, env = "EGRESSD_UPSTREAM_PROXY", value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// File holding `user:password` for --upstream-proxy.
    #[arg(long, env = "EGRESSD_UPSTREAM_PROXY_AUTH_FILE", value_name = "FILE")]
    pub upstream_proxy_auth_file: Option<PathBuf>,
}
