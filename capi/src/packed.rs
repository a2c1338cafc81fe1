//! Collectives on non-contiguous derived datatypes (vector, indexed,
//! struct, resized with gaps), blocking and nonblocking. The send side is
//! packed into a buffer of this library's when the call is made, the
//! byte-level collective runs on the packed bytes, and what it receives
//! lands in a staging buffer that is unpacked into the caller's elements
//! once the operation is done: before a blocking call returns, and for a
//! nonblocking one where its request completes (`requests::settle`, which
//! MPI_Wait/Test and every -all/-any/-some form go through). A nonblocking
//! call's staging buffers belong to its request entry, so they live
//! exactly as long as the operation that uses them.
//!
//! Each side of a call is a [`Layout`]: runs of elements (`count`
//! elements of one type from one address) packed back to back. A
//! v-collective's blocks are one run each, so the byte-level collective
//! gets the packed blocks' byte counts and offsets, whatever the caller's
//! displacements. That is one copy each way of the bytes the types select
//! and one allocation per side; contiguous types (every predefined one)
//! never come here. When one side of a call is contiguous and the other
//! not, both are staged: the contiguous one costs a plain copy.
//!
//! Reductions need one predefined element kind throughout the type (a
//! vector of doubles, say) and a predefined operation: they reduce the
//! packed elements with that kind's kernel. A user function would expect
//! its datatype's layout, not packed elements.

use std::os::raw::{c_int, c_void};
use std::rc::Rc;

use ibcoll::ops::ByteReduce;
use ibcoll::{static_scope, CollRequest, Comm};

use crate::abi::*;
use crate::buffers::{forever, forever_mut, is_in_place, wire_len};
use crate::datatype::{carray, pack, ty, unpack, Ty, TypeInfo};
use crate::error::{err, R};
use crate::ops::predefined;
use crate::requests;
use crate::state::index;

/// Where a call's request goes: `None` for a blocking call.
pub type Req = Option<*mut MPI_Request>;

/// `count` elements of `t` from `at` in the caller's buffer, packed at
/// `off` in a staging buffer.
struct Run {
    at: *mut u8,
    count: usize,
    off: usize,
    t: Rc<TypeInfo>,
}

/// One side of a call: runs of the caller's elements, packed back to
/// back.
#[derive(Default)]
pub struct Layout {
    runs: Vec<Run>,
    /// Packed bytes of all runs.
    len: usize,
}

impl Layout {
    /// Adds `count` elements of `t` at `at` after the runs before; gives
    /// their packed offset and bytes.
    fn push(&mut self, at: *const c_void, count: usize, t: &Rc<TypeInfo>) -> (usize, usize) {
        let (off, b) = (self.len, count * t.wire);
        self.runs.push(Run {
            at: at as *mut u8,
            count,
            off,
            t: t.clone(),
        });
        self.len += b;
        (off, b)
    }

    fn one(at: *const c_void, count: usize, t: &Rc<TypeInfo>) -> Layout {
        let mut l = Layout::default();
        l.push(at, count, t);
        l
    }

    /// Packs run `i` into its place in `data` (`len` bytes).
    ///
    /// # Safety
    /// The run's elements are readable (MPI's contract).
    unsafe fn pack_run(&self, i: usize, data: &mut [u8]) {
        let r = &self.runs[i];
        let dst = &mut data[r.off..r.off + r.count * r.t.wire];
        // SAFETY: the caller's contract; `dst` holds the run's packed bytes.
        unsafe { pack(r.at, r.count, &r.t, dst) };
    }

    /// The packed bytes of run `i` alone.
    ///
    /// # Safety
    /// As [`Layout::pack_run`].
    unsafe fn pack_alone(&self, i: usize) -> Vec<u8> {
        let r = &self.runs[i];
        let mut v = vec![0u8; r.count * r.t.wire];
        // SAFETY: the caller's contract; `v` holds the run's packed bytes.
        unsafe { pack(r.at, r.count, &r.t, &mut v) };
        v
    }

    /// The packed bytes of every run.
    ///
    /// # Safety
    /// As [`Layout::pack_run`], for every run.
    unsafe fn pack(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        for i in 0..self.runs.len() {
            // SAFETY: the caller's contract.
            unsafe { self.pack_run(i, &mut v) };
        }
        v
    }

