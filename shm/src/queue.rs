//! Lock-free multi-producer/single-consumer queue of variable-size records
//! in shared memory: the one receive queue of a local rank, which every
//! other rank of the node may write.
//!
//! # Region
//! ```text
//! +0       reserve line: cells ever reserved     CAS by producers
//! +128     release line: cells ever released     written by the consumer
//! +256     headers: one u64 per cell
//! +256+c/8 data: `c / 64` cells of 64 bytes (c = capacity)
//! ```
//!
//! # Record
//! A record occupies `max(1, ceil(len / 64))` consecutive cells and never
//! wraps (a padding record fills the end of the ring instead); its header
//! is the header word of its first cell:
//! ```text
//! header = len (bits 0..32) | kind (bits 32..40) | producer (bits 40..64)
//! ```
//! Headers live apart from the data (unlike the fast box, whose records
//! are small and want header and payload in one line): the queue carries
//! the larger records, and the consumer then writes one word per record
//! instead of a word in every line it read.
//! A producer reserves its cells with one compare-and-swap on the reserve
//! index (checked against the release index it last read), writes the
//! payload, then stores the header with Release. The consumer polls the
//! header at its own position, so records are taken in reservation order;
//! a producer that reserved but has not yet published holds up the records
//! behind it (for as long as it takes to copy its payload).
//!
//! # Why stale words are never mistaken for headers
//! Only a record's first cell gets a header word, and the consumer zeroes
//! it before it releases the record; fresh segment memory is zero. So
//! every header word of a released cell is zero, which reads as "not yet
//! published", wherever the next lap's records fall.
//!
//! # A producer that dies between reservation and header
//! Before its compare-and-swap a producer writes what it is about to
//! reserve (queue, position, cells) into its own [`Intent`] line; the CAS
//! (Release) makes that visible before the reservation. A consumer whose
//! head record stays unpublished ([`QueueConsumer::stalled`]) can then
//! look for the reserver ([`QueueConsumer::skip_dead`]): a live producer
//! whose intent covers the head will publish (or has lost its CAS and will
//! retry), so it waits; if only dead ones cover it, it skips the cells of
//! the reservation and the records behind it flow again. The dead
//! producer's records published before are delivered; the one it was
//! writing is lost with it.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cells::{self, Cells, CELL};
use crate::error::{Result, ShmError};
use crate::layout::FALSE_SHARING_STRIDE;

/// Smallest queue capacity accepted.
pub const MIN_CAPACITY: usize = 4096;

/// Largest queue capacity accepted (record lengths are 32-bit).
pub const MAX_CAPACITY: usize = 1 << 31;

/// Largest producer id a header can carry.
pub const MAX_PRODUCER: usize = (1 << 24) - 1;

const RESERVE_OFF: usize = 0;
const RELEASE_OFF: usize = FALSE_SHARING_STRIDE;
const HEADERS_OFF: usize = 2 * FALSE_SHARING_STRIDE;

const KIND_DATA: u64 = 1;

/// Bytes of one producer's [`Intent`] line.
pub const INTENT_BYTES: usize = FALSE_SHARING_STRIDE;

/// A producer's last reservation attempt, in a line of its own that only it
/// writes: queue (its consumer's id), first cell, number of cells.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct Intent {
    /// First cell + 1 (0: never reserved).
    pos: AtomicU64,
    /// Queue id (bits 32..64), cells (bits 0..32).
    what: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Intent>() == INTENT_BYTES);

impl Intent {
    /// The line at `ptr`.
    ///
    /// # Safety
    /// `ptr` is 128-byte aligned, points at [`INTENT_BYTES`] bytes that
    /// stay mapped for `'a` and are only accessed through `Intent`.
    pub unsafe fn from_ptr<'a>(ptr: *mut u8) -> &'a Intent {
        // SAFETY: the caller guarantees alignment, size and lifetime; both
        // fields are atomics, valid for any bits.
        unsafe { &*(ptr as *const Intent) }
    }

