//! Pressure on the shm receive queue, meant to run with a tiny box and
//! queue (`IBCOLL_SHM_BOX_BYTES=1024 IBCOLL_SHM_QUEUE_BYTES=4096
//! IBCOLL_EAGER_LIMIT=1024`), so that every sender finds them full:
//!
//! - `slow`: the last rank sleeps before it receives anything, while every
//!   other rank sends it 400 messages of 8 to 1000 bytes (the box and the
//!   queue fill, senders wait); then it receives them all, sender by
//!   sender, checking order and content. Prints `slow: ok (N ranks)`.
//! - `dead`: the last rank never receives and kills itself (SIGKILL) once
//!   the others are stuck on its full queue; each of them must get
//!   `PeerLost` naming it, then the survivors exchange a message among
//!   themselves. Each survivor prints `survivor R: got PeerLost after S s`.
//! - `midpub` (3 ranks, `IBCOLL_SHM_BOXES=0` so every record is queued):
//!   rank 1 sends to rank 2 and dies (SIGKILL, the
//!   `IBCOLL_TEST_DIE_MID_QUEUE` hook) after reserving its 5th record in
//!   rank 2's queue, before publishing it; rank 0 then sends rank 2 400
//!   messages, which sit behind that reservation. Rank 2 must get rank 1's
//!   complete messages, then `PeerLost` naming it, then all of rank 0's, in
//!   order and intact. Prints `midpub: ok (...)`.
//!
//! Exits 3 on any wrong result.

use std::time::{Duration, Instant};

const MSGS: usize = 400;

fn body(src: usize, i: usize) -> Vec<u8> {
    let len = 8 + (i * 131 + src * 17) % 993;
    (0..len).map(|k| (src * 31 + i * 7 + k) as u8).collect()
}

fn fail(msg: String) -> ! {
    eprintln!("queue_pressure: FAILED: {msg}");
    std::process::exit(3)
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    if what == "midpub" && std::env::var("PMI_RANK").as_deref() == Ok("1") {
        // Before init, single-threaded: the victim's hook.
        std::env::set_var("IBCOLL_TEST_DIE_MID_QUEUE", "5");
    }
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let (n, me) = (c.size(), c.rank());
    let last = n - 1;
    match (what.as_str(), me == last) {
        ("slow", true) => {
            std::thread::sleep(Duration::from_millis(300));
            let mut buf = vec![0u8; 1000];
            for i in 0..MSGS {
                for src in 0..last {
                    let st = c
                        .recv(&mut buf, src, ibcoll::ANY_TAG)
                        .unwrap_or_else(|e| fail(format!("recv from {src}: {e}")));
                    let want = body(src, i);
                    if st.tag != i as i32 || buf[..st.len] != want[..] {
                        fail(format!(
                            "message {i} of rank {src}: tag {} len {} (want {})",
                            st.tag,
                            st.len,
                            want.len()
                        ));
                    }
                }
            }
            c.barrier()
                .unwrap_or_else(|e| fail(format!("barrier: {e}")));
            println!("slow: ok ({n} ranks)");
        }
        ("slow", false) => {
            for i in 0..MSGS {
                c.send(&body(me, i), last, i as i32)
                    .unwrap_or_else(|e| fail(format!("send {i}: {e}")));
            }
            c.barrier()
                .unwrap_or_else(|e| fail(format!("barrier: {e}")));
        }
        ("dead", true) => {
            std::thread::sleep(Duration::from_millis(500));
            // SAFETY: getpid has no preconditions; SIGKILL ends us here.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            unreachable!("SIGKILL returned");
        }
        ("dead", false) => {
            let t = Instant::now();
            let mut i = 0;
            let err = loop {
                match c.send(&body(me, i), last, i as i32) {
                    Ok(()) => i += 1,
                    Err(e) => break e,
                }
                if i > 1_000_000 {
                    fail("a million sends to a rank that never receives".into());
                }
            };
            if !err.is_peer_lost() || err.peer() != Some(last) {
                fail(format!("expected PeerLost naming rank {last}, got {err}"));
            }
            println!(
                "survivor {me}: got PeerLost after {:.2} s ({i} sends went through): {err}",
                t.elapsed().as_secs_f64()
            );
            // The survivors' own queues still work.
            if last >= 2 {
                let (right, left) = ((me + 1) % last, (me + last - 1) % last);
                let mut got = [0u64; 2];
                c.sendrecv(&[me as u64, 9], right, 77, &mut got, left, 77)
                    .unwrap_or_else(|e| fail(format!("survivor exchange: {e}")));
                if got != [left as u64, 9] {
                    fail(format!("survivor exchange got {got:?}"));
                }
            }
        }
        ("midpub", _) if n != 3 => fail(format!("midpub wants 3 ranks, not {n}")),
        ("midpub", true) => {
            let mut buf = vec![0u8; 1000];
            let mut from_dead = 0;
            let err = loop {
                match c.recv(&mut buf, 1, ibcoll::ANY_TAG) {
                    Ok(st) => {
                        let want = body(1, from_dead);
                        if st.tag != from_dead as i32 || buf[..st.len] != want[..] {
                            fail(format!("message {from_dead} of the dying rank is wrong"));
                        }
                        from_dead += 1;
                    }
                    Err(e) => break e,
                }
            };
            if !err.is_peer_lost() || err.peer() != Some(1) {
                fail(format!("expected PeerLost naming rank 1, got {err}"));
            }
            for i in 0..MSGS {
                let st = c
                    .recv(&mut buf, 0, ibcoll::ANY_TAG)
                    .unwrap_or_else(|e| fail(format!("recv {i} from rank 0: {e}")));
                let want = body(0, i);
                if st.tag != i as i32 || buf[..st.len] != want[..] {
                    fail(format!("message {i} of rank 0 is wrong (len {})", st.len));
                }
            }
            println!("midpub: ok ({from_dead} messages of the dead rank, then PeerLost, then {MSGS} of rank 0 behind its reservation)");
        }
        ("midpub", false) if me == 1 => {
            for i in 0.. {
                c.send(&body(me, i), last, i as i32)
                    .unwrap_or_else(|e| fail(format!("send {i}: {e}")));
            }
        }
        ("midpub", false) => {
            // Behind the victim's reservation.
            std::thread::sleep(Duration::from_millis(300));
            for i in 0..MSGS {
                c.send(&body(me, i), last, i as i32)
                    .unwrap_or_else(|e| fail(format!("send {i}: {e}")));
            }
            // Learn of the victim's death (it never sends to us), so that
            // finalize does not wait for it.
            let mut b = [0u8; 8];
            match c.recv(&mut b, 1, 0) {
                Err(e) if e.is_peer_lost() => {}
                r => fail(format!("recv from the victim: {r:?}")),
            }
            println!("sender 0: ok");
        }
        _ => fail(format!("unknown mode {what:?}")),
    }
}