    /// A staging buffer to receive this layout into.
    fn recv(self) -> Unpack {
        Unpack {
            data: vec![0u8; self.len],
            to: self,
            call: "",
        }
    }
}

/// A staging buffer, and the caller's elements its bytes go to once the
/// collective has received them.
pub struct Unpack {
    data: Vec<u8>,
    to: Layout,
    /// The nonblocking call it belongs to, for errors.
    pub call: &'static str,
}

impl Unpack {
    /// Unpacks every run into the caller's elements.
    ///
    /// # Safety
    /// The collective that filled `data` is done, and the caller's
    /// buffers are still those the call was given (MPI's contract).
    pub unsafe fn finish(&self) {
        for r in &self.to.runs {
            let src = &self.data[r.off..r.off + r.count * r.t.wire];
            // SAFETY: the caller's contract; `src` is `count` whole
            // elements of `t`.
            unsafe { unpack(r.at, &r.t, src) };
        }
    }
}

/// The layout of `t` (a predefined type is one block).
fn info(t: &Ty) -> Rc<TypeInfo> {
    match t {
        Ty::Derived(i) => i.clone(),
        _ => Rc::new(t.info()),
    }
}

/// Ends a call: a blocking one (`started` `None`) unpacks what it
/// received; a started one is stored with the buffers it uses.
fn end(
    req: Req,
    comm: MPI_Comm,
    started: Option<CollRequest<'static>>,
    keep: Vec<Vec<u8>>,
    mut back: Option<Unpack>,
    call: &'static str,
) -> R<()> {
    if let (Some(p), Some(r)) = (req, started) {
        if let Some(b) = &mut back {
            b.call = call;
        }
        return requests::store_coll(p, r, comm, keep, back);
    }
    if let Some(b) = &back {
        // SAFETY: the blocking collective is done; the caller's buffers
        // are those it was given.
        unsafe { b.finish() };
    }
    Ok(())
}

/// A C array of `n` non-negative counts or displacements.
///
/// # Safety
/// `p` is an array of `n` entries (MPI's contract).
unsafe fn entries(p: *const c_int, n: usize, what: &str) -> R<Vec<usize>> {
    // SAFETY: the caller's contract.
    let a = unsafe { carray(p, n, what) }?;
    a.iter()
        .map(|&x| {
            if x < 0 {
                return err(MPI_ERR_COUNT, format!("{what} has a negative entry {x}"));
            }
            Ok(x as usize)
        })
        .collect()
}

/// A null buffer with data: an error unless the type may be absolute
/// (a derived type at MPI_BOTTOM).
fn check_null(base: *const c_void, bytes: usize, t: &Ty, what: &str) -> R<()> {
    if bytes > 0 && base.is_null() && matches!(t, Ty::Basic { .. }) {
        return err(MPI_ERR_BUFFER, format!("{what} is a null pointer"));
    }
    Ok(())
}

/// The blocks of a v- or w-form buffer: block `i` is `counts[i]` elements
/// of its type at byte `displs[i]` from `base`. Gives the layout and the
/// packed blocks' byte counts and offsets (what the byte-level collective
/// takes).
struct Blocks {
    l: Layout,
    k: Vec<usize>,
    d: Vec<usize>,
}

fn blocks<'t>(
    base: *const c_void,
    counts: &[usize],
    displs: impl Iterator<Item = isize>,
    types: impl Fn(usize) -> &'t Rc<TypeInfo>,
) -> Blocks {
    let mut b = Blocks {
        l: Layout::default(),
        k: Vec::with_capacity(counts.len()),
        d: Vec::with_capacity(counts.len()),
    };
    for (i, (&c, x)) in counts.iter().zip(displs).enumerate() {
        // Not `offset`: the base may be MPI_BOTTOM (null) with absolute
        // displacements.
        let (off, len) = b.l.push(base.wrapping_byte_offset(x), c, types(i));
        b.d.push(off);
        b.k.push(len);
    }
    b
}

/// The blocks of a v-form buffer (displacements in extents of `t`).
///
/// # Safety
/// `counts` and `displs` hold `n` entries (MPI's contract). `what` names
/// the counts, the displacements and the buffer in errors.
unsafe fn v_blocks(
    base: *const c_void,
    counts: *const c_int,
    displs: *const c_int,
    n: usize,
    t: &Ty,
    what: (&str, &str, &str),
) -> R<Blocks> {
    // SAFETY: the caller's contract.
    let (k, d) = unsafe { (entries(counts, n, what.0)?, entries(displs, n, what.1)?) };
    let i = info(t);
    let b = blocks(base, &k, d.iter().map(|&x| x as isize * i.extent), |_| &i);
    check_null(base, b.l.len, t, what.2)?;
    Ok(b)
}

