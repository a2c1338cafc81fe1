//! Gather algorithms (linear also serves gatherv).
pub mod binomial;
pub mod linear;
pub mod node_aware;
