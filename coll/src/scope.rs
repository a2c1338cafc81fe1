//! Scopes: why a nonblocking operation can never touch memory the program
//! no longer owns.
//!
//! Every nonblocking call (`isend`, `irecv`, `ibcast`, `iallreduce`, ...)
//! takes a [`Scope`] and borrows its buffers for the scope's whole
//! lifetime `'scope`. The scope is opened by [`scope`], which runs a
//! closure and, when the closure returns **or panics**, finishes every
//! operation of the scope that is still outstanding before it returns
//! itself. The buffers outlive the scope (the borrow checker sees to
//! that), so whatever the program does with the requests — waits for
//! them, drops them, `mem::forget`s them, leaks them in an `Rc` cycle or
//! with `Box::leak` — the engine is done with a buffer before the buffer
//! can be freed, moved or touched again. This is the design of
//! `std::thread::scope` and of rsmpi's `request::scope`; the guarantee
//! rests on the scope's own frame, not on a destructor of a handle the
//! program holds.
//!
//! ```
//! # fn main() -> ibcoll::Result<()> {
//! let world = ibcoll::init()?;
//! let (rank, size) = (world.rank(), world.size());
//! let right = (rank + 1) % size;
//! let left = (rank + size - 1) % size;
//! let mine = [rank as u64; 4];
//! let mut from_left = [0u64; 4];
//! let mut sum = [0u64];
//! ibcoll::scope(|s| {
//!     let r = world.irecv(s, &mut from_left, left, 0)?;
//!     let w = world.isend(s, &mine, right, 0)?;
//!     let a = world.iallreduce(s, &mine[..1], &mut sum, ibcoll::ReduceOp::Sum)?;
//!     r.wait()?;
//!     w.wait()?;
//!     a.wait()
//! })?;
//! assert_eq!(from_left, [left as u64; 4]);
//! # Ok(())
//! # }
//! ```
//!
//! Buffers made inside the scope cannot be used (they do not live for
//! `'scope`), and a buffer stays borrowed until the scope ends, even after
//! its request completed; a loop that reuses buffers opens one scope per
//! iteration. At the end of a scope that ends normally, an operation whose
//! request was forgotten is waited for (a receive that no message will
//! ever match waits like `MPI_Wait` would; a dead peer ends it with an
//! error), and its outcome is dropped. At the end of a scope left by a
//! panic, receives not matched yet are withdrawn, sends not streaming yet
//! go on from a private copy, and only data already moving is waited for
//! (it ends or fails within the engine's bounds), so a panic does not wait
//! on the peers.
//!
//! [`static_scope`] is a scope that never ends, for buffers that live
//! forever (`'static`: leaked, in a `static`, or owned by code that hands
//! ibcoll a `'static` view under its own `unsafe` contract, as an MPI C
//! interface does).
//!
//! Threading: a scope, like every ibcoll handle, belongs to the thread that
//! called [`crate::init`] (it is neither `Send` nor `Sync`).
//!
//! # What the compiler refuses
//!
//! Forgetting a request is allowed; the buffer is safe because the scope
//! waits (here a message to oneself completes the receive):
//!
//! ```
//! let world = ibcoll::init().unwrap();
//! let mut v = vec![0u8; 4096];
//! ibcoll::scope(|s| {
//!     std::mem::forget(world.irecv(s, &mut v, 0, 0).unwrap());
//!     world.send(&[0xABu8; 4096], 0, 0).unwrap();
//! });
//! drop(v); // the scope has finished the receive
//! let fresh = vec![7u8; 4096];
//! assert!(fresh.iter().all(|&b| b == 7));
//! ```
//!
//! Dropping, moving or touching the buffer while the scope lasts is not:
//!
//! ```compile_fail,E0505
//! let world = ibcoll::init().unwrap();
//! let mut v = vec![0u8; 4096];
//! ibcoll::scope(|s| {
//!     std::mem::forget(world.irecv(s, &mut v, 0, 0).unwrap());
//!     drop(v); // freed while the engine may still write into it
//! });
//! ```
//!
//! ```compile_fail,E0505
//! let world = ibcoll::init().unwrap();
//! let mut v = vec![0u8; 4096];
//! ibcoll::scope(|s| {
//!     let _r = world.irecv(s, &mut v, 0, 0).unwrap();
//!     let _moved = v;
//! });
//! ```
//!
//! ```compile_fail,E0499
//! let world = ibcoll::init().unwrap();
//! let mut v = vec![0u8; 4096];
//! ibcoll::scope(|s| {
//!     let r = world.irecv(s, &mut v, 0, 0).unwrap();
//!     v[0] = 1; // the receive may be writing it
//!     drop(r);
//! });
//! ```
//!
//! A completed request does not end the borrow either (only the scope
//! does):
//!
//! ```compile_fail,E0499
//! let world = ibcoll::init().unwrap();
//! let mut v = vec![0u8; 8];
//! ibcoll::scope(|s| {
//!     let r = world.irecv(s, &mut v, 0, 0).unwrap();
//!     world.send(&[1u8; 8], 0, 0).unwrap();
//!     r.wait().unwrap();
//!     v[0] = 2;
//! });
//! ```
//!
//! A send buffer may be read meanwhile, but not written:
//!
//! ```compile_fail,E0506
//! let world = ibcoll::init().unwrap();
//! let mut v = [0u8; 8];
//! ibcoll::scope(|s| {
//!     let r = world.isend(s, &v, 0, 0).unwrap();
//!     v[0] = 1;
//!     drop(r);
//! });
//! ```
//!
//! The same holds for every nonblocking collective:
//!
//! ```compile_fail,E0506
//! let world = ibcoll::init().unwrap();
//! let (mut x, mut y) = ([1u64], [0u64]);
//! ibcoll::scope(|s| {
//!     let r = world.iallreduce(s, &x, &mut y, ibcoll::ReduceOp::Sum).unwrap();
//!     x[0] = 2;
//!     drop(r);
//! });
//! ```
//!
//! A buffer made inside the scope does not live long enough:
//!
//! ```compile_fail,E0597
//! let world = ibcoll::init().unwrap();
//! ibcoll::scope(|s| {
//!     let mut w = vec![0u8; 8];
//!     std::mem::forget(world.irecv(s, &mut w, 0, 0).unwrap());
//! });
//! ```
//!
//! and no request can leave its scope:
//!
//! ```compile_fail
//! let world = ibcoll::init().unwrap();
//! let mut v = vec![0u8; 8];
//! let r = ibcoll::scope(|s| world.irecv(s, &mut v, 0, 0).unwrap());
//! drop(v);
//! r.wait().unwrap();
//! ```
//!
//! The static scope takes only buffers that live forever:
//!
//! ```compile_fail,E0597
//! let world = ibcoll::init().unwrap();
//! let mut v = vec![0u8; 8];
//! let r = world.irecv(ibcoll::static_scope(), &mut v, 0, 0).unwrap();
//! ```
//!
//! ```
//! let world = ibcoll::init().unwrap();
//! let v: &'static mut [u8] = Box::leak(vec![0u8; 8].into_boxed_slice());
//! std::mem::forget(world.irecv(ibcoll::static_scope(), v, 0, 0).unwrap());
//! world.send(&[3u8; 8], 0, 0).unwrap(); // lands in the leaked buffer
//! ```

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::{Rc, Weak};

