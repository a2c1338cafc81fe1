//! Runs a [`Schedule`] on the point-to-point engine.
//!
//! A [`Run`] holds the schedule, raw views of the user's buffers (kept
//! borrowed by the caller: the blocking call's frame or a
//! [`CollRequest`](crate::CollRequest)'s lifetime), its scratch buffers and
//! the reduction kernel. `step` posts the current round's messages, and once
//! they all completed carries out the round's local steps and moves on.
//!
//! Nonblocking collectives register their run in a per-thread list that
//! [`progress_hook`] (called by the engine's progress loop) steps, so every
//! collective in flight advances whatever the caller waits on.
//!
//! Scratch buffers come from a per-thread pool and go back to it when the
//! run is done: a fresh `vec![0u8; n]` per call costs, from glibc's mmap
//! threshold (128 KiB) on, a page fault per 4 KiB page on first touch and
//! an munmap per call, which made large scans and reduce-scatters several
//! times slower than the transfers themselves. Pooled buffers are not
//! zeroed (the simulator fills scratch with garbage so a schedule that
//! reads scratch before writing it fails its tests) and are 64-byte
//! aligned so the reduction kernels never straddle cache lines more than
//! the user's buffers make them.
//!
//! On a failure (a lost peer, a length mismatch) the round is abandoned:
//! unmatched receives are withdrawn, unfinished sends keep going from a
//! private copy of their data, and transfers already moving data are
//! waited for (they end or fail in bounded time), so the user's buffers are
//! free once the collective returns its error.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Buf, Fault, Schedule, Slice, Step};
use crate::algorithms::{Args, BuildFn};
use crate::engine::notice::{Conflict, Notice, NOTICE_MASK};
use crate::engine::ops::{Op as EngOp, OpKind, Token};
use crate::engine::{Engine, Posted2};
use crate::error::{Disagreement, Error, Op, Result, CALL_EARLIER, CALL_UNKNOWN};
use crate::ops::ByteReduce;

/// One rank's execution of one schedule.
pub(crate) struct Run {
    sched: Rc<Schedule>,
    round: usize,
    posted: bool,
    /// Local steps of the current round already done at posting.
    early: usize,
    pending: Vec<Token>,
    aborting: bool,
    send: *const u8,
    recv: *mut u8,
    send_len: usize,
    recv_len: usize,
    scratch: Vec<Vec<Line>>,
    /// The algorithm and its arguments, for the second phase of a
    /// two-phase schedule ([`Schedule::then`]).
    then: Option<(BuildFn, Args)>,
    reduce: Option<ByteReduce>,
    ctx: u32,
    tag: i32,
    me: u32,
    group: Rc<[usize]>,
    op: Op,
    err: Option<Error>,
    done: bool,
    /// Any-source receive that nobody sends to: the engine fails it when
    /// any member of the communicator dies, so every survivor's run ends
    /// with `PeerLost`, not only those talking to the dead rank.
    sentinel: Option<Token>,
    sentinel_posted: bool,
    /// A reduction operation's panic, for whoever waits for the run.
    panic: Option<Box<dyn std::any::Any + Send>>,
    /// Memory the run reads that nobody else owns (the input copy of an
    /// in-place nonblocking alltoall): freed with the run, after it is done.
    keep: Option<Box<dyn std::any::Any>>,
    /// The engine's notice count when the run last looked for notices
    /// (see `engine::notice`): only a change makes it search.
    notices_seen: u64,
    /// Whom a disagreement this run ends with is to be told (see
    /// [`Run::tell_now`]); `Tell::Nobody` once told.
    tell: Tell,
    /// The call's stamp ([`Wire::stamp`]).
    stamp: u32,
}

/// Whom a run that fails with [`Error::Mismatch`] notifies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tell {
    /// Every other member: this rank found the disagreement (or a notice
    /// of an earlier call made this call fail here).
    All,
    /// The run's schedule peers but `from` (a communicator rank): a notice
    /// from `from` told this rank; the peers may wait for this rank's
    /// messages and see it leave (a lost peer) before `from`'s notice.
    Relay(u32),
    Nobody,
}

/// Where a notice's call lies relative to a run's (tags of one
/// communicator, a 29-bit sequence above `TAG_BASE`: compared modulo).
#[derive(PartialEq, Eq)]
enum When {
    Same,
    Earlier,
    Later,
}

fn when(notice: i32, mine: i32) -> When {
    const SEQ: i32 = 1 << 29;
    let d = (notice - mine).rem_euclid(SEQ);
    if d == 0 {
        When::Same
    } else if d < SEQ / 2 {
        When::Later
    } else {
        When::Earlier
    }
}

/// A [`Conflict`] the engine found (a message of a call of this process
/// with another stamp) as the notice this process would have got had the
/// sender found it: the two ranks and what differs.
#[cold]
#[inline(never)]
fn conflict_notice(e: &Engine, c: &Conflict) -> Notice {
    let op = crate::stamp::collective_of(c.mine).map_or(Op::Wait, Op::Collective);
    let values = crate::stamp::disagreement(c.got, c.mine).unwrap_or_default();
    let err = Error::Mismatch {
        rank: e.rank(),
        op,
        call: CALL_UNKNOWN,
        a: c.peer,
        b: e.rank(),
        values: Box::new(values),
    };
    Notice {
        src: c.src,
        tag: c.tag & NOTICE_MASK,
        payload: encode_notice(false, &err).unwrap_or_default(),
    }
}

