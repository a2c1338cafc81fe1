//! Multi-leader allreduce for small vectors on many nodes.
//!
//! 1. Inside every node the ranks reduce up a 16-ary heap to the
//!    node's lowest rank, which hands the node's sum (its partial) to the
//!    node's first q ranks, its ports.
//! 2. The nodes exchange their partials by a (q+1)-ary Bruck allgather
//!    driven by the ports: in the round of stride D (1, q+1, ...) port j
//!    of node p receives the D partials that node p + (j+1)D holds (fewer
//!    in the last round, so each partial arrives once) and sends its own D
//!    to node p - (j+1)D; the ports then share what they received. That
//!    is ceil(log_{q+1} nodes) inter-node rounds, against recursive
//!    doubling's ceil(log2 ranks) hops.
//! 3. The lowest rank combines the partials in node order and passes the
//!    result down the heap.
//!
//! Every node combines the same partials in the same order, so every rank
//! gets the same bits. The ranks of a node are reduced in heap order, so
//! the operation must be commutative (`in_rank_order` substitutes
//! recursive doubling otherwise). Partials travel whole, so a port holds
//! nodes x count elements: above `MAX_GATHER` bytes the node-aware
//! schedule runs instead. q is `barrier::multi_leader::ports`; with one
//! rank per node this is a Bruck allgather of the inputs and a local
//! reduction.

use crate::algorithms::allreduce::node_aware;
use crate::algorithms::barrier::multi_leader::ports;
use crate::algorithms::levels::{heap_children, heap_parent, Levels};
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, El, Schedule};

/// Most bytes of partials a port gathers (nodes x vector) in
/// [`gather_partials`].
pub(crate) const MAX_GATHER: usize = 1 << 20;

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, false);
    let k = l.groups.len();
    let count = a.count;
    if k.saturating_mul(count).saturating_mul(a.esize) > MAX_GATHER {
        return node_aware::build(a);
    }
    let mine = l.mine();
    let n = mine.len();
    let v = l.me;
    let q = ports(k, l.min_ppn());
    let all = (Buf::Recv, 0, count);
    let mut b = Builder::new(a.esize);
    b.copy((a.input(), 0, count), all);
    b.end_round();

    // 1. Up the heap (a round's local steps run after its messages).
    let kids = heap_children(v, n);
    let parent = heap_parent(v);
    if !kids.is_empty() {
        let tmps: Vec<Buf> = kids.clone().map(|_| b.scratch(count)).collect();
        for (c, &t) in kids.clone().zip(&tmps) {
            b.recv(mine[c], (t, 0, count));
        }
        for &t in &tmps {
            b.reduce((t, 0, count), all, false);
        }
        b.end_round();
    }
    if let Some(p) = parent {
        b.send(mine[p], all);
        b.end_round();
    }

    // 2. Among the nodes, through the ports; 3. combine in node order
    // (node g sits in slot (g - node) mod k).
    if let Some(parts) = gather_partials(&mut b, &l, q, count, 0, all) {
        let slot = |g: usize| (parts, ((g + k - l.node) % k) * count, count);
        b.copy(slot(0), all);
        for g in 1..k {
            b.reduce(slot(g), all, false);
        }
        b.end_round();
    }

    // Down the heap.
    if let Some(p) = parent {
        b.recv(mine[p], all);
        b.end_round();
    }
    for c in kids {
        b.send(mine[c], all);
    }
    b.end_round();
    b.finish()
}

/// The ports' (q+1)-ary Bruck allgather of one partial per node (`count`
/// elements of `src` on member `holder` of every node, which first hands
/// it to the node's q ports). Returns, on member 0 of every node, the
/// scratch buffer whose slot i holds the partial of node (node + i) mod k.
pub(crate) fn gather_partials(
    b: &mut Builder,
    l: &Levels,
    q: usize,
    count: usize,
    holder: usize,
    src: El,
) -> Option<Buf> {
    let k = l.groups.len();
    let mine = l.mine();
    let v = l.me;
    if v == holder {
        for &port in mine.iter().take(q).filter(|&&p| p != mine[holder]) {
            b.send(port, src);
        }
    }
    if v >= q {
        b.end_round();
        return None;
    }
    let parts = b.scratch(k * count);
    let slots = |first: usize, num: usize| (parts, first * count, num * count);
    if v == holder {
        b.copy(src, slots(0, 1));
    } else {
        b.recv(mine[holder], slots(0, 1));
    }
    b.end_round();
    // The chunk port j receives in the round of stride d: (offset, len).
    let chunk = |j: usize, d: usize| {
        let o = (j + 1).saturating_mul(d);
        (o < k).then(|| (o, d.min(k - o)))
    };
    let mut d = 1usize;
    while d < k {
        let last = d.saturating_mul(q + 1) >= k;
        if let Some((o, len)) = chunk(v, d) {
            b.send(l.groups[(l.node + k - o) % k][v], slots(0, len));
            b.recv(l.groups[(l.node + o) % k][v], slots(o, len));
        }
        b.end_round();
        // Share the chunks: among all ports between rounds, to member 0
        // after the last.
        let own = chunk(v, d).map(|(o, len)| slots(o, len));
        let from = |i: usize| chunk(i, d).map(|(o, len)| slots(o, len));
        if !last {
            for i in (0..q).filter(|&i| i != v) {
                if let Some(s) = own {
                    b.send(mine[i], s);
                }
                if let Some(s) = from(i) {
                    b.recv(mine[i], s);
                }
            }
        } else if v == 0 {
            for (i, &port) in mine.iter().enumerate().take(q).skip(1) {
                if let Some(s) = from(i) {
                    b.recv(port, s);
                }
            }
        } else if let Some(s) = own {
            b.send(mine[0], s);
        }
        b.end_round();
        d = d.saturating_mul(q + 1);
    }
    (v == 0).then_some(parts)
}
