//! egressd's CA in an NSS database for the sandbox's HOME
//! (`$HOME/.pki/nssdb`, `sql:` format): Chromium (and every other NSS
//! program) ignores `SSL_CERT_FILE` and trusts only that database, so
//! without it an intercepted site fails with `ERR_CERT_AUTHORITY_INVALID`.
//!
//! The database is made on the host, before the sandbox exists, with
//! `certutil` from libnss3-tools (`-N --empty-password`, then `-A -t C,,`:
//! trusted to issue TLS server certificates, nothing else) in a private
//! scratch directory; its files are carried in the plan and written into
//! the fresh HOME, owned by CMD's uid, before CMD starts. It holds the CA
//! certificate only — never its key.
//!
//! Without certutil (or when it fails) the run goes on with a note on
//! stderr: the sandbox is not weaker for it. Programs that read the CA
//! bundle variables still trust egressd's CA, and an NSS program simply
//! refuses intercepted sites (it fails closed), so refusing to start would
//! only break runs that use no NSS program at all.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the database lies, relative to HOME.
pub const NSSDB_DIR: &str = ".pki/nssdb";
/// The files `certutil -N` makes for a `sql:` database.
const FILES: &[&str] = &["cert9.db", "key4.db", "pkcs11.txt"];
/// The CA's nickname in the database.
pub const NICKNAME: &str = "egressd";
/// Where certutil is looked for besides PATH.
const CERTUTIL_DIRS: &[&str] = &["/usr/bin", "/bin"];

/// The database's files (name, contents), or why there is none.
pub fn database(ca_cert: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let certutil = find_certutil()
        .ok_or_else(|| "certutil was not found (install libnss3-tools)".to_string())?;
    let scratch = std::env::temp_dir().join(format!("egressd-nssdb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&scratch)
            .map_err(|e| format!("cannot make {}: {e}", scratch.display()))?;
    }
    let made = make(&certutil, &scratch, ca_cert);
    let _ = std::fs::remove_dir_all(&scratch);
    made
}

fn make(certutil: &Path, dir: &Path, ca_cert: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let db = format!("sql:{}", dir.display());
    let run = |args: &[&str]| -> Result<(), String> {
        let out = Command::new(certutil)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", certutil.display()))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "certutil {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    };
    run(&["-N", "-d", &db, "--empty-password"])?;
    let ca = ca_cert.to_string_lossy();
    run(&["-A", "-d", &db, "-t", "C,,", "-n", NICKNAME, "-i", &ca])?;
    FILES
        .iter()
        .map(|f| {
            let p = dir.join(f);
            std::fs::read(&p)
                .map(|b| (f.to_string(), b))
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect()
}

fn find_certutil() -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(CERTUTIL_DIRS.iter().map(PathBuf::from))
        .filter(|d| d.is_absolute())
        .map(|d| d.join("certutil"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}
