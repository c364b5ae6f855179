//! Tunnel-detection evaluation you can rerun:
//!
//!     cargo run --release --example tunnel_eval [-- POLICY.yaml]
//!
//! Replays generated DNS tunnel traffic (iodine-, dnscat2- and dns2tcp-shaped
//! queries carrying a 20 KiB payload, in bursts and slow drips) and the benign
//! corpus (`tests/it/attack/dns_tools/benign_names.txt`, 500+ realistic names
//! resolved the way clients resolve them) through egressd's detector with
//! simulated time, and prints what each tunnel moved before it was stopped and
//! the false positives. The replay itself is `tests/it/attack/dns_tools/eval.rs`,
//! which the test suite runs with the same targets.
//!
//! Exits 1 when a burst moves more than 1 KiB, a drip more than 8 KiB in a
//! day, or any benign name is refused. The settings are the policy's: the
//! shipped defaults, or `settings.dns.tunnel` of the YAML file given.

#[path = "../tests/it/attack/dns_tools/eval.rs"]
mod eval;

use eval::{BURST_TARGET, DAY_TARGET, PAYLOAD_BYTES};

fn main() {
    let settings = std::env::args()
        .nth(1)
        .map(|path| std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")));
    let policy = eval::policy(settings.as_deref());
    let t = &policy.settings.dns.tunnel;
    println!(
        "settings: action={:?} max_name_len={} max_label_len={} alert={}B/{}names per {}s block={}B per {}s daily={}B cooldown={}s",
        t.action,
        t.max_name_len,
        t.max_label_len,
        t.alert_bytes,
        t.alert_unique_names,
        t.alert_window_secs,
        t.block_bytes,
        t.block_window_secs,
        t.daily_bytes,
        t.cooldown_secs
    );
    let payload = eval::payload();
    let mut ok = true;

    println!(
        "\nTunnels: {PAYLOAD_BYTES} bytes of payload; bursts at 10 queries/s, drips for 3 days"
    );
    println!(
        "{:<46} {:>6} {:>8} {:>8} {:>9} {:>9} {:>9}  {:<13} verdict",
        "tunnel", "B/qry", "alert at", "allowed", "leaked B", "name B", "max B/day", "stopped by"
    );
    for run in eval::tunnels(&payload) {
        let r = eval::replay(&policy, &run, 3);
        let pass = if run.burst {
            r.leaked <= BURST_TARGET
        } else {
            r.max_per_day <= DAY_TARGET
        };
        ok &= pass;
        println!(
            "{:<46} {:>6} {:>8} {:>8} {:>9} {:>9} {:>9}  {:<13} {}",
            run.label,
            run.per_query,
            r.first_alert.map_or("-".to_string(), |q| format!("#{q}")),
            r.allowed,
            r.leaked,
            r.name_bytes,
            r.max_per_day,
            r.stopped_by,
            match (run.burst, pass) {
                (_, true) => "ok".to_string(),
                (true, false) => format!("MISSED (> {BURST_TARGET} B)"),
                (false, false) => format!("MISSED (> {DAY_TARGET} B a day)"),
            }
        );
    }

    println!(
        "\nBenign corpus: {} names in {} workloads; each pattern is one client",
        eval::corpus_names().len(),
        eval::workloads().len()
    );
    println!(
        "{:<52} {:>6} {:>8} {:>7} {:>7}  false positives",
        "pattern", "names", "queries", "alerts", "blocked"
    );
    let row = |label: &str, r: &eval::BenignResult| {
        println!(
            "{:<52} {:>6} {:>8} {:>7} {:>7}  {}",
            label,
            r.names,
            r.queries,
            r.alerts,
            r.blocked_queries,
            if r.blocked_names.is_empty() {
                "0".to_string()
            } else {
                format!("{} (e.g. {})", r.blocked_names.len(), r.blocked_names[0])
            }
        );
    };
    let mut false_positives = 0;
    for (label, r) in eval::benign_patterns(&policy) {
        false_positives += r.blocked_names.len();
        row(&label, &r);
    }
    // Headroom: the smallest hourly budget (others as set) the patterns pass.
    let refused_with = |block: u64| {
        let mut p = eval::policy(settings.as_deref());
        p.settings.dns.tunnel.block_bytes = block;
        eval::benign_patterns(&p)
            .iter()
            .map(|(_, r)| r.blocked_names.len())
            .sum::<usize>()
    };
    let block = policy.settings.dns.tunnel.block_bytes;
    if refused_with(block) == 0 {
        let (mut lo, mut hi) = (0u64, block);
        while hi - lo > 8 {
            let mid = (lo + hi) / 2;
            if refused_with(mid) == 0 {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        println!(
            "the patterns pass with block_bytes down to about {hi} ({}% of {block})",
            hi * 100 / block.max(1)
        );
    }
    let busy = eval::busy_hour(&policy, &eval::workloads());
    println!("\nBeyond the budget (not a target: where it ends):");
    row("one client, every workload in the same hour", &busy);
    ok &= false_positives == 0;
    println!(
        "\ntargets: bursts <= {BURST_TARGET} B, drips <= {DAY_TARGET} B a day, no benign name refused ({false_positives} refused) => {}",
        if ok { "MET" } else { "MISSED" }
    );
    if !ok {
        std::process::exit(1);
    }
}
