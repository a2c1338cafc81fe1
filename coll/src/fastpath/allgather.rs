//! Allgather(v) through the node's publication slots: every rank publishes
//! its block, then copies every other block out (counts and displacements
//! are known to every rank).

use crate::error::Result;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let es = io.esize;
    let me = f.rank();
    let mine = io.count_of(me) * es;
    let own_dst = io.recv_at(io.displ_of(me) * es, mine)?;
    let input = if io.in_place {
        own_dst as *const u8
    } else {
        io.send_at(0, mine)?
    };
    // SAFETY: `input` was checked.
    unsafe { f.publish_copy(input, mine)? };
    if !io.in_place {
        // SAFETY: our send block and its place in the receive buffer.
        unsafe { copy(input, own_dst, mine) };
    }
    for r in 0..f.size() {
        if r == me {
            continue;
        }
        let len = io.count_of(r) * es;
        let dst = io.recv_at(io.displ_of(r) * es, len)?;
        let src = f.data_of(r, len)?;
        // SAFETY: a published slot of `len` bytes and a checked block.
        unsafe { copy(src, dst, len) };
    }
    Ok(())
}
