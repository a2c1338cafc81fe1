//! Channels: one per peer, chosen once at init. Every channel carries the
//! same records (a [`header::Header`] plus payload) in order, and knows how
//! to move rendezvous data its own way:
//!
//! | channel | eager | rendezvous |
//! |---|---|---|
//! | [`local::LocalChannel`] (self) | queue in memory | receiver copies from the sender's buffer |
//! | [`shm::ShmChannel`] (same node) | SPSC ring | receiver reads the sender's buffer by CMA, else pipelined copy |
//! | [`tcp::TcpChannel`] (other node) | socket | DATA frame streamed into the user buffer |
//!
//! An rdma channel would be one more variant: records over an RC queue pair,
//! rendezvous by RDMA read into the receive buffer (like CMA here).

pub mod header;
pub(crate) mod local;
pub(crate) mod shm;
pub(crate) mod tcp;

use crate::engine::ops::Token;
use crate::engine::State;
use header::Header;

/// What the receiving side needs to know about where a record came from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerInfo {
    /// Pid to read rendezvous data from by CMA, when that works for this
    /// pair; `None` means the data must be streamed (CTS).
    pub cma_pid: Option<i32>,
    /// The peer is this process: copy with memcpy.
    pub local: bool,
}

/// A channel's view of its peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Health {
    Open,
    /// The peer said goodbye (finalized); nothing more will come.
    Closed,
    /// The peer died or the connection broke.
    Failed(String),
}

/// One peer's channel.
pub(crate) enum Channel {
    Local(local::LocalChannel),
    Shm(shm::ShmChannel),
    Tcp(tcp::TcpChannel),
}

impl Channel {
    pub fn name(&self) -> &'static str {
        match self {
            Channel::Local(_) => "self",
            Channel::Shm(_) => "shm",
            Channel::Tcp(_) => "tcp",
        }
    }

    /// Largest message sent eagerly.
    #[inline]
    pub fn eager_limit(&self) -> usize {
        match self {
            Channel::Local(c) => c.eager_limit,
            Channel::Shm(c) => c.eager_limit,
            Channel::Tcp(c) => c.eager_limit,
        }
    }

    /// Sends one record, or returns false (sending nothing) if there is no
    /// room now.
    #[inline]
    pub fn try_send(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        match self {
            Channel::Local(c) => c.try_send(hdr, payload),
            Channel::Shm(c) => c.try_send(hdr, payload),
            Channel::Tcp(c) => c.try_send(hdr, payload),
        }
    }

    /// The address to put in an RTS for `buf`: nonzero only when the peer
    /// will read it directly.
    pub fn rts_addr(&self, buf: *const u8) -> u64 {
        match self {
            Channel::Local(_) => buf as u64,
            Channel::Shm(c) if c.cma => buf as u64,
            _ => 0,
        }
    }

    pub fn info(&self) -> PeerInfo {
        match self {
            Channel::Local(c) => PeerInfo {
                cma_pid: Some(c.pid),
                local: true,
            },
            Channel::Shm(c) => PeerInfo {
                cma_pid: c.cma.then_some(c.peer_pid),
                local: false,
            },
            Channel::Tcp(_) => PeerInfo {
                cma_pid: None,
                local: false,
            },
        }
    }

    /// Moves whatever can move now; returns how many things happened.
    #[inline]
    pub fn poll(&mut self, peer: usize, st: &mut State) -> usize {
        match self {
            Channel::Local(c) => c.poll(peer, st),
            Channel::Shm(c) => c.poll(peer, st),
            Channel::Tcp(c) => c.poll(peer, st),
        }
    }

    /// Sender side, after CTS: stream `len` bytes at `ptr` to the receive
    /// `recv_token`; `send_token` completes when done.
    pub fn start_stream(&mut self, send_token: Token, recv_token: u64, ptr: *const u8, len: usize) {
        match self {
            Channel::Local(_) => {}
            Channel::Shm(c) => c.start_stream(send_token, ptr, len),
            Channel::Tcp(c) => c.start_stream(send_token, recv_token, ptr, len),
        }
    }

    /// Receiver side, before CTS: `wanted` bytes for `recv_token` will
    /// arrive as a stream (only the shm pipe needs to know in advance).
    pub fn expect_stream(&mut self, recv_token: Token, wanted: usize) {
        if let Channel::Shm(c) = self {
            c.expect_stream(recv_token, wanted);
        }
    }

    pub fn health(&self) -> &Health {
        match self {
            Channel::Local(_) => &Health::Open,
            Channel::Shm(c) => &c.health,
            Channel::Tcp(c) => &c.health,
        }
    }

    /// True while the channel holds outgoing work it could not hand over
    /// yet (the engine must not block for long).
    pub fn has_backlog(&self) -> bool {
        match self {
            Channel::Local(c) => c.has_backlog(),
            Channel::Shm(c) => c.has_backlog(),
            Channel::Tcp(c) => c.has_backlog(),
        }
    }

    /// Checks that the peer process still exists (shm); returns a reason if
    /// it does not.
    pub fn check_alive(&mut self) -> Option<String> {
        match self {
            Channel::Shm(c) => c.check_alive(),
            _ => None,
        }
    }

    /// Marks the channel failed.
    pub fn fail(&mut self, reason: String) {
        match self {
            Channel::Local(_) => {}
            Channel::Shm(c) => c.health = Health::Failed(reason),
            Channel::Tcp(c) => c.health = Health::Failed(reason),
        }
    }
}
