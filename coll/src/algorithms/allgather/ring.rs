//! Ring allgather(v): n-1 rounds, each passing one block to the right (as
//! messages of at most `Args::seg` elements). The own block goes out
//! straight from the send buffer in the first round and is copied into
//! place meanwhile.

use crate::algorithms::{recv_segs, send_segs, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    let own = (Buf::Recv, a.displs[r], a.counts[r]);
    let input = if a.in_place {
        own
    } else {
        (Buf::Send, 0, a.counts[r])
    };
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    for s in 0..n.saturating_sub(1) {
        let sb = (r + n - s) % n;
        let rb = (r + 2 * n - s - 1) % n;
        let out = if s == 0 {
            input
        } else {
            (Buf::Recv, a.displs[sb], a.counts[sb])
        };
        send_segs(&mut b, right, out, a.seg);
        recv_segs(&mut b, left, (Buf::Recv, a.displs[rb], a.counts[rb]), a.seg);
        if s == 0 {
            b.copy(input, own);
        }
        b.end_round();
    }
    if n == 1 {
        b.copy(input, own);
    }
    b.finish()
}
