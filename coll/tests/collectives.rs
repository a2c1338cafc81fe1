//! Collectives through ibrun: `coll/examples/coll_check` runs every
//! algorithm of every collective (sizes 0, 1, 3, count < ranks, 1 KiB,
//! eager limits -1/0/+1, 1 MiB), typed operations, bit-identical floating
//! point, argument errors and concurrent nonblocking collectives, for a
//! handful of (ranks, virtual nodes) combinations; and a rank dying in the
//! middle of a collective. Build first: `cargo build --workspace --bins
//! --examples`. Nothing depends on timing (timeouts only turn hangs into
//! failures).

mod common;

use common::*;
use std::process::{Command, Output};

fn coll_check(launcher: &[&str]) {
    let o = run_job(200, launcher, "coll_check", &[]);
    let t = text(&o);
    assert!(o.status.success(), "{launcher:?} failed:\n{t}");
    for c in ibcoll::Collective::ALL {
        assert!(
            t.contains(&format!("{}: ok", c.name())),
            "{} missing:\n{t}",
            c.name()
        );
    }
    for c in [
        "node_aware on split: ok",
        "typed: ok",
        "concurrent: ok",
        "coll_check: all ok",
    ] {
        assert!(t.contains(c), "{c} missing:\n{t}");
    }
}

#[test]
fn collectives_1_rank() {
    coll_check(&["-n", "1"]);
}

#[test]
fn collectives_2_ranks() {
    coll_check(&["-n", "2"]);
}

#[test]
fn collectives_3_ranks() {
    coll_check(&["-n", "3"]);
}

/// The fast paths' trees (barrier, bcast, reduce, allreduce, gather,
/// scatter), forced below
/// their default size: 3 ranks (the root's children only), 7 (a second
/// level) and 18 (a third in the range tree of bcast and the reductions).
#[test]
fn collectives_with_the_fast_path_trees() {
    coll_check(&["-n", "3", "-x", "IBCOLL_SHM_TREE_MIN=2"]);
    coll_check(&["-n", "7", "-x", "IBCOLL_SHM_TREE_MIN=2"]);
    coll_check(&["-n", "18", "-x", "IBCOLL_SHM_TREE_MIN=2"]);
}

#[test]
fn collectives_4_ranks_on_2_virtual_nodes() {
    coll_check(&["-n", "4", "--nodes", "2"]);
}

#[test]
fn collectives_5_ranks_on_3_virtual_nodes() {
    coll_check(&["-n", "5", "--nodes", "3"]);
}

#[test]
fn collectives_7_ranks_oversubscribed() {
    coll_check(&["-n", "7"]);
}

#[test]
fn collectives_8_ranks_on_2_virtual_nodes_oversubscribed() {
    coll_check(&["-n", "8", "--nodes", "2"]);
}

#[test]
fn collectives_6_ranks_on_3_virtual_nodes() {
    coll_check(&["-n", "6", "--nodes", "3"]);
}

#[test]
fn collectives_8_ranks_on_4_virtual_nodes_oversubscribed() {
    coll_check(&["-n", "8", "--nodes", "4"]);
}

/// Enough nodes for the multi-leader bcast and allreduce to drive two
/// ports per node (8 nodes of 3 and 2 ranks: 2 inter-node rounds of 3-ary
/// trees instead of 3 binary ones), every algorithm forced in turn.
#[test]
fn collectives_19_ranks_on_8_uneven_virtual_nodes() {
    coll_check(&["-n", "19", "--nodes", "8"]);
}

/// Uneven nodes (3, 3, 1): the two-level algorithms' folds and a node
/// of one rank.
#[test]
fn collectives_7_ranks_on_3_uneven_virtual_nodes() {
    coll_check(&["-n", "7", "--ppn", "3"]);
}

#[test]
fn collectives_6_ranks_tcp_only() {
    coll_check(&["-n", "6", "-x", "IBCOLL_TRANSPORT=tcp"]);
}

#[test]
fn collectives_5_ranks_on_2_virtual_nodes_small_eager_limits() {
    // Nearly every message goes by rendezvous.
    coll_check(&[
        "-n",
        "5",
        "--nodes",
        "2",
        "-x",
        "IBCOLL_EAGER_LIMIT=100",
        "-x",
        "IBCOLL_TCP_EAGER_LIMIT=1000",
    ]);
}

