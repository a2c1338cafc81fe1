//! `ibcoll-bench`'s command line, read with lexopt. The option table
//! [`OPTIONS`] is the one source of the help text and of which benchmark
//! takes which option, so the two cannot drift apart.

use std::ffi::OsString;
use std::path::PathBuf;

use ibcoll::Collective;

/// What a benchmark name stands for (which options it takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// latency, bw, bibw.
    P2p,
    Coll(Collective),
    Tune,
    Transpose,
}

impl Kind {
    fn bit(self) -> u8 {
        match self {
            Kind::P2p => P2P,
            Kind::Coll(_) => COLL,
            Kind::Tune => TUNE,
            Kind::Transpose => TRANSPOSE,
        }
    }
}

/// Options shared by every benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct Opts {
    pub min: usize,
    pub max: usize,
    pub iters: Option<usize>,
    pub warmup: Option<usize>,
    pub window: usize,
    /// Collectives: force this algorithm (`--algorithm NAME`).
    pub algorithm: Option<String>,
    /// Collectives: a barrier (untimed) after every timed call, as OSU
    /// 5.3's collective benchmarks do (`--barrier`).
    pub barrier: bool,
    /// Tuner: collectives to measure (`--collectives a,b`).
    pub collectives: Option<String>,
    /// Tuner: where to write the table (`--out FILE`).
    pub out: Option<PathBuf>,
    /// A collective: the PNG to draw; the tuner: the folder of its PNGs.
    pub plot: Option<PathBuf>,
    /// Tuner: no plots, not even next to `--out`.
    pub no_plot: bool,
    /// Transpose: one grid R x C (`--grid RxC`; default every shape).
    pub grid: Option<(usize, usize)>,
    /// Transpose: the global array's edge N (`--size N`).
    pub size: Option<usize>,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            min: 0,
            max: 4 << 20,
            iters: None,
            warmup: None,
            window: 64,
            algorithm: None,
            barrier: false,
            collectives: None,
            out: None,
            plot: None,
            no_plot: false,
            grid: None,
            size: None,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Cli {
    Help,
    Version,
    Bench {
        name: String,
        opts: Opts,
    },
    /// Draws a ratio table; needs no ranks.
    PlotRatios {
        table: PathBuf,
        out: PathBuf,
        title: Option<String>,
    },
}

const P2P: u8 = 1;
const COLL: u8 = 2;
const TUNE: u8 = 4;
const RATIOS: u8 = 8;
const TRANSPOSE: u8 = 16;
const ALL: u8 = P2P | COLL | TUNE;

/// One option: short name, long name, value (empty: a flag), where it
/// applies, help line.
struct Opt {
    short: Option<char>,
    long: &'static str,
    value: &'static str,
    applies: u8,
    help: &'static str,
}

