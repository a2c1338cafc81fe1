//! Multi-process tests: rank programs from `coll/examples/` started by
//! `target/<profile>/ibrun`. Build ibrun first:
//! `cargo build --workspace --bins --examples`.
//!
//! Nothing here depends on timing: every job has a generous timeout that
//! only turns a hang into a failure.

mod common;

use common::*;
use std::process::{Command, Output};

fn run(launcher: &[&str], prog: &str, args: &[&str]) -> Output {
    run_job(150, launcher, prog, args)
}

fn run_ok(launcher: &[&str], prog: &str, args: &[&str]) -> String {
    run_job_ok(150, launcher, prog, args)
}

// ---------------------------------------------------------------- ping-pong

#[test]
fn pingpong_shm() {
    let out = run_ok(&["-n", "2"], "pingpong", &[]);
    assert!(out.contains("ok (shm)") && out.contains("all ok"), "{out}");
}

#[test]
fn pingpong_tcp_between_virtual_nodes() {
    let out = run_ok(&["-n", "2", "--nodes", "2"], "pingpong", &[]);
    assert!(out.contains("ok (tcp)") && out.contains("all ok"), "{out}");
}

#[test]
fn pingpong_mixed_shm_and_tcp() {
    let out = run_ok(&["-n", "4", "--nodes", "2"], "pingpong", &[]);
    assert!(
        out.contains("ok (tcp)") && out.contains("ok (shm)"),
        "{out}"
    );
}

#[test]
fn pingpong_tcp_forced_on_one_node() {
    let out = run_ok(
        &["-n", "3", "-x", "IBCOLL_TRANSPORT=tcp"],
        "pingpong",
        &["2000000"],
    );
    assert!(
        out.contains("ok (tcp)") && !out.contains("ok (shm)"),
        "{out}"
    );
}

#[test]
fn pingpong_shm_pipelined_copy_without_cma() {
    let out = run_ok(&["-n", "2", "-x", "IBCOLL_CMA=off"], "pingpong", &[]);
    assert!(out.contains("ok (shm)"), "{out}");
}

#[test]
fn pingpong_other_eager_limits() {
    let out = run_ok(
        &[
            "-n",
            "3",
            "--nodes",
            "2",
            "-x",
            "IBCOLL_EAGER_LIMIT=100",
            "-x",
            "IBCOLL_TCP_EAGER_LIMIT=1000",
        ],
        "pingpong",
        &["300000"],
    );
    assert!(
        out.contains("eager limit 100\n") && out.contains("eager limit 1000\n"),
        "{out}"
    );
}

// ---------------------------------------------------------------- semantics

fn checks(launcher: &[&str]) {
    let out = run_ok(launcher, "p2p_check", &["all"]);
    assert_p2p_checks_ok(&out);
    if !launcher.contains(&"1") {
        assert!(out.contains("truncate: got expected error"), "{out}");
    }
}

#[test]
fn semantics_1_rank() {
    checks(&["-n", "1"]);
}

#[test]
fn semantics_2_ranks() {
    checks(&["-n", "2"]);
}

#[test]
fn semantics_3_ranks() {
    checks(&["-n", "3"]);
}

#[test]
fn semantics_4_ranks() {
    checks(&["-n", "4"]);
}

#[test]
fn semantics_5_ranks() {
    checks(&["-n", "5"]);
}

#[test]
fn semantics_6_ranks() {
    checks(&["-n", "6"]);
}

#[test]
fn semantics_7_ranks_oversubscribed() {
    checks(&["-n", "7"]);
}

#[test]
fn semantics_8_ranks_oversubscribed() {
    checks(&["-n", "8"]);
}

#[test]
fn semantics_5_ranks_on_2_virtual_nodes() {
    checks(&["-n", "5", "--nodes", "2"]);
}

#[test]
fn semantics_4_ranks_tcp_only() {
    checks(&["-n", "4", "-x", "IBCOLL_TRANSPORT=tcp"]);
}

#[test]
fn semantics_3_ranks_without_cma() {
    checks(&["-n", "3", "-x", "IBCOLL_CMA=off"]);
}

// ---------------------------------------------------------------- peer death

