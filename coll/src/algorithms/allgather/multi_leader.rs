//! Multi-leader allgather(v): every rank of a node drives the network.
//!
//! The blocks are kept packed by node (`NodePacking`), so a node's blocks
//! (its node block) are one range and a run of consecutive nodes is at
//! most two (it may wrap).
//!
//! 1. The ranks of each node gather their node block by a Bruck exchange
//!    inside the node (ceil(log2 ranks) rounds, every rank sending), so
//!    no rank carries the node alone.
//! 2. The nodes exchange node blocks by a (q+1)-ary Bruck allgather with
//!    q = the fewest ranks on a node, every rank a port: when the nodes
//!    x..x+D-1 are on every rank of node x, the up to qD that come next
//!    are cut into q near-equal runs, and port j fetches its run from the
//!    node where it starts (which holds it, as runs are at most D long).
//!    After each such round the ports share their runs by a Bruck exchange
//!    inside the node. That is ceil(log_{q+1} nodes) inter-node rounds
//!    (one with as many ranks per node as nodes), each port sending about
//!    nodes/q node blocks in all, where the node-aware form has one leader
//!    send every block of log2(nodes) rounds and then feed its whole node.
//!
//! Ranks beyond the first q of a larger node take part in the exchanges
//! inside their node with nothing of their own to add.

use super::NodePacking;
use crate::algorithms::levels::Levels;
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, false);
    let k = l.groups.len();
    let mut b = Builder::new(a.esize);
    let pk = NodePacking::new(&mut b, a, &l);
    let (buf, pos) = (pk.buf, &pk.pos);

    let r = a.rank;
    let input = if a.in_place {
        (Buf::Recv, a.displs[r], a.counts[r])
    } else {
        (Buf::Send, 0, a.counts[r])
    };
    if !(a.in_place && pk.packed) {
        b.copy(input, (buf, pos[r], a.counts[r]));
        b.end_round();
    }
    let mine = l.mine();
    let me = l.me;

    // 1. The node block.
    let own: Vec<Vec<(usize, usize)>> = mine.iter().map(|&x| vec![(pos[x], a.counts[x])]).collect();
    share(&mut b, buf, mine, me, &own);

    // 2. Among the nodes.
    let q = l.min_ppn();
    let x = l.node;
    let mut d = 1usize;
    while d < k {
        let want = k.min(d.saturating_mul(q + 1)) - d;
        // Port j's run: nodes d + start(j) .. d + start(j + 1) from here
        // (empty ranges, of no nodes or of nodes without data, never
        // travel).
        let start = |j: usize| j * want / q;
        let runs: Vec<Vec<(usize, usize)>> = (0..mine.len())
            .map(|j| {
                if j < q {
                    pk.nodes((x + d + start(j)) % k, start(j + 1) - start(j))
                } else {
                    Vec::new()
                }
            })
            .collect();
        if me < q {
            let len = start(me + 1) - start(me);
            let off = d + start(me);
            let nonempty = |v: Vec<(usize, usize)>| v.into_iter().filter(|&(_, m)| m > 0);
            for (o, m) in nonempty(pk.nodes(x, len)) {
                b.send(l.groups[(x + k - off) % k][me], (buf, o, m));
            }
            for (o, m) in nonempty(pk.nodes((x + off) % k, len)) {
                b.recv(l.groups[(x + off) % k][me], (buf, o, m));
            }
            b.end_round();
        }
        share(&mut b, buf, mine, me, &runs);
        d = d.saturating_mul(q + 1);
    }

    pk.unpack(&mut b, a);
    b.finish()
}

/// Bruck allgather inside the node `mine` (this rank is member `me`) of
/// pieces of `buf`: member i holds `pieces[i]` (element ranges, perhaps
/// none) and ends with all of them. In the round of distance s a member
/// passes the pieces i..i+s to member i-s.
fn share(b: &mut Builder, buf: Buf, mine: &[usize], me: usize, pieces: &[Vec<(usize, usize)>]) {
    let c = mine.len();
    // The ranges of members from..from+cnt (mod c), adjacent ones merged.
    let run = |from: usize, cnt: usize| {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for i in from..from + cnt {
            for &(o, m) in &pieces[i % c] {
                if m == 0 {
                    continue;
                }
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == o => last.1 += m,
                    _ => out.push((o, m)),
                }
            }
        }
        out
    };
    let mut s = 1;
    while s < c {
        let cnt = s.min(c - s);
        for (o, m) in run(me, cnt) {
            b.send(mine[(me + c - s) % c], (buf, o, m));
        }
        for (o, m) in run(me + s, cnt) {
            b.recv(mine[(me + s) % c], (buf, o, m));
        }
        b.end_round();
        s <<= 1;
    }
}
