//! DNS: the resolver front-end ([`serve`], in `server`), the upstream client
//! and cache ([`Resolver`], in `resolver`) that the HTTP proxy also resolves
//! through, and the tunnel budget (`budget`) both share.
//!
//! Inside, imports point one way: `server` (receive loops, [`Bounds`]) →
//! `answer` (one query parsed, identified and decided once) → `codec` (the
//! common packet shape), `answer_cache` (allowed answers as sent) and
//! `resolver` → `failures`, `answers`, `budget`, `by_name`, `ech`, `error`.
//!
//! hickory types never leave this module: the public API below speaks
//! [`Host`], [`IpAddr`], [`Policy`] and [`Exception`].
//!
//! What it owns: turning a DNS packet into one policy [`Request`](crate::policy::Request),
//! answering it (denied names never leave egressd, in any form), forwarding
//! allowed names as fresh queries with our own timeouts, caching answers
//! and, for a while, failures (`failures`, RFC 9520),
//! filtering non-public addresses out of answers, removing ECH
//! configurations from HTTPS/SVCB answers (`ech`), the per-client tunnel
//! budget, and (for transparent capture) which allowed name each answered
//! address came from (`answers`) and each allowed name's own address inside
//! the sandbox (`inside`). What it does not own: the decision itself
//! (`Policy::decide`), the log line and metrics (`Recorder::record`), or
//! binding sockets (`app`).
//!
//! What the proxy uses (`proxy::upstream`): one shared [`Resolver`] (an
//! `Arc`, cheap to call concurrently), its [`Resolver::lookup_ip_for`] (A
//! and AAAA through the cache, never `/etc/hosts` or search domains, bounded
//! by our own timeouts, failed upstream exchanges charged to the request's
//! event) and [`Resolver::tunnel_assess`] (the tunnel budget that a
//! client's proxy lookups and its own queries share).

#[cfg(test)]
mod alloc_count;
mod answer;
mod answer_cache;
mod answers;
mod batch;
mod budget;
mod by_name;
mod codec;
mod ech;
mod error;
mod failures;
pub mod inside;
pub mod proxied;
mod resolver;
mod server;

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use anyhow::{bail, Context};

pub use budget::{encoded_weight, TunnelOutcome};
pub use resolver::{ResolveError, Resolver};
pub use server::{serve, serve_proxied, Bounds};

use crate::policy::host::Host;
use crate::policy::{ClientIdx, Exception, Policy, TunnelAction};
use crate::shutdown::Holder;

/// The DNS port `--upstream-dns` entries get when they name none.
pub const DEFAULT_DNS_PORT: u16 = 53;
/// Where nameservers come from when `--upstream-dns` is not given.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

impl Resolver {
    /// Tunnel detection for `host`, which `exception` allowed for `client`.
    /// One budget per client is shared by everything egressd resolves for it:
    /// the proxy's lookups for CONNECT and plain HTTP, and the client's own
    /// DNS queries. Counts `egressd_dns_tunnel_suspected_total{action}` itself
    /// (`block` for [`TunnelOutcome::Block`], `log` for [`TunnelOutcome::Alert`]);
    /// the caller denies a `Block` with reason `dns_tunnel`.
    ///
    /// The budget is the named client's, else its source address `src`'s.
    /// Only names allowed through a wildcard host pattern are budgeted: an
    /// exact host has no room to carry data.
    pub fn tunnel_check(
        &self,
        policy: &Policy,
        client: Option<ClientIdx>,
        src: IpAddr,
        host: &Host,
        exception: &Exception,
        now: i64,
    ) -> TunnelOutcome {
        self.tunnel_assess(policy, client, src, host, exception, now)
            .0
    }

    /// [`Resolver::tunnel_check`] with a one-line explanation for the log's
    /// `note` when the outcome is not `Ok`.
    pub fn tunnel_assess(
        &self,
        policy: &Policy,
        client: Option<ClientIdx>,
        src: IpAddr,
        host: &Host,
        exception: &Exception,
        now: i64,
    ) -> (TunnelOutcome, Option<String>) {
        let settings = &policy.settings.dns.tunnel;
        // Most allowed names match an exact host: decide that without the lock.
        if settings.action == TunnelAction::Off
            || budget::wildcard_suffix(exception, host).is_none()
        {
            return (TunnelOutcome::Ok, None);
        }
        let id = budget_key(policy, client, src);
        let a = self
            .tunnel_detector()
            .check(settings, &id, host, exception, now);
        match a.outcome {
            TunnelOutcome::Ok => {}
            TunnelOutcome::Alert => self.metrics().dns_tunnel.with_label_values(&["log"]).inc(),
            TunnelOutcome::Block => self
                .metrics()
                .dns_tunnel
                .with_label_values(&["block"])
                .inc(),
        }
        (a.outcome, a.note)
    }

