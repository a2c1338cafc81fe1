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
//! `scale_check node` is for many ranks on one node: the ring exchange,
//! alltoall of 8-byte and of 32 KiB blocks, and every blocking collective
//! once (whether it takes a shared-memory fast path depends on
//! `IBCOLL_SHM_COLL_BYTES`), every result checked.
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

fn check(c: &Comm, what: &str, ok: bool) {
    if !ok {
        fail(c, format!("{what}: wrong result"));
    }
}

/// Alltoall of `words` u64 per block; block j of rank i holds i, j, k.
fn alltoall_blocks(c: &Comm, words: usize) {
    let (n, me) = (c.size(), c.rank());
    let v = |i: usize, j: usize, k: usize| ((i * n + j) as u64) << 20 | k as u64;
    let send: Vec<u64> = (0..n * words)
        .map(|x| v(me, x / words, x % words))
        .collect();
    let mut recv = vec![0u64; n * words];
    ok!(c, c.alltoall(&send, &mut recv));
    let good = recv
        .iter()
        .enumerate()
        .all(|(x, &g)| g == v(x / words, me, x % words));
    check(c, &format!("alltoall of {} B blocks", words * 8), good);
}

/// Every blocking collective once, with small data, results checked.
fn every_collective(c: &Comm) {
    let (n, me) = (c.size(), c.rank());
    let m = me as u64;
    let tri = |k: usize| (k * (k + 1) / 2) as u64;
    ok!(c, c.barrier());
    for root in [0, n - 1] {
        let mut b = if me == root {
            [7u64, root as u64]
        } else {
            [0; 2]
        };
        ok!(c, c.bcast(&mut b, root));
        check(c, "bcast", b == [7, root as u64]);
        let mut r = [0u64; 2];
        ok!(c, c.reduce(&[m, 1], &mut r, ReduceOp::Sum, root));
        check(c, "reduce", me != root || r == [tri(n - 1), n as u64]);
        let mut g = vec![0u64; if me == root { 2 * n } else { 0 }];
        ok!(c, c.gather(&[m, m + 1], &mut g, root));
        let good =
            me != root || (0..n).all(|i| g[2 * i] == i as u64 && g[2 * i + 1] == i as u64 + 1);
        check(c, "gather", good);
        let src: Vec<u64> = if me == root {
            (0..2 * n as u64).collect()
        } else {
            Vec::new()
        };
        let mut sc = [0u64; 2];
        ok!(c, c.scatter(&src, &mut sc, root));
        check(c, "scatter", sc == [2 * m, 2 * m + 1]);
        let counts: Vec<usize> = (0..n).map(|i| i % 3).collect();
        let displs: Vec<usize> = counts
            .iter()
            .scan(0, |a, &k| {
                let d = *a;
                *a += k;
                Some(d)
            })
            .collect();
        let total: usize = counts.iter().sum();
        let mine = vec![m; me % 3];
        let mut gv = vec![0u64; if me == root { total } else { 0 }];
        ok!(c, c.gatherv(&mine, &mut gv, &counts, &displs, root));
        let good = me != root
            || (0..n).all(|i| {
                gv[displs[i]..displs[i] + counts[i]]
                    .iter()
                    .all(|&x| x == i as u64)
            });
        check(c, "gatherv", good);
        let sv: Vec<u64> = if me == root {
            (0..n).flat_map(|i| vec![i as u64 + 100; i % 3]).collect()
        } else {
            Vec::new()
        };
        let mut rv = vec![0u64; me % 3];
        ok!(c, c.scatterv(&sv, &counts, &displs, &mut rv, root));
        check(c, "scatterv", rv.iter().all(|&x| x == m + 100));
    }
    let mut s = [0u64; 2];
    ok!(c, c.allreduce(&[m, 1], &mut s, ReduceOp::Sum));
    check(c, "allreduce", s == [tri(n - 1), n as u64]);
    let mut big = vec![0u64; 512];
    ok!(c, c.allreduce(&vec![m; 512], &mut big, ReduceOp::Max));
    check(c, "allreduce 4 KiB", big.iter().all(|&x| x == n as u64 - 1));
    let mut ag = vec![0u64; n];
    ok!(c, c.allgather(&[m * 3], &mut ag));
    check(
        c,
        "allgather",
        ag.iter().enumerate().all(|(i, &x)| x == 3 * i as u64),
    );
    let counts: Vec<usize> = (0..n).map(|i| 1 + i % 2).collect();
    let displs: Vec<usize> = counts
        .iter()
        .scan(0, |a, &k| {
            let d = *a;
            *a += k;
            Some(d)
        })
        .collect();
    let total: usize = counts.iter().sum();
    let mut agv = vec![0u64; total];
    ok!(
        c,
        c.allgatherv(&vec![m; 1 + me % 2], &mut agv, &counts, &displs)
    );
    check(
        c,
        "allgatherv",
        (0..n).all(|i| {
            agv[displs[i]..displs[i] + counts[i]]
                .iter()
                .all(|&x| x == i as u64)
        }),
    );
    let send: Vec<u64> = (0..total).map(|x| x as u64 + m).collect();
    let mut rs = vec![0u64; counts[me]];
    ok!(c, c.reduce_scatter(&send, &mut rs, &counts, ReduceOp::Sum));
    let good = rs
        .iter()
        .enumerate()
        .all(|(k, &x)| x == n as u64 * (displs[me] + k) as u64 + tri(n - 1));
    check(c, "reduce_scatter", good);
    let send: Vec<u64> = (0..n as u64).map(|j| j * 10 + m).collect();
    let mut rb = [0u64; 1];
    ok!(c, c.reduce_scatter_block(&send, &mut rb, ReduceOp::Sum));
    check(
        c,
        "reduce_scatter_block",
        rb[0] == m * 10 * n as u64 + tri(n - 1),
    );
    let mut sc = [0u64; 1];
    ok!(c, c.scan(&[m + 1], &mut sc, ReduceOp::Sum));
    check(c, "scan", sc[0] == tri(me + 1));
    let mut ex = [0u64; 1];
    ok!(c, c.exscan(&[m + 1], &mut ex, ReduceOp::Sum));
    check(c, "exscan", me == 0 || ex[0] == tri(me));
    // Alltoallv: rank i sends (j % 2) + 1 elements to rank j.
    let sc: Vec<usize> = (0..n).map(|j| j % 2 + 1).collect();
    let sd: Vec<usize> = sc
        .iter()
        .scan(0, |a, &k| {
            let d = *a;
            *a += k;
            Some(d)
        })
        .collect();
    let sbuf: Vec<u64> = (0..n)
        .flat_map(|j| vec![m * 1000 + j as u64; j % 2 + 1])
        .collect();
    let rc = vec![me % 2 + 1; n];
    let rd: Vec<usize> = (0..n).map(|i| i * (me % 2 + 1)).collect();
    let mut rbuf = vec![0u64; n * (me % 2 + 1)];
    ok!(c, c.alltoallv(&sbuf, &sc, &sd, &mut rbuf, &rc, &rd));
    let good = (0..n).all(|i| {
        rbuf[rd[i]..rd[i] + rc[i]]
            .iter()
            .all(|&x| x == i as u64 * 1000 + m)
    });
    check(c, "alltoallv", good);
    ok!(c, c.barrier());
}

fn node(c: &Comm) {
    ring(c);
    alltoall_blocks(c, 1);
    alltoall_blocks(c, 32 * 1024 / 8);
    every_collective(c);
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
        "node" => node(&c),
        other => fail(&c, format!("unknown check {other}")),
    }
    if c.rank() == 0 {
        println!("scale_check {what}: ok ({} ranks)", c.size());
    }
}
