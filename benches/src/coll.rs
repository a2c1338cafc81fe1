//! Collective benchmarks: `ibcoll-bench <collective> [--algorithm NAME]
//! [-m MIN:MAX] [-i ITERS] [-x WARMUP] [--plot FILE]`, and the tuner.
//!
//! OSU format (`osu_allreduce -f`): per message size the average latency
//! over ranks, the minimum and maximum of the ranks' averages, plus the
//! standard deviation of single-call latencies (all ranks, all iterations)
//! and the iteration count. Sizes are bytes per rank as in OSU: the vector
//! for bcast/reduce/allreduce/scan/exscan (as f32 for the reducing ones),
//! one rank's block for gather/scatter/allgather/alltoall/reduce_scatter.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ibcoll::{Collective, Comm, ReduceOp};

use crate::plot::{self, SizeChart};
use crate::progress::Progress;
use crate::{iters_for, sizes, Opts};

/// An error of the benchmark itself (a name, a file), in ibcoll's type so
/// that every benchmark ends the same way.
fn bench_error(c: &Comm, detail: String) -> ibcoll::Error {
    ibcoll::Error::InvalidArgument {
        rank: c.rank(),
        op: ibcoll::Op::Init,
        detail,
    }
}

/// Draws `chart` to `path`; a failure is the benchmark's error.
fn draw(c: &Comm, path: &Path, chart: &SizeChart) -> ibcoll::Result<()> {
    plot::sizes(path, chart)
        .map_err(|e| bench_error(c, format!("cannot draw {}: {e}", path.display())))?;
    println!("# drew {}", path.display());
    Ok(())
}

/// `shm to rank 1`, for chart titles.
fn where_to(c: &Comm) -> String {
    format!(
        "{} ranks, {} to rank 1",
        c.size(),
        c.transport_to(1).unwrap_or("?")
    )
}

/// The buffers of one benchmark, and the uniform v-layout of the current
/// size (made before timing, as OSU's v-benchmarks do, so that the timed
/// call allocates nothing).
struct Bufs {
    s: Vec<u8>,
    r: Vec<u8>,
    fs: Vec<f32>,
    fr: Vec<f32>,
    /// `size` bytes per rank, at `i * size` (v-collectives).
    counts: Vec<usize>,
    displs: Vec<usize>,
    /// `size / 4` floats per rank (reduce_scatter).
    kcounts: Vec<usize>,
}

impl Bufs {
    fn new(n: usize, max: usize) -> Bufs {
        let cap = n * max.max(4);
        Bufs {
            s: vec![1u8; cap],
            r: vec![0u8; cap],
            fs: vec![1f32; cap / 4],
            fr: vec![0f32; cap / 4],
            counts: Vec::new(),
            displs: Vec::new(),
            kcounts: Vec::new(),
        }
    }

    fn layout(&mut self, n: usize, size: usize) {
        self.counts = vec![size; n];
        self.displs = (0..n).map(|i| i * size).collect();
        self.kcounts = vec![size / 4; n];
    }
}

fn call(c: &Comm, coll: Collective, size: usize, b: &mut Bufs) -> ibcoll::Result<()> {
    let n = c.size();
    let k = size / 4;
    let (s, r, fs, fr) = (&b.s, &mut b.r, &b.fs, &mut b.fr);
    let (counts, displs) = (&b.counts, &b.displs);
    match coll {
        Collective::Barrier => c.barrier(),
        Collective::Bcast => c.bcast(&mut r[..size], 0),
        Collective::Reduce => c.reduce(&fs[..k], &mut fr[..k], ReduceOp::Sum, 0),
        Collective::Allreduce => c.allreduce(&fs[..k], &mut fr[..k], ReduceOp::Sum),
        Collective::Scan => c.scan(&fs[..k], &mut fr[..k], ReduceOp::Sum),
        Collective::Exscan => c.exscan(&fs[..k], &mut fr[..k], ReduceOp::Sum),
        Collective::Gather => c.gather(&s[..size], &mut r[..n * size], 0),
        Collective::Scatter => c.scatter(&s[..n * size], &mut r[..size], 0),
        Collective::Allgather => c.allgather(&s[..size], &mut r[..n * size]),
        Collective::Alltoall => c.alltoall(&s[..n * size], &mut r[..n * size]),
        Collective::Gatherv => c.gatherv(&s[..size], &mut r[..n * size], counts, displs, 0),
        Collective::Scatterv => c.scatterv(&s[..n * size], counts, displs, &mut r[..size], 0),
        Collective::Allgatherv => c.allgatherv(&s[..size], &mut r[..n * size], counts, displs),
        Collective::Alltoallv => c.alltoallv(
            &s[..n * size],
            counts,
            displs,
            &mut r[..n * size],
            counts,
            displs,
        ),
        Collective::ReduceScatter => {
            c.reduce_scatter(&fs[..n * k], &mut fr[..k], &b.kcounts, ReduceOp::Sum)
        }
        Collective::ReduceScatterBlock => {
            c.reduce_scatter_block(&fs[..n * k], &mut fr[..k], ReduceOp::Sum)
        }
    }
}

