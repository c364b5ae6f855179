//! `check --against LOG…` for the machine-readable formats: the replay of
//! [`crate::cmd::report::replay`], kept as data for [`super::format`] to render
//! (the text format prints the replay's own report).

use std::path::{Path, PathBuf};

use crate::cmd::report::read::{for_each_line, ReadStats};
use crate::cmd::report::replay::{Change, ChangeKey, Replay};

/// A replay of decision logs against a policy.
#[derive(Debug)]
pub struct Replayed {
    pub logs: Vec<PathBuf>,
    pub replay: Replay,
    pub read: ReadStats,
}

/// Decides every line of `logs` again under the policy at `policy_path`.
/// An error when the policy does not load or a log cannot be read.
pub fn replay(policy_path: &Path, logs: &[PathBuf], now: i64) -> Result<Replayed, String> {
    let policy = crate::policy::load(policy_path)
        .map_err(|_| format!("{} does not load, nothing replayed", policy_path.display()))?;
    let mut replay = Replay::default();
    let read = for_each_line(logs, |l, _| replay.add(&policy, l, now))?;
    Ok(Replayed {
        logs: logs.to_vec(),
        replay,
        read,
    })
}

/// A direction's changes, largest first (ties in request order).
pub fn largest_first(
    map: &std::collections::HashMap<ChangeKey, Change>,
) -> Vec<(&ChangeKey, &Change)> {
    let mut v: Vec<(&ChangeKey, &Change)> = map.iter().collect();
    v.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
    v
}
