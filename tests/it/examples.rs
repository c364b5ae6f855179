//! The client examples (examples/clients/) run behind a real `egressd serve`
//! on 127.0.0.1: an http:// request to a local origin that an exception
//! allows goes through, and an https:// CONNECT nothing allows is refused
//! with its reason read back from egressd. Python is required (CI installs
//! it); the Node example is skipped with a message when node is absent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A plain-HTTP origin on 127.0.0.1 answering every request with `hello`.
fn origin() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().take(64) {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&b[..n]),
                }
            }
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n",
            );
        }
    });
    port
}

struct Egressd {
    child: Child,
    proxy: String,
    dir: PathBuf,
}

impl Drop for Egressd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `egressd serve` on 127.0.0.1 with one exception: the local origin.
fn egressd(origin_port: u16) -> Egressd {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "egressd-examples-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "settings:\n  contact: \"#egressd-examples\"\nexceptions:\n  - id: local-origin\n    owner: tests\n    reason: the examples' allowed request\n    cidrs: [127.0.0.1/32]\n    ports: [{origin_port}]\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--dns-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--upstream-dns",
            "127.0.0.1:9",
            "--log",
        ])
        .arg(dir.join("decisions.log"))
        .arg("--policy")
        .arg(&policy)
        .env_clear()
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut line = String::new();
    let mut proxy = None;
    while proxy.is_none() && Instant::now() < deadline {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        proxy = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("proxy="))
            .map(|a| format!("http://{a}"));
    }
    // Keep draining stderr so egressd never blocks on it.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    Egressd {
        child,
        proxy: proxy.expect("serve printed its proxy address"),
        dir,
    }
}

fn run_example(program: &Path, script: &str, e: &Egressd, allowed: &str) -> (bool, String) {
    let o = Command::new(program)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .args([allowed, "https://example.com/"])
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env("HTTP_PROXY", &e.proxy)
        .env("HTTPS_PROXY", &e.proxy)
        .env("http_proxy", &e.proxy)
        .env("https_proxy", &e.proxy)
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn check_output(out: &str, allowed: &str) {
    assert!(
        out.contains(&format!("ALLOWED {allowed}: 200, 6 bytes")),
        "{out}"
    );
    assert!(
        out.contains("DENIED  https://example.com/: 403 no_exception"),
        "{out}"
    );
    // egressd's explanation, with the contact, reached the program.
    assert!(out.contains("#egressd-examples"), "{out}");
    assert!(
        out.contains("egressd explain https://example.com/"),
        "{out}"
    );
}

#[test]
fn python_client_behind_egressd() {
    let python = on_path("python3").expect("python3 (CI installs it)");
    let port = origin();
    let e = egressd(port);
    let allowed = format!("http://127.0.0.1:{port}/hello");
    let (ok, out) = run_example(&python, "examples/clients/python_client.py", &e, &allowed);
    assert!(ok, "{out}");
    check_output(&out, &allowed);
}

#[test]
fn node_client_behind_egressd() {
    let Some(node) = on_path("node") else {
        println!("SKIPPED node client: no node on PATH");
        return;
    };
    let port = origin();
    let e = egressd(port);
    let allowed = format!("http://127.0.0.1:{port}/hello");
    let (ok, out) = run_example(&node, "examples/clients/node_client.mjs", &e, &allowed);
    assert!(ok, "{out}");
    check_output(&out, &allowed);
}