/// Runs the benchmark of `coll` over the sizes of `o`.
pub fn run(c: &Comm, o: &Opts, coll: Collective) -> ibcoll::Result<()> {
    if let Some(a) = &o.algorithm {
        ibcoll::select::force_algorithm(coll, Some(a))?;
    }
    let n = c.size();
    let mut bufs = Bufs::new(n, o.max);
    if c.rank() == 0 {
        println!(
            "# algorithm: {}",
            o.algorithm.as_deref().unwrap_or("(selected by the table)")
        );
        if o.barrier {
            println!("# a barrier after every timed call (as OSU 5.3)");
        }
        println!(
            "{:<10}{:>17}{:>17}{:>17}{:>17}{:>12}",
            "# Size",
            "Avg Latency(us)",
            "Min Latency(us)",
            "Max Latency(us)",
            "StdDev(us)",
            "Iterations"
        );
    }
    let list: Vec<usize> = if coll == Collective::Barrier {
        vec![0]
    } else {
        sizes(o)
    };
    let mut drawn = Vec::new();
    for size in list {
        if coll.reduces() && size % 4 != 0 {
            continue;
        }
        let (iters, warm) = iters_for(o, size, 1_000, 100);
        bufs.layout(n, size);
        for _ in 0..warm {
            call(c, coll, size, &mut bufs)?;
        }
        c.barrier()?;
        let (mut sum, mut sq) = (0f64, 0f64);
        for _ in 0..iters {
            let t = Instant::now();
            call(c, coll, size, &mut bufs)?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            sum += us;
            sq += us * us;
            if o.barrier {
                c.barrier()?;
            }
        }
        let mean = sum / iters as f64;
        let mut tot = [0f64; 2];
        c.allreduce(&[sum, sq], &mut tot, ReduceOp::Sum)?;
        let mut mn = [0f64];
        let mut mx = [0f64];
        c.allreduce(&[mean], &mut mn, ReduceOp::Min)?;
        c.allreduce(&[mean], &mut mx, ReduceOp::Max)?;
        let cnt = (iters * n) as f64;
        let avg = tot[0] / cnt;
        let sd = (tot[1] / cnt - avg * avg).max(0.0).sqrt();
        if c.rank() == 0 {
            println!(
                "{size:<10}{avg:>17.2}{:>17.2}{:>17.2}{sd:>17.2}{iters:>12}",
                mn[0], mx[0]
            );
        }
        drawn.push(plot::Point {
            bytes: size,
            us: avg,
            spread: Some((mn[0], mx[0])),
        });
    }
    if o.algorithm.is_some() {
        ibcoll::select::force_algorithm(coll, None)?;
    }
    if let (Some(path), 0) = (&o.plot, c.rank()) {
        let name = o.algorithm.as_deref().unwrap_or("as selected by the table");
        let chart = SizeChart {
            title: format!(
                "{}, {}: average over ranks (bars: fastest to slowest rank)",
                coll.name(),
                where_to(c)
            ),
            series: vec![plot::Series {
                name: name.to_string(),
                points: drawn,
            }],
            picked: Vec::new(),
        };
        draw(c, path, &chart)?;
    }
    Ok(())
}

macro_rules! coll_benches {
    ($($f:ident => $c:ident),* $(,)?) => {$(
        pub fn $f(c: &Comm, o: &Opts) -> ibcoll::Result<()> {
            run(c, o, Collective::$c)
        }
    )*};
}

coll_benches!(
    barrier => Barrier,
    bcast => Bcast,
    reduce => Reduce,
    allreduce => Allreduce,
    gather => Gather,
    gatherv => Gatherv,
    scatter => Scatter,
    scatterv => Scatterv,
    allgather => Allgather,
    allgatherv => Allgatherv,
    alltoall => Alltoall,
    alltoallv => Alltoallv,
    reduce_scatter => ReduceScatter,
    reduce_scatter_block => ReduceScatterBlock,
    scan => Scan,
    exscan => Exscan,
);

