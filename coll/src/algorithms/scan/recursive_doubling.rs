//! Recursive-doubling (inclusive and exclusive) scan: in step k rank r
//! exchanges its running partial with r XOR 2^k; data from lower ranks is
//! always the left operand, so the result is in rank order. ceil(log2 n)
//! rounds, any n.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    scan(a, false)
}

pub fn build_exscan(a: &Args) -> Schedule {
    scan(a, true)
}

fn scan(a: &Args, exclusive: bool) -> Schedule {
    let (n, r, c) = (a.size, a.rank, a.count);
    let mut b = Builder::new(a.esize);
    let partial = b.scratch(c);
    let tmp = b.scratch(c);
    b.copy((a.input(), 0, c), (partial, 0, c));
    if !exclusive {
        b.copy((a.input(), 0, c), (Buf::Recv, 0, c));
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
                    b.reduce((tmp, 0, c), (Buf::Recv, 0, c), true);
                } else {
                    b.copy((tmp, 0, c), (Buf::Recv, 0, c));
                    have = true;
                }
            } else {
                b.reduce((tmp, 0, c), (partial, 0, c), false);
            }
            b.end_round();
        }
        mask <<= 1;
    }
    b.finish()
}
