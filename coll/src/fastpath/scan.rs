//! Scan and exscan through the node's publication slots: every rank but
//! the last publishes its input (nobody reads the last one's), then folds
//! the inputs of the ranks before it (and its own, for scan) in rank order.
//! Rank 0 of an exscan leaves its output untouched, as MPI does.

use crate::error::Result;
use crate::fastpath::{fold, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo, inclusive: bool) -> Result<()> {
    let len = io.count * io.esize;
    let me = f.rank();
    let input = io.input_at(0, len)?;
    // The last rank's input is read by nobody; it is kept in the slot only
    // for an in-place scan, whose accumulator overwrites it before use.
    let own = if me + 1 == f.size() && !(inclusive && io.in_place) {
        f.arrive_lazy()?;
        input
    } else {
        // SAFETY: `input` was checked.
        unsafe { f.publish_copy(input, len)? }
    };
    let last = if inclusive { me + 1 } else { me };
    if last == 0 {
        return Ok(());
    }
    let acc = io.recv_at(0, len)?;
    // SAFETY: `own` is our slot or (not in place) our input, `len` bytes;
    // `acc` is our receive buffer, disjoint from every slot and the input.
    unsafe { fold(f, io, last, own, len, 0, len, acc) }
}
