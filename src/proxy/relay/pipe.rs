//! Pipes for splice(2): a tunnel direction moves bytes socket → pipe →
//! socket inside the kernel, never copying them through egressd's memory.
//!
//! A direction leases a pipe from the [`PipePool`] only while data flows:
//! it takes one when its source becomes readable and gives it back once the
//! pipe is empty again and the source would block. Idle tunnels hold no
//! pipe (a pipe is two descriptors; 9000 idle tunnels already hold 18,000
//! sockets). A pipe that may still hold bytes is closed, never returned: the
//! next lease must never see another tunnel's data.
//!
//! This file owns the pipes and the two system calls on them; the copy
//! loop that drives them lives in `relay`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use libc::c_int;

/// Capacity asked for each pipe (F_SETPIPE_SZ). Bigger pipes move more per
/// system call and keep more in flight; the pages are taken only while
/// bytes sit in the pipe. Measured on loopback (one bulk stream, quiet
/// machine): 256 KiB pipes reached 0.72x direct, 1 MiB 0.90x. Linux's
/// default `pipe-max-size` is 1 MiB; an unprivileged user's pipes count
/// against `pipe-user-pages-soft` (64 MiB), beyond which the kernel refuses
/// to enlarge and the pipe keeps a default size: slower, still correct.
pub(crate) const PIPE_SIZE: usize = 1 << 20;
/// Empty pipes kept for the next lease; the rest are closed. 32 full-size
/// free pipes are half the default per-user soft limit, leaving the other
/// half for pipes in use.
pub(crate) const MAX_FREE: usize = 32;

/// One pipe: both ends non-blocking and close-on-exec.
pub(crate) struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    cap: usize,
}

impl Pipe {
    fn new(size: usize) -> io::Result<Pipe> {
        let mut fds: [c_int; 2] = [-1; 2];
        // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are fresh descriptors that
        // nothing else owns; each OwnedFd closes its own exactly once.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A refused enlargement (EPERM over the per-user limit, EINVAL
        // above pipe-max-size) leaves the default size: still a pipe.
        let size = c_int::try_from(size).unwrap_or(c_int::MAX);
        // SAFETY: fcntl on a descriptor we own, with an int argument.
        let got = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
        let cap = if got > 0 {
            got
        } else {
            // SAFETY: as above; F_GETPIPE_SZ takes no argument.
            unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) }
        };
        Ok(Pipe {
            r,
            w,
            cap: usize::try_from(cap).ok().filter(|&c| c > 0).unwrap_or(4096),
        })
    }

    /// Bytes in the pipe, as the kernel counts them.
    fn pending(&self) -> io::Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer, which is
        // valid for the duration of the call.
        if unsafe { libc::ioctl(self.r.as_raw_fd(), libc::FIONREAD, &mut n) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(n).unwrap_or(0))
    }
}

/// `splice(from, to, len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK)`: one of the
/// two must be a pipe. Returns the bytes moved; 0 from a socket is its end.
fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are borrowed, so open for the whole call;
    // null offsets are what splice takes for pipes and sockets.
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Whether a splice error means "this descriptor cannot be spliced" (so
/// the direction should copy in user space instead) rather than a failure
/// of the connection.
pub(crate) fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS))
}

/// Empty pipes, shared by every tunnel of the process.
pub(crate) struct PipePool {
    free: Mutex<Vec<Pipe>>,
    max_free: usize,
    size: usize,
    /// False only for pools that must refuse (tests of the copy fallback).
    enabled: bool,
    leased: AtomicUsize,
    open: AtomicUsize,
    /// Bytes spliced out of this pool's pipes, so tests can tell splicing
    /// from the fallback copy.
    #[cfg(test)]
    pub(crate) spliced: std::sync::atomic::AtomicU64,
}

