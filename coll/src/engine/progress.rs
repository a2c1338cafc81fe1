//! The progress loop and the waiting policy.
//!
//! `progress` looks at what may have work once: the channels whose traffic
//! arrives in memory (self, shm, rdma), and, through one epoll call, the
//! sockets that are ready (`connect.rs`); then it carries out the actions
//! the records asked for and retries what found no room. Nothing in a pass
//! visits every peer of the job. `wait_until` calls it in a loop that
//! escalates: spin, then `sched_yield`, then block:
//!
//! - shm peers only: sleep on this rank's futex doorbell (peers ring it
//!   after every push, which costs them one load while we are awake),
//!   re-checking by a full progress pass after announcing sleep;
//! - sockets only (or rdma): wait in the epoll set;
//! - both: wait in the epoll set, which also holds this rank's wake-up
//!   FIFO in `/dev/shm`, announced on the doorbell first so that shm peers
//!   write one byte into the FIFO instead of a futex wake (and nothing
//!   while we are awake); if the FIFO cannot be made, short doorbell sleeps
//!   (`IBCOLL_MIXED_WAIT_US`) alternate with looks at the sockets.
//!
//! Every block is bounded (`IBCOLL_BLOCK_MS`), and between blocks the
//! liveness of the peers this rank waits on is checked, so a dead peer
//! turns into an error. A rank
//! whose shm records wait for ring space blocks at most `SPACE_WAIT`
//! (50 us): consumers do not ring after draining a ring.
//!
//! The phases are counted by the one `Backoff` of `ibcoll_shm::backoff`;
//! the spin phase pauses once per idle pass (see `wait_with`).

use std::time::{Duration, Instant};

use ibcoll_shm::backoff::{Backoff, Step};

use super::Engine;

/// Longest block of a rank whose shm records wait for ring space.
const SPACE_WAIT: Duration = Duration::from_micros(50);
use crate::transport::{Channel, Health};

impl Engine {
    /// One pass over what may have work; returns how many things happened.
    #[inline]
    pub fn progress(&mut self) -> usize {
        let mut n = 0;
        // Health is looked at in the same pass (one discriminant per
        // channel); the scan that reports changes runs only when a channel
        // is not open and unreported, or something was sent.
        let mut settled = !self.health_dirty;
        if let Some(ib) = &mut self.shm_inbox {
            n += ib.poll(&mut self.peers, &mut self.st);
        }
        for k in 0..self.peers.polled.len() {
            let p = &mut self.peers.list[self.peers.polled[k] as usize];
            n += p.chan.poll(p.rank, &mut self.st);
            settled &= p.reported || matches!(p.chan.health(), Health::Open);
        }
        // The shm channels with a box of ours or work in flight; the others
        // reach us through the receive queue polled above.
        let mut k = 0;
        loop {
            let Some(&slot) = self.shm_polled.borrow().get(k) else {
                break;
            };
            let p = &mut self.peers.list[slot as usize];
            n += p.chan.poll(p.rank, &mut self.st);
            settled &= p.reported || matches!(p.chan.health(), Health::Open);
            if let Channel::Shm(c) = &mut p.chan {
                if c.unlist_if_idle() {
                    self.shm_polled.borrow_mut().swap_remove(k);
                    continue;
                }
            }
            k += 1;
        }
        if let Some(net) = &mut self.net {
            if net.due() {
                n += self.progress_net(0);
            }
        }
        if self.rdma.is_some() {
            n += self.progress_rdma();
            n += self.progress_rdma_cm();
        }
        if !self.st.actions.is_empty() {
            n += self.apply_actions();
            settled = false;
        }
        if self.queued > 0 || !self.ctl_retry.is_empty() {
            n += self.drain_queues();
            settled = false;
        }
        if !settled || self.health_dirty {
            n += self.report_health();
        }
        // Nonblocking collectives in flight (one thread-local check when none).
        n += crate::schedule::run::progress_hook(self);
        n
    }