/// Takes the first notice on `ctx` about the call with tag `mine` (when
/// `same`) or an earlier one this process did not fail already (those it
/// did are dropped), the engine's conflicts first; whether it is about
/// `mine`, and whether this process found it (a conflict).
fn next_notice(
    e: &mut Engine,
    ctx: u32,
    mine: Option<i32>,
    same: bool,
) -> Option<(Notice, bool, bool)> {
    if !e.st.conflicts.is_empty() {
        if let Some(x) = next_conflict(e, ctx, mine, same) {
            return Some(x);
        }
    }
    let Some(mine) = mine else {
        // Any call: a wait that knows none.
        while let Some(n) = e.take_notice(ctx, |_| true) {
            if !e.st.failed_op(ctx, n.tag) {
                e.st.note_failed_op(ctx, n.tag);
                return Some((n, false, false));
            }
        }
        return None;
    };
    let want = |t: i32| match when(t, mine) {
        When::Same => same,
        When::Earlier => true,
        When::Later => false,
    };
    while let Some(n) = e.take_notice(ctx, want) {
        if n.tag == mine {
            return Some((n, true, false));
        }
        if !e.st.failed_op(ctx, n.tag) {
            e.st.note_failed_op(ctx, n.tag);
            return Some((n, false, false));
        }
    }
    None
}

/// [`next_notice`] among the engine's conflicts.
#[cold]
#[inline(never)]
fn next_conflict(
    e: &mut Engine,
    ctx: u32,
    mine: Option<i32>,
    same: bool,
) -> Option<(Notice, bool, bool)> {
    let want = |t: i32| match mine {
        None => true,
        Some(m) => match when(t, m) {
            When::Same => same,
            When::Earlier => true,
            When::Later => false,
        },
    };
    while let Some(c) = e.st.take_conflict(ctx, want) {
        let n = conflict_notice(e, &c);
        if Some(n.tag) == mine {
            return Some((n, true, true));
        }
        if !e.st.failed_op(ctx, n.tag) {
            e.st.note_failed_op(ctx, n.tag);
            return Some((n, false, true));
        }
    }
    None
}

/// The error of communicator rank `me` of `group` in collective `op` for
/// notice `n` (`same`: about this call; else about an earlier one, which
/// this call fails for).
fn notice_error(n: &Notice, same: bool, group: &[usize], me: usize, op: Op) -> Error {
    let me = group[me];
    let from = group.get(n.src as usize).copied().unwrap_or(n.src as usize);
    let (earlier, a, b, name, mut values) = decode_notice(&n.payload).unwrap_or_else(|| {
        (
            false,
            from,
            me,
            op.to_string(),
            Disagreement {
                what: String::new(),
                a_value: "found that the ranks of a call disagree".into(),
                b_value: "cannot complete it without it".into(),
            },
        )
    });
    if !same && !earlier {
        values.b_value = format!("{} (in that {name})", values.b_value);
    }
    Error::Mismatch {
        rank: me,
        op,
        call: if earlier || !same {
            CALL_EARLIER
        } else {
            CALL_UNKNOWN
        },
        a,
        b,
        values: Box::new(values),
    }
}

/// The error a collective `op` of communicator rank `me` of `group` fails
/// with before it starts, when a notice says an earlier call on `ctx` (the
/// collective context; `next` is the tag the next schedule would get,
/// `None` for any call) failed elsewhere and this rank completed it (used
/// where no schedule runs: the shared-memory fast path).
#[cold]
#[inline(never)]
pub(crate) fn earlier_notice(
    e: &mut Engine,
    ctx: u32,
    next: Option<i32>,
    group: &[usize],
    me: usize,
    op: Op,
) -> Option<Error> {
    let (n, _, here) = next_notice(e, ctx, next.map(|t| t & NOTICE_MASK), false)?;
    if here {
        tell_all(e, ctx, me, group, &n);
    }
    Some(notice_error(&n, false, group, me, op))
}

/// Sends notice `n` (about its call) from communicator rank `me` of
/// `group` to every other member: a conflict this process found, so that
/// the members still in that call fail it and those past it fail their
/// next call, as when the finder is the receiver of a wrong message.
#[cold]
#[inline(never)]
fn tell_all(e: &mut Engine, ctx: u32, me: usize, group: &[usize], n: &Notice) {
    for (r, &w) in group.iter().enumerate() {
        if r != me {
            e.send_notice(w, ctx, me as u32, n.tag, &n.payload);
        }
    }
}

