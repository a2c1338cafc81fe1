//! Barrier through the node's publication slots.
//!
//! Below `IBCOLL_SHM_TREE_MIN` members, flat: every rank publishes its
//! arrival and waits for everyone else's, one call of the sequence, n - 1
//! lines read per rank (n(n - 1) line transfers in all), which is the
//! shortest chain for a few ranks.
//!
//! From there on, a tree of `ARITY` children per rank (rank r's children
//! are r·k + 1 ..= r·k + k), in two calls of the sequence: in the first a
//! rank publishes once all its children have (so the root's publication
//! says everyone arrived), in the second the root publishes at once and
//! every other rank once its parent has. A rank reads at most k + 1 lines
//! per barrier and each line has at most k + 1 readers: (k + 1)·n
//! transfers, 2·log_k(n) publications deep. Each publication wakes only
//! the rank that waits for it.

use crate::error::Result;
use crate::fastpath::FastCall;

/// Children per rank in the tree.
const ARITY: usize = 4;

pub(crate) fn run(f: &mut FastCall) -> Result<()> {
    let n = f.size();
    if n < f.tree_min().max(2) {
        f.arrive()?;
        return f.wait_all();
    }
    let me = f.rank();
    let kids = children(me, n);
    let parent = (me > 0).then(|| (me - 1) / ARITY);
    for c in kids.clone() {
        f.wait_for(c)?;
    }
    f.arrive_waking(parent.into_iter())?;
    f.next_call();
    if let Some(p) = parent {
        f.wait_for(p)?;
    }
    f.arrive_waking(kids)
}

/// Rank `me`'s children in a tree of `n`.
fn children(me: usize, n: usize) -> std::ops::Range<usize> {
    (me * ARITY + 1).min(n)..(me * ARITY + ARITY + 1).min(n)
}

#[cfg(test)]
mod tests {
    use super::{children, ARITY};

    /// Every rank but the root has exactly one parent, which counts it
    /// among its children: the gather reaches the root from everyone.
    #[test]
    fn tree_covers_every_rank_once() {
        for n in [2usize, 3, 5, 16, 17, 64, 128, 192] {
            let mut seen = vec![0; n];
            for me in 0..n {
                for c in children(me, n) {
                    assert_eq!((c - 1) / ARITY, me);
                }
                for s in &mut seen[children(me, n)] {
                    *s += 1;
                }
            }
            assert_eq!(seen[0], 0);
            assert!(seen[1..].iter().all(|&s| s == 1), "{n}: {seen:?}");
        }
    }
}
