//! Shared-memory fast paths: small blocking collectives among the ranks of
//! one node, through publication slots in the node segment
//! ([`ibcoll_shm::slots`]) instead of messages.
//!
//! A call publishes this rank's contribution (or only its arrival) in its
//! own slot buffer under the next sequence number, rings the doorbells of
//! the other members, and reads what it needs straight from their buffers.
//! No schedule is built, nothing is matched, no message crosses a ring: an
//! 8-byte allreduce between two ranks is one cache line each way.
//!
//! When a communicator qualifies ([`eligible`]): the node segment exists
//! (shm is in use), the slots are on (`IBCOLL_SHM_COLL_BYTES` > 0), and the
//! communicator holds **every** rank of the node and nothing else, so its
//! member set is the slot owners. All such communicators (the world on one
//! node, its duplicates, a split by node) share one sequence per process:
//! blocking collectives on communicators with the same group are called in
//! the same order on every member (otherwise the program could deadlock,
//! which MPI rules out), so the sequence agrees. Nonblocking collectives
//! never take a fast path: they run schedules, and MPI does not match a
//! blocking collective with a nonblocking one.
//!
//! Selection decides like for any algorithm (the `shm` entries of the
//! table); a call whose communicator does not qualify, or whose data does
//! not fit a buffer, takes the best message-based algorithm instead. Every
//! input to that decision is the same on every member.
//!
//! Waiting goes through [`Engine::wait_until`] (spin, yield, block on the
//! doorbell, other traffic progressing meanwhile); a member that dies or
//! finalizes before publishing what we wait for ends the call with
//! `PeerLost` within the usual bound.

pub(crate) mod blocks;

mod allgather;
mod allreduce;
mod allreduce_tree;
mod alltoall;
mod barrier;
mod bcast;
mod bcast_tree;
mod gather;
mod gather_tree;
mod reduce;
mod reduce_scatter;
mod reduce_tree;
mod scan;
mod scatter;
mod scatter_tree;
mod tree;

use std::rc::Rc;

use ibcoll_shm::backoff::Backoff;
use ibcoll_shm::{NodeSegment, SlotArea, SLOT_BUFFERS, SLOT_INLINE, SLOT_LINES};

use crate::engine::Engine;
use crate::error::{Disagreement, Error, Op, Result};
use crate::transport::{Channel, Health};

/// Ranks whose arrival only releases buffers publish it every this many
/// calls ([`FastCall::arrive_lazy`]); at most `SLOT_BUFFERS / 2` (the
/// shallower reuse window), so a writer waiting for it never waits on a
/// call it has not reached.
const ARRIVE_EVERY: u64 = (SLOT_BUFFERS / 2) as u64;

/// Looks at a flag alone before the engine's wait loop (which polls the
/// channels on every pass, then yields) takes over.
const FLAG_SPIN: u32 = 256;

/// Set in a published length that is not data: the member runs this call
/// as messages (a schedule) with the rest of the value as its bytes per
/// rank ([`FastCall::announce_schedule`]). A member that took the fast
/// path reads it and fails instead of waiting for data that never comes.
pub(crate) const SCHEDULE_MARK: usize = 1 << 62;

/// Set in a published length that is not data: the member found the
/// members disagree in an earlier fast-path call (the rest of the value is
/// its number) and takes part in no further one ([`FastCall::refuse`]). A
/// member reading it fails naming that call: a bcast or scatter root, which
/// returned from the call before any reader could object, learns it so at
/// its next call that reads or waits for the member.
pub(crate) const FAIL_MARK: usize = 1 << 61;

/// The number [`FastSeq::failed`](crate::engine::FastSeq) holds for a
/// disagreement found in a collective of the node's ranks that ran as
/// messages (a schedule, see [`note_schedule_mismatch`]), not in a
/// fast-path call.
const AS_MESSAGES: u64 = (1 << 60) - 1;

/// The call a [`FAIL_MARK`] names, for messages.
fn failed_call(k: u64) -> String {
    if k == AS_MESSAGES {
        "a collective of this node's ranks that ran as messages".into()
    } else {
        format!("shared-memory collective {k} of this node")
    }
}

/// A schedule on a communicator of `group` (world ranks) failed here with
/// [`Error::Mismatch`]: when the communicator qualifies for the fast
/// paths, this process takes part in no later fast-path call (it
/// publishes [`FAIL_MARK`] instead), as if it had found the disagreement
/// there, so that a member that completed the call (a bcast root) and
/// reads this rank's slot next fails even before this rank's notice
/// reached it (the slots are not ordered with the messages).
#[cold]
#[inline(never)]
pub(crate) fn note_schedule_mismatch(e: &mut Engine, group: &[usize]) {
    if e.fast.failed == 0 && eligible(e, group).is_some() {
        e.fast.failed = AS_MESSAGES;
    }
}

/// Either mark: the published length is not data.
const MARKS: usize = SCHEDULE_MARK | FAIL_MARK;

/// Where a data publication's length word holds the call's stamp
/// (`crate::stamp`, 32 bits): above the length (`IBCOLL_SHM_COLL_BYTES`
/// is at most 2^28) and below the marks, so that a reader that compares
/// the word with what it expects tests the collective, root, operation
/// and type of the call with the same load and compare.
const STAMP_SHIFT: u32 = 29;

/// The length bits of a data publication's word.
const LEN_BITS: usize = (1 << STAMP_SHIFT) - 1;