use crate::engine::cell::EngineCell;
use crate::engine::ops::Token;
use crate::engine::Engine;
use crate::schedule::run::{self, Run};

/// Where the nonblocking operations of one [`scope`] are tracked; see the
/// module documentation. `'scope` is the lifetime of the scope (every
/// buffer of its operations is borrowed for it), `'env` that of what the
/// scope borrows from outside.
pub struct Scope<'scope, 'env: 'scope> {
    inner: RefCell<Inner>,
    /// The static scope: it never ends, so nothing it would track is ever
    /// waited for through it (its buffers live forever); tracking is
    /// skipped (one list push and a periodic compaction per operation).
    forever: bool,
    /// Invariant in both, as `std::thread::Scope`: a scope cannot be made
    /// to look shorter or longer than it is.
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

struct Inner {
    /// The process's engine, set by the first operation (weak: the last
    /// communicator's drop finalizes it, settling every operation).
    eng: Option<Weak<EngineCell>>,
    /// Operations that may still be outstanding (entries of finished ones
    /// are dropped when the list is compacted).
    list: Vec<Pending>,
    /// Length at which the list is compacted next.
    compact_at: usize,
}

enum Pending {
    /// A point-to-point operation of the engine.
    Op(Token),
    /// A nonblocking collective.
    Coll(Rc<RefCell<Run>>),
}

/// Entries kept before the first compaction.
const COMPACT_MIN: usize = 64;

/// Runs `f` with a new scope and finishes every operation started in it
/// before returning `f`'s result (see the module documentation). A panic
/// of `f` is resumed once the scope's operations are finished or safely
/// let go of.
pub fn scope<'env, F, R>(f: F) -> R
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
{
    let s = Scope::new();
    // The guard ends the scope on the way out, whether `f` returns or
    // unwinds; its frame is ours, so nothing the program does can skip it.
    struct End<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);
    impl Drop for End<'_, '_, '_> {
        fn drop(&mut self) {
            self.0.end(std::thread::panicking());
        }
    }
    let end = End(&s);
    let r = f(&s);
    drop(end);
    r
}

