//! FFI pieces that `rdma-sys` does not expose, plus small shared helpers.

use rdma_sys::{ibv_context, ibv_gid_entry};
use std::os::raw::c_int;

/// `enum ibv_link_layer` values (an anonymous enum in verbs.h).
pub(crate) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

#[link(name = "ibverbs")]
extern "C" {
    /// `ibv_query_gid_table()` is a static inline wrapper around this exported
    /// symbol (rdma-core >= 32). Returns the number of valid entries or -errno.
    pub(crate) fn _ibv_query_gid_table(
        context: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize;
}

/// Current `errno`.
pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A NUL-terminated C char array to a Rust string (lossy).
pub(crate) fn cstr_array(a: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