/// A notice's payload: whether the sender's disagreement was in an earlier
/// call (1) or this one (0), the two world ranks, then the collective's
/// name and the [`Disagreement`]'s three texts, each a little-endian u16
/// length and the bytes.
fn encode_notice(earlier: bool, err: &Error) -> Option<Vec<u8>> {
    let Error::Mismatch {
        op, a, b, values, ..
    } = err
    else {
        return None;
    };
    let mut v = Vec::with_capacity(64);
    v.push(u8::from(earlier));
    v.extend_from_slice(&(*a as u64).to_le_bytes());
    v.extend_from_slice(&(*b as u64).to_le_bytes());
    let name = op.to_string();
    for t in [&name, &values.what, &values.a_value, &values.b_value] {
        let t = &t.as_bytes()[..t.len().min(512)];
        v.extend_from_slice(&(t.len() as u16).to_le_bytes());
        v.extend_from_slice(t);
    }
    Some(v)
}

/// What [`encode_notice`] wrote: (earlier, a, b, the collective's name,
/// the disagreement); `None` for a payload it did not write.
fn decode_notice(p: &[u8]) -> Option<(bool, usize, usize, String, Disagreement)> {
    let earlier = *p.first()? != 0;
    let word = |i: usize| -> Option<usize> {
        Some(u64::from_le_bytes(p.get(i..i + 8)?.try_into().ok()?) as usize)
    };
    let (a, b) = (word(1)?, word(9)?);
    let mut at = 17;
    let mut text = || -> Option<String> {
        let n = u16::from_le_bytes(p.get(at..at + 2)?.try_into().ok()?) as usize;
        let t = String::from_utf8_lossy(p.get(at + 2..at + 2 + n)?).into_owned();
        at += 2 + n;
        Some(t)
    };
    let name = text()?;
    let what = text()?;
    let a_value = text()?;
    let b_value = text()?;
    Some((
        earlier,
        a,
        b,
        name,
        Disagreement {
            what,
            a_value,
            b_value,
        },
    ))
}

/// Bit that turns a collective's tag into its (never sent) sentinel tag.
const SENTINEL_BIT: i32 = 1 << 30;

/// Where a run talks: context, tag, this rank, the group's world ranks.
pub(crate) struct Wire {
    pub ctx: u32,
    pub tag: i32,
    pub me: usize,
    pub group: Rc<[usize]>,
    pub world_rank: usize,
    /// The call's stamp (`crate::stamp`): every message carries it, and a
    /// receive that gets another fails the call.
    pub stamp: u32,
}

