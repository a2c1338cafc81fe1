//! Binomial-tree gather (uniform counts): a rank collects its subtree's
//! blocks (contiguous in root-relative order) and forwards them in one
//! message; the root rotates them into place. log2(n) rounds.

use crate::algorithms::{subtree, tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, c) = (a.size, a.count);
    let mut b = Builder::new(a.esize);
    let vr = (a.rank + n - a.root) % n;
    let at = |v: usize| (v + a.root) % n;
    let sub = subtree(vr, n);
    let tmp = b.scratch(sub * c);
    let own = if vr == 0 && a.in_place {
        (Buf::Recv, a.rank * c, c)
    } else {
        (Buf::Send, 0, c)
    };
    b.copy(own, (tmp, 0, c));
    b.end_round();
    for ch in tree_children(vr, n) {
        b.recv(at(ch), (tmp, (ch - vr) * c, subtree(ch, n) * c));
    }
    b.end_round();
    if let Some(p) = tree_parent(vr) {
        b.send(at(p), (tmp, 0, sub * c));
        b.end_round();
    } else {
        for j in 0..n {
            b.copy((tmp, j * c, c), (Buf::Recv, at(j) * c, c));
        }
    }
    b.finish()
}
