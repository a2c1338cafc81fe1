//! Rank 1 dies (SIGKILL) in the middle of talking to rank 0; rank 0 must
//! get an error from its pending receive, not hang. Rank 0 prints
//! `survivor: got expected error: ...` and exits 0, or exits 3.
//!
//! Rank 1 first sends a small message, then starts a large rendezvous send
//! (whose data rank 0 never takes), then kills itself. Rank 0 receives the
//! small message and then waits for a message rank 1 never sends.
//!
//! `peer_death exit`: rank 1 ends with `_exit(1)` instead (no destructors,
//! no finalize; the kernel closes its sockets just the same). Slurm ends a
//! whole step as soon as one task dies of a signal, which races the
//! survivor's report; an abnormal exit does not.
//!
//! `peer_death starve`: the survivor is a sender starved of credits. Rank
//! 0 sends one message, then posts 500 more; rank 1 takes the first, stops
//! making progress for 300 ms (so it grants no credits: with a small
//! shared receive queue rank 0 runs out and asks in vain), then kills
//! itself. Rank 0's wait must end with PeerLost.

fn main() {
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    if c.size() < 2 {
        eprintln!("peer_death needs 2 ranks");
        std::process::exit(2);
    }
    let starve = std::env::args().nth(1).as_deref() == Some("starve");
    match c.rank() {
        1 if starve => {
            let mut b = [0u8; 16];
            c.recv(&mut b, 0, 0).expect("first message");
            std::thread::sleep(std::time::Duration::from_millis(300));
            // SAFETY: getpid has no preconditions; SIGKILL ends us here.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            unreachable!("SIGKILL returned");
        }
        1 => {
            c.send(&[1u8; 16], 0, 0).expect("send");
            let big = vec![7u8; 16 << 20];
            ibcoll::scope(|s| {
                let _pending = c.isend(s, &big, 0, 1).expect("isend");
                if std::env::args().nth(1).as_deref() == Some("exit") {
                    // SAFETY: _exit ends the process at once; nothing runs after it.
                    unsafe { libc::_exit(1) }
                }
                // SAFETY: getpid has no preconditions; SIGKILL ends us here.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                unreachable!("SIGKILL returned");
            })
        }
        0 => {
            let t = std::time::Instant::now();
            let res = if starve {
                c.send(&[1u8; 16], 1, 0).expect("first message");
                let msgs: Vec<[u8; 64]> = (0..500).map(|i| [i as u8; 64]).collect();
                ibcoll::scope(|s| {
                    let mut reqs = Vec::new();
                    for m in &msgs {
                        match c.isend(s, m, 1, 2) {
                            Ok(r) => reqs.push(r),
                            Err(e) => return Err(e),
                        }
                    }
                    ibcoll::wait_all(reqs).map(|_| ())
                })
            } else {
                let mut b = [0u8; 16];
                c.recv(&mut b, 1, 0).expect("first message");
                let mut never = [0u8; 8];
                c.recv(&mut never, 1, 2).map(|_| ())
            };
            match res {
                Err(e) if e.is_peer_lost() && e.peer() == Some(1) => {
                    println!(
                        "survivor: got expected error after {:.2} s: {e}",
                        t.elapsed().as_secs_f64()
                    );
                }
                other => {
                    eprintln!("survivor: expected PeerLost from rank 1, got {other:?}");
                    std::process::exit(3);
                }
            }
            // The job goes on without rank 1: talking to ourselves works.
            c.send(&[5u8], 0, 9).expect("self send");
            let mut x = [0u8];
            c.recv(&mut x, 0, 9).expect("self recv");
            // Sending to the dead rank is an error too, not a hang.
            match c.send(&[0u8; 100_000], 1, 3) {
                Err(e) => println!("survivor: send to dead rank: {e}"),
                Ok(()) => {
                    eprintln!("survivor: send to the dead rank succeeded");
                    std::process::exit(3);
                }
            }
        }
        _ => {}
    }
}
