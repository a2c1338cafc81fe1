//! Dissemination barrier: in round k every rank signals `rank + 2^k` and
//! waits for `rank - 2^k`; ceil(log2 n) rounds for any n.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(1);
    let mut k = 1;
    while k < n {
        b.send((r + k) % n, (Buf::Recv, 0, 0));
        b.recv((r + n - k) % n, (Buf::Recv, 0, 0));
        b.end_round();
        k <<= 1;
    }
    b.finish()
}
