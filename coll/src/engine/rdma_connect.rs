//! Rdma pairs connected on first use: the engine's side of the handshake
//! of `transport/rdma_cm.rs` over this process's UD endpoint.
//!
//! The first send to a peer whose pair [`card::plan`](super::card::plan)s
//! to rdma makes this rank's RC queue pair for it and sends REQ
//! ([`Engine::open_rdma`]); records wait in the peer's queue (in order)
//! until the QP is ready. A REQ from a peer this rank has no channel to
//! makes one and answers. Each progress pass polls the UD queue and, while
//! handshakes are in progress, resends what went unanswered and fails a
//! pair whose deadline passed (`IBCOLL_PEER_TIMEOUT_MS`): the operations
//! on it end with `PeerLost` naming the peer.

use std::time::Instant;

use super::card::Card;
use super::Engine;
use crate::transport::rdma::{Handshake, RdmaChannel, RdmaNet};
use crate::transport::rdma_cm::{keep_request, retry_after, Flow, Kind, Msg, MSG_LEN};
use crate::transport::tcp_connect::Connecting;
use crate::transport::{Channel, Health};
use ibcoll_rdma::UdAddr;

impl RdmaNet {
    fn msg(&self, kind: Kind, to: usize, ch: &RdmaChannel) -> [u8; MSG_LEN] {
        let (word, grant) = ch.flow_offer();
        Msg {
            kind,
            job: self.job,
            from: self.rank as u32,
            to: to as u32,
            pid: self.pid,
            host: self.host,
            ud: self.ud.local_addr(),
            qp: ch.local_info(),
            word,
            grant,
        }
        .encode()
    }

    /// Sends one handshake datagram. A full send queue is a lost datagram
    /// (the resend timer covers both); an error is returned to fail the pair.
    fn send(&mut self, dst: &UdAddr, msg: &[u8; MSG_LEN]) -> Result<(), String> {
        self.ud
            .send(dst, msg)
            .map(|_| ())
            .map_err(|e| format!("rdma connection handshake: {e}"))
    }

    /// Sends `msg` and keeps resending it until the pair is ready or the
    /// deadline passes (a handshake already running for `peer` is replaced).
    fn start(&mut self, peer: usize, requester: bool, msg: [u8; MSG_LEN], dst: UdAddr) {
        let now = Instant::now();
        let started = match self.hs.iter().position(|h| h.peer == peer) {
            Some(i) => self.hs.swap_remove(i).started,
            None => now,
        };
        // A failed first send is retried like a lost one.
        let _ = self.send(&dst, &msg);
        self.hs.push(Handshake {
            peer,
            requester,
            msg,
            dst,
            tries: 1,
            next: now + retry_after(1),
            started,
            deadline: started + self.ctx.peer_timeout,
        });
    }
}

impl Engine {
    fn cm_failed(&self, reason: String) -> Channel {
        Channel::Connecting(Box::new(Connecting::failed(
            reason,
            self.cfg.rdma.eager_limit,
        )))
    }

    /// First contact of an rdma pair (this rank sends first): make the
    /// QP, send REQ. A pair that cannot start gets a failed channel
    /// naming why.
    pub(crate) fn open_rdma(&mut self, peer: usize, card: &Card) -> Channel {
        let Some(dst) = card.ud else {
            return self.cm_failed("its card has no UD address for rdma".into());
        };
        let pid = (card.host == self.me.host && self.cfg.rdma.pid_check).then_some(card.pid);
        let Some(r) = self.rdma.as_mut() else {
            return self.cm_failed("this rank has no verbs device".into());
        };
        let ch = match RdmaChannel::open(r.ctx.clone(), peer, pid) {
            Ok(c) => c,
            Err(e) => return self.cm_failed(format!("cannot make a queue pair for it: {e}")),
        };
        let msg = r.msg(Kind::Req, peer, &ch);
        r.stats.requested += 1;
        r.start(peer, true, msg, dst);
        r.bind_qp(ch.qpn(), peer);
        self.rdma_peers.push(peer);
        Channel::Rdma(Box::new(ch))
    }

    /// Handles the handshake datagrams that arrived and moves the
    /// handshakes in progress on; returns how much happened.
    #[inline(never)]
    pub(crate) fn progress_rdma_cm(&mut self) -> usize {
        let Some(r) = self.rdma.as_mut() else {
            return 0;
        };
        let inbox = &mut r.inbox;
        // A failed UD completion is a lost datagram: the resend timer
        // covers it.
        let flows = &mut r.flows;
        let _ = r.ud.poll(|d| {
            if let Some(m) = Msg::decode(d.data) {
                inbox.push(m);
            } else if let Some(f) = Flow::decode(d.data) {
                flows.push(f);
            }
        });
        let mut n = 0;
        let mut msgs = std::mem::take(&mut r.inbox);
        for m in msgs.drain(..) {
            self.on_cm(&m);
            n += 1;
        }
        if let Some(r) = self.rdma.as_mut() {
            r.inbox = msgs;
        }
        if self.rdma.as_ref().is_some_and(|r| !r.flows.is_empty()) {
            let mut flows = std::mem::take(&mut self.rdma.as_mut().expect("checked").flows);
            for f in flows.drain(..) {
                self.on_flow(&f);
                n += 1;
            }
            if let Some(r) = self.rdma.as_mut() {
                r.flows = flows;
            }
        }
        if self.rdma.as_ref().is_some_and(|r| !r.hs.is_empty()) {
            n += self.step_handshakes();
        }
        n + self.progress_rdma_flow()
    }

