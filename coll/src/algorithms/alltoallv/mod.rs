//! Alltoallv algorithms of their own (pairwise and linear alltoall serve
//! alltoallv too).
pub mod node_aware;
