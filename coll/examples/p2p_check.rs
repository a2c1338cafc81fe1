//! Point-to-point semantics checks, run as `p2p_check <check>...` under
//! ibrun with any number of ranks (checks needing a partner skip when
//! alone). Checks: anysource order wildcard probe truncate ssend split ring
//! all, and (not in all) manytoone.
//! Exits non-zero with a message on the first failure.

use ibcoll::{wait_all, wait_any, Comm, Error, ANY_SOURCE, ANY_TAG, UNDEFINED};

fn fail(comm: &Comm, msg: String) -> ! {
    eprintln!("p2p_check rank {}: FAILED: {msg}", comm.rank());
    std::process::exit(3)
}

macro_rules! ok {
    ($comm:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => fail($comm, format!("{}:{}: {e}", file!(), line!())),
        }
    };
}

macro_rules! check {
    ($comm:expr, $cond:expr, $($fmt:tt)*) => {
        if !$cond {
            fail($comm, format!($($fmt)*));
        }
    };
}

/// Every rank > 0 sends `per` messages to rank 0, which takes them with
/// ANY_SOURCE/ANY_TAG and checks each source's order.
fn anysource(c: &Comm) {
    let per = 200u64;
    let n = c.size();
    if c.rank() == 0 {
        let mut next = vec![0u64; n];
        let mut buf = vec![0u64; 12_000];
        for _ in 0..(n as u64 - 1) * per {
            let st = ok!(c, c.recv(&mut buf, ANY_SOURCE, ANY_TAG));
            check!(
                c,
                st.source > 0 && st.source < n,
                "bad source {}",
                st.source
            );
            check!(
                c,
                st.tag == st.source as i32,
                "tag {} from {}",
                st.tag,
                st.source
            );
            check!(
                c,
                buf[0] == next[st.source],
                "from {}: got seq {} expected {}",
                st.source,
                buf[0],
                next[st.source]
            );
            check!(
                c,
                st.count::<u64>() == msg_len(buf[0]),
                "length {} for seq {}",
                st.len,
                buf[0]
            );
            next[st.source] += 1;
        }
    } else {
        for i in 0..per {
            let mut m = vec![i; msg_len(i)];
            m[0] = i;
            ok!(c, c.send(&m, 0, c.rank() as i32));
        }
    }
}

/// Word `j` of message `i` from `src` (`manytoone`).
fn word(src: usize, i: u64, j: usize) -> u64 {
    ((src as u64) << 48) ^ (i << 24) ^ j as u64 ^ 0x5a5a_0000_0000
}

/// Every rank > 0 posts all its `per` messages to rank 0 at once
/// (nonblocking: deep send queues, so senders outrun the receiver's
/// buffers), rank 0 takes them with ANY_SOURCE after a pause (everything
/// piles up first), and every word of every message is checked.
fn manytoone(c: &Comm) {
    let per = 400u64;
    let n = c.size();
    if c.rank() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut next = vec![0u64; n];
        let mut buf = vec![0u64; 12_000];
        for _ in 0..(n as u64 - 1) * per {
            let st = ok!(c, c.recv(&mut buf, ANY_SOURCE, 9));
            let src = st.source;
            check!(c, src > 0 && src < n, "bad source {src}");
            let i = next[src];
            let len = st.count::<u64>();
            check!(
                c,
                len == msg_len(i),
                "from {src}: length {len} for message {i}"
            );
            for (j, &w) in buf[..len].iter().enumerate() {
                check!(
                    c,
                    w == word(src, i, j),
                    "from {src}: message {i} word {j} is {w:#x}, expected {:#x}",
                    word(src, i, j)
                );
            }
            next[src] += 1;
        }
    } else {
        let me = c.rank();
        let bufs: Vec<Vec<u64>> = (0..per)
            .map(|i| (0..msg_len(i)).map(|j| word(me, i, j)).collect())
            .collect();
        ibcoll::scope(|s| {
            let reqs: Vec<_> = bufs.iter().map(|b| ok!(c, c.isend(s, b, 0, 9))).collect();
            ok!(c, wait_all(reqs));
        });
    }
}

/// Mostly small, some past each eager limit.
fn msg_len(i: u64) -> usize {
    match i % 50 {
        7 => 1000,
        13 => 10_000,
        _ => 1 + (i as usize % 17),
    }
}

