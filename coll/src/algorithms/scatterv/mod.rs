//! Scatterv algorithms of their own (linear scatter serves scatterv too).
pub mod node_aware;
