//! Creating the sandbox and running CMD in it. Owns the process tree and
//! everything done inside the namespaces; does not own what serves the
//! sockets (the embedded egressd or the relay, outside) nor the plan.
//!
//! ```text
//!  launcher (host namespaces; serves the sockets it is handed)
//!   └─ outer      unshare(user, mount, net, pid, ipc, uts); uid/gid maps;
//!       │         reports init's pidfd; waits; exits with init's status
//!       └─ init   PID 1 of the sandbox: mounts, lo up, binds 127.0.0.1:3128
//!           │     and :53 (UDP+TCP) — with --transparent also routes through
//!           │     lo, nft capture rules and the :3129 listeners (127.0.0.1,
//!           │     [::1]) — and sends them out (SCM_RIGHTS); on
//!           │     "go" forks CMD, reaps, forwards signals, exits with CMD's
//!           │     status — which kills everything left in the namespace
//!           └─ CMD    rlimits, no capabilities, no_new_privs, exec
//! ```
//!
//! Every step either succeeds or the sandbox is not started (exit 125):
//! there is no fallback to a weaker sandbox. Each process dies with its
//! parent (PR_SET_PDEATHSIG), so if the launcher dies, the sandbox and its
//! sockets go with it; the sandbox never gains a route of its own.

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::{Ipv6Addr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use libc::{c_int, pid_t};

use super::plan::{
    Plan, Transparent, CAPTURE_PORT, DNS_PORT, INSIDE_IP, PROXY_PORT, SECOND_LOOPBACK,
};
use super::sys::{self, SigSet};

/// How long setting up the namespaces may take before the launcher gives up.
const SETUP_DEADLINE: Duration = Duration::from_secs(30);

const NAMESPACES: c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// Signals the launcher passes on to CMD (through init) when a process
/// sends them. The launcher blocks them before creating the sandbox, so
/// every process of the tree starts with them blocked; CMD unblocks.
pub const FORWARDED: &[c_int] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Where the generated resolv.conf is written before it is bound over the
/// real one (inside the sandbox's fresh /tmp; removed once bound).
const RESOLV_STAGING: &str = "/tmp/.egressd-resolv.conf";

/// Why the sandbox could not be set up (the launcher exits 125).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SetupError(pub String);

impl SetupError {
    fn io(what: impl std::fmt::Display, e: io::Error) -> SetupError {
        SetupError(format!("{what}: {e}"))
    }
}

/// The listening sockets created inside the sandbox's network namespace.
pub struct InsideSockets {
    pub proxy: TcpListener,
    pub dns_udp: UdpSocket,
    pub dns_tcp: TcpListener,
    /// `--transparent`: the capture listeners (IPv4, and IPv6 unless the
    /// kernel has none); empty otherwise.
    pub capture: Vec<TcpListener>,
}

/// A sandbox whose CMD has not been started yet, or is running.
pub struct Sandbox {
    outer: pid_t,
    init_pid: pid_t,
    init: OwnedFd,
    chan: OwnedFd,
}

impl Sandbox {
    /// The sandbox's PID 1, as the host sees it.
    pub fn init_pid(&self) -> pid_t {
        self.init_pid
    }

    /// Lets init start CMD.
    pub fn go(&self) -> Result<(), SetupError> {
        sys::send(self.chan.as_fd(), b"G", &[]).map_err(|e| SetupError::io("cannot start CMD", e))
    }

    /// Sends `sig` to the sandbox's init (which passes it on to CMD).
    pub fn signal(&self, sig: c_int) -> io::Result<()> {
        sys::pidfd_send_signal(self.init.as_fd(), sig)
    }

    /// Kills the whole sandbox: when its PID 1 dies, the kernel kills every
    /// process in the PID namespace, including those that called setsid().
    pub fn kill(&self) {
        let _ = self.signal(libc::SIGKILL);
    }

    /// Waits until the sandbox is gone; its exit status (CMD's, or 128+n).
    /// Blocks: call from a thread that may block.
    pub fn wait(&self) -> u8 {
        match sys::wait(self.outer, false) {
            Ok((_, status)) => sys::exit_code(status),
            Err(_) => 125,
        }
    }
}

/// Creates the namespaces and everything in them, up to the point where CMD
/// would start. The caller must be single-threaded, with [`FORWARDED`]
/// blocked.
pub fn create(plan: &Plan) -> Result<(Sandbox, InsideSockets), SetupError> {
    let (ours, theirs) =
        sys::seqpacket_pair().map_err(|e| SetupError::io("cannot create a socket pair", e))?;
    let launcher = sys::getpid();
    let outer = sys::fork().map_err(|e| SetupError::io("cannot fork", e))?;
    if outer == 0 {
        drop(ours);
        outer_main(plan, theirs, launcher);
    }
    drop(theirs);
    sys::set_recv_timeout(ours.as_fd(), SETUP_DEADLINE)
        .map_err(|e| SetupError::io("cannot set a timeout", e))?;

    let mut init: Option<(pid_t, OwnedFd)> = None;
    let mut sockets: Option<Vec<OwnedFd>> = None;
    let failure = loop {
        if init.is_some() && sockets.is_some() {
            break None;
        }
        let mut buf = [0u8; 4096];
        match sys::recv(ours.as_fd(), &mut buf) {
            Ok((0, _)) => {
                break Some(SetupError(
                    "the sandbox ended during setup without saying why".into(),
                ))
            }
            Ok((n, mut fds)) => match buf[0] {
                b'P' if fds.len() == 1 => {
                    let pid = std::str::from_utf8(&buf[1..n])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    init = Some((pid, fds.remove(0)));
                }
                b'R' if fds.len() >= 3 + usize::from(plan.transparent.is_some()) => {
                    sockets = Some(fds)
                }
                b'E' => break Some(SetupError(String::from_utf8_lossy(&buf[1..n]).into_owned())),
                _ => break Some(SetupError("unexpected message from the sandbox".into())),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                break Some(SetupError(format!(
                    "the sandbox was not ready within {}s",
                    SETUP_DEADLINE.as_secs()
                )))
            }
            Err(e) => break Some(SetupError::io("lost contact with the sandbox", e)),
        }
    };
    if let Some(e) = failure {
        if let Some((_, pidfd)) = &init {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
        } else {
            let _ = sys::kill(outer, libc::SIGKILL);
        }
        let _ = sys::wait(outer, false);
        return Err(e);
    }
    let (init_pid, init) = init.expect("checked above");
    let mut fds = sockets.expect("checked above").into_iter();
    let (p, u, t) = (fds.next(), fds.next(), fds.next());
    let inside = InsideSockets {
        proxy: TcpListener::from(p.expect("three descriptors")),
        dns_udp: UdpSocket::from(u.expect("three descriptors")),
        dns_tcp: TcpListener::from(t.expect("three descriptors")),
        capture: fds.map(TcpListener::from).collect(),
    };
    Ok((
        Sandbox {
            outer,
            init_pid,
            init,
            chan: ours,
        },
        inside,
    ))
}

/// Reports a setup failure to the launcher and exits.
fn fail(chan: &OwnedFd, msg: impl std::fmt::Display) -> ! {
    let text = format!("E{msg}");
    let _ = sys::send(chan.as_fd(), text.as_bytes(), &[]);
    sys::exit_now(125)
}

// ---------------------------------------------------------------- outer

fn outer_main(plan: &Plan, chan: OwnedFd, launcher: pid_t) -> ! {
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() || sys::getppid() != launcher {
        sys::exit_now(125);
    }
    if let Err(e) = sys::unshare(NAMESPACES) {
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::ENOSPC) | Some(libc::EACCES) => {
                " — this kernel or its policy forbids unprivileged user namespaces \
                 (check user.max_user_namespaces, kernel.unprivileged_userns_clone, \
                 kernel.apparmor_restrict_unprivileged_userns, or a container's seccomp profile)"
            }
            _ => "",
        };
        fail(
            &chan,
            format!("cannot create user, mount, network and PID namespaces: {e}{hint}"),
        );
    }
    // The caller's own uid and gid become root inside; no other id exists
    // there. setgroups must be denied before an unprivileged gid_map.
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("0 {} 1", plan.uid)),
        ("/proc/self/gid_map", format!("0 {} 1", plan.gid)),
    ] {
        if let Err(e) = fs::write(file, text) {
            fail(&chan, format!("cannot write {file}: {e}"));
        }
    }
    let init = match sys::fork() {
        Ok(pid) => pid,
        Err(e) => fail(&chan, format!("cannot fork the sandbox's init: {e}")),
    };
    if init == 0 {
        init_main(plan, chan);
    }
    let pidfd = match sys::pidfd_open(init) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = sys::kill(init, libc::SIGKILL);
            fail(
                &chan,
                format!("pidfd_open (Linux 5.3 or later is needed): {e}"),
            );
        }
    };
    let _ = sys::send(
        chan.as_fd(),
        format!("P{init}").as_bytes(),
        &[pidfd.as_fd()],
    );
    drop(pidfd);
    drop(chan);
    match sys::wait(init, false) {
        Ok((_, status)) => sys::exit_now(sys::exit_code(status)),
        Err(_) => sys::exit_now(125),
    }
}

