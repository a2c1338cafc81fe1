//! Reduce as reduce-scatter (ring, each rank ends with one reduced block)
//! followed by a gather of the blocks to the root (Rabenseifner's scheme
//! with a ring first phase, valid for any n): moves ~2x the vector per
//! rank instead of log2(n) times, for large vectors. The root accumulates
//! in its receive buffer, the others in two block-sized scratch buffers.
//! The reduce-scatter's messages are cut into pieces of at most
//! `Args::seg` elements; the gather's are not (a rank that only sends gains
//! nothing from pieces and could wait for ring space).

use crate::algorithms::reduce_scatter::ring::{ring_rs, Partials};
use crate::algorithms::{split, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r, count) = (a.size, a.rank, a.count);
    let mut b = Builder::new(a.esize);
    if n == 1 {
        b.copy((a.input(), 0, count), (Buf::Recv, 0, count));
        return b.finish();
    }
    let blocks = split(count, n);
    let at = if r != a.root {
        ring_rs(&mut b, a, a.input(), &blocks, Partials::Into(None), None)
    } else if a.in_place {
        ring_rs(&mut b, a, Buf::Recv, &blocks, Partials::Accumulate, None)
    } else {
        let into = Partials::Into(Some(Buf::Recv));
        ring_rs(&mut b, a, Buf::Send, &blocks, into, None)
    };
    if r == a.root {
        for (i, &(off, len)) in blocks.iter().enumerate() {
            if i != r {
                b.recv(i, (Buf::Recv, off, len));
            }
        }
    } else {
        b.send(a.root, at);
    }
    b.finish()
}
