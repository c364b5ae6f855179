//! A smart-HTTP push (`POST …/git-receive-pack`) judged against an
//! exception's `git.push` before any byte of it goes upstream: the
//! ref-update commands (gitprotocol-pack(5) "Reference Update Request"),
//! each checked against `refs`, `delete` and `force`; fast-forwards proven
//! from the pushed pack; `deny_paths` checked in every pushed commit. All
//! or nothing. And the answer git shows for a refusal: `report-status`
//! (`ng <ref> egressd: <reason>`), in side-band when asked.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::policy::git::PushRules;
use crate::policy::Reason;

use super::pack::{self, Limits, Oid, Pack, PackError, ZERO};
use super::pktline::{self, Pkt, Reader};

/// The most ref-update commands one push may carry.
pub const MAX_COMMANDS: usize = 10_000;
/// The most tree entries the `deny_paths` check visits in one push.
const MAX_TREE_VISITS: usize = 2_000_000;
/// The deepest directory the `deny_paths` check descends.
const MAX_TREE_DEPTH: usize = 256;

/// One ref-update command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub old: Oid,
    pub new: Oid,
    pub name: String,
}

/// A push request's parts.
#[derive(Debug)]
pub struct PushRequest<'a> {
    pub commands: Vec<Command>,
    /// The capabilities the client asked for (after the first command's NUL).
    pub caps: Vec<String>,
    /// The packfile (empty when the push only deletes).
    pub pack: &'a [u8],
}

impl PushRequest<'_> {
    /// Whether the client reads the answer in side-band, and the largest
    /// band packet it takes.
    pub fn sideband(&self) -> Option<usize> {
        sideband(&self.caps)
    }
}

/// Whether a client that asked for `caps` reads the answer in side-band,
/// and the largest band packet it takes.
pub fn sideband(caps: &[String]) -> Option<usize> {
    if caps.iter().any(|c| c == "side-band-64k") {
        Some(pktline::MAX_PKT_LEN - 5)
    } else if caps.iter().any(|c| c == "side-band") {
        Some(995)
    } else {
        None
    }
}

/// Reads the commands, capabilities and pack of a push body.
pub fn parse_request(body: &[u8]) -> Result<PushRequest<'_>, String> {
    match read_head(body, true)? {
        Some(h) => Ok(PushRequest {
            commands: h.commands,
            caps: h.caps,
            pack: &body[h.pack_at..],
        }),
        None => Err("the push ends before its commands do".into()),
    }
}

/// What precedes a push's pack.
#[derive(Debug)]
pub struct Head {
    pub commands: Vec<Command>,
    /// The capabilities the client asked for.
    pub caps: Vec<String>,
    /// Where the pack starts in the body.
    pub pack_at: usize,
}

/// Reads the commands and capabilities at the start of a push body, and
/// where its pack starts. When `body` is not `complete` (the start of a
/// body still arriving), `Ok(None)` while they are not all in it.
pub fn read_head(body: &[u8], complete: bool) -> Result<Option<Head>, String> {
    let mut r = Reader::new(body);
    let mut commands = Vec::new();
    let mut caps = Vec::new();
    loop {
        let Some(pkt) = next(&mut r, complete)? else {
            return Ok(None);
        };
        match pkt {
            Pkt::Flush => break,
            Pkt::Data(line) => {
                let line = line.strip_suffix(b"\n").unwrap_or(line);
                if line.starts_with(b"shallow ") {
                    continue;
                }
                if line.starts_with(b"push-cert") {
                    return Err("signed pushes (push-cert) are not read by egressd".into());
                }
                let (cmd, cap) = match line.iter().position(|&b| b == 0) {
                    Some(i) if commands.is_empty() => (&line[..i], Some(&line[i + 1..])),
                    Some(_) => return Err("capabilities after the first command".into()),
                    None => (line, None),
                };
                if let Some(cap) = cap {
                    caps = String::from_utf8_lossy(cap)
                        .split(' ')
                        .filter(|c| !c.is_empty())
                        .map(str::to_string)
                        .collect();
                }
                commands.push(parse_command(cmd)?);
                if commands.len() > MAX_COMMANDS {
                    return Err(format!("more than {MAX_COMMANDS} ref updates"));
                }
            }
            _ => return Err("unexpected delim in the commands".into()),
        }
    }
    if caps
        .iter()
        .any(|c| c.starts_with("object-format=") && c != "object-format=sha1")
    {
        return Err("only SHA-1 repositories are read by egressd".into());
    }
    if caps.iter().any(|c| c == "push-options") {
        loop {
            match next(&mut r, complete)? {
                None => return Ok(None),
                Some(Pkt::Flush) => break,
                Some(Pkt::Data(_)) => {}
                Some(_) => return Err("the push options end early".into()),
            }
        }
    }
    Ok(Some(Head {
        commands,
        caps,
        pack_at: r.position(),
    }))
}

