//! Reduce-scatter (and its block form) through the node's publication
//! slots: every rank publishes its whole input, then folds its own block of
//! every input in rank order, `((x0 op x1) op x2) ...`.

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let es = io.esize;
    let n = f.size();
    let me = f.rank();
    let total: usize = (0..n).map(|r| io.count_of(r)).sum::<usize>() * es;
    let (off, len) = (io.displ_of(me) * es, io.count_of(me) * es);
    let input = io.input_at(0, total)?;
    let acc = io.recv_at(0, len)?;
    let slot = f.claim()?;
    // SAFETY: the slot holds at least `total` bytes; `input` was checked.
    unsafe { copy(input, slot, total) };
    f.publish(total);
    for r in 0..n {
        // In place, the accumulator overlaps our input: read ours back
        // from the slot.
        let src = if r == me {
            slot as *const u8
        } else {
            f.data_of(r, total)?
        };
        // SAFETY: our block lies inside the `total` published bytes; `acc`
        // is our receive buffer (`len` bytes), disjoint from every slot.
        unsafe {
            if r == 0 {
                copy(src.add(off), acc, len);
            } else {
                io.reduce(acc, src.add(off), len);
            }
        }
    }
    Ok(())
}