/// Statistics of one (collective, size, algorithm) point.
struct Point {
    alg: &'static str,
    /// Mean over ranks and iterations (us).
    avg: f64,
    sd: f64,
    /// Rank 0's single-call latencies: min, median, max (us).
    min: f64,
    med: f64,
    max: f64,
}

fn measure(
    c: &Comm,
    o: &Opts,
    coll: Collective,
    alg: &'static str,
    size: usize,
    bufs: &mut Bufs,
) -> ibcoll::Result<Point> {
    ibcoll::select::force_algorithm(coll, Some(alg))?;
    let (iters, warm) = iters_for(o, size, 200, 20);
    bufs.layout(c.size(), size);
    for _ in 0..warm.min(iters) {
        call(c, coll, size, bufs)?;
    }
    c.barrier()?;
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        call(c, coll, size, bufs)?;
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    ibcoll::select::force_algorithm(coll, None)?;
    let sum: f64 = t.iter().sum();
    let sq: f64 = t.iter().map(|x| x * x).sum();
    let mut tot = [0f64; 2];
    c.allreduce(&[sum, sq], &mut tot, ReduceOp::Sum)?;
    let cnt = (iters * c.size()) as f64;
    let avg = tot[0] / cnt;
    t.sort_by(|a, b| a.total_cmp(b));
    Ok(Point {
        alg,
        avg,
        sd: (tot[1] / cnt - avg * avg).max(0.0).sqrt(),
        min: t[0],
        med: t[t.len() / 2],
        max: t[t.len() - 1],
    })
}

/// `ibcoll-bench tune [-m MIN:MAX] [-i ITERS] [--collectives a,b] [--out FILE] [--plot DIR]`:
/// measures every algorithm of every (or each listed) collective at every
/// size, prints for each point the ranking (by rank 0's median) with mean,
/// std dev and rank 0's min/median/max, and how many algorithms are within
/// 1%, 5% and 25% of the best; rank 0 writes the winners (the previous
/// size's winner is kept while within 5%) as an `IBCOLL_TUNING_FILE` table
/// (rules bounded by this communicator's size) to `--out` (default stdout),
/// and draws each collective once it is measured (see [`plot_dir`]), so that
/// an interrupted run keeps the pictures of what it finished.
pub fn tune(c: &Comm, o: &Opts) -> ibcoll::Result<()> {
    let n = c.size();
    let list: Vec<Collective> = match &o.collectives {
        None => Collective::ALL.to_vec(),
        Some(l) => l
            .split(',')
            .map(|x| {
                Collective::from_name(x.trim()).ok_or_else(|| ibcoll::Error::InvalidArgument {
                    rank: c.rank(),
                    op: ibcoll::Op::Init,
                    detail: format!("unknown collective {x:?}"),
                })
            })
            .collect::<ibcoll::Result<_>>()?,
    };
    let plots = plot_dir(o);
    if let (Some(dir), 0) = (&plots, c.rank()) {
        // Before minutes of measuring, not after.
        std::fs::create_dir_all(dir)
            .map_err(|e| bench_error(c, format!("cannot make {}: {e}", dir.display())))?;
    }
    let sizes_of = |coll: Collective| -> Vec<usize> {
        if coll == Collective::Barrier {
            vec![0]
        } else {
            sizes(o)
                .into_iter()
                .filter(|s| !coll.reduces() || s % 4 == 0)
                .collect()
        }
    };
    let points: usize = list
        .iter()
        .map(|&k| sizes_of(k).len() * ibcoll::algorithms::algorithms(k).len())
        .sum();
    let mut progress = Progress::new(c.rank(), points);
    let mut bufs = Bufs::new(n, o.max);
    let mut rules = Vec::new();
    for (ci, &coll) in list.iter().enumerate() {
        let algs = ibcoll::algorithms::algorithms(coll);
        let sizes_here = sizes_of(coll);
        let mut winners: Vec<(usize, &'static str)> = Vec::new();
        let mut measured: Vec<Vec<Point>> = Vec::new();
        for (si, &size) in sizes_here.iter().enumerate() {
            let mut pts = Vec::new();
            for a in algs {
                progress.step(&format!(
                    "{} ({}/{}), {} ({}/{}), {}",
                    coll.name(),
                    ci + 1,
                    list.len(),
                    plot::bytes_label(size as f64),
                    si + 1,
                    sizes_here.len(),
                    a.name
                ));
                pts.push(measure(c, o, coll, a.name, size, &mut bufs)?);
            }
            // Ranked by rank 0's median (robust against the scheduling
            // spikes of a shared machine); the mean is reported too.
            pts.sort_by(|a, b| a.med.total_cmp(&b.med));
            let best = pts[0].med.max(1e-9);
            let within = |f: f64| pts.iter().filter(|p| p.med <= best * (1.0 + f)).count();
            if c.rank() == 0 {
                println!(
                    "# {} {size} B: best {} ; within 1%: {}, 5%: {}, 25%: {}",
                    coll.name(),
                    pts[0].alg,
                    within(0.01),
                    within(0.05),
                    within(0.25)
                );
                for (i, p) in pts.iter().enumerate() {
                    println!(
                        "  {}. {:<22} avg {:>10.2} us  sd {:>9.2}  min/med/max {:.2}/{:.2}/{:.2}",
                        i + 1,
                        p.alg,
                        p.avg,
                        p.sd,
                        p.min,
                        p.med,
                        p.max
                    );
                }
            }
            // Keep the previous size's winner while it stays within 5%, so
            // noise does not make the table flap between algorithms.
            let pick = match winners.last() {
                Some(&(_, prev)) if pts.iter().any(|p| p.alg == prev && p.med <= best * 1.05) => {
                    prev
                }
                _ => pts[0].alg,
            };
            winners.push((size, pick));
            measured.push(pts);
        }
        if let (Some(dir), 0) = (&plots, c.rank()) {
            let chart = tune_chart(c, coll, algs, &sizes_here, &measured, &winners);
            draw(c, &plot_file(o, dir, coll), &chart)?;
        }
        // One rule per run of sizes with the same winner.
        for (i, &(size, alg)) in winners.iter().enumerate() {
            let last = i + 1 == winners.len();
            if last || winners[i + 1].1 != alg {
                let max_bytes = if last { None } else { Some(size) };
                rules.push((coll, alg, max_bytes));
            }
        }
    }
    progress.finish();
    if c.rank() == 0 {
        let body: Vec<String> = rules
            .iter()
            .map(|(coll, alg, mb)| {
                let mb = mb.map_or(String::new(), |b| format!(", \"max_bytes\": {b}"));
                format!(
                    "  {{\"collective\": \"{}\", \"algorithm\": \"{alg}\", \"max_comm_size\": {n}{mb}}}",
                    coll.name()
                )
            })
            .collect();
        let json = format!("{{\"rules\": [\n{}\n]}}\n", body.join(",\n"));
        match &o.out {
            Some(path) => match std::fs::write(path, &json) {
                Ok(()) => println!("# wrote {}", path.display()),
                Err(e) => eprintln!("ibcoll-bench tune: cannot write {}: {e}", path.display()),
            },
            None => print!("{json}"),
        }
    }
    Ok(())
}

/// Where the tuner draws: `--plot DIR`, else next to `--out`, else nowhere.
fn plot_dir(o: &Opts) -> Option<PathBuf> {
    if o.no_plot {
        return None;
    }
    if let Some(d) = &o.plot {
        return Some(d.clone());
    }
    let out = o.out.as_ref()?;
    Some(match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    })
}