impl Run {
    /// A run of `sched` over `send` (read only) and `recv`.
    ///
    /// # Safety
    /// `send_len` bytes at `send` must stay readable and `recv_len` bytes at
    /// `recv` writable (and not otherwise accessed) until the run is done.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new(
        sched: Rc<Schedule>,
        send: *const u8,
        send_len: usize,
        recv: *mut u8,
        recv_len: usize,
        reduce: Option<ByteReduce>,
        wire: Wire,
        op: Op,
    ) -> Result<Run> {
        let invalid = |detail: String| Error::InvalidArgument {
            rank: wire.world_rank,
            op,
            detail,
        };
        sched
            .validate(wire.me, wire.group.len(), send_len, recv_len)
            .map_err(|b| invalid(format!("schedule does not fit the buffers: {b}")))?;
        if sched.reduces && reduce.is_none() {
            return Err(invalid(
                "schedule reduces but no operation was given".into(),
            ));
        }
        let scratch = sched.scratch.iter().map(|&n| pool_take(n)).collect();
        Ok(Run {
            sched,
            round: 0,
            posted: false,
            early: 0,
            pending: Vec::new(),
            aborting: false,
            send,
            recv,
            send_len,
            recv_len,
            scratch,
            then: None,
            reduce,
            ctx: wire.ctx,
            tag: wire.tag,
            stamp: wire.stamp,
            me: wire.me as u32,
            group: wire.group,
            op,
            err: None,
            done: false,
            sentinel: None,
            sentinel_posted: false,
            panic: None,
            keep: None,
            notices_seen: 0,
            tell: Tell::Nobody,
        })
    }

    /// The collective, for messages.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Makes the run own `keep` (memory it reads) until it is dropped.
    pub fn keep(&mut self, keep: Box<dyn std::any::Any>) {
        self.keep = Some(keep);
    }

    /// Gives the run what it builds a two-phase schedule's second phase
    /// with ([`Schedule::then`]).
    pub fn then(&mut self, build: BuildFn, args: Args) {
        self.then = Some((build, args));
    }

    /// The disagreement a builder found in learned counts, as this rank's
    /// error (told to every member like a message of the wrong size).
    fn fault_error(&self, f: Fault) -> Error {
        let at = |r: usize| self.group.get(r).copied().unwrap_or(r);
        let (a, b) = (at(f.from), at(f.to));
        Error::Mismatch {
            rank: at(self.me as usize),
            op: self.op,
            call: CALL_UNKNOWN,
            a,
            b,
            values: Box::new(Disagreement::transfer(a, b, f.sent, f.expected)),
        }
    }

    /// Replaces the finished first phase by the second, built from the
    /// `u64`s scratch `i` learned (see [`Schedule::then`]).
    fn next_phase(&mut self, i: u16) -> Result<()> {
        let Some((build, mut args)) = self.then.take() else {
            return Ok(());
        };
        let len = self.sched.scratch.get(i as usize).copied().unwrap_or(0);
        let p = self.ptr(&Slice {
            buf: Buf::Scratch(i),
            off: 0,
            len,
        });
        // SAFETY: `validate` checked that scratch `i` exists; it holds
        // `len` bytes, and no transfer is pending (the phase is over).
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
        args.learned = Some(super::learned_values(bytes));
        let sched = build(&args);
        let rank = self.group.get(self.me as usize).copied().unwrap_or(0);
        sched
            .validate(
                self.me as usize,
                self.group.len(),
                self.send_len,
                self.recv_len,
            )
            .map_err(|b| Error::InvalidArgument {
                rank,
                op: self.op,
                detail: format!("second phase does not fit the buffers: {b}"),
            })?;
        if sched.reduces && self.reduce.is_none() {
            return Err(Error::InvalidArgument {
                rank,
                op: self.op,
                detail: "second phase reduces but no operation was given".into(),
            });
        }
        for b in self.scratch.drain(..) {
            pool_give(b);
        }
        self.scratch = sched.scratch.iter().map(|&n| pool_take(n)).collect();
        self.sched = Rc::new(sched);
        self.then = Some((build, args));
        self.round = 0;
        self.posted = false;
        Ok(())
    }

    /// The panic of the run's reduction operation, if it panicked.
    pub fn take_panic(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        self.panic.take()
    }

    /// Gives up the run (a scope left by a panic): what can be let go of
    /// safely is, and [`drive`] then waits only for data already moving.
    pub fn cancel(&mut self, e: &mut Engine) {
        if self.done || self.aborting {
            return;
        }
        self.record(Error::InvalidArgument {
            rank: e.rank(),
            op: self.op,
            detail: "the collective was abandoned by a panic".into(),
        });
        if !self.sentinel_posted {
            // Nothing was posted yet.
            self.done = true;
            return;
        }
        self.abort(e);
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The watchdog fired while this run waited `waited` for its round:
    /// the run fails with the report and gives up what it can (then it
    /// waits only for data already moving, like [`Run::cancel`]).
    pub fn hung(&mut self, e: &mut Engine, waited: std::time::Duration) {
        if self.done || self.aborting {
            return;
        }
        let mut peers: Vec<usize> = self
            .sched
            .rounds
            .get(self.round)
            .into_iter()
            .flatten()
            .filter_map(|s| match s {
                Step::Send { peer, .. } | Step::Recv { peer, .. } => self.group.get(*peer).copied(),
                _ => None,
            })
            .collect();
        if peers.is_empty() {
            peers = self.group.to_vec();
        }
        let what = format!(
            "call with tag {}, round {} of {}",
            self.tag,
            self.round + 1,
            self.sched.rounds.len()
        );
        let err = e.hang_error(self.op, &what, &peers, waited);
        self.fail(e, err);
    }

    /// Ends the run with `err`: its current round is abandoned (what
    /// cannot be withdrawn is waited for, so no buffer stays in use).
    pub fn fail(&mut self, e: &mut Engine, err: Error) {
        if self.done || self.aborting {
            return;
        }
        // A split of the fast-path decision is told like any disagreement:
        // a member that completed the call (a bcast root) learns of it at
        // its next call.
        self.record(err);
        if !self.sentinel_posted {
            self.done = true;
            return;
        }
        self.abort(e);
    }

    /// The outcome, once done.
    pub fn take_result(&mut self) -> Result<()> {
        match self.err.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn ptr(&mut self, s: &Slice) -> *mut u8 {
        let base = match s.buf {
            Buf::Send => self.send as *mut u8,
            Buf::Recv => self.recv,
            Buf::Scratch(i) => self.scratch[i as usize].as_mut_ptr() as *mut u8,
        };
        // SAFETY: `validate` checked `off + len` against the buffer length.
        unsafe { base.add(s.off) }
    }

    /// Whether operation `t` failed, or is a receive that got a message
    /// of another call than this run's `stamp` or shorter than it was
    /// posted for (a schedule receives exactly what its peer's schedule
    /// sends: either means the two ranks' arguments disagree, and waiting
    /// for the rest could hang).
    fn failed(e: &Engine, t: Token, stamp: u32) -> bool {
        match e.st.ops.get(t) {
            Some(EngOp {
                result: Some(Err(_)),
                ..
            }) => true,
            Some(EngOp {
                kind: OpKind::Recv {
                    cap, stamp: got, ..
                },
                result: Some(Ok(st)),
            }) => st.len != *cap || *got != stamp,
            _ => false,
        }
    }

    /// The first pending receive that got a message of another call or
    /// shorter than its buffer, as the disagreement it is (see
    /// [`Run::failed`]): what differs in the stamps first, else the
    /// lengths.
    #[cold]
    #[inline(never)]
    fn bad_recv(&self, e: &Engine) -> Option<Error> {
        self.pending.iter().find_map(|&t| match e.st.ops.get(t) {
            Some(EngOp {
                kind: OpKind::Recv { cap, stamp, .. },
                result: Some(Ok(st)),
            }) if st.len != *cap || *stamp != self.stamp => {
                let me = self.group[self.me as usize];
                let from = self.group.get(st.source).copied().unwrap_or(st.source);
                let values = crate::stamp::disagreement(*stamp, self.stamp).unwrap_or_else(|| {
                    Disagreement::transfer(from, me, st.len as u64, *cap as u64)
                });
                Some(Error::Mismatch {
                    rank: me,
                    op: self.op,
                    call: CALL_UNKNOWN,
                    a: from,
                    b: me,
                    values: Box::new(values),
                })
            }
            _ => None,
        })
    }

    /// Whether `step` can do something now.
    pub fn round_ready(&self, e: &Engine) -> bool {
        self.done
            || !self.posted
            || self.pending.iter().all(|&t| e.is_done(t))
            || (!self.aborting
                && (e.st.notices != self.notices_seen
                    || self.pending.iter().any(|&t| Self::failed(e, t, self.stamp))
                    || self.sentinel.is_some_and(|t| e.is_done(t))))
    }

    /// Posts the sentinel (communicators of more than two ranks; with two,
    /// every failure is seen directly), failing at once if a member is
    /// already gone.
    fn post_sentinel(&mut self, e: &mut Engine) -> Result<()> {
        self.sentinel_posted = true;
        // Messages of this call with another stamp, early or late, fail
        // it even if no receive of ours matches them.
        e.st.note_call(self.ctx, self.tag, self.stamp);
        if self.group.len() <= 2 || self.sched.rounds.is_empty() {
            return Ok(());
        }
        for (r, &w) in self.group.iter().enumerate() {
            if r != self.me as usize {
                // A member that finalized is not an error: its messages to
                // us arrived before its goodbye and are matched normally.
                if let Some(err) = e.peer_died(w, self.op) {
                    return Err(err);
                }
            }
        }
        let t = e.post_recv(
            self.ctx,
            None,
            None,
            Some(self.tag | SENTINEL_BIT),
            &self.group,
            std::ptr::NonNull::<u8>::dangling().as_ptr(),
            0,
        );
        self.sentinel = Some(t);
        Ok(())
    }

    /// Withdraws the sentinel (or takes its error).
    fn drop_sentinel(&mut self, e: &mut Engine) {
        if let Some(t) = self.sentinel.take() {
            if e.is_done(t) {
                if let Some(Err(x)) = e.take_result(t) {
                    self.record(x);
                }
            } else {
                e.st.matcher.unpost(t);
                e.st.ops.remove(t);
            }
        }
    }

    fn record(&mut self, err: Error) {
        if self.err.is_none() {
            let x = err.with_op(self.op);
            if x.is_mismatch() {
                // Found here (a message of the wrong size): the others of
                // the call may wait for this rank, or have completed.
                self.tell = Tell::All;
            }
            self.err = Some(x);
        }
    }

    /// The first notice about this call, or about an earlier call of the
    /// communicator that this rank completed, as the error this run fails
    /// with and whom it tells; notices about calls this rank already failed
    /// are dropped, those about later calls stay for them.
    #[cold]
    #[inline(never)]
    fn look_for_notice(&mut self, e: &mut Engine) -> Option<(Error, Tell)> {
        self.notices_seen = e.st.notices;
        let mine = self.tag & NOTICE_MASK;
        let (n, same, here) = next_notice(e, self.ctx, Some(mine), true)?;
        let err = notice_error(&n, same, &self.group, self.me as usize, self.op);
        let tell = if here {
            // A conflict this process found: told to every member as its
            // own finding, about the call it was in (which may be an
            // earlier one, where some members still wait).
            tell_all(e, self.ctx, self.me as usize, &self.group, &n);
            Tell::Nobody
        } else if same {
            Tell::Relay(n.src)
        } else {
            Tell::All
        };
        Some((err, tell))
    }

    /// Sends the disagreement this run failed with as a notice to whom
    /// [`Run::tell`] says (once), so that no member waits for a rank that
    /// gave up, nor completes without learning of it (its next call on the
    /// communicator fails then).
    #[cold]
    #[inline(never)]
    fn tell_now(&mut self, e: &mut Engine) {
        let tell = std::mem::replace(&mut self.tell, Tell::Nobody);
        let Some(x) = &self.err else { return };
        let earlier = matches!(x, Error::Mismatch { call, .. } if *call == CALL_EARLIER);
        let Some(p) = encode_notice(earlier, x) else {
            return;
        };
        let me = self.me as usize;
        let mut dests: Vec<usize> = match tell {
            Tell::All => (0..self.group.len()).filter(|&r| r != me).collect(),
            Tell::Relay(from) => self
                .sched
                .rounds
                .iter()
                .flatten()
                .filter_map(|s| match s {
                    Step::Send { peer, .. } | Step::Recv { peer, .. } => Some(*peer),
                    _ => None,
                })
                .filter(|&r| r != me && r != from as usize)
                .collect(),
            Tell::Nobody => return,
        };
        dests.sort_unstable();
        dests.dedup();
        for r in dests {
            e.send_notice(self.group[r], self.ctx, self.me, self.tag, &p);
        }
    }

    /// Abandons the current round after a failure (see the module doc).
    fn abort(&mut self, e: &mut Engine) {
        self.aborting = true;
        let mut keep = Vec::new();
        for t in std::mem::take(&mut self.pending) {
            match e.abandon(t) {
                Some(Some(x)) => self.record(x),
                Some(None) => {}
                None => keep.push(t),
            }
        }
        self.pending = keep;
    }

    /// Advances as far as possible; returns how much happened.
    pub fn step(&mut self, e: &mut Engine) -> usize {
        let work = self.step_inner(e);
        if let Some(k) = self.reduce.as_ref().filter(|k| k.is_user()) {
            if let Some(p) = k.take_panic() {
                // Poisoned at once, whatever becomes of the request.
                e.poison_by_panic(self.op, &*p);
                self.panic.get_or_insert(p);
            }
        }
        work
    }

    fn step_inner(&mut self, e: &mut Engine) -> usize {
        let mut work = 0;
        if !self.sentinel_posted && !self.done {
            // A notice may wait already (this call's, from a rank ahead of
            // this one, or an earlier call's): then the first pass looks.
            self.notices_seen = e.st.notices - u64::from(e.st.notices_waiting > 0);
            if let Err(x) = self.post_sentinel(e) {
                self.record(x);
                self.done = true;
                return 1;
            }
        }
        let n = self.step_rounds(e);
        work += n;
        if self.tell != Tell::Nobody {
            self.tell_now(e);
        }
        if self.done {
            self.drop_sentinel(e);
            if self.err.as_ref().is_some_and(Error::is_mismatch) {
                e.st.note_failed_op(self.ctx, self.tag);
                crate::fastpath::note_schedule_mismatch(e, &self.group);
            }
        }
        work
    }

    fn step_rounds(&mut self, e: &mut Engine) -> usize {
        let mut work = 0;
        while !self.done {
            if self.aborting {
                if self.pending.iter().all(|&t| e.is_done(t)) {
                    for t in std::mem::take(&mut self.pending) {
                        let _ = e.take_result(t);
                    }
                    self.done = true;
                    work += 1;
                }
                return work;
            }
            if e.st.notices != self.notices_seen {
                if let Some((x, tell)) = self.look_for_notice(e) {
                    self.record(x);
                    self.tell = tell;
                    self.abort(e);
                    work += 1;
                    continue;
                }
            }
            if let Some(f) = self.sched.fault {
                let x = self.fault_error(f);
                self.record(x);
                self.abort(e);
                work += 1;
                continue;
            }
            if self.round >= self.sched.rounds.len() {
                if let (Some(i), true) = (self.sched.then, self.then.is_some()) {
                    work += 1;
                    if let Err(x) = self.next_phase(i) {
                        self.record(x);
                        self.abort(e);
                    }
                    continue;
                }
                self.done = true;
                work += 1;
                break;
            }
            if !self.posted {
                self.posted = true;
                work += 1;
                if let Err(x) = self.post(e) {
                    self.record(x);
                    self.abort(e);
                    continue;
                }
            }
            if self.pending.iter().any(|&t| Self::failed(e, t, self.stamp)) {
                if let Some(x) = self.bad_recv(e) {
                    self.record(x);
                }
                self.abort(e);
                continue;
            }
            if self.sentinel.is_some_and(|t| e.is_done(t)) {
                // A member died: take its error and abandon the round.
                self.drop_sentinel(e);
                self.abort(e);
                continue;
            }
            if !self.pending.iter().all(|&t| e.is_done(t)) {
                return work;
            }
            for t in std::mem::take(&mut self.pending) {
                if let Some(Err(x)) = e.take_result(t) {
                    self.record(x);
                }
            }
            if self.err.is_some() {
                self.done = true;
                break;
            }
            self.local_steps();
            self.round += 1;
            self.posted = false;
            work += 1;
        }
        work
    }

    fn post(&mut self, e: &mut Engine) -> Result<()> {
        for i in 0..self.sched.rounds[self.round].len() {
            let s = self.sched.rounds[self.round][i].clone();
            match s {
                Step::Recv { peer, data } => {
                    let p = self.ptr(&data);
                    let t = e.post_recv(
                        self.ctx,
                        Some(peer as u32),
                        Some(self.group[peer]),
                        Some(self.tag),
                        &self.group,
                        p,
                        data.len,
                    );
                    self.pending.push(t);
                }
                Step::Send { peer, data } => {
                    let p = self.ptr(&data);
                    let to = self.group[peer];
                    match e.post_send_stamped(
                        to, self.ctx, self.me, self.tag, p, data.len, self.stamp,
                    )? {
                        Posted2::Done => {}
                        Posted2::Pending(t) => self.pending.push(t),
                    }
                }
                _ => {}
            }
        }
        self.early = self.early_local_steps();
        Ok(())
    }

    /// Carries out, right after the round's messages were posted, the
    /// leading local steps that touch no byte a receive of the round writes
    /// and write no byte a send of the round reads: the result is the same
    /// as running them after the messages (what the schedule says and the
    /// simulator does), but the copy or reduction overlaps the transfer
    /// (the peer writes its half of a split rendezvous copy meanwhile)
    /// instead of following it. Returns how many steps were done, so that
    /// [`Run::local_steps`] skips them.
    fn early_local_steps(&mut self) -> usize {
        let round = &self.sched.rounds[self.round];
        let overlap = |a: &Slice, b: &Slice| a.overlaps(b);
        let clear = |read: &Slice, write: &Slice| {
            round.iter().all(|m| match m {
                Step::Recv { data, .. } => !overlap(data, read) && !overlap(data, write),
                Step::Send { data, .. } => !overlap(data, write),
                _ => true,
            })
        };
        let mut n = 0;
        for (i, s) in round.iter().enumerate() {
            match s {
                Step::Copy { src, dst } | Step::Reduce { src, dst, .. } => {
                    if !clear(src, dst) {
                        break;
                    }
                    n = i + 1;
                }
                Step::Put { dst, .. } => {
                    if !clear(dst, dst) {
                        break;
                    }
                    n = i + 1;
                }
                _ => {}
            }
        }
        if n > 0 {
            self.local_range(0, n);
        }
        n
    }

    fn local_steps(&mut self) {
        let from = std::mem::take(&mut self.early);
        self.local_range(from, self.sched.rounds[self.round].len());
    }

    fn local_range(&mut self, from: usize, to: usize) {
        for i in from..to {
            let s = self.sched.rounds[self.round][i].clone();
            match s {
                Step::Copy { src, dst } => {
                    let (a, b) = (self.ptr(&src), self.ptr(&dst));
                    // SAFETY: both ranges were validated against their
                    // buffers; `copy` allows overlap.
                    unsafe { std::ptr::copy(a, b, src.len) };
                }
                Step::Reduce { src, dst, src_left } => {
                    let (a, b) = (self.ptr(&src), self.ptr(&dst));
                    // SAFETY: validated, equal lengths, not overlapping.
                    let (s, d) = unsafe {
                        (
                            std::slice::from_raw_parts(a as *const u8, src.len),
                            std::slice::from_raw_parts_mut(b, dst.len),
                        )
                    };
                    if let Some(f) = &self.reduce {
                        f.apply(d, s, src_left);
                    }
                }
                Step::Put { dst, bytes } => {
                    let b = self.ptr(&dst);
                    // SAFETY: validated: `dst` lies in a writable buffer
                    // and is `bytes.len()` long.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b, bytes.len()) };
                }
                _ => {}
            }
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.done && !self.pending.is_empty() {
            // Every owner finishes its run (a blocking call, a request's
            // wait or drop, a scope's end); only a panic inside ibcoll can
            // get here, and the run's transfers may still be writing into
            // its buffers and scratch.
            eprintln!(
                "ibcoll: rank {}: a {} was dropped with transfers in flight into its buffers; \
                 aborting the process",
                self.group.get(self.me as usize).copied().unwrap_or(0),
                self.op
            );
            std::process::abort();
        }
        if self.done && self.pending.is_empty() {
            for b in self.scratch.drain(..) {
                pool_give(b);
            }
        }
    }
}

/// The unit of pooled scratch: one cache line, so buffers are 64-byte
/// aligned without unsafe allocation code.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; 64]);

/// Buffers larger than this are not kept (a one-off huge collective should
/// not pin its scratch for the rest of the process).
const POOL_MAX_BUF: usize = 64 << 20;
/// Bound on what the pool holds in all (bytes and buffers).
const POOL_MAX_BYTES: usize = 128 << 20;
const POOL_MAX_BUFS: usize = 32;

thread_local! {
    static POOL: RefCell<Vec<Vec<Line>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of at least `n` bytes: the smallest pooled one that fits, else
/// a new one (rounded up to whole pages so slightly larger requests later
/// still fit it).
fn pool_take(n: usize) -> Vec<Line> {
    if n == 0 {
        return Vec::new();
    }
    let lines = n.div_ceil(64);
    let hit = POOL.with(|p| {
        let mut p = p.borrow_mut();
        let best = p
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= lines)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        best.map(|i| p.swap_remove(i))
    });
    hit.unwrap_or_else(|| vec![Line([0; 64]); lines.next_multiple_of(64)])
}

/// Returns `b` to the pool, evicting the smallest buffers beyond the bounds.
fn pool_give(b: Vec<Line>) {
    if b.is_empty() || b.len() * 64 > POOL_MAX_BUF {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        p.push(b);
        while p.len() > POOL_MAX_BUFS
            || p.iter().map(|b| b.len() * 64).sum::<usize>() > POOL_MAX_BYTES
        {
            let Some(i) = p
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i)
            else {
                break;
            };
            p.swap_remove(i);
        }
    });
}