// ---------------------------------------------------------------- init (PID 1)

fn init_main(plan: &Plan, chan: OwnedFd) -> ! {
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() {
        sys::exit_now(125);
    }
    if let Err(e) = setup_filesystem(plan) {
        fail(&chan, e);
    }
    if let Err(e) = sys::loopback_up(SECOND_LOOPBACK) {
        fail(
            &chan,
            format!("cannot configure the loopback interface: {e}"),
        );
    }
    let proxy = TcpListener::bind((INSIDE_IP, PROXY_PORT));
    let dns_udp = UdpSocket::bind((INSIDE_IP, DNS_PORT));
    let dns_tcp = TcpListener::bind((INSIDE_IP, DNS_PORT));
    let (proxy, dns_udp, dns_tcp) = match (proxy, dns_udp, dns_tcp) {
        (Ok(p), Ok(u), Ok(t)) => (p, u, t),
        (p, u, t) => {
            let e = p.err().or(u.err()).or(t.err()).expect("one failed");
            fail(&chan, format!("cannot listen inside the sandbox: {e}"));
        }
    };
    let capture = match &plan.transparent {
        None => Vec::new(),
        Some(t) => setup_capture(t).unwrap_or_else(|e| fail(&chan, e)),
    };
    let mut out = vec![proxy.as_fd(), dns_udp.as_fd(), dns_tcp.as_fd()];
    out.extend(capture.iter().map(|l| l.as_fd()));
    if let Err(e) = sys::send(chan.as_fd(), b"R", &out) {
        fail(&chan, format!("cannot hand the sockets out: {e}"));
    }
    // CMD must not hold egressd's listening sockets.
    drop(out);
    drop((proxy, dns_udp, dns_tcp, capture));

    let mut buf = [0u8; 8];
    match sys::recv(chan.as_fd(), &mut buf) {
        Ok((n, _)) if n >= 1 && buf[0] == b'G' => {}
        _ => sys::exit_now(125),
    }
    drop(chan);

    let mut waited: Vec<c_int> = FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    let signals = SigSet::of(&waited);
    if signals.block().is_err() {
        sys::exit_now(125);
    }
    let cmd = match sys::fork() {
        Ok(0) => command_main(plan),
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("egressd run: cannot fork CMD: {e}");
            sys::exit_now(125);
        }
    };
    supervise(cmd, &signals)
}

