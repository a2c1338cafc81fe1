//! A power-of-two array of 64-byte cells in shared memory, addressed by
//! ever-growing positions: what the fast box ([`crate::ring`]) and the
//! receive queue ([`crate::queue`]) are built on. Each lays its own index
//! lines and headers out in the region; this holds the region's checks and
//! its raw accessors.

use std::sync::atomic::AtomicU64;

use crate::error::{Result, ShmError};
use crate::layout::CACHE_LINE;

/// Bytes per cell.
pub(crate) const CELL: usize = CACHE_LINE;

/// Checks that `capacity` is a power of two in `min..=max`; `what` names
/// the structure in the error.
pub(crate) fn check_capacity(capacity: usize, min: usize, max: usize, what: &str) -> Result<()> {
    if !capacity.is_power_of_two() || !(min..=max).contains(&capacity) {
        return Err(ShmError::Invalid(format!(
            "{what} capacity {capacity} must be a power of two in {min}..={max}"
        )));
    }
    Ok(())
}

/// The region of one ring or queue: `region` bytes at `base`, of which
/// `capacity` bytes are cells.
#[derive(Debug)]
pub(crate) struct Cells {
    base: *mut u8,
    region: usize,
    /// `cells - 1`: a position's cell index is `pos & mask`.
    pub mask: u64,
    /// Number of cells.
    pub cells: u64,
}

impl Cells {
    /// # Safety
    /// `base..base + region` is mapped read-write and stays mapped for the
    /// life of every handle built on the result, and its words are only
    /// accessed atomically by the processes sharing it.
    pub unsafe fn new(
        base: *mut u8,
        region: usize,
        capacity: usize,
        min: usize,
        max: usize,
        what: &str,
    ) -> Result<Cells> {
        check_capacity(capacity, min, max, what)?;
        if base.is_null() || base as usize % CELL != 0 {
            return Err(ShmError::Invalid(format!(
                "{what} base {base:p} is not {CELL}-byte aligned"
            )));
        }
        let cells = (capacity / CELL) as u64;
        Ok(Cells {
            base,
            region,
            mask: cells - 1,
            cells,
        })
    }

    /// Data capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cells as usize * CELL
    }

    /// Index of the cell at position `pos`.
    #[inline(always)]
    pub fn index(&self, pos: u64) -> usize {
        (pos & self.mask) as usize
    }

    /// Cells from position `pos` to the end of the array.
    #[inline(always)]
    pub fn to_end(&self, pos: u64) -> u64 {
        self.cells - (pos & self.mask)
    }

    /// The 8-aligned word at byte `off` of the region.
    #[inline(always)]
    pub fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.region);
        // SAFETY: callers pass offsets of 8-aligned words inside the
        // region, which the constructor's contract keeps mapped for the
        // handle's life; all concurrent access to these words is atomic.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// Byte `off` of the region.
    #[inline(always)]
    pub fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.region);
        // SAFETY: callers pass offsets inside the region (a cell's start),
        // which stays mapped (constructor contract).
        unsafe { self.base.add(off) }
    }
}
