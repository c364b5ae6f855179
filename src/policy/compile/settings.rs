//! `settings:` (in at most one file): the defaults of [`Settings`] with
//! what the file sets, and the named clients.

use std::collections::HashMap;

use super::locate::locate;
use super::{Errors, File};
use crate::policy::raw::{RawClient, RawDns, RawGrantSettings, RawLimits, RawSettings, RawTunnel};
use crate::policy::{Client, DnsSettings, Limits, Settings, Source};

/// The settings and clients of the one file that has a `settings:` block
/// (a second one is an error). Files copied from the previous policy have
/// none.
pub(super) fn settings(files: &[File<'_, '_>], errs: &mut Errors) -> (Settings, Vec<Client>) {
    let mut settings = Settings::default();
    let mut clients = Vec::new();
    let mut settings_src: Option<&Source> = None;
    for file in files {
        let src = file.src;
        let Some(s) = file.raw().and_then(|f| f.settings.as_ref()) else {
            continue;
        };
        if let Some(first) = settings_src {
            errs.at(
                src,
                locate(&src.text, "settings", ""),
                format!(
                    "settings: may appear in one file only (already in {})",
                    first.path.display()
                ),
            );
            continue;
        }
        settings_src = Some(src);
        let (line, _) = locate(&src.text, "settings", "");
        settings.location = Some((src.path.clone(), line));
        apply(s, &mut settings);
        if let Some(dns) = &s.dns {
            apply_dns(dns, &mut settings.dns, src, errs);
        }
        if let Some(l) = &s.limits {
            apply_limits(l, &mut settings.limits);
        }
        if let Some(g) = &s.grants {
            apply_grants(g, &mut settings.grants);
        }
        clients = named_clients(&s.clients, src, errs);
    }
    (settings, clients)
}

/// The top-level settings a file sets over the defaults.
fn apply(s: &RawSettings, settings: &mut Settings) {
    if let Some(m) = s.mode {
        settings.mode = m;
    }
    if let Some(p) = s.private_destinations {
        settings.private_destinations = p;
    }
    if let Some(d) = &s.stale_after {
        settings.stale_after_secs = d.0;
    }
    if let Some(c) = &s.contact {
        settings.contact = c.trim().to_string();
    }
    if let Some(tls) = &s.tls {
        if let Some(m) = tls.missing_sni {
            settings.missing_sni = m;
        }
    }
}

/// `settings.dns`: the deny rcode, the cache's TTL bounds (min at most
/// max), the tunnel thresholds.
fn apply_dns(dns: &RawDns, out: &mut DnsSettings, src: &Source, errs: &mut Errors) {
    if let Some(r) = dns.deny_rcode {
        out.deny_rcode = r;
    }
    if let Some(d) = &dns.cache_min_ttl {
        out.cache_min_ttl = d.0;
    }
    if let Some(d) = &dns.cache_max_ttl {
        out.cache_max_ttl = d.0;
    }
    if out.cache_min_ttl > out.cache_max_ttl {
        errs.at(
            src,
            locate(&src.text, "cache_min_ttl", ""),
            "dns.cache_min_ttl is larger than dns.cache_max_ttl".into(),
        );
    }
    if let Some(t) = &dns.tunnel {
        apply_tunnel(t, out);
    }
}

fn apply_tunnel(t: &RawTunnel, out: &mut DnsSettings) {
    let ts = &mut out.tunnel;
    if let Some(a) = t.action {
        ts.action = a;
    }
    macro_rules! set {
        ($f:ident) => {
            if let Some(v) = t.$f {
                ts.$f = v;
            }
        };
        ($f:ident, $g:ident) => {
            if let Some(v) = &t.$f {
                ts.$g = v.0;
            }
        };
    }
    set!(max_name_len);
    set!(max_label_len);
    set!(alert_unique_names);
    set!(alert_bytes);
    set!(block_bytes);
    set!(daily_bytes);
    set!(alert_window, alert_window_secs);
    set!(block_window, block_window_secs);
    set!(cooldown, cooldown_secs);
}

/// `settings.grants`: the ceiling.
fn apply_grants(g: &RawGrantSettings, out: &mut crate::policy::grant::GrantSettings) {
    if let Some(d) = &g.max_ttl {
        out.max_ttl_secs = d.0;
    }
    out.max_uses = g.max_uses;
    out.never = g.never.iter().map(|p| p.0.clone()).collect();
}

/// `settings.limits` (its ranges were checked when it was read).
fn apply_limits(l: &RawLimits, out: &mut Limits) {
    if let Some(n) = l.connections_per_client {
        out.connections_per_client = n.0;
    }
    if let Some(d) = &l.header_timeout {
        out.header_timeout_secs = d.0;
    }
    if let Some(d) = &l.stall_timeout {
        out.stall_timeout_secs = d.0;
    }
    if let Some(n) = l.log_lines_per_client_per_sec {
        out.log_lines_per_client_per_sec = n.0;
    }
}

/// `settings.clients`: unique ids, each with sources or a token.
fn named_clients(raw: &[RawClient], src: &Source, errs: &mut Errors) -> Vec<Client> {
    let mut clients = Vec::with_capacity(raw.len());
    let mut seen = HashMap::new();
    for c in raw {
        if seen.insert(c.id.0.clone(), ()).is_some() {
            errs.at(
                src,
                locate(&src.text, "id", &c.id.0),
                format!("duplicate client id {:?}", c.id.0),
            );
        }
        if c.sources.is_empty() && c.token_sha256.is_none() {
            errs.at(
                src,
                locate(&src.text, "id", &c.id.0),
                format!("client {:?} needs sources: or token_sha256:", c.id.0),
            );
        }
        clients.push(Client {
            id: c.id.0.as_str().into(),
            sources: c.sources.iter().map(|n| n.0).collect(),
            token_sha256: c.token_sha256.as_ref().map(|t| t.0),
        });
    }
    clients
}
