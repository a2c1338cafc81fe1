//! Collectives, blocking and nonblocking, on ibcoll's collectives: data
//! moves as bytes (counts times the type's size); reductions go through
//! ibcoll's byte-level forms with the kernel of (operation, type).
//! Contiguous types (every predefined one, and contiguous derived ones)
//! go straight from and into the caller's buffers. Any call with a
//! non-contiguous derived type on either side, blocking or nonblocking,
//! uniform or v/w-form, goes to `packed.rs`: the send side is packed when
//! the call is made, the byte-level collective runs on staging buffers,
//! and the receive side is unpacked into the caller's elements when the
//! operation completes (for a nonblocking call, the staging buffers
//! belong to its request, and its completion in `requests.rs` unpacks).
//! Reductions on such types need one predefined element kind and a
//! predefined operation.

use std::os::raw::{c_int, c_void};
use std::rc::Rc;

use ibcoll::{static_scope, CollRequest, Comm};

use crate::abi::*;
use crate::buffers::{basic_len, bytes, bytes_mut, forever, forever_mut, is_in_place, wire_len};
use crate::datatype::{basic, basic_fast, carray, ty, Ty};
use crate::error::{call, err, fail_ibcoll, R};
use crate::ops::{kernel, predefined, predefined_fast};
use crate::packed;
use crate::requests;
use crate::state::{self, index};

/// Where a call's request goes: `None` for a blocking call.
type Req = Option<*mut MPI_Request>;

/// The code of a blocking fast path's ibcoll call (its error to the
/// communicator's handler, out of line).
#[inline(always)]
fn done(func: &'static str, comm: MPI_Comm, r: ibcoll::Result<()>) -> c_int {
    match r {
        Ok(()) => MPI_SUCCESS,
        Err(e) => fail_ibcoll(func, comm, e),
    }
}

#[inline(always)]
fn check_root(c: &Comm, root: c_int) -> R<usize> {
    if root < 0 || root as usize >= c.size() {
        return bad_root(c, root);
    }
    Ok(root as usize)
}

#[cold]
fn bad_root(c: &Comm, root: c_int) -> R<usize> {
    {
        err(
            MPI_ERR_ROOT,
            format!(
                "rank {}: root {root} is not in the communicator of size {}",
                c.world_rank(c.rank()).unwrap_or(0),
                c.size()
            ),
        )
    }
}

/// Stores a started nonblocking collective as a request.
fn store(
    req: *mut MPI_Request,
    r: CollRequest<'static>,
    comm: MPI_Comm,
    keep: Vec<Vec<u8>>,
) -> R<()> {
    requests::store_coll(req, r, comm, keep, None)
}

fn check_req(req: Req) -> R<()> {
    if let Some(r) = req {
        if r.is_null() {
            return err(MPI_ERR_REQUEST, "request pointer is null");
        }
    }
    Ok(())
}

/// Send and receive bytes of one block must agree.
fn same(what: &str, s: usize, r: usize) -> R<()> {
    if s != r {
        return mismatch(what, s, r);
    }
    Ok(())
}

#[cold]
fn mismatch(what: &str, s: usize, r: usize) -> R<()> {
    err(
        MPI_ERR_TRUNCATE,
        format!("{what}: the send block has {s} bytes, the receive block {r}"),
    )
}

/// A C array of `n` counts or displacements, times `unit`, into `v`.
unsafe fn scaled(p: *const c_int, n: usize, unit: usize, what: &str, v: &mut Vec<usize>) -> R<()> {
    // SAFETY: an array of `n` entries (MPI's contract).
    let a = unsafe { carray(p, n, what) }?;
    v.clear();
    for &x in a {
        if x < 0 {
            return err(MPI_ERR_COUNT, format!("{what} has a negative entry {x}"));
        }
        v.push(x as usize * unit);
    }
    Ok(())
}

/// The bytes a v-layout reaches.
fn span(counts: &[usize], displs: &[usize]) -> usize {
    counts
        .iter()
        .zip(displs)
        .map(|(c, d)| c + d)
        .max()
        .unwrap_or(0)
}

/// Runs `f` with the four reusable layout vectors (no allocation per call
/// once they have grown).
fn with_scratch<T>(f: impl FnOnce(&mut [Vec<usize>; 4]) -> R<T>) -> R<T> {
    let mut s = state::with(|st| Ok(std::mem::take(&mut st.scratch)))?;
    let r = f(&mut s);
    let _ = state::with(|st| {
        st.scratch = s;
        Ok(())
    });
    r
}

// ---------------------------------------------------------------- barrier, bcast

