//! Erroneous programs (the `mistakes` example) under ibrun: every rank must
//! report an error naming the mistake within the job's bound, on one node
//! (shm) and on two virtual nodes (tcp), blocking and nonblocking.

mod common;

use common::{run_job, run_job_ok, text};

/// Seconds any one of these jobs may take (it is killed after that: a
/// hang fails the test, it does not stall it).
const BOUND: u32 = 60;

/// Runs `mistakes <args>` on `n` ranks over `nodes` virtual nodes with
/// `env` (`-x VAR=value`) and checks that all `n` ranks reported the
/// expected error, each containing every string of `must`.
fn expect_all(n: usize, nodes: usize, env: &[&str], args: &[&str], must: &[&str]) -> String {
    expect_from(n, n, nodes, env, args, must)
}

/// [`expect_all`] where `reporters` ranks report (the others left).
fn expect_from(
    n: usize,
    reporters: usize,
    nodes: usize,
    env: &[&str],
    args: &[&str],
    must: &[&str],
) -> String {
    let ns = n.to_string();
    let nn = nodes.to_string();
    let mut l: Vec<&str> = vec!["-n", &ns, "--nodes", &nn];
    for e in env {
        l.push("-x");
        l.push(e);
    }
    let o = run_job(BOUND, &l, "mistakes", args);
    let t = text(&o);
    assert!(
        o.status.success(),
        "{args:?} on {n} ranks, {nodes} node(s):\n{t}"
    );
    let lines: Vec<&str> = t.lines().filter(|l| l.contains("expected error")).collect();
    // After a `then` barrier: a rank that lost a peer which failed the
    // call itself and left (the example's `lost peer P that gave up`)
    // counts when P reported the expected error.
    let gave_up: Vec<&str> = t.lines().filter(|l| l.contains("that gave up:")).collect();
    for l in &gave_up {
        let p = l
            .split("lost peer ")
            .nth(1)
            .and_then(|x| x.split(' ').next())
            .unwrap_or_else(|| panic!("{args:?}: no peer in {l}\n{t}"));
        let theirs = format!("rank {p}: expected error");
        assert!(
            lines.iter().any(|x| x.starts_with(&theirs)),
            "{args:?}: rank {p} left without reporting the mistake: {l}\n{t}"
        );
    }
    assert_eq!(
        lines.len() + gave_up.len(),
        reporters,
        "{args:?} on {n} ranks, {nodes} node(s):\n{t}"
    );
    for l in &lines {
        for m in must {
            assert!(l.contains(m), "{args:?}: {m:?} missing in {l}\n{t}");
        }
    }
    t
}

const CHECK: &[&str] = &["IBCOLL_CHECK=1"];

#[test]
fn allreduce_4_vs_100000_doubles_is_a_mismatch() {
    for nodes in [1, 2] {
        expect_all(
            3,
            nodes,
            CHECK,
            &["allreduce4"],
            &["allreduce", "rank 0 has bytes per rank 32", "800000"],
        );
    }
}

#[test]
fn allreduce_count_mismatch_on_one_node_fails_without_ibcoll_check() {
    // Rank 0 takes the shared-memory fast path, the others a schedule: the
    // schedule's announcement in the slots makes both sides fail.
    for n in 2..=5 {
        expect_all(
            n,
            1,
            &[],
            &["allreduce4"],
            &["allreduce", "shared-memory decision", "32 bytes", "800000"],
        );
    }
}

#[test]
fn bcast_with_different_roots_is_a_mismatch() {
    for nodes in [1, 2] {
        expect_all(
            3,
            nodes,
            CHECK,
            &["bcastroot"],
            &["bcast", "rank 0 has root 0", "rank 1 has root 1"],
        );
    }
}

#[test]
fn a_rank_that_left_is_named_with_the_collective_called() {
    // One node only: across nodes the leaving rank's finalize waits in the
    // process manager's barrier for the others, who wait in the allreduce
    // for it (only the watchdog turns that into an error, see below).
    for nodes in [1] {
        for env in [&[][..], CHECK] {
            expect_from(
                3,
                2,
                nodes,
                env,
                &["leave"],
                &["allreduce", "rank 2", "peer lost"],
            );
        }
    }
}

