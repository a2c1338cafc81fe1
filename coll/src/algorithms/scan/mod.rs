//! Scan and exscan algorithms.
pub mod chain;
pub mod multi_leader;
pub mod recursive_doubling;
