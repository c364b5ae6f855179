//! Thin, safe wrappers over the Linux calls the launcher makes: process
//! creation and namespaces, signals, descriptor passing, the mount API
//! (idmapped mounts, pivot_root), loopback and route configuration, running
//! a helper program (nft), account lookup, eventfd, and dropping
//! privileges. Every `unsafe` block of the launcher lives here, each with
//! the reason it is sound; callers see `io::Result`s. Linux only (this is
//! where the launcher's kernel requirements show: mount_setattr and
//! idmapped mounts 5.12, pidfd_open 5.3, close_range 5.9).

use std::ffi::{CStr, CString};
use std::io;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use libc::{c_int, c_long, c_uint, c_ulong, pid_t};

fn check(ret: c_int) -> io::Result<c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: c_long) -> io::Result<c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

// ---------------------------------------------------------------- processes

/// `fork()`. Returns 0 in the child.
///
/// Only sound to use from a single-threaded process (the launcher forks
/// before it starts any thread): the child then owns every lock it sees.
pub fn fork() -> io::Result<pid_t> {
    // SAFETY: see above; the launcher calls this before spawning threads.
    check(unsafe { libc::fork() })
}

pub fn unshare(flags: c_int) -> io::Result<()> {
    // SAFETY: no pointers; the kernel checks the caller is single-threaded.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// Asks the kernel to send `sig` to this process when its parent thread dies.
pub fn set_parent_death_signal(sig: c_int) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as c_ulong, 0, 0, 0) }).map(drop)
}

/// Makes the process undumpable: no core file, and a process of the same
/// uid without CAP_SYS_PTRACE can neither trace it nor read its
/// `/proc/PID/{mem,environ}` (the kernel owns them). Reset by execve.
pub fn set_undumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as c_ulong, 0, 0, 0) }).map(drop)
}

/// Joins a new, empty session keyring of the process's own
/// (`KEYCTL_JOIN_SESSION_KEYRING` with no name): the keys of the session
/// it came from are no longer reachable through `@s`.
pub fn join_new_session_keyring() -> io::Result<()> {
    const KEYCTL_JOIN_SESSION_KEYRING: c_long = 1;
    // SAFETY: keyctl with a null name pointer, which the kernel reads as
    // "an anonymous keyring"; no memory is handed over.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    })
    .map(drop)
}

/// Overwrites the process's argument and environment strings (the memory
/// `/proc/PID/cmdline` and `/proc/PID/environ` read) with zeros, and puts
/// `name` at the start of the arguments. The areas' bounds are the
/// kernel's own (`/proc/self/stat`, fields 48 to 51).
///
/// Only for a forked child that is done with `std::env` (the strings libc's
/// `environ` and Rust's arguments point to become empty).
pub fn wipe_arguments_and_environment(name: &[u8]) -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/self/stat");
    let rest = &stat[stat.rfind(')').ok_or_else(bad)? + 1..];
    let fields: Vec<usize> = rest
        .split_whitespace()
        .skip(45)
        .take(4)
        .map(|f| f.parse().map_err(|_| bad()))
        .collect::<io::Result<_>>()?;
    let [arg_start, arg_end, env_start, env_end] = fields[..] else {
        return Err(bad());
    };
    for (start, end) in [(arg_start, arg_end), (env_start, env_end)] {
        if end > start {
            // SAFETY: the kernel reports these as this process's own
            // argument and environment areas: mapped, writable (the
            // initial stack), and only read through pointers into them,
            // which this single-threaded child no longer follows.
            unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
        }
    }
    let n = name.len().min(arg_end.saturating_sub(arg_start + 1));
    // SAFETY: within the argument area zeroed above, leaving its last
    // byte 0 (the kernel then reads it as plain arguments).
    unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), arg_start as *mut u8, n) };
    Ok(())
}

pub fn getpid() -> pid_t {
    // SAFETY: always succeeds.
    unsafe { libc::getpid() }
}

pub fn getppid() -> pid_t {
    // SAFETY: always succeeds.
    unsafe { libc::getppid() }
}