    /// A query below `exception`'s wildcard that is not a host name (its
    /// valid rightmost labels are `valid_tail`, `labels_above` more left of
    /// them) was refused `dns_tunnel` for `client`: refuse the wildcard to
    /// that client for the cool-down too. Returns what to add to the note.
    pub(crate) fn tunnel_strike(
        &self,
        policy: &Policy,
        (client, src): (Option<ClientIdx>, IpAddr),
        exception: &Exception,
        valid_tail: &str,
        labels_above: usize,
        now: i64,
    ) -> Option<String> {
        let id = budget_key(policy, client, src);
        self.tunnel_detector().strike(
            &policy.settings.dns.tunnel,
            &id,
            exception,
            valid_tail,
            labels_above,
            now,
        )
    }
}

/// Whose tunnel budget a query spends: the named client, else its source
/// address (an IPv6 source by its /64, as every share is kept): one
/// unnamed client never spends another's (DESIGN "Bounds, backpressure and
/// fairness"). A client id is a word, so no id reads as an address key.
fn budget_key(policy: &Policy, client: Option<ClientIdx>, src: IpAddr) -> Cow<'_, str> {
    match policy.client_id(client) {
        Some(id) => Cow::Borrowed(&**id),
        None => match Holder::addr(src) {
            Holder::Addr(ip) => Cow::Owned(format!("addr {ip}")),
            Holder::Named(id) => Cow::Owned(id.to_string()),
        },
    }
}

/// Parses `--upstream-dns`: `IP` or `IP:PORT` (IPv6 as `[IP]:PORT` or a bare
/// `IP`), comma-separated, port 53 by default. `None` reads the `nameserver`
/// lines of `/etc/resolv.conf` (its `search` and `options` are ignored:
/// egressd never makes a name relative).
pub fn parse_upstreams(spec: Option<&str>) -> anyhow::Result<Vec<SocketAddr>> {
    match spec {
        Some(s) => parse_upstream_list(s),
        None => {
            let text = std::fs::read_to_string(RESOLV_CONF).with_context(|| {
                format!("cannot read {RESOLV_CONF} for upstream DNS servers; pass --upstream-dns")
            })?;
            let list = parse_resolv_conf(&text);
            if list.is_empty() {
                bail!("{RESOLV_CONF} names no usable nameserver; pass --upstream-dns IP[:PORT]");
            }
            Ok(list)
        }
    }
}

fn parse_upstream_list(spec: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let addr = parse_one_upstream(part).with_context(|| {
            format!(
                "invalid --upstream-dns entry {part:?}: expected IP or IP:PORT (IPv6 as [IP]:PORT)"
            )
        })?;
        if addr.ip().is_unspecified() || addr.port() == 0 {
            bail!("invalid --upstream-dns entry {part:?}: an unspecified address or port 0 reaches no server");
        }
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    if out.is_empty() {
        bail!("--upstream-dns names no server");
    }
    Ok(out)
}

fn parse_one_upstream(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let bare = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    let ip: IpAddr = bare.parse()?;
    Ok(SocketAddr::new(ip, DEFAULT_DNS_PORT))
}

/// `nameserver` lines of a resolv.conf. Entries with an IPv6 zone
/// (`fe80::1%eth0`) are skipped: they cannot be dialled without one.
fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) else {
            continue;
        };
        let sa = SocketAddr::new(ip, DEFAULT_DNS_PORT);
        if !ip.is_unspecified() && !out.contains(&sa) {
            out.push(sa);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_lists() {
        let got = parse_upstreams(Some("10.0.0.2, 10.0.0.3:5353,[::1]:54,2001:db8::1")).unwrap();
        let want: Vec<SocketAddr> = [
            "10.0.0.2:53",
            "10.0.0.3:5353",
            "[::1]:54",
            "[2001:db8::1]:53",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(got, want);
        assert_eq!(
            parse_upstreams(Some("[::1]")).unwrap(),
            vec!["[::1]:53".parse().unwrap()]
        );
        for bad in [
            "",
            ",",
            "dns.google",
            "1.2.3.4:99999",
            "0.0.0.0",
            "1.2.3.4:0",
            "1.2.3",
            "[::1",
        ] {
            assert!(parse_upstreams(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resolv_conf() {
        let text = "# comment\nsearch corp.example\nnameserver 10.0.0.2\nnameserver  ::1 # local\n\
                    nameserver fe80::1%eth0\nnameserver 10.0.0.2\noptions ndots:5\nnameserver 0.0.0.0\n";
        let want: Vec<SocketAddr> =
            vec!["10.0.0.2:53".parse().unwrap(), "[::1]:53".parse().unwrap()];
        assert_eq!(parse_resolv_conf(text), want);
        assert!(parse_resolv_conf("search x\n").is_empty());
    }
}
