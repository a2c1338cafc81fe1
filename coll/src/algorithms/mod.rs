//! Collective algorithms, one per file under `<collective>/<algorithm>.rs`.
//!
//! Each algorithm is a pure function from [`Args`] (this rank, the
//! communicator shape, sizes in elements, parameters) to a
//! [`Schedule`]. Buffer conventions per
//! collective (all in elements; `Send` is read only):
//!
//! | collective | input | output |
//! |---|---|---|
//! | barrier | - | - |
//! | bcast | `Recv[count]` at root | `Recv[count]` |
//! | reduce, allreduce, scan, exscan | `Send[count]` (`Recv` if `in_place`) | `Recv[count]` (reduce: root only) |
//! | gather(v) | `Send[count]` (root `in_place`: own block already in `Recv`) | root: `Recv`, block i at `displs[i]`, `counts[i]` long |
//! | scatter(v) | root: `Send`, block i at `displs[i]` | `Recv[count]` (root `in_place`: nothing) |
//! | allgather(v) | `Send[counts[rank]]` (`in_place`: own block in `Recv`) | `Recv`, block i at `displs[i]` |
//! | alltoall(v) | `Send`, block for i at `displs[i]`, `counts[i]` | `Recv`, block from i at `rdispls[i]`, `rcounts[i]` |
//! | reduce_scatter(_block) | `Send[sum counts]` (`Recv` if `in_place`) | `Recv[counts[rank]]` |
//!
//! For gatherv/scatterv only the root knows every count; other ranks pass
//! their own count in `count`.

pub mod allgather;
pub mod allreduce;
pub mod alltoall;
pub mod alltoallv;
pub mod barrier;
pub mod bcast;
pub mod gather;
pub mod gatherv;
pub(crate) mod levels;
pub mod reduce;
pub mod reduce_scatter;
pub mod scan;
pub mod scatter;
pub mod scatterv;

use crate::schedule::{Builder, El, Schedule};

/// The collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    Barrier,
    Bcast,
    Reduce,
    Allreduce,
    Gather,
    Gatherv,
    Scatter,
    Scatterv,
    Allgather,
    Allgatherv,
    Alltoall,
    Alltoallv,
    ReduceScatter,
    ReduceScatterBlock,
    Scan,
    Exscan,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 16] = [
        Collective::Barrier,
        Collective::Bcast,
        Collective::Reduce,
        Collective::Allreduce,
        Collective::Gather,
        Collective::Gatherv,
        Collective::Scatter,
        Collective::Scatterv,
        Collective::Allgather,
        Collective::Allgatherv,
        Collective::Alltoall,
        Collective::Alltoallv,
        Collective::ReduceScatter,
        Collective::ReduceScatterBlock,
        Collective::Scan,
        Collective::Exscan,
    ];

    /// Position in [`Collective::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name (`reduce_scatter_block`), as in tuning files.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Barrier => "barrier",
            Collective::Bcast => "bcast",
            Collective::Reduce => "reduce",
            Collective::Allreduce => "allreduce",
            Collective::Gather => "gather",
            Collective::Gatherv => "gatherv",
            Collective::Scatter => "scatter",
            Collective::Scatterv => "scatterv",
            Collective::Allgather => "allgather",
            Collective::Allgatherv => "allgatherv",
            Collective::Alltoall => "alltoall",
            Collective::Alltoallv => "alltoallv",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::ReduceScatterBlock => "reduce_scatter_block",
            Collective::Scan => "scan",
            Collective::Exscan => "exscan",
        }
    }

    /// The collective named `s`.
    pub fn from_name(s: &str) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| c.name() == s)
    }

    /// `IBCOLL_<NAME>_ALGORITHM`.
    pub fn env_var(self) -> &'static str {
        match self {
            Collective::Barrier => "IBCOLL_BARRIER_ALGORITHM",
            Collective::Bcast => "IBCOLL_BCAST_ALGORITHM",
            Collective::Reduce => "IBCOLL_REDUCE_ALGORITHM",
            Collective::Allreduce => "IBCOLL_ALLREDUCE_ALGORITHM",
            Collective::Gather => "IBCOLL_GATHER_ALGORITHM",
            Collective::Gatherv => "IBCOLL_GATHERV_ALGORITHM",
            Collective::Scatter => "IBCOLL_SCATTER_ALGORITHM",
            Collective::Scatterv => "IBCOLL_SCATTERV_ALGORITHM",
            Collective::Allgather => "IBCOLL_ALLGATHER_ALGORITHM",
            Collective::Allgatherv => "IBCOLL_ALLGATHERV_ALGORITHM",
            Collective::Alltoall => "IBCOLL_ALLTOALL_ALGORITHM",
            Collective::Alltoallv => "IBCOLL_ALLTOALLV_ALGORITHM",
            Collective::ReduceScatter => "IBCOLL_REDUCE_SCATTER_ALGORITHM",
            Collective::ReduceScatterBlock => "IBCOLL_REDUCE_SCATTER_BLOCK_ALGORITHM",
            Collective::Scan => "IBCOLL_SCAN_ALGORITHM",
            Collective::Exscan => "IBCOLL_EXSCAN_ALGORITHM",
        }
    }

    /// Whether the collective combines data with a reduction operation.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::Reduce
                | Collective::Allreduce
                | Collective::ReduceScatter
                | Collective::ReduceScatterBlock
                | Collective::Scan
                | Collective::Exscan
        )
    }

    /// Whether the collective has a root.
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Bcast
                | Collective::Reduce
                | Collective::Gather
                | Collective::Gatherv
                | Collective::Scatter
                | Collective::Scatterv
        )
    }
}

