//! Where everything lives inside a node segment.
//!
//! ```text
//! 0                 header (one page)
//! doorbells_off     one Doorbell per local rank, 128 B apart
//! pids_off          one 16-byte slot per local rank: pid, world rank, flags
//! queues_off        one receive queue per local rank (MPSC, `queue_bytes`)
//! owners_off        one 128-byte pipe-owner line per local rank
//! intents_off       one 128-byte queue intent line per local rank
//! grants_off        per local rank, one word per sender: the fast box
//!                   it granted that sender (0: none yet)
//! rings_off         per local rank, a pool of `boxes` fast boxes (SPSC
//!                   rings) it grants to the senders that talk most
//! pipes_off         optionally one outgoing pipe per local rank
//! claims_off        CLAIM_SLOTS claim slots per ordered pair (split copies)
//! extra_off         free area for collective fast paths
//! total_len
//! ```
//!
//! Everything large is per rank: a record goes to the receiver's queue
//! unless the receiver granted its sender one of its fast boxes (it does
//! so for the first `boxes` senders that queued it enough records), and a
//! pipelined copy goes through the sender's one pipe. The per-pair part is
//! 2 KiB of claim slots and an 8-byte grant word; see docs/ARCHITECTURE.md
//! for the sizes this gives at 64 to 192 ranks.
//!
//! Every area starts on a page; rings, queues, pipes and doorbells are
//! 128-byte aligned (two cache lines, so the adjacent-line prefetcher
//! cannot make neighbours share).

use crate::doorbell::Doorbell;
use crate::error::{Result, ShmError};
use crate::{pipeline, queue, ring};

/// Cache-line size assumed throughout (x86-64 and most aarch64).
pub const CACHE_LINE: usize = 64;

/// Page size the layout aligns areas to.
pub const PAGE: usize = 4096;

/// Bytes of one local rank's slot: pid, world rank, flags (see
/// [`crate::NodeSegment::publish_rank`]).
pub const RANK_SLOT: usize = 16;

/// Separation of independently written words: the adjacent-line
/// prefetcher pulls 128-byte pairs of lines.
pub(crate) const FALSE_SHARING_STRIDE: usize = 128;

/// Suggested fast-box capacity in bytes (the engine's config may override
/// it).
pub const DEFAULT_RING_BYTES: usize = 4 * 1024;

/// Suggested receive-queue capacity in bytes.
pub const DEFAULT_QUEUE_BYTES: usize = 256 << 10;

/// Suggested number of fast boxes per receiving rank.
pub const DEFAULT_BOXES: usize = 32;

/// Every parameter of a node layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutParams {
    /// Number of ranks on the node.
    pub local_size: usize,
    /// Data capacity of each pair's fast box in bytes (power of two, at
    /// least [`ring::MIN_CAPACITY`]).
    pub ring_bytes: usize,
    /// Fast boxes per receiving rank (at most `local_size - 1` are made).
    pub boxes: usize,
    /// Data capacity of each rank's receive queue (power of two, at least
    /// [`queue::MIN_CAPACITY`]), or 0 for none (boxes only).
    pub queue_bytes: usize,
    /// Slots per pipe; 0 for no pipe areas (CMA available).
    pub pipe_slots: usize,
    /// Bytes per pipe slot (multiple of 64); ignored when `pipe_slots` is 0.
    pub pipe_chunk: usize,
    /// Bytes of the free `extra` area (rounded up to a page).
    pub extra_bytes: usize,
}

/// Offsets of every area of one node segment; identical on every rank that
/// uses the same [`LayoutParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLayout {
    params: LayoutParams,
    doorbells_off: usize,
    pids_off: usize,
    queues_off: usize,
    queue_stride: usize,
    owners_off: usize,
    intents_off: usize,
    grants_off: usize,
    grant_stride: usize,
    boxes: usize,
    rings_off: usize,
    ring_stride: usize,
    pipes_off: usize,
    pipe_stride: usize,
    claims_off: usize,
    extra_off: usize,
    extra_len: usize,
    total_len: usize,
}

impl NodeLayout {
    /// Layout with a box of `ring_bytes` for every sender of every rank, no
    /// queues, no pipe areas and an `extra_bytes` free area.
    pub fn new(local_size: usize, ring_bytes: usize, extra_bytes: usize) -> Result<NodeLayout> {
        Self::from_params(LayoutParams {
            local_size,
            ring_bytes,
            boxes: local_size.saturating_sub(1),
            queue_bytes: 0,
            pipe_slots: 0,
            pipe_chunk: 0,
            extra_bytes,
        })
    }

