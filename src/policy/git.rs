//! An exception's `git:` rules, compiled, and the smart-HTTP endpoints
//! they allow (DESIGN "Writes on allowed hosts"). Pure: which repository
//! and service a path names, whether a repository is listed. What a push
//! carries is judged above, in `writes::git`.

use globset::{Glob, GlobBuilder, GlobMatcher};

use super::path::PathSet;

/// Default `push.max_bytes`: 64 MiB.
pub const DEFAULT_PUSH_MAX_BYTES: u64 = 64 << 20;
/// The largest `push.max_bytes` a policy may set: 1 GiB.
pub const MAX_PUSH_MAX_BYTES: u64 = 1 << 30;

/// `git:` compiled.
#[derive(Debug)]
pub struct GitRules {
    /// `repos` as written.
    pub repo_patterns: Box<[String]>,
    repos: Box<[GlobMatcher]>,
    /// `None`: fetch only.
    pub push: Option<PushRules>,
}

/// `git.push` compiled.
#[derive(Debug)]
pub struct PushRules {
    pub ref_patterns: Box<[String]>,
    pub refs: PathSet,
    pub force: bool,
    pub delete: bool,
    pub deny_path_patterns: Box<[String]>,
    pub deny_paths: PathSet,
    pub max_bytes: u64,
}

/// The three smart-HTTP endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET …/info/refs` (the service is in the query).
    InfoRefs,
    /// `POST …/git-upload-pack`: a fetch.
    UploadPack,
    /// `POST …/git-receive-pack`: a push.
    ReceivePack,
}

impl Endpoint {
    /// The method each endpoint is asked with.
    pub fn method(self) -> &'static str {
        match self {
            Endpoint::InfoRefs => "GET",
            Endpoint::UploadPack | Endpoint::ReceivePack => "POST",
        }
    }
}

/// Splits a normalised path into the repository it names (as spelled,
/// without the leading `/`) and the endpoint; `None` for any other path.
pub fn endpoint(path: &str) -> Option<(&str, Endpoint)> {
    let path = path.strip_prefix('/')?;
    let (repo, ep) = if let Some(r) = path.strip_suffix("/info/refs") {
        (r, Endpoint::InfoRefs)
    } else if let Some(r) = path.strip_suffix("/git-upload-pack") {
        (r, Endpoint::UploadPack)
    } else if let Some(r) = path.strip_suffix("/git-receive-pack") {
        (r, Endpoint::ReceivePack)
    } else {
        return None;
    };
    (!repo.is_empty() && !repo.starts_with('/') && !repo.ends_with('/')).then_some((repo, ep))
}

/// A repository's name as matched: no trailing `.git`.
pub fn repo_name(repo: &str) -> &str {
    repo.strip_suffix(".git").unwrap_or(repo)
}

/// The `service=` of an `info/refs` query, if it names one.
pub fn service(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|kv| kv.strip_prefix("service="))
}

impl GitRules {
    /// From patterns already validated by [`glob`].
    pub fn new(repo_patterns: Vec<String>, repos: Vec<Glob>, push: Option<PushRules>) -> GitRules {
        GitRules {
            repo_patterns: repo_patterns.into(),
            repos: repos.iter().map(Glob::compile_matcher).collect(),
            push,
        }
    }

    /// Whether `repo` (as a path names it, `.git` optional) is listed.
    pub fn allows_repo(&self, repo: &str) -> bool {
        let name = repo_name(repo);
        self.repos.iter().any(|g| g.is_match(name))
    }
}

impl PushRules {
    /// Whether a denied path may lie at or below the directory `dir`
    /// (`""` is the root): a tree egressd cannot see inside is judged by
    /// this, failing closed.
    pub fn may_deny_below(&self, dir: &str) -> bool {
        self.deny_path_patterns
            .iter()
            .any(|p| may_match_below(p, dir))
    }
}

/// Whether glob `pattern` (`*` not crossing `/`) could match a path below
/// `dir`. Over-approximates: a pattern's literal directory prefix decides.
fn may_match_below(pattern: &str, dir: &str) -> bool {
    let d = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let meta = pattern.find(['*', '?', '[', '{']);
    let Some(m) = meta else {
        return pattern.starts_with(&d) && pattern.len() > d.len();
    };
    let lit = &pattern[..m];
    let lit_dir = &lit[..lit.rfind('/').map_or(0, |i| i + 1)];
    lit.starts_with(&d) || d.starts_with(lit_dir)
}

/// A ref, repo or path glob as `paths:` builds them (`*` stops at `/`).
pub fn glob(p: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(p).literal_separator(true).build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_repos() {
        assert_eq!(
            endpoint("/acme/widgets.git/info/refs"),
            Some(("acme/widgets.git", Endpoint::InfoRefs))
        );
        assert_eq!(
            endpoint("/acme/widgets/git-receive-pack"),
            Some(("acme/widgets", Endpoint::ReceivePack))
        );
        assert_eq!(endpoint("/info/refs"), None);
        assert_eq!(endpoint("/acme/widgets/HEAD"), None);
        assert_eq!(endpoint("/acme/widgets/objects/info/packs"), None);
        let g = GitRules::new(
            vec!["acme/widgets".into()],
            vec![glob("acme/widgets").unwrap()],
            None,
        );
        assert!(g.allows_repo("acme/widgets.git"));
        assert!(g.allows_repo("acme/widgets"));
        assert!(!g.allows_repo("acme/widgets-public"));
        assert!(!g.allows_repo("evil/widgets"));
        assert_eq!(
            service(Some("service=git-receive-pack")),
            Some("git-receive-pack")
        );
        assert_eq!(service(None), None);
    }

    #[test]
    fn what_a_directory_may_hold() {
        assert!(may_match_below(".github/workflows/**", ""));
        assert!(may_match_below(".github/workflows/**", ".github"));
        assert!(may_match_below(".github/workflows/**", ".github/workflows"));
        assert!(!may_match_below(".github/workflows/**", "src"));
        assert!(may_match_below(".gitlab-ci.yml", ""));
        assert!(!may_match_below(".gitlab-ci.yml", "src"));
        assert!(may_match_below("**/secrets.env", "src/deep"));
    }
}
