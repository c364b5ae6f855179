//! Raw YAML → validated, compiled [`Policy`]: the one pure function both
//! the first load and every reload go through ([`compile_digested`];
//! [`compile`] is it from scratch), one call per concern: every file parsed
//! (an empty one refused: it is a half-written file), the settings
//! ([`settings`]), the exceptions and the matcher over them
//! ([`exceptions`]), the package sets ([`packages`]). Every error is
//! collected with its file:line:column ([`locate`]); a policy with any
//! error is refused whole.
//!
//! A reload passes the policy it replaces. A file whose name and content
//! are unchanged since that policy was compiled, and whose exceptions
//! depend on nothing but its own text, is not parsed again: its compiled
//! exceptions are copied from that policy. What else can change an
//! unchanged file's output keeps it parsed ([`Reuse`]): `settings:` and
//! package sets (the other concerns read their raw form), injected headers
//! (a `${env:…}` or `${file:…}` value can change while the file does not),
//! and `clients:` patterns once the clients' ids differ (they compile to
//! indices into that list). Expiry is kept as a time and compared at decide
//! time, so the clock changes nothing here. Duplicate ids across files are
//! checked over every exception, copied or parsed. Any error sends the
//! compile back to the start without the previous policy, so that errors
//! are always exactly those of a compile from scratch; a test holds both
//! ways to the same policy and the same errors over edit sequences.
//!
//! Owns validation. Does not own reading files (`read_sources`) or the
//! serde mirror of the format (`raw`).

mod exceptions;
mod locate;
mod packages;
mod settings;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::ops::Range;

use super::raw::RawFile;
use super::{Client, Diagnostic, Exception, LoadError, Policy, Source};

