//! The interception CA: `egressd ca init` makes it, `serve --ca-dir` loads
//! it, and [`CertAuthority::mint`] signs one short-lived leaf per
//! destination.
//!
//! Files in the CA directory: `ca.pem` (the certificate sandboxes trust) and
//! `ca.key` (PKCS#8, created with mode 0600 and never readable by a sandbox).
//! Both are ECDSA P-256: fast to sign with and accepted by every client
//! that matters.
//!
//! The CA's subject is derived from its key (`egressd interception CA
//! <first 6 bytes of SHA-256 of the public key>`), so loading needs no
//! X.509 parser: the issuer is rebuilt from `ca.key`, and a leaf minted at
//! load is verified against `ca.pem` to prove the two belong together.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use ring::rand::SecureRandom;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};

use super::TlsError;
use crate::policy::host::Target;
use crate::time::{days_from_civil, unix_now};

pub const CA_CERT_FILE: &str = "ca.pem";
pub const CA_KEY_FILE: &str = "ca.key";
/// How long a CA made by `ca init` is valid unless `--days` says otherwise:
/// long enough not to be a chore, short enough that a copied key ages out.
pub const DEFAULT_CA_DAYS: u32 = 365;
/// A loaded CA closer to its end than this gets a warning at start-up.
pub const CA_EXPIRY_WARNING: Duration = Duration::from_secs(30 * 86400);
/// How long a minted leaf is valid. Leaves are cheap to make again; a short
/// life means a leaked one is useless by tomorrow.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(86400);
/// Leaves start this far in the past, for clients whose clocks run behind.
pub const LEAF_BACKDATE: Duration = Duration::from_secs(3600);
/// Host used by the load-time check that `ca.pem` and `ca.key` agree.
const SELF_CHECK_NAME: &str = "egressd-self-check.invalid";

/// Options of `egressd ca init`.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub dir: PathBuf,
    pub days: u32,
    /// Replace an existing CA (its leaves stop being trusted).
    pub force: bool,
}

/// What `ca init` wrote.
#[derive(Debug)]
pub struct Initialised {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub subject: String,
}

/// Creates a new CA in `opts.dir`: key first (0600, via a temporary file
/// renamed into place), then the certificate.
pub fn init_ca(opts: &InitOptions) -> Result<Initialised, TlsError> {
    let dir = &opts.dir;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(TlsError::io(dir))?;
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    if !opts.force {
        for p in [&key_path, &cert_path] {
            if p.exists() {
                return Err(TlsError::Exists(p.clone()));
            }
        }
    }
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = issuer_params(&key);
    let now = unix_now();
    set_validity(
        &mut params,
        now - LEAF_BACKDATE.as_secs() as i64,
        now + i64::from(opts.days.max(1)) * 86400,
    );
    params.serial_number = Some(random_serial()?);
    let cert = params.self_signed(&key)?;
    write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
    Ok(Initialised {
        cert: cert_path,
        key: key_path,
        subject: subject_cn(&key),
    })
}

/// Writes `bytes` to a fresh temporary file created with `mode` (never
/// wider, whatever the umask), then renames it over `path`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let tmp = path.with_extension("tmp~");
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(TlsError::io(&tmp))?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(TlsError::io(&tmp))?;
    f.write_all(bytes).map_err(TlsError::io(&tmp))?;
    f.sync_all().map_err(TlsError::io(&tmp))?;
    fs::rename(&tmp, path).map_err(TlsError::io(path))
}

fn subject_cn(key: &KeyPair) -> String {
    let fp = ring::digest::digest(&ring::digest::SHA256, key.public_key_raw());
    let hex: String = fp.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("egressd interception CA {hex}")
}

/// The CA's parameters, rebuilt from its key alone (see the module doc).
fn issuer_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, subject_cn(key));
    dn.push(DnType::OrganizationName, "egressd");
    params.distinguished_name = dn;
    // pathlen 0: this CA signs leaves, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// Sets a certificate's validity from Unix seconds (rcgen takes the `time`
/// crate's type, which egressd does not otherwise name).
fn set_validity(params: &mut CertificateParams, not_before: i64, not_after: i64) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + Duration::from_secs(not_before.max(0) as u64);
    params.not_after = epoch + Duration::from_secs(not_after.max(0) as u64);
}

fn random_serial() -> Result<SerialNumber, TlsError> {
    // 127 random bits, positive and without a leading zero byte: unique
    // without coordination, and unguessable (CA/B Forum asks for ≥ 64).
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| TlsError::Rcgen(rcgen::Error::RingUnspecified))?;
    b[0] = (b[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&b))
}

