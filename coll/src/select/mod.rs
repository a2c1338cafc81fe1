//! Algorithm selection: one table keyed by collective, communicator size,
//! ranks per node and **bytes per rank**, mapping to an algorithm and its
//! parameters (pipeline segment, in-flight window).
//!
//! The network is part of the key: [`Net`], the transport that joins the
//! communicator's nodes (one summary per communicator, the same on every
//! rank: `tcp` if any rank would reach another node over tcp, `rdma` if
//! every one does so over verbs, `shm` for a communicator within one
//! node). A rule may name the network it was measured on.
//!
//! Order of precedence for each call:
//! 1. [`force_algorithm`] (a per-thread override for tests and benchmarks);
//! 2. `IBCOLL_<COLL>_ALGORITHM=name` (an unknown name is an error listing
//!    the valid ones);
//! 3. the JSON table in `IBCOLL_TUNING_FILE`, if set (its rules are tried
//!    before the defaults);
//! 4. the compiled-in default table ([`Table::default_table`]).
//!
//! Bytes per rank: the vector for bcast/reduce/allreduce/scan/exscan, one
//! rank's block for gather/scatter/allgather/alltoall/reduce_scatter_block,
//! the average block for allgatherv/reduce_scatter; gatherv, scatterv and
//! alltoallv select with 0 bytes (the counts may differ between ranks, and
//! every rank must pick the same algorithm).
//!
//! # Tuning file format
//! ```json
//! { "rules": [
//!   { "collective": "allreduce", "algorithm": "ring",
//!     "max_comm_size": 64, "max_ranks_per_node": 8, "max_bytes": 1048576,
//!     "min_nodes": 1, "network": "tcp", "segment_bytes": 65536, "window": 8 }
//! ] }
//! ```
//! A rule matches when the communicator size, ranks per node and bytes per
//! rank are each at most its `max_*` (a missing or `null` bound is
//! unbounded) and the communicator spans at least `min_nodes` nodes (default
//! 1; estimated as `ceil(size / ranks per node)`) and, if the rule names a
//! `network` (`shm`, `tcp` or `rdma`), its nodes are joined by that one;
//! the first matching rule wins. `segment_bytes` (pipelined algorithms) and `window` (linear
//! alltoall) default to 65536 and 8. Numbers are non-negative integers;
//! unknown fields (at either level), collectives and algorithms are errors.

mod json;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithms::{algorithms, find, Collective, SHM};
use crate::error::{Error, Result};

/// The transport joining a communicator's nodes, as selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Net {
    /// One node: no inter-node phase.
    #[default]
    Shm,
    /// tcp between some of the nodes.
    Tcp,
    /// rdma (verbs) between every pair of nodes.
    Rdma,
}

impl Net {
    pub fn name(self) -> &'static str {
        match self {
            Net::Shm => "shm",
            Net::Tcp => "tcp",
            Net::Rdma => "rdma",
        }
    }

    pub fn from_name(s: &str) -> Option<Net> {
        [Net::Shm, Net::Tcp, Net::Rdma]
            .into_iter()
            .find(|n| n.name() == s)
    }

    /// One byte for the communicator's agreement (a maximum over ranks:
    /// one tcp pair makes the whole communicator tcp).
    pub(crate) fn code(self) -> u8 {
        match self {
            Net::Shm => 0,
            Net::Rdma => 1,
            Net::Tcp => 2,
        }
    }

    pub(crate) fn from_code(c: u8) -> Net {
        match c {
            0 => Net::Shm,
            1 => Net::Rdma,
            _ => Net::Tcp,
        }
    }
}

/// What selection picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub algorithm: &'static str,
    pub segment_bytes: usize,
    pub window: usize,
}

/// One rule of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub collective: Collective,
    pub max_comm_size: usize,
    pub max_ranks_per_node: usize,
    pub max_bytes: usize,
    /// At least this many nodes (estimated as `ceil(size / ranks per
    /// node)`, exact for block placement); 1 = any.
    pub min_nodes: usize,
    /// Only where this network joins the nodes (`None`: any).
    pub network: Option<Net>,
    pub algorithm: &'static str,
    pub segment_bytes: usize,
    pub window: usize,
}

/// A selection table: rules tried in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub rules: Vec<Rule>,
}

const SEG: usize = 65536;
const WINDOW: usize = 8;
const ANY: usize = usize::MAX;

fn rule(c: Collective, size: usize, ppn: usize, bytes: usize, alg: &'static str) -> Rule {
    Rule {
        collective: c,
        max_comm_size: size,
        max_ranks_per_node: ppn,
        max_bytes: bytes,
        min_nodes: 1,
        network: None,
        algorithm: alg,
        segment_bytes: SEG,
        window: WINDOW,
    }
}

/// `r` with pipeline segments of `bytes`.
fn seg(mut r: Rule, bytes: usize) -> Rule {
    r.segment_bytes = bytes;
    r
}

/// `alg` for `c` from 64 KiB to `upto` bytes per rank in 32 KiB pieces on
/// 2 ranks of one node (eager on shm, pipelined through the ring), with
/// whole blocks otherwise. Measured on 2 ranks (docs/COLLECTIVES.md):
/// pieces win at 64-128 KiB (alltoall 64 KiB 5.3 vs 5.9 us), whole blocks
/// from 256 KiB for the collectives that only move data (alltoall 19 vs
/// 21 us) and from 512 KiB for reductions, whose pieces overlap one
/// reduction with the next copy (1 MiB: allreduce 74 vs 82 us, allgather
/// 79 vs 89): a whole block goes through the pipe rendezvous with both
/// cores copying.
fn pieces_on_two(c: Collective, alg: &'static str, upto: usize) -> [Rule; 4] {
    let k = 1024;
    [
        seg(rule(c, ANY, ANY, 64 * k - 1, alg), ANY),
        seg(multi_node(rule(c, ANY, ANY, ANY, alg)), ANY),
        seg(rule(c, 2, ANY, upto, alg), 32 * k),
        seg(rule(c, ANY, ANY, ANY, alg), ANY),
    ]
}

/// Largest bytes per rank that 2-rank reductions cut into pieces.
const PIECES_UPTO: usize = 256 * 1024;

/// Largest bytes per rank that 2-rank data movements cut into pieces.
const MOVE_PIECES_UPTO: usize = 128 * 1024;

/// `r` only for communicators spanning two nodes or more.
fn multi_node(r: Rule) -> Rule {
    from_nodes(r, 2)
}

