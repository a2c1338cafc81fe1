//! `ibcoll-bench transpose [--grid RxC] [--size N] [-i ITERS] [-x WARMUP]`:
//! the distributed transpose of a spectral transform, written as many ways
//! ("protocols", after PSTSWM) as the public API allows, ranked per grid.
//!
//! The P ranks form an R x C grid (rank = row * C + column) and split into
//! row communicators (C ranks) and column communicators (R ranks). A global
//! N x N x N array of f64 starts in z-pencils (`pencil.rs`); one timed
//! transpose goes to x-pencils (across each row, then each column) and
//! back, and both results are compared with the reference computed locally
//! on every rank, every run (warm-up ones too). The protocols run in
//! interleaved repetitions (repetition k starts at protocol k), a run's time
//! is the slowest rank's, and per grid the benchmark prints every
//! protocol's median (min-max) and PSTSWM's summary (`table.rs`). With no
//! `--grid`, every shape of the job's ranks, R descending.

mod pencil;
mod protocols;
mod table;

use std::time::Instant;

use ibcoll::{Comm, ReduceOp, Result};

use crate::cli::Opts;
use pencil::Box3;
use protocols::Protocol;
use table::Timing;

/// N when `--size` is not given: 64^3 f64, 2 MiB over the job.
pub const DEFAULT_SIZE: usize = 64;
/// Timed repetitions of each protocol when `-i` is not given.
pub const DEFAULT_ITERS: usize = 10;