    #[inline]
    fn set(&self, queue: u32, pos: u64, cells: u64) {
        self.what
            .store(u64::from(queue) << 32 | cells, Ordering::Relaxed);
        self.pos.store(pos + 1, Ordering::Relaxed);
    }

    /// (queue, first cell, cells) of the last attempt, if any; `None` too
    /// when the producer was changing it while we read (then it is alive).
    pub fn get(&self) -> Option<(u32, u64, u64)> {
        let w = self.what.load(Ordering::Acquire);
        let p = self.pos.load(Ordering::Acquire);
        if p == 0 || self.what.load(Ordering::Acquire) != w {
            return None;
        }
        Some(((w >> 32) as u32, p - 1, w & 0xffff_ffff))
    }
}
const KIND_PAD: u64 = 2;

/// Bytes of shared memory a queue of `capacity` data bytes needs.
pub fn region_len(capacity: usize) -> usize {
    HEADERS_OFF + capacity / 8 + capacity
}

/// Checks that `capacity` is a power of two in
/// [`MIN_CAPACITY`]`..=`[`MAX_CAPACITY`].
pub fn check_capacity(capacity: usize) -> Result<()> {
    cells::check_capacity(capacity, MIN_CAPACITY, MAX_CAPACITY, "queue")
}

/// Largest payload a queue of `capacity` bytes takes in one record: half
/// the cells, so a record always fits once the queue drains, whatever
/// padding the wrap needs.
pub fn max_record_for(capacity: usize) -> usize {
    capacity / 2
}

fn cells_for(len: usize) -> u64 {
    len.div_ceil(CELL).max(1) as u64
}

fn encode(kind: u64, len: u64, src: u64) -> u64 {
    len | (kind << 32) | (src << 40)
}

#[derive(Debug)]
struct Raw {
    c: Cells,
}

impl Raw {
    /// # Safety
    /// As for [`QueueProducer::new`].
    unsafe fn new(base: *mut u8, capacity: usize) -> Result<Raw> {
        // SAFETY: forwarded contract.
        let c = unsafe {
            Cells::new(
                base,
                region_len(capacity),
                capacity,
                MIN_CAPACITY,
                MAX_CAPACITY,
                "queue",
            )?
        };
        Ok(Raw { c })
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        self.c.word(off)
    }

    fn reserve(&self) -> &AtomicU64 {
        self.word(RESERVE_OFF)
    }

    fn released(&self) -> &AtomicU64 {
        self.word(RELEASE_OFF)
    }

    fn cell_ptr(&self, pos: u64) -> *mut u8 {
        let data_off = HEADERS_OFF + self.c.cells as usize * 8;
        self.c.at(data_off + self.c.index(pos) * CELL)
    }

    fn header(&self, pos: u64) -> &AtomicU64 {
        self.word(HEADERS_OFF + self.c.index(pos) * 8)
    }

    fn max_record(&self) -> usize {
        max_record_for(self.c.capacity())
    }
}

/// One producer's handle on a queue. Any number may exist at a time, each
/// with its own producer id.
#[derive(Debug)]
pub struct QueueProducer {
    raw: Raw,
    src: u64,
    cached_released: u64,
    /// This producer's intent line and the queue's id in it.
    intent: Option<(*const Intent, u32)>,
    /// Test hook: die (SIGKILL) between reserving and publishing this
    /// many-th record (0: never).
    die_at: u64,
    pushes: u64,
}

// SAFETY: the handle only reaches the region through atomics and through
// cells its own reservation gives it exclusively.
unsafe impl Send for QueueProducer {}

