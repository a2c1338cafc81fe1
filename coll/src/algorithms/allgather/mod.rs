//! Allgather(v) algorithms. Block i (`counts[i]` elements) lands at
//! `displs[i]` of the receive buffer.
pub mod bruck;
pub mod multi_leader;
pub mod node_aware;
pub mod recursive_doubling;
pub mod ring;

use crate::algorithms::levels::Levels;
use crate::algorithms::{prefix, Args};
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

/// The blocks of the two-level allgathers packed by node: nodes after
/// each other, each node's ranks in rank order. Where that is the receive
/// buffer's own layout (uniform counts, each node's ranks consecutive) the
/// blocks stay in place; otherwise they go through a scratch buffer,
/// unpacked into `displs` at the end (the gaps of a v-layout are never
/// written).
pub(crate) struct NodePacking {
    pub buf: Buf,
    /// Where rank x's block sits in `buf`.
    pub pos: Vec<usize>,
    /// Start of every node's blocks in `buf` (nodes + 1 entries).
    pub node_start: Vec<usize>,
    /// Whether `buf` is the receive buffer itself.
    pub packed: bool,
}

impl NodePacking {
    pub fn new(b: &mut Builder, a: &Args, l: &Levels) -> NodePacking {
        let order: Vec<usize> = l.groups.iter().flatten().copied().collect();
        let sizes: Vec<usize> = order.iter().map(|&x| a.counts[x]).collect();
        let pp = prefix(&sizes);
        let packed = a.canonical && l.in_rank_order();
        let buf = if packed {
            Buf::Recv
        } else {
            b.scratch(pp[a.size])
        };
        let mut pos = vec![0; a.size];
        for (i, &x) in order.iter().enumerate() {
            pos[x] = if packed { a.displs[x] } else { pp[i] };
        }
        let mut node_start = Vec::with_capacity(l.groups.len() + 1);
        let mut at = 0;
        node_start.push(0);
        for g in &l.groups {
            at += g.len();
            node_start.push(pp[at]);
        }
        NodePacking {
            buf,
            pos,
            node_start,
            packed,
        }
    }

    /// Element ranges (offset, length) of the blocks of the `m` nodes
    /// from `from` on, mod the number of nodes: one range, or two where
    /// they wrap.
    pub fn nodes(&self, from: usize, m: usize) -> Vec<(usize, usize)> {
        let ns = &self.node_start;
        let k = ns.len() - 1;
        let end = from + m;
        if end <= k {
            vec![(ns[from], ns[end] - ns[from])]
        } else {
            vec![(ns[from], ns[k] - ns[from]), (0, ns[end - k])]
        }
    }

    /// Elements of all blocks.
    pub fn total(&self) -> usize {
        self.node_start.last().copied().unwrap_or(0)
    }

    /// Copies every block to its place in the receive buffer (if packed
    /// elsewhere).
    pub fn unpack(&self, b: &mut Builder, a: &Args) {
        if !self.packed {
            for (x, &p) in self.pos.iter().enumerate() {
                b.copy(
                    (self.buf, p, a.counts[x]),
                    (Buf::Recv, a.displs[x], a.counts[x]),
                );
            }
        }
    }
}
