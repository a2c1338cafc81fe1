//! Bruck allgather(v): ceil(log2 n) rounds for any n. Each rank keeps the
//! blocks r, r+1, ... contiguously in a scratch buffer; in the round with
//! distance k it sends its first min(k, n-k) blocks to r-k and appends
//! those of r+k, then rotates everything into place.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    let blockof = |j: usize| (r + j) % n;
    let mut acc = 0;
    let toff: Vec<usize> = std::iter::once(0)
        .chain((0..n).map(|j| {
            acc += a.counts[blockof(j)];
            acc
        }))
        .collect();
    let tmp = b.scratch(toff[n]);
    let own = if a.in_place {
        (Buf::Recv, a.displs[r], a.counts[r])
    } else {
        (Buf::Send, 0, a.counts[r])
    };
    b.copy(own, (tmp, 0, a.counts[r]));
    b.end_round();
    let mut k = 1;
    while k < n {
        let cnt = k.min(n - k);
        b.send((r + n - k) % n, (tmp, 0, toff[cnt]));
        b.recv((r + k) % n, (tmp, toff[k], toff[k + cnt] - toff[k]));
        b.end_round();
        k <<= 1;
    }
    for (j, &off) in toff.iter().enumerate().take(n) {
        if j == 0 && a.in_place {
            continue;
        }
        let i = blockof(j);
        b.copy(
            (tmp, off, a.counts[i]),
            (Buf::Recv, a.displs[i], a.counts[i]),
        );
    }
    b.finish()
}
