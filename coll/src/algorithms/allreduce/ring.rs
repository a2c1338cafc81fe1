//! Ring allreduce: ring reduce-scatter of n blocks, then ring allgather;
//! 2(n-1) rounds moving 2(n-1)/n of the vector per rank. Best for large
//! vectors.

use crate::algorithms::reduce_scatter::ring::ring_rs;
use crate::algorithms::{split, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    b.copy((a.input(), 0, a.count), (Buf::Recv, 0, a.count));
    b.end_round();
    let blocks = split(a.count, n);
    ring_rs(&mut b, n, r, Buf::Recv, &blocks);
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    for s in 0..n.saturating_sub(1) {
        let sb = (r + n - s) % n;
        let rb = (r + 2 * n - s - 1) % n;
        b.send(right, (Buf::Recv, blocks[sb].0, blocks[sb].1));
        b.recv(left, (Buf::Recv, blocks[rb].0, blocks[rb].1));
        b.end_round();
    }
    b.finish()
}
