//! Reduce-scatter algorithms (also used for reduce_scatter_block).
pub mod node_aware;
pub mod recursive_halving;
pub mod ring;
