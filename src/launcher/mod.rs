//! `egressd run [OPTIONS] -- CMD…`: runs CMD in fresh user, mount, network,
//! PID, IPC and UTS namespaces whose only way out is egressd.
//!
//! ```text
//!  gather host facts ─► plan::build (pure) ─► command::check ─► cgroup::create ─► namespaces::create
//!       ─► serve the inside sockets ─► go ─► wait (timeout, --cpu, OOM) ─► remove the cgroup
//!          (embedded egressd via app::start, or relay)
//! ```
//!
//! Inside, 127.0.0.1:3128 (proxy) and 127.0.0.1:53 (DNS, UDP and TCP) are
//! sockets created in the sandbox's network namespace and served from
//! outside it; there is no other interface than `lo`, so there is no other
//! route. With `--transparent`, 127.0.0.1:3129 (and [::1]:3129) join them:
//! nftables rules inside send every other TCP connection there, and the
//! embedded egressd decides it like a proxied one (`proxy::transparent`).
//!
//! Exit status: CMD's (128+n when a signal ended it), 124 when `--timeout`
//! ended it, 152 (128 + SIGXCPU, as the per-process rlimit would) when the
//! sandbox used up `--cpu`, 125 when the sandbox could not be set up, 127
//! when CMD cannot be found — including when the host has it only where
//! the sandbox does not look (with the `--ro` to pass).
//!
//! This module is the `run` command's wiring (its `app.rs`): errors are
//! reported here and turned into the exit status.

pub mod args;
pub mod cgroup;
pub mod command;
pub mod env;
pub mod git_watch;
pub mod guard;
pub mod identity;
pub mod limits;
pub mod namespaces;
pub mod nss;
pub mod plan;
pub mod relay;
pub mod seccomp;
mod sys;
pub mod view;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::app::{self, Listeners};
pub use args::RunArgs;

use cgroup::Cgroups;
use identity::{Account, Caller};
use limits::Limits;
use namespaces::{Sandbox, Setup, FORWARDED};
use plan::{Egress, HostFacts, Options, Plan};
use view::SystemEntry;

/// The client the embedded egressd names the sandbox when `--client` does
/// not: its lines say `"client": "sandbox"`, and a policy declares a client
/// of this id to give the sandbox exceptions of its own.
pub const SANDBOX_CLIENT: &str = "sandbox";

/// Exit status when `--timeout` ended CMD (as timeout(1)).
pub const EXIT_TIMEOUT: u8 = 124;
/// Exit status when the sandbox could not be set up (as env(1), timeout(1)).
pub const EXIT_SETUP: u8 = 125;
/// Exit status when CMD cannot be found (as env(1)).
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit status when the sandbox used up `--cpu`: 128 + SIGXCPU, what the
/// per-process rlimit gives a shell.
pub const EXIT_CPU: u8 = 128 + libc::SIGXCPU as u8;
/// The shortest wait between two looks at the sandbox's CPU time: the
/// limit is overrun by at most this much per CPU.
const CPU_CHECK_MIN: Duration = Duration::from_millis(10);
/// The longest (so that a sandbox that starts using CPU late is still
/// caught soon after it could have used its time up).
const CPU_CHECK_MAX: Duration = Duration::from_secs(1);

