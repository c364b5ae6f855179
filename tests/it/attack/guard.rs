//! The guard of `egressd run` (issue 36), attacked from inside the box: a
//! hostile CMD, default flags, started the way the README starts it. Each
//! test is one way the box could touch egressd's own files, log, keyring or
//! arguments, or plant code for the host; the last walks every path the
//! launcher's arguments and the policy name.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::support::sandbox::{run, Outcome};

const POLICY: &str = "exceptions: []\n";

/// A project directory the sandbox shows read-write (under the host's
/// /tmp, which the sandbox does not show but for this bind).
fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn write(p: &Path, text: &str) -> PathBuf {
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(p, text).unwrap();
    p.to_path_buf()
}

/// What a Python script inside prints.
fn inside(r: crate::support::sandbox::Run, script: &str) -> Outcome {
    r.cmd(&["python3", "-c", script])
}

/// A script that tries to read and write each path and prints one line
/// per path that was readable or writable.
fn probe_script(paths: &[PathBuf]) -> String {
    let list: Vec<String> = paths
        .iter()
        .map(|p| format!("{:?}", p.to_str().unwrap()))
        .collect();
    format!(
        r#"
import os
reached = []
def probe(p):
    try:
        with open(p, 'rb') as f: f.read(1); reached.append('read ' + p)
    except OSError: pass
    try:
        with open(p, 'ab') as f: reached.append('write ' + p)
    except OSError: pass
    try:
        os.listdir(p); reached.append('list ' + p)
    except OSError: pass
    try:
        n = os.path.join(p, 'planted.yaml')
        with open(n, 'w') as f: f.write('x'); reached.append('create ' + n)
    except OSError: pass
for top in [{}]:
    probe(top)
    for root, dirs, files in os.walk(top):
        for n in dirs + files: probe(os.path.join(root, n))
print('REACHED', reached)
"#,
        list.join(", ")
    )
}

fn reached(r: &Outcome) -> String {
    r.stdout
        .lines()
        .find(|l| l.starts_with("REACHED"))
        .unwrap_or_else(|| panic!("no probe output: {}", r.context()))
        .to_string()
}

// ---------------------------------------------------------------- 1. files

#[test]
fn a_policy_in_the_working_directory_can_be_neither_read_nor_rewritten() {
    let work = project();
    let policy = work.path().join("policy");
    write(&policy.join("p.yaml"), POLICY);
    let r = inside(
        run().cwd(work.path()).policy_at("policy"),
        r#"
ok = []
try:
    open('policy/p.yaml').read(); ok.append('read')
except OSError: pass
try:
    open('policy/99-pwn.yaml', 'w').write('exceptions: [{id: all, owner: x, reason: x, hosts: ["*"]}]\n'); ok.append('planted')
except OSError: pass
import os
try:
    os.rename('policy', 'moved'); ok.append('moved')
except OSError: pass
print('OK', ok)
"#,
    );
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("OK []"), "{}", r.context());
    assert!(
        !policy.join("99-pwn.yaml").exists(),
        "the planted policy stays"
    );
    assert!(policy.join("p.yaml").exists());
}

#[test]
fn a_policy_the_sandbox_could_move_aside_is_refused() {
    let work = project();
    write(&work.path().join("config/policy/p.yaml"), POLICY);
    let r = run()
        .cwd(work.path())
        .policy_at("config/policy")
        .cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(
        r.stderr.contains("which the sandbox may write"),
        "{}",
        r.context()
    );
}

