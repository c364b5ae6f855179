//! `egressd run [OPTIONS] -- CMD…`: runs CMD in fresh user, mount, network,
//! PID, IPC and UTS namespaces whose only way out is egressd.
//!
//! ```text
//!  gather host facts ─► plan::build (pure) ─► namespaces::create ─► serve the inside sockets ─► go ─► wait
//!                                              (outer, init; lo up,   (embedded egressd via
//!                                               sockets bound inside)  app::start, or relay)
//! ```
//!
//! Inside, 127.0.0.1:3128 (proxy) and 127.0.0.1:53 (DNS, UDP and TCP) are
//! sockets created in the sandbox's network namespace and served from
//! outside it; there is no other interface than `lo`, so there is no other
//! route. With `--transparent`, 127.0.0.1:3129 (and [::1]:3129) join them:
//! nftables rules inside send every other TCP connection there, and the
//! embedded egressd decides it like a proxied one (`proxy::transparent`). Exit status: CMD's (128+n when a signal ended it), 124 when
//! `--timeout` ended it, 125 when the sandbox could not be set up.
//!
//! This module is the `run` command's wiring (its `app.rs`): errors are
//! reported here and turned into the exit status.

pub mod env;
pub mod limits;
pub mod namespaces;
pub mod plan;
pub mod relay;
mod sys;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::app::{self, Listeners};
use crate::cli::RunArgs;

use namespaces::{Sandbox, FORWARDED};
use plan::{Egress, HostFacts, Options, Plan};

/// Exit status when `--timeout` ended CMD (as timeout(1)).
pub const EXIT_TIMEOUT: u8 = 124;
/// Exit status when the sandbox could not be set up (as env(1), timeout(1)).
pub const EXIT_SETUP: u8 = 125;

/// Runs `egressd run`; returns the process's exit status. Must be called
/// while the process is single-threaded: it forks before starting threads.
pub fn main(args: RunArgs) -> u8 {
    let plan = match prepare(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("egressd run: {e}");
            return EXIT_SETUP;
        }
    };
    notes(&plan);

    // Blocked before the fork so that every process of the tree starts with
    // them blocked (init waits for them; CMD unblocks them).
    let forwarded = sys::SigSet::of(FORWARDED);
    if let Err(e) = forwarded.block() {
        eprintln!("egressd run: cannot block signals: {e}");
        return EXIT_SETUP;
    }
    let (sandbox, inside) = match namespaces::create(&plan) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("egressd run: cannot set up the sandbox: {e}");
            return EXIT_SETUP;
        }
    };
    let sandbox = Arc::new(sandbox);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("egressd run: cannot start runtime: {e}");
            sandbox.kill();
            sandbox.wait();
            return EXIT_SETUP;
        }
    };
    let code = rt.block_on(supervise(&args, &plan, sandbox, inside, forwarded));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

/// Everything checked and decided before a namespace exists.
fn prepare(args: &RunArgs) -> Result<Plan, String> {
    let facts = gather(args)?;
    let opts = Options {
        command: args.command.clone(),
        env: args.env.clone(),
        limits: limits::Limits {
            memory: args.memory,
            cpu_secs: args.cpu,
            pids: args.pids,
            file_size: args.file_size,
        },
        timeout: args.timeout,
        connect: args.connect,
        connect_dns: args.connect_dns,
        client: args.client.clone(),
        transparent: args.transparent,
    };
    if args.token_file.is_some() && args.client.is_none() {
        return Err("--token-file needs --client".into());
    }
    plan::build(&opts, &facts).map_err(|e| e.to_string())
}

