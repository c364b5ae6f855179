//! egressd: the one door out of an agent sandbox. Every HTTP request,
//! CONNECT tunnel and DNS query that leaves a sandbox reaches egressd, is
//! decided against the policy's exceptions (everything not excepted is
//! denied), and is written down as one decision-log line.
//!
//! ```text
//!            ┌─ proxy: accept → admit → forward │ tunnel ─► mitm │ transparent ─┐
//!  client ──►┤          (the edges parse into Dest; exchange is the shared path) ├─┐
//!            └─ dns:   server → handler (fast path │ hickory) ───────────────────┘ │
//!                                                                                 │ one policy::Request
//!   policy::Policy::decide ◄───────────────────────────────────────────────────────┘
//!   (pure, on an Arc snapshot that reload swaps)
//!        │ Decision { verdict, reason, exception }
//!        ▼
//!   record::Recorder::record ─► log (one JSON line, bounded, fail closed)
//!        │                    └► metrics (counted here and nowhere else)
//!        │ allowed
//!        ▼
//!   proxy::exchange, one request: decide → route → reach → answer
//!        │  route: plain, or proxy::gate's (a registry host of an enforced
//!        │  ecosystem: classify → decide the package with packages, pure →
//!        │  Route: gated index │ gated download │ mirror, or its own answer)
//!        ▼
//!   proxy::origin, the one upstream path (client requests and egressd's own
//!        │  index fetches alike), on proxy::upstream: resolve once
//!        │  (dns::Resolver) → check every address → connect to a checked
//!        │  SocketAddr (pool, tls_origins; a tunnel's bytes: relay)
//!        ▼
//!   answer (a gated index filtered, a pinned download hashed as it streams)
//! ```
//!
//! Every front-end turns its input into one [`policy::Request`], asks
//! [`policy::Policy::decide`] for one [`policy::Decision`], and records
//! exactly one [`record::Event`] through [`record::Recorder::record`].
//! Policies are compiled once per load and swapped atomically
//! ([`policy::PolicyHandle`]); readers never block.
//!
//! # Modules
//!
//! | module | owns | does not own |
//! |---|---|---|
//! | [`time`] | the clock, RFC 3339 timestamps, civil dates, short durations | any timeout (each sits beside the wait it bounds) |
//! | [`shutdown`] | the one stop signal; permits that bound what is open and the drain that waits for them | how long a drain may take (`app`) |
//! | [`policy`] | YAML → validated [`policy::Policy`] (`compile/`), the one `decide`, the host and path parsers, the decision values, the atomic pointer readers load | any I/O but reading policy files; logging; reloading |
//! | [`metrics`] | the registry, `/metrics`, `/healthz`, `/readyz` | when a request is counted (`record`) |
//! | [`log`] | the decision-log sink: one writer thread, bounded, fail closed, reopen on SIGUSR1 | what a line says |
//! | [`record`] | the typed [`record::Event`], its JSON writer, [`record::Recorder`]: the one log-and-count | the decision |
//! | [`tls`] | the interception CA, minted leaves and their cache, trust stores | intercepted connections (`proxy::mitm`) |
//! | [`dns`] | the resolver front-end, the upstream client and cache, the tunnel budget, which name an answered address came from | the decision; binding sockets |
//! | [`proxy`] | the HTTP front-ends (forward, CONNECT, interception, transparent capture), the shared exchange (decide → route → reach → answer), the one upstream path (`proxy::origin`), the package gate's serving step (`proxy::gate`: the route, own index fetches, index cache, answers), the relay, the way out | the decision; the resolver; which versions are approved (`packages`) |
//! | [`reload`] | watch → load → swap, the last good policy kept; the reloader thread's priority | compiling (`policy`) |
//! | [`app`] | wiring: load, bind, spawn, signals, drain; an egressd run in-process | answering any request |
//! | [`packages`] | the package gate's knowledge, PURE: classify a registry URL, names, versions, stamps, index filters, the package decision, lockfile import; the policy compiles and holds its sets | any I/O; serving (`proxy::gate`) |
//! | [`cmd`] | the commands above the engine, each `main(args, out, err) -> Exit`: `check` (+ `--against`), `explain`, `report` (+ replay), `packages import`, `ca init`, `schema`, `serve`, `run`; `offline`, the decision without the network that explain, check and replay share | serving; the sandbox (`launcher`) |
//! | [`launcher`] | `egressd run`: the plan, namespaces, the sandbox's environment and limits | decisions (it embeds `app`) |
//! | [`cli`] | the command line: the commands and the flags `serve` and `run` share | behaviour; exit codes (`cmd::Exit`) |
//!
//! # Layers
//!
//! Imports point down, and a test in the suite (`layering.rs`) reads every
//! `crate::` path to hold them there: `time` and `shutdown` use nothing of
//! the crate; `policy` uses only `time`; `metrics` and `log` only `policy`
//! and `time` (and `log` counts its write errors in `metrics`); `record`
//! those; `tls` only `policy` and `time`; the front-ends `dns` and `proxy`
//! what is below them (the proxy resolves through `dns`, never the other
//! way). `app`, `reload`, the commands and `launcher` sit on top. Inside
//! `proxy` the modules form a one-way graph too: the edges (`forward`,
//! `tunnel`, `mitm`, `transparent`) use the shared steps (`dest`,
//! `respond`, `admit`, `exchange`, `gate`, `origin`, `relay`, `upstream`),
//! never the other way round. An import that points up is a design
//! question, not a shortcut.
//!
//! Functions are short: another test (`fn_length.rs`) fails on any
//! function in `src/` over 80 lines (test code aside), naming it.

/// The allocator of every binary built on this crate (egressd, its
/// examples and tests): mimalloc. Measured with 100k exceptions and six
/// reloads, glibc's malloc kept 311 MiB resident (its arenas keep the pages
/// freed by a compile), mimalloc with [`reload::release_freed_memory`]
/// 102–107 MiB; a kept-alive GET also costs 6% fewer instructions. The
/// crate's own unit tests count allocations through a wrapper around it
/// (`dns::alloc_count`).
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod app;
pub mod cli;
pub mod cmd;
pub mod dns;
#[cfg(test)]
mod fn_length;
pub mod launcher;
#[cfg(test)]
mod layering;
pub mod log;
pub mod metrics;
pub mod packages;
pub mod policy;
pub mod proxy;
pub mod record;
pub mod reload;
pub mod shutdown;
pub mod time;
pub mod tls;
pub mod writes;