    /// Fails the operations of every peer whose channel closed or failed
    /// since the last look (over the peers this rank talks to).
    #[inline(never)]
    fn report_health(&mut self) -> usize {
        self.health_dirty = false;
        let mut n = 0;
        for slot in 0..self.peers.list.len() {
            let p = &self.peers.list[slot];
            if !p.reported && !matches!(p.chan.health(), Health::Open) {
                self.check_health(slot);
                n += 1;
            }
        }
        n
    }

    /// Runs the engine until `done` holds.
    pub fn wait_until(&mut self, done: impl FnMut(&Engine) -> bool) {
        self.wait_with(Backoff::new(self.spins, self.yields), done)
    }

    /// Runs the engine until `done` holds, escalating per `b`: its checks
    /// look at `done` alone (for a flag another rank is about to set), its
    /// spins and yields run a progress pass before each look, and its
    /// blocking phase sleeps in the way this rank's peers allow
    /// ([`Engine::block`]).
    pub fn wait_with(&mut self, mut b: Backoff, mut done: impl FnMut(&Engine) -> bool) {
        loop {
            if b.phase() == Step::Check {
                if done(self) {
                    return;
                }
            } else {
                let n = self.progress();
                if done(self) {
                    return;
                }
                if n > 0 {
                    b.reset();
                    continue;
                }
            }
            // One pause per idle pass in the spin phase: the pass itself is
            // only a few loads, and polling the peer's next ring line
            // back-to-back steals it from the producer while it writes the
            // record (measured: 8-byte latency 0.10 vs 0.11-0.98 us with
            // adjacent vCPUs, 1.2-1.4 vs 2.3-2.9 us on a loaded VM).
            match b.step() {
                Step::Check | Step::Spin => {}
                Step::Yield => self.maybe_check_liveness(),
                Step::Block => {
                    self.block(&mut done);
                    self.maybe_check_liveness();
                }
            }
        }
    }

    fn tcp_backlog(&self) -> bool {
        self.tcp_peers
            .iter()
            .any(|&p| self.peers.chan(p).is_some_and(|c| c.has_backlog()))
    }

    /// Whether this rank has anything that signals through a descriptor
    /// (sockets, the listener, rdma completions): then it blocks in epoll.
    fn waits_on_descriptors(&self) -> bool {
        self.net.as_ref().is_some_and(|n| n.sockets > 0) || self.rdma.is_some()
    }

