//! `exceptions:` of every file, in load order: each validated into an
//! [`Exception`] (owner, reason, a destination, patterns that compile,
//! credentials that expand) and indexed in the [`Matcher`].
//!
//! Glob sets are built once per distinct pattern list ([`Globs`]):
//! generated policies repeat the same few lists thousands of times, and a
//! GlobSet costs tens of microseconds to build.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use http::{HeaderName, HeaderValue};

use super::locate::{by_value, locate, locate_all};
use super::{Body, Errors, File};
use crate::policy::grant::{check_ceiling, Candidate, Grant, GrantSettings};
use crate::policy::host::HostPattern;
use crate::policy::matcher::Matcher;
use crate::policy::raw::{RawBody, RawException, RawFile, RawGit, RawUpload};
use crate::policy::upload::{UploadRule, MAX_PER_SECS};
use crate::policy::{
    body, git, path, qtype, Client, ClientIdx, Exception, InjectedHeader, Rules, Settings, Source,
    DEFAULT_PORTS,
};

/// Every exception of every file, the matcher over them, and each file's
/// range of the list. A duplicate id is reported at the duplicate (and
/// the duplicate left out).
pub(super) fn exceptions(
    files: &[File<'_, '_>],
    clients: &[Client],
    settings: &Settings,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Errors,
) -> (Vec<Exception>, Matcher, Vec<Range<usize>>) {
    let (total, hosts) = room(files);
    // Exactly the room needed: growing by doubling would leave 100k
    // exceptions in room for 131k (4 MB never used).
    let mut exceptions = Vec::with_capacity(total);
    let mut ranges = Vec::with_capacity(files.len());
    let mut ids: HashMap<&str, &Path> = HashMap::with_capacity(total);
    let mut matcher = Matcher::with_room_for(hosts);
    let mut globs = Globs::default();
    // Owners repeat across thousands of exceptions: one string each.
    let mut owners: HashMap<&str, Arc<str>> = HashMap::new();
    for f in files {
        let src = f.src;
        let file: Arc<Path> = src.path.as_path().into();
        let start = exceptions.len();
        match &f.body {
            Body::Raw(raw) => {
                if src.grant {
                    grant_file(src, raw, errs);
                }
                let mut places = Places::new(&src.text);
                for r in &raw.exceptions {
                    let id = r.id.0.as_str();
                    let at = places.next(id);
                    if let Some(prev) = ids.insert(id, &src.path) {
                        errs.at(
                            src,
                            at,
                            format!("duplicate exception id {id:?} (also in {})", prev.display()),
                        );
                        continue;
                    }
                    let owner = r.owner.as_deref().map(str::trim).unwrap_or("");
                    let owner = owners.entry(owner).or_insert_with(|| owner.into()).clone();
                    let place = Place {
                        src,
                        file: file.clone(),
                        at,
                    };
                    let mut e = exception(r, place, owner, clients, &mut globs, env, errs);
                    grant(r, &mut e, src, at, &settings.grants, errs);
                    add(&mut exceptions, &mut matcher, e);
                }
            }
            Body::Copied(copied) => {
                for e in *copied {
                    if let Some(prev) = ids.insert(&*e.id, &src.path) {
                        // Only the line is kept: the compile from scratch
                        // this error sends the caller back to places it.
                        errs.at(
                            src,
                            (e.line, 1),
                            format!(
                                "duplicate exception id {:?} (also in {})",
                                e.id,
                                prev.display()
                            ),
                        );
                        continue;
                    }
                    let owner = owners
                        .entry(&*e.owner)
                        .or_insert_with(|| (*e.owner).into())
                        .clone();
                    let e = copy(e, file.clone(), owner, &mut globs);
                    add(&mut exceptions, &mut matcher, e);
                }
            }
            Body::Unparsed => unreachable!("every file is parsed or copied by now"),
        }
        ranges.push(start..exceptions.len());
    }
    (exceptions, matcher, ranges)
}

/// How many exceptions, and host patterns, the files hold.
fn room(files: &[File<'_, '_>]) -> (usize, usize) {
    let (mut total, mut hosts) = (0, 0);
    for f in files {
        match &f.body {
            Body::Raw(raw) => {
                total += raw.exceptions.len();
                hosts += raw.exceptions.iter().map(|r| r.hosts.len()).sum::<usize>();
            }
            Body::Copied(copied) => {
                total += copied.len();
                hosts += copied.iter().map(|e| e.hosts.len()).sum::<usize>();
            }
            Body::Unparsed => unreachable!("every file is parsed or copied by now"),
        }
    }
    (total, hosts)
}