#[test]
fn collectives_4_ranks_without_cma() {
    coll_check(&["-n", "4", "-x", "IBCOLL_CMA=off"]);
}

// ---------------------------------------------------------------- selection

fn select_run(env: &[(&str, &str)]) -> String {
    select_run_on(&["-n", "3"], env)
}

fn select_run_on(launch: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(ibrun());
    cmd.args(["--timeout", "60"]).args(launch);
    for (k, v) in env {
        cmd.args(["-x", &format!("{k}={v}")]);
    }
    let o = cmd
        .arg(example("coll_check"))
        .arg("select")
        .output()
        .expect("spawn ibrun");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    t
}

#[test]
fn algorithm_forced_by_environment_and_tuning_file() {
    let t = select_run(&[("IBCOLL_ALLREDUCE_ALGORITHM", "ring")]);
    assert!(
        t.contains("allreduce 8 -> ring") && t.contains("select: allreduce ok"),
        "{t}"
    );
    let t = select_run(&[("IBCOLL_ALLREDUCE_ALGORITHM", "bogus")]);
    assert!(
        t.contains("IBCOLL_ALLREDUCE_ALGORITHM")
            && t.contains("recursive_doubling, ring, rabenseifner, node_aware")
            && t.contains("select: allreduce error"),
        "{t}"
    );
    let dir = std::env::temp_dir().join(format!("ibcoll-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("table.json");
    std::fs::write(
        &file,
        r#"{"rules": [{"collective": "allreduce", "algorithm": "node_aware", "max_bytes": 64, "window": 3},
                     {"collective": "allreduce", "algorithm": "ring", "segment_bytes": 4096}]}"#,
    )
    .expect("write table");
    let f = file.to_string_lossy().into_owned();
    let t = select_run(&[("IBCOLL_TUNING_FILE", &f)]);
    assert!(
        t.contains("allreduce 8 -> node_aware seg 65536 window 3")
            && t.contains("allreduce 1048576 -> ring seg 4096")
            && t.contains("select: allreduce ok"),
        "{t}"
    );
    std::fs::write(&file, "{\"rules\": [{\"collective\": \"allreduce\"}]}").expect("write");
    let t = select_run(&[("IBCOLL_TUNING_FILE", &f)]);
    assert!(
        t.contains("IBCOLL_TUNING_FILE") && t.contains("select: allreduce error"),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rules keyed by the network: the communicator agrees on the transport
/// joining its nodes (`shm` on one node, `tcp` between virtual nodes
/// over tcp), and a rule naming another network is skipped.
#[test]
fn selection_keyed_by_the_network() {
    let dir = std::env::temp_dir().join(format!("ibcoll-net-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("table.json");
    std::fs::write(
        &file,
        r#"{"rules": [{"collective": "allreduce", "algorithm": "ring", "network": "rdma"},
                     {"collective": "allreduce", "algorithm": "rabenseifner", "network": "tcp"},
                     {"collective": "allreduce", "algorithm": "node_aware"}]}"#,
    )
    .expect("write table");
    let f = file.to_string_lossy().into_owned();
    let env = [
        ("IBCOLL_TUNING_FILE", f.as_str()),
        ("IBCOLL_TRANSPORT", "tcp"),
    ];
    let t = select_run_on(&["-n", "4", "--nodes", "2"], &env);
    assert!(
        t.contains("select: network tcp")
            && t.contains("allreduce 8 -> rabenseifner")
            && t.contains("select: allreduce ok"),
        "{t}"
    );
    let t = select_run_on(&["-n", "3"], &env[..1]);
    assert!(
        t.contains("select: network shm")
            && t.contains("allreduce 8 -> node_aware")
            && t.contains("select: allreduce ok"),
        "{t}"
    );
    std::fs::write(
        &file,
        r#"{"rules": [{"collective": "allreduce", "algorithm": "ring", "network": "ib"}]}"#,
    )
    .expect("write");
    let t = select_run_on(&["-n", "2"], &env[..1]);
    assert!(
        t.contains("unknown network \"ib\"") && t.contains("select: allreduce error"),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------- peer death

/// Starts `coll_check MODE` (death, death_shm, death_shm_messages,
/// death_node_aware, death_multi_leader_*) with ranks on the given (virtual) nodes under the mini
/// PMI server; the last rank dies in the middle of a collective. Returns
/// (survivors' outputs, victim's output). A watchdog kills everything
/// after 120 s, so a hang becomes a failure.
fn death_on(nodes: &[usize], mode: &str) -> (Vec<Output>, Output) {
    let size = nodes.len();
    // Unique per test of this binary (they run in parallel).
    let job = format!(
        "cd{}{}{size}{}",
        std::process::id(),
        nodes.iter().map(|n| n.to_string()).collect::<String>(),
        mode.replace('_', "")
    );
    let mut children = start_without_launcher("coll_check", &[mode], nodes, &job, &[], 120);
    let victim = children.pop().expect("victim");
    // Reap the victim at once: a zombie still counts as alive.
    let victim_out = victim.wait_with_output().expect("wait victim");
    let outs = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait survivor"))
        .collect();
    remove_segments(&job, size);
    (outs, victim_out)
}

fn check_survivors(size: usize, two_nodes: bool) {
    check_survivors_of(size, two_nodes, "death");
}

fn check_survivors_of(size: usize, two_nodes: bool, mode: &str) {
    let nodes: Vec<usize> = (0..size).map(|r| if two_nodes { r } else { 0 }).collect();
    check_survivors_on(&nodes, mode);
}

fn check_survivors_on(nodes: &[usize], mode: &str) {
    use std::os::unix::process::ExitStatusExt;
    let (outs, victim) = death_on(nodes, mode);
    assert_eq!(
        victim.status.signal(),
        Some(libc::SIGKILL),
        "victim: {:?}\n{}",
        victim.status,
        text(&victim)
    );
    for out in outs {
        let o = text(&out);
        eprintln!("{o}");
        assert!(out.status.success(), "survivor failed:\n{o}");
        assert!(
            o.contains("survivor: got expected error") && o.contains("peer lost"),
            "{o}"
        );
    }
}

#[test]
fn rank_death_mid_collective_over_shm_is_an_error() {
    check_survivors(2, false);
}

/// The victim dies before publishing its part of a fast-path allreduce:
/// the survivors, waiting on its slot, learn it from the liveness check.
#[test]
fn rank_death_in_shm_fast_path_is_an_error() {
    check_survivors_of(2, false, "death_shm");
    check_survivors_of(3, false, "death_shm");
}

/// The victim dies in a fast-path alltoallv whose blocks are too big for
/// the slots: the survivors wait on its slot and on messages to and from
/// it, and each fails with `PeerLost`.
#[test]
fn rank_death_in_shm_fast_path_messages_is_an_error() {
    check_survivors_of(2, false, "death_shm_messages");
    check_survivors_of(3, false, "death_shm_messages");
}

/// The victim (rank 3) shares node 1 with rank 2 and dies in the
/// intra-node phase of a node-aware allreduce; alone on node 1 (ranks 0-1
/// on node 0) it dies in the inter-node phase among the leaders.
#[test]
fn rank_death_in_node_aware_phases_is_an_error() {
    check_survivors_on(&[0, 0, 1, 1], "death_node_aware");
    check_survivors_on(&[0, 0, 1], "death_node_aware");
}

/// The same in the multi-leader allreduce and allgather: sharing node 1
/// with rank 2, the victim dies inside the node (in the allreduce as a
/// heap child, in the allgather in the node's first exchange); alone on
/// node 1 it dies as the port the other node waits for.
#[test]
fn rank_death_in_multi_leader_phases_is_an_error() {
    for mode in [
        "death_multi_leader_allreduce",
        "death_multi_leader_allgather",
    ] {
        check_survivors_on(&[0, 0, 1, 1], mode);
        check_survivors_on(&[0, 0, 1], mode);
    }
}

#[test]
fn rank_death_mid_collective_over_tcp_is_an_error() {
    check_survivors(2, true);
}

/// Rank 0 never talks to the victim (rank 2) in this allreduce; it must
/// still fail (the run's any-source sentinel), while rank 1, which did see
/// the death, stays alive until rank 0 has reported.
#[test]
fn rank_death_reaches_survivors_not_talking_to_it_shm() {
    check_survivors(3, false);
}

#[test]
fn rank_death_reaches_survivors_not_talking_to_it_tcp() {
    check_survivors(3, true);
}
