//! Point-to-point calls. Blocking ones hand the caller's bytes straight to
//! ibcoll (no copy, no allocation for contiguous types).

use std::os::raw::{c_int, c_void};

use ibcoll::{static_scope, Comm, ANY_SOURCE, ANY_TAG};

use crate::abi::*;
use crate::buffers::{self, put, put_status, In, Out};
use crate::datatype::{basic, basic_fast, ty};
use crate::error::{call, err, fail, fail_ibcoll, MpiErr, R};
use crate::requests::{
    self, failed_status, failed_status_in, proc_null_status, status_of, Pending, ReqEntry,
};
use crate::state;

/// A destination rank of `c`, or `None` for MPI_PROC_NULL.
#[inline(always)]
pub fn dest(c: &Comm, r: c_int) -> R<Option<usize>> {
    if r == MPI_PROC_NULL {
        return Ok(None);
    }
    if r < 0 || r as usize >= c.size() {
        return bad_rank(c, r);
    }
    Ok(Some(r as usize))
}

#[cold]
fn bad_rank<T>(c: &Comm, r: c_int) -> R<T> {
    err(
        MPI_ERR_RANK,
        format!(
            "rank {}: peer rank {r} is not in the communicator of size {}",
            c.world_rank(c.rank()).unwrap_or(0),
            c.size()
        ),
    )
}

/// A source rank: `None` for MPI_PROC_NULL, ibcoll's any-source for
/// MPI_ANY_SOURCE.
#[inline(always)]
pub fn source(c: &Comm, r: c_int) -> R<Option<usize>> {
    if r == MPI_ANY_SOURCE {
        return Ok(Some(ibcoll::ANY_SOURCE));
    }
    dest(c, r)
}

#[inline(always)]
fn send_tag(t: c_int) -> R<i32> {
    if t < 0 {
        return err(MPI_ERR_TAG, format!("tag {t} is negative"));
    }
    Ok(t)
}

#[inline(always)]
fn recv_tag(t: c_int) -> R<i32> {
    if t == MPI_ANY_TAG {
        return Ok(ANY_TAG);
    }
    send_tag(t)
}

/// MPI_Send and the modes that complete as it does (ready, buffered).
/// MPI_Ssend is [`ssend`].
#[inline(always)]
unsafe fn send(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> R<()> {
    let tag = send_tag(tag)?;
    // The common case in straight-line code: a predefined type is its
    // bytes in place.
    if let Some((_, ext, _)) = basic(dt) {
        let n = buffers::basic_len(buf, count, ext)?;
        let c = state::comm_ref(comm)?;
        let Some(d) = dest(&c, to)? else {
            return Ok(());
        };
        // SAFETY: `buf` holds `count` elements of `ext` bytes (MPI's
        // contract).
        c.send(unsafe { buffers::bytes(buf, n) }, d, tag)?;
        return Ok(());
    }
    // SAFETY: MPI's contract, passed on.
    unsafe { send_typed(buf, count, dt, to, tag, comm) }
}

/// The blocking send's fast path, in the MPI function itself: a
/// predefined type, a buffer that is not null, count and tag not
/// negative, a valid communicator and a rank of it (not MPI_PROC_NULL),
/// each in one compare. `None` for anything else: [`send_slow`] then
/// checks everything again, in order, and reports what is wrong.
#[inline(always)]
unsafe fn send_fast(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
    func: &'static str,
) -> Option<c_int> {
    let (ext, _) = basic_fast(dt)?;
    if (count | tag) < 0 || buf.is_null() {
        return None;
    }
    let c = state::comm_fast(comm)?;
    // A negative rank (MPI_PROC_NULL too) is above any size as unsigned.
    if to as u32 as usize >= c.size() {
        return None;
    }
    // SAFETY: `buf` is not null and holds `count` elements of `ext` bytes
    // (MPI's contract); a non-null pointer is a valid empty slice.
    let data = unsafe { std::slice::from_raw_parts(buf as *const u8, count as usize * ext) };
    let r = c.send(data, to as usize, tag);
    drop(c);
    Some(match r {
        Ok(()) => MPI_SUCCESS,
        Err(e) => fail_ibcoll(func, comm, e),
    })
}

/// MPI_Send (and `func`, a mode that completes as it does) off the fast
/// path: every check, in order, with its error.
#[inline(never)]
unsafe fn send_slow(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
    func: &'static str,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call(func, comm, || unsafe {
        send(buf, count, dt, to, tag, comm)
    })
}

