//! Node-aware allreduce.
//!
//! Below one pipeline segment (`Args::seg`, the rule's `segment_bytes`,
//! 64 KiB unless tuned; latency-bound): binomial reduce inside each node
//! to its leader (lowest rank of the node), recursive-doubling allreduce
//! among the leaders, binomial broadcast inside each node. Inter-node
//! traffic is one vector exchange per leader per round, whatever the ranks
//! per node.
//!
//! From one segment (bandwidth-bound), with several ranks on every
//! node: every node cuts the vector into q slices, q the fewest ranks on
//! one node. Members beyond the first q fold their vector into member
//! `index mod q`; the first q reduce-scatter the slices among themselves
//! (member j ends with its node's sum of slice j); member j of every node
//! then allreduces slice j with member j of the other nodes (recursive
//! doubling on 1/q of the vector: q leaders per node share the network
//! phase); an allgather among the first q and a copy to the folded members
//! finish. Each slice is combined in one fixed order and then copied, so
//! every rank gets the same bits.

use crate::algorithms::allreduce::recursive_doubling;
use crate::algorithms::levels::Levels;
use crate::algorithms::{bcast, reduce, split, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let count = a.count;
    let mut b = Builder::new(a.esize);
    b.copy((a.input(), 0, count), (Buf::Recv, 0, count));
    b.end_round();
    let l = Levels::new(a, false);
    let mine = l.mine();
    let all = (Buf::Recv, 0, count);
    let q = l.min_ppn().min(count.max(1));
    if count < a.seg || q < 2 {
        reduce::binomial::tree(&mut b, mine, l.me, 0, all, all);
        if l.leads() {
            let leaders = l.leaders();
            recursive_doubling::core(&mut b, &leaders, l.node, all);
        }
        bcast::binomial::tree(&mut b, mine, l.me, 0, all);
        return b.finish();
    }
    let me = l.me;
    if me >= q {
        b.send(mine[me % q], all);
        b.end_round();
        b.recv(mine[me % q], all);
        return b.finish();
    }
    // Fold in the members beyond q (in member order).
    let folded: Vec<usize> = (me + q..mine.len()).step_by(q).collect();
    let tmps: Vec<Buf> = folded.iter().map(|_| b.scratch(count)).collect();
    for (&f, &t) in folded.iter().zip(&tmps) {
        b.recv(mine[f], (t, 0, count));
    }
    for &t in &tmps {
        b.reduce((t, 0, count), all, false);
    }
    b.end_round();
    // Reduce-scatter among the first q: member j gets slice j from all.
    let sl = split(count, q);
    let (off, len) = sl[me];
    let parts: Vec<Buf> = (0..q).map(|_| b.scratch(len)).collect();
    for (j, &(o, n)) in sl.iter().enumerate() {
        if j != me {
            b.send(mine[j], (Buf::Recv, o, n));
            b.recv(mine[j], (parts[j], 0, len));
        }
    }
    b.end_round();
    // Member order: the partials of members below me are left operands.
    for j in (0..me).rev() {
        b.reduce((parts[j], 0, len), (Buf::Recv, off, len), true);
    }
    for &p in parts.iter().skip(me + 1) {
        b.reduce((p, 0, len), (Buf::Recv, off, len), false);
    }
    b.end_round();
    let peers: Vec<usize> = l.groups.iter().map(|g| g[me]).collect();
    recursive_doubling::core(&mut b, &peers, l.node, (Buf::Recv, off, len));
    for (j, &(o, n)) in sl.iter().enumerate() {
        if j != me {
            b.send(mine[j], (Buf::Recv, off, len));
            b.recv(mine[j], (Buf::Recv, o, n));
        }
    }
    b.end_round();
    for &f in &folded {
        b.send(mine[f], all);
    }
    b.finish()
}
