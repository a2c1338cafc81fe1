//! Node-aware alltoall (uniform blocks; for small ones): every rank hands
//! its whole send buffer to its node's leader (lowest rank), the leaders
//! swap, for every pair of nodes, one message with all blocks from one
//! node's ranks to the other's, and each leader hands every rank of its
//! node the n blocks it receives. 3 steps of latency and one message per
//! pair of nodes instead of one per pair of ranks, for L x more data
//! through each leader (L ranks per node).

use crate::algorithms::levels::Levels;
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, false);
    let (n, c) = (a.size, a.count);
    let mut b = Builder::new(a.esize);
    let mine = l.mine();
    if !l.leads() {
        b.send(mine[0], (Buf::Send, 0, n * c));
        b.end_round();
        b.recv(mine[0], (Buf::Recv, 0, n * c));
        return b.finish();
    }
    let lm = mine.len();
    // Member m's send buffer at m * n * c.
    let got = b.scratch(lm * n * c);
    for (m, &x) in mine.iter().enumerate().skip(1) {
        b.recv(x, (got, m * n * c, n * c));
    }
    b.copy((Buf::Send, 0, n * c), (got, 0, n * c));
    b.end_round();
    let k = l.groups.len();
    let me = l.node;
    // Per other node h: out[h] holds (source member m, destination d of
    // h) in that order, inb[h] (source s of h, destination member m).
    let mut outs = vec![None; k];
    let mut ins = vec![None; k];
    for (h, g) in l.groups.iter().enumerate() {
        if h == me {
            continue;
        }
        let o = b.scratch(lm * g.len() * c);
        let i = b.scratch(g.len() * lm * c);
        for m in 0..lm {
            for (j, &d) in g.iter().enumerate() {
                b.copy((got, (m * n + d) * c, c), (o, (m * g.len() + j) * c, c));
            }
        }
        outs[h] = Some(o);
        ins[h] = Some(i);
    }
    b.end_round();
    let leaders = l.leaders();
    for (h, g) in l.groups.iter().enumerate() {
        if let (Some(o), Some(i)) = (outs[h], ins[h]) {
            b.send(leaders[h], (o, 0, lm * g.len() * c));
            b.recv(leaders[h], (i, 0, g.len() * lm * c));
        }
    }
    // Every member's n blocks, by source rank (the leader's own straight
    // into its receive buffer).
    let res: Vec<Buf> = (1..lm).map(|_| b.scratch(n * c)).collect();
    let dest = |m: usize| if m == 0 { Buf::Recv } else { res[m - 1] };
    for (h, g) in l.groups.iter().enumerate() {
        for (j, &s) in g.iter().enumerate() {
            for (m, &x) in mine.iter().enumerate() {
                let src = match ins[h] {
                    Some(i) => (i, (j * lm + m) * c, c),
                    None => (got, (j * n + x) * c, c),
                };
                b.copy(src, (dest(m), s * c, c));
            }
        }
    }
    b.end_round();
    for (m, &x) in mine.iter().enumerate().skip(1) {
        b.send(x, (res[m - 1], 0, n * c));
    }
    b.finish()
}
