//! The commands above the engine: each reads its input, calls the engine
//! (policy, packages, record) and writes what it found. `main.rs` only
//! parses the command line and dispatches here. Every command's entry is
//! `main(args, out, err) -> Exit`.

pub mod ca;
pub mod check;
pub mod explain;
pub mod grant;
pub mod log;
pub mod offline;
pub mod packages;
pub mod report;
pub mod run;
pub mod schema;
pub mod serve;

/// How far ahead `check` warns about an exception's expiry and `report`
/// lists it as expiring (one horizon for both).
pub const EXPIRY_WARNING_SECS: i64 = 14 * 86400;

/// The exit status of every command: 0 done (or allowed), 1 failed (or
/// denied, or errors found), and the codes a command documents beside
/// them (`run`'s are its sandbox's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit(pub u8);

impl Exit {
    pub const OK: Exit = Exit(0);
    pub const FAILED: Exit = Exit(1);
}

/// The `i32` statuses the command modules return (each in 0..=255).
impl From<i32> for Exit {
    fn from(code: i32) -> Exit {
        Exit(u8::try_from(code).unwrap_or(1))
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> std::process::ExitCode {
        std::process::ExitCode::from(e.0)
    }
}
