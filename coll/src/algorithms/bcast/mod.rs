//! Broadcast algorithms.
pub mod binomial;
pub mod chain;
pub mod scatter_allgather;