/// Every collective with each mistake it can have, cycling through 2-5
/// ranks, one node or two, blocking or nonblocking (each collective gets
/// both forms and both transports over its mistakes).
const CASES: &[(&str, &str, &str)] = &[
    ("barrier", "coll", "collective"),
    ("bcast", "count", "bytes per rank"),
    ("bcast", "root", "root"),
    ("bcast", "coll", "collective"),
    ("reduce", "count", "bytes per rank"),
    ("reduce", "root", "root"),
    ("reduce", "op", "reduction operation"),
    ("reduce", "type", "element type"),
    ("allreduce", "count", "bytes per rank"),
    ("allreduce", "op", "reduction operation"),
    ("allreduce", "type", "element type"),
    ("allreduce", "coll", "collective"),
    ("gather", "count", "bytes per rank"),
    ("gather", "root", "root"),
    ("gatherv", "count", "bytes in the block"),
    ("gatherv", "root", "root"),
    ("scatter", "count", "bytes per rank"),
    ("scatter", "root", "root"),
    ("scatterv", "count", "bytes in the block"),
    ("scatterv", "root", "root"),
    ("allgather", "count", "bytes per rank"),
    ("allgatherv", "count", "bytes in the block"),
    ("alltoall", "count", "bytes per rank"),
    ("reduce_scatter", "count", "bytes in the block"),
    ("reduce_scatter", "op", "reduction operation"),
    ("reduce_scatter", "type", "element type"),
    ("reduce_scatter_block", "count", "bytes per rank"),
    ("reduce_scatter_block", "op", "reduction operation"),
    ("reduce_scatter_block", "type", "element type"),
    ("scan", "count", "bytes per rank"),
    ("scan", "op", "reduction operation"),
    ("scan", "type", "element type"),
    ("exscan", "count", "bytes per rank"),
    ("exscan", "op", "reduction operation"),
    ("exscan", "type", "element type"),
    (
        "alltoallv",
        "count",
        "sends 32 bytes to rank 0, rank 0 expects 24 bytes",
    ),
    (
        "alltoallv",
        "less",
        "sends 16 bytes to rank 0, rank 0 expects 24 bytes",
    ),
];

fn cases(part: usize, parts: usize) {
    for (i, (coll, kind, what)) in CASES.iter().enumerate() {
        if i % parts != part {
            continue;
        }
        // The "coll" mistake: the last rank calls a (blocking) barrier.
        let coll_name = if *kind == "coll" && *coll == "barrier" {
            "bcast"
        } else {
            coll
        };
        for j in 0..2 {
            let n = 2 + (i + j) % 4;
            let nb = (i + j) % 2 == 1;
            let nodes = 1 + (i / 2 + j) % 2;
            let mut args = vec![coll_name, kind];
            if nb {
                args.push("nb");
            }
            expect_all(n, nodes, CHECK, &args, &["ranks disagree", what]);
        }
    }
}

#[test]
fn every_collective_mismatch_fails_every_rank_part_1() {
    cases(0, 3);
}

#[test]
fn every_collective_mismatch_fails_every_rank_part_2() {
    cases(1, 3);
}

#[test]
fn every_collective_mismatch_fails_every_rank_part_3() {
    cases(2, 3);
}

