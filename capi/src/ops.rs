//! Reduction operations: the predefined ones on every basic kind (ibcoll's
//! own kernels where it has them; logical xor and MINLOC/MAXLOC on the
//! value-index pairs here), and user functions from MPI_Op_create. Each
//! kernel is made once per (operation, kind) and cached.

use std::os::raw::{c_int, c_void};

use ibcoll::ops::{byte_reduce, ByteReduce};
use ibcoll::{ReduceOp, Reducible};

use crate::abi::*;
use crate::buffers::{self, put};
use crate::datatype::{ty, Kind, Ty};
use crate::error::{call, err, R};
use crate::state::{self, index, UserOp};

/// The reduction of `op` on type `t`: the kernel, its element size, and
/// elements per item of `t`.
pub fn kernel(op: MPI_Op, dt: MPI_Datatype, t: &Ty) -> R<(ByteReduce, usize, usize)> {
    let Some((kind, esize, per)) = t.reducible() else {
        return err(
            MPI_ERR_TYPE,
            format!("datatype {dt:#x} is not contiguous: reductions take contiguous types"),
        );
    };
    if let Some(i) = index(op, OP_DYN) {
        let k = user_kernel(i, op, dt, t)?;
        // A user function sees whole items of the caller's type.
        return Ok((k, t.wire(), 1));
    }
    Ok((predefined(op, kind, dt)?, esize, per))
}

/// The kernel of predefined operation `op` on elements of `kind` (of
/// datatype `dt`, named in errors), made once and kept.
#[inline(always)]
pub fn predefined(op: MPI_Op, kind: Kind, dt: MPI_Datatype) -> R<ByteReduce> {
    if !(MPI_MAX..=MPI_NO_OP).contains(&op) {
        return bad_op(op);
    }
    let Some(g) = state::G.get() else {
        return err(
            MPI_ERR_OTHER,
            "called from a thread other than MPI_Init's, or before it",
        );
    };
    match g.builtin[builtin_slot(op, kind)].get() {
        Some(k) => Ok(k.clone()),
        None => make_predefined(g, op, kind, dt).cloned(),
    }
}

/// [`predefined`] without the reference count, for the blocking fast
/// path (`g`: what [`state::Global::get`] returned): `None` if `op` is not
/// predefined or the kernel is not made yet (the slow path makes it, or
/// says why not).
#[inline(always)]
pub fn predefined_fast(
    g: &'static state::Global,
    op: MPI_Op,
    kind: Kind,
) -> Option<&'static ByteReduce> {
    if !(MPI_MAX..=MPI_NO_OP).contains(&op) {
        return None;
    }
    g.builtin[builtin_slot(op, kind)].get()
}

/// Predefined operations are 0x58000001..=0x5800000e: a flat table of
/// (operation, kind).
#[inline(always)]
fn builtin_slot(op: MPI_Op, kind: Kind) -> usize {
    ((op & 0xf) as usize) * 32 + kind.id() as usize
}

#[cold]
fn bad_op<T>(op: MPI_Op) -> R<T> {
    err(MPI_ERR_OP, format!("invalid operation handle {op:#x}"))
}

/// Makes and keeps the kernel of predefined `op` on `kind` (`g`: what
/// [`state::Global::get`] returned).
#[inline(never)]
fn make_predefined(
    g: &'static state::Global,
    op: MPI_Op,
    kind: Kind,
    dt: MPI_Datatype,
) -> R<&'static ByteReduce> {
    let Some(k) = builtin(op, kind) else {
        return err(
            MPI_ERR_OP,
            format!(
                "operation {} does not apply to datatype {dt:#x} ({kind:?})",
                op_name(op)
            ),
        );
    };
    // Making a kernel runs no user code: nothing can have filled the slot
    // meanwhile, and `get_or_init` does not re-enter.
    Ok(g.builtin[builtin_slot(op, kind)].get_or_init(|| k))
}

