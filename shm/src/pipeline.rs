//! Pipelined copy through the segment, for large messages when CMA is
//! denied: a single-producer/single-consumer byte stream over a few
//! fixed-size slots, so the sender fills one slot while the receiver drains
//! another (two copies, overlapped).
//!
//! # Region
//! ```text
//! +0           slot s's flag at s * 128: 0 = empty, else
//!              FULL | receiver tag << 32 | length
//! +data_off    slot s's bytes at data_off + s * chunk   (data_off page aligned)
//! ```
//! A flag owns its 128 bytes, so the two sides' flag writes do not share
//! lines. Slots are used round robin; each side keeps its own position.
//!
//! The stream has no message boundaries: the engine announces the length
//! (rendezvous header through the ring) and the receiver asks for exactly
//! that many bytes, so consecutive messages may share a slot.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, ShmError};
use crate::layout::{CACHE_LINE, FALSE_SHARING_STRIDE, PAGE};

const FULL: u64 = 1 << 63;
const MAX_SLOTS: usize = 1024;

fn data_off(slots: usize) -> usize {
    (slots * FALSE_SHARING_STRIDE).div_ceil(PAGE) * PAGE
}

/// Bytes of shared memory a pipe of `slots` slots of `chunk` bytes needs;
/// fails unless `1 <= slots <= 1024` and `chunk` is a positive multiple of
/// 64 below 4 GiB.
pub fn region_len(slots: usize, chunk: usize) -> Result<usize> {
    if !(1..=MAX_SLOTS).contains(&slots)
        || chunk == 0
        || chunk % CACHE_LINE != 0
        || chunk > u32::MAX as usize
    {
        return Err(ShmError::Invalid(format!(
            "pipe of {slots} slots x {chunk} bytes: need 1..={MAX_SLOTS} slots of a positive multiple of {CACHE_LINE} bytes"
        )));
    }
    slots
        .checked_mul(chunk)
        .and_then(|d| d.checked_add(data_off(slots)))
        .ok_or_else(|| ShmError::Invalid(format!("pipe of {slots} x {chunk} bytes overflows")))
}

#[derive(Debug)]
struct Raw {
    base: *mut u8,
    slots: usize,
    chunk: usize,
}

impl Raw {
    /// # Safety
    /// As for [`PipeSender::new`].
    unsafe fn new(base: *mut u8, slots: usize, chunk: usize) -> Result<Raw> {
        region_len(slots, chunk)?;
        if base.is_null() || base as usize % FALSE_SHARING_STRIDE != 0 {
            return Err(ShmError::Invalid(format!(
                "pipe base {base:p} is not {FALSE_SHARING_STRIDE}-byte aligned"
            )));
        }
        Ok(Raw { base, slots, chunk })
    }

    fn flag(&self, slot: usize) -> &AtomicU64 {
        debug_assert!(slot < self.slots);
        // SAFETY: the flag lies in the region (slot < slots), is 8-aligned,
        // stays mapped per the constructor's contract, and is only ever
        // accessed atomically.
        unsafe { &*(self.base.add(slot * FALSE_SHARING_STRIDE) as *const AtomicU64) }
    }

    fn data(&self, slot: usize) -> *mut u8 {
        // SAFETY: slot < slots, so the slot's bytes lie in the region.
        unsafe { self.base.add(data_off(self.slots) + slot * self.chunk) }
    }
}

/// Writing end of a pipe. Exactly one may exist per pipe at a time.
#[derive(Debug)]
pub struct PipeSender {
    raw: Raw,
    next: usize,
}

// SAFETY: the handle owns the sending role of a region that stays valid;
// which thread holds it does not matter.
unsafe impl Send for PipeSender {}

impl PipeSender {
    /// Attaches the sending end of the pipe at `base`.
    ///
    /// # Safety
    /// - `base..base + region_len(slots, chunk)` is mapped read-write,
    ///   128-byte aligned and stays mapped for the life of the handle;
    /// - the region is zero-filled (or every slot has been drained);
    /// - at most one sender and one receiver, with the same `slots` and
    ///   `chunk`, use it at a time, across processes.
    pub unsafe fn new(base: *mut u8, slots: usize, chunk: usize) -> Result<PipeSender> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, slots, chunk)? };
        Ok(PipeSender { raw, next: 0 })
    }

    /// Bytes per slot.
    pub fn chunk(&self) -> usize {
        self.raw.chunk
    }

    /// Copies a prefix of `src` into free slots and returns its length (0
    /// when every slot is still full). Call again with the rest.
    pub fn try_send(&mut self, src: &[u8]) -> usize {
        self.try_send_tagged(src, 0)
    }

    /// [`try_send`](Self::try_send) with every slot marked for the
    /// receiver `tag` (below 2^31): a pipe that serves several receivers
    /// in turn, each reading only its own slots.
    pub fn try_send_tagged(&mut self, src: &[u8], tag: u32) -> usize {
        debug_assert!(u64::from(tag) < 1 << 31);
        let mut sent = 0;
        while sent < src.len() {
            let flag = self.raw.flag(self.next);
            if flag.load(Ordering::Acquire) != 0 {
                break;
            }
            let n = (src.len() - sent).min(self.raw.chunk);
            // SAFETY: the empty flag, acquired, means the receiver has
            // finished reading this slot and will not touch it until the
            // Release below; `n <= chunk` bytes fit in it.
            unsafe {
                ptr::copy_nonoverlapping(src.as_ptr().add(sent), self.raw.data(self.next), n)
            };
            flag.store(FULL | u64::from(tag) << 32 | n as u64, Ordering::Release);
            sent += n;
            self.next = (self.next + 1) % self.raw.slots;
        }
        sent
    }

    /// True if `try_send` would take at least one byte now.
    pub fn can_send(&self) -> bool {
        self.raw.flag(self.next).load(Ordering::Acquire) == 0
    }

    /// True when the receiver has drained everything sent so far.
    pub fn is_drained(&self) -> bool {
        (0..self.raw.slots).all(|s| self.raw.flag(s).load(Ordering::Acquire) == 0)
    }

    /// The slot the next byte goes to (a new receiver starts reading
    /// there).
    pub fn position(&self) -> usize {
        self.next
    }

    /// Empties every slot: only once the receiver that was reading is gone
    /// (nobody else reads them), so the pipe can serve another.
    pub fn reset(&mut self) {
        for s in 0..self.raw.slots {
            self.raw.flag(s).store(0, Ordering::Release);
        }
    }
}

