//! A node segment: a [`Segment`] interpreted through a [`NodeLayout`].
//!
//! Typical bootstrap: local rank 0 calls [`NodeSegment::create`], publishes
//! the name (PMI `put`), and all ranks fence; the others call
//! [`NodeSegment::open`]. Every rank then publishes its pid. Once
//! [`NodeSegment::all_attached`] holds, any rank may [`unlink`] the file so a
//! crash leaves nothing behind in `/dev/shm`.
//!
//! [`unlink`]: NodeSegment::unlink

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::doorbell::Doorbell;
use crate::error::{Result, ShmError};
use crate::header::SegmentHeader;
use crate::layout::NodeLayout;
use crate::pipeline::{PipeReceiver, PipeSender};
use crate::queue::{Intent, QueueConsumer, QueueProducer};
use crate::ring::{RingConsumer, RingProducer};
use crate::rndv::ClaimSlot;
use crate::segment::Segment;

/// A mapped node segment and its layout.
#[derive(Debug)]
pub struct NodeSegment {
    seg: Segment,
    layout: NodeLayout,
}

impl NodeSegment {
    /// Creates segment `name` sized for `layout`, writes the header and
    /// counts the creator as attached.
    pub fn create(name: &str, layout: NodeLayout) -> Result<NodeSegment> {
        let seg = Segment::create(name, layout.total_len())?;
        let node = NodeSegment { seg, layout };
        node.header().init(&layout);
        node.header().attach();
        Ok(node)
    }

    /// Opens segment `name`, checks it was built for `layout`, and counts
    /// this rank as attached. The creator must have finished `create`.
    pub fn open(name: &str, layout: NodeLayout) -> Result<NodeSegment> {
        let seg = Segment::open(name, layout.total_len())?;
        let node = NodeSegment { seg, layout };
        node.header().validate(&layout, name)?;
        node.header().attach();
        Ok(node)
    }

    /// The layout in use.
    pub fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    /// The underlying mapping.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// The segment header.
    pub fn header(&self) -> &SegmentHeader {
        // SAFETY: offset 0 of a page-aligned mapping of at least one page,
        // which lives as long as `self`.
        unsafe { SegmentHeader::from_ptr(self.ptr(self.layout.header_offset())) }
    }

    /// True once every local rank has mapped the segment.
    pub fn all_attached(&self) -> bool {
        self.header().attached() as usize >= self.layout.local_size()
    }

