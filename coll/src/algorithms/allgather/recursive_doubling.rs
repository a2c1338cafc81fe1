//! Recursive-doubling allgather(v): in step k a rank swaps everything it
//! has with the rank 2^k away (log2 p rounds). With n not a power of two
//! the ranks p..n first hand their block to rank r-p, which carries it
//! through the exchanges and returns the full result at the end.

use super::{own_block, ranges};
use crate::algorithms::{pow2_floor, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    own_block(&mut b, a);
    let pw = pow2_floor(n);
    let blk = |i: usize| (Buf::Recv, a.displs[i], a.counts[i]);
    if r >= pw {
        b.send(r - pw, blk(r));
        b.end_round();
        for (off, len) in ranges(a, (0..n).filter(|&i| i != r)) {
            b.recv(r - pw, (Buf::Recv, off, len));
        }
        return b.finish();
    }
    if r + pw < n {
        b.recv(r + pw, blk(r + pw));
        b.end_round();
    }
    // Blocks held by the aligned group [g, g + m) of virtual ranks.
    let group = |g: usize, m: usize| {
        let lo = g..g + m;
        let hi = (g + pw)..(g + m + pw).min(n);
        lo.chain(hi)
    };
    let mut m = 1;
    while m < pw {
        let peer = r ^ m;
        let mine = r & !(m - 1);
        let theirs = peer & !(m - 1);
        for (off, len) in ranges(a, group(mine, m)) {
            b.send(peer, (Buf::Recv, off, len));
        }
        for (off, len) in ranges(a, group(theirs, m)) {
            b.recv(peer, (Buf::Recv, off, len));
        }
        b.end_round();
        m <<= 1;
    }
    if r + pw < n {
        for (off, len) in ranges(a, (0..n).filter(|&i| i != r + pw)) {
            b.send(r + pw, (Buf::Recv, off, len));
        }
    }
    b.finish()
}
