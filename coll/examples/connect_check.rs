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
//! Rank 0 prints `survivor: got expected error after S s: ERROR`; any other
//! outcome exits 3.

use std::time::{Duration, Instant};

fn main() {
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let what = std::env::args().nth(1).unwrap_or_default();
    match (what.as_str(), c.rank()) {
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
            match c.send(&[7u8; 100], 1, 0) {
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