/// The next pkt-line; `None` at the end of `r`, or, when `r` is not
/// `complete`, when it ends before the line does.
fn next<'a>(r: &mut Reader<'a>, complete: bool) -> Result<Option<Pkt<'a>>, String> {
    match r.next_pkt() {
        Ok(p) => Ok(p),
        Err(pktline::PktError::Truncated) if !complete => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_command(line: &[u8]) -> Result<Command, String> {
    let bad = || format!("bad ref update {:?}", String::from_utf8_lossy(line));
    let mut parts = line.splitn(3, |&b| b == b' ');
    let old = parts.next().and_then(pack::parse_hex).ok_or_else(bad)?;
    let new = parts.next().and_then(pack::parse_hex).ok_or_else(bad)?;
    let name = parts
        .next()
        .and_then(|n| std::str::from_utf8(n).ok())
        .filter(|n| n.starts_with("refs/") && !n.is_empty())
        .ok_or_else(bad)?;
    Ok(Command {
        old,
        new,
        name: name.to_string(),
    })
}

/// One ref's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefVerdict {
    pub command: Command,
    /// `None`: allowed.
    pub refused: Option<Reason>,
}

/// The push's verdict: each ref's, and the reason and detail of the
/// first refusal (every ref is refused when one is: all or nothing).
#[derive(Debug, Clone)]
pub struct Judgement {
    pub refs: Vec<RefVerdict>,
    pub refused: Option<(Reason, String)>,
}

impl Judgement {
    pub fn allowed(&self) -> bool {
        self.refused.is_none()
    }
}

/// Judges a parsed push against `rules`.
pub fn judge(rules: &PushRules, req: &PushRequest<'_>) -> Judgement {
    let pack =
        (!req.pack.is_empty()).then(|| Pack::parse(req.pack, Limits::for_pack(req.pack.len())));
    judge_read(rules, &req.commands, pack)
}

/// Judges a push's `commands` against `rules`, with its pack as read
/// (`None`: the push carried none).
pub fn judge_read(
    rules: &PushRules,
    commands: &[Command],
    pack: Option<Result<Pack, PackError>>,
) -> Judgement {
    let mut refs: Vec<RefVerdict> = commands
        .iter()
        .map(|c| RefVerdict {
            command: c.clone(),
            refused: None,
        })
        .collect();
    let mut first: Option<(Reason, String)> = None;
    for v in refs.iter_mut() {
        let c = &v.command;
        if !rules.refs.is_match(&c.name) {
            let why = format!("{} is not a ref this push may write", c.name);
            refuse(v, Reason::GitRefNotAllowed, why, &mut first);
        } else if c.new == ZERO && c.old != ZERO && !rules.delete {
            let why = format!("{} would be deleted", c.name);
            refuse(v, Reason::GitDeleteNotAllowed, why, &mut first);
        }
    }
    let writes = commands.iter().any(|c| c.new != ZERO);
    let pack = match pack.transpose() {
        Ok(p) => p,
        Err(e) => {
            let why = format!("the pushed pack does not read: {e}");
            for v in refs.iter_mut() {
                refuse(v, Reason::Malformed, why.clone(), &mut first);
            }
            return Judgement {
                refs,
                refused: first,
            };
        }
    };
    if let Some(p) = pack.as_ref().filter(|p| p.unresolved > 0) {
        let why = format!(
            "{} pushed objects are deltas against objects not in the pack (a thin pack): egressd cannot prove what they hold",
            p.unresolved
        );
        for v in refs.iter_mut().filter(|v| v.command.new != ZERO) {
            refuse(v, Reason::GitNotFastForward, why.clone(), &mut first);
        }
    }
    if writes {
        let Some(p) = &pack else {
            return finish_without_pack(rules, refs, first);
        };
        if !rules.force {
            fast_forwards(p, &mut refs, &mut first);
        }
        if !rules.deny_path_patterns.is_empty() {
            if let Some(path) = denied_path(p, rules) {
                let why = format!("a pushed commit adds or changes {path}");
                for v in refs.iter_mut().filter(|v| v.command.new != ZERO) {
                    refuse(v, Reason::GitPathDenied, why.clone(), &mut first);
                }
            }
        }
    }
    Judgement {
        refs,
        refused: first,
    }
}

