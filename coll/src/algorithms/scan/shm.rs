//! Scan and exscan through the node's publication slots: every rank
//! publishes its input, then folds the inputs of the ranks before it (and
//! its own, for scan) in rank order. Rank 0 of an exscan leaves its output
//! untouched, as MPI does.

use crate::error::Result;
use crate::fastpath::{copy, fold, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo, inclusive: bool) -> Result<()> {
    let len = io.count * io.esize;
    let me = f.rank();
    let input = io.input_at(0, len)?;
    let slot = f.claim()?;
    // SAFETY: the slot holds at least `len` bytes; `input` was checked.
    unsafe { copy(input, slot, len) };
    f.publish(len);
    let last = if inclusive { me + 1 } else { me };
    if last == 0 {
        return Ok(());
    }
    let acc = io.recv_at(0, len)?;
    // SAFETY: our slot holds our `len` bytes; `acc` is our receive buffer,
    // disjoint from every slot.
    unsafe { fold(f, io, last, slot, len, 0, len, acc) }
}
