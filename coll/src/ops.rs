//! Reduction operations for the reducing collectives.
//!
//! [`ReduceOp`] names the operation; [`Reducible`] is implemented for every
//! numeric [`Datatype`] and applies it. Bitwise and logical operations exist
//! only for integers: asking for them on floats is an
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the
//! collective is called, never a panic.
//!
//! Every operation is treated as commutative *and* applied in a fixed order
//! by each algorithm (the partial result of the lower ranks is always the
//! left operand where two partial results meet), so floating-point results
//! are bit-identical on every rank.

use std::rc::Rc;

use crate::datatype::Datatype;

/// A reduction operation on `T`.
#[derive(Clone)]
pub enum ReduceOp<T> {
    Sum,
    Prod,
    Min,
    Max,
    /// Bitwise and (integers only).
    Band,
    /// Bitwise or (integers only).
    Bor,
    /// Bitwise exclusive or (integers only).
    Bxor,
    /// Logical and: non-zero is true, result 1 or 0 (integers only).
    Land,
    /// Logical or (integers only).
    Lor,
    /// A user-defined operation. It must be associative and commutative;
    /// algorithms call it as `f(lower_ranks_partial, higher_ranks_partial)`.
    User(Rc<dyn Fn(T, T) -> T>),
    /// A user-defined associative operation that need not be commutative
    /// (`MPI_Op_create` with `commute = 0`): called as
    /// `f(lower_ranks_partial, higher_ranks_partial)` and combined in rank
    /// order, `x0 op x1 op ... op x(n-1)`; the algorithms that combine in
    /// another order (around a ring, say) are not used for it.
    Ordered(Rc<dyn Fn(T, T) -> T>),
}

impl<T> ReduceOp<T> {
    /// A user-defined commutative, associative operation.
    pub fn user(f: impl Fn(T, T) -> T + 'static) -> ReduceOp<T> {
        ReduceOp::User(Rc::new(f))
    }

    /// A user-defined associative operation that need not be commutative
    /// ([`ReduceOp::Ordered`]).
    pub fn ordered(f: impl Fn(T, T) -> T + 'static) -> ReduceOp<T> {
        ReduceOp::Ordered(Rc::new(f))
    }

    /// Short name, for messages.
    /// The operation's code in `stamp::OPS` (a call's stamp and
    /// `IBCOLL_CHECK`'s signature carry it).
    #[inline]
    pub(crate) fn code(&self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Prod => 2,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
            ReduceOp::Band => 5,
            ReduceOp::Bor => 6,
            ReduceOp::Bxor => 7,
            ReduceOp::Land => 8,
            ReduceOp::Lor => 9,
            ReduceOp::User(_) => 10,
            ReduceOp::Ordered(_) => 11,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Band => "band",
            ReduceOp::Bor => "bor",
            ReduceOp::Bxor => "bxor",
            ReduceOp::Land => "land",
            ReduceOp::Lor => "lor",
            ReduceOp::User(_) => "user",
            ReduceOp::Ordered(_) => "ordered user",
        }
    }
}

impl<T> std::fmt::Debug for ReduceOp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Element types that reduction operations apply to.
pub trait Reducible: Datatype {
    /// `op(a, b)`, or `None` when `op` does not apply to this type.
    fn combine(op: &ReduceOp<Self>, a: Self, b: Self) -> Option<Self>;
    /// Whether `op` applies to this type.
    fn supports(op: &ReduceOp<Self>) -> bool;
    /// Runs `f` on this type's cached kernel of built-in operation `i`
    /// (see [`byte_reduce`]).
    #[doc(hidden)]
    fn with_kernel<R>(i: usize, f: impl FnOnce(&mut Option<Rc<BuiltinKernel>>) -> R) -> R;
}

