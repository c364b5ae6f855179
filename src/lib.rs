//! egressd: the one door out of an agent sandbox.
//!
//! ```text
//!  client ──► front-ends ────────► policy ─────────► decision ─────────► upstream
//!             proxy::forward       Policy::decide     Recorder::record    proxy::upstream
//!             proxy::tunnel        (pure, on an       (one JSON line,     (resolve once,
//!             dns::server           Arc snapshot)      metrics)            check, connect)
//! ```
//!
//! Every front-end turns its input into one [`policy::Request`], asks
//! [`policy::Policy::decide`] for one [`policy::Decision`], and records
//! exactly one [`record::Event`] through [`record::Recorder::record`].
//! Policies are compiled once per load and swapped atomically
//! ([`policy::PolicyHandle`]); readers never block.

pub mod app;
pub mod check;
pub mod cli;
pub mod dns;
pub mod explain;
pub mod launcher;
#[cfg(test)]
mod layering;
pub mod log;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod record;
pub mod reload;
pub mod report;
pub mod shutdown;
pub mod time;
pub mod tls;
