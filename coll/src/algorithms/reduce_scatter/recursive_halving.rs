//! Recursive-halving reduce-scatter. Non-power-of-two sizes fold first:
//! among the first 2*rem ranks each even rank hands its vector to the odd
//! one after it, leaving p = 2^k virtual ranks; virtual rank v owns the
//! contiguous blocks of the ranks it stands for. In step k a virtual rank
//! exchanges half of its current range with the partner 2^k away and
//! reduces the half it keeps; the lower virtual rank's data is always the
//! left operand.

use crate::algorithms::{pow2_floor, prefix, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    let p = prefix(&a.counts);
    let total = p[n];
    let acc = b.scratch(total);
    b.copy((a.input(), 0, total), (acc, 0, total));
    b.end_round();
    let pw = pow2_floor(n);
    let rem = n - pw;
    // Virtual block v: element range of the ranks v stands for.
    let vb: Vec<(usize, usize)> = (0..pw)
        .map(|v| {
            let (lo, hi) = if v < rem {
                (2 * v, 2 * v + 2)
            } else {
                (v + rem, v + rem + 1)
            };
            (p[lo], p[hi] - p[lo])
        })
        .collect();
    if let Some(nr) = fold_in(&mut b, r, rem, acc, total) {
        halving(&mut b, nr, pw, rem, acc, &vb);
        if r < 2 * rem {
            // Odd rank standing for r-1 and r: hand over r-1's block.
            b.send(r - 1, (acc, p[r - 1], a.counts[r - 1]));
            b.end_round();
        }
    } else {
        b.recv(r + 1, (acc, p[r], a.counts[r]));
        b.end_round();
    }
    b.copy((acc, p[r], a.counts[r]), (Buf::Recv, 0, a.counts[r]));
    b.finish()
}

/// The world rank standing for virtual rank `v`.
pub(crate) fn vpeer(v: usize, rem: usize) -> usize {
    if v < rem {
        2 * v + 1
    } else {
        v + rem
    }
}

/// Folds the first `2*rem` ranks pairwise (even sends `len` elements of
/// `buf` to odd, which reduces them in as left operand). Returns this
/// rank's virtual rank, or `None` for the even ranks that dropped out.
pub(crate) fn fold_in(
    b: &mut Builder,
    r: usize,
    rem: usize,
    buf: Buf,
    len: usize,
) -> Option<usize> {
    if r < 2 * rem {
        if r % 2 == 0 {
            b.send(r + 1, (buf, 0, len));
            b.end_round();
            return None;
        }
        let tmp = b.scratch(len);
        b.recv(r - 1, (tmp, 0, len));
        b.reduce((tmp, 0, len), (buf, 0, len), true);
        b.end_round();
        return Some(r / 2);
    }
    Some(r - rem)
}

/// The element range (offset, length) covered by virtual blocks `lo..hi`
/// (adjacent in `buf`); empty when `lo >= hi`.
fn span(vb: &[(usize, usize)], lo: usize, hi: usize) -> (usize, usize) {
    if lo >= hi {
        return (0, 0);
    }
    (vb[lo].0, vb[hi - 1].0 + vb[hi - 1].1 - vb[lo].0)
}

/// Recursive halving over the `pw` virtual blocks `vb` (element ranges of
/// `buf`); afterwards virtual rank `nr` holds the reduction of block `nr`.
pub(crate) fn halving(
    b: &mut Builder,
    nr: usize,
    pw: usize,
    rem: usize,
    buf: Buf,
    vb: &[(usize, usize)],
) {
    let range = |lo: usize, hi: usize| span(vb, lo, hi);
    let maxlen = range(0, pw).1;
    let tmp = b.scratch(maxlen);
    let (mut lo, mut hi) = (0, pw);
    let mut mask = pw / 2;
    while mask >= 1 {
        let pnr = nr ^ mask;
        let peer = vpeer(pnr, rem);
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if nr & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (go, gl) = range(give.0, give.1);
        let (ko, kl) = range(keep.0, keep.1);
        b.send(peer, (buf, go, gl));
        b.recv(peer, (tmp, 0, kl));
        b.reduce((tmp, 0, kl), (buf, ko, kl), pnr < nr);
        b.end_round();
        lo = keep.0;
        hi = keep.1;
        mask /= 2;
    }
}

/// Recursive-doubling allgather of the virtual blocks (the inverse of
/// [`halving`]): afterwards every virtual rank holds every block.
pub(crate) fn doubling(
    b: &mut Builder,
    nr: usize,
    pw: usize,
    rem: usize,
    buf: Buf,
    vb: &[(usize, usize)],
) {
    let range = |lo: usize, hi: usize| span(vb, lo, hi);
    let mut mask = 1;
    while mask < pw {
        let pnr = nr ^ mask;
        let peer = vpeer(pnr, rem);
        let mine = nr & !(mask - 1);
        let theirs = pnr & !(mask - 1);
        let (mo, ml) = range(mine, mine + mask);
        let (to, tl) = range(theirs, theirs + mask);
        b.send(peer, (buf, mo, ml));
        b.recv(peer, (buf, to, tl));
        b.end_round();
        mask <<= 1;
    }
}
