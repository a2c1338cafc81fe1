//! Recursive-doubling (inclusive and exclusive) scan: in step k rank r
//! exchanges its running partial with r XOR 2^k; data from lower ranks is
//! always the left operand, so the result is in rank order. ceil(log2 n)
//! rounds, any n.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    scan(a, false)
}

pub fn build_exscan(a: &Args) -> Schedule {
    scan(a, true)
}

fn scan(a: &Args, exclusive: bool) -> Schedule {
    let mut b = Builder::new(a.esize);
    let c = a.count;
    core(
        &mut b,
        a.size,
        a.rank,
        (a.input(), 0, c),
        (Buf::Recv, 0, c),
        exclusive,
    );
    b.finish()
}

/// The scan of `input` over peers 0..n (this rank is `r`; through
/// `Builder::within`, members of a group) into `out`, which an exclusive
/// scan leaves untouched on peer 0.
pub(crate) fn core(b: &mut Builder, n: usize, r: usize, input: El, out: El, exclusive: bool) {
    let c = input.2;
    let partial = b.scratch(c);
    let tmp = b.scratch(c);
    b.copy(input, (partial, 0, c));
    if !exclusive {
        b.copy(input, out);
    }
    b.end_round();
    let mut have = !exclusive;
    let mut mask = 1;
    while mask < n {
        let peer = r ^ mask;
        if peer < n {
            b.send(peer, (partial, 0, c));
            b.recv(peer, (tmp, 0, c));
            if peer < r {
                b.reduce((tmp, 0, c), (partial, 0, c), true);
                if have {
                    b.reduce((tmp, 0, c), out, true);
                } else {
                    b.copy((tmp, 0, c), out);
                    have = true;
                }
            } else {
                b.reduce((tmp, 0, c), (partial, 0, c), false);
            }
            b.end_round();
        }
        mask <<= 1;
    }
}
