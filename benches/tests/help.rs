//! `ibcoll-bench --help`, `--version` and bad options, without ranks.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ibcoll-bench"))
        .args(args)
        .output()
        .expect("run ibcoll-bench")
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_exits_0_and_lists_the_options() {
    for args in [&["--help"][..], &["-h"], &["tune", "--help"]] {
        let o = bench(args);
        let h = out(&o);
        assert!(o.status.success(), "{args:?}: {}", err(&o));
        for opt in [
            "usage: ibrun -n N ibcoll-bench BENCHMARK",
            "-m, --message-size [MIN:]MAX",
            "-i, --iterations N",
            "-x, --warmup N",
            "-W, --window N",
            "-a, --algorithm NAME",
            "--plot PATH",
            "--collectives a,b",
            "-o, --out FILE",
            "--no-plot",
            "--title TEXT",
            "--grid RxC",
            "--size N",
            "transpose",
            "-h, --help",
            "-V, --version",
            "latency, bw, bibw",
            "reduce_scatter_block",
            "tune",
            "plot-ratios TABLE",
        ] {
            assert!(h.contains(opt), "{opt} missing:\n{h}");
        }
    }
}

#[test]
fn version() {
    let o = bench(&["--version"]);
    assert!(o.status.success());
    assert!(out(&o).starts_with("ibcoll-bench "), "{}", out(&o));
}

#[test]
fn bad_options_are_named_and_fail_before_init() {
    for (args, want) in [
        (&["--bogus"][..], "--bogus"),
        (&["allreduce", "--bogus"], "unknown option --bogus"),
        (
            &["allreduce", "-W", "4"],
            "-W is not an option of allreduce",
        ),
        (&["nope"], "unknown benchmark \"nope\""),
        (&[], "no benchmark given"),
    ] {
        let o = bench(args);
        let e = err(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(want) && e.contains("--help"), "{args:?}: {e}");
        assert!(out(&o).is_empty(), "{args:?}");
    }
}
