//! Channels: one per peer this rank talks to (tcp ones made on first use,
//! see [`tcp_connect`]). Every channel carries the
//! same records (a [`header::Header`] plus payload) in order, and knows how
//! to move rendezvous data its own way:
//!
//! | channel | eager | rendezvous |
//! |---|---|---|
//! | [`local::LocalChannel`] (self) | queue in memory | receiver copies from the sender's buffer |
//! | [`shm::ShmChannel`] (same node) | SPSC ring | receiver reads the sender's buffer by CMA, else pipelined copy |
//! | [`tcp::TcpChannel`] (other node) | socket | DATA frame streamed into the user buffer |
//! | [`rdma::RdmaChannel`] (other node, verbs) | SEND into pre-posted buffers, credits | RDMA read (or write) between the registered user buffers, then FIN |

pub mod header;
pub(crate) mod local;
pub mod netif;
pub(crate) mod rdma;
pub(crate) mod rdma_cm;
pub(crate) mod rdma_flow;
pub(crate) mod shm;
pub(crate) mod tcp;
pub(crate) mod tcp_connect;

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

/// A goodbye record: `cause` is one plus the world rank whose loss failed
/// one of this rank's operations first (0: none), carried in `seq`, so
/// that a peer still waiting for this rank when it leaves names the rank
/// that was lost first, not only this one (a rank that gives up on a
/// collective because a member left finalizes in its turn).
pub(crate) fn bye_header(cause: u64) -> Header {
    let mut h = Header::new(header::Kind::Bye);
    h.seq = cause;
    h
}

/// One peer's channel.
pub(crate) enum Channel {
    Local(local::LocalChannel),
    Shm(shm::ShmChannel),
    Tcp(tcp::TcpChannel),
    Rdma(Box<rdma::RdmaChannel>),
    /// A tcp pair before its connection is up (or that never got one).
    Connecting(Box<tcp_connect::Connecting>),
}

