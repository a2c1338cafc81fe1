//! The library's state: the tables behind the handles, in one static
//! owned by the thread that called `MPI_Init`.
//!
//! Why not a thread-local: in a shared library every thread-local access
//! is a call to `__tls_get_addr` (with Rust's lazy-init check around it),
//! paid on every MPI call. The static costs one compare of the caller's
//! thread pointer (a register read) with the owner's.
//!
//! Every access is a short borrow that never spans a call into ibcoll
//! that may run user code: entries are `Rc`s cloned out, or requests'
//! operations taken out of their slot while they are waited for or tested,
//! so that a user reduction may call back in (posting a nonblocking send
//! or receive runs none: the fast paths hold the state meanwhile).

use std::cell::{OnceCell, Ref, RefCell, RefMut};
use std::os::raw::c_int;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use ibcoll::ops::ByteReduce;
use ibcoll::{Comm, Scope};

use crate::abi::*;
use crate::datatype::TypeInfo;
use crate::error::{err, R};
use crate::requests::Requests;

/// Not yet initialized, running, finalized.
pub static PHASE: AtomicU8 = AtomicU8::new(0);
pub const RUNNING: u8 = 1;
pub const FINALIZED: u8 = 2;

pub struct CommEntry {
    pub comm: Rc<Comm>,
    pub errh: MPI_Errhandler,
    pub name: String,
}

pub struct UserOp {
    pub f:
        unsafe extern "C" fn(*mut libc::c_void, *mut libc::c_void, *mut c_int, *mut MPI_Datatype),
    pub commute: bool,
}

pub struct State {
    pub world: Rc<Comm>,
    pub comms: Vec<Option<CommEntry>>,
    pub groups: Vec<Option<Rc<[usize]>>>,
    pub types: Vec<Option<Rc<TypeInfo>>>,
    pub ops: Vec<Option<UserOp>>,
    pub reqs: Requests,
    /// ibcoll's static scope, where every nonblocking operation of this
    /// library is started: the owning thread's (`ibcoll::static_scope` is a
    /// thread-local, a `__tls_get_addr` call per access in a shared
    /// library), kept here by `install`, which runs on that thread.
    pub scope: &'static Scope<'static, 'static>,
    /// Reduction kernels by (operation, element kind), made once.
    pub kernels: std::collections::HashMap<(c_int, c_int), ByteReduce>,
    /// Counts and displacements in bytes for the v-collectives (reused:
    /// no allocation per call once grown).
    pub scratch: [Vec<usize>; 4],
}

/// The state and the thread allowed to touch it.
pub struct Global {
    /// [`thread_id`] of the thread that called `MPI_Init`; 0 before.
    owner: AtomicUsize,
    state: RefCell<Option<State>>,
    /// Kernels of the predefined operations by (operation, kind), made on
    /// first use and kept for the life of the process: apart from
    /// `state`, so that a lookup never conflicts with a call that holds
    /// the state. Set once and never taken out, so a reference to one is
    /// good for as long as the static (no guard, no reference count).
    pub builtin: [OnceCell<ByteReduce>; BUILTIN_SLOTS],
}

/// Slots of [`Global::builtin`]: 16 operations by 32 element kinds.
pub const BUILTIN_SLOTS: usize = 16 * 32;

// SAFETY: the `RefCell`, the `OnceCell`s (and the `Rc`s and the
// reference to the owner's static scope inside, which are neither `Send`
// nor `Sync`) are only reached through `Global::get`, which hands them out
// only to the thread whose thread pointer is `owner`: the one that called
// `MPI_Init` and won [`claim`]'s compare-exchange (one thread ever does;
// `owner` never changes after). MPI_THREAD_FUNNELED: the program promises
// that only it calls MPI; any other thread gets `None` and an MPI error,
// never a reference. A thread pointer is unique among live threads; should
// the owner exit and a new thread get its address, the two never run at
// the same time, so every access is still from one thread at a time, in
// order (thread exit and creation synchronize through the kernel); the
// static scope is leaked by ibcoll, never freed, so its reference stays
// valid after its thread is gone.
unsafe impl Sync for Global {}

