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
use crate::state::{self, index};

pub enum Pending {
    P2p(Request<'static>),
    Coll(CollRequest<'static>),
    /// Complete already (or never started: MPI_PROC_NULL).
    Done,
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
        let i = match st.free_reqs.pop() {
            Some(i) => i,
            None => {
                st.reqs.push(None);
                st.reqs.len() - 1
            }
        };
        st.reqs[i] = Some(e);
        Ok(REQUEST_DYN | i as c_int)
    })
}

fn take(h: MPI_Request) -> R<(usize, ReqEntry)> {
    state::with(|st| {
        let i = index(h, REQUEST_DYN);
        match i.and_then(|i| st.reqs.get_mut(i)).and_then(|s| s.take()) {
            Some(e) => Ok((i.unwrap_or(0), e)),
            None => err(MPI_ERR_REQUEST, format!("invalid request handle {h:#x}")),
        }
    })
}

fn put_back(i: usize, e: ReqEntry) {
    let _ = state::with(|st| {
        st.reqs[i] = Some(e);
        Ok(())
    });
}

fn release(i: usize) {
    let _ = state::with(|st| {
        st.free_reqs.push(i);
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
        Pending::P2p(r) => r.wait().map(Some),
        Pending::Coll(r) => r.wait().map(|_| None),
        Pending::Done => Ok(None),
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
        Pending::P2p(r) => match r.test() {
            Ok(None) => return false,
            Ok(Some(s)) => Ok(Some(s)),
            Err(x) => Err(x),
        },
        Pending::Coll(r) => match r.test() {
            Ok(false) => return false,
            Ok(true) => Ok(None),
            Err(x) => Err(x),
        },
        Pending::Done => Ok(None),
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

#[no_mangle]
pub unsafe extern "C" fn MPI_Wait(req: *mut MPI_Request, status: *mut MPI_Status) -> c_int {
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

/// Completes every request of `rs` that `done` says to (all of them
/// for Waitall): statuses, handles set to null, the first error.
unsafe fn complete_all(
    func: &str,
    rs: &mut [MPI_Request],
    statuses: *mut MPI_Status,
    block: bool,
) -> Result<bool, (MpiErr, MPI_Comm)> {
    if !block {
        // Testall completes nothing unless all are complete.
        for &h in rs.iter() {
            if h == MPI_REQUEST_NULL {
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
    for (k, h) in rs.iter_mut().enumerate() {
        if *h == MPI_REQUEST_NULL {
            put_status(status_at(statuses, k), empty_status());
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
        put_status(status_at(statuses, k), s);
    }
    match first {
        Some((mut x, c)) => {
            if !ignore {
                x.msg = format!("{} (class {} in the request's status)", x.msg, x.class);
                x.class = MPI_ERR_IN_STATUS;
            }
            let _ = func;
            Err((x, c))
        }
        None => Ok(true),
    }
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
    match unsafe { complete_all("MPI_Waitall", rs, statuses, true) } {
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
    match unsafe { complete_all("MPI_Testall", rs, statuses, false) } {
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

/// Tests every active request of `rs` once; the indices of those
/// complete (at most `limit`), whether any was active.
fn scan(rs: &[MPI_Request], limit: usize, found: &mut Vec<usize>) -> R<bool> {
    let mut active = false;
    for (k, &h) in rs.iter().enumerate() {
        if h == MPI_REQUEST_NULL {
            continue;
        }
        let (i, mut e) = take(h)?;
        if e.inactive() {
            put_back(i, e);
            continue;
        }
        active = true;
        let ok = test_entry(&mut e);
        put_back(i, e);
        if ok {
            found.push(k);
            if found.len() >= limit {
                break;
            }
        }
    }
    Ok(active)
}

/// Takes the outcome of completed request `rs[k]`.
fn finish_at(rs: &mut [MPI_Request], k: usize) -> R<(MPI_Status, Option<MpiErr>, MPI_Comm)> {
    let (i, e) = take(rs[k])?;
    Ok(outcome(i, e, &mut rs[k]))
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
    let mut found = Vec::new();
    let r: R<Option<MPI_Comm>> = (|| {
        // SAFETY: an array of `count` requests (MPI's contract).
        let rs = unsafe { reqs(rs, count) }?;
        loop {
            found.clear();
            let active = scan(rs, 1, &mut found)?;
            if !active {
                put(index_out, MPI_UNDEFINED, "index")?;
                if !flag.is_null() {
                    put(flag, 1, "flag")?;
                }
                put_status(status, empty_status());
                return Ok(None);
            }
            if let Some(&k) = found.first() {
                let (s, x, comm) = finish_at(rs, k)?;
                put(index_out, k as c_int, "index")?;
                if !flag.is_null() {
                    put(flag, 1, "flag")?;
                }
                put_status(status, s);
                return match x {
                    Some(x) => Err(MpiErr::new(x.class, format!("{} (comm {comm:#x})", x.msg))),
                    None => Ok(Some(comm)),
                };
            }
            if !block {
                put(flag, 0, "flag")?;
                put(index_out, MPI_UNDEFINED, "index")?;
                return Ok(None);
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
            let active = scan(rs, usize::MAX, &mut found)?;
            if !active {
                return put(outcount, MPI_UNDEFINED, "outcount");
            }
            if !found.is_empty() || !block {
                let mut first = None;
                for (j, &k) in found.iter().enumerate() {
                    let (mut s, x, _) = finish_at(rs, k)?;
                    if let Some(x) = x {
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
                st.detached.push(e);
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
        if let Pending::P2p(p) = &mut e.op {
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
    for e in st.reqs.iter_mut().filter_map(|e| e.take()) {
        let mut e = e;
        wait_entry(&mut e);
    }
    for mut e in st.detached.drain(..) {
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
