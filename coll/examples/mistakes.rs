//! Erroneous programs, run under ibrun: every rank must get an error that
//! names the mistake, within a bound, never a hang or a wrong result.
//! Each rank prints `rank R: expected error after T s: <error>` and exits
//! 0, or prints what it got instead and exits 3.
//!
//! - `mistakes allreduce4`: rank 0 allreduces 4 doubles, the others 100,000.
//! - `mistakes bcastroot [then]`: rank 0 says root 0, the others root 1
//!   (`then`: a rank whose bcast returned `Ok` calls a barrier next).
//! - `mistakes leave [COLL [nb]]`: the last rank returns from `main` without
//!   calling the allreduce (or COLL) the others call (they get `PeerLost`
//!   naming it).
//! - `mistakes <collective> <count|root|op|type|coll> [nb]`: the last rank
//!   passes one more element / another root / max instead of sum / i64
//!   instead of f64 / calls another collective; `nb` uses the
//!   nonblocking form.
//!   `alltoallv count` has the last rank send rank 0 one element more
//!   than rank 0 expects, `alltoallv less` one fewer.
//! - A trailing `cheap` (after `nb`, if any) says the run has no
//!   `IBCOLL_CHECK`: only the ranks that receive from a disagreeing rank
//!   can see the mistake, so a rank may also return `Ok` (it prints
//!   `rank R: ok`), or lose a rank that saw it and gave up the call
//!   (`PeerLost`); any other outcome is still unexpected.
//! - A trailing `then` (after `nb`, if any): a rank whose call returned
//!   `Ok` calls a barrier next (`ibarrier` with `nb`), which must fail
//!   with the disagreement (a rank that completed the call learns of it at
//!   its next call on the communicator); it prints
//!   `rank R: first call: Ok(())` first. The barrier may instead need a
//!   rank that already failed the call and left before the notice of the
//!   finder reached this rank: it then fails with `PeerLost` naming that
//!   rank, printed as `rank R: lost peer P that gave up: <error>` (the
//!   test checks that P reported the disagreement itself).
//! - `mistakes rootnext <bcast|scatter>`: the last rank passes one element
//!   more than the root, then every rank calls a barrier (which every rank
//!   must fail, the root too).
//! - `mistakes p2p <recv|wait|sendrecv> SECONDS`: rank 0 waits for a
//!   message from the last rank, which sleeps in user code first; the
//!   others wait in a barrier (the watchdog must name the sleeper).
//! - `mistakes sleep SECONDS`: the last rank sleeps in user code while the
//!   others wait in a barrier (the watchdog must name it).

use ibcoll::{Comm, Error, ReduceOp};

/// Prints the outcome; the exit code. The rank then finalizes (so that
/// ibrun does not end the job before the others have reported).
fn report(c: &Comm, t: std::time::Instant, r: Result<(), Error>, want: fn(&Error) -> bool) -> i32 {
    match r {
        Err(e) if want(&e) => {
            println!(
                "rank {}: expected error after {:.2} s: {e}",
                c.rank(),
                t.elapsed().as_secs_f64()
            );
            0
        }
        other => {
            println!("rank {}: UNEXPECTED: {other:?}", c.rank());
            3
        }
    }
}

/// After a first call that returned `Ok`: a barrier that lost a peer which
/// finalized (it failed the erroneous call and left before the finder's
/// notice reached this rank) is reported as such; the exit code then.
fn gave_up(c: &Comm, r: &Result<(), Error>) -> Option<i32> {
    match r {
        Err(e @ Error::PeerLost { peer, reason, .. }) if reason.contains("finalized") => {
            println!("rank {}: lost peer {peer} that gave up: {e}", c.rank());
            Some(0)
        }
        _ => None,
    }
}

fn finish(c: Comm, code: i32) -> ! {
    drop(c);
    std::process::exit(code)
}

/// Runs a blocking call, or its nonblocking twin and waits.
macro_rules! run {
    ($nb:expr, $block:expr, |$s:ident| $start:expr) => {
        if $nb {
            ibcoll::scope(|$s| $start?.wait())
        } else {
            $block
        }
    };
}

