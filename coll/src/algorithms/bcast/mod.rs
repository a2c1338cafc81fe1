//! Broadcast algorithms.
pub mod binomial;
pub mod chain;
pub mod node_aware;
pub mod scatter_allgather;
