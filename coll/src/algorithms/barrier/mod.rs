//! Barrier algorithms.
pub mod dissemination;
pub mod node_aware;
pub mod tree;
