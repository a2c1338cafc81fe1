//! Functions `mpi.h` declares that ibcoll does not implement (one-sided,
//! I/O, spawn, topologies): each reports
//! MPI_ERR_UNSUPPORTED_OPERATION naming itself, through MPI_COMM_WORLD's
//! error handler, so programs that only reference them build and run.
//!
//! They are defined without parameters: under the C calling convention
//! the caller's arguments are simply not read (the caller owns them).

use std::os::raw::c_int;

use crate::abi::*;
use crate::error::{fail, MpiErr};

fn unsupported(name: &str) -> c_int {
    fail(
        name,
        MPI_COMM_WORLD,
        MpiErr::new(
            MPI_ERR_UNSUPPORTED_OPERATION,
            format!("{name} is not implemented by ibcoll's MPI interface"),
        ),
    )
}

macro_rules! unsupported {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            unsupported(stringify!($name))
        }
    )*};
}

unsupported!(
    MPI_Win_create,
    MPI_Win_allocate,
    MPI_Win_allocate_shared,
    MPI_Win_free,
    MPI_Win_get_attr,
    MPI_Win_fence,
    MPI_Win_lock,
    MPI_Win_unlock,
    MPI_Win_lock_all,
    MPI_Win_unlock_all,
    MPI_Win_flush,
    MPI_Win_flush_all,
    MPI_Win_sync,
    MPI_Put,
    MPI_Get,
    MPI_Accumulate,
    MPI_File_open,
    MPI_File_close,
    MPI_Comm_spawn,
    MPI_Cart_create,
    MPI_Comm_create_errhandler,
);
