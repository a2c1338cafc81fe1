//! Ring allreduce: ring reduce-scatter of n blocks, then ring allgather;
//! 2(n-1) rounds moving 2(n-1)/n of the vector per rank. Best for large
//! vectors. Not in place, partials are received straight into the receive
//! buffer (no copy of the input first).

use crate::algorithms::reduce_scatter::ring::{ring_rs, Partials};
use crate::algorithms::{recv_segs, send_segs, split, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    let blocks = split(a.count, n);
    if n == 1 {
        b.copy((a.input(), 0, a.count), (Buf::Recv, 0, a.count));
        return b.finish();
    }
    if a.in_place {
        ring_rs(&mut b, a, Buf::Recv, &blocks, Partials::Accumulate, None);
    } else {
        let into = Partials::Into(Some(Buf::Recv));
        ring_rs(&mut b, a, Buf::Send, &blocks, into, None);
    }
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    for s in 0..n.saturating_sub(1) {
        let sb = (r + n - s) % n;
        let rb = (r + 2 * n - s - 1) % n;
        send_segs(
            &mut b,
            right,
            (Buf::Recv, blocks[sb].0, blocks[sb].1),
            a.seg,
        );
        recv_segs(&mut b, left, (Buf::Recv, blocks[rb].0, blocks[rb].1), a.seg);
        b.end_round();
    }
    b.finish()
}