/// The length of a published word: data's without its stamp, a mark as
/// it is.
fn plain(v: usize) -> usize {
    if v & MARKS == 0 {
        v & LEN_BITS
    } else {
        v
    }
}

/// The bytes of a [`SCHEDULE_MARK`] read from a mark line that has moved
/// on to a later call: the member ran the call as messages, with bytes
/// this rank cannot know.
const BYTES_UNKNOWN: usize = (1 << 60) - 1;

/// Rank `a` (world) decided `mine` for fast-path call `k` where member `b`
/// published `got` (either may carry [`SCHEDULE_MARK`]).
#[cold]
#[inline(never)]
fn decision_error(a: usize, op: Op, k: u64, b: usize, got: usize, mine: usize) -> Error {
    let (got, mine) = (plain(got), plain(mine));
    let say = |v: usize| {
        if v & SCHEDULE_MARK != 0 && v & !SCHEDULE_MARK == BYTES_UNKNOWN {
            "ran it as messages".into()
        } else if v & SCHEDULE_MARK != 0 {
            format!(
                "runs it as messages with {} bytes per rank",
                v & !SCHEDULE_MARK
            )
        } else {
            format!("took the shared-memory fast path with {v} bytes")
        }
    };
    Error::Mismatch {
        rank: a,
        op,
        call: k,
        a,
        b,
        values: Box::new(Disagreement {
            what: "shared-memory decision".into(),
            a_value: format!("\"{}\"", say(mine)),
            b_value: format!("\"{}\"", say(got)),
        }),
    }
}

/// The error of a blocking schedule whose announcement a member
/// contradicted (`Engine::check_announced` found it; `group` holds the
/// members' world ranks), if one did; this process then takes part in no
/// later fast-path call, like one that found a disagreement there.
#[cold]
#[inline(never)]
pub(crate) fn split_error(e: &mut Engine, group: &[usize], op: Op) -> Option<Error> {
    let (r, got) = e.fast.split.take()?;
    let a = e.fast.announced.as_ref()?;
    let (k, mine) = (a.k, a.mark);
    if e.fast.failed == 0 {
        e.fast.failed = k;
    }
    let b = group.get(r).copied().unwrap_or(r);
    let me = e.rank();
    if got & FAIL_MARK != 0 {
        return Some(Error::Mismatch {
            rank: me,
            op,
            call: k,
            a: b,
            b: me,
            values: Box::new(Disagreement {
                what: String::new(),
                a_value: format!(
                    "found the ranks disagree on {} (its error there names them) and takes part in no later one",
                    failed_call((got & !FAIL_MARK) as u64)
                ),
                b_value: "cannot complete this call without it".into(),
            }),
        });
    }
    Some(decision_error(me, op, k, b, got, mine))
}

/// Local rank of every member when a communicator of `group` (world ranks)
/// qualifies for the fast paths, else `None`.
pub(crate) fn eligible(e: &Engine, group: &[usize]) -> Option<Vec<usize>> {
    if e.node.is_none() || e.cfg.shm_coll_bytes == 0 || group.len() < 2 {
        return None;
    }
    if group.len() != e.local_size {
        return None;
    }
    let me = e.rank();
    group
        .iter()
        .map(|&w| match e.peers.chan(w) {
            _ if w == me => Some(e.local_rank),
            Some(Channel::Shm(c)) => Some(c.peer_local()),
            _ => None,
        })
        .collect()
}

/// One rank's part of one fast-path collective.
pub(crate) struct FastCall<'a> {
    e: &'a mut Engine,
    area: SlotArea<'a>,
    k: u64,
    /// Bytes the last `claim` made room for.
    claimed: usize,
    me: usize,
    locals: &'a [usize],
    group: &'a Rc<[usize]>,
    /// The communicator's collective context, for blocks sent as messages
    /// ([`blocks`]).
    ctx: u32,
    op: Op,
    /// The call's stamp (`crate::stamp`) where a data publication's word
    /// holds it ([`STAMP_SHIFT`]).
    stamp: usize,
    /// The call's messages: waited for by [`FastCall::finish`], or when
    /// the call is dropped, so that none outlives the buffers it uses.
    msgs: Option<Box<blocks::Msgs>>,
}

impl Drop for FastCall<'_> {
    fn drop(&mut self) {
        if self.msgs.is_some() {
            // An early return or a panic: the error, if any, is the
            // caller's already.
            let _ = self.finish_msgs();
        }
    }
}