/// What an algorithm needs to know (see the module doc for the meaning of
/// the counts per collective).
#[derive(Debug, Clone, Default)]
pub struct Args {
    pub rank: usize,
    pub size: usize,
    pub root: usize,
    /// Bytes per element.
    pub esize: usize,
    pub count: usize,
    pub counts: Vec<usize>,
    pub displs: Vec<usize>,
    pub rcounts: Vec<usize>,
    pub rdispls: Vec<usize>,
    pub in_place: bool,
    /// Node of every rank (empty: all on one node).
    pub nodes: Vec<usize>,
    /// Pipeline segment in elements (>= 1).
    pub seg: usize,
    /// Largest number of peers in flight (>= 1).
    pub window: usize,
    /// `displs` are the prefix sums of `counts` on every rank (uniform
    /// collectives), so adjacent blocks may travel as one message.
    pub canonical: bool,
    /// What the first phase of a two-phase schedule learned (see
    /// [`crate::schedule::Schedule::then`]); `None` while building the
    /// first phase.
    pub learned: Option<Vec<u64>>,
}

impl Args {
    /// Where the reducing collectives find their input.
    pub fn input(&self) -> crate::schedule::Buf {
        if self.in_place {
            crate::schedule::Buf::Recv
        } else {
            crate::schedule::Buf::Send
        }
    }
}

/// The algorithm to run instead of `alg` for a reduction whose operation
/// is not commutative ([`crate::ReduceOp::Ordered`]), and the placement it
/// is built with: one that combines the inputs in rank order. The ring
/// ones go round from each block's owner, recursive halving and
/// Rabenseifner pair ranks across the halves, reduce-scatter-gather is a
/// ring, and the node-aware ones combine each node's members first, which
/// is rank order only when every node holds a contiguous range of ranks.
/// The binomial reduce and recursive doubling keep it (see their files);
/// a reduce-scatter becomes the node-aware one built as if all ranks
/// shared one node: a binomial reduce to rank 0, which hands each rank its
/// block. Every rank substitutes the same (the operation's kind is part of
/// a valid call).
pub(crate) fn in_rank_order<'a>(
    c: Collective,
    alg: &'a str,
    nodes: &'a [usize],
) -> (&'a str, &'a [usize]) {
    match c {
        Collective::Reduce if alg != "binomial" => ("binomial", nodes),
        Collective::Allreduce if alg != "recursive_doubling" => ("recursive_doubling", nodes),
        Collective::ReduceScatter | Collective::ReduceScatterBlock => ("node_aware", &[]),
        _ => (alg, nodes),
    }
}