pub static G: Global = Global {
    owner: AtomicUsize::new(0),
    state: RefCell::new(None),
    builtin: [const { OnceCell::new() }; BUILTIN_SLOTS],
};

impl Global {
    /// The cells, on the owning thread only.
    #[inline(always)]
    pub fn get(&self) -> Option<&Self> {
        let me = thread_id();
        // Relaxed: `owner` is written once, by the owner itself (a thread
        // sees its own writes); another thread reading a stale 0 or the
        // right value compares unequal to its own id either way.
        (self.owner.load(Ordering::Relaxed) == me).then_some(self)
    }
}

/// The calling thread's thread pointer: unique among live threads, read
/// from a register (no call, no memory access beyond the TCB's first
/// word).
#[inline(always)]
fn thread_id() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let v: usize;
        // SAFETY: on x86-64 Linux (glibc and musl) `%fs` is the thread
        // control block, whose first word points to itself; reading it
        // has no side effect.
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) v,
                options(nostack, readonly, preserves_flags, pure));
        }
        v
    }
    #[cfg(all(target_arch = "aarch64", target_os = "linux"))]
    {
        let v: usize;
        // SAFETY: reading the thread pointer register has no side effect.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) v,
                options(nostack, nomem, preserves_flags, pure));
        }
        v
    }
    #[cfg(not(any(
        all(target_arch = "x86_64", target_os = "linux"),
        all(target_arch = "aarch64", target_os = "linux")
    )))]
    {
        thread_local! {
            static ME: u8 = const { 0 };
        }
        ME.with(|m| m as *const u8 as usize)
    }
}

pub fn is_main() -> bool {
    G.get().is_some()
}

/// Runs `f` on the state (a short borrow).
#[inline(always)]
pub fn with<T>(f: impl FnOnce(&mut State) -> R<T>) -> R<T> {
    let Some(g) = G.get() else {
        return not_running();
    };
    match g.state.try_borrow_mut() {
        Ok(mut s) => match s.as_mut() {
            Some(st) => f(st),
            None => not_running(),
        },
        Err(_) => reentered(),
    }
}

#[cold]
fn reentered<T>() -> R<T> {
    err(MPI_ERR_INTERN, "the MPI library was re-entered while busy")
}

/// Runs `f` on the state borrowed shared (for queries while a blocking
/// call may hold it shared too).
#[inline(always)]
fn with_ref<T>(f: impl FnOnce(Option<&State>) -> T) -> T {
    match G.get().map(|g| g.state.try_borrow()) {
        Some(Ok(s)) => f(s.as_ref()),
        _ => f(None),
    }
}

#[cold]
fn not_running<T>() -> R<T> {
    match PHASE.load(Ordering::Relaxed) {
        0 => err(MPI_ERR_OTHER, "MPI_Init has not been called"),
        FINALIZED => err(MPI_ERR_OTHER, "called after MPI_Finalize"),
        _ => err(
            MPI_ERR_OTHER,
            "called from a thread other than the one that called MPI_Init \
             (ibcoll provides MPI_THREAD_FUNNELED)",
        ),
    }
}

/// Makes the calling thread the owner of the state (at `MPI_Init`, before
/// anything else): exactly one thread ever succeeds, so no two threads
/// can both pass [`Global::get`].
pub fn claim() -> R<()> {
    let me = thread_id();
    match G
        .owner
        .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
    {
        Ok(_) => Ok(()),
        Err(o) if o == me => err(
            MPI_ERR_OTHER,
            "MPI_Init was called twice (or after MPI_Finalize)",
        ),
        Err(_) => err(
            MPI_ERR_OTHER,
            "MPI_Init was called by a second thread (ibcoll provides MPI_THREAD_FUNNELED)",
        ),
    }
}

