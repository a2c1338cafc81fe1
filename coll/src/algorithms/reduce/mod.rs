//! Reduce algorithms.
pub mod binomial;
pub mod reduce_scatter_gather;
