//! The box `egressd run` makes, attacked from inside: what it shows of the
//! host's filesystem (and so which host sockets it can reach), who CMD is
//! there and on the host, the whole-sandbox limits, and the failures that
//! say what to pass. Real sandboxes running sh and python3; CI runs them
//! as root, and the tests marked so also as uid 65534 (setpriv).

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use crate::support::sandbox::{
    run, unprivileged_userns, without_cgroups, Outcome, Run, FALLBACK_NOTE,
};
use crate::support::{is_root, need_root};

/// A fresh directory on the host outside everything the sandbox shows.
fn outside_dir() -> tempfile::TempDir {
    for base in ["/srv", "/var/lib"] {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("egressd-it-")
            .tempdir_in(base)
        {
            return d;
        }
    }
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// This process's uid and gid.
fn my_ids() -> (u32, u32) {
    let m = std::fs::metadata("/proc/self").unwrap();
    (m.uid(), m.gid())
}

/// A Unix listener that counts the connections it accepts.
fn counting(l: UnixListener) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            n2.fetch_add(1, Ordering::SeqCst);
            let _ = c.write_all(b"host socket\n");
        }
    });
    n
}

/// Variants to run a test in: as this user, and (when root) as uid 65534.
fn as_each_user(test: &str) -> Vec<(&'static str, bool)> {
    let mut v = vec![("as the caller", false)];
    if is_root() {
        match unprivileged_userns() {
            Ok(()) => v.push(("as uid 65534", true)),
            Err(why) => panic!("{test} as uid 65534: {why}"),
        }
    } else {
        need_root(test, "the uid 65534 variant");
    }
    v
}

fn runner(unprivileged: bool) -> Run {
    if unprivileged {
        run().unprivileged()
    } else {
        run()
    }
}

// ---------------------------------------------------------------- no other way out

