//! Node-aware allgather(v): every node's blocks are gathered to its leader
//! (lowest rank) in one round, the leaders exchange whole nodes' blocks
//! Bruck-style (ceil(log2 nodes) rounds, one or two messages each: a
//! leader holding nodes i..i+d passes them to the leader d nodes back),
//! and each leader broadcasts the result down a binomial tree in its node.
//!
//! The blocks travel packed, nodes after each other and each node's ranks
//! in rank order. Where that is the receive buffer's own layout (uniform
//! counts, each node's ranks consecutive) they travel in place; otherwise
//! through a scratch buffer, unpacked into `displs` at the end (the gaps
//! of a v-layout are never written).

use crate::algorithms::levels::Levels;
use crate::algorithms::{bcast, prefix, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, false);
    let n = a.size;
    let mut b = Builder::new(a.esize);
    let order: Vec<usize> = l.groups.iter().flatten().copied().collect();
    let in_order = order.iter().enumerate().all(|(i, &x)| i == x);
    let sizes: Vec<usize> = order.iter().map(|&x| a.counts[x]).collect();
    let pp = prefix(&sizes);
    let total = pp[n];
    let packed = a.canonical && in_order;
    let buf = if packed { Buf::Recv } else { b.scratch(total) };
    let mut pos = vec![0; n];
    for (i, &x) in order.iter().enumerate() {
        pos[x] = if packed { a.displs[x] } else { pp[i] };
    }
    // Start of every node's blocks in the packed order.
    let mut node_start = Vec::with_capacity(l.groups.len() + 1);
    let mut at = 0;
    node_start.push(0);
    for g in &l.groups {
        at += g.len();
        node_start.push(pp[at]);
    }
    let r = a.rank;
    let own = (Buf::Recv, a.displs[r], a.counts[r]);
    let input = if a.in_place {
        own
    } else {
        (Buf::Send, 0, a.counts[r])
    };
    let mine = l.mine();
    if !l.leads() {
        b.send(mine[0], input);
        b.end_round();
    } else {
        for &x in &mine[1..] {
            b.recv(x, (buf, pos[x], a.counts[x]));
        }
        b.copy(input, (buf, pos[r], a.counts[r]));
        b.end_round();
        let leaders = l.leaders();
        let k = leaders.len();
        let i = l.node;
        // Nodes [from, from + m) (mod k) as at most two ranges.
        let span = |from: usize, m: usize| {
            let end = from + m;
            if end <= k {
                vec![(node_start[from], node_start[end] - node_start[from])]
            } else {
                vec![
                    (node_start[from], node_start[k] - node_start[from]),
                    (0, node_start[end - k]),
                ]
            }
        };
        let mut d = 1;
        while d < k {
            let m = d.min(k - d);
            for (o, len) in span(i, m) {
                b.send(leaders[(i + k - d) % k], (buf, o, len));
            }
            for (o, len) in span((i + d) % k, m) {
                b.recv(leaders[(i + d) % k], (buf, o, len));
            }
            b.end_round();
            d <<= 1;
        }
    }
    bcast::binomial::tree(&mut b, mine, l.me, 0, (buf, 0, total));
    if !packed {
        for (x, &p) in pos.iter().enumerate() {
            b.copy((buf, p, a.counts[x]), (Buf::Recv, a.displs[x], a.counts[x]));
        }
    }
    b.finish()
}