fn main() {
    let c = ibcoll::init().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(2)
    });
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = c.size();
    let me = c.rank();
    let last = me + 1 == n;
    let t = std::time::Instant::now();
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let nb = args.iter().skip(1).any(|x| x == "nb");
    let cheap = args.iter().skip(2).any(|x| x == "cheap");
    let then = args.iter().skip(2).any(|x| x == "then");
    let mm: fn(&Error) -> bool = |e| e.is_mismatch();
    let code = match a(0) {
        "allreduce4" => {
            let k = if me == 0 { 4 } else { 100_000 };
            let x = vec![1.0f64; k];
            let mut y = vec![0.0f64; k];
            let r = c.allreduce(&x, &mut y, ReduceOp::Sum);
            report(&c, t, r, |e| {
                e.is_mismatch() || matches!(e, Error::InvalidArgument { .. })
            })
        }
        "bcastroot" => {
            let mut b = [me as u64; 4];
            let mut r = c.bcast(&mut b, usize::from(me != 0));
            if a(1) == "then" && r.is_ok() {
                println!("rank {me}: first call: Ok(())");
                r = c.barrier();
                if let Some(code) = gave_up(&c, &r) {
                    finish(c, code);
                }
            }
            report(&c, t, r, mm)
        }
        "leave" => {
            if last {
                drop(c);
                return;
            }
            let x = [1.0f64; 4];
            let mut y = [0.0f64; 4];
            let (name, r) = match a(1) {
                "" => ("allreduce", c.allreduce(&x, &mut y, ReduceOp::Sum)),
                // `leave COLL [nb]`: the others call COLL without mistake.
                coll => (coll, mistake(&c, coll, "", false, nb)),
            };
            match &r {
                // A rank that did not need the one that left (a bcast
                // reader fed by the root) completes.
                Ok(()) if !a(1).is_empty() => {
                    println!("rank {me}: ok");
                    drop(c);
                    return;
                }
                Err(e)
                    if !e.to_string().contains(&format!(": {name} with rank"))
                        && !e.to_string().contains(&format!(": {name}: no progress")) =>
                {
                    println!("rank {me}: UNEXPECTED: the error does not name {name}: {e}");
                    drop(c);
                    std::process::exit(3)
                }
                _ => {}
            }
            // Across nodes the leaving rank may never have connected to
            // the others: only the watchdog ends their wait.
            report(&c, t, r, |e| e.is_peer_lost() || e.is_hang())
        }
        "sleep" => {
            let secs: u64 = a(1).parse().unwrap_or(10);
            if last {
                std::thread::sleep(std::time::Duration::from_secs(secs));
                // Late: the others gave up; whatever the barrier says.
                let _ = c.barrier();
                drop(c);
                return;
            }
            let r = c.barrier();
            report(&c, t, r, |e| e.is_hang())
        }
        "rootnext" => {
            // A bcast or scatter (one node, the shared-memory fast path)
            // where the last rank passes one element more than the root
            // (rank 0): the root publishes and returns Ok, the last rank
            // fails. Then a barrier: every rank must fail it, the root
            // naming the rank that found the disagreement.
            let k = 3 + usize::from(last);
            let mut y = vec![0.0f64; k];
            let first = match a(1) {
                "scatter" => {
                    let x = vec![1.0f64; k * n];
                    c.scatter(&x, &mut y, 0)
                }
                _ => c.bcast(&mut y, 0),
            };
            println!("rank {me}: first call: {first:?}");
            let r = c.barrier();
            report(&c, t, r, mm)
        }
        "p2p" => {
            // Rank 0 waits for a message from the last rank, which sleeps
            // in user code first (the watchdog must name it); the ranks in
            // between wait in a barrier for rank 0.
            let secs: u64 = a(2).parse().unwrap_or(10);
            if last {
                std::thread::sleep(std::time::Duration::from_secs(secs));
                let _ = c.send(&[1u64], 0, 5);
                let _ = c.barrier();
                drop(c);
                return;
            }
            if me != 0 {
                let r = c.barrier();
                report(&c, t, r, |e| e.is_hang())
            } else {
                let mut b = [0u64; 1];
                let from = n - 1;
                let r = match a(1) {
                    "recv" => c.recv(&mut b, from, 5).map(|_| ()),
                    "wait" => ibcoll::scope(|s| c.irecv(s, &mut b, from, 5)?.wait().map(|_| ())),
                    _ => c.sendrecv(&[0u64], from, 6, &mut b, from, 5).map(|_| ()),
                };
                report(&c, t, r, |e| e.is_hang())
            }
        }
        coll => {
            let mut r = mistake(&c, coll, a(1), last, nb);
            if then && r.is_ok() {
                println!("rank {me}: first call: Ok(())");
                r = run!(nb, c.barrier(), |s| c.ibarrier(s));
                if let Some(code) = gave_up(&c, &r) {
                    finish(c, code);
                }
            }
            if cheap && r.as_ref().is_ok_and(|_| true) {
                println!("rank {me}: ok");
                0
            } else if cheap && r.as_ref().is_err_and(Error::is_peer_lost) {
                // A rank that saw the mistake gave up the call: a rank
                // still waiting for its messages loses it.
                println!("rank {me}: lost a rank that gave up: {:?}", r);
                0
            } else {
                report(&c, t, r, mm)
            }
        }
    };
    drop(c);
    std::process::exit(code)
}