/// Fills the state (the caller has [`claim`]ed it).
pub fn install(world: Comm) {
    let world = Rc::new(world);
    let me = Rc::new(world.self_comm());
    let st = State {
        comms: vec![
            Some(CommEntry {
                comm: world.clone(),
                errh: MPI_ERRORS_ARE_FATAL,
                name: "MPI_COMM_WORLD".into(),
            }),
            Some(CommEntry {
                comm: me,
                errh: MPI_ERRORS_ARE_FATAL,
                name: "MPI_COMM_SELF".into(),
            }),
        ],
        world,
        groups: Vec::new(),
        types: Vec::new(),
        ops: Vec::new(),
        reqs: Requests::default(),
        scope: ibcoll::static_scope(),
        kernels: Default::default(),
        scratch: Default::default(),
    };
    let g = G.get().expect("MPI_Init claimed the state for this thread");
    WORLD_RANK.store(st.world.rank(), Ordering::Relaxed);
    *g.state.borrow_mut() = Some(st);
    PHASE.store(RUNNING, Ordering::SeqCst);
}

/// The state, taken out at `MPI_Finalize` (the owner keeps the empty
/// cells: MPI_Finalized and the error paths still read them).
pub fn take() -> Option<State> {
    let st = G.get().and_then(|g| g.state.borrow_mut().take());
    if st.is_some() {
        WORLD_RANK.store(usize::MAX, Ordering::Relaxed);
    }
    st
}

/// Index in `State::comms` of communicator handle `h`.
#[inline(always)]
fn comm_index(h: MPI_Comm) -> Option<usize> {
    match h {
        MPI_COMM_WORLD => Some(0),
        MPI_COMM_SELF => Some(1),
        _ => index(h, COMM_DYN),
    }
}

/// Table index of handle `h` of kind `kind`.
#[inline(always)]
pub fn index(h: c_int, kind: c_int) -> Option<usize> {
    if h & KIND_MASK == kind {
        Some((h & INDEX_MASK) as usize)
    } else {
        None
    }
}

impl State {
    /// The communicator behind `h` (`MPI_COMM_WORLD` without a table
    /// look-up: it is `world`).
    #[inline(always)]
    pub fn comm_of(&self, h: MPI_Comm) -> Option<&Comm> {
        if h == MPI_COMM_WORLD {
            return Some(&self.world);
        }
        self.comm_slot(h).map(|e| &*e.comm)
    }

    #[inline(always)]
    pub fn comm_slot(&self, h: MPI_Comm) -> Option<&CommEntry> {
        self.comms.get(comm_index(h)?)?.as_ref()
    }

    /// The communicator behind `h`, the static scope and the request
    /// table at once (disjoint borrows of the state): what a nonblocking
    /// call's fast path needs to start its operation and register it.
    #[inline(always)]
    pub fn poster(
        &mut self,
        h: MPI_Comm,
    ) -> Option<(&Comm, &'static Scope<'static, 'static>, &mut Requests)> {
        let c: &Comm = if h == MPI_COMM_WORLD {
            &self.world
        } else {
            &self.comms.get(comm_index(h)?)?.as_ref()?.comm
        };
        Some((c, self.scope, &mut self.reqs))
    }

    pub fn add_comm(&mut self, c: Comm, errh: MPI_Errhandler) -> MPI_Comm {
        let e = CommEntry {
            comm: Rc::new(c),
            errh,
            name: String::new(),
        };
        let i = match self.comms.iter().skip(2).position(|c| c.is_none()) {
            Some(p) => p + 2,
            None => {
                self.comms.push(None);
                self.comms.len() - 1
            }
        };
        self.comms[i] = Some(e);
        COMM_DYN | i as c_int
    }
}

/// Runs `f` on the communicator behind `h` while the state is borrowed
/// (shared): for blocking calls that run no user code (no reduction of
/// the program's), so nothing can need the state mutably meanwhile. Saves
/// the reference count of [`comm`].
#[inline(always)]
pub fn with_comm<T>(h: MPI_Comm, f: impl FnOnce(&Comm) -> R<T>) -> R<T> {
    let c = comm_ref(h)?;
    f(&c)
}

