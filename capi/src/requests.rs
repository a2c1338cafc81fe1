//! Requests: each is an ibcoll operation in the static scope over the
//! caller's memory (or a staging buffer of the entry's), owned by the
//! request table until `MPI_Wait`/`MPI_Test` completes it. An entry is
//! taken out of its slot while it is waited for or tested.
//!
//! Every completion (Wait, Test, their -all/-any/-some forms,
//! Request_get_status, Finalize) goes through `settle`, which, the
//! operation being done, unpacks a staged receive (a point-to-point
//! one, or a collective's on a non-contiguous type, `packed.rs`) into the
//! caller's buffer: once, as `settle` runs once per operation.

use std::os::raw::c_int;

use ibcoll::{CollRequest, Request, Status};

use crate::abi::*;
use crate::buffers::{put, put_status, Staged};
use crate::error::{call, err, fail, MpiErr, R};
use crate::packed::Unpack;
use crate::state::{self, index, Global, G};

pub enum Pending {
    P2p(Request<'static>),
    /// A point-to-point operation straight on the caller's memory that
    /// leaves nothing to do when it completes but to report its status:
    /// what the fast paths of `MPI_Isend`/`MPI_Irecv` start on predefined
    /// types. The entry's other fields are as [`ReqEntry::vacant`] has
    /// them, so completing it is taking the operation out of the slot and
    /// freeing the slot ([`take_plain!`]). The full path treats it as
    /// `P2p`; anything that changes the entry ends it being `Plain`.
    Plain(Request<'static>),
    Coll(CollRequest<'static>),
    /// Complete already (or never started: MPI_PROC_NULL).
    Done,
    /// No request: a free slot, or one whose entry (or operation) a call
    /// has taken out while it completes or tests it.
    Vacant,
}

/// One request. Field order matters: `op` is dropped (which waits for
/// it) before the buffers it may point into.
pub struct ReqEntry {
    pub op: Pending,
    pub comm: MPI_Comm,
    /// The outcome once known.
    pub done: Option<(MPI_Status, Option<MpiErr>)>,
    /// A receive of a non-contiguous type lands here first.
    pub staged: Option<Staged>,
    /// A collective on a non-contiguous type receives here first; its
    /// completion unpacks it into the caller's elements.
    pub unpack: Option<Unpack>,
    /// Memory the operation reads until it is done (packed sends,
    /// converted layouts).
    pub keep: Vec<Vec<u8>>,
    /// A persistent request's arguments (MPI_Send_init, MPI_Recv_init):
    /// it stays in the table, inactive between a completion and the next
    /// MPI_Start, until MPI_Request_free.
    pub persist: Option<Persist>,
    /// A nonblocking collective's: MPI_Request_free refuses it.
    pub coll: bool,
    /// On the free list: the next free slot's index ([`NIL`] for none).
    next_free: u32,
}

/// No slot (the end of the free list).
const NIL: u32 = u32::MAX;

/// The request table: a handle is `REQUEST_DYN` and the index of its
/// slot. A slot is reused once its request is complete (or freed): no
/// allocation per request once the table has grown to the most requests
/// the program has had at once.
pub struct Requests {
    slots: Vec<ReqEntry>,
    /// The first of the vacant slots that no call holds, linked through
    /// their `next_free` (each at most once): freeing one is two stores,
    /// which cannot fail (see [`take_plain!`]).
    free: u32,
    /// Requests freed while pending (`MPI_Request_free`): finished at
    /// `MPI_Finalize` if not before.
    pub detached: Vec<ReqEntry>,
}

impl Default for Requests {
    fn default() -> Requests {
        Requests {
            slots: Vec::new(),
            free: NIL,
            detached: Vec::new(),
        }
    }
}

impl Requests {
    /// A vacant slot for a new request, off the free list (the caller
    /// fills it with [`Requests::fill`] or [`ReqEntry::fill_plain`], or
    /// gives it back with [`Requests::unreserve`]).
    #[inline(always)]
    pub fn reserve(&mut self) -> R<usize> {
        let i = self.free as usize;
        match self.slots.get(i) {
            Some(e) => {
                self.free = e.next_free;
                Ok(i)
            }
            None => self.grow(),
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) -> R<usize> {
        let i = self.slots.len();
        if i > INDEX_MASK as usize {
            return err(
                MPI_ERR_INTERN,
                format!(
                    "more than {} requests at once (complete or free some)",
                    INDEX_MASK as usize + 1
                ),
            );
        }
        self.slots.push(ReqEntry::vacant());
        Ok(i)
    }

    /// Puts reserved slot `i`, vacant, on the free list.
    #[inline(always)]
    pub fn unreserve(&mut self, i: usize) {
        self.slots[i].next_free = self.free;
        self.free = i as u32;
    }

    /// Fills reserved slot `i` with `e`; its handle.
    fn fill(&mut self, i: usize, e: ReqEntry) -> MPI_Request {
        self.slots[i] = e;
        handle(i)
    }

    /// Reserved slot `i`, for [`ReqEntry::fill_plain`].
    #[inline(always)]
    pub fn reserved(&mut self, i: usize) -> &mut ReqEntry {
        &mut self.slots[i]
    }

    /// The slot of handle `h`, if it is one of the table's.
    #[inline(always)]
    fn slot(&mut self, h: MPI_Request) -> Option<(usize, &mut ReqEntry)> {
        let i = index(h, REQUEST_DYN)?;
        Some((i, self.slots.get_mut(i)?))
    }
}

#[derive(Clone, Copy)]
pub struct Persist {
    pub send: bool,
    /// MPI_Ssend_init: each start is a synchronous send.
    pub sync: bool,
    pub buf: *mut libc::c_void,
    pub count: c_int,
    pub dt: MPI_Datatype,
    pub peer: c_int,
    pub tag: c_int,
}

impl ReqEntry {
    /// A free slot's entry.
    fn vacant() -> ReqEntry {
        ReqEntry::new(Pending::Vacant, 0)
    }

    /// Makes this entry, reserved (so vacant), the plain point-to-point
    /// request `r`; the caller sets `comm` (when it registers it).
    #[inline(always)]
    pub fn fill_plain(&mut self, r: Request<'static>) {
        debug_assert!(matches!(self.op, Pending::Vacant));
        // Vacant: nothing to drop (forgetting skips the drop glue's call).
        std::mem::forget(std::mem::replace(&mut self.op, Pending::Plain(r)));
    }

    pub fn new(op: Pending, comm: MPI_Comm) -> ReqEntry {
        ReqEntry {
            op,
            comm,
            done: None,
            staged: None,
            unpack: None,
            keep: Vec::new(),
            persist: None,
            coll: false,
            next_free: NIL,
        }
    }

    /// A persistent request not started (or completed since its start).
    pub fn inactive(&self) -> bool {
        self.persist.is_some() && self.done.is_none() && matches!(self.op, Pending::Done)
    }

    /// An entry that is complete from the start.
    pub fn finished(comm: MPI_Comm, s: MPI_Status) -> ReqEntry {
        let mut e = ReqEntry::new(Pending::Done, comm);
        e.done = Some((s, None));
        e
    }
}

/// The handle of request slot `i`.
#[inline(always)]
pub fn handle(i: usize) -> MPI_Request {
    REQUEST_DYN | i as c_int
}

/// The status of a receive that got nothing (MPI_PROC_NULL, a null
/// request).
pub fn empty_status() -> MPI_Status {
    MPI_Status {
        MPI_SOURCE: MPI_ANY_SOURCE,
        MPI_TAG: MPI_ANY_TAG,
        ..Default::default()
    }
}

pub fn proc_null_status() -> MPI_Status {
    MPI_Status {
        MPI_SOURCE: MPI_PROC_NULL,
        MPI_TAG: MPI_ANY_TAG,
        ..Default::default()
    }
}

pub fn status_of(s: &Status) -> MPI_Status {
    let mut m = MPI_Status {
        MPI_SOURCE: s.source as c_int,
        MPI_TAG: s.tag,
        ..Default::default()
    };
    m.set_count(s.len, false);
    m
}

/// The status and error of a receive that failed: a truncated one still
/// says what arrived (its source as a rank of `comm`).
pub fn failed_status(comm: MPI_Comm, e: &ibcoll::Error) -> MPI_Status {
    match state::comm(comm) {
        Ok(c) => failed_status_in(&c, e),
        Err(_) => failed_status_in_none(e),
    }
}

fn failed_status_in_none(e: &ibcoll::Error) -> MPI_Status {
    let mut s = empty_status();
    if let ibcoll::Error::Truncated {
        tag, buffer_len, ..
    } = e
    {
        s.MPI_TAG = *tag;
        s.set_count(*buffer_len, false);
    }
    s
}

/// [`failed_status`] with the communicator at hand.
pub fn failed_status_in(c: &ibcoll::Comm, e: &ibcoll::Error) -> MPI_Status {
    let mut s = empty_status();
    if let ibcoll::Error::Truncated {
        peer,
        tag,
        buffer_len,
        ..
    } = e
    {
        if let Some(r) = (0..c.size()).find(|&r| c.world_rank(r) == Some(*peer)) {
            s.MPI_SOURCE = r as c_int;
        }
        s.MPI_TAG = *tag;
        s.set_count(*buffer_len, false);
    }
    s
}

/// Stores a started nonblocking collective as a request, with the
/// staging buffers it reads (`keep`) and writes (`unpack`) until it is
/// done.
pub fn store_coll(
    req: *mut MPI_Request,
    r: CollRequest<'static>,
    comm: MPI_Comm,
    keep: Vec<Vec<u8>>,
    unpack: Option<Unpack>,
) -> R<()> {
    let mut e = ReqEntry::new(Pending::Coll(r), comm);
    e.coll = true;
    e.keep = keep;
    e.unpack = unpack;
    put(req, add(e)?, "request")
}

/// Registers `e`; gives its handle.
pub fn add(e: ReqEntry) -> R<MPI_Request> {
    state::with(|st| {
        let i = st.reqs.reserve()?;
        Ok(st.reqs.fill(i, e))
    })
}

/// Takes request `h`'s entry out of its slot, which stays vacant and off
/// the free list until [`put_back`] or [`release`].
fn take(h: MPI_Request) -> R<(usize, ReqEntry)> {
    state::with(|st| match st.reqs.slot(h) {
        Some((i, e)) if !matches!(e.op, Pending::Vacant) => {
            Ok((i, std::mem::replace(e, ReqEntry::vacant())))
        }
        _ => err(MPI_ERR_REQUEST, format!("invalid request handle {h:#x}")),
    })
}

fn put_back(i: usize, e: ReqEntry) {
    let _ = state::with(|st| {
        st.reqs.slots[i] = e;
        Ok(())
    });
}

fn release(i: usize) {
    let _ = state::with(|st| {
        st.reqs.unreserve(i);
        Ok(())
    });
}

/// Records the outcome of a completed operation in `e`.
fn settle(e: &mut ReqEntry, r: Result<Option<Status>, ibcoll::Error>) {
    let (s, x) = match r {
        Ok(Some(s)) => (status_of(&s), None),
        Ok(None) => (MPI_Status::default(), None),
        Err(x) => (failed_status(e.comm, &x), Some(MpiErr::from(x))),
    };
    if let Some(st) = &e.staged {
        // SAFETY: the receive is done; its caller's buffer is still the
        // one it was posted for (MPI's contract).
        unsafe { st.finish(s.count()) };
    }
    // The operation is dropped (it is done) before its staging buffer is
    // read.
    e.op = Pending::Done;
    if let Some(u) = e.unpack.take() {
        if x.is_none() {
            // SAFETY: the collective is done; the caller's buffers are
            // still those it was started on (MPI's contract).
            unsafe { u.finish() };
        }
    }
    e.done = Some((s, x));
}

/// Blocks until `e` completes.
fn wait_entry(e: &mut ReqEntry) {
    if e.inactive() {
        e.done = Some((empty_status(), None));
    }
    if e.done.is_some() {
        return;
    }
    let r = match std::mem::replace(&mut e.op, Pending::Done) {
        Pending::P2p(r) | Pending::Plain(r) => r.wait().map(Some),
        Pending::Coll(r) => r.wait().map(|_| None),
        Pending::Done | Pending::Vacant => Ok(None),
    };
    settle(e, r);
}

/// Progresses `e` once; true once complete.
fn test_entry(e: &mut ReqEntry) -> bool {
    if e.inactive() {
        e.done = Some((empty_status(), None));
    }
    if e.done.is_some() {
        return true;
    }
    let r = match &mut e.op {
        Pending::P2p(r) | Pending::Plain(r) => match r.test() {
            Ok(None) => return false,
            Ok(Some(s)) => Ok(Some(s)),
            Err(x) => Err(x),
        },
        Pending::Coll(r) => match r.test() {
            Ok(false) => return false,
            Ok(true) => Ok(None),
            Err(x) => Err(x),
        },
        Pending::Done | Pending::Vacant => Ok(None),
    };
    settle(e, r);
    true
}

/// The outcome of a completed entry; its slot freed and the caller's
/// handle set to MPI_REQUEST_NULL, or, for a persistent request, the entry
/// kept (inactive) under the same handle.
fn outcome(
    i: usize,
    mut e: ReqEntry,
    h: &mut MPI_Request,
) -> (MPI_Status, Option<MpiErr>, MPI_Comm) {
    let comm = e.comm;
    let (s, x) = e.done.take().unwrap_or_default();
    if e.persist.is_some() {
        e.op = Pending::Done;
        e.staged = None;
        e.keep.clear();
        put_back(i, e);
        return (s, x, comm);
    }
    *h = MPI_REQUEST_NULL;
    drop(e.op);
    release(i);
    (s, x, comm)
}

fn req_ptr<'a>(p: *mut MPI_Request) -> R<&'a mut MPI_Request> {
    if p.is_null() {
        return err(MPI_ERR_REQUEST, "request pointer is null");
    }
    // SAFETY: not null: the caller's request (MPI's contract).
    Ok(unsafe { &mut *p })
}

/// A request array of `n` entries.
unsafe fn reqs<'a>(p: *mut MPI_Request, n: c_int) -> R<&'a mut [MPI_Request]> {
    if n < 0 {
        return err(MPI_ERR_COUNT, format!("count {n} is negative"));
    }
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return err(MPI_ERR_REQUEST, "request array is null");
    }
    // SAFETY: an array of `n` requests (MPI's contract).
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n as usize) })
}

