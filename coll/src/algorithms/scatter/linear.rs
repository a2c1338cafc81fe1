//! Linear scatter(v): the root sends every block straight to its rank.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    if r != a.root {
        b.recv(a.root, (Buf::Recv, 0, a.count));
        return b.finish();
    }
    for i in 0..n {
        if i != r {
            b.send(i, (Buf::Send, a.displs[i], a.counts[i]));
        }
    }
    if !a.in_place {
        b.copy(
            (Buf::Send, a.displs[r], a.counts[r]),
            (Buf::Recv, 0, a.counts[r]),
        );
    }
    b.finish()
}
