//! The path an exception's `paths:` rule matched is the path the origin
//! receives. A rule is matched against the canonical form
//! ([`crate::policy::path::normalize_path`]: unreserved escapes decoded,
//! repeated slashes collapsed); an origin given the spelling the client
//! sent might read it otherwise (`/repos//x` is not `/repos/x` to every
//! server). So a request allowed by an exception with `paths:` is sent with
//! the canonical path, the query as the client wrote it. Requests under
//! other exceptions go as asked: their path decided nothing, and a
//! signature over the client's spelling (S3 keys with `//`) stays valid.

use http::uri::{PathAndQuery, Uri};

use crate::policy::path::normalize_path;
use crate::policy::Exception;

/// Rewrites `uri`'s path to `matched` when `exception` has `paths:` and
/// the client's spelling differs. On an npm registry host `%2f` is the
/// scope separator that [`super::gate::policy_path`] folds: such a path
/// (which [`normalize_path`] alone refuses) keeps the client's spelling.
pub(crate) fn send_the_path_matched(uri: &mut Uri, exception: Option<&Exception>, matched: &str) {
    if exception.is_none_or(|e| e.paths().is_none()) || uri.path() == matched {
        return;
    }
    if normalize_path(uri.path()).as_deref() != Ok(matched) {
        return;
    }
    let pq = match uri.query() {
        Some(q) => format!("{matched}?{q}"),
        None => matched.to_owned(),
    };
    let Ok(pq) = PathAndQuery::try_from(pq) else {
        return;
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq);
    if let Ok(u) = Uri::from_parts(parts) {
        *uri = u;
    }
}
