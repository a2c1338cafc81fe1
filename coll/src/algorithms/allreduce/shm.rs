//! Allreduce through the node's publication slots: every rank publishes its
//! input, then folds all of them in rank order, `((x0 op x1) op x2) ...`, so
//! every rank computes the same bits without a second exchange. Each rank
//! reads every input, so this suits small vectors and few ranks; selection
//! switches to the message-based algorithms beyond.

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let me = f.rank();
    let input = io.input_at(0, len)?;
    let acc = io.recv_at(0, len)?;
    let slot = f.claim()?;
    // SAFETY: the slot holds at least `len` bytes; `input` was checked.
    unsafe { copy(input, slot, len) };
    f.publish(len);
    for r in 0..f.size() {
        // Our own contribution is read back from the slot: in place, the
        // accumulator has overwritten the input by the time it is needed.
        let src = if r == me {
            slot as *const u8
        } else {
            f.data_of(r, len)?
        };
        // SAFETY: `src` is a published slot of `len` bytes, `acc` our
        // receive buffer of `len` bytes, disjoint from every slot.
        unsafe {
            if r == 0 {
                copy(src, acc, len);
            } else {
                io.reduce(acc, src, len);
            }
        }
    }
    Ok(())
}
