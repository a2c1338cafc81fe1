//! Host-side test of the release hooks (no RDMA device needed): with
//! `TrackingAlloc` as the global allocator, large blocks are tracked while
//! alive and untracked once freed, also under concurrent churn.

use ibcoll_rdma::mem::{self, TrackingAlloc, TRACK_MIN};

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc::new(std::alloc::System);

#[test]
fn large_blocks_tracked_while_alive() {
    let v = vec![1u8; 1 << 20];
    assert!(mem::hooks_active());
    assert!(mem::is_tracked(v.as_ptr(), v.len()));
    assert!(mem::is_tracked(v[1000..].as_ptr(), 5000));
    assert!(
        !mem::is_tracked(v.as_ptr(), v.len() + 1),
        "range beyond the block"
    );
    let small = vec![0u8; TRACK_MIN / 2];
    assert!(
        !mem::is_tracked(small.as_ptr(), small.len()),
        "small blocks are never cached"
    );
    let (p, n) = (v.as_ptr(), v.len());
    drop(v);
    assert!(!mem::is_tracked(p, n), "freed block still tracked");

    // Growth by realloc: the new block is tracked.
    let mut g: Vec<u8> = Vec::with_capacity(TRACK_MIN);
    g.resize(TRACK_MIN, 7);
    g.reserve_exact(8 << 20);
    assert!(mem::is_tracked(g.as_ptr(), g.capacity()));
}

#[test]
fn concurrent_churn_keeps_table_consistent() {
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..2000usize {
                    let len = TRACK_MIN + ((i * 7919 + t * 104729) % (256 * 1024));
                    let v = vec![t as u8; len];
                    assert!(mem::is_tracked(v.as_ptr(), len));
                    let (p, n) = (v.as_ptr(), v.len());
                    drop(v);
                    // Another thread may have been handed the same address.
                    let _ = mem::is_tracked(p, n);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(mem::untracked_blocks(), 0);
}
