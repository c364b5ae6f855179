//! `egressd packages import LOCKFILE…`: lockfiles → an approved set, as
//! the YAML text of a `packages:` list (one set per ecosystem) pinning the
//! exact versions and, where the lockfile carries them, the sha256 of each
//! file. Pure: the CLI reads the files and writes the text.
//!
//! | file | versions | sha256 pins |
//! |---|---|---|
//! | `uv.lock` | registry packages | every sdist and wheel hash |
//! | `requirements*.txt` | `name==version` lines | `--hash=sha256:` |
//! | `package-lock.json`, `npm-shrinkwrap.json` (lockfileVersion 2, 3) | `packages` entries resolved from a registry | none: npm records sha512 (`integrity`), which npm checks itself at install; DESIGN's pins are sha256 |
//! | `pnpm-lock.yaml` (v6, v9) | `packages` keys | none (sha512, as npm) |
//! | `Cargo.lock` | registry packages | `checksum` (the `.crate`'s sha256) |
//! | `go.sum` | every module version (also go.mod-only ones: go reads their `.mod` and looks them up in the sumdb) | none: `h1:` is a hash of the module's file tree, not of the `.zip` |
//!
//! Entries that do not come from the registry (path, git, workspace,
//! `file:` and link entries, bundled dependencies, `-r`/`-e` lines) are
//! skipped and listed in a comment at the top of the output, so nothing is
//! dropped without being said. An unpinned requirement (`>=`), a lockfile
//! version egressd cannot read, or a file it does not know is an error.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use super::name::normalize;
use super::raw::parse_sha256_hex;
use super::version::Version;
use super::Ecosystem;