/// `--transparent`, in init (which still holds the namespace's
/// capabilities): the capture listeners, a default route through `lo` for
/// each family (so that connecting to an outside address reaches the
/// output hook instead of failing with ENETUNREACH), and the nft rules
/// that redirect what leaves to those listeners and drop everything else.
/// Any failure stops the sandbox: never a sandbox that routes without
/// the rules.
fn setup_capture(t: &Transparent) -> Result<Vec<TcpListener>, String> {
    let v4 = TcpListener::bind((INSIDE_IP, CAPTURE_PORT)).map_err(|e| {
        format!("transparent mode: cannot listen on {INSIDE_IP}:{CAPTURE_PORT}: {e}")
    })?;
    // A kernel without IPv6 has no IPv6 to capture either.
    let v6 = match TcpListener::bind((Ipv6Addr::LOCALHOST, CAPTURE_PORT)) {
        Ok(l) => Some(l),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)
            ) =>
        {
            None
        }
        Err(e) => {
            return Err(format!(
                "transparent mode: cannot listen on [::1]:{CAPTURE_PORT}: {e}"
            ))
        }
    };
    let mut sources = vec![std::net::IpAddr::from(INSIDE_IP)];
    if v6.is_some() {
        sources.push(Ipv6Addr::LOCALHOST.into());
    }
    for src in sources {
        sys::add_default_route_via_lo(src).map_err(|e| {
            format!("transparent mode: cannot add a default route through lo (source {src}): {e}")
        })?;
    }
    let nft = cstr(&t.nft)?;
    let (status, output) = sys::run_program(
        &nft,
        &[c"-f".to_owned(), c"/dev/stdin".to_owned()],
        t.rules.as_bytes(),
    )
    .map_err(|e| format!("transparent mode: cannot run {}: {e}", t.nft.display()))?;
    if status != 0 {
        let output = output.trim();
        return Err(format!(
            "transparent mode: {} could not load the capture rules (exit status {}){}{} — \
             the kernel must allow nftables with NAT and redirect (nf_tables, nft_nat, \
             nft_redir) in an unprivileged user namespace",
            t.nft.display(),
            sys::exit_code(status),
            if output.is_empty() { "" } else { ": " },
            output
        ));
    }
    Ok(std::iter::once(v4).chain(v6).collect())
}

