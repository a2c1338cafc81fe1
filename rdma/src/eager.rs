//! Eager buffers and credit accounting for RC endpoints.
//!
//! Per process (what an engine at scale uses):
//! * [`SrqPool`]: one registered buffer cut into equal slots, posted to a
//!   [`SharedReceiveQueue`] that every RC queue pair of the process takes
//!   its receives from, so receive memory does not grow with the peers.
//! * [`SendSlots`]: registered send buffers shared by every queue pair
//!   (messages too large to inline are copied into one until their send
//!   completes).
//! * [`FlowWords`]: a registered array of 16-byte words, one per
//!   connection, that peers RDMA-write (credit grants, goodbyes) so that
//!   control information never needs a receive buffer.
//!
//! Per connection (simple pairs, the tests): a [`RecvPool`] is one
//! registered buffer cut into equal slots, each posted as a receive of one
//! queue pair. The sender may only send while it holds a credit (one per
//! free slot at the receiver); the receiver returns credits as it reposts
//! slots, piggybacked on its own messages or, past a threshold, in an
//! explicit credit message. [`Credits`] keeps both counts; one credit is
//! reserved for that explicit message so the two sides can never both wait
//! for credits that only the other could return.

use crate::error::{Error, Result};
use crate::verbs::{
    Access, ProtectionDomain, QueuePair, RegisteredBuffer, RemoteBuf, Sge, SharedReceiveQueue,
};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// One registered buffer for `count` slots of `slot_size` bytes rounded
/// up to 64 (the device may write it), and the rounded slot size; `what`
/// names the caller in the error for a geometry that cannot be (no
/// slots, empty or oversized ones, more than `u32::MAX` of them).
fn slot_buffer(
    pd: &Arc<ProtectionDomain>,
    slot_size: usize,
    count: usize,
    what: &'static str,
) -> Result<(RegisteredBuffer, usize)> {
    if count == 0 || count > u32::MAX as usize || slot_size == 0 || slot_size > u32::MAX as usize {
        return Err(Error::invalid(
            what,
            format!("bad geometry {count} x {slot_size}"),
            Some(pd.context().name()),
        ));
    }
    let slot_size = slot_size.div_ceil(64) * 64;
    let buf = RegisteredBuffer::new(pd, slot_size * count, Access::LOCAL_WRITE)?;
    Ok((buf, slot_size))
}

/// Registered receive slots, identified by `wr_id = base + slot`.
#[derive(Debug)]
pub struct RecvPool {
    buf: RegisteredBuffer,
    slot_size: usize,
    count: usize,
    base: u64,
}

impl RecvPool {
    /// `count` slots of `slot_size` bytes (rounded up to 64) whose receive
    /// WRs carry ids `base .. base + count`.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        slot_size: usize,
        count: usize,
        base: u64,
    ) -> Result<RecvPool> {
        let (buf, slot_size) = slot_buffer(pd, slot_size, count, "RecvPool::new")?;
        Ok(RecvPool {
            buf,
            slot_size,
            count,
            base,
        })
    }
    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }
    /// Number of slots.
    pub fn count(&self) -> usize {
        self.count
    }
    /// The slot a completion's `wr_id` refers to, if it is one of ours.
    pub fn slot_of(&self, wr_id: u64) -> Option<usize> {
        let i = wr_id.checked_sub(self.base)?;
        (i < self.count as u64).then_some(i as usize)
    }
    fn sge(&self, slot: usize) -> Sge {
        self.buf
            .sge(slot * self.slot_size, self.slot_size as u32)
            .expect("slot in range")
    }
    /// Post every slot (in batches).
    ///
    /// # Safety
    /// The pool must outlive the receives (keep it alive until the QP is
    /// destroyed or the receives have completed/flushed), and slots must not
    /// be read while posted.
    pub unsafe fn post_all(&self, qp: &QueuePair) -> Result<()> {
        let items: Vec<(u64, Sge)> = (0..self.count)
            .map(|i| (self.base + i as u64, self.sge(i)))
            .collect();
        // SAFETY: forwarded contract; the SGEs lie in our registered buffer.
        unsafe { qp.post_recvs(&items) }
    }
    /// Repost slots whose data has been consumed.
    ///
    /// # Safety
    /// As [`post_all`](Self::post_all); the slots must not be posted already.
    pub unsafe fn repost(&self, qp: &QueuePair, slots: &[usize]) -> Result<()> {
        let items: Vec<(u64, Sge)> = slots
            .iter()
            .map(|&i| (self.base + i as u64, self.sge(i)))
            .collect();
        // SAFETY: forwarded contract.
        unsafe { qp.post_recvs(&items) }
    }
    /// The first `len` bytes received in `slot`. Only meaningful between
    /// polling the slot's completion and reposting it.
    pub fn data(&self, slot: usize, len: usize) -> &[u8] {
        let off = slot * self.slot_size;
        &self.buf.as_slice()[off..off + len.min(self.slot_size)]
    }
}