    /// Layout from every parameter, including pipe areas.
    pub fn from_params(p: LayoutParams) -> Result<NodeLayout> {
        let invalid = |what: &str| ShmError::Invalid(format!("layout {p:?}: {what}"));
        if p.local_size == 0 || p.local_size > u32::MAX as usize {
            return Err(invalid("local_size must be in 1..=u32::MAX"));
        }
        ring::check_capacity(p.ring_bytes)?;
        let n = p.local_size;
        let pairs = n
            .checked_mul(n - 1)
            .ok_or_else(|| invalid("too many ranks"))?;
        let mut end = PAGE;

        let doorbells_off = end;
        end = area_end(doorbells_off, n, std::mem::size_of::<Doorbell>())
            .ok_or_else(|| invalid("overflow"))?;
        let pids_off = end;
        end = area_end(pids_off, n, RANK_SLOT).ok_or_else(|| invalid("overflow"))?;

        let queue_stride = if p.queue_bytes == 0 {
            0
        } else {
            queue::check_capacity(p.queue_bytes)?;
            align_up(queue::region_len(p.queue_bytes), FALSE_SHARING_STRIDE)
        };
        let queues_off = end;
        end = area_end(queues_off, n, queue_stride).ok_or_else(|| invalid("overflow"))?;
        let owners_off = end;
        end = area_end(owners_off, n, FALSE_SHARING_STRIDE).ok_or_else(|| invalid("overflow"))?;
        let intents_off = end;
        end = area_end(intents_off, n, queue::INTENT_BYTES).ok_or_else(|| invalid("overflow"))?;

        let grant_stride = align_up(n * 8, FALSE_SHARING_STRIDE);
        let grants_off = end;
        end = area_end(grants_off, n, grant_stride).ok_or_else(|| invalid("overflow"))?;

        let boxes = p.boxes.min(n - 1);
        let ring_stride = align_up(ring::region_len(p.ring_bytes), FALSE_SHARING_STRIDE);
        let rings_off = end;
        end = area_end(
            rings_off,
            n.checked_mul(boxes).ok_or_else(|| invalid("overflow"))?,
            ring_stride,
        )
        .ok_or_else(|| invalid("overflow"))?;

        let pipe_stride = if p.pipe_slots == 0 {
            0
        } else {
            align_up(pipeline::region_len(p.pipe_slots, p.pipe_chunk)?, PAGE)
        };
        let pipes_off = end;
        end = area_end(pipes_off, n, pipe_stride).ok_or_else(|| invalid("overflow"))?;

        let claims_off = end;
        end = area_end(
            claims_off,
            pairs,
            crate::rndv::CLAIM_SLOTS * std::mem::size_of::<crate::rndv::ClaimSlot>(),
        )
        .ok_or_else(|| invalid("overflow"))?;

        let extra_off = end;
        let extra_len = p
            .extra_bytes
            .checked_add(PAGE - 1)
            .map(|x| x & !(PAGE - 1))
            .ok_or_else(|| invalid("overflow"))?;
        let total_len = extra_off
            .checked_add(extra_len)
            .ok_or_else(|| invalid("overflow"))?;
        Ok(NodeLayout {
            params: p,
            doorbells_off,
            pids_off,
            queues_off,
            queue_stride,
            owners_off,
            intents_off,
            grants_off,
            grant_stride,
            boxes,
            rings_off,
            ring_stride,
            pipes_off,
            pipe_stride,
            claims_off,
            extra_off,
            extra_len,
            total_len,
        })
    }

    /// The parameters this layout was made from.
    pub fn params(&self) -> &LayoutParams {
        &self.params
    }

    /// Number of local ranks.
    pub fn local_size(&self) -> usize {
        self.params.local_size
    }

    /// Data capacity of each fast box.
    pub fn ring_bytes(&self) -> usize {
        self.params.ring_bytes
    }

    /// Fast boxes each rank has to grant (`params().boxes`, at most
    /// `local_size - 1`).
    pub fn boxes(&self) -> usize {
        self.boxes
    }

    /// Data capacity of each receive queue (0: none).
    pub fn queue_bytes(&self) -> usize {
        self.params.queue_bytes
    }

    /// Size the segment must have.
    pub fn total_len(&self) -> usize {
        self.total_len
    }

    /// Offset of the segment header (always 0).
    pub fn header_offset(&self) -> usize {
        0
    }