impl<'a> FastCall<'a> {
    /// The slots of `node` (the engine's node segment), when configured.
    #[inline]
    pub fn area(e: &Engine, node: &'a NodeSegment) -> Option<SlotArea<'a>> {
        e.slots.as_ref()?.area(node)
    }

    /// Starts the next fast-path collective as communicator rank `me` of a
    /// communicator that [`eligible`] accepted (`locals` is its answer);
    /// `ctx` is its collective context, `stamp` the call's stamp (every
    /// member's publications of a correct call carry the same).
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        e: &'a mut Engine,
        area: SlotArea<'a>,
        me: usize,
        locals: &'a [usize],
        group: &'a Rc<[usize]>,
        ctx: u32,
        op: Op,
        stamp: u32,
    ) -> FastCall<'a> {
        e.fast.seq += 1;
        let k = e.fast.seq;
        FastCall {
            e,
            area,
            k,
            claimed: 0,
            me,
            locals,
            group,
            ctx,
            op,
            stamp: (stamp as usize) << STAMP_SHIFT,
            msgs: None,
        }
    }

    /// Bytes one publication may hold.
    pub fn capacity(&self) -> usize {
        self.area.capacity()
    }

    /// Communicator rank of this process.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.group.len()
    }

    /// Waits until this rank may write `len` bytes for the call (every
    /// member has arrived at a call late enough that nobody still reads
    /// what the line, or for more than `SLOT_INLINE` bytes the big buffer,
    /// held) and returns where to write them.
    pub fn claim(&mut self, len: usize) -> Result<*mut u8> {
        let window = if len <= SLOT_INLINE {
            SLOT_LINES
        } else {
            SLOT_BUFFERS
        } as u64;
        if self.k > window && self.e.fast.min_other < self.k - window + 1 {
            let need = self.k - window + 1;
            // The latest call a member can have published, and the latest
            // one every member publishes (lazy arrivals skip the others).
            let latest = self.k - 1;
            let sure = latest - latest % ARRIVE_EVERY;
            for r in 0..self.size() {
                if r == self.me {
                    continue;
                }
                let l = self.locals[r];
                if self.e.fast.seen[l] >= need {
                    continue;
                }
                // Learn the member's latest arrival, so the next calls need
                // not look again.
                if self.area.header(l, latest).seq() >= latest {
                    self.e.fast.seen[l] = latest;
                    continue;
                }
                if sure >= need && self.area.header(l, sure).seq() >= sure {
                    self.e.fast.seen[l] = sure;
                    continue;
                }
                // Its latest call run as messages (`announce_schedule`).
                let m = self.area.mark(l).seq();
                if m >= need {
                    self.e.fast.seen[l] = m.min(latest);
                    continue;
                }
                // Wait for a call well past `need` (one every member
                // publishes, before `latest`, so no deadlock): the line
                // polled here is one the member is about to write, and each
                // wait makes that write take the line back from us, so
                // waiting once for several calls costs the member less.
                let far = (need + window / 2).min(sure);
                let far = far - far % ARRIVE_EVERY;
                if far >= need {
                    self.wait_any(r, far, far)?;
                } else {
                    // Published at `need` itself, or at the next call every
                    // member publishes.
                    self.wait_any(r, need, need.next_multiple_of(ARRIVE_EVERY))?;
                }
            }
            let mine = self.locals[self.me];
            let seen = &self.e.fast.seen;
            self.e.fast.min_other = (0..seen.len())
                .filter(|&l| l != mine)
                .map(|l| seen[l])
                .min()
                .unwrap_or(u64::MAX);
        }
        self.claimed = len;
        Ok(self.area.data(self.locals[self.me], self.k, len))
    }

    /// Publishes the bytes written where `claim` said (none for an
    /// arrival) and wakes the members that sleep.
    pub fn publish(&mut self) {
        self.publish_waking(0..self.size());
    }

    /// [`publish`](Self::publish), waking only members `wake` (the ones
    /// that wait for this publication; others that sleep wake by their
    /// bounded sleep).
    fn publish_waking(&mut self, wake: impl Iterator<Item = usize>) {
        // A mark is published with no stamp (`refuse` clears it).
        let word = self.claimed | self.stamp;
        let mine = self.locals[self.me];
        self.area.header(mine, self.k).publish(self.k, word);
        self.e.fast.seen[mine] = self.k;
        // Two calls ahead: the next line is often being polled by a reader
        // that has caught up (taking it now would only bounce it), and
        // farther ahead the readers' own stream prefetch takes it back.
        self.area.prefetch_for_write(mine, self.k + 2);
        for r in wake {
            if r != self.me {
                let w = self.group[r];
                if let Some(Channel::Shm(c)) = self.e.peers.get_mut(w).map(|p| &mut p.chan) {
                    c.ring_peer();
                }
            }
        }
    }

    /// Arrival without data, waking only members `wake`.
    pub fn arrive_waking(&mut self, wake: impl Iterator<Item = usize>) -> Result<()> {
        self.claim(0)?;
        self.publish_waking(wake);
        Ok(())
    }

    /// Moves on to the next call of the sequence (every member does the
    /// same): a collective in two phases publishes once in each.
    pub fn next_call(&mut self) {
        self.e.fast.seq += 1;
        self.k = self.e.fast.seq;
        self.claimed = 0;
    }

    /// Members from which the barrier goes through a tree.
    pub fn tree_min(&self) -> usize {
        self.e.cfg.shm_tree_min
    }

    /// Whether bcast, reduce and allreduce go through [`tree`] (from
    /// `IBCOLL_SHM_TREE_MIN` members on, like the barrier): the same
    /// answer on every member.
    #[inline]
    pub fn tree(&self) -> bool {
        self.size() >= self.tree_min().max(2)
    }

    /// Waits until member `r` has published this call (failing when it
    /// published a mark, or a call with another stamp).
    pub fn wait_for(&mut self, r: usize) -> Result<()> {
        let len = self.line_of(r)?;
        if len & MARKS != 0 {
            return Err(self.decision_mismatch(r, len, self.claimed));
        }
        Ok(())
    }

    /// Claims this rank's slot for `len` bytes, copies them from `src` and
    /// publishes them; returns where they lie now.
    ///
    /// # Safety
    /// `src` readable for `len` bytes, outside this rank's slots.
    pub unsafe fn publish_copy(&mut self, src: *const u8, len: usize) -> Result<*const u8> {
        // SAFETY: the caller's contract.
        unsafe { self.publish_copy_waking(src, len, 0..self.size()) }
    }

    /// [`publish_copy`](Self::publish_copy), waking only members `wake`.
    ///
    /// # Safety
    /// As [`publish_copy`](Self::publish_copy).
    pub unsafe fn publish_copy_waking(
        &mut self,
        src: *const u8,
        len: usize,
        wake: impl Iterator<Item = usize>,
    ) -> Result<*const u8> {
        let slot = self.claim_data(len)?;
        // SAFETY: the slot holds `capacity() >= len` bytes; `src` as the
        // caller guarantees.
        unsafe { copy(src, slot, len) };
        self.publish_waking(wake);
        Ok(slot)
    }

    /// [`claim`](Self::claim) of `len` bytes of data, refused beyond the
    /// slot's capacity; the caller writes them and then publishes them.
    pub fn claim_data(&mut self, len: usize) -> Result<*mut u8> {
        if len > self.capacity() {
            return Err(Error::InvalidArgument {
                rank: self.e.rank(),
                op: self.op,
                detail: format!(
                    "{len} bytes exceed the shared-memory slot of {}",
                    self.capacity()
                ),
            });
        }
        self.claim(len)
    }

    /// Publishes that this rank runs the call as a schedule with `bytes`
    /// per rank (see [`SCHEDULE_MARK`]) in its mark line, so that a member
    /// that took the fast path and waits for this rank's line of the call
    /// fails instead of waiting for data that never comes: a blocking call
    /// on a communicator that qualifies for the fast paths, which ranks
    /// whose arguments differ could otherwise decide differently (one the
    /// fast path, the others messages: both would wait forever).
    ///
    /// Nothing is waited for. Not for the other members' decisions: that
    /// would make every such call a barrier (an oversubscribed 8-rank
    /// scatter of 8 bytes took 132 us instead of 1.1); this rank looks at
    /// what the members published for the call only once its schedule
    /// blocks ([`split_error`]), so a split fails every rank that waits on
    /// it. And not for the slot window: the mark line is rewritten at every
    /// such call and read only by its header, so a root that runs ahead
    /// of its readers (a scatter's) is not held back every `SLOT_LINES`
    /// calls, and the mark counts as this rank's arrival at the call for
    /// the members' reuse rule ([`claim`](Self::claim)). `locals` is the
    /// members' local ranks (what `self` was begun with).
    pub fn announce_schedule(&mut self, bytes: usize, locals: &Rc<[usize]>) -> Result<()> {
        if self.e.fast.failed != 0 {
            return Err(self.refuse());
        }
        let mark = SCHEDULE_MARK | (bytes & !MARKS);
        let mine = self.locals[self.me];
        self.area.mark(mine).publish(self.k, mark);
        self.e.fast.seen[mine] = self.k;
        // Nobody waits for it unless the members disagree (a member that
        // took the fast path then wakes by its bounded sleep): ringing every
        // member's doorbell on every call would wake sleeping ranks for
        // nothing.
        self.e.fast.split = None;
        self.e.fast.announced = Some(crate::engine::Announced {
            k: self.k,
            mark,
            locals: locals.clone(),
        });
        Ok(())
    }

    /// What member `r` published for this call when its line of the call
    /// holds nothing: it ran the call without the slots, as its mark line
    /// says (with its bytes when the mark names this very call).
    #[cold]
    #[inline(never)]
    fn skipped(&self, r: usize) -> Error {
        let m = self.area.mark(self.locals[r]);
        let got = if m.seq() == self.k {
            m.len()
        } else {
            SCHEDULE_MARK | BYTES_UNKNOWN
        };
        self.decision_mismatch(r, got, self.claimed)
    }

    /// Member `r` published `got` where this rank's own decision gives
    /// `mine` (either may carry [`SCHEDULE_MARK`]).
    #[cold]
    #[inline(never)]
    pub fn decision_mismatch(&self, r: usize, got: usize, mine: usize) -> Error {
        if got & FAIL_MARK != 0 {
            return self.failed_before(r, (got & !FAIL_MARK) as u64);
        }
        decision_error(self.e.rank(), self.op, self.k, self.group[r], got, mine)
    }

    /// Member `r` published [`FAIL_MARK`]: it found the members disagree
    /// in fast-path call `k`.
    #[cold]
    #[inline(never)]
    fn failed_before(&self, r: usize, k: u64) -> Error {
        let w = self.group[r];
        Error::Mismatch {
            rank: self.e.rank(),
            op: self.op,
            call: crate::error::CALL_UNKNOWN,
            a: w,
            b: self.e.rank(),
            values: Box::new(Disagreement {
                what: String::new(),
                a_value: format!(
                    "found the ranks disagree on {} (its error there names them) and takes part in no later one",
                    failed_call(k)
                ),
                b_value: "cannot complete this call without it".into(),
            }),
        }
    }

    /// This process found a disagreement in fast-path call
    /// `self.e.fast.failed`: publishes [`FAIL_MARK`] with it for this call
    /// instead of taking part, and fails it.
    #[cold]
    #[inline(never)]
    fn refuse(&mut self) -> Error {
        let k = self.e.fast.failed;
        if self.claim(0).is_ok() {
            self.claimed = FAIL_MARK | k as usize;
            self.stamp = 0;
            self.publish();
        }
        let me = self.e.rank();
        Error::Mismatch {
            rank: me,
            op: self.op,
            call: crate::error::CALL_UNKNOWN,
            a: me,
            b: me,
            values: Box::new(Disagreement {
                what: String::new(),
                a_value: format!(
                    "found the ranks disagree on {} (see that error)",
                    failed_call(k)
                ),
                b_value: "therefore takes part in no later one".into(),
            }),
        }
    }

    /// Keeps the call's number when it failed because the members disagree
    /// (see [`FastSeq::failed`](crate::engine::FastSeq)).
    #[cold]
    #[inline(never)]
    fn note_failure(&mut self, e: &Error) {
        if e.is_mismatch() && self.e.fast.failed == 0 {
            self.e.fast.failed = self.k;
            self.refuse_ahead();
        }
    }

    /// Publishes [`FAIL_MARK`] for the next fast-path call already, when
    /// its line is free without waiting (every member arrived late enough):
    /// a member that returned from this call and waits for this rank in
    /// the next one then fails naming the disagreement even if this rank
    /// never calls again (returns the error and finalizes), instead of
    /// losing it. This rank's own next call publishes the same again.
    #[cold]
    #[inline(never)]
    fn refuse_ahead(&mut self) {
        let next = self.e.fast.seq + 1;
        let window = SLOT_LINES as u64;
        if next > window && self.e.fast.min_other < next - window + 1 {
            return;
        }
        let mine = self.locals[self.me];
        let mark = FAIL_MARK | self.e.fast.failed as usize;
        if self.e.fast.seen[mine] < self.k {
            // This call's line is still unwritten: a member may wait for
            // it (two ranks that each think they are the root wait for each
            // other), and must fail too rather than see this rank leave.
            self.area.header(mine, self.k).publish(self.k, mark);
        }
        self.area.header(mine, next).publish(next, mark);
        for r in 0..self.size() {
            if r != self.me {
                let w = self.group[r];
                if let Some(Channel::Shm(c)) = self.e.peers.get_mut(w).map(|p| &mut p.chan) {
                    c.ring_peer();
                }
            }
        }
    }

    /// Fails this call with `why` (a disagreement in an earlier call that
    /// this rank learned of by a notice): like a rank that found one in the
    /// fast path, it publishes [`FAIL_MARK`] instead of taking part, in
    /// this and every later fast-path call, so that no member waits for it.
    #[cold]
    #[inline(never)]
    pub fn refuse_because(&mut self, why: Error) -> Error {
        if self.e.fast.failed == 0 {
            self.e.fast.failed = self.k;
        }
        let _ = self.refuse();
        why
    }

    /// Claims and publishes this rank's arrival without data.
    pub fn arrive(&mut self) -> Result<()> {
        self.claim(0)?;
        self.publish();
        Ok(())
    }

    /// Arrival of a rank whose buffer nobody reads this call (a bcast or
    /// scatter reader, a gather or reduce root): it only lets the writers
    /// reuse their buffers, so it is published every `ARRIVE_EVERY` calls,
    /// which spares the reader a cache-line transfer the writer would
    /// otherwise pull back on most calls.
    pub fn arrive_lazy(&mut self) -> Result<()> {
        if self.k % ARRIVE_EVERY == 0 {
            self.arrive()?;
        }
        Ok(())
    }

    /// Waits for member `r`'s publication of this call: `len` bytes
    /// (an error naming `r` when it published another length).
    pub fn data_of(&mut self, r: usize, len: usize) -> Result<*const u8> {
        let (p, got) = self.publication_of(r)?;
        if got != len {
            return Err(self.mismatch(r, got, len));
        }
        Ok(p)
    }

    /// The error of member `r` contributing `got` bytes (in its slot or
    /// as a message) where `want` were expected.
    #[cold]
    #[inline(never)]
    pub fn mismatch(&self, r: usize, got: usize, want: usize) -> Error {
        let (from, me) = (self.group[r], self.e.rank());
        Error::Mismatch {
            rank: me,
            op: self.op,
            call: crate::error::CALL_UNKNOWN,
            a: from,
            b: me,
            values: Box::new(Disagreement::transfer(from, me, got as u64, want as u64)),
        }
    }

    /// Waits for member `r`'s publication of this call, whatever its
    /// length: where it is and how long (at most `capacity`).
    pub fn publication_of(&mut self, r: usize) -> Result<(*const u8, usize)> {
        let len = self.line_of(r)?;
        let l = self.locals[r];
        if len & MARKS != 0 {
            return Err(self.decision_mismatch(r, len, self.claimed));
        }
        let len = len.min(self.area.capacity());
        Ok((self.area.data(l, self.k, len), len))
    }

    /// Waits for member `r`'s line of this call; gives its published
    /// length (a mark as it is): an error when the member ran the call
    /// without the slots ([`FastCall::skipped`]) or published data of a
    /// call with another stamp.
    fn line_of(&mut self, r: usize) -> Result<usize> {
        self.wait_seq(r, self.k)?;
        let h = self.area.header(self.locals[r], self.k);
        if h.seq() < self.k {
            return Err(self.skipped(r));
        }
        let w = h.len();
        // One test on the way of a correct call: a mark or another stamp
        // both differ above the length.
        if w & !LEN_BITS != self.stamp {
            return self.odd_line(r, w);
        }
        Ok(w & LEN_BITS)
    }

    /// [`line_of`](Self::line_of) of a word that is not this call's data: a
    /// mark (given as it is), or data under another stamp (an error).
    #[cold]
    #[inline(never)]
    fn odd_line(&self, r: usize, w: usize) -> Result<usize> {
        if w & MARKS != 0 {
            return Ok(w);
        }
        Err(self.stamp_mismatch(r, w))
    }

    /// Member `r` published data under stamp word `w`, another call than
    /// this rank's.
    #[cold]
    #[inline(never)]
    pub(super) fn stamp_mismatch(&self, r: usize, w: usize) -> Error {
        let got = (w >> STAMP_SHIFT) as u32;
        let mine = (self.stamp >> STAMP_SHIFT) as u32;
        let values = crate::stamp::disagreement(got, mine).unwrap_or_else(|| Disagreement {
            what: String::new(),
            a_value: format!("published a word {w:#x}"),
            b_value: "cannot read it".into(),
        });
        self.disagrees(self.group[r], values)
    }

    /// This call fails because member (world rank) `from` and this rank
    /// disagree on it as `values` says.
    fn disagrees(&self, from: usize, values: Disagreement) -> Error {
        let me = self.e.rank();
        Error::Mismatch {
            rank: me,
            op: self.op,
            call: self.k,
            a: from,
            b: me,
            values: Box::new(values),
        }
    }

    /// Waits until every member has published this call (failing if one
    /// published [`FAIL_MARK`]: the length shares the line just polled).
    pub fn wait_all(&mut self) -> Result<()> {
        for r in 0..self.size() {
            if r != self.me {
                let len = self.line_of(r)?;
                if len & FAIL_MARK != 0 {
                    return Err(self.failed_before(r, (len & !FAIL_MARK) as u64));
                }
            }
        }
        Ok(())
    }

    /// Waits until member `r` has published call `want` (or a later one).
    fn wait_seq(&mut self, r: usize, want: u64) -> Result<()> {
        self.wait_any(r, want, want)
    }

    /// Waits until member `r` has published call `a` or call `b` (or a
    /// later one in the same buffer), and records `min(a, b)` as seen.
    fn wait_any(&mut self, r: usize, a: u64, b: u64) -> Result<()> {
        let l = self.locals[r];
        let want = a.min(b);
        if self.e.fast.seen[l] >= want {
            return Ok(());
        }
        // The buffer of call `x` holds x - SLOT_BUFFERS, x, ...: a member
        // is never SLOT_BUFFERS calls ahead of a rank that waits on it, so
        // `>=` is exact.
        let (ha, hb) = (self.area.header(l, a), self.area.header(l, b));
        // A member that ran the call (or a later one) as messages marks it
        // in its mark line instead: that is its arrival, and a caller that
        // wanted its data finds the line empty ([`FastCall::skipped`]).
        let mk = self.area.mark(l);
        let done = || ha.seq() >= a || hb.seq() >= b || mk.seq() >= want;
        if !done() {
            // The flag alone is polled first (no channel pass), longer than
            // the engine spins: a peer a few calls behind publishes within
            // ~100-200 ns, while a yield costs a syscall. Oversubscribed (no
            // engine spins), the CPU goes to the peer at once.
            let checks = if self.e.spins == 0 { 0 } else { FLAG_SPIN };
            let exact = a == b;
            let b = Backoff::new(self.e.spins, self.e.yields).with_checks(checks);
            // Any member's death ends the wait: the member waited for may
            // be alive but have given up on this call because of it.
            let w = self.group[r];
            let group = self.group;
            self.e.watch = Some(w);
            // Waiting for one call's line (not a reuse window): a member
            // that publishes a later call instead disagrees on this one.
            if exact {
                self.e.fast.awaited = Some((l, a));
                self.e.fast.passed = None;
                self.e.fast.cycle = None;
            }
            let hung = self.e.wait_watched(b, |e| {
                done()
                    || !matches!(e.health_of(w), Health::Open)
                    || e.failed_member(group).is_some()
                    || e.fast.passed.is_some()
                    || e.fast.cycle.is_some()
            });
            self.e.watch = None;
            self.e.fast.awaited = None;
            if self.e.fast.wait_published {
                self.e.fast.wait_published = false;
                let mine = self.locals[self.me];
                self.area
                    .wait_word(mine)
                    .store(0, std::sync::atomic::Ordering::Release);
            }
            if !done() {
                if let Some(later) = self.e.fast.passed.take() {
                    return Err(self.passed_error(r, later));
                }
                if let Some(cycle) = self.e.fast.cycle.take() {
                    return Err(self.cycle_error(&cycle));
                }
                if let Some(waited) = hung {
                    let what = format!("shared-memory call {}", self.k);
                    return Err(self.e.hang_error(self.op, &what, &[w], waited));
                }
                if self.e.st.notices_waiting != 0 {
                    // The member may have left after telling this rank
                    // that a call it completed failed there (its notice
                    // came before its goodbye): that is the cause.
                    if let Some(x) = crate::schedule::run::earlier_notice(
                        self.e, self.ctx, None, group, self.me, self.op,
                    ) {
                        return Err(self.refuse_because(x));
                    }
                }
                let x = self.lost(w);
                if let Error::PeerLost { peer, .. } = &x {
                    let cause = self.e.peers.chan(*peer).and_then(|c| c.bye_cause());
                    self.e.st.lost_cause.get_or_insert(cause.unwrap_or(*peer));
                }
                return Err(x);
            }
        }
        let s = &mut self.e.fast.seen[l];
        *s = (*s).max(want);
        Ok(())
    }

    /// Member `r` published call `later` but not this one, which this rank
    /// waits for: the two disagree on this call (which collective it is,
    /// or who publishes in it: a root).
    #[cold]
    #[inline(never)]
    fn passed_error(&self, r: usize, later: u64) -> Error {
        let me = self.e.rank();
        self.disagrees(
            self.group[r],
            Disagreement {
                what: String::new(),
                a_value: format!(
                    "went on to shared-memory call {later} without taking part in call {} as rank {me} expects (the two disagree on the collective or its root)",
                    self.k
                ),
                b_value: "waits for its part".into(),
            },
        )
    }

    /// Members (local ranks `cycle`, this rank first) each wait for the
    /// next one's part of this call, the last for this rank's: none of
    /// them publishes first, so they disagree on the call (two ranks that
    /// each think they are a reduce's root).
    #[cold]
    #[inline(never)]
    fn cycle_error(&self, cycle: &[usize]) -> Error {
        let world = |l: usize| {
            self.locals
                .iter()
                .position(|&x| x == l)
                .map_or(l, |r| self.group[r])
        };
        let names: Vec<String> = cycle
            .iter()
            .map(|&l| format!("rank {}", world(l)))
            .collect();
        let other = cycle.get(1).map_or(self.e.rank(), |&l| world(l));
        self.disagrees(
            other,
            Disagreement {
                what: String::new(),
                a_value: format!(
                    "waits for another rank's part of shared-memory call {} in a cycle ({} and back), none of which publishes first: the ranks disagree on the collective or its root",
                    self.k,
                    names.join(" waits for ")
                ),
                b_value: "waits for its part".into(),
            },
        )
    }

    /// The error of a wait on member `w` that ended without its data:
    /// `w` itself lost, or another member that died.
    fn lost(&self, w: usize) -> Error {
        let peer = match self.e.health_of(w) {
            Health::Open => self.e.failed_member(self.group).unwrap_or(w),
            _ => w,
        };
        self.e.peer_lost(peer, self.op).unwrap_or(Error::PeerLost {
            rank: self.e.rank(),
            peer,
            op: self.op,
            reason: "it stopped answering".into(),
        })
    }
}

