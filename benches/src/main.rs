//! `ibcoll-bench`: OSU-style micro-benchmarks over ibcoll's public API.
//!
//! ```text
//! ibrun -n 2 ibcoll-bench latency|bw|bibw [-m MIN:MAX] [-i ITERS] [-x WARMUP] [-W WINDOW]
//! ```
//! Output follows the OSU micro-benchmarks (`# Size  Avg Latency(us)`,
//! bandwidth in MB/s with 1 MB = 10^6 bytes), so tables from ibcoll, Open MPI
//! and MPICH (benches/mpi/osu_p2p.c) can be compared line by line.
//! Benchmarks are entries of [`BENCHES`]; the collectives (`coll.rs`) run as
//! `ibcoll-bench <collective> [--algorithm NAME] [-m MIN:MAX] [--plot FILE]`.
//! `ibcoll-bench transpose [--grid RxC] [--size N]` ranks the ways of
//! writing a spectral transform's transpose (`transpose/`).
//! `ibcoll-bench --help` lists every option (`cli.rs`).

use std::process::exit;
use std::time::Instant;

use ibcoll::Comm;

use cli::{Cli, Opts};

mod cli;
mod coll;
mod plot;
mod progress;
mod ratios;
mod transpose;

/// Lets the rdma channel keep buffer registrations across messages.
#[global_allocator]
static ALLOC: ibcoll::TrackingAlloc = ibcoll::TrackingAlloc::new(std::alloc::System);

type BenchFn = fn(&Comm, &Opts) -> ibcoll::Result<()>;

/// Name, title line, function.
const BENCHES: &[(&str, &str, BenchFn)] = &[
    ("latency", "Latency Test", latency),
    ("bw", "Bandwidth Test", bw),
    ("bibw", "Bi-Directional Bandwidth Test", bibw),
    ("barrier", "Barrier Latency Test", coll::barrier),
    ("bcast", "Broadcast Latency Test", coll::bcast),
    ("reduce", "Reduce Latency Test", coll::reduce),
    ("allreduce", "Allreduce Latency Test", coll::allreduce),
    ("gather", "Gather Latency Test", coll::gather),
    ("gatherv", "Gatherv Latency Test", coll::gatherv),
    ("scatter", "Scatter Latency Test", coll::scatter),
    ("scatterv", "Scatterv Latency Test", coll::scatterv),
    ("allgather", "Allgather Latency Test", coll::allgather),
    ("allgatherv", "Allgatherv Latency Test", coll::allgatherv),
    (
        "alltoall",
        "All-to-All Personalized Exchange Latency Test",
        coll::alltoall,
    ),
    (
        "alltoallv",
        "All-to-Allv Personalized Exchange Latency Test",
        coll::alltoallv,
    ),
    (
        "reduce_scatter",
        "Reduce_scatter Latency Test",
        coll::reduce_scatter,
    ),
    (
        "reduce_scatter_block",
        "Reduce_scatter_block Latency Test",
        coll::reduce_scatter_block,
    ),
    ("scan", "Scan Latency Test", coll::scan),
    ("exscan", "Exscan Latency Test", coll::exscan),
    ("tune", "Collective Tuner", coll::tune),
    (
        "transpose",
        "Transpose Protocols (PSTSWM-style)",
        transpose::run,
    ),
];

/// 0, then powers of two from max(1, min) up to max.
fn sizes(o: &Opts) -> Vec<usize> {
    let mut v = Vec::new();
    if o.min == 0 {
        v.push(0);
    }
    let mut s = o.min.max(1).next_power_of_two();
    while s <= o.max {
        v.push(s);
        s *= 2;
    }
    v
}

/// OSU's iteration counts: more for small messages.
fn iters_for(o: &Opts, size: usize, small: usize, large: usize) -> (usize, usize) {
    let big = size > 8192;
    let iters = o.iters.unwrap_or(if big { large } else { small });
    let warm = o.warmup.unwrap_or(if big { 10 } else { 100 });
    (iters.max(1), warm)
}