/// Runs `egressd run`; returns the process's exit status. Must be called
/// while the process is single-threaded: it forks before starting threads.
pub fn main(args: RunArgs) -> u8 {
    let (plan, found) = match prepare(&args) {
        Ok(p) => p,
        Err((code, e)) => {
            eprintln!("egressd run: {e}");
            return code;
        }
    };
    notes(&plan);
    if matches!(plan.egress, Egress::Embedded) {
        eprintln!("egressd run: decision log: {}", found.log.display());
    }

    // The cgroup is made (and later removed) by the launcher, which stays
    // outside it; the sandbox's outer process joins it first thing.
    let (mut cgroups, uncovered) =
        cgroup::create(&plan.limits, &format!("egressd-run-{}", sys::getpid()));
    fallback_note(&plan, &uncovered);
    let setup = setup(&plan, &cgroups, &uncovered);

    // Blocked before the fork so that every process of the tree starts with
    // them blocked (init waits for them; CMD unblocks them).
    let forwarded = sys::SigSet::of(FORWARDED);
    if let Err(e) = forwarded.block() {
        eprintln!("egressd run: cannot block signals: {e}");
        return EXIT_SETUP;
    }
    let (sandbox, inside) = match namespaces::create(&plan, &setup) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("egressd run: cannot set up the sandbox: {e}");
            return EXIT_SETUP;
        }
    };
    let sandbox = Arc::new(sandbox);
    // After the fork (the watch is a thread), before CMD starts.
    let git_watch = match plan.view.pinned_git().map(git_watch::GitWatch::start) {
        None => None,
        Some(Ok(w)) => Some(w),
        Some(Err(e)) => {
            eprintln!("egressd run: {e}");
            sandbox.kill();
            sandbox.wait();
            return EXIT_SETUP;
        }
    };
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
    let code = rt.block_on(supervise(
        &args,
        &found,
        &plan,
        sandbox,
        inside,
        forwarded,
        &mut cgroups,
    ));
    rt.shutdown_timeout(Duration::from_secs(1));
    drop(cgroups);
    if let Some(w) = git_watch {
        say_quarantined(w.sweep().len());
    }
    code
}

/// Says how many files planted in `.git` were moved aside, if any.
fn say_quarantined(moved: usize) {
    if moved > 0 {
        eprintln!(
            "egressd run: {moved} file(s) the sandbox planted in .git were moved aside (named \
             *.egressd-quarantined-*): review them, then delete them"
        );
    }
}

/// What the sandbox's processes are set up with: the cgroups they join,
/// and as rlimits the limits no cgroup covers.
fn setup(plan: &Plan, cgroups: &Cgroups, uncovered: &cgroup::Uncovered) -> Setup {
    Setup {
        cgroups: cgroups.procs(),
        rlimits: Limits {
            file_size: plan.limits.file_size,
            // RLIMIT_NPROC counts the sandbox uid's processes in its user
            // namespace; started unprivileged, egressd's own two there
            // (outer, init) have that uid too.
            pids: uncovered
                .limits
                .pids
                .map(|n| match plan.identity.privileged {
                    true => n,
                    false => n.saturating_add(cgroup::OWN_TASKS),
                }),
            ..uncovered.limits.clone()
        },
    }
}

/// Everything checked and decided before a namespace exists; the exit
/// status and the reason when the sandbox is not to be made.
fn prepare(args: &RunArgs) -> Result<(Plan, guard::Found), (u8, String)> {
    let setup = |e: String| (EXIT_SETUP, e);
    let (facts, found) = gather(args).map_err(setup)?;
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
        cwd: args.cwd,
        uid: args.uid,
        gid: args.gid,
        git_writable: args.git_writable,
    };
    if args.token_file.is_some() && args.client.is_none() {
        return Err(setup("--token-file needs --client".into()));
    }
    let plan = plan::build(&opts, &facts).map_err(|e| setup(e.to_string()))?;
    let cmd = command::lookup(
        std::ffi::OsStr::from_bytes(plan.argv[0].as_bytes()),
        &plan.path_var(),
        &plan.cwd,
        &facts.env,
    );
    command::check(&cmd, &plan.view, &plan.home).map_err(|e| (EXIT_NOT_FOUND, e.to_string()))?;
    Ok((plan, found))
}

/// Whether this process is in the initial user namespace (whose uid map is
/// the identity over every id).
fn in_initial_userns() -> bool {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let words: Vec<&str> = map.split_whitespace().collect();
    words == ["0", "0", "4294967295"]
}

/// `--owner USER`, `--owner UID` or `--owner UID:GID`.
fn owner_account(spec: &str) -> Result<Account, String> {
    let number = |s: &str| s.parse::<u32>().ok();
    if let Some((u, g)) = spec.split_once(':') {
        if let (Some(uid), Some(gid)) = (number(u), number(g)) {
            return Ok(Account {
                name: spec.into(),
                uid,
                gid,
            });
        }
        return Err(format!("--owner {spec}: use USER, UID or UID:GID"));
    }
    if let Some(uid) = number(spec) {
        return Ok(Account {
            name: spec.into(),
            uid,
            gid: uid,
        });
    }
    match sys::account(spec) {
        Ok(Some((uid, gid))) => Ok(Account {
            name: spec.into(),
            uid,
            gid,
        }),
        Ok(None) => Err(format!("--owner {spec}: no such user")),
        Err(e) => Err(format!("--owner {spec}: cannot look the user up: {e}")),
    }
}

