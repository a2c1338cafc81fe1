//! Broadcast by multicast among node leaders (`IBCOLL_BCAST_ALGORITHM=mcast`).
//!
//! Three phases: inside the root's node through its node communicator
//! (shared memory), among node leaders by reliable multicast
//! (`ibcoll_rdma::rmcast` over an `ibcoll_rdma::McastGroup`), inside every
//! other node from its leader. Leaders are the lowest rank of each node.
//!
//! A communicator sets this up on its first multicast broadcast, a
//! collective step over the communicator: a node communicator and a leaders
//! communicator (`split`), then every leader joins the group (an MGID from a
//! nonce of leader 0 and the context id) and the leaders agree (an
//! allreduce) on success and on the MTU. If any leader cannot join, every
//! rank falls back to the node-aware tree for this communicator and the
//! first leader that failed prints one line saying why. The group is left
//! when the communicator is dropped.
//!
//! Each multicast broadcast completes synchronously: a leader returns once
//! its subtree of the ack tree holds everything (the root: everyone), so no
//! protocol state outlives the call and nothing needs background progress.
//! Acks and nacks travel as point-to-point messages on the leaders
//! communicator (reliable, in order per pair).

use crate::algorithms::Collective;
use crate::collectives::ReduceArgs;
use crate::comm::{Comm, ANY_SOURCE};
use crate::error::{Error, Op, Result};
use crate::hier::Levels;
use crate::ops::ReduceOp;
use ibcoll_rdma::rmcast::{self, Data, Dest, DropFilter, Member};
use ibcoll_rdma::{
    group_gid, DeviceSelection, McastGroup, ProtectionDomain, SelectedPort, UdConfig,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tag of acks and nacks on the (private) leaders communicator.
const TAG_CTRL: i32 = 0x6d63;
const OP: Op = Op::Collective(Collective::Bcast);

/// What a communicator knows about multicast after its first use.
pub(crate) enum State {
    /// Not used: fall back to the node-aware tree.
    Off,
    /// Set up.
    On(Box<Active>),
}

pub(crate) struct Active {
    /// The node and leaders communicators.
    lv: Levels,
    /// Leaders only (borrowed mutably only inside one multicast).
    lead: Option<std::cell::RefCell<Leader>>,
}

struct Leader {
    comm: Comm,
    member: Member,
    /// Dropped with the communicator's state: detaches, destroys its QP,
    /// leaves the IP group (`McastGroup`'s drop).
    group: McastGroup,
    drop: DropFilter,
    pending: Vec<Vec<u8>>,
    scratch: Vec<u8>,
    ctrl: Vec<u8>,
    /// `IBCOLL_MCAST_REPORT=1`: print the protocol's counters when left.
    report: bool,
}

impl Drop for Leader {
    fn drop(&mut self) {
        if self.report {
            let s = self.member.stats();
            eprintln!(
                "ibcoll: multicast leader {}: sent {} retransmitted {} received {} duplicates {} early kept {} dropped {} nacks sent {} received {} acks sent {}",
                self.comm.rank(),
                s.sent,
                s.retransmitted,
                s.received,
                s.duplicates,
                s.early_kept,
                s.early_dropped,
                s.nacks_sent,
                s.nacks_received,
                s.acks_sent
            );
        }
    }
}

fn env_f64(name: &str) -> std::result::Result<f64, String> {
    match std::env::var(name) {
        Ok(v) => DropFilter::parse_rate(&v),
        Err(_) => Ok(0.0),
    }
}

fn env_num(name: &str, default: u64) -> std::result::Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?}: expected a whole number")),
        Err(_) => Ok(default),
    }
}

