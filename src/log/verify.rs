//! `egressd log verify [--pub FILE] LOG…`: walks a chained decision log
//! (see [`super::chain`]) across the files given, in order (rotation: the
//! chain goes on from one file into the next).
//!
//! Owns what counts as intact, tampered and unsealed, and how it is said.
//! Exit status ([`Verdict::code`]): 0 intact, every line sealed by a
//! checkpoint that verifies; 1 tampered (a line changed, removed or
//! reordered, a checkpoint that does not verify, a line that is not a
//! chained line); 3 unsealed (lines after the last checkpoint: egressd was
//! killed there, or the log was cut; not called tampering).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use ring::signature::{UnparsedPublicKey, ED25519};
use serde_json::Value;

use super::chain::{hex, sha256, signed_message, unhex, GENESIS};

/// What `verify` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Intact,
    Tampered(String),
    Unsealed(String),
}

impl Verdict {
    pub fn code(&self) -> u8 {
        match self {
            Verdict::Intact => 0,
            Verdict::Tampered(_) => 1,
            Verdict::Unsealed(_) => 3,
        }
    }
}

/// A summary of an intact walk, or why it is not.
pub struct Report {
    pub verdict: Verdict,
    pub lines: u64,
    pub checkpoints: u64,
    /// Notes that are not failures (a log that starts mid-chain, a restart
    /// after a clean exit).
    pub notes: Vec<String>,
}

/// Where a line is: file and line number (1-based).
#[derive(Clone)]
struct At(PathBuf, u64);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.0.display(), self.1)
    }
}

/// Reads the public key `keygen` wrote (hex, one line).
pub fn read_pub(path: &Path) -> anyhow::Result<Vec<u8>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    unhex(text.trim())
        .filter(|k| k.len() == 32)
        .ok_or_else(|| anyhow::anyhow!("{} is not an ed25519 public key in hex", path.display()))
}

struct Walk {
    public: Option<Vec<u8>>,
    /// The hash of the last line; `None` before the first.
    prev: Option<[u8; 32]>,
    /// Lines in the current chain (since its genesis), when known.
    count: Option<u64>,
    /// The last line sealed by a checkpoint, and whether that was final.
    sealed: Option<(At, bool)>,
    /// The first line after the last checkpoint.
    unsealed_from: Option<At>,
    unsealed_n: u64,
    lines: u64,
    checkpoints: u64,
    notes: Vec<String>,
    /// Chain segments that ended without sealing (a restart after a kill).
    open_ends: Vec<String>,
}

/// Verifies `logs` in order against `public` (or, without it, against
/// the key each checkpoint names: the chain and signatures are checked,
/// not who signed).
pub fn verify(logs: &[PathBuf], public: Option<Vec<u8>>) -> anyhow::Result<Report> {
    let mut w = Walk {
        public,
        prev: None,
        count: None,
        sealed: None,
        unsealed_from: None,
        unsealed_n: 0,
        lines: 0,
        checkpoints: 0,
        notes: Vec::new(),
        open_ends: Vec::new(),
    };
    for path in logs {
        let f = std::fs::File::open(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let mut r = BufReader::new(f);
        let mut n = 0u64;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let k = r.read_until(b'\n', &mut buf)?;
            if k == 0 {
                break;
            }
            n += 1;
            let at = At(path.clone(), n);
            if buf.last() != Some(&b'\n') {
                return Ok(w.report(Verdict::Unsealed(format!(
                    "{at}: the log ends inside a line (cut)"
                ))));
            }
            buf.pop();
            if let Err(v) = w.line(&buf, at) {
                return Ok(w.report(v));
            }
        }
    }
    let verdict = w.end();
    Ok(w.report(verdict))
}

impl Walk {
    fn report(self, verdict: Verdict) -> Report {
        Report {
            verdict,
            lines: self.lines,
            checkpoints: self.checkpoints,
            notes: self.notes,
        }
    }

    fn line(&mut self, raw: &[u8], at: At) -> Result<(), Verdict> {
        let tampered = |why: String| Verdict::Tampered(format!("{at}: {why}"));
        let v: Value = serde_json::from_slice(raw)
            .map_err(|e| tampered(format!("not a JSON line ({e}): changed")))?;
        let prev = v["prev"]
            .as_str()
            .and_then(unhex)
            .filter(|p| p.len() == 32)
            .ok_or_else(|| tampered("no `prev`: not a line of a chained log".into()))?;
        let hash = sha256(raw);
        match self.prev {
            Some(expect) if prev[..] == expect[..] => {}
            _ if prev[..] == GENESIS[..] => {
                // egressd (re)started: a new chain. The one before must
                // have been sealed by its final checkpoint, or it ends
                // unsealed (a kill).
                if self.prev.is_some() {
                    match &self.sealed {
                        Some((_, true)) if self.unsealed_from.is_none() => {
                            self.notes
                                .push(format!("{at}: egressd restarted (after a clean exit)"));
                        }
                        _ => {
                            let from = self.unsealed_from.as_ref().map_or_else(
                                || "the last checkpoint".to_string(),
                                |a| a.to_string(),
                            );
                            self.open_ends.push(format!(
                                "{} lines from {from} before the restart at {at} are not sealed (egressd was killed, or lines were cut there)",
                                self.unsealed_n
                            ));
                        }
                    }
                }
                self.count = Some(0);
                self.sealed = None;
                self.unsealed_from = None;
                self.unsealed_n = 0;
            }
            None => {
                self.notes.push(format!(
                    "{at}: the log starts mid-chain (earlier files not given); verified from here"
                ));
            }
            Some(_) => {
                return Err(tampered(
                    "`prev` does not match the line before: the line before was changed, or lines were removed or reordered here".to_string(),
                ));
            }
        }
        self.prev = Some(hash);
        self.lines += 1;
        if v["event"] == "checkpoint" {
            self.checkpoint(&v, &prev, &at)?;
        } else if self.unsealed_from.is_none() {
            self.unsealed_from = Some(at);
            self.unsealed_n = 1;
        } else {
            self.unsealed_n += 1;
        }
        self.count = self.count.map(|c| c + 1);
        Ok(())
    }