/// The system's top-level trees as the host has them (a merged-/usr
/// link stays a link).
fn system_entries() -> Result<Vec<(PathBuf, SystemEntry)>, String> {
    let mut system = Vec::new();
    for s in view::SYSTEM {
        let p = Path::new(s);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(p).map_err(|e| format!("{s}: {e}"))?;
                system.push((p.to_path_buf(), SystemEntry::Symlink(target)));
            }
            Ok(m) if m.is_dir() => system.push((p.to_path_buf(), SystemEntry::Dir)),
            _ => {}
        }
    }
    Ok(system)
}

/// The secrets under `/etc` to mask (each also where its link leads),
/// with whether each is a directory.
fn etc_secrets() -> Vec<(PathBuf, bool)> {
    let mut secrets: Vec<PathBuf> = view::ETC_SECRETS.iter().map(PathBuf::from).collect();
    if let Ok(dir) = std::fs::read_dir(view::SSH_DIR) {
        secrets.extend(
            dir.filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| view::is_etc_secret(p)),
        );
    }
    let mut etc_secrets = Vec::new();
    for s in secrets {
        // A secret behind a symlink is masked where the link leads.
        if let Ok(real) = s.canonicalize() {
            let dir = real.is_dir();
            if real != s {
                etc_secrets.push((real, dir));
            }
            etc_secrets.push((s, dir));
        }
    }
    etc_secrets
}

/// `--ca-dir`'s trust for the sandbox: the CA, the bundle with it, an NSS
/// database for HOME.
fn ca_trust(cwd: &Path, d: &Path) -> Result<plan::CaTrust, String> {
    let at = |e: &dyn std::fmt::Display| format!("--ca-dir {}: {e}", d.display());
    let dir = cwd.join(d).canonicalize().map_err(|e| at(&e))?;
    // The system roots plus egressd's CA, rewritten for each run so a
    // renewed CA or updated roots are picked up.
    let bundle = crate::tls::sandbox_ca_bundle(&dir).map_err(|e| at(&e))?;
    let cert = crate::tls::ca_cert_path(&dir);
    // Read now, once: another launcher may rename a new bundle
    // over this one at any time (a whole file either way).
    let read = |p: &Path| std::fs::read(p).map_err(|e| at(&format!("{}: {e}", p.display())));
    let (bundle_pem, cert_pem) = (read(&bundle)?, read(&cert)?);
    let nssdb = nss::database(&cert).unwrap_or_else(|e| {
        eprintln!(
            "egressd run: no NSS database for the sandbox's HOME ({e}): Chromium and \
             other NSS programs inside will refuse intercepted sites; programs that \
             read SSL_CERT_FILE and the other CA variables still trust egressd's CA"
        );
        Vec::new()
    });
    Ok(plan::CaTrust {
        nssdb,
        cert: cert_pem,
        bundle: bundle_pem,
        system_bundle: crate::tls::roots::system_bundle().and_then(|p| p.canonicalize().ok()),
        dir,
    })
}

/// Reads what the plan needs to know about the host, and finds egressd's
/// own files.
fn gather(args: &RunArgs) -> Result<(HostFacts, guard::Found), String> {
    let cwd = std::env::current_dir()
        .and_then(|d| d.canonicalize())
        .map_err(|e| format!("cannot read the working directory: {e}"))?;
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .and_then(|h| h.canonicalize().ok())
        .filter(|h| h.is_dir());
    let system = system_entries()?;
    let etc_secrets = etc_secrets();
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
    let ca = match &args.engine.ca_dir {
        None => None,
        Some(d) => Some(ca_trust(&cwd, d)?),
    };
    let nft = if args.transparent {
        find_nft(args.nft.as_deref())?
    } else {
        None
    };
    let owner = args.owner.as_deref().map(owner_account).transpose()?;
    let found = guard::find(args, &cwd)?;
    let git = git_entries(&cwd);
    let uid = sys::geteuid();
    Ok(HostFacts {
        caller: Caller {
            uid,
            gid: sys::getegid(),
            privileged: uid == 0 && in_initial_userns(),
        },
        owner,
        cwd,
        home,
        system,
        etc_secrets,
        has_tmp: Path::new("/tmp").is_dir(),
        resolv_conf: resolv_conf_target(Path::new("/etc/resolv.conf")),
        env: std::env::vars_os().collect(),
        binds,
        token,
        ca,
        nft,
        guarded: found.guarded.clone(),
        git,
    })
    .map(|facts| (facts, found))
}

