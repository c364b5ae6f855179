//! DESIGN "The record holds": what was served was recorded, even when the
//! log's sink fails or egressd is killed. Each sink failure ends with
//! every answered request's line in the log or on stderr (counted), and
//! none lost where the sink recovers.

use std::collections::BTreeSet;
use std::io::{BufReader, Read, Write};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const PREFIX: &str = "egressd: unwritten decision: ";

fn setup(log: &str) -> Lab {
    let log = log.to_string();
    lab().names(&["a.test"]).start_with(move |ports, b| {
        let b = b.policy(
            "a.yaml",
            &policy()
                .exception("a")
                .host("a.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .yaml(),
        );
        if log.is_empty() {
            b
        } else {
            b.log(&log)
        }
    })
}

/// One GET of `/n/{i}` on a new connection: its status (0 when the answer
/// was cut).
fn get(l: &Lab, i: usize) -> u16 {
    let raw = format!(
        "GET http://a.test:{}/n/{i} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        l.port()
    );
    try_request(l.e.proxy, raw.as_bytes()).map_or(0, |r| r.status)
}

/// The `/n/{i}` of every allowed line with status 200 in `text` (log
/// lines, or stderr lines behind the prefix).
fn served_in(text: &str, prefix: &str) -> Vec<usize> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["status"] == 200 && v["decision"] == "allow")
        .filter_map(|v| v["path"].as_str()?.strip_prefix("/n/")?.parse().ok())
        .collect()
}

/// SIGTERM, and waits for the exit; its stderr after.
fn stop(l: &mut Lab) -> String {
    l.e.signal("TERM");
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while l.e.child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < end, "egressd did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    eventually("the end of egressd's stderr", || {
        l.e.stderr_closed
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    });
    l.e.stderr_text()
}

/// Every answered 200 has its line in the log or on stderr (each line on
/// stderr counted in the exit's summary), and none twice.
fn assert_every_answer_on_record(served: &BTreeSet<usize>, log: &str, stderr: &str) {
    let in_log = served_in(log, "");
    let shown = served_in(stderr, PREFIX);
    let mut all: Vec<usize> = in_log.iter().chain(shown.iter()).copied().collect();
    all.sort();
    let unique: BTreeSet<usize> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "a line both in the log and shown");
    let missing: Vec<_> = served.difference(&unique).collect();
    assert!(
        missing.is_empty(),
        "answered 200 but on no record: {missing:?}\nstderr: {stderr}"
    );
    let printed = stderr.lines().filter(|l| l.starts_with(PREFIX)).count();
    if printed > 0 {
        assert!(
            stderr.contains(&format!("egressd: {printed} unwritten decision lines")),
            "the lines shown are counted: {stderr}"
        );
    }
}

fn lost_metric(e: &Egressd) -> f64 {
    e.metric("egressd_log_lines_lost_total")
        .expect("the lost-lines metric")
}

/// Requests until the log refuses (503 log_unavailable); the 200s go into
/// `served`. Returns how many were made.
fn until_refused(l: &Lab, served: &mut BTreeSet<usize>, from: usize) -> usize {
    for i in from..from + 5_000 {
        match get(l, i) {
            200 => {
                served.insert(i);
            }
            503 => return i + 1,
            _ => {}
        }
    }
    panic!("never refused");
}

fn until_served(l: &Lab, served: &mut BTreeSet<usize>, from: usize) -> usize {
    let mut i = from;
    eventually("200 again", || {
        i += 1;
        (get(l, i) == 200).then(|| {
            served.insert(i);
        })
    });
    i + 1
}