/// The buffers and sizes of one fast-path call, in bytes (the conventions
/// of [`crate::algorithms`]: `send` is read only, `recv` is written).
pub(crate) struct FastIo<'b> {
    /// World rank of this process and the collective, for errors.
    pub rank: usize,
    pub op: Op,
    pub esize: usize,
    /// Elements of this rank's block (see the collective).
    pub count: usize,
    /// Per-rank counts and displacements in elements (the v-collectives'
    /// send side, reduce_scatter); empty for the uniform collectives and
    /// where this rank does not know them (gatherv, scatterv non-roots).
    pub counts: &'b [usize],
    pub displs: &'b [usize],
    /// Receive counts and displacements of alltoallv.
    pub rcounts: &'b [usize],
    pub rdispls: &'b [usize],
    pub root: usize,
    pub in_place: bool,
    pub send: *const u8,
    pub send_len: usize,
    pub recv: *mut u8,
    pub recv_len: usize,
    pub reduce: Option<&'b crate::ops::ByteReduce>,
}

impl FastIo<'_> {
    /// Elements of rank `r`'s block.
    pub fn count_of(&self, r: usize) -> usize {
        self.counts.get(r).copied().unwrap_or(self.count)
    }

    /// Element offset of rank `r`'s block.
    pub fn displ_of(&self, r: usize) -> usize {
        self.displs.get(r).copied().unwrap_or(r * self.count)
    }

    /// Rank `r`'s block in bytes: offset and length.
    pub fn block(&self, r: usize) -> (usize, usize) {
        (self.displ_of(r) * self.esize, self.count_of(r) * self.esize)
    }

    #[inline]
    fn range(&self, what: &str, cap: usize, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).map_or(true, |e| e > cap) {
            return Err(self.range_err(what, cap, off, len));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn range_err(&self, what: &str, cap: usize, off: usize, len: usize) -> Error {
        Error::InvalidArgument {
            rank: self.rank,
            op: self.op,
            detail: format!("{what}: {len} bytes at {off} exceed the buffer of {cap}"),
        }
    }

    /// `len` bytes of the send buffer at byte `off` (checked).
    #[inline]
    pub fn send_at(&self, off: usize, len: usize) -> Result<*const u8> {
        self.range("send", self.send_len, off, len)?;
        // SAFETY: in bounds of the send buffer (checked above).
        Ok(unsafe { self.send.add(off) })
    }

    /// `len` bytes of the receive buffer at byte `off` (checked).
    #[inline]
    pub fn recv_at(&self, off: usize, len: usize) -> Result<*mut u8> {
        self.range("receive", self.recv_len, off, len)?;
        // SAFETY: in bounds of the receive buffer (checked above).
        Ok(unsafe { self.recv.add(off) })
    }

    /// `len` bytes of the input (send, or receive when in place) at `off`.
    #[inline]
    pub fn input_at(&self, off: usize, len: usize) -> Result<*const u8> {
        if self.in_place {
            self.recv_at(off, len).map(|p| p as *const u8)
        } else {
            self.send_at(off, len)
        }
    }

    /// `dst = op(dst, src)` over `len` bytes.
    ///
    /// # Safety
    /// `dst` writable and `src` readable for `len` bytes, not overlapping.
    pub unsafe fn reduce(&self, dst: *mut u8, src: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        if let Some(f) = self.reduce {
            // SAFETY: the caller guarantees both ranges.
            let (d, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(dst, len),
                    std::slice::from_raw_parts(src, len),
                )
            };
            f.apply(d, s, false);
        }
    }
}

