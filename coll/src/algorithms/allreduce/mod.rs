//! Allreduce algorithms. Every one gives bit-identical results on all
//! ranks: each element is combined in one fixed order (and then copied), or
//! both partners of an exchange compute `op(lower, higher)`.
pub mod multi_leader;
pub mod node_aware;
pub mod rabenseifner;
pub mod recursive_doubling;
pub mod ring;