impl Comm {
    /// The multicast state, set up on first use (collective).
    fn mcast_state(&self, nodes: &[usize]) -> Result<std::cell::Ref<'_, State>> {
        if self.mcast.borrow().is_none() {
            let st = self.mcast_setup(nodes)?;
            *self.mcast.borrow_mut() = Some(st);
        }
        Ok(std::cell::Ref::map(self.mcast.borrow(), |s| {
            s.as_ref().expect("set above")
        }))
    }

    fn mcast_err(&self, what: String) -> Error {
        Error::InvalidArgument {
            rank: self.world_rank(self.rank()).unwrap_or(0),
            op: OP,
            detail: what,
        }
    }

    fn mcast_setup(&self, nodes: &[usize]) -> Result<State> {
        let Some(lv) = self.levels(nodes, OP)? else {
            return Ok(State::Off);
        };
        let mut decision = [0u8];
        let mut lead = None;
        if let Some(lc) = &lv.leaders {
            let (l, ok) = self.mcast_join(lc)?;
            decision[0] = u8::from(ok);
            lead = l;
        }
        lv.node.bcast(&mut decision, 0)?;
        if decision[0] == 0 {
            return Ok(State::Off);
        }
        Ok(State::On(Box::new(Active {
            lv,
            lead: lead.map(std::cell::RefCell::new),
        })))
    }

    /// The device port and protection domain a group's QP is made on:
    /// the engine's own, when it talks rdma (one device context per
    /// process, whatever the number of groups), else this node's device
    /// opened for the group (`IBCOLL_TRANSPORT=tcp` with multicast).
    fn mcast_device(&self) -> std::result::Result<(SelectedPort, Arc<ProtectionDomain>), String> {
        if let Some(ctx) = self.eng.borrow().rdma.as_ref().map(|r| r.ctx.clone()) {
            return Ok((ctx.port.clone(), ctx.pd.clone()));
        }
        let env = |k: &str| std::env::var(k).ok();
        let dev = crate::transport::rdma::device_for_node(
            env(ibcoll_rdma::device::ENV_DEVICE).as_deref(),
            self.node_id(),
        );
        let sel = DeviceSelection::from_lookup(|k| {
            if k == ibcoll_rdma::device::ENV_DEVICE {
                dev.clone()
            } else {
                env(k).filter(|v| !v.trim().eq_ignore_ascii_case("auto"))
            }
        })
        .map_err(|e| e.to_string())?;
        let port = sel.select().map_err(|e| e.to_string())?;
        let pd = ProtectionDomain::new(&port.context).map_err(|e| e.to_string())?;
        Ok((port, pd))
    }

    /// Join at one leader; all leaders agree. `Ok((None, false))`: fall back.
    fn mcast_join(&self, lc: &Comm) -> Result<(Option<Leader>, bool)> {
        use std::hash::{BuildHasher, Hasher};
        let mut nonce = [std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()];
        lc.bcast(&mut nonce, 0)?;
        let mgid = group_gid(&nonce[0].to_le_bytes(), u64::from(self.ctx));
        let settings = (|| -> std::result::Result<(f64, u64, u64), String> {
            Ok((
                env_f64("IBCOLL_MCAST_DROP_RATE")?,
                env_num("IBCOLL_MCAST_WINDOW", 64)?,
                env_num("IBCOLL_MCAST_NACK_US", 200)?,
            ))
        })();
        let joined = settings.and_then(|s| {
            let (port, pd) = self.mcast_device()?;
            let window = s.1.clamp(4, 1024) as usize;
            let cfg = UdConfig {
                qkey: 0x1bc0_11ec,
                recv_bufs: (4 * window as u32).max(256),
                send_bufs: 64,
                wr_tag: 0xe0,
                ..UdConfig::default()
            };
            let g = McastGroup::join(&port, &pd, mgid, cfg).map_err(|e| e.to_string())?;
            Ok((g, s))
        });
        let me = lc.rank() as u32;
        let (mtu, fail_rank) = match &joined {
            Ok((g, _)) => (g.max_payload() as u32, u32::MAX),
            Err(_) => (u32::MAX, me),
        };
        let mut agree = [mtu, fail_rank];
        lc.allreduce_in_place(&mut agree, ReduceOp::Min)?;
        if agree[1] != u32::MAX {
            static SAID: std::sync::Once = std::sync::Once::new();
            if agree[1] == me && !SAID.is_completed() {
                SAID.call_once(|| {});
                let why = joined.as_ref().err().map_or("?", |s| s.as_str());
                eprintln!(
                    "ibcoll: multicast broadcast unavailable on rank {} ({}), using the node-aware tree",
                    self.world_rank(self.rank()).unwrap_or(0),
                    why.lines().next().unwrap_or("")
                );
            }
            return Ok((None, false));
        }
        let (group, (rate, window, nack_us)) = joined.expect("every leader joined");
        let mut cfg = rmcast::Config::new(
            self.ctx ^ (nonce[0] as u32),
            me,
            lc.size() as u32,
            agree[0] as usize,
        );
        cfg.window = window.clamp(4, 1024) as usize;
        cfg.ack_step = (cfg.window / 4).max(1) as u32;
        cfg.nack_delay = Duration::from_micros(nack_us.max(1));
        cfg.retx_holdoff = cfg.nack_delay / 2;
        cfg.peer_timeout = self.eng.borrow().cfg.peer_timeout;
        let report = std::env::var("IBCOLL_MCAST_REPORT").is_ok_and(|v| v == "1");
        if me == 0 && report {
            eprintln!(
                "ibcoll: multicast group {mgid} joined by {} node leaders (mtu {}, window {})",
                lc.size(),
                cfg.mtu,
                cfg.window
            );
        }
        let member = Member::new(cfg).map_err(|e| self.mcast_err(e.to_string()))?;
        let seed = self.world_rank(self.rank()).unwrap_or(0) as u64;
        Ok((
            Some(Leader {
                comm: lc.dup()?,
                member,
                group,
                drop: DropFilter::new(rate, seed),
                pending: Vec::new(),
                scratch: Vec::new(),
                ctrl: vec![0; 1024],
                report,
            }),
            true,
        ))
    }

    /// Broadcast `buf` from `root` by multicast among the node leaders.
    /// `Ok(false)`: multicast is off for this communicator (run the tree).
    pub(crate) fn bcast_mcast(&self, buf: &mut [u8], root: usize, nodes: &[usize]) -> Result<bool> {
        let st = self.mcast_state(nodes)?;
        let State::On(a) = &*st else {
            return Ok(false);
        };
        a.lv.bcast_around(self.rank(), buf, root, OP, |_, buf, lroot| {
            a.multicast(buf, lroot)
        })?;
        Ok(true)
    }

    /// Allreduce with the leaders' result broadcast by multicast: every
    /// node reduces to its leader (shared memory), the leaders reduce to
    /// leader 0 (communicator rank 0, the lowest of its node), which
    /// multicasts the result, and every leader passes it on inside its
    /// node. The operation commutes (the leaders' order is not rank
    /// order). `Ok(false)`: multicast is off for this communicator.
    pub(crate) fn allreduce_mcast(&self, mut r: ReduceArgs<'_>, nodes: &[usize]) -> Result<bool> {
        const OP: Op = Op::Collective(Collective::Allreduce);
        let st = self.mcast_state(nodes)?;
        let State::On(a) = &*st else {
            return Ok(false);
        };
        a.lv.reduce_to_leaders(&mut r, Some(0), OP)?;
        a.lv.bcast_around(self.rank(), r.recv, 0, OP, |_, buf, lroot| {
            a.multicast(buf, lroot)
        })?;
        Ok(true)
    }

    /// Barrier released by multicast: arrivals go up inside each node and
    /// then among the leaders to leader 0 (reduces of one byte), whose
    /// multicast of one byte releases the leaders, each its node.
    /// `Ok(false)`: multicast is off for this communicator.
    pub(crate) fn barrier_mcast(&self, nodes: &[usize]) -> Result<bool> {
        const OP: Op = Op::Collective(Collective::Barrier);
        let st = self.mcast_state(nodes)?;
        let State::On(a) = &*st else {
            return Ok(false);
        };
        let mut b = [0u8; 1];
        a.lv.node
            .reduce_in_place(&mut b, ReduceOp::Max, 0)
            .map_err(|e| e.with_op(OP))?;
        if let Some(lc) = &a.lv.leaders {
            lc.reduce_in_place(&mut b, ReduceOp::Max, 0)
                .map_err(|e| e.with_op(OP))?;
        }
        a.lv.bcast_around(self.rank(), &mut b, 0, OP, |_, buf, lroot| {
            a.multicast(buf, lroot)
        })?;
        Ok(true)
    }
}