/// Receive slots of one shared receive queue, identified by
/// `wr_id = base + slot`: the process's eager receive buffers, whatever
/// the number of queue pairs taking receives from it.
#[derive(Debug)]
pub struct SrqPool {
    /// Owns the slots' memory (deregistered after the SRQ is destroyed).
    srq: Arc<SharedReceiveQueue>,
    slot_size: usize,
    count: usize,
    base: u64,
}

impl SrqPool {
    /// A shared receive queue of `count` slots of `slot_size` bytes
    /// (rounded up to 64), whose receive WRs carry ids `base .. base +
    /// count`, every slot posted.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        slot_size: usize,
        count: usize,
        base: u64,
    ) -> Result<SrqPool> {
        let (buf, slot_size) = slot_buffer(pd, slot_size, count, "SrqPool::new")?;
        let srq = SharedReceiveQueue::new(pd, count as u32, Some(buf))?;
        let pool = SrqPool {
            srq,
            slot_size,
            count,
            base,
        };
        let items: Vec<(u64, Sge)> = (0..count).map(|i| pool.item(i)).collect();
        // SAFETY: the SGEs lie in the memory the SRQ owns (registered
        // LOCAL_WRITE with its PD), which lives until after the SRQ is
        // destroyed; the SRQ is new, so no slot is posted twice, and no
        // slot is read until its completion was polled (`data` is unsafe
        // with that contract). Posting here, once, keeps the safe API sound.
        unsafe { pool.srq.post_recvs(&items) }?;
        Ok(pool)
    }

    /// The queue to make queue pairs on.
    pub fn srq(&self) -> &Arc<SharedReceiveQueue> {
        &self.srq
    }
    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }
    /// Number of slots.
    pub fn count(&self) -> usize {
        self.count
    }
    /// Bytes registered for the slots.
    pub fn registered_bytes(&self) -> usize {
        self.srq.mem().map_or(0, |m| m.mr().len())
    }
    /// The slot a receive completion's `wr_id` refers to, if it is one of ours.
    pub fn slot_of(&self, wr_id: u64) -> Option<usize> {
        let i = wr_id.checked_sub(self.base)?;
        (i < self.count as u64).then_some(i as usize)
    }
    fn item(&self, slot: usize) -> (u64, Sge) {
        let mem = self.srq.mem().expect("an SrqPool's SRQ owns its memory");
        let sge = mem
            .sge(slot * self.slot_size, self.slot_size as u32)
            .expect("slot in range");
        (self.base + slot as u64, sge)
    }
    /// Reposts slots whose data has been consumed.
    ///
    /// # Safety
    /// Each slot's receive must have completed (been polled) since it was
    /// last posted, and no slice returned by [`data`](Self::data) for it
    /// may be alive.
    pub unsafe fn repost(&self, slots: &[usize]) -> Result<()> {
        let items: Vec<(u64, Sge)> = slots.iter().map(|&i| self.item(i)).collect();
        // SAFETY: memory as in `new`; the caller guarantees the slots
        // are not posted and not borrowed.
        unsafe { self.srq.post_recvs(&items) }
    }
    /// The first `len` bytes received in `slot`.
    ///
    /// # Safety
    /// The slot's receive completion must have been polled and the slot not
    /// reposted since (else the device may be writing it); the slice must be
    /// dropped before the slot is reposted.
    pub unsafe fn data(&self, slot: usize, len: usize) -> &[u8] {
        let mem = self.srq.mem().expect("an SrqPool's SRQ owns its memory");
        let slot = slot.min(self.count - 1);
        let off = slot * self.slot_size;
        // SAFETY: `off + min(len, slot_size)` lies inside the memory the SRQ
        // owns; the caller guarantees the device does not write the slot
        // while the slice lives.
        unsafe { std::slice::from_raw_parts(mem.as_ptr().add(off), len.min(self.slot_size)) }
    }
}

/// Registered send buffers shared by every queue pair of a process: a
/// message too large to inline is copied into a slot, which its sender
/// holds until the send's (signaled) completion and then gives back.
#[derive(Debug)]
pub struct SendSlots {
    buf: RegisteredBuffer,
    slot_size: usize,
    free: Vec<u32>,
    /// Fewest slots that were free at once.
    low: usize,
}