/// A blocking or nonblocking reduction's kernel on the packed elements of
/// `t` (one predefined kind, a predefined operation), and their size.
fn elem_kernel(t: &TypeInfo, dt: MPI_Datatype, op: MPI_Op) -> R<(ByteReduce, usize)> {
    let Some(elem) = t.elem else {
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
    Ok((predefined(op, elem, dt)?, t.elem_size))
}

/// MPI_Bcast / MPI_Ibcast of a non-contiguous type: the root packs, the
/// others unpack.
///
/// # Safety
/// `buf` holds `count` elements of `t` (MPI's contract), until the
/// request completes for a nonblocking call.
pub unsafe fn bcast(
    c: &Comm,
    t: &Ty,
    buf: *mut c_void,
    count: c_int,
    root: usize,
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    wire_len(buf, count, t)?;
    let l = Layout::one(buf, count as usize, &info(t));
    let mut keep = Vec::new();
    let mut back = None;
    let b = if c.rank() == root {
        // SAFETY: the caller's contract.
        keep.push(unsafe { l.pack() });
        // SAFETY: `keep` goes with the request (or outlives the blocking
        // call) and is not touched meanwhile.
        unsafe { forever_mut(&mut keep[0]) }
    } else {
        let u: &mut Unpack = back.insert(l.recv());
        // SAFETY: as above, for `back`.
        unsafe { forever_mut(&mut u.data) }
    };
    let r = match req {
        None => {
            c.bcast(b, root)?;
            None
        }
        Some(_) => Some(c.ibcast(static_scope(), b, root)?),
    };
    end(req, comm, r, keep, back, "MPI_Ibcast")
}

/// Which reduction.
#[derive(Clone, Copy)]
pub enum Red {
    Reduce(usize),
    Allreduce,
    Scan,
    Exscan,
}

/// A reduction on a non-contiguous type of one predefined element kind
/// with a predefined operation.
///
/// # Safety
/// The buffers hold `count` elements of `t` (MPI's contract), until the
/// request completes for a nonblocking call.
pub unsafe fn reduction(
    c: &Comm,
    t: &Ty,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    kind: Red,
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    let ti = info(t);
    let (k, e) = elem_kernel(&ti, dt, op)?;
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
    let mut to = Layout::default();
    if gets_result {
        wire_len(rbuf, count, t)?;
        to.push(rbuf, n, &ti);
    }
    // SAFETY: MPI's contract.
    let send = unsafe { Layout::one(src, n, &ti).pack() };
    let mut back = to.recv();
    if matches!(kind, Red::Exscan) && c.rank() == 0 {
        // Rank 0's exclusive scan result is undefined: its buffer stays
        // as it is.
        back.to = Layout::default();
    }
    // SAFETY: `send` and `back` go with the request (or outlive the
    // blocking call) and are not touched meanwhile.
    let (sb, rb) = unsafe { (Some(forever(&send)), forever_mut(&mut back.data)) };
    let (r, name) = match (kind, req) {
        (Red::Reduce(root), None) => (c.reduce_raw(sb, rb, e, &k, root).map(|_| None), ""),
        (Red::Allreduce, None) => (c.allreduce_raw(sb, rb, e, &k).map(|_| None), ""),
        (Red::Scan, None) => (c.scan_raw(false, sb, rb, e, &k).map(|_| None), ""),
        (Red::Exscan, None) => (c.scan_raw(true, sb, rb, e, &k).map(|_| None), ""),
        (Red::Reduce(root), Some(_)) => (
            c.ireduce_raw(static_scope(), sb, rb, e, &k, root).map(Some),
            "MPI_Ireduce",
        ),
        (Red::Allreduce, Some(_)) => (
            c.iallreduce_raw(static_scope(), sb, rb, e, &k).map(Some),
            "MPI_Iallreduce",
        ),
        (Red::Scan, Some(_)) => (
            c.iscan_raw(static_scope(), false, sb, rb, e, &k).map(Some),
            "MPI_Iscan",
        ),
        (Red::Exscan, Some(_)) => (
            c.iscan_raw(static_scope(), true, sb, rb, e, &k).map(Some),
            "MPI_Iexscan",
        ),
    };
    end(req, comm, r?, vec![send], Some(back), name)
}

/// MPI_Reduce_local on a non-contiguous type of one predefined element
/// kind with a predefined operation: both sides are packed, combined with
/// the kind's kernel and the result unpacked into `inout`'s elements (its
/// gaps stay as they were).
///
/// # Safety
/// `inbuf` and `inout` hold `count` elements of `t` (MPI's contract).
pub unsafe fn reduce_local(
    t: &Ty,
    inbuf: *const c_void,
    inout: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
) -> R<()> {
    let ti = info(t);
    let (k, _) = elem_kernel(&ti, dt, op)?;
    wire_len(inbuf, count, t)?;
    wire_len(inout, count, t)?;
    let n = count as usize;
    // SAFETY: MPI's contract: both buffers hold `count` elements of `t`.
    let src = unsafe { Layout::one(inbuf, n, &ti).pack() };
    let mut back = Layout::one(inout, n, &ti).recv();
    // SAFETY: as above.
    back.data = unsafe { back.to.pack() };
    k.apply(&mut back.data, &src, true);
    // SAFETY: `back.data` is the combined elements of `inout`, which is
    // still the caller's buffer.
    unsafe { back.finish() };
    Ok(())
}

/// MPI_(I)reduce_scatter / _block on a non-contiguous type: `items` is
/// each rank's count of elements of `t`.
///
/// # Safety
/// The send buffer holds the sum of `items` elements of `t`, the receive
/// buffer this rank's count (in place: the whole input), until the
/// request completes for a nonblocking call (MPI's contract).
pub unsafe fn reduce_scatter(
    c: &Comm,
    t: &Ty,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    items: &[usize],
    is_block: bool,
    dt: MPI_Datatype,
    op: MPI_Op,
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    let ti = info(t);
    let (k, e) = elem_kernel(&ti, dt, op)?;
    // ibcoll counts elements of the kernel: `per` of them in one item.
    let per = ti.wire / e.max(1);
    let total: usize = items.iter().sum();
    let mine = items[c.rank()];
    let in_place = is_in_place(sbuf);
    let counts: Vec<usize> = items.iter().map(|&x| x * per).collect();
    let mut keep = Vec::new();
    let (send, mut back) = if in_place {
        check_null(rbuf, total * ti.wire, t, "receive buffer")?;
        // The input is the whole receive buffer; the result is its first
        // `mine` items (MPI's in-place form).
        // SAFETY: MPI's contract.
        let data = unsafe { Layout::one(rbuf, total, &ti).pack() };
        let to = Layout::one(rbuf, mine, &ti);
        (None, Unpack { data, to, call: "" })
    } else {
        check_null(sbuf, total * ti.wire, t, "send buffer")?;
        check_null(rbuf, mine * ti.wire, t, "receive buffer")?;
        // SAFETY: MPI's contract.
        keep.push(unsafe { Layout::one(sbuf, total, &ti).pack() });
        // SAFETY: `keep` goes with the request (or outlives the blocking
        // call) and is not touched meanwhile.
        let s = unsafe { forever(&keep[0]) };
        (Some(s), Layout::one(rbuf, mine, &ti).recv())
    };
    // SAFETY: as above, for `back`.
    let rb = unsafe { forever_mut(&mut back.data) };
    // An in-place block form is the general form with equal counts.
    let counts = if is_block && !in_place {
        None
    } else {
        Some(&counts[..])
    };
    let r = match req {
        None => {
            c.reduce_scatter_raw(send, rb, counts, e, &k)?;
            None
        }
        Some(_) => Some(c.ireduce_scatter_raw(static_scope(), send, rb, counts, e, &k)?),
    };
    let name = if is_block {
        "MPI_Ireduce_scatter_block"
    } else {
        "MPI_Ireduce_scatter"
    };
    end(req, comm, r, keep, Some(back), name)
}

/// MPI_(I)alltoall / MPI_(I)allgather with a non-contiguous send or
/// receive type (`st` is `None` for MPI_IN_PLACE).
///
/// # Safety
/// The buffers hold their counts of elements (MPI's contract), until the
/// request completes for a nonblocking call.
pub unsafe fn all_to(
    c: &Comm,
    alltoall: bool,
    sbuf: *const c_void,
    scount: c_int,
    st: Option<&Ty>,
    rbuf: *mut c_void,
    rcount: c_int,
    rt: &Ty,
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    let n = c.size();
    let block = wire_len(rbuf, rcount, rt)?;
    let to = Layout::one(rbuf, n * rcount as usize, &info(rt));
    let mut keep = Vec::new();
    let mut back = match st {
        Some(_) => to.recv(),
        None => {
            // In place: the receive buffer holds this rank's data (its own
            // block for allgather, every block for alltoall).
            // SAFETY: MPI's contract: `n * rcount` elements at `rbuf`.
            let data = unsafe { to.pack() };
            Unpack { data, to, call: "" }
        }
    };
    // SAFETY: `back` goes with the request (or outlives the blocking
    // call) and is not touched meanwhile.
    let rb = unsafe { forever_mut(&mut back.data) };
    let s = match st {
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
            let selems = scount as usize * if alltoall { n } else { 1 };
            // SAFETY: MPI's contract.
            keep.push(unsafe { Layout::one(sbuf, selems, &info(st)).pack() });
            // SAFETY: as above, for `keep`.
            Some(unsafe { forever(&keep[0]) })
        }
        None => None,
    };
    let r = match (alltoall, s, req) {
        (false, Some(s), None) => c.allgather(s, rb).map(|_| None),
        (false, None, None) => c.allgather_in_place(rb).map(|_| None),
        (true, Some(s), None) => c.alltoall(s, rb).map(|_| None),
        (true, None, None) => c.alltoall_in_place(rb).map(|_| None),
        (false, Some(s), Some(_)) => c.iallgather(static_scope(), s, rb).map(Some),
        (false, None, Some(_)) => c.iallgather_in_place(static_scope(), rb).map(Some),
        (true, Some(s), Some(_)) => c.ialltoall(static_scope(), s, rb).map(Some),
        (true, None, Some(_)) => c.ialltoall_in_place(static_scope(), rb).map(Some),
    }?;
    let name = if alltoall {
        "MPI_Ialltoall"
    } else {
        "MPI_Iallgather"
    };
    end(req, comm, r, keep, Some(back), name)
}

