//! Blocking collectives on non-contiguous derived datatypes (vector,
//! indexed, struct, resized with gaps): the data is packed into a buffer of
//! this library's, the contiguous collective runs on the packed bytes, and
//! what was received is unpacked into the caller's elements. That is one
//! copy each way, of the bytes the type selects, and one allocation per
//! call; contiguous types (every predefined one) never come here.
//!
//! Reductions need one predefined element kind throughout the type (a
//! vector of doubles, say) and a predefined operation: a user function
//! would expect its datatype's layout, not packed elements.
//!
//! The nonblocking forms still take contiguous types only (their staging
//! buffers would have to live in the request until it completes).

use std::os::raw::{c_int, c_void};

use ibcoll::Comm;

use crate::abi::*;
use crate::buffers::{is_in_place, wire_len};
use crate::datatype::{pack, unpack, Ty, TypeInfo};
use crate::error::{err, R};
use crate::ops::predefined;
use crate::state::index;

/// `count` elements of `t` at `buf`, packed.
///
/// # Safety
/// `buf` holds `count` elements of `t` (MPI's contract).
unsafe fn packed(buf: *const c_void, count: usize, t: &TypeInfo) -> Vec<u8> {
    let mut v = vec![0u8; count * t.wire];
    // SAFETY: the caller's contract; `v` holds `count * wire` bytes.
    unsafe { pack(buf as *const u8, count, t, &mut v) };
    v
}

/// The layout of `t` (a derived type here; a predefined one is one block).
fn layout(t: &Ty) -> TypeInfo {
    match t {
        Ty::Derived(i) => (**i).clone(),
        _ => t.info(),
    }
}

/// MPI_Bcast of a non-contiguous type: the root packs, the others unpack.
///
/// # Safety
/// `buf` holds `count` elements of `t` (MPI's contract).
pub unsafe fn bcast(c: &Comm, t: &Ty, buf: *mut c_void, count: c_int, root: usize) -> R<()> {
    wire_len(buf, count, t)?;
    let info = layout(t);
    let n = count as usize;
    let mut v = if c.rank() == root {
        // SAFETY: the caller's contract.
        unsafe { packed(buf, n, &info) }
    } else {
        vec![0u8; n * info.wire]
    };
    c.bcast(&mut v, root)?;
    if c.rank() != root {
        // SAFETY: the caller's contract; `v` is `n` whole elements.
        unsafe { unpack(buf as *mut u8, &info, &v) };
    }
    Ok(())
}

/// Which reduction.
#[derive(Clone, Copy)]
pub enum Red {
    Reduce(usize),
    Allreduce,
    Scan,
    Exscan,
}

/// A blocking reduction on a non-contiguous type of one predefined
/// element kind with a predefined operation.
///
/// # Safety
/// The buffers hold `count` elements of `t` (MPI's contract).
pub unsafe fn reduction(
    c: &Comm,
    t: &Ty,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    kind: Red,
) -> R<()> {
    let info = layout(t);
    let Some(elem) = info.elem else {
        return err(
            MPI_ERR_TYPE,
            format!("datatype {dt:#x} mixes element kinds: reductions take one predefined kind"),
        );
    };
    if index(op, OP_DYN).is_some() {
        return err(
            MPI_ERR_OP,
            format!(
                "datatype {dt:#x} is not contiguous: a user operation (MPI_Op_create) \
                 takes contiguous types"
            ),
        );
    }
    let k = predefined(op, elem, dt)?;
    let gets_result = match kind {
        Red::Reduce(root) => c.rank() == root,
        _ => true,
    };
    let in_place = is_in_place(sbuf);
    if in_place && !gets_result {
        return err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only for the root");
    }
    let n = count as usize;
    let src = if in_place {
        rbuf as *const c_void
    } else {
        sbuf
    };
    wire_len(src, count, t)?;
    if gets_result {
        wire_len(rbuf, count, t)?;
    }
    // SAFETY: MPI's contract for both buffers.
    let send = unsafe { packed(src, n, &info) };
    let mut recv = vec![0u8; if gets_result { n * info.wire } else { 0 }];
    let e = info.elem_size;
    match kind {
        Red::Reduce(root) => c.reduce_raw(Some(&send), &mut recv, e, &k, root)?,
        Red::Allreduce => c.allreduce_raw(Some(&send), &mut recv, e, &k)?,
        Red::Scan => c.scan_raw(false, Some(&send), &mut recv, e, &k)?,
        Red::Exscan => c.scan_raw(true, Some(&send), &mut recv, e, &k)?,
    }
    // Rank 0's exclusive scan result is undefined: its buffer stays as is.
    let exscan_first = matches!(kind, Red::Exscan) && c.rank() == 0;
    if gets_result && !exscan_first {
        // SAFETY: MPI's contract; `recv` is `n` whole elements.
        unsafe { unpack(rbuf as *mut u8, &info, &recv) };
    }
    Ok(())
}

