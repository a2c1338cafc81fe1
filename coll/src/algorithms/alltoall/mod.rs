//! Alltoall(v) algorithms. The block for rank i is `counts[i]` elements at
//! `displs[i]` of the send buffer; the block from rank i lands at
//! `rdispls[i]` (`rcounts[i]` elements) of the receive buffer.
pub mod bruck;
pub mod linear;
pub mod node_aware;
pub mod pairwise;

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder};

/// The local copy of this rank's own block, as a step of the current
/// round: put in the first exchange round it touches none of that round's
/// messages, so the runner does it while they move (a round of its own
/// would serialize it before them).
pub(crate) fn self_copy(b: &mut Builder, a: &Args) {
    let r = a.rank;
    b.copy(
        (Buf::Send, a.displs[r], a.counts[r]),
        (Buf::Recv, a.rdispls[r], a.rcounts[r]),
    );
}
