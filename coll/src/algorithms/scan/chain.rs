//! Pipelined linear (chain) scan and exscan: rank r receives the prefix of
//! ranks 0..r-1 from r-1 in segments of `Args::seg` elements, combines each
//! segment with its own input and passes it on to r+1 while the next
//! segment arrives. n-1 hops of one vector each instead of recursive
//! doubling's log2(n) whole-vector exchanges (each followed by one or two
//! reductions over the vector): the choice for large vectors on few ranks.
//!
//! Rank r >= 1, with m segments, runs rounds j = 0..=m+1 of: receive
//! segment j, send segment j-2 on, and locally process segment j-1 (it
//! touches neither message of the round, so the runner does it while they
//! move). The received prefix is always the left operand.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    chain(a, false)
}

pub fn build_exscan(a: &Args) -> Schedule {
    chain(a, true)
}

fn chain(a: &Args, exclusive: bool) -> Schedule {
    let (n, r, c) = (a.size, a.rank, a.count);
    let mut b = Builder::new(a.esize);
    let seg = a.seg.max(1);
    let segs: Vec<(usize, usize)> = (0..c.div_ceil(seg))
        .map(|j| (j * seg, seg.min(c - j * seg)))
        .collect();
    let m = segs.len();
    let at = |buf: Buf, k: usize| -> El { (buf, segs[k].0, segs[k].1) };
    if r == 0 {
        if n > 1 {
            for k in 0..m {
                b.send(1, at(a.input(), k));
            }
        }
        if !exclusive {
            b.copy((a.input(), 0, c), (Buf::Recv, 0, c));
        }
        return b.finish();
    }
    let last = r == n - 1;
    // Where the prefix of ranks 0..r-1 is received: straight into the
    // result unless the receive buffer still holds an input that is needed.
    let prefix = if a.in_place && !(exclusive && last) {
        b.scratch(c)
    } else {
        Buf::Recv
    };
    // Not in place, an exscan's result is the received prefix, so what is
    // passed on (prefix op input) needs a buffer of its own.
    let out = if exclusive && !a.in_place && !last {
        b.scratch(c)
    } else {
        Buf::Recv
    };
    for j in 0..m + 2 {
        if j < m {
            b.recv(r - 1, at(prefix, j));
        }
        if !last && (2..m + 2).contains(&j) {
            b.send(r + 1, at(out, j - 2));
        }
        if (1..=m).contains(&j) {
            let k = j - 1;
            match (exclusive, a.in_place) {
                (false, false) => b.reduce(at(Buf::Send, k), at(Buf::Recv, k), false),
                (false, true) => b.reduce(at(prefix, k), at(Buf::Recv, k), true),
                (true, _) if last => {}
                (true, false) => {
                    b.copy(at(Buf::Recv, k), at(out, k));
                    b.reduce(at(Buf::Send, k), at(out, k), false);
                }
                (true, true) => b.reduce(at(prefix, k), at(Buf::Recv, k), true),
            }
        }
        if exclusive && a.in_place && !last && (2..m + 2).contains(&j) {
            // The input op prefix just went out; the result is the prefix.
            b.copy(at(prefix, j - 2), at(Buf::Recv, j - 2));
        }
        b.end_round();
    }
    b.finish()
}
