//! Linear alltoall(v) with a bounded window: every peer is served directly,
//! at most `Args::window` peers (each way) in flight per round.

use super::self_copy;
use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let w = a.window.max(1);
    let mut b = Builder::new(a.esize);
    self_copy(&mut b, a);
    let mut s = 1;
    while s < n {
        let end = (s + w).min(n);
        for d in s..end {
            let from = (r + n - d) % n;
            b.recv(from, (Buf::Recv, a.rdispls[from], a.rcounts[from]));
        }
        for d in s..end {
            let to = (r + d) % n;
            b.send(to, (Buf::Send, a.displs[to], a.counts[to]));
        }
        b.end_round();
        s = end;
    }
    b.finish()
}
