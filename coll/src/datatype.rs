//! Typed buffers: the primitive numeric types that may travel as raw bytes.
//!
//! [`Datatype`] is sealed: it is implemented exactly for types where every
//! bit pattern is a valid value and there is no padding, so viewing a slice
//! of them as bytes (and writing received bytes into them) is sound.

mod sealed {
    pub trait Sealed {}
}

/// Element types of send and receive buffers.
pub trait Datatype: sealed::Sealed + Copy + Send + Sync + 'static {
    /// Short name, for messages and benchmark output.
    const NAME: &'static str;
}

macro_rules! impl_datatype {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Datatype for $t {
            const NAME: &'static str = stringify!($t);
        }
    )*};
}

impl_datatype!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);

/// The bytes of a typed slice.
pub fn as_bytes<T: Datatype>(s: &[T]) -> &[u8] {
    // SAFETY: `Datatype` is only implemented for primitive numeric types,
    // which have no padding and no invalid bit patterns; the byte view
    // covers exactly the slice's memory and borrows it immutably.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// The bytes of a typed mutable slice; any bytes written are valid values.
pub fn as_bytes_mut<T: Datatype>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; additionally every bit pattern is a valid
    // `T`, so writing arbitrary bytes through the view keeps `s` valid.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_views() {
        let mut v = [1u32, 2, 3];
        assert_eq!(as_bytes(&v).len(), 12);
        as_bytes_mut(&mut v)[0] = 9;
        assert_eq!(v[0], u32::from_ne_bytes([9, 0, 0, 0]));
        let f = [1.5f64];
        assert_eq!(as_bytes(&f), &1.5f64.to_ne_bytes());
        assert_eq!(<f32 as Datatype>::NAME, "f32");
    }
}
