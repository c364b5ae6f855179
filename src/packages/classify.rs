//! What a registry request asks for: [`classify`] turns (ecosystem, host,
//! method, path, Accept) into a [`Classified`]: a package reference (name,
//! version, and whether it is an index document, an artifact or per-version
//! metadata), a registry resource that names no package (`config.json`,
//! the sumdb's tiles), `NotRegistry` for hosts the gate does not own, or
//! `Unparseable` for anything on a registry host it cannot read — which is
//! denied (`package_unparseable`): a gate that let unknown paths through
//! would be a gate with a side door.
//!
//! Paths handled (all GET/HEAD; any other method, a query string, a dot
//! segment or an empty segment is unparseable):
//!
//! | host | path | kind |
//! |---|---|---|
//! | pypi.org | `/simple/` | registry (project list) |
//! | | `/simple/<p>/` | index, JSON or HTML by Accept (PEP 691) |
//! | | `/pypi/<p>/json`, `/pypi/<p>/<v>/json` | index; version metadata |
//! | files.pythonhosted.org | `/packages/<h2>/<h2>/<h60>/<file>` | artifact (wheel, sdist), `<file>.metadata` (PEP 658) |
//! | | `/packages/<pyver>/<c>/<name>/<file>` | the same (legacy layout) |
//! | registry.npmjs.org, registry.yarnpkg.com | `/<name>`, `/@s/n`, `/@s%2fn`, `/%40s%2Fn` | packument, full or abbreviated by Accept |
//! | | `/<name>/<version>` | version manifest |
//! | | `/<name>/-/<name>-<v>.tgz`, `/@s/n/-/n-<v>.tgz` | tarball |
//! | | `/-/ping` | registry |
//! | index.crates.io | `/config.json` | registry |
//! | | `/1/<n>`, `/2/<n>`, `/3/<c>/<n>`, `/<ab>/<cd>/<n>` | sparse index file |
//! | static.crates.io | `/crates/<n>/<n>-<v>.crate`, `/crates/<n>/<v>/download` | `.crate` |
//! | crates.io | `/api/v1/crates/<n>/<v>/download` | `.crate` |
//! | proxy.golang.org | `/<module>/@v/list`, `/<module>/@latest` | index |
//! | | `/<module>/@v/<v>.info`, `.mod` | metadata |
//! | | `/<module>/@v/<v>.zip` | artifact |
//! | | `/sumdb/sum.golang.org/<sum path>` | as on sum.golang.org |
//! | sum.golang.org | `/lookup/<module>@<v>` | per-version metadata |
//! | | `/latest`, `/tile/…` | registry |
//!
//! Publishing is told apart from the unreadable (DESIGN "Writes on allowed
//! hosts"): npm `PUT`/`DELETE` on a registry path (`npm publish`,
//! `unpublish`, `deprecate`, `dist-tag`), a `POST` to PyPI's upload
//! endpoint (`upload.pypi.org`, or `/legacy/` on an index host), and
//! `cargo publish` (`PUT /api/v1/crates/new`) and `yank`/`unyank`/`owner`
//! on the crates.io API are [`Classified::Publish`]: denied
//! `package_publish` unless the exception names them.
//!
//! Go module paths and versions are in Go's `!` case encoding; npm scopes in
//! any of their encodings; PyPI and cargo names in any spelling their
//! normalisation folds. Owns: URL shapes and filename parsing. Does not own:
//! whether the package is approved (`decide`).

use std::fmt;

use super::name::{go_unescape, normalize, split_npm_scope, PackageName};
use super::Ecosystem;

/// Longest request path the classifier reads (registry paths are short;
/// a longer one is not a registry request).
pub const MAX_PATH_LEN: usize = 4096;

/// An index document's form, which decides how it is filtered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexForm {
    /// `/simple/<p>/` as `application/vnd.pypi.simple.v1+json` (PEP 691).
    PypiSimpleJson,
    /// `/simple/<p>/` as HTML (PEP 503).
    PypiSimpleHtml,
    /// `/pypi/<p>/json`.
    PypiJson,
    /// A packument as `application/json`.
    NpmFull,
    /// A packument as `application/vnd.npm.install-v1+json`.
    NpmAbbreviated,
    /// A sparse index file (one JSON line per version).
    CargoSparse,
    /// `@v/list`.
    GoList,
    /// `@latest`.
    GoLatest,
}

impl IndexForm {
    pub fn ecosystem(self) -> Ecosystem {
        match self {
            IndexForm::PypiSimpleJson | IndexForm::PypiSimpleHtml | IndexForm::PypiJson => {
                Ecosystem::Pypi
            }
            IndexForm::NpmFull | IndexForm::NpmAbbreviated => Ecosystem::Npm,
            IndexForm::CargoSparse => Ecosystem::Cargo,
            IndexForm::GoList | IndexForm::GoLatest => Ecosystem::Go,
        }
    }

    /// The form a response's `Content-Type` says it is, for the document a
    /// request for `requested` returned (a registry may answer HTML to a
    /// JSON request, or full to an abbreviated one): the filter follows
    /// what came back, not what was asked. `None`: a content type this
    /// index cannot be (unfilterable).
    pub fn from_content_type(
        requested: IndexForm,
        content_type: Option<&str>,
    ) -> Option<IndexForm> {
        let ct = content_type
            .map(|c| {
                c.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .unwrap_or_default();
        match requested {
            IndexForm::PypiSimpleJson | IndexForm::PypiSimpleHtml => match ct.as_str() {
                "application/vnd.pypi.simple.v1+json"
                | "application/vnd.pypi.simple.latest+json" => Some(IndexForm::PypiSimpleJson),
                "application/vnd.pypi.simple.v1+html"
                | "application/vnd.pypi.simple.latest+html"
                | "text/html"
                | "" => Some(IndexForm::PypiSimpleHtml),
                _ => None,
            },
            IndexForm::NpmFull | IndexForm::NpmAbbreviated => match ct.as_str() {
                "application/vnd.npm.install-v1+json" => Some(IndexForm::NpmAbbreviated),
                "application/json" | "" => Some(IndexForm::NpmFull),
                _ => None,
            },
            IndexForm::PypiJson => {
                matches!(ct.as_str(), "application/json" | "").then_some(requested)
            }
            // Sparse index files, @v/list and @latest come as text/plain,
            // application/json or octet-stream depending on the server:
            // their shape is checked by the filter instead.
            IndexForm::CargoSparse | IndexForm::GoList | IndexForm::GoLatest => Some(requested),
        }
    }
}

/// Metadata about one version (or, for Go's `.info`/`.mod`, of a module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKind {
    /// `/pypi/<p>/<v>/json`.
    PypiVersionJson,
    /// `/<name>/<version>` on the npm registry.
    NpmVersion,
    /// `@v/<v>.info`.
    GoInfo,
    /// `@v/<v>.mod`.
    GoMod,
    /// `sum.golang.org/lookup/<module>@<v>`.
    GoSumLookup,
}

impl MetaKind {
    /// Whether the version itself must be allowed (as for a download), or
    /// only the name. Go's `.mod` and `.info` are read for every version in
    /// the module graph, also for versions minimal version selection then
    /// passes over, and they carry no code: the name decides. Their times
    /// are what the gate learns publish dates from.
    pub fn version_scoped(self) -> bool {
        !matches!(self, MetaKind::GoInfo | MetaKind::GoMod)
    }
}

/// A file download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The file's name as the index lists it (`requests-2.32.3-py3-none-any.whl`,
    /// `lodash-4.17.21.tgz`, `v1.2.3.zip`; for cargo with the crate's
    /// normal name, `serde_json-1.0.0.crate`).
    pub filename: String,
    /// PyPI's `<file>.metadata` (PEP 658): authorised as its file.
    pub metadata: bool,
    /// Where the request asks for it (`host/path` as
    /// [`crate::packages::view::request_at`] spells it): a file the index
    /// lists at a place is downloaded from that place only. `None`: by
    /// name (the caller did not say where, or the path is an alias the
    /// registry itself maps to the listed one).
    pub at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Index(IndexForm),
    Artifact(Artifact),
    Meta(MetaKind),
}

