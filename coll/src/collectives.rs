//! The collective operations of [`Comm`], blocking and nonblocking.
//!
//! Every call validates its arguments (bad ones are
//! [`Error::InvalidArgument`] naming the rank and the collective), selects
//! an algorithm ([`crate::select`]), builds this rank's
//! [`Schedule`](crate::schedule::Schedule) and runs it on the
//! communicator's internal context (`ctx + 1`) with a tag unique to the
//! call. The `i`-prefixed forms return a [`CollRequest`] that the progress
//! loop advances whatever the program waits on, so several may be in flight
//! (on one or several communicators). As in MPI, every rank of the
//! communicator must call the same collectives in the same order with
//! matching sizes.
//!
//! Counts and displacements are in elements.
//!
//! ```no_run
//! use ibcoll::{CollRequest, ReduceOp};
//! let world = ibcoll::init()?;
//! let mine = [world.rank() as f64; 4];
//! let mut sum = [0.0; 4];
//! world.allreduce(&mine, &mut sum, ReduceOp::Sum)?; // same bits on every rank
//!
//! // Two collectives in flight at once, on two communicators.
//! let other = world.dup()?;
//! let mut cfg = vec![0u8; 1 << 20];
//! let me = [world.rank() as u32];
//! let mut ranks = vec![0u32; world.size()];
//! ibcoll::scope(|s| {
//!     let a = world.ibcast(s, &mut cfg, 0)?;
//!     let b = other.iallgather(s, &me, &mut ranks)?;
//!     CollRequest::wait_all([a, b])
//! })?;
//!
//! // Force an algorithm (tests, benchmarks); IBCOLL_ALLREDUCE_ALGORITHM=ring
//! // does the same from the environment.
//! ibcoll::select::force_algorithm(ibcoll::Collective::Allreduce, Some("ring"))?;
//! # Ok::<(), ibcoll::Error>(())
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::rc::{Rc, Weak};

use crate::algorithms::{find, node_groups, prefix, Args, Collective};
use crate::check::{self, Sig, Verdict};
use crate::comm::Comm;
use crate::datatype::{as_bytes, as_bytes_mut, Datatype};
use crate::engine::cell::{EngineCell, EngineMut};
use crate::error::{Disagreement, Error, Op, Result};
use crate::fastpath::{self, FastCall, FastIo};
use crate::ops::{byte_reduce, ByteReduce, ReduceOp, Reducible};
use crate::schedule::run::{self, Run, Wire};
use crate::schedule::Schedule;
use crate::scope::Scope;
use crate::select;

mod raw;

/// A nonblocking collective, started in a [`Scope`] whose lifetime
/// `'scope` its buffers are borrowed for.
///
/// Waiting or testing gives the outcome. Dropping an incomplete request
/// waits for the collective; forgetting or leaking it is harmless: the
/// scope finishes the collective before its buffers can be used again (see
/// [`crate::scope`]). Neither `Send` nor `Sync`.
#[must_use = "a collective request does nothing unless waited for or tested"]
pub struct CollRequest<'scope> {
    /// Weak, as for [`crate::Request`].
    eng: Weak<EngineCell>,
    run: Option<Rc<RefCell<Run>>>,
    outcome: Option<Result<()>>,
    _buf: PhantomData<&'scope mut [u8]>,
}

impl CollRequest<'_> {
    /// Takes the finished run's outcome; a reduction operation's panic is
    /// resumed here, once the collective no longer touches any buffer.
    fn finish(&mut self) {
        if let Some(r) = self.run.take() {
            run::unregister(&r);
            let (res, panic) = {
                let mut rr = r.borrow_mut();
                (rr.take_result(), rr.take_panic())
            };
            self.outcome = Some(res);
            if let Some(p) = panic {
                std::panic::resume_unwind(p);
            }
        }
    }

    /// Blocks until the collective completes.
    pub fn wait(mut self) -> Result<()> {
        if let Some(r) = self.run.clone() {
            let Some(eng) = self.eng.upgrade() else {
                return Err(finalized(&r));
            };
            run::drive(&mut eng.borrow_mut(), &r);
            self.finish();
        }
        self.outcome.take().unwrap_or(Ok(()))
    }

    /// Makes progress once; `Ok(true)` once complete.
    pub fn test(&mut self) -> Result<bool> {
        if let Some(r) = self.run.clone() {
            let Some(eng) = self.eng.upgrade() else {
                self.run = None;
                return Err(finalized(&r));
            };
            {
                let mut e = eng.borrow_mut();
                e.progress();
                r.borrow_mut().step(&mut e);
            }
            if !r.borrow().is_done() {
                return Ok(false);
            }
            self.finish();
        }
        match &self.outcome {
            Some(Err(e)) => Err(e.duplicate()),
            _ => Ok(true),
        }
    }

    /// Waits for every request; the first error (after all completed).
    pub fn wait_all<'b>(reqs: impl IntoIterator<Item = CollRequest<'b>>) -> Result<()> {
        let mut first = None;
        for r in reqs {
            if let Err(e) = r.wait() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for CollRequest<'_> {
    fn drop(&mut self) {
        let Some(r) = self.run.take() else { return };
        // Gone: the collective was settled when the engine finalized.
        let Some(eng) = self.eng.upgrade() else {
            return;
        };
        let guard = eng.try_borrow_mut();
        match guard {
            Some(mut e) => {
                if std::thread::panicking() {
                    // Unwinding: do not wait on the peers.
                    r.borrow_mut().cancel(&mut e);
                }
                run::drive(&mut e, &r);
            }
            None => {
                eprintln!(
                    "ibcoll: a pending collective request was dropped while ibcoll was busy \
                     with another call (from inside a reduction operation); aborting the process"
                );
                std::process::abort();
            }
        }
        run::unregister(&r);
        // A panic of its reduction stays unobserved when the request is
        // dropped (the engine is poisoned already); resuming it from a
        // destructor could abort a program that is unwinding.
    }
}

/// The outcome of a collective waited for after the last communicator was
/// dropped (it was settled then).
fn finalized(r: &RefCell<Run>) -> Error {
    Error::InvalidArgument {
        rank: 0,
        op: r.borrow().op(),
        detail: "every communicator was dropped before this request was waited for \
                 (ibcoll finalized and settled the collective then)"
            .into(),
    }
}

/// Per-communicator tag sequence (by context id; ids are never reused).
#[derive(Default)]
struct CommInfo {
    seq: u32,
    /// Collectives checked so far (`IBCOLL_CHECK`).
    checks: u64,
}

/// What a communicator's collectives learn about its group on first use.
pub(crate) struct CollInfo {
    /// Node of every rank.
    nodes: Rc<[usize]>,
    /// The largest number of ranks on one node.
    ppn: usize,
    /// Local rank of every member when the communicator qualifies for the
    /// shared-memory fast paths (see `crate::fastpath::eligible`).
    fast: Option<Rc<[usize]>>,
    /// The transport joining the communicator's nodes, the same on every
    /// rank (selection's `Net`).
    net: select::Net,
    /// The last algorithm choice per collective.
    memo: select::Memo,
    /// Per collective: 0 not yet known, 1 if no byte count makes selection
    /// pick the fast path on this communicator, 2 if some does.
    fast_possible: [std::cell::Cell<u8>; 16],
    /// Per collective, the last schedule built for a uniform call and what
    /// it was built for: a loop of the same call reuses it instead of
    /// building (and allocating) its rounds again on every call.
    schedules: [std::cell::RefCell<Option<KeptSchedule>>; 16],
}

/// A schedule and what it was built for.
type KeptSchedule = (SchedKey, Rc<Schedule>);

/// What a uniform collective's schedule depends on besides the
/// communicator (its size, this rank's place, the nodes).
#[derive(Clone, PartialEq, Eq)]
struct SchedKey {
    alg: &'static str,
    count: usize,
    esize: usize,
    root: usize,
    in_place: bool,
    seg: usize,
    window: usize,
    canonical: bool,
    /// Built as if all ranks shared one node ([`crate::algorithms::in_rank_order`]).
    flat: bool,
}

impl CollInfo {
    fn schedule(&self, coll: Collective, k: &SchedKey) -> Option<Rc<Schedule>> {
        match &*self.schedules[coll.index()].borrow() {
            Some((have, x)) if have == k => Some(x.clone()),
            _ => None,
        }
    }

    fn keep_schedule(&self, coll: Collective, k: SchedKey, x: &Rc<Schedule>) {
        *self.schedules[coll.index()].borrow_mut() = Some((k, x.clone()));
    }

    /// Whether a member of this communicator calling `coll` could take
    /// the shared-memory fast path with some byte count: only then can the
    /// members' decisions split, and only then does a schedule need its
    /// announcement in the slots (whose window bounds how far a root runs
    /// ahead: an oversubscribed 8-rank scatterv of 8 B took 4.7 us with it,
    /// 1.2 without). Decided once per collective from the same selection
    /// every member runs.
    fn may_take_fast_path(&self, coll: Collective, size: usize, shm_bytes: usize) -> bool {
        let slot = &self.fast_possible[coll.index()];
        if slot.get() == 0 {
            let mut b = 1usize;
            let mut any = false;
            loop {
                let b_now = b.min(shm_bytes.max(1));
                any |= select::choose(coll, size, self.ppn, b_now, self.net, true)
                    .map_or(true, |ch| ch.algorithm == crate::algorithms::SHM);
                if any || b_now >= shm_bytes {
                    break;
                }
                b *= 8;
            }
            slot.set(if any { 2 } else { 1 });
        }
        slot.get() == 2
    }
}

/// Hashes a context id as itself (no SipHash on every call).
#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.0 = u64::from(i);
    }
}

