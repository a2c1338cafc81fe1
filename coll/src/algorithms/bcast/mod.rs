//! Broadcast algorithms.
pub mod binomial;
pub mod chain;
pub mod multi_leader;
pub mod node_aware;
pub mod scatter_allgather;
