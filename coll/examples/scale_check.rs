//! A cluster-sized job in miniature, run under ibrun with hundreds of ranks
//! (oversubscribed) on virtual nodes: init, a ring neighbour exchange,
//! barrier, allreduce and alltoall of small data, finalize; every result is
//! checked.
//!
//! `scale_check ring` does the neighbour exchange only, so that a rank's
//! `IBCOLL_STATS` line shows what talking to two peers costs (two
//! connections, a card fetch per peer dialed) whatever the size of the job.
//! `scale_check barrier` is init, one barrier and finalize (the startup
//! benchmark, `benches/scale.sh`). `scale_check first-contact` makes every pair of ranks talk for the first
//! time at once, in both directions (each rank sends to every other before
//! receiving), which exercises simultaneous dials.
//!
//! Prints `scale_check <what>: ok (N ranks)` from rank 0, or exits 3.

use ibcoll::{Comm, ReduceOp};

fn fail(c: &Comm, msg: String) -> ! {
    eprintln!("scale_check rank {}: FAILED: {msg}", c.rank());
    std::process::exit(3)
}

macro_rules! ok {
    ($c:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => fail($c, format!("line {}: {e}", line!())),
        }
    };
}

fn ring(c: &Comm) {
    let (n, me) = (c.size(), c.rank());
    if n < 2 {
        return;
    }
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let mut from_left = [0u64; 4];
    ok!(
        c,
        c.sendrecv(&[me as u64; 4], right, 1, &mut from_left, left, 1)
    );
    if from_left != [left as u64; 4] {
        fail(c, format!("ring: got {from_left:?} from rank {left}"));
    }
    let mut from_right = [0u64; 4];
    ok!(
        c,
        c.sendrecv(&[me as u64; 4], left, 2, &mut from_right, right, 2)
    );
    if from_right != [right as u64; 4] {
        fail(c, format!("ring: got {from_right:?} from rank {right}"));
    }
}

fn collectives(c: &Comm) {
    let (n, me) = (c.size(), c.rank());
    ok!(c, c.barrier());
    let mut sum = [0u64; 2];
    ok!(c, c.allreduce(&[me as u64, 1], &mut sum, ReduceOp::Sum));
    if sum != [(n * (n - 1) / 2) as u64, n as u64] {
        fail(c, format!("allreduce gave {sum:?}"));
    }
    let send: Vec<u32> = (0..n).map(|j| (me * n + j) as u32).collect();
    let mut recv = vec![0u32; n];
    ok!(c, c.alltoall(&send, &mut recv));
    for (j, &v) in recv.iter().enumerate() {
        if v != (j * n + me) as u32 {
            fail(c, format!("alltoall: block {j} is {v}"));
        }
    }
    ok!(c, c.barrier());
}

/// Every rank sends to every other first, then receives from each: every
/// pair dials in both directions at the same time.
fn first_contact(c: &Comm) {
    let (n, me) = (c.size(), c.rank());
    let mut got = vec![[0u32; 2]; n];
    let mine: Vec<[u32; 2]> = (0..n).map(|p| [me as u32, p as u32]).collect();
    ibcoll::scope(|s| {
        let mut reqs = Vec::new();
        for (p, slot) in got.iter_mut().enumerate() {
            if p != me {
                reqs.push(ok!(c, c.irecv(s, slot, p, 5)));
            }
        }
        let mut sends = Vec::new();
        for (p, m) in mine.iter().enumerate() {
            if p != me {
                sends.push(ok!(c, c.isend(s, m, p, 5)));
            }
        }
        ok!(c, ibcoll::wait_all(sends));
        ok!(c, ibcoll::wait_all(reqs));
    });
    for (p, g) in got.iter().enumerate() {
        if p != me && *g != [p as u32, me as u32] {
            fail(c, format!("first contact: from rank {p} got {g:?}"));
        }
    }
}

fn main() {
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    match what.as_str() {
        "all" => {
            ring(&c);
            collectives(&c);
        }
        "ring" => ring(&c),
        "barrier" => ok!(&c, c.barrier()),
        "first-contact" => first_contact(&c),
        other => fail(&c, format!("unknown check {other}")),
    }
    if c.rank() == 0 {
        println!("scale_check {what}: ok ({} ranks)", c.size());
    }
}