/// Starts `peer_death` as 2 ranks on one node (shm) or two (tcp) under the
/// mini PMI server; returns (survivor output, victim status).
fn peer_death_direct(two_nodes: bool) -> (Output, std::process::ExitStatus) {
    let job = format!(
        "pdtest{}{}",
        std::process::id(),
        if two_nodes { "t" } else { "s" }
    );
    let nodes: &[usize] = if two_nodes { &[0, 1] } else { &[0, 0] };
    let mut children = start_without_launcher("peer_death", &[], nodes, &job, &[], 120);
    let victim = children.pop().expect("victim");
    let survivor = children.pop().expect("survivor");
    // Reap the victim at once: a zombie still counts as alive.
    let victim_status = victim.wait_with_output().expect("wait victim").status;
    let out = survivor.wait_with_output().expect("wait survivor");
    remove_segments(&job, 2);
    (out, victim_status)
}

fn check_survivor(two_nodes: bool) {
    use std::os::unix::process::ExitStatusExt;
    let (out, victim) = peer_death_direct(two_nodes);
    assert_eq!(victim.signal(), Some(libc::SIGKILL), "victim: {victim:?}");
    let o = text(&out);
    assert!(out.status.success(), "survivor failed:\n{o}");
    assert!(
        o.contains("survivor: got expected error") && o.contains("peer lost"),
        "{o}"
    );
    assert!(o.contains("send to dead rank"), "{o}");
}

#[test]
fn peer_death_over_shm_is_an_error_not_a_hang() {
    check_survivor(false);
}

#[test]
fn peer_death_over_tcp_is_an_error_not_a_hang() {
    check_survivor(true);
}

#[test]
fn peer_death_under_ibrun_fails_the_job_naming_the_rank() {
    for nodes in ["1", "2"] {
        let o = run(&["-n", "2", "--nodes", nodes], "peer_death", &[]);
        let t = text(&o);
        assert!(!o.status.success(), "{t}");
        assert!(t.contains("rank 1") && t.contains("SIGKILL"), "{t}");
    }
}

// ---------------------------------------------------------------- info

#[test]
fn ibcoll_info_lists_every_variable() {
    let exe = env!("CARGO_BIN_EXE_ibcoll-info");
    let o = Command::new(exe).output().expect("run ibcoll-info");
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    for e in ibcoll::config::REGISTRY {
        assert!(t.contains(e.name), "{} missing:\n{t}", e.name);
    }
    assert!(t.contains("CMA") && t.contains(ibcoll::VERSION), "{t}");
}

#[test]
fn ibcoll_info_help_version_and_bad_option() {
    let exe = env!("CARGO_BIN_EXE_ibcoll-info");
    let o = Command::new(exe)
        .arg("--help")
        .output()
        .expect("run ibcoll-info");
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    for opt in ["-h, --help", "-V, --version", "usage: ibcoll-info"] {
        assert!(t.contains(opt), "{opt} missing:\n{t}");
    }
    let o = Command::new(exe)
        .arg("-V")
        .output()
        .expect("run ibcoll-info");
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains(ibcoll::VERSION));
    let o = Command::new(exe)
        .arg("--bogus")
        .output()
        .expect("run ibcoll-info");
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("\"--bogus\""), "{e}");
}

/// The README's example, which also catches a collective started after a
/// peer finalized (its data arrived before the peer's goodbye).
#[test]
fn readme_quickstart() {
    for n in ["1", "2", "3", "5"] {
        run_ok(&["-n", n], "quickstart", &[]);
    }
}

// ---------------------------------------------------------------- shm queue

const TINY_QUEUE: [&str; 6] = [
    "-x",
    "IBCOLL_SHM_BOX_BYTES=1024",
    "-x",
    "IBCOLL_SHM_QUEUE_BYTES=4096",
    "-x",
    "IBCOLL_EAGER_LIMIT=1024",
];

