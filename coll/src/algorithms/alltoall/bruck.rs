//! Bruck alltoall (uniform counts only): ceil(log2 n) rounds. Blocks are
//! rotated so position j holds the block for r+j; in the round for bit k
//! every block whose position has bit k set moves k ranks on (packed into
//! one message); finally position j holds the block from r-j. Fewest
//! messages: for small blocks.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r, c) = (a.size, a.rank, a.count);
    let mut b = Builder::new(a.esize);
    let tmp = b.scratch(n * c);
    for j in 0..n {
        b.copy((Buf::Send, ((r + j) % n) * c, c), (tmp, j * c, c));
    }
    b.end_round();
    let pack = b.scratch(n.div_ceil(2) * c);
    let unpack = b.scratch(n.div_ceil(2) * c);
    let mut k = 1;
    while k < n {
        let ids: Vec<usize> = (0..n).filter(|j| j & k != 0).collect();
        for (i, &j) in ids.iter().enumerate() {
            b.copy((tmp, j * c, c), (pack, i * c, c));
        }
        b.end_round();
        let len = ids.len() * c;
        b.send((r + k) % n, (pack, 0, len));
        b.recv((r + n - k) % n, (unpack, 0, len));
        for (i, &j) in ids.iter().enumerate() {
            b.copy((unpack, i * c, c), (tmp, j * c, c));
        }
        b.end_round();
        k <<= 1;
    }
    for j in 0..n {
        b.copy((tmp, j * c, c), (Buf::Recv, ((r + n - j) % n) * c, c));
    }
    b.finish()
}
