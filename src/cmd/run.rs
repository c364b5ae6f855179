//! `egressd run`: the launcher ([`crate::launcher::main`]), before any
//! runtime exists (it forks while single-threaded).

use std::io::Write;

use super::Exit;
use crate::launcher::RunArgs;

/// `egressd run`: the command's entry (the launcher writes its own
/// messages to the process's stderr).
pub fn main(args: RunArgs, _out: &mut dyn Write, _err: &mut dyn Write) -> Exit {
    Exit(crate::launcher::main(args))
}
