//! The git gate's readers: a push body (pkt-lines, ref-update commands)
//! and its pack (objects, deltas, commits, trees), judged against fixed
//! rules. Invariants: nothing panics or loops on any input; a judgement
//! that allows the push allows every ref in it, one that refuses it
//! refuses every ref (all or nothing); the refusal answer is well-formed
//! pkt-lines.

use std::sync::OnceLock;

use egressd::policy::{from_yaml, Policy};
use egressd::writes::git::{judge, parse_request, refusal};
use egressd::writes::pack::{Arrived, Limits, Pack};
use egressd::writes::pktline::{Pkt, Reader};

fn policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| {
        from_yaml(
            "exceptions:\n  - id: w\n    owner: o\n    reason: r\n    hosts: [git.example.com]\n    git:\n      repos: [acme/widgets]\n      push:\n        refs: [\"refs/heads/agent/**\"]\n        deny_paths: [\".github/workflows/**\", \"**/secret\"]\n",
        )
        .expect("the harness policy loads")
    })
}

pub fn run(data: &[u8]) {
    // The pack reader on the raw bytes too, with small bounds.
    let small = Limits {
        max_object: 1 << 20,
        max_inflated: 4 << 20,
        max_depth: 8,
    };
    let _ = Pack::parse(data, small);
    // Read as it arrives, a few bytes at a time: every commit and tree it
    // keeps is the one a whole reading finds.
    let trickle = std::io::BufReader::with_capacity(7, data);
    if let Ok(Arrived::Read(a)) = Pack::read_arriving(trickle, small) {
        if let Ok(w) = Pack::parse_whole(data, small) {
            for id in a.commits() {
                assert_eq!(a.commit(id), w.commit(id));
                if let Some(Ok(c)) = a.commit(id) {
                    assert_eq!(a.tree(&c.tree), w.tree(&c.tree));
                }
            }
        }
    }
    let Ok(req) = parse_request(data) else {
        return;
    };
    let push = policy().exceptions[0]
        .git()
        .and_then(|g| g.push.as_ref())
        .expect("push rules");
    let j = judge(push, &req);
    if j.allowed() {
        assert!(j.refs.iter().all(|r| r.refused.is_none()));
        return;
    }
    let out = refusal(&j, req.sideband(), &["refused".to_string()]);
    let mut r = Reader::new(&out);
    let mut flushes = 0;
    while let Some(p) = r.next_pkt().expect("the answer reads as pkt-lines") {
        if p == Pkt::Flush {
            flushes += 1;
        }
    }
    assert!(flushes >= 1);
}
