//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

/// A name no other test (or concurrent test run) uses.
pub fn unique(tag: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "ibcoll-test{}_{}-{tag}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Small deterministic PRNG (xorshift64*), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Byte `j` of record `i`: depends on both, so misplaced or stale bytes show.
pub fn pattern(i: u64, j: usize) -> u8 {
    (i.wrapping_mul(31).wrapping_add(j as u64 * 7) ^ (j as u64 >> 8)) as u8
}

/// Length of record `i` of a stream: mostly small, sometimes up to `max`.
pub fn record_len(i: u64, max: usize) -> usize {
    let mut r = Rng::new(i);
    match r.below(4) {
        0 => r.below(max + 1),
        _ => r.below(64.min(max + 1)),
    }
}

/// Record `i` of a stream whose records are at most `max` bytes.
pub fn record(i: u64, max: usize) -> Vec<u8> {
    (0..record_len(i, max)).map(|j| pattern(i, j)).collect()
}

/// Panics unless `bytes` is record `i`.
pub fn check_record(i: u64, max: usize, bytes: &[u8]) {
    assert_eq!(bytes.len(), record_len(i, max), "length of record {i}");
    for (j, &b) in bytes.iter().enumerate() {
        assert_eq!(b, pattern(i, j), "record {i} byte {j}");
    }
}

/// 128-byte aligned zeroed memory standing in for a segment region.
pub struct Region(Vec<u128>);

impl Region {
    pub fn new(len: usize) -> Region {
        Region(vec![0u128; len / 16 + 16])
    }
    pub fn base(&mut self) -> *mut u8 {
        let p = self.0.as_mut_ptr() as *mut u8;
        p.wrapping_add(p.align_offset(128))
    }
}
