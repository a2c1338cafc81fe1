//! Binomial-tree broadcast: log2(n) rounds, the whole buffer per message.

use crate::algorithms::{tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    let mut b = Builder::new(a.esize);
    let g: Vec<usize> = (0..a.size).collect();
    tree(&mut b, &g, a.rank, a.root, (Buf::Recv, 0, a.count));
    b.finish()
}

/// Broadcast of `data` from `g[root]` over the members `g` (this rank is
/// `g[me]`).
pub(crate) fn tree(b: &mut Builder, g: &[usize], me: usize, root: usize, data: El) {
    let n = g.len();
    let vr = (me + n - root) % n;
    let at = |v: usize| g[(v + root) % n];
    if let Some(p) = tree_parent(vr) {
        b.recv(at(p), data);
        b.end_round();
    }
    for c in tree_children(vr, n).into_iter().rev() {
        b.send(at(c), data);
    }
    b.end_round();
}