/// MPI_(I)gather / MPI_(I)scatter with a non-contiguous type on either
/// side (`own` is the sender's buffer for gather, the receiver's for
/// scatter; `own_t` `None` for MPI_IN_PLACE at the root).
///
/// # Safety
/// The buffers hold their counts of elements (MPI's contract); the root's
/// `all` holds `size * all_count` elements of `all_t`; until the request
/// completes for a nonblocking call.
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
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    let n = c.size();
    let me = c.rank();
    let am_root = me == root;
    // The root's side, one run per rank's block.
    let (block, all_l) = match (am_root, all_t) {
        (true, Some(t)) => {
            let b = wire_len(all, all_count, t)?;
            let ext = t.extent() * all_count as isize;
            let k = vec![all_count as usize; n];
            let i = info(t);
            let bl = blocks(all, &k, (0..n as isize).map(|r| r * ext), |_| &i);
            (b, Some(bl.l))
        }
        _ => (0, None),
    };
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
    let own_l = own_t.map(|t| Layout::one(own, own_count as usize, &info(t)));
    let mut keep = Vec::new();
    let mut back = None;
    // SAFETY: (both arms) MPI's contract for the caller's buffers; the
    // staging buffers go with the request (or outlive the blocking call)
    // and are not touched meanwhile.
    let r = unsafe {
        if scatter {
            let whole: &'static mut [u8] = match &all_l {
                Some(l) => {
                    keep.push(l.pack());
                    forever_mut(&mut keep[0])
                }
                None => &mut [],
            };
            match own_l {
                Some(l) => {
                    let u: &mut Unpack = back.insert(l.recv());
                    let mine = forever_mut(&mut u.data);
                    match req {
                        None => c.scatter(whole, mine, root).map(|_| None),
                        Some(_) => c.iscatter(static_scope(), whole, mine, root).map(Some),
                    }
                }
                // In place at the root: its own block stays where it is.
                None => match req {
                    None => c.scatter_in_place(whole, root).map(|_| None),
                    Some(_) => c.iscatter_in_place(static_scope(), whole, root).map(Some),
                },
            }
        } else {
            let whole: &'static mut [u8] = match all_l {
                Some(l) => {
                    let u: &mut Unpack = back.insert(l.recv());
                    if own_l.is_none() {
                        // In place at the root: its own block is already
                        // in the caller's buffer.
                        u.to.pack_run(me, &mut u.data);
                    }
                    forever_mut(&mut u.data)
                }
                None => &mut [],
            };
            match own_l {
                Some(l) => {
                    keep.push(l.pack());
                    let mine = forever(&keep[0]);
                    match req {
                        None => c.gather(mine, whole, root).map(|_| None),
                        Some(_) => c.igather(static_scope(), mine, whole, root).map(Some),
                    }
                }
                None => match req {
                    None => c.gather_in_place(whole, root).map(|_| None),
                    Some(_) => c.igather_in_place(static_scope(), whole, root).map(Some),
                },
            }
        }
    }?;
    let name = if scatter {
        "MPI_Iscatter"
    } else {
        "MPI_Igather"
    };
    end(req, comm, r, keep, back, name)
}

