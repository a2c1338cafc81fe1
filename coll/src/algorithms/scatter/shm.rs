//! Scatter through the node's publication slots: the root publishes the
//! whole send buffer once and goes on; every rank copies its block out.

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let n = f.size();
    let me = f.rank();
    if me == io.root {
        let all = io.send_at(0, n * len)?;
        let slot = f.claim(n * len)?;
        // SAFETY: the slot holds at least `n * len` bytes (the caller
        // checked the capacity); `all` was checked.
        unsafe { copy(all, slot, n * len) };
        f.publish();
        if !io.in_place {
            let dst = io.recv_at(0, len)?;
            // SAFETY: our block of the send buffer and the receive buffer.
            unsafe { copy(io.send_at(me * len, len)?, dst, len) };
        }
        return Ok(());
    }
    f.arrive_lazy()?;
    let src = f.data_of(io.root, n * len)?;
    let dst = io.recv_at(0, len)?;
    // SAFETY: our block lies inside the root's published `n * len` bytes.
    unsafe { copy(src.add(me * len), dst, len) };
    Ok(())
}