/// Refuses each update that `p` does not prove a fast-forward.
fn fast_forwards(p: &Pack, refs: &mut [RefVerdict], first: &mut Option<(Reason, String)>) {
    for v in refs.iter_mut() {
        let c = &v.command;
        if c.old != ZERO && c.new != ZERO && c.old != c.new && !fast_forward(p, &c.old, &c.new) {
            let why = format!(
                "{} {}..{} is not a fast-forward egressd can prove from the pushed commits",
                c.name,
                short(&c.old),
                short(&c.new)
            );
            refuse(v, Reason::GitNotFastForward, why, first);
        }
    }
}

/// A push that writes refs but carries no pack: every new id must already
/// be upstream. A fast-forward cannot be proven (refused unless `force`);
/// `deny_paths` has nothing new to judge.
fn finish_without_pack(
    rules: &PushRules,
    mut refs: Vec<RefVerdict>,
    mut first: Option<(Reason, String)>,
) -> Judgement {
    if !rules.force {
        for v in refs.iter_mut() {
            let c = &v.command;
            if c.old != ZERO && c.new != ZERO && c.old != c.new {
                let why = format!(
                    "{} moves to {}, which the push does not carry: egressd cannot prove a fast-forward",
                    c.name,
                    short(&c.new)
                );
                refuse(v, Reason::GitNotFastForward, why, &mut first);
            }
        }
    }
    Judgement {
        refs,
        refused: first,
    }
}

/// Refuses `v` for `r` (its first reason stays), noting the push's first.
fn refuse(v: &mut RefVerdict, r: Reason, why: String, first: &mut Option<(Reason, String)>) {
    if v.refused.is_none() {
        v.refused = Some(r);
    }
    if first.is_none() {
        *first = Some((r, why));
    }
}

fn short(id: &Oid) -> String {
    pack::hex(id)[..12].to_string()
}

/// Whether the pack's commits lead from `new` back to `old`.
pub fn fast_forward(pack: &Pack, old: &Oid, new: &Oid) -> bool {
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([*new]);
    while let Some(id) = queue.pop_front() {
        if !seen.insert(id) {
            continue;
        }
        let Some(Ok(c)) = pack.commit(&id) else {
            continue;
        };
        for p in c.parents {
            if p == *old {
                return true;
            }
            queue.push_back(p);
        }
    }
    false
}

/// What a parent says about one path: its entry's id (or that it has no
/// entry there), or nothing, when its tree is not in the pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Known(Option<Oid>),
    Unknown,
}

/// The first denied path a pushed commit adds or changes, compared with
/// each parent (a path the same as in one parent is unchanged); a parent
/// or tree not in the pack cannot prove a path unchanged, so a denied path
/// that may lie there counts as changed (fail closed).
pub fn denied_path(pack: &Pack, rules: &PushRules) -> Option<String> {
    let mut budget = MAX_TREE_VISITS;
    let mut commits: Vec<&Oid> = pack.commits().collect();
    commits.sort();
    for id in commits {
        let c = match pack.commit(id) {
            Some(Ok(c)) => c,
            _ => return Some(format!("commit {} (it does not read)", short(id))),
        };
        let bases: Vec<Base> = c
            .parents
            .iter()
            .map(|p| match pack.commit(p) {
                Some(Ok(pc)) => Base::Known(Some(pc.tree)),
                _ => Base::Unknown,
            })
            .collect();
        if let Some(p) = check_tree(pack, rules, &c.tree, "", &bases, 0, &mut budget) {
            return Some(p);
        }
    }
    None
}

fn changed(id: &Oid, bases: &[Base]) -> bool {
    !bases.contains(&Base::Known(Some(*id)))
}

