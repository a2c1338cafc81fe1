//! Binomial-tree reduce: each rank receives its children's partial results
//! (all at once), combines them in rank order and sends the result to its
//! parent; log2(n) rounds (one more for a root other than rank 0), the
//! whole vector per message.

use crate::algorithms::{tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, El, Schedule};

pub fn build(a: &Args) -> Schedule {
    let mut b = Builder::new(a.esize);
    let g: Vec<usize> = (0..a.size).collect();
    tree(
        &mut b,
        &g,
        a.rank,
        a.root,
        (a.input(), 0, a.count),
        (Buf::Recv, 0, a.count),
    );
    b.finish()
}

/// Reduce of `inp` over the members `g` to `g[root]`, whose result goes to
/// `out` (only used there), combining the inputs in member order (the
/// lower members' partial result always the left operand), as a
/// non-commutative operation needs. For root 0 one binomial tree; for
/// another root, one over the members below it (topped by member 0) and
/// one over those above it (topped by `root + 1`), whose two results the
/// root combines around its own input: a tree rotated to the root, as a
/// plain binomial reduce has it, would combine `x_root op x_(root+1) op
/// ... op x_0 ...`.
pub(crate) fn tree(b: &mut Builder, g: &[usize], me: usize, root: usize, inp: El, out: El) {
    let n = g.len();
    let count = inp.2;
    if root == 0 {
        return from_first(b, g, me, inp, out);
    }
    if me == root {
        b.copy(inp, out);
        b.end_round();
        let left = (b.scratch(count), 0, count);
        b.recv(g[0], left);
        let right = (root + 1 < n).then(|| (b.scratch(count), 0, count));
        if let Some(t) = right {
            b.recv(g[root + 1], t);
        }
        b.reduce(left, out, true);
        if let Some(t) = right {
            b.reduce(t, out, false);
        }
        b.end_round();
        return;
    }
    let (part, at) = if me < root {
        (&g[..root], me)
    } else {
        (&g[root + 1..], me - root - 1)
    };
    let top = (b.scratch(count), 0, count);
    from_first(b, part, at, inp, top);
    if at == 0 {
        b.send(g[root], top);
        b.end_round();
    }
}

/// [`tree`] rooted at member 0 of `g`: a rank's partial result covers a
/// contiguous range of members, itself first.
fn from_first(b: &mut Builder, g: &[usize], me: usize, inp: El, out: El) {
    let n = g.len();
    let count = inp.2;
    let acc = if me == 0 {
        out
    } else {
        (b.scratch(count), 0, count)
    };
    b.copy(inp, acc);
    b.end_round();
    let kids = tree_children(me, n);
    let tmps: Vec<El> = kids.iter().map(|_| (b.scratch(count), 0, count)).collect();
    for (c, t) in kids.iter().zip(&tmps) {
        b.recv(g[*c], *t);
    }
    for t in &tmps {
        b.reduce(*t, acc, false);
    }
    b.end_round();
    if let Some(p) = tree_parent(me) {
        b.send(g[p], acc);
        b.end_round();
    }
}
