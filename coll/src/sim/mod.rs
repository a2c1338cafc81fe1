//! The schedule simulator: runs the schedules of any number of virtual
//! ranks in one process, with no transport, moving the bytes for real so
//! tests can check that the right data ends up in the right place.
//!
//! Semantics follow the engine's strictest case: a send completes only
//! when the matching receive has been posted (rendezvous), messages of a
//! pair match in FIFO order and must have equal lengths, and a round's
//! local steps run once all its messages completed. A state where no rank
//! can move is reported as a deadlock.
//!
//! It also estimates the time of the collective with an α-β-γ model: a
//! message costs `alpha + beta * bytes` from the later of its two posts, a
//! reduction `gamma * bytes`, and a rank starts its next round when the
//! slowest operation of the current one ends. The model has two levels:
//! messages between ranks of different nodes (`SimRank::node`) cost
//! `inter_alpha + inter_beta * bytes`. A rank sends one message at a
//! time (its next one starts when the last one's bytes are out), so a
//! message cut into segments costs what the whole one does, plus the
//! latencies it overlaps. There is no contention between ranks: ranks of
//! one node that send off the node at once each get the full link (a
//! first try that let a node's link carry one message at a time granted
//! it in the simulator's matching order rather than by time, and charged
//! multi-leader phases several times their real cost), which flatters
//! algorithms with many concurrent inter-node messages.
//!
//! [`simulate_model`] runs the same schedules without moving any bytes
//! (no buffers, no data checks), for the model's predictions at 16,384
//! ranks and more.

use std::collections::{HashMap, VecDeque};

use crate::algorithms::{Args, BuildFn};
use crate::ops::ByteReduce;
use crate::schedule::{learned_values, Buf, Schedule, Slice, Step};

/// One virtual rank: its schedule and buffers.
#[derive(Debug, Clone, Default)]
pub struct SimRank {
    pub sched: Schedule,
    pub send: Vec<u8>,
    pub recv: Vec<u8>,
    /// The rank's node (for the inter-node costs).
    pub node: usize,
    /// The algorithm and arguments that build the second phase of a
    /// two-phase schedule ([`Schedule::then`]), as the engine's run does.
    pub then: Option<(BuildFn, Args)>,
}

/// Costs of the α-β-γ model (seconds, seconds per byte).
#[derive(Debug, Clone, Copy)]
pub struct Model {
    /// Within a node.
    pub alpha: f64,
    pub beta: f64,
    pub gamma: f64,
    /// Between nodes.
    pub inter_alpha: f64,
    pub inter_beta: f64,
}

impl Default for Model {
    /// One level: every message costs the same.
    fn default() -> Model {
        Model {
            alpha: 1e-6,
            beta: 1e-10,
            gamma: 2.5e-10,
            inter_alpha: 1e-6,
            inter_beta: 1e-10,
        }
    }
}

impl Model {
    /// Two levels like a cluster node: shared memory inside (0.3 us,
    /// 10 GB/s), the network between nodes at 2 us and 2.5 GB/s (about what
    /// tcp between the simulated hosts of `../shared/hosts/` measures,
    /// ~7 us there, and a 25 Gb/s Ethernet NIC).
    pub fn cluster() -> Model {
        Model {
            alpha: 0.3e-6,
            beta: 1e-10,
            gamma: 2.5e-10,
            inter_alpha: 2e-6,
            inter_beta: 4e-10,
        }
    }
}

/// What a simulation measured.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub messages: usize,
    /// Messages between ranks of different nodes.
    pub inter_messages: usize,
    pub bytes: usize,
    pub max_rounds: usize,
    /// Predicted completion time of the slowest rank (model units).
    pub time: f64,
}

struct RankState {
    round: usize,
    posted: bool,
    pending: usize,
    scratch: Vec<Vec<u8>>,
    clock: f64,
    round_end: f64,
}

struct Msg {
    /// Empty without data (model only).
    data: Vec<u8>,
    len: usize,
    t: f64,
}

/// The shared pieces of one simulation.
struct World<'a> {
    model: Model,
    data: bool,
    nodes: &'a [usize],
    /// When each rank's last message has left it.
    out_free: Vec<f64>,
}

struct PostedRecv {
    slice: Slice,
    t: f64,
}

#[derive(Default)]
struct Pair {
    sends: VecDeque<Msg>,
    recvs: VecDeque<PostedRecv>,
}

fn buf<'a>(r: &'a mut SimRank, s: &'a mut RankState, b: Buf) -> &'a mut Vec<u8> {
    match b {
        Buf::Send => &mut r.send,
        Buf::Recv => &mut r.recv,
        Buf::Scratch(i) => &mut s.scratch[i as usize],
    }
}

