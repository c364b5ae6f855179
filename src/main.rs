use std::process::ExitCode;

use clap::Parser;
use egressd::cli::{CaCommand, Cli, Command, PackagesCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("egressd: cannot start runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            match rt.block_on(egressd::app::serve(args)) {
                Ok(log) => {
                    // Connections still open after the drain period are
                    // dropped with the runtime; each writes its line as it
                    // goes, and the log is flushed before the process ends.
                    rt.shutdown_timeout(std::time::Duration::from_secs(1));
                    log.finish(std::time::Duration::from_secs(2));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("egressd: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Check {
            policy,
            mut against,
            format,
        } => {
            // `check --against a.log b.log policy/`: the last value is the policy.
            let policy = policy.unwrap_or_else(|| {
                match against.last() {
                    Some(p)
                        if against.len() > 1
                            && (p.is_dir()
                                || p.extension().is_some_and(|e| e == "yaml" || e == "yml")) =>
                    {
                        against.pop()
                    }
                    _ => None,
                }
                .unwrap_or_else(|| "policy/".into())
            });
            let opts = egressd::check::Options {
                policy,
                against,
                format,
            };
            let code = egressd::check::run(&opts, &mut std::io::stdout(), &mut std::io::stderr());
            ExitCode::from(code as u8)
        }
        Command::Schema => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            match out.write_all(egressd::check::schema::render().as_bytes()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("egressd: schema: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Report(args) => {
            let opts = egressd::report::Options {
                policy: args.policy,
                since_secs: args.since,
                format: args.format,
                top: args.top,
                logs: args.logs,
            };
            let code = egressd::report::run_report(
                &opts,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr(),
            );
            ExitCode::from(code as u8)
        }
        Command::Explain {
            policy,
            client,
            target,
        } => {
            let target = target.join(" ");
            let code = egressd::explain::run_explain(
                &policy,
                client.as_deref(),
                &target,
                &mut std::io::stdout(),
            );
            ExitCode::from(code as u8)
        }
        // Before any runtime exists: the launcher forks while single-threaded.
        Command::Run(args) => ExitCode::from(egressd::launcher::main(args)),
        Command::Packages {
            command:
                PackagesCommand::Import {
                    id,
                    owner,
                    reason,
                    output,
                    lockfiles,
                },
        } => {
            let args = egressd::cmd::packages::ImportArgs {
                id: &id,
                owner: &owner,
                reason: reason.as_deref(),
                output: output.as_deref(),
                lockfiles: &lockfiles,
            };
            let code = egressd::cmd::packages::run_import(
                &args,
                &mut std::io::stdout().lock(),
                &mut std::io::stderr(),
            );
            ExitCode::from(code as u8)
        }
        Command::Ca {
            command: CaCommand::Init { dir, days, force },
        } => {
            let opts = egressd::tls::InitOptions { dir, days, force };
            match egressd::tls::init_ca(&opts) {
                Ok(done) => {
                    println!(
                        "created {} ({})\n  certificate: {} (give this to sandboxes and clients)\n  key:         {} (mode 0600; keep it to the egressd user)\nserve with: egressd serve --ca-dir {}",
                        done.subject,
                        format_args!("valid {days} days"),
                        done.cert.display(),
                        done.key.display(),
                        opts.dir.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("egressd: ca init: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
