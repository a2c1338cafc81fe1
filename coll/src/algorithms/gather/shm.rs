//! Gather through the node's publication slots: every rank but the root
//! publishes its block and goes on; the root copies the blocks out.

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let me = f.rank();
    if me != io.root {
        let input = io.send_at(0, len)?;
        let slot = f.claim(len)?;
        // SAFETY: the slot holds at least `len` bytes; `input` was checked.
        unsafe { copy(input, slot, len) };
        f.publish();
        return Ok(());
    }
    f.arrive_lazy()?;
    for r in 0..f.size() {
        let dst = io.recv_at(r * len, len)?;
        let src = if r != me {
            f.data_of(r, len)?
        } else if io.in_place {
            continue;
        } else {
            io.send_at(0, len)?
        };
        // SAFETY: `src` is a published slot or our send buffer, `dst` a
        // checked block of the receive buffer; they are disjoint.
        unsafe { copy(src, dst, len) };
    }
    Ok(())
}