/// PID 1's loop: reap every child (orphans are reparented here), pass on
/// signals that a process sent (a terminal's ^C already reached CMD, which
/// shares the launcher's process group), and exit with CMD's status.
fn supervise(cmd: pid_t, signals: &SigSet) -> ! {
    loop {
        let Ok((sig, code)) = signals.wait() else {
            sys::exit_now(125)
        };
        if sig == libc::SIGCHLD {
            while let Ok((pid, status)) = sys::wait(-1, true) {
                if pid == 0 {
                    break;
                }
                if pid == cmd {
                    sys::exit_now(sys::exit_code(status));
                }
            }
        } else if matches!(code, libc::SI_USER | libc::SI_QUEUE | libc::SI_TKILL) {
            let _ = sys::kill(cmd, sig);
        }
    }
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("{} contains a NUL byte", p.display()))
}

/// Creates `path` as a directory (or, with `file`, an empty file) where it
/// is missing, with its parents — possible only inside the fresh tmpfs
/// mounts, since everything else is read-only by then.
fn ensure_mountpoint(path: &Path, file: bool) -> Result<(), String> {
    if fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    let what = |e: io::Error| format!("cannot create the mount point {}: {e}", path.display());
    if file {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(what)?;
        }
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
            .map_err(what)?;
    } else {
        fs::create_dir_all(path).map_err(what)?;
    }
    Ok(())
}

fn setup_filesystem(plan: &Plan) -> Result<(), String> {
    // Nothing mounted here may propagate back to the host.
    sys::mount(c"none", c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("cannot make the mount namespace private: {e}"))?;

    // Take the bind sources before tmpfs mounts can hide them (a --rw under
    // HOME, say), as detached trees with their final read-only/writable
    // state.
    let mut trees = Vec::new();
    for b in &plan.binds {
        let flag = if b.writable { "--rw" } else { "--ro" };
        let path = cstr(&b.path)?;
        let is_dir = fs::metadata(&b.path)
            .map_err(|e| format!("{flag} {}: {e}", b.path.display()))?
            .is_dir();
        let tree = sys::open_tree_clone(&path)
            .map_err(|e| format!("{flag} {}: cannot bind it: {e}", b.path.display()))?;
        let (set, clear) = if b.writable {
            (sys::MOUNT_ATTR_NOSUID, sys::MOUNT_ATTR_RDONLY)
        } else {
            (sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_RDONLY, 0)
        };
        sys::mount_setattr(Some(tree.as_fd()), c"", set, clear)
            .map_err(|e| format!("{flag} {}: cannot set its access: {e}", b.path.display()))?;
        trees.push((path, tree, is_dir));
    }

    // The CA's public files, taken now for the same reason (the CA
    // directory itself is masked below).
    let mut file_trees = Vec::new();
    for f in &plan.file_binds {
        let tree = sys::open_tree_clone(&cstr(&f.source)?)
            .map_err(|e| format!("cannot bind {}: {e}", f.source.display()))?;
        sys::mount_setattr(
            Some(tree.as_fd()),
            c"",
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID,
            0,
        )
        .map_err(|e| format!("cannot make {} read-only: {e}", f.source.display()))?;
        file_trees.push((cstr(&f.target)?, tree));
    }

    // The host's tree, read-only (mount_setattr: Linux 5.12 or later).
    sys::mount_setattr(
        None,
        c"/",
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID,
        0,
    )
    .map_err(|e| {
        format!("cannot make the host filesystem read-only (Linux 5.12 or later is needed): {e}")
    })?;

    for t in &plan.tmpfs {
        ensure_mountpoint(&t.path, false)?;
        let mut data = format!("mode={:o}", t.mode);
        if let Some(size) = plan.tmpfs_size {
            data.push_str(&format!(",size={size}"));
        }
        let data = CString::new(data).expect("no NUL");
        sys::mount(
            c"tmpfs",
            &cstr(&t.path)?,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&data),
        )
        .map_err(|e| format!("cannot mount a tmpfs on {}: {e}", t.path.display()))?;
    }

    // Staged in the fresh /tmp before any --rw bind could put the host's
    // /tmp there.
    if let Some(target) = &plan.resolv_conf {
        let staging = Path::new(RESOLV_STAGING);
        fs::write(staging, &plan.resolv_conf_text)
            .and_then(|()| fs::set_permissions(staging, fs::Permissions::from_mode(0o644)))
            .map_err(|e| format!("cannot write resolv.conf: {e}"))?;
        ensure_mountpoint(target, true)?;
        let tree = sys::open_tree_clone(&cstr(staging)?)
            .map_err(|e| format!("cannot bind resolv.conf: {e}"))?;
        sys::mount_setattr(Some(tree.as_fd()), c"", sys::MOUNT_ATTR_RDONLY, 0)
            .map_err(|e| format!("cannot make resolv.conf read-only: {e}"))?;
        sys::move_mount(tree.as_fd(), &cstr(target)?)
            .map_err(|e| format!("cannot bind resolv.conf over {}: {e}", target.display()))?;
        let _ = fs::remove_file(staging);
    }

    for ((path, tree, is_dir), b) in trees.iter().zip(&plan.binds) {
        ensure_mountpoint(&b.path, !is_dir)?;
        sys::move_mount(tree.as_fd(), path)
            .map_err(|e| format!("cannot bind {}: {e}", b.path.display()))?;
    }

    for m in &plan.masks {
        // Only where it is still visible (not already under a fresh tmpfs).
        if !fs::metadata(m).is_ok_and(|md| md.is_dir()) {
            continue;
        }
        sys::mount(
            c"tmpfs",
            &cstr(m)?,
            Some(c"tmpfs"),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(c"mode=0,size=4k"),
        )
        .map_err(|e| format!("cannot hide {}: {e}", m.display()))?;
    }

    for ((target, tree), f) in file_trees.iter().zip(&plan.file_binds) {
        ensure_mountpoint(&f.target, true)?;
        sys::move_mount(tree.as_fd(), target)
            .map_err(|e| format!("cannot bind {}: {e}", f.target.display()))?;
    }

    sys::mount(
        c"proc",
        c"/proc",
        Some(c"proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(|e| {
        format!(
            "cannot mount the sandbox's own /proc: {e} (the kernel refuses when the host's /proc \
             has paths masked by other mounts, as inside many containers)"
        )
    })?;

    match fs::metadata(&plan.cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        _ => Err(format!(
            "the working directory {} does not exist inside the sandbox",
            plan.cwd.display()
        )),
    }
}