    /// Bytes of the segment resident in memory now (on this node, touched
    /// by any rank: tmpfs pages are shared), by `mincore(2)`.
    pub fn resident_bytes(&self) -> Result<usize> {
        let len = self.seg.len();
        let pages = len.div_ceil(crate::layout::PAGE);
        let mut v = vec![0u8; pages];
        // SAFETY: the mapping starts page aligned and is `len` bytes long;
        // `v` has one byte per page, as mincore writes.
        let rc = unsafe {
            libc::mincore(
                self.seg.as_ptr() as *mut libc::c_void,
                len,
                v.as_mut_ptr() as *mut libc::c_uchar,
            )
        };
        if rc != 0 {
            return Err(ShmError::Segment {
                name: self.seg.name().to_string(),
                op: "mincore",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(v.iter().filter(|&&b| b & 1 != 0).count() * crate::layout::PAGE)
    }

    /// Removes the segment's file; the mappings stay valid.
    pub fn unlink(&self) -> Result<()> {
        Segment::unlink(self.seg.name())
    }

    /// Local rank `rank`'s doorbell.
    pub fn doorbell(&self, rank: usize) -> &Doorbell {
        // SAFETY: the layout puts doorbells 128-byte aligned inside the
        // mapping (its size was checked against the layout), only ever
        // accessed as `Doorbell`, and the mapping lives as long as `self`.
        unsafe { Doorbell::from_ptr(self.ptr(self.layout.doorbell_offset(rank))) }
    }

    /// Local rank `rank`'s pid slot (0 until published).
    pub fn pid_slot(&self, rank: usize) -> &AtomicI32 {
        // SAFETY: an aligned i32 inside the mapping, only accessed
        // atomically, living as long as `self`.
        unsafe { &*(self.ptr(self.layout.pid_offset(rank)) as *const AtomicI32) }
    }

    /// Stores this process's pid in `rank`'s slot.
    pub fn publish_pid(&self, rank: usize) {
        self.pid_slot(rank)
            .store(std::process::id() as i32, Ordering::Release);
    }

    fn word(&self, rank: usize, i: usize) -> &AtomicU32 {
        // SAFETY: words 1..3 of the rank's 16-byte slot, aligned, inside
        // the mapping, only accessed atomically, living as long as `self`.
        unsafe { &*(self.ptr(self.layout.pid_offset(rank) + 4 * i) as *const AtomicU32) }
    }

    /// Publishes what the other ranks of the node need to know of local
    /// rank `rank` before talking to it: its world rank and `flags` (the
    /// caller's), then its pid, which marks the slot complete.
    pub fn publish_rank(&self, rank: usize, world_rank: u32, flags: u32) {
        self.word(rank, 1).store(world_rank, Ordering::Relaxed);
        self.word(rank, 2).store(flags, Ordering::Relaxed);
        self.publish_pid(rank);
    }

    /// What local rank `rank` published: (pid, world rank, flags), or
    /// `None` before it did.
    pub fn rank_info(&self, rank: usize) -> Option<(i32, u32, u32)> {
        let pid = self.pid(rank);
        (pid != 0).then(|| {
            (
                pid,
                self.word(rank, 1).load(Ordering::Relaxed),
                self.word(rank, 2).load(Ordering::Relaxed),
            )
        })
    }

    /// The pid `rank` published, or 0 if it has not yet.
    pub fn pid(&self, rank: usize) -> i32 {
        self.pid_slot(rank).load(Ordering::Acquire)
    }

    /// Producer end of local rank `to`'s fast box `index`.
    ///
    /// # Safety
    /// Called only by the rank `to` granted the box to, with at most one
    /// live producer per box, and the handle is dropped before `self`.
    pub unsafe fn box_producer(&self, to: usize, index: usize) -> Result<RingProducer> {
        let base = self.ptr(self.box_offset(to, index)?);
        // SAFETY: the region lies inside the mapping and is a ring of this
        // capacity from creation on; uniqueness and lifetime are the caller's.
        unsafe { RingProducer::new(base, self.layout.ring_bytes()) }
    }

    /// Consumer end of local rank `to`'s fast box `index`.
    ///
    /// # Safety
    /// Called only by rank `to`, with at most one live consumer per box,
    /// and the handle is dropped before `self`.
    pub unsafe fn box_consumer(&self, to: usize, index: usize) -> Result<RingConsumer> {
        let base = self.ptr(self.box_offset(to, index)?);
        // SAFETY: as in `box_producer`.
        unsafe { RingConsumer::new(base, self.layout.ring_bytes()) }
    }

    fn box_offset(&self, to: usize, index: usize) -> Result<usize> {
        self.layout.check_rank_pub(to)?;
        if index >= self.layout.boxes() {
            return Err(ShmError::Invalid(format!(
                "fast box {index} of local rank {to}: it has {}",
                self.layout.boxes()
            )));
        }
        Ok(self.layout.box_offset(to, index))
    }

    /// The word in which local rank `to` names the fast box it granted
    /// local rank `from`: index + 1, 0 while none (written by `to` alone,
    /// with Release, after it made its consumer end).
    ///
    /// # Panics
    /// If `from == to` or either is not a local rank.
    pub fn box_grant(&self, to: usize, from: usize) -> &AtomicU64 {
        // SAFETY: an aligned u64 inside the mapping, zeroed at creation,
        // only accessed atomically, living as long as `self`.
        unsafe { &*(self.ptr(self.layout.grant_offset(to, from)) as *const AtomicU64) }
    }

    /// Producer `from`'s handle on local rank `to`'s receive queue; fails
    /// if the layout has no queues.
    ///
    /// # Safety
    /// Called only by rank `from` (its id in the records), and the handle
    /// is dropped before `self`.
    pub unsafe fn queue_producer(&self, from: usize, to: usize) -> Result<QueueProducer> {
        self.layout.check_rank_pub(from)?;
        let base = self.queue(to)?;
        // SAFETY: the region lies inside the mapping and is a queue of this
        // capacity from creation on; lifetime is the caller's, and so is
        // the intent line's (same mapping), which only `from` writes.
        unsafe {
            let mut p = QueueProducer::new(base, self.layout.queue_bytes(), from)?;
            p.announce_in(self.intent(from), to as u32);
            Ok(p)
        }
    }

    /// Local rank `rank`'s queue intent line (see [`crate::queue`]).
    pub fn intent(&self, rank: usize) -> &Intent {
        // SAFETY: a 128-byte aligned line inside the mapping (areas start
        // on a page, lines are 128 bytes), zeroed at creation, only used
        // through `Intent`, living as long as `self`.
        unsafe { Intent::from_ptr(self.ptr(self.layout.intent_offset(rank))) }
    }

    /// Local rank `to`'s consumer handle on its receive queue; fails if the
    /// layout has no queues.
    ///
    /// # Safety
    /// Called only by rank `to`, with at most one live consumer, and the
    /// handle is dropped before `self`.
    pub unsafe fn queue_consumer(&self, to: usize) -> Result<QueueConsumer> {
        let base = self.queue(to)?;
        // SAFETY: as in `queue_producer`.
        unsafe { QueueConsumer::new(base, self.layout.queue_bytes()) }
    }

    fn queue(&self, rank: usize) -> Result<*mut u8> {
        let off = self.layout.queue_offset(rank).ok_or_else(|| {
            ShmError::Invalid(format!(
                "segment {} has no receive queues (queue_bytes = 0)",
                self.seg.name()
            ))
        })?;
        Ok(self.ptr(off))
    }

    /// Local rank `from`'s pipe-owner word: which receiver its pipe
    /// streams to now (its encoding is the engine's).
    pub fn pipe_owner(&self, from: usize) -> &AtomicU64 {
        // SAFETY: the first word of a 128-byte aligned line inside the
        // mapping, zeroed at creation, only accessed atomically, living as
        // long as `self`.
        unsafe { &*(self.ptr(self.layout.pipe_owner_offset(from)) as *const AtomicU64) }
    }

    /// Sending end of local rank `from`'s pipe; fails if the layout has
    /// none.
    ///
    /// # Safety
    /// Called only by rank `from`, with at most one live sender per pipe,
    /// and the handle is dropped before `self`.
    pub unsafe fn pipe_sender(&self, from: usize) -> Result<PipeSender> {
        let (base, slots, chunk) = self.pipe(from)?;
        // SAFETY: the region lies inside the mapping, page aligned, zeroed
        // at creation; uniqueness and lifetime are the caller's.
        unsafe { PipeSender::new(base, slots, chunk) }
    }

    /// A receiving end of local rank `from`'s pipe; fails if the layout has
    /// none.
    ///
    /// # Safety
    /// Every rank may hold one, but only the one the sender names in its
    /// pipe-owner word may read, and the handle is dropped before `self`.
    pub unsafe fn pipe_receiver(&self, from: usize) -> Result<PipeReceiver> {
        let (base, slots, chunk) = self.pipe(from)?;
        // SAFETY: as in `pipe_sender`.
        unsafe { PipeReceiver::new(base, slots, chunk) }
    }

    /// Claim slot `slot` of the pair `from -> to` (see [`crate::rndv`]).
    pub fn claim_slot(&self, from: usize, to: usize, slot: usize) -> &ClaimSlot {
        let p = self.ptr(self.layout.claim_offset(from, to, slot));
        // SAFETY: the slot lies inside the mapping, 128-byte aligned (the
        // area starts on a page and slots are 128 bytes), zeroed at
        // creation, lives as long as `self`, and is only used atomically.
        unsafe { &*(p as *const ClaimSlot) }
    }

    /// Start of the free `extra` area ([`NodeLayout::extra_len`] bytes,
    /// page aligned, zeroed at creation). Its use is up to the caller.
    pub fn extra_ptr(&self) -> *mut u8 {
        self.ptr(self.layout.extra_offset())
    }

    fn pipe(&self, from: usize) -> Result<(*mut u8, usize, usize)> {
        let off = self.layout.pipe_offset(from).ok_or_else(|| {
            ShmError::Invalid(format!(
                "segment {} has no pipe areas (pipe_slots = 0)",
                self.seg.name()
            ))
        })?;
        let p = self.layout.params();
        Ok((self.ptr(off), p.pipe_slots, p.pipe_chunk))
    }

    fn ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.seg.len());
        // SAFETY: layout offsets are below total_len, the mapping's length.
        unsafe { self.seg.as_ptr().add(off) }
    }
}