/// `r` only on communicators that span at least `k` nodes.
fn from_nodes(mut r: Rule, k: usize) -> Rule {
    r.min_nodes = k;
    r
}

/// Nodes from which the multi-leader schedules are chosen:
/// the fewest where two ports per node save an inter-node round (8 nodes:
/// 2 rounds of 3-ary trees instead of 3 binary ones).
const MULTI_LEADER_NODES: usize = 8;

/// `r` only across nodes joined by tcp (measured on the simulated hosts).
fn over_tcp(mut r: Rule) -> Rule {
    r.min_nodes = 2;
    r.network = Some(Net::Tcp);
    r
}

/// `r` only across nodes joined by rdma (measured in the Soft-RoCE VM).
fn over_rdma(mut r: Rule) -> Rule {
    r.min_nodes = 2;
    r.network = Some(Net::Rdma);
    r
}

impl Table {
    /// The compiled-in table.
    ///
    /// How it was made: the crossovers start from the classic cost analysis
    /// (latency-bound algorithms with log2(n) whole-vector steps for small
    /// data, bandwidth-optimal reduce-scatter/allgather schemes for large;
    /// the simulator's α-β-γ model agrees), then points were measured with
    /// `ibcoll-bench <collective> --algorithm NAME -m 8:1M` on the 2-core
    /// development VM (2 and 4 ranks on one node, 4 ranks on 2 virtual
    /// nodes over tcp) and the rules moved where a winner was clear beyond
    /// the noise; numbers in `docs/COLLECTIVES.md`. Retune on a real
    /// cluster with a tuning file.
    pub fn default_table() -> Table {
        use Collective::*;
        let k = 1024;
        let multi = multi_node(rule(Allreduce, ANY, ANY, ANY, "node_aware"));
        // The shared-memory fast paths (`shm`) apply only to blocking
        // calls on a communicator that is one whole node, with the data in
        // the slots (`crate::fastpath`); other calls skip those rules.
        // Measured here side by side with the schedules (fast paths off by
        // IBCOLL_SHM_COLL_BYTES=0), medians of 3 runs, 2 ranks pinned and
        // 4 and 8 oversubscribed (docs/COLLECTIVES.md):
        // - all-to-all patterns (barrier, allreduce, allgather, alltoall,
        //   reduce_scatter, scan) win at every size that fits: 2 ranks
        //   0.3-0.8x, 8 ranks allreduce 8 B 13 vs 70 us;
        // - rooted ones (bcast, reduce, gather, scatter) win on 2 ranks
        //   (0.1-0.8x up to 64 KiB), and since the writers prefetch their
        //   lines (no stall per call) also on 4 and 8 ranks, oversubscribed:
        //   bcast 8 B 0.18 vs 0.56 us (4 ranks), 0.57 vs 1.06 (8); reduce
        //   4 KiB 1.05 vs 3.5 (4); gather 4 KiB 2.5 vs 9.1 (8). Scatter on
        //   more than 4 ranks below 1 KiB keeps the eager schedule, whose
        //   root runs ahead (8 ranks 8 B 1.1-1.8 vs 0.5-1.1 us);
        // - allreduce on 2 ranks only to 4 KiB (16-64 KiB: 2.4-5.9 us vs
        //   2.8-6.8), on 8 ranks to 8 KiB (64 KiB: 308 vs 384 us).
        // No cap on the number of ranks: the slots grow with the node
        // (516 KiB per rank) and a call whose data does not fit falls
        // back; 64 and 128 ranks on one node are checked by
        // coll/tests/scale.rs (`shm_at_64_and_128_ranks`).
        let shm = |c, size, bytes| rule(c, size, ANY, bytes, SHM);
        let mut rules: Vec<Rule> = vec![
            shm(Barrier, ANY, ANY),
            shm(Bcast, ANY, 64 * k),
            shm(Reduce, ANY, 64 * k),
            shm(Gather, ANY, 64 * k),
            shm(Scatter, 4, 64 * k),
            // Across nodes over tcp, small blocks: the two-level scatter
            // (simulated hosts, 8 B, us: 2 x 2 15.1 (14.4-24.8) vs 68.4
            // (37-119) linear, Open MPI 8.6; 4 x 2 183 vs 179, equal).
            over_tcp(rule(Scatter, ANY, ANY, 512, "node_aware")),
            rule(Scatter, 15, ANY, 512, "linear"),
            rule(Scatter, ANY, ANY, 512, "binomial"),
            shm(Scatter, ANY, 64 * k),
            // The v-forms select with 0 bytes (one rule for every size);
            // their fast paths send the blocks that do not fit the slots
            // as messages. Measured at 2, 4 and 8 ranks against the linear
            // schedules: gatherv wins everywhere (8 ranks 64 KiB 13-16 vs
            // 56-60 us), alltoallv at 8 B (8 ranks 7.5-9.6 vs 13-18 us)
            // and loses ~10% at 64 KiB; scatterv only on 2 ranks (more:
            // an eager root runs ahead, 4 ranks 8 B 0.9 vs 0.5 us).
            shm(Gatherv, ANY, ANY),
            shm(Scatterv, 2, ANY),
            shm(Alltoallv, ANY, ANY),
            shm(Allreduce, ANY, 4 * k),
            rule(Allreduce, 2, ANY, 32 * k, "recursive_doubling"),
            shm(Allreduce, ANY, 8 * k),
            shm(Allreduce, 4, 64 * k),
            shm(Allgather, ANY, 64 * k),
            shm(Allgatherv, ANY, 64 * k),
            shm(Alltoall, 2, 16 * k),
            shm(Alltoall, ANY, 8 * k),
            shm(ReduceScatter, ANY, 64 * k),
            shm(ReduceScatterBlock, ANY, 64 * k),
            shm(Scan, ANY, 64 * k),
            shm(Exscan, ANY, 64 * k),
        ];
        rules.extend([
            // Several nodes: fan-in/out in the node around a dissemination
            // among nodes (2 hosts x 2: 123 vs 177 us, 4 x 2: 397 vs
            // 1360 us on the simulated hosts; docs/COLLECTIVES.md). The
            // multi-leader form is that same schedule where one port per
            // node needs no more rounds (every shape measured here); at
            // scale its (q+1)-ary rounds take 0.42x dissemination's model
            // time at 64 x 64 and 0.49x at 1,024 x 16, node_aware 0.65x
            // and 0.80x (sim::tests).
            // Over tcp up to 16 ranks, measured: node-aware. At 8 hosts x 2
            // (two ports a node) the multi-leader form lost, 5 interleaved
            // rounds: 321 (306-377) vs 520 (497-583) us, Open MPI 436;
            // 329 vs 485 in an earlier 3-round run (docs/PERFORMANCE.md).
            over_tcp(rule(Barrier, 16, ANY, ANY, "node_aware")),
            multi_node(rule(Barrier, ANY, ANY, ANY, "multi_leader")),
            rule(Barrier, ANY, ANY, ANY, "dissemination"),
            // Many nodes, small data: the multi-leader tree (q ports per
            // node, (q+1)-ary among nodes). Chosen from the simulator's
            // two-level model, not measured: the simulated hosts are 4.
            // Model time, us (`sim::tests::multi_leader_crossover_in_the_model`):
            // 8 B 2.6 vs 6.9 binomial at 8 x 8, 5.2 vs 13.9 at 64 x 64,
            // 7.2 vs 21.4 at 1,024 x 16; 16 KiB 31.8 vs 56.1 node-aware
            // at 8 x 8. Below 8 nodes one port per node needs as many
            // rounds, and the schedule is the binomial tree.
            from_nodes(
                rule(Bcast, ANY, ANY, 16 * k, "multi_leader"),
                MULTI_LEADER_NODES,
            ),
            // Binomial up to 512 KiB on 4 ranks; scatter+allgather
            // wins for larger groups (fewer bytes through the root).
            rule(Bcast, ANY, ANY, 64 * k, "binomial"),
            rule(Bcast, 8, ANY, ANY, "binomial"),
            rule(Bcast, ANY, ANY, ANY, "scatter_allgather"),
            // Binomial 1.4-4.9 us vs 27-33 us up to 8 KiB; from 32 KiB
            // reduce-scatter + gather (33 vs 105 us; 353 vs 1601 us at
            // 512 KiB).
            rule(Reduce, ANY, ANY, 16 * k, "binomial"),
            seg(
                rule(Reduce, ANY, ANY, 64 * k - 1, "reduce_scatter_gather"),
                ANY,
            ),
            // Nodes of several ranks joined by tcp, 64-256 KiB: node-aware
            // (simulated hosts, 3 interleaved rounds, us: 2 x 2 64 KiB
            // 114 vs 154 by this table before, 256 KiB 193 vs 337; 4 x 2
            // 172 vs 432, 617 vs 1022; binomial close, reduce-scatter-
            // gather 2-3x). One rank per node keeps reduce-scatter-gather
            // (2 x 1 64 KiB 39 us, Open MPI 84).
            seg(
                over_tcp(rule(Reduce, ANY, 1, ANY, "reduce_scatter_gather")),
                ANY,
            ),
            over_tcp(rule(Reduce, ANY, ANY, 256 * k, "node_aware")),
            // From 64 KiB on 2 ranks of one node: the ring phase in
            // 32 KiB pieces (eager on shm) instead of one split
            // rendezvous per block each way: 1 MiB 81 -> 57 us.
            seg(
                multi_node(rule(Reduce, ANY, ANY, ANY, "reduce_scatter_gather")),
                ANY,
            ),
            seg(
                rule(Reduce, 2, ANY, PIECES_UPTO, "reduce_scatter_gather"),
                32 * k,
            ),
            seg(rule(Reduce, ANY, ANY, ANY, "reduce_scatter_gather"), ANY),
            // One rank per node: by size. Several nodes with several
            // ranks each: node-aware (1.1 ms like recursive doubling
            // for small vectors over 2 virtual nodes, 7.3 ms vs 8.9
            // (Rabenseifner) and 18 (recursive doubling) at 1 MiB).
            rule(Allreduce, ANY, 1, 32 * k, "recursive_doubling"),
            // Many nodes of several ranks, one or a few elements: the
            // multi-leader allreduce (a (q+1)-ary allgather of the node
            // sums through q ports per node). From the model, not
            // measured (us): 8 B 3.2 vs 6.9 recursive doubling at 8 x 8,
            // 6.4 vs 13.8 at 64 x 64, 10.5 vs 21.3 at 1,024 x 16; at
            // 256 B it loses on 1,024 nodes (94 vs 23: every node gathers
            // and combines every node's sum). Over tcp up to 16 ranks the
            // node-aware one, measured at 8 hosts x 2 (8 B, 5 rounds: 324
            // vs 498 us, Open MPI 509; 337 vs 482 in a 3-round run).
            over_tcp(rule(Allreduce, 16, ANY, 16, "node_aware")),
            from_nodes(
                rule(Allreduce, ANY, ANY, 16, "multi_leader"),
                MULTI_LEADER_NODES,
            ),
            // Over rdma, small vectors: recursive doubling (Soft-RoCE VM,
            // 2 nodes x 2, 5 interleaved rounds: 8 B 733 (522-1086) vs
            // node-aware 834 (688-1077) us, faster in 4 rounds of 5 and
            // 2 of 3 in an earlier run; 1 KiB faster in 4 of 5). The
            // model agrees at scale (8 B: node-aware 1.13x recursive
            // doubling at 64 x 64, 1.06x at 1,024 x 16).
            over_rdma(rule(Allreduce, ANY, ANY, k, "recursive_doubling")),
            // Two nodes (<= 4 ranks) joined by tcp from 32 KiB: the ring,
            // whose one inter-node hop per step streams best over tcp (simulated
            // hosts, 1 MiB: 2 x 1 426-447 vs 637-712 us Rabenseifner,
            // 2 x 2 4.3 vs 7.4-9.0 ms node-aware).
            multi_node(rule(Allreduce, ANY, ANY, 32 * k, "node_aware")),
            over_tcp(rule(Allreduce, 4, 1, ANY, "ring")),
            // With two ranks per node node-aware stays ahead to 512 KiB
            // (simulated hosts, 2 x 2, 3 interleaved rounds: 64 KiB 93
            // (79-114) vs ring 192 (175-204) us, 256 KiB 269 (263-392)
            // vs 429 (409-441); 5 rounds: 512 KiB 358 (338-500) vs 659
            // (525-875); 1 MiB a tie, 1142 (900-2458) vs 1151
            // (847-2725)).
            multi_node(rule(Allreduce, 4, ANY, 512 * k, "node_aware")),
            over_tcp(rule(Allreduce, 4, ANY, ANY, "ring")),
            seg(rule(Allreduce, 8, 1, 512 * k, "ring"), ANY),
            rule(Allreduce, ANY, 1, ANY, "rabenseifner"),
            multi,
            // One node: recursive doubling up to 32 KiB (0.5-2.5 us on
            // 2 ranks, 6-17 us on 4), ring at 64-512 KiB on few ranks
            // (3.9 vs 11.5 us at 64 KiB on 2; 48 vs 85-126 us at
            // 128 KiB on 4), Rabenseifner beyond.
            rule(Allreduce, ANY, ANY, 32 * k, "recursive_doubling"),
            seg(rule(Allreduce, 8, ANY, 64 * k - 1, "ring"), ANY),
            // 2 ranks from 64 KiB: ring in 32 KiB pieces (see alltoall)
            // at every size, Rabenseifner's halving exchanges are the
            // same two transfers without the pieces.
            seg(rule(Allreduce, 2, ANY, PIECES_UPTO, "ring"), 32 * k),
            seg(rule(Allreduce, 2, ANY, ANY, "ring"), ANY),
            seg(rule(Allreduce, 8, ANY, 512 * k, "ring"), ANY),
            rule(Allreduce, ANY, ANY, ANY, "rabenseifner"),
            // Linear gather/scatter beat binomial on few ranks (the
            // root posts everything at once); binomial for many ranks
            // and small blocks.
            rule(Gather, 15, ANY, ANY, "linear"),
            rule(Gather, ANY, ANY, 2 * k, "binomial"),
            rule(Gather, ANY, ANY, ANY, "linear"),
            // The node-aware gatherv/scatterv (and alltoallv below) have
            // no rule: a v-form selects with 0 bytes, so a rule holds for
            // every size, and forced on the simulated hosts (tcp, 2 x 2 and
            // 4 x 2) they lose from 64 KiB (1.3-3x), gatherv also at 8 B
            // (16-108 vs 3-15 us: leaders wait a round trip for their
            // counts), scatterv ties at 8 B (docs/PERFORMANCE.md).
            rule(Gatherv, ANY, ANY, ANY, "linear"),
            rule(Scatter, 15, ANY, ANY, "linear"),
            rule(Scatter, ANY, ANY, 2 * k, "binomial"),
            rule(Scatter, ANY, ANY, ANY, "linear"),
            rule(Scatterv, ANY, ANY, ANY, "linear"),
            // Across nodes of several ranks over tcp, tiny blocks: the
            // node-aware forms (simulated hosts, 3 interleaved rounds, us:
            // allgather 8 B 2 x 2 26 vs 29, 4 x 2 106 vs 170; allgatherv
            // 8 B 35 vs 53 and 116 vs 157, 1 KiB 58 vs 68 and 182 vs
            // 225; allgather at 1 KiB mixed: 80 vs 65, 159 vs 173).
            // One rank per node keeps the flat ones (2 x 1: 0.4x Open
            // MPI; 8 x 1, 8 B: 173 vs 215 multi-leader, 213 node-aware).
            // The node-aware ones hold up to 16 ranks (8 x 2, 8 B, 5
            // rounds: 335 vs multi-leader 399, Open MPI 446).
            over_tcp(rule(Allgather, ANY, 1, 8 * k, "recursive_doubling")),
            over_tcp(rule(Allgather, 16, ANY, 512, "node_aware")),
            over_tcp(rule(Allgatherv, ANY, 1, 8 * k, "bruck")),
            over_tcp(rule(Allgatherv, 16, ANY, k, "node_aware")),
            // From 8 nodes otherwise, any size: every rank a port of the
            // multi-leader exchange. From the model (us,
            // `sim::tests::multi_leader_crossover_in_the_model`): 8 B
            // 4.9 vs 6.3 recursive doubling at 8 x 2, 3.9 vs 7.1 at 8 x 8,
            // 9.1 vs 26.8 at 64 x 64, 26.4 vs 73.6 at 1,024 x 16; 64 KiB
            // 274 vs 380 at 8 x 2, 28.5 vs 106 ms at 64 x 64; measured at
            // 8 x 2, 64 KiB: 3988 vs node-aware 4419 us (Open MPI 7113).
            // With one rank per node it is a Bruck among the nodes (the
            // model ties recursive doubling). Below 8 nodes, forced on the
            // simulated hosts (2 x 2, 4 x 2) it lost: 8 B 38 vs 28 and
            // 158 vs 126 us, 1 MiB 4.4 vs 3.8 and 19.4 vs 18.6 ms.
            from_nodes(
                rule(Allgather, ANY, ANY, ANY, "multi_leader"),
                MULTI_LEADER_NODES,
            ),
            from_nodes(
                rule(Allgatherv, ANY, ANY, ANY, "multi_leader"),
                MULTI_LEADER_NODES,
            ),
            over_tcp(rule(Allgather, ANY, ANY, 512, "node_aware")),
            over_tcp(rule(Allgatherv, ANY, ANY, k, "node_aware")),
            // Recursive doubling for small blocks, ring from 32 KiB
            // (28 vs 63 us; Bruck's extra copies cost 93 us).
            rule(Allgather, ANY, ANY, 8 * k, "recursive_doubling"),
        ]);
        rules.extend(pieces_on_two(Allgather, "ring", MOVE_PIECES_UPTO));
        rules.push(rule(Allgatherv, ANY, ANY, 8 * k, "bruck"));
        rules.extend(pieces_on_two(Allgatherv, "ring", MOVE_PIECES_UPTO));
        rules.extend([
            // Over rdma, small blocks: aggregated through the node
            // leaders (Soft-RoCE VM, 2 nodes x 2, 5 interleaved rounds:
            // 8 B 858 (601-899) vs Bruck 921 (747-1520) us, faster in
            // every round and in 2 of 3 of an earlier run; 1 KiB 1160 vs
            // 1369, faster in 4 of 5).
            over_rdma(rule(Alltoall, ANY, ANY, k, "node_aware")),
            // Bruck for tiny blocks (9-16 us vs 10-30), linear with a
            // window from there (13-617 us vs 19-2115 pairwise).
            rule(Alltoall, ANY, ANY, k, "bruck"),
        ]);
        // From 64 KiB on 2 ranks of one node: blocks in 32 KiB pieces,
        // which shm sends eagerly, pipelined through the ring with both
        // cores copying, up to 128 KiB (see `pieces_on_two`).
        rules.extend(pieces_on_two(Alltoall, "linear", MOVE_PIECES_UPTO));
        rules.extend([
            // Alltoallv selects with 0 bytes: whole blocks as before.
            // Node-aware wins at 8 B across tcp hosts in 3 of 4 runs (4 x 2
            // 269 vs 333 us) but loses 1.3-2.3x at 64 KiB and 1 MiB, and
            // one rule would cover every size: not selected.
            seg(rule(Alltoallv, ANY, ANY, ANY, "linear"), ANY),
            // Recursive halving up to 8 KiB, ring from 32 KiB (120 vs
            // 112 us, then 302 vs 1353 us at 128 KiB).
            rule(ReduceScatter, ANY, ANY, 8 * k, "recursive_halving"),
        ]);
        rules.extend(pieces_on_two(ReduceScatter, "ring", PIECES_UPTO));
        // Across nodes over tcp, small blocks: the two-level form, one
        // round across nodes (simulated hosts, 8 B, us: 4 x 2 475
        // (400-508) vs 553 (550-556) recursive halving, Open MPI 548;
        // 2 x 2 200 vs 211, within the noise). At 64 KiB it loses on
        // 2 x 2 (3647 vs 918: the whole vector through each node's reduce).
        rules.push(over_tcp(rule(
            ReduceScatterBlock,
            ANY,
            ANY,
            k,
            "node_aware",
        )));
        rules.push(rule(
            ReduceScatterBlock,
            ANY,
            ANY,
            8 * k,
            "recursive_halving",
        ));
        rules.extend(pieces_on_two(ReduceScatterBlock, "ring", PIECES_UPTO));
        rules.extend([
            // Chain from 64 KiB on few ranks (n-1 pipelined hops of
            // the vector vs log2(n) whole-vector exchanges each with
            // one or two reductions): 2 ranks 64 KiB 7.4 vs 14 us,
            // 1 MiB ~100 vs ~170 us. 256 KiB segments: on 2 ranks
            // pieces gain nothing (best whole), more ranks need them
            // for the pipeline; smaller ones (eager on shm) stall a
            // rank that only sends once the ring is full.
            // Several nodes, <= 8 ranks, small vectors: the chain, whose
            // first ranks send eagerly and go on, so calls in a row
            // overlap (simulated hosts, 8 B, us: scan 2 x 2 1.6 vs 120
            // recursive doubling vs 3.5 Open MPI, 4 x 2 3.9 vs 925 vs 6.7;
            // exscan alike). A single call still takes n - 1 hops. Up to
            // 16 ranks, also from 64 KiB (8 hosts x 2, 5 rounds, us: scan
            // 8 B 23 vs 447 recursive doubling or multi-leader vs 21
            // Open MPI, 64 KiB 330 vs 1531 vs 593; exscan 25 vs 442 vs
            // 25, 326 vs 1283 vs 458).
            over_tcp(rule(Scan, 16, ANY, 64 * k - 1, "chain")),
            over_tcp(rule(Exscan, 16, ANY, 64 * k - 1, "chain")),
            over_tcp(seg(rule(Scan, 16, ANY, ANY, "chain"), 256 * k)),
            over_tcp(seg(rule(Exscan, 16, ANY, ANY, "chain"), 256 * k)),
            // Many nodes, one or two elements: the multi-leader scan
            // (in-node scan, node totals gathered through q ports per
            // node, each node's prefix in front). From the model, not
            // measured (us, `multi_leader_crossover_in_the_model`): 8 B
            // 5.5 vs 6.3 recursive doubling at 8 x 2, 3.8 vs 6.9 at
            // 8 x 8, 7.5 vs 13.9 at 64 x 64, 11.4 vs 21.3 at 1,024 x 16;
            // at 256 B it loses on 1,024 nodes (95 vs 24). Placements
            // other than blocks of consecutive ranks run recursive
            // doubling inside the algorithm.
            from_nodes(rule(Scan, ANY, ANY, 16, "multi_leader"), MULTI_LEADER_NODES),
            from_nodes(
                rule(Exscan, ANY, ANY, 16, "multi_leader"),
                MULTI_LEADER_NODES,
            ),
            rule(Scan, ANY, ANY, 64 * k - 1, "recursive_doubling"),
            seg(rule(Scan, 8, ANY, ANY, "chain"), 256 * k),
            rule(Scan, ANY, ANY, ANY, "recursive_doubling"),
            rule(Exscan, ANY, ANY, 64 * k - 1, "recursive_doubling"),
            seg(rule(Exscan, 8, ANY, ANY, "chain"), 256 * k),
            rule(Exscan, ANY, ANY, ANY, "recursive_doubling"),
        ]);
        Table { rules }
    }

