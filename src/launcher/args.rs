//! `egressd run`'s command line: the sandbox's own flags beside the embedded
//! egressd's ([`crate::app::EngineArgs`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::app::{EngineArgs, ServeArgs};

/// `egressd run [OPTIONS] -- CMD [ARGS…]`: the sandbox's own options, plus
/// the flags of the egressd it embeds (unless `--connect` names one).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The embedded egressd's policy, DNS upstreams, log format, CA and way out.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Decision log of the embedded egressd, a file (default: a new file outside the
    /// sandbox, its path printed at start; never CMD's stdout or stderr).
    #[arg(long, default_value = "")]
    pub log: String,
    /// Let the sandbox write the working directory's `.git/config`, `.git/hooks`,
    /// `.git/info` and `.git/commondir` (read-only inside by default).
    #[arg(long)]
    pub git_writable: bool,
    /// Use the egressd serving its proxy at ADDR instead of embedding one.
    #[arg(long, value_name = "ADDR")]
    pub connect: Option<SocketAddr>,
    /// With --connect: that egressd's DNS address (default: ADDR's IP, port 8053).
    #[arg(long, value_name = "ADDR")]
    pub connect_dns: Option<SocketAddr>,
    /// The sandbox's client id (default `sandbox`); with --connect, the token that
    /// proves it comes from EGRESSD_TOKEN or --token-file.
    #[arg(long, value_name = "ID")]
    pub client: Option<String>,
    /// File holding the --client token.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Capture every TCP connection and DNS query that leaves the sandbox, even
    /// from programs that ignore the proxy variables (nftables inside the
    /// sandbox's own network namespace); other UDP is dropped.
    #[arg(long)]
    pub transparent: bool,
    /// The nft program --transparent runs (default: found in PATH, /usr/sbin, /sbin).
    #[arg(long, env = "EGRESSD_NFT", value_name = "PATH")]
    pub nft: Option<PathBuf>,
    /// Pass NAME from this environment, or set NAME=VALUE, inside (repeatable).
    #[arg(long = "env", value_name = "NAME[=VALUE]", value_parser = crate::launcher::env::parse_env_spec)]
    pub env: Vec<crate::launcher::env::EnvSpec>,
    /// Kill the whole sandbox after DUR (`90`, `30s`, `5m`, `1500ms`); exit 124.
    #[arg(long, value_name = "DUR", value_parser = crate::launcher::limits::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Memory for the whole sandbox, no swap (cgroup; RLIMIT_AS per process where
    /// no cgroup can be made), e.g. 512M, 2G. Reaching it kills the sandbox.
    #[arg(long, value_name = "BYTES", value_parser = crate::launcher::limits::parse_bytes)]
    pub memory: Option<u64>,
    /// CPU time for the whole sandbox in seconds, all processes together
    /// (cgroup; RLIMIT_CPU per process where no cgroup can be made); exit 152.
    #[arg(long, value_name = "SECS", value_parser = crate::launcher::limits::parse_count)]
    pub cpu: Option<u64>,
    /// Processes and threads CMD and its descendants may have (cgroup; RLIMIT_NPROC
    /// of the sandbox's uid where no cgroup can be made).
    #[arg(long, alias = "nproc", value_name = "N", value_parser = crate::launcher::limits::parse_count)]
    pub pids: Option<u64>,
    /// Largest file CMD may write (RLIMIT_FSIZE), e.g. 100M.
    #[arg(long, value_name = "BYTES", value_parser = crate::launcher::limits::parse_bytes)]
    pub file_size: Option<u64>,
    /// Bind a host path read-only at the same place inside (repeatable).
    #[arg(long, value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// Bind a host path writable at the same place inside (repeatable).
    #[arg(long, value_name = "PATH")]
    pub rw: Vec<PathBuf>,
    /// How the working directory is shown: rw, ro, or none (CMD starts in HOME).
    #[arg(long, value_name = "rw|ro|none", default_value = "rw", value_parser = crate::launcher::plan::parse_cwd_mode)]
    pub cwd: crate::launcher::plan::CwdMode,
    /// CMD's uid inside the sandbox (never 0).
    #[arg(long, value_name = "N", default_value_t = crate::launcher::identity::DEFAULT_ID)]
    pub uid: u32,
    /// CMD's gid inside the sandbox (never 0).
    #[arg(long, value_name = "N", default_value_t = crate::launcher::identity::DEFAULT_ID)]
    pub gid: u32,
    /// Started as root: files CMD creates in the working directory and --rw paths
    /// belong to USER (a name, UID or UID:GID; default: SUDO_UID, else root).
    #[arg(long, value_name = "USER")]
    pub owner: Option<String>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<std::ffi::OsString>,
}

impl RunArgs {
    /// The embedded egressd's settings. Its listeners are created inside the
    /// sandbox, so the listen addresses here are never bound.
    pub fn embedded_serve_args(&self) -> ServeArgs {
        ServeArgs {
            engine: self.engine.clone(),
            listen: SocketAddr::from(([127, 0, 0, 1], 3128)),
            dns_listen: SocketAddr::from(([127, 0, 0, 1], 53)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            // The sandbox's own queries, never a balancer's.
            dns_proxy_protocol: Vec::new(),
            log: self.log.clone(),
        }
    }
}
