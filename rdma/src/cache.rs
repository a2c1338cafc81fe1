//! Registration cache: reuse memory registrations by address range, bounded
//! in entries and pinned bytes with LRU eviction, and never stale.
//!
//! Staleness (a buffer freed, a new one allocated at the same address with
//! other pages) is handled by release notifications from
//! [`crate::mem::TrackingAlloc`]: a registration is kept across calls only
//! for ranges inside a tracked live block, and every release of a block
//! drops the entries overlapping it before the allocator can reuse the
//! address. Ranges that are not tracked are registered per call and not
//! kept. See [`crate::mem`] for the full argument.
//!
//! Entries are handed out as `Arc<MemoryRegion>`: eviction or invalidation
//! only drops the cache's reference, so a region used by in-flight requests
//! is deregistered when its last user lets go.

use crate::error::Result;
use crate::mem::{self, Cursor, Released};
use crate::verbs::{Access, MemoryRegion, ProtectionDomain};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Cache limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegCacheConfig {
    /// Most entries kept.
    pub max_entries: usize,
    /// Most bytes kept registered (pinned) by the cache.
    pub max_bytes: usize,
    /// Access rights of every registration.
    pub access: Access,
    /// Register the whole tracked block containing a request (better reuse
    /// for sub-slices) when it is at most this large; else the exact range.
    pub whole_block_max: usize,
}

impl Default for RegCacheConfig {
    fn default() -> Self {
        RegCacheConfig {
            max_entries: 512,
            max_bytes: 1 << 30,
            access: Access::RDMA,
            whole_block_max: 64 << 20,
        }
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests that registered and kept the registration.
    pub misses: u64,
    /// Requests registered per use (untracked memory, or too large).
    pub uncached: u64,
    /// Entries dropped to respect the limits.
    pub evictions: u64,
    /// Entries dropped because their memory was released.
    pub invalidations: u64,
    /// Times the release stream overflowed and everything was dropped.
    pub flushes: u64,
}

/// What the cache registers with; a trait so the policy is testable
/// without a device.
pub(crate) trait Registrar {
    type Handle;
    /// # Safety
    /// `[addr, addr + len)` must be mapped.
    unsafe fn register(&self, addr: usize, len: usize) -> Result<Self::Handle>;
}

struct Entry<H> {
    start: usize,
    len: usize,
    handle: Arc<H>,
    last_use: u64,
}

struct Inner<H> {
    entries: HashMap<(usize, usize), Entry<H>>,
    bytes: usize,
    tick: u64,
    cursor: Cursor,
    stats: CacheStats,
}

pub(crate) struct Core<R: Registrar> {
    reg: R,
    cfg: RegCacheConfig,
    inner: Mutex<Inner<R::Handle>>,
}

fn overlaps(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

impl<R: Registrar> Core<R> {
    pub(crate) fn new(reg: R, cfg: RegCacheConfig) -> Self {
        Core {
            reg,
            cfg,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                bytes: 0,
                tick: 0,
                cursor: Cursor::new(),
                stats: CacheStats::default(),
            }),
        }
    }

    fn apply_releases(inner: &mut Inner<R::Handle>) {
        match inner.cursor.read() {
            None => {}
            Some(Released::Overflow) => {
                inner.stats.flushes += 1;
                inner.stats.invalidations += inner.entries.len() as u64;
                inner.entries.clear();
                inner.bytes = 0;
            }
            Some(Released::Ranges(rs)) => {
                for (a, l) in rs {
                    let before = inner.entries.len();
                    let mut freed = 0;
                    inner.entries.retain(|_, e| {
                        let keep = !overlaps(e.start, e.len, a, l);
                        if !keep {
                            freed += e.len;
                        }
                        keep
                    });
                    inner.bytes -= freed;
                    inner.stats.invalidations += (before - inner.entries.len()) as u64;
                }
            }
        }
    }

