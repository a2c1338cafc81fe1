//! Node-aware scatterv, the mirror of the node-aware gatherv: the root
//! packs every other node's blocks in member order and sends them in one
//! message straight to the node's leader, which hands each member its
//! block (the root's node gets its blocks straight from the root's send
//! buffer). One message per node crosses the network instead of one per
//! rank.
//!
//! Only the root knows the counts, so it sends a leader of a node of
//! several ranks the node's counts (`u64`s) before the data; the leader
//! learns them in a first phase (a two-phase schedule, see
//! `Schedule::then`) and sizes its receive and its members' messages by
//! them. A member receives its own length, so a wrong member count fails
//! that message; the leader compares its own count with the root's and
//! fails the call when they differ (`Error::Mismatch`, told to every rank).
//!
//! Direct rather than down a binomial tree of nodes, for the reason the
//! gatherv gives: inner leaders would need their subtrees' counts first.

use crate::algorithms::levels::Levels;
use crate::algorithms::{prefix, Args};
use crate::schedule::{learned_bytes, Buf, Builder, Fault, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, true);
    let mut b = Builder::new(a.esize);
    let mine = l.mine();
    let lead = l.lead[l.node];
    if !l.leads() {
        b.recv(mine[lead], (Buf::Recv, 0, a.count));
        return b.finish();
    }
    if a.rank == a.root {
        root(a, &l, &mut b);
        return b.finish();
    }
    if mine.len() == 1 {
        b.recv(a.root, (Buf::Recv, 0, a.count));
        return b.finish();
    }
    let Some(v) = &a.learned else {
        // First phase: the node's counts from the root.
        let t = b.scratch_bytes(8 * mine.len());
        b.recv_bytes(a.root, t, 0, 8 * mine.len());
        b.then(t);
        return b.finish();
    };
    let es = a.esize as u64;
    if v.len() != mine.len() || v[lead] != a.count as u64 {
        let (sent, expected) = match v.get(lead) {
            Some(&c) if v.len() == mine.len() => (c * es, a.count as u64 * es),
            // The root sees another node than this rank does.
            _ => (8 * v.len() as u64, 8 * mine.len() as u64),
        };
        b.fault(Fault {
            from: a.root,
            to: a.rank,
            sent,
            expected,
        });
        return b.finish();
    }
    let counts: Vec<usize> = v.iter().map(|&c| c as usize).collect();
    let off = prefix(&counts);
    let tmp = b.scratch(off[mine.len()]);
    b.recv(a.root, (tmp, 0, off[mine.len()]));
    b.end_round();
    for (m, &x) in mine.iter().enumerate() {
        if m != lead {
            b.send(x, (tmp, off[m], counts[m]));
        }
    }
    b.copy((tmp, off[lead], a.count), (Buf::Recv, 0, a.count));
    b.finish()
}

/// The root: packs every other node's blocks (a node of one rank gets its
/// block straight from the send buffer), sends each leader of a node of
/// several ranks its counts and then its blocks, and its own node's
/// members theirs.
fn root(a: &Args, l: &Levels, b: &mut Builder) {
    let leaders = l.leaders();
    let others: Vec<usize> = (0..l.groups.len())
        .filter(|&h| h != l.node && l.groups[h].len() > 1)
        .collect();
    let nc: usize = others.iter().map(|&h| l.groups[h].len()).sum();
    let cs = b.scratch_bytes(8 * nc);
    let sizes: Vec<usize> = others
        .iter()
        .map(|&h| l.groups[h].iter().map(|&x| a.counts[x]).sum())
        .collect();
    let base = prefix(&sizes);
    let tmp = b.scratch(base[others.len()]);
    let mut at = 0;
    let mut spans = Vec::with_capacity(others.len());
    for (i, &h) in others.iter().enumerate() {
        let bytes = learned_bytes(l.groups[h].iter().map(|&x| a.counts[x]));
        let len = bytes.len();
        b.put(cs, at, bytes);
        spans.push((at, len));
        at += len;
        let mut o = base[i];
        for &x in &l.groups[h] {
            b.copy((Buf::Send, a.displs[x], a.counts[x]), (tmp, o, a.counts[x]));
            o += a.counts[x];
        }
    }
    b.end_round();
    for (i, &h) in others.iter().enumerate() {
        let (o, len) = spans[i];
        b.send_bytes(leaders[h], cs, o, len);
        b.send(leaders[h], (tmp, base[i], sizes[i]));
    }
    for (h, g) in l.groups.iter().enumerate() {
        if h != l.node && g.len() == 1 {
            b.send(g[0], (Buf::Send, a.displs[g[0]], a.counts[g[0]]));
        }
    }
    for &x in l.mine() {
        if x != a.rank {
            b.send(x, (Buf::Send, a.displs[x], a.counts[x]));
        }
    }
    if !a.in_place {
        b.copy(
            (Buf::Send, a.displs[a.rank], a.count),
            (Buf::Recv, 0, a.count),
        );
    }
}
