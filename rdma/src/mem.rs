//! Release notifications for the registration cache.
//!
//! # Why the cache needs them
//! `ibv_reg_mr` pins the physical pages behind a virtual range. If that range
//! is freed and unmapped (glibc `free` of a large block → `munmap`, heap trim
//! → `brk`/`madvise(MADV_DONTNEED)`) and a new allocation later lands at the
//! same address, the address now maps NEW pages while a cached region still
//! points at the OLD, pinned ones: RDMA through it sends stale bytes (or
//! writes where nobody looks). The `(address, length)` key cannot tell, and
//! an unprivileged process cannot read page frame numbers
//! (`/proc/self/pagemap` hides them without CAP_SYS_ADMIN).
//!
//! UCX (ucm: PLT relocation/binary patching of mmap/munmap/brk/madvise…)
//! and Open MPI (opal "patcher") learn of releases by hooking the memory
//! functions, and disable their caches when the hooks cannot be installed.
//! libfabric can alternatively use userfaultfd unmap events. This crate
//! takes the same "no notification, no caching" rule with a hook that Rust
//! offers without patching anything:
//!
//! * [`TrackingAlloc`] wraps the global allocator. It records every live
//!   allocation of at least [`TRACK_MIN`] bytes, and publishes each such
//!   block's range *before* handing it back to the allocator (so before any
//!   unmapping can happen).
//! * The cache only keeps a registration across calls when the range lies
//!   inside a tracked live block (or a region declared with
//!   [`track_external`]). Pages of a live block are never unmapped or zapped
//!   (the allocator only releases pages that are entirely free), so the
//!   registration stays valid until that block is released — which produces
//!   an event that invalidates it.
//! * Everything else (no `TrackingAlloc` installed, C-allocated memory,
//!   stack, untracked mmaps) is registered per use and never cached: slower,
//!   always correct.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Blocks below this size are not tracked (small messages are copied
/// through eager buffers and never registered individually).
pub const TRACK_MIN: usize = 16 * 1024;
const TABLE_CAP: usize = 4096;
const RING: usize = 256;

/// A minimal spin lock: usable inside the global allocator (no allocation,
/// no futex, never held across a call that allocates).
struct Spin<T> {
    locked: AtomicBool,
    v: UnsafeCell<T>,
}

// SAFETY: access to `v` is serialised by `locked`.
unsafe impl<T: Send> Sync for Spin<T> {}

impl<T> Spin<T> {
    const fn new(v: T) -> Self {
        Spin {
            locked: AtomicBool::new(false),
            v: UnsafeCell::new(v),
        }
    }
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: we hold the lock, so this is the only reference.
        let r = f(unsafe { &mut *self.v.get() });
        self.locked.store(false, Ordering::Release);
        r
    }
}

struct State {
    /// Live tracked blocks (start, len), compact (swap-remove).
    blocks: [(usize, usize); TABLE_CAP],
    nblocks: usize,
    /// Released ranges, indexed by sequence number modulo RING.
    ring: [(usize, usize); RING],
    seq: u64,
}

static STATE: Spin<State> = Spin::new(State {
    blocks: [(0, 0); TABLE_CAP],
    nblocks: 0,
    ring: [(0, 0); RING],
    seq: 0,
});
/// Mirror of `State::seq` for a lock-free "anything new?" check.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// Live caches; no events are recorded while there are none.
static CACHES: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
static UNTRACKED: AtomicU64 = AtomicU64::new(0);

