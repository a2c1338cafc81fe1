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

    /// The fewest ranks on one node.
    pub fn min_ppn(&self) -> usize {
        self.groups.iter().map(|g| g.len()).min().unwrap_or(1)
    }
}