fn barrier(comm: MPI_Comm, req: Req) -> R<()> {
    check_req(req)?;
    let c = state::comm(comm)?;
    match req {
        None => Ok(c.barrier()?),
        Some(r) => store(r, c.ibarrier(static_scope())?, comm, Vec::new()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Barrier(comm: MPI_Comm) -> c_int {
    let Some(c) = state::comm_fast(comm) else {
        return barrier_slow(comm);
    };
    let r = c.barrier();
    drop(c);
    done("MPI_Barrier", comm, r)
}

#[inline(never)]
fn barrier_slow(comm: MPI_Comm) -> c_int {
    call("MPI_Barrier", comm, || barrier(comm, None))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ibarrier(comm: MPI_Comm, req: *mut MPI_Request) -> c_int {
    call("MPI_Ibarrier", comm, || barrier(comm, Some(req)))
}

unsafe fn bcast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    if let (None, Some((_, ext, _))) = (req, basic(dt)) {
        // The common case in straight-line code.
        let n = basic_len(buf, count, ext)?;
        let c = state::comm_ref(comm)?;
        let root = check_root(&c, root)?;
        // SAFETY: `buf` holds `count` elements of `ext` bytes (MPI's
        // contract).
        return Ok(c.bcast(unsafe { bytes_mut(buf, n) }, root)?);
    }
    let t = ty(dt)?;
    if !t.is_contiguous() {
        let c = state::comm(comm)?;
        let root = check_root(&c, root)?;
        // SAFETY: MPI's contract, passed on.
        return unsafe { packed::bcast(&c, &t, buf, count, root, req, comm) };
    }
    if req.is_none() {
        // SAFETY: MPI's contract, passed on.
        return state::with_comm(comm, |c| unsafe {
            bcast_on(c, t, buf, count, root, comm, req)
        });
    }
    let c = state::comm(comm)?;
    // SAFETY: MPI's contract, passed on.
    unsafe { bcast_on(&c, t, buf, count, root, comm, req) }
}

unsafe fn bcast_on(
    c: &Comm,
    t: Ty,
    buf: *mut c_void,
    count: c_int,
    root: c_int,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    let root = check_root(c, root)?;
    let n = wire_len(buf, count, &t)?;
    // SAFETY: `buf` holds `count` elements (MPI's contract); a nonblocking
    // call's buffer stays valid until its request completes.
    let b = unsafe { bytes_mut(buf, n) };
    match req {
        None => Ok(c.bcast(b, root)?),
        Some(r) => store(r, c.ibcast(static_scope(), b, root)?, comm, Vec::new()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Bcast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match bcast_fast(buf, count, dt, root, comm) {
            Some(rc) => rc,
            None => bcast_slow(buf, count, dt, root, comm),
        }
    }
}

/// The blocking broadcast's fast path, in the MPI function itself: a
/// predefined type, a buffer that is not null, count not negative, a
/// valid communicator and a root of it. `None` for anything else:
/// [`bcast_slow`] then checks everything, in order, and says what is
/// wrong.
#[inline(always)]
unsafe fn bcast_fast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> Option<c_int> {
    let (ext, _) = basic_fast(dt)?;
    if count < 0 || buf.is_null() {
        return None;
    }
    let c = state::comm_fast(comm)?;
    // A negative root is above any size as unsigned.
    if root as u32 as usize >= c.size() {
        return None;
    }
    // SAFETY: `buf` is not null and holds `count` elements of `ext` bytes
    // (MPI's contract).
    let b = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, count as usize * ext) };
    let r = c.bcast(b, root as usize);
    drop(c);
    Some(done("MPI_Bcast", comm, r))
}

#[inline(never)]
unsafe fn bcast_slow(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Bcast", comm, || unsafe {
        bcast(buf, count, dt, root, comm, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ibcast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ibcast", comm, || unsafe {
        bcast(buf, count, dt, root, comm, Some(req))
    })
}

// ---------------------------------------------------------------- reductions

#[derive(Clone, Copy, PartialEq)]
enum Red {
    Reduce(c_int),
    Allreduce,
    Scan,
    Exscan,
}

unsafe fn reduction(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    kind: Red,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    if let (None, Red::Allreduce, Some((_, ext, k))) = (req, kind, basic(dt)) {
        if index(op, OP_DYN).is_none() {
            // The common case in straight-line code: a predefined
            // operation on a predefined type.
            let kern = predefined(op, k, dt)?;
            let in_place = is_in_place(sbuf);
            let n = basic_len(rbuf, count, ext)?;
            if !in_place {
                basic_len(sbuf, count, ext)?;
            }
            let c = state::comm_ref(comm)?;
            // SAFETY: both buffers hold `count` elements of `ext` bytes
            // (MPI's contract).
            let send = (!in_place).then(|| unsafe { bytes(sbuf, n) });
            // SAFETY: as above.
            let recv = unsafe { bytes_mut(rbuf, n) };
            return Ok(c.allreduce_raw(send, recv, ext, &kern)?);
        }
    }
    let t = ty(dt)?;
    if !t.is_contiguous() {
        let c = state::comm(comm)?;
        let k = match kind {
            Red::Reduce(r) => packed::Red::Reduce(check_root(&c, r)?),
            Red::Allreduce => packed::Red::Allreduce,
            Red::Scan => packed::Red::Scan,
            Red::Exscan => packed::Red::Exscan,
        };
        // SAFETY: MPI's contract, passed on.
        return unsafe { packed::reduction(&c, &t, sbuf, rbuf, count, dt, op, k, req, comm) };
    }
    if req.is_none() && index(op, OP_DYN).is_none() {
        // A predefined operation runs no user code: the communicator is
        // used in place (see `state::with_comm`).
        // SAFETY: MPI's contract, passed on.
        return state::with_comm(comm, |c| unsafe {
            reduction_on(c, t, sbuf, rbuf, count, dt, op, kind, comm, req)
        });
    }
    let c = state::comm(comm)?;
    // SAFETY: MPI's contract, passed on.
    unsafe { reduction_on(&c, t, sbuf, rbuf, count, dt, op, kind, comm, req) }
}

unsafe fn reduction_on(
    c: &Comm,
    t: Ty,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    kind: Red,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    let (k, esize, _) = kernel(op, dt, &t)?;
    let in_place = is_in_place(sbuf);
    let (root, gets_result) = match kind {
        Red::Reduce(r) => {
            let r = check_root(c, r)?;
            (r, c.rank() == r)
        }
        _ => (0, true),
    };
    if in_place && !gets_result {
        return err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only for the root");
    }
    let n = if in_place {
        wire_len(rbuf, count, &t)?
    } else {
        wire_len(sbuf, count, &t)?
    };
    if gets_result {
        wire_len(rbuf, count, &t)?;
    }
    // SAFETY: the buffers hold `count` elements (MPI's contract) and, for
    // a nonblocking call, stay valid until its request completes.
    let send = (!in_place).then(|| unsafe { bytes(sbuf, n) });
    let recv = if gets_result {
        // SAFETY: as above.
        unsafe { bytes_mut(rbuf, n) }
    } else {
        &mut []
    };
    match (kind, req) {
        (Red::Reduce(_), None) => Ok(c.reduce_raw(send, recv, esize, &k, root)?),
        (Red::Allreduce, None) => Ok(c.allreduce_raw(send, recv, esize, &k)?),
        (Red::Scan, None) => Ok(c.scan_raw(false, send, recv, esize, &k)?),
        (Red::Exscan, None) => Ok(c.scan_raw(true, send, recv, esize, &k)?),
        (Red::Reduce(_), Some(r)) => store(
            r,
            c.ireduce_raw(static_scope(), send, recv, esize, &k, root)?,
            comm,
            Vec::new(),
        ),
        (Red::Allreduce, Some(r)) => store(
            r,
            c.iallreduce_raw(static_scope(), send, recv, esize, &k)?,
            comm,
            Vec::new(),
        ),
        (Red::Scan, Some(r)) => store(
            r,
            c.iscan_raw(static_scope(), false, send, recv, esize, &k)?,
            comm,
            Vec::new(),
        ),
        (Red::Exscan, Some(r)) => store(
            r,
            c.iscan_raw(static_scope(), true, send, recv, esize, &k)?,
            comm,
            Vec::new(),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Reduce", comm, || unsafe {
        reduction(sbuf, rbuf, count, dt, op, Red::Reduce(root), comm, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allreduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match allreduce_fast(sbuf, rbuf, count, dt, op, comm) {
            Some(rc) => rc,
            None => allreduce_slow(sbuf, rbuf, count, dt, op, comm),
        }
    }
}

/// The blocking allreduce's fast path, in the MPI function itself: a
/// predefined type, a predefined operation whose kernel for it is made
/// (from the first call on), buffers that are not null, count not
/// negative, a valid communicator. `None` for anything else:
/// [`allreduce_slow`] then checks everything, in order, and says what is
/// wrong (or makes the kernel).
#[inline(always)]
unsafe fn allreduce_fast(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Option<c_int> {
    let (ext, kind) = basic_fast(dt)?;
    if count < 0 || rbuf.is_null() || sbuf.is_null() {
        return None;
    }
    let g = state::G.get()?;
    let kern = predefined_fast(g, op, kind)?;
    let c = g.comm_fast(comm)?;
    let n = count as usize * ext;
    // SAFETY: both buffers are not null and hold `count` elements of
    // `ext` bytes (MPI's contract); MPI_IN_PLACE is not read.
    let (send, recv) = unsafe {
        let send = (!is_in_place(sbuf)).then(|| std::slice::from_raw_parts(sbuf as *const u8, n));
        (send, std::slice::from_raw_parts_mut(rbuf as *mut u8, n))
    };
    let r = c.allreduce_raw(send, recv, ext, kern);
    drop(c);
    Some(done("MPI_Allreduce", comm, r))
}

#[inline(never)]
unsafe fn allreduce_slow(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Allreduce", comm, || unsafe {
        reduction(sbuf, rbuf, count, dt, op, Red::Allreduce, comm, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Scan(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Scan", comm, || unsafe {
        reduction(sbuf, rbuf, count, dt, op, Red::Scan, comm, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Exscan(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Exscan", comm, || unsafe {
        reduction(sbuf, rbuf, count, dt, op, Red::Exscan, comm, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ireduce", comm, || unsafe {
        reduction(
            sbuf,
            rbuf,
            count,
            dt,
            op,
            Red::Reduce(root),
            comm,
            Some(req),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallreduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Iallreduce", comm, || unsafe {
        reduction(sbuf, rbuf, count, dt, op, Red::Allreduce, comm, Some(req))
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iscan(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Iscan", comm, || unsafe {
        reduction(sbuf, rbuf, count, dt, op, Red::Scan, comm, Some(req))
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iexscan(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Iexscan", comm, || unsafe {
        reduction(sbuf, rbuf, count, dt, op, Red::Exscan, comm, Some(req))
    })
}

/// Reduce_scatter (`counts` per rank) or, with `block`, Reduce_scatter_block.
unsafe fn reduce_scatter(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    counts: *const c_int,
    block: c_int,
    is_block: bool,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    let c = state::comm(comm)?;
    let t = ty(dt)?;
    let n = c.size();
    with_scratch(|sc| {
        // Each rank's count of elements of `t`.
        let v = &mut sc[0];
        if is_block {
            if block < 0 {
                return err(MPI_ERR_COUNT, format!("recvcount {block} is negative"));
            }
            v.clear();
            v.resize(n, block as usize);
        } else {
            // SAFETY: `counts` has one entry per rank (MPI's contract).
            unsafe { scaled(counts, n, 1, "recvcounts", v) }?;
        }
        if !t.is_contiguous() {
            // SAFETY: MPI's contract, passed on.
            return unsafe {
                packed::reduce_scatter(&c, &t, sbuf, rbuf, v, is_block, dt, op, req, comm)
            };
        }
        let (k, esize, per) = kernel(op, dt, &t)?;
        // From elements of `t` to elements of the kernel.
        v.iter_mut().for_each(|x| *x *= per);
        let total: usize = v.iter().sum::<usize>() * esize;
        let mine = v[c.rank()] * esize;
        let in_place = is_in_place(sbuf);
        if (!in_place && total > 0 && sbuf.is_null())
            || (rbuf.is_null() && (mine > 0 || (in_place && total > 0)))
        {
            return err(MPI_ERR_BUFFER, "a buffer is a null pointer");
        }
        // SAFETY: the send buffer holds the whole input, the receive
        // buffer this rank's block (or, in place, the whole input); a
        // nonblocking call's buffers stay valid until it completes.
        let (send, recv) = unsafe {
            if in_place {
                (None, bytes_mut(rbuf, total))
            } else {
                (Some(bytes(sbuf, total)), bytes_mut(rbuf, mine))
            }
        };
        // An in-place block form is the general form with equal counts.
        let counts = if is_block && !in_place {
            None
        } else {
            Some(&v[..])
        };
        match req {
            None => Ok(c.reduce_scatter_raw(send, recv, counts, esize, &k)?),
            Some(r) => store(
                r,
                c.ireduce_scatter_raw(static_scope(), send, recv, counts, esize, &k)?,
                comm,
                Vec::new(),
            ),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    counts: *const c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Reduce_scatter", comm, || unsafe {
        reduce_scatter(sbuf, rbuf, counts, 0, false, dt, op, comm, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter_block(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Reduce_scatter_block", comm, || unsafe {
        reduce_scatter(
            sbuf,
            rbuf,
            std::ptr::null(),
            count,
            true,
            dt,
            op,
            comm,
            None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    counts: *const c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ireduce_scatter", comm, || unsafe {
        reduce_scatter(sbuf, rbuf, counts, 0, false, dt, op, comm, Some(req))
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter_block(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ireduce_scatter_block", comm, || unsafe {
        reduce_scatter(
            sbuf,
            rbuf,
            std::ptr::null(),
            count,
            true,
            dt,
            op,
            comm,
            Some(req),
        )
    })
}

// ---------------------------------------------------------------- gather, scatter

/// Gather (`scatter` false) or Scatter: the root's side is `n` blocks.
unsafe fn gather_scatter(
    scatter: bool,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    let c = state::comm(comm)?;
    let root = check_root(&c, root)?;
    let n = c.size();
    let is_root = c.rank() == root;
    let name = if scatter { "scatter" } else { "gather" };
    // The block on every rank's own side, and the root's n blocks.
    let (own_buf, own_count, own_type, all_buf, all_count, all_type) = if scatter {
        (
            rbuf as *const c_void,
            rcount,
            rtype,
            sbuf as *mut c_void,
            scount,
            stype,
        )
    } else {
        (sbuf, scount, stype, rbuf, rcount, rtype)
    };
    let (own_t, all_t) = rooted_types(is_root, own_buf, own_type, all_type)?;
    let in_place = own_t.is_none();
    if packed::needed(&[own_t.as_ref(), all_t.as_ref()]) {
        // SAFETY: MPI's contract, passed on.
        return unsafe {
            packed::gather_scatter(
                &c,
                scatter,
                own_buf as *mut c_void,
                own_count,
                own_t.as_ref(),
                all_buf,
                all_count,
                all_t.as_ref(),
                root,
                req,
                comm,
            )
        };
    }
    let own = match &own_t {
        None => 0,
        Some(t) => wire_len(own_buf, own_count, t)?,
    };
    let all = if let Some(t) = &all_t {
        let b = wire_len(all_buf, all_count, t)?;
        if !in_place {
            same(name, own, b)?;
        }
        b
    } else {
        0
    };
    // SAFETY: MPI's contract for both buffers; a nonblocking call's stay
    // valid until it completes.
    let (mine, whole) = unsafe {
        (
            bytes_mut(own_buf as *mut c_void, own),
            bytes_mut(all_buf, n * all),
        )
    };
    let r = match (scatter, in_place, req) {
        (false, false, None) => return Ok(c.gather(mine, whole, root)?),
        (false, true, None) => return Ok(c.gather_in_place(whole, root)?),
        (true, false, None) => return Ok(c.scatter(whole, mine, root)?),
        (true, true, None) => return Ok(c.scatter_in_place(whole, root)?),
        (false, false, Some(_)) => c.igather(static_scope(), mine, whole, root)?,
        (false, true, Some(_)) => c.igather_in_place(static_scope(), whole, root)?,
        (true, false, Some(_)) => c.iscatter(static_scope(), whole, mine, root)?,
        (true, true, Some(_)) => c.iscatter_in_place(static_scope(), whole, root)?,
    };
    store(req.unwrap_or(std::ptr::null_mut()), r, comm, Vec::new())
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Gather(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Gather", comm, || unsafe {
        gather_scatter(
            false, sbuf, scount, stype, rbuf, rcount, rtype, root, comm, None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Scatter(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Scatter", comm, || unsafe {
        gather_scatter(
            true, sbuf, scount, stype, rbuf, rcount, rtype, root, comm, None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Igather(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Igather", comm, || unsafe {
        gather_scatter(
            false,
            sbuf,
            scount,
            stype,
            rbuf,
            rcount,
            rtype,
            root,
            comm,
            Some(req),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatter(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Iscatter", comm, || unsafe {
        gather_scatter(
            true,
            sbuf,
            scount,
            stype,
            rbuf,
            rcount,
            rtype,
            root,
            comm,
            Some(req),
        )
    })
}

/// The types of a rooted call's two sides: this rank's own block (`None`
/// in place at the root) and the root's buffer of every block (`None` off
/// the root, where it is not read).
fn rooted_types(
    is_root: bool,
    own_buf: *const c_void,
    own_type: MPI_Datatype,
    all_type: MPI_Datatype,
) -> R<(Option<Ty>, Option<Ty>)> {
    let own_t = if is_root && is_in_place(own_buf) {
        None
    } else {
        Some(ty(own_type)?)
    };
    let all_t = if is_root { Some(ty(all_type)?) } else { None };
    Ok((own_t, all_t))
}

/// Gatherv (`scatter` false) or Scatterv.
unsafe fn gather_scatter_v(
    scatter: bool,
    own_buf: *const c_void,
    own_count: c_int,
    own_type: MPI_Datatype,
    all_buf: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    all_type: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    let c = state::comm(comm)?;
    let root = check_root(&c, root)?;
    let n = c.size();
    let me = c.rank();
    let is_root = me == root;
    let (own_t, all_t) = rooted_types(is_root, own_buf, own_type, all_type)?;
    let in_place = own_t.is_none();
    if packed::needed(&[own_t.as_ref(), all_t.as_ref()]) {
        // SAFETY: MPI's contract, passed on.
        return unsafe {
            packed::gather_scatter_v(
                &c,
                scatter,
                own_buf as *mut c_void,
                own_count,
                own_t.as_ref(),
                all_buf,
                counts,
                displs,
                all_t.as_ref(),
                root,
                req,
                comm,
            )
        };
    }
    with_scratch(|sc| {
        let [k, d, _, _] = sc;
        k.clear();
        d.clear();
        let mut whole: &mut [u8] = &mut [];
        if let Some(t) = &all_t {
            let (w, ext) = (t.wire(), t.extent() as usize);
            // SAFETY: one entry per rank at the root (MPI's contract).
            unsafe {
                scaled(counts, n, w, "counts", k)?;
                scaled(displs, n, ext, "displs", d)?;
            }
            if span(k, d) > 0 && all_buf.is_null() {
                return err(MPI_ERR_BUFFER, "the root's buffer is a null pointer");
            }
            // SAFETY: the root's buffer reaches every block (MPI's contract).
            whole = unsafe { bytes_mut(all_buf, span(k, d)) };
        }
        // The root's own block, in place: a copy of it is what it sends
        // (gatherv) or where its block is received and dropped (scatterv).
        let mut keep = Vec::new();
        let mine: &mut [u8] = if in_place {
            let b = &whole[d[me]..d[me] + k[me]];
            keep.push(b.to_vec());
            let v = keep.last_mut().map(|v| &mut v[..]).unwrap_or(&mut []);
            // SAFETY: the vector is kept with the request (or lives to the
            // end of this blocking call).
            unsafe { forever_mut(v) }
        } else {
            let b = match &own_t {
                Some(t) => wire_len(own_buf, own_count, t)?,
                None => 0,
            };
            // SAFETY: MPI's contract for the caller's block.
            unsafe { bytes_mut(own_buf as *mut c_void, b) }
        };
        if is_root && mine.len() != k[me] {
            return err(
                MPI_ERR_TRUNCATE,
                format!(
                    "the root's block has {} bytes, its count says {}",
                    mine.len(),
                    k[me]
                ),
            );
        }
        // SAFETY: `whole` is the caller's (kept valid by MPI's contract).
        let whole = unsafe { forever_mut(whole) };
        let r = match (scatter, req) {
            (false, None) => return Ok(c.gatherv(mine, whole, k, d, root)?),
            (true, None) => return Ok(c.scatterv(whole, k, d, mine, root)?),
            (false, Some(_)) => c.igatherv(static_scope(), mine, whole, k, d, root)?,
            (true, Some(_)) => c.iscatterv(static_scope(), whole, k, d, mine, root)?,
        };
        store(req.unwrap_or(std::ptr::null_mut()), r, comm, keep)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Gatherv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Gatherv", comm, || unsafe {
        gather_scatter_v(
            false, sbuf, scount, stype, rbuf, counts, displs, rtype, root, comm, None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Igatherv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Igatherv", comm, || unsafe {
        gather_scatter_v(
            false,
            sbuf,
            scount,
            stype,
            rbuf,
            counts,
            displs,
            rtype,
            root,
            comm,
            Some(req),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Scatterv(
    sbuf: *const c_void,
    counts: *const c_int,
    displs: *const c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Scatterv", comm, || unsafe {
        gather_scatter_v(
            true,
            rbuf,
            rcount,
            rtype,
            sbuf as *mut c_void,
            counts,
            displs,
            stype,
            root,
            comm,
            None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatterv(
    sbuf: *const c_void,
    counts: *const c_int,
    displs: *const c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Iscatterv", comm, || unsafe {
        gather_scatter_v(
            true,
            rbuf,
            rcount,
            rtype,
            sbuf as *mut c_void,
            counts,
            displs,
            stype,
            root,
            comm,
            Some(req),
        )
    })
}

// ---------------------------------------------------------------- allgather, alltoall

unsafe fn all_to(
    alltoall: bool,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    let in_place = is_in_place(sbuf);
    if let (None, false, Some((_, sx, _)), Some((_, rx, _))) =
        (req, in_place, basic(stype), basic(rtype))
    {
        // The common case in straight-line code.
        let block = basic_len(rbuf, rcount, rx)?;
        let send = basic_len(sbuf, scount, sx)?;
        same(if alltoall { "alltoall" } else { "allgather" }, send, block)?;
        let c = state::comm_ref(comm)?;
        let n = c.size();
        let sn = if alltoall { n * send } else { send };
        // SAFETY: MPI's contract for both buffers.
        let (sb, rb) = unsafe { (bytes(sbuf, sn), bytes_mut(rbuf, n * block)) };
        if alltoall {
            c.alltoall(sb, rb)?;
        } else {
            c.allgather(sb, rb)?;
        }
        return Ok(());
    }
    let rt = ty(rtype)?;
    let st = if in_place { None } else { Some(ty(stype)?) };
    if packed::needed(&[Some(&rt), st.as_ref()]) {
        let c = state::comm(comm)?;
        // SAFETY: MPI's contract, passed on.
        return unsafe {
            packed::all_to(
                &c,
                alltoall,
                sbuf,
                scount,
                st.as_ref(),
                rbuf,
                rcount,
                &rt,
                req,
                comm,
            )
        };
    }
    let body = |c: &Comm| -> R<()> {
        // SAFETY: MPI's contract, passed on.
        unsafe {
            all_to_on(
                c,
                alltoall,
                sbuf,
                scount,
                st.as_ref(),
                rbuf,
                rcount,
                &rt,
                comm,
                req,
            )
        }
    };
    if req.is_none() {
        return state::with_comm(comm, body);
    }
    let c = state::comm(comm)?;
    body(&c)
}

unsafe fn all_to_on(
    c: &Comm,
    alltoall: bool,
    sbuf: *const c_void,
    scount: c_int,
    st: Option<&Ty>,
    rbuf: *mut c_void,
    rcount: c_int,
    rt: &Ty,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    let n = c.size();
    let block = wire_len(rbuf, rcount, rt)?;
    let send = match st {
        None => 0,
        Some(st) => {
            let b = wire_len(sbuf, scount, st)?;
            same(if alltoall { "alltoall" } else { "allgather" }, b, block)?;
            b
        }
    };
    let in_place = st.is_none();
    let sn = if alltoall { n * send } else { send };
    // SAFETY: MPI's contract for both buffers; a nonblocking call's stay
    // valid until it completes.
    let (sb, rb) = unsafe { (bytes(sbuf, sn), bytes_mut(rbuf, n * block)) };
    match (alltoall, in_place, req) {
        (false, false, None) => return Ok(c.allgather(sb, rb)?),
        (false, true, None) => return Ok(c.allgather_in_place(rb)?),
        (true, false, None) => return Ok(c.alltoall(sb, rb)?),
        (true, true, None) => return Ok(c.alltoall_in_place(rb)?),
        _ => {}
    };
    // A thread-local of ibcoll's: only nonblocking calls read it.
    let s = static_scope();
    let r = match (alltoall, in_place, req) {
        (false, false, _) => c.iallgather(s, sb, rb)?,
        (false, true, _) => c.iallgather_in_place(s, rb)?,
        (true, false, _) => c.ialltoall(s, sb, rb)?,
        (true, true, _) => c.ialltoall_in_place(s, rb)?,
    };
    store(req.unwrap_or(std::ptr::null_mut()), r, comm, Vec::new())
}

/// The blocking allgather's and alltoall's fast path, in the MPI
/// functions themselves: predefined types, buffers that are not null nor
/// MPI_IN_PLACE, counts not negative, blocks of equal bytes, a valid
/// communicator. `None` for anything else: [`all_to_slow`] then checks
/// everything, in order, and says what is wrong.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn all_to_fast(
    alltoall: bool,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> Option<c_int> {
    let ((sx, _), (rx, _)) = (basic_fast(stype)?, basic_fast(rtype)?);
    if (scount | rcount) < 0 || sbuf.is_null() || rbuf.is_null() || is_in_place(sbuf) {
        return None;
    }
    let block = rcount as usize * rx;
    if scount as usize * sx != block {
        return None;
    }
    let c = state::comm_fast(comm)?;
    let n = c.size();
    let sn = if alltoall { n * block } else { block };
    // SAFETY: both buffers are not null and hold their blocks (MPI's
    // contract).
    let (sb, rb) = unsafe {
        (
            std::slice::from_raw_parts(sbuf as *const u8, sn),
            std::slice::from_raw_parts_mut(rbuf as *mut u8, n * block),
        )
    };
    let r = if alltoall {
        c.alltoall(sb, rb)
    } else {
        c.allgather(sb, rb)
    };
    drop(c);
    Some(done(
        if alltoall {
            "MPI_Alltoall"
        } else {
            "MPI_Allgather"
        },
        comm,
        r,
    ))
}

#[allow(clippy::too_many_arguments)]
#[inline(never)]
unsafe fn all_to_slow(
    alltoall: bool,
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    let func = if alltoall {
        "MPI_Alltoall"
    } else {
        "MPI_Allgather"
    };
    // SAFETY: MPI's contract, passed on.
    call(func, comm, || unsafe {
        all_to(
            alltoall, sbuf, scount, stype, rbuf, rcount, rtype, comm, None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allgather(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match all_to_fast(false, sbuf, scount, stype, rbuf, rcount, rtype, comm) {
            Some(rc) => rc,
            None => all_to_slow(false, sbuf, scount, stype, rbuf, rcount, rtype, comm),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoall(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on (both paths).
    unsafe {
        match all_to_fast(true, sbuf, scount, stype, rbuf, rcount, rtype, comm) {
            Some(rc) => rc,
            None => all_to_slow(true, sbuf, scount, stype, rbuf, rcount, rtype, comm),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgather(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Iallgather", comm, || unsafe {
        all_to(
            false,
            sbuf,
            scount,
            stype,
            rbuf,
            rcount,
            rtype,
            comm,
            Some(req),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoall(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ialltoall", comm, || unsafe {
        all_to(
            true,
            sbuf,
            scount,
            stype,
            rbuf,
            rcount,
            rtype,
            comm,
            Some(req),
        )
    })
}

unsafe fn allgatherv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    let c = state::comm(comm)?;
    let n = c.size();
    let rt = ty(rtype)?;
    let in_place = is_in_place(sbuf);
    let st = if in_place { None } else { Some(ty(stype)?) };
    if packed::needed(&[Some(&rt), st.as_ref()]) {
        // SAFETY: MPI's contract, passed on.
        return unsafe {
            packed::allgatherv(
                &c,
                sbuf,
                scount,
                st.as_ref(),
                rbuf,
                counts,
                displs,
                &rt,
                req,
                comm,
            )
        };
    }
    with_scratch(|sc| {
        let [k, d, _, _] = sc;
        // SAFETY: one entry per rank (MPI's contract).
        unsafe {
            scaled(counts, n, rt.wire(), "recvcounts", k)?;
            scaled(displs, n, rt.extent() as usize, "displs", d)?;
        }
        let total = span(k, d);
        if total > 0 && rbuf.is_null() {
            return err(MPI_ERR_BUFFER, "receive buffer is a null pointer");
        }
        // SAFETY: MPI's contract; a nonblocking call's buffers stay valid
        // until it completes.
        let rb = unsafe { bytes_mut(rbuf, total) };
        // `st` is `None` exactly for MPI_IN_PLACE.
        let Some(st) = &st else {
            let r = match req {
                None => return Ok(c.allgatherv_in_place(rb, k, d)?),
                Some(_) => c.iallgatherv_in_place(static_scope(), rb, k, d)?,
            };
            return store(req.unwrap_or(std::ptr::null_mut()), r, comm, Vec::new());
        };
        let sn = wire_len(sbuf, scount, st)?;
        // SAFETY: as above.
        let sb = unsafe { bytes(sbuf, sn) };
        let r = match req {
            None => return Ok(c.allgatherv(sb, rb, k, d)?),
            Some(_) => c.iallgatherv(static_scope(), sb, rb, k, d)?,
        };
        store(req.unwrap_or(std::ptr::null_mut()), r, comm, Vec::new())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allgatherv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Allgatherv", comm, || unsafe {
        allgatherv(sbuf, scount, stype, rbuf, counts, displs, rtype, comm, None)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgatherv(
    sbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Iallgatherv", comm, || unsafe {
        allgatherv(
            sbuf,
            scount,
            stype,
            rbuf,
            counts,
            displs,
            rtype,
            comm,
            Some(req),
        )
    })
}

unsafe fn alltoallv(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    let c = state::comm(comm)?;
    let n = c.size();
    let rt = ty(rtype)?;
    let in_place = is_in_place(sbuf);
    let st = if in_place { None } else { Some(ty(stype)?) };
    if packed::needed(&[Some(&rt), st.as_ref()]) {
        let send = st.as_ref().map(|t| packed::Side::V(scounts, sdispls, t));
        let recv = packed::Side::V(rcounts, rdispls, &rt);
        // SAFETY: MPI's contract, passed on.
        return unsafe { packed::alltoallv(&c, false, sbuf, send, rbuf, recv, req, comm) };
    }
    with_scratch(|sc| {
        let [sk, sd, rk, rd] = sc;
        // SAFETY: one entry per rank (MPI's contract).
        unsafe {
            scaled(rcounts, n, rt.wire(), "recvcounts", rk)?;
            scaled(rdispls, n, rt.extent() as usize, "rdispls", rd)?;
        }
        let rtotal = span(rk, rd);
        if rtotal > 0 && rbuf.is_null() {
            return err(MPI_ERR_BUFFER, "receive buffer is a null pointer");
        }
        // SAFETY: MPI's contract; a nonblocking call's buffers stay valid
        // until it completes.
        let rb = unsafe { bytes_mut(rbuf, rtotal) };
        let mut keep = Vec::new();
        let sb: &[u8] = match &st {
            None => {
                // In place: the input is what the receive buffer holds now.
                keep.push(rb.to_vec());
                sk.clone_from(rk);
                sd.clone_from(rd);
                // SAFETY: the copy is kept with the request (or lives to
                // the end of this blocking call).
                unsafe { forever(&keep[0]) }
            }
            Some(st) => {
                // SAFETY: one entry per rank (MPI's contract).
                unsafe {
                    scaled(scounts, n, st.wire(), "sendcounts", sk)?;
                    scaled(sdispls, n, st.extent() as usize, "sdispls", sd)?;
                }
                let stotal = span(sk, sd);
                if stotal > 0 && sbuf.is_null() {
                    return err(MPI_ERR_BUFFER, "send buffer is a null pointer");
                }
                // SAFETY: as above.
                unsafe { bytes(sbuf, stotal) }
            }
        };
        let r = match req {
            None => return Ok(c.alltoallv(sb, sk, sd, rb, rk, rd)?),
            Some(_) => c.ialltoallv(static_scope(), sb, sk, sd, rb, rk, rd)?,
        };
        store(req.unwrap_or(std::ptr::null_mut()), r, comm, keep)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoallv(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Alltoallv", comm, || unsafe {
        alltoallv(
            sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoallv(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stype: MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ialltoallv", comm, || unsafe {
        alltoallv(
            sbuf,
            scounts,
            sdispls,
            stype,
            rbuf,
            rcounts,
            rdispls,
            rtype,
            comm,
            Some(req),
        )
    })
}

#[allow(dead_code)]
fn keep_alive(_: Rc<Comm>) {}

/// Alltoallw: an alltoallv of bytes (counts times each peer's type size,
/// displacements in bytes as Alltoallw has them); with a non-contiguous
/// type anywhere, of the packed bytes (`packed::alltoallv`).
unsafe fn alltoallw(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: *const MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: *const MPI_Datatype,
    comm: MPI_Comm,
    req: Req,
) -> R<()> {
    check_req(req)?;
    let c = state::comm(comm)?;
    let n = c.size();
    let in_place = is_in_place(sbuf);
    let staged = |types: *const MPI_Datatype| -> R<bool> {
        // SAFETY: one entry per rank (MPI's contract).
        let t = unsafe { carray(types, n, "types")? };
        for &h in t {
            if !ty(h)?.is_contiguous() {
                return Ok(true);
            }
        }
        Ok(false)
    };
    if staged(rtypes)? || (!in_place && staged(stypes)?) {
        let send = (!in_place).then_some(packed::Side::W(scounts, sdispls, stypes));
        let recv = packed::Side::W(rcounts, rdispls, rtypes);
        // SAFETY: MPI's contract, passed on.
        return unsafe { packed::alltoallv(&c, true, sbuf, send, rbuf, recv, req, comm) };
    }
    let layout = |counts: *const c_int,
                  displs: *const c_int,
                  types: *const MPI_Datatype|
     -> R<(Vec<usize>, Vec<usize>)> {
        // SAFETY: one entry per rank in each array (MPI's contract).
        let (k, d, t) = unsafe {
            (
                carray(counts, n, "counts")?,
                carray(displs, n, "displs")?,
                carray(types, n, "types")?,
            )
        };
        let mut kb = Vec::with_capacity(n);
        let mut db = Vec::with_capacity(n);
        for i in 0..n {
            if k[i] < 0 || d[i] < 0 {
                return err(
                    MPI_ERR_COUNT,
                    format!("block {i}: count {} at {}", k[i], d[i]),
                );
            }
            kb.push(k[i] as usize * ty(t[i])?.wire());
            db.push(d[i] as usize);
        }
        Ok((kb, db))
    };
    let (rk, rd) = layout(rcounts, rdispls, rtypes)?;
    let rtotal = span(&rk, &rd);
    if rtotal > 0 && rbuf.is_null() {
        return err(MPI_ERR_BUFFER, "receive buffer is a null pointer");
    }
    // SAFETY: MPI's contract; a nonblocking call's buffers stay valid
    // until it completes.
    let rb = unsafe { bytes_mut(rbuf, rtotal) };
    let mut keep = Vec::new();
    let (sk, sd, sb): (Vec<usize>, Vec<usize>, &[u8]) = if in_place {
        keep.push(rb.to_vec());
        // SAFETY: the copy is kept with the request (or to the end of the
        // blocking call).
        (rk.clone(), rd.clone(), unsafe { forever(&keep[0]) })
    } else {
        let (sk, sd) = layout(scounts, sdispls, stypes)?;
        let stotal = span(&sk, &sd);
        if stotal > 0 && sbuf.is_null() {
            return err(MPI_ERR_BUFFER, "send buffer is a null pointer");
        }
        // SAFETY: as above.
        let b = unsafe { bytes(sbuf, stotal) };
        (sk, sd, b)
    };
    let r = match req {
        None => return Ok(c.alltoallv(sb, &sk, &sd, rb, &rk, &rd)?),
        Some(_) => c.ialltoallv(static_scope(), sb, &sk, &sd, rb, &rk, &rd)?,
    };
    store(req.unwrap_or(std::ptr::null_mut()), r, comm, keep)
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoallw(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: *const MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: *const MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Alltoallw", comm, || unsafe {
        alltoallw(
            sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm, None,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoallw(
    sbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: *const MPI_Datatype,
    rbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: *const MPI_Datatype,
    comm: MPI_Comm,
    req: *mut MPI_Request,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Ialltoallw", comm, || unsafe {
        alltoallw(
            sbuf,
            scounts,
            sdispls,
            stypes,
            rbuf,
            rcounts,
            rdispls,
            rtypes,
            comm,
            Some(req),
        )
    })
}
