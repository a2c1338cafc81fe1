//! Tree barrier: binomial fan-in to rank 0, then binomial fan-out.

use crate::algorithms::{tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(1);
    let z = (Buf::Recv, 0, 0);
    let kids = tree_children(r, n);
    for &c in &kids {
        b.recv(c, z);
    }
    b.end_round();
    if let Some(p) = tree_parent(r) {
        b.send(p, z);
        b.end_round();
        b.recv(p, z);
        b.end_round();
    }
    for &c in kids.iter().rev() {
        b.send(c, z);
    }
    b.finish()
}