    /// Blocks until something may have happened (bounded). `done` is
    /// re-checked after announcing sleep, so a condition that is not an
    /// operation (a fast path's shared-memory flag, whose writer rings the
    /// doorbell) cannot be missed.
    fn block(&mut self, done: &mut impl FnMut(&Engine) -> bool) {
        // News of lost ranks read during another PMI call no longer makes
        // the launcher's descriptor readable: look before every block.
        if self.take_launcher_news() > 0 {
            return;
        }
        let shm = !self.shm_peers.is_empty();
        let net = self.waits_on_descriptors();
        if shm {
            let Some(node) = self.node.clone() else {
                return;
            };
            // Consumers do not ring after draining a ring (that would put
            // a fence on every receive), so a rank whose records wait for
            // ring space re-checks after a short sleep instead.
            let space_wait = self.queued > 0
                || !self.ctl_retry.is_empty()
                || self.shm_polled.borrow().iter().any(|&s| {
                    matches!(&self.peers.list[s as usize].chan, Channel::Shm(c) if c.is_busy())
                });
            let block = if space_wait {
                self.cfg.block.min(SPACE_WAIT)
            } else {
                self.cfg.block
            };
            let timeout = if net {
                self.cfg.mixed_wait.min(block)
            } else {
                block
            };
            let me = self.local_rank;
            if net {
                if self.wake.is_none() {
                    let path = ibcoll_shm::wake_path(node.segment().name(), me);
                    let w = ibcoll_shm::WakeFifo::create(&path).map_err(|_| ());
                    if let (Ok(f), Some(n)) = (&w, self.net.as_mut()) {
                        let _ = n.poll.add_input(f.fd(), super::netpoll::Source::Wake);
                    }
                    self.wake = Some(w);
                }
                if let Some(Ok(_)) = &self.wake {
                    // Block in epoll on the sockets (and rdma events) and
                    // the wake-up FIFO, which shm peers poke once we have
                    // announced it on the doorbell.
                    let bell = node.doorbell(me);
                    let block = if bell.begin_polling() {
                        block
                    } else {
                        block.min(Duration::from_millis(1))
                    };
                    if self.progress() == 0 && !done(self) {
                        self.wait_descriptors(block);
                    }
                    bell.end_polling();
                    return;
                }
            }
            node.doorbell(me)
                .sleep(|| self.progress() > 0 || done(self), timeout);
            if net {
                self.wait_descriptors(Duration::ZERO);
            }
        } else if net {
            self.wait_descriptors(self.cfg.block);
        } else {
            // Only this rank: nothing outside can make progress.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits in the epoll set for at most `timeout` (sockets, the
    /// listener, dials, rdma completions, the wake-up FIFO), handling what
    /// is ready.
    pub(crate) fn wait_descriptors(&mut self, timeout: Duration) {
        let mut rdma = false;
        if self.rdma.is_some() {
            // Arm the CQs; a completion that came meanwhile means no sleep.
            if !self.rdma_arm() {
                return;
            }
            rdma = true;
        }
        // Dials in backoff and hellos not in yet have deadlines of their
        // own, which no socket event announces.
        let timeout = match &self.net {
            Some(n) if !n.dialing.is_empty() || !n.incoming.is_empty() => {
                timeout.min(Duration::from_millis(10))
            }
            _ => timeout,
        };
        // So do rdma handshakes waiting to resend.
        // And senders out of credits, resending WANT.
        let timeout = if self.rdma.as_ref().is_some_and(|r| !r.hs.is_empty()) || self.rdma_stalled()
        {
            timeout.min(Duration::from_millis(10))
        } else {
            timeout
        };
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
        if self.net.is_some() {
            self.progress_net(ms);
        } else {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
        }
        if rdma {
            self.rdma_after_wait();
        }
    }

    /// A blocking schedule announced in the slots has waited a while: did
    /// a member publish something else for that call (the fast path, or
    /// other bytes)? Then `fast.split` says who and what, and the
    /// schedule fails instead of waiting for messages that never come.
    /// Only members that published exactly that call are compared (one
    /// that is past it took part in it).
    pub(crate) fn check_announced(&mut self) {
        let (Some(a), None, Some(node)) = (&self.fast.announced, self.fast.split, &self.node)
        else {
            return;
        };
        let Ok(area) = ibcoll_shm::SlotArea::new(node, self.cfg.shm_coll_bytes) else {
            return;
        };
        for (r, &l) in a.locals.iter().enumerate() {
            if l == self.local_rank {
                continue;
            }
            // A member that took the fast path published the call in its
            // line; one that runs it as messages with other bytes, in its
            // mark line.
            let h = area.header(l, a.k);
            let m = area.mark(l);
            let got = if h.seq() == a.k {
                Some(h.len())
            } else if m.seq() == a.k && m.len() != a.mark {
                Some(m.len())
            } else {
                None
            };
            if let Some(got) = got {
                self.fast.split = Some((r, got));
                return;
            }
        }
    }

    /// While a fast-path call has blocked on a member's line for a
    /// liveness interval: whether that member has published a later call
    /// instead (its other lines), i.e. went on without taking part in this
    /// one as this rank expects (a bcast whose root the two disagree on:
    /// the member, a reader by its own root, publishes nothing, while this
    /// rank waits for its data). Sets `fast.passed`; the wait then fails
    /// the call instead of hanging. Costs one look at the member's lines
    /// per interval, never on a call that does not block.
    pub(crate) fn check_passed(&mut self) {
        let (Some((l, k)), None, Some(node)) = (self.fast.awaited, self.fast.passed, &self.node)
        else {
            return;
        };
        let Ok(area) = ibcoll_shm::SlotArea::new(node, self.cfg.shm_coll_bytes) else {
            return;
        };
        let later = (1..ibcoll_shm::SLOT_LINES as u64)
            .map(|j| area.header(l, k + j).seq())
            .filter(|&s| s > k)
            .max();
        let m = area.mark(l).seq();
        self.fast.passed = later.or((m > k).then_some(m));
        if self.fast.passed.is_some() {
            return;
        }
        // Say whom this rank waits for, then follow who waits for whom: a
        // chain of ranks waiting in this call for lines of it that nobody
        // published, back to this rank, never ends.
        let me = self.local_rank;
        let order = std::sync::atomic::Ordering::Release;
        area.wait_word(me).store((k << 16) | (l as u64 + 1), order);
        self.fast.wait_published = true;
        let mut chain = vec![me];
        let mut cur = l;
        while chain.len() <= self.local_size {
            if area.header(cur, k).seq() >= k {
                return;
            }
            chain.push(cur);
            let w = area
                .wait_word(cur)
                .load(std::sync::atomic::Ordering::Acquire);
            if w == 0 || w >> 16 != k {
                return;
            }
            let next = (w & 0xffff) as usize - 1;
            if next == me {
                if area.header(me, k).seq() < k {
                    self.fast.cycle = Some(chain);
                }
                return;
            }
            if chain.contains(&next) {
                return;
            }
            cur = next;
        }
    }

    /// Every `IBCOLL_BLOCK_MS`, checks that the peers this rank waits on
    /// are alive (shm: the process exists; rdma: the heartbeat of a QP); a
    /// vanished one (that did not say goodbye) fails its channel. Only
    /// peers named by pending operations (and the one a fast path waits
    /// for) are looked at; with a receive from any source pending, every
    /// peer this rank has a memory channel to, since any could be the
    /// sender.
    pub(crate) fn maybe_check_liveness(&mut self) {
        if self.last_liveness.elapsed() < self.cfg.block {
            return;
        }
        self.last_liveness = Instant::now();
        self.take_launcher_news();
        self.check_announced();
        self.check_passed();
        self.probe_calls();
        if let Some(ib) = &mut self.shm_inbox {
            // A dead sender's half-written record would hold up the others'.
            ib.skip_dead_reservation(self.local_rank);
        }
        let mut watched: Vec<usize> = Vec::new();
        let mut any_source = false;
        for t in self.st.ops.tokens() {
            let Some(op) = self.st.ops.get(t) else {
                continue;
            };
            if op.result.is_some() {
                continue;
            }
            match &op.kind {
                super::ops::OpKind::Send { peer, .. } => watched.push(*peer),
                super::ops::OpKind::Recv {
                    stage: super::ops::RecvStage::Streaming { peer, .. },
                    ..
                } => watched.push(*peer),
                super::ops::OpKind::Recv { peer: Some(p), .. } => watched.push(*p),
                super::ops::OpKind::Recv { peer: None, .. } => any_source = true,
            }
        }
        watched.extend(self.watch);
        if any_source {
            watched.extend(self.shm_peers.iter().copied());
            watched.extend(self.rdma_peers.iter().copied());
        }
        watched.sort_unstable();
        watched.dedup();
        let mut dead: Vec<(usize, String)> = Vec::new();
        let mut rdma_died = false;
        for p in watched {
            let Some(slot) = self.peers.slot(p) else {
                continue;
            };
            let chan = &mut self.peers.list[slot].chan;
            if !matches!(chan, Channel::Shm(_) | Channel::Rdma(_)) {
                continue;
            }
            if let Some(reason) = chan.check_alive() {
                rdma_died |= matches!(chan, Channel::Rdma(_));
                dead.push((p, reason));
            }
        }
        if dead.is_empty() {
            return;
        }
        // Take what they sent before they died (records, a goodbye): a
        // local peer's last records may still wait in this rank's receive
        // queue (a peer that sent and then exited must not look as if it
        // died before sending), a remote one's in the shared completion
        // queue, and the rest in the channel itself.
        if let Some(ib) = &mut self.shm_inbox {
            while ib.poll(&mut self.peers, &mut self.st) > 0 {}
        }
        if rdma_died {
            while self.progress_rdma() > 0 {}
        }
        for (p, reason) in dead {
            if let Some(c) = self.peers.get_mut(p).map(|x| &mut x.chan) {
                while c.poll(p, &mut self.st) > 0 {}
                if *c.health() == Health::Open {
                    c.fail(reason);
                }
            }
        }
        self.health_dirty = true;
    }

    /// Settles what leaked requests left outstanding (a program that
    /// waits for its operations leaves nothing): nonblocking collectives
    /// are given up, receives nobody matched are withdrawn, sends not
    /// moving yet go on from a private copy, and data already moving is
    /// waited for (it ends or fails within the engine's bounds). After this
    /// nothing points into the program's memory.
    fn settle(&mut self) {
        crate::schedule::run::settle_all(self);
        let mut moving = Vec::new();
        for t in self.st.ops.tokens().collect::<Vec<_>>() {
            if self.abandon(t).is_none() {
                moving.push(t);
            }
        }
        for t in moving {
            self.wait_until(|e| e.is_done(t));
            let _ = self.take_result(t);
        }
    }

    /// Says goodbye to every peer, flushes, and leaves the job.
    pub(crate) fn finalize(&mut self) {
        self.progress();
        self.settle();
        if self.cfg.stats {
            eprintln!("{}", self.stats_line());
        }
        let deadline = Instant::now() + self.cfg.peer_timeout;
        let cause = self.st.lost_cause.map_or(0, |p| p as u64 + 1);
        let mut bye_pending: Vec<usize> = Vec::new();
        for slot in 0..self.peers.list.len() {
            let p = &mut self.peers.list[slot];
            let delivered = match &mut p.chan {
                Channel::Shm(c) => c.health != Health::Open || c.send_bye(cause),
                Channel::Tcp(c) => {
                    if c.health == Health::Open {
                        c.send_bye(cause);
                    }
                    true
                }
                Channel::Rdma(c) => {
                    c.send_bye(cause);
                    true
                }
                Channel::Local(_) | Channel::Connecting(_) => true,
            };
            if !delivered {
                bye_pending.push(p.rank);
            }
        }
        // Sends still queued (a channel still connecting: an abandoned send
        // of a failed collective, or a notice of the failure, to a peer not
        // talked to before) go out first: the peer may wait for nothing
        // else.
        while (!bye_pending.is_empty()
            || self.tcp_backlog()
            || self.rdma_backlog()
            || self.queued > 0)
            && Instant::now() < deadline
        {
            self.progress();
            self.drop_dead_queues();
            bye_pending.retain(|&p| match self.peers.get_mut(p).map(|x| &mut x.chan) {
                Some(Channel::Shm(c)) => c.health == Health::Open && !c.send_bye(cause),
                _ => false,
            });
            if self.tcp_backlog() {
                for p in self.tcp_peers.clone() {
                    if self.peers.chan(p).is_some_and(|c| c.has_backlog()) {
                        self.note_tcp_busy(p);
                    }
                }
                self.wait_descriptors(Duration::from_millis(10));
            } else if self.queued > 0 && self.waits_on_descriptors() {
                self.wait_descriptors(Duration::from_millis(10));
            } else if !bye_pending.is_empty() || self.rdma_backlog() || self.queued > 0 {
                std::thread::yield_now();
            }
        }
        let failed = self.any_failed
            || self
                .peers
                .list
                .iter()
                .any(|p| matches!(p.chan.health(), Health::Failed(_)));
        if let Some(mut pmi) = self.pmi.take() {
            // Everyone has flushed once everyone is here; closing sockets
            // before that could reset a connection with data in flight.
            if !failed {
                // A peer's watchdog then says where this rank went.
                if self.cfg.hang_timeout.is_some() && !self.hang_published {
                    super::watchdog::publish_finalizing(&mut pmi, self.rank());
                }
                if let Some(net) = &mut self.net {
                    net.refuse_new();
                }
                let _ = pmi.fence();
            }
            let _ = pmi.finalize();
        }
    }
}
