//! The package gate (DESIGN "Packages"): approved package sets, the
//! classification of registry URLs, the one package decision, index
//! filtering and lockfile import. PURE: no I/O, no clock, no logging.
//! Everything here is a function of its arguments, so the proxy can call
//! it per request and tests can call it with tables.

pub mod classify;
pub mod compile;
pub mod decide;
pub mod name;
pub mod raw;
pub mod version;
pub mod view;

#[cfg(test)]
pub(crate) mod testutil;

use serde::Deserialize;

/// The four registries the gate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    Pypi,
    Npm,
    Cargo,
    Go,
}

impl Ecosystem {
    pub const ALL: [Ecosystem; 4] = [
        Ecosystem::Pypi,
        Ecosystem::Npm,
        Ecosystem::Cargo,
        Ecosystem::Go,
    ];

    /// The policy's and the log's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Ecosystem::Pypi => "pypi",
            Ecosystem::Npm => "npm",
            Ecosystem::Cargo => "cargo",
            Ecosystem::Go => "go",
        }
    }

    /// Position in [`Ecosystem::ALL`].
    pub fn index(self) -> usize {
        match self {
            Ecosystem::Pypi => 0,
            Ecosystem::Npm => 1,
            Ecosystem::Cargo => 2,
            Ecosystem::Go => 3,
        }
    }
}