#[test]
fn a_guarded_file_with_a_hard_link_in_sight_is_refused() {
    let work = project();
    let outside = tempfile::tempdir().unwrap();
    let ca = write(
        &outside.path().join("upstream-ca.pem"),
        "not a secret, a link\n",
    );
    std::fs::hard_link(&ca, work.path().join("ca-link.pem")).unwrap();
    let r = run()
        .cwd(work.path())
        .arg("--upstream-ca")
        .arg(&ca)
        .cmd(&["cat", "ca-link.pem"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("hard links"), "{}", r.context());
}

#[test]
fn a_secret_behind_a_symlink_in_sight_is_masked() {
    let work = project();
    let outside = tempfile::tempdir().unwrap();
    let pass = write(&outside.path().join("proxy-auth"), "user:hunter2-secret\n");
    // The file is under a --ro path, and a link in the working directory
    // leads to it.
    std::os::unix::fs::symlink(&pass, work.path().join("auth-link")).unwrap();
    let r = run()
        .cwd(work.path())
        .arg("--ro")
        .arg(outside.path())
        .arg("--upstream-proxy")
        .arg("http://127.0.0.1:9")
        .arg("--upstream-proxy-auth-file")
        .arg(&pass)
        .cmd(&[
            "sh",
            "-c",
            &format!("cat auth-link {}; echo done", pass.display()),
        ]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("done"), "{}", r.context());
    assert!(!r.stdout.contains("hunter2"), "{}", r.context());
}

// ---------------------------------------------------------------- 2. loading

#[test]
fn a_symlinked_key_in_the_policy_directory_is_refused_without_its_content() {
    let outside = tempfile::tempdir().unwrap();
    let key = write(
        &outside.path().join("ca.key"),
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7-key-bytes\n",
    );
    let policy = outside.path().join("policy");
    write(&policy.join("a.yaml"), POLICY);
    std::os::unix::fs::symlink(&key, policy.join("x.yaml")).unwrap();
    let r = run().policy_at(&policy).cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("x.yaml"), "{}", r.context());
    assert!(!r.stderr.contains("key-bytes"), "{}", r.context());
}

#[test]
fn a_load_error_names_the_place_never_the_content() {
    let outside = tempfile::tempdir().unwrap();
    let policy = write(
        &outside.path().join("p.yaml"),
        "root:$6$saltsalt$c2VjcmV0LWhhc2g:19000:0:99999:7:::\n",
    );
    let r = run().policy_at(&policy).cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("p.yaml:1:1"), "{}", r.context());
    assert!(r.stderr.contains("expected"), "{}", r.context());
    assert!(!r.stderr.contains("c2VjcmV0"), "{}", r.context());
}

#[test]
fn a_policy_file_of_another_owner_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    let policy = write(&outside.path().join("p.yaml"), POLICY);
    std::os::unix::fs::chown(&policy, Some(12345), Some(12345)).unwrap();
    let r = run().policy_at(&policy).cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
    assert!(r.stderr.contains("owned by uid 12345"), "{}", r.context());
}

// ---------------------------------------------------------------- 3. the log

/// The default log's path, as the launcher printed it at start.
fn printed_log(r: &Outcome) -> PathBuf {
    let line = r
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("egressd run: decision log: "))
        .unwrap_or_else(|| panic!("no log path printed: {}", r.context()));
    PathBuf::from(line)
}

#[test]
fn the_decision_log_is_not_cmds_stream_and_cmd_cannot_forge_it() {
    let forged = r#"{"decision":"allow","host":"forged.test","reason":"forged"}"#;
    let r = run().default_log().cmd(&[
        "sh",
        "-c",
        &format!(
            "echo '{forged}' >&2; printf '{{\"partial' >&2; \
             python3 -c 'import fcntl,os; fcntl.fcntl(2, fcntl.F_SETFL, os.O_NONBLOCK)'; \
             curl -s -o /dev/null http://denied.test/ ; exit 0"
        ),
    ]);
    assert_eq!(r.code, 0, "{}", r.context());
    let log = printed_log(&r);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("forged"), "{text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["host"] == "denied.test"),
        "the real decision is in the log: {text}"
    );
    // CMD's stderr is CMD's own: no decision line of egressd's in it.
    assert!(!r.stderr.contains("\"denied.test\""), "{}", r.context());
    let _ = std::fs::remove_file(&log);
}

