//! Lock-free single-producer/single-consumer ring of variable-size records
//! in shared memory.
//!
//! # Region
//! ```text
//! +0     producer line: head (cells ever published)   written by producer
//! +128   consumer line: tail (cells ever released)    written by consumer
//! +256   data: `capacity / 64` cells of 64 bytes
//! ```
//! The two indices sit 128 bytes apart so neither the line nor its
//! prefetch buddy is shared.
//!
//! # Record
//! A record occupies `ceil((8 + len) / 64)` consecutive cells and never
//! wraps (a padding record fills the end of the ring instead):
//! ```text
//! cell k:   [ header u64 | payload bytes 0..56 ]
//! cell k+1: [ payload bytes 56..120 ]  ...
//! header = len (bits 0..32) | kind (bits 32..40) | low 24 bits of k (bits 40..64)
//! ```
//! The header is the ready flag and shares its cache line with the first
//! 56 payload bytes, so a consumer polling the header pulls in a whole
//! small message (a 32-byte engine header plus 24 bytes of data) with one
//! line transfer. The consumer polls the header at its own position and
//! never reads the producer's index; the producer caches the consumer's
//! index and reads it only when the cached value says the ring is full.
//! (The producer's published `head` is only read by a re-created handle.)
//!
//! # Why stale cells are never mistaken for headers
//! Records have different sizes on each lap, so the cell where the next
//! header will go may hold old payload bytes. Before publishing a record at
//! cells `k..k+n`, the producer makes sure the header word of cell `k+n` is
//! zero (hence it needs `n + 1` free cells). The consumer acquires the
//! header of `k` before it reads `k+n`, so it sees that zero or the later
//! header, never older bytes. Fresh (ftruncated) segment memory is all
//! zero, which is an empty ring.
//!
//! (Zeroing a few cells ahead *after* each publish, to keep that store off
//! the publishing path, measured no better on a two-core AMD EPYC VM:
//! 44 vs 38 ns half round trip when both vCPUs share a cache complex,
//! 213 vs 220 ns when they do not.)

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cells::{self, Cells, CELL};
use crate::error::Result;
use crate::layout::FALSE_SHARING_STRIDE;

/// Smallest ring capacity accepted.
pub const MIN_CAPACITY: usize = 1024;

/// Largest ring capacity accepted (record lengths are 32-bit).
pub const MAX_CAPACITY: usize = 1 << 31;

/// Payload bytes that share a cache line with the record header.
pub const INLINE_BYTES: usize = CELL - HEADER;

const HEADER: usize = 8;
const HEAD_OFF: usize = 0;
const TAIL_OFF: usize = FALSE_SHARING_STRIDE;
const DATA_OFF: usize = 2 * FALSE_SHARING_STRIDE;

const KIND_DATA: u64 = 1;
const KIND_PAD: u64 = 2;

/// Bytes of shared memory a ring of `capacity` data bytes needs.
pub fn region_len(capacity: usize) -> usize {
    DATA_OFF + capacity
}

/// Checks that `capacity` is a power of two in
/// [`MIN_CAPACITY`]`..=`[`MAX_CAPACITY`].
pub fn check_capacity(capacity: usize) -> Result<()> {
    cells::check_capacity(capacity, MIN_CAPACITY, MAX_CAPACITY, "ring")
}

/// Largest payload a ring of `capacity` bytes takes in one record: half the
/// cells minus the header, so a record always fits once the ring drains,
/// whatever padding the wrap needs.
pub fn max_record_for(capacity: usize) -> usize {
    capacity / 2 - HEADER
}

fn cells_for(len: usize) -> u64 {
    (HEADER + len).div_ceil(CELL) as u64
}

fn encode(kind: u64, len: u64, pos: u64) -> u64 {
    len | (kind << 32) | ((pos & 0xff_ffff) << 40)
}

fn kind_of(h: u64) -> u64 {
    (h >> 32) & 0xff
}

fn len_of(h: u64) -> u64 {
    h & 0xffff_ffff
}

/// Raw view of one ring region, shared by both handles.
#[derive(Debug)]
struct Raw {
    c: Cells,
}

impl Raw {
    /// # Safety
    /// As for [`RingProducer::new`].
    unsafe fn new(base: *mut u8, capacity: usize) -> Result<Raw> {
        // SAFETY: forwarded contract.
        let c = unsafe {
            Cells::new(
                base,
                region_len(capacity),
                capacity,
                MIN_CAPACITY,
                MAX_CAPACITY,
                "ring",
            )?
        };
        Ok(Raw { c })
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        self.c.word(off)
    }

