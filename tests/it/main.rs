//! One integration-test binary: egressd started as a real process on
//! loopback, driven over real sockets.

mod support;

mod attack;
mod browser;
mod check_formats;
mod deny_answers;
mod deploy;
mod dns;
mod examples;
mod explain_packages;
mod fast_path;
mod fleet;
mod forge_api;
mod forward;
mod fuzz_regressions;
mod git_gate;
mod grants;
mod launcher;
mod lifecycle;
mod ocsf;
mod package_gate;
mod package_policy;
mod packages;
mod packages_import;
mod policy_ci;
mod policy_files;
mod record;
mod report;
mod sandbox;
mod schema;
mod timeouts;
mod tls;
mod tls_reuse;
mod transparent;
mod tunnel;
mod upload;
mod upstream_proxy;
mod validators;