/// A request for something of one package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRef {
    pub ecosystem: Ecosystem,
    pub name: PackageName,
    /// As the registry spells it (Go: decoded from `!`); `None` for an index.
    pub version: Option<String>,
    pub kind: Kind,
}

/// A registry request that names no package.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegistryResource {
    /// PyPI `/simple/`: the list of every project name.
    PypiSimpleRoot,
    /// `index.crates.io/config.json`: where cargo downloads from.
    CargoConfig,
    /// npm `/-/ping`.
    NpmPing,
    /// sum.golang.org `/latest`: the signed tree head.
    GoSumLatest,
    /// sum.golang.org `/tile/…`: hashes of the transparency log.
    GoSumTile,
    /// `proxy.golang.org/sumdb/sum.golang.org/supported`.
    GoSumdbSupported,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// Not a host of an ecosystem the caller named or the gate knows.
    NotRegistry,
    Registry(Ecosystem, RegistryResource),
    Package(PackageRef),
    /// A write to the registry (a publish and its kin): denied
    /// `package_publish` unless an exception names it. `what` says which.
    Publish {
        ecosystem: Ecosystem,
        what: &'static str,
    },
    /// A registry host, a path the gate cannot read: deny.
    Unparseable {
        ecosystem: Ecosystem,
        why: String,
    },
}

/// The role a host plays in its ecosystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    PypiIndex,
    PypiFiles,
    /// `upload.pypi.org`: uploads only.
    PypiUpload,
    Npm,
    CargoIndex,
    CargoStatic,
    CargoApi,
    GoProxy,
    GoSum,
}

/// The public registries' hosts, by ecosystem: with an ecosystem in
/// `settings.packages.enforce`, every request to these needs interception.
pub const REGISTRY_HOSTS: &[(&str, Ecosystem)] = &[
    ("pypi.org", Ecosystem::Pypi),
    ("files.pythonhosted.org", Ecosystem::Pypi),
    ("upload.pypi.org", Ecosystem::Pypi),
    ("registry.npmjs.org", Ecosystem::Npm),
    ("registry.yarnpkg.com", Ecosystem::Npm),
    ("index.crates.io", Ecosystem::Cargo),
    ("static.crates.io", Ecosystem::Cargo),
    ("crates.io", Ecosystem::Cargo),
    ("proxy.golang.org", Ecosystem::Go),
    ("sum.golang.org", Ecosystem::Go),
];

/// The ecosystem whose public registry `host` is, if any.
pub fn registry_ecosystem(host: &str) -> Option<Ecosystem> {
    let h = host.trim_end_matches('.');
    REGISTRY_HOSTS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(h))
        .map(|(_, e)| *e)
}

fn known_role(host: &str) -> Option<Role> {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    Some(match h.as_str() {
        "pypi.org" => Role::PypiIndex,
        "files.pythonhosted.org" => Role::PypiFiles,
        "upload.pypi.org" => Role::PypiUpload,
        "registry.npmjs.org" | "registry.yarnpkg.com" => Role::Npm,
        "index.crates.io" => Role::CargoIndex,
        "static.crates.io" => Role::CargoStatic,
        "crates.io" => Role::CargoApi,
        "proxy.golang.org" => Role::GoProxy,
        "sum.golang.org" => Role::GoSum,
        _ => return None,
    })
}

/// For a host the caller says serves `eco` (a private registry), the role
/// its path shows.
fn role_by_path(eco: Ecosystem, segs: &[&str]) -> Role {
    let first = segs.first().copied().unwrap_or("");
    match eco {
        Ecosystem::Pypi if first == "packages" => Role::PypiFiles,
        Ecosystem::Pypi => Role::PypiIndex,
        Ecosystem::Npm => Role::Npm,
        Ecosystem::Cargo if first == "crates" => Role::CargoStatic,
        Ecosystem::Cargo if first == "api" => Role::CargoApi,
        Ecosystem::Cargo => Role::CargoIndex,
        Ecosystem::Go if matches!(first, "lookup" | "tile" | "latest") => Role::GoSum,
        Ecosystem::Go => Role::GoProxy,
    }
}

fn role_ecosystem(r: Role) -> Ecosystem {
    match r {
        Role::PypiIndex | Role::PypiFiles | Role::PypiUpload => Ecosystem::Pypi,
        Role::Npm => Ecosystem::Npm,
        Role::CargoIndex | Role::CargoStatic | Role::CargoApi => Ecosystem::Cargo,
        Role::GoProxy | Role::GoSum => Ecosystem::Go,
    }
}

/// Why a path was not readable (becomes `Unparseable`).
struct Why(String);

impl<T: fmt::Display> From<T> for Why {
    fn from(t: T) -> Why {
        Why(t.to_string())
    }
}

type R<T> = Result<T, Why>;

fn why<T>(s: impl Into<String>) -> R<T> {
    Err(Why(s.into()))
}

/// Classifies one registry request. `ecosystem`: the caller's knowledge
/// that `host` serves that ecosystem (a private registry); `None` uses the
/// public registries' hosts. `path` is the request target's path as sent
/// (percent-encoded, with any query); `accept` the `Accept` header.
pub fn classify(
    ecosystem: Option<Ecosystem>,
    host: &str,
    method: &str,
    path: &str,
    accept: Option<&str>,
) -> Classified {
    let known = known_role(host);
    let eco = match (ecosystem, known) {
        (Some(e), _) => e,
        (None, Some(r)) => role_ecosystem(r),
        (None, None) => return Classified::NotRegistry,
    };
    classified(eco, classify_inner(eco, known, method, path, accept, false))
}

/// [`classify`] for a registry served by a mirror
/// (`settings.packages.mirrors`), whose file paths follow the mirror's
/// layout (Artifactory's `/packages/packages/<h2>/…`, Nexus's
/// `/packages/<name>/<version>/<file>`, devpi's `/+f/…`), not the public
/// file host's: a PyPI path that is no index path is read as a file by its
/// last segment (a wheel or sdist name, or its `.metadata`). The path
/// rules of [`classify`] (no dot or empty segments in any encoding, no
/// query) hold all the same, and such a file is authorised only where the
/// filtered index lists it ([`Artifact::at`]).
pub fn classify_mirrored(
    ecosystem: Ecosystem,
    host: &str,
    method: &str,
    path: &str,
    accept: Option<&str>,
) -> Classified {
    let known = known_role(host);
    classified(
        ecosystem,
        classify_inner(ecosystem, known, method, path, accept, true),
    )
}