thread_local! {
    static ACTIVE: RefCell<Vec<Rc<RefCell<Run>>>> = const { RefCell::new(Vec::new()) };
}

/// Runs registered on all threads together: a progress pass with none
/// anywhere skips the thread-local list (in a shared library, such as the
/// C interface's, every thread-local access is a call to
/// `__tls_get_addr`). Relaxed is enough: a thread always sees its own
/// additions, and another thread only ever subtracts what it added, so a
/// thread with runs of its own never reads 0.
static ANY_ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Sets `a`'s length in [`ANY_ACTIVE`], from `before`.
fn count_change(before: usize, after: usize) {
    if after > before {
        ANY_ACTIVE.fetch_add(after - before, Ordering::Relaxed);
    } else if before > after {
        ANY_ACTIVE.fetch_sub(before - after, Ordering::Relaxed);
    }
}

/// Lets the progress loop advance `run` until it is done.
pub(crate) fn register(run: Rc<RefCell<Run>>) {
    ACTIVE.with(|a| {
        let mut a = a.borrow_mut();
        a.push(run);
        count_change(0, 1);
    });
}

/// Removes `run` from the progress list.
pub(crate) fn unregister(run: &Rc<RefCell<Run>>) {
    ACTIVE.with(|a| {
        if let Ok(mut a) = a.try_borrow_mut() {
            let before = a.len();
            a.retain(|r| !Rc::ptr_eq(r, run));
            count_change(before, a.len());
        }
    });
}