/// Validates and compiles policy sources from scratch. `env` supplies
/// `${env:…}` values.
pub fn compile(
    sources: &[Source],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, LoadError> {
    compile_digested(sources, &digest_sources(sources), None, env)
}

/// Validates and compiles policy sources: the one function both the first
/// load and every reload go through. `digests` is `digest_sources(sources)`
/// (the reloader compares it first; hashing 13 MB twice is 20 ms).
///
/// `previous`, the policy this one will replace: the exceptions of files
/// unchanged since it was compiled are copied from it rather than parsed
/// again (see the module header for what keeps a file parsed). The result
/// is the one `previous: None` gives for the same sources, errors
/// included.
pub fn compile_digested(
    sources: &[Source],
    digests: &Digests,
    previous: Option<&Policy>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, LoadError> {
    if let Some(previous) = previous {
        // An error may be about a copied file (an id it has is now in
        // another file too), and a copied exception keeps its line, not
        // its column: a compile from scratch locates it.
        if let Ok(p) = build(sources, digests, Some(previous), env) {
            return Ok(p);
        }
    }
    build(sources, digests, None, env)
}

/// One compile; with `previous`, unchanged files are copied from it.
fn build(
    sources: &[Source],
    digests: &Digests,
    previous: Option<&Policy>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, LoadError> {
    assert_eq!(
        digests.files.len(),
        sources.len(),
        "digests of other sources"
    );
    let mut files = unchanged(sources, digests, previous);
    parse(&mut files, |_| false)?;
    let mut errors = Errors::default();
    let (settings, clients) = settings::settings(&files, &mut errors);
    if previous.is_some_and(|p| !same_ids(&p.clients, &clients)) {
        parse(&mut files, |reuse| reuse == Reuse::WithSameClients)?;
    }
    let (exceptions, matcher, ranges) =
        exceptions::exceptions(&files, &clients, &settings, env, &mut errors);
    let packages = packages::packages(&files, &settings, &clients, &exceptions, env, &mut errors);
    if !errors.0.is_empty() {
        return Err(LoadError(errors.0));
    }
    let compiled_files = files
        .iter()
        .zip(&digests.files)
        .zip(ranges)
        .map(|((f, digest), exceptions)| FileRecord {
            name: file_name(f.src).into(),
            digest: *digest,
            exceptions,
            reuse: f.reuse,
            parsed: matches!(f.body, Body::Raw(_)),
        })
        .collect();
    Ok(Policy {
        settings,
        clients,
        exceptions,
        files: sources.iter().map(|s| s.path.clone()).collect(),
        digest: digests.policy,
        matcher,
        packages,
        compiled_files,
        only_client: None,
    })
}

/// What a policy keeps of each of its files, so that the next compile can
/// copy an unchanged file's exceptions from it: the file's name, the digest
/// of its content, where its exceptions are. Not the parsed file: kept for
/// every file of a 100k-exception policy that would be tens of MiB resident
/// for as long as the policy serves.
#[derive(Debug, Clone)]
pub(super) struct FileRecord {
    /// The file's name, not its path: `serve --policy policy/` loads the
    /// files by relative paths, the reloader by absolute ones.
    name: Box<OsStr>,
    digest: [u8; 32],
    /// Its exceptions, a range of [`Policy::exceptions`].
    exceptions: Range<usize>,
    reuse: Reuse,
    /// Parsed by the compile that built the policy (not copied).
    pub(super) parsed: bool,
}

/// Whether the exceptions compiled from a file can be copied into the next
/// policy while the file is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// They depend on the file's text alone.
    Always,
    /// An exception names `clients:` patterns, compiled to indices into the
    /// clients list: they hold while the clients' ids are the same, in the
    /// same order.
    WithSameClients,
    /// The file has `settings:` or package sets (the other concerns read
    /// their raw form), or injected headers (a `${env:…}` or `${file:…}`
    /// value can change while the file does not).
    Never,
}

impl Reuse {
    fn of(f: &RawFile) -> Reuse {
        if f.settings.is_some()
            || !f.packages.is_empty()
            || f.exceptions.iter().any(|e| e.inject.is_some())
        {
            Reuse::Never
        } else if f.exceptions.iter().any(|e| e.clients.is_some()) {
            Reuse::WithSameClients
        } else {
            Reuse::Always
        }
    }
}

/// One policy file as the compile takes it.
struct File<'s, 'p> {
    src: &'s Source,
    body: Body<'p>,
    /// For a copied file, its [`Reuse`] when it was parsed.
    reuse: Reuse,
}

enum Body<'p> {
    /// Not read yet.
    Unparsed,
    Raw(Box<RawFile>),
    /// Unchanged since the previous policy: its exceptions there.
    Copied(&'p [Exception]),
}

impl File<'_, '_> {
    /// Its parsed form, if this compile parsed it.
    fn raw(&self) -> Option<&RawFile> {
        match &self.body {
            Body::Raw(f) => Some(f),
            _ => None,
        }
    }
}

/// Every source, copied from `previous` where it may be (same name, same
/// content, not [`Reuse::Never`]), otherwise still to be parsed.
fn unchanged<'s, 'p>(
    sources: &'s [Source],
    digests: &Digests,
    previous: Option<&'p Policy>,
) -> Vec<File<'s, 'p>> {
    let before: HashMap<&OsStr, &FileRecord> = previous
        .iter()
        .flat_map(|p| &p.compiled_files)
        .map(|r| (&*r.name, r))
        .collect();
    sources
        .iter()
        .zip(&digests.files)
        .map(|(src, digest)| {
            let copied = before.get(file_name(src)).and_then(|r| {
                let p = previous?;
                // Grant files are always parsed: they are small, and the
                // ceiling they are held to lives in another file.
                (r.digest == *digest && r.reuse != Reuse::Never && !src.grant)
                    .then(|| (Body::Copied(&p.exceptions[r.exceptions.clone()]), r.reuse))
            });
            let (body, reuse) = copied.unwrap_or((Body::Unparsed, Reuse::Never));
            File { src, body, reuse }
        })
        .collect()
}

fn same_ids(a: &[Client], b: &[Client]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.id == b.id)
}

/// Parses the files not read yet, and the copied ones whose [`Reuse`]
/// `also` names; any file that is empty or does not parse stops the
/// compile here, with all such files reported.
fn parse(files: &mut [File<'_, '_>], also: impl Fn(Reuse) -> bool) -> Result<(), LoadError> {
    let mut errors: Vec<Diagnostic> = Vec::new();
    for f in files.iter_mut() {
        let todo = match f.body {
            Body::Unparsed => true,
            Body::Copied(_) => also(f.reuse),
            Body::Raw(_) => false,
        };
        if !todo {
            continue;
        }
        match parse_file(f.src) {
            Ok(raw) => {
                f.reuse = Reuse::of(&raw);
                f.body = Body::Raw(Box::new(raw));
            }
            Err(d) => errors.push(d),
        }
    }
    if !errors.is_empty() {
        return Err(LoadError(errors));
    }
    Ok(())
}

/// One file as YAML; an empty one is refused.
fn parse_file(src: &Source) -> Result<RawFile, Diagnostic> {
    if src.text.trim().is_empty()
        || src
            .text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return Err(Diagnostic {
            file: src.path.clone(),
            line: 1,
            column: 1,
            message: "policy file is empty (a half-written file is refused; delete the file to remove it)".into(),
        });
    }
    // The fast front end where it follows the file; serde_yaml_ng for
    // the rest, and for every error (its file:line:column).
    if let Some(f) = super::yaml::parse(&src.text) {
        return Ok(f);
    }
    serde_yaml_ng::from_str::<RawFile>(&src.text).map_err(|e| Diagnostic::from_yaml(&src.path, &e))
}

