//! The small seccomp filter CMD runs under (installed by `sys`, after
//! no_new_privs, just before exec; inherited by everything CMD starts, in
//! nested namespaces too). Pure: this builds the classic-BPF program.
//!
//! It closes what the box's own design opens, nothing more:
//! - **No setuid or setgid bits** (`chmod`, `fchmod`, `fchmodat`,
//!   `fchmodat2`, and the mode of `open`, `openat`, `creat`, `mknod`,
//!   `mknodat`): EPERM. Started as root, what CMD creates in the working
//!   directory and `--rw` paths is root's on disk (idmapped mounts), so a
//!   setuid bit there would be a setuid-root program for anyone on the host
//!   who can reach it; elsewhere it would hand out the owner's uid.
//!   `openat2` (whose mode the filter cannot read) and io_uring (whose
//!   operations no filter sees) fail with ENOSYS, so callers fall back.
//! - **No typing into the terminal** (`TIOCSTI`, `TIOCLINUX`): EPERM. CMD
//!   shares the launcher's terminal, and pushing characters into its input
//!   would run commands outside the sandbox.
//! - **No kernel keyrings** (`keyctl`, `add_key`, `request_key`): EPERM,
//!   as the container runtimes' default profiles answer. CMD starts in a
//!   fresh session keyring of its own (joined just before this filter), and
//!   cannot read, plant or join another.
//! - Only the native system-call ABI: a 32-bit or x32 call is killed (their
//!   numbers differ, and this filter would not recognise them).

/// One classic-BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

// linux/filter.h, linux/seccomp.h, linux/audit.h.
const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K
pub const RET_ALLOW: u32 = 0x7fff_0000;
pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
/// `struct seccomp_data`: nr, arch, then the arguments (low word first on
/// little-endian machines, which is all this filter is built for).
const NR: u32 = 0;
const ARCH: u32 = 4;
fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}
const SETID_BITS: u32 = 0o6000;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// System calls whose argument `.1` is a file mode.
fn mode_args() -> Vec<(libc::c_long, u32)> {
    let mut v = vec![
        (libc::SYS_fchmod, 1),
        (libc::SYS_fchmodat, 2),
        (FCHMODAT2, 2),
        (libc::SYS_openat, 3),
        (libc::SYS_mknodat, 2),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_chmod, 1),
        (libc::SYS_open, 2),
        (libc::SYS_creat, 1),
        (libc::SYS_mknod, 1),
    ]);
    v
}

/// `add_key`, `request_key`, `keyctl`: the kernel keyring calls.
const KEYRING: &[libc::c_long] = &[libc::SYS_add_key, libc::SYS_request_key, libc::SYS_keyctl];

/// `fchmodat2` (Linux 6.6; the same number on every architecture).
const FCHMODAT2: libc::c_long = 452;
/// openat2, io_uring_setup/enter/register (the same numbers everywhere).
const UNFILTERABLE: &[libc::c_long] = &[437, 425, 426, 427];

fn ld(k: u32) -> Insn {
    Insn {
        code: LD_W_ABS,
        jt: 0,
        jf: 0,
        k,
    }
}
fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
    Insn { code, jt, jf, k }
}
fn ret(k: u32) -> Insn {
    Insn {
        code: RET_K,
        jt: 0,
        jf: 0,
        k,
    }
}
fn errno(e: i32) -> u32 {
    RET_ERRNO | (e as u32 & 0xffff)
}

