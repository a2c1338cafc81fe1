//! Linear alltoall(v) with a bounded window: every peer is served directly,
//! at most `Args::window` peers (each way) in flight per round, each block
//! as messages of at most `Args::seg` elements. The own block is copied in
//! the first round, while the messages move.

use super::self_copy;
use crate::algorithms::{recv_segs, send_segs, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let w = a.window.max(1);
    let mut b = Builder::new(a.esize);
    let mut s = 1;
    while s < n {
        let end = (s + w).min(n);
        for d in s..end {
            let from = (r + n - d) % n;
            let blk = (Buf::Recv, a.rdispls[from], a.rcounts[from]);
            recv_segs(&mut b, from, blk, a.seg);
        }
        for d in s..end {
            let to = (r + d) % n;
            send_segs(&mut b, to, (Buf::Send, a.displs[to], a.counts[to]), a.seg);
        }
        if s == 1 {
            self_copy(&mut b, a);
        }
        b.end_round();
        s = end;
    }
    if n == 1 {
        self_copy(&mut b, a);
    }
    b.finish()
}