/// Reads what the plan needs to know about the host.
fn gather(args: &RunArgs) -> Result<HostFacts, String> {
    let cwd = std::env::current_dir()
        .and_then(|d| d.canonicalize())
        .map_err(|e| format!("cannot read the working directory: {e}"))?;
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .and_then(|h| h.canonicalize().ok())
        .filter(|h| h.is_dir());
    let scratch = plan::SCRATCH
        .iter()
        .map(|(p, _)| PathBuf::from(p))
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect();
    let mut binds = Vec::new();
    for (paths, writable, flag) in [(&args.ro, false, "--ro"), (&args.rw, true, "--rw")] {
        for p in paths {
            let c = cwd
                .join(p)
                .canonicalize()
                .map_err(|e| format!("{flag} {}: {e}", p.display()))?;
            binds.push((c, writable));
        }
    }
    let token = if args.client.is_none() {
        None
    } else if let Some(f) = &args.token_file {
        let t =
            std::fs::read_to_string(f).map_err(|e| format!("--token-file {}: {e}", f.display()))?;
        Some(t.trim_end_matches(['\n', '\r']).to_string())
    } else {
        std::env::var("EGRESSD_TOKEN").ok()
    };
    let ca = match &args.ca_dir {
        None => None,
        Some(d) => {
            let at = |e: &dyn std::fmt::Display| format!("--ca-dir {}: {e}", d.display());
            let dir = cwd.join(d).canonicalize().map_err(|e| at(&e))?;
            // The system roots plus egressd's CA, rewritten for each run so a
            // renewed CA or updated roots are picked up.
            let bundle = crate::tls::sandbox_ca_bundle(&dir).map_err(|e| at(&e))?;
            Some(plan::CaTrust {
                cert: crate::tls::ca_cert_path(&dir),
                bundle,
                system_bundle: crate::tls::roots::system_bundle()
                    .and_then(|p| p.canonicalize().ok()),
                dir,
            })
        }
    };
    let nft = if args.transparent {
        find_nft(args.nft.as_deref())?
    } else {
        None
    };
    Ok(HostFacts {
        uid: sys::getuid(),
        gid: sys::getgid(),
        cwd,
        home,
        scratch,
        resolv_conf: resolv_conf_target(Path::new("/etc/resolv.conf")),
        env: std::env::vars_os().collect(),
        binds,
        token,
        ca,
        nft,
    })
}