const OPTIONS: &[Opt] = &[
    Opt {
        short: Some('m'),
        long: "message-size",
        value: "[MIN:]MAX",
        applies: ALL,
        help: "sizes in bytes per rank, powers of two (k, m, g suffixes; default 0:4m)",
    },
    Opt {
        short: Some('i'),
        long: "iterations",
        value: "N",
        applies: ALL | TRANSPOSE,
        help: "timed iterations per size (default: by size, as OSU);\n\
               transpose: timed repetitions of each protocol (default 10)",
    },
    Opt {
        short: Some('x'),
        long: "warmup",
        value: "N",
        applies: ALL | TRANSPOSE,
        help: "untimed iterations per size before the timed ones (transpose: default 1)",
    },
    Opt {
        short: Some('W'),
        long: "window",
        value: "N",
        applies: P2P,
        help: "bw, bibw: messages in flight per iteration (default 64)",
    },
    Opt {
        short: Some('a'),
        long: "algorithm",
        value: "NAME",
        applies: COLL,
        help: "COLLECTIVE: force this algorithm (default: the selection table's)",
    },
    Opt {
        short: None,
        long: "barrier",
        value: "",
        applies: COLL,
        help: "COLLECTIVE: an untimed barrier after every timed call, as OSU 5.3's\n\
               collective benchmarks do (default: calls back to back)",
    },
    Opt {
        short: None,
        long: "plot",
        value: "PATH",
        applies: COLL | TUNE,
        help: "COLLECTIVE: draw latency and bandwidth over size to the PNG file PATH;\n\
               tune: one PNG per collective into the folder PATH",
    },
    Opt {
        short: None,
        long: "collectives",
        value: "a,b,...",
        applies: TUNE,
        help: "tune: only these collectives (default: all)",
    },
    Opt {
        short: Some('o'),
        long: "out",
        value: "FILE",
        applies: TUNE | RATIOS,
        help: "tune: write the tuning table to FILE (default: stdout), and without\n\
               --plot the PNGs next to it (FILE's name without extension.COLL.png);\n\
               plot-ratios: the PNG to draw",
    },
    Opt {
        short: None,
        long: "no-plot",
        value: "",
        applies: TUNE,
        help: "tune: draw nothing, not even next to --out",
    },
    Opt {
        short: None,
        long: "grid",
        value: "RxC",
        applies: TRANSPOSE,
        help: "transpose: only the R x C process grid (default: every shape of the job)",
    },
    Opt {
        short: None,
        long: "size",
        value: "N",
        applies: TRANSPOSE,
        help: "transpose: the N x N x N array of f64 (default 64; rounded up to a\n\
               multiple of R and C)",
    },
    Opt {
        short: None,
        long: "title",
        value: "TEXT",
        applies: RATIOS,
        help: "plot-ratios: the chart's title",
    },
    Opt {
        short: Some('h'),
        long: "help",
        value: "",
        applies: ALL | RATIOS | TRANSPOSE,
        help: "this text",
    },
    Opt {
        short: Some('V'),
        long: "version",
        value: "",
        applies: ALL | RATIOS | TRANSPOSE,
        help: "print the version",
    },
];

/// The `--help` text.
pub fn help() -> String {
    let colls: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
    let mut s = format!(
        "ibcoll-bench {}: OSU-style micro-benchmarks over ibcoll
usage: ibrun -n N ibcoll-bench BENCHMARK [options]
       ibcoll-bench plot-ratios TABLE --out FILE [--title TEXT]
       ibcoll-bench --help | --version

benchmarks (2 or more ranks; OSU output on rank 0):
  latency, bw, bibw   point-to-point between ranks 0 and 1
  COLLECTIVE          {}
  tune                every algorithm of every collective at every size: prints
                      the rankings, writes the winners as a tuning table
                      (IBCOLL_TUNING_FILE) and draws what it measured
  transpose           a spectral transform's transpose on an R x C grid (row and
                      column communicators), every protocol (alltoall algorithms,
                      alltoallv, sendrecv, nonblocking orders), each result
                      checked; per grid the PSTSWM table of the protocols
  plot-ratios TABLE   no ranks: bar chart of a tab-separated table of ratios,
                      lines `panel<TAB>label<TAB>series<TAB>ratio` (# comments;
                      ratio `-` when missing), as benches/compare-coll.sh writes

options:
",
        ibcoll::VERSION,
        wrap(&colls.join(" "), 56, 22)
    );
    for o in OPTIONS {
        let mut left = match o.short {
            Some(c) => format!("  -{c}, --{}", o.long),
            None => format!("      --{}", o.long),
        };
        if !o.value.is_empty() {
            left = format!("{left} {}", o.value);
        }
        let mut lines = o.help.lines();
        let first = lines.next().unwrap_or("");
        if left.len() < 26 {
            s += &format!("{left:<26}{first}\n");
        } else {
            s += &format!("{left}\n{:26}{first}\n", "");
        }
        for l in lines {
            s += &format!("{:26}{}\n", "", l.trim_start());
        }
    }
    s
}