fn status_at(p: *mut MPI_Status, i: usize) -> *mut MPI_Status {
    if p.is_null() || p as usize == MPI_STATUS_IGNORE {
        return p;
    }
    // SAFETY: an array of statuses as long as the request array (MPI's
    // contract).
    unsafe { p.add(i) }
}

/// Takes the operation of plain request `$h` out of its slot in `$t` (a
/// `Requests`) into local `$r`, with the slot's index `$i` and the
/// request's communicator `$comm`; the slot, vacant then, goes on the free
/// list if `$free`, or else stays reserved. Returns `None` from the
/// enclosing function if `$h` is not a plain request (the full path then
/// deals with it).
///
/// A macro, not a function: the request (104 bytes) is read straight into
/// the local that the caller's `wait`/`test` call uses, and nothing that
/// may unwind comes between. Returned through a tuple or by
/// `mem::replace`, or live across a call that may unwind (its drop flag),
/// it was copied once or twice more: 14 to 30 instructions per request.
macro_rules! take_plain {
    ($t:expr, $h:expr, $free:expr => $i:ident, $r:ident, $comm:ident) => {
        let t: &mut Requests = &mut $t;
        let $i = index($h, REQUEST_DYN)?;
        let slot = t.slots.get_mut($i)?;
        let Pending::Plain(op) = &mut slot.op else {
            return None;
        };
        let $comm = slot.comm;
        // SAFETY: the request is read out here once, and its place is
        // overwritten right below, without a drop (`ptr::write`), by
        // `Vacant`: it is moved, never duplicated, and nothing in between
        // can unwind.
        #[allow(unused_mut)]
        let mut $r = unsafe { std::ptr::read(op) };
        // SAFETY: `slot.op` is a valid, exclusively borrowed place whose
        // old value was just moved out.
        unsafe { std::ptr::write(&mut slot.op, Pending::Vacant) };
        if $free {
            // `unreserve` without its second bounds check.
            slot.next_free = t.free;
            t.free = $i as u32;
        }
    };
}

