//! Publication slots: the area behind shared-memory fast paths.
//!
//! Every local rank owns [`SLOT_BUFFERS`] buffers, used in turn by
//! successive operations numbered 1, 2, 3, ... (operation `k` uses buffer
//! `k % SLOT_BUFFERS`).
//! Each buffer is a header — the number of the operation whose data it
//! holds, and that data's length — followed by up to `cap` bytes of data.
//! The owner writes the data and length, then stores the sequence number
//! with Release; readers poll it with Acquire, so data and length are
//! visible once the number is. The data starts 16 bytes into the header's
//! cache line, so a small publication travels as one line.
//!
//! Reuse rule (kept by the user of the slots, not checked here): the owner
//! may overwrite its buffer for operation `k` once every reader has
//! published a number of at least `k - SLOT_BUFFERS + 1`, because a rank
//! publishes `j` only after it finished reading everything of the
//! operations before `j`. More than two buffers let a rank that only
//! writes (a broadcast root) run ahead of its readers for a few calls
//! instead of waiting for each of them every call.
//!
//! ```text
//! rank r, buffer b:  base + (SLOT_BUFFERS r + b) * stride
//!   +0   seq  (u64, Release/Acquire)
//!   +8   len  (u64)
//!   +16  data (cap bytes)
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, ShmError};
use crate::layout::FALSE_SHARING_STRIDE;
use crate::node::NodeSegment;

/// Bytes before the data of each buffer.
pub const SLOT_HEADER: usize = 16;

/// Buffers per rank.
pub const SLOT_BUFFERS: usize = 8;

/// The header of one buffer.
#[repr(C)]
pub struct SlotHeader {
    seq: AtomicU64,
    len: AtomicU64,
}

impl SlotHeader {
    /// The operation whose data the buffer holds (0: none yet).
    #[inline]
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// The published length (read after [`seq`](Self::seq) showed the
    /// operation).
    #[inline]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed) as usize
    }

    /// Whether the published length is zero.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Owner only: publishes `len` bytes (already written) as operation
    /// `seq`.
    #[inline]
    pub fn publish(&self, seq: u64, len: usize) {
        self.len.store(len as u64, Ordering::Relaxed);
        self.seq.store(seq, Ordering::Release);
    }
}

/// The slots of one node, viewed through its segment.
#[derive(Clone, Copy)]
pub struct SlotArea<'a> {
    base: *mut u8,
    ranks: usize,
    cap: usize,
    stride: usize,
    _seg: std::marker::PhantomData<&'a NodeSegment>,
}

impl<'a> SlotArea<'a> {
    fn stride(cap: usize) -> usize {
        (SLOT_HEADER + cap).next_multiple_of(FALSE_SHARING_STRIDE)
    }

    /// Bytes the slots of `ranks` ranks with `cap` data bytes per buffer
    /// need (the `extra_bytes` to ask the layout for).
    pub fn bytes_needed(ranks: usize, cap: usize) -> usize {
        ranks * SLOT_BUFFERS * Self::stride(cap)
    }

    /// The slots in `node`'s extra area, which must have been laid out with
    /// at least [`bytes_needed`](Self::bytes_needed)`(local_size, cap)`.
    pub fn new(node: &'a NodeSegment, cap: usize) -> Result<SlotArea<'a>> {
        let ranks = node.layout().params().local_size;
        let need = Self::bytes_needed(ranks, cap);
        if node.layout().extra_len() < need {
            return Err(ShmError::Invalid(format!(
                "the segment's extra area has {} bytes, {need} needed for {ranks} slots of {cap}",
                node.layout().extra_len()
            )));
        }
        Ok(SlotArea {
            base: node.extra_ptr(),
            ranks,
            cap,
            stride: Self::stride(cap),
            _seg: std::marker::PhantomData,
        })
    }

    /// Data bytes per buffer.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    #[inline]
    fn buf(&self, rank: usize, seq: u64) -> *mut u8 {
        assert!(
            rank < self.ranks,
            "slot of local rank {rank} of {}",
            self.ranks
        );
        let i = SLOT_BUFFERS * rank + (seq % SLOT_BUFFERS as u64) as usize;
        // SAFETY: `new` checked that SLOT_BUFFERS * ranks buffers of
        // `stride` bytes fit in the extra area, and `i` is below that.
        unsafe { self.base.add(i * self.stride) }
    }

    /// Header of the buffer local rank `rank` uses for operation `seq`.
    #[inline]
    pub fn header(&self, rank: usize, seq: u64) -> &'a SlotHeader {
        // SAFETY: the buffer starts 128-byte aligned (the extra area starts
        // on a page, the stride is a multiple of 128) inside the mapping,
        // which lives for 'a; the area is zeroed at creation, and a
        // `SlotHeader` is two atomics, valid for any bits and shared access.
        unsafe { &*(self.buf(rank, seq) as *const SlotHeader) }
    }

    /// Data of the buffer local rank `rank` uses for operation `seq`
    /// ([`capacity`](Self::capacity) bytes, 16-byte aligned). Only the
    /// owner writes it, and only under the reuse rule of the module doc.
    #[inline]
    pub fn data(&self, rank: usize, seq: u64) -> *mut u8 {
        // SAFETY: the data follows the header inside the same buffer.
        unsafe { self.buf(rank, seq).add(SLOT_HEADER) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::NodeLayout;

    #[test]
    fn buffers_alternate_and_do_not_overlap() {
        let cap = 100;
        let layout = NodeLayout::new(3, 4096, SlotArea::bytes_needed(3, cap)).unwrap();
        let name = format!("ibcoll-test-slots-{}", std::process::id());
        let node = NodeSegment::create(&name, layout).unwrap();
        node.unlink().unwrap();
        let s = SlotArea::new(&node, cap).unwrap();
        let mut starts: Vec<usize> = (0..3)
            .flat_map(|r| (1..=SLOT_BUFFERS as u64).map(move |k| s.data(r, k) as usize))
            .collect();
        starts.sort();
        for w in starts.windows(2) {
            assert!(w[1] - w[0] >= SLOT_HEADER + cap);
        }
        let b = SLOT_BUFFERS as u64;
        assert_eq!(s.data(1, 1 + b), s.data(1, 1));
        assert_eq!(s.header(2, 4).seq(), 0);
        // SAFETY: the buffer has `cap` bytes and no reader exists.
        unsafe { std::ptr::write_bytes(s.data(2, 4), 7, cap) };
        s.header(2, 4).publish(4, cap);
        assert_eq!(
            (s.header(2, 4 + b).seq(), s.header(2, 4 + b).len()),
            (4, cap)
        );
        assert_eq!(s.header(2, 5).seq(), 0);
        assert!(SlotArea::new(&node, 1 << 20).is_err());
    }
}