    fn head(&self) -> &AtomicU64 {
        self.word(HEAD_OFF)
    }

    fn tail(&self) -> &AtomicU64 {
        self.word(TAIL_OFF)
    }

    fn cell_ptr(&self, pos: u64) -> *mut u8 {
        self.c.at(DATA_OFF + self.c.index(pos) * CELL)
    }

    fn header(&self, pos: u64) -> &AtomicU64 {
        self.word(DATA_OFF + self.c.index(pos) * CELL)
    }
}

/// The sending side of a ring. Exactly one may exist per ring at a time.
#[derive(Debug)]
pub struct RingProducer {
    raw: Raw,
    head: u64,
    cached_tail: u64,
}

// SAFETY: the handle owns the producer role of a region that stays valid and
// is only reached through atomics or cells the protocol gives it exclusively;
// moving it to another thread changes none of that.
unsafe impl Send for RingProducer {}

impl RingProducer {
    /// Attaches the producer side of the ring at `base`.
    ///
    /// Resumes from the indices stored in the region, so a freshly zeroed
    /// region is an empty ring and a handle may be dropped and re-created.
    ///
    /// # Safety
    /// - `base..base + region_len(capacity)` is mapped read-write, 64-byte
    ///   aligned, and stays mapped for the life of the handle;
    /// - the region is zero-filled or was last used by a ring of the same
    ///   capacity;
    /// - at most one `RingProducer` and one `RingConsumer` use the region at
    ///   a time, across all processes, and nothing else writes to it.
    pub unsafe fn new(base: *mut u8, capacity: usize) -> Result<RingProducer> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, capacity)? };
        let head = raw.head().load(Ordering::Relaxed);
        let cached_tail = raw.tail().load(Ordering::Acquire);
        Ok(RingProducer {
            raw,
            head,
            cached_tail,
        })
    }

    /// Largest total length `try_push` accepts.
    pub fn max_record(&self) -> usize {
        max_record_for(self.raw.c.capacity())
    }

    /// True if a record of `len` bytes would fit now (never, above
    /// [`max_record`](Self::max_record)). Reads the consumer's index when
    /// the cached one says no, so it suits a sleeper's re-check.
    pub fn can_push(&mut self, len: usize) -> bool {
        let (n, pad) = self.placement(len);
        len <= self.max_record() && self.has_room(pad + n + 1)
    }

    /// Cells of a `len`-byte record at the head, and of the padding it
    /// needs first so that it does not wrap.
    #[inline]
    fn placement(&self, len: usize) -> (u64, u64) {
        let n = cells_for(len);
        let to_end = self.raw.c.to_end(self.head);
        (n, if n > to_end { to_end } else { 0 })
    }

    /// True if `need` cells past the head are free, refreshing the cached
    /// consumer index only when it says they are not.
    #[inline]
    fn has_room(&mut self, need: u64) -> bool {
        if self.head + need <= self.cached_tail + self.raw.c.cells {
            return true;
        }
        self.cached_tail = self.raw.tail().load(Ordering::Acquire);
        self.head + need <= self.cached_tail + self.raw.c.cells
    }

    /// Writes the concatenation of `parts` as one record. Returns false,
    /// writing nothing, if the ring has no room now.
    ///
    /// No allocation, no syscall; the consumer's index is read only when the
    /// cached copy says the ring may be full.
    ///
    /// # Panics
    /// If the total length exceeds [`max_record`](Self::max_record): such a
    /// record could never fit, and retrying on `false` would spin forever.
    #[inline]
    pub fn try_push(&mut self, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(
            len <= self.max_record(),
            "record of {len} bytes exceeds ring max_record {}",
            self.max_record()
        );
        let (n, pad) = self.placement(len);
        // The extra cell is the one whose header gets zeroed.
        if !self.has_room(pad + n + 1) {
            return false;
        }
        if pad > 0 {
            self.raw.header(self.head + pad).store(0, Ordering::Relaxed);
            self.raw
                .header(self.head)
                .store(encode(KIND_PAD, pad, self.head), Ordering::Release);
            self.head += pad;
        }
        // Zero the next header before writing this record: stores commit in
        // order (x86), and that line may need a transfer from the consumer
        // (it read it a lap ago); between this record's payload and header
        // stores it would leave a window in which the consumer, polling
        // this record's line, takes the line back and the header store
        // needs a second transfer.
        self.raw.header(self.head + n).store(0, Ordering::Relaxed);
        let mut dst = self.raw.cell_ptr(self.head).wrapping_add(HEADER);
        for p in parts {
            // SAFETY: the record's cells are free (the space check above,
            // with the consumer's Release of `tail` acquired) and contiguous
            // (padding keeps records from wrapping), and `len` bytes fit in
            // them; the consumer does not read them before the header below
            // is published.
            unsafe {
                ptr::copy_nonoverlapping(p.as_ptr(), dst, p.len());
                dst = dst.add(p.len());
            }
        }
        self.raw
            .header(self.head)
            .store(encode(KIND_DATA, len as u64, self.head), Ordering::Release);
        self.head += n;
        // Only a re-created handle reads this, so no ordering is needed.
        self.raw.head().store(self.head, Ordering::Relaxed);
        true
    }
}

