use std::io::{stderr, stdout};
use std::process::ExitCode;

use clap::Parser;
use egressd::cli::{Cli, Command};
use egressd::cmd;

fn main() -> ExitCode {
    // Unlocked: `serve --log -` writes the decision log to stdout from its own thread.
    let (out, err) = (&mut stdout(), &mut stderr());
    let exit = match Cli::parse().command {
        Command::Serve(args) => cmd::serve::main(args, out, err),
        Command::Check(args) => cmd::check::main(args, out, err),
        Command::Schema => cmd::schema::main((), out, err),
        Command::Report(args) => cmd::report::main(args, out, err),
        Command::Explain(args) => cmd::explain::main(args, out, err),
        // Before any runtime exists: the launcher forks while single-threaded.
        Command::Run(args) => cmd::run::main(args, out, err),
        Command::Log { command } => cmd::log::main(command, out, err),
        Command::Packages { command } => cmd::packages::main(command, out, err),
        Command::Ca { command } => cmd::ca::main(command, out, err),
        Command::Grant(args) => cmd::grant::main(args, out, err),
    };
    exit.into()
}