/// MPI_(I)gatherv / MPI_(I)scatterv with a non-contiguous type on either
/// side (`own` as for [`gather_scatter`]; `counts` and `displs`, in
/// elements and extents of `all_t`, are read at the root only).
///
/// # Safety
/// As [`gather_scatter`]; at the root, `counts` and `displs` hold one
/// entry per rank and `all` reaches every block.
pub unsafe fn gather_scatter_v(
    c: &Comm,
    scatter: bool,
    own: *mut c_void,
    own_count: c_int,
    own_t: Option<&Ty>,
    all: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    all_t: Option<&Ty>,
    root: usize,
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    let n = c.size();
    let me = c.rank();
    let am_root = me == root;
    let all_b = match (am_root, all_t) {
        (true, Some(t)) => {
            // SAFETY: one entry per rank at the root (MPI's contract).
            let b = unsafe {
                v_blocks(
                    all,
                    counts,
                    displs,
                    n,
                    t,
                    ("counts", "displs", "the root's buffer"),
                )
            }?;
            Some(b)
        }
        _ => None,
    };
    let own_l = match own_t {
        Some(t) => {
            wire_len(own, own_count, t)?;
            Some(Layout::one(own, own_count as usize, &info(t)))
        }
        None => None,
    };
    if let Some(b) = &all_b {
        let mine = own_l.as_ref().map_or(b.k[me], |l| l.len);
        if mine != b.k[me] {
            return err(
                MPI_ERR_TRUNCATE,
                format!(
                    "the root's block has {mine} bytes, its count says {}",
                    b.k[me]
                ),
            );
        }
    }
    let (k, d) = match &all_b {
        Some(b) => (b.k.clone(), b.d.clone()),
        None => (Vec::new(), Vec::new()),
    };
    let mut keep = Vec::new();
    let mut back = None;
    // SAFETY: (both arms) MPI's contract for the caller's buffers; the
    // staging buffers go with the request (or outlive the blocking call)
    // and are not touched meanwhile.
    let r = unsafe {
        if scatter {
            let whole = match &all_b {
                Some(b) => {
                    keep.push(b.l.pack());
                    forever(&keep[0])
                }
                None => &[],
            };
            let mine = match own_l {
                Some(l) => {
                    let u: &mut Unpack = back.insert(l.recv());
                    forever_mut(&mut u.data)
                }
                None => {
                    // In place at the root: its own block is received
                    // here and dropped; the caller's stays as it is.
                    keep.push(vec![0u8; k[me]]);
                    let last = keep.len() - 1;
                    forever_mut(&mut keep[last])
                }
            };
            match req {
                None => c.scatterv(whole, &k, &d, mine, root).map(|_| None),
                Some(_) => c
                    .iscatterv(static_scope(), whole, &k, &d, mine, root)
                    .map(Some),
            }
        } else {
            let mine = match (&own_l, &all_b) {
                (Some(l), _) => l.pack(),
                // In place at the root: what it sends is its own block.
                (None, Some(b)) => b.l.pack_alone(me),
                (None, None) => Vec::new(),
            };
            keep.push(mine);
            let mine = forever(&keep[0]);
            let whole: &'static mut [u8] = match all_b {
                Some(b) => {
                    let u: &mut Unpack = back.insert(b.l.recv());
                    forever_mut(&mut u.data)
                }
                None => &mut [],
            };
            match req {
                None => c.gatherv(mine, whole, &k, &d, root).map(|_| None),
                Some(_) => c
                    .igatherv(static_scope(), mine, whole, &k, &d, root)
                    .map(Some),
            }
        }
    }?;
    let name = if scatter {
        "MPI_Iscatterv"
    } else {
        "MPI_Igatherv"
    };
    end(req, comm, r, keep, back, name)
}

