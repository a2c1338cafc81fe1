//! Reduce through the node's publication slots up a tree ([`super::tree`],
//! rooted at rank 0 whatever the reduce's root): a rank combines its input
//! with its children's partial results, in rank order, in its own slot and
//! publishes that for its parent. Rank 0 ends with the result; a root
//! other than 0 copies it out of rank 0's slot (one more hop, so that the
//! inputs are combined in rank order with the ranges the tree keeps).

use crate::error::Result;
use crate::fastpath::tree::Node;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let me = f.rank();
    let input = io.input_at(0, len)?;
    let node = Node::of(me, f.size());
    if me == 0 && io.root == 0 {
        let acc = io.recv_at(0, len)?;
        // SAFETY: `acc` is our receive buffer, disjoint from every slot.
        return unsafe { total(f, io, &node, input, acc, len) };
    }
    // SAFETY: `input` was checked; the slot is ours, disjoint from it and
    // from the children's slots.
    unsafe { partial(f, io, &node, input, len, node.parent.into_iter())? };
    if me == io.root {
        let src = f.data_of(0, len)?;
        let acc = io.recv_at(0, len)?;
        // SAFETY: rank 0's publication holds `len` bytes (checked); our
        // input is in our slot already, so in place it may be overwritten.
        unsafe { copy(src, acc, len) };
    }
    Ok(())
}

/// The top of the tree (rank 0): `acc = input op p(c1) op p(c2) ...`,
/// straight into `acc` (nobody reads rank 0's partial), then its arrival.
///
/// # Safety
/// `input` readable for `len` bytes; `acc` writable for `len` bytes,
/// disjoint from every slot, and equal to `input` or disjoint from it.
pub(crate) unsafe fn total(
    f: &mut FastCall,
    io: &FastIo,
    node: &Node,
    input: *const u8,
    acc: *mut u8,
    len: usize,
) -> Result<()> {
    // SAFETY: the caller's contract (in place `copy` does nothing).
    unsafe {
        copy(input, acc, len);
        combine_kids(f, io, node, acc, len)?;
    }
    f.arrive_lazy()
}

/// Publishes `input` combined with `node`'s children's partial results (in
/// rank order) in this rank's slot for this call, waking `wake`; returns
/// where it lies.
///
/// # Safety
/// `input` readable for `len` bytes, outside this rank's slots.
pub(crate) unsafe fn partial(
    f: &mut FastCall,
    io: &FastIo,
    node: &Node,
    input: *const u8,
    len: usize,
    wake: impl Iterator<Item = usize>,
) -> Result<*const u8> {
    if node.is_leaf() {
        // SAFETY: the caller's contract.
        return unsafe { f.publish_copy_waking(input, len, wake) };
    }
    let slot = f.claim_data(len)?;
    // SAFETY: the slot holds `len` bytes and is ours; the caller's
    // contract for `input`; the children's slots are theirs.
    unsafe {
        copy(input, slot, len);
        combine_kids(f, io, node, slot, len)?;
    }
    f.publish_waking(wake);
    Ok(slot)
}

/// `acc = acc op p(c1) op p(c2) ...` over `node`'s children's
/// publications of this call.
///
/// # Safety
/// `acc` writable for `len` bytes and disjoint from every other rank's
/// slots.
unsafe fn combine_kids(
    f: &mut FastCall,
    io: &FastIo,
    node: &Node,
    acc: *mut u8,
    len: usize,
) -> Result<()> {
    for c in node.kids() {
        let src = f.data_of(c, len)?;
        // SAFETY: the child's publication holds `len` bytes (checked) and
        // stays until we publish this call; the caller's contract.
        unsafe { io.reduce(acc, src, len) };
    }
    Ok(())
}