    /// The first rule matching the key.
    pub fn lookup(
        &self,
        c: Collective,
        size: usize,
        ppn: usize,
        bytes: usize,
        net: Net,
    ) -> Option<Choice> {
        self.lookup_where(c, size, ppn, bytes, net, true)
    }

    /// The first rule matching the key, skipping the shared-memory fast
    /// path unless `fast_ok`.
    pub fn lookup_where(
        &self,
        c: Collective,
        size: usize,
        ppn: usize,
        bytes: usize,
        net: Net,
        fast_ok: bool,
    ) -> Option<Choice> {
        self.rules
            .iter()
            .find(|r| {
                (fast_ok || r.algorithm != SHM)
                    && r.network.map_or(true, |n| n == net)
                    && r.collective == c
                    && size <= r.max_comm_size
                    && ppn <= r.max_ranks_per_node
                    && bytes <= r.max_bytes
                    && size.div_ceil(ppn.max(1)) >= r.min_nodes
            })
            .map(|r| Choice {
                algorithm: r.algorithm,
                segment_bytes: r.segment_bytes,
                window: r.window,
            })
    }

    /// Reads a table in the format of the module doc; the error names
    /// the line and column, or the rule, and what is wrong there.
    pub fn from_json(text: &str) -> std::result::Result<Table, String> {
        json::table(text)
    }
}