/// Advances every registered nonblocking collective once (called from
/// `Engine::progress`); returns how much happened.
#[inline]
pub(crate) fn progress_hook(e: &mut Engine) -> usize {
    if ANY_ACTIVE.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    ACTIVE.with(|a| {
        let Ok(mut a) = a.try_borrow_mut() else {
            return 0;
        };
        let before = a.len();
        let mut n = 0;
        a.retain(|r| match r.try_borrow_mut() {
            Ok(mut r) => {
                n += r.step(e);
                !r.is_done()
            }
            Err(_) => true,
        });
        count_change(before, a.len());
        n
    })
}

/// Settles every nonblocking collective still registered (the engine is
/// finalizing: only leaked requests leave any): each is given up as by a
/// panic ([`Run::cancel`]) and driven until nothing points into its
/// buffers.
pub(crate) fn settle_all(e: &mut Engine) {
    let runs: Vec<Rc<RefCell<Run>>> = ACTIVE.with(|a| std::mem::take(&mut *a.borrow_mut()));
    count_change(runs.len(), 0);
    for r in runs {
        r.borrow_mut().cancel(e);
        drive(e, &r);
    }
}

/// Runs `run` to completion. A reduction operation's panic stays in the
/// run ([`Run::take_panic`]): the caller resumes it once it no longer
/// holds the engine.
///
/// A schedule announced in the fast-path slots also ends when a member
/// published something else for that call (see
/// `FastCall::announce_schedule`).
pub(crate) fn run_blocking(e: &mut Engine, run: &mut Run) -> Result<()> {
    let mut res = run_announced(e, run);
    if res.is_err() && e.fast.announced.is_some() {
        // A member that took the fast path may have failed and left before
        // this rank blocked long enough to look: its departure is not the
        // cause.
        e.check_announced();
        if let Some(x) = crate::fastpath::split_error(e, &run.group, run.op) {
            res = Err(x);
        }
    }
    e.fast.announced = None;
    e.fast.split = None;
    res
}

