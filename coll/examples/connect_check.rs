//! First contacts that go wrong, for the tests (2 ranks on two nodes,
//! started without a launcher that would end the job for them):
//!
//! - `connect_check dead-before-contact`: rank 1 dies right after init,
//!   before anyone talked to it; rank 0's first send to it must fail with
//!   `PeerLost` naming rank 1, within the bound, not hang.
//! - `connect_check unreachable`: rank 1 publishes an address nothing
//!   listens on (the test sets `IBCOLL_TCP_HOST` for it); rank 0's send
//!   must fail naming rank 1 and the address it tried.
//!
//! - `connect_check dies-after-answering`: rank 1 stays out of the
//!   library for a second, then answers first contacts for 1.5 s (an rdma
//!   handshake completes) and dies; rank 0's 1 MiB send to it must fail
//!   with `PeerLost` naming rank 1.
//!
//! Rank 0 prints `survivor: got expected error after S s: ERROR`; any other
//! outcome exits 3.
//!
//! And first contacts that go right, for any number of ranks:
//!
//! - `connect_check ring`: each rank sends to its right neighbour and
//!   receives from its left (20 laps, no barrier: nobody else is talked
//!   to), printing `ring: ok (N ranks)` on rank 0.
//! - `connect_check crossing`: every rank sends to every other at once (a
//!   small message and a 100 KiB one), so every pair's first messages
//!   cross; each checks what it got and prints `crossing: ok`.

use std::time::{Duration, Instant};

fn main() {
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let what = std::env::args().nth(1).unwrap_or_default();
    match what.as_str() {
        "ring" => return ring(&c),
        "crossing" => return crossing(&c),
        _ => {}
    }
    match (what.as_str(), c.rank()) {
        ("dies-after-answering", 1) => {
            std::thread::sleep(Duration::from_secs(1));
            let end = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < end {
                let _ = c.iprobe(ibcoll::ANY_SOURCE, ibcoll::ANY_TAG);
                std::thread::sleep(Duration::from_millis(1));
            }
            // SAFETY: getpid has no preconditions; SIGKILL ends us here.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        ("dead-before-contact", 1) => {
            // SAFETY: getpid has no preconditions; SIGKILL ends us here.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        ("unreachable", 1) => {
            // Stay alive (and in the library) while rank 0 finds out; the
            // test ends this rank.
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                let _ = c.iprobe(ibcoll::ANY_SOURCE, ibcoll::ANY_TAG);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        (_, 0) => {
            let t = Instant::now();
            // A rendezvous send needs the peer to take it: it cannot end
            // before the peer is found dead.
            let len = if what == "dies-after-answering" {
                1 << 20
            } else {
                100
            };
            match c.send(&vec![7u8; len], 1, 0) {
                Err(e) if e.is_peer_lost() && e.peer() == Some(1) => println!(
                    "survivor: got expected error after {:.2} s: {e}",
                    t.elapsed().as_secs_f64()
                ),
                other => {
                    eprintln!("expected PeerLost from rank 1, got {other:?}");
                    std::process::exit(3)
                }
            }
            std::process::exit(0);
        }
        _ => {}
    }
}

fn fail(c: &ibcoll::Comm, what: String) -> ! {
    eprintln!("rank {}: {what}", c.rank());
    std::process::exit(3)
}

fn ring(c: &ibcoll::Comm) {
    let (r, n) = (c.rank(), c.size());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for lap in 0..20u64 {
        let mut tok = [0u64];
        if r == 0 {
            tok[0] = lap * 1000;
            c.send(&tok, right, 0)
                .unwrap_or_else(|e| fail(c, e.to_string()));
            c.recv(&mut tok, left, 0)
                .unwrap_or_else(|e| fail(c, e.to_string()));
            if tok[0] != lap * 1000 + n as u64 - 1 {
                fail(c, format!("lap {lap}: token {}", tok[0]));
            }
        } else {
            c.recv(&mut tok, left, 0)
                .unwrap_or_else(|e| fail(c, e.to_string()));
            tok[0] += 1;
            c.send(&tok, right, 0)
                .unwrap_or_else(|e| fail(c, e.to_string()));
        }
    }
    if r == 0 {
        println!("ring: ok ({n} ranks)");
    }
}

fn crossing(c: &ibcoll::Comm) {
    let (r, n) = (c.rank(), c.size());
    let small: Vec<Vec<u8>> = (0..n).map(|p| vec![(r * 16 + p) as u8; 64]).collect();
    let big: Vec<Vec<u8>> = (0..n)
        .map(|p| (0..100 << 10).map(|i| (i + r * 7 + p) as u8).collect())
        .collect();
    let mut got_small = vec![vec![0u8; 64]; n];
    let mut got_big = vec![vec![0u8; 100 << 10]; n];
    ibcoll::scope(|s| {
        let mut reqs = Vec::new();
        // Sends first, everywhere at once: every pair's first messages cross.
        for p in (0..n).filter(|&p| p != r) {
            reqs.push(
                c.isend(s, &small[p], p, 1)
                    .unwrap_or_else(|e| fail(c, e.to_string())),
            );
            reqs.push(
                c.isend(s, &big[p], p, 2)
                    .unwrap_or_else(|e| fail(c, e.to_string())),
            );
        }
        for (p, (gs, gb)) in got_small.iter_mut().zip(got_big.iter_mut()).enumerate() {
            if p == r {
                continue;
            }
            reqs.push(
                c.irecv(s, gs, p, 1)
                    .unwrap_or_else(|e| fail(c, e.to_string())),
            );
            reqs.push(
                c.irecv(s, gb, p, 2)
                    .unwrap_or_else(|e| fail(c, e.to_string())),
            );
        }
        for q in reqs {
            q.wait().unwrap_or_else(|e| fail(c, e.to_string()));
        }
    });
    for p in (0..n).filter(|&p| p != r) {
        if got_small[p] != vec![(p * 16 + r) as u8; 64] {
            fail(c, format!("small message from rank {p} is wrong"));
        }
        if got_big[p]
            .iter()
            .enumerate()
            .any(|(i, &b)| b != (i + p * 7 + r) as u8)
        {
            fail(c, format!("large message from rank {p} is wrong"));
        }
    }
    println!("crossing: ok (rank {r} of {n})");
}
