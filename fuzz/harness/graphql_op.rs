//! The `body:` readers: the duplicate-refusing JSON reader and the GraphQL
//! operation reader, on any bytes. Invariants: nothing panics, overflows
//! the stack or loops (a document nested 10,000 deep included); what the
//! strict JSON reader accepts, serde_json reads to the same value; the
//! judge of a GraphQL request agrees with the operation it reads (a
//! query passes the read rules and fails the mutation rules; a mutation
//! passes the mutation rules exactly when every top-level field is listed).

use std::sync::OnceLock;

use egressd::policy::{from_yaml, Policy};
use egressd::writes::body::{judge, operation, read_json, OpKind};

fn policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| {
        from_yaml(
            "exceptions:\n  - id: read\n    owner: o\n    reason: r\n    hosts: [api.test]\n    body: { graphql: { queries: true } }\n  - id: pr\n    owner: o\n    reason: r\n    hosts: [api.test]\n    body: { graphql: { mutations: [createPullRequest, addComment] } }\n",
        )
        .expect("the harness policy loads")
    })
}

pub fn run(data: &[u8]) {
    // The JSON reader against serde_json's own.
    if let Ok(v) = read_json(data) {
        let plain: serde_json::Value =
            serde_json::from_slice(data).expect("serde_json reads what the strict reader reads");
        assert_eq!(v, plain, "the strict reader reads the same value");
    }
    let Ok(doc) = std::str::from_utf8(data) else {
        return;
    };
    // The operation name, when the document's first line names one.
    let name = doc
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#op "))
        .map(str::trim);
    let op = operation(doc, name);
    let body = serde_json::to_vec(&serde_json::json!({"query": doc, "operationName": name}))
        .expect("a JSON request");
    let read = judge(policy().exceptions[0].body().expect("rules"), &body);
    let pr = judge(policy().exceptions[1].body().expect("rules"), &body);
    match op {
        Err(_) => {
            assert!(
                read.is_err() && pr.is_err(),
                "an unreadable document passes nothing"
            );
        }
        Ok(op) => match op.kind {
            OpKind::Query => assert!(read.is_ok() && pr.is_err(), "{op:?}"),
            OpKind::Subscription => assert!(read.is_err() && pr.is_err(), "{op:?}"),
            OpKind::Mutation => {
                let listed = !op.fields.is_empty()
                    && op
                        .fields
                        .iter()
                        .all(|f| f == "createPullRequest" || f == "addComment");
                assert!(read.is_err(), "{op:?}");
                assert_eq!(pr.is_ok(), listed, "{op:?}");
            }
        },
    }
}
