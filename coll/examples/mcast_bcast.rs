//! Broadcasts checked byte by byte, for the multicast broadcast tests
//! (`coll/tests/mcast.rs`; run with `IBCOLL_BCAST_ALGORITHM=mcast`).
//!
//!     mcast_bcast [MAX_BYTES] [ROUNDS]
//!
//! Sizes 0, 1, one fragment -1/0/+1 for 1 KiB and 4 KiB path MTUs, 64 KiB
//! and then powers of 4 up to MAX_BYTES (default 1 MiB); the root rotates
//! over every rank; each size is broadcast on the world and on a duplicate
//! of it, alternately, so two communicators (two groups) are in use at
//! once. Then, for each size, an allreduce (sum of `u64`s, in place on
//! the duplicate) on both communicators and a barrier (run with
//! `IBCOLL_ALLREDUCE_ALGORITHM=mcast` and `IBCOLL_BARRIER_ALGORITHM=mcast`
//! these multicast too). Prints `mcast_bcast: N broadcasts ok` and
//! `mcast_bcast: N allreduces ok` on rank 0.

fn main() -> ibcoll::Result<()> {
    let world = ibcoll::init()?;
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let max = args.first().copied().unwrap_or(1 << 20);
    let rounds = args.get(1).copied().unwrap_or(1);
    let dup = world.dup()?;
    let (rank, size) = (world.rank(), world.size());
    let mut sizes = vec![0, 1, 991, 992, 993, 4063, 4064, 4065, 65536];
    let mut s = 1 << 18;
    while s <= max {
        sizes.push(s);
        s *= 4;
    }
    if !sizes.contains(&max) && max > 65536 {
        sizes.push(max);
    }
    let mut k = 0usize;
    for _ in 0..rounds {
        for &len in &sizes {
            for (ci, comm) in [&world, &dup].into_iter().enumerate() {
                let root = (k + ci) % size;
                let fill = |i: usize| {
                    (i.wrapping_mul(2_654_435_761) >> 7) as u8 ^ (k as u8) ^ (ci as u8 * 0x55)
                };
                let mut buf: Vec<u8> = if rank == root {
                    (0..len).map(fill).collect()
                } else {
                    vec![0xEE; len]
                };
                comm.bcast(&mut buf, root)?;
                if let Some(i) = (0..len).find(|&i| buf[i] != fill(i)) {
                    eprintln!("rank {rank}: broadcast {k} on comm {ci} ({len} B from {root}): byte {i} wrong");
                    std::process::exit(1);
                }
                k += 1;
            }
        }
    }
    let mut m = 0usize;
    for &len in &sizes {
        let count = len / 8;
        let v = |r: usize, i: usize| (r as u64 + 1).wrapping_mul(i as u64 ^ 0x9e37) ^ m as u64;
        let want: Vec<u64> = (0..count)
            .map(|i| (0..size).map(|r| v(r, i)).fold(0u64, u64::wrapping_add))
            .collect();
        let mine: Vec<u64> = (0..count).map(|i| v(rank, i)).collect();
        let mut got = vec![0u64; count];
        world.allreduce(&mine, &mut got, ibcoll::ReduceOp::Sum)?;
        let mut inplace = mine.clone();
        dup.allreduce_in_place(&mut inplace, ibcoll::ReduceOp::Sum)?;
        for (which, g) in [("world", &got), ("dup in place", &inplace)] {
            if let Some(i) = (0..count).find(|&i| g[i] != want[i]) {
                eprintln!("rank {rank}: allreduce {m} on {which} ({count} u64): element {i} wrong");
                std::process::exit(1);
            }
        }
        world.barrier()?;
        m += 1;
    }
    world.barrier()?;
    if rank == 0 {
        println!("mcast_bcast: {k} broadcasts ok");
        println!("mcast_bcast: {m} allreduces ok");
    }
    Ok(())
}