/// Puts operation `$r`, lent out by [`take_plain!`] (not freed), back
/// into slot `$i` of `$t`. A macro for the reason `take_plain!` is: passed
/// to a function, the request was copied twice more.
macro_rules! put_back_plain {
    ($t:expr, $i:expr, $r:expr) => {
        let op = &mut $t.slots[$i].op;
        debug_assert!(matches!(op, Pending::Vacant));
        // SAFETY: `op` is a valid, exclusively borrowed place holding
        // `Vacant` (the slot of a lent-out operation), which owns nothing:
        // not dropping it leaks nothing.
        unsafe { std::ptr::write(op, Pending::Plain($r)) };
    };
}

/// What a failed plain request gives: its status (a truncated receive's
/// says what arrived), the error, the request's communicator.
type Failed = (MPI_Status, MpiErr, MPI_Comm);

#[cold]
#[inline(never)]
fn failed(comm: MPI_Comm, x: ibcoll::Error) -> Failed {
    (failed_status(comm, &x), MpiErr::from(x), comm)
}

/// Waits for plain request `h` (see [`Pending::Plain`]): its status, its
/// slot freed (the caller nulls the handle). `None` if `h` is not a plain
/// request, or the state cannot be borrowed: the full path then deals
/// with it and says what is wrong. The operation is taken out of its slot
/// and the state is not borrowed while it is waited for (a user reduction
/// that a nonblocking collective runs meanwhile may call the library).
#[inline(always)]
fn wait_plain(g: &'static Global, h: MPI_Request) -> Option<Result<MPI_Status, Failed>> {
    let mut t = g.reqs_fast()?;
    // The slot is freed as `ReqEntry::vacant` leaves one (see
    // `Pending::Plain`).
    take_plain!(t, h, true => _i, r, comm);
    drop(t);
    Some(match r.wait() {
        Ok(s) => Ok(status_of(&s)),
        Err(x) => Err(failed(comm, x)),
    })
}

