//! A fake public package registry: PyPI, npm, crates.io and the Go module
//! proxy in one HTTPS server (h2 and HTTP/1.1) on port 443 of a loopback
//! address of its own, with a certificate for every public registry name
//! from a test CA made here. Tests resolve the public names to it with the
//! fake DNS and hand egressd the CA with `--upstream-ca`.
//!
//! Packages are published by the test ([`Registry::publish`]) with an age;
//! the artifacts are generated here and are real: wheels and sdists, npm
//! tarballs, `.crate` files and module zips that the real clients unpack,
//! with correct hashes in the index documents:
//!
//! | ecosystem | served |
//! |---|---|
//! | PyPI | `pypi.org/simple/<p>/` (a name not in PEP 503 form: `301` to it) as PEP 691 JSON or PEP 503 HTML by `Accept` (`upload-time`, `sha256`, `core-metadata`), `/pypi/<p>/json`; `files.pythonhosted.org` hash paths and the legacy `/packages/py3/<c>/<p>/` paths, `<wheel>.metadata` |
//! | npm | `registry.npmjs.org/<name>` full (with `time`) or abbreviated by `Accept`, scoped names in every encoding, `/<name>/-/<file>.tgz` |
//! | crates.io | `index.crates.io/config.json` and the prefixed sparse paths (with `pubtime`), `static.crates.io/crates/<n>/<v>/download` and `/crates/<n>/<n>-<v>.crate` |
//! | Go | `proxy.golang.org/<module>/@v/list`, `.info`, `.mod` (with `Last-Modified`), `.zip`, `@latest`, `!` case encoding |
//!
//! Every request is recorded ([`Registry::hits`]), so a test can show a
//! denied download never left egressd. Owns the far side of package
//! traffic; not egressd's view of it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use super::tls::{serve_https, server_config, test_pki_named};

/// A fake registry whose public names `dns` answers with its address
/// (a [`super::Lab`] with [`super::LabBuilder::registry`] holds one).
pub fn registry_behind(dns: &super::dns::FakeDns) -> Registry {
    let reg = try_registry().expect("a fake registry on 127.77.0.x:443");
    for h in REGISTRY_HOSTS {
        dns.set(h, &[&reg.ip()]);
    }
    reg
}

/// The public names the registry answers for.
pub const REGISTRY_HOSTS: &[&str] = &[
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "index.crates.io",
    "static.crates.io",
    "crates.io",
    "proxy.golang.org",
    "sum.golang.org",
];

/// A name the registry's certificate also carries, for a test that
/// stands one registry up as another's mirror (`settings.packages.mirrors`).
pub const MIRROR_HOST: &str = "mirror.test";

/// One day, for ages.
pub const DAY: Duration = Duration::from_secs(86_400);

/// Which registry a package lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Eco {
    Pypi,
    Npm,
    Cargo,
    Go,
}

/// One request as the registry received it.
#[derive(Clone, Debug)]
pub struct Hit {
    pub host: String,
    pub method: String,
    pub path: String,
    pub accept: Option<String>,
    pub status: u16,
    /// Every request header, as received (names lower-case).
    pub headers: Vec<(String, String)>,
}