/// N GETs on one keep-alive connection, and `kill -9` the moment the last
/// answer is read: every answer has its line in the log.
#[test]
fn sigkill_after_the_last_answer_loses_no_line() {
    let mut l = setup("");
    let s = connect(l.e.proxy);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let n = 300;
    for i in 0..n {
        write!(
            w,
            "GET http://a.test:{}/n/{i} HTTP/1.1\r\nHost: a.test\r\n\r\n",
            l.port()
        )
        .unwrap();
        let resp = read_response(&mut r).expect("an answer");
        assert_eq!(resp.status, 200);
    }
    l.e.child.kill().unwrap(); // SIGKILL
    l.e.child.wait().unwrap();
    let log = std::fs::read_to_string(&l.e.log_path).unwrap();
    let got: BTreeSet<usize> = served_in(&log, "").into_iter().collect();
    let missing: Vec<usize> = (0..n).filter(|i| !got.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "answered but not in the log: {missing:?}"
    );
    // Requests answered on the hyper path too (a POST is not the fast
    // path's), each on its own connection, killed right after.
    let mut l = setup("");
    for i in 0..50 {
        let raw = format!(
            "POST http://a.test:{}/n/{i} HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            l.port()
        );
        assert_eq!(http_request(l.e.proxy, raw.as_bytes()).status, 200);
    }
    l.e.child.kill().unwrap();
    l.e.child.wait().unwrap();
    let log = std::fs::read_to_string(&l.e.log_path).unwrap();
    let got: BTreeSet<usize> = served_in(&log, "").into_iter().collect();
    let missing: Vec<usize> = (0..50).filter(|i| !got.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "answered but not in the log: {missing:?}"
    );
}

/// /dev/full: nothing is written, so nothing is answered as if it were;
/// what was decided is shown on stderr at exit and counted.
#[test]
fn dev_full_answers_nothing_off_the_record_and_shows_every_line() {
    let mut l = setup("/dev/full");
    let mut served = BTreeSet::new();
    until_refused(&l, &mut served, 0);
    assert!(l.e.metric("egressd_log_write_errors_total").unwrap() >= 1.0);
    let stderr = stop(&mut l);
    assert_every_answer_on_record(&served, "", &stderr);
    assert!(
        served_in(&stderr, PREFIX).len() + stderr.matches("log_unavailable").count() >= 1,
        "the held lines are shown: {stderr}"
    );
}