fn classified(eco: Ecosystem, r: R<Classified>) -> Classified {
    match r {
        Ok(c) => c,
        Err(Why(why)) => Classified::Unparseable {
            ecosystem: eco,
            why,
        },
    }
}

fn classify_inner(
    eco: Ecosystem,
    known: Option<Role>,
    method: &str,
    path: &str,
    accept: Option<&str>,
    mirrored: bool,
) -> R<Classified> {
    if let Some(what) = publish(eco, known, method, path) {
        return Ok(Classified::Publish {
            ecosystem: eco,
            what,
        });
    }
    if !(method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD")) {
        return why(format!(
            "{method} is not a registry read (only GET and HEAD are)"
        ));
    }
    if path.len() > MAX_PATH_LEN {
        return why("path too long");
    }
    if path.contains(['?', '#']) {
        return why("a query string is not part of any registry read");
    }
    let Some(rest) = path.strip_prefix('/') else {
        return why("path does not start with /");
    };
    let segs: Vec<&str> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split('/').collect()
    };
    // A trailing slash is one empty last segment (`/simple/requests/`);
    // any other empty segment, and dot segments in any encoding, are
    // refused: no registry path has them, and a proxy or server that
    // collapses them would read a different path than the gate did.
    let (segs, trailing) = match segs.split_last() {
        Some((&"", head)) => (head, true),
        _ => (&segs[..], false),
    };
    for s in segs {
        let lower = s.to_ascii_lowercase();
        if s.is_empty()
            || matches!(
                lower.as_str(),
                "." | ".." | "%2e" | "%2e%2e" | ".%2e" | "%2e."
            )
        {
            return why("empty or dot segment in path");
        }
    }
    let role = known
        .filter(|r| role_ecosystem(*r) == eco)
        .unwrap_or_else(|| role_by_path(eco, segs));
    match role {
        Role::PypiIndex | Role::PypiFiles if mirrored => {
            let strict = match role {
                Role::PypiIndex => pypi_index(segs, trailing, accept),
                _ => pypi_files(segs, trailing),
            };
            strict.or_else(|e| pypi_mirror_file(segs, trailing).map_err(|_| e))
        }
        Role::PypiIndex => pypi_index(segs, trailing, accept),
        Role::PypiFiles => pypi_files(segs, trailing),
        Role::PypiUpload => why("upload.pypi.org takes uploads only"),
        Role::Npm => npm(segs, trailing, accept),
        Role::CargoIndex => cargo_index(segs, trailing),
        Role::CargoStatic => cargo_static(segs, trailing),
        Role::CargoApi => cargo_api(segs, trailing),
        Role::GoProxy => go_proxy(segs, trailing),
        Role::GoSum => go_sum(segs, trailing),
    }
}

/// What kind of publish `method` on `path` is, if it is one. Judged on
/// the path's shape only (before any other check): a write is refused as
/// a publish whether or not the rest of its path would read.
fn publish(eco: Ecosystem, known: Option<Role>, method: &str, path: &str) -> Option<&'static str> {
    let m = method.to_ascii_uppercase();
    if matches!(m.as_str(), "GET" | "HEAD") {
        return None;
    }
    let p = path.split(['?', '#']).next().unwrap_or("");
    let segs: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
    let role = known
        .filter(|r| role_ecosystem(*r) == eco)
        .unwrap_or_else(|| role_by_path(eco, &segs));
    let lower: Vec<String> = segs.iter().map(|s| s.to_ascii_lowercase()).collect();
    let lower: Vec<&str> = lower.iter().map(String::as_str).collect();
    match (role, m.as_str(), lower.as_slice()) {
        (Role::Npm, "PUT", [s, ..]) if *s != "-" || lower.get(1) == Some(&"package") => {
            Some("npm publish (a PUT on the registry)")
        }
        (Role::Npm, "DELETE", [s, ..]) if *s != "-" || lower.get(1) == Some(&"package") => {
            Some("npm unpublish (a DELETE on the registry)")
        }
        (Role::PypiUpload, "POST", _) => Some("a PyPI upload (a POST to the upload endpoint)"),
        (Role::PypiIndex, "POST", ["legacy"]) => {
            Some("a PyPI upload (a POST to the legacy upload endpoint)")
        }
        (Role::CargoApi, "PUT", ["api", "v1", "crates", "new"]) => {
            Some("cargo publish (PUT /api/v1/crates/new)")
        }
        (Role::CargoApi, "PUT" | "DELETE", ["api", "v1", "crates", _, _, "yank" | "unyank"]) => {
            Some("cargo yank (a write to the crates API)")
        }
        (Role::CargoApi, "PUT" | "DELETE", ["api", "v1", "crates", _, "owners"]) => {
            Some("cargo owner (a write to the crates API)")
        }
        _ => None,
    }
}

/// Percent-decodes one path segment. `None` for a bad escape, non-UTF-8,
/// or a decoded `/`, `\`, control character or NUL: a segment that
/// decodes into more than one segment is a path-confusion attempt.
fn decode(seg: &str) -> Option<String> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    if s.is_empty()
        || s == "."
        || s == ".."
        || s.chars().any(|c| c == '/' || c == '\\' || c.is_control())
    {
        return None;
    }
    Some(s)
}

fn dec(seg: &str) -> R<String> {
    decode(seg).ok_or_else(|| {
        Why(format!(
            "segment {seg:?} does not decode to one path segment"
        ))
    })
}

fn pkg(eco: Ecosystem, name: &str) -> R<PackageName> {
    normalize(eco, name).map_err(|e| Why(e.0))
}

/// The q-value of the best media range in `accept` matching one of
/// `types` exactly; 0 when none does.
fn accept_q(accept: Option<&str>, types: &[&str]) -> f32 {
    let mut best = 0.0f32;
    for range in accept.unwrap_or("").split(',') {
        let mut parts = range.split(';');
        let t = parts.next().unwrap_or("").trim();
        if !types.iter().any(|x| x.eq_ignore_ascii_case(t)) {
            continue;
        }
        let mut q = 1.0f32;
        for p in parts {
            if let Some(v) = p.trim().strip_prefix("q=") {
                q = v.trim().parse().unwrap_or(0.0);
            }
        }
        best = best.max(q);
    }
    best
}

const PYPI_JSON_TYPES: &[&str] = &[
    "application/vnd.pypi.simple.v1+json",
    "application/vnd.pypi.simple.latest+json",
];
const PYPI_HTML_TYPES: &[&str] = &[
    "application/vnd.pypi.simple.v1+html",
    "application/vnd.pypi.simple.latest+html",
    "text/html",
];

fn pypi_index(segs: &[&str], trailing: bool, accept: Option<&str>) -> R<Classified> {
    let eco = Ecosystem::Pypi;
    match segs {
        ["simple"] => Ok(Classified::Registry(eco, RegistryResource::PypiSimpleRoot)),
        ["simple", p] => {
            let json = accept_q(accept, PYPI_JSON_TYPES);
            let html = accept_q(accept, PYPI_HTML_TYPES);
            let form = if json > 0.0 && json >= html {
                IndexForm::PypiSimpleJson
            } else {
                IndexForm::PypiSimpleHtml
            };
            Ok(package(eco, pkg(eco, &dec(p)?)?, None, Kind::Index(form)))
        }
        ["pypi", p, "json"] if !trailing => Ok(package(
            eco,
            pkg(eco, &dec(p)?)?,
            None,
            Kind::Index(IndexForm::PypiJson),
        )),
        ["pypi", p, v, "json"] if !trailing => {
            let v = dec(v)?;
            Ok(package(
                eco,
                pkg(eco, &dec(p)?)?,
                Some(v),
                Kind::Meta(MetaKind::PypiVersionJson),
            ))
        }
        _ => why("not a PyPI index path (/simple/<project>/, /pypi/<project>/json)"),
    }
}