/// The errors found so far, each located in its file.
#[derive(Default)]
struct Errors(Vec<Diagnostic>);

impl Errors {
    fn at(&mut self, src: &Source, (line, column): (usize, usize), message: String) {
        self.0.push(Diagnostic {
            file: src.path.clone(),
            line,
            column,
            message,
        });
    }
}

/// A policy's digest and each of its files': what a reload compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    /// SHA-256 over every file's name and content digest, in order: equal
    /// digests, equal policies. Names, not paths: the same policy read as
    /// `policy/` at start and as its absolute path by the reloader is the
    /// same policy.
    pub policy: [u8; 32],
    /// SHA-256 of each file's content, in the order of the sources.
    files: Vec<[u8; 32]>,
}

/// Each file's content digest, and the policy's over them (each byte is
/// hashed once).
pub fn digest_sources(sources: &[Source]) -> Digests {
    let sha256 = |b: &[u8]| -> [u8; 32] {
        ring::digest::digest(&ring::digest::SHA256, b)
            .as_ref()
            .try_into()
            .expect("sha256 is 32 bytes")
    };
    let files: Vec<[u8; 32]> = sources.iter().map(|s| sha256(s.text.as_bytes())).collect();
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for (src, digest) in sources.iter().zip(&files) {
        ctx.update(file_name(src).as_encoded_bytes());
        // A name never holds a NUL, and a digest is 32 bytes: unambiguous.
        ctx.update(&[0]);
        ctx.update(digest);
    }
    let policy = ctx
        .finish()
        .as_ref()
        .try_into()
        .expect("sha256 is 32 bytes");
    Digests { policy, files }
}

fn file_name(src: &Source) -> &OsStr {
    src.path.file_name().unwrap_or(src.path.as_os_str())
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;
    use std::path::PathBuf;

    use super::*;
    use crate::policy::host::{parse_target, HostPattern, Target};

    /// Everything a compiled policy is, as text: two policies with the
    /// same summary decide alike and report alike. Injected values are
    /// written out (their `Debug` hides them); the matcher by the
    /// candidates it finds for every name and range the policy names.
    fn summary(p: &Policy) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "settings {:?}", p.settings);
        let _ = writeln!(s, "clients {:?}", p.clients);
        let _ = writeln!(s, "files {:?} digest {:?}", p.files, p.digest);
        let _ = writeln!(
            s,
            "packages {:?} {:?} {:?}",
            p.packages.settings, p.packages.sets, p.packages.contact
        );
        for r in &p.compiled_files {
            let _ = writeln!(
                s,
                "file {:?} {:?} {:?} {:?}",
                r.name, r.digest, r.exceptions, r.reuse
            );
        }
        for e in &p.exceptions {
            let _ = writeln!(s, "{e:?}");
            for h in e.inject() {
                let _ = writeln!(s, "  inject {} = {:?}", h.name, h.value.to_str());
            }
            let mut targets: Vec<Target> = e
                .hosts
                .iter()
                .filter_map(|h| {
                    parse_target(&match h {
                        HostPattern::Exact(n) => n.to_string(),
                        HostPattern::Subdomains(n) => format!("x.{n}"),
                        HostPattern::LabelGlob {
                            prefix,
                            suffix,
                            rest,
                        } => format!("{prefix}{suffix}.{rest}"),
                    })
                    .ok()
                })
                .collect();
            targets.extend(e.cidrs.iter().map(|n| Target::Ip(n.network())));
            for t in targets {
                let mut found = Vec::new();
                p.matcher.for_each_candidate(&t, |i| found.push(i));
                found.sort_unstable();
                let _ = writeln!(s, "  {t:?} -> {found:?}");
            }
        }
        s
    }

    fn src(dir: &str, name: &str, text: &str) -> Source {
        Source {
            path: PathBuf::from(dir).join(name),
            text: text.into(),
            grant: false,
        }
    }

    const SETTINGS: &str = "settings:
  contact: \"#sec\"
  clients:
    - id: ci-runner
      sources: [10.8.0.0/16]
    - id: agent-a
      sources: [10.9.0.0/16]
  packages: { enforce: [pypi] }
