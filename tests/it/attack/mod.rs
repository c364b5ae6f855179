//! The attack suite (issue 6): every known way around an egress proxy, tried
//! against a real `egressd serve` over real sockets. Each attack asserts four
//! things: the answer (status and `X-Egressd-Reason`, or DNS rcode), that
//! nothing reached a canary or a denied origin, that no denied name reached
//! the fake upstream DNS, and that the decision log has exactly one line
//! for it, saying why.
//!
//! One file per class of attack:
//!
//! | file | class |
//! |---|---|
//! | `literals.rs` | IP literals in every spelling, metadata addresses |
//! | `hostnames.rs` | host-name games: case, dots, labels, IDN, encodings |
//! | `targets.rs` | request-target vs `Host`, userinfo, schemes, ports, egressd itself |
//! | `connect.rs` | CONNECT authorities, pipelining, SNI, non-TLS bytes |
//! | `rebinding.rs` | DNS rebinding, time-of-check/time-of-use, redirects |
//! | `report_mode.rs` | `mode: report` against the guards: {enforce, report} × {policy denial, tunnel, private address} × {dns, http, connect} |
//! | `smuggling.rs` | CL.TE, TE.CL, framing tricks, pipelining (origin bytes checked) |
//! | `framing.rs` | strict framing past hyper: transfer codings, canonical lengths, ambiguous answers, head and extension bounds, `Host` lists, method overrides |
//! | `upgrades.rs` | h2c, HTTP/2 prior knowledge, WebSocket |
//! | `body.rs` | hostile bodies against `body:` rules: GraphQL nested 10,000 deep, duplicate JSON keys, huge bodies |
//! | `git_push.rs` | malformed pushes at the git gate: pkt-lines, lying packs, delta loops, zip bombs |
//! | `dns.rs` | the resolver: packet abuse, floods, hostile upstream answers |
//! | `dns_tools/` | DNS tunnels: real iodine and dns2tcp in a namespace lab, generated tunnels, the benign corpus |
//! | `ech.rs` | ECH configurations in HTTPS/SVCB answers |
//! | `fairness.rs` | one client holding thousands of connections or DNS queries: others keep their share |
//! | `fairness_dns.rs` | one address spending a wildcard's tunnel budget, twenty holding every TCP DNS slot: the others keep theirs |
//! | `fairness_h2.rs` | intercepted HTTP/2 streams with a shut window: counted against the share, reset past the stall bound |
//! | `fairness_log.rs` | log volume per client: HPACK-referenced long paths, floods summarised, slowloris on the proxy port has its line |
//! | `faults.rs` | resets, dead upstreams, reload storms, drain, rotation, full sink |
//! | `guard.rs` | `egressd run`'s guard: a hostile CMD against egressd's own files, log, keyring, PID 1, `.git` (issue 36); `guard_identity.rs`: the sandbox's own client, the echoed credential; `guard_admin.rs`: no egressd listener but its proxy and resolver reachable from the box, however the policy opens the host |
//! | `proxy_protocol.rs` | a forged PROXY protocol header on DNS: believed only from a `--dns-proxy-protocol` balancer |
//! | `log_stall.rs` | a decision log that stops taking lines: stalled FIFO, `/dev/full`, full tmpfs |
//!
//! The fixtures (a [`Lab`], the fake DNS, raw origins, the decision-log
//! cursor [`Lines`]) are the whole suite's, in `tests/it/support/`.

pub use crate::support::*;

mod body;
mod connect;
mod dns;
mod dns_tools;
mod ech;
mod fairness;
mod fairness_dns;
mod fairness_h2;
mod fairness_log;
mod faults;
mod framing;
mod git_push;
mod guard;
mod guard_admin;
mod guard_identity;
mod hostnames;
mod literals;
mod log_stall;
mod proxy_protocol;
mod rebinding;
mod report_mode;
mod smuggling;
mod targets;
mod upgrades;