impl Hit {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A document or file the registry serves at one (host, path).
#[derive(Clone, Debug)]
struct Doc {
    /// (content type, body); more than one: chosen by `Accept`.
    forms: Vec<(&'static str, Vec<u8>)>,
    last_modified: Option<String>,
}

/// A file of a release.
#[derive(Clone, Debug)]
struct File {
    name: String,
    bytes: Vec<u8>,
    /// A wheel's METADATA, served as `<file>.metadata`.
    metadata: Option<Vec<u8>>,
}

#[derive(Clone, Debug)]
struct Release {
    version: String,
    time: SystemTime,
    deps: Vec<(String, String)>,
    files: Vec<File>,
}

#[derive(Default)]
struct State {
    docs: BTreeMap<(String, String), Doc>,
    packages: BTreeMap<(Eco, String), Vec<Release>>,
    hits: Vec<Hit>,
    /// Documents served with a `Content-Encoding` (body already encoded):
    /// (content type, encoding, body), before `docs`.
    encoded: BTreeMap<(String, String), (&'static str, &'static str, Vec<u8>)>,
    /// `Cache-Control` sent with the document at (host, path).
    cache_control: BTreeMap<(String, String), String>,
}

/// The fake registry; see the module header.
pub struct Registry {
    pub addr: SocketAddr,
    /// The test CA that signed its certificate (PEM), for `--upstream-ca`.
    pub ca_pem: String,
    state: Arc<Mutex<State>>,
}

/// The next loopback address to try (one registry per address, so labs
/// running in parallel each have their own port 443).
static NEXT: AtomicU8 = AtomicU8::new(1);

/// A registry on port 443 of a fresh 127.77.0.x address. Port 443 needs
/// root (or CAP_NET_BIND_SERVICE): the error says when it cannot be had.
pub fn try_registry() -> io::Result<Registry> {
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            return Err(io::Error::other("no free 127.77.0.x:443"));
        }
        let at = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 77, 0, n)), 443);
        match std::net::TcpListener::bind(at) {
            Ok(l) => return Ok(serve(l)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The registry's own CA and a leaf for every name in [`REGISTRY_HOSTS`]
/// (and [`MIRROR_HOST`]).
fn serve(l: std::net::TcpListener) -> Registry {
    let pki = test_pki_named("egressd test registry CA");
    let names: Vec<&str> = REGISTRY_HOSTS
        .iter()
        .chain([&MIRROR_HOST])
        .copied()
        .collect();
    let config = server_config(pki.leaf(&names), &[b"h2", b"http/1.1"]);
    let addr = l.local_addr().unwrap();
    let state = Arc::new(Mutex::new(State::default()));
    let s2 = state.clone();
    serve_https(l, config, 2, move |req| handle(req, s2.clone()));
    Registry {
        addr,
        ca_pem: pki.ca_pem,
        state,
    }
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let host = req
        .uri()
        .host()
        .map(str::to_string)
        .or_else(|| {
            req.headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| h.split(':').next().unwrap_or(h).to_string())
        })
        .unwrap_or_default()
        .to_ascii_lowercase();
    let path = req.uri().path().to_string();
    let method = req.method().to_string();
    let header = |n: http::header::HeaderName| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let accept = header(http::header::ACCEPT);
    let inm = header(http::header::IF_NONE_MATCH);
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let _ = req.into_body().collect().await;
    let mut st = state.lock().unwrap();
    let encoded = st.encoded.get(&(host.clone(), path.clone())).cloned();
    let resp = match encoded {
        Some((ctype, encoding, body)) => Response::builder()
            .header("content-type", ctype)
            .header("content-encoding", encoding)
            .body(Full::new(Bytes::from(body)))
            .unwrap(),
        None => answer(
            &st,
            &host,
            &path,
            &method,
            accept.as_deref(),
            inm.as_deref(),
        ),
    };
    st.hits.push(Hit {
        host,
        method,
        path,
        accept,
        status: resp.status().as_u16(),
        headers,
    });
    Ok(resp)
}

/// The ETag of a body (a CRC is plenty for a test's documents).
fn etag_of(body: &[u8]) -> String {
    format!("\"{:08x}-{}\"", crc32fast::hash(body), body.len())
}

fn answer(
    st: &State,
    host: &str,
    path: &str,
    method: &str,
    accept: Option<&str>,
    if_none_match: Option<&str>,
) -> Response<Full<Bytes>> {
    let not_found = |what: &str| {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from(format!("not found: {what}\n"))))
            .unwrap()
    };
    if method != "GET" && method != "HEAD" {
        return Response::builder()
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    // Percent-decoded: npm's `@s%2fn` is `@s/n`, Go's `%21` is `!`.
    let key_path = percent_decode(path);
    // pypi.org sends a name that is not in PEP 503 form to the one that is.
    if let Some(name) = (host == "pypi.org")
        .then(|| key_path.strip_prefix("/simple/")?.strip_suffix('/'))
        .flatten()
        .filter(|n| !n.contains('/') && pep503(n) != *n)
    {
        return Response::builder()
            .status(StatusCode::MOVED_PERMANENTLY)
            .header("location", format!("/simple/{}/", pep503(name)))
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    let at = (host.to_string(), key_path);
    let Some(doc) = st.docs.get(&at) else {
        return not_found(&format!("{host}{path}"));
    };
    let (ctype, body) = pick_form(doc, accept);
    let etag = etag_of(body);
    let mut b = Response::builder()
        .header("content-type", ctype)
        .header("etag", &etag)
        .header("vary", "Accept");
    if let Some(cc) = st.cache_control.get(&at) {
        b = b.header("cache-control", cc);
    }
    if let Some(lm) = &doc.last_modified {
        b = b.header("last-modified", lm);
    }
    if if_none_match.is_some_and(|v| v.split(',').any(|t| t.trim() == etag)) {
        return b
            .status(StatusCode::NOT_MODIFIED)
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    let body = if method == "HEAD" {
        Bytes::new()
    } else {
        Bytes::from(body.to_vec())
    };
    b.body(Full::new(body)).unwrap()
}

/// The form of `doc` that `accept` asks for: the first listed type it
/// names, else the last form (PyPI's HTML, npm's full document).
fn pick_form<'a>(doc: &'a Doc, accept: Option<&str>) -> (&'static str, &'a [u8]) {
    let accept = accept.unwrap_or("").to_ascii_lowercase();
    let wanted = doc
        .forms
        .iter()
        .find(|(t, _)| accept.contains(t))
        .or(doc.forms.last())
        .unwrap();
    (wanted.0, &wanted.1)
}

/// `path` with every `%XX` decoded (so `/@s%2fn`, `/%40s%2Fn` and `/@s/n`
/// are one npm document, and Go's `%21` is `!`).
fn percent_decode(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(v) if b[i] == b'%' => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Registry {
    /// Every request so far, in order.
    pub fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }
    /// Requests whose path contains `part`.
    pub fn hits_for(&self, part: &str) -> Vec<Hit> {
        self.hits()
            .into_iter()
            .filter(|h| h.path.contains(part))
            .collect()
    }
    /// The address as the fake DNS answers it.
    pub fn ip(&self) -> String {
        self.addr.ip().to_string()
    }

    /// Publishes `name` `version` to `eco`'s registry as `age` old, with
    /// dependencies (name, requirement in the ecosystem's syntax), and
    /// regenerates that package's documents.
    pub fn publish(
        &self,
        eco: Eco,
        name: &str,
        version: &str,
        age: Duration,
        deps: &[(&str, &str)],
    ) {
        let time = SystemTime::now() - age;
        let deps: Vec<(String, String)> = deps
            .iter()
            .map(|(n, r)| (n.to_string(), r.to_string()))
            .collect();
        let files = match eco {
            Eco::Pypi => pypi_files(name, version, &deps),
            Eco::Npm => vec![npm_tarball(name, version, &deps)],
            Eco::Cargo => vec![crate_file(name, version, &deps)],
            Eco::Go => vec![go_zip(name, version, &deps)],
        };
        let mut st = self.state.lock().unwrap();
        let releases = st.packages.entry((eco, name.to_string())).or_default();
        releases.retain(|r| r.version != version);
        releases.push(Release {
            version: version.to_string(),
            time,
            deps,
            files,
        });
        let releases = releases.clone();
        let docs = match eco {
            Eco::Pypi => pypi_docs(name, &releases),
            Eco::Npm => npm_docs(name, &releases),
            Eco::Cargo => cargo_docs(name, &releases),
            Eco::Go => go_docs(name, &releases),
        };
        if eco == Eco::Cargo {
            st.docs.insert(
                ("index.crates.io".into(), "/config.json".into()),
                doc(
                    "application/json",
                    br#"{"dl":"https://static.crates.io/crates","api":"https://crates.io"}"#
                        .to_vec(),
                ),
            );
        }
        for (k, d) in docs {
            st.docs.insert(k, d);
        }
    }

    /// Publishes each (name, version, age) without dependencies.
    pub fn publish_all(&self, eco: Eco, releases: &[(&str, &str, Duration)]) {
        for (n, v, age) in releases {
            self.publish(eco, n, v, *age, &[]);
        }
    }

    /// The sha256 (hex) of a published file, by file name.
    pub fn sha256_of(&self, eco: Eco, name: &str, file: &str) -> String {
        // Looked up under the lock, asserted after it (a panic holding it
        // would poison the registry for every other test).
        let bytes = {
            let st = self.state.lock().unwrap();
            st.packages.get(&(eco, name.to_string())).and_then(|rs| {
                rs.iter()
                    .flat_map(|r| &r.files)
                    .find(|f| f.name == file)
                    .map(|f| f.bytes.clone())
            })
        };
        let bytes = bytes.unwrap_or_else(|| panic!("no file {file} of {name} (as published)"));
        hex(&sha256(&bytes))
    }

    /// The URL of a published PyPI file (hash layout).
    pub fn pypi_url(&self, name: &str, file: &str) -> String {
        let h = self.sha256_of(Eco::Pypi, name, file);
        format!("https://files.pythonhosted.org{}", pypi_hash_path(&h, file))
    }

    /// Replaces the document at (host, path) with `body` (a garbled index,
    /// say), served as `content_type` whatever the `Accept`.
    pub fn put_raw(&self, host: &str, path: &str, content_type: &'static str, body: Vec<u8>) {
        self.state
            .lock()
            .unwrap()
            .docs
            .insert((host.into(), path.into()), doc(content_type, body));
    }
}

impl Registry {
    /// Sends `Cache-Control: value` with the document at (host, path), as
    /// the public registries send `max-age` with their index documents.
    pub fn set_cache_control(&self, host: &str, path: &str, value: &str) {
        self.state
            .lock()
            .unwrap()
            .cache_control
            .insert((host.into(), path.into()), value.into());
    }

    /// Serves `body` at (host, path) as already encoded with `encoding`
    /// (`gzip`), whatever the request asks for.
    pub fn put_encoded(
        &self,
        host: &str,
        path: &str,
        content_type: &'static str,
        encoding: &'static str,
        body: Vec<u8>,
    ) {
        self.state
            .lock()
            .unwrap()
            .encoded
            .insert((host.into(), path.into()), (content_type, encoding, body));
    }

    /// The document (the first form `accept` names, as served) at
    /// (host, path), if any.
    pub fn doc_body(&self, host: &str, path: &str, accept: Option<&str>) -> Option<Vec<u8>> {
        let st = self.state.lock().unwrap();
        let d = st.docs.get(&(host.to_string(), path.to_string()))?;
        Some(pick_form(d, accept).1.to_vec())
    }
}

fn doc(ctype: &'static str, body: Vec<u8>) -> Doc {
    Doc {
        forms: vec![(ctype, body)],
        last_modified: None,
    }
}

// ---------------------------------------------------------------- hashes, encodings, times

fn sha256(b: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .to_vec()
}

fn sha512(b: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA512, b)
        .as_ref()
        .to_vec()
}

