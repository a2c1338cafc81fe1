//! Publication slots: the area behind shared-memory fast paths.
//!
//! Successive operations are numbered 1, 2, 3, ...; for operation `k`
//! every local rank owns one *line*, entry `k % SLOT_LINES` of its ring of
//! [`SLOT_LINES`] cache lines: the number of the operation (stored last,
//! with Release; readers poll it with Acquire), the data's length, and up
//! to [`SLOT_INLINE`] bytes of data in the same line. Larger data goes to
//! buffer `k % SLOT_BUFFERS` of the rank's [`SLOT_BUFFERS`] big buffers of
//! `cap` bytes each. A small publication thus travels as one line, and the
//! lines of successive operations are adjacent, as in a message ring.
//!
//! Reuse rule (kept by the user of the slots, not checked here): the owner
//! may write its line for operation `k` once every reader has published a
//! number of at least `k - SLOT_LINES + 1`, and its big buffer once every
//! reader has published at least `k - SLOT_BUFFERS + 1`, because a rank
//! publishes `j` only after it finished reading everything of the
//! operations before `j`. The depth lets a rank that only writes (a
//! broadcast root) run ahead of its readers instead of waiting for them.
//!
//! Besides, every rank owns one *mark* line: the number of the last
//! operation it did not run through the slots (with a word saying how it
//! ran it), overwritten at every such operation. Writing it needs no
//! reuse rule, since nobody reads anything but the header: a rank that
//! runs operations elsewhere (as messages) says so without waiting for
//! its readers, and its mark counts as its arrival at that operation.
//!
//! The mark line's third word is the rank's *wait word*: while it has
//! blocked for a while waiting for another rank's line of an operation, the
//! operation's number and that rank ([`SlotArea::wait_word`]), so that a
//! rank can follow who waits for whom and find a cycle (ranks that each
//! wait for the other to publish first disagree on the operation).
//!
//! ```text
//! rank r, line of k:        base + r * LINES_BYTES + (k % SLOT_LINES) * 64
//!   +0   seq  (u64, Release/Acquire)
//!   +8   len  (u64)
//!   +16  data (len <= SLOT_INLINE)
//! rank r, big buffer of k:  base + ranks * LINES_BYTES
//!                                + (SLOT_BUFFERS r + k % SLOT_BUFFERS) * stride
//! rank r, mark:             base + ranks * (LINES_BYTES + SLOT_BUFFERS stride)
//!                                + r * MARK_BYTES
//!   +0   seq, +8 len (as a line's header), +16 wait word (u64)
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, ShmError};
use crate::layout::{CACHE_LINE, FALSE_SHARING_STRIDE};
use crate::node::NodeSegment;

/// Bytes before the inline data of a line.
pub const SLOT_HEADER: usize = 16;

/// Data bytes that fit in a line.
pub const SLOT_INLINE: usize = CACHE_LINE - SLOT_HEADER;

/// Lines per rank.
pub const SLOT_LINES: usize = 64;

/// Big buffers per rank.
pub const SLOT_BUFFERS: usize = 8;

const LINES_BYTES: usize = SLOT_LINES * CACHE_LINE;

/// Each rank's mark line, alone in its false-sharing stride (the adjacent
/// line prefetcher pulls pairs).
const MARK_BYTES: usize = FALSE_SHARING_STRIDE;
const _: () = assert!(MARK_BYTES >= 24);

/// The header of one line.
#[repr(C)]
pub struct SlotHeader {
    seq: AtomicU64,
    len: AtomicU64,
}

