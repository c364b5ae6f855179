//! Command line: `serve`, `check`, `explain`. Every `serve` flag can also
//! come from an `EGRESSD_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy, the DNS resolver and the metrics endpoint; the policy is hot-reloaded.
    Serve(ServeArgs),
    /// Validate and lint a policy directory or file (exit 1 on errors).
    Check {
        /// Policy directory or file.
        #[arg(default_value = "policy/")]
        policy: PathBuf,
    },
    /// Say which exception (if any) allows a target, and why not otherwise.
    Explain {
        #[arg(long, env = "EGRESSD_POLICY", default_value = "policy/")]
        policy: PathBuf,
        /// Decide as this client (an id from settings.clients).
        #[arg(long)]
        client: Option<String>,
        /// `https://host/path`, `http://host:port/path`, `host:port`, `GET http://…`, or `dns:name[/TYPE]`.
        #[arg(required = true, num_args = 1..=2)]
        target: Vec<String>,
    },
    /// Manage the TLS-interception CA.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create the interception CA: `ca.pem` (give it to sandboxes) and `ca.key` (mode 0600).
    Init {
        /// Directory to write the CA into.
        #[arg(long, default_value = "certs/")]
        dir: PathBuf,
        /// Days the CA is valid.
        #[arg(long, default_value_t = crate::tls::ca::DEFAULT_CA_DAYS)]
        days: u32,
        /// Replace an existing CA (clients trusting the old one stop trusting egressd).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Policy directory or file.
    #[arg(long, env = "EGRESSD_POLICY", default_value = "policy/")]
    pub policy: PathBuf,
    /// HTTP proxy listen address.
    #[arg(long, env = "EGRESSD_LISTEN", default_value = "127.0.0.1:3128")]
    pub listen: SocketAddr,
    /// DNS resolver listen address (UDP and TCP).
    #[arg(long, env = "EGRESSD_DNS_LISTEN", default_value = "127.0.0.1:8053")]
    pub dns_listen: SocketAddr,
    /// Metrics listen address (/metrics, /healthz, /readyz).
    #[arg(long, env = "EGRESSD_METRICS_LISTEN", default_value = "127.0.0.1:9464")]
    pub metrics_listen: SocketAddr,
    /// Upstream DNS servers: IP or IP:PORT, comma-separated (default: /etc/resolv.conf's nameservers).
    #[arg(long, env = "EGRESSD_UPSTREAM_DNS")]
    pub upstream_dns: Option<String>,
    /// Decision log path; `-` is stdout.
    #[arg(long, env = "EGRESSD_LOG", default_value = "-")]
    pub log: String,
    /// Directory holding the interception CA (`ca.pem`, `ca.key`); enables TLS interception.
    #[arg(long, env = "EGRESSD_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// Extra CA certificates (PEM) to trust for origins, beside the system roots.
    #[arg(long, env = "EGRESSD_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,
}