/// The mistakes of [`CASES`] but the counts (tested apart below) without
/// `IBCOLL_CHECK`: each message and shared-memory publication of a call
/// carries the call's stamp (collective, root, operation, type), ranks
/// that block send probes, and a fast-path wait notices a member that went
/// on or a cycle of waits; every rank fails the call or the barrier that
/// `then` makes it call next. Not covered without the check (and so not
/// here): a blocking call against another rank's nonblocking one ("coll"
/// with `nb`), and a fast-path bcast or scatter in which the disagreeing
/// ranks are all roots that nobody reads (two ranks on one node that each
/// say they are the root).
fn cheap_cases(part: usize, parts: usize) {
    let cases: Vec<_> = CASES
        .iter()
        .filter(|c| c.1 != "count" && c.1 != "less")
        .collect();
    for (i, (coll, kind, what)) in cases.iter().enumerate() {
        if i % parts != part {
            continue;
        }
        let coll_name = if *kind == "coll" && *coll == "barrier" {
            "bcast"
        } else {
            coll
        };
        for j in 0..2 {
            let nb = *kind != "coll" && (i + j) % 2 == 1;
            let nodes = 1 + (i / 2 + j) % 2;
            let mut n = 2 + (i + 2 * j) % 4;
            let lone_roots = matches!(*coll, "bcast" | "scatter" | "scatterv") && *kind == "root";
            if lone_roots && nodes == 1 && !nb && n == 2 {
                n = 3;
            }
            let mut args = vec![coll_name, kind];
            if nb {
                args.push("nb");
            }
            args.push("then");
            let t = expect_all(n, nodes, &[], &args, &["ranks disagree"]);
            let named = t
                .lines()
                .filter(|l| l.contains("expected error"))
                .any(|l| l.contains(what) || l.contains("in a cycle") || l.contains("went on to"));
            assert!(
                named,
                "{args:?} on {n} ranks, {nodes} node(s): no rank names {what:?}\n{t}"
            );
        }
    }
}

#[test]
fn every_collective_mistake_fails_every_rank_without_ibcoll_check_part_1() {
    cheap_cases(0, 3);
}

#[test]
fn every_collective_mistake_fails_every_rank_without_ibcoll_check_part_2() {
    cheap_cases(1, 3);
}

#[test]
fn every_collective_mistake_fails_every_rank_without_ibcoll_check_part_3() {
    cheap_cases(2, 3);
}

#[test]
fn the_issues_bcast_root_mistake_is_found_without_ibcoll_check_across_nodes() {
    // Rank 0 says root 0, the others root 1, across two nodes (messages):
    // every rank fails the bcast or the barrier after it. On one node the
    // fast path's lone root publishes and nobody reads it: that needs
    // IBCOLL_CHECK (`bcast_with_different_roots_is_a_mismatch`).
    for n in [3, 4] {
        let t = expect_all(n, 2, &[], &["bcastroot", "then"], &["ranks disagree"]);
        assert!(t.contains("has root 0") && t.contains("has root 1"), "{t}");
    }
}

#[test]
fn a_rank_that_left_is_named_by_the_watchdog_across_nodes() {
    let t = expect_from(
        3,
        2,
        2,
        &["IBCOLL_HANG_TIMEOUT=2"],
        &["leave"],
        &["allreduce"],
    );
    // The rank whose wait involves rank 2 names it: through the watchdog
    // (rank 2 is finalizing), or at once when its first dial to rank 2
    // finds the listener closed; the other may see that one finalize first
    // (PeerLost).
    assert!(
        t.contains("rank 2 is finalizing")
            || (t.contains("with rank 2 failed: peer lost") && t.contains("has finalized or died")),
        "{t}"
    );
}

#[test]
fn the_watchdog_names_a_rank_sleeping_in_user_code() {
    // The last rank sleeps 8 s; the others' barrier fires its watchdog
    // after 2 s (shared-memory fast path on one node, a schedule over tcp).
    for (n, nodes) in [(2, 1), (3, 1), (2, 2), (3, 2)] {
        let last = format!("rank {} is not waiting in ibcoll (in user code", n - 1);
        expect_from(
            n,
            n - 1,
            nodes,
            &["IBCOLL_HANG_TIMEOUT=2"],
            &["sleep", "8"],
            &[
                "barrier: no progress for 2 s",
                "is waiting in barrier",
                &last,
            ],
        );
    }
}

#[test]
fn correct_programs_pass_under_ibcoll_check() {
    // No false alarm: every collective, form and root of coll_check.
    for (n, nodes) in [("3", "1"), ("4", "2")] {
        let out = run_job_ok(
            240,
            &["-n", n, "--nodes", nodes, "-x", "IBCOLL_CHECK=1"],
            "coll_check",
            &["quick"],
        );
        assert!(out.contains("coll_check: all ok"), "{out}");
    }
}

