//! Ping-pong with content checks between rank 0 and every other rank, for
//! sizes around every protocol threshold. Prints the channel used to each
//! peer. Exits non-zero (with a message) on any mismatch.
//!
//! Usage: pingpong [max_bytes]   (default 16 MiB)

use ibcoll::{Comm, ANY_SOURCE, ANY_TAG};

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131) ^ (i >> 8)) as u8)
        .collect()
}

fn sizes(comm: &Comm, peer: usize, max: usize) -> Vec<usize> {
    let eager = comm.eager_limit_to(peer).unwrap_or(0);
    let mut v = vec![
        0,
        1,
        7,
        64,
        4095,
        4096,
        4097,
        eager - 1,
        eager,
        eager + 1,
        65536,
        1 << 20,
        16 << 20,
    ];
    v.retain(|&s| s <= max);
    v.sort();
    v.dedup();
    v
}

fn fail(comm: &Comm, msg: String) -> ! {
    eprintln!("pingpong rank {}: FAILED: {msg}", comm.rank());
    std::process::exit(3)
}

fn main() {
    let max: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(16 << 20);
    let comm = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let (rank, size) = (comm.rank(), comm.size());
    for peer in 1..size {
        if rank != 0 && rank != peer {
            continue;
        }
        let other = if rank == 0 { peer } else { 0 };
        let via = comm.transport_to(other).unwrap_or("?");
        if rank == 0 {
            println!(
                "rank 0 <-> rank {peer}: {via}, eager limit {}",
                comm.eager_limit_to(peer).unwrap_or(0)
            );
        }
        for (k, &len) in sizes(&comm, other, max).iter().enumerate() {
            let tag = (k % 5) as i32;
            let ping = pattern(len, peer * 1000 + k);
            let pong = pattern(len, peer * 1000 + k + 500);
            // Alternate blocking and nonblocking forms.
            let nonblocking = k % 2 == 1;
            if rank == 0 {
                if nonblocking {
                    let mut back = vec![0u8; len];
                    let st = ibcoll::scope(|sc| {
                        let r = comm
                            .irecv(sc, &mut back, peer, tag)
                            .unwrap_or_else(|e| fail(&comm, e.to_string()));
                        let s = comm
                            .isend(sc, &ping, peer, tag)
                            .unwrap_or_else(|e| fail(&comm, e.to_string()));
                        s.wait().unwrap_or_else(|e| fail(&comm, e.to_string()));
                        r.wait().unwrap_or_else(|e| fail(&comm, e.to_string()))
                    });
                    if st.len != len || st.source != peer || st.tag != tag || back != pong {
                        fail(&comm, format!("{via} size {len}: bad pong (status {st:?})"));
                    }
                } else {
                    comm.send(&ping, peer, tag)
                        .unwrap_or_else(|e| fail(&comm, e.to_string()));
                    let mut back = vec![0u8; len];
                    let st = comm
                        .recv(&mut back, peer, ANY_TAG)
                        .unwrap_or_else(|e| fail(&comm, e.to_string()));
                    if st.len != len || st.source != peer || st.tag != tag || back != pong {
                        fail(&comm, format!("{via} size {len}: bad pong (status {st:?})"));
                    }
                }
            } else {
                let mut got = vec![0u8; len];
                let st = comm
                    .recv(&mut got, ANY_SOURCE, tag)
                    .unwrap_or_else(|e| fail(&comm, e.to_string()));
                if st.len != len || st.source != 0 || got != ping {
                    fail(&comm, format!("{via} size {len}: bad ping (status {st:?})"));
                }
                comm.send(&pong, 0, tag)
                    .unwrap_or_else(|e| fail(&comm, e.to_string()));
            }
        }
        if rank == 0 {
            println!("rank 0 <-> rank {peer}: ok ({via})");
        }
    }
    // Typed buffers, and a self message.
    let vals: Vec<f64> = (0..100).map(|i| i as f64 * 0.5).collect();
    let mut back = vec![0f64; 100];
    let st = ibcoll::scope(|sc| {
        let r = comm
            .irecv(sc, &mut back, rank, 9)
            .unwrap_or_else(|e| fail(&comm, e.to_string()));
        comm.send(&vals, rank, 9)
            .unwrap_or_else(|e| fail(&comm, e.to_string()));
        r.wait().unwrap_or_else(|e| fail(&comm, e.to_string()))
    });
    if back != vals || st.count::<f64>() != 100 {
        fail(&comm, "self message mismatch".into());
    }
    comm.barrier()
        .unwrap_or_else(|e| fail(&comm, e.to_string()));
    if rank == 0 {
        println!("pingpong: all ok");
    }
}