/// A reduction's codes for the call's stamp and `IBCOLL_CHECK`: the op's
/// and the element type's (`stamp::OPS`, `stamp::type_code`; a byte-level
/// call's `ByteReduce::codes`).
pub(crate) type OpSig = (u8, u8);

/// A reduction's buffers and operation as bytes (the composed algorithms
/// run their phases with it: `Comm::reduce_bytes`).
pub(crate) struct ReduceArgs<'a> {
    /// `None`: in place in `recv`.
    pub send: Option<&'a [u8]>,
    pub recv: &'a mut [u8],
    pub esize: usize,
    pub k: &'a ByteReduce,
    pub sig: OpSig,
}

type CtxMap = HashMap<u32, CommInfo, std::hash::BuildHasherDefault<IdHasher>>;

thread_local! {
    static COMMS: RefCell<CtxMap> = RefCell::new(CtxMap::default());
}

/// The stamp of the library's own exchanges (the network agreement,
/// `IBCOLL_CHECK`'s): none. Every rank runs them alike, and the two phases
/// of an alltoallv check share a tag, so their messages must not count as
/// another call's.
const INTERNAL: u32 = 0;

/// Tags below this are used by `split` and friends.
const TAG_BASE: i32 = 16;

/// Tags of the signature exchanges (`IBCOLL_CHECK`): above every
/// collective's tag (`TAG_BASE` plus a 29-bit sequence), so an exchange
/// never matches a collective's messages.
const TAG_CHECK: i32 = TAG_BASE + (1 << 29);

/// One call, described for the algorithms. The v-layouts borrow the
/// caller's arrays (a blocking call copies nothing); a schedule copies them
/// into its `Args`. Empty where this rank does not know them (a gatherv or
/// scatterv non-root), which a schedule reads as zeros. Only plain fields,
/// so that a blocking call keeps the whole description in registers.
struct Spec<'c> {
    coll: Collective,
    esize: usize,
    count: usize,
    counts: &'c [usize],
    displs: &'c [usize],
    rcounts: &'c [usize],
    rdispls: &'c [usize],
    root: usize,
    in_place: bool,
    canonical: bool,
    /// Every block is `count` long at `i * count` (`counts` and friends
    /// are made only when a schedule needs them).
    uniform: bool,
    bytes: usize,
    /// Reduction operation (`check::op_code`) and element type
    /// (`check::type_code`), 0 for none, for the signature exchange of
    /// `IBCOLL_CHECK`.
    rop: u8,
    rty: u8,
}

impl<'c> Spec<'c> {
    fn new(coll: Collective, esize: usize, count: usize) -> Spec<'c> {
        Spec {
            coll,
            esize,
            count,
            counts: &[],
            displs: &[],
            rcounts: &[],
            rdispls: &[],
            root: 0,
            in_place: false,
            canonical: false,
            uniform: false,
            bytes: count * esize,
            rop: 0,
            rty: 0,
        }
    }

    /// The call's stamp (`crate::stamp`).
    #[inline]
    fn stamp(&self) -> u32 {
        crate::stamp::stamp(self.coll, self.root, self.rop, self.rty)
    }

    fn uniform(mut self) -> Spec<'c> {
        self.uniform = true;
        self.canonical = true;
        self
    }
}

/// One validated call, not yet selected: a blocking call may take the
/// shared-memory fast path, a nonblocking one always runs a schedule. It
/// borrows the caller's buffers for `'b` (so a nonblocking collective's
/// request can live no longer than they do) and the v-layouts for `'v`.
/// Plain fields (pointers rather than slices) so that a blocking call
/// keeps the whole description in registers.
struct Call<'b, 'v> {
    spec: Spec<'v>,
    send: *const u8,
    send_len: usize,
    recv: *mut u8,
    recv_len: usize,
    reduce: Option<ByteReduce>,
    _bufs: PhantomData<(&'b [u8], &'b mut [u8])>,
}

impl Comm {
    fn coll_err(&self, c: Collective, detail: String) -> Error {
        Error::InvalidArgument {
            rank: self.world_rank(self.rank()).unwrap_or(0),
            op: Op::Collective(c),
            detail: format!("(communicator rank {}) {detail}", self.rank()),
        }
    }