#[test]
fn the_watchdog_aborts_the_job_when_told_to() {
    let o = run_job(
        BOUND,
        &[
            "-n",
            "2",
            "-x",
            "IBCOLL_HANG_TIMEOUT=1",
            "-x",
            "IBCOLL_HANG_ACTION=abort",
        ],
        "mistakes",
        &["sleep", "6"],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("called abort with exit code 70"), "{t}");
    // ibrun's report, once, instead of the aborting rank's own.
    assert_eq!(
        t.matches("watchdog report (IBCOLL_HANG_TIMEOUT)").count(),
        1,
        "{t}"
    );
    assert!(t.contains("ibrun:   rank 1: not waiting in ibcoll"), "{t}");
}

#[test]
fn ibrun_prints_one_grouped_watchdog_report() {
    // Ranks 0-2 wait in a shared-memory barrier for rank 3, asleep.
    let t = expect_from(
        4,
        3,
        1,
        &["IBCOLL_HANG_TIMEOUT=2"],
        &["sleep", "8"],
        &["barrier: no progress for 2 s"],
    );
    assert_eq!(
        t.matches("watchdog report (IBCOLL_HANG_TIMEOUT)").count(),
        1,
        "{t}"
    );
    assert!(
        t.contains(
            "ibrun:   ranks 0-2: waiting in barrier (shared-memory call 1) for rank 3 (waited 2."
        ),
        "{t}"
    );
    assert!(
        t.contains("ibrun:   rank 3: not waiting in ibcoll (in user code"),
        "{t}"
    );
    // A chain (rank 0 in a receive from rank 2, rank 1 in a barrier for
    // rank 0) on two nodes: one line per rank.
    let t = expect_from(
        3,
        2,
        2,
        &["IBCOLL_HANG_TIMEOUT=2"],
        &["p2p", "recv", "8"],
        &["no progress for 2 s"],
    );
    assert_eq!(
        t.matches("watchdog report (IBCOLL_HANG_TIMEOUT)").count(),
        1,
        "{t}"
    );
    for l in [
        "ibrun:   rank 0: waiting in recv (receive of up to 8 bytes from rank 2) for rank 2",
        "ibrun:   rank 1: waiting in barrier (",
        "ibrun:   rank 2: not waiting in ibcoll",
    ] {
        assert!(t.contains(l), "{l:?} missing:\n{t}");
    }
}

#[test]
fn v_collective_counts_are_checked_without_ibcoll_check() {
    // No IBCOLL_CHECK: the rank that receives the disagreeing block sees
    // the length of the message (or slot) differ from what it expects and
    // names both; the others may return Ok (or lose a rank that gave up).
    // (collective, mistake, the rank that must see it (None: the last;
    // ANY: whichever the algorithm routes the block to first: allgatherv's
    // depends on the placement), what it must say ({s}: the sender, {r}:
    // the receiver)).
    const ANY: Option<usize> = Some(usize::MAX);
    let cases: &[(&str, &str, Option<usize>, &str)] = &[
        (
            "alltoallv",
            "count",
            Some(0),
            "rank {s} sends 32 bytes to rank 0, rank 0 expects 24 bytes from rank {s}",
        ),
        (
            "alltoallv",
            "less",
            Some(0),
            "rank {s} sends 16 bytes to rank 0, rank 0 expects 24 bytes from rank {s}",
        ),
        (
            "gatherv",
            "count",
            Some(0),
            "bytes to rank 0, rank 0 expects",
        ),
        (
            "scatterv",
            "count",
            None,
            "rank 0 sends 24 bytes to rank {r}, rank {r} expects 32 bytes from rank 0",
        ),
        (
            "allgatherv",
            "count",
            ANY,
            "rank {s} sends 32 bytes to rank",
        ),
    ];
    for (i, &(coll, kind, who, what)) in cases.iter().enumerate() {
        for j in 0..2 {
            let n = 2 + (i + j) % 4;
            let nodes = 1 + (i + j / 2 + j) % 2;
            let nb = (i + j) % 2 == 1;
            let mut args = vec![coll, kind];
            if nb {
                args.push("nb");
            }
            args.push("cheap");
            let r = who.unwrap_or(n - 1);
            let want = what
                .replace("{s}", &(n - 1).to_string())
                .replace("{r}", &r.to_string());
            let ns = n.to_string();
            let nn = nodes.to_string();
            let o = run_job(BOUND, &["-n", &ns, "--nodes", &nn], "mistakes", &args);
            let t = text(&o);
            assert!(
                o.status.success(),
                "{args:?} on {n} ranks, {nodes} node(s):\n{t}"
            );
            let line = format!("rank {r}: expected error");
            let l = t
                .lines()
                .find(|l| {
                    if who == ANY {
                        l.contains(": expected error")
                    } else {
                        l.starts_with(&line)
                    }
                })
                .unwrap_or_else(|| panic!("{args:?}: no error on rank {r}:\n{t}"));
            assert!(l.contains(&want), "{args:?}: {want:?} missing in {l}\n{t}");
            assert!(l.contains(&format!(": {coll}: ranks disagree")), "{l}");
        }
    }
}

