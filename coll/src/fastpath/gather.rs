//! Gather and gatherv through the node's publication slots: every rank but
//! the root publishes its block and goes on; the root copies the blocks
//! out. A gatherv block too big for a slot travels as a message instead;
//! its sender and the root (which knows every length) both see that
//! ([`crate::fastpath::blocks`]).

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let me = f.rank();
    if me != io.root {
        let len = io.count * io.esize;
        let input = io.send_at(0, len)?;
        if len > f.capacity() {
            f.arrive_lazy()?;
            f.send_msg(io.root, input, len);
            return f.finish();
        }
        // SAFETY: `input` was checked.
        unsafe { f.publish_copy(input, len)? };
        return Ok(());
    }
    f.arrive_lazy()?;
    let n = f.size();
    let cap = f.capacity();
    if (0..n).any(|r| r != me && io.block(r).1 > cap) {
        return gather_with_messages(f, io);
    }
    for r in 0..n {
        let (off, len) = io.block(r);
        let dst = io.recv_at(off, len)?;
        let src = if r != me {
            f.data_of(r, len)?
        } else if io.in_place {
            continue;
        } else {
            io.send_at(0, len)?
        };
        // SAFETY: `src` holds `len` bytes (a publication of that length or
        // our checked send buffer), `dst` was checked.
        unsafe { copy(src, dst, len) };
    }
    Ok(())
}

/// The root's part when some blocks travel as messages: every
/// destination is checked before a receive is posted, and once one is,
/// the call goes on to the end.
fn gather_with_messages(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let n = f.size();
    let me = f.rank();
    let cap = f.capacity();
    for r in 0..n {
        let (off, len) = io.block(r);
        io.recv_at(off, len)?;
    }
    if !io.in_place {
        io.send_at(0, io.block(me).1)?;
    }
    for r in (0..n).filter(|&r| r != me && io.block(r).1 > cap) {
        let (off, len) = io.block(r);
        let dst = io.recv_at(off, len)?;
        f.recv_msg(r, dst, len);
    }
    for r in 0..n {
        let (off, len) = io.block(r);
        let dst = io.recv_at(off, len)?;
        let src = if r != me {
            if len > cap || f.msgs_failed() {
                continue;
            }
            let got = f.data_of(r, len);
            match f.note(got) {
                Some(p) => p,
                None => continue,
            }
        } else if io.in_place {
            continue;
        } else {
            io.send_at(0, len)?
        };
        // SAFETY: `src` holds `len` bytes (a publication of that length or
        // our checked send buffer), `dst` was checked.
        unsafe { copy(src, dst, len) };
    }
    f.finish()
}