pub fn geteuid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::getegid() }
}

/// Ends the process at once: no destructors, no atexit handlers, no stdio
/// flush of buffers that a forked child shares with its parent.
pub fn exit_now(code: u8) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code as c_int) }
}

/// Waits for `pid` (or any child, with -1) and returns (pid, raw status).
pub fn wait(pid: pid_t, nohang: bool) -> io::Result<(pid_t, c_int)> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, if nohang { libc::WNOHANG } else { 0 }) };
        if r >= 0 {
            return Ok((r, status));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The shell's convention: the exit code, or 128 + the signal that killed it.
pub fn exit_code(status: c_int) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        128u8.wrapping_add(libc::WTERMSIG(status) as u8)
    } else {
        255
    }
}

/// A descriptor for `pid` that cannot come to name another process later.
pub fn pidfd_open(pid: pid_t) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments; the result is a new descriptor we own.
    let fd = check_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: c_int) -> io::Result<()> {
    // SAFETY: a null siginfo is allowed (the kernel fills in SI_USER).
    check_long(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })
    .map(drop)
}

pub fn kill(pid: pid_t, sig: c_int) -> io::Result<()> {
    // SAFETY: integer arguments.
    check(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// Marks every descriptor from `first` up close-on-exec.
pub fn cloexec_from(first: c_uint) -> io::Result<()> {
    // SAFETY: integer arguments.
    check(unsafe { libc::close_range(first, c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC as c_int) })
        .map(drop)
}

pub fn chdir(path: &CStr) -> io::Result<()> {
    // SAFETY: a valid C string.
    check(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// `execve`; returns only on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = envp.iter().map(|s| s.as_ptr()).collect();
    e.push(std::ptr::null());
    // SAFETY: null-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), a.as_ptr(), e.as_ptr()) };
    io::Error::last_os_error()
}

// ---------------------------------------------------------------- signals

/// A set of signals, to block or to wait for.
pub struct SigSet(libc::sigset_t);

impl SigSet {
    pub fn of(sigs: &[c_int]) -> SigSet {
        // SAFETY: sigemptyset initialises the set; sigaddset only fails for
        // invalid numbers, which the constants we pass are not.
        unsafe {
            let mut s = MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(s.as_mut_ptr());
            let mut s = s.assume_init();
            for &sig in sigs {
                libc::sigaddset(&mut s, sig);
            }
            SigSet(s)
        }
    }

    /// Blocks the set in the calling thread (threads started later inherit it).
    pub fn block(&self) -> io::Result<()> {
        // SAFETY: valid set pointer; a null old-set pointer is allowed.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &self.0, std::ptr::null_mut()) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(())
    }

    /// Waits for one signal of the set (which must be blocked); returns the
    /// signal and its `si_code` (SI_USER for kill(), SI_KERNEL for a
    /// terminal's ^C, …).
    pub fn wait(&self) -> io::Result<(c_int, c_int)> {
        loop {
            // SAFETY: valid set and out-pointer.
            let mut info: libc::siginfo_t = unsafe { zeroed() };
            let r = unsafe { libc::sigwaitinfo(&self.0, &mut info) };
            if r >= 0 {
                return Ok((r, info.si_code));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Unblocks every signal and restores SIGPIPE's default action (Rust
/// programs ignore it, and an ignored disposition survives exec).
pub fn reset_signals_for_exec() -> io::Result<()> {
    let empty = SigSet::of(&[]);
    // SAFETY: valid set; null old-set pointer allowed. SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        let r = libc::pthread_sigmask(libc::SIG_SETMASK, &empty.0, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- descriptor passing

/// A connected pair of SOCK_SEQPACKET sockets (message boundaries kept),
/// both close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors returned.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Most descriptors one message carries.
const MAX_FDS: usize = 5;

/// Sends one message with `fds` attached (SCM_RIGHTS).
pub fn send(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // u64 keeps the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; we point it at `iov` and `control`,
    // which outlive the sendmsg call, and write the control message within
    // the CMSG_SPACE we computed (checked against the buffer's size).
    unsafe {
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let payload = (fds.len() * size_of::<c_int>()) as c_uint;
            let space = libc::CMSG_SPACE(payload) as usize;
            assert!(space <= size_of::<[u64; 8]>());
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as usize;
            let data = libc::CMSG_DATA(cmsg) as *mut c_int;
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
        loop {
            let r = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Receives one message and the descriptors attached to it (close-on-exec).
/// `Ok((0, []))` is end of stream.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: as in `send`; the kernel writes at most msg_controllen bytes
    // of control data, and we read only the SCM_RIGHTS payload it reports.
    unsafe {
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = size_of::<[u64; 8]>();
        let n = loop {
            let r = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize - header) / size_of::<c_int>();
                let data = libc::CMSG_DATA(cmsg) as *const c_int;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other("descriptors were truncated in transit"));
        }
        Ok((n, fds))
    }
}

pub fn set_recv_timeout(sock: BorrowedFd<'_>, d: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid timeval of the size we pass.
    check(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}

// ---------------------------------------------------------------- mounts

// The new mount API's constants (linux/mount.h); not all are in `libc`.
const OPEN_TREE_CLONE: c_uint = 1;
const AT_RECURSIVE: c_uint = 0x8000;
const AT_EMPTY_PATH: c_uint = 0x1000;
const MOVE_MOUNT_F_EMPTY_PATH: c_uint = 0x4;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub fn mount(
    source: &CStr,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    // SAFETY: valid C strings or nulls, as mount(2) accepts.
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |s| s.as_ptr() as *const libc::c_void),
        )
    })
    .map(drop)
}

/// A detached copy of the mount tree at `path` (with everything mounted
/// below it), to be attached elsewhere later with [`move_mount`].
pub fn open_tree_clone(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: a valid C string; the result is a new descriptor we own.
    let fd = check_long(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as c_uint,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sets and clears `MOUNT_ATTR_*` on the mount at `path` (or on the tree
/// behind `fd`) and, with `recursive`, every mount below it.
pub fn mount_setattr(
    at: Option<BorrowedFd<'_>>,
    path: &CStr,
    set: u64,
    clear: u64,
    recursive: bool,
) -> io::Result<()> {
    setattr(at, path, set, clear, recursive, None)
}

/// Makes the detached tree behind `tree` (and every mount below it) an
/// idmapped mount, with the id maps of the user namespace `userns`, plus
/// the attributes `set`.
pub fn mount_idmap(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>, set: u64) -> io::Result<()> {
    setattr(Some(tree), c"", set, 0, true, Some(userns))
}

fn setattr(
    at: Option<BorrowedFd<'_>>,
    path: &CStr,
    set: u64,
    clear: u64,
    recursive: bool,
    userns: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set | userns.map_or(0, |_| MOUNT_ATTR_IDMAP),
        attr_clr: clear,
        propagation: 0,
        userns_fd: userns.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    let rec = if recursive { AT_RECURSIVE } else { 0 };
    let (dirfd, flags) = match at {
        Some(fd) => (fd.as_raw_fd(), rec | AT_EMPTY_PATH),
        None => (libc::AT_FDCWD, rec),
    };
    // SAFETY: valid C string and a struct of the size we pass.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Attaches the detached tree `tree` at `target`.
pub fn move_mount(tree: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings; integer descriptors.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// Detaches the mount at `path` (MNT_DETACH: lazily, with everything below).
pub fn umount_detach(path: &CStr) -> io::Result<()> {
    // SAFETY: a valid C string.
    check(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

// ---------------------------------------------------------------- eventfd

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: integer arguments; the result is a new descriptor we own.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers `fd` with the tokio runtime this is called in, to await its
/// readiness.
pub fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is an open descriptor that it alone closes, and
    // its as_raw_fd returns that same descriptor for as long as it lives,
    // which is as long as the AsyncFd that owns it.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|e| e.into())
}

// ---------------------------------------------------------------- accounts

/// The uid and primary gid of the account `name` (passwd, through NSS).
pub fn account(name: &str) -> io::Result<Option<(u32, u32)>> {
    let cname = CString::new(name).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: passwd is plain data, filled in by getpwnam_r.
    let mut pwd: libc::passwd = unsafe { zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; strings in `pwd` point
    // into `buf`, which we do not read through.
    let r = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
            &mut result,
        )
    };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok((!result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid)))
}

// ---------------------------------------------------------------- network

fn ifreq_named(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr
}

fn sockaddr_v4(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux; the
    // kernel reads it as sockaddr_in because sin_family says AF_INET.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Brings `lo` up and gives it `second` as an extra address (/8), in the
/// calling process's network namespace.
pub fn loopback_up(second: Ipv4Addr) -> io::Result<()> {
    // SAFETY: a fresh socket descriptor we own.
    let sock = unsafe {
        OwnedFd::from_raw_fd(check(libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        ))?)
    };
    let fd = sock.as_raw_fd();
    let mut ifr = ifreq_named("lo");
    // SAFETY: ioctls on a socket with a valid ifreq; we read the union's
    // flags member only after SIOCGIFFLAGS filled it in.
    unsafe {
        check(libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut ifr))?;
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &ifr))?;
    }
    // An alias label ("lo:1") adds a secondary address without netlink.
    let mut alias = ifreq_named("lo:1");
    alias.ifr_ifru.ifru_addr = sockaddr_v4(second);
    // SAFETY: as above.
    unsafe { check(libc::ioctl(fd, libc::SIOCSIFADDR as _, &alias))? };
    alias.ifr_ifru.ifru_netmask = sockaddr_v4(Ipv4Addr::new(255, 0, 0, 0));
    // SAFETY: as above.
    unsafe { check(libc::ioctl(fd, libc::SIOCSIFNETMASK as _, &alias))? };
    Ok(())
}

// ---------------------------------------------------------------- privileges

const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Becomes `uid`/`gid` (inside the sandbox's user namespace) with no
/// capabilities, now or after any exec: locks the "root is not special"
/// securebits, empties the bounding set, drops supplementary groups (where
/// `setgroups` is allowed), switches ids, empties the ambient set, clears
/// effective/permitted/inheritable, and sets no_new_privs (setuid binaries
/// and file capabilities grant nothing). The order matters: the bounding
/// set and the ids can only be changed while the capabilities to do so are
/// still held.
pub fn drop_privileges(uid: u32, gid: u32, clear_groups: bool) -> io::Result<()> {
    let bits = libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_KEEP_CAPS_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    let ctx =
        |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    // SAFETY: prctl/capset/set*id with integer arguments or structs we own.
    unsafe {
        check(libc::prctl(
            libc::PR_SET_SECUREBITS,
            bits as c_ulong,
            0,
            0,
            0,
        ))
        .map_err(ctx("securebits"))?;
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as c_ulong, 0, 0, 0) != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINVAL) {
                    break; // past the kernel's last capability
                }
                return Err(ctx("bounding set")(e));
            }
        }
        if clear_groups {
            check(libc::setgroups(0, std::ptr::null())).map_err(ctx("setgroups"))?;
        }
        check(libc::setresgid(gid, gid, gid)).map_err(ctx("setresgid"))?;
        check(libc::setresuid(uid, uid, uid)).map_err(ctx("setresuid"))?;
        check(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as c_ulong,
            0,
            0,
            0,
        ))
        .map_err(ctx("ambient set"))?;
        let header = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        check_long(libc::syscall(libc::SYS_capset, &header, data.as_ptr()))
            .map_err(ctx("capset"))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)).map_err(ctx("no_new_privs"))?;
    }
    Ok(())
}

