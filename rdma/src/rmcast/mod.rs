//! Reliable multicast over a lossy datagram group, as a state machine
//! without I/O (quinn-proto's shape): the caller moves packets between the
//! UD QP, its reliable point-to-point channel and a [`Member`], and gives
//! it the time; nothing here touches verbs, so every path is tested in one
//! process with injected loss (`tests.rs`).
//!
//! The protocol (docs/ARCHITECTURE.md, "Reliable multicast", says why):
//! * Every member calls [`Member::begin`] for every broadcast of the group,
//!   in the same order, with the same root and length; broadcast *k* is
//!   numbered *k* everywhere, so packets of different broadcasts never mix
//!   and a fast root's next broadcast can arrive before a slow member has
//!   begun it (kept, up to `early_cap` fragments, else repaired later).
//! * The root cuts the message into `mtu - 32`-byte fragments and sends
//!   them to the group; it holds at most `window` fragments not yet
//!   acknowledged by everyone (a copy, so its call returns once everything
//!   is sent and its buffer is free; later broadcasts wait for room).
//! * Loss repair by nack to the root over the reliable channel: a gap is
//!   nacked at once, a quiet `nack_delay` nacks what is still missing; the
//!   root retransmits by multicast, each fragment at most once per
//!   `retx_holdoff` however many members ask (suppression at the root).
//! * Acknowledgement by a binomial tree rooted at the broadcast's root:
//!   each member reports the prefix its whole subtree holds every
//!   `ack_step` fragments and at the end, so the root hears from log2(n)
//!   children, never from everyone, and frees its window from the front.
//! * A member waiting `peer_timeout` without progress fails with
//!   [`Error::PeerLost`] naming the root (data) or the subtree's laggard
//!   (acks): a dead member is an error within that bound, not a hang.

mod drop;
mod member;
#[cfg(test)]
mod tests;
pub mod wire;

pub use drop::DropFilter;
pub use member::{tree, Config, Data, Dest, Error, Member, Stats, Transmit};
