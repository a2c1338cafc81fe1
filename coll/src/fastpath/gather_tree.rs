//! Gather through the node's publication slots up a tree ([`super::tree`],
//! rooted at the gather's root): a rank publishes its own block followed
//! by its children's publications, in child order. A subtree is a
//! contiguous range of ranks relative to the root, so each publication is
//! the blocks of that range in order, and the root copies each child's
//! publication into its receive buffer in one piece (two across the end of
//! the rank order). The root polls at most `ARITY` lines and reads as many
//! publications, where the flat form has it poll every rank's line; the
//! price is a copy per level, so it runs from `IBCOLL_SHM_TREE_MIN` ranks
//! on, and only where the largest subtree's blocks fit a slot ([`fits`];
//! else the flat form runs).

use crate::error::Result;
use crate::fastpath::tree::{Node, Rooted, ARITY};
use crate::fastpath::{copy, FastCall, FastIo};

/// Whether the largest publication of the tree, a child of the root's
/// subtree of `ceil((n - 1) / ARITY)` blocks, fits a slot: the same answer
/// on every rank of a correct call (the block, the member count and the
/// slots' capacity are), so every rank runs the same form.
pub(crate) fn fits(f: &FastCall, io: &FastIo) -> bool {
    let len = io.count * io.esize;
    f.size().saturating_sub(1).div_ceil(ARITY) * len <= f.capacity()
}

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let n = f.size();
    let (root, me) = (io.root, f.rank());
    let t = Rooted::of(me, n, root);
    let (rel, node) = (t.rel, &t.node);
    let abs = |r: usize| t.abs(r);
    let Some(p) = node.parent else {
        return at_root(f, io, node, len);
    };
    let input = io.send_at(0, len)?;
    let total = (node.end - rel) * len;
    let slot = f.claim_data(total)?;
    // SAFETY: the slot holds `total` bytes and is ours; `input` was
    // checked; each child's publication holds its subtree's blocks
    // (checked by `data_of`), which follow ours in relative rank order.
    unsafe {
        copy(input, slot, len);
        let mut at = len;
        for (c, k) in node.kid_spans() {
            let clen = k * len;
            let src = f.data_of(abs(c), clen)?;
            copy(src, slot.add(at), clen);
            at += clen;
        }
    }
    f.publish_waking(std::iter::once(abs(p)));
    Ok(())
}

/// The root: its own block, then each child's publication into the
/// blocks of the ranks of that child's subtree.
fn at_root(f: &mut FastCall, io: &FastIo, node: &Node, len: usize) -> Result<()> {
    let n = f.size();
    let (root, me) = (io.root, f.rank());
    let recv = io.recv_at(0, n * len)?;
    if !io.in_place {
        // SAFETY: our checked send block and our block of the receive
        // buffer.
        unsafe { copy(io.send_at(0, len)?, recv.add(me * len), len) };
    }
    f.arrive_lazy()?;
    for (c, k) in node.kid_spans() {
        let src = f.data_of((c + root) % n, k * len)?;
        // Relative ranks c..c+k are absolute ranks from (c + root) % n on,
        // wrapping once past n - 1.
        let first = (c + root) % n;
        let head = k.min(n - first);
        // SAFETY: the child's publication holds `k * len` bytes (checked);
        // `recv` holds `n * len` (checked) and the two pieces lie inside it.
        unsafe {
            copy(src, recv.add(first * len), head * len);
            copy(src.add(head * len), recv, (k - head) * len);
        }
    }
    Ok(())
}