fn insert_block(start: usize, len: usize) {
    let full = STATE.with(|s| {
        if s.nblocks == TABLE_CAP {
            return true;
        }
        s.blocks[s.nblocks] = (start, len);
        s.nblocks += 1;
        false
    });
    if full {
        // Not tracked => never cached; still correct.
        UNTRACKED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Remove `start` from the table (if present) and publish `[start, start+len)`.
fn release(start: usize, len: usize) {
    STATE.with(|s| {
        if let Some(i) = s.blocks[..s.nblocks].iter().position(|b| b.0 == start) {
            s.nblocks -= 1;
            s.blocks[i] = s.blocks[s.nblocks];
        }
        if CACHES.load(Ordering::Acquire) > 0 {
            let i = (s.seq % RING as u64) as usize;
            s.ring[i] = (start, len);
            s.seq += 1;
            SEQ.store(s.seq, Ordering::Release);
        }
    });
}

/// A global allocator wrapper that tells the registration cache when memory
/// is released. Install it in the binary:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: ibcoll_rdma::mem::TrackingAlloc = ibcoll_rdma::mem::TrackingAlloc::new(std::alloc::System);
/// ```
///
/// Without it the cache still works, registering per use (see module docs).
pub struct TrackingAlloc<A = System>(A);

impl<A> TrackingAlloc<A> {
    /// Wrap `inner`.
    pub const fn new(inner: A) -> Self {
        TrackingAlloc(inner)
    }
}

// SAFETY: every method forwards to the inner allocator with the same
// arguments and only adds bookkeeping that never allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TrackingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.alloc(layout) };
        if layout.size() >= TRACK_MIN && !p.is_null() {
            ACTIVE.store(true, Ordering::Relaxed);
            insert_block(p as usize, layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if layout.size() >= TRACK_MIN && !p.is_null() {
            ACTIVE.store(true, Ordering::Relaxed);
            insert_block(p as usize, layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= TRACK_MIN {
            // Published before the allocator can unmap anything.
            release(ptr as usize, layout.size());
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.0.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.size() >= TRACK_MIN {
            // The old block may move or be remapped: treat it as released.
            release(ptr as usize, layout.size());
        }
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if new_size >= TRACK_MIN && !p.is_null() {
            ACTIVE.store(true, Ordering::Relaxed);
            insert_block(p as usize, new_size);
        }
        p
    }
}

/// True once a [`TrackingAlloc`] has served a tracked allocation, i.e. it is
/// the global allocator and the cache can keep registrations.
pub fn hooks_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Blocks that could not be tracked because the table was full.
pub fn untracked_blocks() -> u64 {
    UNTRACKED.load(Ordering::Relaxed)
}

/// Declare memory that did not come from the global allocator (an `mmap`ed
/// segment, a C buffer) as cacheable.
///
/// # Safety
/// `[ptr, ptr + len)` must be mapped, and the caller must call
/// [`release_external`] for it *before* unmapping it, shrinking it, or
/// calling `madvise(MADV_DONTNEED/MADV_FREE)` on any part of it.
pub unsafe fn track_external(ptr: *const u8, len: usize) {
    if len > 0 {
        insert_block(ptr as usize, len);
    }
}

/// Counterpart of [`track_external`]: the range is about to be released.
/// Also usable for any range whose pages are about to change: it only ever
/// makes the cache drop entries.
pub fn release_external(ptr: *const u8, len: usize) {
    release(ptr as usize, len);
}

/// True when `[addr, addr + len)` lies inside a tracked live block, i.e. the
/// registration cache will keep its registration across calls.
pub fn is_tracked(addr: *const u8, len: usize) -> bool {
    tracked_block(addr as usize, len).is_some()
}

/// The tracked live block containing `[addr, addr + len)`, if any.
pub(crate) fn tracked_block(addr: usize, len: usize) -> Option<(usize, usize)> {
    let end = addr.checked_add(len)?;
    STATE.with(|s| {
        s.blocks[..s.nblocks]
            .iter()
            .copied()
            .find(|&(b, l)| b <= addr && end <= b + l)
    })
}

/// A cache's position in the release stream.
pub(crate) struct Cursor(u64);

/// What a cache must do after reading the stream.
pub(crate) enum Released {
    /// Ranges released since the last read.
    Ranges(Vec<(usize, usize)>),
    /// The cache fell behind the ring: drop everything.
    Overflow,
}

impl Cursor {
    /// Register a new cache (events are recorded from now on).
    pub(crate) fn new() -> Cursor {
        CACHES.fetch_add(1, Ordering::AcqRel);
        Cursor(STATE.with(|s| s.seq))
    }

    /// Releases since the last call; `None` when there are none (lock-free).
    pub(crate) fn read(&mut self) -> Option<Released> {
        if SEQ.load(Ordering::Acquire) == self.0 {
            return None;
        }
        let mut buf = [(0usize, 0usize); RING];
        let (n, overflow, seq) = STATE.with(|s| {
            let behind = s.seq - self.0;
            if behind > RING as u64 {
                return (0, true, s.seq);
            }
            for (k, q) in (self.0..s.seq).enumerate() {
                buf[k] = s.ring[(q % RING as u64) as usize];
            }
            (behind as usize, false, s.seq)
        });
        self.0 = seq;
        Some(if overflow {
            Released::Overflow
        } else {
            Released::Ranges(buf[..n].to_vec())
        })
    }
}

impl Drop for Cursor {
    fn drop(&mut self) {
        CACHES.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serialises unit tests that use the process-wide release stream.
#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_tracking_and_release_events() {
        let _g = TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let mut c = Cursor::new();
        let base = 0x7000_0000_0000usize;
        // SAFETY: the range is never dereferenced; only bookkeeping.
        unsafe { track_external(base as *const u8, 1 << 20) };
        assert_eq!(tracked_block(base + 4096, 8192), Some((base, 1 << 20)));
        assert_eq!(tracked_block(base + (1 << 20) - 1, 2), None);
        release_external(base as *const u8, 1 << 20);
        assert_eq!(tracked_block(base, 1), None);
        match c.read() {
            Some(Released::Ranges(r)) => assert!(r.contains(&(base, 1 << 20))),
            Some(Released::Overflow) => {} // other tests may have flooded the ring
            None => panic!("release not reported"),
        }
        // Overflow detection.
        for i in 0..(RING + 5) {
            release_external((base + i * 4096) as *const u8, 4096);
        }
        assert!(matches!(c.read(), Some(Released::Overflow)));
    }
}
