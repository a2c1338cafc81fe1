//! ibcoll: MPI-style communication for Rust HPC programs.
//!
//! ```no_run
//! let world = ibcoll::init()?;
//! let (rank, size) = (world.rank(), world.size());
//! if rank == 0 {
//!     world.send(&[1.0f64, 2.0], 1 % size, 7)?;
//! } else if rank == 1 {
//!     let mut buf = [0.0f64; 2];
//!     let st = world.recv(&mut buf, ibcoll::ANY_SOURCE, ibcoll::ANY_TAG)?;
//!     assert_eq!((st.source, st.tag, st.count::<f64>()), (0, 7, 2));
//! }
//! # Ok::<(), ibcoll::Error>(())
//! ```
//!
//! Processes start under `ibrun` (or any PMI-1 process manager, or alone
//! as a singleton). Peers on the same node talk through shared memory,
//! others through tcp; see `docs/ARCHITECTURE.md`.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod algorithms;
pub(crate) mod check;
pub mod collectives;
pub mod comm;
pub mod config;
pub mod datatype;
pub(crate) mod engine;
pub mod error;
pub(crate) mod fastpath;
mod hier;
mod mcast;
pub mod ops;
pub mod request;
pub mod schedule;
pub mod scope;
pub mod select;
pub mod sim;
pub(crate) mod stamp;
pub mod transport;

use std::sync::atomic::{AtomicBool, Ordering};

pub use algorithms::Collective;
pub use collectives::CollRequest;
pub use comm::{Comm, ANY_SOURCE, ANY_TAG, UNDEFINED};
pub use datatype::Datatype;
pub use error::{Disagreement, Error, Op, Result};
/// Global-allocator wrapper that lets the rdma channel cache memory
/// registrations safely (see `rdma/README.md`): install it with
/// `#[global_allocator] static A: ibcoll::TrackingAlloc = ibcoll::TrackingAlloc::new(std::alloc::System);`.
/// Without it, rendezvous buffers are registered per message.
pub use ibcoll_rdma::TrackingAlloc;
pub use ops::{ReduceOp, Reducible};
pub use request::{wait_all, wait_any, Request, Status};
pub use scope::{scope, static_scope, Scope};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Joins the job and returns the world communicator. Call it once per
/// process; the job is left when the last communicator (and request) is
/// dropped.
pub fn init() -> Result<Comm> {
    if INITIALIZED.swap(true, Ordering::SeqCst) {
        return Err(Error::InvalidArgument {
            rank: 0,
            op: Op::Init,
            detail: "ibcoll::init was already called in this process".into(),
        });
    }
    let eng = engine::Engine::init()?;
    Ok(Comm::world(eng))
}

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What `ibcoll-info` reports about verbs here: the device and port the
/// rdma channel would use, or why there is none.
pub fn rdma_status() -> (bool, String) {
    transport::rdma::status()
}

/// What `ibcoll-info` reports about tcp here: the addresses this process
/// would publish for its listener (comma-separated) and how they were
/// chosen (`IBCOLL_TCP_HOST`, `IBCOLL_TCP_IF`, or the interface rules).
pub fn tcp_address_status() -> std::result::Result<(String, String), String> {
    let cfg = config::Config::from_env().map_err(|e| e.to_string())?;
    let c = engine::bootstrap::tcp_address_choice(&cfg)?;
    let addrs: Vec<String> = c.addrs.iter().map(|a| a.to_string()).collect();
    Ok((addrs.join(","), c.why))
}

/// What `ibcoll-info` reports about single-copy transfers here.
pub fn cma_status() -> (bool, String) {
    match config::Config::from_env() {
        Ok(c) => engine::bootstrap::cma_usable(&c),
        Err(e) => (false, e.to_string()),
    }
}

/// The node segment layout this configuration (the environment) gives a
/// node of `ppn` ranks, as `ibcoll-info --ppn` prints it.
pub fn shm_layout(ppn: usize) -> Result<ibcoll_shm::NodeLayout> {
    let cfg = config::Config::from_env()?;
    ibcoll_shm::NodeLayout::from_params(engine::bootstrap::layout_params(&cfg, ppn)).map_err(|e| {
        Error::InvalidArgument {
            rank: 0,
            op: Op::Init,
            detail: e.to_string(),
        }
    })
}
