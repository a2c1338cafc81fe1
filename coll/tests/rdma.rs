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

/// The launcher arguments of `n` ranks on `nodes` virtual nodes, every
/// pair over rdma on the VM's devices, with `-x` for each of `env`.
fn over_rdma(n: usize, nodes: usize, env: &[&str]) -> Vec<String> {
    let mut l: Vec<String> = ["-n", &n.to_string(), "--nodes", &nodes.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for e in ["IBCOLL_TRANSPORT=rdma", DEVICES].iter().chain(env) {
        l.push("-x".into());
        l.push(e.to_string());
    }
    l
}

/// [`run`] with [`over_rdma`]'s launcher.
fn run_rdma(n: usize, nodes: usize, env: &[&str], prog: &str, args: &[&str]) -> Output {
    let l = over_rdma(n, nodes, env);
    run(
        &l.iter().map(String::as_str).collect::<Vec<_>>(),
        prog,
        args,
    )
}

/// [`run_ok`] with [`over_rdma`]'s launcher.
fn run_rdma_ok(n: usize, nodes: usize, env: &[&str], prog: &str, args: &[&str]) -> String {
    let l = over_rdma(n, nodes, env);
    run_ok(
        &l.iter().map(String::as_str).collect::<Vec<_>>(),
        prog,
        args,
    )
}

#[test]
fn pingpong_rdma_2_nodes_read_and_write_rendezvous() {
    if !have_rdma() {
        return;
    }
    for mode in ["auto", "read", "write"] {
        let m = format!("IBCOLL_RDMA_RNDV={mode}");
        let out = run_rdma_ok(2, 2, &[&m], "pingpong", &["1100000"]);
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
    let out = run_rdma_ok(3, 3, &[], "p2p_check", &["all"]);
    assert_p2p_checks_ok(&out);
    assert!(out.contains("truncate: got expected error"), "{out}");
}

#[test]
fn many_to_one_with_few_credits() {
    if !have_rdma() {
        return;
    }
    // 3 senders into one receiver whose shared receive queue has 16
    // buffers, and write rendezvous: credits, not RNR retries, pace the
    // senders.
    let out = run_rdma_ok(
        4,
        2,
        &[
            "IBCOLL_RDMA_SRQ_BUFS=16",
            "IBCOLL_RDMA_SEND_BUFS=2",
            "IBCOLL_RDMA_RNR_RETRY=0",
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

/// Seven ranks on seven nodes post 400 messages each (eager and
/// rendezvous) to rank 0 at once, which sleeps first so they all pile up;
/// its shared receive queue has 16 buffers and RNR retries are off, so a
/// single message sent without a posted buffer fails the job. Every word
/// of every message is checked, and the stats show the senders had to
/// queue for credits (the protocol was exercised, not bypassed).
#[test]
fn many_to_one_through_a_16_buffer_srq_without_rnr_retries() {
    if !have_rdma() {
        return;
    }
    let o = run_rdma(
        8,
        8,
        &[
            "IBCOLL_RDMA_SRQ_BUFS=16",
            "IBCOLL_RDMA_RNR_RETRY=0",
            "IBCOLL_STATS=1",
        ],
        "p2p_check",
        &["manytoone"],
    );
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("manytoone: ok (8 ranks)"),
        "{t}"
    );
    let lines = stats_lines(&o);
    assert_eq!(lines.len(), 8, "{t}");
    let root = lines
        .iter()
        .find(|l| l.contains("rank 0 of 8"))
        .unwrap_or_else(|| panic!("no stats of rank 0: {t}"));
    eprintln!("{root}");
    assert!(root.contains("rdma qps rc=7 ud=1"), "{root}");
    assert_eq!(stat(root, "srq bufs="), 16, "{root}");
    assert!(stat(root, "credit requests ") > 0, "{root}");
    for l in &lines {
        assert_eq!(stat(l, "failed "), 0, "{l}");
    }
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
    // Every rank over rdma on 3 nodes, then shm within and rdma between
    // the shapes (4,2) (5,3) (6,3) (8,4), and 3 uneven nodes of
    // 3, 2 and 2 ranks (two ports a node in the multi-leader schedules).
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
        &["-n", "5", "--nodes", "3", "-x", DEVICES][..],
        &["-n", "6", "--nodes", "3", "-x", DEVICES][..],
        &["-n", "8", "--nodes", "4", "-x", DEVICES][..],
        &["-n", "7", "--nodes", "3", "-x", DEVICES][..],
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
fn peer_death(args: &[&str], extra_env: &[(&str, &str)]) -> (Output, f64) {
    let job = format!(
        "rdmapd{}{}{}",
        std::process::id(),
        extra_env.len(),
        args.len()
    );
    let mut env = vec![
        ("IBCOLL_TRANSPORT", "rdma"),
        ("IBCOLL_IB_DEVICE", "rxe0,rxe1"),
    ];
    env.extend_from_slice(extra_env);
    let t = std::time::Instant::now();
    let mut children = start_without_launcher("peer_death", args, &[0, 1], &job, &env, 300);
    let victim = children.pop().expect("victim");
    let survivor = children.pop().expect("survivor");
    let _ = victim.wait_with_output();
    let out = survivor.wait_with_output().expect("wait survivor");
    (out, t.elapsed().as_secs_f64())
}

fn check_survivor(extra_env: &[(&str, &str)], bound_s: f64) {
    check_survivor_of(&[], extra_env, bound_s);
}

fn check_survivor_of(args: &[&str], extra_env: &[(&str, &str)], bound_s: f64) -> String {
    let (out, secs) = peer_death(args, extra_env);
    let o = text(&out);
    eprintln!("peer death {args:?} {extra_env:?}: {secs:.1} s\n{o}");
    assert!(out.status.success(), "survivor failed:\n{o}");
    assert!(
        o.contains("survivor: got expected error") && o.contains("peer lost"),
        "{o}"
    );
    assert!(o.contains("send to dead rank"), "{o}");
    assert!(secs < bound_s, "took {secs:.1} s (bound {bound_s} s):\n{o}");
    o
}

/// A sender out of credits because its receiver stopped and died (16
/// buffers in the receiver's SRQ, 500 messages posted): its wait ends with
/// PeerLost, found by the pid check, and with the pid check off by the
/// heartbeat probe (an RDMA write, which needs no credit). The survivor's
/// stats show it asked for credits (WANT) in vain.
#[test]
fn a_sender_starved_of_credits_by_a_dead_peer_gets_peer_lost() {
    if !have_rdma() {
        return;
    }
    let srq = [("IBCOLL_RDMA_SRQ_BUFS", "16"), ("IBCOLL_STATS", "1")];
    let heartbeat = [
        ("IBCOLL_RDMA_SRQ_BUFS", "16"),
        ("IBCOLL_STATS", "1"),
        ("IBCOLL_RDMA_PID_CHECK", "off"),
        ("IBCOLL_PEER_TIMEOUT_MS", "3000"),
        ("IBCOLL_RDMA_TIMEOUT", "14"),
        ("IBCOLL_RDMA_RETRY_CNT", "3"),
    ];
    for env in [&srq[..], &heartbeat[..]] {
        let o = check_survivor_of(&["starve"], env, 60.0);
        let line = o
            .lines()
            .find(|l| l.contains("ibcoll stats: rank 0 "))
            .unwrap_or_else(|| panic!("no stats of rank 0:\n{o}"));
        let i = line.find("credit requests ").expect("credit requests");
        assert!(stat(&line[i..], " sent ") > 0, "{line}");
    }
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

// ------------------------------------------------- connections on first use

/// The `IBCOLL_STATS` lines of a job (one per rank).
fn stats_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| l.starts_with("ibcoll stats: "))
        .map(str::to_owned)
        .collect()
}

/// The number after `key` in a stats line.
fn stat(line: &str, key: &str) -> u64 {
    let i = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + key.len();
    line[i..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("no number after {key} in {line}"))
}

#[test]
fn ring_on_8_nodes_makes_two_queue_pairs_per_rank_then_every_collective() {
    if !have_rdma() {
        return;
    }
    // Nodes alternate rxe0/rxe1: neighbours 1-2, 3-4... cross the veth
    // pair, and 7-0 ... and ranks two apart share a device.
    let o = run_rdma(8, 8, &["IBCOLL_STATS=1"], "connect_check", &["ring"]);
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("ring: ok (8 ranks)"),
        "{t}"
    );
    let lines = stats_lines(&o);
    assert_eq!(lines.len(), 8, "{t}");
    for l in &lines {
        // Exactly the two neighbours, and init's one fence.
        assert!(l.contains("rdma qps rc=2 ud=1"), "{l}");
        assert_eq!(stat(l, "handshakes="), 2, "{l}");
        assert_eq!(stat(l, "fences="), 1, "{l}");
        assert_eq!(stat(l, "failed "), 0, "{l}");
    }
    let o = run_rdma(8, 8, &[], "coll_check", &["quick"]);
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("coll_check: all ok"),
        "{t}"
    );
}

#[test]
fn crossing_first_messages_connect_once_even_with_lost_datagrams() {
    if !have_rdma() {
        return;
    }
    // 2 ranks: the purely simultaneous case; 4 ranks with one handshake
    // datagram in three dropped: every pair recovers by resending.
    for (n, drop) in [(2, "0"), (4, "3")] {
        let d = format!("IBCOLL_RDMA_UD_DROP={drop}");
        let o = run_rdma(
            n,
            n,
            &["IBCOLL_STATS=1", &d],
            "connect_check",
            &["crossing"],
        );
        let t = text(&o);
        let n = n as u64;
        assert!(o.status.success(), "{t}");
        assert_eq!(t.matches("crossing: ok").count() as u64, n, "{t}");
        let lines = stats_lines(&o);
        let mut resent = 0;
        for l in &lines {
            assert!(l.contains(&format!("rdma qps rc={} ud=1", n - 1)), "{l}");
            assert_eq!(stat(l, "handshakes="), n - 1, "{l}");
            resent += stat(l, "resent ");
        }
        if drop != "0" {
            assert!(resent > 0, "nothing was resent with loss:\n{t}");
        }
    }
}

/// `connect_check WHAT` as 2 ranks on two virtual nodes over rdma, with no
/// launcher to end the survivor; returns its output and how long it took.
fn rdma_contact(what: &str, env: &[(&str, &str)]) -> (String, f64) {
    let job = format!("rcc{}{}{}", what.len(), env.len(), std::process::id());
    let mut e = vec![
        ("IBCOLL_TRANSPORT", "rdma"),
        ("IBCOLL_IB_DEVICE", "rxe0,rxe1"),
        ("IBCOLL_PEER_TIMEOUT_MS", "3000"),
    ];
    e.extend_from_slice(env);
    let t = std::time::Instant::now();
    let mut children = start_without_launcher("connect_check", &[what], &[0, 1], &job, &e, 120);
    let mut r1 = children.pop().expect("rank 1");
    if what != "unreachable" {
        // Rank 1 ends by itself: reap it, or the survivor's pid check
        // would see a zombie, which is still a process.
        let _ = r1.wait();
    }
    let r0 = children
        .pop()
        .expect("rank 0")
        .wait_with_output()
        .expect("rank 0");
    let secs = t.elapsed().as_secs_f64();
    let _ = r1.kill();
    let _ = r1.wait();
    let out = text(&r0);
    eprintln!("{what} {env:?}: {secs:.1} s\n{out}");
    assert!(r0.status.success(), "{out}");
    assert!(
        out.contains("survivor: got expected error") && out.contains("rank 1"),
        "{out}"
    );
    (out, secs)
}

#[test]
fn a_peer_that_never_answers_the_handshake_is_a_bounded_error() {
    if !have_rdma() {
        return;
    }
    // Dead before the first contact: the pid check finds it at once.
    let (_, secs) = rdma_contact("dead-before-contact", &[]);
    assert!(secs < 30.0, "{secs:.1} s");
    // Without the pid check only the handshake's deadline can.
    let (out, secs) = rdma_contact("dead-before-contact", &[("IBCOLL_RDMA_PID_CHECK", "off")]);
    assert!(out.contains("no reply (REP)"), "{out}");
    assert!(secs < 30.0, "{secs:.1} s");
    // Every handshake datagram lost (alive peer, broken fabric): the same.
    let (out, _) = rdma_contact(
        "unreachable",
        &[
            ("IBCOLL_RDMA_UD_DROP", "1"),
            ("IBCOLL_RDMA_PID_CHECK", "off"),
        ],
    );
    assert!(out.contains("no reply (REP)"), "{out}");
}

#[test]
fn a_peer_dying_after_the_handshake_is_an_error_not_a_hang() {
    if !have_rdma() {
        return;
    }
    let (_, secs) = rdma_contact("dies-after-answering", &[]);
    assert!(secs < 40.0, "{secs:.1} s");
    let (_, secs) = rdma_contact(
        "dies-after-answering",
        &[
            ("IBCOLL_RDMA_PID_CHECK", "off"),
            ("IBCOLL_RDMA_TIMEOUT", "14"),
            ("IBCOLL_RDMA_RETRY_CNT", "3"),
        ],
    );
    assert!(secs < 60.0, "{secs:.1} s");
}
