//! Barrier algorithms.
pub mod dissemination;
pub mod multi_leader;
pub mod node_aware;
pub mod tree;