/// The set the import writes.
#[derive(Debug, Clone)]
pub struct ImportSet<'a> {
    /// The set's id; with several ecosystems, `<id>-<ecosystem>` each.
    pub id: &'a str,
    /// Required of every set: who answers for these packages.
    pub owner: &'a str,
    /// Default: "pinned from <files>".
    pub reason: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("{file}:{line}: {message}")]
    Parse {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{0}: not a lockfile egressd reads (uv.lock, requirements*.txt, package-lock.json, npm-shrinkwrap.json, pnpm-lock.yaml, Cargo.lock, go.sum)")]
    Unknown(String),
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pin {
    eco: Ecosystem,
    name: String,
    version: String,
    sha256: Vec<[u8; 32]>,
}

struct Collected {
    pins: Vec<Pin>,
    skipped: Vec<String>,
}

/// The lockfile kind `path` names.
fn kind(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    Some(match name {
        "uv.lock" => "uv",
        "package-lock.json" | "npm-shrinkwrap.json" => "npm",
        "pnpm-lock.yaml" => "pnpm",
        "Cargo.lock" => "cargo",
        "go.sum" => "go",
        n if n.ends_with(".txt") => "requirements",
        _ => return None,
    })
}

/// Writes the approved set(s) for `files` (path, contents).
pub fn import(files: &[(&Path, &str)], set: &ImportSet<'_>) -> Result<String, ImportError> {
    if normalize_id(set.id).is_none() {
        return Err(ImportError::Invalid(format!(
            "invalid set id {:?}: use [a-z0-9._-]+",
            set.id
        )));
    }
    if set.owner.trim().is_empty() {
        return Err(ImportError::Invalid("a set needs an owner".into()));
    }
    if files.is_empty() {
        return Err(ImportError::Invalid("no lockfile given".into()));
    }
    let mut c = Collected {
        pins: Vec::new(),
        skipped: Vec::new(),
    };
    for (path, text) in files {
        let file = path.display().to_string();
        match kind(path) {
            Some("uv") => uv_lock(&file, text, &mut c)?,
            Some("requirements") => requirements(&file, text, &mut c)?,
            Some("npm") => package_lock(&file, text, &mut c)?,
            Some("pnpm") => pnpm_lock(&file, text, &mut c)?,
            Some("cargo") => cargo_lock(&file, text, &mut c)?,
            Some("go") => go_sum(&file, text, &mut c)?,
            _ => return Err(ImportError::Unknown(file)),
        }
    }
    let merged = merge(c.pins)?;
    if merged.is_empty() {
        return Err(ImportError::Invalid(
            "the lockfiles pin no registry package".into(),
        ));
    }
    Ok(write(files, set, &merged, &c.skipped))
}

/// One entry per (ecosystem, normal name, version), hashes merged.
fn merge(pins: Vec<Pin>) -> Result<BTreeMap<(Ecosystem, String, String), Pin>, ImportError> {
    let mut merged: BTreeMap<(Ecosystem, String, String), Pin> = BTreeMap::new();
    for p in pins {
        let n = normalize(p.eco, &p.name)
            .map_err(|e| ImportError::Invalid(e.to_string()))?
            .to_string();
        let key = (p.eco, n, p.version.clone());
        let e = merged.entry(key).or_insert_with(|| Pin {
            sha256: Vec::new(),
            ..p.clone()
        });
        for h in p.sha256 {
            if !e.sha256.contains(&h) {
                e.sha256.push(h);
            }
        }
    }
    Ok(merged)
}

/// The `packages:` YAML for the merged pins: one set per ecosystem.
fn write(
    files: &[(&Path, &str)],
    set: &ImportSet<'_>,
    merged: &BTreeMap<(Ecosystem, String, String), Pin>,
    skipped: &[String],
) -> String {
    let ecos: Vec<Ecosystem> = {
        let mut v: Vec<Ecosystem> = merged.keys().map(|k| k.0).collect();
        v.dedup();
        v
    };
    let names: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
    let reason = set
        .reason
        .map(str::to_string)
        .unwrap_or_else(|| format!("pinned from {}", names.join(", ")));
    let mut out = format!(
        "# Written by `egressd packages import {}`: exact versions{}.\n",
        names.join(" "),
        if merged.values().any(|p| !p.sha256.is_empty()) {
            " and the sha256 of their files"
        } else {
            ""
        }
    );
    out.push_str("# settings.packages.min_age still applies to these versions.\n");
    for s in skipped {
        out.push_str(&format!("# skipped (not from a registry): {s}\n"));
    }
    out.push_str("packages:\n");
    for eco in &ecos {
        let id = if ecos.len() == 1 {
            set.id.to_string()
        } else {
            format!("{}-{}", set.id, eco.as_str())
        };
        out.push_str(&format!(
            "  - id: {id}\n    owner: {}\n    reason: {}\n    ecosystem: {}\n    allow:\n",
            quote(set.owner.trim()),
            quote(&reason),
            eco.as_str()
        ));
        for p in merged.values().filter(|p| p.eco == *eco) {
            out.push_str(&format!(
                "      - {{ name: {}, versions: {}",
                quote(&p.name),
                quote(&exact(p.eco, &p.version))
            ));
            if !p.sha256.is_empty() {
                let hs: Vec<String> = p.sha256.iter().map(|h| quote(&hex(h))).collect();
                out.push_str(&format!(", sha256: [{}]", hs.join(", ")));
            }
            out.push_str(" }\n");
        }
    }
    out
}

fn normalize_id(id: &str) -> Option<&str> {
    (!id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)))
    .then_some(id)
}

/// A YAML double-quoted scalar (JSON's string syntax is a subset).
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// The constraint that admits exactly `v`, in the ecosystem's syntax.
fn exact(eco: Ecosystem, v: &str) -> String {
    match eco {
        Ecosystem::Pypi => format!("=={v}"),
        Ecosystem::Npm => v.to_string(),
        Ecosystem::Cargo | Ecosystem::Go => format!("={v}"),
    }
}

fn perr(file: &str, line: usize, message: impl fmt::Display) -> ImportError {
    ImportError::Parse {
        file: file.to_string(),
        line,
        message: message.to_string(),
    }
}

fn check_version(
    file: &str,
    line: usize,
    eco: Ecosystem,
    name: &str,
    v: &str,
) -> Result<(), ImportError> {
    Version::parse(eco, v)
        .map(|_| ())
        .map_err(|e| perr(file, line, format!("{name}: {e}")))
}

fn sha_of(s: &str) -> Option<[u8; 32]> {
    s.strip_prefix("sha256:")
        .and_then(|h| parse_sha256_hex(h).ok())
}