/// `Reducible::with_kernel` for one type: its own thread-local slots (a
/// static in a generic function would be shared by every type).
macro_rules! kernel_cache {
    () => {
        fn with_kernel<R>(i: usize, f: impl FnOnce(&mut Option<Rc<BuiltinKernel>>) -> R) -> R {
            thread_local! {
                static K: std::cell::RefCell<[Option<Rc<BuiltinKernel>>; BUILTIN_OPS]> =
                    const { std::cell::RefCell::new([const { None }; BUILTIN_OPS]) };
            }
            K.with(|k| f(&mut k.borrow_mut()[i]))
        }
    };
}

macro_rules! int_reducible {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            #[inline]
            fn combine(op: &ReduceOp<$t>, a: $t, b: $t) -> Option<$t> {
                Some(match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Band => a & b,
                    ReduceOp::Bor => a | b,
                    ReduceOp::Bxor => a ^ b,
                    ReduceOp::Land => ((a != 0) && (b != 0)) as $t,
                    ReduceOp::Lor => ((a != 0) || (b != 0)) as $t,
                    ReduceOp::User(f) | ReduceOp::Ordered(f) => f(a, b),
                })
            }
            fn supports(_: &ReduceOp<$t>) -> bool {
                true
            }
            kernel_cache!();
        }
    )*};
}

macro_rules! float_reducible {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            #[inline]
            fn combine(op: &ReduceOp<$t>, a: $t, b: $t) -> Option<$t> {
                Some(match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::User(f) | ReduceOp::Ordered(f) => f(a, b),
                    _ => return None,
                })
            }
            fn supports(op: &ReduceOp<$t>) -> bool {
                !matches!(
                    op,
                    ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor | ReduceOp::Land | ReduceOp::Lor
                )
            }
            kernel_cache!();
        }
    )*};
}

int_reducible!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize);
float_reducible!(f32, f64);

/// A type-erased reduction over byte buffers: `dst = src (op) dst` when
/// `src_left`, else `dst = dst (op) src`, element-wise. Lengths are equal
/// multiples of the element size (checked by the schedule).
///
/// A user operation that panics does not unwind through the engine (which
/// may have operations in flight into buffers on the unwinding stack):
/// [`ByteReduce::apply`] catches the panic, leaves that destination as it
/// is, and keeps the payload for the collective's caller, who takes it
/// ([`ByteReduce::take_panic`]) once the collective has finished and
/// nothing points into its buffers any more.
#[derive(Clone)]
pub struct ByteReduce(Kern);

/// The operation's and element type's codes (`stamp::OPS`,
/// `stamp::TYPES`) for a call's stamp: `(user, none)` where unknown.
type OpCodes = (u8, u8);

/// One reference either way, so that handing out the cached kernel of a
/// built-in operation (every reducing call does) costs one increment.
#[derive(Clone)]
enum Kern {
    Builtin(Rc<BuiltinKernel>),
    User(Rc<UserKernel>),
}

/// A built-in operation's loop with its and its element type's codes,
/// in one allocation: the codes live behind the pointer, not beside it,
/// so a `ByteReduce` stays two words (a call's description is kept in
/// registers).
#[doc(hidden)]
pub struct Builtin<F: ?Sized> {
    codes: OpCodes,
    f: F,
}

/// [`Builtin`] of any loop.
#[doc(hidden)]
pub type BuiltinKernel = Builtin<Kernel>;

/// A user operation's loop and where its first panic waits for the
/// collective to end.
struct UserKernel {
    f: Box<Kernel>,
    panic: std::cell::RefCell<Option<Box<dyn std::any::Any + Send>>>,
    /// False: combine in rank order only ([`ReduceOp::Ordered`]).
    commutative: bool,
}

/// The element-wise loop of one operation on one type.
#[doc(hidden)]
pub type Kernel = dyn Fn(&mut [u8], &[u8], bool);

