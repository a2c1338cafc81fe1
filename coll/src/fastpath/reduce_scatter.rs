//! Reduce-scatter (and its block form) through the node's publication
//! slots: every rank publishes its whole input, then folds its own block of
//! every input in rank order, `((x0 op x1) op x2) ...`.

use crate::error::Result;
use crate::fastpath::{fold, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let es = io.esize;
    let n = f.size();
    let me = f.rank();
    let total: usize = (0..n).map(|r| io.count_of(r)).sum::<usize>() * es;
    let (off, len) = (io.displ_of(me) * es, io.count_of(me) * es);
    let input = io.input_at(0, total)?;
    let acc = io.recv_at(0, len)?;
    // SAFETY: `input` was checked.
    let slot = unsafe { f.publish_copy(input, total)? };
    // SAFETY: our slot holds our `total` bytes (in place, the accumulator
    // overlaps our input, so ours is read from there); `acc` is our
    // receive buffer, disjoint from every slot.
    unsafe { fold(f, io, n, slot, total, off, len, acc) }
}
