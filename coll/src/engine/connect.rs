//! The network side of the engine: the tcp listener, connections made on
//! first use, the sockets the listener accepted, and the epoll set that
//! tells a progress pass which of them have something to do.
//!
//! A peer on another node gets a channel only when this rank first sends to
//! it ([`Engine::open_channel`]: fetch its card, [`card::plan`] the pair,
//! dial, or start the rdma handshake of `rdma_connect.rs`) or when it first
//! connects here ([`Engine::step_incoming`]); the
//! rules that keep exactly one connection per pair are in
//! [`crate::transport::tcp_connect`]. Sends wait in the peer's queue until
//! the connection is up, so they keep their order.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::card::{self, Card, Transport};
use super::netpoll::{NetPoll, Source};
use super::Engine;
use crate::transport::tcp::{tune_socket, TcpChannel};
use crate::transport::tcp_connect::{
    keep_incoming, Connecting, Dial, DialStep, Hello, Incoming, IncomingStep, ACCEPT, REJECT,
};
use crate::transport::{Channel, Health};

/// Passes between looks at a listener that is the only socket (first
/// contacts are rare; every pass would cost a syscall on the shm path).
const LISTENER_ONLY_EVERY: u32 = 64;

/// Connections waiting in the kernel for this rank to accept them (the
/// default of 128 overflows when hundreds of peers make first contact at
/// once, and each overflow costs the dialer a SYN retransmit of a second).
const LISTEN_BACKLOG: i32 = 4096;

/// The network side (see the module documentation).
pub(crate) struct Net {
    pub poll: NetPoll,
    pub listener: Option<TcpListener>,
    /// Accepted sockets whose hello has not arrived yet.
    pub incoming: Vec<Incoming>,
    /// World ranks this rank is dialing.
    pub dialing: Vec<usize>,
    /// World ranks whose tcp channel has queued output that no socket
    /// event will announce (a stream queued on an idle socket).
    pub busy: Vec<usize>,
    /// Sockets registered (the listener, dials, accepted ones, channels).
    pub sockets: usize,
    /// Passes since the last look while the listener is the only socket.
    skipped: u32,
    pub job: u64,
}

impl Net {
    pub fn new(job: u64) -> std::io::Result<Net> {
        Ok(Net {
            poll: NetPoll::new()?,
            listener: None,
            incoming: Vec::new(),
            dialing: Vec::new(),
            busy: Vec::new(),
            sockets: 0,
            skipped: 0,
            job,
        })
    }

    /// Binds the listener (all addresses, any port) and watches it.
    pub fn listen(&mut self) -> std::io::Result<u16> {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
        s.listen(LISTEN_BACKLOG)?;
        s.set_nonblocking(true)?;
        let l: TcpListener = s.into();
        let port = l.local_addr()?.port();
        self.poll.add_input(l.as_raw_fd(), Source::Listener)?;
        self.sockets += 1;
        self.listener = Some(l);
        Ok(port)
    }

    /// Closes the listener and the accepted sockets whose hello has not
    /// been answered, before a finalize's fence (which makes no progress):
    /// a peer dialing this rank then sees the connection reset or refused
    /// and fails within its connect bound, instead of waiting for an answer
    /// that would never come while this rank waits for it in the fence.
    pub fn refuse_new(&mut self) {
        if let Some(l) = self.listener.take() {
            self.unwatch(l.as_raw_fd());
        }
        for inc in std::mem::take(&mut self.incoming) {
            self.unwatch(inc.sock.as_raw_fd());
        }
    }

    fn watch(&mut self, fd: std::os::fd::RawFd, s: Source) {
        if self.poll.add_socket(fd, s).is_ok() {
            self.sockets += 1;
        }
    }

    fn unwatch(&mut self, fd: std::os::fd::RawFd) {
        self.poll.remove(fd);
        self.sockets = self.sockets.saturating_sub(1);
    }