#[test]
fn host_unix_sockets_outside_the_shown_paths_are_unreachable() {
    let dir = outside_dir();
    let path = dir.path().join("daemon.sock");
    let on_disk = counting(UnixListener::bind(&path).unwrap());
    chmod(dir.path(), 0o755);
    chmod(&path, 0o777);
    let name = format!("egressd-it-{}", std::process::id());
    let abstract_addr = UnixAddr::from_abstract_name(name.as_bytes()).unwrap();
    let in_abstract = counting(UnixListener::bind_addr(&abstract_addr).unwrap());
    let script = format!(
        r#"
import errno, os, socket
for label, addr in [('path', {path:?}), ('abstract', '\0' + {name:?})]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(addr)
        print(label, 'connected', s.recv(64))
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, str(e)))
print('dir', 'exists' if os.path.exists({dir:?}) else 'absent')
"#,
        path = path.to_str().unwrap(),
        dir = dir.path().to_str().unwrap(),
    );
    let r = run().cmd(&["python3", "-c", &script]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("path ENOENT"), "{}", r.context());
    // Abstract sockets belong to the network namespace: the sandbox's own.
    assert!(
        r.stdout.contains("abstract ECONNREFUSED"),
        "{}",
        r.context()
    );
    assert!(r.stdout.contains("dir absent"), "{}", r.context());
    assert_eq!(
        on_disk.load(Ordering::SeqCst),
        0,
        "reached the socket on disk"
    );
    assert_eq!(
        in_abstract.load(Ordering::SeqCst),
        0,
        "reached the abstract socket"
    );

    // Both listeners do answer a host process: they could have counted.
    let mut s = UnixStream::connect(&path).unwrap();
    let mut a = UnixStream::connect_addr(&abstract_addr).unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).unwrap();
    a.read_exact(&mut buf).unwrap();
    assert_eq!(on_disk.load(Ordering::SeqCst), 1);
    assert_eq!(in_abstract.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------- nothing worth stealing

#[test]
fn secrets_root_only_files_and_hidden_directories_are_out_of_reach() {
    let shown = outside_dir();
    chmod(shown.path(), 0o755);
    let secret = shown.path().join("root-only");
    std::fs::write(&secret, "root-only-content").unwrap();
    chmod(&secret, 0o600);
    let public = shown.path().join("public");
    std::fs::write(&public, "public-content").unwrap();
    chmod(&public, 0o644);
    let hidden = outside_dir();
    std::fs::write(hidden.path().join("file"), "hidden-content").unwrap();
    chmod(hidden.path(), 0o755);
    let home = outside_dir();
    std::fs::write(
        home.path().join(".netrc"),
        "machine x password home-content",
    )
    .unwrap();
    chmod(home.path(), 0o755);
    // Host directories the sandbox does not show (but those above the
    // directories this test shows it).
    let absent: Vec<&str> = [
        "/boot",
        "/sys",
        "/mnt",
        "/home",
        "/var/lib",
        "/root/.cargo",
        "/work",
    ]
    .into_iter()
    .filter(|d| !shown.path().starts_with(d) && !home.path().starts_with(d))
    .collect();
    let script = format!(
        "cat /etc/shadow; cat /etc/gshadow; echo shadow-size=$(stat -c %s /etc/shadow); \
         cat {secret}; cat {public}; echo; \
         test -e {hidden} && echo hidden=visible || echo hidden=absent; \
         echo \"home=$HOME entries=$(ls -A \"$HOME\" | wc -l)\"; \
         for d in {absent}; do test -e $d && echo \"shows $d\"; done; \
         true",
        secret = secret.display(),
        public = public.display(),
        hidden = hidden.path().join("file").display(),
        absent = absent.join(" "),
    );
    let r = run()
        .env("HOME", home.path().to_str().unwrap())
        .arg("--ro")
        .arg(shown.path())
        .cmd(&["sh", "-c", &script]);
    assert_eq!(r.code, 0, "{}", r.context());
    let host_shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    let first_hash = host_shadow
        .lines()
        .find_map(|l| l.split(':').nth(1).filter(|h| h.len() > 2));
    if let Some(h) = first_hash {
        assert!(
            !r.stdout.contains(h),
            "a password hash leaked: {}",
            r.context()
        );
    }
    assert!(
        r.stderr.contains("/etc/shadow: Permission denied"),
        "{}",
        r.context()
    );
    assert!(
        r.stderr.contains("/etc/gshadow: Permission denied"),
        "{}",
        r.context()
    );
    // Masked: an empty file, whatever the host's permissions would allow.
    assert!(r.stdout.contains("shadow-size=0"), "{}", r.context());
    // Root's own 0600 file: CMD holds no host privilege.
    need_root("secrets_root_only_files…", "a file only root may read");
    assert!(!r.stdout.contains("root-only-content"), "{}", r.context());
    assert!(
        r.stderr
            .contains(&format!("{}: Permission denied", secret.display())),
        "{}",
        r.context()
    );
    assert!(
        r.stdout.contains("public-content"),
        "--ro works: {}",
        r.context()
    );
    assert!(r.stdout.contains("hidden=absent"), "{}", r.context());
    assert!(
        r.stdout
            .contains(&format!("home={} entries=0", home.path().display())),
        "a fresh HOME: {}",
        r.context()
    );
    assert!(!r.stdout.contains("shows "), "{}", r.context());
}

#[test]
fn writes_land_owned_by_the_invoking_user_and_nowhere_else() {
    for (who, unprivileged) in as_each_user("writes_land_owned_by…") {
        let work = tempfile::tempdir().unwrap();
        let ro = outside_dir();
        let rw = outside_dir();
        for d in [work.path(), ro.path(), rw.path()] {
            chmod(d, 0o755);
        }
        let invoking = if unprivileged {
            for d in [work.path(), rw.path()] {
                std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
            }
            (65534, 65534)
        } else {
            my_ids()
        };
        let script = format!(
            "id -u; echo made > made-inside; \
             for p in / /usr /etc /opt /var /srv {ro} /dev; do \
               touch $p/egressd-x 2>/dev/null && echo \"wrote $p\" || echo \"refused $p\"; done; \
             touch /tmp/x /var/tmp/x \"$HOME/x\" {rw}/made-rw && echo scratch=ok",
            ro = ro.path().display(),
            rw = rw.path().display(),
        );
        let r = runner(unprivileged)
            .cwd(work.path())
            .arg("--ro")
            .arg(ro.path())
            .arg("--rw")
            .arg(rw.path())
            .cmd(&["sh", "-c", &script]);
        assert_eq!(r.code, 0, "{who}: {}", r.context());
        assert!(r.stdout.starts_with("1000\n"), "{who}: {}", r.context());
        assert!(!r.stdout.contains("wrote "), "{who}: {}", r.context());
        assert_eq!(
            r.stdout.matches("refused ").count(),
            8,
            "{who}: {}",
            r.context()
        );
        assert!(r.stdout.contains("scratch=ok"), "{who}: {}", r.context());
        for f in [work.path().join("made-inside"), rw.path().join("made-rw")] {
            let m = std::fs::metadata(&f).unwrap_or_else(|e| panic!("{who}: {}: {e}", f.display()));
            assert_eq!((m.uid(), m.gid()), invoking, "{who}: {}", f.display());
        }
        assert!(!ro.path().join("egressd-x").exists());
    }

    need_root("writes_land_owned_by…", "the SUDO_UID and --owner cases");
    // Through sudo, files belong to the user who ran sudo; --owner names
    // another. Either way CMD is that user on the host, never root.
    for (how, extra_env, args) in [
        (
            "SUDO_UID",
            vec![("SUDO_UID", "65534"), ("SUDO_GID", "65534")],
            vec![],
        ),
        ("--owner", vec![], vec!["--owner", "nobody"]),
    ] {
        let work = tempfile::tempdir().unwrap();
        chmod(work.path(), 0o777);
        let mut b = run().cwd(work.path());
        for (k, v) in extra_env {
            b = b.env(k, v);
        }
        for a in args {
            b = b.arg(a);
        }
        let r = b.cmd(&["sh", "-c", "touch made && cat /proc/self/uid_map"]);
        assert_eq!(r.code, 0, "{how}: {}", r.context());
        let m = std::fs::metadata(work.path().join("made")).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{how}");
        assert!(
            r.stdout.contains("1000      65534"),
            "{how}: {}",
            r.context()
        );
    }
}

#[test]
fn cmd_cannot_make_setuid_files_or_type_into_the_terminal() {
    // Started as root, a file CMD makes here is root's on disk: with a
    // setuid bit it would be a setuid-root program for anyone on the host.
    let work = tempfile::tempdir().unwrap();
    let script = r#"
import errno, fcntl, os, termios
def attempt(label, f):
    try:
        f()
        print(label, 'ok')
    except OSError as e:
        print(label, errno.errorcode[e.errno])
open('prog', 'w').close()
attempt('chmod 4755', lambda: os.chmod('prog', 0o4755))
attempt('chmod 2755', lambda: os.chmod('prog', 0o2755))
attempt('chmod 755', lambda: os.chmod('prog', 0o755))
attempt('fchmod 4755', lambda: os.fchmod(os.open('prog', os.O_RDONLY), 0o4755))
attempt('open 4755', lambda: os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt('tiocsti', lambda: fcntl.ioctl(0, termios.TIOCSTI, b'x'))
"#;
    let r = run().cwd(work.path()).cmd(&["python3", "-c", script]);
    assert_eq!(r.code, 0, "{}", r.context());
    for refused in [
        "chmod 4755 EPERM",
        "chmod 2755 EPERM",
        "fchmod 4755 EPERM",
        "open 4755 EPERM",
        // stdin is /dev/null: without the filter this would be ENOTTY.
        "tiocsti EPERM",
    ] {
        assert!(r.stdout.contains(refused), "{refused}: {}", r.context());
    }
    assert!(r.stdout.contains("chmod 755 ok"), "{}", r.context());
    let m = std::fs::metadata(work.path().join("prog")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o755);
    assert!(!work.path().join("made").exists());
}

// ---------------------------------------------------------------- identity

#[test]
fn cmd_is_uid_1000_and_can_make_a_user_namespace_of_its_own() {
    for (who, unprivileged) in as_each_user("cmd_is_uid_1000…") {
        let r = runner(unprivileged).cmd(&[
            "sh",
            "-c",
            "id -u; id -g; grep CapEff /proc/self/status; \
             unshare --user --map-root-user sh -c 'echo nested=$(id -u)'",
        ]);
        assert_eq!(r.code, 0, "{who}: {}", r.context());
        assert!(
            r.stdout.starts_with("1000\n1000\n"),
            "{who}: {}",
            r.context()
        );
        assert!(
            r.stdout.contains("CapEff:\t0000000000000000"),
            "{who}: {}",
            r.context()
        );
        // What Chromium's own sandbox does: a uid 0 without capabilities
        // could not (the kernel wants CAP_SETFCAP to map uid 0 below).
        assert!(r.stdout.contains("nested=0"), "{who}: {}", r.context());
    }
    let r = run()
        .arg("--uid")
        .arg("2000")
        .arg("--gid")
        .arg("3000")
        .cmd(&["sh", "-c", "id -u; id -g"]);
    assert_eq!(r.stdout, "2000\n3000\n", "{}", r.context());
    let r = run().arg("--uid").arg("0").cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("never runs as root"), "{}", r.context());
}

// ---------------------------------------------------------------- the working directory

#[test]
fn the_working_directory_is_rw_ro_or_not_shown() {
    let work = tempfile::tempdir().unwrap();
    let r = run().cwd(work.path()).arg("--cwd").arg("ro").cmd(&[
        "sh",
        "-c",
        "pwd; touch x 2>/dev/null && echo wrote || echo refused",
    ]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert_eq!(r.stdout, format!("{}\nrefused\n", work.path().display()));

    // From /, the whole host would be the working directory: refused.
    let r = run().cwd("/").cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(
        r.stderr.contains("would show the whole host filesystem")
            && r.stderr.contains("--cwd none"),
        "{}",
        r.context()
    );
    let r = run()
        .cwd("/")
        .env("HOME", "/nonexistent")
        .arg("--cwd")
        .arg("none")
        .cmd(&["sh", "-c", "pwd; ls /srv | wc -l"]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert_eq!(r.stdout, "/tmp/home\n0\n", "{}", r.context());

    let r = run()
        .arg("--rw")
        .arg("/nonexistent/egressd-rw")
        .cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(
        r.stderr.contains("--rw /nonexistent/egressd-rw"),
        "{}",
        r.context()
    );
}

// ---------------------------------------------------------------- whole-sandbox limits

/// Fails `test` unless a cgroup bounds this run (as root it must).
fn need_a_cgroup(test: &str, r: &Outcome) {
    if r.stderr.contains(FALLBACK_NOTE) {
        need_root(test, "a cgroup for the whole sandbox");
        panic!("{test}: root got no cgroup: {}", r.context());
    }
}

/// No directory named after the launcher is left under /sys/fs/cgroup.
fn cgroups_removed(pid: u32) {
    fn walk(d: &Path, name: &str, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(d) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name() == name {
                    found.push(p.clone());
                }
                if depth > 0 {
                    walk(&p, name, depth - 1, found);
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        Path::new("/sys/fs/cgroup"),
        &format!("egressd-run-{pid}"),
        5,
        &mut found,
    );
    assert!(found.is_empty(), "left behind: {found:?}");
}

/// Python: `n` children each take 300 MiB (touched), report, and wait.
const CHILDREN_OF_300_MIB: &str = r#"
import os, sys
n = int(sys.argv[1])
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        b = bytearray(300 << 20)
        os.write(ready_w, b'r')
        os.read(go_r, 1)
        os._exit(0)
    kids.append(pid)
got = 0
while got < n:
    got += len(os.read(ready_r, n))
print('all allocated', flush=True)
os.write(go_w, b'g' * n)
print('statuses', [os.waitpid(k, 0)[1] for k in kids], flush=True)
print('survived', flush=True)
"#;

#[test]
fn memory_is_bounded_for_the_whole_sandbox() {
    let r = run()
        .arg("--memory")
        .arg("400M")
        .cmd(&["python3", "-c", CHILDREN_OF_300_MIB, "1"]);
    need_a_cgroup("memory_is_bounded_for_the_whole_sandbox", &r);
    assert_eq!(r.code, 0, "one child of 300 MiB fits: {}", r.context());
    assert!(r.stdout.contains("statuses [0]"), "{}", r.context());
    cgroups_removed(r.pid);

    // Two fit each process's bound, not the sandbox's: all are killed.
    let r = run()
        .arg("--memory")
        .arg("400M")
        .cmd(&["python3", "-c", CHILDREN_OF_300_MIB, "2"]);
    assert_eq!(r.code, 128 + 9, "{}", r.context());
    assert!(!r.stdout.contains("all allocated"), "{}", r.context());
    assert!(!r.stdout.contains("survived"), "{}", r.context());
    assert!(
        r.stderr
            .contains("the sandbox ran out of memory (--memory 400M for the whole sandbox)"),
        "{}",
        r.context()
    );
    cgroups_removed(r.pid);
}

/// Python: fork until the kernel refuses; print how many processes
/// there were in all, by counting and by /proc (minus the sandbox's init).
const FORK_LOOP: &str = r#"
import os
r, w = os.pipe()
kids = 0
while kids < 1000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.read(r, 1)
        os._exit(0)
    kids += 1
procs = [p for p in os.listdir('/proc') if p.isdigit()]
print('total', kids + 1, 'proc', len(procs) - 1, flush=True)
os.write(w, b'x' * kids)
"#;

#[test]
fn a_fork_loop_stops_at_the_pids_limit_in_total() {
    for (who, unprivileged) in as_each_user("a_fork_loop_stops…") {
        let r = runner(unprivileged)
            .arg("--pids")
            .arg("64")
            .cmd(&["python3", "-c", FORK_LOOP]);
        assert_eq!(r.code, 0, "{who}: {}", r.context());
        assert!(
            r.stdout.contains("total 64 proc 64"),
            "{who}: {}",
            r.context()
        );
        if !unprivileged {
            need_a_cgroup("a_fork_loop_stops…", &r);
            cgroups_removed(r.pid);
        } else {
            assert!(
                r.stderr
                    .contains("--pids counts the processes of uid 1000 in the sandbox"),
                "{who}: {}",
                r.context()
            );
        }
    }
}

#[test]
fn cpu_time_is_bounded_for_the_whole_sandbox() {
    // Four processes of 0.35 s of CPU each: each fits a per-process --cpu 1,
    // together they do not.
    let burn = "import time\nwhile time.process_time() < 0.35: pass\n";
    let script = format!("for i in 1 2 3 4; do python3 -c '{burn}' & done; wait; echo all-done");
    let r = run().arg("--cpu").arg("1").cmd(&["sh", "-c", &script]);
    need_a_cgroup("cpu_time_is_bounded_for_the_whole_sandbox", &r);
    assert_eq!(r.code, 128 + libc::SIGXCPU, "{}", r.context());
    assert!(!r.stdout.contains("all-done"), "{}", r.context());
    assert!(
        r.stderr.contains("used up its CPU time (--cpu 1s"),
        "{}",
        r.context()
    );
    cgroups_removed(r.pid);

    // Where no cgroup can be had, --cpu is each process's, and says so.
    let b = without_cgroups("cpu_time_is_bounded… (fallback)");
    let r = b.arg("--cpu").arg("1").cmd(&["sh", "-c", &script]);
    assert!(
        r.stderr.contains(FALLBACK_NOTE),
        "cpu_time_is_bounded… (fallback) tests the rlimit fallback, and this user has a cgroup of its own: run it as root"
    );
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("all-done"), "{}", r.context());
    assert!(
        r.stderr
            .contains("--cpu is each process's CPU time (RLIMIT_CPU)"),
        "{}",
        r.context()
    );
}

// ---------------------------------------------------------------- helpful failures

/// The `--ro`/`--env` flags a hint names, as arguments.
fn suggested(stderr: &str) -> Vec<String> {
    let line = stderr
        .lines()
        .find(|l| l.contains("; pass "))
        .unwrap_or_else(|| panic!("no hint in {stderr:?}"));
    let flags = &line[line.rfind("; pass ").unwrap() + "; pass ".len()..];
    flags.split_whitespace().map(str::to_string).collect()
}

fn with_args(mut b: Run, args: &[String]) -> Run {
    for a in args {
        b = b.arg(a);
    }
    b
}

#[test]
fn a_command_the_sandbox_does_not_show_fails_with_the_ro_to_pass() {
    let tools = outside_dir();
    chmod(tools.path(), 0o755);
    let bin = tools.path().join("prefix/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let tool = bin.join("tool");
    std::fs::write(&tool, "#!/bin/sh\necho tool ran\n").unwrap();
    chmod(&tool, 0o755);
    let r = run().cmd(&[tool.to_str().unwrap()]);
    assert_eq!(r.code, 127, "{}", r.context());
    assert!(r.stderr.contains("is not shown inside"), "{}", r.context());
    let args = suggested(&r.stderr);
    assert_eq!(
        args,
        ["--ro", tools.path().join("prefix").to_str().unwrap()],
        "{}",
        r.context()
    );
    let r = with_args(run(), &args).cmd(&[tool.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert_eq!(r.stdout, "tool ran\n");

    // A script the sandbox shows, whose interpreter it does not.
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("job");
    std::fs::write(&script, format!("#!{}\n", tool.display())).unwrap();
    chmod(&script, 0o755);
    let r = run().cwd(work.path()).cmd(&["./job"]);
    assert_eq!(r.code, 127, "{}", r.context());
    assert!(
        r.stderr.contains(&format!(
            "cannot run ./job: its interpreter {}",
            tool.display()
        )),
        "{}",
        r.context()
    );
    let r = with_args(run().cwd(work.path()), &suggested(&r.stderr)).cmd(&["./job"]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert_eq!(r.stdout, "tool ran\n");
}

#[test]
fn cargo_from_home_fails_with_the_hint_and_works_with_it() {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let cargo = std::env::split_paths(&path)
        .map(|d| d.join("cargo"))
        .find(|p| p.is_file())
        .expect("cargo_from_home…: no cargo on PATH");
    let home = std::env::var_os("HOME").map(PathBuf::from);
    assert!(
        home.is_some_and(|h| cargo.starts_with(h)),
        "cargo_from_home… needs cargo installed in HOME, as rustup does (it is {} here, \
         which the sandbox shows)",
        cargo.display()
    );
    let r = run().cmd(&["cargo", "--version"]);
    assert_eq!(r.code, 127, "{}", r.context());
    assert!(r.stderr.contains("cannot run cargo: "), "{}", r.context());
    assert!(
        r.stderr
            .contains("which is a fresh, empty directory inside"),
        "{}",
        r.context()
    );
    let args = suggested(&r.stderr);
    let r = with_args(run(), &args).cmd(&["cargo", "--version"]);
    assert_eq!(r.code, 0, "with {args:?}: {}", r.context());
    assert!(r.stdout.starts_with("cargo "), "{}", r.context());
}

#[test]
fn ca_bundle_variables_are_not_taken_for_credentials() {
    let r = run()
        .env("AWS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
        .env("SSL_CERT_DIR", "/etc/ssl/certs")
        .env("NODE_EXTRA_CA_CERTS", "/etc/ssl/certs/ca-certificates.crt")
        .env("GH_TOKEN", "ghp_secretvalue")
        .cmd(&["true"]);
    assert_eq!(r.code, 0, "{}", r.context());
    let note = r
        .stderr
        .lines()
        .find(|l| l.contains("look like credentials"))
        .unwrap_or_else(|| panic!("no note: {}", r.context()));
    assert!(note.contains("GH_TOKEN"), "{note}");
    for n in ["AWS_CA_BUNDLE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS"] {
        assert!(!note.contains(n), "{n} called a credential: {note}");
    }
}

// ---------------------------------------------------------------- host files replaced while a sandbox runs

/// Runs `script` as root in a mount namespace of its own (`unshare
/// --mount`, propagation private) in which `/etc` (`whole_etc`) or only
/// `/etc/ssl/certs` is a tmpfs holding a copy of the host's: so the script
/// can replace files there by rename, as `update-ca-certificates`,
/// `passwd` or a DHCP client do on the host, without touching the host's.
/// `$EGRESSD`, `$CA` (an interception CA directory), `$POLICY` and `$WORK`
/// are set for it. Needs root.
fn with_replaceable_etc(test: &str, whole_etc: bool, script: &str) -> (i32, String) {
    need_root(test, "a mount namespace with a tmpfs over /etc");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let init = std::process::Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["ca", "init", "--dir"])
        .arg(&ca)
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    let policy = dir.path().join("policy");
    std::fs::create_dir(&policy).unwrap();
    std::fs::write(policy.join("p.yaml"), "exceptions: []\n").unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // The copy is made in a tmpfs of the namespace's own, then moved over
    // the directory: nothing of /etc is written to disk.
    let copied = if whole_etc { "/etc" } else { "/etc/ssl/certs" };
    let setup = format!(
        "set -e\nstage=$(mktemp -d)\nmount -t tmpfs -o mode=755,size=64m egressd-it-etc \"$stage\"\n\
         cp -a {copied}/. \"$stage\"/\nmount --move \"$stage\" {copied}\nrmdir \"$stage\"\n"
    );
    let out = std::process::Command::new(crate::support::tool("unshare"))
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!("{setup}{script}"))
        .env("EGRESSD", env!("CARGO_BIN_EXE_egressd"))
        .env("CA", &ca)
        .env("POLICY", &policy)
        .env("WORK", &work)
        .env_remove("EGRESSD_POLICY")
        .env_remove("EGRESSD_CA_DIR")
        .current_dir(&work)
        .output()
        .unwrap();
    let text = format!(
        "{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The `egressd run` of [`with_replaceable_etc`]'s scripts, intercepting.
const RUN_IN_ETC_TEST: &str = "\"$EGRESSD\" run --policy \"$POLICY\" --log /dev/null \
     --upstream-dns 127.0.0.1:9 --ca-dir \"$CA\" --timeout 60s --";

#[test]
fn files_the_host_replaces_after_setup_stay_egressds_inside() {
    // What egressd put over host files — its CA bundle over the
    // distribution's, a mask over an SSH host key, its resolv.conf — must
    // stay, whatever the host does to the files. The kernel detaches a
    // mount whose mount point is a file another namespace renames over, so
    // a mount placed on the host's own file would vanish when the host
    // replaces it: the sandbox would lose egressd's CA, show the new
    // secret and the host's resolvers.
    let inside = "look() {\n\
        echo \"$1 ca=$(grep -c 'egressd interception CA' /etc/ssl/certs/ca-certificates.crt) \
         key=$(stat -c %s /etc/ssh/ssh_host_egressdtest_key)$(cat /etc/ssh/ssh_host_egressdtest_key 2>/dev/null) \
         resolv=$(grep -c '^nameserver 127.0.0.1$' /etc/resolv.conf)\"\n\
        }\n\
        look before\necho > ready\nread x < go\nlook after\n";
    // The host's side waits for the sandbox at most 60 s (a sandbox that
    // does not start never opens `ready`); the sandbox's `--timeout`
    // bounds its own wait.
    let script = format!(
        "cat > inside.sh <<'INSIDE'\n{inside}INSIDE\n\
         mkdir -p /etc/ssh\n\
         echo old-secret > /etc/ssh/ssh_host_egressdtest_key\n\
         chmod 644 /etc/ssh/ssh_host_egressdtest_key\n\
         mkfifo ready go\n\
         {RUN_IN_ETC_TEST} sh inside.sh &\n\
         sandbox=$!\n\
         timeout 60 sh -c 'read x < ready' || {{ echo 'the sandbox did not start'; kill $sandbox; wait $sandbox; exit 1; }}\n\
         cp /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/.new && mv -f /etc/ssl/certs/.new /etc/ssl/certs/ca-certificates.crt\n\
         echo new-secret > /etc/ssh/.new && chmod 644 /etc/ssh/.new && mv -f /etc/ssh/.new /etc/ssh/ssh_host_egressdtest_key\n\
         echo 'nameserver 192.0.2.1' > /etc/.new && mv -f /etc/.new /etc/resolv.conf\n\
         echo > go\n\
         wait $sandbox\n"
    );
    let (code, out) = with_replaceable_etc("sandbox::replaced_after_setup", true, &script);
    assert_eq!(code, 0, "{out}");
    for when in ["before", "after"] {
        assert!(
            out.contains(&format!("{when} ca=1 key=0 resolv=1")),
            "{when}: {out}"
        );
    }
    assert!(!out.contains("secret"), "{out}");
}

#[test]
fn sandboxes_start_whole_while_their_ca_bundles_are_rewritten() {
    // The CI flake: `cannot mount /tmp/root/etc/ssl/certs/ca-certificates.crt:
    // No such file or directory`. The sandbox had taken the CA directory's
    // sandbox-bundle.pem, which every `egressd run --ca-dir` rewrites by
    // rename (the package tests share one CA directory), and a copy of a
    // file renamed over cannot be attached; a host replacing its own
    // bundle (update-ca-certificates) between the sandbox finding it and
    // mounting over it failed the same way. Here both files are replaced
    // without pause while sandboxes start, two at a time: each must start
    // and trust egressd's CA.
    let script = format!(
        "replace() {{ while :; do cp \"$1\" \"$1.new\"; mv -f \"$1.new\" \"$1\"; done; }}\n\
         \"$EGRESSD\" run --policy \"$POLICY\" --log /dev/null --upstream-dns 127.0.0.1:9 --ca-dir \"$CA\" -- true\n\
         replace /etc/ssl/certs/ca-certificates.crt & host=$!\n\
         replace \"$CA/sandbox-bundle.pem\" & launchers=$!\n\
         one() {{ for i in 1 2 3 4 5 6; do \
             echo \"run $1.$i: $({RUN_IN_ETC_TEST} grep -c 'egressd interception CA' /etc/ssl/certs/ca-certificates.crt 2>&1 | tail -n 1)\"; \
           done; }}\n\
         one a & a=$!\n one b & b=$!\n\
         wait $a; wait $b\n\
         kill $host $launchers\n"
    );
    let (code, out) = with_replaceable_etc("sandbox::ca_bundle_rewritten", false, &script);
    assert_eq!(code, 0, "{out}");
    let runs: Vec<&str> = out.lines().filter(|l| l.starts_with("run ")).collect();
    assert_eq!(runs.len(), 12, "{out}");
    for r in runs {
        assert!(r.ends_with(": 1"), "{r}\n{out}");
    }
}
