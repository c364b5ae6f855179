//! What each fuzz target checks, as plain functions of the input bytes.
//! The cargo-fuzz targets (`fuzz/fuzz_targets/`) call them under libFuzzer;
//! `tests/it/fuzz_regressions.rs` calls them on every committed seed and
//! regression input, so `cargo test` replays the corpora without cargo-fuzz.
//!
//! Every check panics on a broken invariant; a panic anywhere (also in a
//! task egressd spawned) is a finding.

#![allow(dead_code)]

pub mod decide_model;
pub mod dns_packet;
pub mod git_push;
pub mod graphql_op;
pub mod host_parse;
pub mod http1_fast;
pub mod package_classify;
pub mod policy_load;

/// Reads structured choices from fuzz bytes; past the end everything is 0.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, pos: 0 }
    }
    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    pub fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }
    /// An index below `n` (n > 0).
    pub fn pick(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }
    /// A subset of `items`, by the bits of one byte.
    pub fn subset<T: Copy>(&mut self, items: &[T]) -> Vec<T> {
        let bits = self.byte();
        items
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << (i % 8)) != 0)
            .map(|(_, t)| *t)
            .collect()
    }
    pub fn exhausted(&self) -> bool {
        self.pos >= self.data.len()
    }
}
