//! Datatypes: the predefined ones (MPICH's handles), and derived ones as a
//! list of byte blocks per element. A contiguous type travels straight
//! from and into the caller's buffer; any other is packed into (or
//! received into and unpacked from) a buffer of this library's.

use std::os::raw::c_int;
use std::rc::Rc;

use crate::abi::*;
use crate::error::{call, err, R};
use crate::state::{self, index};

/// What the elements of a type are, for reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
    Bool,
    Byte,
    /// `{ T value; int index; }` pairs for MINLOC/MAXLOC.
    FloatInt,
    DoubleInt,
    LongInt,
    ShortInt,
    TwoInt,
    /// Known, moved as bytes, not reducible by the predefined operations.
    Opaque,
}

impl Kind {
    pub fn id(self) -> c_int {
        self as c_int
    }
}

/// A type: its MPI size, bounds, and where its bytes are in one element.
#[derive(Debug, Clone)]
pub struct TypeInfo {
    /// `MPI_Type_size`.
    pub size: usize,
    pub lb: isize,
    pub extent: isize,
    /// (offset, length) of the bytes of one element, in order, merged.
    pub blocks: Vec<(isize, usize)>,
    /// Bytes of one element on the wire (the blocks' total).
    pub wire: usize,
    /// The kind of every basic element, when there is one.
    pub elem: Option<Kind>,
    /// Size of one basic element of `elem`.
    pub elem_size: usize,
    pub committed: bool,
    pub align: usize,
}

impl TypeInfo {
    /// One element's bytes are `extent` bytes at offset 0.
    pub fn contiguous(&self) -> bool {
        self.blocks.len() <= 1
            && self
                .blocks
                .first()
                .map_or(true, |&(o, l)| o == 0 && l as isize == self.extent)
    }
}

/// A resolved datatype: predefined (no table look-up) or derived.
#[derive(Clone)]
pub enum Ty {
    Basic { size: usize, ext: usize, kind: Kind },
    Derived(Rc<TypeInfo>),
}

impl Ty {
    /// Bytes of one element on the wire.
    #[inline(always)]
    pub fn wire(&self) -> usize {
        match self {
            Ty::Basic { ext, .. } => *ext,
            Ty::Derived(t) => t.wire,
        }
    }
    /// Bytes from one element to the next in a buffer.
    #[inline(always)]
    pub fn extent(&self) -> isize {
        match self {
            Ty::Basic { ext, .. } => *ext as isize,
            Ty::Derived(t) => t.extent,
        }
    }
    #[inline(always)]
    pub fn is_contiguous(&self) -> bool {
        match self {
            Ty::Basic { .. } => true,
            Ty::Derived(t) => t.contiguous(),
        }
    }
    /// The basic element kind and size, and elements per item, when this
    /// is a contiguous array of one kind (what a reduction needs).
    pub fn reducible(&self) -> Option<(Kind, usize, usize)> {
        match self {
            Ty::Basic { ext, kind, .. } => Some((*kind, *ext, 1)),
            Ty::Derived(t) if t.contiguous() => {
                let k = t.elem?;
                Some((k, t.elem_size, t.wire / t.elem_size.max(1)))
            }
            Ty::Derived(_) => None,
        }
    }
    pub fn info(&self) -> TypeInfo {
        match self {
            Ty::Basic { size, ext, kind } => TypeInfo {
                size: *size,
                lb: 0,
                extent: *ext as isize,
                blocks: if *ext > 0 { vec![(0, *ext)] } else { vec![] },
                wire: *ext,
                elem: Some(*kind),
                elem_size: *ext,
                committed: true,
                align: (*ext).clamp(1, 8),
            },
            Ty::Derived(t) => (**t).clone(),
        }
    }
}

/// The predefined datatype `h`: (MPI size, extent, kind). Those of
/// MPICH's form 0x4c00_SSII (size SS, index II) through a table by
/// index: one load and compare on every call's datatype argument.
#[inline(always)]
pub fn basic(h: MPI_Datatype) -> Option<(usize, usize, Kind)> {
    if let Some((size, kind)) = basic_fast(h) {
        return Some((size, size, kind));
    }
    if (h as u32) >> 16 == 0x4c00 {
        return None;
    }
    basic_slow(h)
}

