//! Node-aware gatherv: every rank sends its block to its node's leader
//! (the root in the root's node, whose members send straight into the
//! root's receive buffer), each other leader sends its node's blocks
//! packed in one message straight to the root, and the root puts every
//! block at its displacement. One message per node crosses the network
//! instead of one per rank.
//!
//! Only the root knows the counts, so a leader learns its node's from the
//! root first (one message of `u64`s, a two-phase schedule, see
//! `Schedule::then`); a node of one rank needs none. With those counts
//! every message is sized by both ends from the same rank's view: a
//! member's block by its own length at the member and the root's count at
//! the leader, so a wrong length fails that pair; the leader packs its own
//! block at its own length, so the root, which expects its count, sees a
//! node message of the wrong size exactly when the leader's block is
//! wrong. Every disagreement fails the call (`Error::Mismatch`).
//!
//! The leaders send to the root directly rather than up a binomial tree
//! of nodes (as the uniform gather does): a leader inside the tree would
//! have to learn its whole subtree's counts before sizing its receives,
//! one more latency per tree level, while the root's k - 1 receives of
//! whole nodes cost less than that for the node counts ibcoll runs on.

use crate::algorithms::levels::Levels;
use crate::algorithms::{prefix, Args};
use crate::schedule::{learned_bytes, Buf, Builder, Fault, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, true);
    let mut b = Builder::new(a.esize);
    let mine = l.mine();
    let lead = l.lead[l.node];
    if !l.leads() {
        b.send(mine[lead], (Buf::Send, 0, a.count));
        return b.finish();
    }
    if a.rank == a.root {
        root(a, &l, &mut b);
        return b.finish();
    }
    if mine.len() == 1 {
        b.send(a.root, (Buf::Send, 0, a.count));
        return b.finish();
    }
    let Some(v) = &a.learned else {
        // First phase: the node's counts from the root.
        let t = b.scratch_bytes(8 * mine.len());
        b.recv_bytes(a.root, t, 0, 8 * mine.len());
        b.then(t);
        return b.finish();
    };
    if v.len() != mine.len() {
        // The root sees another node than this rank does (a placement
        // the ranks disagree on): fail rather than guess.
        b.fault(Fault {
            from: a.root,
            to: a.rank,
            sent: 8 * v.len() as u64,
            expected: 8 * mine.len() as u64,
        });
        return b.finish();
    }
    // The root's counts for the members, this rank's own length for itself.
    let counts: Vec<usize> = (0..mine.len())
        .map(|m| if m == lead { a.count } else { v[m] as usize })
        .collect();
    let off = prefix(&counts);
    let tmp = b.scratch(off[mine.len()]);
    for (m, &x) in mine.iter().enumerate() {
        if m != lead {
            b.recv(x, (tmp, off[m], counts[m]));
        }
    }
    b.copy((Buf::Send, 0, a.count), (tmp, off[lead], a.count));
    b.end_round();
    b.send(a.root, (tmp, 0, off[mine.len()]));
    b.finish()
}

/// The root: tells every other leader of a node of several ranks its
/// node's counts, receives its own node's blocks in place and every other
/// node's packed, then unpacks them.
fn root(a: &Args, l: &Levels, b: &mut Builder) {
    let leaders = l.leaders();
    let others: Vec<usize> = (0..l.groups.len()).filter(|&h| h != l.node).collect();
    let told: Vec<usize> = others
        .iter()
        .copied()
        .filter(|&h| l.groups[h].len() > 1)
        .collect();
    let nc: usize = told.iter().map(|&h| l.groups[h].len()).sum();
    let cs = b.scratch_bytes(8 * nc);
    let mut at = 0;
    let mut spans = Vec::with_capacity(told.len());
    for &h in &told {
        let bytes = learned_bytes(l.groups[h].iter().map(|&x| a.counts[x]));
        let len = bytes.len();
        b.put(cs, at, bytes);
        spans.push((h, at, len));
        at += len;
    }
    b.end_round();
    for &(h, o, len) in &spans {
        b.send_bytes(leaders[h], cs, o, len);
    }
    // Every other node's blocks, packed in member order, node after node.
    let sizes: Vec<usize> = others
        .iter()
        .map(|&h| l.groups[h].iter().map(|&x| a.counts[x]).sum())
        .collect();
    let base = prefix(&sizes);
    let tmp = b.scratch(base[others.len()]);
    for &x in l.mine() {
        if x != a.rank {
            b.recv(x, (Buf::Recv, a.displs[x], a.counts[x]));
        }
    }
    for (i, &h) in others.iter().enumerate() {
        b.recv(leaders[h], (tmp, base[i], sizes[i]));
    }
    if !a.in_place {
        b.copy(
            (Buf::Send, 0, a.count),
            (Buf::Recv, a.displs[a.rank], a.count),
        );
    }
    b.end_round();
    for (i, &h) in others.iter().enumerate() {
        let mut o = base[i];
        for &x in &l.groups[h] {
            b.copy((tmp, o, a.counts[x]), (Buf::Recv, a.displs[x], a.counts[x]));
            o += a.counts[x];
        }
    }
}