pub fn op_name(op: MPI_Op) -> &'static str {
    match op {
        MPI_MAX => "MPI_MAX",
        MPI_MIN => "MPI_MIN",
        MPI_SUM => "MPI_SUM",
        MPI_PROD => "MPI_PROD",
        MPI_LAND => "MPI_LAND",
        MPI_BAND => "MPI_BAND",
        MPI_LOR => "MPI_LOR",
        MPI_BOR => "MPI_BOR",
        MPI_LXOR => "MPI_LXOR",
        MPI_BXOR => "MPI_BXOR",
        MPI_MINLOC => "MPI_MINLOC",
        MPI_MAXLOC => "MPI_MAXLOC",
        MPI_REPLACE => "MPI_REPLACE",
        MPI_NO_OP => "MPI_NO_OP",
        MPI_OP_NULL => "MPI_OP_NULL",
        _ => "an invalid operation handle",
    }
}

fn typed<T: Reducible>(op: MPI_Op) -> Option<ByteReduce> {
    let r = match op {
        MPI_MAX => ReduceOp::Max,
        MPI_MIN => ReduceOp::Min,
        MPI_SUM => ReduceOp::Sum,
        MPI_PROD => ReduceOp::Prod,
        MPI_LAND => ReduceOp::Land,
        MPI_LOR => ReduceOp::Lor,
        MPI_BAND => ReduceOp::Band,
        MPI_BOR => ReduceOp::Bor,
        MPI_BXOR => ReduceOp::Bxor,
        MPI_LXOR if T::supports(&ReduceOp::Land) => return Some(lxor(std::mem::size_of::<T>())),
        _ => return None,
    };
    if !T::supports(&r) {
        return None;
    }
    Some(byte_reduce(r))
}

fn builtin(op: MPI_Op, kind: Kind) -> Option<ByteReduce> {
    use Kind::*;
    match kind {
        I8 => typed::<i8>(op),
        U8 => typed::<u8>(op),
        I16 => typed::<i16>(op),
        U16 => typed::<u16>(op),
        I32 => typed::<i32>(op),
        U32 => typed::<u32>(op),
        I64 => typed::<i64>(op),
        U64 => typed::<u64>(op),
        F32 => typed::<f32>(op),
        F64 => typed::<f64>(op),
        Bool => match op {
            MPI_LAND | MPI_LOR | MPI_LXOR => typed::<u8>(op),
            _ => None,
        },
        Byte => match op {
            MPI_BAND | MPI_BOR | MPI_BXOR => typed::<u8>(op),
            _ => None,
        },
        FloatInt => pair::<f32>(op, 8, 4),
        DoubleInt => pair::<f64>(op, 16, 8),
        LongInt => pair::<i64>(op, 16, 8),
        ShortInt => pair::<i16>(op, 8, 4),
        TwoInt => pair::<i32>(op, 8, 4),
        Opaque => None,
    }
}

/// Logical xor on integers of `w` bytes (non-zero is true).
fn lxor(w: usize) -> ByteReduce {
    ByteReduce::from_fn(move |dst, src, _| {
        for (d, s) in dst.chunks_exact_mut(w).zip(src.chunks_exact(w)) {
            let a = d.iter().any(|&b| b != 0);
            let b = s.iter().any(|&b| b != 0);
            d.fill(0);
            // 1 in the native byte order.
            let one = if cfg!(target_endian = "little") {
                0
            } else {
                w - 1
            };
            d[one] = (a ^ b) as u8;
        }
    })
}

/// Values that MINLOC/MAXLOC compare.
trait PairValue: Copy + PartialOrd {
    fn read(b: &[u8]) -> Self;
}

macro_rules! pair_value {
    ($($t:ty),*) => {$(
        impl PairValue for $t {
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..std::mem::size_of::<$t>()]);
                <$t>::from_ne_bytes(a)
            }
        }
    )*};
}
pair_value!(f32, f64, i64, i16, i32);

