//! Ring allgather(v): n-1 rounds, each passing one block to the right.

use super::own_block;
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    own_block(&mut b, a);
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    for s in 0..n.saturating_sub(1) {
        let sb = (r + n - s) % n;
        let rb = (r + 2 * n - s - 1) % n;
        b.send(right, (Buf::Recv, a.displs[sb], a.counts[sb]));
        b.recv(left, (Buf::Recv, a.displs[rb], a.counts[rb]));
        b.end_round();
    }
    b.finish()
}