/// `DIR/COLL.png` under `--plot`, `DIR/<out's stem>.COLL.png` next to
/// `--out` (so that two tables in one folder keep their own pictures).
fn plot_file(o: &Opts, dir: &Path, coll: Collective) -> PathBuf {
    match (&o.plot, o.out.as_ref().and_then(|f| f.file_stem())) {
        (None, Some(stem)) => dir.join(format!("{}.{}.png", stem.to_string_lossy(), coll.name())),
        _ => dir.join(format!("{}.png", coll.name())),
    }
}

/// The tuner's chart of one collective: rank 0's median per algorithm
/// and size (what the ranking uses), the winners as picked.
fn tune_chart(
    c: &Comm,
    coll: Collective,
    algs: &[ibcoll::algorithms::Algorithm],
    sizes: &[usize],
    measured: &[Vec<Point>],
    winners: &[(usize, &'static str)],
) -> SizeChart {
    let series = algs
        .iter()
        .map(|a| plot::Series {
            name: a.name.to_string(),
            points: sizes
                .iter()
                .zip(measured)
                .filter_map(|(&bytes, pts)| {
                    let p = pts.iter().find(|p| p.alg == a.name)?;
                    Some(plot::Point {
                        bytes,
                        us: p.med,
                        spread: None,
                    })
                })
                .collect(),
        })
        .collect();
    let picked = winners
        .iter()
        .filter_map(|&(b, w)| Some((b, algs.iter().position(|a| a.name == w)?)))
        .collect();
    SizeChart {
        title: format!("{}, {}: median of rank 0's calls", coll.name(), where_to(c)),
        series,
        picked,
    }
}
