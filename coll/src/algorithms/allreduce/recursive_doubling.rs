//! Recursive-doubling allreduce: log2(p) exchanges of the whole vector
//! (p = largest power of two <= n; the other ranks fold into a partner
//! first and get the result back at the end). Best for small vectors.

use crate::algorithms::reduce_scatter::recursive_halving::vpeer;
use crate::algorithms::{pow2_floor, Args};
use crate::schedule::{Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    super::over_all(a, core)
}

/// Allreduce in place of `data` over the members `g` (this rank is
/// `g[me]`).
pub(crate) fn core(b: &mut Builder, g: &[usize], me: usize, data: El) {
    let (buf, off, count) = data;
    let n = g.len();
    if n <= 1 {
        return;
    }
    let pw = pow2_floor(n);
    let rem = n - pw;
    // Fold (in member indices, mapped to ranks through g).
    let nr = if me < 2 * rem {
        if me % 2 == 0 {
            b.send(g[me + 1], (buf, off, count));
            b.end_round();
            b.recv(g[me + 1], (buf, off, count));
            b.end_round();
            return;
        }
        let tmp = b.scratch(count);
        b.recv(g[me - 1], (tmp, 0, count));
        b.reduce((tmp, 0, count), (buf, off, count), true);
        b.end_round();
        me / 2
    } else {
        me - rem
    };
    let tmp = b.scratch(count);
    let mut mask = 1;
    while mask < pw {
        let pnr = nr ^ mask;
        let peer = g[vpeer(pnr, rem)];
        b.send(peer, (buf, off, count));
        b.recv(peer, (tmp, 0, count));
        b.reduce((tmp, 0, count), (buf, off, count), pnr < nr);
        b.end_round();
        mask <<= 1;
    }
    if me < 2 * rem {
        b.send(g[me - 1], (buf, off, count));
        b.end_round();
    }
}