fn toml_line(text: &str, span: Option<std::ops::Range<usize>>) -> usize {
    span.map_or(1, |r| {
        text[..r.start.min(text.len())].lines().count().max(1)
    })
}

#[derive(Deserialize)]
struct UvLock {
    #[serde(default)]
    package: Vec<UvPackage>,
}

#[derive(Deserialize)]
struct UvPackage {
    name: String,
    version: Option<String>,
    source: Option<toml::Table>,
    sdist: Option<UvFile>,
    #[serde(default)]
    wheels: Vec<UvFile>,
}

#[derive(Deserialize)]
struct UvFile {
    hash: Option<String>,
}

fn uv_lock(file: &str, text: &str, c: &mut Collected) -> Result<(), ImportError> {
    let lock: UvLock =
        toml::from_str(text).map_err(|e| perr(file, toml_line(text, e.span()), e.message()))?;
    for p in lock.package {
        let from_registry = p
            .source
            .as_ref()
            .is_some_and(|s| s.contains_key("registry"));
        let Some(version) = p.version.filter(|_| from_registry) else {
            c.skipped.push(format!("{file}: {}", p.name));
            continue;
        };
        check_version(file, 1, Ecosystem::Pypi, &p.name, &version)?;
        let sha256 = p
            .sdist
            .iter()
            .chain(&p.wheels)
            .filter_map(|f| f.hash.as_deref().and_then(sha_of))
            .collect();
        c.pins.push(Pin {
            eco: Ecosystem::Pypi,
            name: p.name,
            version,
            sha256,
        });
    }
    Ok(())
}

fn requirements(file: &str, text: &str, c: &mut Collected) -> Result<(), ImportError> {
    for (line, l) in logical_lines(text) {
        requirement(file, line, &l, c)?;
    }
    Ok(())
}

/// A requirements file's logical lines (a trailing backslash continues a
/// line; comments gone), with the line each starts on.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut logical: Vec<(usize, String)> = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    for (n, raw) in text.lines().enumerate() {
        if cur.is_empty() {
            start = n + 1;
        }
        let line = match raw
            .find(" #")
            .or_else(|| raw.trim_start().starts_with('#').then_some(0))
        {
            Some(i) if !raw[..i].trim_end().ends_with('\\') => &raw[..i],
            _ => raw,
        };
        match line.trim_end().strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(line);
                logical.push((start, std::mem::take(&mut cur)));
            }
        }
    }
    if !cur.is_empty() {
        logical.push((start, cur));
    }
    logical
}

/// One logical line of a requirements file: a pin, a line skipped (and
/// said), or an error.
fn requirement(file: &str, line: usize, l: &str, c: &mut Collected) -> Result<(), ImportError> {
    let l = l.trim();
    if l.is_empty() {
        return Ok(());
    }
    if l.starts_with('-') {
        if l.starts_with("-r")
            || l.starts_with("--requirement")
            || l.starts_with("-e")
            || l.starts_with("--editable")
            || l.starts_with("-c")
        {
            c.skipped.push(format!("{file}:{line}: {l}"));
        }
        return Ok(());
    }
    let mut words = l.split_whitespace();
    let spec_end = l.find(" --").unwrap_or(l.len());
    let spec = l[..spec_end].split(';').next().unwrap_or("").trim();
    let mut hashes = Vec::new();
    let mut expect_hash = false;
    for w in words.by_ref() {
        if expect_hash {
            expect_hash = false;
            hashes.push(w);
        } else if let Some(h) = w.strip_prefix("--hash=") {
            hashes.push(h);
        } else if w == "--hash" {
            expect_hash = true;
        }
    }
    if spec.contains(" @ ") || spec.contains("://") {
        c.skipped.push(format!("{file}:{line}: {spec}"));
        return Ok(());
    }
    let Some(i) = spec.find("===").or_else(|| spec.find("==")) else {
        return Err(perr(
            file,
            line,
            format!("{spec:?} is not pinned with == (an import approves exact versions)"),
        ));
    };
    let op_len = if spec[i..].starts_with("===") { 3 } else { 2 };
    let name = spec[..i].split('[').next().unwrap_or("").trim();
    let version = spec[i + op_len..].trim();
    if version.contains([',', '<', '>', '!', '~', '*']) {
        return Err(perr(
            file,
            line,
            format!("{spec:?} is not one exact version"),
        ));
    }
    normalize(Ecosystem::Pypi, name).map_err(|e| perr(file, line, e))?;
    check_version(file, line, Ecosystem::Pypi, name, version)?;
    let mut sha256 = Vec::new();
    for h in hashes {
        match sha_of(h) {
            Some(d) => sha256.push(d),
            None if h.starts_with("sha256:") => {
                return Err(perr(file, line, format!("bad hash {h:?}")))
            }
            // pip accepts sha384/sha512 too; DESIGN's pins are sha256.
            None => {}
        }
    }
    c.pins.push(Pin {
        eco: Ecosystem::Pypi,
        name: name.to_string(),
        version: version.to_string(),
        sha256,
    });
    Ok(())
}

