//! Multi-leader scan and exscan for small vectors on many nodes whose
//! ranks are consecutive (block placement: every node a range of ranks,
//! nodes in rank order).
//!
//! 1. Each node scans its members' inputs by recursive doubling inside
//!    the node (in rank order); its last member then holds the node's
//!    total and hands it to the node's q ports.
//! 2. The ports gather every node's total by the (q+1)-ary Bruck exchange
//!    of the multi-leader allreduce (`allreduce::multi_leader`), which
//!    leaves them on the node's first member.
//! 3. That member combines the totals of the nodes before its own, in
//!    node order, and passes this prefix down the node's 16-ary heap;
//!    every member puts it in front of its in-node result.
//!
//! ceil(log_{q+1} nodes) inter-node rounds instead of recursive
//! doubling's log2(nodes) (its first log2(ranks per node) steps stay in
//! the node anyway). Operands keep rank order throughout, so the operation
//! need not commute. Other placements, and more than `MAX_GATHER` bytes of
//! totals on one rank, run recursive doubling.

use crate::algorithms::allreduce::multi_leader::{gather_partials, MAX_GATHER};
use crate::algorithms::barrier::multi_leader::ports;
use crate::algorithms::levels::{heap_children, heap_parent, Levels};
use crate::algorithms::scan::recursive_doubling;
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    scan(a, false)
}

pub fn build_exscan(a: &Args) -> Schedule {
    scan(a, true)
}

fn scan(a: &Args, exclusive: bool) -> Schedule {
    let l = Levels::new(a, false);
    let k = l.groups.len();
    let count = a.count;
    if !l.in_rank_order() || k.saturating_mul(count).saturating_mul(a.esize) > MAX_GATHER {
        return if exclusive {
            recursive_doubling::build_exscan(a)
        } else {
            recursive_doubling::build(a)
        };
    }
    let mine = l.mine();
    let (c, v, x) = (mine.len(), l.me, l.node);
    let out = (Buf::Recv, 0, count);
    let mut b = Builder::new(a.esize);
    // In place, an exclusive scan overwrites the input the last member
    // still needs for its node's total.
    let input = if exclusive && a.in_place && v + 1 == c {
        let own = b.scratch(count);
        b.copy((a.input(), 0, count), (own, 0, count));
        b.end_round();
        (own, 0, count)
    } else {
        (a.input(), 0, count)
    };

    // 1. In the node, and the node's total on its last member.
    b.within(Some(mine));
    recursive_doubling::core(&mut b, c, v, input, out, exclusive);
    b.within(None);
    let total = if !exclusive || v + 1 < c {
        out
    } else if c > 1 {
        let t = b.scratch(count);
        b.copy(out, (t, 0, count));
        b.reduce(input, (t, 0, count), false);
        b.end_round();
        (t, 0, count)
    } else {
        input
    };

    // 2. Every node's total on member 0 (holder: the last member).
    let q = ports(k, l.min_ppn());
    let parts = gather_partials(&mut b, &l, q, count, c - 1, total);
    if x == 0 {
        return b.finish();
    }

    // 3. The prefix of the nodes before this one (node g in slot
    // (g - x) mod k), down the heap, in front of the in-node result.
    let prefix = b.scratch(count);
    let pre = (prefix, 0, count);
    if let Some(parts) = parts {
        let slot = |g: usize| (parts, ((g + k - x) % k) * count, count);
        b.copy(slot(0), pre);
        for g in 1..x {
            b.reduce(slot(g), pre, false);
        }
        b.end_round();
    }
    if let Some(p) = heap_parent(v) {
        b.recv(mine[p], pre);
        b.end_round();
    }
    for ch in heap_children(v, c) {
        b.send(mine[ch], pre);
    }
    if exclusive && v == 0 {
        b.copy(pre, out);
    } else {
        b.reduce(pre, out, true);
    }
    b.finish()
}