impl SendSlots {
    /// `count` slots of `slot_size` bytes (rounded up to 64).
    pub fn new(pd: &Arc<ProtectionDomain>, slot_size: usize, count: usize) -> Result<SendSlots> {
        let (buf, slot_size) = slot_buffer(pd, slot_size, count, "SendSlots::new")?;
        Ok(SendSlots {
            buf,
            slot_size,
            free: (0..count as u32).rev().collect(),
            low: count,
        })
    }
    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }
    /// Number of slots.
    pub fn count(&self) -> usize {
        self.buf.len() / self.slot_size
    }
    /// Slots free now.
    pub fn free(&self) -> usize {
        self.free.len()
    }
    /// Fewest slots free at once so far.
    pub fn low_water(&self) -> usize {
        self.low
    }
    /// Bytes registered for the slots.
    pub fn registered_bytes(&self) -> usize {
        self.buf.mr().len()
    }
    /// Takes a free slot.
    pub fn take(&mut self) -> Option<u32> {
        let s = self.free.pop()?;
        self.low = self.low.min(self.free.len());
        Some(s)
    }
    /// Gives a slot back (once the send that used it has completed).
    pub fn give(&mut self, slot: u32) {
        debug_assert!(!self.free.contains(&slot), "slot {slot} given back twice");
        self.free.push(slot);
    }
    /// Writes `parts` one after the other at the start of `slot` and returns
    /// the SGE of the bytes written; `None` (nothing written) when `slot`
    /// is not one of ours or the parts do not fit in a slot.
    pub fn fill(&mut self, slot: u32, parts: &[&[u8]]) -> Option<Sge> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > self.slot_size || slot as usize >= self.buf.len() / self.slot_size {
            return None;
        }
        let base = slot as usize * self.slot_size;
        let dst = &mut self.buf.as_mut_slice()[base..base + total];
        let mut off = 0;
        for p in parts {
            dst[off..off + p.len()].copy_from_slice(p);
            off += p.len();
        }
        self.buf.sge(base, total as u32)
    }
}

/// Words per [`FlowWords`] chunk (one 4 KiB registration).
const WORDS_PER_CHUNK: usize = 256;
/// Bytes of one flow word.
pub const FLOW_WORD_LEN: usize = 16;

/// One registered array of 16-byte words per process, one word per
/// connection, written only by the connection's peer (RDMA writes) and
/// read here:
///
/// ```text
/// 0  granted  u32   credits the peer has granted us so far (cumulative, wrapping)
/// 4  acked    u32   the last credit request of ours the peer has queued
/// 8  bye      u64   non-zero once the peer said goodbye (its cause + flag)
/// ```
///
/// It grows by chunks of 256 words (4 KiB, one registration each) as
/// connections are made, so its memory follows the connections, not the
/// job; a word is handed out again only after its connection's queue pair
/// is gone.
#[derive(Debug)]
pub struct FlowWords {
    pd: Arc<ProtectionDomain>,
    chunks: Vec<RegisteredBuffer>,
    free: Vec<u32>,
    next: u32,
}

