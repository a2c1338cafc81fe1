//! Broadcast through the node's publication slots: the root publishes the
//! data once, every other rank copies it out. The root does not wait for
//! the readers (the slot's reuse rule holds it back at most one call later).

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let dst = io.recv_at(0, len)?;
    if f.rank() == io.root {
        // SAFETY: `dst` has `len` readable bytes (checked).
        unsafe { f.publish_copy(dst, len)? };
    } else {
        f.arrive_lazy()?;
        let src = f.data_of(io.root, len)?;
        // SAFETY: the root's published buffer holds `len` bytes (checked by
        // `data_of`) and stays until we arrive at the next call.
        unsafe { copy(src, dst, len) };
    }
    Ok(())
}