    #[inline]
    fn check_root(&self, c: Collective, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(self.root_err(c, root));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn root_err(&self, c: Collective, root: usize) -> Error {
        self.coll_err(
            c,
            format!(
                "root {root} is not below the communicator size {}",
                self.size()
            ),
        )
    }

    #[inline]
    fn check_op<T: Reducible>(&self, c: Collective, op: &ReduceOp<T>) -> Result<()> {
        if !T::supports(op) {
            return Err(self.coll_err(
                c,
                format!("operation {} does not apply to {}", op.name(), T::NAME),
            ));
        }
        Ok(())
    }

    /// Checks a v-layout: `counts`/`displs` have one entry per rank and
    /// every block fits in `len` elements.
    #[inline]
    fn check_layout(
        &self,
        c: Collective,
        what: &str,
        counts: &[usize],
        displs: &[usize],
        len: usize,
    ) -> Result<()> {
        let n = self.size();
        let fits = counts.len() == n
            && displs.len() == n
            && counts
                .iter()
                .zip(displs)
                .all(|(&k, &d)| k.checked_add(d).is_some_and(|e| e <= len));
        if fits {
            Ok(())
        } else {
            Err(self.layout_err(c, what, counts, displs, len))
        }
    }

    /// What is wrong with a layout that [`check_layout`](Self::check_layout)
    /// refused.
    #[cold]
    #[inline(never)]
    fn layout_err(
        &self,
        c: Collective,
        what: &str,
        counts: &[usize],
        displs: &[usize],
        len: usize,
    ) -> Error {
        let n = self.size();
        if counts.len() != n || displs.len() != n {
            return self.coll_err(
                c,
                format!(
                    "{what}: {} counts and {} displacements for {n} ranks",
                    counts.len(),
                    displs.len()
                ),
            );
        }
        let i = (0..n)
            .find(|&i| counts[i].checked_add(displs[i]).map_or(true, |e| e > len))
            .unwrap_or(0);
        self.coll_err(
            c,
            format!(
                "{what}: block {i} ({} elements at {}) exceeds the buffer of {len}",
                counts[i], displs[i]
            ),
        )
    }

    fn next_tag(&self) -> i32 {
        let ctx = self.ctx + 1;
        COMMS.with(|m| {
            let mut m = m.borrow_mut();
            let info = m.entry(ctx).or_default();
            let t = info.seq;
            info.seq = (info.seq + 1) % (1 << 29);
            TAG_BASE + t as i32
        })
    }

    /// The node of every rank of the communicator and the most ranks on
    /// one node (from the process manager's map, or exchanged on first use
    /// without one), and whether the communicator qualifies for the
    /// shared-memory fast paths. Errors of the first-use exchange are those
    /// of `caller`, the collective the program called.
    #[inline]
    fn coll_info(&self, caller: Collective) -> Result<&CollInfo> {
        match self.coll.get() {
            Some(i) => Ok(i),
            None => self
                .coll_info_first(caller)
                .map_err(|e| e.with_op(Op::Collective(caller))),
        }
    }

    #[cold]
    #[inline(never)]
    fn coll_info_first(&self, caller: Collective) -> Result<&CollInfo> {
        let n = self.size();
        // The process manager's map gives every rank's node without a
        // message (an allgather of node ids is n - 1 steps at scale).
        let known: Option<Vec<usize>> = {
            let e = self.eng.borrow();
            self.group.iter().map(|&w| e.node_of(w)).collect()
        };
        let nodes: Rc<[usize]> = if n == 1 {
            vec![self.node_id()].into()
        } else if let Some(k) = known {
            k.into()
        } else {
            let mine = [self.node_id() as u64];
            let mut all = vec![0u64; n];
            let tag = self.next_tag();
            self.allgather_internal(as_bytes(&mine), as_bytes_mut(&mut all), tag)?;
            all.iter().map(|&x| x as usize).collect()
        };
        let ppn = node_groups(&nodes, n)
            .iter()
            .map(|g| g.len())
            .max()
            .unwrap_or(1);
        let fast = fastpath::eligible(&self.eng.borrow(), &self.group).map(Into::into);
        let net = if nodes.iter().all(|&x| x == nodes[0]) {
            select::Net::Shm
        } else {
            self.agree_net(caller)?
        };
        Ok(self.coll.get_or_init(|| CollInfo {
            nodes,
            ppn,
            fast,
            net,
            memo: select::Memo::default(),
            fast_possible: Default::default(),
            schedules: Default::default(),
        }))
    }

    /// The transport joining this multi-node communicator's nodes, agreed
    /// by every member (once, at the first collective): each rank names
    /// the transport it reaches other nodes by (rdma where it has a verbs
    /// endpoint and the mode allows it), and the communicator takes the
    /// slowest, so that every rank selects alike even when some nodes
    /// lack a device. One byte, recursive doubling: log2(size) steps. It
    /// runs as part of `caller`, the first collective (so the hang
    /// watchdog names that one), before its `IBCOLL_CHECK` exchange on
    /// blocking and nonblocking calls alike (either order on both would
    /// let a blocking and a nonblocking first call wait for each other).
    fn agree_net(&self, caller: Collective) -> Result<select::Net> {
        use crate::config::TransportMode;
        let mine = {
            let e = self.eng.borrow();
            match e.cfg.transport {
                TransportMode::Tcp => select::Net::Tcp,
                TransportMode::Rdma => select::Net::Rdma,
                TransportMode::Auto if e.me.verbs => select::Net::Rdma,
                TransportMode::Auto => select::Net::Tcp,
            }
        };
        let spec = Spec::new(Collective::Allreduce, 1, 1).uniform();
        let args = self.args(&spec, "recursive_doubling", &[], 65536, 8);
        let sched = (find(Collective::Allreduce, "recursive_doubling").and_then(|a| a.schedule()))
            .map(|b| b(&args))
            .unwrap_or_default();
        let send = [mine.code()];
        let mut recv = [0u8];
        let tag = self.next_tag();
        // SAFETY: `send` and `recv` outlive the blocking run below.
        let mut r = unsafe {
            Run::new(
                Rc::new(sched),
                send.as_ptr(),
                send.len(),
                recv.as_mut_ptr(),
                recv.len(),
                Some(byte_reduce::<u8>(ReduceOp::Max)),
                self.wire(tag, INTERNAL),
                Op::Collective(caller),
            )
        }?;
        run::run_blocking(&mut self.eng.borrow_mut(), &mut r)?;
        Ok(select::Net::from_code(recv[0]))
    }

    /// The transport joining this communicator's nodes as selection sees
    /// it (`shm` within one node); agreed by every member at the first
    /// collective, so this is a collective call on a communicator that has
    /// run none yet.
    pub fn network(&self) -> Result<select::Net> {
        self.coll_info(Collective::Barrier).map(|i| i.net)
    }

    /// Ring allgather of `send` (one block of every rank) into `recv`, on
    /// the internal context with tag `tag`, blocking.
    fn allgather_internal(&self, send: &[u8], recv: &mut [u8], tag: i32) -> Result<()> {
        let spec = Spec::new(Collective::Allgather, send.len().max(1), 1).uniform();
        let args = self.args(&spec, "ring", &[], 65536, 8);
        let sched = (find(Collective::Allgather, "ring").and_then(|a| a.schedule()))
            .map(|b| b(&args))
            .unwrap_or_default();
        // SAFETY: `send` and `recv` outlive the blocking run below.
        let mut r = unsafe {
            Run::new(
                Rc::new(sched),
                send.as_ptr(),
                send.len(),
                recv.as_mut_ptr(),
                recv.len(),
                None,
                self.wire(tag, INTERNAL),
                Op::Collective(Collective::Allgather),
            )
        }?;
        run::run_blocking(&mut self.eng.borrow_mut(), &mut r)
    }

    /// Linear alltoall of `send` (one `u64` for every rank) into `recv`,
    /// on the internal context with tag `tag`, blocking (at most 8 peers
    /// each way in flight).
    fn alltoall_internal(&self, send: &[u64], recv: &mut [u64], tag: i32) -> Result<()> {
        let spec = Spec::new(Collective::Alltoall, 8, 1).uniform();
        let args = self.args(&spec, "linear", &[], 65536, 8);
        let sched = (find(Collective::Alltoall, "linear").and_then(|a| a.schedule()))
            .map(|b| b(&args))
            .unwrap_or_default();
        let (send, recv) = (as_bytes(send), as_bytes_mut(recv));
        // SAFETY: `send` and `recv` outlive the blocking run below.
        let mut r = unsafe {
            Run::new(
                Rc::new(sched),
                send.as_ptr(),
                send.len(),
                recv.as_mut_ptr(),
                recv.len(),
                None,
                self.wire(tag, INTERNAL),
                Op::Collective(Collective::Alltoall),
            )
        }?;
        run::run_blocking(&mut self.eng.borrow_mut(), &mut r)
    }

    /// `IBCOLL_CHECK` for an alltoallv whose signatures agree: every rank
    /// sends every other the bytes it sends it (one alltoall of `u64`s) and
    /// compares them with the bytes it expects from it; an allgather of
    /// what each found makes every rank fail with the same error (the
    /// first receiver, in rank order, that expects another length).
    #[cold]
    #[inline(never)]
    fn check_alltoallv(&self, s: &Spec<'_>, call: u64, tag: i32) -> Result<()> {
        let n = self.size();
        let op = Op::Collective(s.coll);
        let sent: Vec<u64> = s.counts.iter().map(|&c| (c * s.esize) as u64).collect();
        let mut got = vec![0u64; n];
        self.alltoall_internal(&sent, &mut got, tag)
            .map_err(|e| e.with_op(op))?;
        let bad = (0..n).find(|&j| got[j] != (s.rcounts[j] * s.esize) as u64);
        let mut rec = [0u64; 4];
        if let Some(j) = bad {
            rec = [1, j as u64, got[j], (s.rcounts[j] * s.esize) as u64];
        }
        let mut all = vec![0u64; 4 * n];
        self.allgather_internal(as_bytes(&rec), as_bytes_mut(&mut all), tag)
            .map_err(|e| e.with_op(op))?;
        let Some(b) = all.chunks(4).position(|r| r[0] != 0) else {
            return Ok(());
        };
        let r = &all[4 * b..4 * b + 4];
        let (from, to) = (self.group[r[1] as usize % n], self.group[b]);
        Err(Error::Mismatch {
            rank: self.world_rank(self.rank()).unwrap_or(0),
            op,
            call,
            a: from,
            b: to,
            values: Box::new(Disagreement::transfer(from, to, r[2], r[3])),
        })
    }

    /// The number of this call among the communicator's checked
    /// collectives.
    fn next_check(&self) -> u64 {
        COMMS.with(|m| {
            let mut m = m.borrow_mut();
            let info = m.entry(self.ctx + 1).or_default();
            let c = info.checks;
            info.checks += 1;
            c
        })
    }

    /// `IBCOLL_CHECK`: exchanges the signature of call `s` with every rank
    /// of the communicator and fails it (on every rank alike) when they
    /// disagree.
    #[cold]
    #[inline(never)]
    fn check_call(&self, s: &Spec<'_>, nb: bool) -> Result<()> {
        let n = self.size();
        let op = Op::Collective(s.coll);
        let call = self.next_check();
        if n == 1 {
            return Ok(());
        }
        let me = self.rank();
        let layout = match s.coll {
            Collective::Gatherv | Collective::Scatterv if me == s.root => Some(s.counts),
            Collective::Allgatherv | Collective::ReduceScatter => Some(s.counts),
            _ => None,
        };
        let sig = Sig {
            coll: s.coll,
            call,
            nb,
            root: s.root as u64,
            bytes: (s.count * s.esize) as u64,
            rop: s.rop,
            rty: check::type_field(check::type_name_of(s.rty)),
            layout: layout.map(|c| check::layout_hash(c, s.esize)),
        };
        let tag = TAG_CHECK + (call % (1 << 29)) as i32;
        let mut all = vec![0u8; n * check::RECORD];
        self.allgather_internal(&sig.encode(), &mut all, tag)
            .map_err(|e| e.with_op(op))?;
        let recs: Vec<Sig> = all
            .chunks(check::RECORD)
            .enumerate()
            .map(|(i, r)| {
                Sig::decode(r).ok_or_else(|| Error::Protocol {
                    rank: self.world_rank(me).unwrap_or(0),
                    peer: self.group[i],
                    detail: "unreadable collective signature".into(),
                })
            })
            .collect::<Result<_>>()?;
        let wme = self.world_rank(me).unwrap_or(0);
        match check::verify(&recs, &self.group, wme, op) {
            Verdict::Agree if s.coll == Collective::Alltoallv => self.check_alltoallv(s, call, tag),
            Verdict::Agree => Ok(()),
            Verdict::Mismatch(e) => Err(e),
            Verdict::Layout => {
                // Every rank saw the same records, so every rank is here:
                // a second exchange says which entry is wrong.
                let owns: Vec<u64> = recs.iter().map(|r| r.bytes).collect();
                let d = layout.and_then(|c| check::layout_detail(c, s.esize, &owns));
                let mut rec = [0u8; 24];
                if let Some((i, v)) = d {
                    rec[0] = 1;
                    rec[8..16].copy_from_slice(&i.to_le_bytes());
                    rec[16..24].copy_from_slice(&v.to_le_bytes());
                }
                let mut all = vec![0u8; n * 24];
                self.allgather_internal(&rec, &mut all, tag)
                    .map_err(|e| e.with_op(op))?;
                let u = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
                let details: Vec<Option<(u64, u64)>> = all
                    .chunks(24)
                    .map(|r| (r[0] != 0).then(|| (u(&r[8..16]), u(&r[16..24]))))
                    .collect();
                Err(
                    check::layout_error(&details, &owns, call, &self.group, wme, op)
                        .unwrap_or_else(|| {
                            self.coll_err(
                                s.coll,
                                "ranks disagree on the block sizes (hash), but none found which"
                                    .into(),
                            )
                        }),
                )
            }
        }
    }

    /// Where a run of this communicator talks, for a call with `stamp`.
    fn wire(&self, tag: i32, stamp: u32) -> Wire {
        Wire {
            stamp,
            ctx: self.ctx + 1,
            tag,
            me: self.rank(),
            group: self.group.clone(),
            world_rank: self.world_rank(self.rank()).unwrap_or(0),
        }
    }

    fn args(&self, s: &Spec, alg: &str, nodes: &[usize], seg_bytes: usize, window: usize) -> Args {
        let n = self.size();
        let known = |v: &[usize]| {
            if v.is_empty() {
                vec![0; n]
            } else {
                v.to_vec()
            }
        };
        let (counts, displs) = if s.uniform {
            (vec![s.count; n], (0..n).map(|i| i * s.count).collect())
        } else {
            (known(s.counts), known(s.displs))
        };
        let (rcounts, rdispls) = if s.uniform {
            (counts.clone(), displs.clone())
        } else {
            (known(s.rcounts), known(s.rdispls))
        };
        Args {
            rank: self.rank(),
            size: n,
            root: s.root,
            esize: s.esize,
            count: s.count,
            counts,
            displs,
            rcounts,
            rdispls,
            in_place: s.in_place,
            // Only the two-level algorithms look at placement.
            nodes: if crate::algorithms::uses_placement(alg) {
                nodes.to_vec()
            } else {
                Vec::new()
            },
            seg: (seg_bytes / s.esize.max(1)).max(1),
            window,
            canonical: s.canonical,
            learned: None,
        }
    }

    /// Packs one validated call over `send` (read only) and `recv`.
    #[inline(always)]
    fn prepare<'b, 'v>(
        &self,
        spec: Spec<'v>,
        send: &'b [u8],
        recv: &'b mut [u8],
        reduce: Option<ByteReduce>,
    ) -> Result<Call<'b, 'v>> {
        Ok(Call {
            spec,
            send: send.as_ptr(),
            send_len: send.len(),
            recv: recv.as_mut_ptr(),
            recv_len: recv.len(),
            reduce,
            _bufs: PhantomData,
        })
    }

    /// Builds the schedule run of `c` with algorithm `choice`. The run
    /// points into `c`'s buffers: the caller finishes it within `'b` (a
    /// blocking call in its frame, a nonblocking one in its scope).
    fn build(&self, c: Call<'_, '_>, choice: select::Choice, nodes: &[usize]) -> Result<Run> {
        let s = &c.spec;
        let (name, nodes) = match &c.reduce {
            Some(k) if !k.is_commutative() => {
                crate::algorithms::in_rank_order(s.coll, choice.algorithm, nodes)
            }
            _ => (choice.algorithm, nodes),
        };
        let alg = find(s.coll, name)
            .and_then(|a| a.schedule().map(|b| (a.name, b)))
            .ok_or_else(|| self.coll_err(s.coll, format!("no schedule {name}")))?;
        let key = s.uniform.then_some(SchedKey {
            alg: alg.0,
            count: s.count,
            esize: s.esize,
            root: s.root,
            in_place: s.in_place,
            seg: choice.segment_bytes,
            window: choice.window,
            canonical: s.canonical,
            flat: nodes.is_empty(),
        });
        let info = self.coll_info(s.coll)?;
        let cached = key.as_ref().and_then(|k| info.schedule(s.coll, k));
        // The arguments stay with a two-phase schedule's run, which
        // builds its second phase from them.
        let mut then = None;
        let sched = match cached {
            Some(x) => x,
            None => {
                let args = self.args(s, alg.0, nodes, choice.segment_bytes, choice.window);
                let x = Rc::new((alg.1)(&args));
                if let Some(k) = key {
                    info.keep_schedule(s.coll, k, &x);
                }
                if x.then.is_some() {
                    then = Some(args);
                }
                x
            }
        };
        let tag = self.next_tag();
        // SAFETY: `c` borrows both buffers for `'b`, and every caller
        // finishes the run within it (see above).
        let mut run = unsafe {
            Run::new(
                sched,
                c.send,
                c.send_len,
                c.recv,
                c.recv_len,
                c.reduce,
                self.wire(tag, s.stamp()),
                Op::Collective(s.coll),
            )
        }?;
        if let Some(args) = then {
            run.then(alg.1, args);
        }
        Ok(run)
    }

    /// Runs one blocking call: the fast path, or a schedule.
    ///
    /// Inlined, with the argument checks and `prepare`, into every public
    /// blocking collective so that the call's description stays in
    /// registers: passed through memory, its fields were stored piecewise
    /// and reloaded wider, and each such load waited for the store buffer
    /// to drain (tens of ns on an 8-byte collective). Everything that is
    /// not on the fast path lives out of line (`block_slow`, the cold
    /// error and first-use helpers).
    #[inline(always)]
    fn block(&self, call: Result<Call<'_, '_>>) -> Result<()> {
        // Looked at in place: the fast path never needs the call moved.
        let c = match &call {
            Ok(c) => c,
            Err(_) => return call.map(|_| ()),
        };
        let info = self.coll_info(c.spec.coll)?;
        let (check, shm_bytes, notices) = {
            let e = self.eng.borrow();
            (e.cfg.check, e.cfg.shm_coll_bytes, e.st.notices_waiting)
        };
        if check {
            self.check_call(&c.spec, false)?;
        }
        let s = &c.spec;
        let op = Op::Collective(s.coll);
        let io = FastIo {
            rank: self.world_rank(self.rank()).unwrap_or(0),
            op,
            esize: s.esize,
            count: s.count,
            counts: s.counts,
            displs: s.displs,
            rcounts: s.rcounts,
            rdispls: s.rdispls,
            root: s.root,
            in_place: s.in_place,
            send: c.send,
            send_len: c.send_len,
            recv: c.recv,
            recv_len: c.recv_len,
            reduce: c.reduce.as_ref(),
        };
        let fast_ok =
            info.fast.is_some() && fastpath::bytes_needed(s.coll, &io, self.size()) <= shm_bytes;
        let (choice, shm) = select::choose_marked(
            &info.memo,
            s.coll,
            self.size(),
            info.ppn,
            s.bytes,
            info.net,
            fast_ok,
        )
        .map_err(|e| e.with_op(op))?;
        if shm {
            if let Some(locals) = &info.fast {
                let mut e = self.eng.borrow_mut();
                if let Some(x) = e.poison_err(op) {
                    return Err(x);
                }
                if let Some(node) = e.node.clone() {
                    if let Some(area) = FastCall::area(&e, &node) {
                        if notices != 0 {
                            if let Some(x) = self.fast_notice(&mut e, area, locals, op) {
                                return Err(x);
                            }
                        }
                        if io.reduce.is_some_and(|k| k.is_user()) {
                            return self.fast_user(e, area, locals, s.coll, &io, s.stamp());
                        }
                        let mut f = FastCall::begin(
                            &mut e,
                            area,
                            self.rank(),
                            locals,
                            &self.group,
                            self.ctx + 1,
                            op,
                            s.stamp(),
                        );
                        return fastpath::run(s.coll, &mut f, &io).map_err(|x| x.with_op(op));
                    }
                }
            }
        } else if let Some(locals) = &info.fast {
            if info.may_take_fast_path(s.coll, self.size(), shm_bytes) {
                self.announce_schedule(locals, s.coll, s.bytes)?;
            }
        }
        self.block_slow(call, choice, &info.nodes)
    }

    /// The error of a fast-path call on a communicator of which an earlier
    /// call failed on another rank (a notice says so, see
    /// `engine::notice`) after this rank completed it; the call then
    /// publishes that it takes part in no fast-path call any more, so that
    /// no member waits for it. (A schedule looks for such notices itself.)
    #[cold]
    #[inline(never)]
    fn fast_notice(
        &self,
        e: &mut crate::engine::Engine,
        area: ibcoll_shm::SlotArea<'_>,
        locals: &[usize],
        op: Op,
    ) -> Option<Error> {
        let ctx = self.ctx + 1;
        let next = COMMS.with(|m| m.borrow().get(&ctx).map_or(0, |i| i.seq));
        let x = run::earlier_notice(
            e,
            ctx,
            Some(TAG_BASE + next as i32),
            &self.group,
            self.rank(),
            op,
        )?;
        // It publishes only a mark: no stamp.
        let mut f = FastCall::begin(e, area, self.rank(), locals, &self.group, ctx, op, 0);
        Some(f.refuse_because(x))
    }

    /// A blocking call on a communicator that qualifies for the fast paths
    /// but runs a schedule: says so in the slots, so that a member whose
    /// arguments made it take the fast path fails instead of hanging (see
    /// `FastCall::announce_schedule`). Costs one slot publication and
    /// wait per call, beside a schedule of at least a slot's worth of data.
    #[cold]
    #[inline(never)]
    fn announce_schedule(
        &self,
        locals: &Rc<[usize]>,
        coll: Collective,
        bytes: usize,
    ) -> Result<()> {
        let op = Op::Collective(coll);
        let mut e = self.eng.borrow_mut();
        if let Some(x) = e.poison_err(op) {
            return Err(x);
        }
        let Some(node) = e.node.clone() else {
            return Ok(());
        };
        let Some(area) = FastCall::area(&e, &node) else {
            return Ok(());
        };
        let mut f = FastCall::begin(
            &mut e,
            area,
            self.rank(),
            locals,
            &self.group,
            self.ctx + 1,
            op,
            0,
        );
        f.announce_schedule(bytes, locals)
            .map_err(|x| x.with_op(op))
    }

    /// The fast path of a collective with a user reduction: once it is
    /// over, a panic of the operation is resumed ([`user_panic`]). Out of
    /// line, so that the built-in operations' path returns the fast path's
    /// result in place.
    #[inline(never)]
    fn fast_user(
        &self,
        mut e: EngineMut<'_>,
        area: ibcoll_shm::SlotArea<'_>,
        locals: &[usize],
        coll: Collective,
        io: &FastIo<'_>,
        stamp: u32,
    ) -> Result<()> {
        let op = Op::Collective(coll);
        let mut f = FastCall::begin(
            &mut e,
            area,
            self.rank(),
            locals,
            &self.group,
            self.ctx + 1,
            op,
            stamp,
        );
        let res = fastpath::run(coll, &mut f, io).map_err(|x| x.with_op(op));
        drop(f);
        user_panic(e, op, io.reduce.and_then(|k| k.take_panic()));
        res
    }

    #[inline(never)]
    fn block_slow(
        &self,
        call: Result<Call<'_, '_>>,
        choice: select::Choice,
        nodes: &[usize],
    ) -> Result<()> {
        let call = call?;
        let op = Op::Collective(call.spec.coll);
        if let Some(x) = self.eng.borrow().poison_err(op) {
            return Err(x);
        }
        if matches!(choice.algorithm, "mcast" | "hier")
            && self.run_composed(&call, choice.algorithm, nodes)?
        {
            return Ok(());
        }
        let mut r = self.build(call, choice, nodes)?;
        let mut e = self.eng.borrow_mut();
        let res = run::run_blocking(&mut e, &mut r);
        let panic = r.take_panic();
        user_panic(e, op, panic);
        res
    }

    /// A blocking call with an algorithm composed of calls on
    /// sub-communicators: `mcast` (`crate::mcast`) or `hier`
    /// (`crate::hier`). `Ok(false)` where it is off for this communicator,
    /// or the call cannot use it (a reduction that does not commute: the
    /// leaders' order is not rank order); its schedule, the node-aware
    /// one, runs then.
    #[cold]
    fn run_composed(&self, call: &Call<'_, '_>, alg: &str, nodes: &[usize]) -> Result<bool> {
        let s = &call.spec;
        let mcast = alg == "mcast";
        match s.coll {
            Collective::Bcast => {
                // SAFETY: `call` borrows the buffer for this blocking call,
                // and nothing else points into it while `buf` lives.
                let buf = unsafe { std::slice::from_raw_parts_mut(call.recv, call.recv_len) };
                if mcast {
                    self.bcast_mcast(buf, s.root, nodes)
                } else {
                    self.bcast_hier(buf, s.root, nodes)
                }
            }
            Collective::Allreduce => {
                let Some(k) = call.reduce.as_ref().filter(|k| k.is_commutative()) else {
                    return Ok(false);
                };
                // SAFETY: as above; an allreduce's send buffer, when it
                // has one, is another borrow than `recv` (the typed call
                // took both from the caller), and stays valid for the call.
                let (send, recv) = unsafe {
                    (
                        (!s.in_place).then(|| std::slice::from_raw_parts(call.send, call.send_len)),
                        std::slice::from_raw_parts_mut(call.recv, call.recv_len),
                    )
                };
                let a = ReduceArgs {
                    send,
                    recv,
                    esize: s.esize,
                    k,
                    sig: (s.rop, s.rty),
                };
                if mcast {
                    self.allreduce_mcast(a, nodes)
                } else {
                    self.allreduce_hier(a, nodes)
                }
            }
            Collective::Barrier if mcast => self.barrier_mcast(nodes),
            Collective::Barrier => self.barrier_hier(nodes),
            _ => Ok(false),
        }
    }

    /// A blocking reduce of `a` to `root` (`a.send` `None`: in place in
    /// `a.recv`), or with `root` `None` an allreduce in place of `a.recv`:
    /// the phases of the `mcast` and `hier` allreduces on their node and
    /// leaders communicators.
    pub(crate) fn reduce_bytes(&self, a: &mut ReduceArgs<'_>, root: Option<usize>) -> Result<()> {
        let (c, send, root) = match root {
            Some(r) => {
                self.check_root(Collective::Reduce, r)?;
                (Collective::Reduce, a.send, r)
            }
            None => (Collective::Allreduce, None, 0),
        };
        self.block(self.reduce_like_bytes(c, send, a.recv, a.esize, (a.k.clone(), a.sig), root))
    }

    /// Starts the nonblocking collective `c` in `scope`.
    fn nonblock<'s>(
        &self,
        scope: &'s Scope<'s, '_>,
        c: Result<Call<'s, '_>>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock_keeping(scope, c, None)
    }