/// The working directory's `.git` (a directory, not a worktree's link
/// file) and the entries git takes code or configuration from.
fn git_entries(cwd: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
    let git = cwd.join(".git");
    if !std::fs::symlink_metadata(&git).is_ok_and(|m| m.is_dir()) {
        return None;
    }
    let ro = ["config", "hooks", "info", "commondir", "config.worktree"]
        .iter()
        .map(|n| git.join(n))
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| !m.file_type().is_symlink()))
        .collect();
    Some((git, ro))
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

/// One line when a limit could not be given to the whole sandbox.
fn fallback_note(plan: &Plan, left: &cgroup::Uncovered) {
    let mut per = Vec::new();
    if left.limits.memory.is_some() {
        per.push("--memory is each process's address space (RLIMIT_AS)".to_string());
    }
    if left.limits.cpu_secs.is_some() {
        per.push("--cpu is each process's CPU time (RLIMIT_CPU)".to_string());
    }
    if left.limits.pids.is_some() {
        per.push(format!(
            "--pids counts the processes of uid {} in the sandbox (RLIMIT_NPROC)",
            plan.identity.uid
        ));
    }
    if per.is_empty() {
        return;
    }
    let reasons = left.reasons();
    let hint = if reasons.iter().any(|r| r.contains("denied")) {
        " — run as root, or in a delegated cgroup"
    } else {
        ""
    };
    eprintln!(
        "egressd run: no cgroup for the whole sandbox ({}{hint}), so limits are per process: {}",
        reasons.join("; "),
        per.join(", ")
    );
}

enum Egressd {
    Embedded(Box<app::Running>),
    Relay(relay::Relay),
}

/// How the wait for the sandbox ended.
enum End {
    Exited(u8),
    Timeout,
    Cpu,
    /// v1: the kernel reported an OOM in the sandbox's group.
    Oom,
}

/// Serves the inside sockets, starts CMD, and waits for it (or the timeout,
/// the CPU limit, an OOM).
async fn supervise(
    args: &RunArgs,
    found: &guard::Found,
    plan: &Plan,
    sandbox: Arc<Sandbox>,
    inside: namespaces::InsideSockets,
    forwarded: sys::SigSet,
    cgroups: &mut Cgroups,
) -> u8 {
    let egressd = match serve(args, found, plan, inside).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("egressd run: {e:#}");
            sandbox.kill();
            let s = sandbox.clone();
            let _ = tokio::task::spawn_blocking(move || s.wait()).await;
            return EXIT_SETUP;
        }
    };

    if let Err(e) = forward_signals(&sandbox, forwarded) {
        eprintln!("egressd run: cannot start the signal thread: {e}");
        sandbox.kill();
        return EXIT_SETUP;
    }

    let oom_event = match cgroups.take_oom_event().map(sys::async_fd) {
        Some(Ok(fd)) => Some(fd),
        Some(Err(e)) => {
            eprintln!("egressd run: cannot watch the sandbox's memory: {e}");
            sandbox.kill();
            return EXIT_SETUP;
        }
        None => None,
    };
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
    let cpu_limit = plan
        .limits
        .cpu_secs
        .filter(|_| cgroups.covers_cpu())
        .map(Duration::from_secs);
    let cg: &Cgroups = cgroups;
    let end = tokio::select! {
        s = &mut waiter => End::Exited(s.unwrap_or(EXIT_SETUP)),
        _ = sleep_or_never(plan.timeout) => End::Timeout,
        _ = cpu_used_up(cg, cpu_limit) => End::Cpu,
        _ = oom_reported(oom_event.as_ref()) => End::Oom,
    };
    let status = match end {
        End::Exited(s) => s,
        _ => {
            sandbox.kill();
            waiter.await.unwrap_or(EXIT_SETUP)
        }
    };

    stop(egressd, found).await;
    say_why_killed(&end, plan, cg);
    match end {
        End::Timeout => EXIT_TIMEOUT,
        End::Cpu => EXIT_CPU,
        End::Exited(_) | End::Oom => status,
    }
}