    /// Whether this pass should ask epoll: always while connections
    /// exist, now and then while only the listener does.
    #[inline]
    pub fn due(&mut self) -> bool {
        if self.sockets == 0 {
            return false;
        }
        if self.sockets > 1 || !self.incoming.is_empty() || !self.dialing.is_empty() {
            return true;
        }
        self.skipped += 1;
        if self.skipped >= LISTENER_ONLY_EVERY {
            self.skipped = 0;
            return true;
        }
        false
    }
}

impl Engine {
    /// Makes the channel of a peer this rank has none to yet, returning its
    /// entry: a dial for a tcp peer, or a failed channel naming why there
    /// can be none (the operations then fail with that reason).
    #[cold]
    #[inline(never)]
    pub(crate) fn open_channel(&mut self, peer: usize) -> usize {
        let chan = self.first_contact(peer);
        let dial_fd = match &chan {
            Channel::Connecting(c) => c.dial.as_ref().and_then(|d| d.fd()),
            _ => None,
        };
        let dialing = matches!(&chan, Channel::Connecting(c) if c.dial.is_some());
        // An rdma channel's completions come through the shared CQ: not
        // polled per channel.
        let slot = self.peers.add(peer, chan, false);
        if let Some(net) = &mut self.net {
            if let Some(fd) = dial_fd {
                net.watch(fd, Source::Peer(peer));
            }
            if dialing {
                net.dialing.push(peer);
            }
        }
        self.health_dirty = true;
        slot
    }