impl QueueProducer {
    /// Attaches producer `src` to the queue at `base`.
    ///
    /// # Safety
    /// - `base..base + region_len(capacity)` is mapped read-write, 64-byte
    ///   aligned, and stays mapped for the life of the handle;
    /// - the region is zero-filled or was last used by a queue of the same
    ///   capacity;
    /// - at most one [`QueueConsumer`] uses it at a time, and nothing but
    ///   these handles writes to it.
    pub unsafe fn new(base: *mut u8, capacity: usize, src: usize) -> Result<QueueProducer> {
        if src > MAX_PRODUCER {
            return Err(ShmError::Invalid(format!(
                "queue producer id {src} above {MAX_PRODUCER}"
            )));
        }
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, capacity)? };
        let cached_released = raw.released().load(Ordering::Acquire);
        Ok(QueueProducer {
            raw,
            src: src as u64,
            cached_released,
            intent: None,
            die_at: 0,
            pushes: 0,
        })
    }

    /// Announces every reservation in `intent` first, under queue id
    /// `queue`, so that a consumer can skip it should this process die
    /// before publishing.
    ///
    /// # Safety
    /// `intent` stays mapped for the life of the handle, and only this
    /// producer's handles write to it.
    pub unsafe fn announce_in(&mut self, intent: &Intent, queue: u32) {
        self.intent = Some((intent as *const Intent, queue));
    }

    /// Test hook: the process kills itself (SIGKILL) after reserving the
    /// cells of its `n`-th record and copying its payload, before the
    /// header (0: never).
    pub fn die_mid_publish_at(&mut self, n: u64) {
        self.die_at = n;
    }

    /// Largest total length `try_push` accepts.
    pub fn max_record(&self) -> usize {
        self.raw.max_record()
    }

    /// Cells the consumer has released so far (Acquire).
    #[inline]
    pub fn released(&mut self) -> u64 {
        self.cached_released = self.raw.released().load(Ordering::Acquire);
        self.cached_released
    }

    /// True if a record of `len` bytes would fit now.
    pub fn can_push(&mut self, len: usize) -> bool {
        if len > self.max_record() {
            return false;
        }
        let t = self.raw.reserve().load(Ordering::Relaxed);
        let total = self.placement(t, len).0;
        t + total <= self.released() + self.raw.c.cells
    }

    /// Cells to reserve at `t` for `len` bytes, and the padding among them.
    #[inline]
    fn placement(&self, t: u64, len: usize) -> (u64, u64) {
        let n = cells_for(len);
        let to_end = self.raw.c.to_end(t);
        let pad = if n > to_end { to_end } else { 0 };
        (pad + n, pad)
    }

    /// Writes the concatenation of `parts` as one record; returns the
    /// queue position just past it (compare with
    /// [`released`](Self::released) to learn that the consumer is done
    /// with it), or `None`, writing nothing, if the queue has no room now.
    ///
    /// # Panics
    /// If the total length exceeds [`max_record`](Self::max_record).
    #[inline]
    pub fn try_push(&mut self, parts: &[&[u8]]) -> Option<u64> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(
            len <= self.max_record(),
            "record of {len} bytes exceeds queue max_record {}",
            self.max_record()
        );
        let mut t = self.raw.reserve().load(Ordering::Relaxed);
        let (total, pad) = loop {
            let (total, pad) = self.placement(t, len);
            if t + total > self.cached_released + self.raw.c.cells
                && t + total > self.released() + self.raw.c.cells
            {
                return None;
            }
            if let Some((i, queue)) = self.intent {
                // SAFETY: `announce_in`'s contract keeps the line mapped.
                unsafe { &*i }.set(queue, t, total);
            }
            // Release: the intent is visible before the reservation.
            match self.raw.reserve().compare_exchange_weak(
                t,
                t + total,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break (total, pad),
                Err(now) => t = now,
            }
        };
        if pad > 0 {
            self.raw
                .header(t)
                .store(encode(KIND_PAD, pad, self.src), Ordering::Release);
        }
        let pos = t + pad;
        let mut dst = self.raw.cell_ptr(pos);
        for p in parts {
            // SAFETY: the reservation gives this handle the cells
            // `pos..t + total` alone (they were released by the consumer,
            // whose Release of the index was acquired above), they are
            // contiguous (padding keeps records from wrapping) and hold
            // `len` bytes; the consumer reads them only after the header.
            unsafe {
                ptr::copy_nonoverlapping(p.as_ptr(), dst, p.len());
                dst = dst.add(p.len());
            }
        }
        self.pushes += 1;
        if self.pushes == self.die_at {
            // SAFETY: getpid and kill have no preconditions; SIGKILL ends
            // the process here, reservation made, header not written.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        self.raw
            .header(pos)
            .store(encode(KIND_DATA, len as u64, self.src), Ordering::Release);
        Some(t + total)
    }
}