#[test]
fn full_queue_and_slow_receiver_lose_nothing() {
    // Default grants; a box at the first queued record for one sender
    // only (the others stay on the queue while it switches over); none.
    for boxes in [
        &[][..],
        &["-x", "IBCOLL_SHM_BOXES=1", "-x", "IBCOLL_SHM_BOX_AFTER=0"][..],
        &["-x", "IBCOLL_SHM_BOXES=0"][..],
    ] {
        let mut args = vec!["-n", "4"];
        args.extend_from_slice(&TINY_QUEUE);
        args.extend_from_slice(boxes);
        let o = run(&args, "queue_pressure", &["slow"]);
        let t = text(&o);
        assert!(o.status.success(), "{boxes:?}: {t}");
        assert!(t.contains("slow: ok (4 ranks)"), "{boxes:?}: {t}");
    }
}

#[test]
fn senders_to_a_dead_receiver_with_its_queue_full_get_peer_lost() {
    let job = format!("qptest{}", std::process::id());
    let env = [
        ("IBCOLL_SHM_BOX_BYTES", "1024"),
        ("IBCOLL_SHM_QUEUE_BYTES", "4096"),
        ("IBCOLL_EAGER_LIMIT", "1024"),
        ("IBCOLL_PEER_TIMEOUT_MS", "2000"),
    ];
    let mut children =
        start_without_launcher("queue_pressure", &["dead"], &[0, 0, 0, 0], &job, &env, 120);
    let t = std::time::Instant::now();
    // Reap the victim first: a zombie still counts as alive.
    let victim = children
        .pop()
        .expect("victim")
        .wait_with_output()
        .expect("wait");
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    remove_segments(&job, 4);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        victim.status.signal(),
        Some(libc::SIGKILL),
        "{}",
        text(&victim)
    );
    for (r, o) in outs.iter().enumerate() {
        let s = text(o);
        assert!(o.status.success(), "survivor {r}:\n{s}");
        assert!(s.contains(&format!("survivor {r}: got PeerLost")), "{s}");
    }
    assert!(t.elapsed().as_secs() < 60, "took {:?}", t.elapsed());
}

/// A sender killed between reserving its record in the receiver's queue
/// and publishing it: the receiver skips the reservation (the sender is
/// dead), gets `PeerLost` for it and every record of the other sender
/// queued behind it.
#[test]
fn a_sender_killed_mid_publish_does_not_block_the_queue() {
    let job = format!("qmid{}", std::process::id());
    let env = [
        ("IBCOLL_SHM_BOXES", "0"),
        ("IBCOLL_PEER_TIMEOUT_MS", "2000"),
    ];
    let mut children =
        start_without_launcher("queue_pressure", &["midpub"], &[0, 0, 0], &job, &env, 120);
    let t = std::time::Instant::now();
    // Reap the victim first: a zombie still counts as alive.
    let victim = children.remove(1).wait_with_output().expect("wait");
    let mut outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    outs.insert(1, victim);
    remove_segments(&job, 3);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        outs[1].status.signal(),
        Some(libc::SIGKILL),
        "{}",
        text(&outs[1])
    );
    assert!(outs[0].status.success(), "{}", text(&outs[0]));
    let s = text(&outs[2]);
    assert!(outs[2].status.success(), "{s}");
    assert!(s.contains("midpub: ok (4 messages of the dead rank"), "{s}");
    assert!(t.elapsed().as_secs() < 60, "took {:?}", t.elapsed());
}

#[test]
fn ibcoll_info_prints_the_segment_formula_for_a_ranks_per_node() {
    let exe = env!("CARGO_BIN_EXE_ibcoll-info");
    let o = Command::new(exe)
        .args(["--ppn", "128"])
        .env_remove("IBCOLL_SHM_QUEUE_BYTES")
        .env_remove("IBCOLL_SHM_BOX_BYTES")
        .env_remove("IBCOLL_SHM_COLL_BYTES")
        .output()
        .expect("run ibcoll-info");
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{t}");
    let key = "shm segment for 128 ranks per node: ";
    let at = t.find(key).unwrap_or_else(|| panic!("{t}")) + key.len();
    let bytes: u64 = t[at..]
        .split(' ')
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{t}"));
    assert!(bytes <= 128 * (8 << 20), "{t}");
    assert!(t.contains("formula: 4096 + n * "), "{t}");
    let bad = Command::new(exe)
        .args(["--ppn", "x"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
}
