//! The two levels of the node-aware algorithms: the ranks of each node
//! (in rank order, nodes in order of their lowest rank) and one leader per
//! node. The leader is the node's lowest rank, or the root in the root's
//! node, so a rooted collective needs no extra hop to or from the root.

use crate::algorithms::{node_groups, Args};

pub(crate) struct Levels {
    /// Members of every node.
    pub groups: Vec<Vec<usize>>,
    /// Index of this rank's node in `groups`.
    pub node: usize,
    /// This rank's index in its node.
    pub me: usize,
    /// Index in its node of every node's leader.
    pub lead: Vec<usize>,
    /// Index of the root's node (0 without a root).
    pub root_node: usize,
}

impl Levels {
    /// The levels of `a`'s communicator; `rooted` makes the root its node's
    /// leader.
    pub fn new(a: &Args, rooted: bool) -> Levels {
        let groups = node_groups(&a.nodes, a.size);
        let find = |r: usize| {
            groups
                .iter()
                .enumerate()
                .find_map(|(g, m)| m.binary_search(&r).ok().map(|i| (g, i)))
                .unwrap_or((0, 0))
        };
        let (node, me) = find(a.rank);
        let mut lead = vec![0; groups.len()];
        let mut root_node = 0;
        if rooted {
            let (g, i) = find(a.root);
            lead[g] = i;
            root_node = g;
        }
        Levels {
            groups,
            node,
            me,
            lead,
            root_node,
        }
    }

    /// The members of this rank's node.
    pub fn mine(&self) -> &[usize] {
        &self.groups[self.node]
    }

    /// Whether this rank leads its node.
    pub fn leads(&self) -> bool {
        self.me == self.lead[self.node]
    }

    /// The leader rank of every node.
    pub fn leaders(&self) -> Vec<usize> {
        self.groups
            .iter()
            .zip(&self.lead)
            .map(|(g, &l)| g[l])
            .collect()
    }

    /// Whether the nodes are blocks of consecutive ranks, in rank order
    /// (the ranks listed node after node are 0, 1, 2, ...).
    pub fn in_rank_order(&self) -> bool {
        self.groups
            .iter()
            .flatten()
            .enumerate()
            .all(|(i, &r)| i == r)
    }

    /// The fewest ranks on one node.
    pub fn min_ppn(&self) -> usize {
        self.groups.iter().map(|g| g.len()).min().unwrap_or(1)
    }
}

/// Children of a rank in the wide, shallow trees inside nodes of the
/// multi-leader algorithms: as many as the most ports a node drives
/// (`barrier::multi_leader`), so the rank at the top reaches every port in
/// one hop, and two hops cover 256 ranks.
pub(crate) const HEAP_FANOUT: usize = 16;

/// Parent of member `v` in its node's `HEAP_FANOUT`-ary heap (members
/// counted from the heap's top).
pub(crate) fn heap_parent(v: usize) -> Option<usize> {
    (v > 0).then(|| (v - 1) / HEAP_FANOUT)
}

/// Children of member `v` in a `HEAP_FANOUT`-ary heap of `n` members.
pub(crate) fn heap_children(v: usize, n: usize) -> std::ops::Range<usize> {
    let first = (HEAP_FANOUT * v + 1).min(n);
    first..(HEAP_FANOUT * v + HEAP_FANOUT + 1).min(n)
}

/// The leaders' binomial tree of a rooted collective that moves whole
/// nodes' blocks (gather, scatter): nodes numbered from the root's node,
/// a leader's subtree covers consecutive relative nodes, so its blocks
/// are one contiguous range in that order.
pub(crate) struct NodeTree {
    /// Number of nodes.
    pub k: usize,
    /// This rank's node, relative to the root's.
    pub pos: usize,
    /// `first[v]`: blocks before relative node v (k + 1 entries).
    pub first: Vec<usize>,
    root_node: usize,
}

impl NodeTree {
    pub fn new(l: &Levels) -> NodeTree {
        let k = l.groups.len();
        let mut first = Vec::with_capacity(k + 1);
        let mut s = 0;
        first.push(0);
        for v in 0..k {
            s += l.groups[(v + l.root_node) % k].len();
            first.push(s);
        }
        NodeTree {
            k,
            pos: (l.node + k - l.root_node) % k,
            first,
            root_node: l.root_node,
        }
    }

    /// Index in `Levels::groups` of relative node `v`.
    pub fn node(&self, v: usize) -> usize {
        (v + self.root_node) % self.k
    }

    /// Blocks of the subtree of relative node `v`: (first, number).
    pub fn span(&self, v: usize) -> (usize, usize) {
        let end = v + crate::algorithms::subtree(v, self.k);
        (self.first[v], self.first[end] - self.first[v])
    }
}