/// A leaf certificate and its key.
pub struct Minted {
    pub cert: CertificateDer<'static>,
    pub key: PrivateKeyDer<'static>,
    /// Unix seconds.
    pub not_after: i64,
}

/// A loaded CA that can sign leaves.
pub struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    /// Unix seconds, from `ca.pem`.
    pub not_after: i64,
    pub cert_path: PathBuf,
    pub subject: String,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority")
            .field("subject", &self.subject)
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

impl CertAuthority {
    /// Loads `ca.pem` and `ca.key` from `dir` and proves they belong
    /// together. Warnings (a key readable by others, a CA about to expire)
    /// are returned for the caller to print.
    pub fn load(dir: &Path) -> Result<(CertAuthority, Vec<String>), TlsError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let mut warnings = Vec::new();
        let meta = fs::metadata(&key_path).map_err(TlsError::io(&key_path))?;
        if meta.permissions().mode() & 0o077 != 0 {
            warnings.push(format!(
                "{} is readable by group or others (mode {:o}); chmod 600 it",
                key_path.display(),
                meta.permissions().mode() & 0o777
            ));
        }
        let key_pem = fs::read_to_string(&key_path).map_err(TlsError::io(&key_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| TlsError::BadCa {
            path: key_path.clone(),
            msg: format!("not a usable private key: {e}"),
        })?;
        let cert = CertificateDer::from_pem_file(&cert_path).map_err(|e| TlsError::Pem {
            path: cert_path.clone(),
            msg: e.to_string(),
        })?;
        let (_, not_after) = validity(&cert).ok_or_else(|| TlsError::BadCa {
            path: cert_path.clone(),
            msg: "cannot read the certificate's validity".into(),
        })?;
        let now = unix_now();
        if not_after <= now {
            return Err(TlsError::BadCa {
                path: cert_path,
                msg: "the CA has expired; make a new one with `egressd ca init --force`".into(),
            });
        }
        if not_after - now < CA_EXPIRY_WARNING.as_secs() as i64 {
            warnings.push(format!(
                "{} expires in {} days; make a new one with `egressd ca init --force` and redistribute it",
                cert_path.display(),
                (not_after - now) / 86400
            ));
        }
        let subject = subject_cn(&key);
        let ca = CertAuthority {
            issuer: Issuer::new(issuer_params(&key), key),
            cert,
            not_after,
            cert_path,
            subject,
        };
        ca.self_check()?;
        Ok((ca, warnings))
    }

    /// The CA certificate.
    pub fn cert(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// Mints a leaf for `target`: a DNS or IP subject alternative name,
    /// serverAuth only, a random serial, valid from an hour ago for
    /// [`LEAF_VALIDITY`] (never past the CA's own end).
    pub fn mint(&self, target: &Target) -> Result<Minted, TlsError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        let name = match target {
            Target::Name(h) => h.as_str().to_string(),
            Target::Ip(ip) => ip.to_string(),
        };
        if name.len() <= 64 {
            dn.push(DnType::CommonName, name.clone());
        }
        params.distinguished_name = dn;
        params.subject_alt_names = vec![match target {
            Target::Name(h) => SanType::DnsName(h.as_str().try_into()?),
            Target::Ip(ip) => SanType::IpAddress(*ip),
        }];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        let now = unix_now();
        let not_after = (now + LEAF_VALIDITY.as_secs() as i64).min(self.not_after);
        set_validity(&mut params, now - LEAF_BACKDATE.as_secs() as i64, not_after);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Minted {
            cert: cert.der().clone(),
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            not_after,
        })
    }

    /// Verifies a freshly minted leaf against `ca.pem` alone, as a client
    /// would: catches a certificate and key from different CAs, or a
    /// `ca.pem` that `ca init` did not make.
    fn self_check(&self) -> Result<(), TlsError> {
        let bad = |msg: String| TlsError::BadCa {
            path: self.cert_path.clone(),
            msg,
        };
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.cert.clone())
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            super::provider(),
        )
        .build()
        .map_err(|e| bad(e.to_string()))?;
        let name = crate::policy::host::parse_target(SELF_CHECK_NAME).expect("valid name");
        let leaf = self.mint(&name)?;
        let server = ServerName::try_from(SELF_CHECK_NAME).expect("valid name");
        verifier
            .verify_server_cert(&leaf.cert, &[], &server, &[], UnixTime::now())
            .map_err(|e| {
                bad(format!(
                    "a leaf signed with {CA_KEY_FILE} does not verify against it ({e}): \
                     the two files are not one CA made by `egressd ca init`"
                ))
            })?;
        Ok(())
    }
}

