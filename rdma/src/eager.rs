//! Eager receive buffers and credit accounting for RC endpoints.
//!
//! A [`RecvPool`] is one registered buffer cut into equal slots, each posted
//! as a receive. The sender may only send while it holds a credit (one per
//! free slot at the receiver); the receiver returns credits as it reposts
//! slots, piggybacked on its own messages or, past a threshold, in an
//! explicit credit message. [`Credits`] keeps both counts; one credit is
//! reserved for that explicit message so the two sides can never both wait
//! for credits that only the other could return.

use crate::error::{Error, Result};
use crate::verbs::{Access, ProtectionDomain, QueuePair, RegisteredBuffer, Sge};
use std::sync::Arc;

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
        if count == 0 || slot_size == 0 || slot_size > u32::MAX as usize {
            return Err(Error::invalid(
                "RecvPool::new",
                format!("bad geometry {count} x {slot_size}"),
                Some(pd.context().name()),
            ));
        }
        let slot_size = slot_size.div_ceil(64) * 64;
        let buf = RegisteredBuffer::new(pd, slot_size * count, Access::LOCAL_WRITE)?;
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
