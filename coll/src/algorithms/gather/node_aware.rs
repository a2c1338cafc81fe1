//! Node-aware gather (uniform blocks): every rank sends its block to its
//! node's leader (the root in the root's node, whose members send straight
//! into the root's receive buffer), the leaders gather whole nodes' blocks
//! up a binomial tree of nodes (a leader forwards its subtree's nodes in
//! one message), and the root puts every block in place. One message per
//! node crosses the network instead of one per rank; ceil(log2 nodes)
//! inter-node steps.

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
        b.send(mine[lead], (Buf::Send, 0, c));
        return b.finish();
    }
    let t = NodeTree::new(&l);
    let leaders = l.leaders();
    let kid = |v: usize| leaders[t.node(v)];
    if t.pos == 0 {
        // The root: its node's blocks land in place; the other nodes'
        // (relative nodes 1..k, in that order) in one scratch buffer.
        for (m, &x) in mine.iter().enumerate() {
            if m != lead {
                b.recv(x, (Buf::Recv, x * c, c));
            }
        }
        let base = t.first[1.min(t.k)];
        let tmp = b.scratch((t.first[t.k] - base) * c);
        for v in tree_children(0, t.k) {
            let (f, len) = t.span(v);
            b.recv(kid(v), (tmp, (f - base) * c, len * c));
        }
        if !a.in_place {
            b.copy((Buf::Send, 0, c), (Buf::Recv, a.rank * c, c));
        }
        b.end_round();
        for v in 1..t.k {
            for (j, &x) in l.groups[t.node(v)].iter().enumerate() {
                b.copy((tmp, (t.first[v] - base + j) * c, c), (Buf::Recv, x * c, c));
            }
        }
        return b.finish();
    }
    // A leader of another node: its members' blocks in member order, then
    // its child nodes' blocks.
    let (f0, len) = t.span(t.pos);
    let tmp = b.scratch(len * c);
    for (m, &x) in mine.iter().enumerate() {
        if m != lead {
            b.recv(x, (tmp, m * c, c));
        }
    }
    for v in tree_children(t.pos, t.k) {
        let (f, n) = t.span(v);
        b.recv(kid(v), (tmp, (f - f0) * c, n * c));
    }
    b.copy((Buf::Send, 0, c), (tmp, lead * c, c));
    b.end_round();
    if let Some(p) = tree_parent(t.pos) {
        b.send(kid(p), (tmp, 0, len * c));
    }
    b.finish()
}