/// MPI_Ssend: returns once the receiver has matched the message (ibcoll's
/// synchronous send: rendezvous at any size).
unsafe fn ssend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> R<()> {
    let tag = send_tag(tag)?;
    let t = ty(dt)?;
    state::with_comm(comm, |c| {
        let Some(d) = dest(c, to)? else {
            return Ok(());
        };
        // SAFETY: `buf` holds `count` elements of `dt` (MPI's contract).
        let data = unsafe { buffers::out(buf, count, &t) }?;
        c.ssend(data.bytes(), d, tag)?;
        Ok(())
    })
}

/// [`send`] of a derived type (packed unless contiguous).
#[inline(never)]
unsafe fn send_typed(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> R<()> {
    let t = ty(dt)?;
    state::with_comm(comm, |c| {
        let Some(d) = dest(c, to)? else {
            return Ok(());
        };
        // SAFETY: `buf` holds `count` elements of `dt` (MPI's contract).
        let data = unsafe { buffers::out(buf, count, &t) }?;
        c.send(data.bytes(), d, tag)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Send(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match send_fast(buf, count, dt, dest, tag, comm, "MPI_Send") {
            Some(rc) => rc,
            None => send_slow(buf, count, dt, dest, tag, comm, "MPI_Send"),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ssend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ssend", comm, || unsafe {
        ssend(buf, count, dt, dest, tag, comm)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Rsend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match send_fast(buf, count, dt, dest, tag, comm, "MPI_Rsend") {
            Some(rc) => rc,
            None => send_slow(buf, count, dt, dest, tag, comm, "MPI_Rsend"),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Bsend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match send_fast(buf, count, dt, dest, tag, comm, "MPI_Bsend") {
            Some(rc) => rc,
            None => send_slow(buf, count, dt, dest, tag, comm, "MPI_Bsend"),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Buffer_attach(_buf: *mut c_void, _size: c_int) -> c_int {
    // Buffered sends complete as standard sends; the buffer is not needed.
    MPI_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Buffer_detach(buf: *mut c_void, size: *mut c_int) -> c_int {
    call("MPI_Buffer_detach", MPI_COMM_WORLD, || {
        put(buf as *mut *mut c_void, std::ptr::null_mut(), "buffer_addr")?;
        put(size, 0, "size")
    })
}

#[inline(always)]
unsafe fn recv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> R<()> {
    let tag = recv_tag(tag)?;
    if let Some((_, ext, _)) = basic(dt) {
        let n = buffers::basic_len(buf, count, ext)?;
        let c = state::comm_ref(comm)?;
        let Some(s) = source(&c, from)? else {
            put_status(status, proc_null_status());
            return Ok(());
        };
        // SAFETY: `buf` holds `count` writable elements of `ext` bytes
        // (MPI's contract).
        let into = unsafe { buffers::bytes_mut(buf, n) };
        return match c.recv(into, s, tag) {
            Ok(st) => {
                put_status(status, status_of(&st));
                Ok(())
            }
            Err(e) => recv_failed(&c, e, status),
        };
    }
    // SAFETY: MPI's contract, passed on.
    unsafe { recv_typed(buf, count, dt, from, tag, comm, status) }
}

/// The blocking receive's fast path, as [`send_fast`]: a predefined type,
/// a buffer that is not null, count not negative, a tag from MPI_ANY_TAG
/// up, a valid communicator, a rank of it or MPI_ANY_SOURCE.
#[inline(always)]
unsafe fn recv_fast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> Option<c_int> {
    // MPI_ANY_TAG is ibcoll's ANY_TAG: every tag from -1 up passes as it
    // is (the largest tag wraps to negative and takes the slow path).
    const _: () = assert!(MPI_ANY_TAG == ANY_TAG && MPI_ANY_TAG == -1);
    let (ext, _) = basic_fast(dt)?;
    if (count | tag.wrapping_add(1)) < 0 || buf.is_null() {
        return None;
    }
    let c = state::comm_fast(comm)?;
    let src = if (from as u32 as usize) < c.size() {
        from as usize
    } else if from == MPI_ANY_SOURCE {
        ANY_SOURCE
    } else {
        return None;
    };
    // SAFETY: `buf` is not null and holds `count` writable elements of
    // `ext` bytes (MPI's contract).
    let into = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, count as usize * ext) };
    match c.recv(into, src, tag) {
        Ok(st) => {
            drop(c);
            put_status(status, status_of(&st));
            Some(MPI_SUCCESS)
        }
        Err(e) => Some(recv_fast_failed(&c, e, status, comm)),
    }
}

#[cold]
#[inline(never)]
fn recv_fast_failed(c: &Comm, e: ibcoll::Error, status: *mut MPI_Status, comm: MPI_Comm) -> c_int {
    put_status(status, failed_status_in(c, &e));
    fail("MPI_Recv", comm, MpiErr::from(e))
}

#[cold]
fn recv_failed(c: &Comm, e: ibcoll::Error, status: *mut MPI_Status) -> R<()> {
    put_status(status, failed_status_in(c, &e));
    Err(MpiErr::from(e))
}

/// [`recv`] of a derived type (unpacked unless contiguous).
#[inline(never)]
unsafe fn recv_typed(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> R<()> {
    let t = ty(dt)?;
    state::with_comm(comm, |c| {
        let Some(s) = source(c, from)? else {
            put_status(status, proc_null_status());
            return Ok(());
        };
        // SAFETY: `buf` holds `count` writable elements (MPI's contract).
        let mut into = unsafe { buffers::inb(buf, count, &t) }?;
        match c.recv(into.bytes(), s, tag) {
            Ok(st) => {
                if let In::Staged(s) = &into {
                    // SAFETY: the receive is done; `buf` is as above.
                    unsafe { s.finish(st.len) };
                }
                put_status(status, status_of(&st));
                Ok(())
            }
            Err(e) => {
                put_status(status, failed_status_in(c, &e));
                Err(MpiErr::from(e))
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Recv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match recv_fast(buf, count, dt, source, tag, comm, status) {
            Some(rc) => rc,
            None => recv_slow(buf, count, dt, source, tag, comm, status),
        }
    }
}

/// MPI_Recv off the fast path: every check, in order, with its error.
#[inline(never)]
unsafe fn recv_slow(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Recv", comm, || unsafe {
        recv(buf, count, dt, from, tag, comm, status)
    })
}

/// Starts a send: the request's entry (not registered yet).
///
/// # Safety
/// `buf` holds `count` elements and stays valid and unchanged until the
/// operation completes (MPI's contract for nonblocking sends).
pub unsafe fn post_send(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
    sync: bool,
) -> R<ReqEntry> {
    let c = state::comm(comm)?;
    let t = ty(dt)?;
    let tag = send_tag(tag)?;
    let Some(d) = dest(&c, to)? else {
        return Ok(ReqEntry::finished(comm, Default::default()));
    };
    // SAFETY: `buf` holds `count` elements (MPI's contract).
    let data = unsafe { buffers::out(buf, count, &t) }?;
    let (view, keep) = match data {
        // SAFETY: the caller keeps the buffer valid and unchanged until the
        // request completes (MPI's contract for nonblocking sends).
        Out::Direct(b) => (unsafe { buffers::forever(b) }, None),
        Out::Packed(v) => {
            // SAFETY: `v` moves into the request's entry, which keeps it
            // until the operation is done (field order of ReqEntry).
            (unsafe { buffers::forever(&v) }, Some(v))
        }
    };
    let r = if sync {
        c.issend(static_scope(), view, d, tag)?
    } else {
        c.isend(static_scope(), view, d, tag)?
    };
    let mut e = ReqEntry::new(Pending::P2p(r), comm);
    e.keep.extend(keep);
    Ok(e)
}

unsafe fn isend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
    sync: bool,
) -> R<()> {
    if req.is_null() {
        return err(MPI_ERR_REQUEST, "request pointer is null");
    }
    // SAFETY: MPI's contract, passed on.
    let e = unsafe { post_send(buf, count, dt, to, tag, comm, sync) }?;
    put(req, requests::add(e)?, "request")
}

/// Starts a receive: the request's entry (not registered yet).
///
/// # Safety
/// `buf` holds `count` writable elements left alone until the operation
/// completes (MPI's contract for nonblocking receives).
pub unsafe fn post_recv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> R<ReqEntry> {
    let c = state::comm(comm)?;
    let t = ty(dt)?;
    let tag = recv_tag(tag)?;
    let Some(s) = source(&c, from)? else {
        return Ok(ReqEntry::finished(comm, proc_null_status()));
    };
    // SAFETY: the caller's contract.
    let into = unsafe { buffers::inb(buf, count, &t) }?;
    let (view, staged) = match into {
        // SAFETY: the caller's contract.
        In::Direct(b) => (unsafe { buffers::forever_mut(b) }, None),
        In::Staged(mut s) => {
            // SAFETY: the staging vector moves into the request's entry,
            // which keeps it until the receive is done.
            (unsafe { buffers::forever_mut(&mut s.data) }, Some(s))
        }
    };
    let r = c.irecv(static_scope(), view, s, tag)?;
    let mut e = ReqEntry::new(Pending::P2p(r), comm);
    e.staged = staged;
    Ok(e)
}

/// MPI_Send_init / MPI_Recv_init: checks the arguments, keeps them.
unsafe fn init_persistent(
    send: bool,
    sync: bool,
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    peer: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> R<()> {
    let c = state::comm(comm)?;
    let t = ty(dt)?;
    buffers::wire_len(buf, count, &t)?;
    if send {
        send_tag(tag)?;
        dest(&c, peer)?;
    } else {
        recv_tag(tag)?;
        source(&c, peer)?;
    }
    if req.is_null() {
        return err(MPI_ERR_REQUEST, "request pointer is null");
    }
    let mut e = ReqEntry::new(Pending::Done, comm);
    e.persist = Some(requests::Persist {
        send,
        sync,
        buf,
        count,
        dt,
        peer,
        tag,
    });
    put(req, requests::add(e)?, "request")
}

macro_rules! init_fn {
    ($name:ident, $s:literal, $send:expr, $sync:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            buf: *const c_void,
            count: c_int,
            dt: MPI_Datatype,
            peer: c_int,
            tag: c_int,
            comm: MPI_Comm,
            req: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: MPI's contract, passed on.
            call($s, comm, || unsafe {
                init_persistent(
                    $send,
                    $sync,
                    buf as *mut c_void,
                    count,
                    dt,
                    peer,
                    tag,
                    comm,
                    req,
                )
            })
        }
    };
}

init_fn!(MPI_Send_init, "MPI_Send_init", true, false);
init_fn!(MPI_Ssend_init, "MPI_Ssend_init", true, true);
init_fn!(MPI_Rsend_init, "MPI_Rsend_init", true, false);
init_fn!(MPI_Bsend_init, "MPI_Bsend_init", true, false);
init_fn!(MPI_Recv_init, "MPI_Recv_init", false, false);

/// The nonblocking send's fast path, in the MPI function itself: the
/// checks of [`send_fast`] and a request pointer that is not null; the
/// send is started in the static scope over the caller's memory and
/// registered as a plain request (see `requests::Pending::Plain`). `None`
/// for anything else, before anything is started: [`isend_slow`] then
/// checks everything again, in order, and reports what is wrong.
///
/// The state is borrowed (mutably: the request table) while ibcoll posts
/// the send: posting runs no user code (ibcoll's `isend`/`issend` and
/// `irecv` queue, match or connect; they drive no collective), so no user
/// reduction can want the state meanwhile.
#[inline(always)]
unsafe fn isend_fast(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
    sync: bool,
    func: &'static str,
) -> Option<c_int> {
    let (ext, _) = basic_fast(dt)?;
    if (count | tag) < 0 || buf.is_null() || req.is_null() {
        return None;
    }
    let mut st = state::G.get()?.state_fast()?;
    let (c, scope, reqs) = st.poster(comm)?;
    // A negative rank (MPI_PROC_NULL too) is above any size as unsigned.
    if to as u32 as usize >= c.size() {
        return None;
    }
    let i = reqs.reserve().ok()?;
    // Taken (bounds checked) before the send is started, so that nothing
    // between its return and its registration can unwind (a path that
    // unwinds there costs one more copy of the request: see `take_plain!`).
    let slot = reqs.reserved(i);
    // SAFETY: `buf` is not null and holds `count` elements of `ext` bytes,
    // left valid and unchanged until the request completes (MPI's contract
    // for nonblocking sends), which is what a `'static` view needs: the
    // request table owns the operation until MPI_Wait/Test (or
    // MPI_Finalize) completes it.
    let data = unsafe { std::slice::from_raw_parts(buf as *const u8, count as usize * ext) };
    let r = if sync {
        c.issend(scope, data, to as usize, tag)
    } else {
        c.isend(scope, data, to as usize, tag)
    };
    match r {
        Ok(r) => {
            slot.fill_plain(r);
            slot.comm = comm;
            drop(st);
            // SAFETY: not null: the caller's request (MPI's contract).
            unsafe { req.write(requests::handle(i)) };
            Some(MPI_SUCCESS)
        }
        Err(e) => {
            reqs.unreserve(i);
            drop(st);
            Some(fail_ibcoll(func, comm, e))
        }
    }
}

/// A nonblocking send off the fast path: every check, in order, with its
/// error.
#[inline(never)]
unsafe fn isend_slow(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
    sync: bool,
    func: &'static str,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call(func, comm, || unsafe {
        isend(buf, count, dt, to, tag, comm, req, sync)
    })
}

macro_rules! isend_fn {
    ($name:ident, $s:literal, $sync:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            buf: *const c_void,
            count: c_int,
            dt: MPI_Datatype,
            dest: c_int,
            tag: c_int,
            comm: MPI_Comm,
            req: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: MPI's contract, passed on (both paths).
            unsafe {
                match isend_fast(buf, count, dt, dest, tag, comm, req, $sync, $s) {
                    Some(rc) => rc,
                    None => isend_slow(buf, count, dt, dest, tag, comm, req, $sync, $s),
                }
            }
        }
    };
}

isend_fn!(MPI_Isend, "MPI_Isend", false);
isend_fn!(MPI_Issend, "MPI_Issend", true);
isend_fn!(MPI_Irsend, "MPI_Irsend", false);
isend_fn!(MPI_Ibsend, "MPI_Ibsend", false);

/// The nonblocking receive's fast path, as [`isend_fast`] with the
/// checks of [`recv_fast`].
#[inline(always)]
unsafe fn irecv_fast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> Option<c_int> {
    let (ext, _) = basic_fast(dt)?;
    // MPI_ANY_TAG (-1) is ibcoll's ANY_TAG (see `recv_fast`).
    if (count | tag.wrapping_add(1)) < 0 || buf.is_null() || req.is_null() {
        return None;
    }
    let mut st = state::G.get()?.state_fast()?;
    let (c, scope, reqs) = st.poster(comm)?;
    let src = if (from as u32 as usize) < c.size() {
        from as usize
    } else if from == MPI_ANY_SOURCE {
        ANY_SOURCE
    } else {
        return None;
    };
    let i = reqs.reserve().ok()?;
    // As in `isend_fast`.
    let slot = reqs.reserved(i);
    // SAFETY: `buf` is not null and holds `count` writable elements of
    // `ext` bytes, left alone until the request completes (MPI's contract
    // for nonblocking receives): see `isend_fast`.
    let into = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, count as usize * ext) };
    match c.irecv(scope, into, src, tag) {
        Ok(r) => {
            slot.fill_plain(r);
            slot.comm = comm;
            drop(st);
            // SAFETY: not null: the caller's request (MPI's contract).
            unsafe { req.write(requests::handle(i)) };
            Some(MPI_SUCCESS)
        }
        Err(e) => {
            reqs.unreserve(i);
            drop(st);
            Some(fail_ibcoll("MPI_Irecv", comm, e))
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Irecv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match irecv_fast(buf, count, dt, from, tag, comm, req) {
            Some(rc) => rc,
            None => irecv_slow(buf, count, dt, from, tag, comm, req),
        }
    }
}

/// MPI_Irecv off the fast path: every check, in order, with its error.
#[inline(never)]
unsafe fn irecv_slow(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    call("MPI_Irecv", comm, || {
        if req.is_null() {
            return err(MPI_ERR_REQUEST, "request pointer is null");
        }
        // SAFETY: MPI's contract, passed on.
        let e = unsafe { post_recv(buf, count, dt, from, tag, comm) }?;
        put(req, requests::add(e)?, "request")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Sendrecv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    to: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    from: c_int,
    rtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Sendrecv", comm, || {
        let c = state::comm(comm)?;
        let (st, rt) = (ty(stype)?, ty(rtype)?);
        let stag = send_tag(stag)?;
        let rtag = recv_tag(rtag)?;
        let d = dest(&c, to)?;
        let s = source(&c, from)?;
        // SAFETY: both buffers per MPI's contract.
        let (data, mut into) = unsafe {
            (
                buffers::out(sbuf, scount, &st)?,
                buffers::inb(rbuf, rcount, &rt)?,
            )
        };
        let res = match (d, s) {
            (Some(d), Some(s)) => c.sendrecv(data.bytes(), d, stag, into.bytes(), s, rtag),
            (Some(d), None) => c.send(data.bytes(), d, stag).map(|_| ibcoll::Status {
                source: usize::MAX,
                tag: -1,
                len: 0,
            }),
            (None, Some(s)) => c.recv(into.bytes(), s, rtag),
            (None, None) => Ok(ibcoll::Status {
                source: usize::MAX,
                tag: -1,
                len: 0,
            }),
        };
        match res {
            Ok(r) => {
                if s.is_none() {
                    put_status(status, proc_null_status());
                } else {
                    if let In::Staged(x) = &into {
                        // SAFETY: the receive is done.
                        unsafe { x.finish(r.len) };
                    }
                    put_status(status, status_of(&r));
                }
                Ok(())
            }
            Err(e) => {
                put_status(status, failed_status(comm, &e));
                Err(e.into())
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Sendrecv_replace(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    to: c_int,
    stag: c_int,
    from: c_int,
    rtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Sendrecv_replace", comm, || {
        let t = ty(dt)?;
        // SAFETY: `buf` holds `count` elements (MPI's contract); the copy
        // is what is sent while the buffer is received into.
        let copy: Vec<u8> = unsafe { buffers::out(buf, count, &t)? }.bytes().to_vec();
        let tmp = Ty1(t);
        // SAFETY: `copy` is contiguous and outlives the call.
        let rc = unsafe {
            MPI_Sendrecv(
                copy.as_ptr() as *const c_void,
                copy.len() as c_int,
                MPI_BYTE,
                to,
                stag,
                buf,
                count,
                dt,
                from,
                rtag,
                comm,
                status,
            )
        };
        let _ = tmp;
        if rc != MPI_SUCCESS {
            return Err(MpiErr::new(
                rc & 0x7f,
                crate::error::message(rc).unwrap_or_default(),
            ));
        }
        Ok(())
    })
}

/// Keeps a resolved type alive across a nested call.
struct Ty1(#[allow(dead_code)] crate::datatype::Ty);

fn probe_status(s: &ibcoll::Status) -> MPI_Status {
    status_of(s)
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Probe(
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Probe", comm, || {
        let c = state::comm(comm)?;
        let tag = recv_tag(tag)?;
        let Some(s) = source(&c, from)? else {
            put_status(status, proc_null_status());
            return Ok(());
        };
        let st = c.probe(s, tag)?;
        put_status(status, probe_status(&st));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iprobe(
    from: c_int,
    tag: c_int,
    comm: MPI_Comm,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Iprobe", comm, || {
        let c = state::comm(comm)?;
        let tag = recv_tag(tag)?;
        let Some(s) = source(&c, from)? else {
            put_status(status, proc_null_status());
            return put(flag, 1, "flag");
        };
        match c.iprobe(s, tag)? {
            Some(st) => {
                put_status(status, probe_status(&st));
                put(flag, 1, "flag")
            }
            None => put(flag, 0, "flag"),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Get_count(
    status: *const MPI_Status,
    dt: MPI_Datatype,
    count: *mut c_int,
) -> c_int {
    call("MPI_Get_count", MPI_COMM_WORLD, || {
        if status.is_null() || status as usize == MPI_STATUS_IGNORE {
            return err(MPI_ERR_ARG, "status is null or MPI_STATUS_IGNORE");
        }
        let t = ty(dt)?;
        // SAFETY: a valid status (checked above; MPI's contract).
        let bytes = unsafe { (*status).count() };
        let w = t.wire();
        let n = if w == 0 {
            0
        } else if bytes % w != 0 {
            MPI_UNDEFINED
        } else {
            (bytes / w) as c_int
        };
        put(count, n, "count")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Get_elements(
    status: *const MPI_Status,
    dt: MPI_Datatype,
    count: *mut c_int,
) -> c_int {
    call("MPI_Get_elements", MPI_COMM_WORLD, || {
        if status.is_null() || status as usize == MPI_STATUS_IGNORE {
            return err(MPI_ERR_ARG, "status is null or MPI_STATUS_IGNORE");
        }
        let t = ty(dt)?;
        // SAFETY: a valid status (checked above; MPI's contract).
        let bytes = unsafe { (*status).count() };
        let es = match t.reducible() {
            Some((_, es, _)) => es,
            None => t.info().elem_size,
        };
        let n = if es == 0 {
            0
        } else if bytes % es != 0 {
            MPI_UNDEFINED
        } else {
            (bytes / es) as c_int
        };
        put(count, n, "count")
    })
}