/// MINLOC or MAXLOC on `{ V value; int index; }` items of `ext` bytes,
/// the index at byte `at`: the better value wins, a tie goes to the lower
/// index (so the order of the operands does not matter).
fn pair<V: PairValue + 'static>(op: MPI_Op, ext: usize, at: usize) -> Option<ByteReduce> {
    let max = match op {
        MPI_MAXLOC => true,
        MPI_MINLOC => false,
        _ => return None,
    };
    Some(ByteReduce::from_fn(move |dst, src, _| {
        for (d, s) in dst.chunks_exact_mut(ext).zip(src.chunks_exact(ext)) {
            let (dv, sv) = (V::read(d), V::read(s));
            let (di, si) = (i32::read(&d[at..]), i32::read(&s[at..]));
            let better = if max { sv > dv } else { sv < dv };
            if better || (sv == dv && si < di) {
                d.copy_from_slice(s);
            }
        }
    }))
}

fn user_kernel(i: usize, op: MPI_Op, dt: MPI_Datatype, t: &Ty) -> R<ByteReduce> {
    enum Got {
        Cached(ByteReduce),
        Fn(UserFn, bool),
    }
    let key = (op, dt);
    let got = state::with(|st| {
        if let Some(k) = st.kernels.get(&key) {
            return Ok(Got::Cached(k.clone()));
        }
        match st.ops.get(i).and_then(|o| o.as_ref()) {
            Some(u) => Ok(Got::Fn(u.f, u.commute)),
            None => err(MPI_ERR_OP, format!("invalid operation handle {op:#x}")),
        }
    })?;
    let (f, commute) = match got {
        Got::Cached(k) => return Ok(k),
        Got::Fn(f, c) => (f, c),
    };
    let w = t.wire();
    let f = move |dst: &mut [u8], src: &[u8], src_left: bool| {
        let mut n = (dst.len() / w.max(1)) as c_int;
        let mut d = dt;
        if src_left || commute {
            // SAFETY: the user function of MPI_Op_create reads `n` items
            // of `dt` from its first argument and combines them into its
            // second (`inout = in op inout`), both valid for `n` items.
            unsafe {
                f(
                    src.as_ptr() as *mut c_void,
                    dst.as_mut_ptr() as *mut c_void,
                    &mut n,
                    &mut d,
                )
            }
        } else {
            // `dst = dst op src` of a non-commutative operation: the
            // function writes its second argument, so it gets a copy.
            let mut tmp = src.to_vec();
            // SAFETY: as above, with `tmp` as the in-out argument.
            unsafe {
                f(
                    dst.as_mut_ptr() as *mut c_void,
                    tmp.as_mut_ptr() as *mut c_void,
                    &mut n,
                    &mut d,
                )
            }
            dst.copy_from_slice(&tmp);
        }
    };
    // A non-commutative operation is combined in rank order only: the
    // algorithms that combine in another order are not used for it.
    let k = if commute {
        ByteReduce::from_fn(f)
    } else {
        ByteReduce::from_fn_ordered(f)
    };
    state::with(|st| {
        st.kernels.insert(key, k.clone());
        Ok(())
    })?;
    Ok(k)
}

type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut MPI_Datatype);