    fn first_contact(&mut self, peer: usize) -> Channel {
        let limit = self.cfg.tcp_eager_limit;
        let fail = |why: String| Channel::Connecting(Box::new(Connecting::failed(why, limit)));
        if peer >= self.size() {
            return fail(format!("rank {peer} is not in the job of {}", self.size()));
        }
        let card = match self.fetch_card(peer) {
            Ok(c) => c,
            Err(why) => return fail(why),
        };
        match card::plan(&self.me, &card, self.cfg.transport, self.use_shm) {
            Ok(Transport::Tcp) => {}
            Ok(Transport::Rdma) => return self.open_rdma(peer, &card),
            Ok(t) => {
                return fail(format!(
                    "the pair should talk over {} (set up at init), but has no such channel",
                    t.name()
                ))
            }
            Err(why) => return fail(why),
        }
        if card.port == 0 {
            return fail("it has no tcp listener".into());
        }
        let me = self.rank() as u32;
        let Some(net) = &mut self.net else {
            return fail("this rank has no network side (no tcp listener)".into());
        };
        // A peer on this host (and network namespace) is reached over
        // loopback, unless the user chose its addresses.
        let addrs: Vec<SocketAddr> = if card.host == self.me.host && !card.explicit {
            vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), card.port)]
        } else {
            card.addrs
                .iter()
                .map(|&a| SocketAddr::new(a, card.port))
                .collect()
        };
        let hello = Hello {
            job: net.job,
            rank: me,
        };
        self.stats.dials += 1;
        let dial = Dial::new(addrs, hello, self.cfg.peer_timeout);
        Channel::Connecting(Box::new(Connecting::new(Some(dial), limit)))
    }

    /// Peer `peer`'s bootstrap card, from the key-value space.
    fn fetch_card(&mut self, peer: usize) -> std::result::Result<Card, String> {
        let pmi = self
            .pmi
            .as_mut()
            .ok_or_else(|| "the job has left its process manager".to_string())?;
        let b = pmi
            .get(&super::bootstrap::card_key(peer))
            .map_err(|e| format!("its bootstrap card: {e}"))?;
        self.stats.cards_fetched += 1;
        self.stats.gets += 1;
        self.stats.fetched_bytes += b.len() as u64;
        Card::decode(&b)
            .ok_or_else(|| "its bootstrap card does not parse (different ibcoll versions?)".into())
    }

    /// Installs `sock` as `peer`'s tcp channel (replacing a dial) and
    /// watches it.
    fn install_tcp(&mut self, peer: usize, sock: std::net::TcpStream) -> usize {
        tune_socket(&sock, self.cfg.peer_timeout, self.cfg.tcp_buf_bytes);
        let fd = sock.as_raw_fd();
        let chan = match TcpChannel::new(sock, self.cfg.tcp_eager_limit) {
            Ok(c) => Channel::Tcp(c),
            Err(e) => Channel::Connecting(Box::new(Connecting::failed(
                format!("tcp socket setup: {e}"),
                self.cfg.tcp_eager_limit,
            ))),
        };
        let ok = matches!(chan, Channel::Tcp(_));
        let slot = self.peers.add(peer, chan, false);
        if ok {
            if let Some(net) = &mut self.net {
                net.watch(fd, Source::Peer(peer));
            }
            if !self.tcp_peers.contains(&peer) {
                self.tcp_peers.push(peer);
            }
        }
        // Its queued sends can go now.
        self.health_dirty = true;
        slot
    }

    /// Moves every dial on; returns how many ended.
    pub(crate) fn step_dials(&mut self) -> usize {
        let mut n = 0;
        let mut k = 0;
        let wait = self.cfg.peer_timeout.max(Duration::from_secs(1));
        while let Some(&peer) = self.net.as_ref().and_then(|net| net.dialing.get(k)) {
            let outcome = match self.peers.get_mut(peer).map(|p| &mut p.chan) {
                Some(Channel::Connecting(c)) => step_dial(c, wait),
                // Replaced by the peer's own connection.
                _ => Outcome::Gone,
            };
            let net = self.net_mut();
            match outcome {
                Outcome::Pending { before, after } => {
                    // A retry opens a new socket: watch it instead.
                    if before != after {
                        if let Some(fd) = before {
                            net.unwatch(fd);
                        }
                        if let Some(fd) = after {
                            net.watch(fd, Source::Peer(peer));
                        }
                    }
                    k += 1;
                }
                Outcome::Waiting => k += 1,
                Outcome::Rejected(fd) => {
                    if let Some(fd) = fd {
                        net.unwatch(fd);
                    }
                    self.stats.rejected += 1;
                    n += 1;
                    k += 1;
                }
                Outcome::Accepted(fd, sock) => {
                    if let Some(fd) = fd {
                        net.unwatch(fd);
                    }
                    net.dialing.swap_remove(k);
                    self.install_tcp(peer, sock);
                    n += 1;
                }
                Outcome::Ended(fd) => {
                    if let Some(fd) = fd {
                        net.unwatch(fd);
                    }
                    net.dialing.swap_remove(k);
                    self.health_dirty = true;
                    n += 1;
                }
                Outcome::Gone => {
                    net.dialing.swap_remove(k);
                }
            }
        }
        n
    }

    fn net_mut(&mut self) -> &mut Net {
        self.net
            .as_mut()
            .expect("dials and sockets exist only with a network side")
    }

    /// Accepts every connection waiting on the listener.
    fn accept_all(&mut self) -> usize {
        let mut n = 0;
        let timeout = self.cfg.peer_timeout;
        loop {
            let net = self.net_mut();
            let Some(l) = &net.listener else { return n };
            match l.accept() {
                Ok((s, _)) => match Incoming::new(s, timeout) {
                    Ok(inc) => {
                        let fd = inc.sock.as_raw_fd();
                        net.watch(fd, Source::Incoming);
                        net.incoming.push(inc);
                        n += 1;
                    }
                    Err(_) => continue,
                },
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return n,
            }
        }
    }

    /// Reads the hellos of accepted sockets and keeps or rejects each
    /// connection (see [`keep_incoming`]).
    pub(crate) fn step_incoming(&mut self) -> usize {
        let mut n = 0;
        let mut k = 0;
        let me = self.rank();
        while k < self.net.as_ref().map_or(0, |net| net.incoming.len()) {
            let step = self.net_mut().incoming[k].step();
            let hello = match step {
                IncomingStep::Pending => {
                    k += 1;
                    continue;
                }
                IncomingStep::Drop => None,
                IncomingStep::Hello(h) => Some(h),
            };
            let mut inc = self.net_mut().incoming.swap_remove(k);
            self.net_mut().unwatch(inc.sock.as_raw_fd());
            n += 1;
            let Some(h) = hello else { continue };
            let peer = h.rank as usize;
            if h.job != self.net_mut().job || peer >= self.size() || peer == me {
                // Not a peer of this job: a stray connection.
                continue;
            }
            let (have, dialing) = match self.peers.chan(peer) {
                Some(Channel::Connecting(c)) => (c.health != Health::Open, c.dial.is_some()),
                Some(_) => (true, false),
                None => (false, false),
            };
            if !keep_incoming(me, peer, have, dialing) {
                let _ = inc.reply(REJECT);
                self.stats.rejected += 1;
                continue;
            }
            if inc.reply(ACCEPT).is_err() {
                continue;
            }
            // Our own dial (if any) loses: drop it (its socket closes).
            let ours = match self.peers.get_mut(peer).map(|p| &mut p.chan) {
                Some(Channel::Connecting(c)) => c.dial.take().and_then(|d| d.fd()),
                _ => None,
            };
            if let Some(fd) = ours {
                self.net_mut().unwatch(fd);
            }
            self.stats.accepted += 1;
            self.install_tcp(peer, inc.sock);
        }
        n
    }

    /// Notes that `peer`'s tcp channel must be flushed on every pass until
    /// its queue is empty.
    pub(crate) fn note_tcp_busy(&mut self, peer: usize) {
        if let Some(net) = &mut self.net {
            if !net.busy.contains(&peer) {
                net.busy.push(peer);
            }
        }
    }

    /// One look at the network (waiting up to `timeout_ms` for something to
    /// happen): reads and writes the sockets epoll reports, accepts, moves
    /// dials and hellos on. Returns how much happened.
    #[inline(never)]
    pub(crate) fn progress_net(&mut self, timeout_ms: i32) -> usize {
        let mut ready = [Source::Incoming; 64];
        let mut k = 0;
        if let Some(net) = &mut self.net {
            for s in net.poll.wait(timeout_ms) {
                ready[k] = s;
                k += 1;
            }
        }
        let mut n = 0;
        for &s in &ready[..k] {
            match s {
                Source::Peer(p) => n += self.poll_socket_of(p),
                Source::Listener => n += self.accept_all(),
                Source::Wake => {
                    if let Some(Ok(w)) = &self.wake {
                        w.drain();
                    }
                }
                Source::Launcher => n += self.take_launcher_news(),
                Source::Incoming | Source::Rdma => {}
            }
        }
        let Some(net) = &self.net else { return n };
        let (dials, incoming, busy) = (
            !net.dialing.is_empty(),
            !net.incoming.is_empty(),
            !net.busy.is_empty(),
        );
        if dials {
            n += self.step_dials();
        }
        if incoming {
            n += self.step_incoming();
        }
        if busy {
            let mut i = 0;
            while let Some(&p) = self.net.as_ref().and_then(|net| net.busy.get(i)) {
                n += self.poll_socket_of(p);
                let more = self.peers.chan(p).is_some_and(|c| c.has_backlog());
                if more {
                    i += 1;
                } else {
                    self.net_mut().busy.swap_remove(i);
                }
            }
        }
        n
    }

    /// Polls `peer`'s tcp channel (or moves its dial on) after a socket
    /// event.
    fn poll_socket_of(&mut self, peer: usize) -> usize {
        let Some(slot) = self.peers.slot(peer) else {
            return 0;
        };
        let p = &mut self.peers.list[slot];
        match &mut p.chan {
            Channel::Tcp(c) => {
                let n = c.poll(peer, &mut self.st);
                if c.health != Health::Open && !p.reported {
                    self.health_dirty = true;
                }
                n
            }
            // Dials are stepped after the events.
            _ => 0,
        }
    }
}

