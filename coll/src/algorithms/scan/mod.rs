//! Scan and exscan algorithms.
pub mod chain;
pub mod recursive_doubling;