fn bytes(r: &mut SimRank, s: &mut RankState, sl: &Slice) -> Vec<u8> {
    buf(r, s, sl.buf)[sl.off..sl.off + sl.len].to_vec()
}

/// Runs every rank's schedule to completion. `reduce` is the operation for
/// reducing schedules.
pub fn simulate(
    ranks: &mut [SimRank],
    reduce: Option<&ByteReduce>,
    model: Model,
) -> Result<Stats, String> {
    let n = ranks.len();
    for (i, r) in ranks.iter().enumerate() {
        r.sched
            .validate(i, n, r.send.len(), r.recv.len())
            .map_err(|e| format!("rank {i}: {e}"))?;
        if r.sched.reduces && reduce.is_none() {
            return Err(format!("rank {i}: reduces without an operation"));
        }
    }
    run(ranks, reduce, model, true)
}

/// Runs the schedules for the model's time only: no buffers (`send` and
/// `recv` may be empty), nothing copied or checked but the matching of
/// messages and their lengths.
pub fn simulate_model(ranks: &mut [SimRank], model: Model) -> Result<Stats, String> {
    run(ranks, None, model, false)
}

fn run(
    ranks: &mut [SimRank],
    reduce: Option<&ByteReduce>,
    model: Model,
    data: bool,
) -> Result<Stats, String> {
    let n = ranks.len();
    let nodes: Vec<usize> = ranks.iter().map(|r| r.node).collect();
    let mut w = World {
        model,
        data,
        nodes: &nodes,
        out_free: vec![0.0; n],
    };
    let mut st: Vec<RankState> = ranks
        .iter()
        .map(|r| RankState {
            round: 0,
            posted: false,
            pending: 0,
            // Garbage, not zeros: the engine's scratch comes from a pool
            // and holds whatever the previous collective left there.
            scratch: if data {
                r.sched.scratch.iter().map(|&l| vec![0xA5u8; l]).collect()
            } else {
                Vec::new()
            },
            clock: 0.0,
            round_end: 0.0,
        })
        .collect();
    let mut pairs: HashMap<(usize, usize), Pair> = HashMap::new();
    // Senders waiting for a match, per pair (FIFO).
    let mut stats = Stats::default();
    loop {
        let mut moved = false;
        let mut all_done = true;
        for i in 0..n {
            loop {
                if let Some(f) = ranks[i].sched.fault {
                    return Err(format!("rank {i}: learned counts disagree: {f:?}"));
                }
                let nrounds = ranks[i].sched.rounds.len();
                if st[i].round >= nrounds {
                    if let Some(t) = ranks[i].sched.then {
                        next_phase(&mut ranks[i], &mut st[i], t, w.data)
                            .map_err(|e| format!("rank {i}: {e}"))?;
                        moved = true;
                        continue;
                    }
                    break;
                }
                all_done = false;
                if !st[i].posted {
                    st[i].posted = true;
                    st[i].round_end = st[i].clock;
                    moved = true;
                    let round = ranks[i].sched.rounds[st[i].round].clone();
                    for s in &round {
                        match s {
                            Step::Send { peer, data } => {
                                let d = if w.data {
                                    bytes(&mut ranks[i], &mut st[i], data)
                                } else {
                                    Vec::new()
                                };
                                stats.messages += 1;
                                if w.nodes[i] != w.nodes[*peer] {
                                    stats.inter_messages += 1;
                                }
                                stats.bytes += data.len;
                                st[i].pending += 1;
                                pairs.entry((i, *peer)).or_default().sends.push_back(Msg {
                                    data: d,
                                    len: data.len,
                                    t: st[i].clock,
                                });
                                matchup(ranks, &mut st, &mut pairs, i, *peer, &mut w)?;
                            }
                            Step::Recv { peer, data } => {
                                st[i].pending += 1;
                                pairs
                                    .entry((*peer, i))
                                    .or_default()
                                    .recvs
                                    .push_back(PostedRecv {
                                        slice: *data,
                                        t: st[i].clock,
                                    });
                                matchup(ranks, &mut st, &mut pairs, *peer, i, &mut w)?;
                            }
                            _ => {}
                        }
                    }
                }
                if st[i].pending > 0 {
                    break;
                }
                // Round complete: local steps.
                let round = ranks[i].sched.rounds[st[i].round].clone();
                let mut t = st[i].round_end;
                for s in &round {
                    match s {
                        Step::Put { dst, bytes } if w.data => {
                            buf(&mut ranks[i], &mut st[i], dst.buf)[dst.off..dst.off + dst.len]
                                .copy_from_slice(bytes);
                        }
                        Step::Copy { .. } | Step::Reduce { .. } if !w.data => {
                            if let Step::Reduce { src, .. } = s {
                                t += model.gamma * src.len as f64;
                            }
                        }
                        Step::Copy { src, dst } => {
                            let d = bytes(&mut ranks[i], &mut st[i], src);
                            buf(&mut ranks[i], &mut st[i], dst.buf)[dst.off..dst.off + dst.len]
                                .copy_from_slice(&d);
                        }
                        Step::Reduce { src, dst, src_left } => {
                            let d = bytes(&mut ranks[i], &mut st[i], src);
                            let target = &mut buf(&mut ranks[i], &mut st[i], dst.buf)
                                [dst.off..dst.off + dst.len];
                            if let Some(f) = reduce {
                                f.apply(target, &d, *src_left);
                            }
                            t += model.gamma * d.len() as f64;
                        }
                        _ => {}
                    }
                }
                st[i].clock = t;
                st[i].round += 1;
                st[i].posted = false;
                moved = true;
            }
        }
        if all_done {
            break;
        }
        if !moved {
            let stuck: Vec<String> = (0..n)
                .filter(|&i| st[i].round < ranks[i].sched.rounds.len())
                .take(8)
                .map(|i| format!("rank {i} in round {}", st[i].round))
                .collect();
            return Err(format!("deadlock: {}", stuck.join(", ")));
        }
    }
    stats.max_rounds = ranks
        .iter()
        .map(|r| r.sched.rounds.len())
        .max()
        .unwrap_or(0);
    stats.time = st.iter().map(|s| s.clock).fold(0.0, f64::max);
    if let Some(((s, d), _)) = pairs
        .iter()
        .find(|(_, p)| !p.sends.is_empty() || !p.recvs.is_empty())
    {
        return Err(format!("unmatched messages from rank {s} to rank {d}"));
    }
    Ok(stats)
}

