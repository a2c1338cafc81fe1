//! Rabenseifner allreduce: recursive-halving reduce-scatter then
//! recursive-doubling allgather over p = 2^k virtual ranks (extra ranks
//! fold in first and get the result back at the end). ~2x the vector per
//! rank in 2 log2(p) rounds: for medium and large vectors.

use crate::algorithms::reduce_scatter::recursive_halving::{doubling, fold_in, halving};
use crate::algorithms::{pow2_floor, split, Args};
use crate::schedule::{Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    super::over_all(a, core)
}

/// Allreduce in place of `data` over the members `g` (this rank is
/// `g[me]`), lower members' data the left operand.
pub(crate) fn core(b: &mut Builder, g: &[usize], me: usize, data: El) {
    let (buf, off, count) = data;
    let n = g.len();
    if n <= 1 {
        return;
    }
    // The halving works on a buffer from its start.
    let work = if off == 0 { buf } else { b.scratch(count) };
    b.copy(data, (work, 0, count));
    b.end_round();
    b.within(Some(g));
    let pw = pow2_floor(n);
    let rem = n - pw;
    let vb = split(count, pw);
    match fold_in(b, me, rem, work, count) {
        Some(nr) => {
            halving(b, nr, pw, rem, work, &vb);
            doubling(b, nr, pw, rem, work, &vb);
            if me < 2 * rem {
                b.send(me - 1, (work, 0, count));
                b.end_round();
            }
        }
        None => {
            b.recv(me + 1, (work, 0, count));
            b.end_round();
        }
    }
    b.within(None);
    b.copy((work, 0, count), data);
    b.end_round();
}