/// 10,000 messages, same tag, between pairs (2k+1 -> 2k): received in the
/// order sent, whether the receive was posted early or late.
fn order(c: &Comm) {
    let count = 10_000u64;
    let r = c.rank();
    if r % 2 == 1 {
        let bufs: Vec<Vec<u64>> = (0..count).map(|i| vec![i; msg_len(i)]).collect();
        ibcoll::scope(|s| {
            let mut reqs = Vec::new();
            for (i, b) in bufs.iter().enumerate() {
                if i % 3 == 0 {
                    reqs.push(ok!(c, c.isend(s, b, r - 1, 5)));
                } else {
                    ok!(c, c.send(b, r - 1, 5));
                }
                if reqs.len() > 64 {
                    ok!(c, wait_all(reqs.drain(..)));
                }
            }
            ok!(c, wait_all(reqs));
        });
    } else if r + 1 < c.size() {
        let mut i = 0u64;
        while i < count {
            if i % 100 < 50 {
                // Pre-post a window of receives.
                let k = 10.min(count - i) as usize;
                let mut bufs = vec![vec![0u64; 10_000]; k];
                let sts = ibcoll::scope(|s| {
                    let reqs: Vec<_> = bufs
                        .iter_mut()
                        .map(|b| ok!(c, c.irecv(s, b, r + 1, 5)))
                        .collect();
                    ok!(c, wait_all(reqs))
                });
                for (j, (b, st)) in bufs.iter().zip(&sts).enumerate() {
                    let want = i + j as u64;
                    check!(
                        c,
                        b[0] == want && st.count::<u64>() == msg_len(want),
                        "order: got {} expected {want}",
                        b[0]
                    );
                }
                i += k as u64;
            } else {
                let mut b = vec![0u64; 10_000];
                let st = ok!(c, c.recv(&mut b, r + 1, 5));
                check!(
                    c,
                    b[0] == i && st.count::<u64>() == msg_len(i),
                    "order: got {} expected {i}",
                    b[0]
                );
                i += 1;
            }
        }
    }
}

/// Tag selection and wildcards; also wait_any.
fn wildcard(c: &Comm) {
    if c.size() < 2 {
        return;
    }
    match c.rank() {
        1 => {
            for t in [5, 3, 9] {
                ok!(c, c.send(&[t as u32], 0, t));
            }
            ok!(c, c.send(&[7u32; 3000], 0, 11));
        }
        0 => {
            let mut b = [0u32];
            let st = ok!(c, c.recv(&mut b, 1, 9));
            check!(c, b[0] == 9 && st.tag == 9, "tag 9 recv got {}", b[0]);
            let st = ok!(c, c.recv(&mut b, ANY_SOURCE, ANY_TAG));
            check!(
                c,
                b[0] == 5 && st.tag == 5 && st.source == 1,
                "first ANY_TAG got {}",
                b[0]
            );
            let st = ok!(c, c.recv(&mut b, 1, ANY_TAG));
            check!(c, b[0] == 3 && st.tag == 3, "second ANY_TAG got {}", b[0]);
            let mut never = [0u32];
            let mut big = [0u32; 3000];
            ibcoll::scope(|s| {
                let mut reqs = vec![
                    ok!(c, c.irecv(s, &mut never, ANY_SOURCE, 99)),
                    ok!(c, c.irecv(s, &mut big, ANY_SOURCE, 11)),
                ];
                let (i, st) = wait_any(&mut reqs).unwrap();
                let st = ok!(c, st);
                check!(c, i == 1 && st.len == 12000, "wait_any returned {i} {st:?}");
                // Complete the dangling receive ourselves.
                ok!(c, c.send(&[1u32], 0, 99));
                let (i, st) = wait_any(&mut reqs).unwrap();
                check!(c, i == 0 && ok!(c, st).len == 4, "second wait_any {i}");
                check!(c, wait_any(&mut reqs).is_none(), "third wait_any not None");
            });
            check!(
                c,
                big.iter().all(|&x| x == 7) && never[0] == 1,
                "wildcard content"
            );
        }
        _ => {}
    }
}

