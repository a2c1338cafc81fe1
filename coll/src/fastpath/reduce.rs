//! Reduce through the node's publication slots: every rank but the root
//! publishes its input and goes on; the root folds the inputs in rank
//! order, `((x0 op x1) op x2) ...`, straight out of the slots.

use crate::error::Result;
use crate::fastpath::{fold, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let me = f.rank();
    let input = io.input_at(0, len)?;
    if me != io.root {
        // SAFETY: `input` was checked.
        unsafe { f.publish_copy(input, len)? };
        return Ok(());
    }
    let acc = io.recv_at(0, len)?;
    // In place on a root other than rank 0, the accumulator starts as rank
    // 0's input and would overwrite ours: keep ours in the slot first.
    let own = if io.in_place && me != 0 {
        // SAFETY: as above.
        unsafe { f.publish_copy(input, len)? }
    } else {
        f.arrive_lazy()?;
        input
    };
    let n = f.size();
    // SAFETY: `own` is our input or slot (`len` bytes); `acc` is our
    // receive buffer, disjoint from every slot and equal to `own` only when
    // in place on rank 0 (where the first copy is skipped).
    unsafe { fold(f, io, n, own, len, 0, len, acc) }
}
