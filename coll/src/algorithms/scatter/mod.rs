//! Scatter algorithms (linear also serves scatterv).
pub mod binomial;
pub mod linear;
pub mod node_aware;