/// `text` in lines of at most `width`, continued lines indented by `indent`.
fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for w in text.split(' ') {
        if line > 0 && line + 1 + w.len() > width {
            out += &format!("\n{:indent$}", "");
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out += w;
        line += w.len();
    }
    out
}

/// A size with an optional k/m/g (binary) suffix.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (d, m) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    d.parse::<usize>().ok()?.checked_mul(m)
}

/// `RxC` (or `R*C`), both at least 1.
pub fn parse_grid(s: &str) -> Option<(usize, usize)> {
    let (r, c) = s.split_once(['x', 'X', '*'])?;
    let (r, c) = (r.trim().parse().ok()?, c.trim().parse().ok()?);
    (r >= 1 && c >= 1).then_some((r, c))
}

fn kind_of(name: &str) -> Option<Kind> {
    match name {
        "latency" | "bw" | "bibw" => Some(Kind::P2p),
        "tune" => Some(Kind::Tune),
        "transpose" => Some(Kind::Transpose),
        _ => Collective::from_name(name).map(Kind::Coll),
    }
}

fn text(v: OsString, flag: &str) -> Result<String, String> {
    v.into_string()
        .map_err(|v| format!("{flag}: {v:?} is not valid UTF-8"))
}

fn number(v: OsString, flag: &str) -> Result<usize, String> {
    let t = text(v, flag)?;
    t.parse()
        .map_err(|_| format!("{flag} needs a non-negative integer, got {t:?}"))
}

/// Reads the arguments after the program name.
pub fn parse<I>(args: I) -> Result<Cli, String>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    use lexopt::Arg;
    let mut p = lexopt::Parser::from_args(args);
    let err = |e: lexopt::Error| e.to_string();
    // Before the benchmark name only --help and --version mean anything.
    let name = match p.next().map_err(err)? {
        None => return Err("no benchmark given".into()),
        Some(Arg::Short('h') | Arg::Long("help")) => return Ok(Cli::Help),
        Some(Arg::Short('V') | Arg::Long("version")) => return Ok(Cli::Version),
        Some(Arg::Value(v)) => text(v, "benchmark")?,
        Some(a) => return Err(format!("{} before the benchmark name", shown(&a))),
    };
    let bit = if name == "plot-ratios" {
        RATIOS
    } else {
        kind_of(&name)
            .ok_or_else(|| format!("unknown benchmark {name:?}"))?
            .bit()
    };
    let mut o = Opts::default();
    let mut table: Option<PathBuf> = None;
    let mut title = None;
    while let Some(arg) = p.next().map_err(err)? {
        let flag = shown(&arg);
        let found = match arg {
            Arg::Value(v) if bit == RATIOS && table.is_none() => {
                table = Some(PathBuf::from(v));
                continue;
            }
            Arg::Value(v) => return Err(format!("unexpected argument {v:?} after {name}")),
            Arg::Short(c) => OPTIONS.iter().find(|o| o.short == Some(c)),
            Arg::Long(l) => OPTIONS.iter().find(|o| o.long == l),
        };
        let opt = found.ok_or_else(|| format!("unknown option {flag}"))?;
        if opt.applies & bit == 0 {
            return Err(format!("{flag} is not an option of {name}"));
        }
        match opt.long {
            "help" => return Ok(Cli::Help),
            "version" => return Ok(Cli::Version),
            "no-plot" => o.no_plot = true,
            "barrier" => o.barrier = true,
            "message-size" => {
                let v = text(p.value().map_err(err)?, &flag)?;
                let bad = || format!("{flag} needs [MIN:]MAX sizes (e.g. 8:1m), got {v:?}");
                let (a, b) = v.split_once(':').unwrap_or(("", v.as_str()));
                o.min = if a.is_empty() {
                    0
                } else {
                    parse_size(a).ok_or_else(bad)?
                };
                o.max = parse_size(b).ok_or_else(bad)?;
            }
            "iterations" => o.iters = Some(number(p.value().map_err(err)?, &flag)?),
            "warmup" => o.warmup = Some(number(p.value().map_err(err)?, &flag)?),
            "window" => o.window = number(p.value().map_err(err)?, &flag)?.max(1),
            "algorithm" => o.algorithm = Some(text(p.value().map_err(err)?, &flag)?),
            "collectives" => o.collectives = Some(text(p.value().map_err(err)?, &flag)?),
            "out" => o.out = Some(PathBuf::from(p.value().map_err(err)?)),
            "plot" => o.plot = Some(PathBuf::from(p.value().map_err(err)?)),
            "title" => title = Some(text(p.value().map_err(err)?, &flag)?),
            "grid" => {
                let v = text(p.value().map_err(err)?, &flag)?;
                o.grid = Some(parse_grid(&v).ok_or_else(|| {
                    format!("{flag} needs RxC with R, C >= 1 (e.g. 4x2), got {v:?}")
                })?);
            }
            "size" => {
                let v = number(p.value().map_err(err)?, &flag)?;
                if v == 0 {
                    return Err(format!("{flag} needs N >= 1"));
                }
                o.size = Some(v);
            }
            other => return Err(format!("--{other} is listed but not read (a bug)")),
        }
    }
    if o.min > o.max {
        return Err("-m MIN:MAX needs MIN <= MAX".into());
    }
    if bit != RATIOS {
        return Ok(Cli::Bench { name, opts: o });
    }
    Ok(Cli::PlotRatios {
        table: table.ok_or("plot-ratios needs a TABLE file")?,
        out: o.out.ok_or("plot-ratios needs --out FILE")?,
        title,
    })
}