impl PipePool {
    pub(crate) const fn new(max_free: usize, size: usize) -> PipePool {
        PipePool {
            free: Mutex::new(Vec::new()),
            max_free,
            size,
            enabled: true,
            leased: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            #[cfg(test)]
            spliced: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A pool that never has a pipe: every direction copies in user space.
    #[cfg(test)]
    pub(crate) const fn without_pipes() -> PipePool {
        let mut p = PipePool::new(0, 0);
        p.enabled = false;
        p
    }

    /// The pool a proxy shares between all its tunnels (one per
    /// `ProxyCtx`): pipes count against the file limit with every socket.
    pub(crate) fn standard() -> PipePool {
        PipePool::new(MAX_FREE, PIPE_SIZE)
    }

    /// An empty pipe: a free one, or a new one. Fails when no pipe can be
    /// made (EMFILE, ENFILE); the caller copies in user space instead.
    pub(crate) fn take(&self) -> io::Result<Lease<'_>> {
        if !self.enabled {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "pipes disabled"));
        }
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let pipe = match reused {
            Some(p) => p,
            None => {
                let p = Pipe::new(self.size)?;
                self.open.fetch_add(1, Ordering::Relaxed);
                p
            }
        };
        self.leased.fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            pool: self,
            pipe: Some(pipe),
            held: 0,
        })
    }

    fn give_back(&self, pipe: Pipe, held: usize) {
        self.leased.fetch_sub(1, Ordering::Relaxed);
        // Our count says empty; the kernel's must agree before another
        // tunnel may write into (and read out of) this pipe.
        if held == 0 && matches!(pipe.pending(), Ok(0)) {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() < self.max_free {
                free.push(pipe);
                return;
            }
        }
        drop(pipe);
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Pipes waiting in the free list.
    #[cfg(test)]
    pub(crate) fn free_len(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Pipes leased right now.
    #[cfg(test)]
    pub(crate) fn leased(&self) -> usize {
        self.leased.load(Ordering::Relaxed)
    }

    /// Pipes open: leased plus free.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

/// A pipe lent to one direction of one tunnel. Dropped empty, the pipe
/// goes back to the pool; dropped holding bytes (the task was cancelled,
/// a side failed), it is closed and the bytes with it.
pub(crate) struct Lease<'p> {
    pool: &'p PipePool,
    pipe: Option<Pipe>,
    held: usize,
}

impl Lease<'_> {
    fn pipe(&self) -> &Pipe {
        self.pipe
            .as_ref()
            .expect("a lease holds its pipe until dropped")
    }

    /// Bytes in the pipe, by our count.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Whether the pipe has no room left by our count (the kernel may call
    /// it full sooner: it counts slots, and a slot may hold a part page).
    pub(crate) fn full(&self) -> bool {
        self.held >= self.pipe().cap
    }

    /// Moves what `src` has (as much as fits) into the pipe. `Ok(0)` is the
    /// end of `src`. `WouldBlock` means `src` is dry *or* the pipe is full.
    pub(crate) fn fill_from(&mut self, src: BorrowedFd<'_>) -> io::Result<usize> {
        let room = self.pipe().cap.saturating_sub(self.held).max(1);
        let w = self.pipe().w.as_raw_fd();
        // SAFETY: `w` belongs to the pipe this lease owns, open until drop.
        let n = splice(src, unsafe { BorrowedFd::borrow_raw(w) }, room)?;
        self.held += n;
        Ok(n)
    }

    /// Moves bytes from the pipe to `dst`. Only call with bytes held:
    /// `WouldBlock` then means `dst` is full.
    pub(crate) fn drain_to(&mut self, dst: BorrowedFd<'_>) -> io::Result<usize> {
        debug_assert!(self.held > 0);
        let r = self.pipe().r.as_raw_fd();
        // SAFETY: `r` belongs to the pipe this lease owns, open until drop.
        let n = splice(unsafe { BorrowedFd::borrow_raw(r) }, dst, self.held)?;
        self.held -= n;
        #[cfg(test)]
        self.pool.spliced.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Reads the pipe's bytes out into memory, for a destination that
    /// cannot be spliced to.
    pub(crate) fn read_out(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.held];
        let mut got = 0;
        while got < buf.len() {
            // SAFETY: the pointer and length describe the unfilled tail of
            // `buf`; read writes at most that many bytes into it.
            let n = unsafe {
                libc::read(
                    self.pipe().r.as_raw_fd(),
                    buf[got..].as_mut_ptr().cast(),
                    buf.len() - got,
                )
            };
            match usize::try_from(n) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(_) => return Err(io::Error::last_os_error()),
            }
        }
        buf.truncate(got);
        self.held -= got;
        Ok(buf)
    }

    #[cfg(test)]
    fn write_end(&self) -> io::Result<OwnedFd> {
        self.pipe().w.try_clone()
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            self.pool.give_back(pipe, self.held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A connected pair of blocking TCP sockets on 127.0.0.1.
    fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn an_emptied_lease_returns_its_pipe_to_the_free_list() {
        let pool = PipePool::new(4, 64 << 10);
        let (mut a, b) = tcp_pair();
        b.set_nonblocking(true).unwrap();
        a.write_all(b"hello").unwrap();
        let (mut c, d) = tcp_pair();
        {
            let mut lease = pool.take().unwrap();
            assert!(lease.pipe().cap >= 4096);
            // The bytes may take a moment to cross loopback: the socket is
            // non-blocking, so wait for them with poll, not a sleep.
            let mut pfd = libc::pollfd {
                fd: b.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            assert_eq!(unsafe { libc::poll(&mut pfd, 1, 10_000) }, 1);
            assert_eq!(lease.fill_from(b.as_fd()).unwrap(), 5);
            assert_eq!(lease.held(), 5);
            assert_eq!(lease.drain_to(d.as_fd()).unwrap(), 5);
            assert_eq!(lease.held(), 0);
            assert_eq!(pool.leased(), 1);
        }
        let mut got = [0u8; 5];
        std::io::Read::read_exact(&mut c, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        assert_eq!((pool.leased(), pool.free_len(), pool.open()), (0, 1, 1));
        // And the next lease reuses it rather than making another.
        drop(pool.take().unwrap());
        assert_eq!((pool.free_len(), pool.open()), (1, 1));
    }

    #[test]
    fn a_lease_dropped_with_bytes_inside_closes_its_pipe() {
        let pool = PipePool::new(4, 64 << 10);
        let lease = pool.take().unwrap();
        let w = lease.write_end().unwrap();
        let mut w = std::fs::File::from(w);
        w.write_all(b"left over").unwrap();
        // Our count says empty (say a splice was mis-counted): the kernel's
        // count is checked too, and the pipe is still not reused.
        assert_eq!(lease.held(), 0);
        drop(lease);
        assert_eq!((pool.leased(), pool.free_len(), pool.open()), (0, 0, 0));
        // The read end is closed: writing through our copy of the write
        // end now fails with EPIPE (the test harness ignores SIGPIPE).
        let e = w.write_all(b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));

        let mut lease = pool.take().unwrap();
        lease.held = 3; // what fill_from would have counted
        drop(lease);
        assert_eq!((pool.free_len(), pool.open()), (0, 0));
    }

    #[test]
    fn the_free_list_is_capped() {
        let pool = PipePool::new(2, 64 << 10);
        let leases: Vec<_> = (0..5).map(|_| pool.take().unwrap()).collect();
        assert_eq!((pool.leased(), pool.open()), (5, 5));
        drop(leases);
        assert_eq!((pool.leased(), pool.free_len(), pool.open()), (0, 2, 2));
    }

    #[test]
    fn a_refusing_pool_has_no_pipe() {
        let pool = PipePool::without_pipes();
        assert!(pool.take().is_err());
        assert_eq!(pool.open(), 0);
    }
}
