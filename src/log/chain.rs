//! A verifiable decision log (`--log-chain`): every line carries `prev`,
//! the SHA-256 of the line before it (as written, without its newline), and
//! every `--log-checkpoint N` lines, and at a clean exit, a checkpoint line
//! signed with the ed25519 key of `--log-key`. `egressd log verify`
//! ([`super::verify`]) walks the chain.
//!
//! Owns the line format of `prev` and of checkpoint lines, the key file and
//! the signed message. Does not own the order lines reach the log in: the
//! sink seals each line under the lock that orders its batch, so the order
//! hashed is the order written.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ring::digest::{digest, SHA256};
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};

/// The `prev` of the first line of a chain (egressd started).
pub const GENESIS: [u8; 32] = [0; 32];
/// What a checkpoint's signature covers is this, then the line count, the
/// `prev` in hex and whether it is the final one, each on a line.
const SIGNED_PREFIX: &str = "egressd-log-checkpoint-v1";
/// The default of `--log-checkpoint`.
pub const DEFAULT_EVERY: u64 = 1000;

/// `serve`'s flags for a verifiable log.
#[derive(Debug, Clone, clap::Args)]
pub struct ChainArgs {
    /// Hash-chain the decision log: each line carries `prev`, the hash of
    /// the line before; needs --log-key.
    #[arg(long, env = "EGRESSD_LOG_CHAIN", requires = "log_key")]
    pub log_chain: bool,
    /// The ed25519 key (PKCS#8, as `egressd log keygen` writes it) that
    /// signs the chained log's checkpoints.
    #[arg(long, env = "EGRESSD_LOG_KEY", value_name = "FILE")]
    pub log_key: Option<PathBuf>,
    /// Lines between two signed checkpoints of a chained log.
    #[arg(long, env = "EGRESSD_LOG_CHECKPOINT", value_name = "N", default_value_t = DEFAULT_EVERY,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub log_checkpoint: u64,
}

impl Default for ChainArgs {
    fn default() -> ChainArgs {
        ChainArgs {
            log_chain: false,
            log_key: None,
            log_checkpoint: DEFAULT_EVERY,
        }
    }
}

impl ChainArgs {
    /// The chain `serve` starts with, or none; an unreadable key is an
    /// error (egressd does not start with a log it was told to sign and
    /// cannot).
    pub fn chain(&self) -> anyhow::Result<Option<Chain>> {
        if !self.log_chain {
            return Ok(None);
        }
        let path = self
            .log_key
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("--log-chain needs --log-key FILE"))?;
        let key = read_key(path)?;
        Ok(Some(Chain::new(key, self.log_checkpoint)))
    }
}

/// Reads an ed25519 key (PKCS#8 v1 or v2 DER).
pub fn read_key(path: &Path) -> anyhow::Result<Ed25519KeyPair> {
    let der = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read log key {}: {e}", path.display()))?;
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| {
        anyhow::anyhow!(
            "{} is not an ed25519 key in PKCS#8 (egressd log keygen makes one): {e}",
            path.display()
        )
    })
}

/// Makes a key: the private key (PKCS#8 DER, mode 0600, never
/// overwritten) at `path`, the public key in hex at `path.pub`. Returns
/// the public key in hex.
pub fn keygen(path: &Path) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let rng = SystemRandom::new();
    let doc = Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| anyhow::anyhow!("cannot generate an ed25519 key"))?;
    let key = Ed25519KeyPair::from_pkcs8(doc.as_ref())
        .map_err(|_| anyhow::anyhow!("the generated key does not parse"))?;
    let public = hex(key.public_key().as_ref());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    f.write_all(doc.as_ref())?;
    let pub_path = pub_path(path);
    std::fs::write(&pub_path, format!("{public}\n"))
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", pub_path.display()))?;
    Ok(public)
}

/// Where `keygen` puts the public key of the key at `path`.
pub fn pub_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".pub");
    PathBuf::from(p)
}

/// The chain's state: the hash of the last line, how many lines it holds,
/// and the key.
pub struct Chain {
    prev: [u8; 32],
    lines: u64,
    since: u64,
    every: u64,
    key: Ed25519KeyPair,
    public: String,
}

impl Chain {
    pub fn new(key: Ed25519KeyPair, every: u64) -> Chain {
        let public = hex(key.public_key().as_ref());
        Chain {
            prev: GENESIS,
            lines: 0,
            since: 0,
            every: every.max(1),
            key,
            public,
        }
    }

    /// Seals the line at `out[start..]` (one JSON object and its newline):
    /// adds `prev` as its last field and makes it the chain's last line;
    /// after every `every` lines, appends a checkpoint line.
    pub fn seal(&mut self, out: &mut Vec<u8>, start: usize) {
        // The object's closing brace and newline are the last two bytes.
        debug_assert!(out.ends_with(b"}\n"));
        out.truncate(out.len() - 2);
        out.extend_from_slice(b",\"prev\":\"");
        push_hex(out, &self.prev);
        out.extend_from_slice(b"\"}");
        self.link(out, start);
        out.push(b'\n');
        self.since += 1;
        if self.since >= self.every {
            self.checkpoint(out, false);
        }
    }

    /// Appends a signed checkpoint line over the chain so far: `final` at
    /// a clean exit.
    pub fn checkpoint(&mut self, out: &mut Vec<u8>, last: bool) {
        let start = out.len();
        let prev = hex(&self.prev);
        let sig = self
            .key
            .sign(signed_message(self.lines, &prev, last).as_bytes());
        out.extend_from_slice(b"{\"ts\":\"");
        out.extend_from_slice(
            crate::time::format_rfc3339_millis(crate::time::unix_now_millis()).as_bytes(),
        );
        let _ = write!(
            Bytes(out),
            "\",\"event\":\"checkpoint\",\"lines\":{},\"final\":{last},\"key\":\"{}\",\"sig\":\"{}\",\"prev\":\"{prev}\"}}",
            self.lines,
            self.public,
            hex(sig.as_ref()),
        );
        self.link(out, start);
        out.push(b'\n');
        self.since = 0;
    }

    fn link(&mut self, out: &[u8], start: usize) {
        self.prev = sha256(&out[start..]);
        self.lines += 1;
    }
}

/// What a checkpoint signs.
pub fn signed_message(lines: u64, prev_hex: &str, last: bool) -> String {
    format!("{SIGNED_PREFIX}\n{lines}\n{prev_hex}\n{last}\n")
}

pub fn sha256(b: &[u8]) -> [u8; 32] {
    let d = digest(&SHA256, b);
    let mut h = [0; 32];
    h.copy_from_slice(d.as_ref());
    h
}

pub fn hex(b: &[u8]) -> String {
    let mut s = Vec::with_capacity(b.len() * 2);
    push_hex(&mut s, b);
    String::from_utf8(s).expect("hex digits")
}

fn push_hex(out: &mut Vec<u8>, b: &[u8]) {
    const D: &[u8; 16] = b"0123456789abcdef";
    for &x in b {
        out.push(D[(x >> 4) as usize]);
        out.push(D[(x & 15) as usize]);
    }
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `fmt::Write` into a byte buffer.
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
