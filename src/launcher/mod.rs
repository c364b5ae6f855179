//! `egressd run [OPTIONS] -- CMD…`: runs CMD in fresh namespaces whose only
//! way out is egressd. This first part is the pure half: the plan of a
//! sandbox, the environment allowlist and the resource bounds.

pub mod env;
pub mod limits;
pub mod plan;
