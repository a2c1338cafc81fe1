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
//! slowest operation of the current one ends.

use std::collections::{HashMap, VecDeque};

use crate::ops::ByteReduce;
use crate::schedule::{Buf, Schedule, Slice, Step};

/// One virtual rank: its schedule and buffers.
#[derive(Debug, Clone, Default)]
pub struct SimRank {
    pub sched: Schedule,
    pub send: Vec<u8>,
    pub recv: Vec<u8>,
}

/// Costs of the α-β-γ model (seconds, seconds per byte).
#[derive(Debug, Clone, Copy)]
pub struct Model {
    pub alpha: f64,
    pub beta: f64,
    pub gamma: f64,
}

impl Default for Model {
    fn default() -> Model {
        Model {
            alpha: 1e-6,
            beta: 1e-10,
            gamma: 2.5e-10,
        }
    }
}

/// What a simulation measured.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub messages: usize,
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
    data: Vec<u8>,
    t: f64,
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
    let mut st: Vec<RankState> = ranks
        .iter()
        .map(|r| RankState {
            round: 0,
            posted: false,
            pending: 0,
            // Garbage, not zeros: the engine's scratch comes from a pool
            // and holds whatever the previous collective left there.
            scratch: r.sched.scratch.iter().map(|&l| vec![0xA5u8; l]).collect(),
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
                let nrounds = ranks[i].sched.rounds.len();
                if st[i].round >= nrounds {
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
                                let d = bytes(&mut ranks[i], &mut st[i], data);
                                stats.messages += 1;
                                stats.bytes += d.len();
                                st[i].pending += 1;
                                pairs.entry((i, *peer)).or_default().sends.push_back(Msg {
                                    data: d,
                                    t: st[i].clock,
                                });
                                matchup(ranks, &mut st, &mut pairs, i, *peer, model)?;
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
                                matchup(ranks, &mut st, &mut pairs, *peer, i, model)?;
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

fn matchup(
    ranks: &mut [SimRank],
    st: &mut [RankState],
    pairs: &mut HashMap<(usize, usize), Pair>,
    src: usize,
    dst: usize,
    model: Model,
) -> Result<(), String> {
    let Some(p) = pairs.get_mut(&(src, dst)) else {
        return Ok(());
    };
    while !p.sends.is_empty() && !p.recvs.is_empty() {
        let (Some(m), Some(r)) = (p.sends.pop_front(), p.recvs.pop_front()) else {
            break;
        };
        if m.data.len() != r.slice.len {
            return Err(format!(
                "message from rank {src} to rank {dst}: {} bytes sent, {} expected",
                m.data.len(),
                r.slice.len
            ));
        }
        buf(&mut ranks[dst], &mut st[dst], r.slice.buf)[r.slice.off..r.slice.off + r.slice.len]
            .copy_from_slice(&m.data);
        let end = m.t.max(r.t) + model.alpha + model.beta * m.data.len() as f64;
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

#[cfg(test)]
mod tests;
