//! Wiring only: load the policy → start the log → bind → spawn the
//! front-ends and the reloader → wait for a signal → stop accepting.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, UdpSocket};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

use crate::cli::ServeArgs;
use crate::decision::Recorder;
use crate::log::{LogSink, LogTarget};
use crate::metrics::Metrics;
use crate::policy::reload::{PolicyHandle, Reloader};
use crate::proxy::{self, ProxyCtx};
use crate::{dns, policy};

/// How long open connections get to finish after SIGTERM/SIGINT.
const DRAIN: Duration = Duration::from_secs(5);

/// Binds the resolver's UDP socket and a TCP listener on the same port.
/// With port 0 the kernel picks the UDP port, which may be taken for TCP:
/// then try another.
async fn bind_dns(addr: std::net::SocketAddr) -> Result<(UdpSocket, TcpListener)> {
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

pub async fn serve(args: ServeArgs) -> Result<()> {
    let metrics = Metrics::new();
    let pol = policy::load(&args.policy).map_err(|e| {
        anyhow::anyhow!("{e}\negressd: policy {} is invalid", args.policy.display())
    })?;
    let n_exceptions = pol.exceptions.len();
    metrics.sync_policy(&pol);
    let handle = PolicyHandle::new(pol);

    let log = LogSink::start(LogTarget::parse(&args.log), metrics.clone())
        .with_context(|| format!("cannot open decision log {}", args.log))?;
    let recorder = Recorder::new(log.clone(), metrics.clone());
    let upstreams = dns::parse_upstreams(args.upstream_dns.as_deref()).context("--upstream-dns")?;
    let resolver = dns::Resolver::new(upstreams.clone(), metrics.clone());

    let proxy_l = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let (dns_udp, dns_tcp) = bind_dns(args.dns_listen).await?;
    let dns_addr = dns_udp.local_addr()?;
    let metrics_l = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
    let proxy_addr = proxy_l.local_addr()?;
    let metrics_addr = metrics_l.local_addr()?;

    // Handlers before anything is announced: a SIGHUP that arrives early
    // must reload, not kill (its default action).
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let ctx = Arc::new(ProxyCtx {
        policy: handle.clone(),
        recorder: recorder.clone(),
        resolver: resolver.clone(),
        own_addrs: vec![proxy_addr, dns_addr, metrics_addr],
        http: proxy::upstream::http_client(),
    });
    tokio::spawn(proxy::serve(proxy_l, ctx, shutdown_rx.clone()));
    {
        let (h, r, rec, s) = (
            handle.clone(),
            resolver.clone(),
            recorder.clone(),
            shutdown_rx.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = dns::serve(dns_udp, dns_tcp, h, r, rec, s).await {
                eprintln!("egressd: DNS resolver stopped: {e:#}");
            }
        });
    }
    let lh = log.clone();
    tokio::spawn(crate::metrics::serve(
        metrics_l,
        metrics.clone(),
        move || lh.healthy(),
        shutdown_rx.clone(),
    ));
    let (hup_tx, hup_rx) = mpsc::unbounded_channel();
    let reloader = Reloader::new(args.policy.clone(), handle.clone(), metrics.clone());
    tokio::spawn(reloader.run(hup_rx, shutdown_rx.clone()));
    metrics.set_ready();

    eprintln!(
        "egressd: listening proxy={proxy_addr} dns={dns_addr} metrics={metrics_addr} policy={} exceptions={n_exceptions} upstream_dns={}",
        args.policy.display(),
        upstreams.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
    );

    loop {
        tokio::select! {
            _ = hup.recv() => { let _ = hup_tx.send(()); }
            _ = usr1.recv() => { eprintln!("egressd: reopening decision log"); log.reopen(); }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    eprintln!("egressd: shutting down");
    let _ = shutdown_tx.send(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = tokio::time::timeout(DRAIN, async {
        while metrics.active.with_label_values(&["connect"]).get()
            + metrics.active.with_label_values(&["http"]).get()
            > 0
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    Ok(())
}
