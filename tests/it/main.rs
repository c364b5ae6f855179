//! One integration-test binary: egressd started as a real process on
//! loopback, driven over real sockets.

mod support;

mod attack;
mod check_formats;
mod forward;
mod launcher;
mod lifecycle;
mod ocsf;
mod policy_ci;
mod schema;
mod tls;
mod transparent;
mod tunnel;
mod upstream_proxy;
mod validators;
