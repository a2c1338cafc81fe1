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
        // SAFETY: `all` was checked.
        unsafe { f.publish_copy(all, n * len)? };
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

/// Scatterv: the root publishes a directory and the blocks that fit
/// ([`crate::fastpath::blocks`]) and sends the others as messages; every
/// rank looks its block up in the directory.
pub(crate) fn run_v(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let n = f.size();
    let me = f.rank();
    if me != io.root {
        let len = io.count * io.esize;
        let dst = io.recv_at(0, len)?;
        f.arrive_lazy()?;
        match f.block_from(io.root, len)? {
            // SAFETY: the directory's block is `len` bytes of the root's
            // publication (checked by `block_from`); `dst` was checked.
            Some(src) => unsafe { copy(src, dst, len) },
            None => f.recv_msg(io.root, dst, len),
        }
        return f.finish();
    }
    for r in 0..n {
        let (off, len) = io.block(r);
        io.send_at(off, len)?;
    }
    let own = if io.in_place {
        None
    } else {
        Some(io.recv_at(0, io.block(me).1)?)
    };
    // SAFETY: every block of the send buffer was checked above.
    unsafe { f.publish_blocks(io.send, |r| io.block(r))? };
    if let Some(dst) = own {
        let (off, len) = io.block(me);
        // SAFETY: our block of the checked send buffer and the checked
        // receive buffer.
        unsafe { copy(io.send.add(off), dst, len) };
    }
    f.finish()
}