/// The consuming side of a queue. Exactly one may exist per queue.
#[derive(Debug)]
pub struct QueueConsumer {
    raw: Raw,
    head: u64,
}

// SAFETY: as for `QueueProducer`: the role, not the thread, owns the region.
unsafe impl Send for QueueConsumer {}

impl QueueConsumer {
    /// Attaches the consumer side of the queue at `base`.
    ///
    /// # Safety
    /// Same contract as [`QueueProducer::new`]; only one consumer.
    pub unsafe fn new(base: *mut u8, capacity: usize) -> Result<QueueConsumer> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, capacity)? };
        let head = raw.released().load(Ordering::Relaxed);
        Ok(QueueConsumer { raw, head })
    }

    /// Largest record a producer may send.
    pub fn max_record(&self) -> usize {
        self.raw.max_record()
    }

    /// False if certainly no record is ready: one load of the header word
    /// at the consumer's position.
    #[inline(always)]
    pub fn maybe_ready(&self) -> bool {
        self.raw.header(self.head).load(Ordering::Acquire) != 0
    }

    /// The oldest unconsumed record, if it is published. It stays in the
    /// queue until [`QueueRecord::consume`].
    #[inline]
    pub fn peek(&mut self) -> Option<QueueRecord<'_>> {
        let mut h = self.raw.header(self.head).load(Ordering::Acquire);
        if (h >> 32) & 0xff == KIND_PAD {
            self.raw.header(self.head).store(0, Ordering::Relaxed);
            self.release(h & 0xffff_ffff);
            h = self.raw.header(self.head).load(Ordering::Acquire);
        }
        if h == 0 {
            return None;
        }
        debug_assert_eq!((h >> 32) & 0xff, KIND_DATA, "corrupt queue header {h:#x}");
        let len = (h & 0xffff_ffff) as usize;
        let data = self.raw.cell_ptr(self.head);
        Some(QueueRecord {
            consumer: self,
            data,
            len,
            src: (h >> 40) as usize,
        })
    }

    /// The head position while its record is reserved but not published
    /// (its header still zero although the reserve index is past it).
    pub fn stalled(&self) -> Option<u64> {
        let h = self.raw.header(self.head).load(Ordering::Acquire);
        (h == 0 && self.raw.reserve().load(Ordering::Acquire) > self.head).then_some(self.head)
    }

    /// Skips the record at a stalled head if every producer whose intent
    /// (`intents` yields each producer's [`Intent::get`] under queue id
    /// `queue`, and whether it is alive) covers the head is dead: its cells
    /// are released, so the records behind it are taken again. Returns the
    /// cells skipped (0: not stalled, or a live producer may still
    /// publish).
    pub fn skip_dead(
        &mut self,
        queue: u32,
        intents: impl Iterator<Item = (Option<(u32, u64, u64)>, bool)>,
    ) -> u64 {
        let Some(head) = self.stalled() else { return 0 };
        let mut end: Option<u64> = None;
        for (intent, alive) in intents {
            // Unreadable (being changed): a producer that reserved the head
            // does not write its intent again before publishing.
            let Some((q, pos, cells)) = intent else {
                continue;
            };
            if q != queue || pos > head || head >= pos + cells {
                continue;
            }
            if alive {
                return 0;
            }
            // Two dead producers may name the same start (one lost its
            // CAS): the shorter reservation skips nobody else's record.
            end = Some(end.map_or(pos + cells, |e| e.min(pos + cells)));
        }
        let Some(end) = end else { return 0 };
        // The header at the head is zero (stalled); the dead producer never
        // wrote another (only a record's first cell has one).
        self.release(end - head);
        end - head
    }

    fn release(&mut self, cells: u64) {
        self.head += cells;
        // Release: our reads of the cells, and the zeroing of their
        // header, happen before a producer's Acquire of the index lets it
        // reserve them again.
        self.raw.released().store(self.head, Ordering::Release);
    }
}