/// A tmpfs mounted by the test (root only), unmounted when dropped.
struct Tmpfs(std::path::PathBuf, #[allow(dead_code)] Scratch);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        crate::support::need_root("a full-disk test", "it mounts a small tmpfs");
        let dir = scratch();
        let at = dir.path("mnt");
        std::fs::create_dir(&at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount -t tmpfs failed");
        Tmpfs(at, dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A 64 KiB tmpfs that fills: egressd refuses, and once room is made
/// (a filler removed), writes what it held; no line lost.
#[test]
fn a_full_disk_refuses_then_recovers_with_no_line_lost() {
    let fs = Tmpfs::mount("64k");
    let log = fs.0.join("decisions.log");
    // Most of the room taken by a filler the test frees later.
    std::fs::write(fs.0.join("filler"), vec![b'x'; 40 << 10]).unwrap();
    let mut l = setup(log.to_str().unwrap());
    let mut served = BTreeSet::new();
    let next = until_refused(&l, &mut served, 0);
    assert!(served.len() > 10, "some were served before the disk filled");
    assert!(l.e.metric("egressd_log_write_errors_total").unwrap() >= 1.0);
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    until_served(&l, &mut served, next);
    assert_eq!(lost_metric(&l.e), 0.0);
    let stderr = stop(&mut l);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_every_answer_on_record(&served, &text, &stderr);
    assert!(!stderr.contains(PREFIX), "the sink recovered: {stderr}");
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "every line whole"
    );
}

/// The same disk left full: the lines the log did not take are shown on
/// stderr at exit, each counted.
#[test]
fn a_disk_that_stays_full_shows_and_counts_every_held_line() {
    let fs = Tmpfs::mount("64k");
    let log = fs.0.join("decisions.log");
    std::fs::write(fs.0.join("filler"), vec![b'x'; 40 << 10]).unwrap();
    let mut l = setup(log.to_str().unwrap());
    let mut served = BTreeSet::new();
    until_refused(&l, &mut served, 0);
    let stderr = stop(&mut l);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_every_answer_on_record(&served, &text, &stderr);
    assert!(stderr.contains(PREFIX), "held lines shown: {stderr}");
}

/// A FIFO nobody reads: egressd refuses by age; when it is read again,
/// every line arrives.
#[test]
fn a_stalled_fifo_refuses_then_delivers_every_line() {
    let fifo = log_fifo();
    let reader = fifo.open_reader();
    let mut l = setup(fifo.arg());
    let mut r = reader.join().unwrap();
    let mut served = BTreeSet::new();
    // Nobody reads: the pipe fills.
    let next = until_refused(&l, &mut served, 0);
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            g.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    until_served(&l, &mut served, next);
    assert_eq!(lost_metric(&l.e), 0.0);
    let stderr = stop(&mut l);
    let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
    assert_every_answer_on_record(&served, &text, &stderr);
    assert!(!stderr.contains(PREFIX), "the sink recovered: {stderr}");
}

/// The FIFO's reader goes away (after reading every line so far): writes
/// fail, egressd refuses; a new reader gets what was held.
#[test]
fn a_fifo_whose_reader_dies_loses_no_line() {
    let fifo = log_fifo();
    let reader = fifo.open_reader();
    let mut l = setup(fifo.arg());
    let mut r = BufReader::new(reader.join().unwrap());
    let mut served = BTreeSet::new();
    let mut first = String::new();
    for i in 0..20 {
        assert_eq!(get(&l, i), 200);
        served.insert(i);
        // Read this request's line before the next.
        let mut line = String::new();
        std::io::BufRead::read_line(&mut r, &mut line).unwrap();
        first.push_str(&line);
    }
    drop(r);
    let next = until_refused(&l, &mut served, 20);
    let got = fifo.collect();
    until_served(&l, &mut served, next);
    assert_eq!(lost_metric(&l.e), 0.0);
    let stderr = stop(&mut l);
    let text = first + &String::from_utf8(got.lock().unwrap().clone()).unwrap();
    assert_every_answer_on_record(&served, &text, &stderr);
    assert!(!stderr.contains(PREFIX), "the sink recovered: {stderr}");
}

/// The log file deleted under egressd: the next line goes to a new file at
/// the same path, not into the deleted one.
#[test]
fn a_deleted_log_file_is_recreated_and_no_line_goes_into_the_void() {
    let mut l = setup("");
    let path = l.e.log_path.clone();
    for i in 0..5 {
        assert_eq!(get(&l, i), 200);
    }
    std::fs::remove_file(&path).unwrap();
    let mut served = BTreeSet::new();
    for i in 5..40 {
        assert_eq!(get(&l, i), 200);
        served.insert(i);
    }
    assert_eq!(lost_metric(&l.e), 0.0);
    let stderr = stop(&mut l);
    let text = std::fs::read_to_string(&path).expect("a new log file");
    assert_every_answer_on_record(&served, &text, &stderr);
    assert!(!stderr.contains(PREFIX), "{stderr}");
}

/// `egressd log …` with `args`: exit status and stdout.
fn log_cmd(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .arg("log")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A chained log of `n` answered requests, checkpoints every 5 lines;
/// egressd stopped with SIGTERM (`clean`) or SIGKILL. The log's lines,
/// the public key's path, and the scratch dir holding them.
fn chained(n: usize, clean: bool) -> (Vec<String>, String, Scratch) {
    let dir = scratch();
    let key = dir.path("log.key");
    let (rc, _) = log_cmd(&["keygen", key.to_str().unwrap()]);
    assert_eq!(rc, 0);
    let key_arg = key.to_str().unwrap().to_string();
    let mut l = lab().names(&["a.test"]).start_with(move |ports, b| {
        b.policy(
            "a.yaml",
            &policy()
                .exception("a")
                .host("a.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .yaml(),
        )
        .arg("--log-chain")
        .arg("--log-key")
        .arg(&key_arg)
        .arg("--log-checkpoint")
        .arg("5")
    });
    for i in 0..n {
        assert_eq!(get(&l, i), 200);
    }
    if clean {
        stop(&mut l);
    } else {
        l.e.child.kill().unwrap();
        l.e.child.wait().unwrap();
    }
    let text = std::fs::read_to_string(&l.e.log_path).unwrap();
    let public = format!("{}.pub", key.display());
    (text.lines().map(String::from).collect(), public, dir)
}

fn verify_lines(dir: &Scratch, public: &str, lines: &[String]) -> (i32, String) {
    let p = dir.path("copy.log");
    std::fs::write(
        &p,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    log_cmd(&["verify", "--pub", public, p.to_str().unwrap()])
}

#[test]
fn a_chained_log_verifies_and_each_edit_is_named() {
    let (lines, public, dir) = chained(12, true);
    assert!(lines.iter().all(|l| l.contains("\"prev\":\"")));
    let checkpoints = lines
        .iter()
        .filter(|l| l.contains("\"checkpoint\""))
        .count();
    assert_eq!(
        checkpoints, 3,
        "every 5 lines and the final one: {lines:#?}"
    );
    assert!(lines.last().unwrap().contains("\"final\":true"));
    let (rc, out) = verify_lines(&dir, &public, &lines);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("intact"), "{out}");

    // A flipped byte in line 3 (1-based): line 4's prev no longer matches.
    let mut flipped = lines.clone();
    flipped[2] = flipped[2].replacen("/n/2", "/n/7", 1);
    let (rc, out) = verify_lines(&dir, &public, &flipped);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("copy.log:4:") && out.contains("prev"), "{out}");

    // A deleted line.
    let mut deleted = lines.clone();
    deleted.remove(7);
    let (rc, out) = verify_lines(&dir, &public, &deleted);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("copy.log:8:"), "{out}");

    // A swapped pair.
    let mut swapped = lines.clone();
    swapped.swap(1, 2);
    let (rc, out) = verify_lines(&dir, &public, &swapped);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("copy.log:2:"), "{out}");

    // A checkpoint re-signed by another key.
    let other = dir.path("other.key");
    assert_eq!(log_cmd(&["keygen", other.to_str().unwrap()]).0, 0);
    let other_pub = format!("{}.pub", other.display());
    let (rc, out) = verify_lines(&dir, &other_pub, &lines);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("checkpoint"), "{out}");

    // The tail cut (the final checkpoint and two lines before it).
    let cut = &lines[..lines.len() - 3];
    let (rc, out) = verify_lines(&dir, &public, cut);
    assert_eq!(rc, 3, "{out}");
    assert!(
        out.contains("not sealed") || out.contains("not the final"),
        "{out}"
    );
    assert!(!out.contains("TAMPERED"), "{out}");
}

