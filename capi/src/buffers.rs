//! Views of the caller's buffers: contiguous data is used in place (no
//! copy), other derived types are packed into, or received into and
//! unpacked from, a buffer of this library's.

use std::os::raw::{c_int, c_void};
use std::rc::Rc;

use crate::abi::*;
use crate::datatype::{pack, unpack, Ty, TypeInfo};
use crate::error::{err, R};

pub fn is_in_place(p: *const c_void) -> bool {
    p as usize == MPI_IN_PLACE
}

/// Checks `count` and the buffer, and gives the bytes on the wire.
#[inline(always)]
pub fn wire_len(buf: *const c_void, count: c_int, t: &Ty) -> R<usize> {
    if count < 0 {
        return bad_count(count);
    }
    let n = count as usize * t.wire();
    // A null buffer is MPI_BOTTOM, meaningful only with a derived type of
    // absolute addresses.
    if n > 0 && buf.is_null() && matches!(t, Ty::Basic { .. }) {
        return err(
            MPI_ERR_BUFFER,
            format!("buffer is a null pointer with count {count}"),
        );
    }
    Ok(n)
}

/// [`wire_len`] of a predefined type of `ext` bytes.
#[inline(always)]
pub fn basic_len(buf: *const c_void, count: c_int, ext: usize) -> R<usize> {
    if count < 0 {
        return bad_count(count);
    }
    let n = count as usize * ext;
    if n > 0 && buf.is_null() {
        return null_buffer(count);
    }
    Ok(n)
}

#[cold]
fn null_buffer<T>(count: c_int) -> R<T> {
    err(
        MPI_ERR_BUFFER,
        format!("buffer is a null pointer with count {count}"),
    )
}

#[cold]
fn bad_count<T>(count: c_int) -> R<T> {
    err(MPI_ERR_COUNT, format!("count {count} is negative"))
}

/// `n` bytes at `p` as a slice.
///
/// # Safety
/// `p` is valid for reads of `n` bytes for `'a` (MPI's buffer contract).
#[inline(always)]
pub unsafe fn bytes<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p as *const u8, n) }
}

/// `n` bytes at `p` as a mutable slice.
///
/// # Safety
/// `p` is valid for writes of `n` bytes for `'a`, and nothing else uses
/// them meanwhile (MPI's buffer contract).
#[inline(always)]
pub unsafe fn bytes_mut<'a>(p: *mut c_void, n: usize) -> &'a mut [u8] {
    if n == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
}

/// Data to send: the caller's bytes, or a packed copy of them.
pub enum Out<'a> {
    Direct(&'a [u8]),
    Packed(Vec<u8>),
}

impl Out<'_> {
    #[inline(always)]
    pub fn bytes(&self) -> &[u8] {
        match self {
            Out::Direct(b) => b,
            Out::Packed(v) => v,
        }
    }
}

/// The data of `count` elements of `t` at `buf`.
///
/// # Safety
/// `buf` holds `count` elements of `t` for `'a`.
#[inline(always)]
pub unsafe fn out<'a>(buf: *const c_void, count: c_int, t: &Ty) -> R<Out<'a>> {
    let n = wire_len(buf, count, t)?;
    if t.is_contiguous() {
        // SAFETY: the caller's contract; a contiguous type's `count`
        // elements are `n` bytes.
        return Ok(Out::Direct(unsafe { bytes(buf, n) }));
    }
    let info = t.info();
    let mut v = vec![0u8; n];
    // SAFETY: the caller's contract.
    unsafe { pack(buf as *const u8, count as usize, &info, &mut v) };
    Ok(Out::Packed(v))
}

/// Where received data goes: the caller's bytes, or a staging buffer
/// unpacked into the caller's elements afterwards.
pub enum In<'a> {
    Direct(&'a mut [u8]),
    Staged(Staged),
}

pub struct Staged {
    pub data: Vec<u8>,
    pub dst: *mut u8,
    pub t: Rc<TypeInfo>,
}

impl Staged {
    /// Unpacks the first `n` received bytes.
    ///
    /// # Safety
    /// `dst` still holds the elements the receive was posted for.
    pub unsafe fn finish(&self, n: usize) {
        let n = n.min(self.data.len());
        // SAFETY: the caller's contract; `n` bytes are whole elements or
        // rounded down to them.
        unsafe { unpack(self.dst, &self.t, &self.data[..n]) }
    }
}

impl In<'_> {
    #[inline(always)]
    pub fn bytes(&mut self) -> &mut [u8] {
        match self {
            In::Direct(b) => b,
            In::Staged(s) => &mut s.data,
        }
    }
}

/// Where `count` elements of `t` at `buf` are received.
///
/// # Safety
/// `buf` holds `count` elements of `t`, writable, for `'a`.
#[inline(always)]
pub unsafe fn inb<'a>(buf: *mut c_void, count: c_int, t: &Ty) -> R<In<'a>> {
    let n = wire_len(buf, count, t)?;
    match t {
        Ty::Derived(info) if !t.is_contiguous() => Ok(In::Staged(Staged {
            data: vec![0u8; n],
            dst: buf as *mut u8,
            t: info.clone(),
        })),
        // SAFETY: the caller's contract.
        _ => Ok(In::Direct(unsafe { bytes_mut(buf, n) })),
    }
}

/// A `'static` view of a staging buffer's heap block, for a nonblocking
/// operation that the owner of `v` keeps alive until it completes.
///
/// # Safety
/// `v` is not read, resized or dropped until the operation is done.
pub unsafe fn forever_mut(v: &mut [u8]) -> &'static mut [u8] {
    // SAFETY: the caller's contract; the heap block does not move when the
    // vector that owns it moves.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr(), v.len()) }
}

/// A `'static` view of the caller's or a staging buffer for a
/// nonblocking send.
///
/// # Safety
/// As [`forever_mut`], for reads.
pub unsafe fn forever(v: &[u8]) -> &'static [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(v.as_ptr(), v.len()) }
}

/// Stores `s` through a status pointer unless it is `MPI_STATUS_IGNORE`.
#[inline(always)]
pub fn put_status(p: *mut MPI_Status, s: MPI_Status) {
    // Null (0) and MPI_STATUS_IGNORE (1) in one compare.
    const _: () = assert!(MPI_STATUS_IGNORE == 1);
    if p as usize > MPI_STATUS_IGNORE {
        // SAFETY: not null nor MPI_STATUS_IGNORE: the caller's status
        // (MPI's contract).
        unsafe { p.write(s) }
    }
}

/// Stores `v` through an output pointer (an error if it is null).
#[inline(always)]
pub fn put<T>(p: *mut T, v: T, what: &str) -> R<()> {
    if p.is_null() {
        return err(MPI_ERR_ARG, format!("{what} is a null pointer"));
    }
    // SAFETY: not null: the caller's output argument (MPI's contract).
    unsafe { p.write(v) };
    Ok(())
}
