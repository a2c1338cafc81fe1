//! Barrier algorithms.
pub mod dissemination;
pub(crate) mod shm;
pub mod tree;
