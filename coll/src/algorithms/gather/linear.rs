//! Linear gather(v): every rank sends its block straight to the root, which
//! posts all receives at once.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    if r != a.root {
        b.send(a.root, (Buf::Send, 0, a.count));
        return b.finish();
    }
    for i in 0..n {
        if i != r {
            b.recv(i, (Buf::Recv, a.displs[i], a.counts[i]));
        }
    }
    if !a.in_place {
        b.copy((Buf::Send, 0, a.count), (Buf::Recv, a.displs[r], a.count));
    }
    b.finish()
}