/// What stepping one dial came to, for [`Engine::step_dials`] (file
/// descriptors are those to stop watching).
enum Outcome {
    Pending {
        before: Option<std::os::fd::RawFd>,
        after: Option<std::os::fd::RawFd>,
    },
    /// Rejected earlier; the peer's connection has not come yet.
    Waiting,
    Rejected(Option<std::os::fd::RawFd>),
    Accepted(Option<std::os::fd::RawFd>, std::net::TcpStream),
    /// Failed (the channel's health says why).
    Ended(Option<std::os::fd::RawFd>),
    Gone,
}

fn step_dial(c: &mut Connecting, wait: Duration) -> Outcome {
    if let Some(until) = c.await_until {
        if Instant::now() < until {
            return Outcome::Waiting;
        }
        c.await_until = None;
        c.health =
            Health::Failed("it rejected this rank's connection, and its own never came".into());
        return Outcome::Ended(None);
    }
    let Some(d) = c.dial.as_mut() else {
        return Outcome::Gone;
    };
    let before = d.fd();
    match d.step() {
        DialStep::Pending => Outcome::Pending {
            before,
            after: d.fd(),
        },
        DialStep::Accepted(sock) => {
            c.dial = None;
            Outcome::Accepted(before, sock)
        }
        DialStep::Rejected => {
            // The peer dials us too (that is why it rejected): its
            // connection is on its way.
            c.dial = None;
            c.await_until = Some(Instant::now() + wait);
            Outcome::Rejected(before)
        }
        DialStep::Failed(why) => {
            c.dial = None;
            c.health = Health::Failed(format!("tcp connect failed: {why}"));
            Outcome::Ended(before)
        }
    }
}

