//! Reduce algorithms.
pub mod binomial;
pub mod node_aware;
pub mod reduce_scatter_gather;
