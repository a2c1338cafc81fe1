//! Point-to-point over the rdma channel: the rank programs of
//! `coll/examples/` under `ibrun --nodes K` with `IBCOLL_TRANSPORT=rdma`.
//!
//! These need verbs devices: they run inside the Soft-RoCE VM
//! (`scripts/rxe-run --coll-rdma-tests`, part of `scripts/test`), with
//! `-n veth` giving rxe0 and rxe1 and `IBCOLL_IB_DEVICE=rxe0,rxe1` putting
//! node i on `rxe<i mod 2>` so traffic between virtual nodes crosses the
//! veth pair. Without a device each test prints a note and passes, unless
//! `IBCOLL_RDMA_REQUIRE=1`. Build first: `cargo build --workspace --bins
//! --examples`.

mod common;

use common::*;
use std::process::Output;

const DEVICES: &str = "IBCOLL_IB_DEVICE=rxe0,rxe1";

fn have_rdma() -> bool {
    if !ibcoll_rdma::devices().is_empty() {
        return true;
    }
    if std::env::var("IBCOLL_RDMA_REQUIRE").is_ok_and(|v| v == "1") {
        panic!("IBCOLL_RDMA_REQUIRE=1 but there is no RDMA device");
    }
    eprintln!("note: no RDMA device here; run scripts/rxe-run --coll-rdma-tests");
    false
}

fn run(launcher: &[&str], prog: &str, args: &[&str]) -> Output {
    run_job(200, launcher, prog, args)
}

fn run_ok(launcher: &[&str], prog: &str, args: &[&str]) -> String {
    run_job_ok(200, launcher, prog, args)
}

#[test]
fn pingpong_rdma_2_nodes_read_and_write_rendezvous() {
    if !have_rdma() {
        return;
    }
    for mode in ["auto", "read", "write"] {
        let m = format!("IBCOLL_RDMA_RNDV={mode}");
        let out = run_ok(
            &[
                "-n",
                "2",
                "--nodes",
                "2",
                "-x",
                "IBCOLL_TRANSPORT=rdma",
                "-x",
                DEVICES,
                "-x",
                &m,
            ],
            "pingpong",
            &["1100000"],
        );
        assert!(
            out.contains("ok (rdma)") && out.contains("eager limit 8192") && out.contains("all ok"),
            "{mode}: {out}"
        );
    }
}

#[test]
fn auto_uses_rdma_between_nodes_and_shm_within() {
    if !have_rdma() {
        return;
    }
    let o = run(
        &["-n", "4", "--nodes", "2", "-x", DEVICES],
        "pingpong",
        &["100000"],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("ok (rdma)") && t.contains("ok (shm)"), "{t}");
    assert!(!t.contains("using tcp"), "{t}");
}

#[test]
fn semantics_rdma_3_nodes() {
    if !have_rdma() {
        return;
    }
    let out = run_ok(
        &[
            "-n",
            "3",
            "--nodes",
            "3",
            "-x",
            "IBCOLL_TRANSPORT=rdma",
            "-x",
            DEVICES,
        ],
        "p2p_check",
        &["all"],
    );
    assert_p2p_checks_ok(&out);
    assert!(out.contains("truncate: got expected error"), "{out}");
}

#[test]
fn many_to_one_with_few_credits() {
    if !have_rdma() {
        return;
    }
    // 3 senders into one receiver with 4 receive buffers per peer and
    // write rendezvous: credits, not RNR retries, pace the senders.
    let out = run_ok(
        &[
            "-n",
            "4",
            "--nodes",
            "2",
            "-x",
            "IBCOLL_TRANSPORT=rdma",
            "-x",
            DEVICES,
            "-x",
            "IBCOLL_RDMA_RECV_BUFS=4",
            "-x",
            "IBCOLL_RDMA_SEND_BUFS=2",
            "-x",
            "IBCOLL_RDMA_RNR_RETRY=0",
            "-x",
            "IBCOLL_RDMA_RNDV=write",
        ],
        "p2p_check",
        &["anysource", "ring"],
    );
    assert!(
        out.contains("anysource: ok (4 ranks)") && out.contains("ring: ok"),
        "{out}"
    );
}

#[test]
fn collectives_over_rdma_if_present() {
    if !have_rdma() {
        return;
    }
    if !target_dir().join("examples").join("coll_check").exists() {
        eprintln!("note: no coll_check example yet");
        return;
    }
    // Every rank over rdma on 3 nodes, then shm within and rdma between 2.
    for launcher in [
        &[
            "-n",
            "3",
            "--nodes",
            "3",
            "-x",
            "IBCOLL_TRANSPORT=rdma",
            "-x",
            DEVICES,
        ][..],
        &["-n", "4", "--nodes", "2", "-x", DEVICES][..],
    ] {
        let o = run(launcher, "coll_check", &["quick"]);
        let t = text(&o);
        assert!(
            o.status.success() && t.contains("coll_check: all ok"),
            "{t}"
        );
    }
}

// ---------------------------------------------------------------- peer death

/// `peer_death` as 2 ranks on two virtual nodes over rdma; the victim
/// SIGKILLs itself with a rendezvous send pending. Returns the survivor's
/// output and how long it took.
fn peer_death(extra_env: &[(&str, &str)]) -> (Output, f64) {
    let job = format!("rdmapd{}{}", std::process::id(), extra_env.len());
    let mut env = vec![
        ("IBCOLL_TRANSPORT", "rdma"),
        ("IBCOLL_IB_DEVICE", "rxe0,rxe1"),
    ];
    env.extend_from_slice(extra_env);
    let t = std::time::Instant::now();
    let mut children = start_without_launcher("peer_death", &[], &[0, 1], &job, &env, 300);
    let victim = children.pop().expect("victim");
    let survivor = children.pop().expect("survivor");
    let _ = victim.wait_with_output();
    let out = survivor.wait_with_output().expect("wait survivor");
    (out, t.elapsed().as_secs_f64())
}

fn check_survivor(extra_env: &[(&str, &str)], bound_s: f64) {
    let (out, secs) = peer_death(extra_env);
    let o = text(&out);
    eprintln!("peer death {extra_env:?}: {secs:.1} s\n{o}");
    assert!(out.status.success(), "survivor failed:\n{o}");
    assert!(
        o.contains("survivor: got expected error") && o.contains("peer lost"),
        "{o}"
    );
    assert!(o.contains("send to dead rank"), "{o}");
    assert!(secs < bound_s, "took {secs:.1} s (bound {bound_s} s):\n{o}");
}

#[test]
fn peer_death_over_rdma_is_an_error_not_a_hang() {
    if !have_rdma() {
        return;
    }
    check_survivor(&[], 60.0);
}

#[test]
fn peer_death_over_rdma_found_by_the_verbs_heartbeat() {
    if !have_rdma() {
        return;
    }
    // No pid check: the idle survivor's probe (a zero-length RDMA write)
    // must fail with "retry counter exceeded" within the peer timeout.
    check_survivor(
        &[
            ("IBCOLL_RDMA_PID_CHECK", "off"),
            ("IBCOLL_PEER_TIMEOUT_MS", "3000"),
            ("IBCOLL_RDMA_TIMEOUT", "14"),
            ("IBCOLL_RDMA_RETRY_CNT", "3"),
        ],
        60.0,
    );
}