/// Copies `len` bytes (nothing when `src == dst`).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes; the ranges are equal
/// or disjoint.
#[inline(always)]
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    if len == 0 || std::ptr::eq(src, dst) {
        return;
    }
    // Small copies (most fast-path calls) in registers: a call into the
    // library's memmove costs more than the copy.
    // SAFETY: the caller guarantees the ranges; distinct ranges of the
    // user's buffers and the slots never partly overlap. Both words are
    // read before either is written, and unaligned accesses need no
    // alignment.
    unsafe {
        if len <= 16 {
            if len >= 8 {
                let (a, b) = (
                    (src as *const u64).read_unaligned(),
                    (src.add(len - 8) as *const u64).read_unaligned(),
                );
                (dst as *mut u64).write_unaligned(a);
                (dst.add(len - 8) as *mut u64).write_unaligned(b);
            } else if len >= 4 {
                let (a, b) = (
                    (src as *const u32).read_unaligned(),
                    (src.add(len - 4) as *const u32).read_unaligned(),
                );
                (dst as *mut u32).write_unaligned(a);
                (dst.add(len - 4) as *mut u32).write_unaligned(b);
            } else {
                for i in 0..len {
                    *dst.add(i) = *src.add(i);
                }
            }
            return;
        }
        std::ptr::copy_nonoverlapping(src, dst, len);
    }
}

