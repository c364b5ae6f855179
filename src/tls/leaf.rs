//! Minted leaves, cached per destination as ready rustls server configs, so
//! that a second connection to the same host costs a handshake and not a
//! key generation. Bounded ([`LEAF_CACHE_CAPACITY`], least recently used
//! out) and renewed well before a leaf expires.
//!
//! Each config keeps its own TLS session cache ([`SESSIONS_PER_LEAF`]), so
//! a returning client resumes (TLS 1.3 tickets naming a cached session, or
//! a TLS 1.2 session id) instead of a full handshake, and a session made in
//! a tunnel to one destination is unknown to every other destination's
//! config: it never resumes there, even between address literals, whose
//! ClientHello carries no name to tell them apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ServerConfig;

use super::ca::CertAuthority;
use super::lru::Lru;
use super::TlsError;
use crate::policy::host::Target;
use crate::time::unix_now;

/// Destinations whose leaf is kept. One entry is a few KiB.
pub const LEAF_CACHE_CAPACITY: usize = 1024;
/// A cached leaf is replaced once it is this old (half its life), so a
/// client never receives one about to expire.
pub const LEAF_REUSE: Duration = Duration::from_secs(12 * 3600);

/// Sessions one destination's config remembers for resumption (rustls's
/// default, made explicit: resumption is relied on, and tested).
pub const SESSIONS_PER_LEAF: usize = 256;

/// ALPN protocols offered to clients inside an intercepted tunnel.
pub const SERVER_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

struct Entry {
    config: Arc<ServerConfig>,
    renew_at: i64,
}

pub struct LeafCache {
    ca: CertAuthority,
    cache: Mutex<Lru<Target, Entry>>,
    minted: AtomicU64,
}

impl LeafCache {
    pub fn new(ca: CertAuthority) -> LeafCache {
        LeafCache {
            ca,
            cache: Mutex::new(Lru::new(LEAF_CACHE_CAPACITY)),
            minted: AtomicU64::new(0),
        }
    }

    pub fn ca(&self) -> &CertAuthority {
        &self.ca
    }

    /// How many leaves have been minted (cache misses).
    pub fn minted(&self) -> u64 {
        self.minted.load(Ordering::Relaxed)
    }

    /// The server config presenting a leaf for `target`, followed by the CA
    /// certificate (so a client that holds the CA only as a trust anchor by
    /// name, or logs the chain, sees where the leaf comes from): cached, or
    /// minted now. Minting happens outside the lock; two first connections racing
    /// may both mint, and the later one is kept.
    pub fn server_config(&self, target: &Target) -> Result<Arc<ServerConfig>, TlsError> {
        let now = unix_now();
        {
            let mut c = self.cache.lock().expect("leaf cache lock");
            if let Some(e) = c.get(target) {
                if e.renew_at > now {
                    return Ok(e.config.clone());
                }
            }
        }
        let leaf = self.ca.mint(target)?;
        self.minted.fetch_add(1, Ordering::Relaxed);
        let mut config = ServerConfig::builder_with_provider(super::provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.cert, self.ca.cert().clone()], leaf.key)?;
        config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSIONS_PER_LEAF);
        let config = Arc::new(config);
        let renew_at = (now + LEAF_REUSE.as_secs() as i64).min(leaf.not_after - 3600);
        self.cache.lock().expect("leaf cache lock").insert(
            target.clone(),
            Entry {
                config: config.clone(),
                renew_at,
            },
        );
        Ok(config)
    }
}
