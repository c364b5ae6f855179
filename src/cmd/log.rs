//! `egressd log verify|keygen`: check a chained decision log, or make the
//! key that signs its checkpoints (the chain itself is [`crate::log::chain`]).

use std::io::Write;

use super::Exit;
use crate::log::verify::LogCommand;

/// `egressd log`: the command's entry.
pub fn main(command: LogCommand, _out: &mut dyn Write, _err: &mut dyn Write) -> Exit {
    Exit(crate::log::verify::main(command))
}
