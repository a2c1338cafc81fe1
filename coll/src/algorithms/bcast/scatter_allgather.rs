//! Scatter + ring allgather broadcast (van de Geijn): the root scatters n
//! blocks down a binomial tree, then a ring allgather completes every
//! rank's copy. Good for large buffers: every link carries ~2x the data.

use crate::algorithms::{split, subtree, tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let n = a.size;
    let mut b = Builder::new(a.esize);
    if n == 1 {
        return b.finish();
    }
    let blocks = split(a.count, n);
    let vr = (a.rank + n - a.root) % n;
    let at = |v: usize| (v + a.root) % n;
    // Elements of relative blocks [lo, lo + k).
    let range = |lo: usize, k: usize| {
        let start = blocks[lo].0;
        let end = blocks[lo + k - 1].0 + blocks[lo + k - 1].1;
        (Buf::Recv, start, end - start)
    };
    if let Some(p) = tree_parent(vr) {
        b.recv(at(p), range(vr, subtree(vr, n)));
        b.end_round();
    }
    for c in tree_children(vr, n).into_iter().rev() {
        b.send(at(c), range(c, subtree(c, n)));
    }
    b.end_round();
    let right = at((vr + 1) % n);
    let left = at((vr + n - 1) % n);
    for s in 0..n - 1 {
        let sb = (vr + n - s) % n;
        let rb = (vr + 2 * n - s - 1) % n;
        b.send(right, (Buf::Recv, blocks[sb].0, blocks[sb].1));
        b.recv(left, (Buf::Recv, blocks[rb].0, blocks[rb].1));
        b.end_round();
    }
    b.finish()
}