/// Installs `prog` as the calling thread's seccomp filter (after
/// no_new_privs, which [`drop_privileges`] sets); inherited across fork
/// and exec, never removed.
pub fn install_seccomp(prog: &[super::seccomp::Insn]) -> io::Result<()> {
    let filters: Vec<libc::sock_filter> = prog
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let len = u16::try_from(filters.len()).map_err(io::Error::other)?;
    let fprog = libc::sock_fprog {
        len,
        filter: filters.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `len` instructions that outlive the call;
    // the kernel copies the program.
    check(unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as c_ulong,
            &fprog as *const libc::sock_fprog as c_ulong,
            0,
            0,
        )
    })
    .map(drop)
}

// ---------------------------------------------------------------- routes (transparent mode)

// Netlink and rtnetlink constants (linux/netlink.h, linux/rtnetlink.h).
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 0x2;
const NLMSG_HDRLEN: usize = 16;
const RTMSG_LEN: usize = 12;

fn push_rtattr(msg: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(payload);
    msg.resize(msg.len() + (4 - len % 4) % 4, 0);
}

/// Adds a default route (IPv4 or IPv6, by the family of `src`) through
/// `lo`, with `src` as the preferred source address, in the calling
/// process's network namespace (rtnetlink; what `ip route add default dev
/// lo src SRC` does). Without the source, connections to outside addresses
/// would leave from 0.0.0.0: lo's addresses have host scope, which a route
/// of link scope does not pick.
pub fn add_default_route_via_lo(src: std::net::IpAddr) -> io::Result<()> {
    let (family, addr, scope): (c_int, Vec<u8>, u8) = match src {
        std::net::IpAddr::V4(a) => (libc::AF_INET, a.octets().to_vec(), libc::RT_SCOPE_LINK),
        std::net::IpAddr::V6(a) => (libc::AF_INET6, a.octets().to_vec(), libc::RT_SCOPE_UNIVERSE),
    };
    // SAFETY: a NUL-terminated name.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(io::Error::last_os_error());
    }
    let mut msg = Vec::with_capacity(64);
    msg.extend_from_slice(&[0u8; NLMSG_HDRLEN]);
    msg.extend_from_slice(&[
        family as u8,
        0, // dst_len: the default route
        0, // src_len
        0, // tos
        libc::RT_TABLE_MAIN,
        libc::RTPROT_BOOT,
        scope,
        libc::RTN_UNICAST,
    ]);
    msg.extend_from_slice(&0u32.to_ne_bytes()); // rtm_flags
    debug_assert_eq!(msg.len(), NLMSG_HDRLEN + RTMSG_LEN);
    push_rtattr(&mut msg, libc::RTA_OIF, &lo.to_ne_bytes());
    push_rtattr(&mut msg, libc::RTA_PREFSRC, &addr);
    let len = msg.len() as u32;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    msg[4..6].copy_from_slice(&libc::RTM_NEWROUTE.to_ne_bytes());
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    msg[6..8].copy_from_slice(&flags.to_ne_bytes());
    msg[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence number

    netlink_request(&msg)
}

