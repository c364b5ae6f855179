//! Log volume per client is bounded (issue 41, item 4).
