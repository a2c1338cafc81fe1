//! Node-aware scatter (uniform blocks), the mirror of the node-aware
//! gather: the root packs the other nodes' blocks in node order and sends
//! each child leader its subtree's nodes in one message down a binomial
//! tree of nodes; every leader passes its children theirs and hands each
//! member of its node its block (the root's node straight from the send
//! buffer). One message per node crosses the network instead of one per
//! rank.

use crate::algorithms::levels::{Levels, NodeTree};
use crate::algorithms::{tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, true);
    let c = a.count;
    let mut b = Builder::new(a.esize);
    let mine = l.mine();
    let lead = l.lead[l.node];
    if !l.leads() {
        b.recv(mine[lead], (Buf::Recv, 0, c));
        return b.finish();
    }
    let t = NodeTree::new(&l);
    let leaders = l.leaders();
    let kid = |v: usize| leaders[t.node(v)];
    // Children farthest first: their subtrees are the largest and the
    // deepest.
    let kids: Vec<usize> = tree_children(t.pos, t.k).into_iter().rev().collect();
    if t.pos == 0 {
        let base = t.first[1.min(t.k)];
        let tmp = b.scratch((t.first[t.k] - base) * c);
        for v in 1..t.k {
            for (j, &x) in l.groups[t.node(v)].iter().enumerate() {
                b.copy((Buf::Send, x * c, c), (tmp, (t.first[v] - base + j) * c, c));
            }
        }
        b.end_round();
        for &v in &kids {
            let (f, len) = t.span(v);
            b.send(kid(v), (tmp, (f - base) * c, len * c));
        }
        for (m, &x) in mine.iter().enumerate() {
            if m != lead {
                b.send(x, (Buf::Send, x * c, c));
            }
        }
        if !a.in_place {
            b.copy((Buf::Send, a.rank * c, c), (Buf::Recv, 0, c));
        }
        return b.finish();
    }
    let (f0, len) = t.span(t.pos);
    let tmp = b.scratch(len * c);
    if let Some(p) = tree_parent(t.pos) {
        b.recv(kid(p), (tmp, 0, len * c));
        b.end_round();
    }
    for &v in &kids {
        let (f, n) = t.span(v);
        b.send(kid(v), (tmp, (f - f0) * c, n * c));
    }
    for (m, &x) in mine.iter().enumerate() {
        if m != lead {
            b.send(x, (tmp, m * c, c));
        }
    }
    b.copy((tmp, lead * c, c), (Buf::Recv, 0, c));
    b.finish()
}
