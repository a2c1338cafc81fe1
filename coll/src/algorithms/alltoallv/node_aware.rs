//! Node-aware alltoallv (for small blocks, like the node-aware alltoall):
//! the ranks of a node exchange their blocks for each other directly;
//! every member hands its node's leader (lowest rank) its blocks for the
//! other nodes in one message, the leaders swap one bundle per pair of
//! nodes, and each leader hands every member, in one message, its blocks
//! from the other nodes. One message per pair of nodes crosses the network
//! instead of one per pair of ranks.
//!
//! A leader knows none of its members' counts, so the schedule has two
//! phases (see `Schedule::then`). In the first, every member sends its
//! leader its send and receive counts (`u64`s), and the leaders swap, per
//! pair of nodes, the matrix of send counts from one node's ranks to the
//! other's: a bundle carries its counts ahead of it. In the second, built
//! from what the leader learned, it compares every block count in the
//! matrices it received with the receive count its member gave for that
//! block, and fails the call (`Error::Mismatch`, told to every rank, naming
//! both ranks) where they differ; the bundles are then sized by those
//! counts on both sides, and a member's message to or from its leader by
//! its own counts on both sides. Blocks between ranks of one node travel
//! as direct messages, which the engine checks one by one. So a wrong
//! count is found however the lengths add up, never a wrong result.
//!
//! That costs a second round across the network (the matrices) before the
//! data: it pays where one message per pair of nodes saves more than that,
//! many ranks per node and small blocks.

use crate::algorithms::levels::Levels;
use crate::algorithms::{prefix, Args};
use crate::schedule::{learned_bytes, Buf, Builder, Fault, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, false);
    let n = a.size;
    let mut b = Builder::new(a.esize);
    let mine = l.mine().to_vec();
    let k = l.groups.len();
    let on_node: Vec<bool> = {
        let mut v = vec![false; n];
        for &x in &mine {
            v[x] = true;
        }
        v
    };
    let off_node: Vec<usize> = (0..n).filter(|&x| !on_node[x]).collect();
    if !l.leads() {
        member(a, &mut b, &mine, &off_node);
        return b.finish();
    }
    if k == 1 {
        // One node: only the direct exchange.
        direct(a, &mut b, &mine);
        return b.finish();
    }
    match &a.learned {
        None => first_phase(a, &l, &mut b),
        Some(v) => second_phase(a, &l, &mut b, v, &off_node),
    }
    b.finish()
}

/// The blocks between this rank and the other ranks of its node, one
/// message each way per pair, and its own block.
fn direct(a: &Args, b: &mut Builder, mine: &[usize]) {
    let r = a.rank;
    for &x in mine {
        if x != r {
            b.send(x, (Buf::Send, a.displs[x], a.counts[x]));
            b.recv(x, (Buf::Recv, a.rdispls[x], a.rcounts[x]));
        }
    }
    b.copy(
        (Buf::Send, a.displs[r], a.counts[r]),
        (Buf::Recv, a.rdispls[r], a.rcounts[r]),
    );
}

/// A member: its counts and then its blocks for other nodes (by
/// destination rank) to its leader, the direct exchange, then its blocks
/// from other nodes (by source rank) from the leader.
fn member(a: &Args, b: &mut Builder, mine: &[usize], off_node: &[usize]) {
    let n = a.size;
    let lead = mine[0];
    let one_node = off_node.is_empty();
    let cs = b.scratch_bytes(16 * n);
    let out_len: usize = off_node.iter().map(|&d| a.counts[d]).sum();
    let out = b.scratch(out_len);
    if !one_node {
        b.put(
            cs,
            0,
            learned_bytes(a.counts.iter().chain(&a.rcounts).copied()),
        );
        let mut o = 0;
        for &d in off_node {
            b.copy((Buf::Send, a.displs[d], a.counts[d]), (out, o, a.counts[d]));
            o += a.counts[d];
        }
        b.end_round();
        b.send_bytes(lead, cs, 0, 16 * n);
        b.send(lead, (out, 0, out_len));
    }
    direct(a, b, mine);
    b.end_round();
    if one_node {
        return;
    }
    let in_len: usize = off_node.iter().map(|&s| a.rcounts[s]).sum();
    let inb = b.scratch(in_len);
    b.recv(lead, (inb, 0, in_len));
    b.end_round();
    let mut o = 0;
    for &s in off_node {
        b.copy(
            (inb, o, a.rcounts[s]),
            (Buf::Recv, a.rdispls[s], a.rcounts[s]),
        );
        o += a.rcounts[s];
    }
}