/// Tests plain request `h` once: `None` if it is not one (as
/// [`wait_plain`]); whether it is complete. A complete operation keeps its
/// outcome, which [`wait_plain`] then returns at once. The operation is out
/// of its slot (reserved meanwhile) while it is tested, and the state is
/// not borrowed.
#[inline(always)]
fn probe_plain(g: &'static Global, h: MPI_Request) -> Option<bool> {
    let mut t = g.reqs_fast()?;
    take_plain!(t, h, false => i, r, _comm);
    drop(t);
    let done = !matches!(r.test(), Ok(None));
    // Borrows are scoped: after the test the state is borrowed as before
    // it, that is not at all (the first borrow succeeded), so this one
    // fails only if the test ran MPI_Finalize (from a user reduction):
    // then the slot went with the state, and the operation is dropped here
    // (its drop returns at once: the engine's finalization settled it).
    let mut t = g.reqs_fast()?;
    put_back_plain!(t, i, r);
    Some(done)
}

/// MPI_Test's [`probe_plain`]: a complete request's status, its slot freed
/// (the caller nulls the handle), or `Some(None)` while it is incomplete.
#[inline(always)]
fn test_plain(g: &'static Global, h: MPI_Request) -> Option<Option<Result<MPI_Status, Failed>>> {
    let mut t = g.reqs_fast()?;
    take_plain!(t, h, false => i, r, comm);
    drop(t);
    let res = r.test();
    // As in `probe_plain`.
    let mut t = g.reqs_fast()?;
    Some(match res {
        Ok(None) => {
            put_back_plain!(t, i, r);
            None
        }
        Ok(Some(s)) => {
            t.unreserve(i);
            Some(Ok(status_of(&s)))
        }
        Err(x) => {
            t.unreserve(i);
            Some(Err(failed(comm, x)))
        }
    })
}