    /// Offset of local rank `rank`'s doorbell.
    pub fn doorbell_offset(&self, rank: usize) -> usize {
        self.check_rank(rank);
        self.doorbells_off + rank * std::mem::size_of::<Doorbell>()
    }

    /// Offset of local rank `rank`'s slot ([`RANK_SLOT`] bytes: its pid as
    /// an `i32`, then its world rank and flags as `u32`s).
    pub fn pid_offset(&self, rank: usize) -> usize {
        self.check_rank(rank);
        self.pids_off + rank * RANK_SLOT
    }

    /// Offset of local rank `rank`'s receive queue, or `None` if the layout
    /// has none; its region is [`queue::region_len`]`(self.queue_bytes())`
    /// long.
    pub fn queue_offset(&self, rank: usize) -> Option<usize> {
        self.check_rank(rank);
        (self.params.queue_bytes > 0).then(|| self.queues_off + rank * self.queue_stride)
    }

    /// Offset of local rank `rank`'s pipe-owner line (128 bytes): which
    /// receiver its pipe streams to now.
    pub fn pipe_owner_offset(&self, rank: usize) -> usize {
        self.check_rank(rank);
        self.owners_off + rank * FALSE_SHARING_STRIDE
    }

    /// Offset of local rank `rank`'s queue intent line
    /// ([`queue::INTENT_BYTES`]): what it is reserving in some queue now.
    pub fn intent_offset(&self, rank: usize) -> usize {
        self.check_rank(rank);
        self.intents_off + rank * queue::INTENT_BYTES
    }

    /// Offset of fast box `index` (< [`boxes`](Self::boxes)) of local rank
    /// `to`, which it grants to one sender; its region is
    /// [`ring::region_len`]`(self.ring_bytes())` long.
    ///
    /// # Panics
    /// If `to` is not a local rank or `index` is too large.
    pub fn box_offset(&self, to: usize, index: usize) -> usize {
        self.check_rank(to);
        assert!(index < self.boxes, "fast box {index} of {}", self.boxes);
        self.rings_off + (to * self.boxes + index) * self.ring_stride
    }

    /// Offset of the 8-byte word in which local rank `to` says which of
    /// its fast boxes it granted local rank `from` (index + 1; 0: none).
    ///
    /// # Panics
    /// If `from == to` or either is not a local rank.
    pub fn grant_offset(&self, to: usize, from: usize) -> usize {
        self.pair_index(from, to);
        self.grants_off + to * self.grant_stride + from * 8
    }

    /// Offset of local rank `from`'s outgoing pipe area, or `None` if the
    /// layout has no pipes.
    ///
    /// # Panics
    /// If `from` is not a local rank.
    pub fn pipe_offset(&self, from: usize) -> Option<usize> {
        self.check_rank(from);
        (self.params.pipe_slots > 0).then(|| self.pipes_off + from * self.pipe_stride)
    }

    /// Offset of claim slot `slot` (< [`crate::rndv::CLAIM_SLOTS`]) of the
    /// ordered pair `from -> to`.
    ///
    /// # Panics
    /// If `from == to`, either is not a local rank, or `slot` is too large.
    pub fn claim_offset(&self, from: usize, to: usize, slot: usize) -> usize {
        assert!(slot < crate::rndv::CLAIM_SLOTS, "claim slot {slot}");
        let size = std::mem::size_of::<crate::rndv::ClaimSlot>();
        self.claims_off + (self.pair_index(from, to) * crate::rndv::CLAIM_SLOTS + slot) * size
    }

    /// Offset of the free `extra` area.
    pub fn extra_offset(&self) -> usize {
        self.extra_off
    }

    /// Length of the `extra` area (the requested size rounded up to a page).
    pub fn extra_len(&self) -> usize {
        self.extra_len
    }

    fn pair_index(&self, from: usize, to: usize) -> usize {
        self.check_rank(from);
        self.check_rank(to);
        assert_ne!(from, to, "no pair of a rank with itself");
        from * (self.params.local_size - 1) + to - usize::from(to > from)
    }

    /// Fails unless `rank` is a local rank.
    pub(crate) fn check_rank_pub(&self, rank: usize) -> Result<()> {
        if rank >= self.params.local_size {
            return Err(ShmError::Invalid(format!(
                "local rank {rank} out of range (local_size {})",
                self.params.local_size
            )));
        }
        Ok(())
    }

    fn check_rank(&self, rank: usize) {
        assert!(
            rank < self.params.local_size,
            "local rank {rank} out of range (local_size {})",
            self.params.local_size
        );
    }
}

fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

