//! Communicators, groups, attributes and error handlers.

use std::os::raw::{c_char, c_int, c_void};
use std::rc::Rc;

use crate::abi::*;
use crate::buffers::put;
use crate::datatype::carray;
use crate::error::{call, err, R};
use crate::state::{self, index, with};

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_rank(comm: MPI_Comm, rank: *mut c_int) -> c_int {
    call("MPI_Comm_rank", comm, || {
        let r = with(|st| match st.comm_slot(comm) {
            Some(e) => Ok(e.comm.rank()),
            None => state::bad_comm(comm),
        })?;
        put(rank, r as c_int, "rank")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_size(comm: MPI_Comm, size: *mut c_int) -> c_int {
    call("MPI_Comm_size", comm, || {
        let r = with(|st| match st.comm_slot(comm) {
            Some(e) => Ok(e.comm.size()),
            None => state::bad_comm(comm),
        })?;
        put(size, r as c_int, "size")
    })
}

fn errh_of(comm: MPI_Comm) -> MPI_Errhandler {
    state::errhandler(comm)
}

fn register(c: Option<ibcoll::Comm>, parent: MPI_Comm) -> R<MPI_Comm> {
    match c {
        Some(c) => with(|st| Ok(st.add_comm(c, errh_of_locked(st, parent)))),
        None => Ok(MPI_COMM_NULL),
    }
}

fn errh_of_locked(st: &state::State, parent: MPI_Comm) -> MPI_Errhandler {
    st.comm_slot(parent)
        .map_or(MPI_ERRORS_ARE_FATAL, |e| e.errh)
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_split(
    comm: MPI_Comm,
    color: c_int,
    key: c_int,
    new: *mut MPI_Comm,
) -> c_int {
    call("MPI_Comm_split", comm, || {
        let c = state::comm(comm)?;
        if new.is_null() {
            return err(MPI_ERR_ARG, "newcomm is a null pointer");
        }
        let color = if color == MPI_UNDEFINED {
            ibcoll::UNDEFINED
        } else {
            color
        };
        if color < 0 && color != ibcoll::UNDEFINED {
            return err(
                MPI_ERR_ARG,
                format!("color {color} is negative (and not MPI_UNDEFINED)"),
            );
        }
        let n = c.split(color, key)?;
        put(new, register(n, comm)?, "newcomm")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_split_type(
    comm: MPI_Comm,
    split_type: c_int,
    key: c_int,
    _info: MPI_Info,
    new: *mut MPI_Comm,
) -> c_int {
    call("MPI_Comm_split_type", comm, || {
        let c = state::comm(comm)?;
        if new.is_null() {
            return err(MPI_ERR_ARG, "newcomm is a null pointer");
        }
        let color = match split_type {
            MPI_UNDEFINED => ibcoll::UNDEFINED,
            // MPI_COMM_TYPE_SHARED (and the hardware-guided kinds): the
            // ranks of one node.
            1..=3 => c.node_id() as c_int,
            t => return err(MPI_ERR_ARG, format!("split type {t} is not known")),
        };
        let n = c.split(color, key)?;
        put(new, register(n, comm)?, "newcomm")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_dup(comm: MPI_Comm, new: *mut MPI_Comm) -> c_int {
    call("MPI_Comm_dup", comm, || {
        let c = state::comm(comm)?;
        if new.is_null() {
            return err(MPI_ERR_ARG, "newcomm is a null pointer");
        }
        let n = c.dup()?;
        put(new, register(Some(n), comm)?, "newcomm")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_free(comm: *mut MPI_Comm) -> c_int {
    call("MPI_Comm_free", MPI_COMM_WORLD, || {
        if comm.is_null() {
            return err(MPI_ERR_ARG, "comm is a null pointer");
        }
        // SAFETY: checked non-null (MPI's contract).
        let h = unsafe { *comm };
        if h == MPI_COMM_WORLD || h == MPI_COMM_SELF {
            return err(
                MPI_ERR_COMM,
                "MPI_COMM_WORLD and MPI_COMM_SELF cannot be freed",
            );
        }
        let gone = with(
            |st| match index(h, COMM_DYN).and_then(|i| st.comms.get_mut(i)) {
                Some(slot @ Some(_)) => Ok(slot.take()),
                _ => state::bad_comm(h),
            },
        )?;
        // Dropped outside the state's borrow.
        drop(gone);
        put(comm, MPI_COMM_NULL, "comm")
    })
}

/// World ranks of communicator `h`'s members.
fn members(h: MPI_Comm) -> R<Vec<usize>> {
    let c = state::comm(h)?;
    Ok((0..c.size()).filter_map(|r| c.world_rank(r)).collect())
}

fn compare(a: &[usize], b: &[usize]) -> c_int {
    if a == b {
        return MPI_CONGRUENT;
    }
    let (mut x, mut y) = (a.to_vec(), b.to_vec());
    x.sort_unstable();
    y.sort_unstable();
    if x == y {
        MPI_SIMILAR
    } else {
        MPI_UNEQUAL
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_compare(a: MPI_Comm, b: MPI_Comm, result: *mut c_int) -> c_int {
    call("MPI_Comm_compare", a, || {
        let (x, y) = (members(a)?, members(b)?);
        let r = if a == b { MPI_IDENT } else { compare(&x, &y) };
        put(result, r, "result")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_test_inter(comm: MPI_Comm, flag: *mut c_int) -> c_int {
    call("MPI_Comm_test_inter", comm, || {
        state::comm(comm)?;
        put(flag, 0, "flag")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_get_parent(parent: *mut MPI_Comm) -> c_int {
    call("MPI_Comm_get_parent", MPI_COMM_WORLD, || {
        put(parent, MPI_COMM_NULL, "parent")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_set_name(comm: MPI_Comm, name: *const c_char) -> c_int {
    call("MPI_Comm_set_name", comm, || {
        if name.is_null() {
            return err(MPI_ERR_ARG, "name is a null pointer");
        }
        // SAFETY: a NUL-terminated string (MPI's contract).
        let s = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        with(|st| {
            let i = match comm {
                MPI_COMM_WORLD => Some(0),
                MPI_COMM_SELF => Some(1),
                _ => index(comm, COMM_DYN),
            };
            match i.and_then(|i| st.comms.get_mut(i)).and_then(|e| e.as_mut()) {
                Some(e) => {
                    e.name = s;
                    Ok(())
                }
                None => state::bad_comm(comm),
            }
        })
    })
}

/// Copies `s` into the caller's buffer of `cap` bytes, NUL-terminated.
pub fn copy_out(s: &str, buf: *mut c_char, cap: usize, len: *mut c_int) -> R<()> {
    if buf.is_null() {
        return err(MPI_ERR_ARG, "string buffer is a null pointer");
    }
    let b = s.as_bytes();
    let n = b.len().min(cap - 1);
    // SAFETY: the caller's buffer holds `cap` bytes (MPI's contract: at
    // least the MPI_MAX_* of the call).
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    put(len, n as c_int, "resultlen")
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_get_name(
    comm: MPI_Comm,
    name: *mut c_char,
    len: *mut c_int,
) -> c_int {
    call("MPI_Comm_get_name", comm, || {
        let s = with(|st| match st.comm_slot(comm) {
            Some(e) => Ok(e.name.clone()),
            None => state::bad_comm(comm),
        })?;
        copy_out(&s, name, MPI_MAX_OBJECT_NAME, len)
    })
}

// ---------------------------------------------------------------- groups

fn group(h: MPI_Group) -> R<Rc<[usize]>> {
    if h == MPI_GROUP_EMPTY {
        return Ok(Rc::from([]));
    }
    with(|st| {
        match index(h, GROUP_DYN)
            .and_then(|i| st.groups.get(i))
            .and_then(|g| g.clone())
        {
            Some(g) => Ok(g),
            None if h == MPI_GROUP_NULL => err(MPI_ERR_GROUP, "group is MPI_GROUP_NULL"),
            None => err(MPI_ERR_GROUP, format!("invalid group handle {h:#x}")),
        }
    })
}

fn add_group(g: Vec<usize>) -> R<MPI_Group> {
    if g.is_empty() {
        return Ok(MPI_GROUP_EMPTY);
    }
    with(|st| {
        let i = match st.groups.iter().position(|g| g.is_none()) {
            Some(i) => i,
            None => {
                st.groups.push(None);
                st.groups.len() - 1
            }
        };
        st.groups[i] = Some(g.into());
        Ok(GROUP_DYN | i as c_int)
    })
}

fn my_world() -> R<usize> {
    with(|st| Ok(st.world.rank()))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_group(comm: MPI_Comm, g: *mut MPI_Group) -> c_int {
    call("MPI_Comm_group", comm, || {
        let m = members(comm)?;
        put(g, add_group(m)?, "group")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Group_size(g: MPI_Group, size: *mut c_int) -> c_int {
    call("MPI_Group_size", MPI_COMM_WORLD, || {
        put(size, group(g)?.len() as c_int, "size")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Group_rank(g: MPI_Group, rank: *mut c_int) -> c_int {
    call("MPI_Group_rank", MPI_COMM_WORLD, || {
        let me = my_world()?;
        let r = group(g)?
            .iter()
            .position(|&w| w == me)
            .map_or(MPI_UNDEFINED, |p| p as c_int);
        put(rank, r, "rank")
    })
}

fn ranks_in(g: &[usize], n: c_int, ranks: *const c_int) -> R<Vec<usize>> {
    if n < 0 {
        return err(MPI_ERR_COUNT, format!("n {n} is negative"));
    }
    // SAFETY: an array of `n` ranks (MPI's contract).
    let r = unsafe { carray(ranks, n as usize, "ranks") }?;
    let mut out = Vec::with_capacity(r.len());
    for &x in r {
        if x < 0 || x as usize >= g.len() {
            return err(
                MPI_ERR_RANK,
                format!("rank {x} is not in the group of size {}", g.len()),
            );
        }
        if out.contains(&(x as usize)) {
            return err(MPI_ERR_RANK, format!("rank {x} is listed twice"));
        }
        out.push(x as usize);
    }
    Ok(out)
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Group_incl(
    g: MPI_Group,
    n: c_int,
    ranks: *const c_int,
    new: *mut MPI_Group,
) -> c_int {
    call("MPI_Group_incl", MPI_COMM_WORLD, || {
        let gr = group(g)?;
        let sel = ranks_in(&gr, n, ranks)?;
        put(
            new,
            add_group(sel.iter().map(|&r| gr[r]).collect())?,
            "newgroup",
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Group_excl(
    g: MPI_Group,
    n: c_int,
    ranks: *const c_int,
    new: *mut MPI_Group,
) -> c_int {
    call("MPI_Group_excl", MPI_COMM_WORLD, || {
        let gr = group(g)?;
        let sel = ranks_in(&gr, n, ranks)?;
        let kept = (0..gr.len())
            .filter(|r| !sel.contains(r))
            .map(|r| gr[r])
            .collect();
        put(new, add_group(kept)?, "newgroup")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Group_translate_ranks(
    a: MPI_Group,
    n: c_int,
    r1: *const c_int,
    b: MPI_Group,
    r2: *mut c_int,
) -> c_int {
    call("MPI_Group_translate_ranks", MPI_COMM_WORLD, || {
        let (ga, gb) = (group(a)?, group(b)?);
        if n < 0 {
            return err(MPI_ERR_COUNT, format!("n {n} is negative"));
        }
        // SAFETY: an array of `n` ranks (MPI's contract).
        let src = unsafe { carray(r1, n as usize, "ranks1") }?;
        if n > 0 && r2.is_null() {
            return err(MPI_ERR_ARG, "ranks2 is a null pointer");
        }
        for (i, &x) in src.iter().enumerate() {
            let t = if x == MPI_PROC_NULL {
                MPI_PROC_NULL
            } else if x < 0 || x as usize >= ga.len() {
                return err(
                    MPI_ERR_RANK,
                    format!("rank {x} is not in the group of size {}", ga.len()),
                );
            } else {
                gb.iter()
                    .position(|&w| w == ga[x as usize])
                    .map_or(MPI_UNDEFINED, |p| p as c_int)
            };
            // SAFETY: `ranks2` has room for `n` entries (MPI's contract).
            unsafe { *r2.add(i) = t };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Group_compare(
    a: MPI_Group,
    b: MPI_Group,
    result: *mut c_int,
) -> c_int {
    call("MPI_Group_compare", MPI_COMM_WORLD, || {
        let (ga, gb) = (group(a)?, group(b)?);
        let r = match compare(&ga, &gb) {
            MPI_CONGRUENT => MPI_IDENT,
            x => x,
        };
        put(result, r, "result")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Group_free(g: *mut MPI_Group) -> c_int {
    call("MPI_Group_free", MPI_COMM_WORLD, || {
        if g.is_null() {
            return err(MPI_ERR_ARG, "group is a null pointer");
        }
        // SAFETY: checked non-null (MPI's contract).
        let h = unsafe { *g };
        if h != MPI_GROUP_EMPTY {
            with(
                |st| match index(h, GROUP_DYN).and_then(|i| st.groups.get_mut(i)) {
                    Some(slot @ Some(_)) => {
                        *slot = None;
                        Ok(())
                    }
                    _ => err(MPI_ERR_GROUP, format!("invalid group handle {h:#x}")),
                },
            )?;
        }
        put(g, MPI_GROUP_NULL, "group")
    })
}

/// MPI_Comm_create: a split of `comm` where the members of `group` get
/// one color, ranked in the group's order, and the others none.
#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_create(
    comm: MPI_Comm,
    g: MPI_Group,
    new: *mut MPI_Comm,
) -> c_int {
    call("MPI_Comm_create", comm, || {
        let c = state::comm(comm)?;
        let gr = group(g)?;
        if new.is_null() {
            return err(MPI_ERR_ARG, "newcomm is a null pointer");
        }
        let m: Vec<usize> = (0..c.size()).filter_map(|r| c.world_rank(r)).collect();
        if let Some(w) = gr.iter().find(|w| !m.contains(w)) {
            return err(
                MPI_ERR_GROUP,
                format!("world rank {w} of the group is not in the communicator"),
            );
        }
        let me = c.world_rank(c.rank()).unwrap_or(usize::MAX);
        let (color, key) = match gr.iter().position(|&w| w == me) {
            // Disjoint groups (each rank passing its own, as MPI allows)
            // get a color each: their lowest member.
            Some(p) => (*gr.iter().min().unwrap_or(&0) as c_int, p as c_int),
            None => (ibcoll::UNDEFINED, 0),
        };
        let n = c.split(color, key)?;
        put(new, register(n, comm)?, "newcomm")
    })
}

// ---------------------------------------------------------------- attributes

/// The predefined attributes' values (attributes are pointers to these).
static TAG_UB_VALUE: c_int = i32::MAX;
static NO_HOST: c_int = MPI_PROC_NULL;
static IO_ANY: c_int = -2; // MPI_ANY_SOURCE: every rank can do I/O
static WTIME_LOCAL: c_int = 0;
thread_local! {
    static UNIVERSE: std::cell::Cell<c_int> = const { std::cell::Cell::new(0) };
}
static APPNUM_VALUE: c_int = 0;

unsafe fn get_attr(comm: MPI_Comm, key: c_int, val: *mut c_void, flag: *mut c_int) -> R<()> {
    let c = state::comm(comm)?;
    let p: *const c_int = match key {
        MPI_TAG_UB => &TAG_UB_VALUE,
        MPI_HOST => &NO_HOST,
        MPI_IO => &IO_ANY,
        MPI_WTIME_IS_GLOBAL => &WTIME_LOCAL,
        MPI_UNIVERSE_SIZE => {
            UNIVERSE.with(|u| u.set(c.size() as c_int));
            UNIVERSE.with(|u| u.as_ptr())
        }
        MPI_APPNUM => &APPNUM_VALUE,
        _ => return put(flag, 0, "flag"),
    };
    put(val as *mut *const c_int, p, "attribute_val")?;
    put(flag, 1, "flag")
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_get_attr(
    comm: MPI_Comm,
    key: c_int,
    val: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Comm_get_attr", comm, || unsafe {
        get_attr(comm, key, val, flag)
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Attr_get(
    comm: MPI_Comm,
    key: c_int,
    val: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    // SAFETY: MPI's contract, passed on.
    call("MPI_Attr_get", comm, || unsafe {
        get_attr(comm, key, val, flag)
    })
}

// ---------------------------------------------------------------- error handlers

fn set_errh(comm: MPI_Comm, h: MPI_Errhandler) -> R<()> {
    match h {
        MPI_ERRORS_ARE_FATAL | MPI_ERRORS_RETURN | MPI_ERRORS_ABORT => {}
        _ => {
            return err(
                MPI_ERR_ARG,
                format!("error handler {h:#x}: only MPI_ERRORS_ARE_FATAL, MPI_ERRORS_ABORT and MPI_ERRORS_RETURN are supported"),
            )
        }
    }
    with(|st| {
        let i = match comm {
            MPI_COMM_WORLD => Some(0),
            MPI_COMM_SELF => Some(1),
            _ => index(comm, COMM_DYN),
        };
        match i.and_then(|i| st.comms.get_mut(i)).and_then(|e| e.as_mut()) {
            Some(e) => {
                e.errh = h;
                Ok(())
            }
            None => state::bad_comm(comm),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_set_errhandler(comm: MPI_Comm, h: MPI_Errhandler) -> c_int {
    call("MPI_Comm_set_errhandler", comm, || set_errh(comm, h))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Errhandler_set(comm: MPI_Comm, h: MPI_Errhandler) -> c_int {
    call("MPI_Errhandler_set", comm, || set_errh(comm, h))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_get_errhandler(comm: MPI_Comm, h: *mut MPI_Errhandler) -> c_int {
    call("MPI_Comm_get_errhandler", comm, || {
        state::comm(comm)?;
        put(h, errh_of(comm), "errhandler")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Errhandler_free(h: *mut MPI_Errhandler) -> c_int {
    call("MPI_Errhandler_free", MPI_COMM_WORLD, || {
        put(h, MPI_ERRHANDLER_NULL, "errhandler")
    })
}
