//! TLS for interception: the local CA (`ca init`, loading, minting one leaf
//! per destination), the cache of minted leaves, and the trust stores —
//! the roots egressd verifies origins against, and the bundle a sandbox is
//! given so that its clients trust egressd's leaves.
//!
//! This module owns key material and certificates. It does not own the
//! intercepted connection itself (that is `proxy::mitm`), nor any decision.
//! rustls runs on the `ring` provider only.

pub mod ca;
pub mod leaf;
pub mod lru;
pub mod roots;

use std::path::PathBuf;
use std::sync::Arc;

pub use ca::{init_ca, CertAuthority, InitOptions};
pub use leaf::LeafCache;
pub use roots::{ca_cert_path, sandbox_ca_bundle, upstream_roots, SANDBOX_BUNDLE_FILE};

/// The one crypto provider every rustls config in egressd is built from.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What can go wrong with keys, certificates and trust stores. These are
/// operator errors (a missing or unreadable file, a CA that does not match
/// its key), reported at start-up or by `ca init`.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} already exists (pass --force to replace the CA)")]
    Exists(PathBuf),
    #[error("{path}: {msg}")]
    Pem { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    BadCa { path: PathBuf, msg: String },
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("no trusted roots: no system bundle found ({}) and no --upstream-ca", roots::SYSTEM_BUNDLES.join(", "))]
    NoRoots,
}

impl TlsError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TlsError {
        let path = path.into();
        move |source| TlsError::Io { path, source }
    }
}