fn package(eco: Ecosystem, name: PackageName, version: Option<String>, kind: Kind) -> Classified {
    Classified::Package(PackageRef {
        ecosystem: eco,
        name,
        version,
        kind,
    })
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn pypi_files(segs: &[&str], trailing: bool) -> R<Classified> {
    if trailing {
        return why("a file path does not end in /");
    }
    let eco = Ecosystem::Pypi;
    let (file, dir_name) = match segs {
        ["packages", a, b, c, file] if is_hex(a, 2) && is_hex(b, 2) && is_hex(c, 60) => {
            (dec(file)?, None)
        }
        ["packages", pyver, letter, name, file] => {
            let name = dec(name)?;
            let letter = dec(letter)?;
            let pyver = dec(pyver)?;
            if !pyver
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_')
            {
                return why("not a PyPI file path");
            }
            // The legacy layout files a project under its first letter.
            if !name.chars().next().is_some_and(|c| letter.chars().eq([c])) {
                return why("legacy file path whose letter is not its project's first");
            }
            (dec(file)?, Some(name))
        }
        _ => return why("not a PyPI file path (/packages/<h2>/<h2>/<h60>/<file>)"),
    };
    let (filename, metadata) = match file.strip_suffix(".metadata") {
        Some(f) => (f.to_string(), true),
        None => (file, false),
    };
    let (name, version) = pypi_filename(&filename)
        .ok_or_else(|| Why(format!("{filename:?} is not a wheel or sdist file name")))?;
    let name = pkg(eco, &name)?;
    if let Some(d) = dir_name {
        if pkg(eco, &d)? != name {
            return why("legacy file path whose directory names another project");
        }
    }
    Ok(package(
        eco,
        name,
        Some(version),
        Kind::Artifact(Artifact {
            filename,
            metadata,
            at: None,
        }),
    ))
}

/// A file on a PyPI mirror, by its last segment (see [`classify_mirrored`]).
fn pypi_mirror_file(segs: &[&str], trailing: bool) -> R<Classified> {
    let (Some(last), false) = (segs.last(), trailing) else {
        return why("not a file path");
    };
    if segs.first() == Some(&"simple") {
        return why("an index path");
    }
    let file = dec(last)?;
    let (filename, metadata) = match file.strip_suffix(".metadata") {
        Some(f) => (f.to_string(), true),
        None => (file, false),
    };
    let (name, version) = pypi_filename(&filename)
        .ok_or_else(|| Why(format!("{filename:?} is not a wheel or sdist file name")))?;
    Ok(package(
        Ecosystem::Pypi,
        pkg(Ecosystem::Pypi, &name)?,
        Some(version),
        Kind::Artifact(Artifact {
            filename,
            metadata,
            at: None,
        }),
    ))
}

/// Source distribution suffixes PyPI has accepted.
const SDIST_SUFFIXES: &[&str] = &[".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tar", ".zip"];

/// (name, version) of a wheel (`{name}-{ver}(-{build})?-{py}-{abi}-{plat}.whl`)
/// or sdist (`{name}-{ver}.tar.gz`, …) file name. A legacy sdist name may
/// contain `-`: the version is the first `-`-separated tail that is a PEP
/// 440 version (`python-dateutil-2.8.2` is python-dateutil 2.8.2,
/// `foo-1.0-1` is foo 1.0.post1).
pub fn pypi_filename(file: &str) -> Option<(String, String)> {
    if let Some(stem) = file.strip_suffix(".whl") {
        let parts: Vec<&str> = stem.split('-').collect();
        if !(parts.len() == 5 || parts.len() == 6) || parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        if !is_pep440(parts[1]) {
            return None;
        }
        return Some((parts[0].to_string(), parts[1].to_string()));
    }
    if let Some(stem) = file.strip_suffix(".egg") {
        // name-version(-pyX.Y(-platform)?)?.egg
        let mut it = stem.splitn(3, '-');
        let (n, v) = (it.next()?, it.next()?);
        if !is_pep440(v) {
            return None;
        }
        return Some((n.to_string(), v.to_string()));
    }
    let stem = SDIST_SUFFIXES.iter().find_map(|s| file.strip_suffix(s))?;
    for (i, _) in stem.match_indices('-') {
        let (n, v) = (&stem[..i], &stem[i + 1..]);
        if !n.is_empty() && v.starts_with(|c: char| c.is_ascii_digit()) && is_pep440(v) {
            return Some((n.to_string(), v.to_string()));
        }
    }
    None
}

fn is_pep440(s: &str) -> bool {
    s.parse::<pep440_rs::Version>().is_ok()
}

const NPM_ABBREVIATED: &str = "application/vnd.npm.install-v1+json";

/// An npm path's package name (scoped or not, its separator and `@`
/// decoded) and the segments after it.
fn npm_name<'s>(first: &str, segs: &'s [&'s str]) -> R<(String, &'s [&'s str])> {
    // The scope separator may be a `/` or `%2f`/`%2F` (DESIGN): both name
    // the same package, and `@` may come as `%40`.
    let first = match first.get(..3) {
        Some("%40") => format!("@{}", &first[3..]),
        _ => first.to_string(),
    };
    Ok(if let Some(scoped) = first.strip_prefix('@') {
        if let Some((s, n)) = split_npm_scope(scoped).filter(|_| !scoped.contains('/')) {
            (format!("@{}/{}", dec(s)?, dec(n)?), &segs[1..])
        } else {
            let Some(n) = segs.get(1) else {
                return why("a scope without a package name");
            };
            (format!("@{}/{}", dec(scoped)?, dec(n)?), &segs[2..])
        }
    } else {
        let n = dec(&first)?;
        // `/%2d/...` is the API prefix `/-/` to a server that decodes
        // first: never a package.
        if n == "-" {
            return why("an encoded '-' is the registry's API prefix");
        }
        (n, &segs[1..])
    })
}

fn npm(segs: &[&str], trailing: bool, accept: Option<&str>) -> R<Classified> {
    let eco = Ecosystem::Npm;
    if trailing && !segs.is_empty() {
        return why("npm paths do not end in /");
    }
    let Some(first) = segs.first() else {
        return why("the registry root is not a package");
    };
    if *first == "-" {
        return match segs {
            ["-", "ping"] => Ok(Classified::Registry(eco, RegistryResource::NpmPing)),
            _ => why("npm API endpoint outside the package gate (search, audit, login, …)"),
        };
    }
    let (raw_name, rest) = npm_name(first, segs)?;
    let name = pkg(eco, &raw_name)?;
    match rest {
        [] => {
            let form = if accept_q(accept, &[NPM_ABBREVIATED]) > 0.0 {
                IndexForm::NpmAbbreviated
            } else {
                IndexForm::NpmFull
            };
            Ok(package(eco, name, None, Kind::Index(form)))
        }
        ["-", file] => {
            let file = dec(file)?;
            let bare = name.as_str().rsplit('/').next().unwrap_or(name.as_str());
            let version = file
                .strip_suffix(".tgz")
                .and_then(|f| f.strip_prefix(bare))
                .and_then(|f| f.strip_prefix('-'))
                .filter(|v| nodejs_semver::Version::parse(v).is_ok())
                .ok_or_else(|| Why(format!("{file:?} is not {bare}-<version>.tgz")))?
                .to_string();
            Ok(package(
                eco,
                name,
                Some(version),
                Kind::Artifact(Artifact {
                    filename: file,
                    metadata: false,
                    at: None,
                }),
            ))
        }
        [v] => {
            let v = dec(v)?;
            if nodejs_semver::Version::parse(&v).is_err() {
                return why(format!(
                    "{v:?} is not a version (dist-tag documents are outside the gate)"
                ));
            }
            Ok(package(
                eco,
                name,
                Some(v),
                Kind::Meta(MetaKind::NpmVersion),
            ))
        }
        _ => why("not an npm package path"),
    }
}

/// The sparse index's path for a (lower-case, ASCII) crate name. Counted
/// in characters, so any string gives a path, not a panic (a name that is
/// not a crate name fails its normalisation before this matters).
pub fn cargo_index_path(name: &str) -> String {
    let c: Vec<char> = name.chars().take(4).collect();
    let s = |r: std::ops::Range<usize>| c[r].iter().collect::<String>();
    match c.len() {
        0 => "/".to_string(),
        1 => format!("/1/{name}"),
        2 => format!("/2/{name}"),
        3 => format!("/3/{}/{name}", s(0..1)),
        _ => format!("/{}/{}/{name}", s(0..2), s(2..4)),
    }
}

fn cargo_index(segs: &[&str], trailing: bool) -> R<Classified> {
    let eco = Ecosystem::Cargo;
    if trailing {
        return why("index paths do not end in /");
    }
    let name = match segs {
        ["config.json"] => return Ok(Classified::Registry(eco, RegistryResource::CargoConfig)),
        [_, n] | [_, _, n] => *n,
        _ => return why("not a sparse index path"),
    };
    // cargo asks for the lower-cased name; the directories are a function
    // of it, so a path whose directories do not fit is not an index file.
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        || cargo_index_path(name) != format!("/{}", segs.join("/"))
    {
        return why("sparse index path whose directories do not fit its crate name");
    }
    Ok(package(
        eco,
        pkg(eco, name)?,
        None,
        Kind::Index(IndexForm::CargoSparse),
    ))
}

fn crate_ref(name: &str, version: &str) -> R<Classified> {
    let eco = Ecosystem::Cargo;
    let name_n = pkg(eco, name)?;
    let filename = format!("{name_n}-{version}.crate");
    if semver::Version::parse(version).is_err() {
        return why(format!("{version:?} is not a crate version"));
    }
    Ok(package(
        eco,
        name_n,
        Some(version.to_string()),
        // Named by the normal form: crates.io serves one crate under every
        // -/_ and case spelling, and the index view lists it so.
        Kind::Artifact(Artifact {
            filename,
            metadata: false,
            at: None,
        }),
    ))
}

fn cargo_static(segs: &[&str], trailing: bool) -> R<Classified> {
    if trailing {
        return why("not a .crate path");
    }
    match segs {
        ["crates", n, v, "download"] => crate_ref(&dec(n)?, &dec(v)?),
        ["crates", n, file] => {
            let (n, file) = (dec(n)?, dec(file)?);
            let v = file
                .strip_suffix(".crate")
                .and_then(|f| f.strip_prefix(n.as_str()))
                .and_then(|f| f.strip_prefix('-'))
                .ok_or_else(|| Why(format!("{file:?} is not {n}-<version>.crate")))?;
            crate_ref(&n, v)
        }
        _ => why("not a .crate path (/crates/<name>/<name>-<version>.crate)"),
    }
}

fn cargo_api(segs: &[&str], trailing: bool) -> R<Classified> {
    match segs {
        ["api", "v1", "crates", n, v, "download"] if !trailing => crate_ref(&dec(n)?, &dec(v)?),
        _ => why("crates.io API endpoint outside the package gate (only downloads are)"),
    }
}

fn go_module(escaped: &[&str]) -> R<PackageName> {
    let joined = escaped.join("/");
    let path = go_unescape(&joined)
        .ok_or_else(|| Why(format!("{joined:?} is not in Go's case encoding")))?;
    pkg(Ecosystem::Go, &path)
}

fn go_version(escaped: &str) -> R<String> {
    let v = go_unescape(escaped)
        .ok_or_else(|| Why(format!("{escaped:?} is not in Go's case encoding")))?;
    if super::version::GoVersion::parse(&v).is_none() {
        return why(format!(
            "{v:?} is not a canonical module version (branch and query lookups are outside the gate)"
        ));
    }
    Ok(v)
}

fn go_proxy(segs: &[&str], trailing: bool) -> R<Classified> {
    let eco = Ecosystem::Go;
    if trailing {
        return why("Go proxy paths do not end in /");
    }
    if let ["sumdb", "sum.golang.org", rest @ ..] = segs {
        if rest == ["supported"] {
            return Ok(Classified::Registry(
                eco,
                RegistryResource::GoSumdbSupported,
            ));
        }
        return go_sum(rest, false);
    }
    if segs.iter().any(|s| s.contains('%')) {
        return why("percent-encoding in a Go proxy path");
    }
    if let Some(i) = segs.iter().position(|s| *s == "@v") {
        let module = go_module(&segs[..i])?;
        return match &segs[i + 1..] {
            ["list"] => Ok(package(eco, module, None, Kind::Index(IndexForm::GoList))),
            [file] => {
                let (v, kind) = if let Some(v) = file.strip_suffix(".info") {
                    (v, Kind::Meta(MetaKind::GoInfo))
                } else if let Some(v) = file.strip_suffix(".mod") {
                    (v, Kind::Meta(MetaKind::GoMod))
                } else if let Some(v) = file.strip_suffix(".zip") {
                    (
                        v,
                        Kind::Artifact(Artifact {
                            filename: format!("{}.zip", go_version(v)?),
                            metadata: false,
                            at: None,
                        }),
                    )
                } else {
                    return why("not @v/list, .info, .mod or .zip");
                };
                Ok(package(eco, module, Some(go_version(v)?), kind))
            }
            _ => why("not a Go proxy path"),
        };
    }
    if let Some((last, head)) = segs.split_last() {
        if *last == "@latest" {
            return Ok(package(
                eco,
                go_module(head)?,
                None,
                Kind::Index(IndexForm::GoLatest),
            ));
        }
    }
    why("not a Go proxy path (<module>/@v/..., <module>/@latest)")
}

fn go_sum(segs: &[&str], trailing: bool) -> R<Classified> {
    let eco = Ecosystem::Go;
    if trailing {
        return why("sumdb paths do not end in /");
    }
    match segs {
        ["latest"] => Ok(Classified::Registry(eco, RegistryResource::GoSumLatest)),
        ["tile", rest @ ..] if !rest.is_empty() && rest.iter().all(|s| is_tile_segment(s)) => {
            Ok(Classified::Registry(eco, RegistryResource::GoSumTile))
        }
        ["lookup", rest @ ..] if !rest.is_empty() => {
            if rest.iter().any(|s| s.contains('%')) {
                return why("percent-encoding in a sumdb path");
            }
            let (last, head) = rest.split_last().expect("non-empty");
            let (m_last, v) = last
                .split_once('@')
                .ok_or_else(|| Why("lookup path without @version".to_string()))?;
            let mut module: Vec<&str> = head.to_vec();
            module.push(m_last);
            // `<module>@<version>/go.mod` is looked up as `…@<version>` too;
            // the version is what the gate decides on.
            Ok(package(
                eco,
                go_module(&module)?,
                Some(go_version(v)?),
                Kind::Meta(MetaKind::GoSumLookup),
            ))
        }
        _ => why("not a sumdb path (/lookup/<module>@<version>, /tile/..., /latest)"),
    }
}

/// Tile path segments: numbers, `x`-prefixed numbers, `data`, and a final
/// `<n>.p` and width (tlog's tile encoding).
fn is_tile_segment(s: &str) -> bool {
    s == "data"
        || s.bytes().all(|b| b.is_ascii_digit())
        || s.strip_prefix('x')
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        || s.strip_suffix(".p")
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// Where the gate reads a package's index when it must authorise a
/// download the client did not look up first (egressd fetches it itself,
/// as its own logged request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexLocation {
    pub host: &'static str,
    pub path: String,
    pub accept: &'static str,
    pub form: IndexForm,
}

/// The index document that lists `name`'s versions with their publish
/// times (the forms with times: PyPI simple JSON, the full packument, the
/// sparse index file, Go's `@v/list` — Go's times then come from each
/// version's `.mod`, see [`go_mod_path`]).
pub fn index_location(eco: Ecosystem, name: &PackageName) -> IndexLocation {
    let n = name.as_str();
    match eco {
        Ecosystem::Pypi => IndexLocation {
            host: "pypi.org",
            path: format!("/simple/{n}/"),
            accept: "application/vnd.pypi.simple.v1+json",
            form: IndexForm::PypiSimpleJson,
        },
        Ecosystem::Npm => IndexLocation {
            host: "registry.npmjs.org",
            path: format!("/{}", n.replacen('/', "%2f", 1)),
            accept: "application/json",
            form: IndexForm::NpmFull,
        },
        Ecosystem::Cargo => IndexLocation {
            host: "index.crates.io",
            // The registry's file is the crate's own spelling lower-cased,
            // which may use `-` where the normal form has `_`; cargo itself
            // tries both. The caller retries with `-` on a 404.
            path: cargo_index_path(n),
            accept: "*/*",
            form: IndexForm::CargoSparse,
        },
        Ecosystem::Go => IndexLocation {
            host: "proxy.golang.org",
            path: format!("/{}/@v/list", super::name::go_escape(n)),
            accept: "*/*",
            form: IndexForm::GoList,
        },
    }
}

/// `proxy.golang.org` path of a version's `.mod`, whose `Last-Modified`
/// is the version's publish time for the gate.
pub fn go_mod_path(module: &PackageName, version: &str) -> String {
    format!(
        "/{}/@v/{}.mod",
        super::name::go_escape(module.as_str()),
        super::name::go_escape(version)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::testutil::Rng;

    fn c(host: &str, path: &str) -> Classified {
        classify(None, host, "GET", path, None)
    }

    fn pref(cl: Classified) -> PackageRef {
        match cl {
            Classified::Package(p) => p,
            other => panic!("not a package: {other:?}"),
        }
    }

    fn art(host: &str, path: &str) -> (String, String, String, bool) {
        let p = pref(c(host, path));
        let Kind::Artifact(a) = p.kind else {
            panic!("{path}: not an artifact: {:?}", p.kind)
        };
        (
            p.name.to_string(),
            p.version.unwrap(),
            a.filename,
            a.metadata,
        )
    }

    fn unparseable(host: &str, path: &str) {
        assert!(
            matches!(c(host, path), Classified::Unparseable { .. }),
            "{host}{path}: {:?}",
            c(host, path)
        );
    }

    #[test]
    fn pypi_index_paths_and_accept() {
        let json = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01";
        let p = pref(classify(
            None,
            "pypi.org",
            "GET",
            "/simple/Requests/",
            Some(json),
        ));
        assert_eq!(p.name.as_str(), "requests");
        assert_eq!(p.kind, Kind::Index(IndexForm::PypiSimpleJson));
        let p = pref(classify(
            None,
            "pypi.org",
            "GET",
            "/simple/requests/",
            Some("text/html"),
        ));
        assert_eq!(p.kind, Kind::Index(IndexForm::PypiSimpleHtml));
        let p = pref(c("pypi.org", "/simple/zope.interface"));
        assert_eq!(
            (p.name.as_str(), &p.kind),
            ("zope-interface", &Kind::Index(IndexForm::PypiSimpleHtml))
        );
        assert_eq!(
            c("pypi.org", "/simple/"),
            Classified::Registry(Ecosystem::Pypi, RegistryResource::PypiSimpleRoot)
        );
        let p = pref(c("pypi.org", "/pypi/requests/json"));
        assert_eq!(p.kind, Kind::Index(IndexForm::PypiJson));
        let p = pref(c("pypi.org", "/pypi/requests/2.32.3/json"));
        assert_eq!(
            (p.version.as_deref(), &p.kind),
            (Some("2.32.3"), &Kind::Meta(MetaKind::PypiVersionJson))
        );
        for bad in [
            "/project/requests/",
            "/simple/a/b/",
            "/simple//",
            "/simple/../x/",
            "/simple/%2e%2e/",
            "/",
            "/simple/requests/?x=1",
            "/simple/a%2fb/",
        ] {
            unparseable("pypi.org", bad);
        }
    }

    #[test]
    fn pypi_files_hash_and_legacy_paths() {
        let h = "/packages/f9/9b/335f9764261e915ed497fcdeb11df5dfd6f7bf257d4a6a2a686d80da4d54";
        assert_eq!(
            art(
                "files.pythonhosted.org",
                &format!("{h}/requests-2.32.3-py3-none-any.whl")
            ),
            (
                "requests".into(),
                "2.32.3".into(),
                "requests-2.32.3-py3-none-any.whl".into(),
                false
            )
        );
        assert_eq!(
            art(
                "files.pythonhosted.org",
                &format!("{h}/requests-2.32.3-py3-none-any.whl.metadata")
            ),
            (
                "requests".into(),
                "2.32.3".into(),
                "requests-2.32.3-py3-none-any.whl".into(),
                true
            )
        );
        assert_eq!(
            art(
                "files.pythonhosted.org",
                &format!("{h}/torch-2.0.0%2Bcpu-cp311-cp311-linux_x86_64.whl")
            )
            .1,
            "2.0.0+cpu"
        );
        assert_eq!(
            art(
                "files.pythonhosted.org",
                "/packages/source/p/python-dateutil/python-dateutil-2.8.2.tar.gz"
            ),
            (
                "python-dateutil".into(),
                "2.8.2".into(),
                "python-dateutil-2.8.2.tar.gz".into(),
                false
            )
        );
        assert_eq!(
            art(
                "files.pythonhosted.org",
                "/packages/py2.py3/s/six/six-1.16.0-py2.py3-none-any.whl"
            )
            .0,
            "six"
        );
        // The legacy layout's letter and directory must fit the file.
        unparseable(
            "files.pythonhosted.org",
            "/packages/source/x/six/six-1.16.0.tar.gz",
        );
        unparseable(
            "files.pythonhosted.org",
            "/packages/source/s/sax/six-1.16.0.tar.gz",
        );
        unparseable("files.pythonhosted.org", &format!("{h}/README.txt"));
        unparseable(
            "files.pythonhosted.org",
            "/packages/f9/9b/short/requests-2.32.3.tar.gz",
        );
        unparseable(
            "files.pythonhosted.org",
            &format!("{h}/a%2f..%2fb-1.0.tar.gz"),
        );
    }

    #[test]
    fn filenames_split_into_name_and_version() {
        let f = |s| pypi_filename(s).map(|(n, v)| format!("{n} {v}"));
        assert_eq!(
            f("numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl").as_deref(),
            Some("numpy 1.26.4")
        );
        assert_eq!(f("pkg-1.0-1-py3-none-any.whl").as_deref(), Some("pkg 1.0"));
        assert_eq!(f("foo-1.0-1.tar.gz").as_deref(), Some("foo 1.0-1"));
        assert_eq!(f("py-3to2-1.0.zip").as_deref(), Some("py-3to2 1.0"));
        assert_eq!(
            f("zope.interface-6.0.tar.gz").as_deref(),
            Some("zope.interface 6.0")
        );
        assert_eq!(
            f("setuptools-0.6c11-py2.7.egg").as_deref(),
            Some("setuptools 0.6c11")
        );
        assert_eq!(f("x-1.0.exe"), None);
        assert_eq!(f("x.whl"), None);
        assert_eq!(f("nover.tar.gz"), None);
    }

    #[test]
    fn npm_scopes_in_every_encoding_name_one_package() {
        for path in [
            "/@types/node",
            "/@types%2fnode",
            "/@types%2Fnode",
            "/%40types%2fnode",
        ] {
            let p = pref(c("registry.npmjs.org", path));
            assert_eq!(p.name.as_str(), "@types/node", "{path}");
            assert_eq!(p.kind, Kind::Index(IndexForm::NpmFull));
        }
        let p = pref(classify(
            None,
            "registry.npmjs.org",
            "GET",
            "/lodash",
            Some("application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8, */*"),
        ));
        assert_eq!(p.kind, Kind::Index(IndexForm::NpmAbbreviated));
        assert_eq!(
            art("registry.npmjs.org", "/lodash/-/lodash-4.17.21.tgz"),
            (
                "lodash".into(),
                "4.17.21".into(),
                "lodash-4.17.21.tgz".into(),
                false
            )
        );
        assert_eq!(
            art("registry.npmjs.org", "/@types/node/-/node-20.1.0.tgz").1,
            "20.1.0"
        );
        assert_eq!(
            art("registry.npmjs.org", "/@types%2fnode/-/node-20.1.0.tgz").0,
            "@types/node"
        );
        let p = pref(c("registry.npmjs.org", "/lodash/4.17.21"));
        assert_eq!(p.kind, Kind::Meta(MetaKind::NpmVersion));
        assert_eq!(
            c("registry.npmjs.org", "/-/ping"),
            Classified::Registry(Ecosystem::Npm, RegistryResource::NpmPing)
        );
        for bad in [
            "/",
            "/-/v1/search",
            "/-/npm/v1/security/advisories/bulk",
            "/lodash/latest",
            "/lodash/-/other-1.0.0.tgz",
            "/@types",
            "/lodash%2f..%2fx",
            "/@a/b/c/d",
            "/lodash/-/lodash-4.17.21.tgz/",
            "/%2d",
            "/%2D/ping",
        ] {
            unparseable("registry.npmjs.org", bad);
        }
        // A write is a publish, not an unreadable path.
        assert!(matches!(
            classify(None, "registry.npmjs.org", "PUT", "/lodash", None),
            Classified::Publish { .. }
        ));
    }

    #[test]
    fn publishes_are_told_apart_from_unreadable_writes() {
        let publish = |eco: Option<Ecosystem>, host: &str, method: &str, path: &str| {
            matches!(
                classify(eco, host, method, path, None),
                Classified::Publish { .. }
            )
        };
        for (host, method, path) in [
            ("registry.npmjs.org", "PUT", "/left-pad"),
            ("registry.npmjs.org", "put", "/@acme%2fwidget"),
            ("registry.npmjs.org", "DELETE", "/left-pad/-rev/3-abc"),
            (
                "registry.npmjs.org",
                "PUT",
                "/-/package/left-pad/dist-tags/latest",
            ),
            ("upload.pypi.org", "POST", "/legacy/"),
            ("upload.pypi.org", "POST", "/"),
            ("pypi.org", "POST", "/legacy/"),
            ("crates.io", "PUT", "/api/v1/crates/new"),
            ("crates.io", "DELETE", "/api/v1/crates/serde/1.0.0/yank"),
            ("crates.io", "PUT", "/api/v1/crates/serde/owners"),
        ] {
            assert!(publish(None, host, method, path), "{method} {host}{path}");
        }
        // A private registry's host, by the ecosystem the caller names.
        assert!(publish(
            Some(Ecosystem::Npm),
            "npm.corp.example",
            "PUT",
            "/x"
        ));
        assert!(publish(
            Some(Ecosystem::Cargo),
            "cargo.corp",
            "PUT",
            "/api/v1/crates/new"
        ));
        for (host, method, path) in [
            // Reads, and writes that publish nothing (npm audit, login).
            ("registry.npmjs.org", "GET", "/left-pad"),
            (
                "registry.npmjs.org",
                "POST",
                "/-/npm/v1/security/advisories/bulk",
            ),
            ("registry.npmjs.org", "PUT", "/-/user/org.couchdb.user:me"),
            ("pypi.org", "POST", "/simple/"),
            ("crates.io", "POST", "/api/v1/crates/new"),
            ("static.crates.io", "PUT", "/crates/serde/serde-1.0.0.crate"),
            ("proxy.golang.org", "PUT", "/x/@v/v1.0.0.zip"),
        ] {
            assert!(!publish(None, host, method, path), "{method} {host}{path}");
            assert!(matches!(
                classify(None, host, method, path, None),
                Classified::Unparseable { .. } | Classified::Package(_)
            ));
        }
        // upload.pypi.org serves nothing to read.
        unparseable("upload.pypi.org", "/legacy/");
    }

    #[test]
    fn cargo_index_and_downloads() {
        assert_eq!(
            c("index.crates.io", "/config.json"),
            Classified::Registry(Ecosystem::Cargo, RegistryResource::CargoConfig)
        );
        for (path, name) in [
            ("/1/a", "a"),
            ("/2/cc", "cc"),
            ("/3/s/syn", "syn"),
            ("/se/rd/serde_json", "serde_json"),
            ("/se/rd/serde-json", "serde_json"),
        ] {
            let p = pref(c("index.crates.io", path));
            assert_eq!(
                (p.name.as_str(), &p.kind),
                (name, &Kind::Index(IndexForm::CargoSparse)),
                "{path}"
            );
        }
        for bad in [
            "/3/x/syn",
            "/se/rx/serde",
            "/2/abc",
            "/Se/rd/Serde",
            "/se/rd/serde/",
        ] {
            unparseable("index.crates.io", bad);
        }
        assert_eq!(
            art("static.crates.io", "/crates/serde/serde-1.0.200.crate"),
            (
                "serde".into(),
                "1.0.200".into(),
                "serde-1.0.200.crate".into(),
                false
            )
        );
        assert_eq!(
            art("static.crates.io", "/crates/serde/1.0.200/download").2,
            "serde-1.0.200.crate"
        );
        assert_eq!(
            art("crates.io", "/api/v1/crates/serde/1.0.200/download").1,
            "1.0.200"
        );
        unparseable("crates.io", "/api/v1/crates?q=serde");
        unparseable("crates.io", "/api/v1/crates/serde");
        unparseable("static.crates.io", "/crates/serde/tokio-1.0.0.crate");
    }

    #[test]
    fn go_proxy_and_sumdb() {
        let p = pref(c(
            "proxy.golang.org",
            "/github.com/!azure/go-autorest/@v/list",
        ));
        assert_eq!(
            (p.name.as_str(), &p.kind),
            (
                "github.com/Azure/go-autorest",
                &Kind::Index(IndexForm::GoList)
            )
        );
        let p = pref(c("proxy.golang.org", "/golang.org/x/text/@latest"));
        assert_eq!(p.kind, Kind::Index(IndexForm::GoLatest));
        let p = pref(c("proxy.golang.org", "/golang.org/x/text/@v/v0.14.0.info"));
        assert_eq!(
            (p.version.as_deref(), &p.kind),
            (Some("v0.14.0"), &Kind::Meta(MetaKind::GoInfo))
        );
        let p = pref(c("proxy.golang.org", "/golang.org/x/text/@v/v0.14.0.mod"));
        assert_eq!(p.kind, Kind::Meta(MetaKind::GoMod));
        assert_eq!(
            art("proxy.golang.org", "/golang.org/x/text/@v/v0.14.0.zip").2,
            "v0.14.0.zip"
        );
        let p = pref(c(
            "proxy.golang.org",
            "/github.com/x/y/@v/v0.0.0-20191109021931-daa7c04131f5.zip",
        ));
        assert_eq!(
            p.version.as_deref(),
            Some("v0.0.0-20191109021931-daa7c04131f5")
        );
        let p = pref(c(
            "sum.golang.org",
            "/lookup/github.com/!burnt!sushi/toml@v1.3.2",
        ));
        assert_eq!(
            (p.name.as_str(), p.version.as_deref(), &p.kind),
            (
                "github.com/BurntSushi/toml",
                Some("v1.3.2"),
                &Kind::Meta(MetaKind::GoSumLookup)
            )
        );
        let p = pref(c(
            "proxy.golang.org",
            "/sumdb/sum.golang.org/lookup/golang.org/x/text@v0.14.0",
        ));
        assert_eq!(p.kind, Kind::Meta(MetaKind::GoSumLookup));
        assert_eq!(
            c("sum.golang.org", "/tile/8/0/x123/456.p/7"),
            Classified::Registry(Ecosystem::Go, RegistryResource::GoSumTile)
        );
        assert_eq!(
            c("sum.golang.org", "/tile/8/data/x001/234"),
            Classified::Registry(Ecosystem::Go, RegistryResource::GoSumTile)
        );
        assert_eq!(
            c("sum.golang.org", "/latest"),
            Classified::Registry(Ecosystem::Go, RegistryResource::GoSumLatest)
        );
        assert_eq!(
            c("proxy.golang.org", "/sumdb/sum.golang.org/supported"),
            Classified::Registry(Ecosystem::Go, RegistryResource::GoSumdbSupported)
        );
        for bad in [
            "/github.com/Azure/x/@v/list",
            "/golang.org/x/text/@v/master.info",
            "/golang.org/x/text/@v/v1.0.0.tar",
            "/golang.org/x/text",
            "/golang.org/x/text/@v/",
            "/golang.org/x/t%65xt/@v/list",
            "/@v/list",
        ] {
            unparseable("proxy.golang.org", bad);
        }
        unparseable("sum.golang.org", "/lookup/golang.org/x/text");
        unparseable("sum.golang.org", "/tile/../x");
    }

    #[test]
    fn other_hosts_and_private_registries() {
        assert_eq!(
            c("example.com", "/simple/requests/"),
            Classified::NotRegistry
        );
        let p = pref(classify(
            Some(Ecosystem::Pypi),
            "pypi.corp",
            "GET",
            "/simple/requests/",
            None,
        ));
        assert_eq!(p.name.as_str(), "requests");
        let p = pref(classify(
            Some(Ecosystem::Cargo),
            "crates.corp",
            "GET",
            "/crates/serde/serde-1.0.0.crate",
            None,
        ));
        assert!(matches!(p.kind, Kind::Artifact(_)));
        assert_eq!(
            registry_ecosystem("Registry.NPMJS.org."),
            Some(Ecosystem::Npm)
        );
    }

    #[test]
    fn index_locations_classify_back_to_their_index() {
        for (eco, name) in [
            (Ecosystem::Pypi, "requests"),
            (Ecosystem::Npm, "@types/node"),
            (Ecosystem::Npm, "lodash"),
            (Ecosystem::Cargo, "serde_json"),
            (Ecosystem::Go, "github.com/Azure/x"),
        ] {
            let n = normalize(eco, name).unwrap();
            let loc = index_location(eco, &n);
            let p = pref(classify(None, loc.host, "GET", &loc.path, Some(loc.accept)));
            assert_eq!(
                (p.name, p.kind),
                (n.clone(), Kind::Index(loc.form)),
                "{name}"
            );
        }
        let n = normalize(Ecosystem::Go, "github.com/Azure/x").unwrap();
        let p = pref(c("proxy.golang.org", &go_mod_path(&n, "v1.0.0-RC1")));
        assert_eq!((p.name, p.version.as_deref()), (n, Some("v1.0.0-RC1")));
    }

    /// Whatever the path, classification never panics, and a package it
    /// finds has a name that is already normal.
    #[test]
    fn random_paths_never_panic_and_names_are_normal() {
        let mut rng = Rng::new(3);
        let pieces = [
            "/",
            "simple",
            "pypi",
            "json",
            "packages",
            "@v",
            "list",
            "@latest",
            "-",
            "%2f",
            "%2F",
            "%40",
            "@s",
            "a",
            "A",
            "!a",
            "..",
            ".",
            "v1.2.3",
            "1.0.0",
            ".tgz",
            ".whl",
            ".crate",
            "crates",
            "api",
            "v1",
            "download",
            "lookup",
            "tile",
            "%",
            "%zz",
            "x-1.0.tar.gz",
            "se",
            "rd",
            "serde",
        ];
        let hosts = [
            "pypi.org",
            "files.pythonhosted.org",
            "registry.npmjs.org",
            "index.crates.io",
            "static.crates.io",
            "crates.io",
            "proxy.golang.org",
            "sum.golang.org",
        ];
        for _ in 0..20000 {
            let mut path = String::from("/");
            for _ in 0..rng.below(8) {
                path.push_str(pieces[rng.below(pieces.len())]);
                if rng.below(2) == 0 {
                    path.push('/');
                }
            }
            let host = hosts[rng.below(hosts.len())];
            if let Classified::Package(p) = classify(None, host, "GET", &path, None) {
                assert_eq!(
                    normalize(p.ecosystem, p.name.as_str()).as_ref(),
                    Ok(&p.name),
                    "{host}{path}"
                );
            }
        }
    }
}
