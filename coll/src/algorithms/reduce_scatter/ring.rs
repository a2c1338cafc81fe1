//! Ring reduce-scatter: n-1 rounds; in round s rank r passes its partial
//! sum of block r-1-s to r+1, so block c accumulates along the ring from
//! rank c+1 and ends, complete, at rank c.

use crate::algorithms::{prefix, recv_segs, send_segs, Args};
use crate::schedule::{Buf, Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, r) = (a.size, a.rank);
    let mut b = Builder::new(a.esize);
    let p = prefix(&a.counts);
    let blocks: Vec<(usize, usize)> = (0..n).map(|i| (p[i], a.counts[i])).collect();
    let mine = blocks[r].1;
    if n == 1 {
        b.copy((a.input(), 0, mine), (Buf::Recv, 0, mine));
    } else if a.in_place {
        // The result's place (the front of the buffer) still holds input
        // blocks other ranks need, so it is written only at the end.
        let at = ring_rs(&mut b, a, Buf::Recv, &blocks, Partials::Into(None), None);
        b.copy(at, (Buf::Recv, 0, mine));
    } else {
        let fin = Some((Buf::Recv, 0, mine));
        ring_rs(&mut b, a, Buf::Send, &blocks, Partials::Into(None), fin);
    }
    b.finish()
}

/// Where a ring reduce-scatter keeps the partial sums it passes on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Partials {
    /// In the input buffer itself, which is overwritten: each partial is
    /// received into a temporary and reduced into the input's block.
    Accumulate,
    /// The input is only read. A partial is received straight into its
    /// place and reduced with the input's block there, which saves copying
    /// the whole input into an accumulator first (a full extra pass over
    /// the vector, the largest cost at 2 ranks). The place is block b of
    /// the given buffer, or, with `None`, one of two alternating scratch
    /// buffers (a partial received in round s is sent on in round s+1).
    Into(Option<Buf>),
}

/// Ring reduce-scatter of `blocks` (element ranges of `input`, which holds
/// this rank's vector) among `a.size` ranks, each message cut into pieces
/// of at most `a.seg` elements. Returns where block `r`'s full reduction ends up:
/// `fin` if given (only with [`Partials::Into`]), else the partial's place
/// (with `n == 1`, the input block itself, not copied). Received partials
/// are always the left operand, as in every other algorithm.
pub(crate) fn ring_rs(
    b: &mut Builder,
    a: &Args,
    input: Buf,
    blocks: &[(usize, usize)],
    parts: Partials,
    fin: Option<El>,
) -> El {
    let (n, r, seg) = (a.size, a.rank, a.seg);
    let blk = |buf: Buf, i: usize| (buf, blocks[i].0, blocks[i].1);
    if n == 1 {
        return blk(input, r);
    }
    let maxlen = blocks.iter().map(|x| x.1).max().unwrap_or(0);
    let right = (r + 1) % n;
    let left = (r + n - 1) % n;
    match parts {
        Partials::Accumulate => {
            let tmp = b.scratch(maxlen);
            for s in 0..n - 1 {
                let sb = (r + 2 * n - 1 - s) % n;
                let rb = (r + 2 * n - 2 - s) % n;
                send_segs(b, right, blk(input, sb), seg);
                recv_segs(b, left, (tmp, 0, blocks[rb].1), seg);
                b.reduce((tmp, 0, blocks[rb].1), blk(input, rb), true);
                b.end_round();
            }
            blk(input, r)
        }
        Partials::Into(place) => {
            let pp = match place {
                Some(_) => [input; 2],
                None => [b.scratch(maxlen), b.scratch(maxlen)],
            };
            let at = |s: usize, i: usize| match place {
                Some(x) => blk(x, i),
                None => (pp[s % 2], 0, blocks[i].1),
            };
            let mut last = blk(input, r);
            for s in 0..n - 1 {
                let sb = (r + 2 * n - 1 - s) % n;
                let rb = (r + 2 * n - 2 - s) % n;
                let src = if s == 0 {
                    blk(input, sb)
                } else {
                    at(s - 1, sb)
                };
                let dst = match fin {
                    Some(f) if s == n - 2 => f,
                    _ => at(s, rb),
                };
                send_segs(b, right, src, seg);
                recv_segs(b, left, dst, seg);
                b.reduce(blk(input, rb), dst, false);
                b.end_round();
                last = dst;
            }
            last
        }
    }
}
