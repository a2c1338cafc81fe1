//! Node-aware broadcast. The root leads its node; other nodes are led by
//! their lowest rank.
//!
//! Below four pipeline segments (`Args::seg`, the rule's `segment_bytes`):
//! a binomial tree among the leaders, then a
//! binomial tree inside every node (every byte crosses the network once
//! per node, in ceil(log2 nodes) steps). From there the two phases are
//! pipelined: the buffer flows in `Args::seg`-element segments down a
//! chain or (many nodes) a binomial tree of leaders, and each leader passes every segment on to
//! its child leaders and down its node's binomial tree while it takes the
//! next one, so the inter- and intra-node transfers overlap.

use crate::algorithms::levels::Levels;
use crate::algorithms::{bcast, tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

/// Up to this many nodes the leaders pass segments along a chain (one
/// inter-node send per segment and leader); beyond, down a binomial tree
/// (log2 nodes deep instead of nodes deep). In the simulator's two-level
/// model, 8 nodes x 8 ranks at 1 MiB: chain 1.04 ms, tree 1.66 ms; 1,024
/// x 16: chain 56 ms, binomial without pipelining 28 ms.
const CHAIN_NODES: usize = 16;

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, true);
    let mut b = Builder::new(a.esize);
    let all = (Buf::Recv, 0, a.count);
    let mine = l.mine();
    let lead = l.lead[l.node];
    let leaders = l.leaders();
    let k = leaders.len();
    if a.count < 4 * a.seg {
        if l.leads() {
            bcast::binomial::tree(&mut b, &leaders, l.node, l.root_node, all);
        }
        bcast::binomial::tree(&mut b, mine, l.me, lead, all);
        return b.finish();
    }
    // Parent and children in the combined tree: the leaders from the
    // root's node in a chain (up to CHAIN_NODES nodes) or a binomial tree,
    // every node a binomial tree under its leader.
    let n = mine.len();
    let vr = (l.me + n - lead) % n;
    let at = |v: usize| mine[(v + lead) % n];
    let pos = (l.node + k - l.root_node) % k;
    let lat = |v: usize| leaders[(v + l.root_node) % k];
    let mut kids: Vec<usize> = Vec::new();
    let parent = if vr == 0 && k <= CHAIN_NODES {
        if pos + 1 < k {
            kids.push(lat(pos + 1));
        }
        pos.checked_sub(1).map(lat)
    } else if vr == 0 {
        kids.extend(tree_children(pos, k).into_iter().rev().map(lat));
        tree_parent(pos).map(lat)
    } else {
        tree_parent(vr).map(at)
    };
    kids.extend(tree_children(vr, n).into_iter().rev().map(at));
    let seg = a.seg.max(1);
    let nseg = a.count.div_ceil(seg);
    let part = |t: usize| (Buf::Recv, t * seg, seg.min(a.count - t * seg));
    match parent {
        None => {
            for t in 0..nseg {
                for &c in &kids {
                    b.send(c, part(t));
                }
                b.end_round();
            }
        }
        Some(p) => {
            for t in 0..=nseg {
                if t < nseg {
                    b.recv(p, part(t));
                }
                if t >= 1 {
                    for &c in &kids {
                        b.send(c, part(t - 1));
                    }
                }
                b.end_round();
            }
        }
    }
    b.finish()
}
