//! The commands above the engine: each reads its input, calls the engine
//! (policy, packages, record) and writes what it found. `main.rs` only
//! parses the command line and dispatches here.

pub mod packages;