/// A plain request of MPI_Wait or MPI_Test that failed: its status, and
/// the error reported.
#[cold]
#[inline(never)]
fn plain_failed(func: &str, f: Failed, status: *mut MPI_Status) -> c_int {
    let (s, x, comm) = f;
    put_status(status, s);
    fail(func, comm, x)
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Wait(req: *mut MPI_Request, status: *mut MPI_Status) -> c_int {
    if !req.is_null() {
        // SAFETY: not null: the caller's request (MPI's contract).
        let r = unsafe { &mut *req };
        if let Some(res) = G.get().and_then(|g| wait_plain(g, *r)) {
            *r = MPI_REQUEST_NULL;
            return match res {
                Ok(s) => {
                    put_status(status, s);
                    MPI_SUCCESS
                }
                Err(f) => plain_failed("MPI_Wait", f, status),
            };
        }
    }
    wait_slow(req, status)
}

/// MPI_Wait of anything but a plain request, and its errors.
#[inline(never)]
fn wait_slow(req: *mut MPI_Request, status: *mut MPI_Status) -> c_int {
    let r = match req_ptr(req) {
        Ok(r) => r,
        Err(e) => return fail("MPI_Wait", MPI_COMM_WORLD, e),
    };
    if *r == MPI_REQUEST_NULL {
        put_status(status, empty_status());
        return MPI_SUCCESS;
    }
    let (i, mut e) = match take(*r) {
        Ok(x) => x,
        Err(e) => return fail("MPI_Wait", MPI_COMM_WORLD, e),
    };
    wait_entry(&mut e);
    let (s, x, comm) = outcome(i, e, r);
    put_status(status, s);
    match x {
        None => MPI_SUCCESS,
        Some(x) => fail("MPI_Wait", comm, x),
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Test(
    req: *mut MPI_Request,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if !req.is_null() && !flag.is_null() {
        // SAFETY: not null: the caller's request and flag (MPI's contract).
        let (r, f) = unsafe { (&mut *req, &mut *flag) };
        match G.get().and_then(|g| test_plain(g, *r)) {
            Some(None) => {
                *f = 0;
                return MPI_SUCCESS;
            }
            Some(Some(res)) => {
                *f = 1;
                *r = MPI_REQUEST_NULL;
                return match res {
                    Ok(s) => {
                        put_status(status, s);
                        MPI_SUCCESS
                    }
                    Err(x) => plain_failed("MPI_Test", x, status),
                };
            }
            None => {}
        }
    }
    test_slow(req, flag, status)
}

/// MPI_Test of anything but a plain request, and its errors.
#[inline(never)]
fn test_slow(req: *mut MPI_Request, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
    let r = match req_ptr(req) {
        Ok(r) => r,
        Err(e) => return fail("MPI_Test", MPI_COMM_WORLD, e),
    };
    if *r == MPI_REQUEST_NULL {
        put_status(status, empty_status());
        return call("MPI_Test", MPI_COMM_WORLD, || put(flag, 1, "flag"));
    }
    if flag.is_null() {
        return fail(
            "MPI_Test",
            MPI_COMM_WORLD,
            MpiErr::new(MPI_ERR_ARG, "flag is a null pointer"),
        );
    }
    let (i, mut e) = match take(*r) {
        Ok(x) => x,
        Err(e) => return fail("MPI_Test", MPI_COMM_WORLD, e),
    };
    if !test_entry(&mut e) {
        put_back(i, e);
        let _ = put(flag, 0, "flag");
        return MPI_SUCCESS;
    }
    let _ = put(flag, 1, "flag");
    let (s, x, comm) = outcome(i, e, r);
    put_status(status, s);
    match x {
        None => MPI_SUCCESS,
        Some(x) => fail("MPI_Test", comm, x),
    }
}

/// A plain request of Waitall/Testall that failed: its status with the
/// error class, kept as the call's error if it is the first.
#[cold]
#[inline(never)]
fn plain_failed_in(f: Failed, status: *mut MPI_Status, first: &mut Option<(MpiErr, MPI_Comm)>) {
    let (mut s, x, comm) = f;
    s.MPI_ERROR = x.class;
    first.get_or_insert((x, comm));
    put_status(status, s);
}

/// Completes every request of `rs` (Waitall; Testall only if every one
/// is complete): statuses, handles set to null, the first error.
unsafe fn complete_all(
    rs: &mut [MPI_Request],
    statuses: *mut MPI_Status,
    block: bool,
) -> Result<bool, (MpiErr, MPI_Comm)> {
    let g = G.get();
    if !block {
        // Testall completes nothing unless all are complete.
        for &h in rs.iter() {
            if h == MPI_REQUEST_NULL {
                continue;
            }
            if let Some(done) = g.and_then(|g| probe_plain(g, h)) {
                if !done {
                    return Ok(false);
                }
                continue;
            }
            let (i, mut e) = take(h).map_err(|x| (x, MPI_COMM_WORLD))?;
            let ok = test_entry(&mut e);
            put_back(i, e);
            if !ok {
                return Ok(false);
            }
        }
    }
    let mut first: Option<(MpiErr, MPI_Comm)> = None;
    let ignore = statuses.is_null() || statuses as usize == MPI_STATUS_IGNORE;
    // One loop each way: with the statuses ignored, nothing of them is
    // computed or tested per request.
    if ignore {
        wait_each(g, rs, |_| std::ptr::null_mut(), &mut first);
    } else {
        // SAFETY: an array of statuses as long as the request array (MPI's
        // contract).
        wait_each(g, rs, |k| unsafe { statuses.add(k) }, &mut first);
    }
    match first {
        Some((x, c)) => Err((in_status(x, ignore), c)),
        None => Ok(true),
    }
}

/// Waits for every request of `rs` in order; the status of `rs[k]` goes
/// to `status(k)` (null: nowhere), the first error to `first`.
#[inline(always)]
fn wait_each(
    g: Option<&'static Global>,
    rs: &mut [MPI_Request],
    status: impl Fn(usize) -> *mut MPI_Status,
    first: &mut Option<(MpiErr, MPI_Comm)>,
) {
    for (k, h) in rs.iter_mut().enumerate() {
        if *h == MPI_REQUEST_NULL {
            put_status(status(k), empty_status());
            continue;
        }
        if let Some(res) = g.and_then(|g| wait_plain(g, *h)) {
            *h = MPI_REQUEST_NULL;
            match res {
                Ok(s) => put_status(status(k), s),
                Err(f) => plain_failed_in(f, status(k), first),
            }
            continue;
        }
        let (i, mut e) = match take(*h) {
            Ok(x) => x,
            Err(x) => {
                first.get_or_insert((x, MPI_COMM_WORLD));
                continue;
            }
        };
        wait_entry(&mut e);
        let (mut s, x, comm) = outcome(i, e, h);
        if let Some(x) = x {
            s.MPI_ERROR = x.class;
            first.get_or_insert((x, comm));
        }
        put_status(status(k), s);
    }
}

/// The error of a call with statuses: MPI_ERR_IN_STATUS when they are
/// not ignored (each request's class is in its status).
#[cold]
fn in_status(mut x: MpiErr, ignore: bool) -> MpiErr {
    if !ignore {
        x.msg = format!("{} (class {} in the request's status)", x.msg, x.class);
        x.class = MPI_ERR_IN_STATUS;
    }
    x
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitall(
    count: c_int,
    rs: *mut MPI_Request,
    statuses: *mut MPI_Status,
) -> c_int {
    // SAFETY: an array of `count` requests (MPI's contract).
    let rs = match unsafe { reqs(rs, count) } {
        Ok(r) => r,
        Err(e) => return fail("MPI_Waitall", MPI_COMM_WORLD, e),
    };
    // SAFETY: the statuses array is as long as the requests (MPI's contract).
    match unsafe { complete_all(rs, statuses, true) } {
        Ok(_) => MPI_SUCCESS,
        Err((x, c)) => fail("MPI_Waitall", c, x),
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testall(
    count: c_int,
    rs: *mut MPI_Request,
    flag: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    // SAFETY: an array of `count` requests (MPI's contract).
    let rs = match unsafe { reqs(rs, count) } {
        Ok(r) => r,
        Err(e) => return fail("MPI_Testall", MPI_COMM_WORLD, e),
    };
    if flag.is_null() {
        return fail(
            "MPI_Testall",
            MPI_COMM_WORLD,
            MpiErr::new(MPI_ERR_ARG, "flag is a null pointer"),
        );
    }
    // SAFETY: the statuses array is as long as the requests (MPI's contract).
    match unsafe { complete_all(rs, statuses, false) } {
        Ok(done) => {
            let _ = put(flag, done as c_int, "flag");
            MPI_SUCCESS
        }
        Err((x, c)) => {
            let _ = put(flag, 1, "flag");
            fail("MPI_Testall", c, x)
        }
    }
}

/// Tests every active request of `rs` once, in order, calling `found`
/// with the index of each complete one until it returns false; whether
/// any was active.
fn scan(rs: &[MPI_Request], mut found: impl FnMut(usize) -> bool) -> R<bool> {
    let g = G.get();
    let mut active = false;
    for (k, &h) in rs.iter().enumerate() {
        if h == MPI_REQUEST_NULL {
            continue;
        }
        let ok = match g.and_then(|g| probe_plain(g, h)) {
            Some(ok) => ok,
            None => {
                let (i, mut e) = take(h)?;
                if e.inactive() {
                    put_back(i, e);
                    continue;
                }
                let ok = test_entry(&mut e);
                put_back(i, e);
                ok
            }
        };
        active = true;
        if ok && !found(k) {
            break;
        }
    }
    Ok(active)
}

/// Takes the outcome of completed request `rs[k]`: its status and, if it
/// failed, the error and the request's communicator.
fn finish_at(rs: &mut [MPI_Request], k: usize) -> R<(MPI_Status, Option<(MpiErr, MPI_Comm)>)> {
    if let Some(res) = G.get().and_then(|g| wait_plain(g, rs[k])) {
        rs[k] = MPI_REQUEST_NULL;
        return Ok(match res {
            Ok(s) => (s, None),
            Err((s, x, comm)) => (s, Some((x, comm))),
        });
    }
    let (i, e) = take(rs[k])?;
    let (s, x, comm) = outcome(i, e, &mut rs[k]);
    Ok((s, x.map(|x| (x, comm))))
}

unsafe fn any(
    func: &str,
    count: c_int,
    rs: *mut MPI_Request,
    index_out: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
    block: bool,
) -> c_int {
    let r: R<()> = (|| {
        // SAFETY: an array of `count` requests (MPI's contract).
        let rs = unsafe { reqs(rs, count) }?;
        loop {
            let mut hit = None;
            let active = scan(rs, |k| {
                hit = Some(k);
                false
            })?;
            if !active {
                put(index_out, MPI_UNDEFINED, "index")?;
                if !flag.is_null() {
                    put(flag, 1, "flag")?;
                }
                put_status(status, empty_status());
                return Ok(());
            }
            if let Some(k) = hit {
                let (s, x) = finish_at(rs, k)?;
                put(index_out, k as c_int, "index")?;
                if !flag.is_null() {
                    put(flag, 1, "flag")?;
                }
                put_status(status, s);
                return match x {
                    Some((x, comm)) => {
                        Err(MpiErr::new(x.class, format!("{} (comm {comm:#x})", x.msg)))
                    }
                    None => Ok(()),
                };
            }
            if !block {
                put(flag, 0, "flag")?;
                put(index_out, MPI_UNDEFINED, "index")?;
                return Ok(());
            }
        }
    })();
    match r {
        Ok(_) => MPI_SUCCESS,
        Err(x) => fail(func, MPI_COMM_WORLD, x),
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitany(
    count: c_int,
    rs: *mut MPI_Request,
    index: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    unsafe {
        any(
            "MPI_Waitany",
            count,
            rs,
            index,
            std::ptr::null_mut(),
            status,
            true,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testany(
    count: c_int,
    rs: *mut MPI_Request,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if flag.is_null() {
        return fail(
            "MPI_Testany",
            MPI_COMM_WORLD,
            MpiErr::new(MPI_ERR_ARG, "flag is a null pointer"),
        );
    }
    // SAFETY: MPI's contract, passed on.
    unsafe { any("MPI_Testany", count, rs, index, flag, status, false) }
}

unsafe fn some(
    func: &str,
    count: c_int,
    rs: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
    block: bool,
) -> c_int {
    let r: R<()> = (|| {
        // SAFETY: an array of `count` requests (MPI's contract).
        let rs = unsafe { reqs(rs, count) }?;
        let mut found = Vec::new();
        loop {
            found.clear();
            let active = scan(rs, |k| {
                found.push(k);
                true
            })?;
            if !active {
                return put(outcount, MPI_UNDEFINED, "outcount");
            }
            if !found.is_empty() || !block {
                let mut first = None;
                for (j, &k) in found.iter().enumerate() {
                    let (mut s, x) = finish_at(rs, k)?;
                    if let Some((x, _)) = x {
                        s.MPI_ERROR = x.class;
                        first.get_or_insert(x);
                    }
                    // SAFETY: `indices` has room for `count` entries, the
                    // statuses too (MPI's contract); `j < count`.
                    unsafe {
                        if indices.is_null() {
                            return err(MPI_ERR_ARG, "indices is a null pointer");
                        }
                        *indices.add(j) = k as c_int;
                    }
                    put_status(status_at(statuses, j), s);
                }
                put(outcount, found.len() as c_int, "outcount")?;
                return match first {
                    Some(x) => Err(x),
                    None => Ok(()),
                };
            }
        }
    })();
    match r {
        Ok(()) => MPI_SUCCESS,
        Err(x) => fail(func, MPI_COMM_WORLD, x),
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitsome(
    count: c_int,
    rs: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    unsafe { some("MPI_Waitsome", count, rs, outcount, indices, statuses, true) }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testsome(
    count: c_int,
    rs: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    unsafe {
        some(
            "MPI_Testsome",
            count,
            rs,
            outcount,
            indices,
            statuses,
            false,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Request_free(req: *mut MPI_Request) -> c_int {
    call("MPI_Request_free", MPI_COMM_WORLD, || {
        let r = req_ptr(req)?;
        if *r == MPI_REQUEST_NULL {
            return err(MPI_ERR_REQUEST, "request is MPI_REQUEST_NULL");
        }
        let (i, mut e) = take(*r)?;
        if e.coll {
            // MPI makes freeing a nonblocking collective's request
            // erroneous, active or not. Refusing it on every rank, whatever
            // its progress, keeps the outcome the same on all of them; its
            // receive side may also still have to be unpacked by a
            // completion call. The request stays valid.
            let call = e
                .unpack
                .as_ref()
                .map_or("a nonblocking collective", |u| u.call);
            put_back(i, e);
            return err(
                MPI_ERR_REQUEST,
                format!(
                    "the request is that of {call}: complete it with MPI_Wait or MPI_Test; \
                     freeing a nonblocking collective's request is erroneous"
                ),
            );
        }
        let done = test_entry(&mut e);
        *r = MPI_REQUEST_NULL;
        release(i);
        if !done {
            // Finished later: at MPI_Finalize (or dropped, which waits).
            state::with(|st| {
                st.reqs.detached.push(e);
                Ok(())
            })?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Request_get_status(
    req: MPI_Request,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Request_get_status", MPI_COMM_WORLD, || {
        if req == MPI_REQUEST_NULL {
            put_status(status, empty_status());
            return put(flag, 1, "flag");
        }
        let (i, mut e) = take(req)?;
        let done = test_entry(&mut e);
        let s = e.done.as_ref().map(|d| d.0);
        put_back(i, e);
        if let Some(s) = s {
            put_status(status, s);
        }
        put(flag, done as c_int, "flag")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Cancel(req: *mut MPI_Request) -> c_int {
    call("MPI_Cancel", MPI_COMM_WORLD, || {
        let r = req_ptr(req)?;
        if *r == MPI_REQUEST_NULL {
            return err(MPI_ERR_REQUEST, "request is MPI_REQUEST_NULL");
        }
        let (i, mut e) = take(*r)?;
        if let Pending::P2p(p) | Pending::Plain(p) = &mut e.op {
            if e.done.is_none() && p.cancel() {
                let mut s = empty_status();
                s.set_count(0, true);
                e.op = Pending::Done;
                e.done = Some((s, None));
            }
        }
        // A send, a matched receive, a collective: cannot be cancelled;
        // it completes normally (MPI_Test_cancelled says false).
        put_back(i, e);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Test_cancelled(status: *const MPI_Status, flag: *mut c_int) -> c_int {
    call("MPI_Test_cancelled", MPI_COMM_WORLD, || {
        if status.is_null() || status as usize == MPI_STATUS_IGNORE {
            return err(MPI_ERR_ARG, "status is null or MPI_STATUS_IGNORE");
        }
        // SAFETY: a valid status (checked above; MPI's contract).
        let c = unsafe { (*status).cancelled() };
        put(flag, c as c_int, "flag")
    })
}

/// Finishes every request still pending (MPI_Finalize).
pub fn finish_all(st: &mut state::State) {
    for slot in st.reqs.slots.iter_mut() {
        if !matches!(slot.op, Pending::Vacant) {
            let mut e = std::mem::replace(slot, ReqEntry::vacant());
            wait_entry(&mut e);
        }
    }
    for mut e in st.reqs.detached.drain(..) {
        wait_entry(&mut e);
    }
}

/// Starts persistent request `h`.
fn start(h: MPI_Request) -> R<()> {
    let (i, mut e) = take(h)?;
    let Some(p) = e.persist else {
        put_back(i, e);
        return err(MPI_ERR_REQUEST, format!("request {h:#x} is not persistent"));
    };
    if !e.inactive() {
        put_back(i, e);
        return err(MPI_ERR_REQUEST, format!("request {h:#x} is active already"));
    }
    // SAFETY: the buffer given to MPI_Send_init/MPI_Recv_init stays valid
    // while the request exists (MPI's contract).
    let posted = unsafe {
        if p.send {
            crate::p2p::post_send(p.buf, p.count, p.dt, p.peer, p.tag, e.comm, p.sync)
        } else {
            crate::p2p::post_recv(p.buf, p.count, p.dt, p.peer, p.tag, e.comm)
        }
    };
    match posted {
        Ok(n) => {
            e.op = n.op;
            e.done = n.done;
            e.staged = n.staged;
            e.keep = n.keep;
            put_back(i, e);
            Ok(())
        }
        Err(x) => {
            put_back(i, e);
            Err(x)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Start(req: *mut MPI_Request) -> c_int {
    call("MPI_Start", MPI_COMM_WORLD, || start(*req_ptr(req)?))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Startall(count: c_int, rs: *mut MPI_Request) -> c_int {
    call("MPI_Startall", MPI_COMM_WORLD, || {
        // SAFETY: an array of `count` requests (MPI's contract).
        let rs = unsafe { reqs(rs, count) }?;
        rs.iter().try_for_each(|&h| start(h))
    })
}