    /// [`Comm::nonblock`] with memory the run owns (and reads) until it is
    /// dropped.
    fn nonblock_keeping<'s>(
        &self,
        scope: &'s Scope<'s, '_>,
        c: Result<Call<'s, '_>>,
        keep: Option<Box<dyn std::any::Any>>,
    ) -> Result<CollRequest<'s>> {
        let c = c?;
        let op = Op::Collective(c.spec.coll);
        if let Some(x) = self.eng.borrow().poison_err(op) {
            return Err(x);
        }
        let info = self.coll_info(c.spec.coll)?;
        if self.eng.borrow().cfg.check {
            self.check_call(&c.spec, true)?;
        }
        let choice = select::choose(
            c.spec.coll,
            self.size(),
            info.ppn,
            c.spec.bytes,
            info.net,
            false,
        )
        .map_err(|e| e.with_op(op))?;
        let mut run = self.build(c, choice, &info.nodes)?;
        if let Some(k) = keep {
            run.keep(k);
        }
        let r = Rc::new(RefCell::new(run));
        r.borrow_mut().step(&mut self.eng.borrow_mut());
        let mut req = CollRequest {
            eng: Rc::downgrade(&self.eng),
            run: Some(r.clone()),
            outcome: None,
            _buf: PhantomData,
        };
        if r.borrow().is_done() {
            req.finish();
        } else {
            scope.track_coll(&self.eng, &r);
            run::register(r);
        }
        Ok(req)
    }

    // ------------------------------------------------------------ barrier

    #[inline(always)]
    fn barrier_run(&self) -> Result<Call<'static, 'static>> {
        let s = Spec::new(Collective::Barrier, 1, 0);
        self.prepare(s, &[], &mut [], None)
    }

    /// Blocks until every rank of the communicator has called it.
    pub fn barrier(&self) -> Result<()> {
        self.block(self.barrier_run())
    }

    /// Nonblocking barrier.
    pub fn ibarrier<'s>(&self, scope: &'s Scope<'s, '_>) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.barrier_run())
    }

    // ------------------------------------------------------------ bcast

    #[inline(always)]
    fn bcast_run<'b, T: Datatype>(
        &self,
        buf: &'b mut [T],
        root: usize,
    ) -> Result<Call<'b, 'static>> {
        self.check_root(Collective::Bcast, root)?;
        let mut s = Spec::new(Collective::Bcast, std::mem::size_of::<T>(), buf.len());
        s.root = root;
        self.prepare(s, &[], as_bytes_mut(buf), None)
    }

    /// Broadcasts `buf` from `root` to every rank (same length everywhere).
    pub fn bcast<T: Datatype>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.block(self.bcast_run(buf, root))
    }

    /// Nonblocking [`Comm::bcast`].
    pub fn ibcast<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.bcast_run(buf, root))
    }

    // ------------------------------------------------------------ reductions

    #[inline(always)]
    fn reduce_like<'b, T: Reducible>(
        &self,
        c: Collective,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
        op: ReduceOp<T>,
        root: usize,
    ) -> Result<Call<'b, 'static>> {
        self.check_op(c, &op)?;
        let esize = std::mem::size_of::<T>();
        let send_b = send.map(as_bytes);
        let sig = (check::op_code(&op), const { check::type_code(T::NAME) });
        self.reduce_like_bytes(
            c,
            send_b,
            as_bytes_mut(recv),
            esize,
            (byte_reduce(op), sig),
            root,
        )
    }

    /// [`Comm::reduce_like`] on bytes: elements of `esize` bytes that
    /// `reduce` combines, with its `IBCOLL_CHECK` signature (the typed calls
    /// and `raw.rs` share it).
    #[inline(always)]
    fn reduce_like_bytes<'b>(
        &self,
        c: Collective,
        send: Option<&'b [u8]>,
        recv: &'b mut [u8],
        esize: usize,
        (reduce, sig): (ByteReduce, OpSig),
        root: usize,
    ) -> Result<Call<'b, 'static>> {
        let count = send.map_or(recv.len(), |s| s.len()) / esize;
        let needs_recv = c != Collective::Reduce || self.rank() == root || send.is_none();
        if send.is_some() && needs_recv && recv.len() / esize != count {
            return Err(self.coll_err(
                c,
                format!(
                    "send buffer has {count} elements, receive buffer {}",
                    recv.len() / esize
                ),
            ));
        }
        let mut s = Spec::new(c, esize, count);
        s.root = root;
        s.in_place = send.is_none();
        (s.rop, s.rty) = sig;
        let recv_b = if needs_recv { recv } else { &mut [] };
        let send_b = send.unwrap_or(&[]);
        self.prepare(s, send_b, recv_b, Some(reduce))
    }

    /// Reduces every rank's `send` with `op` into `recv` at `root` (`recv`
    /// is ignored elsewhere and may be empty).
    pub fn reduce<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp<T>,
        root: usize,
    ) -> Result<()> {
        self.check_root(Collective::Reduce, root)?;
        self.block(self.reduce_like(Collective::Reduce, Some(send), recv, op, root))
    }

    /// [`Comm::reduce`] with the input taken from `buf` (and the result
    /// written there at the root).
    pub fn reduce_in_place<T: Reducible>(
        &self,
        buf: &mut [T],
        op: ReduceOp<T>,
        root: usize,
    ) -> Result<()> {
        self.check_root(Collective::Reduce, root)?;
        self.block(self.reduce_like(Collective::Reduce, None, buf, op, root))
    }

    /// Nonblocking [`Comm::reduce`].
    pub fn ireduce<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: ReduceOp<T>,
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.check_root(Collective::Reduce, root)?;
        self.nonblock(
            scope,
            self.reduce_like(Collective::Reduce, Some(send), recv, op, root),
        )
    }

    /// Reduces every rank's `send` with `op`; every rank gets the result
    /// in `recv` (bit-identical everywhere, floating point included).
    pub fn allreduce<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp<T>,
    ) -> Result<()> {
        self.block(self.reduce_like(Collective::Allreduce, Some(send), recv, op, 0))
    }

    /// [`Comm::allreduce`] in place.
    pub fn allreduce_in_place<T: Reducible>(&self, buf: &mut [T], op: ReduceOp<T>) -> Result<()> {
        self.block(self.reduce_like(Collective::Allreduce, None, buf, op, 0))
    }

    /// Nonblocking [`Comm::allreduce`].
    pub fn iallreduce<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_like(Collective::Allreduce, Some(send), recv, op, 0),
        )
    }

    /// Nonblocking [`Comm::allreduce_in_place`].
    pub fn iallreduce_in_place<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_like(Collective::Allreduce, None, buf, op, 0),
        )
    }

    /// Inclusive prefix reduction: rank r gets `send[0] op ... op send[r]`.
    pub fn scan<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp<T>) -> Result<()> {
        self.block(self.reduce_like(Collective::Scan, Some(send), recv, op, 0))
    }

    /// [`Comm::scan`] in place.
    pub fn scan_in_place<T: Reducible>(&self, buf: &mut [T], op: ReduceOp<T>) -> Result<()> {
        self.block(self.reduce_like(Collective::Scan, None, buf, op, 0))
    }

    /// Nonblocking [`Comm::scan`].
    pub fn iscan<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_like(Collective::Scan, Some(send), recv, op, 0),
        )
    }

    /// Exclusive prefix reduction: rank r > 0 gets `send[0] op ... op
    /// send[r-1]`; rank 0's `recv` is left unchanged.
    pub fn exscan<T: Reducible>(&self, send: &[T], recv: &mut [T], op: ReduceOp<T>) -> Result<()> {
        self.block(self.reduce_like(Collective::Exscan, Some(send), recv, op, 0))
    }

    /// [`Comm::exscan`] in place.
    pub fn exscan_in_place<T: Reducible>(&self, buf: &mut [T], op: ReduceOp<T>) -> Result<()> {
        self.block(self.reduce_like(Collective::Exscan, None, buf, op, 0))
    }

    /// Nonblocking [`Comm::exscan`].
    pub fn iexscan<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_like(Collective::Exscan, Some(send), recv, op, 0),
        )
    }

    #[inline(always)]
    fn reduce_scatter_run<'b, 'c, T: Reducible>(
        &self,
        c: Collective,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
        counts: Option<(&'c [usize], &'c [usize])>,
        op: ReduceOp<T>,
    ) -> Result<Call<'b, 'c>> {
        self.check_op(c, &op)?;
        let esize = std::mem::size_of::<T>();
        let sig = (check::op_code(&op), const { check::type_code(T::NAME) });
        self.reduce_scatter_bytes(
            c,
            send.map(as_bytes),
            as_bytes_mut(recv),
            esize,
            counts,
            (byte_reduce(op), sig),
        )
    }

    /// [`Comm::reduce_scatter_run`] on bytes (see `reduce_like_bytes`).
    #[inline(always)]
    fn reduce_scatter_bytes<'b, 'c>(
        &self,
        c: Collective,
        send: Option<&'b [u8]>,
        recv: &'b mut [u8],
        esize: usize,
        counts: Option<(&'c [usize], &'c [usize])>,
        (reduce, sig): (ByteReduce, OpSig),
    ) -> Result<Call<'b, 'c>> {
        let n = self.size();
        let recv_len = recv.len() / esize;
        let input_len = send.map_or(recv_len, |s| s.len() / esize);
        let (mine, total) = match counts {
            Some((counts, _)) => {
                if counts.len() != n {
                    return Err(self.coll_err(c, format!("{} counts for {n} ranks", counts.len())));
                }
                (counts[self.rank()], counts.iter().sum())
            }
            // reduce_scatter_block (never in place): every block as long
            // as `recv`.
            None => (recv_len, n * recv_len),
        };
        if input_len != total {
            return Err(self.coll_err(
                c,
                format!("input has {input_len} elements, the counts sum to {total}"),
            ));
        }
        if send.is_some() && recv_len != mine {
            return Err(self.coll_err(
                c,
                format!("receive buffer has {recv_len} elements, expected {mine}"),
            ));
        }
        let mut s = Spec::new(c, esize, mine);
        s.bytes = total * esize / n;
        match counts {
            // `displs` is the prefix sum of `counts` (n + 1 entries).
            Some((counts, displs)) => {
                s.displs = &displs[..n];
                s.counts = counts;
            }
            None => s = s.uniform(),
        }
        s.canonical = true;
        s.in_place = send.is_none();
        (s.rop, s.rty) = sig;
        self.prepare(s, send.unwrap_or(&[]), recv, Some(reduce))
    }

    /// Reduces the ranks' `send` vectors (sum of `counts` elements) and
    /// scatters the result: rank i gets `counts[i]` elements in `recv`.
    pub fn reduce_scatter<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp<T>,
    ) -> Result<()> {
        self.block(self.reduce_scatter_run(
            Collective::ReduceScatter,
            Some(send),
            recv,
            Some((counts, &prefix(counts))),
            op,
        ))
    }

    /// [`Comm::reduce_scatter`] in place: `buf` holds the whole input; the
    /// result is written to its first `counts[rank]` elements.
    pub fn reduce_scatter_in_place<T: Reducible>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        op: ReduceOp<T>,
    ) -> Result<()> {
        self.block(self.reduce_scatter_run(
            Collective::ReduceScatter,
            None,
            buf,
            Some((counts, &prefix(counts))),
            op,
        ))
    }

    /// Nonblocking [`Comm::reduce_scatter`].
    pub fn ireduce_scatter<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_scatter_run(
                Collective::ReduceScatter,
                Some(send),
                recv,
                Some((counts, &prefix(counts))),
                op,
            ),
        )
    }

    /// [`Comm::reduce_scatter`] with `recv.len()` elements for every rank.
    pub fn reduce_scatter_block<T: Reducible>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp<T>,
    ) -> Result<()> {
        self.block(self.reduce_scatter_run(
            Collective::ReduceScatterBlock,
            Some(send),
            recv,
            None,
            op,
        ))
    }

    /// Nonblocking [`Comm::reduce_scatter_block`].
    pub fn ireduce_scatter_block<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_scatter_run(Collective::ReduceScatterBlock, Some(send), recv, None, op),
        )
    }

    // ------------------------------------------------------------ gather / scatter

    #[inline(always)]
    fn gather_run<'b, T: Datatype>(
        &self,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
        root: usize,
    ) -> Result<Call<'b, 'static>> {
        let c = Collective::Gather;
        self.check_root(c, root)?;
        let n = self.size();
        let me = self.rank();
        let count = match send {
            Some(s) => s.len(),
            None if me == root => {
                if recv.len() % n != 0 {
                    return Err(self.coll_err(
                        c,
                        format!(
                            "in-place buffer of {} elements is not a multiple of {n} ranks",
                            recv.len()
                        ),
                    ));
                }
                recv.len() / n
            }
            None => recv.len(),
        };
        let (send_b, recv_b): (&[u8], &mut [u8]) = match send {
            Some(s) => (
                as_bytes(s),
                if me == root {
                    as_bytes_mut(recv)
                } else {
                    &mut []
                },
            ),
            None if me == root => (&[], as_bytes_mut(recv)),
            None => (as_bytes(recv), &mut []),
        };
        if me == root && recv_b.len() != n * count * std::mem::size_of::<T>() {
            return Err(self.coll_err(
                c,
                format!(
                    "root's receive buffer must hold {} elements ({n} x {count})",
                    n * count
                ),
            ));
        }
        let mut s = Spec::new(c, std::mem::size_of::<T>(), count).uniform();
        s.root = root;
        s.in_place = send.is_none() && me == root;
        self.prepare(s, send_b, recv_b, None)
    }

    /// Gathers every rank's `send` (same length everywhere) into `recv` at
    /// `root`, rank order (`recv` is ignored elsewhere).
    pub fn gather<T: Datatype>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.block(self.gather_run(Some(send), recv, root))
    }

    /// [`Comm::gather`] with one buffer: at the root the whole result with
    /// its own block already in place; elsewhere the block to send.
    pub fn gather_in_place<T: Datatype>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.block(self.gather_run(None, buf, root))
    }

    /// Nonblocking [`Comm::gather`].
    pub fn igather<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.gather_run(Some(send), recv, root))
    }

    #[inline(always)]
    fn gatherv_run<'b, 'c, T: Datatype>(
        &self,
        send: &'b [T],
        recv: &'b mut [T],
        counts: &'c [usize],
        displs: &'c [usize],
        root: usize,
    ) -> Result<Call<'b, 'c>> {
        let c = Collective::Gatherv;
        self.check_root(c, root)?;
        let me = self.rank();
        let mut s = Spec::new(c, std::mem::size_of::<T>(), send.len());
        s.bytes = 0;
        s.root = root;
        let recv_b: &mut [u8] = if me == root {
            self.check_layout(c, "receive", counts, displs, recv.len())?;
            if counts[me] != send.len() {
                return Err(self.coll_err(
                    c,
                    format!(
                        "root sends {} elements but counts[{me}] is {}",
                        send.len(),
                        counts[me]
                    ),
                ));
            }
            s.counts = counts;
            s.displs = displs;
            as_bytes_mut(recv)
        } else {
            &mut []
        };
        self.prepare(s, as_bytes(send), recv_b, None)
    }

    /// Gathers blocks of different lengths: rank i's `send` lands at
    /// `displs[i]` of the root's `recv` and must be `counts[i]` long
    /// (`counts`/`displs`/`recv` only matter at the root).
    pub fn gatherv<T: Datatype>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<()> {
        self.block(self.gatherv_run(send, recv, counts, displs, root))
    }

    /// Nonblocking [`Comm::gatherv`].
    pub fn igatherv<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.gatherv_run(send, recv, counts, displs, root))
    }

    #[inline(always)]
    fn scatter_run<'b, T: Datatype>(
        &self,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
        root: usize,
    ) -> Result<Call<'b, 'static>> {
        let c = Collective::Scatter;
        self.check_root(c, root)?;
        let n = self.size();
        let me = self.rank();
        let esize = std::mem::size_of::<T>();
        let (count, send_b, recv_b): (usize, &[u8], &mut [u8]) = match send {
            Some(s) => {
                if me == root && s.len() != n * recv.len() {
                    return Err(self.coll_err(
                        c,
                        format!(
                            "root's send buffer has {} elements, expected {n} x {}",
                            s.len(),
                            recv.len()
                        ),
                    ));
                }
                (
                    recv.len(),
                    if me == root { as_bytes(s) } else { &[] },
                    as_bytes_mut(recv),
                )
            }
            None if me == root => {
                if recv.len() % n != 0 {
                    return Err(self.coll_err(
                        c,
                        format!(
                            "in-place buffer of {} elements is not a multiple of {n} ranks",
                            recv.len()
                        ),
                    ));
                }
                (recv.len() / n, as_bytes(recv), &mut [])
            }
            None => (recv.len(), &[], as_bytes_mut(recv)),
        };
        let mut s = Spec::new(c, esize, count).uniform();
        s.root = root;
        s.in_place = send.is_none() && me == root;
        self.prepare(s, send_b, recv_b, None)
    }

    /// Scatters the root's `send` (`size` blocks of `recv.len()` elements)
    /// so rank i gets block i in `recv` (`send` is ignored elsewhere).
    pub fn scatter<T: Datatype>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.block(self.scatter_run(Some(send), recv, root))
    }

    /// [`Comm::scatter`] with one buffer: at the root the whole input (its
    /// own block stays in place); elsewhere the receive buffer.
    pub fn scatter_in_place<T: Datatype>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.block(self.scatter_run(None, buf, root))
    }

    /// Nonblocking [`Comm::scatter`].
    pub fn iscatter<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.scatter_run(Some(send), recv, root))
    }

    #[inline(always)]
    fn scatterv_run<'b, 'c, T: Datatype>(
        &self,
        send: &'b [T],
        counts: &'c [usize],
        displs: &'c [usize],
        recv: &'b mut [T],
        root: usize,
    ) -> Result<Call<'b, 'c>> {
        let c = Collective::Scatterv;
        self.check_root(c, root)?;
        let me = self.rank();
        let mut s = Spec::new(c, std::mem::size_of::<T>(), recv.len());
        s.bytes = 0;
        s.root = root;
        let send_b: &[u8] = if me == root {
            self.check_layout(c, "send", counts, displs, send.len())?;
            if counts[me] != recv.len() {
                return Err(self.coll_err(
                    c,
                    format!(
                        "root receives {} elements but counts[{me}] is {}",
                        recv.len(),
                        counts[me]
                    ),
                ));
            }
            s.counts = counts;
            s.displs = displs;
            as_bytes(send)
        } else {
            &[]
        };
        self.prepare(s, send_b, as_bytes_mut(recv), None)
    }

    /// Scatters blocks of different lengths: rank i gets `counts[i]`
    /// elements from `displs[i]` of the root's `send` (`counts`, `displs`
    /// and `send` only matter at the root).
    pub fn scatterv<T: Datatype>(
        &self,
        send: &[T],
        counts: &[usize],
        displs: &[usize],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        self.block(self.scatterv_run(send, counts, displs, recv, root))
    }

    /// Nonblocking [`Comm::scatterv`].
    pub fn iscatterv<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        counts: &[usize],
        displs: &[usize],
        recv: &'s mut [T],
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.scatterv_run(send, counts, displs, recv, root))
    }

    // ------------------------------------------------------------ allgather / alltoall

    #[inline(always)]
    fn allgather_run<'b, T: Datatype>(
        &self,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
    ) -> Result<Call<'b, 'static>> {
        let c = Collective::Allgather;
        let n = self.size();
        let count = match send {
            Some(s) => s.len(),
            None => {
                if recv.len() % n != 0 {
                    return Err(self.coll_err(
                        c,
                        format!(
                            "in-place buffer of {} elements is not a multiple of {n} ranks",
                            recv.len()
                        ),
                    ));
                }
                recv.len() / n
            }
        };
        if recv.len() != n * count {
            return Err(self.coll_err(
                c,
                format!(
                    "receive buffer has {} elements, expected {n} x {count}",
                    recv.len()
                ),
            ));
        }
        let mut s = Spec::new(c, std::mem::size_of::<T>(), count).uniform();
        s.in_place = send.is_none();
        self.prepare(s, send.map_or(&[][..], as_bytes), as_bytes_mut(recv), None)
    }

    /// Every rank gets every rank's `send` (same length), in rank order.
    pub fn allgather<T: Datatype>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.block(self.allgather_run(Some(send), recv))
    }

    /// [`Comm::allgather`] in place: this rank's block is already at its
    /// place in `buf`.
    pub fn allgather_in_place<T: Datatype>(&self, buf: &mut [T]) -> Result<()> {
        self.block(self.allgather_run(None, buf))
    }

    /// Nonblocking [`Comm::allgather`].
    pub fn iallgather<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.allgather_run(Some(send), recv))
    }

    #[inline(always)]
    fn allgatherv_run<'b, 'c, T: Datatype>(
        &self,
        send: Option<&'b [T]>,
        recv: &'b mut [T],
        counts: &'c [usize],
        displs: &'c [usize],
    ) -> Result<Call<'b, 'c>> {
        let c = Collective::Allgatherv;
        let n = self.size();
        self.check_layout(c, "receive", counts, displs, recv.len())?;
        let me = self.rank();
        if let Some(s) = send {
            if s.len() != counts[me] {
                return Err(self.coll_err(
                    c,
                    format!(
                        "send buffer has {} elements but counts[{me}] is {}",
                        s.len(),
                        counts[me]
                    ),
                ));
            }
        }
        let esize = std::mem::size_of::<T>();
        let mut s = Spec::new(c, esize, counts[me]);
        s.bytes = counts.iter().sum::<usize>() * esize / n;
        s.counts = counts;
        s.displs = displs;
        s.in_place = send.is_none();
        self.prepare(s, send.map_or(&[][..], as_bytes), as_bytes_mut(recv), None)
    }

    /// Allgather of blocks of different lengths: rank i's `send`
    /// (`counts[i]` elements) lands at `displs[i]` of every `recv`.
    pub fn allgatherv<T: Datatype>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        self.block(self.allgatherv_run(Some(send), recv, counts, displs))
    }

    /// [`Comm::allgatherv`] in place (own block already in `buf`).
    pub fn allgatherv_in_place<T: Datatype>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        self.block(self.allgatherv_run(None, buf, counts, displs))
    }

    /// Nonblocking [`Comm::allgatherv`].
    pub fn iallgatherv<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.allgatherv_run(Some(send), recv, counts, displs))
    }

    #[inline(always)]
    fn alltoall_run<'b, T: Datatype>(
        &self,
        send: &'b [T],
        recv: &'b mut [T],
    ) -> Result<Call<'b, 'static>> {
        let c = Collective::Alltoall;
        let n = self.size();
        if send.len() != recv.len() || send.len() % n != 0 {
            return Err(self.coll_err(
                c,
                format!(
                    "send ({}) and receive ({}) buffers must be equal multiples of {n} ranks",
                    send.len(),
                    recv.len()
                ),
            ));
        }
        let s = Spec::new(c, std::mem::size_of::<T>(), send.len() / n).uniform();
        self.prepare(s, as_bytes(send), as_bytes_mut(recv), None)
    }

    /// Block i of `send` goes to rank i; block j of `recv` comes from rank
    /// j (blocks of `len / size` elements).
    pub fn alltoall<T: Datatype>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.block(self.alltoall_run(send, recv))
    }

    /// [`Comm::alltoall`] in place.
    pub fn alltoall_in_place<T: Datatype>(&self, buf: &mut [T]) -> Result<()> {
        let copy = buf.to_vec();
        self.block(self.alltoall_run(&copy, buf))
    }

    /// Nonblocking [`Comm::alltoall`].
    pub fn ialltoall<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.alltoall_run(send, recv))
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn alltoallv_run<'b, 'c, T: Datatype>(
        &self,
        send: &'b [T],
        scounts: &'c [usize],
        sdispls: &'c [usize],
        recv: &'b mut [T],
        rcounts: &'c [usize],
        rdispls: &'c [usize],
    ) -> Result<Call<'b, 'c>> {
        let c = Collective::Alltoallv;
        self.check_layout(c, "send", scounts, sdispls, send.len())?;
        self.check_layout(c, "receive", rcounts, rdispls, recv.len())?;
        let me = self.rank();
        if scounts[me] != rcounts[me] {
            return Err(self.coll_err(
                c,
                format!(
                    "sends itself {} elements but expects {}",
                    scounts[me], rcounts[me]
                ),
            ));
        }
        let mut s = Spec::new(c, std::mem::size_of::<T>(), 0);
        s.bytes = 0;
        s.counts = scounts;
        s.displs = sdispls;
        s.rcounts = rcounts;
        s.rdispls = rdispls;
        self.prepare(s, as_bytes(send), as_bytes_mut(recv), None)
    }

    /// Alltoall with blocks of different lengths: `scounts[i]` elements at
    /// `sdispls[i]` go to rank i; `rcounts[j]` elements from rank j land at
    /// `rdispls[j]`.
    pub fn alltoallv<T: Datatype>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<()> {
        self.block(self.alltoallv_run(send, scounts, sdispls, recv, rcounts, rdispls))
    }

    /// Nonblocking [`Comm::alltoallv`].
    #[allow(clippy::too_many_arguments)]
    pub fn ialltoallv<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        send: &'s [T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &'s mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.alltoallv_run(send, scounts, sdispls, recv, rcounts, rdispls),
        )
    }
    // ------------------------------------------------------------ nonblocking in place

    /// Nonblocking [`Comm::reduce_in_place`].
    pub fn ireduce_in_place<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        op: ReduceOp<T>,
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.check_root(Collective::Reduce, root)?;
        self.nonblock(
            scope,
            self.reduce_like(Collective::Reduce, None, buf, op, root),
        )
    }

    /// Nonblocking [`Comm::scan_in_place`].
    pub fn iscan_in_place<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.reduce_like(Collective::Scan, None, buf, op, 0))
    }

    /// Nonblocking [`Comm::exscan_in_place`].
    pub fn iexscan_in_place<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_like(Collective::Exscan, None, buf, op, 0),
        )
    }

    /// Nonblocking [`Comm::reduce_scatter_in_place`].
    pub fn ireduce_scatter_in_place<'s, T: Reducible>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        counts: &[usize],
        op: ReduceOp<T>,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(
            scope,
            self.reduce_scatter_run(
                Collective::ReduceScatter,
                None,
                buf,
                Some((counts, &prefix(counts))),
                op,
            ),
        )
    }

    /// Nonblocking [`Comm::gather_in_place`].
    pub fn igather_in_place<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.gather_run(None, buf, root))
    }

    /// Nonblocking [`Comm::scatter_in_place`].
    pub fn iscatter_in_place<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        root: usize,
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.scatter_run(None, buf, root))
    }

    /// Nonblocking [`Comm::allgather_in_place`].
    pub fn iallgather_in_place<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.allgather_run(None, buf))
    }

    /// Nonblocking [`Comm::allgatherv_in_place`].
    pub fn iallgatherv_in_place<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<CollRequest<'s>> {
        self.nonblock(scope, self.allgatherv_run(None, buf, counts, displs))
    }

    /// Nonblocking [`Comm::alltoall_in_place`] (the input is copied first).
    pub fn ialltoall_in_place<'s, T: Datatype>(
        &self,
        scope: &'s Scope<'s, '_>,
        buf: &'s mut [T],
    ) -> Result<CollRequest<'s>> {
        let copy: Box<[T]> = buf.into();
        // SAFETY: the view is of the box's heap block, which stays put when
        // the box moves into the run below and is freed only with the run,
        // after it is done; nothing else sees the box.
        let input: &'s [T] = unsafe { std::slice::from_raw_parts(copy.as_ptr(), copy.len()) };
        let run = self.alltoall_run(input, buf);
        self.nonblock_keeping(scope, run, Some(Box::new(copy)))
    }
}

/// Resumes the panic of a blocking collective's reduction operation, if it
/// panicked, once the collective is over: the engine is poisoned first
/// (this rank's data no longer matches the others'), and let go of, so the
/// unwinding does not pass through it.
#[inline]
fn user_panic(mut e: EngineMut<'_>, op: Op, panic: Option<Box<dyn std::any::Any + Send>>) {
    if let Some(p) = panic {
        e.poison_by_panic(op, &*p);
        drop(e);
        std::panic::resume_unwind(p);
    }
}