fn check_tree(
    pack: &Pack,
    rules: &PushRules,
    tree: &Oid,
    dir: &str,
    bases: &[Base],
    depth: usize,
    budget: &mut usize,
) -> Option<String> {
    if !changed(tree, bases) || !rules.may_deny_below(dir) {
        return None;
    }
    let shown = if dir.is_empty() { "/" } else { dir };
    if depth > MAX_TREE_DEPTH {
        return Some(format!("{shown} (nested too deep to check)"));
    }
    let Some(data) = pack.tree(tree) else {
        return Some(format!(
            "{shown} (a tree not in the pack, which egressd cannot check)"
        ));
    };
    let Ok(entries) = pack::tree_entries(data) else {
        return Some(format!("{shown} (a tree that does not read)"));
    };
    // Each parent's entries at this directory, when its tree is here.
    let parent_entries: Vec<Option<HashMap<&[u8], Oid>>> = bases
        .iter()
        .map(|b| match b {
            Base::Known(Some(id)) => pack
                .tree(id)
                .and_then(|d| pack::tree_entries(d).ok())
                .map(|es| es.into_iter().map(|e| (e.name, e.id)).collect()),
            Base::Known(None) => Some(HashMap::new()),
            Base::Unknown => None,
        })
        .collect();
    for e in &entries {
        if *budget == 0 {
            return Some(format!("{shown} (too many tree entries to check)"));
        }
        *budget -= 1;
        let name = String::from_utf8_lossy(e.name);
        let path = if dir.is_empty() {
            name.into_owned()
        } else {
            format!("{dir}/{name}")
        };
        let child: Vec<Base> = parent_entries
            .iter()
            .map(|pe| match pe {
                Some(m) => Base::Known(m.get(e.name).copied()),
                None => Base::Unknown,
            })
            .collect();
        if rules.deny_paths.is_match(&path) && changed(&e.id, &child) {
            return Some(path);
        }
        if e.is_tree() {
            if let Some(p) = check_tree(pack, rules, &e.id, &path, &child, depth + 1, budget) {
                return Some(p);
            }
        }
    }
    None
}