/// The filter. Each rule matches the call number held in the accumulator
/// and ends in a return, so the number need only be loaded once.
pub fn program() -> Vec<Insn> {
    let mut p = vec![
        ld(ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        ret(RET_KILL_PROCESS),
        ld(NR),
    ];
    #[cfg(target_arch = "x86_64")]
    p.extend([jump(JGE_K, X32_SYSCALL_BIT, 0, 1), ret(RET_KILL_PROCESS)]);
    for (nr, arg) in mode_args() {
        p.extend([
            jump(JEQ_K, nr as u32, 0, 4),
            ld(arg_low(arg)),
            jump(JSET_K, SETID_BITS, 0, 1),
            ret(errno(libc::EPERM)),
            ret(RET_ALLOW),
        ]);
    }
    for nr in UNFILTERABLE {
        p.extend([jump(JEQ_K, *nr as u32, 0, 1), ret(errno(libc::ENOSYS))]);
    }
    for nr in KEYRING {
        p.extend([jump(JEQ_K, *nr as u32, 0, 1), ret(errno(libc::EPERM))]);
    }
    p.extend([
        jump(JEQ_K, libc::SYS_ioctl as u32, 0, 5),
        ld(arg_low(1)),
        jump(JEQ_K, libc::TIOCSTI as u32, 2, 0),
        jump(JEQ_K, libc::TIOCLINUX as u32, 1, 0),
        ret(RET_ALLOW),
        ret(errno(libc::EPERM)),
        ret(RET_ALLOW),
    ]);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for what [`program`] uses: the reference
    /// the filter is checked against.
    fn run(p: &[Insn], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&(nr as i32).to_le_bytes());
        data.extend_from_slice(&arch.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        for a in args {
            data.extend_from_slice(&a.to_le_bytes());
        }
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let i = p[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                JEQ_K | JGE_K | JSET_K => {
                    let taken = match i.code {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                RET_K => return i.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    /// An ioctl request as the register holding it (`Ioctl` is an int on
    /// some libcs, a long on others).
    #[allow(clippy::unnecessary_cast)]
    fn req(r: libc::Ioctl) -> u64 {
        r as u64
    }

    fn call(nr: libc::c_long, args: [u64; 6]) -> u32 {
        run(&program(), nr, AUDIT_ARCH, args)
    }

    #[test]
    fn keyring_calls_are_refused() {
        for nr in [libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key] {
            assert_eq!(call(nr, [0; 6]), errno(libc::EPERM), "{nr}");
        }
        assert_eq!(call(libc::SYS_getpid, [0; 6]), RET_ALLOW);
    }

    #[test]
    fn setid_modes_are_refused_other_modes_pass() {
        let eperm = errno(libc::EPERM);
        assert_eq!(call(libc::SYS_fchmodat, [0, 0, 0o4755, 0, 0, 0]), eperm);
        assert_eq!(call(libc::SYS_fchmodat, [0, 0, 0o2755, 0, 0, 0]), eperm);
        assert_eq!(call(libc::SYS_fchmodat, [0, 0, 0o1777, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(libc::SYS_fchmod, [3, 0o6755, 0, 0, 0, 0]), eperm);
        assert_eq!(call(libc::SYS_fchmod, [3, 0o755, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(FCHMODAT2, [0, 0, 0o4000, 0, 0, 0]), eperm);
        let o_creat = libc::O_CREAT as u64;
        assert_eq!(call(libc::SYS_openat, [0, 0, o_creat, 0o4755, 0, 0]), eperm);
        assert_eq!(
            call(libc::SYS_openat, [0, 0, o_creat, 0o644, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(call(libc::SYS_mknodat, [0, 0, 0o104755, 0, 0, 0]), eperm);
        // The kernel reads a mode as 32 bits (then 16): high bits change nothing.
        assert_eq!(
            call(libc::SYS_fchmod, [3, (1 << 40) | 0o4755, 0, 0, 0, 0]),
            eperm
        );
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(call(libc::SYS_chmod, [0, 0o4755, 0, 0, 0, 0]), eperm);
            assert_eq!(call(libc::SYS_open, [0, o_creat, 0o2755, 0, 0, 0]), eperm);
            assert_eq!(call(libc::SYS_creat, [0, 0o4700, 0, 0, 0, 0]), eperm);
            assert_eq!(call(libc::SYS_creat, [0, 0o700, 0, 0, 0, 0]), RET_ALLOW);
        }
    }

    #[test]
    fn terminal_injection_and_unfilterable_calls_are_refused() {
        let eperm = errno(libc::EPERM);
        let sti = req(libc::TIOCSTI);
        assert_eq!(call(libc::SYS_ioctl, [0, sti, 0, 0, 0, 0]), eperm);
        assert_eq!(
            call(libc::SYS_ioctl, [0, (7 << 32) | sti, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            call(libc::SYS_ioctl, [0, req(libc::TIOCLINUX), 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            call(libc::SYS_ioctl, [0, req(libc::TIOCGWINSZ), 0, 0, 0, 0]),
            RET_ALLOW
        );
        for nr in UNFILTERABLE {
            assert_eq!(call(*nr, [0; 6]), errno(libc::ENOSYS), "{nr}");
        }
        assert_eq!(call(libc::SYS_read, [0; 6]), RET_ALLOW);
        assert_eq!(call(libc::SYS_execve, [0; 6]), RET_ALLOW);
    }

    #[test]
    fn foreign_abis_are_killed() {
        // AUDIT_ARCH_I386: 32-bit calls on a 64-bit kernel.
        assert_eq!(run(&program(), 15, 0x4000_0003, [0; 6]), RET_KILL_PROCESS);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            call((X32_SYSCALL_BIT as libc::c_long) | libc::SYS_fchmod, [0; 6]),
            RET_KILL_PROCESS
        );
    }

    #[test]
    fn every_jump_lands_inside_the_program() {
        let p = program();
        for (i, insn) in p.iter().enumerate() {
            if insn.code != RET_K && insn.code != LD_W_ABS {
                assert!(i + 1 + usize::from(insn.jt.max(insn.jf)) < p.len(), "{i}");
            }
        }
        assert_eq!(p.last().unwrap().code, RET_K);
        assert!(p.len() < 4096, "BPF_MAXINSNS");
    }
}
