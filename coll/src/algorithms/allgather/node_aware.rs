//! Node-aware allgather(v): every node's blocks are gathered to its leader
//! (lowest rank) in one round, the leaders exchange whole nodes' blocks
//! Bruck-style (ceil(log2 nodes) rounds, one or two messages each: a
//! leader holding nodes i..i+d passes them to the leader d nodes back),
//! and each leader broadcasts the result down a binomial tree in its node.
//!
//! The blocks travel packed by node (`NodePacking`: in the receive buffer
//! itself where that is its layout).

use super::NodePacking;
use crate::algorithms::levels::Levels;
use crate::algorithms::{bcast, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, false);
    let mut b = Builder::new(a.esize);
    let pk = NodePacking::new(&mut b, a, &l);
    let (buf, total) = (pk.buf, pk.total());
    let pos = &pk.pos;
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
        let mut d = 1;
        while d < k {
            let m = d.min(k - d);
            for (o, len) in pk.nodes(i, m) {
                b.send(leaders[(i + k - d) % k], (buf, o, len));
            }
            for (o, len) in pk.nodes((i + d) % k, m) {
                b.recv(leaders[(i + d) % k], (buf, o, len));
            }
            b.end_round();
            d <<= 1;
        }
    }
    bcast::binomial::tree(&mut b, mine, l.me, 0, (buf, 0, total));
    pk.unpack(&mut b, a);
    b.finish()
}