#[test]
fn node_aware_v_collectives_fail_every_rank_on_a_count_mistake() {
    // The two-phase node-aware gatherv, scatterv and alltoallv (a leader
    // learns counts first: its node's from the root, or its members' and
    // the other leaders' matrices) forced across nodes: the last rank's
    // wrong count fails the call on the rank that receives its block (its
    // leader, the root, itself, or the leader that compares the counts),
    // and every rank fails that call or the barrier after it. Placements with a node of one rank
    // (the last rank alone: its block goes straight to or from the root)
    // and uneven nodes.
    for (coll, kind) in [
        ("gatherv", "count"),
        ("scatterv", "count"),
        ("alltoallv", "count"),
        ("alltoallv", "less"),
    ] {
        let env = format!("IBCOLL_{}_ALGORITHM=node_aware", coll.to_uppercase());
        for (n, nodes) in [(3, 2), (4, 2), (5, 3), (6, 3)] {
            for nb in [false, true] {
                let mut args = vec![coll, kind];
                if nb {
                    args.push("nb");
                }
                args.push("then");
                expect_all(n, nodes, &[&env], &args, &["ranks disagree"]);
            }
        }
    }
}

#[test]
fn the_watchdog_watches_point_to_point_waits() {
    // Rank 0 waits in a receive (recv, a request's wait, sendrecv) for the
    // last rank, which sleeps in user code; the ranks between wait in a
    // barrier for rank 0, and their report follows the chain.
    for (form, op, n, nodes) in [
        ("recv", "recv", 2, 1),
        ("wait", "wait", 3, 1),
        ("sendrecv", "wait", 3, 2),
    ] {
        let last = n - 1;
        let t = expect_from(
            n,
            n - 1,
            nodes,
            &["IBCOLL_HANG_TIMEOUT=2"],
            &["p2p", form, "8"],
            &[&format!(
                "rank {last} is not waiting in ibcoll (in user code"
            )],
        );
        let want = format!(
            "rank 0: {op}: no progress for 2 s: rank 0 is waiting in {op} (receive of up to 8 bytes from rank {last}) for rank {last}"
        );
        assert!(t.contains(&want), "{form}: {want:?} missing:\n{t}");
        if n > 2 {
            assert!(
                t.contains("rank 1 is waiting in barrier") && t.contains("; rank 0 is waiting in"),
                "{form}: the barrier's report does not follow the chain:\n{t}"
            );
        }
    }
}

#[test]
fn a_fast_path_root_fails_its_next_call_after_a_disagreement() {
    // bcast and scatter roots publish and return before any reader can
    // object (their own data is right); the reader that found the
    // disagreement takes part in no later shared-memory call, so the
    // barrier after it fails on every rank, the root naming that reader.
    // (A scatter of 5 ranks does not fit a slot: every rank runs it as
    // messages and the announcement fails all of them at once.)
    for (coll, ns) in [("bcast", &[2, 3, 5][..]), ("scatter", &[2, 3][..])] {
        for &n in ns {
            let last = n - 1;
            let t = expect_all(
                n,
                1,
                &[],
                &["rootnext", coll],
                &[
                    "barrier: ranks disagree",
                    &format!("rank {last} found the ranks disagree on shared-memory collective"),
                ],
            );
            assert!(t.contains("rank 0: first call: Ok(())"), "{t}");
            assert!(
                t.contains(&format!("rank {last}: first call: Err(Mismatch")),
                "{t}"
            );
            assert!(
                t.contains("rank 0: expected error")
                    && t.contains("rank 0 cannot complete this call without it"),
                "{t}"
            );
        }
    }
}