thread_local! {
    static FOREVER: &'static Scope<'static, 'static> = Box::leak(Box::new(Scope {
        forever: true,
        ..Scope::new()
    }));
}

/// The scope that never ends, for `'static` buffers: its operations are
/// never waited for by the scope (the program waits, tests, or leaves
/// them), and that is sound because their buffers are never freed.
pub fn static_scope() -> &'static Scope<'static, 'static> {
    FOREVER.with(|s| *s)
}

impl Scope<'_, '_> {
    fn new() -> Self {
        Scope {
            inner: RefCell::new(Inner {
                eng: None,
                list: Vec::new(),
                compact_at: COMPACT_MIN,
            }),
            _scope: PhantomData,
            _env: PhantomData,
            forever: false,
        }
    }

    /// Tracks point-to-point operation `tok` of `eng`.
    pub(crate) fn track_op(&self, eng: &Rc<EngineCell>, tok: Token) {
        self.track(eng, Pending::Op(tok));
    }

    /// Tracks nonblocking collective `run` of `eng`.
    pub(crate) fn track_coll(&self, eng: &Rc<EngineCell>, run: &Rc<RefCell<Run>>) {
        self.track(eng, Pending::Coll(run.clone()));
    }

    #[inline]
    fn track(&self, eng: &Rc<EngineCell>, p: Pending) {
        if self.forever {
            return;
        }
        self.track_in_list(eng, p);
    }

    #[inline(never)]
    fn track_in_list(&self, eng: &Rc<EngineCell>, p: Pending) {
        let mut i = self.inner.borrow_mut();
        if i.eng.is_none() {
            i.eng = Some(Rc::downgrade(eng));
        }
        if i.list.len() >= i.compact_at {
            // Amortized: the list is walked once per doubling, so a scope
            // (the static one above all) holds only what is outstanding.
            if let Some(e) = eng.try_borrow_mut() {
                i.list.retain(|p| match p {
                    Pending::Op(t) => e.st.ops.get(*t).is_some(),
                    Pending::Coll(r) => !r.borrow().is_done(),
                });
            }
            i.compact_at = (2 * i.list.len()).max(COMPACT_MIN);
        }
        i.list.push(p);
    }

    /// Finishes every operation still outstanding: waits for them, or,
    /// while unwinding, lets go of what can be let go of safely and waits
    /// only for data already moving.
    fn end(&self, unwinding: bool) {
        let (eng, list) = {
            let mut i = self.inner.borrow_mut();
            (i.eng.take(), std::mem::take(&mut i.list))
        };
        // No engine any more: it settled every operation when the last
        // communicator was dropped.
        let Some(eng) = eng.and_then(|w| w.upgrade()) else {
            return;
        };
        let Some(mut e) = eng.try_borrow_mut() else {
            // Only a scope ended from inside a reduction operation gets
            // here; its operations may still be writing into its buffers.
            eprintln!(
                "ibcoll: a scope ended while ibcoll was busy with another call (from inside a \
                 reduction operation); its operations cannot be finished, aborting the process"
            );
            std::process::abort();
        };
        let mut panic = None;
        for p in list {
            match p {
                Pending::Op(t) => finish_op(&mut e, t, unwinding),
                Pending::Coll(r) => {
                    if unwinding {
                        r.borrow_mut().cancel(&mut e);
                    }
                    run::drive(&mut e, &r);
                    run::unregister(&r);
                    if let Some(x) = r.borrow_mut().take_panic() {
                        panic.get_or_insert(x);
                    }
                }
            }
        }
        drop(e);
        // A reduction that panicked in a collective whose request was
        // forgotten: the panic is the program's, now that nothing points
        // into its buffers any more.
        if let Some(p) = panic {
            if !unwinding {
                std::panic::resume_unwind(p);
            }
        }
    }
}

/// Waits for point-to-point operation `t` (or lets go of it, see
/// [`Scope::end`]) and drops its outcome.
fn finish_op(e: &mut Engine, t: Token, unwinding: bool) {
    if e.st.ops.get(t).is_none() {
        // Taken by its request already (most entries).
        return;
    }
    if unwinding && e.abandon(t).is_some() {
        return;
    }
    if !e.is_done(t) {
        e.wait_until(|e| e.is_done(t));
    }
    let _ = e.take_result(t);
}