/// Bytes one rank publishes in a fast-path `c` (the same on every rank
/// for valid arguments; a tree gather that would need more runs flat).
pub(crate) fn bytes_needed(c: crate::algorithms::Collective, io: &FastIo, n: usize) -> usize {
    use crate::algorithms::Collective::*;
    let block = io.count * io.esize;
    match c {
        Barrier => 0,
        Bcast | Reduce | Allreduce | Scan | Exscan | Gather | Allgather => block,
        Scatter | Alltoall => n * block,
        Allgatherv => (0..n).map(|r| io.count_of(r)).max().unwrap_or(0) * io.esize,
        ReduceScatter | ReduceScatterBlock => {
            (0..n).map(|r| io.count_of(r)).sum::<usize>() * io.esize
        }
        // Every rank sizes its blocks itself (`blocks`).
        Gatherv | Scatterv | Alltoallv => 0,
    }
}

/// Runs the fast path of `c`. Inlined with the dispatch below into every
/// blocking collective, whose `c` is a constant there: the call goes
/// straight to its collective's fast path.
#[inline(always)]
pub(crate) fn run(c: crate::algorithms::Collective, f: &mut FastCall, io: &FastIo) -> Result<()> {
    if f.e.fast.failed != 0 {
        return Err(f.refuse());
    }
    let r = run_call(c, f, io);
    if let Err(x) = &r {
        f.note_failure(x);
    }
    r
}

