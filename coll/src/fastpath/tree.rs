//! The tree the rooted and reducing fast paths use from
//! `IBCOLL_SHM_TREE_MIN` members on: each rank owns a contiguous range of
//! ranks, itself first, and splits the rest of its range into at most
//! [`ARITY`] contiguous parts whose first ranks are its children. A
//! reduction that combines a rank's own input with its children's partial
//! results in child order therefore combines the inputs in rank order
//! (`x0 op x1 op ... op x(n-1)`, associated by subtree), as MPI requires
//! of a non-commutative operation, and every line has at most `ARITY` + 1
//! readers instead of n - 1.

/// Children per rank.
pub(crate) const ARITY: usize = 4;

/// One rank's place in the tree of `n` ranks rooted at rank 0.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub parent: Option<usize>,
    kids: [usize; ARITY],
    /// Where each child's range ends (its subtree is `kid..end`).
    ends: [usize; ARITY],
    nkids: usize,
    /// Where this rank's range ends (its subtree is `me..end`).
    pub end: usize,
}

impl Node {
    /// The place of rank `me` (`me < n`): found by descending from the
    /// root's range, log_ARITY(n) steps.
    pub fn of(me: usize, n: usize) -> Node {
        debug_assert!(me < n);
        let (mut lo, mut hi, mut parent) = (0, n, None);
        loop {
            let kids = split(lo, hi);
            if me == lo {
                let mut node = Node {
                    parent,
                    kids: [0; ARITY],
                    ends: [0; ARITY],
                    nkids: 0,
                    end: hi,
                };
                for &(c, end) in kids.iter().flatten() {
                    node.kids[node.nkids] = c;
                    node.ends[node.nkids] = end;
                    node.nkids += 1;
                }
                return node;
            }
            let &(c, end) = kids
                .iter()
                .flatten()
                .find(|&&(c, end)| (c..end).contains(&me))
                .expect("every rank of a range lies in one part of it");
            (lo, hi, parent) = (c, end, Some(lo));
        }
    }

    /// The children, first rank first.
    pub fn kids(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        self.kids[..self.nkids].iter().copied()
    }

    /// The children with the number of ranks in each one's subtree.
    pub fn kid_spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.nkids).map(|i| (self.kids[i], self.ends[i] - self.kids[i]))
    }

    pub fn is_leaf(&self) -> bool {
        self.nkids == 0
    }
}

/// The tree of a rooted collective: ranks relative to the root, so that
/// the root is the tree's rank 0.
pub(crate) struct Rooted {
    n: usize,
    root: usize,
    /// This rank, relative to the root.
    pub rel: usize,
    /// This rank's place.
    pub node: Node,
}

impl Rooted {
    /// Rank `me`'s place in the tree of `n` ranks rooted at `root`.
    pub fn of(me: usize, n: usize, root: usize) -> Rooted {
        let rel = (me + n - root) % n;
        Rooted {
            n,
            root,
            rel,
            node: Node::of(rel, n),
        }
    }

    /// The communicator rank of relative rank `r`.
    #[inline]
    pub fn abs(&self, r: usize) -> usize {
        (r + self.root) % self.n
    }
}

/// The parts of range `lo..hi` below its first rank: (first rank, end),
/// as even as can be, the larger ones first.
fn split(lo: usize, hi: usize) -> [Option<(usize, usize)>; ARITY] {
    let rest = hi - lo - 1;
    let mut parts = [None; ARITY];
    let (base, extra) = (rest / ARITY, rest % ARITY);
    let mut at = lo + 1;
    for (i, p) in parts.iter_mut().enumerate() {
        let len = base + usize::from(i < extra);
        if len > 0 {
            *p = Some((at, at + len));
            at += len;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank but 0 has one parent, which lists it among its children;
    /// each rank's subtree is a contiguous range starting at it and its
    /// children's subtrees follow each other in rank order (so a fold in
    /// child order is a fold in rank order); the depth is logarithmic.
    #[test]
    fn ranges_cover_every_rank_once_in_order() {
        for n in [1usize, 2, 3, 5, 16, 17, 64, 127, 128, 192] {
            let nodes: Vec<Node> = (0..n).map(|r| Node::of(r, n)).collect();
            assert_eq!(nodes[0].parent, None);
            for (r, node) in nodes.iter().enumerate() {
                for c in node.kids() {
                    assert_eq!(nodes[c].parent, Some(r), "{n}: {c}'s parent");
                }
                if let Some(p) = node.parent {
                    assert!(nodes[p].kids().any(|c| c == r));
                }
            }
            fn span(nodes: &[Node], r: usize) -> (usize, usize) {
                let mut end = r + 1;
                for (c, k) in nodes[r].kid_spans() {
                    let (lo, hi) = span(nodes, c);
                    assert_eq!(lo, end, "children's ranges follow each other");
                    assert_eq!(hi - lo, k, "a child's span is its range");
                    end = hi;
                }
                assert_eq!(end, nodes[r].end, "{r}'s range");
                (r, end)
            }
            assert_eq!(span(&nodes, 0), (0, n));
            let depth = (0..n)
                .map(|mut r| {
                    let mut d = 0;
                    while let Some(p) = nodes[r].parent {
                        r = p;
                        d += 1;
                    }
                    d
                })
                .max()
                .unwrap();
            assert!(
                depth <= 1 + (n as f64).log(ARITY as f64).ceil() as usize,
                "{n}: {depth}"
            );
        }
    }
}
