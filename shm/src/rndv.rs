//! Claim slots: shared work counters that let both ends of a rendezvous
//! copy the same range, chunk by chunk, without copying a chunk twice.
//!
//! The receiver of a large message copies its first part itself and
//! offers the rest as `n` chunks in a slot of the pair `sender -> receiver`
//! (it owns those slots). The sender (with `process_vm_writev`) and the
//! receiver (with `process_vm_readv`, once its own part is done) each
//! [`claim`](ClaimSlot::claim) the next chunk until none is left, and
//! [`add_done`](ClaimSlot::add_done) its bytes once copied. So a sender that
//! is busy or descheduled costs nothing: the receiver takes every chunk.
//! The receiver completes when [`done`](ClaimSlot::done) reaches the total,
//! after which no chunk is being copied and no claim can succeed.
//!
//! A claim names the slot's generation, which the receiver bumps every
//! time it offers the slot again, so a late claim for an old transfer
//! fails instead of taking a chunk of the next one.

use std::sync::atomic::{AtomicU64, Ordering};

/// Claim slots per ordered pair of local ranks (concurrent split copies
/// from one sender to one receiver; more are copied by the receiver alone).
pub const CLAIM_SLOTS: usize = 16;

/// One shared work counter, alone in 128 bytes. Zeroed memory is an idle
/// slot of generation 0.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct ClaimSlot {
    /// Generation (high 32 bits) and next unclaimed chunk (low 32 bits).
    claim: AtomicU64,
    /// Bytes copied so far in this generation.
    done: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<ClaimSlot>() == 128);

impl ClaimSlot {
    /// Receiver: starts a new generation with every chunk unclaimed and
    /// nothing done; returns the generation to send to the sender. Only
    /// call it on an idle slot (its last transfer complete).
    pub fn offer(&self) -> u32 {
        let gen = ((self.claim.load(Ordering::Relaxed) >> 32) as u32).wrapping_add(1);
        self.done.store(0, Ordering::Relaxed);
        // Release: `done = 0` is visible to whoever claims in this
        // generation.
        self.claim.store(u64::from(gen) << 32, Ordering::Release);
        gen
    }

    /// Claims the next of `chunks` chunks of generation `gen`, or `None`
    /// if all are taken or the slot has moved on.
    pub fn claim(&self, gen: u32, chunks: u32) -> Option<u32> {
        let mut v = self.claim.load(Ordering::Acquire);
        loop {
            let next = v as u32;
            if (v >> 32) as u32 != gen || next >= chunks {
                return None;
            }
            match self
                .claim
                .compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(next),
                Err(cur) => v = cur,
            }
        }
    }

    /// Records `bytes` copied for a claimed chunk (after the copy).
    pub fn add_done(&self, bytes: u64) {
        // Release: the copy happens before the receiver sees the count.
        self.done.fetch_add(bytes, Ordering::Release);
    }

    /// Bytes copied so far (Acquire: the copies they count are visible).
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_claimed_once_and_generations_fence_off_late_claims() {
        let s = ClaimSlot::default();
        let g = s.offer();
        assert_eq!(s.claim(g, 3), Some(0));
        assert_eq!(s.claim(g, 3), Some(1));
        assert_eq!(s.claim(g + 1, 3), None, "wrong generation");
        assert_eq!(s.claim(g, 3), Some(2));
        assert_eq!(s.claim(g, 3), None, "all taken");
        s.add_done(10);
        s.add_done(5);
        assert_eq!(s.done(), 15);
        let g2 = s.offer();
        assert_ne!(g, g2);
        assert_eq!(s.done(), 0);
        assert_eq!(s.claim(g, 3), None, "old generation");
        assert_eq!(s.claim(g2, 1), Some(0));
    }

    #[test]
    fn two_threads_claim_every_chunk_exactly_once() {
        let s = ClaimSlot::default();
        let g = s.offer();
        let n = 10_000u32;
        let counts: Vec<u32> = std::thread::scope(|sc| {
            let h: Vec<_> = (0..2)
                .map(|_| {
                    sc.spawn(|| {
                        let mut k = 0;
                        while s.claim(g, n).is_some() {
                            s.add_done(1);
                            k += 1;
                        }
                        k
                    })
                })
                .collect();
            h.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(counts.iter().sum::<u32>(), n);
        assert_eq!(s.done(), u64::from(n));
    }
}