/// Appends `e`, its hosts and CIDRs indexed in `matcher`.
fn add(exceptions: &mut Vec<Exception>, matcher: &mut Matcher, e: Exception) {
    let idx = exceptions.len() as u32;
    for h in &e.hosts {
        matcher.add_host(h, idx);
    }
    for c in &e.cidrs {
        matcher.add_cidr(c, idx);
    }
    exceptions.push(e);
}

/// A file of the grants directory holds one exception and nothing else.
fn grant_file(src: &Source, raw: &RawFile, errs: &mut Errors) {
    if raw.settings.is_some() {
        errs.at(
            src,
            locate(&src.text, "settings", ""),
            "a grant file holds no settings:".into(),
        );
    }
    if !raw.packages.is_empty() {
        errs.at(
            src,
            locate(&src.text, "packages", ""),
            "a grant file holds no packages:".into(),
        );
    }
    if raw.exceptions.len() != 1 {
        errs.at(
            src,
            locate(&src.text, "exceptions", ""),
            format!(
                "a grant file holds exactly one exception, not {}",
                raw.exceptions.len()
            ),
        );
    }
}

/// `grant:` of one exception: only in a grant file, required there, and the
/// grant held to the ceiling (`settings.grants`) as `egressd grant` held it
/// when it wrote the file: a file edited by hand past it is refused.
fn grant(
    r: &RawException,
    e: &mut Exception,
    src: &Source,
    at: (usize, usize),
    ceiling: &GrantSettings,
    errs: &mut Errors,
) {
    let id = &*e.id;
    let Some(g) = &r.grant else {
        if src.grant {
            errs.at(
                src,
                at,
                format!("exception {id:?} in a grant file has no grant:"),
            );
        }
        return;
    };
    if !src.grant {
        errs.at(
            src,
            at,
            format!("exception {id:?} has grant:, which only files of the grants directory may have (egressd grant writes them)"),
        );
        return;
    }
    let Some(expires) = r.expires.as_ref().map(|d| d.0) else {
        errs.at(src, at, format!("grant {id:?} has no expires:"));
        return;
    };
    let hosts: Vec<String> = r.hosts.iter().map(|h| h.0.to_string()).collect();
    let candidate = Candidate {
        hosts: &hosts,
        has_cidrs: !r.cidrs.is_empty(),
        has_inject: r.inject.is_some(),
        ttl_secs: expires - g.granted_at.0,
        max_uses: g.max_uses,
    };
    if let Err(refusal) = check_ceiling(&candidate, ceiling) {
        errs.at(src, at, format!("grant {id:?} {refusal}"));
        return;
    }
    if r.clients
        .as_ref()
        .is_some_and(|c| c.iter().any(|p| p.contains('*')))
    {
        errs.at(
            src,
            at,
            format!("grant {id:?} names a client pattern; a grant names clients exactly"),
        );
        return;
    }
    let grant = Grant::new(
        g.from_request.trim().into(),
        g.granted_by.trim().into(),
        g.granted_at.0,
        g.max_uses,
    );
    e.set_grant(grant);
}

/// An exception of an unchanged file, as compiling its text again gives
/// it, placed in the file's path as read now. Every part is a fresh copy
/// (shared lists through `globs`, as a compile shares them): nothing of
/// the policy it came from is kept alive, so that one is freed whole,
/// pages and all, when it is retired.
fn copy(e: &Exception, file: Arc<Path>, owner: Arc<str>, globs: &mut Globs) -> Exception {
    let rules = e.rules().map(|r| {
        let mut r = r.clone();
        if let Some(paths) = &mut r.paths {
            // Compiled before, so the patterns are valid: no report.
            *paths = globs.paths(&r.path_patterns, &e.id, &mut |_| {});
        }
        r
    });
    Exception::new(
        (*e.id).into(),
        owner,
        e.reason.clone(),
        e.hosts.clone(),
        e.cidrs.clone(),
        globs.ports_of(&e.ports),
        (file, e.line),
        rules.unwrap_or_default(),
    )
}

