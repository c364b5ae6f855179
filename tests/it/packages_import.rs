//! `egressd packages import`: a project's lockfiles become an approved set
//! pinning what they pin, run as a user would run it (the binary, real
//! lockfile formats, stdout and `--output`).

use std::process::{Command, Output};

use crate::support::*;

const H1: &str = "922820b53db7a7257ffbda3f597266d435245903d80737e34f8a45ff3e3230d8";
const H2: &str = "bec941d2aa8195e248a60b31ff9f0558284cf01a52591ceda73ea9afffd69fd9";

fn import(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["packages", "import"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn lockfiles(s: &Scratch) {
    s.file(
        "requirements.txt",
        &format!(
            "# pip-compile --generate-hashes\n--index-url https://pypi.org/simple\n\
             certifi==2024.8.30 \\\n    --hash=sha256:{H1} \\\n    --hash=sha256:{H2}\n    # via requests\n\
             -e ./local-tool\nrequests==2.32.3 \\\n    --hash=sha256:{H2}\n"
        ),
    );
    s.file(
        "Cargo.lock",
        &format!(
            "version = 4\n\n[[package]]\nname = \"app\"\nversion = \"0.1.0\"\ndependencies = [\"serde\"]\n\n\
             [[package]]\nname = \"serde\"\nversion = \"1.0.210\"\n\
             source = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"{H1}\"\n"
        ),
    );
    s.file(
        "package-lock.json",
        r#"{"name":"web","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{
  "":{"name":"web","version":"1.0.0","dependencies":{"@types/node":"^20.0.0","left-pad":"1.3.0"}},
  "node_modules/@types/node":{"version":"20.14.2","resolved":"https://registry.npmjs.org/@types/node/-/node-20.14.2.tgz","integrity":"sha512-xyz"},
  "node_modules/left-pad":{"version":"1.3.0","resolved":"https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz","integrity":"sha512-abc"}}}"#,
    );
    s.file(
        "go.sum",
        "golang.org/x/text v0.14.0 h1:ScX5w1eTa3QqT8oi6+ziP7dTV1S2+ALU0bI+0zXKWiQ=\n\
         golang.org/x/text v0.14.0/go.mod h1:18ZOQIKpY8NJVqYksKHtTdi31H5itFRjB5/qKTNYzSU=\n",
    );
}

#[test]
fn lockfiles_become_one_pinned_set_per_ecosystem() {
    let s = scratch();
    lockfiles(&s);
    let out = import(
        &[
            "--id",
            "agent",
            "--owner",
            "platform",
            "requirements.txt",
            "Cargo.lock",
            "package-lock.json",
            "go.sum",
        ],
        s.dir(),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    for id in ["agent-pypi", "agent-cargo", "agent-npm", "agent-go"] {
        assert!(stdout.contains(&format!("- id: {id}\n")), "{id}:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!(
            "{{ name: \"certifi\", versions: \"==2024.8.30\", sha256: [\"{H1}\", \"{H2}\"] }}"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("name: \"requests\", versions: \"==2.32.3\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("name: \"serde\", versions: \"=1.0.210\""),
        "{stdout}"
    );
    assert!(stdout.contains("name: \"@types/node\""), "{stdout}");
    assert!(stdout.contains("name: \"golang.org/x/text\""), "{stdout}");
    assert!(
        stdout.contains("# skipped (not from a registry)") && stdout.contains("local-tool"),
        "an editable entry disappeared silently:\n{stdout}"
    );
    assert!(
        !stdout.contains("name: \"app\""),
        "the workspace crate: {stdout}"
    );
    assert!(stdout.contains("owner: \"platform\""), "{stdout}");

    // --output writes the same text to a file.
    let out2 = import(
        &[
            "--id",
            "agent",
            "--owner",
            "platform",
            "-o",
            "approved.yaml",
            "requirements.txt",
            "Cargo.lock",
            "package-lock.json",
            "go.sum",
        ],
        s.dir(),
    );
    assert!(
        out2.status.success(),
        "{}",
        String::from_utf8_lossy(&out2.stderr)
    );
    assert!(out2.stdout.is_empty());
    assert_eq!(
        std::fs::read_to_string(s.path("approved.yaml")).unwrap(),
        stdout
    );
}

#[test]
fn what_cannot_be_pinned_is_an_error_naming_the_line() {
    let s = scratch();
    s.file("requirements.txt", "certifi==2024.8.30\nrequests>=2.31\n");
    let out = import(&["--id", "x", "--owner", "o", "requirements.txt"], s.dir());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requirements.txt:2:"), "{err}");
    assert!(out.stdout.is_empty(), "a partial set was written");

    s.file("yarn.lock", "# yarn lockfile v1\n");
    let out = import(&["--id", "x", "--owner", "o", "yarn.lock"], s.dir());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a lockfile egressd reads"));

    let out = import(&["--id", "x", "--owner", "o", "missing.lock"], s.dir());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.lock"));

    let out = import(
        &["--id", "Bad Id", "--owner", "o", "requirements.txt"],
        s.dir(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid set id"));
}
