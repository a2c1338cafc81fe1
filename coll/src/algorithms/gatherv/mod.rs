//! Gatherv algorithms of their own (linear gather serves gatherv too).
pub mod node_aware;