/// SIGKILL: the lines after the last checkpoint are reported unsealed,
/// not tampered with; the ones before verify.
#[test]
fn a_sigkill_tail_is_unsealed_not_tampered() {
    let (lines, public, dir) = chained(7, false);
    assert!(!lines.last().unwrap().contains("\"final\":true"));
    let (rc, out) = verify_lines(&dir, &public, &lines);
    assert_eq!(rc, 3, "{out}");
    assert!(
        out.contains("2 lines from") && out.contains("not sealed"),
        "{out}"
    );
    assert!(!out.contains("TAMPERED"), "{out}");
}

/// SIGUSR1 rotation: the chain goes on into the new file; verify takes
/// the files in order, and not out of order.
#[test]
fn a_chained_log_verifies_across_rotation() {
    let dir = scratch();
    let key = dir.path("log.key");
    assert_eq!(log_cmd(&["keygen", key.to_str().unwrap()]).0, 0);
    let key_arg = key.to_str().unwrap().to_string();
    let mut l = lab().names(&["a.test"]).start_with(move |ports, b| {
        b.policy(
            "a.yaml",
            &policy()
                .exception("a")
                .host("a.test")
                .cidr(LOOPBACK)
                .port(ports.origin)
                .yaml(),
        )
        .arg("--log-chain")
        .arg("--log-key")
        .arg(&key_arg)
        .arg("--log-checkpoint")
        .arg("4")
    });
    for i in 0..6 {
        assert_eq!(get(&l, i), 200);
    }
    let old = dir.path("decisions.log.1");
    std::fs::rename(&l.e.log_path, &old).unwrap();
    l.e.signal("USR1");
    eventually("the reopen", || {
        l.e.stderr_text()
            .contains("reopening decision log")
            .then_some(())
    });
    for i in 6..12 {
        assert_eq!(get(&l, i), 200);
    }
    stop(&mut l);
    let public = format!("{}.pub", key.display());
    let new = l.e.log_path.to_str().unwrap().to_string();
    let (rc, out) = log_cmd(&["verify", "--pub", &public, old.to_str().unwrap(), &new]);
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = log_cmd(&["verify", "--pub", &public, &new, old.to_str().unwrap()]);
    assert_ne!(rc, 0, "out of order: {out}");
}
