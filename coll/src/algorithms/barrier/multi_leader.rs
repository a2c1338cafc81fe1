//! Multi-leader barrier: a binomial fan-in inside each node to its first
//! rank, then a (q+1)-ary dissemination among nodes driven by the first q
//! ranks of every node (its "ports"), then a binomial fan-out inside each
//! node. In each inter-node round at distance d, port j signals port j of
//! the node (j+1)d ahead and waits for the one (j+1)d behind, so a round
//! covers q+1 times as many nodes as the last: ceil(log_{q+1} nodes)
//! inter-node rounds instead of dissemination's ceil(log2 nodes). Between
//! rounds the ports meet at port 0 (binomial fan-in and fan-out over the
//! ports), so what one port learned goes out through all of them in the
//! next round. q is the smallest number of ports (at most 16 and at most
//! the fewest ranks on a node) that needs the fewest rounds: the in-node
//! meeting costs 2 log2 q intra-node hops per round, far less than an
//! inter-node latency. With one rank per node it is the dissemination
//! barrier; on one node the tree barrier.

use crate::algorithms::levels::Levels;
use crate::algorithms::{tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

/// Most ports per node.
const MAX_PORTS: usize = 16;

/// Inter-node rounds of a (q+1)-ary dissemination over `k` nodes.
fn rounds(k: usize, q: usize) -> usize {
    let (mut r, mut covered) = (0, 1usize);
    while covered < k {
        covered = covered.saturating_mul(q + 1);
        r += 1;
    }
    r
}

/// Ports per node for `k` nodes whose smallest holds `min_ppn` ranks.
pub(crate) fn ports(k: usize, min_ppn: usize) -> usize {
    let most = min_ppn.clamp(1, MAX_PORTS);
    let fewest = rounds(k, most);
    (1..=most).find(|&q| rounds(k, q) == fewest).unwrap_or(most)
}

pub fn build(a: &Args) -> Schedule {
    with_ports(a, ports)
}

/// The schedule with `ports(nodes, fewest ranks on a node)` ports per
/// node; one port is the node-aware barrier (`node_aware.rs`).
pub(crate) fn with_ports(a: &Args, ports: fn(usize, usize) -> usize) -> Schedule {
    let l = Levels::new(a, false);
    let mine = l.mine();
    let (k, me) = (l.groups.len(), l.me);
    let q = ports(k, l.min_ppn());
    let mut b = Builder::new(1);
    let z = (Buf::Recv, 0, 0);
    let kids = tree_children(me, mine.len());
    for &c in &kids {
        b.recv(mine[c], z);
    }
    b.end_round();
    let parent = tree_parent(me);
    if let Some(p) = parent {
        b.send(mine[p], z);
        b.end_round();
    }
    if me < q {
        // The ports' tree is the node tree cut to its first q ranks (a
        // binomial tree's prefixes are subtrees), so port messages to and
        // from a parent follow the fan-in's in the same order per pair.
        let port_kids = tree_children(me, q);
        let mut d = 1;
        while d < k {
            if let Some(p) = parent {
                b.recv(mine[p], z);
                b.end_round();
            }
            for &c in &port_kids {
                b.send(mine[c], z);
            }
            let s = (me + 1) * d;
            if s < k {
                b.send(l.groups[(l.node + s) % k][me], z);
                b.recv(l.groups[(l.node + k - s) % k][me], z);
            }
            b.end_round();
            for &c in &port_kids {
                b.recv(mine[c], z);
            }
            b.end_round();
            if let Some(p) = parent {
                b.send(mine[p], z);
                b.end_round();
            }
            d = d.saturating_mul(q + 1);
        }
    }
    if let Some(p) = parent {
        b.recv(mine[p], z);
        b.end_round();
    }
    for &c in kids.iter().rev() {
        b.send(mine[c], z);
    }
    b.finish()
}
