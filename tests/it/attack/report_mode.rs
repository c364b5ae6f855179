//! One rule for `mode: report` (`policy::enforced`), held by the resolver
//! and the proxy alike: report mode lets through what only the allowlist
//! refuses, and never what the guards refuse (a non-public address, a
//! name over its tunnel budget). The table: {enforce, report} × {policy
//! denial, tunnel, private address} × {dns, http, connect}, every cell
//! over real sockets, with its answer and its one log line.

use std::io::{BufReader, Read, Write};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use super::*;

/// A name over `max_label_len` below the wildcard: a tunnel on its own.
const TUNNEL: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.t.test";

#[derive(Clone, Copy, Debug)]
enum Via {
    Dns,
    Http,
    Connect,
}

/// `(name, reason, whether report mode lets it through)`.
const DENIALS: &[(&str, &str, bool)] = &[
    // Only the allowlist refuses it: the exception is for another client.
    ("listed.test", "client_not_allowed", true),
    ("private.test", "private_address", false),
    (TUNNEL, "dns_tunnel", false),
];

fn lab(mode: &str) -> Lab {
    let l = crate::support::lab()
        .names(&["listed.test", "private.test"])
        .start(|p| {
            let ports = [p.origin, p.echo];
            policy()
                .mode(mode)
                .setting("dns", "{ tunnel: { max_label_len: 20 } }")
                .client_from("someone-else", &["10.99.0.0/16"])
                .exception("listed")
                .reason("another client's")
                .host("listed.test")
                .client("someone-else")
                .cidr(LOOPBACK)
                .ports(&ports)
                .exception("private")
                .reason("a name that resolves to loopback, no cidrs")
                .host("private.test")
                .ports(&ports)
                .exception("wild")
                .reason("a wildcard to tunnel under")
                .host("*.t.test")
                .cidr(LOOPBACK)
                .ports(&ports)
        });
    l.dns.set("*.t.test", &["127.0.0.1"]);
    l
}

/// Tries `name` by `via`: whether it got through, and the status or rcode
/// it got (for the log line).
fn attempt(l: &Lab, via: Via, name: &str, reason: &str) -> bool {
    let what = format!("{via:?} {name}");
    match via {
        Via::Dns => {
            let r = ask_udp(l.e.dns, &dns_query(&format!("{name}."), RecordType::A));
            if r.metadata.response_code == ResponseCode::NoError && !r.answers.is_empty() {
                return true;
            }
            assert_dns_denied(&r, reason, &what);
            false
        }
        Via::Http => {
            let r = http_request(
                l.e.proxy,
                get_raw(&format!("http://{name}:{}/", l.port())).as_bytes(),
            );
            if r.status == 200 {
                return true;
            }
            assert_eq!((r.status, r.reason()), (403, Some(reason)), "{what}");
            false
        }
        Via::Connect => {
            let mut s = connect(l.e.proxy);
            write!(s, "CONNECT {name}:{} HTTP/1.1\r\n\r\n", l.echo_port()).unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let resp = read_response(&mut r).expect("an answer to CONNECT");
            if resp.status != 200 {
                assert_eq!((resp.status, resp.reason()), (403, Some(reason)), "{what}");
                return false;
            }
            s.write_all(b"ping").unwrap();
            let mut back = [0u8; 4];
            r.read_exact(&mut back).unwrap();
            assert_eq!(&back, b"ping", "{what}");
            true
        }
    }
}

#[test]
fn report_mode_relaxes_the_allowlist_and_never_the_guards() {
    for mode in ["enforce", "report"] {
        let l = lab(mode);
        let mut lines = Lines::new(&l.e);
        for via in [Via::Dns, Via::Http, Via::Connect] {
            for &(name, reason, report_passes) in DENIALS {
                let what = format!("{mode} {via:?} {name}");
                let passes = mode == "report" && report_passes;
                assert_eq!(attempt(&l, via, name, reason), passes, "{what}");
                let line = lines.one(&what);
                assert_denied_line(&line, reason, None, &what);
                assert_eq!(line["mode"], mode, "{what}");
            }
        }
        lines.done(mode);
        let served = if mode == "report" { 1 } else { 0 };
        assert_eq!(
            l.origin.count(),
            served,
            "{mode}: requests the origin served"
        );
        assert_eq!(
            l.dns.count(TUNNEL),
            0,
            "{mode}: a tunnel name was asked upstream"
        );
    }
}
