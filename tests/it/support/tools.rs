//! The programs and privileges tests need from the machine. `tests/setup`
//! installs every program; a test whose program is missing, or that needs
//! root and does not have it, fails with what to do. No test reports `ok`
//! without having run.

use std::path::{Path, PathBuf};

/// Each program a test drives, and how it is installed (what `tests/setup`
/// does for it).
const INSTALL: &[(&str, &str)] = &[
    ("bash", "apt-get install bash"),
    ("certutil", "apt-get install libnss3-tools"),
    ("check-jsonschema", "tests/setup installs it from PyPI"),
    ("chromium", "apt-get install chromium"),
    ("curl", "apt-get install curl"),
    ("dns2tcpc", "apt-get install dns2tcp"),
    ("dnsdist", "apt-get install dnsdist"),
    ("gh", "apt-get install gh"),
    ("haproxy", "apt-get install haproxy"),
    ("git", "apt-get install git"),
    ("dns2tcpd", "apt-get install dns2tcp"),
    ("go", "apt-get install golang-go"),
    ("iodine", "apt-get install iodine"),
    ("iodined", "apt-get install iodine"),
    ("ip", "apt-get install iproute2"),
    ("mkfifo", "apt-get install coreutils"),
    ("nft", "apt-get install nftables"),
    ("node", "apt-get install nodejs"),
    ("npm", "apt-get install npm"),
    ("openssl", "apt-get install openssl"),
    ("pnpm", "npm install -g pnpm@12.23.0"),
    ("promtool", "apt-get install prometheus"),
    (
        "python3",
        "apt-get install python3 python3-venv python3-pip",
    ),
    ("setpriv", "apt-get install util-linux"),
    ("systemd-analyze", "apt-get install systemd"),
    ("time", "apt-get install time"),
    ("unshare", "apt-get install util-linux"),
    (
        "uv",
        "tests/setup installs it from PyPI into /usr/local/bin",
    ),
];

/// How `name` is installed, for the failure message.
pub fn install_hint(name: &str) -> &'static str {
    INSTALL
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("see tests/setup", |(_, how)| how)
}

/// The message a test fails with when `name` is missing.
pub fn missing(name: &str) -> String {
    format!(
        "{name} is missing: run tests/setup ({})",
        install_hint(name)
    )
}

/// `name` on `PATH` (or in `/usr/sbin`, `/sbin`, where Debian puts some of
/// them); fails the test, with the command that installs it, when absent.
pub fn tool(name: &str) -> PathBuf {
    find_tool(name).unwrap_or_else(|| panic!("{}", missing(name)))
}

/// `name` on `PATH`, `/usr/sbin` or `/sbin`, if it is there.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    super::on_path(name).or_else(|| {
        ["/usr/sbin", "/sbin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    })
}

/// The program at `path` (a test that runs it by its absolute path); fails
/// the test, with the command that installs it, when absent.
pub fn installed(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(
        p.is_file(),
        "{}",
        missing(p.file_name().unwrap().to_str().unwrap())
    );
    p
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the test unless it runs as root; `why` says what needs root.
pub fn need_root(test: &str, why: &str) {
    assert!(
        is_root(),
        "{test} needs root ({why}): run the README's test command as root"
    );
}

/// Fails the test, with the command that installs it, for each program in
/// [`INSTALL`] that the shell `script` runs (a word in command position:
/// first in the script, after `;`, `&`, `|`, `(`, `{`, `` ` ``, `$(`, a
/// newline or a shell keyword, past `VAR=value` words and `timeout N`). A
/// script run inside `egressd run` would otherwise end with `sh: curl: not
/// found` and a wrong exit code, naming nothing to install.
pub fn need_for_script(script: &str) {
    for word in commands_of(script) {
        let name = word.rsplit('/').next().unwrap_or(word);
        if !INSTALL.iter().any(|(n, _)| *n == name) {
            continue;
        }
        if word.starts_with('/') {
            installed(word);
        } else {
            tool(name);
        }
    }
}

/// The words in command position in a shell script (see [`need_for_script`]).
fn commands_of(script: &str) -> Vec<&str> {
    const KEYWORDS: &[&str] = &[
        "if", "then", "else", "elif", "do", "while", "until", "!", "exec", "env", "command",
    ];
    let mut out = Vec::new();
    for segment in script.split(['\n', ';', '&', '|', '(', ')', '{', '`']) {
        let mut words = segment.split_whitespace().peekable();
        while let Some(w) = words.next() {
            let w = w.trim_start_matches('$');
            if w.is_empty() || KEYWORDS.contains(&w) || is_assignment(w) {
                continue;
            }
            if w == "timeout" {
                // timeout [-s SIG | -k N | --opt] DURATION COMMAND
                while let Some(opt) = words.next_if(|a| a.starts_with('-')) {
                    if opt == "-k" || opt == "-s" {
                        words.next();
                    }
                }
                words.next();
                continue;
            }
            out.push(w);
            break;
        }
    }
    out
}

/// `NAME=value`: a variable set for the command that follows.
fn is_assignment(w: &str) -> bool {
    w.split_once('=').is_some_and(|(n, _)| {
        !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[test]
fn the_programs_a_script_runs_are_the_words_in_command_position() {
    let script = "FOO=1 curl -s \"$u\" && echo curl=ok; for u in a b; do\n  timeout -k 1 5 npm ci\ndone\n\
                  x=$(openssl s_client </dev/null | grep -c BEGIN); /usr/bin/python3 -m pip -V 2>&1 | tail -1";
    assert_eq!(
        commands_of(script),
        [
            "curl",
            "echo",
            "for",
            "npm",
            "done",
            "openssl",
            "grep",
            "/usr/bin/python3",
            "1",
            "tail"
        ]
    );
}
