//! The floor under any CONNECT relay on this machine: how fast a tunnel
//! moves one stream when it does nothing but splice. A measuring
//! instrument for issue #37 item 9 (CONNECT bulk against direct), as
//! `examples/h1_floor` is for GETs; not a proxy. It decides nothing, logs
//! nothing, resolves nothing, meters nothing and has no idle timeout: one
//! blocking thread per direction, each splicing socket → pipe (1 MiB, as
//! egressd's) → socket until the stream ends. No readiness polling, no
//! runtime, no lease: whatever egressd's relay spends above this is its
//! own (`benches/load/run --only bulk --floor`).
//!
//!     cargo run --release --example splice_floor -- LISTEN ORIGIN_IP
//!
//! `CONNECT name:port HTTP/1.1` on LISTEN is answered `200` and relayed to
//! ORIGIN_IP at that port (the name is not looked at). Anything else
//! closes the connection.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread;

/// Pipe capacity asked for (egressd's `relay::pipe::PIPE_SIZE`).
const PIPE_SIZE: libc::c_int = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, origin] = args.as_slice() else {
        eprintln!("usage: splice_floor LISTEN ORIGIN_IP");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().expect("LISTEN is IP:PORT");
    let origin: IpAddr = origin.parse().expect("ORIGIN_IP is an IP address");
    let l = TcpListener::bind(listen).expect("bind");
    for c in l.incoming() {
        let Ok(c) = c else { continue };
        thread::spawn(move || {
            let _ = serve(c, origin);
        });
    }
}

fn serve(mut client: TcpStream, origin: IpAddr) -> io::Result<()> {
    client.set_nodelay(true)?;
    // The head, byte by byte up to its blank line: nothing after it may be
    // read into user space, it belongs to the tunnel.
    let mut head = Vec::with_capacity(256);
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || client.read(&mut b)? == 0 {
            return Ok(());
        }
        head.push(b[0]);
    }
    // `CONNECT name:port HTTP/1.1`: the port after the target's last colon.
    let Some(port) = head
        .strip_prefix(b"CONNECT ")
        .and_then(|rest| rest.split(|&b| b == b' ').next())
        .and_then(|target| std::str::from_utf8(target).ok())
        .and_then(|target| target.rsplit_once(':'))
        .and_then(|(_, port)| port.parse::<u16>().ok())
    else {
        return Ok(());
    };
    let up = TcpStream::connect((origin, port))?;
    up.set_nodelay(true)?;
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    let (c2, u2) = (client.try_clone()?, up.try_clone()?);
    let back = thread::spawn(move || relay(&u2, &c2));
    let r = relay(&client, &up);
    let _ = back.join();
    r
}

/// One direction: splice `src` → pipe → `dst` until `src` ends, then
/// half-close `dst`.
fn relay(src: &TcpStream, dst: &TcpStream) -> io::Result<()> {
    let (r, w) = pipe()?;
    let mut held = 0usize;
    loop {
        let n = splice(src.as_raw_fd(), w.as_raw_fd(), PIPE_SIZE as usize)?;
        if n == 0 {
            break;
        }
        held += n;
        while held > 0 {
            held -= splice(r.as_raw_fd(), dst.as_raw_fd(), held)?;
        }
    }
    let _ = dst.shutdown(Shutdown::Write);
    Ok(())
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned by no one else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETPIPE_SZ on a pipe we own; failure keeps the default size.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) };
    Ok((r, w))
}

/// A blocking `splice(2)` of up to `len` bytes.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are open for the call's duration; null
        // offsets are what splice takes for sockets and pipes.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
