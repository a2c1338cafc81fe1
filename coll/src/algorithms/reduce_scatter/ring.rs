//! Ring reduce-scatter: n-1 rounds; in round s rank r passes its partial
//! sum of block r-1-s to r+1, so block c accumulates along the ring from
//! rank c+1 and ends, complete, at rank c.

use crate::algorithms::{prefix, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    let p = prefix(&a.counts);
    let total = p[n];
    let acc = b.scratch(total);
    b.copy((a.input(), 0, total), (acc, 0, total));
    b.end_round();
    let blocks: Vec<(usize, usize)> = (0..n).map(|i| (p[i], a.counts[i])).collect();
    ring_rs(&mut b, n, r, acc, &blocks);
    b.copy((acc, blocks[r].0, blocks[r].1), (Buf::Recv, 0, blocks[r].1));
    b.finish()
}

/// Ring reduce-scatter over `blocks` of `acc` (which holds this rank's
/// input); afterwards block `r` of `acc` holds the full reduction.
pub(crate) fn ring_rs(b: &mut Builder, n: usize, r: usize, acc: Buf, blocks: &[(usize, usize)]) {
    if n == 1 {
        return;
    }
    let maxlen = blocks.iter().map(|x| x.1).max().unwrap_or(0);
    let tmp = b.scratch(maxlen);
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    for s in 0..n - 1 {
        let sb = (r + 2 * n - 1 - s) % n;
        let rb = (r + 2 * n - 2 - s) % n;
        b.send(right, (acc, blocks[sb].0, blocks[sb].1));
        b.recv(left, (tmp, 0, blocks[rb].1));
        b.reduce(
            (tmp, 0, blocks[rb].1),
            (acc, blocks[rb].0, blocks[rb].1),
            true,
        );
        b.end_round();
    }
}
