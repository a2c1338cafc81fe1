//! The hang watchdog (`IBCOLL_HANG_TIMEOUT`): a blocking wait (a
//! collective, a collective's request, or a point-to-point receive, send,
//! probe or request wait) that has
//! waited longer than the timeout stops, says which ranks it waits for and
//! what each of them is doing, and fails with [`Error::Hang`] (or aborts
//! the job, `IBCOLL_HANG_ACTION=abort`).
//!
//! What a rank is doing travels through the process manager's key-value
//! store, and only once a watchdog fires: the waiter puts its own state
//! (`ibcoll-hang-<rank>`: the call it waits in and for whom), then reads
//! the keys of the ranks it waits for, for a bounded grace period. A rank
//! that also waits in ibcoll fires its own watchdog and says so; one that
//! never does is not waiting in ibcoll (it is in user code, or stuck
//! outside ibcoll). A state names the ranks its rank waits for, and the
//! report follows them (a chain of waits ends at the rank that is not in
//! ibcoll), up to 16 ranks. Nothing is published while no watchdog fires, so the
//! fast paths pay nothing, and it works the same for local and remote
//! peers.

use std::time::{Duration, Instant};

use ibcoll_shm::backoff::Backoff;

use super::ops::{OpKind, Token};
use super::Engine;
use crate::error::{Error, Op};

/// Longest time a fired watchdog waits for the states of the ranks it
/// waits for.
const GRACE: Duration = Duration::from_secs(2);

/// Ranks named in one report at most.
const REPORT_MAX: usize = 16;

fn key(rank: usize) -> String {
    format!("{}{rank}", ibcoll_launcher::server::HANG_KEY_PREFIX)
}

impl Engine {
    /// [`Engine::wait_with`] under the watchdog: `None` when `done` held,
    /// `Some(waited)` when the hang timeout passed first (then `done` may
    /// still be false). Without a timeout it is `wait_with`.
    pub fn wait_watched(
        &mut self,
        b: Backoff,
        mut done: impl FnMut(&Engine) -> bool,
    ) -> Option<Duration> {
        let Some(limit) = self.cfg.hang_timeout else {
            self.wait_with(b, done);
            return None;
        };
        let start = Instant::now();
        let mut fired = false;
        self.wait_with(b, |e| {
            if done(e) {
                return true;
            }
            fired = start.elapsed() >= limit;
            fired
        });
        fired.then(|| start.elapsed())
    }

    /// [`Engine::wait_until`] under the watchdog (see `wait_watched`).
    pub fn wait_until_watched(&mut self, done: impl FnMut(&Engine) -> bool) -> Option<Duration> {
        let b = Backoff::new(self.spins, self.yields);
        self.wait_watched(b, done)
    }

    /// Waits for point-to-point operation `tok` (a receive, a send, a
    /// request's wait) under the watchdog: `None` once it is done, or the
    /// [`Error::Hang`] of `op` naming the peer it waits for when the hang
    /// timeout passed first; the operation is then withdrawn where it can
    /// be (a receive nothing matched, a send not yet streaming: it goes on
    /// from a private copy), else waited for (its data is moving and ends in
    /// bounded time), so the caller's buffer is free either way.
    pub fn wait_op_watched(&mut self, tok: Token, op: Op) -> Option<Error> {
        let waited = self.wait_until_watched(|e| e.is_done(tok))?;
        let (what, peers) = match self.st.ops.get(tok).map(|o| &o.kind) {
            Some(OpKind::Recv {
                peer: Some(p), cap, ..
            }) => (
                format!("receive of up to {cap} bytes from rank {p}"),
                vec![*p],
            ),
            Some(OpKind::Recv { group, cap, .. }) => (
                format!("receive of up to {cap} bytes from any rank"),
                group.to_vec(),
            ),
            Some(OpKind::Send { peer, len, .. }) => {
                (format!("send of {len} bytes to rank {peer}"), vec![*peer])
            }
            None => return None,
        };
        let err = self.hang_error(op, &what, &peers, waited);
        if self.abandon(tok).is_none() {
            self.wait_until(|e| e.is_done(tok));
            let _ = self.take_result(tok);
        }
        Some(err)
    }

