//! The library's state: the tables behind the handles, kept in the local
//! storage of the thread that called `MPI_Init`.
//!
//! Every access is a short borrow that never spans a call into ibcoll:
//! entries are `Rc`s cloned out, or requests taken out of their slot while
//! they are waited for, so that a user reduction may call back in.

use std::cell::{Cell, RefCell};
use std::os::raw::c_int;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};

use ibcoll::ops::ByteReduce;
use ibcoll::Comm;

use crate::abi::*;
use crate::datatype::TypeInfo;
use crate::error::{err, R};
use crate::requests::ReqEntry;

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
    pub reqs: Vec<Option<ReqEntry>>,
    pub free_reqs: Vec<usize>,
    /// Requests freed while pending (`MPI_Request_free`): finished at
    /// `MPI_Finalize` if not before.
    pub detached: Vec<ReqEntry>,
    /// Reduction kernels by (operation, element kind), made once.
    pub kernels: std::collections::HashMap<(c_int, c_int), ByteReduce>,
    /// Counts and displacements in bytes for the v-collectives (reused:
    /// no allocation per call once grown).
    pub scratch: [Vec<usize>; 4],
}

thread_local! {
    pub static ST: RefCell<Option<State>> = const { RefCell::new(None) };
    static MAIN: Cell<bool> = const { Cell::new(false) };
}

pub fn is_main() -> bool {
    MAIN.with(|m| m.get())
}

/// Runs `f` on the state (a short borrow).
#[inline(always)]
pub fn with<T>(f: impl FnOnce(&mut State) -> R<T>) -> R<T> {
    ST.with(|s| match s.try_borrow_mut() {
        Ok(mut g) => match g.as_mut() {
            Some(st) => f(st),
            None => not_running(),
        },
        Err(_) => err(MPI_ERR_INTERN, "the MPI library was re-entered while busy"),
    })
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
        reqs: Vec::new(),
        free_reqs: Vec::new(),
        detached: Vec::new(),
        kernels: Default::default(),
        scratch: Default::default(),
    };
    ST.with(|s| *s.borrow_mut() = Some(st));
    MAIN.with(|m| m.set(true));
    PHASE.store(RUNNING, Ordering::SeqCst);
}

/// The state, taken out at `MPI_Finalize`.
pub fn take() -> Option<State> {
    ST.with(|s| s.borrow_mut().take())
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
    #[inline(always)]
    pub fn comm_slot(&self, h: MPI_Comm) -> Option<&CommEntry> {
        let i = match h {
            MPI_COMM_WORLD => 0,
            MPI_COMM_SELF => 1,
            _ => index(h, COMM_DYN)?,
        };
        self.comms.get(i)?.as_ref()
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
    ST.with(|s| match s.try_borrow() {
        Ok(g) => match g.as_ref() {
            Some(st) => match st.comm_slot(h) {
                Some(e) => f(&e.comm),
                None => bad_comm(h),
            },
            None => not_running(),
        },
        Err(_) => err(MPI_ERR_INTERN, "the MPI library was re-entered while busy"),
    })
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
    ST.with(|s| match s.try_borrow() {
        Ok(g) => match g.as_ref() {
            Some(st) => st
                .comm_slot(h)
                .or_else(|| st.comm_slot(MPI_COMM_WORLD))
                .map_or(MPI_ERRORS_ARE_FATAL, |e| e.errh),
            None => MPI_ERRORS_ARE_FATAL,
        },
        Err(_) => MPI_ERRORS_ARE_FATAL,
    })
}

/// This process's world rank, while the library runs.
pub fn world_rank() -> Option<usize> {
    ST.with(|s| {
        s.try_borrow()
            .ok()
            .and_then(|g| g.as_ref().map(|st| st.world.rank()))
    })
}

/// Ends the job: through the process manager (ibrun reports the rank),
/// or by exiting when there is no job.
pub fn abort_job(code: c_int, msg: &str) -> ! {
    let world = ST.with(|s| {
        s.try_borrow()
            .ok()
            .and_then(|g| g.as_ref().map(|st| st.world.clone()))
    });
    match world {
        Some(w) => w.abort(code, msg),
        None => {
            eprintln!("ibcoll MPI: {msg}");
            std::process::exit(if code == 0 { 1 } else { code })
        }
    }
}