/// Where each exception of one file is: its `id:` line.
struct Places<'t> {
    /// Every `id:` entry of the file, in document order, found in one pass
    /// (locating each exception by scanning the whole file made loading
    /// quadratic).
    id_lines: Vec<(&'t str, (usize, usize))>,
    /// Where in `id_lines` the next exception's entry normally is: the
    /// exceptions come in the order of their `id:` lines.
    next: usize,
    /// The same entries by value, built only if an exception is not at
    /// `next` (written in flow style, or with an escaped id).
    by_value: Option<HashMap<&'t str, Vec<(usize, usize)>>>,
    /// The line and column of the previous exception (several may share a
    /// line in flow style).
    after: (usize, usize),
}

impl<'t> Places<'t> {
    fn new(text: &'t str) -> Places<'t> {
        // Start below `exceptions:` so a client with the same id is skipped.
        let after = if text.lines().any(|l| l.trim_end() == "exceptions:") {
            locate(text, "exceptions", "")
        } else {
            (0, 0)
        };
        let id_lines = locate_all(text, "id");
        let next = id_lines.partition_point(|(_, at)| *at <= after);
        Places {
            id_lines,
            next,
            by_value: None,
            after,
        }
    }

    /// The first `id: <id>` below the previous exception: the right one for
    /// a duplicate within a file, and not a client's id.
    fn next(&mut self, id: &str) -> (usize, usize) {
        let after = self.after;
        let at = match self.id_lines.get(self.next) {
            Some(&(v, at)) if v == id && at > after => {
                self.next += 1;
                at
            }
            _ => self
                .by_value
                .get_or_insert_with(|| by_value(&self.id_lines))
                .get(id)
                .and_then(|v| v.iter().find(|at| **at > after))
                .copied()
                .unwrap_or((1, 1)),
        };
        self.after = after.max(at);
        if self.next < self.id_lines.len() && self.id_lines[self.next].1 <= self.after {
            self.next = self.id_lines.partition_point(|(_, at)| *at <= self.after);
        }
        at
    }
}

/// Where an exception is: its file (and the file's shared path) and the
/// line:column of its `id:`.
struct Place<'s> {
    src: &'s Source,
    file: Arc<Path>,
    at: (usize, usize),
}

/// One exception, validated; every error is reported at its place.
/// `owner` is its trimmed `owner:`, interned.
fn exception(
    r: &RawException,
    place: Place<'_>,
    owner: Arc<str>,
    clients: &[Client],
    globs: &mut Globs,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Errors,
) -> Exception {
    let Place { src, file, at } = place;
    let id = r.id.0.as_str();
    if owner.is_empty() {
        errs.at(src, at, format!("exception {id:?} has no owner:"));
    }
    let reason = r.reason.as_deref().map(str::trim).unwrap_or("");
    if reason.is_empty() {
        errs.at(src, at, format!("exception {id:?} has no reason:"));
    }
    if r.hosts.is_empty() && r.cidrs.is_empty() {
        let msg = format!("exception {id:?} names no hosts: and no cidrs:");
        errs.at(src, at, msg);
    }
    let mut report = |msg: String| errs.at(src, at, msg);
    let client_idx = r
        .clients
        .as_ref()
        .map(|pats| globs.clients(pats, clients, id, &mut report));
    let paths = r.paths.as_ref().map(|ps| globs.paths(ps, id, &mut report));
    let dns_types = dns_types(r, &mut report);
    let inject = injected(r, env, &mut report);
    let git = r
        .git
        .as_ref()
        .map(|g| Arc::new(git_rules(g, id, &mut report)));
    let upload = r.upload.as_ref().map(|u| upload_rule(u, id, &mut report));
    let body = r
        .body
        .as_ref()
        .map(|b| Arc::new(body_rules(b, id, &mut report)));
    body_fits(r, body.is_some(), git.is_some(), &mut report);
    empty_lists(r, &mut report);
    let mut ports: Vec<u16> = match &r.ports {
        Some(p) => p.iter().map(|p| p.0).collect(),
        None => DEFAULT_PORTS.to_vec(),
    };
    ports.sort_unstable();
    ports.dedup();
    let mut hosts: Vec<HostPattern> = r.hosts.iter().map(|h| h.0.clone()).collect();
    hosts.dedup();
    let rules = Rules {
        ticket: r.ticket.as_deref().map(Into::into),
        expires: r.expires.as_ref().map(|d| d.0),
        clients: client_idx.map(Vec::into_boxed_slice),
        client_patterns: r.clients.as_deref().map(Into::into),
        methods: r
            .methods
            .as_ref()
            .map(|m| m.iter().map(|m| m.0.clone()).collect()),
        path_patterns: r.paths.as_deref().unwrap_or_default().into(),
        paths,
        dns_types: dns_types.into(),
        inject: inject.into(),
        grant: None,
        git,
        upload,
        body,
    };
    Exception::new(
        id.into(),
        owner,
        reason.into(),
        hosts.into(),
        r.cidrs.iter().map(|c| c.0).collect(),
        globs.ports(ports),
        (file, at.0),
        rules,
    )
}