/// End of an area of `count` items of `stride` bytes at `off`, page aligned.
fn area_end(off: usize, count: usize, stride: usize) -> Option<usize> {
    let end = count.checked_mul(stride)?.checked_add(off)?;
    end.checked_add(PAGE - 1).map(|e| e & !(PAGE - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_are_aligned_and_disjoint() {
        let l = NodeLayout::from_params(LayoutParams {
            local_size: 5,
            ring_bytes: 4096,
            boxes: 3,
            queue_bytes: 8192,
            pipe_slots: 2,
            pipe_chunk: 8192,
            extra_bytes: 100,
        })
        .unwrap();
        let mut regions = vec![(0, PAGE)];
        for r in 0..5 {
            assert_eq!(l.doorbell_offset(r) % FALSE_SHARING_STRIDE, 0);
            regions.push((l.doorbell_offset(r), std::mem::size_of::<Doorbell>()));
            regions.push((l.pid_offset(r), RANK_SLOT));
            let qo = l.queue_offset(r).unwrap();
            assert_eq!(qo % FALSE_SHARING_STRIDE, 0);
            regions.push((qo, queue::region_len(8192)));
            regions.push((l.pipe_owner_offset(r), FALSE_SHARING_STRIDE));
            regions.push((l.intent_offset(r), queue::INTENT_BYTES));
            let po = l.pipe_offset(r).unwrap();
            assert_eq!(po % PAGE, 0);
            regions.push((po, pipeline::region_len(2, 8192).unwrap()));
            for b in 0..3 {
                let ro = l.box_offset(r, b);
                assert_eq!(ro % FALSE_SHARING_STRIDE, 0);
                regions.push((ro, ring::region_len(4096)));
            }
            for t in (0..5).filter(|&t| t != r) {
                regions.push((l.grant_offset(r, t), 8));
                for c in 0..crate::rndv::CLAIM_SLOTS {
                    regions.push((l.claim_offset(r, t, c), 128));
                }
            }
        }
        assert_eq!(l.extra_offset() % PAGE, 0);
        assert_eq!(l.extra_len(), PAGE);
        regions.push((l.extra_offset(), l.extra_len()));
        regions.sort();
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {w:?}");
        }
        let last = regions.last().unwrap();
        assert!(last.0 + last.1 <= l.total_len());
        assert_eq!(l.total_len() % PAGE, 0);
    }

    #[test]
    fn single_rank_and_no_pipes() {
        let l = NodeLayout::new(1, DEFAULT_RING_BYTES, 0).unwrap();
        assert_eq!(l.extra_len(), 0);
        assert!(l.total_len() >= PAGE);
        let l = NodeLayout::new(2, DEFAULT_RING_BYTES, 0).unwrap();
        assert_eq!(l.pipe_offset(0), None);
        assert_eq!(l.queue_offset(1), None);
        assert_eq!(l.boxes(), 1);
        assert_ne!(l.box_offset(0, 0), l.box_offset(1, 0));
        assert_ne!(l.grant_offset(0, 1), l.grant_offset(1, 0));
    }

    #[test]
    fn grows_linearly_with_the_defaults() {
        // Targets of the 64-192 ranks-per-node work: at most 8 MiB of
        // segment per local rank with the default sizes.
        for n in [2usize, 8, 64, 128, 192, 256] {
            let l = NodeLayout::from_params(LayoutParams {
                local_size: n,
                ring_bytes: DEFAULT_RING_BYTES,
                boxes: DEFAULT_BOXES,
                queue_bytes: DEFAULT_QUEUE_BYTES,
                pipe_slots: 4,
                pipe_chunk: 64 * 1024,
                extra_bytes: crate::SlotArea::bytes_needed(n, 64 * 1024),
            })
            .unwrap();
            assert!(
                l.total_len() <= n * (8 << 20),
                "{n} ranks: {}",
                l.total_len()
            );
        }
    }

    #[test]
    fn rejects_bad_params() {
        assert!(NodeLayout::new(0, 4096, 0).is_err());
        assert!(NodeLayout::new(2, 3000, 0).is_err());
        assert!(NodeLayout::new(usize::MAX / 2, 4096, 0).is_err());
    }

    #[test]
    #[should_panic(expected = "itself")]
    fn no_self_grant() {
        NodeLayout::new(2, 4096, 0).unwrap().grant_offset(1, 1);
    }

    #[test]
    #[should_panic(expected = "fast box 1 of 1")]
    fn no_box_past_the_pool() {
        NodeLayout::new(2, 4096, 0).unwrap().box_offset(0, 1);
    }
}