/// The `nft` program for `--transparent`: `--nft` (which must exist), else
/// the first executable `nft` in PATH or [`plan::NFT_DIRS`].
fn find_nft(given: Option<&Path>) -> Result<Option<PathBuf>, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(p) = given {
        let p = p
            .canonicalize()
            .map_err(|e| format!("--nft {}: {e}", p.display()))?;
        if !executable(&p) {
            return Err(format!("--nft {}: not an executable file", p.display()));
        }
        return Ok(Some(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    Ok(std::env::split_paths(&path)
        .chain(plan::NFT_DIRS.iter().map(PathBuf::from))
        .filter(|d| d.is_absolute())
        .map(|d| d.join("nft"))
        .find(|p| executable(p))
        .and_then(|p| p.canonicalize().ok()))
}

/// Where a resolv.conf bind must land: the file `/etc/resolv.conf` leads
/// to, even when that is a dangling symlink into `/run` (systemd-resolved's
/// stub file, which the sandbox's fresh `/run` does not have).
fn resolv_conf_target(p: &Path) -> Option<PathBuf> {
    if let Ok(c) = p.canonicalize() {
        return Some(c);
    }
    let link = std::fs::read_link(p).ok()?;
    Some(p.parent().unwrap_or(Path::new("/")).join(link))
}

/// Tells the user what the environment scrub kept out (names only).
fn notes(plan: &Plan) {
    if !plan.dropped_credentials.is_empty() {
        let others = match plan.dropped_other {
            0 => String::new(),
            n => format!(" (and {n} other variables not on the allowlist)"),
        };
        eprintln!(
            "egressd run: not passed into the sandbox (look like credentials; pass one with --env NAME): {}{others}",
            plan.dropped_credentials.join(", ")
        );
    }
    if !plan.missing_env.is_empty() {
        eprintln!(
            "egressd run: --env names not set here, left unset inside: {}",
            plan.missing_env.join(", ")
        );
    }
}

enum Egressd {
    Embedded(app::Running),
    Relay(relay::Relay),
}

/// Serves the inside sockets, starts CMD, and waits for it (or the timeout).
async fn supervise(
    args: &RunArgs,
    plan: &Plan,
    sandbox: Arc<Sandbox>,
    inside: namespaces::InsideSockets,
    forwarded: sys::SigSet,
) -> u8 {
    let egressd = match serve(args, plan, inside).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("egressd run: {e:#}");
            sandbox.kill();
            let s = sandbox.clone();
            let _ = tokio::task::spawn_blocking(move || s.wait()).await;
            return EXIT_SETUP;
        }
    };

    // Signals a process sends the launcher are passed on to CMD (through
    // init). The thread blocks in sigwaitinfo for the life of the process.
    {
        let s = sandbox.clone();
        let spawned = std::thread::Builder::new()
            .name("egressd-run-signals".into())
            .spawn(move || {
                while let Ok((sig, code)) = forwarded.wait() {
                    // A terminal's ^C (SI_KERNEL) already reached CMD, which
                    // is in the launcher's process group.
                    if matches!(code, libc::SI_USER | libc::SI_QUEUE | libc::SI_TKILL) {
                        let _ = s.signal(sig);
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("egressd run: cannot start the signal thread: {e}");
            sandbox.kill();
            return EXIT_SETUP;
        }
    }

    if let Err(e) = sandbox.go() {
        eprintln!("egressd run: {e}");
        sandbox.kill();
        return EXIT_SETUP;
    }
    let waiter = {
        let s = sandbox.clone();
        tokio::task::spawn_blocking(move || s.wait())
    };
    tokio::pin!(waiter);
    let mut timed_out = false;
    let status = match plan.timeout {
        None => waiter.await,
        Some(limit) => tokio::select! {
            s = &mut waiter => s,
            _ = tokio::time::sleep(limit) => {
                timed_out = true;
                sandbox.kill();
                waiter.await
            }
        },
    }
    .unwrap_or(EXIT_SETUP);

    match egressd {
        Egressd::Embedded(running) => running.shutdown().await,
        Egressd::Relay(r) => r.stop(),
    }
    if timed_out {
        eprintln!(
            "egressd run: timed out after {}; the sandbox was killed",
            humanize(plan.timeout.unwrap_or_default())
        );
        return EXIT_TIMEOUT;
    }
    status
}

fn humanize(d: Duration) -> String {
    if d.subsec_millis() != 0 {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

/// Starts whatever serves the inside sockets.
async fn serve(
    args: &RunArgs,
    plan: &Plan,
    inside: namespaces::InsideSockets,
) -> anyhow::Result<Egressd> {
    for s in [&inside.proxy, &inside.dns_tcp] {
        s.set_nonblocking(true)?;
    }
    inside.dns_udp.set_nonblocking(true)?;
    let proxy = tokio::net::TcpListener::from_std(inside.proxy)?;
    let dns_udp = tokio::net::UdpSocket::from_std(inside.dns_udp)?;
    let dns_tcp = tokio::net::TcpListener::from_std(inside.dns_tcp)?;
    let mut transparent = Vec::new();
    for l in inside.capture {
        l.set_nonblocking(true)?;
        transparent.push(tokio::net::TcpListener::from_std(l)?);
    }
    Ok(match &plan.egress {
        Egress::Embedded => {
            let listeners = Listeners {
                proxy,
                dns_udp,
                dns_tcp,
                metrics: None,
                transparent,
            };
            Egressd::Embedded(app::start(&args.embedded_serve_args(), listeners).await?)
        }
        Egress::Connect { proxy: p, dns } => {
            Egressd::Relay(relay::Relay::start(proxy, dns_udp, dns_tcp, *p, *dns))
        }
    })
}