impl Engine {
    /// Watches the launcher's notifications of lost ranks (ibrun, the
    /// `srun --mpi=none` store) in the epoll set, when it sends them.
    pub(crate) fn watch_launcher(&mut self) {
        let Some(fd) = self.pmi.as_ref().and_then(|p| p.event_fd()) else {
            return;
        };
        if let Some(net) = &mut self.net {
            let _ = net.poll.add_input(fd, Source::Launcher);
            self.launcher_fd = Some(fd);
        }
    }

    /// Fails the channels of the ranks the launcher reported lost since
    /// the last look (never blocks): pending operations on them end with
    /// `PeerLost` at once instead of after a liveness timeout. Returns how
    /// many were new.
    pub(crate) fn take_launcher_news(&mut self) -> usize {
        let Some(pmi) = self.pmi.as_mut() else {
            return 0;
        };
        let lost = pmi.take_failures();
        // Stop watching a connection that closed (its fd is gone).
        if pmi.event_fd().is_none() {
            if let (Some(fd), Some(net)) = (self.launcher_fd.take(), self.net.as_mut()) {
                net.poll.remove(fd);
            }
        }
        let mut n = 0;
        for (r, how) in lost {
            if r >= self.size() || r == self.rank() {
                continue;
            }
            let reason = format!("the launcher reports it {how}");
            match self.peers.get_mut(r) {
                Some(p) => {
                    if matches!(p.chan.health(), Health::Open) {
                        p.chan.fail(reason);
                        n += 1;
                    }
                }
                None => {
                    let limit = self.cfg.tcp_eager_limit;
                    self.peers.add(
                        r,
                        Channel::Connecting(Box::new(Connecting::failed(reason, limit))),
                        false,
                    );
                    n += 1;
                }
            }
        }
        if n > 0 {
            self.any_failed = true;
            self.health_dirty = true;
        }
        n
    }
}
