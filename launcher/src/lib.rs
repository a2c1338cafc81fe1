//! ibcoll's launcher side: the PMI-1 protocol (wire format, server state
//! machine, client), the placement of ranks on nodes, and the pieces of
//! `ibrun` that are worth testing without processes.

pub mod client;
pub mod codec;
pub mod conns;
pub mod hang_report;
pub mod kvs_host;
pub mod mapping;
pub mod poller;
pub mod server;
pub mod slurm;
pub mod wire;

pub use client::{InitMode, Placement, Pmi, PmiError, PmiStats};
pub use mapping::NodeMap;