impl ByteReduce {
    /// Applies the reduction (see the type).
    #[inline]
    pub fn apply(&self, dst: &mut [u8], src: &[u8], src_left: bool) {
        match &self.0 {
            Kern::Builtin(k) => (k.f)(dst, src, src_left),
            Kern::User(u) => Self::apply_user(u, dst, src, src_left),
        }
    }

    /// A reduction given directly on bytes, for callers that know the
    /// element type only at run time (the MPI C interface): `f(dst, src,
    /// src_left)` must do what [`ByteReduce::apply`] does. The slices hold
    /// whole elements of the size the collective is called with. It is
    /// treated as a user operation: a panic is caught and handed back as
    /// for [`ReduceOp::User`].
    pub fn from_fn(f: impl Fn(&mut [u8], &[u8], bool) + 'static) -> ByteReduce {
        Self::user(Box::new(f), true)
    }

    /// [`from_fn`](Self::from_fn) for an operation that need not be
    /// commutative: combined in rank order only ([`ReduceOp::Ordered`]).
    pub fn from_fn_ordered(f: impl Fn(&mut [u8], &[u8], bool) + 'static) -> ByteReduce {
        Self::user(Box::new(f), false)
    }

    fn user(f: Box<Kernel>, commutative: bool) -> ByteReduce {
        ByteReduce(Kern::User(Rc::new(UserKernel {
            f,
            panic: Default::default(),
            commutative,
        })))
    }

    /// Whether the operation may be combined in any order (every built-in
    /// one, [`ReduceOp::User`]); false only for an ordered user operation.
    #[inline]
    pub fn is_commutative(&self) -> bool {
        match &self.0 {
            Kern::Builtin(..) => true,
            Kern::User(u) => u.commutative,
        }
    }

    #[inline(never)]
    fn apply_user(u: &UserKernel, dst: &mut [u8], src: &[u8], src_left: bool) {
        let f = &u.f;
        // Unwind safety: after a panic the destination holds whatever the
        // operation left there, which is only ever plain bytes; the
        // collective completes and its caller gets the panic back.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dst, src, src_left)));
        if let Err(p) = r {
            let mut s = u.panic.borrow_mut();
            if s.is_none() {
                *s = Some(p);
            }
        }
    }

    /// The first panic of the user operation, if it panicked.
    pub fn take_panic(&self) -> Option<Box<dyn std::any::Any + Send>> {
        match &self.0 {
            Kern::Builtin(..) => None,
            Kern::User(u) => u.panic.borrow_mut().take(),
        }
    }

    /// The operation's and element type's codes (see [`OpCodes`]).
    #[inline]
    pub(crate) fn codes(&self) -> OpCodes {
        match &self.0 {
            Kern::Builtin(k) => k.codes,
            // A user operation's type is the caller's business.
            Kern::User(u) if u.commutative => (10, 0),
            Kern::User(_) => (11, 0),
        }
    }

    /// Whether this is a user operation (which may panic).
    #[inline]
    pub fn is_user(&self) -> bool {
        matches!(self.0, Kern::User(_))
    }
}

/// What a panic payload says, for messages.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Number of built-in operations (all but `User`).
const BUILTIN_OPS: usize = 9;

/// The byte-level kernel of `op` on `T`. Those of the built-in operations
/// are made once per type and thread: a small collective would otherwise
/// spend an allocation per call on its kernel.
pub fn byte_reduce<T: Reducible>(op: ReduceOp<T>) -> ByteReduce {
    let i = match &op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Min => 2,
        ReduceOp::Max => 3,
        ReduceOp::Band => 4,
        ReduceOp::Bor => 5,
        ReduceOp::Bxor => 6,
        ReduceOp::Land => 7,
        ReduceOp::Lor => 8,
        ReduceOp::User(_) | ReduceOp::Ordered(_) => return make_kernel(op),
    };
    // The operation is moved only on a miss: copying it into the lookup's
    // closure costs a stalled load on every call (the caller stored it in
    // narrower pieces than the copy reads).
    if let Some(f) = T::with_kernel(i, |k| k.clone()) {
        return ByteReduce(Kern::Builtin(f));
    }
    let f = make_kernel(op);
    if let Kern::Builtin(k) = &f.0 {
        T::with_kernel(i, |slot| *slot = Some(k.clone()));
    }
    f
}