#[derive(Deserialize)]
struct NpmLock {
    #[serde(rename = "lockfileVersion")]
    lockfile_version: Option<u32>,
    #[serde(default)]
    packages: BTreeMap<String, NpmEntry>,
}

#[derive(Deserialize)]
struct NpmEntry {
    name: Option<String>,
    version: Option<String>,
    resolved: Option<String>,
    #[serde(default)]
    link: bool,
    #[serde(default, rename = "inBundle")]
    in_bundle: bool,
}

fn package_lock(file: &str, text: &str, c: &mut Collected) -> Result<(), ImportError> {
    let lock: NpmLock = serde_json::from_str(text).map_err(|e| perr(file, e.line(), e))?;
    match lock.lockfile_version {
        Some(2 | 3) => {}
        v => {
            return Err(perr(file, 1, format!(
                "lockfileVersion {v:?}: egressd reads versions 2 and 3 (npm 7 and later; run npm install --lockfile-version 3)"
            )))
        }
    }
    for (key, e) in lock.packages {
        let Some(i) = key.rfind("node_modules/") else {
            continue; // the root package and workspaces
        };
        let path_name = &key[i + "node_modules/".len()..];
        let from_registry = e
            .resolved
            .as_deref()
            .is_none_or(|r| r.starts_with("https://") || r.starts_with("http://"))
            && e.resolved.as_deref().is_none_or(|r| r.contains("/-/"));
        let version = match e.version {
            Some(v) if !e.link && !e.in_bundle && from_registry => v,
            _ => {
                c.skipped.push(format!("{file}: {key}"));
                continue;
            }
        };
        // An alias (`"foo": "npm:bar@1"`) is installed as foo but is bar.
        let name = e.name.unwrap_or_else(|| path_name.to_string());
        check_version(file, 1, Ecosystem::Npm, &name, &version)?;
        c.pins.push(Pin {
            eco: Ecosystem::Npm,
            name,
            version,
            sha256: Vec::new(),
        });
    }
    Ok(())
}

fn pnpm_lock(file: &str, text: &str, c: &mut Collected) -> Result<(), ImportError> {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
        .map_err(|e| perr(file, e.location().map_or(1, |l| l.line()), e))?;
    let packages = match doc.get("packages") {
        Some(serde_yaml_ng::Value::Mapping(m)) => m,
        None => return Ok(()),
        Some(_) => return Err(perr(file, 1, "packages: is not a mapping")),
    };
    for (k, v) in packages {
        let Some(key) = k.as_str() else {
            return Err(perr(file, 1, "a packages: key is not a string"));
        };
        let res = v.get("resolution");
        let registry =
            res.is_none_or(|r| r.get("integrity").is_some() && r.get("tarball").is_none());
        // v9: `name@1.0.0`; v6: `/name@1.0.0(peer@2)`; v5: `/name/1.0.0`.
        let k = key.strip_prefix('/').unwrap_or(key);
        let k = k.split('(').next().unwrap_or(k);
        let (name, version) = match k[1..].rfind('@') {
            Some(i) => (&k[..i + 1], &k[i + 2..]),
            None => match k.rfind('/') {
                Some(i) => (&k[..i], &k[i + 1..]),
                None => return Err(perr(file, 1, format!("package key {key:?} has no version"))),
            },
        };
        if !registry || Version::parse(Ecosystem::Npm, version).is_err() {
            c.skipped.push(format!("{file}: {key}"));
            continue;
        }
        c.pins.push(Pin {
            eco: Ecosystem::Npm,
            name: name.to_string(),
            version: version.to_string(),
            sha256: Vec::new(),
        });
    }
    Ok(())
}