impl FlowWords {
    /// An empty array (nothing registered until the first word is taken).
    pub fn new(pd: &Arc<ProtectionDomain>) -> FlowWords {
        FlowWords {
            pd: pd.clone(),
            chunks: Vec::new(),
            free: Vec::new(),
            next: 0,
        }
    }
    /// Takes a zeroed word; registers a new chunk when all are in use.
    pub fn take(&mut self) -> Result<u32> {
        if let Some(w) = self.free.pop() {
            return Ok(w);
        }
        let w = self.next;
        if w as usize / WORDS_PER_CHUNK >= self.chunks.len() {
            self.chunks.push(RegisteredBuffer::new(
                &self.pd,
                WORDS_PER_CHUNK * FLOW_WORD_LEN,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )?);
        }
        self.next += 1;
        Ok(w)
    }
    /// Gives word `w` back, zeroed. Only once no peer can write it any
    /// more (its connection's queue pair is destroyed or in error).
    pub fn give(&mut self, w: u32) {
        let (a, b) = self.cells(w);
        a.store(0, Ordering::Relaxed);
        b.store(0, Ordering::Relaxed);
        self.free.push(w);
    }
    /// Bytes registered for the words.
    pub fn registered_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.mr().len()).sum()
    }
    /// Where the peer writes word `w`.
    pub fn remote(&self, w: u32) -> RemoteBuf {
        let (c, i) = (w as usize / WORDS_PER_CHUNK, w as usize % WORDS_PER_CHUNK);
        self.chunks[c]
            .remote(i * FLOW_WORD_LEN, FLOW_WORD_LEN)
            .expect("word in its chunk")
    }
    fn cells(&self, w: u32) -> (&AtomicU64, &AtomicU64) {
        let (c, i) = (w as usize / WORDS_PER_CHUNK, w as usize % WORDS_PER_CHUNK);
        let p = self.chunks[c].as_ptr();
        // SAFETY: the word lies inside the chunk (i < WORDS_PER_CHUNK), is
        // 16-byte aligned (the chunk is page-aligned), and lives as long as
        // `self`; it is only ever accessed atomically here and by the
        // device's DMA writes, like memory shared with another process.
        unsafe {
            let w = p.add(i * FLOW_WORD_LEN);
            (
                AtomicU64::from_ptr(w.cast::<u64>()),
                AtomicU64::from_ptr(w.add(8).cast::<u64>()),
            )
        }
    }
    /// `(granted, acked)` as the peer last wrote them.
    pub fn grant(&self, w: u32) -> (u32, u32) {
        let (a, _) = self.cells(w);
        // Each half is read on its own (a device write of 8 bytes may be
        // seen half done): both only ever grow, so either value is valid.
        // SAFETY: `a` is 8-byte aligned, so its halves are 4-byte aligned
        // cells of the same memory.
        let (g, k) = unsafe {
            let p = a.as_ptr().cast::<u32>();
            (AtomicU32::from_ptr(p), AtomicU32::from_ptr(p.add(1)))
        };
        (
            u32::from_le(g.load(Ordering::Acquire)),
            u32::from_le(k.load(Ordering::Acquire)),
        )
    }
    /// The peer's goodbye word (0: none yet).
    pub fn bye(&self, w: u32) -> u64 {
        let (_, b) = self.cells(w);
        u64::from_le(b.load(Ordering::Acquire))
    }
}

/// The 8 bytes a peer writes at offset 0 of a [`FlowWords`] word.
pub fn grant_word(granted: u32, acked: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&granted.to_le_bytes());
    b[4..].copy_from_slice(&acked.to_le_bytes());
    b
}

/// The 8 bytes a peer writes at offset 8 of a [`FlowWords`] word to say
/// goodbye with `cause` (below 2^63).
pub fn bye_word(cause: u64) -> [u8; 8] {
    ((1u64 << 63) | cause).to_le_bytes()
}

/// Credit accounting for one direction pair of an eager channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credits {
    /// Sends we may still issue (peer's free slots as we know them).
    send: u32,
    /// Slots we reposted whose credits the peer has not been told about.
    owed: u32,
    /// Explicit update once this many are owed.
    threshold: u32,
}

impl Credits {
    /// `peer_slots`: the peer's receive slots for us; `threshold`: owed
    /// credits that trigger an explicit update.
    pub fn new(peer_slots: u32, threshold: u32) -> Credits {
        Credits {
            send: peer_slots,
            owed: 0,
            threshold: threshold.max(1),
        }
    }
    /// Credits available for data messages (one is kept for updates).
    pub fn available(&self) -> u32 {
        self.send.saturating_sub(1)
    }
    /// Take a credit for a data message; false when none is left.
    pub fn try_take(&mut self) -> bool {
        if self.available() == 0 {
            return false;
        }
        self.send -= 1;
        true
    }
    /// Take the reserved credit for an explicit credit-update message.
    pub fn try_take_for_update(&mut self) -> bool {
        if self.send == 0 {
            return false;
        }
        self.send -= 1;
        true
    }
    /// The peer returned `n` credits (piggybacked or explicit).
    pub fn grant(&mut self, n: u32) {
        self.send = self.send.saturating_add(n);
    }
    /// We reposted `n` slots: we owe the peer `n` credits.
    pub fn reposted(&mut self, n: u32) {
        self.owed = self.owed.saturating_add(n);
    }
    /// Take all owed credits to piggyback on an outgoing message.
    pub fn take_owed(&mut self) -> u32 {
        std::mem::take(&mut self.owed)
    }
    /// True when enough credits are owed to justify an explicit update.
    pub fn update_due(&self) -> bool {
        self.owed >= self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_flow_and_reserve() {
        let mut a = Credits::new(4, 2); // a sends to b, b has 4 slots for a
        let mut b = Credits::new(4, 2);
        assert_eq!(a.available(), 3);
        assert!(a.try_take() && a.try_take() && a.try_take());
        assert!(!a.try_take(), "last credit is reserved for updates");
        assert!(a.try_take_for_update());
        assert!(!a.try_take_for_update());
        // b consumed 4 messages and reposted them.
        b.reposted(4);
        assert!(b.update_due());
        a.grant(b.take_owed());
        assert!(!b.update_due());
        assert_eq!(a.available(), 3);
    }
}