impl Active {
    /// The leaders' multicast of `buf` from leaders-communicator rank
    /// `lroot` (a leader's part; `Levels::bcast_around` calls it on
    /// leaders only).
    fn multicast(&self, buf: &mut [u8], lroot: usize) -> Result<()> {
        match &self.lead {
            Some(l) => l.borrow_mut().bcast(buf, lroot as u32),
            None => Ok(()),
        }
    }
}

impl Leader {
    fn peer_world(&self, r: u32) -> usize {
        self.comm.world_rank(r as usize).unwrap_or(usize::MAX)
    }

    fn fail(&self, e: rmcast::Error) -> Error {
        let rank = self.comm.world_rank(self.comm.rank()).unwrap_or(0);
        match e {
            rmcast::Error::PeerLost { peer, .. } | rmcast::Error::Reported { peer, .. } => {
                Error::PeerLost {
                    rank,
                    peer: self.peer_world(peer),
                    op: OP,
                    reason: e.to_string(),
                }
            }
            other => Error::InvalidArgument {
                rank,
                op: OP,
                detail: other.to_string(),
            },
        }
    }

    fn bcast(&mut self, buf: &mut [u8], root: u32) -> Result<()> {
        let r = self.bcast_until_done(buf, root);
        if r.is_err() {
            // Lost a member: tell the others, who may wait for it too
            // (best effort; they time out otherwise).
            while let Some(t) = self.member.poll_abort() {
                if let Dest::Member(to) = t.dest {
                    let _ = self.comm.send(t.bytes, to as usize, TAG_CTRL);
                }
            }
        }
        r
    }

