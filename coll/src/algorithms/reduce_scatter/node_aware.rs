//! Node-aware reduce-scatter(_block), for small blocks: a binomial reduce
//! of the whole vector inside every node to its leader (lowest rank), the
//! leaders pack each node's blocks together (its members' blocks in member
//! order) and swap them directly, one message per pair of nodes in one
//! round, each leader reduces the partials of its node's blocks in node
//! order, and hands every member its block. One round of inter-node
//! latency instead of log2(ranks) (recursive halving) or ranks - 1 (ring),
//! for the whole vector through each node's reduce.

use crate::algorithms::levels::Levels;
use crate::algorithms::{prefix, reduce, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let n = a.size;
    let l = Levels::new(a, false);
    let mut b = Builder::new(a.esize);
    let p = prefix(&a.counts);
    let total = p[n];
    let mine = l.mine();
    let own = a.counts[a.rank];
    let part = if l.leads() {
        (b.scratch(total), 0, total)
    } else {
        (Buf::Recv, 0, 0)
    };
    reduce::binomial::tree(&mut b, mine, l.me, 0, (a.input(), 0, total), part);
    if !l.leads() {
        b.recv(mine[0], (Buf::Recv, 0, own));
        return b.finish();
    }
    // Node h's blocks at `at[h]` of `packed`, `len[h]` long.
    let len: Vec<usize> = l
        .groups
        .iter()
        .map(|g| g.iter().map(|&x| a.counts[x]).sum())
        .collect();
    let at = prefix(&len);
    let packed = b.scratch(total);
    for (h, g) in l.groups.iter().enumerate() {
        let mut o = at[h];
        for &x in g {
            b.copy((part.0, p[x], a.counts[x]), (packed, o, a.counts[x]));
            o += a.counts[x];
        }
    }
    b.end_round();
    let me = l.node;
    let leaders = l.leaders();
    let k = leaders.len();
    let got: Vec<Option<Buf>> = (0..k)
        .map(|h| (h != me).then(|| b.scratch(len[me])))
        .collect();
    for h in 0..k {
        if let Some(g) = got[h] {
            b.send(leaders[h], (packed, at[h], len[h]));
            b.recv(leaders[h], (g, 0, len[me]));
        }
    }
    b.end_round();
    // Node order: the partials of lower nodes are left operands.
    let acc = (packed, at[me], len[me]);
    for h in (0..me).rev() {
        if let Some(g) = got[h] {
            b.reduce((g, 0, len[me]), acc, true);
        }
    }
    for g in got.iter().skip(me + 1).flatten() {
        b.reduce((*g, 0, len[me]), acc, false);
    }
    b.end_round();
    let mut o = at[me];
    for &x in mine {
        if x == a.rank {
            b.copy((packed, o, own), (Buf::Recv, 0, own));
        } else {
            b.send(x, (packed, o, a.counts[x]));
        }
        o += a.counts[x];
    }
    b.finish()
}
