//! What a write carries, read before it is forwarded (DESIGN "Writes on
//! allowed hosts"): git's pkt-lines and packfiles, and a push judged
//! against an exception's `git.push`; a request body judged against
//! `body:` (JSON pointers, GraphQL operations). Pure: bytes in memory in, verdicts
//! out; bounded in every dimension an attacker controls. The proxy reads
//! the bodies and answers (`proxy::writes`).

pub mod body;
pub mod git;
pub mod pack;
pub mod pktline;
