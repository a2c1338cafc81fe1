//! Allreduce through the node's publication slots in two calls of the
//! sequence: a reduce up the tree ([`super::tree`], rooted at rank 0; see
//! [`super::reduce_tree`]), then a broadcast of rank 0's result down the
//! same tree. Every rank gets rank 0's bits. A rank reads at most
//! `ARITY` + 1 lines per phase and wakes only the ranks that wait for
//! its publication, where the flat form has every rank read every input.

use crate::error::Result;
use crate::fastpath::reduce_tree::{partial, total};
use crate::fastpath::tree::Node;
use crate::fastpath::{copy, FastCall, FastIo};

pub(crate) fn run(f: &mut FastCall, io: &FastIo) -> Result<()> {
    let len = io.count * io.esize;
    let input = io.input_at(0, len)?;
    let acc = io.recv_at(0, len)?;
    let node = Node::of(f.rank(), f.size());
    match node.parent {
        None => {
            // SAFETY: `input` was checked; `acc` is our receive buffer,
            // disjoint from every slot.
            unsafe { total(f, io, &node, input, acc, len)? };
            f.next_call();
        }
        Some(p) => {
            // SAFETY: `input` was checked and lies outside our slots.
            unsafe { partial(f, io, &node, input, len, std::iter::once(p))? };
            f.next_call();
            let src = f.data_of(p, len)?;
            // SAFETY: the parent's publication holds `len` bytes (checked);
            // `acc` is our receive buffer, disjoint from every slot.
            unsafe { copy(src, acc, len) };
        }
    }
    if node.is_leaf() {
        return f.arrive_lazy();
    }
    // SAFETY: `acc` holds the `len` result bytes, outside our slots.
    unsafe { f.publish_copy_waking(acc, len, node.kids())? };
    Ok(())
}