/// One collective with one mistake on the last rank.
fn mistake(c: &Comm, coll: &str, kind: &str, last: bool, nb: bool) -> Result<(), Error> {
    let n = c.size();
    let me = c.rank();
    let k = 3 + usize::from(last && kind == "count");
    let root = usize::from(last && kind == "root") % n;
    let op = if last && kind == "op" {
        ReduceOp::Max
    } else {
        ReduceOp::Sum
    };
    let typed = last && kind == "type";
    if last && kind == "coll" {
        return c.barrier();
    }
    let x = vec![1.0f64; k];
    let mut y = vec![0.0f64; k];
    let xi = vec![1i64; k];
    let mut yi = vec![0i64; k];
    let mut big = vec![0.0f64; k * n];
    let bigx = vec![1.0f64; k * n];
    match coll {
        "barrier" => run!(nb, c.barrier(), |s| c.ibarrier(s)),
        "bcast" => run!(nb, c.bcast(&mut y, root), |s| c.ibcast(s, &mut y, root)),
        "allreduce" | "reduce" | "scan" | "exscan" if typed => {
            let o = ReduceOp::Sum;
            match coll {
                "allreduce" => run!(nb, c.allreduce(&xi, &mut yi, o.clone()), |s| c.iallreduce(
                    s,
                    &xi,
                    &mut yi,
                    o.clone()
                )),
                "reduce" => run!(nb, c.reduce(&xi, &mut yi, o.clone(), root), |s| c.ireduce(
                    s,
                    &xi,
                    &mut yi,
                    o.clone(),
                    root
                )),
                "scan" => run!(nb, c.scan(&xi, &mut yi, o.clone()), |s| c.iscan(
                    s,
                    &xi,
                    &mut yi,
                    o.clone()
                )),
                _ => run!(nb, c.exscan(&xi, &mut yi, o.clone()), |s| c.iexscan(
                    s,
                    &xi,
                    &mut yi,
                    o.clone()
                )),
            }
        }
        "allreduce" => run!(nb, c.allreduce(&x, &mut y, op.clone()), |s| c.iallreduce(
            s,
            &x,
            &mut y,
            op.clone()
        )),
        "reduce" => run!(nb, c.reduce(&x, &mut y, op.clone(), root), |s| c.ireduce(
            s,
            &x,
            &mut y,
            op.clone(),
            root
        )),
        "scan" => run!(nb, c.scan(&x, &mut y, op.clone()), |s| c.iscan(
            s,
            &x,
            &mut y,
            op.clone()
        )),
        "exscan" => run!(nb, c.exscan(&x, &mut y, op.clone()), |s| c.iexscan(
            s,
            &x,
            &mut y,
            op.clone()
        )),
        "gather" => run!(nb, c.gather(&x, &mut big, root), |s| c
            .igather(s, &x, &mut big, root)),
        "scatter" => run!(nb, c.scatter(&bigx, &mut y, root), |s| c
            .iscatter(s, &bigx, &mut y, root)),
        "allgather" => run!(nb, c.allgather(&x, &mut big), |s| c
            .iallgather(s, &x, &mut big)),
        "alltoall" => run!(nb, c.alltoall(&bigx, &mut big), |s| c
            .ialltoall(s, &bigx, &mut big)),
        "gatherv" | "scatterv" | "allgatherv" => {
            // Every rank but the last sends 3; the last sends k (4 when
            // "count") while the root's counts say 3.
            let mut counts = vec![3usize; n];
            counts[n - 1] = if coll == "allgatherv" { k } else { 3 };
            let displs: Vec<usize> = (0..n).map(|i| i * 4).collect();
            let mut v = vec![0.0f64; 4 * n];
            let vx = vec![1.0f64; 4 * n];
            match coll {
                "gatherv" => run!(nb, c.gatherv(&x, &mut v, &counts, &displs, root), |s| c
                    .igatherv(s, &x, &mut v, &counts, &displs, root)),
                "scatterv" => run!(nb, c.scatterv(&vx, &counts, &displs, &mut y, root), |s| c
                    .iscatterv(s, &vx, &counts, &displs, &mut y, root)),
                _ => run!(nb, c.allgatherv(&x, &mut v, &counts, &displs), |s| c
                    .iallgatherv(s, &x, &mut v, &counts, &displs)),
            }
        }
        "alltoallv" => {
            // Blocks of 3 at 4-element strides; the last rank's block for
            // rank 0 is one longer ("count") or shorter ("less").
            let mut sc = vec![3usize; n];
            if last {
                sc[0] = match kind {
                    "count" => 4,
                    "less" => 2,
                    _ => 3,
                };
            }
            let rc = vec![3usize; n];
            let d: Vec<usize> = (0..n).map(|i| i * 4).collect();
            let vx = vec![1.0f64; 4 * n];
            let mut v = vec![0.0f64; 4 * n];
            run!(nb, c.alltoallv(&vx, &sc, &d, &mut v, &rc, &d), |s| c
                .ialltoallv(s, &vx, &sc, &d, &mut v, &rc, &d))
        }
        "reduce_scatter_block" => {
            let (sx, mut sy) = (vec![1.0f64; k * n], vec![0.0f64; k]);
            let (ix, mut iy) = (vec![1i64; k * n], vec![0i64; k]);
            if typed {
                run!(
                    nb,
                    c.reduce_scatter_block(&ix, &mut iy, ReduceOp::Sum),
                    |s| c.ireduce_scatter_block(s, &ix, &mut iy, ReduceOp::Sum)
                )
            } else {
                run!(nb, c.reduce_scatter_block(&sx, &mut sy, op.clone()), |s| c
                    .ireduce_scatter_block(s, &sx, &mut sy, op.clone()))
            }
        }
        "reduce_scatter" => {
            // The last rank's counts give rank 0 one element more.
            let mut counts = vec![3usize; n];
            if last && kind == "count" {
                counts[0] = 4;
            }
            let total: usize = counts.iter().sum();
            let (sx, mut sy) = (vec![1.0f64; total], vec![0.0f64; counts[me]]);
            let (ix, mut iy) = (vec![1i64; total], vec![0i64; counts[me]]);
            if typed {
                run!(
                    nb,
                    c.reduce_scatter(&ix, &mut iy, &counts, ReduceOp::Sum),
                    |s| c.ireduce_scatter(s, &ix, &mut iy, &counts, ReduceOp::Sum)
                )
            } else {
                run!(
                    nb,
                    c.reduce_scatter(&sx, &mut sy, &counts, op.clone()),
                    |s| c.ireduce_scatter(s, &sx, &mut sy, &counts, op.clone())
                )
            }
        }
        other => {
            eprintln!("mistakes: unknown collective {other}");
            std::process::exit(2)
        }
    }
}