/// The receiving side of a ring. Exactly one may exist per ring at a time.
#[derive(Debug)]
pub struct RingConsumer {
    raw: Raw,
    tail: u64,
}

// SAFETY: as for `RingProducer`: the role, not the thread, owns the region.
unsafe impl Send for RingConsumer {}

impl RingConsumer {
    /// Attaches the consumer side of the ring at `base`.
    ///
    /// # Safety
    /// Same contract as [`RingProducer::new`].
    pub unsafe fn new(base: *mut u8, capacity: usize) -> Result<RingConsumer> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, capacity)? };
        let tail = raw.tail().load(Ordering::Relaxed);
        Ok(RingConsumer { raw, tail })
    }

    /// Largest record the producer may send.
    pub fn max_record(&self) -> usize {
        max_record_for(self.raw.c.capacity())
    }

    /// True if no record is ready. One load of the line the next record
    /// will arrive in.
    #[inline]
    pub fn is_empty(&self) -> bool {
        let h = self.raw.header(self.tail).load(Ordering::Acquire);
        if kind_of(h) == KIND_PAD {
            return self
                .raw
                .header(self.tail + len_of(h))
                .load(Ordering::Acquire)
                == 0;
        }
        h == 0
    }

    /// False if certainly no record is ready: one load of the header
    /// word at the consumer's position (a padding record reads as maybe).
    #[inline(always)]
    pub fn maybe_ready(&self) -> bool {
        self.raw.header(self.tail).load(Ordering::Acquire) != 0
    }

    /// The oldest unconsumed record, if one is ready. It stays in the ring
    /// until [`RecordRef::consume`] or [`pop`](Self::pop).
    #[inline]
    pub fn peek(&mut self) -> Option<RecordRef<'_>> {
        let mut h = self.raw.header(self.tail).load(Ordering::Acquire);
        if kind_of(h) == KIND_PAD {
            debug_assert_eq!(h >> 40, self.tail & 0xff_ffff, "corrupt ring");
            self.release(len_of(h));
            h = self.raw.header(self.tail).load(Ordering::Acquire);
        }
        if h == 0 {
            return None;
        }
        debug_assert_eq!(kind_of(h), KIND_DATA, "corrupt ring header {h:#x}");
        debug_assert_eq!(h >> 40, self.tail & 0xff_ffff, "corrupt ring");
        let len = len_of(h) as usize;
        let data = self.raw.cell_ptr(self.tail).wrapping_add(HEADER);
        Some(RecordRef {
            consumer: self,
            data,
            len,
        })
    }

    /// Releases the oldest record, if one is ready; returns whether one was.
    pub fn pop(&mut self) -> bool {
        match self.peek() {
            Some(r) => {
                r.consume();
                true
            }
            None => false,
        }
    }

    fn release(&mut self, cells: u64) {
        self.tail += cells;
        // Release: our reads of the released cells happen before the
        // producer's Acquire of `tail` lets it overwrite them.
        self.raw.tail().store(self.tail, Ordering::Release);
    }
}

/// A ready record, borrowed from the ring until consumed or dropped.
#[derive(Debug)]
pub struct RecordRef<'a> {
    consumer: &'a mut RingConsumer,
    data: *const u8,
    len: usize,
}

impl RecordRef<'_> {
    /// The record's bytes (contiguous; records never wrap).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the header that published these `len` bytes was acquired
        // in `peek`, and the producer cannot reuse the cells until `tail`
        // moves past them, which needs `&mut` access to the consumer that
        // this borrow holds.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// Releases the record's cells to the producer.
    #[inline]
    pub fn consume(self) {
        let cells = cells_for(self.len);
        self.consumer.release(cells);
    }
}