#[derive(Deserialize)]
struct CargoLock {
    #[serde(default)]
    package: Vec<CargoPackage>,
}

#[derive(Deserialize)]
struct CargoPackage {
    name: String,
    version: String,
    source: Option<String>,
    checksum: Option<String>,
}

fn cargo_lock(file: &str, text: &str, c: &mut Collected) -> Result<(), ImportError> {
    let lock: CargoLock =
        toml::from_str(text).map_err(|e| perr(file, toml_line(text, e.span()), e.message()))?;
    for p in lock.package {
        let registry = p
            .source
            .as_deref()
            .is_some_and(|s| s.starts_with("registry+") || s.starts_with("sparse+"));
        if !registry {
            c.skipped.push(format!("{file}: {} {}", p.name, p.version));
            continue;
        }
        check_version(file, 1, Ecosystem::Cargo, &p.name, &p.version)?;
        let sha256 = match p.checksum.as_deref() {
            Some(h) => {
                vec![parse_sha256_hex(h).map_err(|e| perr(file, 1, format!("{}: {e}", p.name)))?]
            }
            None => Vec::new(),
        };
        c.pins.push(Pin {
            eco: Ecosystem::Cargo,
            name: p.name,
            version: p.version,
            sha256,
        });
    }
    Ok(())
}