    /// # Safety
    /// `[addr, addr + len)` must be mapped and stay so while the caller uses
    /// the returned handle for it.
    pub(crate) unsafe fn get(&self, addr: usize, len: usize) -> Result<Arc<R::Handle>> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let inner = &mut *g;
        Self::apply_releases(inner);
        inner.tick += 1;
        let tick = inner.tick;
        let end = addr.saturating_add(len);
        let hit = if let Some(e) = inner.entries.get_mut(&(addr, len)) {
            Some(e)
        } else {
            inner
                .entries
                .values_mut()
                .find(|e| e.start <= addr && end <= e.start + e.len)
        };
        if let Some(e) = hit {
            e.last_use = tick;
            inner.stats.hits += 1;
            return Ok(e.handle.clone());
        }
        let range = match mem::tracked_block(addr, len) {
            Some((b, bl)) if bl <= self.cfg.whole_block_max && bl <= self.cfg.max_bytes => {
                Some((b, bl))
            }
            Some(_) if len <= self.cfg.max_bytes => Some((addr, len)),
            _ => None,
        };
        let Some((start, rlen)) = range else {
            inner.stats.uncached += 1;
            // SAFETY: forwarded contract.
            return Ok(Arc::new(unsafe { self.reg.register(addr, len) }?));
        };
        // Make room (LRU).
        while !inner.entries.is_empty()
            && (inner.entries.len() >= self.cfg.max_entries
                || inner.bytes + rlen > self.cfg.max_bytes)
        {
            let key = inner
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| *k)
                .expect("non-empty");
            let e = inner.entries.remove(&key).expect("present");
            inner.bytes -= e.len;
            inner.stats.evictions += 1;
        }
        // SAFETY: `[start, start+rlen)` is either the caller's range or the
        // live tracked block containing it, hence mapped.
        let handle = Arc::new(unsafe { self.reg.register(start, rlen) }?);
        inner.stats.misses += 1;
        if self.cfg.max_entries > 0 {
            inner.bytes += rlen;
            inner.entries.insert(
                (start, rlen),
                Entry {
                    start,
                    len: rlen,
                    handle: handle.clone(),
                    last_use: tick,
                },
            );
        }
        Ok(handle)
    }

    pub(crate) fn stats(&self) -> CacheStats {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).stats
    }

    pub(crate) fn usage(&self) -> (usize, usize) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Self::apply_releases(&mut g);
        (g.entries.len(), g.bytes)
    }

    pub(crate) fn flush(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.entries.clear();
        g.bytes = 0;
    }
}

struct PdRegistrar {
    pd: Arc<ProtectionDomain>,
    access: Access,
}

impl Registrar for PdRegistrar {
    type Handle = MemoryRegion;
    unsafe fn register(&self, addr: usize, len: usize) -> Result<MemoryRegion> {
        // SAFETY: forwarded contract (range mapped).
        unsafe { MemoryRegion::register_raw(&self.pd, addr as *mut u8, len, self.access) }
    }
}

/// The registration cache of one protection domain.
pub struct RegCache {
    core: Core<PdRegistrar>,
}