";
    const A: &str = "exceptions:
  - id: a1
    owner: team-a
    reason: r
    hosts: [a1.test, \"*.a1.test\"]
  - id: a2
    owner: team-a
    reason: r
    expires: 2030-01-01
    clients: [\"ci-*\"]
    hosts: [a2.test]
    ports: [443]
  - {id: a3, owner: team-b, reason: r, hosts: [\"api-*.a3.test\"], cidrs: [44.0.0.0/24]}
";
    const B: &str = "exceptions:
  - id: b1
    owner: team-b
    reason: r
    hosts: [b1.test]
    methods: [GET, HEAD]
    paths: [\"/v1/**\"]
  - id: b2
    owner: team-a
    reason: r
    cidrs: [10.1.0.0/16]
    ports: [5432]
";
    const C: &str = "exceptions:
  - id: c1
    owner: team-c
    reason: r
    hosts: [c1.test]
    inject:
      headers: { Authorization: \"Bearer ${env:TOKEN}\" }
";
    const D: &str = "exceptions:
  - id: pypi
    owner: team-d
    reason: r
    hosts: [pypi.org, files.pythonhosted.org]
packages:
  - id: py-runtime
    owner: o
    reason: r
    ecosystem: pypi
    clients: [\"ci-*\"]
    allow: [\"requests >=2.31,<3\"]
";

    /// Over each edit of a sequence, compiling with the previous good
    /// policy (as the reloader does) gives exactly what compiling from
    /// scratch gives: the same policy, or the same errors at the same
    /// file:line:column.
    #[test]
    fn a_compile_that_copies_unchanged_files_equals_one_from_scratch() {
        let b_edited = B.replace("b1.test", "b1.example");
        let e = "exceptions:\n  - id: e1\n    owner: o\n    reason: r\n    hosts: [e1.test]\n";
        let e_dup = e.replace("id: e1", "id: a1");
        let z_dup = "exceptions:\n  - id: b1\n    owner: o\n    reason: r\n    hosts: [z.test]\n";
        let a_broken = A.replace("  - id: a2\n    owner: team-a\n", "  - id: a2\n");
        let b_unparsable = B.replace("hosts: [b1.test]", "hosts: [b1.test");
        let a_with_settings = format!("{SETTINGS}{A}");
        let new_client = SETTINGS.replace(
            "  clients:\n",
            "  clients:\n    - id: ci-zero\n      sources: [10.7.0.0/16]\n",
        );
        let base = [
            ("00-settings.yaml", SETTINGS),
            ("10-a.yaml", A),
            ("20-b.yaml", B),
            ("30-c.yaml", C),
            ("40-d.yaml", D),
        ];
        // The base with some files replaced, added (`Some`) or removed.
        let with = |changes: &[(&'static str, Option<&str>)]| -> Vec<(&'static str, String)> {
            let mut files: Vec<(&'static str, String)> =
                base.iter().map(|(n, t)| (*n, t.to_string())).collect();
            for (name, text) in changes {
                files.retain(|(n, _)| n != name);
                if let Some(t) = text {
                    files.push((name, t.to_string()));
                }
            }
            files.sort();
            files
        };
        let settings = "00-settings.yaml";
        // Each step: what it does, the files then, `${env:TOKEN}`, and how
        // many files a compile that may copy parses (`None`: an error).
        // Settings, the injecting file and the package file are always
        // parsed: 3 of the base's 5 when nothing changed.
        let steps = [
            ("first load", with(&[]), "t1", Some(5)),
            ("nothing changed", with(&[]), "t1", Some(3)),
            (
                "one file changed",
                with(&[("20-b.yaml", Some(&b_edited))]),
                "t1",
                Some(4),
            ),
            (
                "a file added",
                with(&[("20-b.yaml", Some(&b_edited)), ("25-e.yaml", Some(e))]),
                "t1",
                Some(4),
            ),
            (
                "a file removed",
                with(&[("20-b.yaml", Some(&b_edited))]),
                "t1",
                Some(3),
            ),
            (
                "a duplicate id in a new file",
                with(&[("25-e.yaml", Some(&e_dup))]),
                "t1",
                None,
            ),
            (
                "a duplicate id found in an unchanged file",
                with(&[("05-z.yaml", Some(z_dup))]),
                "t1",
                None,
            ),
            ("duplicates gone", with(&[]), "t1", Some(4)),
            ("a secret changed, no file did", with(&[]), "t2", Some(3)),
            (
                "settings moved to another file",
                with(&[(settings, None), ("10-a.yaml", Some(&a_with_settings))]),
                "t2",
                Some(3),
            ),
            (
                "settings moved back",
                with(&[("10-a.yaml", Some(A))]),
                "t2",
                Some(4),
            ),
            (
                "settings in two files",
                with(&[("10-a.yaml", Some(&a_with_settings))]),
                "t2",
                None,
            ),
            (
                "a client added before the others",
                with(&[(settings, Some(&new_client))]),
                "t2",
                Some(4),
            ),
            (
                "a file broken",
                with(&[
                    (settings, Some(&new_client)),
                    ("10-a.yaml", Some(&a_broken)),
                ]),
                "t2",
                None,
            ),
            (
                "a file unparsable",
                with(&[
                    (settings, Some(&new_client)),
                    ("20-b.yaml", Some(&b_unparsable)),
                ]),
                "t2",
                None,
            ),
            (
                "a file emptied",
                with(&[
                    (settings, Some(&new_client)),
                    ("20-b.yaml", Some("# nothing\n")),
                ]),
                "t2",
                None,
            ),
            (
                "fixed",
                with(&[(settings, Some(&new_client))]),
                "t2",
                Some(3),
            ),
            (
                "a file renamed",
                with(&[
                    (settings, Some(&new_client)),
                    ("20-b.yaml", None),
                    ("21-b.yaml", Some(B)),
                ]),
                "t2",
                Some(4),
            ),
            ("back to the start", with(&[]), "t1", Some(5)),
        ];
        // The first load reads `policy/` as typed, the reloader by its
        // absolute path: copied exceptions must name the path read now.
        let mut serving: Option<Policy> = None;
        for (i, (what, files, token, parsed)) in steps.iter().enumerate() {
            let dir = if i == 0 {
                "policy"
            } else {
                "/srv/egressd/policy"
            };
            let sources: Vec<Source> = files.iter().map(|(n, t)| src(dir, n, t)).collect();
            let env = |n: &str| (n == "TOKEN").then(|| token.to_string());
            let scratch = compile(&sources, &env);
            let digests = digest_sources(&sources);
            let copying = compile_digested(&sources, &digests, serving.as_ref(), &env);
            match (&scratch, &copying) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(summary(a), summary(b), "step {i}: {what}");
                    assert_eq!(a.files_parsed(), sources.len(), "step {i}");
                    assert_eq!(Some(b.files_parsed()), *parsed, "step {i}: {what}");
                }
                (Err(a), Err(b)) => {
                    assert_eq!(a.0, b.0, "step {i}: {what}");
                    assert!(parsed.is_none(), "step {i}: {what}: {a}");
                }
                _ => panic!(
                    "step {i}: {}: from scratch {:?}, copying {:?}",
                    what,
                    scratch.as_ref().map(|p| p.exceptions.len()),
                    copying.as_ref().map(|p| p.exceptions.len())
                ),
            }
            if let Ok(p) = copying {
                serving = Some(p);
            }
        }
    }

    /// The duplicate that only a copied file shows is still reported where
    /// a compile from scratch reports it: at its `id:`, column included.
    #[test]
    fn a_duplicate_in_an_unchanged_file_is_located_by_line_and_column() {
        let one = [src("p", "10-a.yaml", A), src("p", "20-b.yaml", B)];
        let before = compile(&one, &|_| None).unwrap();
        let z = "exceptions:\n  - id: b2\n    owner: o\n    reason: r\n    hosts: [z.test]\n";
        let two = [
            src("p", "05-z.yaml", z),
            src("p", "10-a.yaml", A),
            src("p", "20-b.yaml", B),
        ];
        let err =
            compile_digested(&two, &digest_sources(&two), Some(&before), &|_| None).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!(
            err.to_string(),
            "error: p/20-b.yaml:8:5: duplicate exception id \"b2\" (also in p/05-z.yaml)"
        );
    }

    /// A name is part of the digest: the same content under another name
    /// is another policy.
    #[test]
    fn digests_change_with_a_files_name_and_content() {
        let d = |files: &[(&str, &str)]| {
            let s: Vec<Source> = files.iter().map(|(n, t)| src("p", n, t)).collect();
            digest_sources(&s)
        };
        let base = d(&[("a.yaml", A), ("b.yaml", B)]);
        assert_eq!(base, d(&[("a.yaml", A), ("b.yaml", B)]));
        assert_ne!(base.policy, d(&[("a.yaml", A), ("c.yaml", B)]).policy);
        assert_ne!(base.policy, d(&[("a.yaml", B), ("b.yaml", A)]).policy);
        assert_ne!(base.policy, d(&[("a.yaml", A)]).policy);
        assert_eq!(base.files[0], d(&[("x.yaml", A)]).files[0]);
    }
}