/// The predefined datatypes of the table (size = extent, kind): the
/// blocking calls' fast paths. The slot of the handle's low byte holds
/// that handle or, where there is none, a value whose low byte differs
/// from the slot's, which no handle equals: no range check first.
#[inline(always)]
pub fn basic_fast(h: MPI_Datatype) -> Option<(usize, Kind)> {
    let (handle, size, kind) = BASIC[(h & 0xff) as usize];
    (handle == h).then_some((size as usize, kind))
}

/// Every predefined handle of the form 0x4c00_SSII.
const SIMPLE: [MPI_Datatype; 39] = [
    MPI_CHAR,
    MPI_SIGNED_CHAR,
    MPI_UNSIGNED_CHAR,
    MPI_BYTE,
    MPI_WCHAR,
    MPI_SHORT,
    MPI_UNSIGNED_SHORT,
    MPI_INT,
    MPI_UNSIGNED,
    MPI_LONG,
    MPI_UNSIGNED_LONG,
    MPI_FLOAT,
    MPI_DOUBLE,
    MPI_LONG_DOUBLE,
    MPI_LONG_LONG_INT,
    MPI_UNSIGNED_LONG_LONG,
    MPI_PACKED,
    MPI_2INT,
    MPI_INT8_T,
    MPI_INT16_T,
    MPI_INT32_T,
    MPI_INT64_T,
    MPI_UINT8_T,
    MPI_UINT16_T,
    MPI_UINT32_T,
    MPI_UINT64_T,
    MPI_C_BOOL,
    MPI_C_FLOAT_COMPLEX,
    MPI_C_DOUBLE_COMPLEX,
    MPI_C_LONG_DOUBLE_COMPLEX,
    MPI_AINT,
    MPI_OFFSET,
    MPI_COUNT,
    MPI_CXX_BOOL,
    MPI_INTEGER,
    MPI_REAL,
    MPI_DOUBLE_PRECISION,
    MPI_LOGICAL,
    MPI_CHARACTER,
];

/// (handle, size, kind) by the low byte of a 0x4c00_SSII handle; a
/// handle that is not there has a different `handle` in its slot: an
/// empty slot `s` holds `!s`, whose low byte (255 - s) is never `s`.
static BASIC: [(MPI_Datatype, u8, Kind); 256] = {
    let mut t = [(0, 0u8, Kind::Opaque); 256];
    let mut i = 0;
    while i < 256 {
        t[i].0 = !(i as MPI_Datatype);
        i += 1;
    }
    i = 0;
    while i < SIMPLE.len() {
        let h = SIMPLE[i];
        let slot = (h & 0xff) as usize;
        // Two handles on one slot would make one of them unknown.
        assert!(t[slot].0 == !(slot as MPI_Datatype) || t[slot].0 == h);
        if let Some((size, ext, kind)) = basic_slow(h) {
            assert!(size == ext && size < 256);
            t[slot] = (h, size as u8, kind);
        }
        i += 1;
    }
    t
};

/// [`basic`] by a match over every predefined handle.
const fn basic_slow(h: MPI_Datatype) -> Option<(usize, usize, Kind)> {
    use Kind::*;
    let k = match h {
        MPI_CHAR | MPI_SIGNED_CHAR | MPI_INT8_T => I8,
        MPI_UNSIGNED_CHAR | MPI_UINT8_T | MPI_CHARACTER => U8,
        MPI_BYTE | MPI_PACKED => Byte,
        MPI_SHORT | MPI_INT16_T => I16,
        MPI_UNSIGNED_SHORT | MPI_UINT16_T => U16,
        MPI_INT | MPI_INT32_T | MPI_WCHAR | MPI_INTEGER | MPI_LOGICAL => I32,
        MPI_UNSIGNED | MPI_UINT32_T => U32,
        MPI_LONG | MPI_LONG_LONG_INT | MPI_INT64_T | MPI_AINT | MPI_OFFSET | MPI_COUNT => I64,
        MPI_UNSIGNED_LONG | MPI_UNSIGNED_LONG_LONG | MPI_UINT64_T => U64,
        MPI_FLOAT | MPI_REAL => F32,
        MPI_DOUBLE | MPI_DOUBLE_PRECISION => F64,
        MPI_C_BOOL | MPI_CXX_BOOL => Bool,
        MPI_LONG_DOUBLE
        | MPI_C_FLOAT_COMPLEX
        | MPI_C_DOUBLE_COMPLEX
        | MPI_C_LONG_DOUBLE_COMPLEX => Opaque,
        MPI_2INT => TwoInt,
        MPI_FLOAT_INT => return Some((8, 8, FloatInt)),
        MPI_DOUBLE_INT => return Some((12, 16, DoubleInt)),
        MPI_LONG_INT => return Some((12, 16, LongInt)),
        MPI_SHORT_INT => return Some((6, 8, ShortInt)),
        MPI_LONG_DOUBLE_INT => return Some((20, 32, Opaque)),
        _ => return None,
    };
    // MPICH encodes the size in bits 8-15 of a predefined handle.
    let size = ((h >> 8) & 0xff) as usize;
    Some((size, size, k))
}

