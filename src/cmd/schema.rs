//! `egressd schema`: the policy's JSON Schema (its making is
//! [`super::check::schema`]) on stdout.

use std::io::Write;

use super::Exit;

/// `egressd schema`: the command's entry.
pub fn main(_args: (), out: &mut dyn Write, err: &mut dyn Write) -> Exit {
    match out.write_all(super::check::schema::render().as_bytes()) {
        Ok(()) => Exit::OK,
        Err(e) => {
            let _ = writeln!(err, "egressd: schema: {e}");
            Exit::FAILED
        }
    }
}