#[test]
fn a_log_in_the_working_directory_cannot_be_erased() {
    let work = project();
    let log = work.path().join("decisions.jsonl");
    let r = run().cwd(work.path()).arg("--log").arg(&log).cmd(&[
        "sh",
        "-c",
        "curl -s -o /dev/null http://denied.test/; sleep 0.2; \
         rm -f decisions.jsonl; : > decisions.jsonl; echo forged > decisions.jsonl",
    ]);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("denied.test"), "{text}\n{}", r.context());
    assert!(!text.contains("forged"), "{text}");
    // Under run the log is never CMD's stdout or stderr.
    let r = run().arg("--log").arg("-").cmd(&["true"]);
    assert_eq!(r.code, 125, "{}", r.context());
}

// ---------------------------------------------------------------- 4. keyring, PID 1

#[test]
fn the_keyring_is_not_reachable_from_inside() {
    let r = inside(
        run(),
        r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3
r = libc.syscall(250, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)
e1 = ctypes.get_errno()
r2 = libc.syscall(248, b"user", b"planted", b"x", 1, KEY_SPEC_SESSION_KEYRING)
e2 = ctypes.get_errno()
print('KEYCTL', r, os.strerror(e1) if r < 0 else '', 'ADD', r2, os.strerror(e2) if r2 < 0 else '')
"#,
    );
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(
        r.stdout
            .contains("KEYCTL -1 Operation not permitted ADD -1 Operation not permitted"),
        "{}",
        r.context()
    );
}

#[test]
fn pid_1_shows_nothing_of_the_launchers_arguments_or_environment() {
    let r = run()
        .arg("--upstream-proxy")
        .arg("http://user:pw-in-argv-77@127.0.0.1:9")
        .env("LAUNCHER_ONLY_SECRET", "env-secret-88")
        .cmd(&[
            "sh",
            "-c",
            "tr '\\0' ' ' </proc/1/cmdline; echo; cat /proc/1/environ; echo; \
             cat /proc/1/cmdline /proc/1/environ /proc/1/mem 2>/dev/null | tr -d '\\0' | head -c 200; echo end",
        ]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert!(r.stdout.contains("egressd-init"), "{}", r.context());
    assert!(r.stdout.contains("end"), "{}", r.context());
    assert!(!r.stdout.contains("pw-in-argv-77"), "{}", r.context());
    assert!(!r.stdout.contains("env-secret-88"), "{}", r.context());
    assert!(!r.stdout.contains("--upstream"), "{}", r.context());
}

// ---------------------------------------------------------------- 6. git

#[test]
fn git_config_and_hooks_are_read_only_unless_asked() {
    let work = project();
    let config = write(&work.path().join(".git/config"), "[core]\n\tbare = false\n");
    std::fs::create_dir_all(work.path().join(".git/hooks")).unwrap();
    std::fs::create_dir_all(work.path().join(".git/objects")).unwrap();
    let plant = "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> .git/config; \
                 printf '#!/bin/sh\\n' > .git/hooks/post-checkout; \
                 mv .git .git-moved; \
                 echo x > .git/objects/new && echo objects-writable";
    let r = run().cwd(work.path()).cmd(&["sh", "-c", plant]);
    assert!(r.stdout.contains("objects-writable"), "{}", r.context());
    assert!(!std::fs::read_to_string(&config)
        .unwrap()
        .contains("fsmonitor"));
    assert!(!work.path().join(".git/hooks/post-checkout").exists());
    assert!(work.path().join(".git").is_dir());
    let r = run().cwd(work.path()).arg("--git-writable").cmd(&[
        "sh",
        "-c",
        &plant.replace("mv .git .git-moved;", ""),
    ]);
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("fsmonitor"),
        "{}",
        r.context()
    );
}