/// The answer to a refused push, in git's own channel: `report-status`
/// with `ng <ref> egressd: <reason>` for every ref, and (in side-band)
/// `remote: egressd: …` lines naming the rule and whom to contact.
pub fn refusal(j: &Judgement, sideband: Option<usize>, message: &[String]) -> Vec<u8> {
    let (reason, _) = j.refused.as_ref().expect("a refused push");
    let mut report = Vec::new();
    pktline::write(&mut report, b"unpack ok\n");
    for v in &j.refs {
        let r = v.refused.unwrap_or(*reason);
        let why = if v.refused.is_some() {
            format!("egressd: {}", r.as_str())
        } else {
            format!(
                "egressd: not updated, the push is all or nothing ({})",
                reason.as_str()
            )
        };
        pktline::write(
            &mut report,
            format!("ng {} {why}\n", v.command.name).as_bytes(),
        );
    }
    pktline::flush(&mut report);
    let Some(max) = sideband else {
        return report;
    };
    let mut out = Vec::new();
    for line in message {
        let mut band = vec![2u8];
        band.extend_from_slice(format!("egressd: {line}\n").as_bytes());
        for chunk in band[1..].chunks(max) {
            let mut p = vec![2u8];
            p.extend_from_slice(chunk);
            pktline::write(&mut out, &p);
        }
    }
    for chunk in report.chunks(max) {
        let mut p = vec![1u8];
        p.extend_from_slice(chunk);
        pktline::write(&mut out, &p);
    }
    pktline::flush(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::pack::build::*;
    use super::super::pack::{object_id, Kind};
    use super::*;
    use crate::policy::git::{glob, PushRules};
    use crate::policy::path::PathSet;

    fn rules(force: bool, delete: bool, deny: &[&str]) -> PushRules {
        PushRules {
            ref_patterns: vec!["refs/heads/agent/**".into()].into(),
            refs: PathSet::new(vec![glob("refs/heads/agent/**").unwrap()]),
            force,
            delete,
            deny_path_patterns: deny.iter().map(|s| s.to_string()).collect(),
            deny_paths: PathSet::new(deny.iter().map(|d| glob(d).unwrap()).collect()),
            max_bytes: 1 << 20,
        }
    }

    fn body(cmds: &[(Oid, Oid, &str)], caps: &str, pack: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, (o, n, r)) in cmds.iter().enumerate() {
            let mut line = format!("{} {} {r}", pack::hex(o), pack::hex(n));
            if i == 0 {
                line.push('\0');
                line.push_str(caps);
            }
            line.push('\n');
            pktline::write(&mut out, line.as_bytes());
        }
        pktline::flush(&mut out);
        out.extend_from_slice(pack);
        out
    }

    /// A history: `base` (upstream, not pushed) ← c1 ← c2, with files.
    struct History {
        pack: Vec<u8>,
        c1: Oid,
        c2: Oid,
        base: Oid,
    }

    fn history(file_in_c2: &str) -> History {
        let base = [0xaa; 20];
        let blob = b"x\n".to_vec();
        let blob_id = object_id(Kind::Blob, &blob);
        let t1 = tree(&[("100644", "README", blob_id)]);
        let t1_id = object_id(Kind::Tree, &t1);
        let c1 = commit(&t1_id, &[base]);
        let c1_id = object_id(Kind::Commit, &c1);
        let mut entries = vec![
            object(Kind::Blob, &blob),
            object(Kind::Tree, &t1),
            object(Kind::Commit, &c1),
        ];
        let (dir, file) = file_in_c2.rsplit_once('/').unwrap_or(("", file_in_c2));
        let mut root: Vec<(String, Oid, &str)> = vec![("README".into(), blob_id, "100644")];
        if dir.is_empty() {
            root.push((file.into(), blob_id, "100644"));
        } else {
            // One tree per directory level, innermost first.
            let mut id = blob_id;
            let mut mode = "100644";
            let mut name = file.to_string();
            for part in dir.rsplit('/') {
                let t = tree(&[(mode, &name, id)]);
                id = object_id(Kind::Tree, &t);
                entries.push(object(Kind::Tree, &t));
                mode = "40000";
                name = part.to_string();
            }
            root.push((name, id, "40000"));
        }
        root.sort_by(|a, b| a.0.cmp(&b.0));
        let r: Vec<(&str, &str, Oid)> = root.iter().map(|(n, i, m)| (*m, n.as_str(), *i)).collect();
        let t2 = tree(&r);
        let t2_id = object_id(Kind::Tree, &t2);
        let c2 = commit(&t2_id, &[c1_id]);
        let c2_id = object_id(Kind::Commit, &c2);
        entries.push(object(Kind::Tree, &t2));
        entries.push(object(Kind::Commit, &c2));
        History {
            pack: pack(entries.len() as u32, &entries),
            c1: c1_id,
            c2: c2_id,
            base,
        }
    }

    fn judged(r: &PushRules, cmds: &[(Oid, Oid, &str)], pack: &[u8]) -> Judgement {
        let b = body(cmds, "report-status side-band-64k", pack);
        let req = parse_request(&b).unwrap();
        judge(r, &req)
    }

    #[test]
    fn an_agent_branch_lands_and_main_does_not() {
        let h = history("src/lib.rs");
        let r = rules(false, false, &[".github/workflows/**"]);
        let j = judged(&r, &[(ZERO, h.c2, "refs/heads/agent/x")], &h.pack);
        assert!(j.allowed(), "{:?}", j.refused);
        let j = judged(&r, &[(ZERO, h.c2, "refs/heads/main")], &h.pack);
        assert_eq!(j.refused.unwrap().0, Reason::GitRefNotAllowed);
        // Two refs, one bad: both refused.
        let j = judged(
            &r,
            &[
                (ZERO, h.c2, "refs/heads/agent/x"),
                (ZERO, h.c2, "refs/tags/v1"),
            ],
            &h.pack,
        );
        assert_eq!(j.refused.as_ref().unwrap().0, Reason::GitRefNotAllowed);
        assert_eq!(j.refs[0].refused, None);
        assert_eq!(j.refs[1].refused, Some(Reason::GitRefNotAllowed));
        let out = refusal(&j, None, &[]);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("ng refs/heads/agent/x egressd: not updated"),
            "{text}"
        );
        assert!(
            text.contains("ng refs/tags/v1 egressd: git_ref_not_allowed"),
            "{text}"
        );
    }

    #[test]
    fn fast_forwards_are_proven_and_rewrites_refused() {
        let h = history("src/lib.rs");
        let r = rules(false, false, &[]);
        // base ← c1 ← c2: an update from base is a fast-forward.
        let j = judged(&r, &[(h.base, h.c2, "refs/heads/agent/x")], &h.pack);
        assert!(j.allowed(), "{:?}", j.refused);
        // From an id the pushed commits do not lead back to: refused.
        let j = judged(&r, &[([0xbb; 20], h.c2, "refs/heads/agent/x")], &h.pack);
        assert_eq!(j.refused.unwrap().0, Reason::GitNotFastForward);
        // Moving back (c2 → c1) is not a fast-forward.
        let j = judged(&r, &[(h.c2, h.c1, "refs/heads/agent/x")], &h.pack);
        assert_eq!(j.refused.unwrap().0, Reason::GitNotFastForward);
        // force: allowed.
        let j = judged(
            &rules(true, false, &[]),
            &[([0xbb; 20], h.c2, "refs/heads/agent/x")],
            &h.pack,
        );
        assert!(j.allowed());
        // No pack, an existing commit: cannot prove.
        let j = judged(&r, &[([0xbb; 20], h.c2, "refs/heads/agent/x")], b"");
        assert_eq!(j.refused.unwrap().0, Reason::GitNotFastForward);
    }

    #[test]
    fn deletes_need_delete() {
        let r = rules(false, false, &[]);
        let j = judged(&r, &[([1; 20], ZERO, "refs/heads/agent/x")], b"");
        assert_eq!(j.refused.unwrap().0, Reason::GitDeleteNotAllowed);
        let j = judged(
            &rules(false, true, &[]),
            &[([1; 20], ZERO, "refs/heads/agent/x")],
            b"",
        );
        assert!(j.allowed());
    }

    #[test]
    fn denied_paths_in_any_commit_are_refused() {
        let r = rules(false, false, &[".github/workflows/**", ".gitlab-ci.yml"]);
        let h = history(".github/workflows/ci.yml");
        let j = judged(&r, &[(ZERO, h.c2, "refs/heads/agent/x")], &h.pack);
        let (reason, why) = j.refused.unwrap();
        assert_eq!(reason, Reason::GitPathDenied);
        assert!(why.contains(".github/workflows/ci.yml"), "{why}");
        let h = history(".gitlab-ci.yml");
        let j = judged(&r, &[(ZERO, h.c2, "refs/heads/agent/x")], &h.pack);
        assert_eq!(j.refused.unwrap().0, Reason::GitPathDenied);
        // The same file elsewhere is fine.
        let h = history("docs/workflows/ci.yml");
        let j = judged(&r, &[(ZERO, h.c2, "refs/heads/agent/x")], &h.pack);
        assert!(j.allowed(), "{:?}", j.refused);
    }

    #[test]
    fn malformed_requests_are_errors() {
        assert!(parse_request(b"").is_err());
        assert!(parse_request(b"00").is_err());
        assert!(parse_request(b"0010short").is_err());
        assert!(parse_request(b"000dnot a cmd\n0000").is_err());
        // A flush alone: a probe, no commands.
        assert!(parse_request(b"0000").unwrap().commands.is_empty());
        // A pack that lies is refused in the judgement.
        let h = history("a");
        let mut p = h.pack.clone();
        p[11] = 200; // the count
        let j = judged(
            &rules(false, false, &[]),
            &[(ZERO, h.c2, "refs/heads/agent/x")],
            &p,
        );
        assert_eq!(j.refused.unwrap().0, Reason::Malformed);
    }

    #[test]
    fn sideband_answers_carry_the_message_in_band_two() {
        let h = history("a");
        let j = judged(
            &rules(false, false, &[]),
            &[(ZERO, h.c2, "refs/heads/main")],
            &h.pack,
        );
        let out = refusal(
            &j,
            Some(65515),
            &["refs/heads/main is not allowed; contact #sec".into()],
        );
        let mut r = Reader::new(&out);
        let Some(Pkt::Data(first)) = r.next_pkt().unwrap() else {
            panic!()
        };
        assert_eq!(first[0], 2);
        assert!(String::from_utf8_lossy(&first[1..]).starts_with("egressd: refs/heads/main"));
        let Some(Pkt::Data(second)) = r.next_pkt().unwrap() else {
            panic!()
        };
        assert_eq!(second[0], 1);
        let mut inner = Reader::new(&second[1..]);
        assert_eq!(inner.next_pkt().unwrap(), Some(Pkt::Data(b"unpack ok\n")));
    }
}
