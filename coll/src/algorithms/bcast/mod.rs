//! Broadcast algorithms.
pub mod binomial;
pub mod chain;
pub mod scatter_allgather;
pub(crate) mod shm;