fn run_announced(e: &mut Engine, run: &mut Run) -> Result<()> {
    loop {
        run.step(e);
        if run.is_done() {
            return run.take_result();
        }
        let hung = e.wait_until_watched(|e| run.round_ready(e) || e.fast.split.is_some());
        if let Some(x) = crate::fastpath::split_error(e, &run.group, run.op) {
            run.fail(e, x);
        } else if let Some(waited) = hung {
            run.hung(e, waited);
        }
    }
}

/// Drives the nonblocking collective `r` until it is done (its outcome
/// stays in it).
pub(crate) fn drive(e: &mut Engine, r: &RefCell<Run>) {
    loop {
        r.borrow_mut().step(e);
        let rr = r.borrow();
        if rr.is_done() {
            return;
        }
        let hung = e.wait_until_watched(|e| rr.round_ready(e));
        drop(rr);
        if let Some(waited) = hung {
            r.borrow_mut().hung(e, waited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notice_payload_round_trips() {
        let err = Error::Mismatch {
            rank: 2,
            op: Op::Collective(crate::algorithms::Collective::Bcast),
            call: CALL_UNKNOWN,
            a: 0,
            b: 2,
            values: Box::new(Disagreement::transfer(0, 2, 24, 32)),
        };
        let p = encode_notice(true, &err).unwrap();
        let (earlier, a, b, name, v) = decode_notice(&p).unwrap();
        assert!(earlier);
        assert_eq!((a, b, name.as_str()), (0, 2, "bcast"));
        assert_eq!(v, Disagreement::transfer(0, 2, 24, 32));
        assert!(decode_notice(&p[..p.len() - 1]).is_none());
        assert!(decode_notice(&[]).is_none());
        let lost = Error::PeerLost {
            rank: 0,
            peer: 1,
            op: Op::Barrier,
            reason: String::new(),
        };
        assert!(encode_notice(false, &lost).is_none());
    }

    #[test]
    fn notices_are_ordered_modulo_the_tag_sequence() {
        assert!(when(20, 20) == When::Same);
        assert!(when(21, 20) == When::Later);
        assert!(when(19, 20) == When::Earlier);
        // Across the wrap of the 29-bit sequence (tags 16 + seq).
        let last = 16 + (1 << 29) - 1;
        assert!(when(16, last) == When::Later);
        assert!(when(last, 16) == When::Earlier);
    }
}