fn shown(a: &lexopt::Arg) -> String {
    match a {
        lexopt::Arg::Short(c) => format!("-{c}"),
        lexopt::Arg::Long(l) => format!("--{l}"),
        lexopt::Arg::Value(v) => format!("{v:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(line: &str) -> Result<Cli, String> {
        parse(line.split_whitespace())
    }

    fn opts(line: &str) -> Opts {
        match p(line) {
            Ok(Cli::Bench { opts, .. }) => opts,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn benchmarks_and_options() {
        let o = opts("allreduce -m 4:64 -i 5 -x 2 --algorithm ring --plot a.png");
        assert_eq!((o.min, o.max, o.iters, o.warmup), (4, 64, Some(5), Some(2)));
        assert_eq!(o.algorithm.as_deref(), Some("ring"));
        assert_eq!(o.plot, Some(PathBuf::from("a.png")));
        assert!(!o.barrier);
        assert!(opts("bcast --barrier").barrier);
        let o = opts("bw -m 1k -W 0");
        assert_eq!((o.min, o.max, o.window), (0, 1024, 1));
        let o = opts("tune --message-size=8:1m --collectives bcast,scan -o t.json --no-plot");
        assert_eq!((o.min, o.max), (8, 1 << 20));
        assert_eq!(o.collectives.as_deref(), Some("bcast,scan"));
        assert!(o.no_plot && o.out == Some(PathBuf::from("t.json")));
        assert_eq!(opts("latency -m:64").max, 64);
        assert_eq!(
            kind_of("reduce_scatter_block"),
            Some(Kind::Coll(Collective::ReduceScatterBlock))
        );
        assert_eq!(
            p("plot-ratios t.tsv --out r.png --title x"),
            Ok(Cli::PlotRatios {
                table: "t.tsv".into(),
                out: "r.png".into(),
                title: Some("x".into())
            })
        );
        for h in ["--help", "-h", "tune --help", "bw -m 1 -h"] {
            assert_eq!(p(h), Ok(Cli::Help), "{h}");
        }
        assert_eq!(p("--version"), Ok(Cli::Version));
        let o = opts("transpose --grid 4x2 --size 48 -i 3 -x 0");
        assert_eq!(
            (o.grid, o.size, o.iters, o.warmup),
            (Some((4, 2)), Some(48), Some(3), Some(0))
        );
        assert_eq!(opts("transpose").grid, None);
        assert_eq!(parse_grid("2*3"), Some((2, 3)));
    }

    #[test]
    fn errors_name_the_option() {
        for (line, want) in [
            ("", "no benchmark"),
            ("-q", "-q before the benchmark name"),
            ("--help2", "--help2 before"),
            ("nope", "unknown benchmark \"nope\""),
            ("latency -q 1", "unknown option -q"),
            ("latency --bogus", "unknown option --bogus"),
            (
                "latency --algorithm ring",
                "--algorithm is not an option of latency",
            ),
            ("bcast -W 4", "-W is not an option of bcast"),
            (
                "bcast --collectives x",
                "--collectives is not an option of bcast",
            ),
            ("bcast -m", "-m"),
            ("bcast -m 8:x", "-m needs [MIN:]MAX"),
            ("bcast -m 64:8", "MIN <= MAX"),
            ("bcast -i -3", "-i needs a non-negative integer"),
            ("bcast extra", "unexpected argument"),
            ("tune --no-plot=yes", "--no-plot"),
            ("plot-ratios t.tsv", "needs --out"),
            ("plot-ratios --out x.png", "needs a TABLE"),
            ("plot-ratios t.tsv u.tsv --out x.png", "unexpected argument"),
            ("transpose --grid 4", "--grid needs RxC"),
            ("transpose --grid 0x8", "--grid needs RxC"),
            ("transpose --size 0", "--size needs N >= 1"),
            ("transpose -m 8", "-m is not an option of transpose"),
            ("bcast --grid 2x2", "--grid is not an option of bcast"),
        ] {
            let e = p(line).unwrap_err();
            assert!(e.contains(want), "{line:?}: {e}");
        }
    }

    #[test]
    fn help_lists_every_option_and_benchmark() {
        let h = help();
        for o in OPTIONS {
            assert!(h.contains(&format!("--{}", o.long)), "{}", o.long);
            if let Some(c) = o.short {
                assert!(h.contains(&format!("-{c}, --{}", o.long)), "{c}");
            }
        }
        for c in Collective::ALL {
            assert!(h.contains(c.name()), "{}", c.name());
        }
        assert!(h.lines().all(|l| l.len() <= 100), "{h}");
    }

    #[test]
    fn every_listed_option_is_read() {
        let benches = [
            (P2P, "bw"),
            (COLL, "bcast"),
            (TUNE, "tune"),
            (RATIOS, "plot-ratios t"),
            (TRANSPOSE, "transpose"),
        ];
        for o in OPTIONS {
            for &(bit, bench) in benches.iter().filter(|(b, _)| o.applies & b != 0) {
                let value = match (o.value, o.long) {
                    ("", _) => "",
                    (_, "grid") => "2x4",
                    _ => "8",
                };
                let line = format!("{bench} --{} {value} --out x", o.long);
                let line = if bit & (TUNE | RATIOS) == 0 {
                    line.replace(" --out x", "")
                } else {
                    line
                };
                assert!(p(&line).is_ok(), "{line}: {:?}", p(&line));
            }
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("k"), None);
        assert_eq!(parse_size("99999999999999999999g"), None);
    }

    proptest! {
        /// Random arguments: a command or an error, never a panic.
        #[test]
        fn any_arguments_parse_or_error(
            args in proptest::collection::vec(
                prop_oneof![
                    "-[a-zA-Z]{0,3}", "--[a-z-]{0,12}(=[a-z0-9:]{0,4})?", "[a-z_]{0,10}",
                    "[0-9kmg:]{0,6}", "\\PC{0,8}",
                ],
                0..8,
            )
        ) {
            let _ = parse(args);
        }
    }
}
