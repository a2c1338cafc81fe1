//! The engine's cell: one per process, shared by every communicator,
//! request and scope of the thread that called [`crate::init`].
//!
//! Besides handing out the engine, the cell keeps two promises the safe
//! API rests on:
//! - a panic that starts while the engine is in use (only ibcoll's own code
//!   runs then: user reduction operations catch their panics, see
//!   [`crate::ops::ByteReduce`]) ends the process with a message, because
//!   the engine's state is then unknown while operations may still point
//!   into the unwinding frames;
//! - a call into ibcoll while the engine is in use (from inside a reduction
//!   operation) is refused with a panic that says so, which the operation's
//!   catch turns into a failed collective.

use std::cell::{Ref, RefCell, RefMut};

use super::Engine;

/// The engine of this process, behind the guard described in the module.
pub(crate) struct EngineCell(RefCell<Engine>);

/// The engine, borrowed.
pub(crate) struct EngineMut<'a> {
    e: RefMut<'a, Engine>,
    /// Whether the thread was unwinding already when the borrow began (a
    /// scope or request finishing its operations during a panic).
    unwinding: bool,
}

impl EngineCell {
    pub fn new(e: Engine) -> EngineCell {
        EngineCell(RefCell::new(e))
    }

    /// The engine; panics (with a message saying why) when it is in use
    /// already, which only a call from inside a reduction operation can do.
    #[inline(always)]
    pub fn borrow_mut(&self) -> EngineMut<'_> {
        match self.0.try_borrow_mut() {
            Ok(e) => EngineMut {
                e,
                unwinding: std::thread::panicking(),
            },
            Err(_) => reentered(),
        }
    }

    /// The engine, or `None` while it is in use.
    pub fn try_borrow_mut(&self) -> Option<EngineMut<'_>> {
        let e = self.0.try_borrow_mut().ok()?;
        Some(EngineMut {
            e,
            unwinding: std::thread::panicking(),
        })
    }

    /// The engine for reading (see [`EngineCell::borrow_mut`]).
    #[inline]
    pub fn borrow(&self) -> Ref<'_, Engine> {
        match self.0.try_borrow() {
            Ok(e) => e,
            Err(_) => reentered(),
        }
    }
}

#[cold]
#[inline(never)]
fn reentered() -> ! {
    panic!(
        "ibcoll was called while it was busy with another call: calls from inside a \
         reduction operation (ReduceOp::user) are not allowed"
    )
}

impl std::ops::Deref for EngineMut<'_> {
    type Target = Engine;
    #[inline]
    fn deref(&self) -> &Engine {
        &self.e
    }
}

impl std::ops::DerefMut for EngineMut<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.e
    }
}

impl Drop for EngineMut<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.unwinding && std::thread::panicking() {
            panicked_inside(self.e.rank());
        }
    }
}

/// A panic unwound through the engine: its operations may still be
/// writing into the frames being unwound, so the process cannot go on.
#[cold]
#[inline(never)]
fn panicked_inside(rank: usize) -> ! {
    eprintln!(
        "ibcoll: rank {rank}: a panic inside ibcoll unwound through the engine while \
         operations may be in flight into memory being freed; aborting the process"
    );
    std::process::abort()
}