fn sha1(b: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, b)
        .as_ref()
        .to_vec()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// RFC 4648 base64; `url` picks the URL-safe alphabet without padding (a
/// wheel's RECORD).
fn base64(b: &[u8], url: bool) -> String {
    let abc: &[u8; 64] = if url {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(abc[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else if !url {
                out.push('=');
            }
        }
    }
    out
}

/// (year, month, day, hour, minute, second, weekday 0 = Thursday 1970-01-01).
fn civil(t: SystemTime) -> (i64, u32, u32, u64, u64, u64, u64) {
    let secs = t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        (days as u64) % 7,
    )
}

/// `2026-12-02T12:00:00.000000Z`, as PyPI writes `upload-time`.
pub fn rfc3339(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, _) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.000000Z")
}

/// `2026-12-02T12:00:00Z`, as npm, crates.io and Go write times.
fn rfc3339_short(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, _) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// An IMF-fixdate (`Last-Modified`).
fn http_date(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, wd) = civil(t);
    let day = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][wd as usize];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][mo as usize - 1];
    format!("{day}, {d:02} {mon} {y} {h:02}:{mi:02}:{s:02} GMT")
}

// ---------------------------------------------------------------- archives

/// A POSIX ustar archive of (path, contents), regular files mode 0644.
pub fn tar(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, data) in files {
        let mut h = [0u8; 512];
        let p = path.as_bytes();
        assert!(p.len() <= 100, "tar path too long: {path}");
        h[..p.len()].copy_from_slice(p);
        // (offset, value): mode, uid, gid, size, mtime, type, magic, version.
        let size = format!("{:011o}\0", data.len());
        let mtime = format!("{:011o}\0", 1_600_000_000u64);
        for (at, v) in [
            (100, "0000644\0"),
            (108, "0000000\0"),
            (116, "0000000\0"),
            (124, size.as_str()),
            (136, mtime.as_str()),
            (156, "0"),
            (257, "ustar\0"),
            (263, "00"),
        ] {
            h[at..at + v.len()].copy_from_slice(v.as_bytes());
        }
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

pub fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// A zip archive of (path, contents), stored (no compression).
pub fn zip(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    // 1980-01-01 00:00 in DOS time.
    let (dos_time, dos_date) = (0u16, 0x21u16);
    for (path, data) in files {
        let crc = crc32fast::hash(data);
        let offset = out.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&0u16.to_le_bytes()); // stored
            v.extend_from_slice(&dos_time.to_le_bytes());
            v.extend_from_slice(&dos_date.to_le_bytes());
            v.extend_from_slice(&crc.to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(path.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(path.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // version made by
        common(&mut central);
        central.extend_from_slice(&0u16.to_le_bytes()); // comment
        central.extend_from_slice(&0u16.to_le_bytes()); // disk
        central.extend_from_slice(&0u16.to_le_bytes()); // internal attrs
        central.extend_from_slice(&0u32.to_le_bytes()); // external attrs
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(path.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(files.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

// ---------------------------------------------------------------- PyPI

/// PEP 503 normalised name.
pub fn pep503(name: &str) -> String {
    let mut out = String::new();
    let mut sep = false;
    for c in name.chars() {
        if c == '-' || c == '_' || c == '.' {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The wheel and sdist file name of a release.
pub fn wheel_name(name: &str, version: &str) -> String {
    format!(
        "{}-{version}-py3-none-any.whl",
        pep503(name).replace('-', "_")
    )
}
pub fn sdist_name(name: &str, version: &str) -> String {
    format!("{}-{version}.tar.gz", pep503(name).replace('-', "_"))
}

fn pypi_hash_path(sha_hex: &str, file: &str) -> String {
    format!(
        "/packages/{}/{}/{}/{file}",
        &sha_hex[..2],
        &sha_hex[2..4],
        &sha_hex[4..]
    )
}

fn pypi_legacy_path(name: &str, file: &str) -> String {
    let n = pep503(name);
    format!("/packages/py3/{}/{n}/{file}", &n[..1])
}

fn pypi_files(name: &str, version: &str, deps: &[(String, String)]) -> Vec<File> {
    let dist = pep503(name).replace('-', "_");
    let module = dist.clone();
    let mut metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    for (d, req) in deps {
        metadata.push_str(&format!("Requires-Dist: {d}{req}\n"));
    }
    let info = format!("{dist}-{version}.dist-info");
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            format!("{module}/__init__.py"),
            format!("__version__ = {version:?}\n").into_bytes(),
        ),
        (format!("{info}/METADATA"), metadata.clone().into_bytes()),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: egressd-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_vec(),
        ),
    ];
    let mut record = String::new();
    for (p, b) in &files {
        record.push_str(&format!(
            "{p},sha256={},{}\n",
            base64(&sha256(b), true),
            b.len()
        ));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    files.push((format!("{info}/RECORD"), record.into_bytes()));
    let wheel = File {
        name: wheel_name(name, version),
        bytes: zip(&files),
        metadata: Some(metadata.clone().into_bytes()),
    };
    let base = format!("{dist}-{version}");
    let pkg_info = metadata.clone();
    let sdist = File {
        name: sdist_name(name, version),
        bytes: gzip(&tar(&[
            (format!("{base}/PKG-INFO"), pkg_info.into_bytes()),
            (
                format!("{base}/pyproject.toml"),
                format!("[project]\nname = {name:?}\nversion = {version:?}\n").into_bytes(),
            ),
            (
                format!("{base}/{module}/__init__.py"),
                format!("__version__ = {version:?}\n").into_bytes(),
            ),
        ])),
        metadata: None,
    };
    vec![wheel, sdist]
}

fn pypi_docs(name: &str, releases: &[Release]) -> Vec<((String, String), Doc)> {
    let n = pep503(name);
    let mut out = Vec::new();
    let mut jfiles = Vec::new();
    let mut html = format!(
        "<!DOCTYPE html>\n<html>\n  <head>\n    <meta name=\"pypi:repository-version\" content=\"1.1\">\n    <title>Links for {n}</title>\n  </head>\n  <body>\n    <h1>Links for {n}</h1>\n"
    );
    let mut releases_json = Map::new();
    for r in releases {
        let mut rel_files = Vec::new();
        for f in &r.files {
            let sha = hex(&sha256(&f.bytes));
            let path = pypi_hash_path(&sha, &f.name);
            let url = format!("https://files.pythonhosted.org{path}");
            let mut j = json!({
                "filename": f.name,
                "url": url,
                "hashes": {"sha256": sha},
                "requires-python": null,
                "size": f.bytes.len(),
                "upload-time": rfc3339(r.time),
                "yanked": false,
            });
            let mut meta_attr = String::new();
            if let Some(m) = &f.metadata {
                let msha = hex(&sha256(m));
                j["core-metadata"] = json!({"sha256": msha});
                j["data-dist-info-metadata"] = json!({"sha256": msha});
                meta_attr = format!(
                    " data-dist-info-metadata=\"sha256={msha}\" data-core-metadata=\"sha256={msha}\""
                );
                for p in [path.clone(), pypi_legacy_path(name, &f.name)] {
                    out.push((
                        ("files.pythonhosted.org".into(), format!("{p}.metadata")),
                        doc("binary/octet-stream", m.clone()),
                    ));
                }
            }
            html.push_str(&format!(
                "    <a href=\"{url}#sha256={sha}\"{meta_attr}>{}</a><br />\n",
                f.name
            ));
            jfiles.push(j);
            rel_files.push(json!({
                "filename": f.name,
                "url": url,
                "digests": {"sha256": sha},
                "packagetype": if f.name.ends_with(".whl") { "bdist_wheel" } else { "sdist" },
                "size": f.bytes.len(),
                "upload_time_iso_8601": rfc3339(r.time),
                "yanked": false,
            }));
            for p in [path, pypi_legacy_path(name, &f.name)] {
                out.push((
                    ("files.pythonhosted.org".into(), p),
                    doc("binary/octet-stream", f.bytes.clone()),
                ));
            }
        }
        releases_json.insert(r.version.clone(), Value::Array(rel_files.clone()));
        out.push((
            ("pypi.org".into(), format!("/pypi/{n}/{}/json", r.version)),
            doc(
                "application/json",
                serde_json::to_vec(&json!({
                    "info": {"name": name, "version": r.version},
                    "urls": rel_files,
                }))
                .unwrap(),
            ),
        ));
    }
    html.push_str("  </body>\n</html>\n");
    let versions: Vec<&str> = releases.iter().map(|r| r.version.as_str()).collect();
    let simple_json = json!({
        "meta": {"api-version": "1.1"},
        "name": n,
        "versions": versions,
        "files": jfiles,
    });
    let last = releases.last().unwrap();
    let legacy = json!({
        "info": {"name": name, "version": last.version},
        "releases": releases_json,
        "urls": releases_json[&last.version],
    });
    out.push((
        ("pypi.org".into(), format!("/simple/{n}/")),
        Doc {
            forms: vec![
                (
                    "application/vnd.pypi.simple.v1+json",
                    serde_json::to_vec(&simple_json).unwrap(),
                ),
                ("text/html", html.into_bytes()),
            ],
            last_modified: None,
        },
    ));
    out.push((
        ("pypi.org".into(), format!("/pypi/{n}/json")),
        doc("application/json", serde_json::to_vec(&legacy).unwrap()),
    ));
    out
}

// ---------------------------------------------------------------- npm

/// The tarball file name: `name-1.0.0.tgz`, the scope left off.
fn npm_file(name: &str, version: &str) -> String {
    let base = name.rsplit('/').next().unwrap();
    format!("{base}-{version}.tgz")
}

fn npm_tarball(name: &str, version: &str, deps: &[(String, String)]) -> File {
    let deps: Map<String, Value> = deps
        .iter()
        .map(|(n, r)| (n.clone(), Value::String(r.clone())))
        .collect();
    let manifest = json!({
        "name": name,
        "version": version,
        "main": "index.js",
        "dependencies": deps,
    });
    File {
        name: npm_file(name, version),
        bytes: gzip(&tar(&[
            (
                "package/package.json".into(),
                serde_json::to_vec_pretty(&manifest).unwrap(),
            ),
            (
                "package/index.js".into(),
                format!("module.exports = {version:?};\n").into_bytes(),
            ),
        ])),
        metadata: None,
    }
}

fn npm_docs(name: &str, releases: &[Release]) -> Vec<((String, String), Doc)> {
    let mut out = Vec::new();
    let mut full_versions = Map::new();
    let mut abbr_versions = Map::new();
    let mut time = Map::new();
    time.insert(
        "created".into(),
        json!(rfc3339(releases.iter().map(|r| r.time).min().unwrap())),
    );
    let modified = rfc3339(releases.iter().map(|r| r.time).max().unwrap());
    time.insert("modified".into(), json!(modified));
    for r in releases {
        let f = &r.files[0];
        let tarball = format!("https://registry.npmjs.org/{name}/-/{}", f.name);
        let dist = json!({
            "shasum": hex(&sha1(&f.bytes)),
            "integrity": format!("sha512-{}", base64(&sha512(&f.bytes), false)),
            "tarball": tarball,
        });
        let deps: Map<String, Value> = r
            .deps
            .iter()
            .map(|(n, q)| (n.clone(), Value::String(q.clone())))
            .collect();
        full_versions.insert(
            r.version.clone(),
            json!({
                "name": name,
                "version": r.version,
                "main": "index.js",
                "description": format!("{name} for the egressd lab"),
                "dependencies": deps,
                "_id": format!("{name}@{}", r.version),
                "dist": dist,
            }),
        );
        abbr_versions.insert(
            r.version.clone(),
            json!({"name": name, "version": r.version, "dependencies": deps, "dist": dist}),
        );
        time.insert(r.version.clone(), json!(rfc3339(r.time)));
        out.push((
            ("registry.npmjs.org".into(), format!("/{name}/-/{}", f.name)),
            doc("application/octet-stream", f.bytes.clone()),
        ));
        out.push((
            (
                "registry.npmjs.org".into(),
                format!("/{name}/{}", r.version),
            ),
            doc(
                "application/json",
                serde_json::to_vec(&full_versions[&r.version]).unwrap(),
            ),
        ));
    }
    let latest = &releases.last().unwrap().version;
    let full = json!({
        "_id": name,
        "name": name,
        "dist-tags": {"latest": latest},
        "versions": full_versions,
        "time": time,
    });
    let abbr = json!({
        "name": name,
        "dist-tags": {"latest": latest},
        "modified": modified,
        "versions": abbr_versions,
    });
    out.push((
        ("registry.npmjs.org".into(), format!("/{name}")),
        Doc {
            forms: vec![
                (
                    "application/vnd.npm.install-v1+json",
                    serde_json::to_vec(&abbr).unwrap(),
                ),
                ("application/json", serde_json::to_vec(&full).unwrap()),
            ],
            last_modified: None,
        },
    ));
    out
}

// ---------------------------------------------------------------- crates.io

/// The sparse index path of a crate (`/1/a`, `/2/ab`, `/3/a/abc`, `/ab/cd/abcd…`).
pub fn cargo_index_path(name: &str) -> String {
    let n = name.to_ascii_lowercase();
    match n.len() {
        1 => format!("/1/{n}"),
        2 => format!("/2/{n}"),
        3 => format!("/3/{}/{n}", &n[..1]),
        _ => format!("/{}/{}/{n}", &n[..2], &n[2..4]),
    }
}

fn crate_file(name: &str, version: &str, deps: &[(String, String)]) -> File {
    let base = format!("{name}-{version}");
    let mut toml = format!(
        "[package]\nname = {name:?}\nversion = {version:?}\nedition = \"2021\"\n\n[dependencies]\n"
    );
    for (d, req) in deps {
        toml.push_str(&format!("{d} = {req:?}\n"));
    }
    File {
        name: format!("{base}.crate"),
        bytes: gzip(&tar(&[
            (format!("{base}/Cargo.toml"), toml.into_bytes()),
            (
                format!("{base}/src/lib.rs"),
                format!("pub const VERSION: &str = {version:?};\n").into_bytes(),
            ),
        ])),
        metadata: None,
    }
}

fn cargo_docs(name: &str, releases: &[Release]) -> Vec<((String, String), Doc)> {
    let mut out = Vec::new();
    let mut lines = String::new();
    for r in releases {
        let f = &r.files[0];
        let deps: Vec<Value> = r
            .deps
            .iter()
            .map(|(n, q)| {
                json!({"name": n, "req": q, "features": [], "optional": false,
                       "default_features": true, "target": null, "kind": "normal"})
            })
            .collect();
        let line = json!({
            "name": name,
            "vers": r.version,
            "deps": deps,
            "cksum": hex(&sha256(&f.bytes)),
            "features": {},
            "yanked": false,
            "pubtime": rfc3339_short(r.time),
        });
        lines.push_str(&serde_json::to_string(&line).unwrap());
        lines.push('\n');
        for p in [
            format!("/crates/{name}/{}/download", r.version),
            format!("/crates/{name}/{}", f.name),
        ] {
            out.push((
                ("static.crates.io".into(), p),
                doc("application/gzip", f.bytes.clone()),
            ));
        }
    }
    out.push((
        ("index.crates.io".into(), cargo_index_path(name)),
        doc("text/plain", lines.into_bytes()),
    ));
    out
}

// ---------------------------------------------------------------- Go

/// Go's `!` case encoding of a module path or version.
pub fn go_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_uppercase() {
            out.push('!');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn go_mod(module: &str, deps: &[(String, String)]) -> String {
    let mut m = format!("module {module}\n\ngo 1.19\n");
    for (d, v) in deps {
        m.push_str(&format!("\nrequire {d} {v}\n"));
    }
    m
}

fn go_zip(module: &str, version: &str, deps: &[(String, String)]) -> File {
    let pkg = module.rsplit('/').next().unwrap().replace(['-', '.'], "_");
    let prefix = format!("{module}@{version}");
    File {
        name: format!("{version}.zip"),
        bytes: zip(&[
            (
                format!("{prefix}/go.mod"),
                go_mod(module, deps).into_bytes(),
            ),
            (
                format!("{prefix}/lib.go"),
                format!("package {pkg}\n\nconst Version = {version:?}\n").into_bytes(),
            ),
        ]),
        metadata: None,
    }
}

fn go_docs(module: &str, releases: &[Release]) -> Vec<((String, String), Doc)> {
    let base = format!("/{}/@v", go_escape(module));
    let mut out = Vec::new();
    let mut list = String::new();
    for r in releases {
        let v = go_escape(&r.version);
        list.push_str(&r.version);
        list.push('\n');
        let info =
            serde_json::to_vec(&json!({"Version": r.version, "Time": rfc3339_short(r.time)}))
                .unwrap();
        let lm = Some(http_date(r.time));
        out.push((
            ("proxy.golang.org".into(), format!("{base}/{v}.info")),
            Doc {
                forms: vec![("application/json", info.clone())],
                last_modified: lm.clone(),
            },
        ));
        out.push((
            ("proxy.golang.org".into(), format!("{base}/{v}.mod")),
            Doc {
                forms: vec![(
                    "text/plain; charset=UTF-8",
                    go_mod(module, &r.deps).into_bytes(),
                )],
                last_modified: lm.clone(),
            },
        ));
        out.push((
            ("proxy.golang.org".into(), format!("{base}/{v}.zip")),
            Doc {
                forms: vec![("application/zip", r.files[0].bytes.clone())],
                last_modified: lm,
            },
        ));
    }
    let last = releases.last().unwrap();
    out.push((
        ("proxy.golang.org".into(), format!("{base}/list")),
        doc("text/plain; charset=UTF-8", list.into_bytes()),
    ));
    out.push((
        (
            "proxy.golang.org".into(),
            format!("/{}/@latest", go_escape(module)),
        ),
        doc(
            "application/json",
            serde_json::to_vec(&json!({"Version": last.version, "Time": rfc3339_short(last.time)}))
                .unwrap(),
        ),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_and_dates() {
        assert_eq!(base64(b"foobar", false), "Zm9vYmFy");
        assert_eq!(base64(b"fooba", false), "Zm9vYmE=");
        assert_eq!(base64(b"foob", true), "Zm9vYg");
        assert_eq!(pep503("Foo.Bar__baz"), "foo-bar-baz");
        assert_eq!(cargo_index_path("serde"), "/se/rd/serde");
        assert_eq!(cargo_index_path("abc"), "/3/a/abc");
        assert_eq!(go_escape("github.com/Azure/x"), "github.com/!azure/x");
        let t = UNIX_EPOCH + Duration::from_secs(1_764_676_800); // 2025-12-02T12:00:00Z
        assert_eq!(rfc3339_short(t), "2025-12-02T12:00:00Z");
        assert_eq!(http_date(t), "Tue, 02 Dec 2025 12:00:00 GMT");
    }
}