/// Whether `alg` is built on the node map (`Args::nodes`): the two-level
/// algorithms (`mcast`'s and `hier`'s schedules, their fallback and
/// nonblocking form, are the node-aware ones). The others get no map, so that their schedules
/// do not depend on placement.
pub(crate) fn uses_placement(alg: &str) -> bool {
    matches!(alg, "node_aware" | "multi_leader" | "mcast" | "hier")
}

/// Builds one rank's schedule.
pub type BuildFn = fn(&Args) -> Schedule;

/// How an algorithm runs.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A schedule of messages, built by this function (any communicator,
    /// blocking or not; the simulator runs these).
    Schedule(BuildFn),
    /// The shared-memory fast path (`fastpath/<collective>.rs`, run by
    /// `crate::fastpath`): blocking calls on a communicator that holds
    /// every rank of one node, with data that fits the publication slots.
    /// Other calls that select it take the best schedule instead.
    Shm,
}

/// A named algorithm.
#[derive(Debug, Clone, Copy)]
pub struct Algorithm {
    pub name: &'static str,
    pub kind: Kind,
}

impl Algorithm {
    /// The schedule builder, unless this is the shared-memory fast path.
    pub fn schedule(&self) -> Option<BuildFn> {
        match self.kind {
            Kind::Schedule(b) => Some(b),
            Kind::Shm => None,
        }
    }

    /// Whether this is the shared-memory fast path.
    pub fn is_shm(&self) -> bool {
        matches!(self.kind, Kind::Shm)
    }
}

const fn alg(name: &'static str, build: BuildFn) -> Algorithm {
    Algorithm {
        name,
        kind: Kind::Schedule(build),
    }
}

/// Name of the shared-memory fast path in every collective that has one.
pub const SHM: &str = "shm";

const SHM_ALG: Algorithm = Algorithm {
    name: SHM,
    kind: Kind::Shm,
};