// ---------------------------------------------------------------- CMD

fn command_main(plan: &Plan) -> ! {
    let die = |code: u8, msg: String| -> ! {
        eprintln!("egressd run: {msg}");
        sys::exit_now(code)
    };
    if let Err(e) = sys::reset_signals_for_exec() {
        die(125, format!("cannot reset signals: {e}"));
    }
    match cstr(&plan.cwd) {
        Ok(c) => {
            if let Err(e) = sys::chdir(&c) {
                die(125, format!("cannot enter {}: {e}", plan.cwd.display()));
            }
        }
        Err(e) => die(125, e),
    }
    if let Err(e) = plan.limits.apply() {
        die(125, format!("cannot set {e}"));
    }
    if let Err(e) = sys::cloexec_from(3) {
        die(125, format!("cannot close inherited descriptors: {e}"));
    }
    if let Err(e) = sys::drop_all_capabilities() {
        die(125, format!("cannot drop capabilities: {e}"));
    }
    let e = exec_path(plan);
    let name = String::from_utf8_lossy(plan.argv[0].as_bytes()).into_owned();
    let code = if e.raw_os_error() == Some(libc::ENOENT) {
        127
    } else {
        126
    };
    die(code, format!("cannot run {name}: {e}"))
}

/// execvp's search, over the sandbox's PATH rather than the launcher's.
fn exec_path(plan: &Plan) -> io::Error {
    let file = plan.argv[0].as_bytes();
    if file.contains(&b'/') {
        return sys::execve(&plan.argv[0], &plan.argv, &plan.env);
    }
    let path = plan
        .env
        .iter()
        .find_map(|kv| kv.as_bytes().strip_prefix(b"PATH="))
        .unwrap_or(b"/usr/local/bin:/usr/bin:/bin");
    let mut result = io::Error::from_raw_os_error(libc::ENOENT);
    for dir in path.split(|&b| b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let mut full = dir.to_vec();
        full.push(b'/');
        full.extend_from_slice(file);
        let Ok(full) = CString::new(full) else {
            continue;
        };
        let e = sys::execve(&full, &plan.argv, &plan.env);
        match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => {}
            Some(libc::EACCES) => result = e,
            _ => return e,
        }
    }
    result
}