/// Reading end of a pipe. Exactly one may exist per pipe at a time.
#[derive(Debug)]
pub struct PipeReceiver {
    raw: Raw,
    next: usize,
    /// Bytes of slot `next` already handed out.
    off: usize,
}

// SAFETY: as for `PipeSender`.
unsafe impl Send for PipeReceiver {}

impl PipeReceiver {
    /// Attaches the reading end of the pipe at `base`.
    ///
    /// # Safety
    /// Same contract as [`PipeSender::new`].
    pub unsafe fn new(base: *mut u8, slots: usize, chunk: usize) -> Result<PipeReceiver> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, slots, chunk)? };
        Ok(PipeReceiver {
            raw,
            next: 0,
            off: 0,
        })
    }

    /// Starts reading at slot `slot` (mod the slot count): where the
    /// sender's stream to this receiver begins, when the pipe served
    /// another receiver before.
    pub fn restart_at(&mut self, slot: usize) {
        self.next = slot % self.raw.slots;
        self.off = 0;
    }

    /// The slot read next and the bytes of it already handed out.
    pub fn position(&self) -> (usize, usize) {
        (self.next, self.off)
    }

    /// True if at least one byte can be received now.
    pub fn is_ready(&self) -> bool {
        self.raw.flag(self.next).load(Ordering::Acquire) != 0
    }

    /// Fills a prefix of `dst` from full slots and returns its length (0 if
    /// none is full). Slots are released as soon as they are drained.
    pub fn try_recv(&mut self, dst: &mut [u8]) -> usize {
        self.try_recv_tagged(dst, 0)
    }

    /// [`try_recv`](Self::try_recv) of the slots marked `tag` only: a slot
    /// marked for another receiver reads as empty.
    pub fn try_recv_tagged(&mut self, dst: &mut [u8], tag: u32) -> usize {
        let mut got = 0;
        while got < dst.len() {
            let flag = self.raw.flag(self.next);
            let f = flag.load(Ordering::Acquire);
            if f == 0 || (f & !FULL) >> 32 != u64::from(tag) {
                break;
            }
            let len = (f & 0xffff_ffff) as usize;
            let n = (len - self.off).min(dst.len() - got);
            // SAFETY: the full flag, acquired, publishes `len` bytes that the
            // sender will not touch until we store 0; off + n <= len.
            unsafe {
                ptr::copy_nonoverlapping(
                    self.raw.data(self.next).add(self.off),
                    dst.as_mut_ptr().add(got),
                    n,
                )
            };
            got += n;
            self.off += n;
            if self.off == len {
                flag.store(0, Ordering::Release);
                self.off = 0;
                self.next = (self.next + 1) % self.raw.slots;
            }
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(slots: usize, chunk: usize) -> Vec<u128> {
        vec![0u128; region_len(slots, chunk).unwrap() / 16 + 8]
    }

    fn ends(mem: &mut [u128], slots: usize, chunk: usize) -> (PipeSender, PipeReceiver) {
        let p = mem.as_mut_ptr() as *mut u8;
        let base = p.wrapping_add(p.align_offset(128));
        // SAFETY: `mem` is zeroed, has 128 spare bytes for alignment and
        // outlives both ends in each test.
        unsafe {
            (
                PipeSender::new(base, slots, chunk).unwrap(),
                PipeReceiver::new(base, slots, chunk).unwrap(),
            )
        }
    }

    #[test]
    fn streams_across_slots_and_partial_reads() {
        let mut mem = region(2, 128);
        let (mut tx, mut rx) = ends(&mut mem, 2, 128);
        let src: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let (mut sent, mut got) = (0, 0);
        assert!(!rx.is_ready());
        while got < dst.len() {
            sent += tx.try_send(&src[sent..]);
            // Odd read sizes exercise partly drained slots.
            let end = (got + 77).min(dst.len());
            got += rx.try_recv(&mut dst[got..end]);
        }
        assert_eq!(src, dst);
        assert!(tx.is_drained());
    }

    #[test]
    fn full_pipe_takes_nothing() {
        let mut mem = region(2, 64);
        let (mut tx, _rx) = ends(&mut mem, 2, 64);
        assert_eq!(tx.try_send(&[1; 500]), 128);
        assert_eq!(tx.try_send(&[1; 500]), 0);
        assert!(!tx.is_drained());
    }

    #[test]
    fn rejects_bad_geometry() {
        assert!(region_len(0, 64).is_err());
        assert!(region_len(2, 100).is_err());
        assert_eq!(region_len(2, 4096).unwrap(), PAGE + 2 * 4096);
    }
}
