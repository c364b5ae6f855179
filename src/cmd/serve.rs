//! `egressd serve`: a runtime built, the engine run ([`crate::app::serve`])
//! until a signal, its log flushed.

use std::io::Write;
use std::time::Duration;

use super::Exit;
use crate::app::ServeArgs;

/// `egressd serve`: the command's entry.
pub fn main(args: ServeArgs, _out: &mut dyn Write, err: &mut dyn Write) -> Exit {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(err, "egressd: cannot start runtime: {e}");
            return Exit::FAILED;
        }
    };
    match rt.block_on(crate::app::serve(args)) {
        Ok(log) => {
            // Connections still open after the drain period are dropped
            // with the runtime; each writes its line as it goes, and the
            // log is flushed before the process ends.
            rt.shutdown_timeout(Duration::from_secs(1));
            log.finish(Duration::from_secs(2));
            Exit::OK
        }
        Err(e) => {
            let _ = writeln!(err, "egressd: {e:#}");
            Exit::FAILED
        }
    }
}