impl RegCache {
    /// A cache registering with `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, cfg: RegCacheConfig) -> RegCache {
        RegCache {
            core: Core::new(
                PdRegistrar {
                    pd: pd.clone(),
                    access: cfg.access,
                },
                cfg,
            ),
        }
    }

    /// A region covering `buf` (cached when possible).
    ///
    /// The region stays registered while the returned `Arc` lives, but it
    /// describes `buf`'s memory only while `buf` is alive: post requests on
    /// it only under that condition (the `unsafe` contract of posting).
    pub fn get(&self, buf: &[u8]) -> Result<Arc<MemoryRegion>> {
        // SAFETY: a live slice is mapped memory.
        unsafe { self.core.get(buf.as_ptr() as usize, buf.len().max(1)) }
    }

    /// Like [`get`](Self::get) for a raw range.
    ///
    /// # Safety
    /// The range must be mapped memory of this process.
    pub unsafe fn get_raw(&self, addr: *const u8, len: usize) -> Result<Arc<MemoryRegion>> {
        // SAFETY: forwarded contract.
        unsafe { self.core.get(addr as usize, len.max(1)) }
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.core.stats()
    }

    /// (entries, bytes) currently kept.
    pub fn usage(&self) -> (usize, usize) {
        self.core.usage()
    }

    /// Drop every entry.
    pub fn flush(&self) {
        self.core.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake(AtomicUsize);
    impl Registrar for Fake {
        type Handle = (usize, usize, usize);
        unsafe fn register(&self, addr: usize, len: usize) -> Result<Self::Handle> {
            Ok((addr, len, self.0.fetch_add(1, Ordering::Relaxed)))
        }
    }

    fn cfg(max_entries: usize, max_bytes: usize) -> RegCacheConfig {
        RegCacheConfig {
            max_entries,
            max_bytes,
            access: Access::RDMA,
            whole_block_max: 1 << 20,
        }
    }

    // Fake addresses, declared as external tracked blocks (never dereferenced).
    fn block(n: usize, len: usize) -> usize {
        let a = 0x6100_0000_0000usize + n * (1 << 24);
        // SAFETY: bookkeeping only; the fake registrar never touches memory.
        unsafe { mem::track_external(a as *const u8, len) };
        a
    }

    #[test]
    fn hits_subranges_and_untracked() {
        let _g = mem::TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let c = Core::new(Fake(AtomicUsize::new(0)), cfg(8, 1 << 30));
        let a = block(1, 1 << 16);
        // SAFETY: fake registrar.
        unsafe {
            let h1 = c.get(a + 100, 1000).unwrap();
            assert_eq!((h1.0, h1.1), (a, 1 << 16), "whole block registered");
            let h2 = c.get(a + 5000, 100).unwrap();
            assert!(Arc::ptr_eq(&h1, &h2));
            let s = c.stats();
            assert_eq!((s.hits, s.misses), (1, 1));
            // Untracked memory is never kept.
            let u1 = c.get(0x10, 64).unwrap();
            let u2 = c.get(0x10, 64).unwrap();
            assert_ne!(u1.2, u2.2);
            assert_eq!(c.stats().uncached, 2);
        }
        mem::release_external(a as *const u8, 1 << 16);
    }

    #[test]
    fn release_invalidates_and_reregisters() {
        let _g = mem::TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let c = Core::new(Fake(AtomicUsize::new(0)), cfg(8, 1 << 30));
        let a = block(2, 1 << 16);
        // SAFETY: fake registrar.
        unsafe {
            let h1 = c.get(a, 4096).unwrap();
            // "free" the buffer and "allocate" a new one at the same address.
            mem::release_external(a as *const u8, 1 << 16);
            mem::track_external(a as *const u8, 1 << 16);
            let h2 = c.get(a, 4096).unwrap();
            assert_ne!(h1.2, h2.2, "stale registration reused");
            assert!(c.stats().invalidations >= 1);
        }
        mem::release_external(a as *const u8, 1 << 16);
    }

    #[test]
    fn lru_bounds_entries_and_bytes() {
        let _g = mem::TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let c = Core::new(Fake(AtomicUsize::new(0)), cfg(3, 3 * 65536));
        let bs: Vec<usize> = (10..15).map(|i| block(i, 65536)).collect();
        // SAFETY: fake registrar.
        unsafe {
            for &b in &bs[..3] {
                c.get(b, 10).unwrap();
            }
            c.get(bs[0], 10).unwrap(); // bs[0] most recent; bs[1] is LRU
            c.get(bs[3], 10).unwrap(); // evicts bs[1]
            assert_eq!(c.usage(), (3, 3 * 65536));
            let before = c.stats().misses;
            c.get(bs[0], 10).unwrap();
            c.get(bs[2], 10).unwrap();
            assert_eq!(c.stats().misses, before, "bs[0], bs[2] still cached");
            c.get(bs[1], 10).unwrap();
            assert_eq!(c.stats().misses, before + 1, "bs[1] was evicted");
            assert!(c.stats().evictions >= 2);
        }
        // Byte bound: a cache of 100 KiB holds one 64 KiB block at a time.
        let c2 = Core::new(Fake(AtomicUsize::new(0)), cfg(100, 100 * 1024));
        // SAFETY: fake registrar.
        unsafe {
            c2.get(bs[0], 1).unwrap();
            c2.get(bs[1], 1).unwrap();
        }
        assert_eq!(c2.usage(), (1, 65536));
        for b in bs {
            mem::release_external(b as *const u8, 65536);
        }
    }
}
