//! The header at the start of a node segment: what the creator built it for,
//! and how many ranks have mapped it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::{Result, ShmError};
use crate::layout::NodeLayout;

/// "IBCOLSHM", written last by the creator so a reader that sees it sees
/// every other field.
pub const MAGIC: u64 = u64::from_le_bytes(*b"IBCOLSHM");

/// Bumped whenever the segment format changes.
pub const VERSION: u32 = 3;

#[repr(C, align(128))]
#[derive(Debug)]
struct Fixed {
    magic: AtomicU64,
    version: AtomicU32,
    local_size: AtomicU32,
    ring_bytes: AtomicU64,
    boxes: AtomicU64,
    queue_bytes: AtomicU64,
    pipe_slots: AtomicU64,
    pipe_chunk: AtomicU64,
    extra_bytes: AtomicU64,
    total_len: AtomicU64,
}

/// Kept off the fixed fields' lines: every rank writes it once.
#[repr(C, align(128))]
#[derive(Debug)]
struct AttachCounter {
    attached: AtomicU32,
}

/// Segment header. All fields are atomics, so it can be read and written
/// in place by every process that maps the segment.
#[repr(C)]
#[derive(Debug)]
pub struct SegmentHeader {
    fixed: Fixed,
    attach: AttachCounter,
}

const _: () = assert!(std::mem::size_of::<SegmentHeader>() <= crate::layout::PAGE);

impl SegmentHeader {
    /// The header at the start of a mapped segment.
    ///
    /// # Safety
    /// `ptr` is 128-byte aligned and points at `size_of::<SegmentHeader>()`
    /// bytes (zeroed or a header) that stay mapped for `'a` and are only
    /// accessed through `SegmentHeader`.
    pub unsafe fn from_ptr<'a>(ptr: *mut u8) -> &'a SegmentHeader {
        debug_assert_eq!(ptr as usize % 128, 0);
        // SAFETY: the caller guarantees alignment, size and lifetime; every
        // field is an atomic integer, for which any bits are valid.
        unsafe { &*(ptr as *const SegmentHeader) }
    }

    /// Creator only, before anyone opens the segment: records `layout`.
    pub fn init(&self, layout: &NodeLayout) {
        let p = layout.params();
        let f = &self.fixed;
        f.version.store(VERSION, Ordering::Relaxed);
        f.local_size.store(p.local_size as u32, Ordering::Relaxed);
        f.ring_bytes.store(p.ring_bytes as u64, Ordering::Relaxed);
        f.boxes.store(p.boxes as u64, Ordering::Relaxed);
        f.queue_bytes.store(p.queue_bytes as u64, Ordering::Relaxed);
        f.pipe_slots.store(p.pipe_slots as u64, Ordering::Relaxed);
        f.pipe_chunk.store(p.pipe_chunk as u64, Ordering::Relaxed);
        f.extra_bytes.store(p.extra_bytes as u64, Ordering::Relaxed);
        f.total_len
            .store(layout.total_len() as u64, Ordering::Relaxed);
        f.magic.store(MAGIC, Ordering::Release);
    }

    /// Checks that the creator built the segment for `layout`; `name` is
    /// for the error message.
    pub fn validate(&self, layout: &NodeLayout, name: &str) -> Result<()> {
        let f = &self.fixed;
        let bad = |reason: String| ShmError::BadHeader {
            name: name.into(),
            reason,
        };
        let magic = f.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(bad(format!(
                "magic {magic:#x} (not initialised, or not an ibcoll segment)"
            )));
        }
        let version = f.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this build speaks {VERSION}"
            )));
        }
        let p = layout.params();
        let fields = [
            (
                "local_size",
                u64::from(f.local_size.load(Ordering::Relaxed)),
                p.local_size,
            ),
            (
                "ring_bytes",
                f.ring_bytes.load(Ordering::Relaxed),
                p.ring_bytes,
            ),
            ("boxes", f.boxes.load(Ordering::Relaxed), p.boxes),
            (
                "queue_bytes",
                f.queue_bytes.load(Ordering::Relaxed),
                p.queue_bytes,
            ),
            (
                "pipe_slots",
                f.pipe_slots.load(Ordering::Relaxed),
                p.pipe_slots,
            ),
            (
                "pipe_chunk",
                f.pipe_chunk.load(Ordering::Relaxed),
                p.pipe_chunk,
            ),
            (
                "extra_bytes",
                f.extra_bytes.load(Ordering::Relaxed),
                p.extra_bytes,
            ),
            (
                "total_len",
                f.total_len.load(Ordering::Relaxed),
                layout.total_len(),
            ),
        ];
        for (what, theirs, ours) in fields {
            if theirs != ours as u64 {
                return Err(bad(format!("{what} is {theirs}, this rank expects {ours}")));
            }
        }
        Ok(())
    }

    /// Counts this rank as having mapped the segment; returns the new count.
    pub fn attach(&self) -> u32 {
        self.attach.attached.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// How many ranks have attached so far. When it reaches the local size,
    /// every rank has the segment mapped and the file may be unlinked.
    pub fn attached(&self) -> u32 {
        self.attach.attached.load(Ordering::Acquire)
    }
}