/// Replaces rank `r`'s finished first phase by its second, built from
/// what scratch `t` learned (see [`Schedule::then`]); as the engine's run.
fn next_phase(r: &mut SimRank, s: &mut RankState, t: u16, data: bool) -> Result<(), String> {
    if !data {
        return Err("a two-phase schedule needs its data (simulate, not simulate_model)".into());
    }
    let Some((build, mut args)) = r.then.take() else {
        return Err("a two-phase schedule without its builder".into());
    };
    let learned = s
        .scratch
        .get(t as usize)
        .ok_or("learns from a missing scratch")?;
    args.learned = Some(learned_values(learned));
    let sched = build(&args);
    sched
        .validate(args.rank, args.size, r.send.len(), r.recv.len())
        .map_err(|e| format!("second phase: {e}"))?;
    s.scratch = sched.scratch.iter().map(|&l| vec![0xA5u8; l]).collect();
    r.sched = sched;
    r.then = Some((build, args));
    s.round = 0;
    s.posted = false;
    Ok(())
}

fn matchup(
    ranks: &mut [SimRank],
    st: &mut [RankState],
    pairs: &mut HashMap<(usize, usize), Pair>,
    src: usize,
    dst: usize,
    w: &mut World<'_>,
) -> Result<(), String> {
    let Some(p) = pairs.get_mut(&(src, dst)) else {
        return Ok(());
    };
    while !p.sends.is_empty() && !p.recvs.is_empty() {
        let (Some(m), Some(r)) = (p.sends.pop_front(), p.recvs.pop_front()) else {
            break;
        };
        if m.len != r.slice.len {
            return Err(format!(
                "message from rank {src} to rank {dst}: {} bytes sent, {} expected",
                m.len, r.slice.len
            ));
        }
        if w.data {
            buf(&mut ranks[dst], &mut st[dst], r.slice.buf)[r.slice.off..r.slice.off + r.slice.len]
                .copy_from_slice(&m.data);
        }
        let t0 = m.t.max(r.t).max(w.out_free[src]);
        let (alpha, beta) = if w.nodes[src] == w.nodes[dst] {
            (w.model.alpha, w.model.beta)
        } else {
            (w.model.inter_alpha, w.model.inter_beta)
        };
        w.out_free[src] = t0 + beta * m.len as f64;
        let end = t0 + alpha + beta * m.len as f64;
        st[src].pending -= 1;
        st[dst].pending -= 1;
        st[src].round_end = st[src].round_end.max(end);
        st[dst].round_end = st[dst].round_end.max(end);
    }
    if p.sends.is_empty() && p.recvs.is_empty() {
        pairs.remove(&(src, dst));
    }
    Ok(())
}

pub mod mcast;
#[cfg(test)]
mod tests;
