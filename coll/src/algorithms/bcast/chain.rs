//! Pipelined chain broadcast: the buffer is cut into segments
//! (`Args::seg` elements) that flow root -> root+1 -> ... -> root-1; in
//! round t a rank receives segment t and forwards segment t-1.

use crate::algorithms::Args;
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (n, count) = (a.size, a.count);
    let mut b = Builder::new(a.esize);
    if n == 1 || count == 0 {
        return b.finish();
    }
    let seg = a.seg.max(1);
    let nseg = count.div_ceil(seg);
    let part = |t: usize| (Buf::Recv, t * seg, seg.min(count - t * seg));
    let vr = (a.rank + n - a.root) % n;
    let prev = (a.rank + n - 1) % n;
    let next = (a.rank + 1) % n;
    let has_next = vr + 1 < n;
    if vr == 0 {
        for t in 0..nseg {
            b.send(next, part(t));
            b.end_round();
        }
        return b.finish();
    }
    for t in 0..=nseg {
        if t < nseg {
            b.recv(prev, part(t));
        }
        if has_next && t >= 1 {
            b.send(next, part(t - 1));
        }
        b.end_round();
    }
    b.finish()
}
