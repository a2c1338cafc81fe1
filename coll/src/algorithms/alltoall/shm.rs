//! Alltoall through the node's publication slots: every rank publishes its
//! whole send buffer, then copies the block meant for it out of every
//! other rank's.

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let n = f.size();
    let me = f.rank();
    let all = io.send_at(0, n * len)?;
    let slot = f.claim(n * len)?;
    // SAFETY: the slot holds at least `n * len` bytes (capacity checked by
    // the caller); `all` was checked.
    unsafe { copy(all, slot, n * len) };
    f.publish();
    // SAFETY: our own block of the send buffer to ours in the receive one.
    unsafe { copy(io.send_at(me * len, len)?, io.recv_at(me * len, len)?, len) };
    for r in 0..n {
        if r == me {
            continue;
        }
        let dst = io.recv_at(r * len, len)?;
        let src = f.data_of(r, n * len)?;
        // SAFETY: block `me` lies inside the `n * len` published bytes.
        unsafe { copy(src.add(me * len), dst, len) };
    }
    Ok(())
}
