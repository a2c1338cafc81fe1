//! Multi-leader broadcast for small data on many nodes: a (q+1)-ary tree
//! among nodes driven by the first q ranks of every node (its "ports", as
//! in the multi-leader barrier), with wide, shallow trees inside nodes.
//!
//! Nodes are numbered from the root's node. In the round of stride D
//! (1, q+1, (q+1)^2, ...), every node p < D that has the data sends it
//! from port j to node p + (j+1)D, so ceil(log_{q+1} nodes) inter-node
//! hops reach every node instead of the binomial tree's ceil(log2 nodes).
//! Inside a node the ranks, counted from the one that receives (the root,
//! or the node's lowest rank), form a 16-ary heap (`levels::heap_children`):
//! the receiver hands the data to every port and up to 16-q others at
//! once, and each port sends to its child nodes before its children in the
//! node. Two in-node hops cover 256 ranks; a binomial tree needs log2 of the
//! node's size, each hop costing what a small message costs anyway.
//!
//! q is `barrier::multi_leader::ports`: the fewest ports (at most 16 and
//! at most the fewest ranks on a node) that need the fewest inter-node
//! rounds. With one rank per node this is the binomial tree over nodes.
//! Every pair of ranks exchanges at most one message.

use crate::algorithms::barrier::multi_leader::ports;
use crate::algorithms::levels::{heap_children, heap_parent, Levels};
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, true);
    let mine = l.mine();
    let k = l.groups.len();
    let n = mine.len();
    let q = ports(k, l.min_ppn());
    let lead = l.lead[l.node];
    // This rank's place in its node, counted from the receiving rank.
    let v = (l.me + n - lead) % n;
    let at = |w: usize| mine[(w + lead) % n];
    // Relative node number, and the node that relative number names.
    let pos = (l.node + k - l.root_node) % k;
    let node_at = |p: usize| {
        let g = (p + l.root_node) % k;
        l.groups[g][l.lead[g]]
    };
    let all = (Buf::Recv, 0, a.count);
    let mut b = Builder::new(a.esize);
    if let Some(p) = heap_parent(v) {
        b.recv(at(p), all);
        b.end_round();
    } else if pos > 0 {
        // Received in the round of the largest stride D <= pos, from port
        // pos / D - 1 of node pos mod D.
        let mut d: usize = 1;
        while d.saturating_mul(q + 1) <= pos {
            d *= q + 1;
        }
        let g = (pos % d + l.root_node) % k;
        let from = pos / d - 1;
        let parent = l.groups[g][(l.lead[g] + from) % l.groups[g].len()];
        b.recv(parent, all);
        b.end_round();
    }
    if v < q {
        // Strides after the one this node received in, smallest first:
        // the earliest child heads the largest subtree.
        let mut d: usize = 1;
        while d <= pos {
            d = d.saturating_mul(q + 1);
        }
        while d < k {
            let c = pos + (v + 1) * d;
            if c < k {
                b.send(node_at(c), all);
            }
            d = d.saturating_mul(q + 1);
        }
    }
    for c in heap_children(v, n) {
        b.send(at(c), all);
    }
    b.end_round();
    b.finish()
}