fn probe(c: &Comm) {
    if c.size() < 2 {
        return;
    }
    match c.rank() {
        0 => {
            ok!(c, c.barrier());
            for _ in 0..2 {
                let st = ok!(c, c.probe(ANY_SOURCE, ANY_TAG));
                check!(
                    c,
                    st.source == 1 && (st.tag == 4 || st.tag == 6),
                    "probe status {st:?}"
                );
                let mut b = vec![0u8; st.len];
                let st2 = ok!(c, c.recv(&mut b, st.source, st.tag));
                check!(
                    c,
                    st2 == st && b.iter().all(|&x| x == st.tag as u8),
                    "probe then recv {st2:?}"
                );
            }
            check!(
                c,
                ok!(c, c.iprobe(ANY_SOURCE, ANY_TAG)).is_none(),
                "iprobe found a ghost"
            );
            ok!(c, c.barrier());
        }
        1 => {
            ok!(c, c.send(&[4u8; 333], 0, 4));
            ok!(c, c.barrier());
            ok!(c, c.send(&[6u8; 100_000], 0, 6));
            ok!(c, c.barrier());
        }
        _ => {
            ok!(c, c.barrier());
            ok!(c, c.barrier());
        }
    }
}

/// A too-small buffer gives Truncated (naming peer and sizes) for eager
/// and rendezvous messages, and everything goes on working.
fn truncate(c: &Comm) {
    if c.size() < 2 {
        return;
    }
    let big = 200_000usize;
    match c.rank() {
        1 => {
            ok!(c, c.send(&[1u8; 100], 0, 1));
            ok!(c, c.send(&vec![2u8; big], 0, 2));
            ok!(c, c.send(&[3u8; 8], 0, 3));
            // Large enough for the shm copy to be split between both sides.
            let big2: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            ok!(c, c.send(&big2, 0, 4));
        }
        0 => {
            let mut small = [0u8; 10];
            for (tag, len) in [(1, 100usize), (2, big)] {
                match c.recv(&mut small, 1, tag) {
                    Err(
                        e @ Error::Truncated {
                            peer: 1,
                            message_len,
                            buffer_len: 10,
                            ..
                        },
                    ) if message_len == len => {
                        println!("truncate: got expected error: {e}");
                        check!(
                            c,
                            small.iter().all(|&x| x == tag as u8),
                            "truncated prefix not delivered"
                        );
                    }
                    other => fail(
                        c,
                        format!("expected Truncated for tag {tag}, got {other:?}"),
                    ),
                }
            }
            let mut b = [0u8; 8];
            let st = ok!(c, c.recv(&mut b, 1, 3));
            check!(c, st.len == 8 && b == [3; 8], "after truncation: {st:?}");
            let mut part = vec![0u8; 200_000];
            match c.recv(&mut part, 1, 4) {
                Err(Error::Truncated {
                    message_len: 300_000,
                    buffer_len: 200_000,
                    ..
                }) => check!(
                    c,
                    part.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8),
                    "truncated large message: wrong prefix"
                ),
                other => fail(c, format!("expected Truncated for tag 4, got {other:?}")),
            }
        }
        _ => {}
    }
    ok!(c, c.barrier());
}

/// Split by parity (reversed order by key), then dup; all three
/// communicators use the same tags at once without crosstalk.
fn split(c: &Comm) {
    let (r, n) = (c.rank(), c.size());
    let half = ok!(c, c.split((r % 2) as i32, -(r as i32))).unwrap();
    let members: Vec<usize> = (0..n).filter(|x| x % 2 == r % 2).rev().collect();
    check!(
        c,
        half.size() == members.len(),
        "split size {}",
        half.size()
    );
    check!(
        c,
        half.world_rank(half.rank()) == Some(r),
        "split rank mapping"
    );
    check!(
        c,
        members[half.rank()] == r,
        "split order: rank {} in half",
        half.rank()
    );
    let dup = ok!(c, half.dup());
    let none = ok!(c, c.split(if r == 0 { UNDEFINED } else { 1 }, 0));
    check!(c, (r == 0) == none.is_none(), "UNDEFINED color");
    // Same tag on three communicators, posted in an order that would cross
    // them up if contexts were shared.
    let comms = [c, &half, &dup];
    let mut inbox = [[0u64; 2]; 3];
    ibcoll::scope(|s| {
        let mut reqs = Vec::new();
        for (cm, slot) in comms.iter().zip(inbox.iter_mut()).rev() {
            let from = (cm.rank() + cm.size() - 1) % cm.size();
            reqs.push(ok!(c, cm.irecv(s, slot, from, 0)));
        }
        for (k, cm) in comms.iter().enumerate() {
            let to = (cm.rank() + 1) % cm.size();
            ok!(c, cm.send(&[k as u64, cm.rank() as u64], to, 0));
        }
        ok!(c, wait_all(reqs));
    });
    for (k, (cm, got)) in comms.iter().zip(inbox.iter()).enumerate() {
        let from = (cm.rank() + cm.size() - 1) % cm.size();
        check!(
            c,
            got[0] == k as u64 && got[1] == from as u64,
            "crosstalk on comm {k}: {got:?}"
        );
    }
    if let Some(x) = none {
        ok!(c, x.barrier());
    }
    ok!(c, dup.barrier());
}

