//! Binomial-tree scatter (uniform counts): the root sends each child its
//! whole subtree's blocks in one message; log2(n) rounds.

use crate::algorithms::{subtree, tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, c) = (a.size, a.count);
    let mut b = Builder::new(a.esize);
    let vr = (a.rank + n - a.root) % n;
    let at = |v: usize| (v + a.root) % n;
    let sub = subtree(vr, n);
    let tmp = b.scratch(sub * c);
    match tree_parent(vr) {
        Some(p) => {
            b.recv(at(p), (tmp, 0, sub * c));
            b.end_round();
        }
        None => {
            for j in 0..n {
                b.copy((Buf::Send, at(j) * c, c), (tmp, j * c, c));
            }
            b.end_round();
        }
    }
    for ch in tree_children(vr, n).into_iter().rev() {
        b.send(at(ch), (tmp, (ch - vr) * c, subtree(ch, n) * c));
    }
    if !(vr == 0 && a.in_place) {
        b.copy((tmp, 0, c), (Buf::Recv, 0, c));
    }
    b.finish()
}
