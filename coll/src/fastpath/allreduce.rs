//! Allreduce through the node's publication slots: every rank publishes its
//! input, then folds all of them in rank order, `((x0 op x1) op x2) ...`, so
//! every rank computes the same bits without a second exchange. Each rank
//! reads every input, so this suits small vectors and few ranks; selection
//! switches to the message-based algorithms beyond.

use crate::error::Result;
use crate::fastpath::{fold, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let input = io.input_at(0, len)?;
    let acc = io.recv_at(0, len)?;
    // SAFETY: `input` was checked.
    let slot = unsafe { f.publish_copy(input, len)? };
    let n = f.size();
    // SAFETY: our slot holds our `len` bytes; `acc` is our receive buffer,
    // disjoint from every slot.
    unsafe { fold(f, io, n, slot, len, 0, len, acc) }
}