/// `body:` where a body can be judged: not on an exception whose methods
/// send none, nor beside `git:` (a push's body is git's to judge).
fn body_fits(r: &RawException, body: bool, git: bool, report: &mut impl FnMut(String)) {
    let id = r.id.0.as_str();
    if let (true, Some(methods)) = (body, &r.methods) {
        if methods.iter().all(|m| m.0 == "GET" || m.0 == "HEAD") {
            report(format!(
                "exception {id:?}: body: on an exception whose methods ({}) send no body; \
                 list the methods that carry one (POST, PUT, PATCH)",
                methods
                    .iter()
                    .map(|m| m.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if git && body {
        report(format!(
            "exception {id:?}: git: and body: on one exception (a push's body is judged by git:); \
             put the body: rules on an exception of their own"
        ));
    }
}

/// Compiled pattern lists, by the list as written, and port lists, so
/// that exceptions with the same list share one.
#[derive(Default)]
struct Globs {
    clients: HashMap<Vec<String>, Vec<ClientIdx>>,
    paths: HashMap<Vec<String>, Arc<path::PathSet>>,
    ports: HashMap<Vec<u16>, Arc<[u16]>>,
}

impl Globs {
    /// One shared copy of each distinct port list (most exceptions name
    /// the default one).
    fn ports(&mut self, ports: Vec<u16>) -> Arc<[u16]> {
        if let Some(p) = self.ports.get(&ports) {
            return p.clone();
        }
        let shared: Arc<[u16]> = ports.as_slice().into();
        self.ports.insert(ports, shared.clone());
        shared
    }

    /// [`Globs::ports`] for a list already sorted and deduplicated, without
    /// a copy of it when it is known.
    fn ports_of(&mut self, ports: &[u16]) -> Arc<[u16]> {
        match self.ports.get(ports) {
            Some(p) => p.clone(),
            None => self.ports(ports.to_vec()),
        }
    }

    /// The clients whose id matches one of `pats` (a list with a bad
    /// pattern is reported and not kept).
    fn clients(
        &mut self,
        pats: &[String],
        clients: &[Client],
        id: &str,
        report: &mut dyn FnMut(String),
    ) -> Vec<ClientIdx> {
        if let Some(v) = self.clients.get(pats) {
            return v.clone();
        }
        let mut b = GlobSetBuilder::new();
        let mut ok = true;
        for p in pats {
            match Glob::new(p) {
                Ok(g) => {
                    b.add(g);
                }
                Err(e) => {
                    ok = false;
                    report(format!("exception {id:?}: bad client pattern {p:?}: {e}"))
                }
            }
        }
        let set = b.build().unwrap_or_else(|_| GlobSet::empty());
        let v: Vec<ClientIdx> = clients
            .iter()
            .enumerate()
            .filter(|(_, c)| set.is_match(&*c.id))
            .map(|(i, _)| i as ClientIdx)
            .collect();
        if ok {
            self.clients.insert(pats.to_vec(), v.clone());
        }
        v
    }

    /// The path patterns as one set (`*` stops at `/`); each must start
    /// with `/`.
    fn paths(
        &mut self,
        ps: &[String],
        id: &str,
        report: &mut dyn FnMut(String),
    ) -> Arc<path::PathSet> {
        if let Some(set) = self.paths.get(ps) {
            return set.clone();
        }
        let mut globs = Vec::with_capacity(ps.len());
        let mut ok = true;
        for p in ps {
            if !p.starts_with('/') {
                ok = false;
                report(format!(
                    "exception {id:?}: path pattern {p:?} must start with '/'"
                ));
                continue;
            }
            match GlobBuilder::new(p).literal_separator(true).build() {
                Ok(g) => globs.push(g),
                Err(e) => {
                    ok = false;
                    report(format!("exception {id:?}: bad path pattern {p:?}: {e}"))
                }
            }
        }
        let set = Arc::new(path::PathSet::new(globs));
        if ok {
            self.paths.insert(ps.to_vec(), set.clone());
        }
        set
    }
}

/// `dns_types`, none of them a type that is never answered.
fn dns_types(r: &RawException, report: &mut dyn FnMut(String)) -> Vec<u16> {
    let id = r.id.0.as_str();
    let types: Vec<u16> = r.dns_types.iter().flatten().map(|q| q.0).collect();
    for t in &types {
        if qtype::NEVER_ALLOWED.contains(t) {
            report(format!(
                "exception {id:?}: DNS type {} is never answered (zone transfers, ANY and NULL are tunnel carriers)",
                qtype::qtype_name(*t)
            ));
        }
    }
    types
}

/// `inject.headers`, names and values valid, `${env:…}`/`${file:…}`
/// expanded, values marked sensitive.
fn injected(
    r: &RawException,
    env: &dyn Fn(&str) -> Option<String>,
    report: &mut dyn FnMut(String),
) -> Vec<InjectedHeader> {
    let id = r.id.0.as_str();
    let mut inject = Vec::new();
    let Some(inj) = &r.inject else {
        return inject;
    };
    for (name, value) in &inj.headers {
        let Ok(hn) = HeaderName::from_bytes(name.as_bytes()) else {
            report(format!("exception {id:?}: invalid header name {name:?}"));
            continue;
        };
        match expand_secret(value, env) {
            Ok(v) => match HeaderValue::from_str(&v) {
                Ok(mut hv) => {
                    hv.set_sensitive(true);
                    inject.push(InjectedHeader {
                        name: hn,
                        value: hv,
                    })
                }
                Err(_) => report(format!(
                    "exception {id:?}: value of header {name} is not a valid header value"
                )),
            },
            Err(e) => report(format!("exception {id:?}: inject {name}: {e}")),
        }
    }
    inject
}

/// `upload:` compiled; a budget of nothing or a window out of range is
/// reported.
fn upload_rule(u: &RawUpload, id: &str, report: &mut dyn FnMut(String)) -> UploadRule {
    if u.bytes.0 == 0 {
        report(format!(
            "exception {id:?}: upload: bytes must be at least 1B (to allow no upload, narrow methods: instead)"
        ));
    }
    if u.per.0 == 0 || u.per.0 > MAX_PER_SECS {
        report(format!(
            "exception {id:?}: upload: per must be between 1s and 30d"
        ));
    }
    UploadRule::new(u.bytes.0, u.per.0)
}

/// `git:` compiled; every bad glob or bound is reported.
fn git_rules(g: &RawGit, id: &str, report: &mut dyn FnMut(String)) -> git::GitRules {
    let globs = |what: &str, ps: &[String], strip_slash: bool, report: &mut dyn FnMut(String)| {
        let mut out = Vec::new();
        if ps.is_empty() {
            report(format!("exception {id:?}: git: {what}: is empty"));
        }
        for p in ps {
            let p = if strip_slash {
                p.trim_start_matches('/')
            } else {
                p.as_str()
            };
            let p = if what == "repos" {
                git::repo_name(p)
            } else {
                p
            };
            match git::glob(p) {
                Ok(g) => out.push(g),
                Err(e) => report(format!(
                    "exception {id:?}: git: bad {what} pattern {p:?}: {e}"
                )),
            }
        }
        out
    };
    let repos = globs("repos", &g.repos, true, report);
    let push = g.push.as_ref().map(|p| {
        let refs = globs("push.refs", &p.refs, false, report);
        let deny = if p.deny_paths.is_empty() {
            Vec::new()
        } else {
            globs("push.deny_paths", &p.deny_paths, true, report)
        };
        let max_bytes = p
            .max_bytes
            .as_ref()
            .map_or(git::DEFAULT_PUSH_MAX_BYTES, |m| m.0);
        if max_bytes == 0 || max_bytes > git::MAX_PUSH_MAX_BYTES {
            report(format!(
                "exception {id:?}: git: push.max_bytes must be between 1B and 1GiB"
            ));
        }
        git::PushRules {
            ref_patterns: p.refs.clone().into(),
            refs: path::PathSet::new(refs),
            force: p.force,
            delete: p.delete,
            deny_path_patterns: p
                .deny_paths
                .iter()
                .map(|d| d.trim_start_matches('/').to_string())
                .collect(),
            deny_paths: path::PathSet::new(deny),
            max_bytes,
        }
    });
    git::GitRules::new(
        g.repos
            .iter()
            .map(|r| r.trim_start_matches('/').to_string())
            .collect(),
        repos,
        push,
    )
}

/// `body:` compiled; every bad pointer, value, name or bound is reported.
fn body_rules(b: &RawBody, id: &str, report: &mut dyn FnMut(String)) -> body::BodyRules {
    let max_bytes = b
        .max_bytes
        .as_ref()
        .map_or(body::DEFAULT_MAX_BYTES, |m| m.0);
    if max_bytes == 0 || max_bytes > body::MAX_MAX_BYTES {
        report(format!(
            "exception {id:?}: body: max_bytes must be between 1B and 16MiB"
        ));
    }
    let mut json = Vec::new();
    if let Some(map) = &b.json {
        if map.is_empty() {
            report(format!("exception {id:?}: body: json: is empty"));
        }
        for (pointer, v) in map {
            if let Err(e) = body::valid_pointer(pointer) {
                report(format!("exception {id:?}: body: json: {pointer:?}: {e}"));
                continue;
            }
            let expect = match v {
                serde_json::Value::String(p) => match git::glob(p) {
                    Ok(g) => body::Expect::Glob {
                        pattern: p.clone(),
                        glob: g.compile_matcher(),
                    },
                    Err(e) => {
                        report(format!(
                            "exception {id:?}: body: json: {pointer:?}: bad pattern {p:?}: {e}"
                        ));
                        continue;
                    }
                },
                serde_json::Value::Number(n) => body::Expect::Number(n.clone()),
                serde_json::Value::Bool(b) => body::Expect::Bool(*b),
                serde_json::Value::Null => body::Expect::Null,
                serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
                    report(format!(
                        "exception {id:?}: body: json: {pointer:?}: a value must be a string, \
                         number, boolean or null (point at each member instead)"
                    ));
                    continue;
                }
            };
            json.push(body::JsonRule {
                pointer: pointer.clone(),
                expect,
            });
        }
    }
    let graphql = b.graphql.as_ref().map(|g| {
        if !g.queries && g.mutations.is_empty() {
            report(format!(
                "exception {id:?}: body: graphql: allows nothing (set queries: true or list mutations:)"
            ));
        }
        for m in &g.mutations {
            if !body::valid_graphql_name(m) {
                report(format!(
                    "exception {id:?}: body: graphql: mutations: {m:?} is not a GraphQL field name"
                ));
            }
        }
        body::GraphqlRules {
            queries: g.queries,
            mutations: g.mutations.clone().into(),
        }
    });
    body::BodyRules {
        max_bytes,
        json: json.into(),
        graphql,
    }
}

/// An empty list would silently match nothing (or, for ports, leave the
/// name resolvable while every connection is refused): say so instead.
fn empty_lists(r: &RawException, report: &mut dyn FnMut(String)) {
    let id = r.id.0.as_str();
    for (key, empty) in [
        ("ports", r.ports.as_ref().is_some_and(|v| v.is_empty())),
        ("methods", r.methods.as_ref().is_some_and(|v| v.is_empty())),
        ("paths", r.paths.as_ref().is_some_and(|v| v.is_empty())),
        ("clients", r.clients.as_ref().is_some_and(|v| v.is_empty())),
    ] {
        if empty {
            report(format!(
                "exception {id:?}: {key}: is empty; omit it to allow any (ports default to [80, 443])"
            ));
        }
    }
}

/// Expands `${env:NAME}` and `${file:PATH}` in an injected header value.
pub(super) fn expand_secret(
    v: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = v;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').ok_or("unterminated ${...}")? + start;
        let inner = &rest[start + 2..end];
        let val = if let Some(name) = inner.strip_prefix("env:") {
            env(name).ok_or_else(|| format!("environment variable {name} is not set"))?
        } else if let Some(p) = inner.strip_prefix("file:") {
            std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read secret file {p}: {e}"))?
                .trim_end_matches(['\n', '\r'])
                .to_string()
        } else {
            return Err(format!(
                "unknown substitution ${{{inner}}}: use ${{env:NAME}} or ${{file:PATH}}"
            ));
        };
        out.push_str(&val);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