impl Channel {
    pub fn name(&self) -> &'static str {
        match self {
            Channel::Local(_) => "self",
            Channel::Shm(_) => "shm",
            Channel::Tcp(_) | Channel::Connecting(_) => "tcp",
            Channel::Rdma(_) => "rdma",
        }
    }

    /// Largest message sent eagerly.
    #[inline]
    pub fn eager_limit(&self) -> usize {
        match self {
            Channel::Local(c) => c.eager_limit,
            Channel::Shm(c) => c.eager_limit,
            Channel::Tcp(c) => c.eager_limit,
            Channel::Rdma(c) => c.eager_limit,
            Channel::Connecting(c) => c.eager_limit,
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
            Channel::Rdma(c) => c.try_send(hdr, payload),
            Channel::Connecting(c) => c.try_send(),
        }
    }

    /// The address to put in an RTS for `buf`: nonzero only when the peer
    /// will read it directly.
    pub fn rts_addr(&self, buf: *const u8) -> u64 {
        match self {
            Channel::Local(_) => buf as u64,
            Channel::Shm(c) if c.cma => buf as u64,
            // The rdma channel registers it and sends its key along.
            Channel::Rdma(_) => buf as u64,
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
            Channel::Tcp(_) | Channel::Rdma(_) | Channel::Connecting(_) => PeerInfo {
                cma_pid: None,
                local: false,
            },
        }
    }

    /// Moves whatever can move now; returns how many things happened.
    #[inline(always)]
    pub fn poll(&mut self, peer: usize, st: &mut State) -> usize {
        // Self and shm polls start with an inlined idle check, so an idle
        // pass over them stays a few loads; the others are called out of
        // line to keep this small enough to inline into the progress loop.
        match self {
            Channel::Local(c) => c.poll(peer, st),
            Channel::Shm(c) => c.poll(peer, st),
            _ => self.poll_net(peer, st),
        }
    }

    #[inline(never)]
    fn poll_net(&mut self, peer: usize, st: &mut State) -> usize {
        match self {
            Channel::Tcp(c) => c.poll(peer, st),
            // Its completions come through the shared CQ
            // (`Engine::progress_rdma`), not per channel.
            Channel::Rdma(_) => 0,
            Channel::Local(_) | Channel::Shm(_) | Channel::Connecting(_) => 0,
        }
    }

    /// Sender side, after CTS: stream `len` bytes at `ptr` to the receive
    /// `recv_token`; `send_token` completes when done.
    pub fn start_stream(&mut self, send_token: Token, recv_token: u64, ptr: *const u8, len: usize) {
        match self {
            Channel::Local(_) | Channel::Connecting(_) => {}
            Channel::Shm(c) => c.start_stream(send_token, ptr, len),
            Channel::Tcp(c) => c.start_stream(send_token, recv_token, ptr, len),
            Channel::Rdma(c) => c.start_stream(send_token, recv_token, ptr, len),
        }
    }

    /// Receiver side, before CTS: `wanted` bytes for `recv_token` will
    /// arrive as a stream into `buf` (the shm pipe needs to know in
    /// advance; rdma registers `buf` and names it in the CTS).
    pub fn expect_stream(&mut self, recv_token: Token, wanted: usize, buf: *mut u8) {
        match self {
            Channel::Shm(c) => c.expect_stream(recv_token, wanted),
            Channel::Rdma(c) => c.expect_stream(recv_token, wanted, buf),
            _ => {}
        }
    }

    /// Receiver side, shm with CMA: copy `wanted` bytes at `addr` in the
    /// peer (send `send_token`) into `buf` for receive `recv_token`, then
    /// answer FIN.
    pub fn start_cma_read(
        &mut self,
        recv_token: Token,
        send_token: u64,
        addr: u64,
        buf: *mut u8,
        wanted: usize,
    ) {
        if let Channel::Shm(c) = self {
            c.start_cma_read(recv_token, send_token, addr, buf, wanted);
        }
    }

    #[inline(always)]
    pub fn health(&self) -> &Health {
        match self {
            Channel::Local(_) => &Health::Open,
            Channel::Shm(c) => &c.health,
            Channel::Tcp(c) => &c.health,
            Channel::Rdma(c) => &c.health,
            Channel::Connecting(c) => &c.health,
        }
    }

    /// Why the peer finalized, as its goodbye said: the world rank whose
    /// loss failed one of its operations first, if one did.
    pub fn bye_cause(&self) -> Option<usize> {
        let c = match self {
            Channel::Shm(c) => c.bye_cause(),
            Channel::Tcp(c) => c.bye_cause,
            Channel::Rdma(c) => c.bye_cause,
            Channel::Local(_) | Channel::Connecting(_) => 0,
        };
        (c as usize).checked_sub(1)
    }

    /// True while the channel holds outgoing work it could not hand over
    /// yet (the engine must not block for long).
    pub fn has_backlog(&self) -> bool {
        match self {
            Channel::Local(c) => c.has_backlog(),
            Channel::Shm(c) => c.has_backlog(),
            Channel::Tcp(c) => c.has_backlog(),
            Channel::Rdma(c) => c.has_backlog(),
            Channel::Connecting(_) => false,
        }
    }

    /// Checks that the peer process still exists (shm); returns a reason if
    /// it does not.
    pub fn check_alive(&mut self) -> Option<String> {
        match self {
            Channel::Shm(c) => c.check_alive(),
            Channel::Rdma(c) => c.check_alive(),
            _ => None,
        }
    }

    /// This rank's side of the channel's work in flight, for a hang
    /// report (shm only: its streams live in memory both sides see).
    pub fn describe(&self) -> Option<String> {
        match self {
            Channel::Shm(c) => Some(c.describe()),
            _ => None,
        }
    }

    /// Marks the channel failed.
    pub fn fail(&mut self, reason: String) {
        match self {
            Channel::Local(_) => {}
            Channel::Shm(c) => c.health = Health::Failed(reason),
            Channel::Tcp(c) => c.health = Health::Failed(reason),
            Channel::Rdma(c) => c.fail(reason),
            Channel::Connecting(c) => c.health = Health::Failed(reason),
        }
    }
}