/// Every algorithm of `c`.
pub fn algorithms(c: Collective) -> &'static [Algorithm] {
    match c {
        Collective::Barrier => {
            const L: &[Algorithm] = &[
                alg("dissemination", barrier::dissemination::build),
                alg("tree", barrier::tree::build),
                alg("node_aware", barrier::node_aware::build),
                alg("multi_leader", barrier::multi_leader::build),
                // Blocking calls are released by multicast among node
                // leaders (`crate::mcast`); the schedule is the fallback
                // (and the nonblocking form).
                alg("mcast", barrier::node_aware::build),
                // Blocking calls: the node's fast path, the leaders' barrier,
                // the node's fast path again (`crate::hier`).
                alg("hier", barrier::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Bcast => {
            const L: &[Algorithm] = &[
                alg("binomial", bcast::binomial::build),
                alg("scatter_allgather", bcast::scatter_allgather::build),
                alg("chain", bcast::chain::build),
                alg("node_aware", bcast::node_aware::build),
                alg("multi_leader", bcast::multi_leader::build),
                // Blocking calls multicast among node leaders
                // (`crate::mcast`); the schedule is the fallback (and the
                // nonblocking form): the node-aware tree.
                alg("mcast", bcast::node_aware::build),
                // Blocking calls: the root's node's fast path, the leaders'
                // bcast, every other node's fast path (`crate::hier`).
                alg("hier", bcast::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Reduce => {
            const L: &[Algorithm] = &[
                alg("binomial", reduce::binomial::build),
                alg(
                    "reduce_scatter_gather",
                    reduce::reduce_scatter_gather::build,
                ),
                alg("node_aware", reduce::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Allreduce => {
            const L: &[Algorithm] = &[
                alg("recursive_doubling", allreduce::recursive_doubling::build),
                alg("ring", allreduce::ring::build),
                alg("rabenseifner", allreduce::rabenseifner::build),
                alg("node_aware", allreduce::node_aware::build),
                alg("multi_leader", allreduce::multi_leader::build),
                // Blocking calls with a commutative operation broadcast
                // the leaders' result by multicast (`crate::mcast`); the
                // schedule is the fallback (and the nonblocking form).
                alg("mcast", allreduce::node_aware::build),
                // Blocking calls with a commutative operation: the node's
                // fast-path reduce, the leaders' allreduce, the node's
                // fast-path bcast (`crate::hier`).
                alg("hier", allreduce::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Gather => {
            const L: &[Algorithm] = &[
                alg("binomial", gather::binomial::build),
                alg("linear", gather::linear::build),
                alg("node_aware", gather::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Gatherv => {
            const L: &[Algorithm] = &[
                alg("linear", gather::linear::build),
                alg("node_aware", gatherv::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Scatter => {
            const L: &[Algorithm] = &[
                alg("binomial", scatter::binomial::build),
                alg("linear", scatter::linear::build),
                alg("node_aware", scatter::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Scatterv => {
            const L: &[Algorithm] = &[
                alg("linear", scatter::linear::build),
                alg("node_aware", scatterv::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Allgather | Collective::Allgatherv => {
            const L: &[Algorithm] = &[
                alg("ring", allgather::ring::build),
                alg("recursive_doubling", allgather::recursive_doubling::build),
                alg("bruck", allgather::bruck::build),
                alg("node_aware", allgather::node_aware::build),
                alg("multi_leader", allgather::multi_leader::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Alltoall => {
            const L: &[Algorithm] = &[
                alg("pairwise", alltoall::pairwise::build),
                alg("bruck", alltoall::bruck::build),
                alg("linear", alltoall::linear::build),
                alg("node_aware", alltoall::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Alltoallv => {
            const L: &[Algorithm] = &[
                alg("pairwise", alltoall::pairwise::build),
                alg("linear", alltoall::linear::build),
                alg("node_aware", alltoallv::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::ReduceScatter | Collective::ReduceScatterBlock => {
            const L: &[Algorithm] = &[
                alg("ring", reduce_scatter::ring::build),
                alg(
                    "recursive_halving",
                    reduce_scatter::recursive_halving::build,
                ),
                alg("node_aware", reduce_scatter::node_aware::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Scan => {
            const L: &[Algorithm] = &[
                alg("recursive_doubling", scan::recursive_doubling::build),
                alg("chain", scan::chain::build),
                alg("multi_leader", scan::multi_leader::build),
                SHM_ALG,
            ];
            L
        }
        Collective::Exscan => {
            const L: &[Algorithm] = &[
                alg("recursive_doubling", scan::recursive_doubling::build_exscan),
                alg("chain", scan::chain::build_exscan),
                alg("multi_leader", scan::multi_leader::build_exscan),
                SHM_ALG,
            ];
            L
        }
    }
}

/// The algorithm `name` of `c`.
pub fn find(c: Collective, name: &str) -> Option<Algorithm> {
    algorithms(c).iter().copied().find(|a| a.name == name)
}

// ---------------------------------------------------------------- helpers

/// Splits `count` elements into `parts` nearly equal blocks (offset, len).
pub(crate) fn split(count: usize, parts: usize) -> Vec<(usize, usize)> {
    let parts = parts.max(1);
    let (q, r) = (count / parts, count % parts);
    let mut off = 0;
    (0..parts)
        .map(|i| {
            let len = q + usize::from(i < r);
            let b = (off, len);
            off += len;
            b
        })
        .collect()
}

/// Sends `data` (element units) to `peer` as consecutive messages of at
/// most `seg` elements; the receiver cuts it the same way with
/// [`recv_segs`]. Several moderate messages in flight move faster than one
/// large one where a large message takes a slower protocol (on shared
/// memory: rendezvous with a copy split between both cores, which in an
/// exchange where both cores already copy only adds coordination). An
/// empty block is still one (empty) message.
pub(crate) fn send_segs(b: &mut Builder, peer: usize, data: El, seg: usize) {
    for piece in segments(data, seg) {
        b.send(peer, piece);
    }
}

/// Receives what [`send_segs`] sent.
pub(crate) fn recv_segs(b: &mut Builder, peer: usize, data: El, seg: usize) {
    for piece in segments(data, seg) {
        b.recv(peer, piece);
    }
}

fn segments((buf, off, len): El, seg: usize) -> impl Iterator<Item = El> {
    let seg = seg.max(1);
    let n = len.div_ceil(seg).max(1);
    (0..n).map(move |i| (buf, off + i * seg, seg.min(len - (i * seg).min(len))))
}

/// Prefix sums of `counts` (one more entry than `counts`).
pub(crate) fn prefix(counts: &[usize]) -> Vec<usize> {
    let mut p = Vec::with_capacity(counts.len() + 1);
    let mut s = 0;
    p.push(0);
    for &c in counts {
        s += c;
        p.push(s);
    }
    p
}

/// Largest power of two <= n (n >= 1).
pub(crate) fn pow2_floor(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// Binomial tree over `n` relative ranks rooted at 0: the parent of `vr`.
pub(crate) fn tree_parent(vr: usize) -> Option<usize> {
    (vr != 0).then(|| vr - (vr & vr.wrapping_neg()))
}

/// Children of `vr` in ascending distance (`vr + 1`, `vr + 2`, ...).
pub(crate) fn tree_children(vr: usize, n: usize) -> Vec<usize> {
    let low = if vr == 0 {
        usize::MAX
    } else {
        vr & vr.wrapping_neg()
    };
    let mut out = Vec::new();
    let mut m = 1;
    while m < low && vr + m < n {
        out.push(vr + m);
        m <<= 1;
    }
    out
}

/// Number of relative ranks in the subtree of `vr` (itself included).
pub(crate) fn subtree(vr: usize, n: usize) -> usize {
    let low = if vr == 0 {
        usize::MAX
    } else {
        vr & vr.wrapping_neg()
    };
    low.min(n - vr)
}

/// The node groups of a communicator: members of each node in rank order,
/// nodes in order of their lowest rank. Empty `nodes` = one node.
pub(crate) fn node_groups(nodes: &[usize], size: usize) -> Vec<Vec<usize>> {
    if nodes.len() != size {
        return vec![(0..size).collect()];
    }
    // Placement in blocks (the usual case): one group per run of equal
    // ids, no map.
    if nodes.windows(2).all(|w| w[0] <= w[1]) {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (r, w) in nodes.iter().enumerate() {
            if r == 0 || nodes[r - 1] != *w {
                groups.push(Vec::new());
            }
            if let Some(g) = groups.last_mut() {
                g.push(r);
            }
        }
        return groups;
    }
    // Otherwise one pass with a map from node id to group (a linear search
    // per rank is quadratic in nodes at 1,024 nodes).
    let mut index: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (r, &n) in nodes.iter().enumerate() {
        let g = *index.entry(n).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(r);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(split(7, 3), vec![(0, 3), (3, 2), (5, 2)]);
        assert_eq!(split(1, 3), vec![(0, 1), (1, 0), (1, 0)]);
        assert_eq!(pow2_floor(7), 4);
        assert_eq!(pow2_floor(8), 8);
        assert_eq!(tree_children(0, 6), vec![1, 2, 4]);
        assert_eq!(tree_children(4, 6), vec![5]);
        assert_eq!(tree_parent(6), Some(4));
        assert_eq!(subtree(4, 6), 2);
        assert_eq!(subtree(0, 6), 6);
        assert_eq!(
            node_groups(&[1, 1, 0, 0, 2], 5),
            vec![vec![0, 1], vec![2, 3], vec![4]]
        );
        for c in Collective::ALL {
            assert_eq!(Collective::from_name(c.name()), Some(c));
            assert!(!algorithms(c).is_empty());
        }
    }
}
