//! Trust stores. Origins are verified against the system's CA bundle plus
//! `--upstream-ca` (there is no switch to accept any certificate).
//! Sandboxes get one bundle — the system roots plus egressd's CA — so that
//! every client inside trusts egressd's leaves and still the public roots.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::ca::CA_CERT_FILE;
use super::TlsError;

/// System CA bundles, first found wins: Debian/Ubuntu/Alpine, Fedora/RHEL,
/// openSUSE, and the macOS/BSD/Alpine `cert.pem`.
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The bundle [`sandbox_ca_bundle`] writes, in the CA directory.
pub const SANDBOX_BUNDLE_FILE: &str = "sandbox-bundle.pem";

/// Environment variables that point common clients at a CA *bundle* (the
/// system roots plus egressd's CA): OpenSSL-based tools and Python (`SSL_CERT_FILE`),
/// requests, curl, pip, git, cargo, the AWS SDKs and CLI, npm.
pub const BUNDLE_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "AWS_CA_BUNDLE",
    "npm_config_cafile",
];
/// Node.js adds the certificates in this file to its built-in roots, so it
/// points at egressd's CA alone.
pub const CA_ONLY_ENV: &[&str] = &["NODE_EXTRA_CA_CERTS"];

/// The first system CA bundle that exists.
pub fn system_bundle() -> Option<PathBuf> {
    SYSTEM_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Every certificate in a PEM file; a file with none is an error.
pub fn load_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |msg: String| TlsError::Pem {
        path: path.to_path_buf(),
        msg,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| match e {
            rustls_pki_types::pem::Error::Io(source) => TlsError::Io {
                path: path.to_path_buf(),
                source,
            },
            e => pem_err(e.to_string()),
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err("no CERTIFICATE in the file".into()));
    }
    Ok(certs)
}

/// The roots egressd verifies origins against: the system bundle (if one
/// exists; certificates webpki cannot use are skipped, as every client
/// does) plus every certificate in `extra` (each must be usable).
pub fn upstream_roots(extra: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    if let Some(sys) = system_bundle() {
        if let Ok(certs) = load_pem_certs(&sys) {
            roots.add_parsable_certificates(certs);
        }
    }
    if let Some(path) = extra {
        for c in load_pem_certs(path)? {
            roots.add(c).map_err(|e| TlsError::Pem {
                path: path.to_path_buf(),
                msg: format!("not a usable CA certificate: {e}"),
            })?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots);
    }
    Ok(roots)
}

/// A client config for origins, offering `alpn`.
pub fn client_config(
    roots: Arc<RootCertStore>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut c = ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(c))
}

/// Where `ca init` put the CA certificate in `ca_dir` (for
/// `NODE_EXTRA_CA_CERTS` and for distributing by hand).
pub fn ca_cert_path(ca_dir: &Path) -> PathBuf {
    ca_dir.join(CA_CERT_FILE)
}

/// Writes `ca_dir/sandbox-bundle.pem` — the system CA bundle followed by
/// egressd's CA certificate — and returns its path. For the launcher: point
/// the variables in [`BUNDLE_ENV`] at it, [`CA_ONLY_ENV`] at
/// [`ca_cert_path`], and bind it read-only over the distribution's bundle
/// path inside the sandbox. Rewritten atomically on every call (mode 0644),
/// so a renewed CA or updated system roots are picked up by the next
/// sandbox. Without a system bundle it holds egressd's CA alone, which is
/// enough for intercepted hosts but not for tunnelled ones.
pub fn sandbox_ca_bundle(ca_dir: &Path) -> Result<PathBuf, TlsError> {
    let ca_path = ca_cert_path(ca_dir);
    // Parsed only to refuse a file without a certificate; copied verbatim.
    load_pem_certs(&ca_path)?;
    let ca_pem = fs::read(&ca_path).map_err(TlsError::io(&ca_path))?;
    let mut out = Vec::new();
    if let Some(sys) = system_bundle() {
        out = fs::read(&sys).map_err(TlsError::io(&sys))?;
        if !out.ends_with(b"\n") && !out.is_empty() {
            out.push(b'\n');
        }
    }
    out.extend_from_slice(b"# egressd interception CA\n");
    out.extend_from_slice(&ca_pem);
    let path = ca_dir.join(SANDBOX_BUNDLE_FILE);
    // A name of its own per writer: launchers starting at once must not
    // rename each other's half-written file into place.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = ca_dir.join(format!(
        ".{SANDBOX_BUNDLE_FILE}.{}.{nanos}.tmp",
        std::process::id()
    ));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(TlsError::io(&tmp))?;
    f.write_all(&out).map_err(TlsError::io(&tmp))?;
    f.set_permissions(fs::Permissions::from_mode(0o644))
        .map_err(TlsError::io(&tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        TlsError::Io {
            path: path.clone(),
            source: e,
        }
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ca::{init_ca, InitOptions};

    #[test]
    fn sandbox_bundle_ends_with_egressds_ca() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(&InitOptions {
            dir: dir.path().to_path_buf(),
            days: 365,
            force: false,
        })
        .unwrap();
        let path = sandbox_ca_bundle(dir.path()).unwrap();
        let certs = load_pem_certs(&path).unwrap();
        let ca = load_pem_certs(&ca_cert_path(dir.path())).unwrap();
        assert_eq!(certs.last(), ca.first());
        if let Some(sys) = system_bundle() {
            assert_eq!(certs.len(), load_pem_certs(&sys).unwrap().len() + 1);
        }
    }

    #[test]
    fn an_empty_extra_ca_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("empty.pem");
        fs::write(&f, "nothing here\n").unwrap();
        assert!(upstream_roots(Some(&f)).is_err());
    }
}
