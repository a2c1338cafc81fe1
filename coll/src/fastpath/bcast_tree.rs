//! Broadcast through the node's publication slots down a tree
//! ([`super::tree`], rooted at the bcast's root): a rank copies the data
//! out of its parent's slot and, if it has children, publishes a copy of
//! it for them. Each line has at most `ARITY` readers and each publication
//! wakes only the children that wait for it, where the flat form has every
//! rank poll the root's line.

use crate::error::Result;
use crate::fastpath::tree::Rooted;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let dst = io.recv_at(0, len)?;
    let n = f.size();
    let (root, me) = (io.root, f.rank());
    let t = Rooted::of(me, n, root);
    let node = &t.node;
    let abs = |r: usize| t.abs(r);
    if let Some(p) = node.parent {
        let src = f.data_of(abs(p), len)?;
        // SAFETY: the parent's published buffer holds `len` bytes (checked
        // by `data_of`) and stays until we arrive at a later call.
        unsafe { copy(src, dst, len) };
    }
    if node.is_leaf() {
        return f.arrive_lazy();
    }
    // SAFETY: `dst` has `len` readable bytes (checked), outside our slots.
    unsafe { f.publish_copy_waking(dst, len, node.kids().map(abs))? };
    Ok(())
}
