//! Binomial-tree reduce: each rank receives its children's partial results
//! (all at once), combines them in rank order and sends the result to its
//! parent; log2(n) rounds, the whole vector per message.

use crate::algorithms::{tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    let mut b = Builder::new(a.esize);
    let g: Vec<usize> = (0..a.size).collect();
    tree(
        &mut b,
        &g,
        a.rank,
        a.root,
        (a.input(), 0, a.count),
        (Buf::Recv, 0, a.count),
    );
    b.finish()
}

/// Reduce of `inp` over the members `g` to `g[root]`, whose result goes to
/// `out` (only used there). Relative to the root, a rank's partial result
/// covers a contiguous range of members, the lower one as left operand.
pub(crate) fn tree(b: &mut Builder, g: &[usize], me: usize, root: usize, inp: El, out: El) {
    let n = g.len();
    let count = inp.2;
    let vr = (me + n - root) % n;
    let at = |v: usize| g[(v + root) % n];
    let acc = if vr == 0 {
        out
    } else {
        (b.scratch(count), 0, count)
    };
    b.copy(inp, acc);
    b.end_round();
    let kids = tree_children(vr, n);
    let tmps: Vec<El> = kids.iter().map(|_| (b.scratch(count), 0, count)).collect();
    for (c, t) in kids.iter().zip(&tmps) {
        b.recv(at(*c), *t);
    }
    for t in &tmps {
        b.reduce(*t, acc, false);
    }
    b.end_round();
    if let Some(p) = tree_parent(vr) {
        b.send(at(p), acc);
        b.end_round();
    }
}