    fn on_cm(&mut self, m: &Msg) {
        let me = self.rank();
        let peer = m.from as usize;
        let Some(r) = self.rdma.as_ref() else { return };
        if m.job != r.job || m.to as usize != me || peer >= self.size() || peer == me {
            // Another job's, or garbage: not ours to answer.
            return;
        }
        match m.kind {
            Kind::Req => self.on_req(peer, m),
            Kind::Rep => self.on_rep(peer, m),
            Kind::Rdy => {
                if let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) {
                    if c.is_connected() && c.remote_qpn() == Some(m.qp.qpn) {
                        c.set_ready();
                    }
                }
            }
        }
    }

    fn on_req(&mut self, peer: usize, m: &Msg) {
        let me = self.rank();
        let pid_check = self.cfg.rdma.pid_check;
        let host = self.me.host;
        let Some(r) = self.rdma.as_mut() else { return };
        match self.peers.get_mut(peer).map(|p| &mut p.chan) {
            Some(Channel::Rdma(c)) => {
                if c.health != Health::Open {
                    return;
                }
                if c.is_connected() {
                    // Our REP was lost: answer again (a stale REQ for
                    // another QP is ignored).
                    if c.remote_qpn() == Some(m.qp.qpn) {
                        let rep = r.msg(Kind::Rep, peer, c);
                        if let Err(e) = r.send(&m.ud, &rep) {
                            c.fail(e);
                            self.health_dirty = true;
                        }
                    }
                    return;
                }
                // Both sent REQ: only the lower rank's is answered.
                if !keep_request(me, peer) {
                    return;
                }
                if let Err(e) = c.connect(m) {
                    c.fail(e);
                    self.health_dirty = true;
                    return;
                }
                let rep = r.msg(Kind::Rep, peer, c);
                r.stats.answered += 1;
                r.start(peer, false, rep, m.ud);
            }
            Some(_) => {}
            None => {
                let pid = (m.host == host && pid_check).then_some(m.pid);
                let made = RdmaChannel::open(r.ctx.clone(), peer, pid).and_then(|mut c| {
                    c.connect(m)?;
                    Ok(c)
                });
                match made {
                    Ok(c) => {
                        let rep = r.msg(Kind::Rep, peer, &c);
                        r.stats.answered += 1;
                        r.start(peer, false, rep, m.ud);
                        r.bind_qp(c.qpn(), peer);
                        self.peers.add(peer, Channel::Rdma(Box::new(c)), false);
                        self.rdma_peers.push(peer);
                    }
                    Err(e) => {
                        // Its sends to us will time out; ours fail at once.
                        let ch = self.cm_failed(format!("cannot answer its rdma connection: {e}"));
                        self.peers.add(peer, ch, false);
                        self.health_dirty = true;
                    }
                }
            }
        }
    }

    fn on_rep(&mut self, peer: usize, m: &Msg) {
        let Some(r) = self.rdma.as_mut() else { return };
        let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) else {
            return;
        };
        if c.health != Health::Open {
            return;
        }
        if !c.is_connected() {
            if let Err(e) = c.connect(m) {
                c.fail(e);
                self.health_dirty = true;
                return;
            }
            c.set_ready();
        } else if c.remote_qpn() != Some(m.qp.qpn) {
            return;
        }
        // (Again, when the REP is repeated: our RDY was lost.)
        let rdy = r.msg(Kind::Rdy, peer, c);
        if let Err(e) = r.send(&m.ud, &rdy) {
            c.fail(e);
            self.health_dirty = true;
        }
    }

    /// Ends the handshakes whose pair is ready (or gone), resends what
    /// went unanswered, and fails the pairs whose deadline passed.
    fn step_handshakes(&mut self) -> usize {
        let now = Instant::now();
        let mut n = 0;
        let mut k = 0;
        while let Some(h) = self.rdma.as_ref().and_then(|r| r.hs.get(k)) {
            let peer = h.peer;
            let r = self.rdma.as_mut().expect("checked above");
            let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) else {
                r.hs.swap_remove(k);
                continue;
            };
            let h = &mut r.hs[k];
            if c.health != Health::Open {
                r.stats.failed += 1;
                r.hs.swap_remove(k);
                continue;
            }
            if c.is_ready() {
                if h.requester {
                    let us = now.duration_since(h.started).as_micros() as u64;
                    r.stats.timed += 1;
                    r.stats.total_us += us;
                    r.stats.max_us = r.stats.max_us.max(us);
                }
                r.stats.completed += 1;
                r.hs.swap_remove(k);
                n += 1;
                continue;
            }
            if now >= h.deadline {
                let (what, sent) = if h.requester {
                    ("no reply (REP)", "requests (REQ)")
                } else {
                    ("no confirmation (RDY) and no data", "replies (REP)")
                };
                c.fail(format!(
                    "rdma connection handshake: {what} within {:?} ({} {sent} sent to {})",
                    self.cfg.peer_timeout, h.tries, h.dst
                ));
                r.stats.failed += 1;
                r.hs.swap_remove(k);
                self.health_dirty = true;
                n += 1;
                continue;
            }
            if now >= h.next {
                h.tries += 1;
                h.next = now + retry_after(h.tries);
                let (dst, msg) = (h.dst, h.msg);
                r.stats.resent += 1;
                if let Err(e) = r.send(&dst, &msg) {
                    c.fail(e);
                    self.health_dirty = true;
                }
                n += 1;
            }
            k += 1;
        }
        n
    }
}
