//! Allgather(v) algorithms. Block i (`counts[i]` elements) lands at
//! `displs[i]` of the receive buffer.
pub mod bruck;
pub mod multi_leader;
pub mod node_aware;
pub mod recursive_doubling;
pub mod ring;

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder};

/// Copies this rank's block into place (unless in place).
pub(crate) fn own_block(b: &mut Builder, a: &Args) {
    if !a.in_place {
        let r = a.rank;
        b.copy(
            (Buf::Send, 0, a.counts[r]),
            (Buf::Recv, a.displs[r], a.counts[r]),
        );
        b.end_round();
    }
}

/// Element ranges of the blocks `ids` (ascending), merged where adjacent
/// when the layout is canonical (the same on every rank).
pub(crate) fn ranges(a: &Args, ids: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for i in ids {
        let (off, len) = (a.displs[i], a.counts[i]);
        if a.canonical {
            if let Some(last) = out.last_mut() {
                if last.0 + last.1 == off {
                    last.1 += len;
                    continue;
                }
            }
        }
        out.push((off, len));
    }
    out
}