/// The communicator behind `h`, borrowed from the state (shared) for as
/// long as the guard lives: the blocking calls' way (see [`with_comm`]),
/// straight-line code with no closure.
#[inline(always)]
pub fn comm_ref(h: MPI_Comm) -> R<Ref<'static, Comm>> {
    let Some(g) = G.get() else {
        return not_running();
    };
    let Ok(s) = g.state.try_borrow() else {
        return reentered();
    };
    match Ref::filter_map(s, |s| s.as_ref()?.comm_of(h)) {
        Ok(c) => Ok(c),
        Err(s) => {
            let running = s.is_some();
            drop(s);
            if running {
                bad_comm(h)
            } else {
                not_running()
            }
        }
    }
}

/// [`comm_ref`] for the blocking calls' fast paths: `None` for anything
/// but a valid communicator on the owning thread while the library runs
/// (the caller then takes its slow path, which says what is wrong). A
/// handful of instructions: the owner check, the borrow, one compare for
/// `MPI_COMM_WORLD`.
#[inline(always)]
pub fn comm_fast(h: MPI_Comm) -> Option<Ref<'static, Comm>> {
    G.get()?.comm_fast(h)
}

impl Global {
    /// The running state, borrowed mutably: the nonblocking calls' fast
    /// paths, on the `&Global` that [`Global::get`] returned only. `None`
    /// while it is borrowed or the library is not running (the caller then
    /// takes its slow path, which says so).
    #[inline(always)]
    pub fn state_fast(&'static self) -> Option<RefMut<'static, State>> {
        let s = self.state.try_borrow_mut().ok()?;
        RefMut::filter_map(s, |s| s.as_mut()).ok()
    }

    /// [`Global::state_fast`]'s request table alone.
    #[inline(always)]
    pub fn reqs_fast(&'static self) -> Option<RefMut<'static, Requests>> {
        let s = self.state.try_borrow_mut().ok()?;
        RefMut::filter_map(s, |s| s.as_mut().map(|s| &mut s.reqs)).ok()
    }

    /// [`comm_fast`] for a caller that has the cells already (one owner
    /// check for several look-ups): on the `&Global` that [`Global::get`]
    /// returned only, like every access to the cells (see `unsafe impl
    /// Sync`).
    #[inline(always)]
    pub fn comm_fast(&'static self, h: MPI_Comm) -> Option<Ref<'static, Comm>> {
        let s = self.state.try_borrow().ok()?;
        Ref::filter_map(s, |s| s.as_ref()?.comm_of(h)).ok()
    }
}

/// The communicator behind handle `h`.
#[inline(always)]
pub fn comm(h: MPI_Comm) -> R<Rc<Comm>> {
    with(|st| match st.comm_slot(h) {
        Some(e) => Ok(e.comm.clone()),
        None => bad_comm(h),
    })
}

#[cold]
pub fn bad_comm<T>(h: MPI_Comm) -> R<T> {
    if h == MPI_COMM_NULL {
        err(MPI_ERR_COMM, "communicator is MPI_COMM_NULL")
    } else {
        err(MPI_ERR_COMM, format!("invalid communicator handle {h:#x}"))
    }
}

/// The error handler of communicator `h` (world's for an invalid one).
pub fn errhandler(h: MPI_Comm) -> MPI_Errhandler {
    with_ref(|st| match st {
        Some(st) => st
            .comm_slot(h)
            .or_else(|| st.comm_slot(MPI_COMM_WORLD))
            .map_or(MPI_ERRORS_ARE_FATAL, |e| e.errh),
        None => MPI_ERRORS_ARE_FATAL,
    })
}

/// This process's world rank, while the library runs (from any thread:
/// error messages of refused calls name it too).
pub fn world_rank() -> Option<usize> {
    match WORLD_RANK.load(Ordering::Relaxed) {
        usize::MAX => None,
        r => Some(r),
    }
}

/// Set at `MPI_Init`; `usize::MAX` before and after the library runs.
static WORLD_RANK: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Ends the job: through the process manager (ibrun reports the rank),
/// or by exiting when there is no job.
pub fn abort_job(code: c_int, msg: &str) -> ! {
    let world = with_ref(|st| st.map(|st| st.world.clone()));
    match world {
        Some(w) => w.abort(code, msg),
        None => {
            eprintln!("ibcoll MPI: {msg}");
            std::process::exit(if code == 0 { 1 } else { code })
        }
    }
}