#[test]
fn a_rank_that_left_is_named_with_every_collective_called() {
    // The last rank leaves; the others call each collective (blocking or
    // nonblocking, 3 or 4 ranks on one node): whoever needed it fails
    // naming the collective it called (a rank that did not need it may
    // complete).
    let colls = [
        "barrier",
        "bcast",
        "reduce",
        "allreduce",
        "gather",
        "gatherv",
        "scatter",
        "scatterv",
        "allgather",
        "allgatherv",
        "alltoall",
        "alltoallv",
        "reduce_scatter",
        "reduce_scatter_block",
        "scan",
        "exscan",
    ];
    for (i, coll) in colls.iter().enumerate() {
        for nb in [false, true] {
            let n = 3 + (i + usize::from(nb)) % 2;
            let ns = n.to_string();
            let mut args = vec!["leave", coll];
            if nb {
                args.push("nb");
            }
            let o = run_job(BOUND, &["-n", &ns], "mistakes", &args);
            let t = text(&o);
            assert!(o.status.success(), "{args:?} on {n} ranks:\n{t}");
            // (The example itself fails the job on an error that does not
            // name the collective.) Where rank 0 needs the last rank's
            // data, some rank must fail; a bcast, scatter or scan from
            // rank 0 may complete on every rank that stayed.
            let needed = !matches!(*coll, "bcast" | "scatter" | "scatterv" | "scan" | "exscan");
            let named = format!(": {coll} with rank");
            assert!(
                !needed
                    || t.lines()
                        .any(|l| l.contains("expected error") && l.contains(&named)),
                "{args:?}: no error naming {coll}:\n{t}"
            );
        }
    }
}

#[test]
fn every_count_mismatch_fails_every_rank_without_ibcoll_check() {
    // No IBCOLL_CHECK: only the rank that receives a wrong-sized message
    // (or slot) sees the disagreement; its notice fails the call on every
    // rank still in it, and a rank that completed the call (a bcast root,
    // a gather sender) fails its next call on the communicator, the
    // barrier that `then` makes it call. Every collective, 2-5 ranks, one
    // node (shared-memory fast path or messages) and two (tcp), blocking
    // and nonblocking.
    let colls: &[(&str, &str)] = &[
        ("bcast", "count"),
        ("allreduce", "count"),
        ("reduce", "count"),
        ("gather", "count"),
        ("scatter", "count"),
        ("allgather", "count"),
        ("alltoall", "count"),
        ("gatherv", "count"),
        ("scatterv", "count"),
        ("allgatherv", "count"),
        ("alltoallv", "count"),
        ("alltoallv", "less"),
        ("reduce_scatter", "count"),
        ("reduce_scatter_block", "count"),
        ("scan", "count"),
        ("exscan", "count"),
    ];
    for (i, &(coll, kind)) in colls.iter().enumerate() {
        for j in 0..4 {
            let n = 2 + (i + j) % 4;
            let nodes = 1 + j % 2;
            let nb = j / 2 == 1;
            let mut args = vec![coll, kind];
            if nb {
                args.push("nb");
            }
            args.push("then");
            let t = expect_all(n, nodes, &[], &args, &["ranks disagree"]);
            for l in t.lines().filter(|l| l.contains("expected error")) {
                // The call itself, or the barrier after it.
                assert!(
                    l.contains(&format!(": {coll}: ranks disagree"))
                        || l.contains(": barrier: ranks disagree"),
                    "{args:?} on {n} ranks, {nodes} node(s): {l}\n{t}"
                );
                // Both sides of the transfer, the two decisions, or (the
                // fast path's next call) the rank that found them.
                assert!(
                    (l.contains(" sends ") && l.contains(" expects "))
                        || l.contains("shared-memory decision")
                        || l.contains("found the ranks disagree on shared-memory collective")
                        || l.contains("found the ranks disagree on a collective of this node's ranks that ran as messages"),
                    "{args:?} on {n} ranks, {nodes} node(s): {l}\n{t}"
                );
            }
        }
    }
}
