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
//! then allreduces slice j with member j of the other nodes (on 1/q of
//! the vector, so q leaders per node share the network phase; recursive
//! doubling, or Rabenseifner's halving and doubling for slices from
//! `HALVING_SLICE` on more than 2 nodes); an allgather among the first q
//! and a copy to the folded members finish. Each slice is combined in one
//! fixed order and then copied, so every rank gets the same bits.

use crate::algorithms::allreduce::{rabenseifner, recursive_doubling};
use crate::algorithms::levels::Levels;
use crate::algorithms::{bcast, reduce, split, Args};
use crate::schedule::{Buf, Builder, Schedule};

/// Smallest slice (bytes) that the nodes reduce by halving and doubling
/// (2x the slice per port in 2 log2(nodes) rounds) rather than by
/// recursive doubling (log2(nodes) x the slice): past 2 nodes, where the
/// extra rounds' latency is paid back.
const HALVING_SLICE: usize = 8 << 10;

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
    let slice = (Buf::Recv, off, len);
    if peers.len() > 2 && len * a.esize >= HALVING_SLICE {
        rabenseifner::core(&mut b, &peers, l.node, slice);
    } else {
        recursive_doubling::core(&mut b, &peers, l.node, slice);
    }
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