/// MPI_Alltoall / MPI_Allgather with a non-contiguous send or receive
/// type (`st` is `None` for MPI_IN_PLACE).
///
/// # Safety
/// The buffers hold their counts of elements (MPI's contract).
pub unsafe fn all_to(
    c: &Comm,
    alltoall: bool,
    sbuf: *const c_void,
    scount: c_int,
    st: Option<&Ty>,
    rbuf: *mut c_void,
    rcount: c_int,
    rt: &Ty,
) -> R<()> {
    let n = c.size();
    let block = wire_len(rbuf, rcount, rt)?;
    let rinfo = layout(rt);
    let relems = rcount as usize;
    let mut recv = vec![0u8; n * block];
    match st {
        Some(st) => {
            let b = wire_len(sbuf, scount, st)?;
            if b != block {
                return err(
                    MPI_ERR_TRUNCATE,
                    format!(
                        "{}: the send block has {b} bytes, the receive block {block}",
                        if alltoall { "alltoall" } else { "allgather" }
                    ),
                );
            }
            let sinfo = layout(st);
            let selems = scount as usize * if alltoall { n } else { 1 };
            // SAFETY: MPI's contract.
            let send = unsafe { packed(sbuf, selems, &sinfo) };
            if alltoall {
                c.alltoall(&send, &mut recv)?;
            } else {
                c.allgather(&send, &mut recv)?;
            }
        }
        None => {
            // In place: the receive buffer holds this rank's data (its own
            // block for allgather, every block for alltoall).
            // SAFETY: MPI's contract: `n * rcount` elements at `rbuf`.
            let mine = unsafe { packed(rbuf, n * relems, &rinfo) };
            recv.copy_from_slice(&mine);
            if alltoall {
                c.alltoall_in_place(&mut recv)?;
            } else {
                c.allgather_in_place(&mut recv)?;
            }
        }
    }
    // SAFETY: MPI's contract; `recv` is `n * rcount` whole elements.
    unsafe { unpack(rbuf as *mut u8, &rinfo, &recv) };
    Ok(())
}

/// MPI_Gather / MPI_Scatter with a non-contiguous type on either side
/// (`own` is the sender's buffer for gather, the receiver's for scatter;
/// `own_t` `None` for MPI_IN_PLACE at the root).
///
/// # Safety
/// The buffers hold their counts of elements (MPI's contract); the root's
/// `all` holds `size * all_count` elements of `all_t`.
pub unsafe fn gather_scatter(
    c: &Comm,
    scatter: bool,
    own: *mut c_void,
    own_count: c_int,
    own_t: Option<&Ty>,
    all: *mut c_void,
    all_count: c_int,
    all_t: Option<&Ty>,
    root: usize,
) -> R<()> {
    let n = c.size();
    let am_root = c.rank() == root;
    let (block, all_info) = match (am_root, all_t) {
        (true, Some(t)) => (wire_len(all, all_count, t)?, Some(layout(t))),
        _ => (0, None),
    };
    let own_info = own_t.map(layout);
    let mine_len = match own_t {
        Some(t) => wire_len(own, own_count, t)?,
        None => block,
    };
    if am_root && own_t.is_some() && mine_len != block {
        return err(
            MPI_ERR_TRUNCATE,
            format!(
                "{}: this rank's block has {mine_len} bytes, the root's blocks {block}",
                if scatter { "scatter" } else { "gather" }
            ),
        );
    }
    let mut mine = match (&own_info, scatter) {
        // SAFETY: MPI's contract.
        (Some(i), false) => unsafe { packed(own, own_count as usize, i) },
        _ => vec![0u8; mine_len],
    };
    let mut whole = match (&all_info, scatter) {
        // SAFETY: MPI's contract (the root's buffer).
        (Some(i), true) => unsafe { packed(all, n * all_count as usize, i) },
        (Some(_), false) => vec![0u8; n * block],
        (None, _) => Vec::new(),
    };
    match (scatter, own_t.is_some()) {
        (false, true) => c.gather(&mine, &mut whole, root)?,
        (false, false) => {
            // In place at the root: its own block is already in `all`.
            let me = c.rank();
            if let Some(i) = &all_info {
                let at = me * all_count as usize;
                // SAFETY: MPI's contract: the root's block `me` of `all`.
                let own_block = unsafe {
                    packed(
                        (all as *const u8).offset(at as isize * i.extent) as *const c_void,
                        all_count as usize,
                        i,
                    )
                };
                whole[me * block..(me + 1) * block].copy_from_slice(&own_block);
            }
            c.gather_in_place(&mut whole, root)?
        }
        (true, true) => c.scatter(&whole, &mut mine, root)?,
        (true, false) => c.scatter_in_place(&mut whole, root)?,
    }
    if scatter {
        if let Some(i) = &own_info {
            // SAFETY: MPI's contract; `mine` is `own_count` whole elements.
            unsafe { unpack(own as *mut u8, i, &mine) };
        }
    } else if let (true, Some(i)) = (am_root, &all_info) {
        // SAFETY: MPI's contract; `whole` is `n * all_count` elements.
        unsafe { unpack(all as *mut u8, i, &whole) };
    }
    Ok(())
}

/// Whether a blocking call on types `ts` needs these paths.
pub fn needed(ts: &[Option<&Ty>]) -> bool {
    ts.iter().flatten().any(|t| !t.is_contiguous())
}