    /// The report of a wait in `op` (`what` describes the call) that has
    /// waited `waited` for `waiting_for` (world ranks): publishes this
    /// rank's state, gathers theirs, and returns the error (or aborts the
    /// job when `IBCOLL_HANG_ACTION=abort`).
    pub fn hang_error(
        &mut self,
        op: Op,
        what: &str,
        waiting_for: &[usize],
        waited: Duration,
    ) -> Error {
        let me = self.rank();
        let mut ranks: Vec<usize> = waiting_for.iter().copied().filter(|&r| r != me).collect();
        ranks.sort_unstable();
        ranks.dedup();
        // What this rank does, without the time (the launcher groups the
        // ranks that do the same), then with it.
        let doing = format!("waiting in {op} ({what}) for {}", list(&ranks));
        let mine = format!("{doing} for {:.1} s", waited.as_secs_f64());
        // The ranks to describe: those waited for, then (a rank that waits
        // in turn says for whom) the ones they wait for, up to REPORT_MAX.
        let mut shown: Vec<usize> = ranks.iter().copied().take(REPORT_MAX).collect();
        let mut states: Vec<Option<String>> = vec![None; shown.len()];
        if let Some(p) = self.pmi.as_mut() {
            if !self.hang_published {
                // One state per process: the first wait that fires. The
                // ranks it waits for and the seconds follow, after '|'s
                // (`ibcoll_launcher::server::HANG_KEY_PREFIX`).
                let v = format!(
                    "{}|{}|{:.1}",
                    wire_safe(&doing),
                    // At most REPORT_MAX, so the value stays within
                    // PMI's 1024 bytes (an any-source wait waits for all).
                    ranks
                        .iter()
                        .take(REPORT_MAX)
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    waited.as_secs_f64()
                );
                let _ = p.put_raw(&key(me), &v);
                self.hang_published = true;
            }
            let until = Instant::now() + GRACE.min(self.cfg.hang_timeout.unwrap_or(GRACE));
            loop {
                let mut i = 0;
                while i < shown.len() {
                    if states[i].is_none() {
                        states[i] = p.get_raw(&key(shown[i])).ok().flatten();
                        let next: Vec<usize> = states[i]
                            .as_deref()
                            .and_then(|v| v.split('|').nth(1))
                            .into_iter()
                            .flat_map(|l| l.split(','))
                            .filter_map(|r| r.parse().ok())
                            .collect();
                        for r in next {
                            if r != me && !shown.contains(&r) && shown.len() < REPORT_MAX {
                                shown.push(r);
                                states.push(None);
                            }
                        }
                    }
                    i += 1;
                }
                if states.iter().all(Option::is_some) || Instant::now() >= until {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let mut report = format!("rank {me} is {mine}");
        for (&r, s) in shown.iter().zip(&states) {
            match s {
                Some(v) => {
                    let mut parts = v.split('|');
                    let text = parts.next().unwrap_or("").replace('_', " ");
                    match parts.nth(1) {
                        Some(secs) => {
                            report.push_str(&format!("; rank {r} is {text} for {secs} s"))
                        }
                        None => report.push_str(&format!("; rank {r} is {text}")),
                    }
                }
                None => report.push_str(&format!(
                    "; rank {r} is not waiting in ibcoll (in user code, or stuck outside ibcoll)"
                )),
            }
        }
        if ranks.len() > REPORT_MAX {
            report.push_str(&format!("; and {} more", ranks.len() - REPORT_MAX));
        }
        // This rank's side of the channels it waits on, in its own error
        // only (the published state stays one short line per rank, which
        // the launcher groups).
        for &r in ranks.iter().take(REPORT_MAX) {
            if let Some(d) = self.peers.chan(r).and_then(|c| c.describe()) {
                report.push_str(&format!("; with rank {r}: {d}"));
            }
        }
        let err = Error::Hang {
            rank: me,
            op,
            waited_s: waited.as_secs(),
            waiting_for: ranks.into_boxed_slice(),
            report: report.into_boxed_str(),
        };
        if self.cfg.hang_abort {
            let msg = format!("ibcoll watchdog: {err}");
            match self.pmi.take() {
                // The launcher prints it (ibrun: with every rank's state,
                // grouped, instead of this rank's report).
                Some(mut p) => p.abort_quietly(70, &msg),
                None => eprintln!("{msg}"),
            }
            std::process::exit(70);
        }
        err
    }
}

/// Says, for the watchdogs of ranks that still wait for this one, that it
/// is finalizing (in the process manager's barrier, out of ibcoll's
/// calls).
pub(crate) fn publish_finalizing(p: &mut ibcoll_launcher::Pmi, rank: usize) {
    let _ = p.put_raw(&key(rank), "finalizing_(it_called_no_further_collective)");
}

/// `ranks 1, 2, 3`, or `rank 4`; past [`REPORT_MAX`] ranks, `and N more`.
fn list(r: &[usize]) -> String {
    match r {
        [one] => format!("rank {one}"),
        _ => {
            let mut s = r
                .iter()
                .take(REPORT_MAX)
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            if r.len() > REPORT_MAX {
                s.push_str(&format!(" and {} more", r.len() - REPORT_MAX));
            }
            format!("ranks {s}")
        }
    }
}

/// PMI values may not hold spaces or separators.
fn wire_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "()[],.:-+/".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}
