//! Reduce as reduce-scatter (ring, each rank ends with one reduced block)
//! followed by a gather of the blocks to the root (Rabenseifner's scheme
//! with a ring first phase, valid for any n): moves ~2x the vector per
//! rank instead of log2(n) times, for large vectors.

use crate::algorithms::reduce_scatter::ring::ring_rs;
use crate::algorithms::{split, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r, count) = (a.size, a.rank, a.count);
    let mut b = Builder::new(a.esize);
    let acc = b.scratch(count);
    b.copy((a.input(), 0, count), (acc, 0, count));
    b.end_round();
    let blocks = split(count, n);
    ring_rs(&mut b, n, r, acc, &blocks);
    if r == a.root {
        for (i, &(off, len)) in blocks.iter().enumerate() {
            if i != r {
                b.recv(i, (Buf::Recv, off, len));
            }
        }
        let (off, len) = blocks[r];
        b.copy((acc, off, len), (Buf::Recv, off, len));
    } else {
        let (off, len) = blocks[r];
        b.send(a.root, (acc, off, len));
    }
    b.finish()
}
