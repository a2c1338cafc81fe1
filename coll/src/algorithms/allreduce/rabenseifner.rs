//! Rabenseifner allreduce: recursive-halving reduce-scatter then
//! recursive-doubling allgather over p = 2^k virtual ranks (extra ranks
//! fold in first and get the result back at the end). ~2x the vector per
//! rank in 2 log2(p) rounds: for medium and large vectors.

use crate::algorithms::reduce_scatter::recursive_halving::{doubling, fold_in, halving};
use crate::algorithms::{pow2_floor, split, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r, count) = (a.size, a.rank, a.count);
    let mut b = Builder::new(a.esize);
    b.copy((a.input(), 0, count), (Buf::Recv, 0, count));
    b.end_round();
    if n == 1 {
        return b.finish();
    }
    let pw = pow2_floor(n);
    let rem = n - pw;
    let vb = split(count, pw);
    match fold_in(&mut b, r, rem, Buf::Recv, count) {
        Some(nr) => {
            halving(&mut b, nr, pw, rem, Buf::Recv, &vb);
            doubling(&mut b, nr, pw, rem, Buf::Recv, &vb);
            if r < 2 * rem {
                b.send(r - 1, (Buf::Recv, 0, count));
                b.end_round();
            }
        }
        None => {
            b.recv(r + 1, (Buf::Recv, 0, count));
            b.end_round();
        }
    }
    b.finish()
}
