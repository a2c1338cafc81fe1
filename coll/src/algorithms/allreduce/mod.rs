//! Allreduce algorithms. Every one gives bit-identical results on all
//! ranks: each element is combined in one fixed order (and then copied), or
//! both partners of an exchange compute `op(lower, higher)`.
pub mod multi_leader;
pub mod node_aware;
pub mod rabenseifner;
pub mod recursive_doubling;
pub mod ring;

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, El, Schedule};

/// A group allreduce (`core(builder, members, me, data)`) run over the
/// whole communicator on the receive buffer.
pub(crate) fn over_all(a: &Args, core: fn(&mut Builder, &[usize], usize, El)) -> Schedule {
    let mut b = Builder::new(a.esize);
    b.copy((a.input(), 0, a.count), (Buf::Recv, 0, a.count));
    b.end_round();
    let g: Vec<usize> = (0..a.size).collect();
    core(&mut b, &g, a.rank, (Buf::Recv, 0, a.count));
    b.finish()
}
