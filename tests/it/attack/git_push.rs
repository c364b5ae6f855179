//! Malformed pushes against the git gate: truncated and oversized
//! pkt-lines, a pack whose object count lies, a delta loop, a zip bomb.
//! Each is sent with curl through egressd (interception) to a repository
//! the exception lets agents push to; each is refused with a reason, and
//! the git server receives no `git-receive-pack` request.

use std::io::Write;
use std::process::Command;

use flate2::write::ZlibEncoder;
use ring::digest::{Context, SHA1_FOR_LEGACY_USE_ONLY};

use crate::git_gate::{git_rules, start, Setup};

fn pkt(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(format!("{:04x}", data.len() + 4).as_bytes());
    out.extend_from_slice(data);
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut e = ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A pack of `entries` claiming `count` objects, with a good trailer.
fn pack(count: u32, entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"PACK".to_vec();
    out.extend_from_slice(&2u32.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    for e in entries {
        out.extend_from_slice(e);
    }
    let mut h = Context::new(&SHA1_FOR_LEGACY_USE_ONLY);
    h.update(&out);
    out.extend_from_slice(h.finish().as_ref());
    out
}

/// An object header: type and size (gitformat-pack).
fn header(ty: u8, size: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut c = (ty << 4) | (size & 15) as u8;
    let mut rest = size >> 4;
    while rest > 0 {
        out.push(c | 0x80);
        c = (rest & 0x7f) as u8;
        rest >>= 7;
    }
    out.push(c);
    out
}

/// A push creating refs/heads/agent/a at a made-up id, then `tail`.
fn push_body(tail: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    pkt(
        &mut out,
        format!(
            "{} {} refs/heads/agent/a\0report-status side-band-64k\n",
            "0".repeat(40),
            "1".repeat(40)
        )
        .as_bytes(),
    );
    out.extend_from_slice(b"0000");
    out.extend_from_slice(tail);
    out
}

/// POSTs `body` to acme/widgets' receive-pack through egressd: the
/// status and the body as text.
fn post(s: &Setup, body: &[u8]) -> (u16, String) {
    let file = s.dir.path().join("body");
    std::fs::write(&file, body).unwrap();
    let out = Command::new(crate::support::tool("curl"))
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--proxy"])
        .arg(format!("http://{}", s.e.proxy))
        .arg("--cacert")
        .arg(&s.ca)
        .args(["-H", "Content-Type: application/x-git-receive-pack-request"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("{}/git-receive-pack", s.url("acme/widgets")))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap_or(0), body.to_lowercase())
}

#[test]
fn malformed_pushes_are_refused_and_nothing_goes_upstream() {
    let s = start(git_rules());
    let before = s.server.refs("acme/widgets");
    // A pkt-line whose length runs past the body.
    let (code, text) = post(&s, b"00ff0000000000");
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("truncated pkt-line"), "{text}");
    // A length past git's 65520.
    let (code, text) = post(&s, b"fff1xxxx");
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("pkt-line of 65521 bytes"), "{text}");
    // Length digits that are not hex.
    let (code, _) = post(&s, b"zzzz0000");
    assert_eq!(code, 400);
    // A pack that says it holds a million objects and holds one.
    let blob = [header(3, 5), zlib(b"hello")].concat();
    let (code, text) = post(
        &s,
        &push_body(&pack(1_000_000, std::slice::from_ref(&blob))),
    );
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains("ng refs/heads/agent/a egressd: malformed"),
        "{text}"
    );
    assert!(text.contains("object count lies"), "{text}");
    // Two REF_DELTAs, each naming the other's id as its base.
    let delta = zlib(&[1, 1, 1, b'a']);
    let a = [header(7, 4), [0x22; 20].to_vec(), delta.clone()].concat();
    let b = [header(7, 4), [0x11; 20].to_vec(), delta].concat();
    let (code, text) = post(&s, &push_body(&pack(2, &[a, b])));
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("egressd: git_not_fast_forward"), "{text}");
    // A zip bomb: declared as 100 bytes, inflating to 32 MiB.
    let bomb = [header(3, 100), zlib(&vec![0u8; 32 << 20])].concat();
    assert!(bomb.len() < 64 << 10);
    let (code, text) = post(&s, &push_body(&pack(1, &[bomb])));
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("inflates past its declared size"), "{text}");
    // A pack whose checksum does not match.
    let mut p = pack(1, &[blob]);
    let n = p.len();
    p[n - 1] ^= 0xff;
    let (code, text) = post(&s, &push_body(&p));
    assert_eq!(code, 200);
    assert!(text.contains("checksum"), "{text}");
    assert_eq!(
        s.server.receive_packs(),
        0,
        "a malformed push reached upstream"
    );
    assert_eq!(s.server.refs("acme/widgets"), before);
    let refused = s
        .e
        .log_lines()
        .into_iter()
        .filter(|l| l["reason"] == "malformed" && l["path"] == "/acme/widgets.git/git-receive-pack")
        .count();
    assert!(refused >= 5, "{refused}");
}
