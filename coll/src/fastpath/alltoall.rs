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
    // SAFETY: `all` was checked.
    unsafe { f.publish_copy(all, n * len)? };
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

/// Alltoallv: every rank publishes a directory and the blocks that fit
/// ([`crate::fastpath::blocks`]) and sends the others as messages, then
/// looks its block up in every other rank's directory.
pub(crate) fn run_v(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let n = f.size();
    let me = f.rank();
    let sblock = |r: usize| io.block(r);
    let rblock = |r: usize| {
        let c = io.rcounts.get(r).copied().unwrap_or(0);
        let d = io.rdispls.get(r).copied().unwrap_or(0);
        (d * io.esize, c * io.esize)
    };
    for r in 0..n {
        let (off, len) = sblock(r);
        io.send_at(off, len)?;
        let (off, len) = rblock(r);
        io.recv_at(off, len)?;
    }
    // SAFETY: every block of the send buffer was checked above.
    unsafe { f.publish_blocks(io.send, sblock)? };
    let ((so, len), (ro, _)) = (sblock(me), rblock(me));
    // SAFETY: our own block, checked in both buffers (alltoallv checks
    // that it sends itself as much as it receives).
    unsafe { copy(io.send.add(so), io.recv.add(ro), len) };
    // After an error every other member's block is still taken (a live
    // member's message must find its receive, or it waits for one).
    for r in (0..n).filter(|&r| r != me) {
        let (off, len) = rblock(r);
        // SAFETY: checked above.
        let dst = unsafe { io.recv.add(off) };
        let got = f.block_from(r, len);
        match f.note(got) {
            // SAFETY: the block is `len` bytes of the publication (checked
            // by `block_from`).
            Some(Some(src)) => unsafe { copy(src, dst, len) },
            Some(None) => f.recv_msg(r, dst, len),
            None => {}
        }
    }
    f.finish()
}