impl std::ops::Deref for RecordRef<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeroed, 128-byte aligned memory standing in for a segment.
    struct Region(Vec<u128>);

    impl Region {
        fn new(capacity: usize) -> Region {
            Region(vec![0u128; region_len(capacity).div_ceil(16) + 8])
        }
        fn base(&mut self) -> *mut u8 {
            let p = self.0.as_mut_ptr() as *mut u8;
            p.wrapping_add(p.align_offset(128))
        }
    }

    fn pair(r: &mut Region, cap: usize) -> (RingProducer, RingConsumer) {
        let base = r.base();
        // SAFETY: `r` is zeroed, aligned, long enough and outlives the
        // handles in every test; one handle per side.
        unsafe {
            (
                RingProducer::new(base, cap).unwrap(),
                RingConsumer::new(base, cap).unwrap(),
            )
        }
    }

    #[test]
    fn header_and_payload_share_the_first_line() {
        let mut r = Region::new(1024);
        let (mut p, mut c) = pair(&mut r, 1024);
        assert!(c.is_empty());
        assert!(p.try_push(&[&[1u8; 32], &7u64.to_le_bytes()]));
        assert!(!c.is_empty());
        let rec = c.peek().unwrap();
        assert_eq!(rec.len(), 40);
        assert_eq!(rec.as_ptr() as usize % CELL, HEADER);
        assert_eq!(&rec[32..], &7u64.to_le_bytes());
        rec.consume();
        assert!(c.is_empty());
        assert!(c.peek().is_none());
    }

    #[test]
    fn fills_up_then_accepts_after_drain() {
        let mut r = Region::new(1024);
        let (mut p, mut c) = pair(&mut r, 1024);
        let mut pushed = 0;
        while p.try_push(&[&[pushed as u8; 56]]) {
            pushed += 1;
        }
        // One cell per record, one cell kept for the zeroed next header.
        assert_eq!(pushed, 1024 / CELL - 1);
        assert!(!p.can_push(0));
        assert!(!p.can_push(p.max_record() + 1));
        for i in 0..pushed {
            let rec = c.peek().unwrap();
            assert!(rec.iter().all(|&b| b == i as u8));
            rec.consume();
            assert!(p.can_push(56));
        }
        assert!(p.can_push(p.max_record()));
        assert!(p.try_push(&[&vec![9; p.max_record()]]));
        assert_eq!(c.peek().unwrap().len(), max_record_for(1024));
    }

    #[test]
    fn wraps_with_padding_and_variable_sizes() {
        let mut r = Region::new(1024);
        let (mut p, mut c) = pair(&mut r, 1024);
        let mut next_out = 0u32;
        for i in 0u32..5000 {
            let len = (i as usize * 37) % (p.max_record() + 1);
            let payload: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
            while !p.try_push(&[&payload]) {
                let rec = c.peek().expect("full ring must have a record");
                check(&rec, next_out);
                rec.consume();
                next_out += 1;
            }
        }
        while let Some(rec) = c.peek() {
            check(&rec, next_out);
            rec.consume();
            next_out += 1;
        }
        assert_eq!(next_out, 5000);

        fn check(rec: &[u8], i: u32) {
            assert_eq!(rec.len(), (i as usize * 37) % (max_record_for(1024) + 1));
            for (j, &b) in rec.iter().enumerate() {
                assert_eq!(b, (i as usize + j) as u8, "record {i} byte {j}");
            }
        }
    }

    #[test]
    fn handles_resume_from_shared_indices() {
        let mut r = Region::new(4096);
        let (mut p, mut c) = pair(&mut r, 4096);
        for i in 0..10u8 {
            assert!(p.try_push(&[&[i; 100]]));
        }
        for _ in 0..4 {
            assert!(c.pop());
        }
        // Replace both handles, as an engine re-creating a channel would.
        let (mut p, mut c) = {
            let _old = (p, c);
            pair(&mut r, 4096)
        };
        assert!(p.try_push(&[&[10; 100]]));
        for i in 4..11u8 {
            let rec = c.peek().unwrap();
            assert_eq!(rec[0], i);
            rec.consume();
        }
        assert!(!c.pop());
    }

    #[test]
    #[should_panic(expected = "exceeds ring max_record")]
    fn oversize_record_panics() {
        let mut r = Region::new(1024);
        let (mut p, _c) = pair(&mut r, 1024);
        let big = vec![0u8; p.max_record() + 1];
        p.try_push(&[&big]);
    }

    #[test]
    fn rejects_bad_capacity_and_alignment() {
        let mut r = Region::new(4096);
        let base = r.base();
        // SAFETY: the constructors fail before touching memory.
        unsafe {
            assert!(RingProducer::new(base, 1000).is_err());
            assert!(RingProducer::new(base.add(8), 1024).is_err());
        }
    }
}
