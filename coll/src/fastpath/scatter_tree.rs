//! Scatter through the node's publication slots with its release down a
//! tree ([`super::tree`], rooted at the scatter's root): the root publishes
//! the whole send buffer once, as in the flat form, but a rank waits for
//! its parent's line instead of the root's (the root's for the root's
//! children), takes its block out of the root's publication (published by
//! then: one read, no polling), and then publishes its arrival for its
//! own children. Each line has at most `ARITY` rank polling it, where the
//! flat form has every rank poll the root's.

use crate::error::Result;
use crate::fastpath::tree::Rooted;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let n = f.size();
    let (root, me) = (io.root, f.rank());
    let t = Rooted::of(me, n, root);
    let node = &t.node;
    let abs = |r: usize| t.abs(r);
    let Some(p) = node.parent else {
        let all = io.send_at(0, n * len)?;
        // SAFETY: `all` was checked.
        unsafe { f.publish_copy_waking(all, n * len, node.kids().map(abs))? };
        if !io.in_place {
            let dst = io.recv_at(0, len)?;
            // SAFETY: our block of the send buffer and the receive buffer.
            unsafe { copy(io.send_at(me * len, len)?, dst, len) };
        }
        return Ok(());
    };
    if p != 0 {
        // The release: the parent has read this call, so the root has
        // published it.
        f.wait_for(abs(p))?;
    }
    let src = f.data_of(root, n * len)?;
    let dst = io.recv_at(0, len)?;
    // SAFETY: our block lies inside the root's published `n * len` bytes.
    unsafe { copy(src.add(me * len), dst, len) };
    if node.is_leaf() {
        return f.arrive_lazy();
    }
    f.arrive_waking(node.kids().map(abs))
}