/// The datatype behind handle `h`.
#[inline(always)]
pub fn ty(h: MPI_Datatype) -> R<Ty> {
    if let Some((size, ext, kind)) = basic(h) {
        return Ok(Ty::Basic { size, ext, kind });
    }
    derived(h)
}

#[inline(never)]
fn derived(h: MPI_Datatype) -> R<Ty> {
    let t = state::with(|st| {
        index(h, TYPE_DYN)
            .and_then(|i| st.types.get(i).cloned().flatten())
            .map_or_else(|| bad_type(h), Ok)
    })?;
    if !t.committed {
        return err(
            MPI_ERR_TYPE,
            format!("datatype {h:#x} is used before MPI_Type_commit"),
        );
    }
    Ok(Ty::Derived(t))
}

/// The datatype behind `h`, committed or not (for constructors and
/// queries).
fn any_ty(h: MPI_Datatype) -> R<TypeInfo> {
    if let Some((size, ext, kind)) = basic(h) {
        return Ok(Ty::Basic { size, ext, kind }.info());
    }
    state::with(|st| {
        index(h, TYPE_DYN)
            .and_then(|i| st.types.get(i).cloned().flatten())
            .map_or_else(|| bad_type(h), |t| Ok((*t).clone()))
    })
}

#[cold]
fn bad_type<T>(h: MPI_Datatype) -> R<T> {
    if h == MPI_DATATYPE_NULL {
        err(MPI_ERR_TYPE, "datatype is MPI_DATATYPE_NULL")
    } else {
        err(MPI_ERR_TYPE, format!("invalid datatype handle {h:#x}"))
    }
}

/// Builds a type whose element is `parts`: each (byte displacement,
/// old type) copy of an old element.
fn build(parts: impl Iterator<Item = (isize, TypeInfo)>) -> TypeInfo {
    let mut blocks: Vec<(isize, usize)> = Vec::new();
    let mut size = 0;
    let mut elem: Option<Option<Kind>> = None;
    let mut elem_size = 0;
    let mut lo = isize::MAX;
    let mut hi = isize::MIN;
    let mut align = 1;
    for (d, t) in parts {
        size += t.size;
        align = align.max(t.align);
        lo = lo.min(d + t.lb);
        hi = hi.max(d + t.lb + t.extent);
        elem = Some(match elem {
            None => t.elem,
            Some(e) if e == t.elem && elem_size == t.elem_size => e,
            Some(_) => None,
        });
        elem_size = t.elem_size;
        for &(o, l) in &t.blocks {
            let o = d + o;
            match blocks.last_mut() {
                Some(last) if last.0 + last.1 as isize == o => last.1 += l,
                _ => blocks.push((o, l)),
            }
        }
    }
    if lo > hi {
        lo = 0;
        hi = 0;
    }
    let wire = blocks.iter().map(|b| b.1).sum();
    TypeInfo {
        size,
        lb: lo,
        extent: hi - lo,
        blocks,
        wire,
        elem: elem.flatten(),
        elem_size,
        committed: false,
        align,
    }
}

