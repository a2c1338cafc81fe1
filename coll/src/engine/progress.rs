//! The progress loop and the waiting policy.
//!
//! `progress` polls every channel once, carries out the actions the records
//! asked for, and retries what found no room. `wait_until` calls it in a
//! loop that escalates: spin, then `sched_yield`, then block:
//!
//! - shm peers only: sleep on this rank's futex doorbell (peers ring it
//!   after every push, which costs them one load while we are awake),
//!   re-checking by a full progress pass after announcing sleep;
//! - tcp peers only: `poll(2)` on the sockets;
//! - both: `poll(2)` on the sockets and this rank's wake-up FIFO in
//!   `/dev/shm`, announced on the doorbell first so that shm peers write
//!   one byte into the FIFO instead of a futex wake (and nothing while we
//!   are awake); if the FIFO cannot be made, short doorbell sleeps
//!   (`IBCOLL_MIXED_WAIT_US`) alternate with socket polls.
//!
//! Every block is bounded (`IBCOLL_BLOCK_MS`), and between blocks the pids
//! of shm peers are checked, so a dead peer turns into an error. A rank
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
    /// One pass over everything; returns how many things happened.
    #[inline]
    pub fn progress(&mut self) -> usize {
        let mut n = 0;
        // Health is looked at in the same pass (one discriminant per
        // channel); the scan that reports changes runs only when a channel
        // is not open and unreported, or something was sent.
        let mut settled = true;
        for (peer, ch) in self.chans.iter_mut().enumerate() {
            n += ch.poll(peer, &mut self.st);
            settled &= matches!(ch.health(), Health::Open) || self.reported[peer];
        }
        if !self.st.actions.is_empty() {
            n += self.apply_actions();
            settled = false;
        }
        if self.queued > 0 || !self.ctl_retry.is_empty() {
            n += self.drain_queues();
            settled = false;
        }
        if !settled {
            for peer in 0..self.chans.len() {
                if !self.reported[peer] && !matches!(self.chans[peer].health(), Health::Open) {
                    self.check_health(peer);
                    n += 1;
                }
            }
        }
        // Nonblocking collectives in flight (one thread-local check when none).
        n += crate::schedule::run::progress_hook(self);
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
        self.tcp_peers.iter().any(|&p| self.chans[p].has_backlog())
    }

    /// Blocks until something may have happened (bounded). `done` is
    /// re-checked after announcing sleep, so a condition that is not an
    /// operation (a fast path's shared-memory flag, whose writer rings the
    /// doorbell) cannot be missed.
    fn block(&mut self, done: &mut impl FnMut(&Engine) -> bool) {
        let shm = !self.shm_peers.is_empty();
        // rdma completions wake the same poll(2) as the sockets.
        let tcp = !self.tcp_peers.is_empty() || !self.rdma_peers.is_empty();
        if shm {
            let Some(node) = self.node.clone() else {
                return;
            };
            // Consumers do not ring after draining a ring (that would put
            // a fence on every receive), so a rank whose records wait for
            // ring space re-checks after a short sleep instead.
            let space_wait = self.queued > 0
                || !self.ctl_retry.is_empty()
                || self
                    .shm_peers
                    .iter()
                    .any(|&p| matches!(&self.chans[p], Channel::Shm(c) if c.is_busy()));
            let block = if space_wait {
                self.cfg.block.min(SPACE_WAIT)
            } else {
                self.cfg.block
            };
            let timeout = if tcp {
                self.cfg.mixed_wait.min(block)
            } else {
                block
            };
            let me = self.local_rank;
            if tcp {
                if self.wake.is_none() {
                    let path = ibcoll_shm::wake_path(node.segment().name(), me);
                    self.wake = Some(ibcoll_shm::WakeFifo::create(&path).map_err(|_| ()));
                }
                if let Some(Ok(_)) = &self.wake {
                    // Block in poll(2) on the sockets (and rdma events) and
                    // the wake-up FIFO, which shm peers poke once we have
                    // announced it on the doorbell.
                    let bell = node.doorbell(me);
                    let block = if bell.begin_polling() {
                        block
                    } else {
                        block.min(Duration::from_millis(1))
                    };
                    if self.progress() == 0 && !done(self) {
                        let backlog = self.tcp_backlog();
                        self.poll_sockets(block, backlog);
                    }
                    bell.end_polling();
                    return;
                }
            }
            node.doorbell(me)
                .sleep(|| self.progress() > 0 || done(self), timeout);
        } else if tcp {
            let backlog = self.tcp_backlog();
            self.poll_sockets(self.cfg.block, backlog);
        } else {
            // Only this rank: nothing outside can make progress.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits in poll(2) for any tcp socket to become readable (or writable,
    /// when `want_write`).
    pub(crate) fn poll_sockets(&mut self, timeout: Duration, want_write: bool) {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.tcp_peers.len() + 1);
        let mut rdma = false;
        if !self.rdma_peers.is_empty() {
            // Arm the CQs; a completion that came meanwhile means no sleep.
            let Some(fd) = self.rdma_arm() else { return };
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            rdma = true;
        }
        if let Some(Ok(w)) = &self.wake {
            fds.push(libc::pollfd {
                fd: w.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        for &p in &self.tcp_peers {
            if let Channel::Tcp(c) = &self.chans[p] {
                if c.health != Health::Open {
                    continue;
                }
                let mut events = libc::POLLIN;
                if want_write && c.has_backlog() {
                    events |= libc::POLLOUT;
                }
                fds.push(libc::pollfd {
                    fd: c.fd(),
                    events,
                    revents: 0,
                });
            }
        }
        if fds.is_empty() {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
            return;
        }
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs that
        // the kernel may write `revents` into during the call.
        unsafe {
            libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
        }
        if let Some(Ok(w)) = &self.wake {
            w.drain();
        }
        if rdma {
            self.rdma_after_wait();
        }
    }

    /// Every `IBCOLL_BLOCK_MS`, checks that shm peers' processes exist; a
    /// vanished one (that did not say goodbye) fails its channel.
    pub(crate) fn maybe_check_liveness(&mut self) {
        if self.last_liveness.elapsed() < self.cfg.block {
            return;
        }
        self.last_liveness = Instant::now();
        let (ns, nr) = (self.shm_peers.len(), self.rdma_peers.len());
        for i in 0..ns + nr {
            let p = if i < ns {
                self.shm_peers[i]
            } else {
                self.rdma_peers[i - ns]
            };
            if let Some(reason) = self.chans[p].check_alive() {
                // Take what it sent before it died (records, a goodbye).
                while self.chans[p].poll(p, &mut self.st) > 0 {}
                if *self.chans[p].health() == Health::Open {
                    self.chans[p].fail(reason);
                }
            }
        }
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
        let deadline = Instant::now() + self.cfg.peer_timeout;
        let mut bye_pending: Vec<usize> = Vec::new();
        for p in 0..self.chans.len() {
            let delivered = match &mut self.chans[p] {
                Channel::Shm(c) => c.health != Health::Open || c.send_bye(),
                Channel::Tcp(c) => {
                    if c.health == Health::Open {
                        c.send_bye();
                    }
                    true
                }
                Channel::Rdma(c) => {
                    c.send_bye();
                    true
                }
                Channel::Local(_) => true,
            };
            if !delivered {
                bye_pending.push(p);
            }
        }
        while (!bye_pending.is_empty() || self.tcp_backlog() || self.rdma_backlog())
            && Instant::now() < deadline
        {
            self.progress();
            bye_pending.retain(|&p| match &mut self.chans[p] {
                Channel::Shm(c) => c.health == Health::Open && !c.send_bye(),
                _ => false,
            });
            if self.tcp_backlog() {
                self.poll_sockets(Duration::from_millis(10), true);
            } else if !bye_pending.is_empty() || self.rdma_backlog() {
                std::thread::yield_now();
            }
        }
        let failed = self.any_failed
            || self
                .chans
                .iter()
                .any(|c| matches!(c.health(), Health::Failed(_)));
        if let Some(mut pmi) = self.pmi.take() {
            // Everyone has flushed once everyone is here; closing sockets
            // before that could reset a connection with data in flight.
            if !failed {
                let _ = pmi.fence();
            }
            let _ = pmi.finalize();
        }
    }
}