/// Signals a process sends the launcher are passed on to CMD (through
/// init). The thread blocks in sigwaitinfo for the life of the process.
fn forward_signals(sandbox: &Arc<Sandbox>, forwarded: sys::SigSet) -> std::io::Result<()> {
    let s = sandbox.clone();
    std::thread::Builder::new()
        .name("egressd-run-signals".into())
        .spawn(move || {
            while let Ok((sig, code)) = forwarded.wait() {
                // A terminal's ^C (SI_KERNEL) already reached CMD, which
                // is in the launcher's process group.
                if matches!(code, libc::SI_USER | libc::SI_QUEUE | libc::SI_TKILL) {
                    let _ = s.signal(sig);
                }
            }
        })
        .map(drop)
}

/// Stops the embedded egressd (draining it) or the relay.
async fn stop(egressd: Egressd, found: &guard::Found) {
    match egressd {
        Egressd::Embedded(running) => {
            let denials = running.package_denials.clone();
            running.shutdown().await;
            // After the drain, so that the last requests' denials are in.
            if let Some(s) = denials.summary("egressd run") {
                eprint!("{s}");
            }
            if found.log_is_default {
                eprintln!("egressd run: decisions are in {}", found.log.display());
            }
        }
        // The egressd it relays to keeps the decisions (and its log).
        Egressd::Relay(r) => r.stop(),
    }
}

/// Says why the sandbox was killed, if it was.
fn say_why_killed(end: &End, plan: &Plan, cg: &Cgroups) {
    if matches!(end, End::Oom) || cg.oom_kills() > 0 {
        eprintln!(
            "egressd run: the sandbox ran out of memory (--memory {} for the whole sandbox); \
             it was killed",
            plan.limits.memory.map(bytes).unwrap_or_default()
        );
    }
    match end {
        End::Timeout => {
            eprintln!(
                "egressd run: timed out after {}; the sandbox was killed",
                humanize(plan.timeout.unwrap_or_default())
            );
        }
        End::Cpu => {
            eprintln!(
                "egressd run: the sandbox used up its CPU time (--cpu {}s, all its processes \
                 together); it was killed",
                plan.limits.cpu_secs.unwrap_or_default()
            );
        }
        End::Exited(_) | End::Oom => {}
    }
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Returns once the sandbox has used `limit` of CPU time (never without
/// one). It looks again when the rest could first be used up, with every
/// CPU busy, so it wakes rarely and overruns by at most [`CPU_CHECK_MIN`]
/// per CPU.
async fn cpu_used_up(cg: &Cgroups, limit: Option<Duration>) {
    let Some(limit) = limit else {
        return std::future::pending().await;
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    loop {
        let used = match cg.cpu_used() {
            Ok(u) => u,
            // Unreadable: never a sandbox that outlives its limit unseen.
            Err(e) => {
                eprintln!("egressd run: cannot read the sandbox's CPU time: {e}");
                return;
            }
        };
        if used >= limit {
            return;
        }
        let wait = ((limit - used) / cpus).clamp(CPU_CHECK_MIN, CPU_CHECK_MAX);
        tokio::time::sleep(wait).await;
    }
}

async fn oom_reported(event: Option<&tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>) {
    match event {
        Some(fd) => {
            let _ = fd.readable().await;
        }
        None => std::future::pending().await,
    }
}

/// `400M`, `2G`, or bytes.
fn bytes(b: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b % (1 << shift) == 0 {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
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
    found: &guard::Found,
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
                // The sandbox is a client of its own, never a host
                // client's `sources:` (its traffic comes from loopback).
                client: Some(args.client.as_deref().unwrap_or(SANDBOX_CLIENT).into()),
                // Inside the sandbox: no egressd on the host dials them.
                announced: Default::default(),
            };
            // The policy by its canonical path (a link the sandbox could
            // repoint is not followed again on reload), the log outside.
            let mut serve_args = args.embedded_serve_args();
            serve_args.engine.policy = found.policy.clone();
            serve_args.log = found.log.to_string_lossy().into_owned();
            Egressd::Embedded(Box::new(app::start(&serve_args, listeners).await?))
        }
        Egress::Connect { proxy: p, dns } => {
            Egressd::Relay(relay::Relay::start(proxy, dns_udp, dns_tcp, *p, *dns))
        }
    })
}