/// notBefore and notAfter of a DER certificate, as Unix seconds. A few
/// lines of DER walking instead of an X.509 parser dependency.
pub fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (0x30, cert, _) = tlv(der)? else {
        return None;
    };
    let (0x30, tbs, _) = tlv(cert)? else {
        return None;
    };
    let (tag, _, mut rest) = tlv(tbs)?;
    if tag == 0xa0 {
        rest = tlv(rest)?.2; // [0] version, then the serial
    }
    rest = tlv(rest)?.2; // signature algorithm
    rest = tlv(rest)?.2; // issuer
    let (0x30, val, _) = tlv(rest)? else {
        return None;
    };
    let (t1, nb, r) = tlv(val)?;
    let (t2, na, _) = tlv(r)?;
    Some((asn1_time(t1, nb)?, asn1_time(t2, na)?))
}

/// One DER tag-length-value: (tag, contents, the bytes after it).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let l0 = *b.get(1)?;
    let (len, hdr) = if l0 < 0x80 {
        (l0 as usize, 2)
    } else {
        let n = (l0 & 0x7f) as usize;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = len << 8 | *b.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    (end <= b.len()).then(|| (tag, &b[hdr..end], &b[end..]))
}

/// UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn asn1_time(tag: u8, s: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(s).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 => {
            let yy: i64 = s.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, s.get(2..)?)
        }
        0x18 => (s.get(..4)?.parse().ok()?, s.get(4..)?),
        _ => return None,
    };
    if rest.len() != 10 || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |i: usize| -> u32 { rest[i..i + 2].parse().unwrap_or(0) };
    let days = days_from_civil(year, n(0), n(2));
    Some(days * 86400 + i64::from(n(4)) * 3600 + i64::from(n(6)) * 60 + i64::from(n(8)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::host::parse_target;

    fn fresh() -> (tempfile::TempDir, CertAuthority) {
        let dir = tempfile::tempdir().unwrap();
        let opts = InitOptions {
            dir: dir.path().join("certs"),
            days: 20,
            force: false,
        };
        init_ca(&opts).unwrap();
        let (ca, warnings) = CertAuthority::load(&opts.dir).unwrap();
        assert_eq!(warnings.len(), 1, "20 days is inside the warning window");
        (dir, ca)
    }

    #[test]
    fn init_writes_a_private_key_and_refuses_to_overwrite() {
        let (dir, ca) = fresh();
        let certs = dir.path().join("certs");
        let mode = fs::metadata(certs.join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let err = init_ca(&InitOptions {
            dir: certs.clone(),
            days: 30,
            force: false,
        })
        .unwrap_err();
        assert!(matches!(err, TlsError::Exists(_)), "{err}");
        let now = unix_now();
        assert!((ca.not_after - (now + 20 * 86400)).abs() < 5);
        // --force makes another CA; the old certificate no longer matches
        // a key from elsewhere.
        let old_cert = fs::read(certs.join(CA_CERT_FILE)).unwrap();
        init_ca(&InitOptions {
            dir: certs.clone(),
            days: 30,
            force: true,
        })
        .unwrap();
        fs::write(certs.join(CA_CERT_FILE), old_cert).unwrap();
        let err = CertAuthority::load(&certs).unwrap_err();
        assert!(err.to_string().contains("not one CA"), "{err}");
    }

    #[test]
    fn leaves_have_unique_serials_and_short_lives() {
        let (_dir, ca) = fresh();
        let t = parse_target("api.test").unwrap();
        let a = ca.mint(&t).unwrap();
        let b = ca.mint(&t).unwrap();
        assert_ne!(serial(&a.cert), serial(&b.cert));
        let (nb, na) = validity(&a.cert).unwrap();
        assert_eq!(na - nb, (LEAF_VALIDITY + LEAF_BACKDATE).as_secs() as i64);
        assert_eq!(na, a.not_after);
        let ip = ca.mint(&parse_target("127.0.0.1").unwrap()).unwrap();
        assert!(!ip.cert.is_empty());
    }

    fn serial(der: &[u8]) -> Vec<u8> {
        let (_, cert, _) = tlv(der).unwrap();
        let (_, tbs, _) = tlv(cert).unwrap();
        let (_, _, rest) = tlv(tbs).unwrap(); // version
        tlv(rest).unwrap().1.to_vec()
    }

    #[test]
    fn asn1_times() {
        assert_eq!(asn1_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(
            asn1_time(0x18, b"20270301120000Z"),
            Some(1_803_859_200 + 43200)
        );
        assert_eq!(asn1_time(0x17, b"7001010000Z"), None);
        assert_eq!(asn1_time(0x19, b"700101000000Z"), None);
    }
}
