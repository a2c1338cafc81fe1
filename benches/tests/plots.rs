//! The pictures: a small tune run through ibrun draws one valid PNG per
//! collective next to its table, a collective benchmark draws its run, and
//! plot-ratios draws a table.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `target/<profile>`, where `cargo build --workspace --bins` put ibrun.
fn ibrun() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test executable lives in target/<profile>/deps")
        .join("ibrun");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins --examples` first",
        p.display()
    );
    p
}

fn bench() -> &'static str {
    env!("CARGO_BIN_EXE_ibcoll-bench")
}

fn text(o: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Two ranks, bounded by ibrun's timeout (a hang fails, not a slow run).
fn two_ranks(args: &[&str]) -> String {
    let o = Command::new(ibrun())
        .args(["--timeout", "120", "-n", "2", bench()])
        .args(args)
        .env_remove("IBCOLL_TUNING_FILE")
        .output()
        .expect("spawn ibrun");
    let t = text(&o);
    assert!(o.status.success(), "{args:?}: {t}");
    t
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ibcoll-plots-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// Asserts `path` is a PNG of `w` x `h` pixels (0: any) with something drawn
/// on it, of a size a chart has; returns its width and height.
fn check_png(path: &Path, w: u32, h: u32) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        (5_000..3_000_000).contains(&bytes.len()),
        "{}: {} bytes",
        path.display(),
        bytes.len()
    );
    let mut r = png::Decoder::new(std::io::Cursor::new(&bytes))
        .read_info()
        .unwrap_or_else(|e| panic!("{}: not a PNG: {e}", path.display()));
    let mut px = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut px).expect("decode");
    let (iw, ih) = (info.width, info.height);
    assert!(w == 0 || iw == w, "{}: width {iw}", path.display());
    assert!(h == 0 || ih == h, "{}: height {ih}", path.display());
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let px = &px[..info.buffer_size()];
    let inked = px.chunks(3).filter(|p| p != &[255, 255, 255]).count();
    let share = inked as f64 / (iw * ih) as f64;
    assert!(
        (0.02..0.7).contains(&share),
        "{}: {:.1}% of the pixels drawn",
        path.display(),
        share * 100.0
    );
    (iw, ih)
}

/// A tune of a few sizes and iterations: seconds, not minutes.
fn tune(args: &[&str]) -> String {
    let mut all = vec!["tune", "-m", "8:256", "-i", "3", "-x", "1"];
    all.extend_from_slice(args);
    two_ranks(&all)
}

#[test]
fn tune_draws_one_png_per_collective_next_to_its_table() {
    let d = scratch("tune");
    let table = d.join("t.json");
    let t = tune(&[
        "--collectives",
        "allreduce,barrier,alltoall",
        "--out",
        table.to_str().unwrap(),
    ]);
    for c in ["allreduce", "alltoall"] {
        let f = d.join(format!("t.{c}.png"));
        assert!(t.contains(&format!("# drew {}", f.display())), "{t}");
        check_png(&f, 1200, 960);
    }
    // Barrier has only 0 bytes: bars of its algorithms instead.
    check_png(&d.join("t.barrier.png"), 1100, 0);
    let json = std::fs::read_to_string(&table).expect("table written");
    ibcoll::select::Table::from_json(&json).expect("a table ibcoll reads");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn tune_plot_dir_and_no_plot() {
    let d = scratch("dir");
    let dir = d.join("pictures/new");
    tune(&["--collectives", "bcast", "--plot", dir.to_str().unwrap()]);
    check_png(&dir.join("bcast.png"), 1200, 960);
    let out = d.join("quiet.json");
    let t = tune(&[
        "--collectives",
        "bcast",
        "--out",
        out.to_str().unwrap(),
        "--no-plot",
    ]);
    assert!(!t.contains("# drew"), "{t}");
    assert!(out.exists() && !d.join("quiet.bcast.png").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_collective_run_draws_its_plot_and_keeps_its_output() {
    let d = scratch("coll");
    let f = d.join("ar.png");
    let t = two_ranks(&[
        "allreduce",
        "-m",
        "8:1k",
        "-i",
        "3",
        "-x",
        "1",
        "--algorithm",
        "ring",
        "--plot",
        f.to_str().unwrap(),
    ]);
    check_png(&f, 1200, 960);
    // The OSU table is untouched: its header, then one row per size.
    let rows: Vec<&str> = t
        .lines()
        .skip_while(|l| !l.starts_with("# Size"))
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .collect();
    assert_eq!(rows.len(), 8, "{t}");
    assert!(rows[0].starts_with("8 "), "{t}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn plot_ratios_draws_a_table_and_names_a_bad_line() {
    let d = scratch("ratios");
    let table = d.join("r.tsv");
    let mut tsv = String::from("# panel\tlabel\tseries\tratio\n");
    for np in [2, 4] {
        for c in ["bcast 8", "allreduce 8", "alltoall 65536"] {
            tsv += &format!("{np} ranks\t{c}\tvs Open MPI\t0.{np}5\n");
            tsv += &format!("{np} ranks\t{c}\tvs MPICH\t1.{np}\n");
        }
    }
    std::fs::write(&table, &tsv).unwrap();
    let f = d.join("r.png");
    let plot = || {
        Command::new(bench())
            .args(["plot-ratios", table.to_str().unwrap()])
            .args(["--out", f.to_str().unwrap()])
            .output()
            .expect("run ibcoll-bench")
    };
    let o = plot();
    assert!(o.status.success(), "{}", text(&o));
    check_png(&f, 1100, 0);
    std::fs::write(&table, "2 ranks\tbcast\tx\n").unwrap();
    let o = plot();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("r.tsv: line 1: 3 tab-separated fields"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
