//! Pairwise-exchange alltoall(v): n-1 rounds; in round s rank r sends to
//! r+s and receives from r-s (one partner each way at a time). The own
//! block is copied in the first round, while the messages move.

use super::self_copy;
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    for s in 1..n {
        let to = (r + s) % n;
        let from = (r + n - s) % n;
        b.send(to, (Buf::Send, a.displs[to], a.counts[to]));
        b.recv(from, (Buf::Recv, a.rdispls[from], a.rcounts[from]));
        if s == 1 {
            self_copy(&mut b, a);
        }
        b.end_round();
    }
    if n == 1 {
        self_copy(&mut b, a);
    }
    b.finish()
}
