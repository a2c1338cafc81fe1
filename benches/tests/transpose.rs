//! `ibcoll-bench transpose` through ibrun: every protocol's transpose
//! (there and back) is checked against the local reference on every rank
//! in every run, and a wrong element ends the job non-zero; here on 4 and
//! 6 ranks (every grid shape: 4x1, 2x2, 1x4, 6x1, 3x2, 2x3, 1x6), on 2
//! virtual nodes (shm inside, tcp across), and with blocks past the eager
//! limits (rendezvous, where a badly ordered blocking exchange would
//! hang). Timeouts only turn hangs into failures; no timing is checked.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Every protocol the benchmark must run (a name dropped from it fails).
const PROTOCOLS: &[&str] = &[
    "alltoall",
    "alltoall/pairwise",
    "alltoall/bruck",
    "alltoall/linear",
    "alltoall/shm",
    "alltoall/node_aware",
    "ialltoall",
    "alltoallv",
    "sendrecv/shift",
    "sendrecv/xor",
    "send-recv/xor",
    "irecv-isend/all",
    "irecv-isend/window2",
    "irecv-ahead/send",
];

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

fn text(o: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs the benchmark under `launcher` and checks that each of `grids`
/// ran every protocol and passed its checks.
fn transpose(launcher: &[&str], args: &[&str], grids: &[&str]) {
    let t0 = std::time::Instant::now();
    let o = Command::new(ibrun())
        .args(["--timeout", "60"])
        .args(launcher)
        .arg(env!("CARGO_BIN_EXE_ibcoll-bench"))
        .arg("transpose")
        .args(args)
        .env_remove("IBCOLL_TRANSPORT")
        .env_remove("IBCOLL_TUNING_FILE")
        .env_remove("IBCOLL_ALLTOALL_ALGORITHM")
        .output()
        .expect("spawn ibrun");
    eprintln!("{launcher:?} {args:?}: {:.1} s", t0.elapsed().as_secs_f64());
    let t = text(&o);
    assert!(o.status.success(), "{launcher:?} {args:?}:\n{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    for g in grids {
        let start = format!("# grid {g}: rows of");
        let rows: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with(&start))
            .skip(1)
            .take_while(|l| !l.starts_with('#') || l.starts_with("# protocol"))
            .collect();
        for p in PROTOCOLS {
            assert!(
                rows.iter().any(|l| l.split_whitespace().next() == Some(*p)),
                "grid {g}: no row for {p}:\n{t}"
            );
        }
        let ok = format!(
            "# grid {g}: {} protocols x 3 runs checked on every rank: ok",
            PROTOCOLS.len()
        );
        assert!(out.contains(&ok), "{ok:?} missing:\n{t}");
        assert!(
            out.lines().any(|l| l.split_whitespace().next() == Some(*g)),
            "no summary line for {g}:\n{t}"
        );
    }
}

const SMALL: &[&str] = &["--size", "12", "-i", "2", "-x", "1"];

#[test]
fn every_protocol_on_4_ranks() {
    transpose(&["-n", "4"], SMALL, &["4x1", "2x2", "1x4"]);
}

#[test]
fn every_protocol_on_6_ranks() {
    transpose(&["-n", "6"], SMALL, &["6x1", "3x2", "2x3", "1x6"]);
}

#[test]
fn every_protocol_on_2_virtual_nodes() {
    transpose(&["-n", "4", "--nodes", "2"], SMALL, &["4x1", "2x2", "1x4"]);
}

/// 256 KiB blocks: rendezvous on shm and tcp alike.
#[test]
fn large_blocks_on_2_virtual_nodes() {
    transpose(
        &["-n", "4", "--nodes", "2"],
        &["--grid", "2x2", "--size", "64", "-i", "2", "-x", "1"],
        &["2x2"],
    );
}

#[test]
fn a_grid_that_does_not_fit_the_job_is_an_error() {
    let o = Command::new(ibrun())
        .args(["--timeout", "60", "-n", "4"])
        .arg(env!("CARGO_BIN_EXE_ibcoll-bench"))
        .args(["transpose", "--grid", "3x2"])
        .output()
        .expect("spawn ibrun");
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("--grid 3x2 needs 6 ranks, the job has 4"), "{t}");
}