fn latency(c: &Comm, o: &Opts) -> ibcoll::Result<()> {
    let me = c.rank();
    let mut sbuf = vec![b'a'; o.max];
    let mut rbuf = vec![b'b'; o.max];
    if me == 0 {
        println!("# Size       Avg Latency(us)");
    }
    for size in sizes(o) {
        let (iters, warm) = iters_for(o, size, 10_000, 1_000);
        c.barrier()?;
        let mut t0 = Instant::now();
        for i in 0..iters + warm {
            if i == warm {
                t0 = Instant::now();
            }
            if me == 0 {
                c.send(&sbuf[..size], 1, 1)?;
                c.recv(&mut rbuf[..size], 1, 1)?;
            } else if me == 1 {
                c.recv(&mut rbuf[..size], 0, 1)?;
                c.send(&sbuf[..size], 0, 1)?;
            }
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / (2.0 * iters as f64);
        if me == 0 {
            println!("{size:<12}{us:>18.2}");
        }
        sbuf[0] = sbuf[0].wrapping_add(1);
    }
    Ok(())
}

fn bw_common(c: &Comm, o: &Opts, bidir: bool) -> ibcoll::Result<()> {
    let me = c.rank();
    let w = o.window;
    let sbufs = vec![vec![b'a'; o.max]; w];
    let mut rbufs = vec![vec![b'b'; o.max]; w];
    let mut ack = [0u8; 4];
    if me == 0 {
        println!("# Size      Bandwidth (MB/s)");
    }
    for size in sizes(o).into_iter().filter(|&s| s > 0) {
        let (iters, warm) = iters_for(o, size, 1_000, 100);
        let warm = warm.min(iters);
        c.barrier()?;
        let mut t0 = Instant::now();
        for i in 0..iters + warm {
            if i == warm {
                t0 = Instant::now();
            }
            if me == 0 {
                ibcoll::scope(|s| {
                    let mut reqs = Vec::with_capacity(2 * w);
                    if bidir {
                        for b in rbufs.iter_mut() {
                            reqs.push(c.irecv(s, &mut b[..size], 1, 10)?);
                        }
                    }
                    for b in &sbufs {
                        reqs.push(c.isend(s, &b[..size], 1, 10)?);
                    }
                    ibcoll::wait_all(reqs)
                })?;
                c.recv(&mut ack, 1, 11)?;
            } else if me == 1 {
                ibcoll::scope(|s| {
                    let mut reqs = Vec::with_capacity(2 * w);
                    for b in rbufs.iter_mut() {
                        reqs.push(c.irecv(s, &mut b[..size], 0, 10)?);
                    }
                    if bidir {
                        for b in &sbufs {
                            reqs.push(c.isend(s, &b[..size], 0, 10)?);
                        }
                    }
                    ibcoll::wait_all(reqs)
                })?;
                c.send(&ack, 0, 11)?;
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let bytes = (size * w * iters) as f64 * if bidir { 2.0 } else { 1.0 };
        if me == 0 {
            println!("{size:<12}{:>18.2}", bytes / 1e6 / secs);
        }
    }
    Ok(())
}

fn bw(c: &Comm, o: &Opts) -> ibcoll::Result<()> {
    bw_common(c, o, false)
}

fn bibw(c: &Comm, o: &Opts) -> ibcoll::Result<()> {
    bw_common(c, o, true)
}

fn main() {
    let (name, opts) = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Cli::Help) => {
            print!("{}", cli::help());
            return;
        }
        Ok(Cli::Version) => {
            println!("ibcoll-bench {}", ibcoll::VERSION);
            return;
        }
        Ok(Cli::PlotRatios { table, out, title }) => {
            if let Err(e) = ratios::draw(&table, &out, title.as_deref()) {
                eprintln!("ibcoll-bench plot-ratios: {e}");
                exit(1);
            }
            return;
        }
        Ok(Cli::Bench { name, opts, .. }) => (name, opts),
        Err(e) => {
            eprintln!("ibcoll-bench: {e} (see ibcoll-bench --help)");
            exit(2);
        }
    };
    let Some(&(_, title, f)) = BENCHES.iter().find(|(n, _, _)| *n == name) else {
        eprintln!("ibcoll-bench: unknown benchmark {name:?} (see ibcoll-bench --help)");
        exit(2);
    };
    let c = match ibcoll::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ibcoll-bench: init failed: {e}");
            exit(1);
        }
    };
    if c.size() < 2 {
        eprintln!("ibcoll-bench {name} needs at least 2 ranks");
        exit(2);
    }
    if c.rank() == 0 {
        println!("# ibcoll {title} v{}", ibcoll::VERSION);
        println!(
            "# ranks {} ({} to rank 1, eager limit {} B)",
            c.size(),
            c.transport_to(1).unwrap_or("?"),
            c.eager_limit_to(1).unwrap_or(0)
        );
    }
    if let Err(e) = f(&c, &opts) {
        eprintln!("ibcoll-bench {name}: {e}");
        exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        let Ok(Cli::Bench { opts, .. }) = cli::parse(["latency", "-m", "4:64"]) else {
            panic!()
        };
        assert_eq!(sizes(&opts), vec![4, 8, 16, 32, 64]);
        let Ok(Cli::Bench { opts, .. }) = cli::parse(["latency", "-m", "1k"]) else {
            panic!()
        };
        assert_eq!(sizes(&opts).last(), Some(&1024));
        assert_eq!(sizes(&opts)[0], 0);
        // Every name the parser takes has a benchmark, and the other way.
        for (n, _, _) in BENCHES {
            assert!(matches!(cli::parse([*n]), Ok(Cli::Bench { .. })), "{n}");
        }
        for c in ibcoll::Collective::ALL {
            assert!(
                BENCHES.iter().any(|(n, _, _)| *n == c.name()),
                "{}",
                c.name()
            );
        }
    }
}