/// Sends one rtnetlink request `msg` to the kernel and waits for its
/// acknowledgement (the error it carries, if any).
fn netlink_request(msg: &[u8]) -> io::Result<()> {
    // SAFETY: a fresh socket descriptor we own.
    let sock = unsafe {
        OwnedFd::from_raw_fd(check(libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        ))?)
    };
    // SAFETY: sockaddr_nl is plain data; all-zero with the family set
    // addresses the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `msg` and `kernel` are valid for the lengths passed.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr() as *const libc::c_void,
            msg.len(),
            0,
            &kernel as *const libc::sockaddr_nl as *const libc::sockaddr,
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    set_recv_timeout(sock.as_fd(), Duration::from_secs(5))?;
    let mut reply = [0u8; 1024];
    loop {
        // SAFETY: `reply` is valid for its length.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                reply.as_mut_ptr() as *mut libc::c_void,
                reply.len(),
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        if n < NLMSG_HDRLEN + 4 {
            return Err(io::Error::other("short netlink reply"));
        }
        let kind = u16::from_ne_bytes([reply[4], reply[5]]);
        if kind != NLMSG_ERROR {
            continue;
        }
        let errno = i32::from_ne_bytes(
            reply[NLMSG_HDRLEN..NLMSG_HDRLEN + 4]
                .try_into()
                .expect("four bytes"),
        );
        return if errno == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(-errno))
        };
    }
}