/// MPI_(I)allgatherv with a non-contiguous type on either side (`st`
/// `None` for MPI_IN_PLACE).
///
/// # Safety
/// `counts` and `displs` hold one entry per rank, `rbuf` reaches every
/// block, `sbuf` holds `scount` elements (MPI's contract), until the
/// request completes for a nonblocking call.
pub unsafe fn allgatherv(
    c: &Comm,
    sbuf: *const c_void,
    scount: c_int,
    st: Option<&Ty>,
    rbuf: *mut c_void,
    counts: *const c_int,
    displs: *const c_int,
    rt: &Ty,
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    let n = c.size();
    // SAFETY: one entry per rank (MPI's contract).
    let b = unsafe {
        v_blocks(
            rbuf,
            counts,
            displs,
            n,
            rt,
            ("recvcounts", "displs", "receive buffer"),
        )
    }?;
    let (k, d) = (b.k.clone(), b.d.clone());
    let mut back = b.l.recv();
    let mut keep = Vec::new();
    let s = match st {
        Some(st) => {
            wire_len(sbuf, scount, st)?;
            // SAFETY: MPI's contract.
            keep.push(unsafe { Layout::one(sbuf, scount as usize, &info(st)).pack() });
            // SAFETY: `keep` goes with the request (or outlives the
            // blocking call) and is not touched meanwhile.
            Some(unsafe { forever(&keep[0]) })
        }
        None => {
            // In place: this rank's block is in the receive buffer.
            // SAFETY: MPI's contract.
            unsafe { back.to.pack_run(c.rank(), &mut back.data) };
            None
        }
    };
    // SAFETY: as above, for `back`.
    let rb = unsafe { forever_mut(&mut back.data) };
    let r = match (s, req) {
        (Some(s), None) => c.allgatherv(s, rb, &k, &d).map(|_| None),
        (None, None) => c.allgatherv_in_place(rb, &k, &d).map(|_| None),
        (Some(s), Some(_)) => c.iallgatherv(static_scope(), s, rb, &k, &d).map(Some),
        (None, Some(_)) => c.iallgatherv_in_place(static_scope(), rb, &k, &d).map(Some),
    }?;
    end(req, comm, r, keep, Some(back), "MPI_Iallgatherv")
}