/// The valid algorithm names of `c`, comma-separated.
pub fn names(c: Collective) -> String {
    algorithms(c)
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A key of the per-collective memo of [`choose`]: (forcing generation,
/// size, ranks per node, bytes, network, fast path allowed).
type MemoKey = (u64, usize, usize, usize, Net, bool);

/// Bumped by every `force_algorithm` on any thread, so memoized choices
/// expire. Process-wide rather than thread-local: in a shared library
/// (the C interface's) every thread-local access is a call to
/// `__tls_get_addr`, which measurably slowed 8-byte collectives; while it
/// is 0 (nothing was ever forced, as in every production run) a call
/// needs no thread-local at all (see [`Memo`]).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A communicator's memo of [`choose_marked`]: the last choice per
/// collective, keyed by (bytes, fast path allowed). Used only while no
/// thread ever forced an algorithm, since forcing is per thread and a
/// communicator may move between threads; after that the thread's own
/// memo serves.
#[derive(Default)]
pub(crate) struct Memo([Cell<Option<MemoEntry>>; 16]);

/// (bytes, fast path allowed, the choice, whether it is the fast path).
type MemoEntry = (usize, bool, Choice, bool);

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

thread_local! {
    static FORCED: RefCell<[Option<&'static str>; 16]> = const { RefCell::new([None; 16]) };
    /// The last choice per collective: a loop of identical calls selects
    /// once (the environment and tuning file are read once anyway).
    /// With it, whether the choice is the fast path (compared once).
    static MEMO: RefCell<[Option<(MemoKey, Choice, bool)>; 16]> = const { RefCell::new([None; 16]) };
    static FILE: RefCell<Option<std::result::Result<Option<Table>, String>>> = const { RefCell::new(None) };
    static DEFAULT: Table = Table::default_table();
    /// `IBCOLL_<COLL>_ALGORITHM`, read once per collective.
    static ENV: RefCell<[Option<EnvChoice>; 16]> = const { RefCell::new([ENV_UNREAD; 16]) };
}

const ENV_UNREAD: Option<EnvChoice> = None;

/// What `IBCOLL_<COLL>_ALGORITHM` says.
#[derive(Clone)]
enum EnvChoice {
    Auto,
    Alg(&'static str),
    Unknown(String),
}

fn env_choice(c: Collective) -> EnvChoice {
    ENV.with(|m| {
        m.borrow_mut()[c.index()]
            .get_or_insert_with(|| match std::env::var(c.env_var()) {
                Ok(v) if !v.is_empty() && v != "auto" => match find(c, &v) {
                    Some(a) => EnvChoice::Alg(a.name),
                    None => EnvChoice::Unknown(v),
                },
                _ => EnvChoice::Auto,
            })
            .clone()
    })
}

fn default_lookup(
    c: Collective,
    size: usize,
    ppn: usize,
    bytes: usize,
    net: Net,
    fast_ok: bool,
) -> Option<Choice> {
    DEFAULT.with(|t| t.lookup_where(c, size, ppn, bytes, net, fast_ok))
}

/// Forces (or with `None` releases) the algorithm of `c` for every later
/// call on this thread, over the environment and tables. For tests and
/// benchmarks; every rank must force the same. An unknown name is an
/// `InvalidArgument` listing the valid ones (its `rank` is 0: selection
/// does not know the process's rank).
pub fn force_algorithm(c: Collective, name: Option<&str>) -> Result<()> {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    let Some(name) = name else {
        FORCED.with(|f| f.borrow_mut()[c.index()] = None);
        return Ok(());
    };
    let a = find(c, name).ok_or_else(|| Error::InvalidArgument {
        rank: 0,
        op: crate::error::Op::Collective(c),
        detail: format!(
            "unknown {} algorithm {name:?} (valid: {})",
            c.name(),
            names(c)
        ),
    })?;
    FORCED.with(|f| f.borrow_mut()[c.index()] = Some(a.name));
    Ok(())
}

fn file_lookup(
    c: Collective,
    size: usize,
    ppn: usize,
    bytes: usize,
    net: Net,
    fast_ok: bool,
) -> Result<Option<Choice>> {
    if FILE.with(|f| matches!(&*f.borrow(), Some(Ok(None)))) {
        return Ok(None);
    }
    Ok(tuning_file()?.and_then(|t| t.lookup_where(c, size, ppn, bytes, net, fast_ok)))
}

fn tuning_file() -> Result<Option<Table>> {
    FILE.with(|f| {
        let mut f = f.borrow_mut();
        if f.is_none() {
            let loaded = match std::env::var("IBCOLL_TUNING_FILE") {
                Err(_) => Ok(None),
                Ok(p) if p.is_empty() => Ok(None),
                Ok(p) => std::fs::read_to_string(&p)
                    .map_err(|e| format!("cannot read {p}: {e}"))
                    .and_then(|t| Table::from_json(&t))
                    .map(Some),
            };
            *f = Some(loaded);
        }
        match f.as_ref() {
            Some(Ok(t)) => Ok(t.clone()),
            Some(Err(e)) => Err(Error::Config {
                var: "IBCOLL_TUNING_FILE",
                value: std::env::var("IBCOLL_TUNING_FILE").unwrap_or_default(),
                detail: e.clone(),
            }),
            None => Ok(None),
        }
    })
}

/// Picks the algorithm for one call (see the module doc). With `fast_ok`
/// false (a nonblocking call, a communicator that is not one whole node,
/// data beyond the slots) the shared-memory fast path is never returned: a
/// forced `shm` then yields the table's best schedule.
#[inline]
pub fn choose(
    c: Collective,
    size: usize,
    ppn: usize,
    bytes: usize,
    net: Net,
    fast_ok: bool,
) -> Result<Choice> {
    choose_in_thread(
        c,
        (
            GENERATION.load(Ordering::Relaxed),
            size,
            ppn,
            bytes,
            net,
            fast_ok,
        ),
    )
    .map(|(ch, _)| ch)
}

/// [`choose`] for a communicator whose size, ranks per node and network
/// do not change (its `memo` keeps the last choice per collective), and
/// whether the choice is the shared-memory fast path.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose_marked(
    memo: &Memo,
    c: Collective,
    size: usize,
    ppn: usize,
    bytes: usize,
    net: Net,
    fast_ok: bool,
) -> Result<(Choice, bool)> {
    let gen = GENERATION.load(Ordering::Relaxed);
    let key = (gen, size, ppn, bytes, net, fast_ok);
    if gen != 0 {
        return choose_in_thread(c, key);
    }
    let slot = &memo.0[c.index()];
    match slot.get() {
        Some((b, f, ch, shm)) if b == bytes && f == fast_ok => Ok((ch, shm)),
        _ => {
            let (ch, shm) = choose_in_thread(c, key)?;
            slot.set(Some((bytes, fast_ok, ch, shm)));
            Ok((ch, shm))
        }
    }
}

/// [`choose`] through this thread's memo (which knows its forcings).
#[inline]
fn choose_in_thread(c: Collective, key: MemoKey) -> Result<(Choice, bool)> {
    let hit = MEMO.with(|m| match m.borrow()[c.index()] {
        Some((k, ch, shm)) if k == key => Some((ch, shm)),
        _ => None,
    });
    match hit {
        Some(hit) => Ok(hit),
        None => choose_and_remember(c, key),
    }
}

#[cold]
#[inline(never)]
fn choose_and_remember(c: Collective, key: MemoKey) -> Result<(Choice, bool)> {
    let (_, size, ppn, bytes, net, fast_ok) = key;
    let ch = choose_uncached(c, size, ppn, bytes, net, fast_ok)?;
    let shm = ch.algorithm == SHM;
    MEMO.with(|m| m.borrow_mut()[c.index()] = Some((key, ch, shm)));
    Ok((ch, shm))
}

fn choose_uncached(
    c: Collective,
    size: usize,
    ppn: usize,
    bytes: usize,
    net: Net,
    fast_ok: bool,
) -> Result<Choice> {
    let dflt = |alg: &'static str| Choice {
        algorithm: alg,
        segment_bytes: SEG,
        window: WINDOW,
    };
    // `hier` composes calls on a node communicator, which must take the
    // table (its fast path), not a forced `hier` again.
    let usable = |a: &str| (fast_ok || a != SHM) && (a != "hier" || net != Net::Shm);
    if let Some(a) = FORCED.with(|f| f.borrow()[c.index()]).filter(|a| usable(a)) {
        let base = default_lookup(c, size, ppn, bytes, net, fast_ok);
        return Ok(Choice {
            algorithm: a,
            ..base.unwrap_or(dflt(a))
        });
    }
    match env_choice(c) {
        EnvChoice::Auto => {}
        EnvChoice::Alg(a) if usable(a) => return Ok(dflt(a)),
        EnvChoice::Alg(_) => {}
        EnvChoice::Unknown(v) => {
            return Err(Error::Config {
                var: c.env_var(),
                value: v,
                detail: format!("unknown algorithm (valid: auto, {})", names(c)),
            })
        }
    }
    if let Some(ch) = file_lookup(c, size, ppn, bytes, net, fast_ok)? {
        return Ok(ch);
    }
    Ok(default_lookup(c, size, ppn, bytes, net, fast_ok).unwrap_or(dflt(algorithms(c)[0].name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_table_covers_everything() {
        let t = Table::default_table();
        for c in Collective::ALL {
            for size in [1, 2, 7, 64, 5000] {
                for bytes in [0, 1, 1 << 12, 1 << 20, 1 << 30] {
                    let ch = t.lookup(c, size, 4, bytes, Net::Tcp).expect("a rule");
                    assert!(find(c, ch.algorithm).is_some(), "{c:?} {}", ch.algorithm);
                }
            }
        }
    }

    #[test]
    fn many_nodes_take_the_multi_leader_schedules() {
        let t = Table::default_table();
        let pick = |c, size, ppn, bytes, net| {
            t.lookup_where(c, size, ppn, bytes, net, false)
                .unwrap()
                .algorithm
        };
        for net in [Net::Tcp, Net::Rdma] {
            assert_eq!(pick(Collective::Bcast, 16, 2, 8, net), "multi_leader");
            assert_eq!(
                pick(Collective::Bcast, 64 * 64, 64, 16 << 10, net),
                "multi_leader"
            );
            assert_eq!(pick(Collective::Bcast, 14, 2, 8, net), "binomial");
            assert_eq!(
                pick(Collective::Allreduce, 1024 * 16, 16, 16, net),
                "multi_leader"
            );
            // Beyond 16 B, what the table picked before.
            let before = if net == Net::Rdma {
                "recursive_doubling"
            } else {
                "node_aware"
            };
            assert_eq!(pick(Collective::Allreduce, 1024 * 16, 16, 32, net), before);
            for c in [Collective::Scan, Collective::Exscan] {
                assert_eq!(pick(c, 64 * 64, 64, 8, net), "multi_leader");
                assert_eq!(pick(c, 64 * 64, 64, 32, net), "recursive_doubling");
                assert_ne!(pick(c, 14, 2, 8, net), "multi_leader");
            }
            for c in [Collective::Allgather, Collective::Allgatherv] {
                for bytes in [8, 1 << 20] {
                    assert_eq!(pick(c, 64 * 64, 64, bytes, net), "multi_leader");
                }
                assert_eq!(pick(c, 16, 2, 1 << 20, net), "multi_leader");
                assert_ne!(pick(c, 14, 2, 8, net), "multi_leader");
            }
            // Up to 16 ranks over tcp, what 8 hosts x 2 measured.
            let small = if net == Net::Tcp {
                ["node_aware", "node_aware", "node_aware", "chain"]
            } else {
                ["multi_leader"; 4]
            };
            assert_eq!(pick(Collective::Allgather, 16, 2, 8, net), small[0]);
            assert_eq!(pick(Collective::Allreduce, 16, 2, 8, net), small[1]);
            assert_eq!(pick(Collective::Barrier, 16, 2, 0, net), small[2]);
            assert_eq!(pick(Collective::Scan, 16, 2, 8, net), small[3]);
            assert_eq!(pick(Collective::Barrier, 64, 2, 0, net), "multi_leader");
            assert_eq!(pick(Collective::Allreduce, 64, 2, 8, net), "multi_leader");
            // One rank per node: recursive doubling, as measured.
            assert_eq!(
                pick(Collective::Allreduce, 16, 1, 8, net),
                "recursive_doubling"
            );
        }
    }

    #[test]
    fn multi_node_allreduce_is_node_aware() {
        let t = Table::default_table();
        // Several nodes: the fast path never qualifies.
        let pick = |size, ppn, bytes| {
            t.lookup_where(Collective::Allreduce, size, ppn, bytes, Net::Tcp, false)
                .unwrap()
                .algorithm
        };
        assert_eq!(pick(8, 4, 8), "node_aware");
        assert_eq!(pick(8, 8, 8), "recursive_doubling");
        assert_eq!(pick(8, 1, 8), "recursive_doubling");
        assert_eq!(pick(64, 1, 1 << 20), "rabenseifner");
        assert_eq!(pick(4, 2, 1 << 20), "ring");
        assert_eq!(pick(2, 1, 1 << 20), "ring");
        assert_eq!(pick(8, 2, 1 << 20), "node_aware");
        let barrier = |size, ppn| {
            t.lookup_where(Collective::Barrier, size, ppn, 0, Net::Tcp, false)
                .unwrap()
                .algorithm
        };
        assert_eq!(barrier(8, 2), "node_aware");
        assert_eq!(barrier(8, 8), "dissemination");
        let on = |c, size, ppn, bytes| {
            t.lookup_where(c, size, ppn, bytes, Net::Tcp, false)
                .unwrap()
                .algorithm
        };
        let reduce = |size, ppn, bytes| on(Collective::Reduce, size, ppn, bytes);
        assert_eq!(reduce(4, 2, 64 << 10), "node_aware");
        assert_eq!(reduce(8, 2, 256 << 10), "node_aware");
        assert_eq!(reduce(2, 1, 64 << 10), "reduce_scatter_gather");
        assert_eq!(reduce(4, 2, 1 << 20), "reduce_scatter_gather");
        assert_eq!(on(Collective::Allgather, 8, 2, 8), "node_aware");
        assert_eq!(on(Collective::Allgather, 2, 1, 8), "recursive_doubling");
        assert_eq!(on(Collective::Allgatherv, 8, 2, 1024), "node_aware");
        assert_eq!(on(Collective::Allgatherv, 2, 1, 8), "bruck");
        assert_eq!(on(Collective::Allreduce, 4, 2, 512 << 10), "node_aware");
        assert_eq!(on(Collective::Allreduce, 4, 2, 1 << 20), "ring");
        let scan = |size, ppn| {
            t.lookup_where(Collective::Scan, size, ppn, 8, Net::Tcp, false)
                .unwrap()
                .algorithm
        };
        assert_eq!(scan(4, 2), "chain");
        assert_eq!(scan(16, 4), "chain");
        assert_eq!(scan(24, 4), "recursive_doubling");
        assert_eq!(scan(64, 2), "multi_leader");
        // The rules measured over tcp stay there: over rdma two nodes of
        // two ranks keep the node-aware allreduce at 1 MiB and the scan
        // its recursive doubling.
        let on = |c, net, bytes| {
            t.lookup_where(c, 4, 2, bytes, net, false)
                .unwrap()
                .algorithm
        };
        assert_eq!(on(Collective::Allreduce, Net::Tcp, 1 << 20), "ring");
        assert_eq!(on(Collective::Allreduce, Net::Rdma, 1 << 20), "node_aware");
        assert_eq!(on(Collective::Scan, Net::Rdma, 8), "recursive_doubling");
        // Measured over rdma in the VM: small allreduce and alltoall.
        assert_eq!(
            on(Collective::Allreduce, Net::Rdma, 8),
            "recursive_doubling"
        );
        assert_eq!(on(Collective::Allreduce, Net::Tcp, 8), "node_aware");
        assert_eq!(on(Collective::Alltoall, Net::Rdma, 8), "node_aware");
        assert_eq!(on(Collective::Alltoall, Net::Tcp, 8), "bruck");
        assert_eq!(
            on(Collective::Alltoall, Net::Rdma, 1 << 16),
            on(Collective::Alltoall, Net::Tcp, 1 << 16)
        );
        assert_eq!(on(Collective::Barrier, Net::Rdma, 0), "multi_leader");
        assert_eq!(on(Collective::Scatter, Net::Tcp, 8), "node_aware");
        assert_eq!(on(Collective::Scatter, Net::Rdma, 8), "linear");
        assert_eq!(
            on(Collective::ReduceScatterBlock, Net::Tcp, 8),
            "node_aware"
        );
        assert_ne!(
            on(Collective::ReduceScatterBlock, Net::Tcp, 1 << 16),
            "node_aware"
        );
        let j = Table::from_json(
            r#"{"rules":[{"collective":"bcast","algorithm":"chain","min_nodes":3}]}"#,
        )
        .unwrap();
        assert!(j.lookup(Collective::Bcast, 4, 2, 1, Net::Tcp).is_none());
        assert!(j.lookup(Collective::Bcast, 6, 2, 1, Net::Tcp).is_some());
    }

    #[test]
    fn json_tables() {
        let t = Table::from_json(
            r#"{"rules":[{"collective":"allreduce","algorithm":"ring","max_bytes":100,"window":3},
                         {"collective":"bcast","algorithm":"chain","segment_bytes":4096}]}"#,
        )
        .unwrap();
        let c = t
            .lookup(Collective::Allreduce, 8, 1, 100, Net::Tcp)
            .unwrap();
        assert_eq!((c.algorithm, c.window), ("ring", 3));
        assert!(t
            .lookup(Collective::Allreduce, 8, 1, 101, Net::Tcp)
            .is_none());
        assert_eq!(
            t.lookup(Collective::Bcast, 3, 3, 1 << 30, Net::Tcp)
                .unwrap()
                .segment_bytes,
            4096
        );
        let e = Table::from_json(r#"{"rules":[{"collective":"allreduce","algorithm":"nope"}]}"#)
            .unwrap_err();
        assert!(e.contains("recursive_doubling"), "{e}");
        assert!(Table::from_json(r#"{"rules":[{"collective":"x","algorithm":"ring"}]}"#).is_err());
        let n = Table::from_json(
            r#"{"rules":[{"collective":"bcast","algorithm":"chain","network":"rdma"}]}"#,
        )
        .unwrap();
        assert!(n.lookup(Collective::Bcast, 4, 2, 1, Net::Rdma).is_some());
        assert!(n.lookup(Collective::Bcast, 4, 2, 1, Net::Tcp).is_none());
        let e = Table::from_json(
            r#"{"rules":[{"collective":"bcast","algorithm":"chain","network":"ib"}]}"#,
        )
        .unwrap_err();
        assert!(e.contains("unknown network") && e.contains("rdma"), "{e}");
        assert!(Table::from_json(
            r#"{"rules":[{"collective":"bcast","algorithm":"chain","max_bytes":-1}]}"#
        )
        .is_err());
        assert!(Table::from_json(
            r#"{"rules":[{"collective":"bcast","algorithm":"chain","bogus":1}]}"#
        )
        .is_err());
    }

    #[test]
    fn forcing() {
        force_algorithm(Collective::Scan, Some("recursive_doubling")).unwrap();
        assert_eq!(
            choose(Collective::Scan, 4, 1, 8, Net::Shm, true)
                .unwrap()
                .algorithm,
            "recursive_doubling"
        );
        let e = force_algorithm(Collective::Bcast, Some("bogus"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("binomial") && e.contains("chain"), "{e}");
        force_algorithm(Collective::Scan, None).unwrap();
    }
}

#[cfg(test)]
mod registry_tests {
    use crate::algorithms::{algorithms, Collective};
    use crate::config::REGISTRY;

    #[test]
    fn every_variable_is_registered_with_its_algorithms() {
        assert!(REGISTRY.iter().any(|e| e.name == "IBCOLL_TUNING_FILE"));
        for c in Collective::ALL {
            let e = REGISTRY
                .iter()
                .find(|e| e.name == c.env_var())
                .unwrap_or_else(|| panic!("{} not registered", c.env_var()));
            for a in algorithms(c) {
                assert!(
                    e.doc.contains(a.name),
                    "{}: {} undocumented",
                    e.name,
                    a.name
                );
            }
        }
    }
}