    fn checkpoint(&mut self, v: &Value, prev: &[u8], at: &At) -> Result<(), Verdict> {
        let bad = |why: &str| Verdict::Tampered(format!("{at}: checkpoint {why}"));
        let lines = v["lines"]
            .as_u64()
            .ok_or_else(|| bad("has no line count"))?;
        let last = v["final"].as_bool().ok_or_else(|| bad("has no `final`"))?;
        let key = v["key"]
            .as_str()
            .and_then(unhex)
            .ok_or_else(|| bad("names no key"))?;
        let sig = v["sig"]
            .as_str()
            .and_then(unhex)
            .ok_or_else(|| bad("has no signature"))?;
        if let Some(p) = &self.public {
            if *p != key {
                return Err(bad("is signed by another key than --pub's"));
            }
        }
        let msg = signed_message(lines, &hex(prev), last);
        UnparsedPublicKey::new(&ED25519, &key)
            .verify(msg.as_bytes(), &sig)
            .map_err(|_| bad("does not verify"))?;
        match self.count {
            Some(c) if c != lines => {
                return Err(bad(&format!(
                    "counts {lines} lines before it, the log holds {c}: lines were removed or added"
                )))
            }
            None => self.count = Some(lines),
            _ => {}
        }
        self.checkpoints += 1;
        self.sealed = Some((at.clone(), last));
        self.unsealed_from = None;
        self.unsealed_n = 0;
        Ok(())
    }

    fn end(&mut self) -> Verdict {
        if self.lines == 0 {
            return Verdict::Tampered("no lines: an empty log is not a chained log".into());
        }
        let mut open = std::mem::take(&mut self.open_ends);
        if let Some(from) = &self.unsealed_from {
            let after = self.sealed.as_ref().map_or_else(
                || "its start".to_string(),
                |(a, _)| format!("the last checkpoint ({a})"),
            );
            open.push(format!(
                "{} lines from {from} are not sealed: the log ends after {after} without its final checkpoint (egressd was killed, or the log was cut)",
                self.unsealed_n
            ));
        } else if let Some((a, false)) = &self.sealed {
            open.push(format!(
                "the log ends at a checkpoint ({a}) that is not the final one: egressd was killed, or the log was cut"
            ));
        }
        if open.is_empty() {
            Verdict::Intact
        } else {
            Verdict::Unsealed(open.join("\n"))
        }
    }
}

/// `egressd log …`.
#[derive(Debug, clap::Subcommand)]
pub enum LogCommand {
    /// Make an ed25519 key for --log-key: the private key at FILE (PKCS#8,
    /// mode 0600), the public key in hex at FILE.pub.
    Keygen {
        #[arg(value_name = "FILE")]
        key: PathBuf,
    },
    /// Check chained decision logs, oldest first (rotated files in order):
    /// 0 intact, 1 changed/removed/reordered line or bad checkpoint,
    /// 3 lines not sealed by a checkpoint (a kill or a cut tail).
    Verify {
        /// The public key `keygen` wrote (FILE.pub); without it, each
        /// checkpoint is checked against the key it names.
        #[arg(long = "pub", value_name = "FILE")]
        public: Option<PathBuf>,
        #[arg(value_name = "LOG", required = true, num_args = 1..)]
        logs: Vec<PathBuf>,
    },
}

/// Runs `egressd log …`; the exit status.
pub fn main(cmd: LogCommand) -> u8 {
    match cmd {
        LogCommand::Keygen { key } => match super::chain::keygen(&key) {
            Ok(public) => {
                println!("{public}");
                eprintln!(
                    "egressd: key written to {}, public key to {}",
                    key.display(),
                    super::chain::pub_path(&key).display()
                );
                0
            }
            Err(e) => {
                eprintln!("egressd: log keygen: {e:#}");
                2
            }
        },
        LogCommand::Verify { public, logs } => {
            let public = match public.as_deref().map(read_pub).transpose() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("egressd: log verify: {e:#}");
                    return 2;
                }
            };
            let unchecked_signer = public.is_none();
            let r = match verify(&logs, public) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("egressd: log verify: {e:#}");
                    return 2;
                }
            };
            for n in &r.notes {
                println!("note: {n}");
            }
            match &r.verdict {
                Verdict::Intact => println!(
                    "intact: {} lines, {} checkpoints{}",
                    r.lines,
                    r.checkpoints,
                    if unchecked_signer {
                        " (signer not checked: give --pub)"
                    } else {
                        ""
                    }
                ),
                Verdict::Tampered(why) => println!("TAMPERED: {why}"),
                Verdict::Unsealed(why) => println!(
                    "unsealed: {why}\n(the lines before are intact: {} lines, {} checkpoints)",
                    r.lines, r.checkpoints
                ),
            }
            r.verdict.code()
        }
    }
}