impl SlotHeader {
    /// The operation whose data the line holds (0: none yet).
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

/// What [`SlotArea::new`] found, kept by a caller that makes the area on
/// every call (a fast-path collective: the checks cost more than the
/// collective's own arithmetic).
#[derive(Clone, Copy)]
pub struct SlotLayout {
    base: *mut u8,
    ranks: usize,
    cap: usize,
    stride: usize,
    /// Bytes of extra area the slots take ([`SlotArea::bytes_needed`]).
    need: usize,
}

impl SlotLayout {
    /// The area this layout was taken from, when `node`'s extra area starts
    /// where it did and is as long as the slots need (anything else gives
    /// `None`): every offset `new` checked then lies inside it.
    #[inline]
    pub fn area<'a>(&self, node: &'a NodeSegment) -> Option<SlotArea<'a>> {
        let l = node.layout();
        (node.extra_ptr() == self.base
            && l.extra_len() >= self.need
            && l.params().local_size == self.ranks)
            .then_some(SlotArea {
                base: self.base,
                ranks: self.ranks,
                cap: self.cap,
                stride: self.stride,
                _seg: std::marker::PhantomData,
            })
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
        cap.max(1).next_multiple_of(FALSE_SHARING_STRIDE)
    }

    /// Bytes the slots of `ranks` ranks with `cap` data bytes per big
    /// buffer need (the `extra_bytes` to ask the layout for).
    pub fn bytes_needed(ranks: usize, cap: usize) -> usize {
        ranks * (LINES_BYTES + SLOT_BUFFERS * Self::stride(cap) + MARK_BYTES)
    }

    /// The slots in `node`'s extra area, which must have been laid out with
    /// at least [`bytes_needed`](Self::bytes_needed)`(local_size, cap)`.
    #[inline]
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

    /// The area's layout, to make it again for the same segment without
    /// redoing the checks of [`new`](Self::new) ([`SlotLayout::area`]).
    pub fn layout(&self) -> SlotLayout {
        SlotLayout {
            base: self.base,
            ranks: self.ranks,
            cap: self.cap,
            stride: self.stride,
            need: Self::bytes_needed(self.ranks, self.cap),
        }
    }

    /// Data bytes one publication may hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap.max(SLOT_INLINE)
    }

    #[inline]
    fn line(&self, rank: usize, seq: u64) -> *mut u8 {
        assert!(
            rank < self.ranks,
            "slot of local rank {rank} of {}",
            self.ranks
        );
        let off = rank * LINES_BYTES + (seq % SLOT_LINES as u64) as usize * CACHE_LINE;
        // SAFETY: `new` checked that the lines of every rank fit in the
        // extra area, and `off` lies within rank `rank`'s.
        unsafe { self.base.add(off) }
    }

    /// Owner only: asks the CPU to fetch, for writing, the line of its own
    /// operation `seq` ahead of time. The line was last read by the other
    /// ranks `SLOT_LINES` operations ago, so each publication would otherwise
    /// stall on taking it back from their caches (one cross-core transfer
    /// per call, which bounds a root that streams small calls). A hint
    /// only: nothing is read or written.
    #[inline]
    pub fn prefetch_for_write(&self, rank: usize, seq: u64) {
        let _p = self.line(rank, seq);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHW has no architectural effect (CPUs without it
        // execute it as a NOP); the address lies in the mapping (see `line`).
        unsafe {
            std::arch::asm!("prefetchw [{0}]", in(reg) _p, options(nostack, preserves_flags, readonly));
        }
    }

    /// Header of the line local rank `rank` uses for operation `seq`.
    #[inline]
    pub fn header(&self, rank: usize, seq: u64) -> &'a SlotHeader {
        // SAFETY: the line is 64-byte aligned (the extra area starts on a
        // page) inside the mapping, which lives for 'a; the area is zeroed
        // at creation, and a `SlotHeader` is two atomics, valid for any
        // bits and shared access.
        unsafe { &*(self.line(rank, seq) as *const SlotHeader) }
    }

    /// The mark line of local rank `rank`: the last operation it ran
    /// without the slots, and how (module doc). Only the owner publishes.
    #[inline]
    pub fn mark(&self, rank: usize) -> &'a SlotHeader {
        assert!(
            rank < self.ranks,
            "mark of local rank {rank} of {}",
            self.ranks
        );
        let off = self.ranks * (LINES_BYTES + SLOT_BUFFERS * self.stride) + rank * MARK_BYTES;
        // SAFETY: `new` checked that the marks of every rank follow the big
        // buffers inside the extra area; the offset is a multiple of the
        // cache line from a page-aligned start; a `SlotHeader` is two
        // atomics, valid for any bits and shared access.
        unsafe { &*(self.base.add(off) as *const SlotHeader) }
    }

    /// The wait word of local rank `rank` (module doc): 0, or the
    /// operation it waits in times 2^16 plus one plus the local rank it
    /// waits for. Only the owner writes it.
    #[inline]
    pub fn wait_word(&self, rank: usize) -> &'a AtomicU64 {
        let m = self.mark(rank) as *const SlotHeader as *const u8;
        // SAFETY: the mark line is MARK_BYTES >= 24 bytes long (the header
        // is 16), 8-byte aligned; an AtomicU64 is valid for any bits and
        // shared access, and the mapping lives for 'a.
        unsafe { &*(m.add(std::mem::size_of::<SlotHeader>()) as *const AtomicU64) }
    }

    /// Where local rank `rank` puts `len` bytes of operation `seq`: its
    /// line (up to [`SLOT_INLINE`] bytes, 16-byte aligned) or its big
    /// buffer (up to `cap` bytes, 128-byte aligned). Only the owner
    /// writes, and only under the reuse rule of the module doc.
    #[inline]
    pub fn data(&self, rank: usize, seq: u64, len: usize) -> *mut u8 {
        if len <= SLOT_INLINE {
            // SAFETY: the inline data follows the header in the same line.
            return unsafe { self.line(rank, seq).add(SLOT_HEADER) };
        }
        let i = SLOT_BUFFERS * rank + (seq % SLOT_BUFFERS as u64) as usize;
        // SAFETY: `new` checked that the big buffers of every rank follow
        // the lines inside the extra area, and `i` is below their count.
        unsafe { self.base.add(self.ranks * LINES_BYTES + i * self.stride) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::NodeLayout;

    #[test]
    fn lines_and_buffers_do_not_overlap() {
        let cap = 100;
        let layout = NodeLayout::new(3, 4096, SlotArea::bytes_needed(3, cap)).unwrap();
        let name = format!("ibcoll-test-slots-{}", std::process::id());
        let node = NodeSegment::create(&name, layout).unwrap();
        node.unlink().unwrap();
        let s = SlotArea::new(&node, cap).unwrap();
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for r in 0..3 {
            for k in 1..=SLOT_LINES as u64 {
                spans.push((s.header(r, k) as *const _ as usize, CACHE_LINE));
            }
            for k in 1..=SLOT_BUFFERS as u64 {
                spans.push((s.data(r, k, cap) as usize, cap));
            }
        }
        for r in 0..3 {
            spans.push((s.mark(r) as *const _ as usize, CACHE_LINE));
        }
        spans.sort();
        let end = s.mark(2) as *const _ as usize + MARK_BYTES;
        assert!(end <= node.extra_ptr() as usize + SlotArea::bytes_needed(3, cap));
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?}");
        }
        let (l, b) = (SLOT_LINES as u64, SLOT_BUFFERS as u64);
        assert_eq!(s.data(1, 1 + b, cap), s.data(1, 1, cap));
        assert_eq!(s.data(1, 1 + l, 8), s.data(1, 1, 8));
        assert_eq!(
            s.data(1, 1, 8) as usize,
            s.header(1, 1) as *const _ as usize + SLOT_HEADER
        );
        assert_eq!(s.header(2, 4).seq(), 0);
        // SAFETY: the buffer has `cap` bytes and no reader exists.
        unsafe { std::ptr::write_bytes(s.data(2, 4, cap), 7, cap) };
        s.header(2, 4).publish(4, cap);
        assert_eq!(
            (s.header(2, 4 + l).seq(), s.header(2, 4 + l).len()),
            (4, cap)
        );
        assert_eq!(s.header(2, 5).seq(), 0);
        assert!(SlotArea::new(&node, 1 << 20).is_err());
    }
}