fn make_kernel<T: Reducible>(op: ReduceOp<T>) -> ByteReduce {
    let codes = (op.code(), const { crate::stamp::type_code(T::NAME) });
    let user = matches!(op, ReduceOp::User(_) | ReduceOp::Ordered(_));
    let commutative = !matches!(op, ReduceOp::Ordered(_));
    let f = move |dst: &mut [u8], src: &[u8], src_left: bool| {
        let sz = std::mem::size_of::<T>();
        let n = dst.len().min(src.len()) / sz;
        let d = dst.as_mut_ptr() as *mut T;
        let s = src.as_ptr() as *const T;
        for i in 0..n {
            // SAFETY: `i < n` elements fit in both slices; unaligned reads
            // and writes are used because scratch buffers are byte vectors;
            // every bit pattern is a valid `T` (sealed `Datatype`).
            unsafe {
                let a = std::ptr::read_unaligned(s.add(i));
                let b = std::ptr::read_unaligned(d.add(i));
                let (l, r) = if src_left { (a, b) } else { (b, a) };
                // `supports` was checked when the collective started.
                let v = T::combine(&op, l, r).unwrap_or(b);
                std::ptr::write_unaligned(d.add(i), v);
            }
        }
    };
    if user {
        ByteReduce::user(Box::new(f), commutative)
    } else {
        let k: Rc<BuiltinKernel> = Rc::new(Builtin { codes, f });
        ByteReduce(Kern::Builtin(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_apply() {
        assert_eq!(i32::combine(&ReduceOp::Sum, 2, 3), Some(5));
        assert_eq!(u8::combine(&ReduceOp::Sum, 250, 10), Some(4));
        assert_eq!(i64::combine(&ReduceOp::Min, -2, 3), Some(-2));
        assert_eq!(u16::combine(&ReduceOp::Bxor, 6, 3), Some(5));
        assert_eq!(i8::combine(&ReduceOp::Land, 2, 0), Some(0));
        assert_eq!(i8::combine(&ReduceOp::Lor, 2, 0), Some(1));
        assert_eq!(f64::combine(&ReduceOp::Band, 1.0, 2.0), None);
        assert!(!f32::supports(&ReduceOp::Lor));
        assert_eq!(
            f32::combine(&ReduceOp::user(|a: f32, b: f32| a.max(b) * 2.0), 1.0, 3.0),
            Some(6.0)
        );
        let k = byte_reduce::<u32>(ReduceOp::Sum);
        let mut d = crate::datatype::as_bytes(&[1u32, 2]).to_vec();
        k.apply(&mut d, crate::datatype::as_bytes(&[10u32, 20]), true);
        assert_eq!(d, crate::datatype::as_bytes(&[11u32, 22]));
    }

    #[test]
    fn a_user_operation_that_panics_is_caught_and_kept() {
        let k = byte_reduce::<u32>(ReduceOp::user(|a, b| {
            if b == 7 {
                panic!("seven");
            }
            a + b
        }));
        let mut d = crate::datatype::as_bytes(&[1u32, 7, 3]).to_vec();
        k.apply(&mut d, crate::datatype::as_bytes(&[10u32, 20, 30]), true);
        // The elements before the panic were combined, the rest untouched.
        assert_eq!(d, crate::datatype::as_bytes(&[11u32, 7, 3]));
        let p = k.take_panic().expect("the panic is kept");
        assert_eq!(panic_message(&*p), "seven");
        assert!(k.take_panic().is_none());
        assert!(byte_reduce::<u32>(ReduceOp::Sum).take_panic().is_none());
    }
}