/// The grid shapes R x C of `p` ranks, R descending.
pub fn shapes(p: usize) -> Vec<(usize, usize)> {
    (1..=p)
        .rev()
        .filter(|r| p % r == 0)
        .map(|r| (r, p / r))
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `n` rounded up to a multiple of R and C (at least one), so that every
/// pencil cuts into equal blocks.
pub fn global_size(n: usize, r: usize, c: usize) -> usize {
    let l = r / gcd(r, c) * c;
    n.div_ceil(l).max(1) * l
}

/// This rank's place in an R x C grid, its communicators and pencils.
struct Grid {
    name: String,
    n: usize,
    row: Comm,
    col: Comm,
    /// z-pencil (the start and end), y-pencil (after the row swap),
    /// x-pencil (after the column swap).
    z: Box3,
    y: Box3,
    x: Box3,
}

impl Grid {
    fn new(world: &Comm, r: usize, c: usize, n: usize) -> Result<Grid> {
        let me = world.rank();
        let (i, j) = (me / c, me % c);
        let missing = |what: &str| ibcoll::Error::InvalidArgument {
            rank: me,
            op: ibcoll::Op::Split,
            detail: format!("split gave no {what} communicator"),
        };
        // Keyed by the other coordinate: rank j in the row, i in the column.
        let row = world
            .split(i as i32, j as i32)?
            .ok_or_else(|| missing("row"))?;
        let col = world
            .split(j as i32, i as i32)?
            .ok_or_else(|| missing("column"))?;
        let z = Box3 {
            off: [i * n / r, j * n / c, 0],
            len: [n / r, n / c, n],
        };
        let y = z.swapped(2, 1, c, j, n);
        let x = y.swapped(1, 0, r, i, n);
        Ok(Grid {
            name: format!("{r}x{c}"),
            n,
            row,
            col,
            z,
            y,
            x,
        })
    }
}

/// The buffers of one rank (every pencil holds N^3 / P elements).
struct Bufs {
    z: Vec<f64>,
    y: Vec<f64>,
    x: Vec<f64>,
    zback: Vec<f64>,
    send: Vec<f64>,
    recv: Vec<f64>,
}

/// Packs `src` (box `from`), exchanges on `comm`, unpacks into `dst` (box
/// `to`): dimension `cut` gets cut over the ranks, `whole` made whole.
#[allow(clippy::too_many_arguments)]
fn swap(
    comm: &Comm,
    p: &Protocol,
    src: &[f64],
    from: &Box3,
    (cut, whole): (usize, usize),
    to: &Box3,
    dst: &mut [f64],
    (send, recv): (&mut [f64], &mut [f64]),
) -> Result<()> {
    let k = comm.size();
    pencil::pack(src, from, cut, k, send);
    p.exchange(comm, send, recv)?;
    pencil::unpack(recv, to, whole, k, dst);
    Ok(())
}

/// z-pencils to x-pencils: across the rows, then across the columns.
fn forward(g: &Grid, p: &Protocol, b: &mut Bufs) -> Result<()> {
    let sr = (&mut b.send[..], &mut b.recv[..]);
    swap(&g.row, p, &b.z, &g.z, (2, 1), &g.y, &mut b.y, sr)?;
    let sr = (&mut b.send[..], &mut b.recv[..]);
    swap(&g.col, p, &b.y, &g.y, (1, 0), &g.x, &mut b.x, sr)
}

/// x-pencils back to z-pencils (into `zback`).
fn back(g: &Grid, p: &Protocol, b: &mut Bufs) -> Result<()> {
    let sr = (&mut b.send[..], &mut b.recv[..]);
    swap(&g.col, p, &b.x, &g.x, (0, 1), &g.y, &mut b.y, sr)?;
    let sr = (&mut b.send[..], &mut b.recv[..]);
    swap(&g.row, p, &b.y, &g.y, (1, 2), &g.z, &mut b.zback, sr)
}

/// Exits the job with a message naming the rank, grid, protocol and the
/// first wrong element, if `data` is not the reference of `b`.
fn check(world: &Comm, g: &Grid, p: &Protocol, what: &str, b: &Box3, data: &[f64]) {
    if let Some((at, want, got)) = pencil::first_wrong(g.n, b, data) {
        eprintln!(
            "ibcoll-bench transpose rank {}: WRONG RESULT: grid {}, protocol {}, {what}: \
             element {at:?} of the {n}^3 array is {got}, want {want}",
            world.rank(),
            g.name,
            p.name,
            n = g.n
        );
        std::process::exit(3);
    }
}

/// One checked transpose there and back; its time in seconds (this rank's,
/// both directions, not the checks).
fn run_once(world: &Comm, g: &Grid, p: &Protocol, b: &mut Bufs) -> Result<f64> {
    for v in [&mut b.y, &mut b.x, &mut b.zback, &mut b.recv] {
        v.fill(f64::NAN);
    }
    world.barrier()?;
    let t = Instant::now();
    forward(g, p, b)?;
    let there = t.elapsed().as_secs_f64();
    check(world, g, p, "after the transpose to x-pencils", &g.x, &b.x);
    world.barrier()?;
    let t = Instant::now();
    back(g, p, b)?;
    let again = t.elapsed().as_secs_f64();
    check(
        world,
        g,
        p,
        "after the transpose back to z-pencils",
        &g.z,
        &b.zback,
    );
    Ok(there + again)
}

/// Every protocol on grid `r` x `c`; the summary of the grid (on every rank).
fn run_grid(
    world: &Comm,
    (r, c): (usize, usize),
    n: usize,
    (iters, warm): (usize, usize),
    protos: &[Protocol],
) -> Result<table::Summary> {
    let g = Grid::new(world, r, c, n)?;
    let count = g.z.count();
    let mut b = Bufs {
        z: vec![0.0; count],
        y: vec![0.0; count],
        x: vec![0.0; count],
        zback: vec![0.0; count],
        send: vec![0.0; count],
        recv: vec![0.0; count],
    };
    pencil::fill(n, &g.z, &mut b.z);
    let np = protos.len();
    let mut times = vec![0.0; np * iters];
    for rep in 0..warm + iters {
        for k in 0..np {
            let i = (k + rep) % np;
            let p = &protos[i];
            p.start()?;
            let t = run_once(world, &g, p, &mut b).map_err(|e| {
                eprintln!(
                    "ibcoll-bench transpose: grid {}, protocol {}: {e}",
                    g.name, p.name
                );
                e
            })?;
            p.finish()?;
            if rep >= warm {
                times[i * iters + rep - warm] = t;
            }
        }
    }
    let mut slowest = vec![0.0; times.len()];
    world.allreduce(&times, &mut slowest, ReduceOp::Max)?;
    let timings: Vec<Timing> = protos
        .iter()
        .enumerate()
        .map(|(i, p)| Timing {
            name: p.name.clone(),
            reps: slowest[i * iters..(i + 1) * iters].to_vec(),
        })
        .collect();
    let (rows, summary) = table::summarize(&g.name, &timings);
    if world.rank() == 0 {
        println!(
            "# grid {}: rows of {c} ranks, columns of {r}; N = {n} ({n}^3 f64, {} KiB per rank; \
             blocks {} B across rows, {} B across columns); {np} protocols x {iters} repetitions \
             (+{warm} warm-up), interleaved; time = slowest rank, there and back",
            g.name,
            count * 8 / 1024,
            count / c * 8,
            count / r * 8,
        );
        print!("{}", table::rows_text(&rows));
        println!(
            "# grid {}: {np} protocols x {} runs checked on every rank: ok",
            g.name,
            warm + iters
        );
    }
    Ok(summary)
}

/// The benchmark.
pub fn run(world: &Comm, o: &Opts) -> Result<()> {
    let p = world.size();
    let bad = |detail: String| ibcoll::Error::InvalidArgument {
        rank: world.rank(),
        op: ibcoll::Op::Init,
        detail,
    };
    let grids = match o.grid {
        Some((r, c)) if r * c == p => vec![(r, c)],
        Some((r, c)) => {
            return Err(bad(format!(
                "--grid {r}x{c} needs {} ranks, the job has {p}",
                r * c
            )))
        }
        None => shapes(p),
    };
    let iters = o.iters.unwrap_or(DEFAULT_ITERS).max(1);
    let warm = o.warmup.unwrap_or(1);
    let protos = protocols::all();
    let mut summaries = Vec::new();
    for (r, c) in grids {
        let n = global_size(o.size.unwrap_or(DEFAULT_SIZE), r, c);
        summaries.push(run_grid(world, (r, c), n, (iters, warm), &protos)?);
    }
    if world.rank() == 0 {
        println!("# PSTSWM summary (protocol time = median of its repetitions)");
        println!("{}", table::SUMMARY_HEADER);
        for s in &summaries {
            println!("{}", table::summary_line(s));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_shapes_and_sizes() {
        assert_eq!(shapes(8), [(8, 1), (4, 2), (2, 4), (1, 8)]);
        assert_eq!(shapes(6), [(6, 1), (3, 2), (2, 3), (1, 6)]);
        assert_eq!(shapes(7), [(7, 1), (1, 7)]);
        assert_eq!(global_size(64, 4, 2), 64);
        assert_eq!(global_size(64, 2, 3), 66);
        assert_eq!(global_size(1, 2, 3), 6);
        assert_eq!(global_size(0, 1, 1), 1);
    }
}
