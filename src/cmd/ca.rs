//! `egressd ca init`: the interception CA made (the work is
//! [`crate::tls::init_ca`]), and what to do with it said.

use std::io::Write;
use std::path::PathBuf;

use super::Exit;

/// `egressd ca …`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
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

/// `egressd ca`: the command's entry.
pub fn main(command: Command, out: &mut dyn Write, err: &mut dyn Write) -> Exit {
    let Command::Init { dir, days, force } = command;
    let opts = crate::tls::InitOptions { dir, days, force };
    match crate::tls::init_ca(&opts) {
        Ok(done) => {
            let _ = writeln!(
                out,
                "created {} ({})\n  certificate: {} (give this to sandboxes and clients)\n  key:         {} (mode 0600; keep it to the egressd user)\nserve with: egressd serve --ca-dir {}",
                done.subject,
                format_args!("valid {days} days"),
                done.cert.display(),
                done.key.display(),
                opts.dir.display()
            );
            Exit::OK
        }
        Err(e) => {
            let _ = writeln!(err, "egressd: ca init: {e}");
            Exit::FAILED
        }
    }
}
