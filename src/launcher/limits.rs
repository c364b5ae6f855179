//! Resource bounds for the sandboxed command: parsing of `--memory`,
//! `--file-size`, `--timeout` at the CLI edge, and the rlimits applied to
//! CMD just before it is executed — `--file-size` always, `--memory`,
//! `--cpu` and `--pids` only where no cgroup bounds the whole sandbox
//! (`cgroup`). Owns nothing else: the wall-clock `--timeout` and the
//! cgroup's `--cpu` are enforced by the launcher (it kills the whole PID
//! namespace), not by an rlimit.

use std::io;
use std::time::Duration;

/// The bounds asked for, and, through [`Limits::apply`], the rlimits CMD
/// (and everything it starts) runs under where no cgroup covers them.
/// `None`: not bounded (inherited).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// `--memory`: bytes for the whole sandbox (cgroup); as an rlimit,
    /// RLIMIT_AS, bytes of address space per process.
    pub memory: Option<u64>,
    /// `--cpu`: seconds of CPU time for the whole sandbox (cgroup); as an
    /// rlimit, RLIMIT_CPU per process (SIGXCPU, then SIGKILL).
    pub cpu_secs: Option<u64>,
    /// `--pids`: processes (and threads) CMD and its descendants may have
    /// (cgroup); as an rlimit, RLIMIT_NPROC, which Linux 5.14+ counts per
    /// user namespace: the sandbox's uid's processes. CMD is never host
    /// root, whom the kernel would exempt.
    pub pids: Option<u64>,
    /// `--file-size`: RLIMIT_FSIZE, bytes per file written.
    pub file_size: Option<u64>,
}

impl Limits {
    /// Sets each bound as both soft and hard limit, so CMD cannot raise it.
    /// For CPU the hard limit is one second above the soft one: the soft
    /// limit sends SIGXCPU (which a program may catch to clean up), the hard
    /// one SIGKILL.
    pub fn apply(&self) -> io::Result<()> {
        let set = |res, soft: u64, hard: u64, what: &str| -> io::Result<()> {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: setrlimit reads one plain struct we own.
            if unsafe { libc::setrlimit(res, &lim) } != 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
            }
            Ok(())
        };
        if let Some(b) = self.memory {
            set(libc::RLIMIT_AS, b, b, "--memory (RLIMIT_AS)")?;
        }
        if let Some(s) = self.cpu_secs {
            set(
                libc::RLIMIT_CPU,
                s,
                s.saturating_add(1),
                "--cpu (RLIMIT_CPU)",
            )?;
        }
        if let Some(n) = self.pids {
            set(libc::RLIMIT_NPROC, n, n, "--pids (RLIMIT_NPROC)")?;
        }
        if let Some(b) = self.file_size {
            set(libc::RLIMIT_FSIZE, b, b, "--file-size (RLIMIT_FSIZE)")?;
        }
        Ok(())
    }
}

/// `1048576`, `512K`, `256M`, `2G`, `1T`, also `256MiB`/`256MB`: multiples
/// are binary (1K = 1024) whichever spelling is used.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 512M, 2G, 1048576)"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "{s:?}: unknown size unit {unit:?} (use K, M, G or T)"
            ))
        }
    };
    let v = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if v == 0 {
        return Err(format!("{s:?}: a size of 0 would stop CMD from running"));
    }
    Ok(v)
}

/// `90` (seconds), `1500ms`, `30s`, `5m`, `2h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30s, 5m, 1500ms)"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if d.is_zero() {
        return Err(format!("{s:?}: a zero timeout would kill CMD at once"));
    }
    Ok(d)
}

/// A positive count (`--cpu`, `--pids`).
pub fn parse_count(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err(format!("{s:?}: must be at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("512K"), Ok(512 << 10));
        assert_eq!(parse_bytes("256m"), Ok(256 << 20));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1T"), Ok(1 << 40));
        for bad in ["", "M", "12X", "-1", "1.5G", "0", "99999999999T"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in ["", "s", "0", "0s", "5d", "1.5s", "-3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("64"), Ok(64));
        assert!(parse_count("0").is_err());
        assert!(parse_count("x").is_err());
    }
}