/// The other nodes (indices in `Levels::groups`) and where each one's
/// matrix lies, in `u64`s, in a buffer of all of them (`per(h)` each).
fn layout(l: &Levels, per: impl Fn(usize) -> usize) -> (Vec<usize>, Vec<usize>) {
    let others: Vec<usize> = (0..l.groups.len()).filter(|&h| h != l.node).collect();
    let sizes: Vec<usize> = others.iter().map(|&h| per(h)).collect();
    (others, prefix(&sizes))
}

/// A leader's first phase: its members' counts, then the send-count
/// matrices with every other leader (rows: source ranks, in node order;
/// columns: destination ranks).
fn first_phase(a: &Args, l: &Levels, b: &mut Builder) {
    let n = a.size;
    let mine = l.mine();
    let lm = mine.len();
    let leaders = l.leaders();
    // Learned: the members' (send, receive) counts, 2n each, then the
    // matrix from every other node h (|h| x lm).
    let (others, inb) = layout(l, |h| l.groups[h].len() * lm);
    let mc = (lm - 1) * 2 * n;
    let learn = b.scratch_bytes(8 * (mc + inb[others.len()]));
    // Sent: this node's matrix for every other node h (lm x |h|).
    let (_, outb) = layout(l, |h| lm * l.groups[h].len());
    let mo = b.scratch_bytes(8 * outb[others.len()]);
    for (i, &h) in others.iter().enumerate() {
        let row = learned_bytes(l.groups[h].iter().map(|&d| a.counts[d]));
        b.put(mo, 8 * outb[i], row);
    }
    b.end_round();
    for (m, &x) in mine.iter().enumerate().skip(1) {
        b.recv_bytes(x, learn, 8 * (m - 1) * 2 * n, 16 * n);
    }
    for (i, &h) in others.iter().enumerate() {
        let g = &l.groups[h];
        for m in 1..lm {
            // Runs of consecutive destination ranks in one copy.
            let mut j = 0;
            while j < g.len() {
                let mut e = j + 1;
                while e < g.len() && g[e] == g[e - 1] + 1 {
                    e += 1;
                }
                b.copy_bytes(
                    (learn, 8 * ((m - 1) * 2 * n + g[j])),
                    (mo, 8 * (outb[i] + m * g.len() + j)),
                    8 * (e - j),
                );
                j = e;
            }
        }
    }
    b.end_round();
    for (i, &h) in others.iter().enumerate() {
        let len = lm * l.groups[h].len();
        b.send_bytes(leaders[h], mo, 8 * outb[i], 8 * len);
        b.recv_bytes(leaders[h], learn, 8 * (mc + inb[i]), 8 * len);
    }
    b.then(learn);
}