// ---------------------------------------------------------------- helper programs

/// `CAP_NET_ADMIN` (linux/capability.h): what nft needs.
pub const CAP_NET_ADMIN: u32 = 12;

/// Makes `caps` (which the caller holds) survive the next execve, as
/// ambient capabilities: a process whose uid is not 0 in its namespace
/// otherwise loses every capability when it runs a program.
fn keep_across_exec(caps: &[u32]) -> io::Result<()> {
    let header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget/capset fill and read the two-element array the v3
    // header announces; prctl takes integers.
    unsafe {
        check_long(libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()))?;
        for &c in caps {
            data[(c / 32) as usize].inheritable |= 1 << (c % 32);
        }
        check_long(libc::syscall(libc::SYS_capset, &header, data.as_ptr()))?;
        for &c in caps {
            check(libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as c_ulong,
                c as c_ulong,
                0,
                0,
            ))?;
        }
    }
    Ok(())
}

/// Writes all of `data` to `fd` (retrying an interrupted write).
fn write_all_fd(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    let mut written = 0;
    while written < data.len() {
        // SAFETY: the slice is valid for its length.
        let r = unsafe {
            libc::write(
                fd.as_raw_fd(),
                data[written..].as_ptr() as *const libc::c_void,
                data.len() - written,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        written += r as usize;
    }
    Ok(())
}

/// Reads `fd` to its end, keeping the first 16 KiB or so: a program that
/// prints without end cannot exhaust memory.
fn read_bounded(fd: BorrowedFd<'_>) -> Vec<u8> {
    let mut output = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: `buf` is valid for its length.
        let r = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if r == 0 {
            break;
        }
        if output.len() < 16 << 10 {
            output.extend_from_slice(&buf[..r as usize]);
        }
    }
    output
}

/// Runs `path` with `args` (and an empty environment), `input` as its
/// standard input, and the capabilities `caps` of the caller's, and returns
/// its exit status and what it wrote to stdout and stderr. For a
/// single-threaded caller (it forks), such as the sandbox's init.
pub fn run_program(
    path: &CStr,
    args: &[CString],
    input: &[u8],
    caps: &[u32],
) -> io::Result<(c_int, String)> {
    let pipe = || -> io::Result<(OwnedFd, OwnedFd)> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: `fds` has room for the two descriptors returned.
        check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
        // SAFETY: fresh descriptors owned by nobody else.
        Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    };
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    // The input fits the pipe's buffer (64 KiB): write it all now, so the
    // program sees end-of-file after it.
    if input.len() >= 64 << 10 {
        return Err(io::Error::other("input too large for a pipe"));
    }
    write_all_fd(in_w.as_fd(), input)?;
    drop(in_w);
    let mut argv = vec![path.to_owned()];
    argv.extend(args.iter().cloned());
    let pid = fork()?;
    if pid == 0 {
        // SAFETY: dup2 onto the standard descriptors (which clears their
        // close-on-exec flag); every other descriptor is close-on-exec.
        unsafe {
            if libc::dup2(in_r.as_raw_fd(), 0) < 0
                || libc::dup2(out_w.as_raw_fd(), 1) < 0
                || libc::dup2(out_w.as_raw_fd(), 2) < 0
            {
                exit_now(127);
            }
        }
        let _ = reset_signals_for_exec();
        if keep_across_exec(caps).is_err() {
            exit_now(126);
        }
        execve(path, &argv, &[]);
        exit_now(127);
    }
    drop(in_r);
    drop(out_w);
    let output = read_bounded(out_r.as_fd());
    let (_, status) = wait(pid, false)?;
    Ok((status, String::from_utf8_lossy(&output).into_owned()))
}
