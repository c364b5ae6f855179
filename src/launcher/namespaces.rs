//! Creating the sandbox and running CMD in it. Owns the process tree and
//! everything done inside the namespaces; does not own what serves the
//! sockets (the embedded egressd or the relay, outside), the plan, or the
//! cgroup (made before, joined here).
//!
//! ```text
//!  launcher (host namespaces; writes the sandbox's id maps; serves the sockets it is handed)
//!   └─ outer      joins the cgroup; as root, makes the idmapped binds;
//!       │         unshare(user, mount, net, pid, ipc, uts); reports init's
//!       │         pidfd; waits; exits with init's status
//!       └─ init   PID 1 of the sandbox: lo up, binds 127.0.0.1:3128 and
//!           │     :53 (UDP+TCP) — with --transparent also routes through
//!           │     lo, nft capture rules and the :3129 listeners (127.0.0.1,
//!           │     [::1]); builds the sandbox's root and pivots into it;
//!           │     sends the sockets out (SCM_RIGHTS); on "go" forks CMD,
//!           │     reaps, forwards signals, exits with CMD's status — which
//!           │     kills everything left in the namespace
//!           └─ CMD    rlimits, --uid/--gid, no capabilities, no_new_privs, seccomp, exec
//! ```
//!
//! Every step either succeeds or the sandbox is not started (exit 125):
//! there is no fallback to a weaker sandbox. Each process dies with its
//! parent (PR_SET_PDEATHSIG), so if the launcher dies, the sandbox and its
//! sockets go with it; the sandbox never gains a route of its own.

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::net::{Ipv6Addr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use libc::{c_int, pid_t};

use super::identity::IdMap;
use super::limits::Limits;
use super::plan::{
    Plan, Transparent, CAPTURE_PORT, DNS_PORT, INSIDE_IP, PROXY_PORT, SECOND_LOOPBACK,
};
use super::seccomp;
use super::sys::{self, SigSet};
use super::view::{Layer, Rebuilt, SystemEntry, DEV_LINKS, DEV_NODES};

/// What `/proc/1/cmdline` says inside: nothing of the launcher's.
const INIT_NAME: &[u8] = b"egressd-init";

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

/// Where init builds the sandbox's root: a private tmpfs over the host's
/// `/tmp` (in init's mount namespace only), holding the new root, the mask
/// source, the staged resolv.conf and egressd's files. It disappears with
/// the old root.
const STAGING: &str = "/tmp";
const NEW_ROOT: &str = "/tmp/root";
const MASK_FILE: &str = "/tmp/mask";
const RESOLV_STAGING: &str = "/tmp/resolv.conf";
/// The staging tmpfs's size besides egressd's files.
const STAGING_SIZE: usize = 1 << 20;
/// Sizes of tmpfs mounts that hold only directories, links and tiny files.
const SMALL_TMPFS: &str = "size=1m";
/// Size of a rebuilt directory's tmpfs (links and empty placeholders).
const REBUILT_TMPFS: &str = "size=4m";
/// Read-only, inaccessible and empty: what a masked directory shows.
const MASK_DIR_OPTIONS: &CStr = c"mode=0,size=4k";

/// Why the sandbox could not be set up (the launcher exits 125).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SetupError(pub String);

impl SetupError {
    fn io(what: impl std::fmt::Display, e: io::Error) -> SetupError {
        SetupError(format!("{what}: {e}"))
    }
}

/// What the sandbox's processes take along that is not in the plan: made
/// by the launcher at run time.
#[derive(Debug, Default, Clone)]
pub struct Setup {
    /// `cgroup.procs` files the outer process joins before anything else.
    pub cgroups: Vec<PathBuf>,
    /// The limits CMD gets as rlimits (those no cgroup covers).
    pub rlimits: Limits,
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
pub fn create(plan: &Plan, setup: &Setup) -> Result<(Sandbox, InsideSockets), SetupError> {
    let (ours, theirs) =
        sys::seqpacket_pair().map_err(|e| SetupError::io("cannot create a socket pair", e))?;
    let launcher = sys::getpid();
    let outer = sys::fork().map_err(|e| SetupError::io("cannot fork", e))?;
    if outer == 0 {
        drop(ours);
        outer_main(plan, setup, theirs, launcher);
    }
    drop(theirs);
    sys::set_recv_timeout(ours.as_fd(), SETUP_DEADLINE)
        .map_err(|e| SetupError::io("cannot set a timeout", e))?;

    let mut init: Option<(pid_t, OwnedFd)> = None;
    let failure = handshake(plan, outer, &ours, &mut init);
    let sockets = match failure {
        Ok(sockets) => sockets,
        Err(e) => {
            if let Some((_, pidfd)) = &init {
                let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            } else {
                let _ = sys::kill(outer, libc::SIGKILL);
            }
            let _ = sys::wait(outer, false);
            return Err(e);
        }
    };
    let (init_pid, init) = init.expect("checked above");
    let mut fds = sockets.into_iter();
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

/// The setup's messages from the sandbox: the id maps asked for (`U`,
/// written and answered `M`), init's pid and pidfd (`P`, kept in `init`
/// as soon as it comes, so that a failure after it can kill init), the
/// inside sockets (`R`), or an error (`E`).
fn handshake(
    plan: &Plan,
    outer: pid_t,
    ours: &OwnedFd,
    init: &mut Option<(pid_t, OwnedFd)>,
) -> Result<Vec<OwnedFd>, SetupError> {
    let mut sockets: Option<Vec<OwnedFd>> = None;
    loop {
        if init.is_some() {
            if let Some(s) = sockets.take() {
                return Ok(s);
            }
        }
        let mut buf = [0u8; 4096];
        match sys::recv(ours.as_fd(), &mut buf) {
            Ok((0, _)) => {
                return Err(SetupError(
                    "the sandbox ended during setup without saying why".into(),
                ))
            }
            Ok((n, mut fds)) => match buf[0] {
                b'U' => {
                    write_id_maps(plan, outer)?;
                    if let Err(e) = sys::send(ours.as_fd(), b"M", &[]) {
                        return Err(SetupError::io("lost contact with the sandbox", e));
                    }
                }
                b'P' if fds.len() == 1 => {
                    let pid = std::str::from_utf8(&buf[1..n])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    *init = Some((pid, fds.remove(0)));
                }
                b'R' if fds.len() >= 3 + usize::from(plan.transparent.is_some()) => {
                    sockets = Some(fds)
                }
                b'E' => return Err(SetupError(String::from_utf8_lossy(&buf[1..n]).into_owned())),
                _ => return Err(SetupError("unexpected message from the sandbox".into())),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(SetupError(format!(
                    "the sandbox was not ready within {}s",
                    SETUP_DEADLINE.as_secs()
                )))
            }
            Err(e) => return Err(SetupError::io("lost contact with the sandbox", e)),
        }
    }
}

/// The launcher writes the sandbox's id maps, from outside: CMD's non-root
/// uid must exist in the namespace before CMD can switch to it, and neither
/// CMD (no capabilities) nor, as root, the outer process itself (a process
/// inside a user namespace holds no CAP_SETUID over its parent, which a
/// map of more than its own id needs) could write them.
fn write_id_maps(plan: &Plan, outer: pid_t) -> Result<(), SetupError> {
    let id = &plan.identity;
    let mut files = Vec::new();
    if id.deny_setgroups() {
        files.push(("setgroups", "deny".to_string()));
    }
    files.push(("uid_map", id.uid_map()));
    files.push(("gid_map", id.gid_map()));
    for (file, text) in files {
        fs::write(format!("/proc/{outer}/{file}"), text)
            .map_err(|e| SetupError(format!("cannot write the sandbox's {file}: {e}")))?;
    }
    Ok(())
}

/// Reports a setup failure to the launcher and exits.
fn fail(chan: &OwnedFd, msg: impl std::fmt::Display) -> ! {
    let text = format!("E{msg}");
    let _ = sys::send(chan.as_fd(), text.as_bytes(), &[]);
    sys::exit_now(125)
}

// ---------------------------------------------------------------- outer

/// Detached, idmapped copies of the writable binds, in layer order
/// (`None` for layers that are not idmapped binds).
type IdmappedTrees = Vec<Option<OwnedFd>>;

fn outer_main(plan: &Plan, setup: &Setup, chan: OwnedFd, launcher: pid_t) -> ! {
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() || sys::getppid() != launcher {
        sys::exit_now(125);
    }
    // First, so that everything the sandbox ever runs is in the group.
    for procs in &setup.cgroups {
        if let Err(e) = fs::write(procs, "0") {
            fail(
                &chan,
                format!("cannot join the sandbox's cgroup {}: {e}", procs.display()),
            );
        }
    }
    // Idmapped mounts take CAP_SYS_ADMIN over the host's filesystems, so
    // they are made here, before the process leaves the host's user
    // namespace; init attaches them.
    let any = plan
        .view
        .layers
        .iter()
        .any(|l| matches!(l, Layer::Bind { idmapped: true, .. }));
    let idmapped = match plan.identity.bind_idmap() {
        Some(map) if any => idmapped_binds(plan, &map).unwrap_or_else(|e| fail(&chan, e)),
        _ => Vec::new(),
    };
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
    let _ = sys::send(chan.as_fd(), b"U", &[]);
    let mut buf = [0u8; 8];
    match sys::recv(chan.as_fd(), &mut buf) {
        Ok((n, _)) if n >= 1 && buf[0] == b'M' => {}
        _ => sys::exit_now(125),
    }
    let init = match sys::fork() {
        Ok(pid) => pid,
        Err(e) => fail(&chan, format!("cannot fork the sandbox's init: {e}")),
    };
    if init == 0 {
        init_main(plan, setup, chan, idmapped);
    }
    drop(idmapped);
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

/// A user namespace carrying `map`, only to lend its maps to idmapped
/// mounts: a child unshares one and waits while its maps are written and
/// the namespace is opened, then exits (the namespace lives on in the
/// descriptor).
fn idmap_userns(map: &IdMap) -> Result<OwnedFd, String> {
    let (ours, theirs) =
        sys::seqpacket_pair().map_err(|e| format!("cannot create a socket pair: {e}"))?;
    let child = sys::fork().map_err(|e| format!("cannot fork: {e}"))?;
    if child == 0 {
        drop(ours);
        let _ = sys::set_parent_death_signal(libc::SIGKILL);
        let msg: &[u8] = if sys::unshare(libc::CLONE_NEWUSER).is_ok() {
            b"u"
        } else {
            b"e"
        };
        let _ = sys::send(theirs.as_fd(), msg, &[]);
        // Until the parent is done with us (it closes its end).
        let _ = sys::recv(theirs.as_fd(), &mut [0u8; 1]);
        sys::exit_now(0);
    }
    drop(theirs);
    let result = (|| {
        let mut buf = [0u8; 1];
        match sys::recv(ours.as_fd(), &mut buf) {
            Ok((1, _)) if buf[0] == b'u' => {}
            _ => return Err("cannot create a user namespace for the idmap".to_string()),
        }
        for (file, text) in [("uid_map", &map.uid_map), ("gid_map", &map.gid_map)] {
            fs::write(format!("/proc/{child}/{file}"), text)
                .map_err(|e| format!("cannot write the idmap's {file}: {e}"))?;
        }
        fs::File::open(format!("/proc/{child}/ns/user"))
            .map(OwnedFd::from)
            .map_err(|e| format!("cannot open the idmap's user namespace: {e}"))
    })();
    drop(ours);
    let _ = sys::wait(child, false);
    result
}

fn idmapped_binds(plan: &Plan, map: &IdMap) -> Result<IdmappedTrees, String> {
    let userns = idmap_userns(map)?;
    let id = &plan.identity;
    plan.view
        .layers
        .iter()
        .map(|l| match l {
            Layer::Bind {
                path,
                idmapped: true,
                ..
            } => {
                let fail = |e: io::Error| {
                    format!(
                        "{}: cannot show it through an idmapped mount, which makes what the \
                         sandbox writes there belong to uid {} (CMD itself runs as uid {}, never \
                         as root): {e} — the filesystem must support idmapped mounts (Linux 5.12+; \
                         ext4, xfs, btrfs, tmpfs since 6.3, …); or pass --owner USER, an \
                         unprivileged user, or start egressd run through sudo",
                        path.display(),
                        id.owner_uid,
                        id.host_uid
                    )
                };
                let tree = sys::open_tree_clone(&cstr(path)?).map_err(fail)?;
                sys::mount_idmap(tree.as_fd(), userns.as_fd(), sys::MOUNT_ATTR_NOSUID)
                    .map_err(fail)?;
                Ok(Some(tree))
            }
            _ => Ok(None),
        })
        .collect()
}

// ---------------------------------------------------------------- init (PID 1)

fn init_main(plan: &Plan, setup: &Setup, chan: OwnedFd, idmapped: IdmappedTrees) -> ! {
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() {
        sys::exit_now(125);
    }
    // PID 1 is a fork of the launcher: its argument vector and environment
    // (`--upstream-proxy http://user:password@…`, the variables the scrub
    // kept from CMD) would show in /proc/1/cmdline and /proc/1/environ, and
    // its memory holds the rest. Blanked, and closed to CMD (same uid when
    // started unprivileged).
    if let Err(e) = sys::set_undumpable() {
        fail(
            &chan,
            format!("cannot make the sandbox's init undumpable: {e}"),
        );
    }
    if let Err(e) = sys::wipe_arguments_and_environment(INIT_NAME) {
        fail(
            &chan,
            format!("cannot clear the sandbox's init arguments: {e}"),
        );
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
    // Before the filesystem is narrowed: nft is run from the host's tree.
    let capture = match &plan.transparent {
        None => Vec::new(),
        Some(t) => setup_capture(t).unwrap_or_else(|e| fail(&chan, e)),
    };
    if let Err(e) = setup_filesystem(plan, idmapped) {
        fail(&chan, e);
    }
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
        Ok(0) => command_main(plan, setup),
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
        // init may be a non-root uid of its namespace (started
        // unprivileged, it has CMD's uid), whose capabilities an exec drops.
        &[sys::CAP_NET_ADMIN],
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

/// `p` (absolute, as seen inside) under the new root being built.
fn under_root(p: &Path) -> PathBuf {
    Path::new(NEW_ROOT).join(p.strip_prefix("/").unwrap_or(p))
}

/// Creates `path` as a directory (or, with `file`, an empty file) where it
/// is missing, with its parents — possible only on the new root and the
/// fresh tmpfs mounts: every host path shown exists already. Directories
/// made here are 0755 whatever the umask, so that CMD can walk down to
/// what is bound below them.
fn ensure_mountpoint(path: &Path, file: bool) -> Result<(), String> {
    if fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    let what = |e: io::Error| format!("cannot create the mount point {}: {e}", path.display());
    let dir = if file { path.parent() } else { Some(path) };
    if let Some(dir) = dir {
        let missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|a| fs::symlink_metadata(a).is_err())
            .collect();
        for d in missing.into_iter().rev() {
            fs::create_dir(d)
                .and_then(|()| fs::set_permissions(d, fs::Permissions::from_mode(0o755)))
                .map_err(what)?;
        }
    }
    if file {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
            .map_err(what)?;
    }
    Ok(())
}

/// A detached copy of the host tree at `path`, with attributes `set`.
fn clone_tree(path: &Path, set: u64) -> Result<OwnedFd, String> {
    let tree = sys::open_tree_clone(&cstr(path)?)
        .map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    sys::mount_setattr(Some(tree.as_fd()), c"", set, 0, true)
        .map_err(|e| format!("cannot set the access of {}: {e}", path.display()))?;
    Ok(tree)
}

fn attach(tree: &OwnedFd, at: &Path, file: bool) -> Result<(), String> {
    ensure_mountpoint(at, file)?;
    sys::move_mount(tree.as_fd(), &cstr(at)?)
        .map_err(|e| format!("cannot mount {}: {e}", at.display()))
}

fn tmpfs(at: &Path, flags: libc::c_ulong, data: &str) -> Result<(), String> {
    ensure_mountpoint(at, false)?;
    let data = CString::new(data).map_err(|_| "NUL in tmpfs options".to_string())?;
    sys::mount(c"tmpfs", &cstr(at)?, Some(c"tmpfs"), flags, Some(&data))
        .map_err(|e| format!("cannot mount a tmpfs on {}: {e}", at.display()))
}

/// How often an entry of a rebuilt directory is taken again when the host
/// replaced it between taking and mounting it.
const REPLACED_TRIES: usize = 5;

/// Rebuilds the host directory `r` (see
/// [`View::rebuilt`](super::view::View::rebuilt)) on a tmpfs of its own
/// at its place under the new root: the host's symlinks recreated, every
/// other entry bound (with `attrs`) on a placeholder of its own, and an
/// empty placeholder where something is mounted later (a target of `r`, or
/// a rebuilt directory of `all`). An entry the host removes meanwhile is
/// not shown; one it replaces by rename is taken again.
fn rebuild(r: &Rebuilt, all: &[Rebuilt], attrs: u64) -> Result<(), String> {
    let what = |e: io::Error| format!("cannot rebuild {}: {e}", r.path.display());
    let mode = fs::metadata(&r.path).map_err(what)?.mode() & 0o7777;
    let at = under_root(&r.path);
    tmpfs(
        &at,
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("mode={mode:o},{REBUILT_TMPFS}"),
    )?;
    for e in fs::read_dir(&r.path).map_err(what)? {
        let e = e.map_err(what)?;
        let (host, inside) = (e.path(), at.join(e.file_name()));
        let Ok(md) = fs::symlink_metadata(&host) else {
            continue;
        };
        if md.file_type().is_symlink() {
            match fs::read_link(&host) {
                Ok(target) => std::os::unix::fs::symlink(target, &inside)
                    .map_err(|e| format!("cannot link {}: {e}", host.display()))?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot read {}: {e}", host.display())),
            }
        } else if r.targets.contains(&host) || all.iter().any(|d| d.path == host) {
            ensure_mountpoint(&inside, !md.is_dir())?;
        } else {
            bind_entry(&host, &inside, md.is_dir(), attrs)?;
        }
    }
    Ok(())
}

/// Binds the host's `host` at `inside` (a new placeholder). The host may
/// replace it by rename at any moment, and a copy of a file that was
/// renamed over cannot be attached (ENOENT): then it is taken again, up to
/// [`REPLACED_TRIES`] times. Gone from the host: not shown.
fn bind_entry(host: &Path, inside: &Path, dir: bool, attrs: u64) -> Result<(), String> {
    let c = cstr(host)?;
    ensure_mountpoint(inside, !dir)?;
    for _ in 0..REPLACED_TRIES {
        let tree = match sys::open_tree_clone(&c) {
            Ok(t) => t,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return remove_placeholder(inside, dir);
            }
            Err(e) => return Err(format!("cannot bind {}: {e}", host.display())),
        };
        sys::mount_setattr(Some(tree.as_fd()), c"", attrs, 0, true)
            .map_err(|e| format!("cannot set the access of {}: {e}", host.display()))?;
        match sys::move_mount(tree.as_fd(), &cstr(inside)?) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(format!("cannot mount {}: {e}", inside.display())),
        }
    }
    Err(format!(
        "{} was replaced on the host {REPLACED_TRIES} times while the sandbox was set up; \
         try again",
        host.display()
    ))
}

fn remove_placeholder(p: &Path, dir: bool) -> Result<(), String> {
    let r = if dir {
        fs::remove_dir(p)
    } else {
        fs::remove_file(p)
    };
    r.map_err(|e| format!("cannot remove {}: {e}", p.display()))
}

/// Builds the sandbox's root (the plan's [`View`](super::view::View)) and
/// pivots into it. In init, with the namespace's capabilities.
fn setup_filesystem(plan: &Plan, idmapped: IdmappedTrees) -> Result<(), String> {
    // Nothing mounted here may propagate back to the host.
    sys::mount(c"none", c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("cannot make the mount namespace private: {e}"))?;
    let view = &plan.view;

    // Every host tree is taken first, as a detached copy with its final
    // access, before any mount below can hide its source (a --rw under
    // /tmp, the CA's files).
    let system_attrs = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    let rebuilt = view.rebuilt();
    let trees = take_trees(view, &rebuilt, system_attrs, idmapped)?;
    let files = stage(view)?;
    let root = Path::new(NEW_ROOT);
    tmpfs(
        root,
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("mode=755,{SMALL_TMPFS}"),
    )?;

    mount_system(view, &trees.system, &rebuilt, system_attrs)?;
    let size = plan
        .tmpfs_size
        .map(|s| format!(",size={s}"))
        .unwrap_or_default();
    mount_proc_and_dev(&trees.dev, &size)?;
    mount_layers(plan, &trees.layers, &size)?;
    if let Some(target) = &view.resolv_conf {
        fs::write(RESOLV_STAGING, &plan.resolv_conf_text)
            .and_then(|()| fs::set_permissions(RESOLV_STAGING, fs::Permissions::from_mode(0o644)))
            .map_err(|e| format!("cannot write resolv.conf: {e}"))?;
        let tree = clone_tree(Path::new(RESOLV_STAGING), sys::MOUNT_ATTR_RDONLY)?;
        attach(&tree, &under_root(target), true).map_err(|e| format!("resolv.conf: {e}"))?;
    }

    mount_masks(view)?;
    for (tree, f) in files.iter().zip(&view.files) {
        attach(tree, &under_root(&f.target), true)?;
    }

    // Into the new root; the host's tree (and the staging tmpfs) is detached.
    sys::chdir(&cstr(root)?).map_err(|e| format!("cannot enter the new root: {e}"))?;
    sys::pivot_root(c".", c".").map_err(|e| format!("pivot_root: {e}"))?;
    sys::umount_detach(c".").map_err(|e| format!("cannot detach the host's root: {e}"))?;
    sys::chdir(c"/").map_err(|e| format!("cannot enter the new root: {e}"))?;
    // Nothing can be created beside what was put there (non-recursive: the
    // fresh scratch mounts stay writable). A rebuilt directory is never at
    // or below a layer, so what is mounted at its path is its own tmpfs.
    let own: Vec<CString> = rebuilt
        .iter()
        .map(|r| cstr(&r.path))
        .collect::<Result<_, _>>()?;
    for p in [c"/", c"/dev"]
        .into_iter()
        .chain(own.iter().map(CString::as_c_str))
    {
        sys::mount_setattr(None, p, sys::MOUNT_ATTR_RDONLY, 0, false).map_err(|e| {
            format!(
                "cannot make the sandbox's {} read-only: {e}",
                p.to_string_lossy()
            )
        })?;
    }

    match fs::metadata(&plan.cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        _ => Err(format!(
            "the working directory {} does not exist inside the sandbox",
            plan.cwd.display()
        )),
    }
}

/// The host trees the sandbox shows, cloned before anything is mounted:
/// the system's directories (`None` where rebuilt), the layers' binds
/// (`None` for a tmpfs) and the host's harmless `/dev` nodes.
struct Trees {
    system: Vec<Option<OwnedFd>>,
    layers: Vec<Option<(OwnedFd, bool)>>,
    dev: Vec<(&'static str, OwnedFd)>,
}

fn take_trees(
    view: &super::view::View,
    rebuilt: &[Rebuilt],
    system_attrs: u64,
    mut idmapped: IdmappedTrees,
) -> Result<Trees, String> {
    let mut system = Vec::new();
    for (path, entry) in &view.system {
        if *entry == SystemEntry::Dir && !rebuilt.iter().any(|r| r.path == *path) {
            system.push(Some(clone_tree(path, system_attrs)?));
        } else {
            system.push(None);
        }
    }
    let mut layers = Vec::new();
    for (i, l) in view.layers.iter().enumerate() {
        let tree = match l {
            Layer::Tmpfs { .. } => None,
            Layer::Bind {
                idmapped: true,
                writable,
                path,
                ..
            } => {
                let tree = idmapped.get_mut(i).and_then(Option::take).ok_or_else(|| {
                    format!("{}: the idmapped mount was not made", path.display())
                })?;
                if !writable {
                    sys::mount_setattr(Some(tree.as_fd()), c"", sys::MOUNT_ATTR_RDONLY, 0, true)
                        .map_err(|e| format!("cannot make {} read-only: {e}", path.display()))?;
                }
                Some((tree, fs::metadata(path).map(|m| m.is_dir()).unwrap_or(true)))
            }
            Layer::Bind { path, writable, .. } => {
                let is_dir = fs::metadata(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?
                    .is_dir();
                let attrs = if *writable {
                    sys::MOUNT_ATTR_NOSUID
                } else {
                    sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_RDONLY
                };
                Some((clone_tree(path, attrs)?, is_dir))
            }
        };
        layers.push(tree);
    }
    let mut dev = Vec::new();
    for n in DEV_NODES {
        let host = Path::new("/dev").join(n);
        // A host without one (a container's /dev) has nothing to lend.
        if fs::symlink_metadata(&host).is_ok() {
            dev.push((
                *n,
                clone_tree(&host, sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC)?,
            ));
        }
    }

    Ok(Trees {
        system,
        layers,
        dev,
    })
}

/// The staging tmpfs, private to this mount namespace: the new root, the
/// mask source (an empty file nobody may read) and resolv.conf; and
/// egressd's own files (the CA's) in it, from the bytes the launcher
/// read, cloned read-only.
fn stage(view: &super::view::View) -> Result<Vec<OwnedFd>, String> {
    let contents: usize = view.files.iter().map(|f| f.contents.len()).sum();
    tmpfs(
        Path::new(STAGING),
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("mode=700,size={}", STAGING_SIZE + contents),
    )?;
    let mut files = Vec::new();
    for (i, f) in view.files.iter().enumerate() {
        let staged = PathBuf::from(format!("{STAGING}/file{i}"));
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&staged)
            .and_then(|mut w| {
                w.set_permissions(fs::Permissions::from_mode(0o644))?;
                io::Write::write_all(&mut w, &f.contents)
            })
            .map_err(|e| format!("cannot write {}: {e}", f.target.display()))?;
        files.push(clone_tree(
            &staged,
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
        )?);
    }
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(MASK_FILE)
        .and_then(|f| f.set_permissions(fs::Permissions::from_mode(0o000)))
        .map_err(|e| format!("cannot create the mask file: {e}"))?;
    Ok(files)
}

/// The system, read-only (merged-/usr links as links), then the rebuilt
/// directories.
fn mount_system(
    view: &super::view::View,
    system: &[Option<OwnedFd>],
    rebuilt: &[Rebuilt],
    system_attrs: u64,
) -> Result<(), String> {
    // The system, read-only; merged-/usr links as links.
    for ((path, entry), tree) in view.system.iter().zip(system) {
        match (entry, tree) {
            (SystemEntry::Symlink(target), _) => {
                std::os::unix::fs::symlink(target, under_root(path))
                    .map_err(|e| format!("cannot link {}: {e}", path.display()))?;
            }
            (SystemEntry::Dir, Some(tree)) => attach(tree, &under_root(path), false)?,
            (SystemEntry::Dir, None) => {}
        }
    }
    // The rebuilt directories, shallow to deep: each one's placeholder is
    // in its parent's tmpfs, or in the root's for a system tree.
    // Their host paths are still in sight (nothing is mounted over a
    // system tree here, only under the new root).
    for r in rebuilt {
        rebuild(r, rebuilt, system_attrs)?;
    }

    Ok(())
}

/// The sandbox's own /proc and a minimal /dev.
fn mount_proc_and_dev(dev: &[(&'static str, OwnedFd)], size: &str) -> Result<(), String> {
    // The sandbox's own /proc, mounted while the host's is still in this
    // namespace (the kernel lets a user namespace mount proc only where a
    // full proc is already visible).
    let proc_at = under_root(Path::new("/proc"));
    ensure_mountpoint(&proc_at, false)?;
    sys::mount(
        c"proc",
        &cstr(&proc_at)?,
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

    // A minimal /dev: the host's harmless nodes, a private devpts, fresh shm.
    let dev_at = under_root(Path::new("/dev"));
    tmpfs(
        &dev_at,
        libc::MS_NOSUID | libc::MS_NOEXEC,
        &format!("mode=755,{SMALL_TMPFS}"),
    )?;
    for (n, tree) in dev {
        attach(tree, &dev_at.join(n), true)?;
    }
    for (link, target) in DEV_LINKS {
        std::os::unix::fs::symlink(target, dev_at.join(link))
            .map_err(|e| format!("cannot link /dev/{link}: {e}"))?;
    }
    let pts = dev_at.join("pts");
    ensure_mountpoint(&pts, false)?;
    sys::mount(
        c"devpts",
        &cstr(&pts)?,
        Some(c"devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=620"),
    )
    .map_err(|e| format!("cannot mount /dev/pts: {e}"))?;
    tmpfs(
        &dev_at.join("shm"),
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("mode=1777{size}"),
    )?;

    Ok(())
}

/// Fresh scratch, HOME and the binds, shallow to deep.
fn mount_layers(plan: &Plan, trees: &[Option<(OwnedFd, bool)>], size: &str) -> Result<(), String> {
    let id = &plan.identity;
    for (l, tree) in plan.view.layers.iter().zip(trees) {
        let at = under_root(l.path());
        match (l, tree) {
            (
                Layer::Tmpfs {
                    mode, cmd_owned, ..
                },
                _,
            ) => {
                let owner = if *cmd_owned {
                    format!(",uid={},gid={}", id.uid, id.gid)
                } else {
                    String::new()
                };
                tmpfs(
                    &at,
                    libc::MS_NOSUID | libc::MS_NODEV,
                    &format!("mode={mode:o}{owner}{size}"),
                )?;
                // Before anything deeper is mounted over HOME.
                if l.path() == plan.home {
                    write_home_files(&at, &plan.home_files, id.uid, id.gid)?;
                }
            }
            (Layer::Bind { .. }, Some((tree, is_dir))) => attach(tree, &at, !is_dir)?,
            (Layer::Bind { .. }, None) => unreachable!("every bind was cloned"),
        }
    }

    Ok(())
}

/// Masks last, over whatever shows a secret (only where it is visible).
fn mount_masks(view: &super::view::View) -> Result<(), String> {
    for m in &view.masks {
        let at = under_root(&m.path);
        match fs::symlink_metadata(&at) {
            Ok(md) if !md.file_type().is_symlink() => {}
            _ => continue,
        }
        if m.dir {
            sys::mount(
                c"tmpfs",
                &cstr(&at)?,
                Some(c"tmpfs"),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                Some(MASK_DIR_OPTIONS),
            )
            .map_err(|e| format!("cannot hide {}: {e}", m.path.display()))?;
        } else {
            let tree = clone_tree(
                Path::new(MASK_FILE),
                sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
            )?;
            sys::move_mount(tree.as_fd(), &cstr(&at)?)
                .map_err(|e| format!("cannot hide {}: {e}", m.path.display()))?;
        }
    }

    Ok(())
}

/// The plan's files for HOME (the NSS database), into the fresh tmpfs at
/// `home`: directories 0700 and files 0600, all owned by CMD's uid and gid
/// so CMD can read and update them. Nothing else is in that tmpfs yet, so
/// no path here can be a link planted by anyone.
fn write_home_files(
    home: &Path,
    files: &[(PathBuf, Vec<u8>)],
    uid: u32,
    gid: u32,
) -> Result<(), String> {
    let own = |p: &Path| {
        std::os::unix::fs::chown(p, Some(uid), Some(gid))
            .map_err(|e| format!("cannot give {} to CMD: {e}", p.display()))
    };
    for (rel, bytes) in files {
        let at = home.join(rel);
        let mut dir = home.to_path_buf();
        for c in rel.parent().into_iter().flat_map(|p| p.components()) {
            dir.push(c);
            if fs::symlink_metadata(&dir).is_err() {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
                own(&dir)?;
            }
        }
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&at)
            .and_then(|mut f| io::Write::write_all(&mut f, bytes))
            .map_err(|e| format!("cannot write {}: {e}", at.display()))?;
        own(&at)?;
    }
    Ok(())
}

// ---------------------------------------------------------------- CMD

fn command_main(plan: &Plan, setup: &Setup) -> ! {
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
    if let Err(e) = setup.rlimits.apply() {
        die(125, format!("cannot set {e}"));
    }
    if let Err(e) = sys::cloexec_from(3) {
        die(125, format!("cannot close inherited descriptors: {e}"));
    }
    let id = &plan.identity;
    if let Err(e) = sys::drop_privileges(id.uid, id.gid, !id.deny_setgroups()) {
        die(125, format!("cannot drop privileges: {e}"));
    }
    // A session keyring of CMD's own, before the filter forbids keyctl:
    // the launcher's session keys stay out of reach.
    // A kernel without keyrings (ENOSYS), or a container's filter that
    // already refuses keyctl (EPERM, inherited by CMD), leaves none to share.
    match sys::join_new_session_keyring() {
        Ok(()) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {}
        Err(e) => die(
            125,
            format!("cannot give CMD a session keyring of its own: {e}"),
        ),
    }
    if let Err(e) = sys::install_seccomp(&seccomp::program()) {
        die(125, format!("cannot install the seccomp filter: {e}"));
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