#[no_mangle]
pub unsafe extern "C" fn MPI_Op_create(
    f: Option<UserFn>,
    commute: c_int,
    op: *mut MPI_Op,
) -> c_int {
    call("MPI_Op_create", MPI_COMM_WORLD, || {
        let Some(f) = f else {
            return err(MPI_ERR_ARG, "user function is a null pointer");
        };
        let h = state::with(|st| {
            let i = match st.ops.iter().position(|o| o.is_none()) {
                Some(i) => i,
                None => {
                    st.ops.push(None);
                    st.ops.len() - 1
                }
            };
            st.ops[i] = Some(UserOp {
                f,
                commute: commute != 0,
            });
            Ok(OP_DYN | i as c_int)
        })?;
        put(op, h, "op")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Op_free(op: *mut MPI_Op) -> c_int {
    call("MPI_Op_free", MPI_COMM_WORLD, || {
        if op.is_null() {
            return err(MPI_ERR_ARG, "op is a null pointer");
        }
        // SAFETY: checked non-null (MPI's contract).
        let h = unsafe { *op };
        state::with(
            |st| match index(h, OP_DYN).and_then(|i| st.ops.get_mut(i)) {
                Some(slot @ Some(_)) => {
                    *slot = None;
                    st.kernels.retain(|k, _| k.0 != h);
                    Ok(())
                }
                _ => err(MPI_ERR_OP, format!("{h:#x} is not a user operation")),
            },
        )?;
        put(op, MPI_OP_NULL, "op")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Op_commutative(op: MPI_Op, commute: *mut c_int) -> c_int {
    call("MPI_Op_commutative", MPI_COMM_WORLD, || {
        let c = match index(op, OP_DYN) {
            Some(i) => state::with(|st| match st.ops.get(i).and_then(|o| o.as_ref()) {
                Some(u) => Ok(u.commute),
                None => err(MPI_ERR_OP, format!("invalid operation handle {op:#x}")),
            })?,
            None if (MPI_MAX..=MPI_NO_OP).contains(&op) => true,
            None => return err(MPI_ERR_OP, format!("invalid operation handle {op:#x}")),
        };
        put(commute, c as c_int, "commute")
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_local(
    inbuf: *const c_void,
    inout: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
) -> c_int {
    call("MPI_Reduce_local", MPI_COMM_WORLD, || {
        let t = ty(dt)?;
        if !t.is_contiguous() {
            // SAFETY: MPI's contract on the two buffers.
            return unsafe { crate::packed::reduce_local(&t, inbuf, inout, count, dt, op) };
        }
        let n = buffers::wire_len(inbuf, count, &t)?;
        buffers::wire_len(inout, count, &t)?;
        let (k, _, _) = kernel(op, dt, &t)?;
        // SAFETY: both buffers hold `count` contiguous items (MPI's
        // contract; `kernel` refused non-contiguous types).
        let (src, dst) = unsafe { (buffers::bytes(inbuf, n), buffers::bytes_mut(inout, n)) };
        k.apply(dst, src, true);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn di(v: f64, i: i32) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&v.to_ne_bytes());
        b[8..12].copy_from_slice(&i.to_ne_bytes());
        b
    }

    #[test]
    fn minloc_maxloc_on_double_int() {
        let min = builtin(MPI_MINLOC, Kind::DoubleInt).unwrap();
        let max = builtin(MPI_MAXLOC, Kind::DoubleInt).unwrap();
        let mut d = [di(2.0, 5), di(1.0, 3)].concat();
        let s = [di(2.0, 1), di(0.5, 9)].concat();
        min.apply(&mut d, &s, true);
        // Equal values: the lower index; a smaller value wins.
        assert_eq!(d, [di(2.0, 1), di(0.5, 9)].concat());
        let mut d = [di(2.0, 5), di(1.0, 3)].concat();
        max.apply(&mut d, &s, false);
        assert_eq!(d, [di(2.0, 1), di(1.0, 3)].concat());
        assert!(builtin(MPI_SUM, Kind::DoubleInt).is_none());
    }

    #[test]
    fn predefined_operations_by_kind() {
        let lx = builtin(MPI_LXOR, Kind::I32).unwrap();
        let mut d: Vec<u8> = [0i32, 5, 7].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let s: Vec<u8> = [3i32, 0, 1].iter().flat_map(|x| x.to_ne_bytes()).collect();
        lx.apply(&mut d, &s, true);
        let want: Vec<u8> = [1i32, 1, 0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(d, want);
        assert!(builtin(MPI_BAND, Kind::F64).is_none());
        assert!(builtin(MPI_SUM, Kind::Byte).is_none());
        assert!(builtin(MPI_BOR, Kind::Byte).is_some());
        assert!(builtin(MPI_SUM, Kind::Opaque).is_none());
        assert!(builtin(MPI_MINLOC, Kind::I32).is_none());
    }
}
