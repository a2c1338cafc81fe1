//! Scan and exscan algorithms.
pub mod recursive_doubling;
pub(crate) mod shm;
