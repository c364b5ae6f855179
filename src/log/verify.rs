//! `egressd log verify`: walks a chained decision log.