/// Passes a token around the ring; prints the time per hop.
fn ring(c: &Comm) {
    let (r, n) = (c.rank(), c.size());
    if n < 2 {
        return;
    }
    let laps = 200;
    let mut tok = [0u64];
    ok!(c, c.barrier());
    let t = std::time::Instant::now();
    for lap in 0..laps {
        if r == 0 {
            tok[0] = lap;
            ok!(c, c.send(&tok, 1, 0));
            ok!(c, c.recv(&mut tok, n - 1, 0));
            check!(c, tok[0] == lap + n as u64 - 1, "ring token {}", tok[0]);
        } else {
            ok!(c, c.recv(&mut tok, r - 1, 0));
            tok[0] += 1;
            ok!(c, c.send(&tok, (r + 1) % n, 0));
        }
    }
    if r == 0 {
        let us = t.elapsed().as_secs_f64() * 1e6 / (laps as f64 * n as f64);
        println!("ring: {n} ranks, {us:.2} us per hop");
    }
}

/// A synchronous send completes only once its receive is matched: rank 0's
/// issend stays incomplete through many tests, because rank 1 posts the
/// receive only after rank 0 says (in another message) that it has tested
/// them; no timing is involved. An eager send would complete at once.
/// Small, empty and rendezvous-sized messages; and to oneself.
fn ssend(c: &Comm) {
    let s = ibcoll::static_scope();
    for len in [8usize, 0, 100_000] {
        let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let data: &'static [u8] = Box::leak(data.into_boxed_slice());
        // To oneself: pending until this rank's own receive.
        let mut r = ok!(c, c.issend(s, data, c.rank(), 40));
        for _ in 0..100 {
            check!(
                c,
                ok!(c, r.test()).is_none(),
                "issend to self ({len} B) completed unmatched"
            );
        }
        let mut got = vec![0u8; len];
        ok!(c, c.recv(&mut got, c.rank(), 40));
        ok!(c, r.wait());
        check!(c, got == data, "issend to self: wrong data");
        if c.size() < 2 {
            continue;
        }
        match c.rank() {
            0 => {
                let mut r = ok!(c, c.issend(s, data, 1, 41));
                for _ in 0..1000 {
                    check!(
                        c,
                        ok!(c, r.test()).is_none(),
                        "issend ({len} B) completed before rank 1 posted its receive"
                    );
                }
                ok!(c, c.send(&[1u8], 1, 42));
                ok!(c, r.wait());
                // Blocking: returns once rank 1 has received (and so
                // checked) the first message.
                ok!(c, c.ssend(data, 1, 43));
            }
            1 => {
                let mut go = [0u8];
                ok!(c, c.recv(&mut go, 0, 42));
                let mut got = vec![0u8; len];
                let st = ok!(c, c.recv(&mut got, 0, 41));
                check!(
                    c,
                    st.len == len && got == data,
                    "issend: wrong data ({len} B)"
                );
                ok!(c, c.recv(&mut got, 0, 43));
                check!(c, got == data, "ssend: wrong data ({len} B)");
            }
            _ => {}
        }
    }
}

fn main() {
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let mut checks: Vec<String> = std::env::args().skip(1).collect();
    if checks.is_empty() || checks.iter().any(|s| s == "all") {
        checks = [
            "anysource",
            "order",
            "wildcard",
            "probe",
            "truncate",
            "ssend",
            "split",
            "ring",
        ]
        .map(String::from)
        .to_vec();
    }
    for name in &checks {
        match name.as_str() {
            "anysource" => anysource(&c),
            "manytoone" => manytoone(&c),
            "order" => order(&c),
            "wildcard" => wildcard(&c),
            "probe" => probe(&c),
            "truncate" => truncate(&c),
            "ssend" => ssend(&c),
            "split" => split(&c),
            "ring" => ring(&c),
            other => fail(&c, format!("unknown check {other}")),
        }
        ok!(&c, c.barrier());
        if c.rank() == 0 {
            println!("{name}: ok ({} ranks)", c.size());
        }
    }
}