/// A leader's second phase, from what the first learned (`v`).
fn second_phase(a: &Args, l: &Levels, b: &mut Builder, v: &[u64], off_node: &[usize]) {
    let n = a.size;
    let es = a.esize as u64;
    let mine = l.mine();
    let lm = mine.len();
    let leaders = l.leaders();
    let (others, inb) = layout(l, |h| l.groups[h].len() * lm);
    let mc = (lm - 1) * 2 * n;
    if v.len() != mc + inb[others.len()] {
        // Another leader sees other nodes than this one (a placement the
        // ranks disagree on): fail rather than guess.
        b.fault(Fault {
            from: leaders[others.first().copied().unwrap_or(l.node)],
            to: a.rank,
            sent: 8 * v.len() as u64,
            expected: 8 * (mc + inb[others.len()]) as u64,
        });
        return;
    }
    // Member m's count to / from rank x.
    let sc = |m: usize, x: usize| {
        if m == 0 {
            a.counts[x]
        } else {
            v[(m - 1) * 2 * n + x] as usize
        }
    };
    let rc = |m: usize, x: usize| {
        if m == 0 {
            a.rcounts[x]
        } else {
            v[(m - 1) * 2 * n + n + x] as usize
        }
    };
    // Elements from rank j-th of node others[i] to member m.
    let inc = |i: usize, j: usize, m: usize| v[mc + inb[i] + j * lm + m] as usize;
    for (i, &h) in others.iter().enumerate() {
        for (j, &s) in l.groups[h].iter().enumerate() {
            for (m, &x) in mine.iter().enumerate() {
                if inc(i, j, m) != rc(m, s) {
                    b.fault(Fault {
                        from: s,
                        to: x,
                        sent: inc(i, j, m) as u64 * es,
                        expected: rc(m, s) as u64 * es,
                    });
                    return;
                }
            }
        }
    }
    // Every member's blocks for other nodes, by destination rank.
    let offs: Vec<Vec<usize>> = (0..lm)
        .map(|m| prefix(&off_node.iter().map(|&d| sc(m, d)).collect::<Vec<_>>()))
        .collect();
    let pos: Vec<usize> = {
        let mut p = vec![0; n];
        for (i, &d) in off_node.iter().enumerate() {
            p[d] = i;
        }
        p
    };
    let got: Vec<Buf> = (0..lm)
        .map(|m| b.scratch(if m == 0 { 0 } else { offs[m][off_node.len()] }))
        .collect();
    for (m, &x) in mine.iter().enumerate().skip(1) {
        b.recv(x, (got[m], 0, offs[m][off_node.len()]));
    }
    direct(a, b, mine);
    // The bundle for every other node: member-major, destinations inner.
    let out_sizes: Vec<usize> = others
        .iter()
        .map(|&h| {
            (0..lm)
                .map(|m| l.groups[h].iter().map(|&d| sc(m, d)).sum::<usize>())
                .sum()
        })
        .collect();
    let outs: Vec<Buf> = out_sizes.iter().map(|&s| b.scratch(s)).collect();
    for (i, &h) in others.iter().enumerate() {
        let mut o = 0;
        for m in 0..lm {
            for &d in &l.groups[h] {
                let c = sc(m, d);
                let src = if m == 0 {
                    (Buf::Send, a.displs[d], c)
                } else {
                    (got[m], offs[m][pos[d]], c)
                };
                b.copy(src, (outs[i], o, c));
                o += c;
            }
        }
    }
    b.end_round();
    // The bundles from every other node: source-major, members inner.
    let in_sizes: Vec<usize> = (0..others.len())
        .map(|i| {
            (0..l.groups[others[i]].len())
                .map(|j| (0..lm).map(|m| inc(i, j, m)).sum::<usize>())
                .sum()
        })
        .collect();
    let ins: Vec<Buf> = in_sizes.iter().map(|&s| b.scratch(s)).collect();
    for (i, &h) in others.iter().enumerate() {
        b.send(leaders[h], (outs[i], 0, out_sizes[i]));
        b.recv(leaders[h], (ins[i], 0, in_sizes[i]));
    }
    // Where the block from off-node rank s to member m lies.
    let mut at = vec![(0usize, 0usize); n * lm];
    for (i, &h) in others.iter().enumerate() {
        let mut o = 0;
        for (j, &s) in l.groups[h].iter().enumerate() {
            for m in 0..lm {
                at[s * lm + m] = (i, o);
                o += inc(i, j, m);
            }
        }
    }
    // Every member's blocks from other nodes, by source rank (the
    // leader's own straight into its receive buffer).
    let dels: Vec<Buf> = (0..lm)
        .map(|m| {
            let len = if m == 0 {
                0
            } else {
                off_node.iter().map(|&s| rc(m, s)).sum()
            };
            b.scratch(len)
        })
        .collect();
    for m in 0..lm {
        let mut o = 0;
        for &s in off_node {
            let (i, p) = at[s * lm + m];
            let c = rc(m, s);
            if m == 0 {
                b.copy((ins[i], p, c), (Buf::Recv, a.rdispls[s], c));
            } else {
                b.copy((ins[i], p, c), (dels[m], o, c));
            }
            o += c;
        }
    }
    b.end_round();
    for (m, &x) in mine.iter().enumerate().skip(1) {
        let len: usize = off_node.iter().map(|&s| rc(m, s)).sum();
        b.send(x, (dels[m], 0, len));
    }
}