/// One side of an alltoallv/alltoallw: its blocks.
pub enum Side<'a> {
    /// Counts and displacements in elements and extents of one type.
    V(*const c_int, *const c_int, &'a Ty),
    /// Counts of each block's type, displacements in bytes.
    W(*const c_int, *const c_int, *const MPI_Datatype),
}

/// The blocks of `side` at `base`.
///
/// # Safety
/// The arrays hold `n` entries (MPI's contract).
unsafe fn side_blocks(base: *const c_void, side: &Side, n: usize, send: bool) -> R<Blocks> {
    let what = if send {
        ("sendcounts", "sdispls", "send buffer")
    } else {
        ("recvcounts", "rdispls", "receive buffer")
    };
    match side {
        // SAFETY: the caller's contract.
        Side::V(k, d, t) => unsafe { v_blocks(base, *k, *d, n, t, what) },
        Side::W(k, d, ts) => {
            // SAFETY: the caller's contract.
            let (kk, dd, hs) = unsafe {
                (
                    entries(*k, n, what.0)?,
                    entries(*d, n, what.1)?,
                    carray(*ts, n, "types")?,
                )
            };
            let tys = hs.iter().map(|&h| ty(h)).collect::<R<Vec<_>>>()?;
            for (i, t) in tys.iter().enumerate() {
                check_null(base, kk[i] * t.wire(), t, what.2)?;
            }
            let infos: Vec<Rc<TypeInfo>> = tys.iter().map(info).collect();
            Ok(blocks(base, &kk, dd.iter().map(|&x| x as isize), |i| {
                &infos[i]
            }))
        }
    }
}