/// A published record, borrowed from the queue until consumed or dropped.
#[derive(Debug)]
pub struct QueueRecord<'a> {
    consumer: &'a mut QueueConsumer,
    data: *const u8,
    len: usize,
    src: usize,
}

impl QueueRecord<'_> {
    /// The producer id that wrote the record.
    #[inline]
    pub fn src(&self) -> usize {
        self.src
    }

    /// The record's bytes (contiguous; records never wrap).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the header that published these `len` bytes was acquired
        // in `peek`, and no producer can reserve the cells until the
        // release index moves past them, which needs `&mut` access to the
        // consumer that this borrow holds.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// Releases the record's cells to the producers, zeroing its header
    /// first (see the module docs).
    #[inline]
    pub fn consume(self) {
        let cells = cells_for(self.len);
        let head = self.consumer.head;
        self.consumer.raw.header(head).store(0, Ordering::Relaxed);
        self.consumer.release(cells);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Region(Vec<u128>);

    impl Region {
        fn new(capacity: usize) -> Region {
            Region(vec![0u128; region_len(capacity) / 16 + 8])
        }
        fn base(&mut self) -> *mut u8 {
            let p = self.0.as_mut_ptr() as *mut u8;
            p.wrapping_add(p.align_offset(128))
        }
    }

    #[test]
    fn records_keep_order_and_source_across_wraps() {
        let cap = 4096;
        let mut r = Region::new(cap);
        let base = r.base();
        // SAFETY: zeroed aligned memory that outlives the handles.
        let (mut a, mut b, mut c) = unsafe {
            (
                QueueProducer::new(base, cap, 3).unwrap(),
                QueueProducer::new(base, cap, 7).unwrap(),
                QueueConsumer::new(base, cap).unwrap(),
            )
        };
        let mut expect = std::collections::VecDeque::new();
        for i in 0..2000usize {
            let len = (i * 37) % 700;
            let body: Vec<u8> = (0..len).map(|k| (k + i) as u8).collect();
            let p = if i % 3 == 0 { &mut a } else { &mut b };
            while p.try_push(&[&body]).is_none() {
                let rec = c.peek().expect("full queue has a record");
                let (src, want): (usize, Vec<u8>) = expect.pop_front().unwrap();
                assert_eq!(rec.src(), src);
                assert_eq!(rec.bytes(), &want[..]);
                rec.consume();
            }
            expect.push_back((if i % 3 == 0 { 3 } else { 7 }, body));
        }
        while let Some(rec) = c.peek() {
            let (src, want) = expect.pop_front().unwrap();
            assert_eq!((rec.src(), rec.bytes()), (src, &want[..]));
            rec.consume();
        }
        assert!(expect.is_empty());
    }

    #[test]
    fn full_queue_takes_nothing_and_reports_release() {
        let cap = 4096;
        let mut r = Region::new(cap);
        let base = r.base();
        // SAFETY: as above.
        let (mut p, mut c) = unsafe {
            (
                QueueProducer::new(base, cap, 1).unwrap(),
                QueueConsumer::new(base, cap).unwrap(),
            )
        };
        let big = vec![9u8; p.max_record()];
        let end = p.try_push(&[&big]).unwrap();
        assert!(p.try_push(&[&big]).is_none() || p.try_push(&[&[1u8; 1000]]).is_none());
        assert!(p.released() < end);
        while let Some(rec) = c.peek() {
            rec.consume();
        }
        assert!(p.released() >= end);
    }

    #[test]
    fn a_dead_producers_unpublished_reservation_is_skipped_not_a_live_ones() {
        let cap = 4096;
        let mut r = Region::new(cap);
        let base = r.base();
        let lines: Vec<u128> = vec![0; 3 * INTENT_BYTES / 16 + 8];
        let lp = lines.as_ptr() as *mut u8;
        let lp = lp.wrapping_add(lp.align_offset(128));
        // SAFETY: aligned zeroed lines and region that outlive the handles.
        let (i1, i2) = unsafe {
            (
                Intent::from_ptr(lp),
                Intent::from_ptr(lp.wrapping_add(INTENT_BYTES)),
            )
        };
        // SAFETY: as above.
        let (mut a, mut b, mut c) = unsafe {
            let mut a = QueueProducer::new(base, cap, 1).unwrap();
            a.announce_in(i1, 9);
            let mut b = QueueProducer::new(base, cap, 2).unwrap();
            b.announce_in(i2, 9);
            (a, b, QueueConsumer::new(base, cap).unwrap())
        };
        assert!(a.try_push(&[b"first"]).is_some());
        // Producer 1 reserves three cells and dies before its header.
        let t = a.raw.reserve().load(Ordering::Relaxed);
        i1.set(9, t, 3);
        a.raw.reserve().store(t + 3, Ordering::Release);
        assert!(b.try_push(&[b"behind it"]).is_some());
        let rec = c.peek().unwrap();
        assert_eq!((rec.src(), rec.bytes()), (1, &b"first"[..]));
        rec.consume();
        assert!(c.peek().is_none());
        assert_eq!(c.stalled(), Some(t));
        let look = |alive1| [(i1.get(), alive1), (i2.get(), true)].into_iter();
        // Alive: it may still publish. Another queue's id: not ours.
        assert_eq!(c.skip_dead(9, look(true)), 0);
        assert_eq!(c.skip_dead(8, look(false)), 0);
        assert_eq!(c.skip_dead(9, look(false)), 3);
        let rec = c.peek().unwrap();
        assert_eq!((rec.src(), rec.bytes()), (2, &b"behind it"[..]));
        rec.consume();
        assert_eq!(c.stalled(), None);
        assert_eq!(c.skip_dead(9, look(false)), 0);
        // The queue goes on over the skipped cells.
        for i in 0..200u32 {
            let body = i.to_le_bytes();
            assert!(b.try_push(&[&body, &[7u8; 100]]).is_some());
            let rec = c.peek().unwrap();
            assert_eq!(&rec.bytes()[..4], &body);
            rec.consume();
        }
    }

    #[test]
    fn threads_push_concurrently() {
        let cap = 8192;
        let mut r = Region::new(cap);
        let base = r.base() as usize;
        let per = 5000u32;
        let threads: Vec<_> = (0..3)
            .map(|id| {
                std::thread::spawn(move || {
                    // SAFETY: the region outlives the threads (joined below).
                    let mut p = unsafe { QueueProducer::new(base as *mut u8, cap, id).unwrap() };
                    for i in 0..per {
                        let n = (i % 50) as usize;
                        let mut body = vec![(i % 256) as u8; n + 4];
                        body[..4].copy_from_slice(&i.to_le_bytes());
                        while p.try_push(&[&body]).is_none() {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        // SAFETY: single consumer on the region.
        let mut c = unsafe { QueueConsumer::new(base as *mut u8, cap).unwrap() };
        let mut next = [0u32; 3];
        let mut left = 3 * per;
        while left > 0 {
            if let Some(rec) = c.peek() {
                let s = rec.src();
                let b = rec.bytes();
                let i = u32::from_le_bytes(b[..4].try_into().unwrap());
                assert_eq!(i, next[s], "order of producer {s}");
                assert_eq!(b.len(), (i % 50) as usize + 4);
                assert!(b[4..].iter().all(|&x| x == (i % 256) as u8));
                next[s] += 1;
                left -= 1;
                rec.consume();
            }
        }
        for t in threads {
            t.join().unwrap();
        }
    }
}