fn add(t: TypeInfo) -> R<MPI_Datatype> {
    state::with(|st| {
        let i = match st.types.iter().position(|t| t.is_none()) {
            Some(i) => i,
            None => {
                st.types.push(None);
                st.types.len() - 1
            }
        };
        st.types[i] = Some(Rc::new(t));
        Ok(TYPE_DYN | i as c_int)
    })
}

fn nonneg(v: c_int, what: &str) -> R<usize> {
    if v < 0 {
        return err(MPI_ERR_COUNT, format!("{what} {v} is negative"));
    }
    Ok(v as usize)
}

fn out<T>(p: *mut T, what: &str) -> R<*mut T> {
    if p.is_null() {
        return err(MPI_ERR_ARG, format!("{what} is a null pointer"));
    }
    Ok(p)
}

/// Stores handle `v` through the caller's pointer `p`.
fn put<T>(p: *mut T, v: T) {
    // SAFETY: every caller checked `p` with `out` (non-null); the C caller
    // gives a pointer to writable storage of its type (MPI's contract).
    unsafe { p.write(v) }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_contiguous(
    count: c_int,
    old: MPI_Datatype,
    new: *mut MPI_Datatype,
) -> c_int {
    call("MPI_Type_contiguous", MPI_COMM_WORLD, || {
        let n = nonneg(count, "count")?;
        let o = any_ty(old)?;
        let out_p = out(new, "newtype")?;
        let t = build((0..n).map(|i| (i as isize * o.extent, o.clone())));
        put(out_p, add(t)?);
        Ok(())
    })
}

fn hvector(count: c_int, bl: c_int, stride: isize, old: MPI_Datatype) -> R<TypeInfo> {
    let n = nonneg(count, "count")?;
    let b = nonneg(bl, "blocklength")?;
    let o = any_ty(old)?;
    Ok(build((0..n).flat_map(|i| {
        let o = o.clone();
        (0..b).map(move |j| (i as isize * stride + j as isize * o.extent, o.clone()))
    })))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_vector(
    count: c_int,
    blocklength: c_int,
    stride: c_int,
    old: MPI_Datatype,
    new: *mut MPI_Datatype,
) -> c_int {
    call("MPI_Type_vector", MPI_COMM_WORLD, || {
        let ext = any_ty(old)?.extent;
        let t = hvector(count, blocklength, stride as isize * ext, old)?;
        put(out(new, "newtype")?, add(t)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_create_hvector(
    count: c_int,
    blocklength: c_int,
    stride: MPI_Aint,
    old: MPI_Datatype,
    new: *mut MPI_Datatype,
) -> c_int {
    call("MPI_Type_create_hvector", MPI_COMM_WORLD, || {
        let t = hvector(count, blocklength, stride as isize, old)?;
        put(out(new, "newtype")?, add(t)?);
        Ok(())
    })
}

/// `n` entries of a C array (empty for 0).
pub unsafe fn carray<'a, T>(p: *const T, n: usize, what: &str) -> R<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return err(MPI_ERR_ARG, format!("{what} is a null pointer"));
    }
    // SAFETY: the caller passes an array of `n` entries (MPI's contract).
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_indexed(
    count: c_int,
    bls: *const c_int,
    displs: *const c_int,
    old: MPI_Datatype,
    new: *mut MPI_Datatype,
) -> c_int {
    call("MPI_Type_indexed", MPI_COMM_WORLD, || {
        let n = nonneg(count, "count")?;
        // SAFETY: arrays of `count` entries (MPI's contract).
        let (b, d) = unsafe {
            (
                carray(bls, n, "blocklengths")?,
                carray(displs, n, "displacements")?,
            )
        };
        let o = any_ty(old)?;
        if let Some(x) = b.iter().find(|&&x| x < 0) {
            return err(MPI_ERR_ARG, format!("block length {x} is negative"));
        }
        let t = build(b.iter().zip(d).flat_map(|(&bl, &dp)| {
            let o = o.clone();
            (0..bl).map(move |j| ((dp + j) as isize * o.extent, o.clone()))
        }));
        put(out(new, "newtype")?, add(t)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_create_struct(
    count: c_int,
    bls: *const c_int,
    displs: *const MPI_Aint,
    types: *const MPI_Datatype,
    new: *mut MPI_Datatype,
) -> c_int {
    call("MPI_Type_create_struct", MPI_COMM_WORLD, || {
        let n = nonneg(count, "count")?;
        // SAFETY: arrays of `count` entries (MPI's contract).
        let (b, d, ts) = unsafe {
            (
                carray(bls, n, "blocklengths")?,
                carray(displs, n, "displacements")?,
                carray(types, n, "types")?,
            )
        };
        let infos = ts.iter().map(|&t| any_ty(t)).collect::<R<Vec<_>>>()?;
        if let Some(x) = b.iter().find(|&&x| x < 0) {
            return err(MPI_ERR_ARG, format!("block length {x} is negative"));
        }
        let mut t = build(b.iter().zip(d).zip(&infos).flat_map(|((&bl, &dp), o)| {
            (0..bl).map(move |j| (dp as isize + j as isize * o.extent, o.clone()))
        }));
        // As C lays out a struct: the extent is padded to the alignment.
        let a = t.align as isize;
        t.extent = (t.extent + a - 1) / a * a;
        put(out(new, "newtype")?, add(t)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_create_resized(
    old: MPI_Datatype,
    lb: MPI_Aint,
    extent: MPI_Aint,
    new: *mut MPI_Datatype,
) -> c_int {
    call("MPI_Type_create_resized", MPI_COMM_WORLD, || {
        let mut t = any_ty(old)?;
        t.lb = lb as isize;
        t.extent = extent as isize;
        t.committed = false;
        put(out(new, "newtype")?, add(t)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_dup(old: MPI_Datatype, new: *mut MPI_Datatype) -> c_int {
    call("MPI_Type_dup", MPI_COMM_WORLD, || {
        let t = any_ty(old)?;
        put(out(new, "newtype")?, add(t)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_commit(t: *mut MPI_Datatype) -> c_int {
    call("MPI_Type_commit", MPI_COMM_WORLD, || {
        // SAFETY: checked non-null; points to a handle (MPI's contract).
        let h = unsafe { *out(t, "datatype")? };
        if basic(h).is_some() {
            return Ok(());
        }
        state::with(|st| {
            match index(h, TYPE_DYN)
                .and_then(|i| st.types.get_mut(i))
                .and_then(|t| t.as_mut())
            {
                Some(t) => {
                    Rc::make_mut(t).committed = true;
                    Ok(())
                }
                None => bad_type(h),
            }
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_free(t: *mut MPI_Datatype) -> c_int {
    call("MPI_Type_free", MPI_COMM_WORLD, || {
        let p = out(t, "datatype")?;
        // SAFETY: checked non-null; points to a handle (MPI's contract).
        let h = unsafe { *p };
        if basic(h).is_some() {
            return err(MPI_ERR_TYPE, "a predefined datatype cannot be freed");
        }
        state::with(|st| {
            match index(h, TYPE_DYN).and_then(|i| st.types.get_mut(i)) {
                // Operations in flight keep their own reference.
                Some(slot @ Some(_)) => {
                    *slot = None;
                    Ok(())
                }
                _ => bad_type(h),
            }
        })?;
        put(p, MPI_DATATYPE_NULL);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_size(t: MPI_Datatype, size: *mut c_int) -> c_int {
    call("MPI_Type_size", MPI_COMM_WORLD, || {
        let i = any_ty(t)?;
        put(out(size, "size")?, i.size as c_int);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_get_extent(
    t: MPI_Datatype,
    lb: *mut MPI_Aint,
    extent: *mut MPI_Aint,
) -> c_int {
    call("MPI_Type_get_extent", MPI_COMM_WORLD, || {
        let i = any_ty(t)?;
        put(out(lb, "lb")?, i.lb as MPI_Aint);
        put(out(extent, "extent")?, i.extent as MPI_Aint);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_get_true_extent(
    t: MPI_Datatype,
    lb: *mut MPI_Aint,
    extent: *mut MPI_Aint,
) -> c_int {
    call("MPI_Type_get_true_extent", MPI_COMM_WORLD, || {
        let i = any_ty(t)?;
        let lo = i.blocks.iter().map(|b| b.0).min().unwrap_or(0);
        let hi = i
            .blocks
            .iter()
            .map(|b| b.0 + b.1 as isize)
            .max()
            .unwrap_or(0);
        put(out(lb, "lb")?, lo as MPI_Aint);
        put(out(extent, "extent")?, (hi - lo) as MPI_Aint);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Type_extent(t: MPI_Datatype, extent: *mut MPI_Aint) -> c_int {
    call("MPI_Type_extent", MPI_COMM_WORLD, || {
        let i = any_ty(t)?;
        put(out(extent, "extent")?, i.extent as MPI_Aint);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Get_address(loc: *const libc::c_void, addr: *mut MPI_Aint) -> c_int {
    call("MPI_Get_address", MPI_COMM_WORLD, || {
        put(out(addr, "address")?, loc as MPI_Aint);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Address(loc: *const libc::c_void, addr: *mut MPI_Aint) -> c_int {
    // SAFETY: same contract as MPI_Get_address.
    unsafe { MPI_Get_address(loc, addr) }
}

/// Copies `count` elements of type `t` at `buf` into `out` (packed).
///
/// # Safety
/// `buf` holds `count` elements of `t` (MPI's contract).
pub unsafe fn pack(buf: *const u8, count: usize, t: &TypeInfo, out: &mut [u8]) {
    let mut at = 0;
    for i in 0..count {
        for &(o, l) in &t.blocks {
            // SAFETY: the block lies in element `i` of the caller's buffer.
            let src = unsafe { buf.offset(i as isize * t.extent + o) };
            // SAFETY: `out` holds `count * wire` bytes; `src` is valid for `l`.
            unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr().add(at), l) };
            at += l;
        }
    }
}

/// Copies packed `data` into whole elements of type `t` at `buf`.
///
/// # Safety
/// `buf` holds `count` elements of `t`, `count * wire <= data.len()`
/// rounded down to whole elements.
pub unsafe fn unpack(buf: *mut u8, t: &TypeInfo, data: &[u8]) {
    let n = data.len().checked_div(t.wire).unwrap_or(0);
    let mut at = 0;
    for i in 0..n {
        for &(o, l) in &t.blocks {
            // SAFETY: element `i < count` of the caller's buffer.
            let dst = unsafe { buf.offset(i as isize * t.extent + o) };
            // SAFETY: `at + l <= n * wire <= data.len()`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(at), dst, l) };
            at += l;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Pack_size(
    count: c_int,
    t: MPI_Datatype,
    _comm: MPI_Comm,
    size: *mut c_int,
) -> c_int {
    call("MPI_Pack_size", MPI_COMM_WORLD, || {
        let n = nonneg(count, "count")?;
        let i = any_ty(t)?;
        put(out(size, "size")?, (n * i.wire) as c_int);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Pack(
    inbuf: *const libc::c_void,
    count: c_int,
    t: MPI_Datatype,
    outbuf: *mut libc::c_void,
    outsize: c_int,
    position: *mut c_int,
    comm: MPI_Comm,
) -> c_int {
    call("MPI_Pack", comm, || {
        let n = nonneg(count, "incount")?;
        let i = any_ty(t)?;
        let pos_p = out(position, "position")?;
        // SAFETY: checked non-null.
        let pos = unsafe { *pos_p } as usize;
        let need = n * i.wire;
        if pos + need > outsize.max(0) as usize {
            return err(
                MPI_ERR_TRUNCATE,
                format!("{need} bytes at position {pos} do not fit in {outsize}"),
            );
        }
        if need > 0 {
            // SAFETY: `outbuf` holds `outsize` bytes (MPI's contract) and
            // `pos + need` fit; `inbuf` holds `count` elements.
            unsafe {
                let o = std::slice::from_raw_parts_mut((outbuf as *mut u8).add(pos), need);
                pack(inbuf as *const u8, n, &i, o);
            }
        }
        put(pos_p, (pos + need) as c_int);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Unpack(
    inbuf: *const libc::c_void,
    insize: c_int,
    position: *mut c_int,
    outbuf: *mut libc::c_void,
    count: c_int,
    t: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    call("MPI_Unpack", comm, || {
        let n = nonneg(count, "outcount")?;
        let i = any_ty(t)?;
        let pos_p = out(position, "position")?;
        // SAFETY: checked non-null.
        let pos = unsafe { *pos_p } as usize;
        let need = n * i.wire;
        if pos + need > insize.max(0) as usize {
            return err(
                MPI_ERR_TRUNCATE,
                format!("{need} bytes at position {pos} exceed the {insize} packed"),
            );
        }
        if need > 0 {
            // SAFETY: `inbuf` holds `insize` bytes, `outbuf` `count`
            // elements (MPI's contract).
            unsafe {
                let d = std::slice::from_raw_parts((inbuf as *const u8).add(pos), need);
                unpack(outbuf as *mut u8, &i, d);
            }
        }
        put(pos_p, (pos + need) as c_int);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic_info(h: MPI_Datatype) -> TypeInfo {
        let (size, ext, kind) = basic(h).unwrap();
        Ty::Basic { size, ext, kind }.info()
    }

    #[test]
    fn predefined_sizes_from_the_handle() {
        assert_eq!(basic(MPI_DOUBLE).map(|b| b.0), Some(8));
        assert_eq!(basic(MPI_INT8_T).map(|b| b.0), Some(1));
        assert_eq!(
            basic(MPI_UINT64_T).map(|b| (b.0, b.2)),
            Some((8, Kind::U64))
        );
        assert_eq!(basic(MPI_DOUBLE_INT).map(|b| (b.0, b.1)), Some((12, 16)));
        assert_eq!(basic(MPI_2INT).map(|b| (b.0, b.2)), Some((8, Kind::TwoInt)));
        assert!(basic(0x1234).is_none());
    }

    #[test]
    fn the_table_agrees_with_the_match() {
        // Every handle of the table's form, and the pair types beyond it.
        for h in (0x4c00_0000..=0x4c00_ffff).chain(0x8c00_0000u32 as i32..=0x8c00_00ffu32 as i32) {
            assert_eq!(basic(h), basic_slow(h), "handle {h:#x}");
        }
        // The table holds every predefined handle the match knows.
        assert_eq!(
            (0x4c00_0000..=0x4c00_ffff)
                .filter(|&h| basic(h).is_some())
                .count(),
            SIMPLE.len()
        );
    }

    #[test]
    fn vector_and_contiguous_layouts() {
        let d = basic_info(MPI_DOUBLE);
        // A column of a 4x4 matrix: 4 blocks of 8 bytes, 32 bytes apart.
        let v = build((0..4).map(|i| (i * 32, d.clone())));
        assert_eq!((v.size, v.wire, v.extent, v.lb), (32, 32, 104, 0));
        assert_eq!(v.blocks, vec![(0, 8), (32, 8), (64, 8), (96, 8)]);
        assert!(!v.clone().contiguous());
        assert_eq!(v.elem, Some(Kind::F64));
        // Contiguous elements merge into one block.
        let c = build((0..3).map(|i| (i * 8, d.clone())));
        assert_eq!(c.blocks, vec![(0, 24)]);
        assert!(c.contiguous());
        // Mixed kinds have no element kind (no predefined reduction).
        let m = build([(0, d.clone()), (8, basic_info(MPI_INT))].into_iter());
        assert_eq!(m.elem, None);
        assert_eq!((m.size, m.extent), (12, 12));
    }

    #[test]
    fn pack_and_unpack_a_strided_type() {
        let d = basic_info(MPI_BYTE);
        let t = build((0..3).map(|i| (i * 2, d.clone())));
        let src = [1u8, 0, 2, 0, 3, 4, 0, 5, 0, 6, 0];
        let mut packed = [0u8; 6];
        // SAFETY: `src` holds two elements of extent 5 plus the last block.
        unsafe { pack(src.as_ptr(), 2, &t, &mut packed) };
        assert_eq!(packed, [1, 2, 3, 4, 5, 6]);
        let mut dst = [9u8; 11];
        // SAFETY: `dst` holds two elements of `t`.
        unsafe { unpack(dst.as_mut_ptr(), &t, &packed) };
        assert_eq!(dst, [1, 9, 2, 9, 3, 4, 9, 5, 9, 6, 9]);
    }
}