fn go_sum(file: &str, text: &str, c: &mut Collected) -> Result<(), ImportError> {
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        let mut it = l.split_whitespace();
        let (Some(module), Some(version), Some(hash), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(perr(
                file,
                n + 1,
                "expected <module> <version>[/go.mod] h1:<hash>",
            ));
        };
        if !hash.starts_with("h1:") {
            return Err(perr(file, n + 1, format!("unknown hash {hash:?}")));
        }
        let version = version.strip_suffix("/go.mod").unwrap_or(version);
        normalize(Ecosystem::Go, module).map_err(|e| perr(file, n + 1, e))?;
        check_version(file, n + 1, Ecosystem::Go, module, version)?;
        c.pins.push(Pin {
            eco: Ecosystem::Go,
            name: module.to_string(),
            version: version.to_string(),
            sha256: Vec::new(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::compile::tests::compile_yaml;

    fn set() -> ImportSet<'static> {
        ImportSet {
            id: "locked",
            owner: "platform",
            reason: None,
        }
    }

    fn run(files: &[(&str, &str)]) -> Result<String, ImportError> {
        let files: Vec<(&Path, &str)> = files.iter().map(|(p, t)| (Path::new(*p), *t)).collect();
        import(&files, &set())
    }

    const H1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const H2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn uv_lock_pins_versions_and_every_file_hash() {
        let lock = format!(
            r#"version = 1
requires-python = ">=3.12"

[[package]]
name = "app"
version = "0.1.0"
source = {{ editable = "." }}

[[package]]
name = "Requests"
version = "2.32.3"
source = {{ registry = "https://pypi.org/simple" }}
sdist = {{ url = "https://files.pythonhosted.org/x/requests-2.32.3.tar.gz", hash = "sha256:{H1}", size = 1 }}
wheels = [
    {{ url = "https://files.pythonhosted.org/x/requests-2.32.3-py3-none-any.whl", hash = "sha256:{H2}", size = 2 }},
]
"#
        );
        let y = run(&[("uv.lock", &lock)]).unwrap();
        assert!(
            y.contains(&format!(
                "- {{ name: \"Requests\", versions: \"==2.32.3\", sha256: [\"{H1}\", \"{H2}\"] }}"
            )),
            "{y}"
        );
        assert!(
            y.contains("# skipped (not from a registry): uv.lock: app"),
            "{y}"
        );
        let p = compile_yaml(&y, &[]).unwrap();
        let s = p.set("locked").unwrap();
        assert_eq!(
            (s.allow[0].name.as_str(), s.allow[0].sha256.len()),
            ("requests", 2)
        );
        assert_eq!(s.owner.as_ref(), "platform");
    }

    #[test]
    fn requirements_with_hashes() {
        let req = format!(
            "# generated\n--index-url https://pypi.org/simple\n-r base.txt\ncertifi==2024.8.30 \\\n    --hash=sha256:{H1} \\\n    --hash=sha256:{H2}\n    # via requests\nidna[all]==3.7 ; python_version >= \"3.8\" --hash sha256:{H1}\nurllib3===2.2.1\n"
        );
        let y = run(&[("requirements.txt", &req)]).unwrap();
        assert!(
            y.contains(&format!(
                "{{ name: \"certifi\", versions: \"==2024.8.30\", sha256: [\"{H1}\", \"{H2}\"] }}"
            )),
            "{y}"
        );
        assert!(
            y.contains(&format!(
                "{{ name: \"idna\", versions: \"==3.7\", sha256: [\"{H1}\"] }}"
            )),
            "{y}"
        );
        assert!(
            y.contains("{ name: \"urllib3\", versions: \"==2.2.1\" }"),
            "{y}"
        );
        assert!(
            y.contains("# skipped (not from a registry): requirements.txt:3: -r base.txt"),
            "{y}"
        );
        compile_yaml(&y, &[]).unwrap();
        let e = run(&[("requirements.txt", "a==1\nrequests>=2\n")]).unwrap_err();
        assert_eq!(e.to_string(), "requirements.txt:2: \"requests>=2\" is not pinned with == (an import approves exact versions)");
    }

    #[test]
    fn package_lock_v3() {
        let lock = r#"{
  "name": "app", "lockfileVersion": 3, "requires": true,
  "packages": {
    "": { "name": "app", "dependencies": { "lodash": "^4" } },
    "node_modules/lodash": { "version": "4.17.21", "resolved": "https://registry.npmjs.org/lodash/-/lodash-4.17.21.tgz", "integrity": "sha512-v2k=" },
    "node_modules/@types/node": { "version": "20.1.0", "resolved": "https://registry.npmjs.org/@types/node/-/node-20.1.0.tgz", "integrity": "sha512-x" },
    "node_modules/a/node_modules/lodash": { "version": "3.10.1", "resolved": "https://registry.npmjs.org/lodash/-/lodash-3.10.1.tgz" },
    "node_modules/alias": { "name": "real-pkg", "version": "1.0.0", "resolved": "https://registry.npmjs.org/real-pkg/-/real-pkg-1.0.0.tgz" },
    "node_modules/local": { "resolved": "packages/local", "link": true },
    "node_modules/gitdep": { "version": "1.0.0", "resolved": "git+ssh://git@github.com/x/y.git#abc" }
  }
}"#;
        let y = run(&[("package-lock.json", lock)]).unwrap();
        for want in [
            "\"lodash\", versions: \"4.17.21\"",
            "\"lodash\", versions: \"3.10.1\"",
            "\"@types/node\", versions: \"20.1.0\"",
            "\"real-pkg\", versions: \"1.0.0\"",
        ] {
            assert!(y.contains(want), "{want}\n{y}");
        }
        assert!(
            y.contains("skipped (not from a registry): package-lock.json: node_modules/gitdep"),
            "{y}"
        );
        assert!(!y.contains("alias") && !y.contains("sha256"), "{y}");
        compile_yaml(&y, &[]).unwrap();
        let e = run(&[(
            "package-lock.json",
            r#"{"lockfileVersion":1,"dependencies":{}}"#,
        )])
        .unwrap_err();
        assert!(e.to_string().contains("lockfileVersion Some(1)"), "{e}");
    }

    #[test]
    fn pnpm_lock_v6_and_v9() {
        let v9 = "lockfileVersion: '9.0'\npackages:\n  '@babel/core@7.24.0':\n    resolution: {integrity: sha512-x}\n  lodash@4.17.21:\n    resolution: {integrity: sha512-y}\n  local@file:pkg:\n    resolution: {directory: pkg, type: directory}\n";
        let y = run(&[("pnpm-lock.yaml", v9)]).unwrap();
        assert!(
            y.contains("\"@babel/core\", versions: \"7.24.0\"")
                && y.contains("\"lodash\", versions: \"4.17.21\""),
            "{y}"
        );
        assert!(
            y.contains("skipped (not from a registry): pnpm-lock.yaml: local@file:pkg"),
            "{y}"
        );
        let v6 = "lockfileVersion: '6.0'\npackages:\n  /@types/react@18.2.0(react@18.2.0):\n    resolution: {integrity: sha512-x}\n  /ms/2.1.3:\n    resolution: {integrity: sha512-z}\n";
        let y = run(&[("pnpm-lock.yaml", v6)]).unwrap();
        assert!(
            y.contains("\"@types/react\", versions: \"18.2.0\"")
                && y.contains("\"ms\", versions: \"2.1.3\""),
            "{y}"
        );
        compile_yaml(&y, &[]).unwrap();
    }

    #[test]
    fn cargo_lock_and_go_sum_in_one_import() {
        let lock = format!(
            "version = 4\n\n[[package]]\nname = \"app\"\nversion = \"0.1.0\"\n\n[[package]]\nname = \"serde\"\nversion = \"1.0.200\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"{H1}\"\n\n[[package]]\nname = \"gitdep\"\nversion = \"0.1.0\"\nsource = \"git+https://github.com/x/y#abc\"\n"
        );
        let sum = "golang.org/x/text v0.14.0 h1:ScX5w1eTa3QqT8oi6+ziP7dTV1S2+ALU0bI+0zXKWiQ=\ngolang.org/x/text v0.14.0/go.mod h1:18ZOQIKpY8NJVqYksKHtTdi31H5itFRjB5/qKTNYzSU=\ngithub.com/BurntSushi/toml v1.3.2/go.mod h1:CxXYINrC8qIiEnFrOxCa7Jy5BFHlXnUU2pbicEuybL4=\ngithub.com/x/y v2.0.0+incompatible h1:abc=\n";
        let y = run(&[("Cargo.lock", &lock), ("go.sum", sum)]).unwrap();
        assert!(
            y.contains("- id: locked-cargo") && y.contains("- id: locked-go"),
            "{y}"
        );
        assert!(
            y.contains(&format!(
                "{{ name: \"serde\", versions: \"=1.0.200\", sha256: [\"{H1}\"] }}"
            )),
            "{y}"
        );
        assert_eq!(
            y.matches("golang.org/x/text").count(),
            1,
            "zip and go.mod lines are one version\n{y}"
        );
        assert!(
            y.contains("\"github.com/BurntSushi/toml\", versions: \"=v1.3.2\""),
            "{y}"
        );
        assert!(y.contains("\"=v2.0.0+incompatible\""), "{y}");
        assert!(
            y.contains("skipped (not from a registry): Cargo.lock: gitdep 0.1.0"),
            "{y}"
        );
        let p = compile_yaml(&y, &[]).unwrap();
        assert_eq!(p.sets.len(), 2);
    }

    #[test]
    fn bad_input_is_an_error_that_says_where() {
        assert!(matches!(
            run(&[("Gemfile.lock", "")]),
            Err(ImportError::Unknown(_))
        ));
        let e = run(&[("Cargo.lock", "[[package]]\nname = 1\n")]).unwrap_err();
        assert!(e.to_string().starts_with("Cargo.lock:2:"), "{e}");
        let e = run(&[("go.sum", "golang.org/x/text v0.14 h1:x=\n")]).unwrap_err();
        assert!(e.to_string().starts_with("go.sum:1: "), "{e}");
        assert!(run(&[("Cargo.lock", "version = 4\n")])
            .unwrap_err()
            .to_string()
            .contains("no registry package"));
        let files = [(Path::new("go.sum"), "")];
        let e = import(
            &files,
            &ImportSet {
                id: "Bad Id",
                owner: "o",
                reason: None,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("invalid set id"), "{e}");
    }
}