/// MPI_(I)alltoallv / MPI_(I)alltoallw with a non-contiguous type on
/// either side (`send` `None` for MPI_IN_PLACE): an alltoallv of the
/// packed bytes.
///
/// # Safety
/// The arrays hold one entry per rank and the buffers reach every block
/// (MPI's contract), until the request completes for a nonblocking call.
pub unsafe fn alltoallv(
    c: &Comm,
    w: bool,
    sbuf: *const c_void,
    send: Option<Side>,
    rbuf: *mut c_void,
    recv: Side,
    req: Req,
    comm: MPI_Comm,
) -> R<()> {
    let n = c.size();
    // SAFETY: the caller's contract.
    let rb = unsafe { side_blocks(rbuf, &recv, n, false) }?;
    let (rk, rd) = (rb.k.clone(), rb.d.clone());
    let (sk, sd, sdata) = match send {
        Some(s) => {
            // SAFETY: the caller's contract.
            let b = unsafe { side_blocks(sbuf, &s, n, true) }?;
            // SAFETY: MPI's contract.
            let data = unsafe { b.l.pack() };
            (b.k, b.d, data)
        }
        // In place: the input is what the receive buffer holds now, in
        // the receive layout.
        // SAFETY: MPI's contract.
        None => (rk.clone(), rd.clone(), unsafe { rb.l.pack() }),
    };
    let keep = vec![sdata];
    let mut back = rb.l.recv();
    // SAFETY: `keep` and `back` go with the request (or outlive the
    // blocking call) and are not touched meanwhile.
    let (s, r) = unsafe { (forever(&keep[0]), forever_mut(&mut back.data)) };
    let started = match req {
        None => {
            c.alltoallv(s, &sk, &sd, r, &rk, &rd)?;
            None
        }
        Some(_) => Some(c.ialltoallv(static_scope(), s, &sk, &sd, r, &rk, &rd)?),
    };
    let name = if w {
        "MPI_Ialltoallw"
    } else {
        "MPI_Ialltoallv"
    };
    end(req, comm, started, keep, Some(back), name)
}

/// Whether a call on types `ts` needs these paths.
pub fn needed(ts: &[Option<&Ty>]) -> bool {
    ts.iter().flatten().any(|t| !t.is_contiguous())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::Kind;

    /// Elements of 4 bytes, bytes 1 and 3 data (a byte vector, stride 2).
    fn strided() -> Rc<TypeInfo> {
        Rc::new(TypeInfo {
            size: 2,
            lb: 0,
            extent: 4,
            blocks: vec![(1, 1), (3, 1)],
            wire: 2,
            elem: Some(Kind::U8),
            elem_size: 1,
            committed: true,
            align: 1,
        })
    }

    #[test]
    fn v_blocks_pack_back_to_back_and_unpack_in_place() {
        let t = strided();
        // Block 0: 1 element at element 3; block 1: 2 elements at 0; the
        // element at 2 is a hole.
        let src: Vec<u8> = (0..16).collect();
        let base = src.as_ptr() as *const c_void;
        let b = blocks(base, &[1, 2], [12isize, 0].into_iter(), |_| &t);
        assert_eq!((b.k.clone(), b.d.clone()), (vec![2, 4], vec![0, 2]));
        // SAFETY: every run lies in `src`.
        let packed = unsafe { b.l.pack() };
        assert_eq!(packed, [13, 15, 1, 3, 5, 7]);
        let mut dst = vec![0xeeu8; 16];
        let db = blocks(
            dst.as_mut_ptr() as *const c_void,
            &[1, 2],
            [12isize, 0].into_iter(),
            |_| &t,
        );
        let mut u = db.l.recv();
        u.data.copy_from_slice(&packed);
        assert_eq!(u.to.len, 6);
        // SAFETY: every run lies in `dst`, which outlives `u`'s use.
        unsafe { u.finish() };
        let e = 0xee;
        assert_eq!(
            dst,
            [e, 1, e, 3, e, 5, e, 7, e, e, e, e, e, 13, e, 15],
            "data where the blocks are, the gaps and the hole untouched"
        );
        // The root's own block alone (in-place gatherv).
        // SAFETY: run 1 lies in `src`.
        assert_eq!(unsafe { b.l.pack_alone(1) }, [1, 3, 5, 7]);
    }
}