/// `commondir` does not exist before the run, so it cannot be mounted
/// read-only; planted, it would point the host's next git command at a
/// config of the box's choosing (a `core.fsmonitor` that git runs as the
/// operator). The launcher moves it aside while the box still runs, and
/// the host's `git status` afterwards runs nothing the box wrote.
#[test]
fn a_planted_commondir_is_moved_aside_while_the_box_runs() {
    let git = crate::support::tool("git");
    let work = project();
    let w = work.path();
    let ok = std::process::Command::new(&git)
        .args(["init", "-q"])
        .current_dir(w)
        .status()
        .unwrap();
    assert!(ok.success());
    let scratch = tempfile::tempdir().unwrap();
    let marker = scratch.path().join("fsmonitor-ran");
    let plant = format!(
        "mkdir -p evil && cp -r .git/objects .git/refs evil/ && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"touch {m}\"\\n' > evil/config && \
         printf '%s/evil\\n' \"$PWD\" > .git/commondir && echo planted; \
         i=0; while [ -e .git/commondir ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; \
         [ -e .git/commondir ] && echo still-there || echo moved-while-running",
        m = marker.display()
    );
    let r = run().cwd(w).cmd(&["sh", "-c", &plant]);
    assert!(r.stdout.contains("planted"), "{}", r.context());
    assert!(r.stdout.contains("moved-while-running"), "{}", r.context());
    assert!(!w.join(".git/commondir").exists(), "{}", r.context());
    assert!(r.stderr.contains("egressd-quarantined"), "{}", r.context());
    let aside: Vec<_> = std::fs::read_dir(w.join(".git"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("commondir.egressd-quarantined-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{}", r.context());
    let status = std::process::Command::new(&git)
        .args(["status", "--short"])
        .current_dir(w)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    assert!(!marker.exists(), "the host's git ran the box's fsmonitor");
}

// ---------------------------------------------------------------- the sweep

#[test]
fn sweep_no_path_the_launcher_or_the_policy_names_is_reachable() {
    let work = project();
    let w = work.path();
    let secret = write(&w.join("secrets/token"), "sweep-token\n");
    let policy_dir = w.join("policy");
    write(
        &policy_dir.join("p.yaml"),
        &format!(
            "exceptions:\n  - id: a\n    owner: t\n    reason: t\n    hosts: [a.test]\n    \
             inject: {{headers: {{X-A: \"${{file:{}}}\"}}}}\n",
            secret.display()
        ),
    );
    let auth = write(&w.join("proxy-auth"), "u:p\n");
    let log = w.join("decisions.jsonl");
    let grants = w.join("grants");
    let key = w.join("log.key");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["log", "keygen"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(st.status.success(), "{st:?}");
    let ca_dir = w.join("certs");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["ca", "init", "--dir"])
        .arg(&ca_dir)
        .output()
        .unwrap();
    assert!(st.status.success(), "{st:?}");
    let ca = w.join("upstream-ca.pem");
    std::fs::copy(ca_dir.join("ca.pem"), &ca).unwrap();
    let named = vec![
        policy_dir.clone(),
        secret.clone(),
        ca.clone(),
        auth.clone(),
        log.clone(),
        ca_dir.clone(),
        grants.clone(),
        key.clone(),
    ];
    let r = run()
        .cwd(w)
        .policy_at(&policy_dir)
        .arg("--log")
        .arg(&log)
        .arg("--upstream-ca")
        .arg(&ca)
        .arg("--upstream-proxy")
        .arg("http://127.0.0.1:9")
        .arg("--upstream-proxy-auth-file")
        .arg(&auth)
        .arg("--ca-dir")
        .arg(&ca_dir)
        .arg("--grants")
        .arg(&grants)
        .arg("--log-chain")
        .arg("--log-key")
        .arg(&key)
        .cmd(&["python3", "-c", &probe_script(&named)]);
    assert_eq!(r.code, 0, "{}", r.context());
    assert_eq!(reached(&r), "REACHED []", "{}", r.context());
    assert!(!policy_dir.join("planted.yaml").exists());
}
