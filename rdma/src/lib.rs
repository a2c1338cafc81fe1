//! `ibcoll-rdma`: the verbs layer of ibcoll.
//!
//! * [`device`]: device list (empty, not an error, without kernel RDMA),
//!   ports, GID tables with types, and the device/port/GID choice
//!   ([`DeviceSelection`], env `IBCOLL_IB_DEVICE`, `IBCOLL_IB_PORT`,
//!   `IBCOLL_IB_GID_INDEX`).
//! * [`verbs`]: RAII wrappers — [`ProtectionDomain`], [`CompletionChannel`],
//!   [`CompletionQueue`], [`MemoryRegion`], [`RegisteredBuffer`],
//!   [`QueuePair`] (RC and UD), [`SharedReceiveQueue`], [`AddressHandle`]. Parents are held by `Arc`
//!   so they outlive their children.
//! * [`endpoint`]: [`RcEndpoint`] and its exchangeable [`QpInfo`].
//! * [`ud`]: [`UdEndpoint`], the process's datagram QP (address handles
//!   cached per peer, datagrams up to the path MTU) and its [`UdAddr`].
//! * [`eager`]: the shared receive queue's slots ([`SrqPool`]), shared send
//!   slots, the per-connection flow words peers RDMA-write, and per-pair
//!   receive pools with credit accounting.
//! * [`cache`] + [`mem`]: the registration cache and the release
//!   notifications that keep it from ever serving a stale registration.
//! * [`mcast`]: multicast groups (MGID per job and communicator, attach,
//!   the IP join RoCE needs, RAII leave).
//! * [`rmcast`]: reliable multicast as a state machine without I/O
//!   (fragments, window, nacks, ack tree, loss injection).
//! * [`error`]: the crate's one error type.
//!
//! Posting work requests is `unsafe` (the device accesses memory after the
//! call returns); inline sends are safe.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

pub mod cache;
pub mod device;
pub mod eager;
pub mod endpoint;
pub mod error;
pub mod mcast;
pub mod mem;
pub mod rmcast;
mod sys;
pub mod ud;
pub mod verbs;

pub use cache::{CacheStats, RegCache, RegCacheConfig};
pub use device::{
    best_roce_gid, devices, format_gid_table, AsyncEvent, Context, DeviceAttr, DeviceInfo,
    DeviceSelection, Gid, GidEntry, GidType, LinkLayer, Mtu, PortAttr, PortState, SelectedPort,
};
pub use eager::{
    bye_word, grant_word, Credits, FlowWords, RecvPool, SendSlots, SrqPool, FLOW_WORD_LEN,
};
pub use endpoint::{QpInfo, RcConfig, RcEndpoint};
pub use error::{Ctx, Error, Result};
pub use mcast::{group_gid, McastGroup};
pub use mem::TrackingAlloc;
pub use ud::{Datagram, UdAddr, UdConfig, UdEndpoint, UdStats};
pub use verbs::{
    status_str, Access, AddressHandle, AhAttr, CompletionChannel, CompletionQueue, Grh,
    MemoryRegion, ProtectionDomain, QpCaps, QpType, QueuePair, RcConnectAttr, RegisteredBuffer,
    RemoteBuf, SendFlags, SendOp, SendWr, Sge, SharedReceiveQueue, UdDest, WcOpcode,
    WorkCompletion,
};
