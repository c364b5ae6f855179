//! Command line: `serve`, `check`, `schema`, `explain`, `report`, `run`, `packages`, `ca`. Every `serve` flag can also
//! come from an `EGRESSD_*` environment variable.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "egressd",
    version,
    about = "Egress-control forward proxy and DNS resolver for agent sandboxes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy, the DNS resolver and the metrics endpoint; the policy is hot-reloaded.
    Serve(ServeArgs),
    /// Validate and lint a policy directory or file (exit 1 on errors).
    Check(crate::cmd::check::Args),
    /// Print the policy's JSON Schema (for editors and CI validators).
    Schema,
    /// Say which exception (if any) allows a target, and why not otherwise;
    /// for `pkg:ECOSYSTEM/NAME[@VERSION]`, the package gate's decision.
    Explain(crate::cmd::explain::Args),
    /// Exception review from decision logs: use per exception, stale, expired
    /// and expiring exceptions, the hottest, and the most-denied destinations
    /// with ready-to-edit exception stubs.
    Report(crate::cmd::report::Options),
    /// Run CMD in a sandbox whose only way out is egressd (embedded by default).
    Run(RunArgs),
    /// The package gate's approved sets.
    Packages {
        #[command(subcommand)]
        command: crate::cmd::packages::Command,
    },
    /// Check a chained decision log (`--log-chain`), or make its signing key.
    Log {
        #[command(subcommand)]
        command: crate::log::verify::LogCommand,
    },
    /// Manage the TLS-interception CA.
    Ca {
        #[command(subcommand)]
        command: crate::cmd::ca::Command,
    },
    /// Turn a denied request into an expiring, use-bounded exception (a
    /// grant) in the grants directory; list, revoke or promote grants.
    Grant(crate::cmd::grant::GrantArgs),
}

pub use crate::app::{EngineArgs, ServeArgs};
pub use crate::launcher::RunArgs;
