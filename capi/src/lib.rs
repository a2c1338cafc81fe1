//! libibcoll_mpi: a subset of MPI's C API on ibcoll, with MPICH's ABI
//! (handle values, constants, `MPI_Status` layout) so that programs built
//! against `mpi.h` here, or against Debian's MPICH, run on ibcoll.
//!
//! Threading is `MPI_THREAD_FUNNELED`: the thread that called `MPI_Init`
//! makes every call. The library's state is one static that only that
//! thread reaches (`state.rs`); a call from another thread is an
//! `MPI_ERR_OTHER`.
//!
//! Soundness: a C caller hands over raw pointers with MPI's contract (a
//! buffer is valid for `count` elements, and a nonblocking operation's
//! buffer stays valid and untouched until the request completes). The
//! `unsafe extern "C"` entry points rely on exactly that contract and on
//! nothing more: a nonblocking operation is an ibcoll operation in
//! [`ibcoll::static_scope`] over a `'static` view of the caller's memory,
//! owned by this library's request table until `MPI_Wait`/`MPI_Test`
//! completes it (or `MPI_Finalize` waits for it).
//!
//! No entry point holds the state mutably borrowed while it calls into
//! ibcoll where ibcoll may run user code, so a user reduction
//! (`MPI_Op_create`) may call back into the library: a request's operation
//! is taken out of its slot while it is waited for or tested. The
//! nonblocking calls' fast paths hold it while ibcoll posts a send or
//! receive, which runs no user code. (The blocking calls' fast paths hold
//! it shared while they wait: a user reduction that a pending nonblocking
//! collective runs meanwhile and that calls a function needing it mutably,
//! such as `MPI_Comm_rank`, gets `MPI_ERR_INTERN`.)

#![allow(non_snake_case, non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]
// The entry points and their helpers take MPI's argument lists as they are.
#![allow(clippy::too_many_arguments)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod abi;
mod buffers;
mod coll;
mod comm;
mod datatype;
mod env;
mod error;
mod ops;
mod p2p;
mod packed;
mod requests;
mod state;
mod unsupported;

pub use abi::*;
