//! Errors: every failure becomes an MPI error class and a message naming
//! the rank, the peer where there is one, and the MPI function; the
//! communicator's error handler then aborts the job
//! (`MPI_ERRORS_ARE_FATAL`, the default) or returns the code
//! (`MPI_ERRORS_RETURN`).

use std::cell::RefCell;
use std::os::raw::c_int;

use crate::abi::*;
use crate::state;

/// A failed call: its class and what went wrong. Boxed: every `R<T>` of
/// the hot paths then stays in registers (one word of error).
#[derive(Debug)]
pub struct MpiErr(Box<ErrBody>);

#[derive(Debug)]
pub struct ErrBody {
    pub class: c_int,
    pub msg: String,
}

impl MpiErr {
    #[cold]
    pub fn new(class: c_int, msg: impl Into<String>) -> MpiErr {
        MpiErr(Box::new(ErrBody {
            class,
            msg: msg.into(),
        }))
    }
}

impl std::ops::Deref for MpiErr {
    type Target = ErrBody;
    fn deref(&self) -> &ErrBody {
        &self.0
    }
}

impl std::ops::DerefMut for MpiErr {
    fn deref_mut(&mut self) -> &mut ErrBody {
        &mut self.0
    }
}

pub type R<T> = Result<T, MpiErr>;

#[cold]
pub fn err<T>(class: c_int, msg: impl Into<String>) -> R<T> {
    Err(MpiErr::new(class, msg))
}

impl From<ibcoll::Error> for MpiErr {
    fn from(e: ibcoll::Error) -> MpiErr {
        use ibcoll::Error as E;
        let class = match &e {
            E::Truncated { .. } => MPI_ERR_TRUNCATE,
            E::PeerLost { .. } => MPI_ERR_PROC_ABORTED,
            E::InvalidArgument { .. } => MPI_ERR_ARG,
            E::Protocol { .. } => MPI_ERR_INTERN,
            _ => MPI_ERR_OTHER,
        };
        MpiErr::new(class, e.to_string())
    }
}

/// Messages of the last errors, for `MPI_Error_string`.
const SLOTS: usize = 64;

thread_local! {
    static MESSAGES: RefCell<(usize, Vec<String>)> = const { RefCell::new((0, Vec::new())) };
}

/// The code of `e` (its class and the slot that keeps its message).
fn record(msg: String, class: c_int) -> c_int {
    MESSAGES.with(|m| {
        let mut m = m.borrow_mut();
        let slot = m.0 % SLOTS;
        m.0 += 1;
        if m.1.len() <= slot {
            m.1.push(msg);
        } else {
            m.1[slot] = msg;
        }
        class | (((slot + 1) as c_int) << CODE_SHIFT)
    })
}

/// The message of error code `code`, if it is one this library made.
pub fn message(code: c_int) -> Option<String> {
    let slot = (code >> CODE_SHIFT) as usize;
    if slot == 0 {
        return None;
    }
    MESSAGES.with(|m| m.borrow().1.get(slot - 1).cloned())
}

pub fn class_name(class: c_int) -> &'static str {
    match class {
        MPI_SUCCESS => "no error",
        MPI_ERR_BUFFER => "invalid buffer pointer",
        MPI_ERR_COUNT => "invalid count argument",
        MPI_ERR_TYPE => "invalid datatype",
        MPI_ERR_TAG => "invalid tag",
        MPI_ERR_COMM => "invalid communicator",
        MPI_ERR_RANK => "invalid rank",
        MPI_ERR_ROOT => "invalid root",
        MPI_ERR_GROUP => "invalid group",
        MPI_ERR_OP => "invalid reduce operation",
        MPI_ERR_ARG => "invalid argument",
        MPI_ERR_TRUNCATE => "message truncated",
        MPI_ERR_OTHER => "other error",
        MPI_ERR_INTERN => "internal error",
        MPI_ERR_IN_STATUS => "error code is in status",
        MPI_ERR_PENDING => "pending request",
        MPI_ERR_REQUEST => "invalid request",
        MPI_ERR_NO_MEM => "out of memory",
        MPI_ERR_UNSUPPORTED_OPERATION => "unsupported operation",
        MPI_ERR_PROC_ABORTED => "peer process lost",
        _ => "unknown error",
    }
}

/// Reports failure `e` of MPI function `func` on communicator `comm`
/// (its error handler decides) and gives the code to return.
#[cold]
#[inline(never)]
pub fn fail(func: &str, comm: MPI_Comm, e: MpiErr) -> c_int {
    let rank = state::world_rank();
    let text = if e.msg.starts_with("rank ") {
        format!("{func}: {}", e.msg)
    } else {
        match rank {
            Some(r) => format!("{func}: rank {r}: {}", e.msg),
            None => format!("{func}: {}", e.msg),
        }
    };
    let handler = state::errhandler(comm);
    if handler == MPI_ERRORS_RETURN {
        return record(text, e.class);
    }
    record(text.clone(), e.class);
    state::abort_job(
        e.class.max(1),
        &format!("{text} ({}; MPI_ERRORS_ARE_FATAL)", class_name(e.class)),
    )
}

/// [`fail`] for an error of ibcoll's: the blocking fast paths' one
/// error exit, out of their straight-line code.
#[cold]
#[inline(never)]
pub fn fail_ibcoll(func: &str, comm: MPI_Comm, e: ibcoll::Error) -> c_int {
    fail(func, comm, MpiErr::from(e))
}

/// Runs the body of MPI function `func` on `comm`: its error goes to the
/// communicator's error handler.
#[inline(always)]
pub fn call(func: &str, comm: MPI_Comm, f: impl FnOnce() -> R<()>) -> c_int {
    match f() {
        Ok(()) => MPI_SUCCESS,
        Err(e) => fail(func, comm, e),
    }
}