    fn bcast_until_done(&mut self, buf: &mut [u8], root: u32) -> Result<()> {
        let me = self.comm.rank() as u32;
        let len = buf.len();
        let mut d = if root == me {
            Data::Source(buf)
        } else {
            Data::Sink(buf)
        };
        self.member
            .begin(Instant::now(), root, len, &mut d)
            .map_err(|e| self.fail(e))?;
        let mut idle = 0u32;
        loop {
            let now = Instant::now();
            let before = (
                self.member.stats().received,
                self.member.stats().nacks_received,
            );
            // Acks and nacks (this also runs the engine's progress).
            while let Some(s) = self.comm.iprobe(ANY_SOURCE, TAG_CTRL)? {
                if s.len > self.ctrl.len() {
                    self.ctrl.resize(s.len, 0);
                }
                let st = self.comm.recv(&mut self.ctrl[..], s.source, TAG_CTRL)?;
                self.member
                    .handle_control(now, st.source as u32, &self.ctrl[..st.len])
                    .map_err(|e| self.fail(e))?;
            }
            // Datagrams (stashed ones first: they came while sending).
            for p in std::mem::take(&mut self.pending) {
                if !self.drop.drop_next() {
                    self.member
                        .handle_datagram(now, &p, &mut d)
                        .map_err(|e| self.fail(e))?;
                }
            }
            let mut res = Ok(());
            let (member, drop) = (&mut self.member, &mut self.drop);
            self.group
                .poll(|dg| {
                    if res.is_ok() && !drop.drop_next() {
                        res = member.handle_datagram(now, dg.data, &mut d);
                    }
                })
                .map_err(|e| self.comm.mcast_err(e.to_string()))?;
            res.map_err(|e| self.fail(e))?;
            if self.member.poll_timeout().is_some_and(|t| t <= now) {
                self.member.handle_timeout(now).map_err(|e| self.fail(e))?;
            }
            loop {
                let dest = match self.member.poll_transmit(now, &d) {
                    Ok(Some(t)) => {
                        self.scratch.clear();
                        self.scratch.extend_from_slice(t.bytes);
                        t.dest
                    }
                    Ok(None) => break,
                    Err(e) => return Err(self.fail(e)),
                };
                match dest {
                    Dest::Member(to) => self.comm.send(&self.scratch[..], to as usize, TAG_CTRL)?,
                    Dest::Group => {
                        let t0 = Instant::now();
                        loop {
                            let sent = self
                                .group
                                .send(&self.scratch)
                                .map_err(|e| self.comm.mcast_err(e.to_string()))?;
                            if sent {
                                break;
                            }
                            let pending = &mut self.pending;
                            self.group
                                .poll(|dg| pending.push(dg.data.to_vec()))
                                .map_err(|e| self.comm.mcast_err(e.to_string()))?;
                            if t0.elapsed() > Duration::from_secs(30) {
                                return Err(self.comm.mcast_err(
                                    "multicast send slots stayed busy for 30 s".into(),
                                ));
                            }
                        }
                    }
                }
            }
            if self.member.current().is_none() && self.member.is_idle() {
                return Ok(());
            }
            // Nothing arrived: after a while let other processes of the
            // node run (the leader spins on a CQ that is not in the
            // engine's poll set).
            if before
                == (
                    self.member.stats().received,
                    self.member.stats().nacks_received,
                )
            {
                idle = idle.saturating_add(1);
                if idle > 128 {
                    std::thread::yield_now();
                }
            } else {
                idle = 0;
            }
        }
    }
}