#[inline(always)]
fn run_call(c: crate::algorithms::Collective, f: &mut FastCall, io: &FastIo) -> Result<()> {
    use crate::algorithms::Collective::*;
    match c {
        Barrier => barrier::run(f),
        Bcast if f.tree() => bcast_tree::run(f, io),
        Bcast => bcast::run(f, io),
        Reduce if f.tree() => reduce_tree::run(f, io),
        Reduce => reduce::run(f, io),
        Allreduce if f.tree() => allreduce_tree::run(f, io),
        Allreduce => allreduce::run(f, io),
        Gather if f.tree() && gather_tree::fits(f, io) => gather_tree::run(f, io),
        Gather | Gatherv => gather::run(f, io),
        Scatter if f.tree() => scatter_tree::run(f, io),
        Scatter => scatter::run(f, io),
        Scatterv => scatter::run_v(f, io),
        Allgather | Allgatherv => allgather::run(f, io),
        Alltoall => alltoall::run(f, io),
        Alltoallv => alltoall::run_v(f, io),
        ReduceScatter | ReduceScatterBlock => reduce_scatter::run(f, io),
        Scan => scan::run(f, io, true),
        Exscan => scan::run(f, io, false),
    }
}

/// Folds the publications of ranks `0..upto` into `acc` in rank order,
/// `((x0 op x1) op x2) ...`, so every rank that folds the same ranks gets
/// the same bits. Each publication is `total` bytes, of which the `len`
/// at `off` are folded; this rank's own is read from `own` (its slot: in
/// place, the accumulator may already have overwritten the input).
///
/// # Safety
/// `own` readable for `off + len` bytes; `acc` writable for `len` bytes and
/// disjoint from every slot.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn fold(
    f: &mut FastCall,
    io: &FastIo,
    upto: usize,
    own: *const u8,
    total: usize,
    off: usize,
    len: usize,
    acc: *mut u8,
) -> Result<()> {
    for r in 0..upto {
        let src = if r == f.rank() {
            own
        } else {
            f.data_of(r, total)?
        };
        // SAFETY: a publication (or our own slot) holds `total >= off +
        // len` bytes; `acc` as the caller guarantees.
        unsafe {
            let src = src.add(off);
            if r == 0 {
                copy(src, acc, len);
            } else {
                io.reduce(acc, src, len);
            }
        }
    }
    Ok(())
}
