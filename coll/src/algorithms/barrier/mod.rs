//! Barrier algorithms.
pub mod dissemination;
pub mod tree;
