//! The channel to a peer on another node over verbs: one RC queue pair per
//! peer (`ibcoll-rdma`'s [`RcEndpoint`]), all on one device, protection
//! domain, registration cache, completion queue and completion channel per
//! process.
//!
//! Wire format: every SEND carries an 8-byte prefix
//!
//! ```text
//! 0  type u8     1 record (header + payload), 2 credits only, 3 DONE
//! 1  flags u8    1: a 16-byte buffer descriptor (addr u64, rkey u32, 0 u32)
//!                   follows the record's payload (RTS: the sender's buffer,
//!                   CTS: the receiver's buffer)
//! 4  credits u32 receive buffers the sender reposted since it last said so
//! ```
//!
//! * **Eager** (`len <= IBCOLL_RDMA_EAGER_LIMIT`): prefix + header + payload
//!   into one of the peer's pre-posted receive buffers; inline when small,
//!   else copied into a registered send buffer. One credit per message;
//!   credits come back piggybacked on every message, or in an explicit
//!   credit message once `IBCOLL_RDMA_CREDIT_UPDATE` are owed. One credit
//!   is kept for that message, so both sides can never wait on each other
//!   (and a receiver never runs out of posted buffers: no RNR).
//! * **Rendezvous, read** (default up to `IBCOLL_RDMA_READ_MAX`): the RTS carries the sender's buffer
//!   (registered through the cache); the matched receiver RDMA-reads
//!   `min(len, capacity)` bytes straight into its registered buffer and
//!   answers FIN. Zero copy, one round trip.
//! * **Rendezvous, write** (above `IBCOLL_RDMA_READ_MAX`,
//!   `IBCOLL_RDMA_RNDV=write`, or when the sender could not register): the receiver's CTS carries its buffer; the sender
//!   RDMA-writes into it and sends DONE behind the write (RC keeps order);
//!   the send completes with the write's completion.
//!
//! Failures: a completion error fails the channel with the verbs status
//! and the peer; the engine turns it into `PeerLost` for the operations
//! that need the peer. A peer on the same host (virtual nodes) is also
//! checked by pid; otherwise a zero-length RDMA write probes an idle peer
//! every `IBCOLL_PEER_TIMEOUT_MS / 4`, and the QP's ack timeout and retry
//! count (`IBCOLL_RDMA_TIMEOUT`, `IBCOLL_RDMA_RETRY_CNT`) turn a dead peer
//! into "transport retry counter exceeded".
//!
//! Completions: every RC queue pair of the process shares one CQ
//! (`RdmaCtx::cq`); `Engine::progress_rdma` polls it once per pass and
//! dispatches by QP number. Blocking waits arm that CQ and the UD one and
//! sleep in `poll(2)` on the completion channel's fd together with the tcp
//! sockets.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibcoll_rdma::{
    CompletionChannel, CompletionQueue, Credits, DeviceSelection, MemoryRegion, ProtectionDomain,
    QpCaps, QpInfo, RcConfig, RcEndpoint, RecvPool, RegCache, RegCacheConfig, RegisteredBuffer,
    RemoteBuf, SelectedPort, SendOp, UdAddr, UdConfig, UdEndpoint, WorkCompletion,
};

use super::header::{Header, Kind, HEADER_LEN};
use super::{Channel, Health, PeerInfo};
use crate::config::{Config, RdmaConfig, RndvMode};
use crate::engine::ops::Token;
use crate::engine::{Engine, State};

const PREFIX_LEN: usize = 8;
const DESC_LEN: usize = 16;
const MSG_RECORD: u8 = 1;
const MSG_CREDIT: u8 = 2;
const MSG_DONE: u8 = 3;
const FLAG_DESC: u8 = 1;

/// Bytes beyond the eager limit in a receive buffer: prefix, header, and a
/// control word plus a buffer descriptor.
const MSG_OVERHEAD: usize = PREFIX_LEN + HEADER_LEN + 8 + DESC_LEN;

const TAG_SHIFT: u32 = 60;
const TAG_RECV: u64 = 0;
const TAG_SEND: u64 = 1;
const TAG_INLINE: u64 = 2;
const TAG_XFER: u64 = 3;
const TAG_PROBE: u64 = 4;
const TAG_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// Largest RDMA read/write posted as one WR; longer transfers are split.
const MAX_WR_BYTES: usize = 1 << 30;

fn wr(tag: u64, idx: u64) -> u64 {
    (tag << TAG_SHIFT) | (idx & TAG_MASK)
}

/// The verbs resources shared by every rdma channel of the process.
pub(crate) struct RdmaCtx {
    pub port: SelectedPort,
    pub pd: Arc<ProtectionDomain>,
    pub comp: Arc<CompletionChannel>,
    /// Receive buffers (the device and peers write them).
    pub cache: RegCache,
    /// Send buffers: remote read only, so read-only memory (constants in
    /// the binary) can be sent too.
    pub send_cache: RegCache,
    pub cfg: RdmaConfig,
    pub peer_timeout: Duration,
    /// The one completion queue of every RC queue pair of the process
    /// (sends and receives): a progress pass polls it once, whatever the
    /// number of peers, and a blocking wait arms only it.
    pub cq: Arc<CompletionQueue>,
    /// Entries the queue pairs made so far can have outstanding at once;
    /// the CQ is grown to hold them (an overrun CQ is fatal).
    pub cq_need: Cell<u32>,
}

impl RdmaCtx {
    /// Device, port and GID, for messages.
    #[allow(dead_code)]
    pub fn describe(&self) -> String {
        format!(
            "{} port {}{}",
            self.port.context.name(),
            self.port.port,
            self.port
                .gid
                .as_ref()
                .map(|g| format!(" gid[{}] {}", g.index, g.gid))
                .unwrap_or_default()
        )
    }
}

/// `IBCOLL_IB_DEVICE` for node `node_id`: a comma list means "node i uses
/// entry i mod n"; `auto` or empty means automatic choice.
pub(crate) fn device_for_node(value: Option<&str>, node_id: usize) -> Option<String> {
    let v = value?.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("auto") {
        return None;
    }
    let list: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if list.is_empty() {
        return None;
    }
    Some(list[node_id % list.len()].to_string())
}

/// The `IBCOLL_IB_*` choice for node `node_id`: one entry of a comma list
/// in `IBCOLL_IB_DEVICE`, and `auto` meaning "let the verbs layer choose".
fn selection_for_node(node_id: usize) -> Result<DeviceSelection, String> {
    let env = |k: &str| std::env::var(k).ok();
    let dev = device_for_node(env(ibcoll_rdma::device::ENV_DEVICE).as_deref(), node_id);
    DeviceSelection::from_lookup(|k| {
        if k == ibcoll_rdma::device::ENV_DEVICE {
            dev.clone()
        } else {
            env(k).filter(|v| !v.trim().eq_ignore_ascii_case("auto"))
        }
    })
    .map_err(|e| e.to_string())
}

/// What `ibcoll-info` reports: the device this process (as node
/// `IBCOLL_NODE_ID`, default 0) would use, or why there is none.
pub fn status() -> (bool, String) {
    let node = std::env::var("IBCOLL_NODE_ID")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let selected = selection_for_node(node).and_then(|s| s.select().map_err(|e| e.to_string()));
    match selected {
        Ok(p) => (
            true,
            format!(
                "{} port {}{}",
                p.context.name(),
                p.port,
                p.gid
                    .as_ref()
                    .map(|g| format!(" gid[{}] {} ({})", g.index, g.gid, g.gid_type))
                    .unwrap_or_else(|| format!(" lid {}", p.attr.lid))
            ),
        ),
        Err(e) => (
            false,
            e.to_string().lines().next().unwrap_or("").to_string(),
        ),
    }
}

/// A handshake in progress (`rdma_cm.rs`): the peer, what to resend to
/// it and when, and the bound.
pub(crate) struct Handshake {
    pub peer: usize,
    /// This rank sent the first REQ (else it answers with REP).
    pub requester: bool,
    pub msg: [u8; super::rdma_cm::MSG_LEN],
    pub dst: UdAddr,
    pub tries: u32,
    pub next: Instant,
    pub started: Instant,
    pub deadline: Instant,
}

/// Handshake counts for `IBCOLL_STATS`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CmStats {
    /// Handshakes this rank started (its first message to the peer).
    pub requested: u64,
    /// Handshakes a peer started with this rank.
    pub answered: u64,
    /// Handshakes that ended with both QPs ready.
    pub completed: u64,
    pub failed: u64,
    /// Datagrams resent after a timeout.
    pub resent: u64,
    /// Requester-side handshakes that completed, and the sum and largest
    /// time from the first REQ to ready.
    pub timed: u64,
    pub total_us: u64,
    pub max_us: u64,
}

/// The verbs side of a process: device, PD, caches, and the UD endpoint
/// the connection manager speaks over. RC queue pairs are made per peer,
/// on first use.
pub(crate) struct RdmaNet {
    // Drop order: the UD QP before the CQ it uses.
    pub ud: UdEndpoint,
    pub ud_cq: Arc<CompletionQueue>,
    pub ctx: Rc<RdmaCtx>,
    /// Handshakes in progress (only peers being connected).
    pub hs: Vec<Handshake>,
    /// Handshake datagrams of this pass (kept for its allocation).
    pub inbox: Vec<super::rdma_cm::Msg>,
    pub stats: CmStats,
    /// The peer of each RC queue pair's number, to dispatch the shared
    /// CQ's completions (filled when the QP is made).
    pub qp_peer: HashMap<u32, usize>,
    pub wcs: Box<[WorkCompletion; WC_BATCH]>,
    /// Peers whose channel took completions in this pass (each once).
    pub touched: Vec<usize>,
    /// What every handshake datagram says of this rank.
    pub job: u64,
    pub rank: usize,
    pub pid: i32,
    pub host: u64,
}

impl RdmaNet {
    /// Opens this node's device and makes the UD endpoint. The error says
    /// why rdma cannot be used here.
    pub fn new(
        cfg: &Config,
        node_id: usize,
        rank: usize,
        job: u64,
        host: u64,
    ) -> Result<RdmaNet, String> {
        let sel = selection_for_node(node_id)?;
        let port = sel.select().map_err(|e| e.to_string())?;
        let pd = ProtectionDomain::new(&port.context).map_err(|e| e.to_string())?;
        let comp = CompletionChannel::new(&port.context).map_err(|e| e.to_string())?;
        let cache = RegCache::new(&pd, RegCacheConfig::default());
        let send_cache = RegCache::new(
            &pd,
            RegCacheConfig {
                access: ibcoll_rdma::Access::REMOTE_READ,
                ..RegCacheConfig::default()
            },
        );
        let ucfg = UdConfig {
            drop_one_in: cfg.rdma.ud_drop,
            ..UdConfig::default()
        };
        let ud_cq =
            CompletionQueue::new(&port.context, ucfg.send_bufs + ucfg.recv_bufs, Some(&comp))
                .map_err(|e| e.to_string())?;
        let ud = UdEndpoint::new(&port, &pd, Some(&ud_cq), ucfg).map_err(|e| e.to_string())?;
        let cq = CompletionQueue::new(&port.context, RC_CQ_INITIAL, Some(&comp))
            .map_err(|e| e.to_string())?;
        let ctx = Rc::new(RdmaCtx {
            cq,
            cq_need: Cell::new(0),
            port,
            pd,
            comp,
            cache,
            send_cache,
            cfg: cfg.rdma.clone(),
            peer_timeout: cfg.peer_timeout,
        });
        Ok(RdmaNet {
            ud,
            ud_cq,
            ctx,
            hs: Vec::new(),
            inbox: Vec::new(),
            stats: CmStats::default(),
            job,
            rank,
            pid: std::process::id() as i32,
            host,
            qp_peer: HashMap::new(),
            wcs: Box::new(std::array::from_fn(|_| WorkCompletion::default())),
            touched: Vec::new(),
        })
    }

    /// Completions of `qpn` belong to `peer` from now on.
    pub fn bind_qp(&mut self, qpn: u32, peer: usize) {
        self.qp_peer.insert(qpn, peer);
    }
}

/// Entries of the shared RC completion queue before any queue pair needs
/// more (it grows with the connections, `RdmaCtx::cq_need`).
const RC_CQ_INITIAL: u32 = 1024;

/// Completions taken from the shared CQ per progress pass.
const WC_BATCH: usize = 32;

fn make_ep(ctx: &Rc<RdmaCtx>) -> Result<RcEndpoint, String> {
    let c = &ctx.cfg;
    let max_wr = ctx.port.context.attr().max_qp_wr.max(16);
    let send_wr = (2 * c.recv_bufs as u32 + 64).min(max_wr);
    let recv_wr = (c.recv_bufs as u32).min(max_wr);
    let need = ctx.cq_need.get() + send_wr + recv_wr;
    let cq = &ctx.cq;
    if need > cq.capacity() {
        let want = need
            .max(cq.capacity().saturating_mul(2))
            .min(ctx.port.context.attr().max_cqe.max(need));
        cq.resize(want)
            .map_err(|e| format!("grow the completion queue to {want} entries: {e}"))?;
    }
    let mut rc = RcConfig {
        caps: QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 128, // <= the 160-byte staging in send_msg
        },
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: c.rnr_retry,
        ..RcConfig::default()
    };
    let ep = match RcEndpoint::new(&ctx.port, &ctx.pd, cq, cq, rc) {
        Ok(ep) => ep,
        Err(_) => {
            // The device may not inline that much.
            rc.caps.max_inline_data = 64;
            RcEndpoint::new(&ctx.port, &ctx.pd, cq, cq, rc).map_err(|e| e.to_string())?
        }
    };
    let caps = ep.qp().caps();
    ctx.cq_need
        .set(ctx.cq_need.get() + caps.max_send_wr + caps.max_recv_wr);
    Ok(ep)
}

/// A rendezvous transfer in flight (RDMA read or write).
struct Xfer {
    write: bool,
    /// Sender's token (write: ours; read: the peer's, for the FIN).
    send_token: u64,
    /// Receiver's token (read: ours; write: the peer's, for DONE).
    recv_token: u64,
    len: usize,
    chunks_left: usize,
    _mr: Arc<MemoryRegion>,
}

/// Work waiting for a credit or send-queue room, in order.
enum Pend {
    Msg {
        ty: u8,
        flags: u8,
        body: Vec<u8>,
        signal: bool,
    },
    Xfer {
        write: bool,
        send_token: u64,
        recv_token: u64,
        local: u64,
        remote: RemoteBuf,
        len: usize,
        mr: Arc<MemoryRegion>,
    },
}

pub(crate) struct RdmaChannel {
    // Drop order: the QP before the buffers it uses.
    ep: RcEndpoint,
    pool: RecvPool,
    sbuf: RegisteredBuffer,
    ctx: Rc<RdmaCtx>,
    pub eager_limit: usize,
    pub health: Health,
    peer_rank: usize,
    peer_pid: Option<i32>,
    credits: Credits,
    send_slot: usize,
    nslots: usize,
    next_slot: usize,
    /// WR count at which each send slot was last posted (0: never).
    slot_wr: Vec<u64>,
    /// Send WRs posted so far (mirrors the endpoint's count).
    posted: u64,
    /// Sender: registrations held for RTSs until FIN.
    send_mrs: HashMap<u64, Arc<MemoryRegion>>,
    /// Receiver: the senders' buffers offered in RTSs, by send token.
    rts_remote: HashMap<u64, RemoteBuf>,
    /// Sender: the receivers' buffers from CTSs, by send token.
    cts_remote: HashMap<u64, RemoteBuf>,
    /// Receiver: registered receive buffers, by receive token.
    expect: HashMap<u64, (Arc<MemoryRegion>, u64, usize)>,
    xfers: Vec<Option<Xfer>>,
    pending: VecDeque<Pend>,
    consumed: Vec<usize>,
    /// Consumed slots reposted together (one `ibv_post_recv` per batch);
    /// with the credit threshold it stays below the slot count, so a
    /// sender never waits for credits held back here.
    repost_batch: usize,
    last_heard: Instant,
    /// Something completed since the last liveness check.
    heard: bool,
    probe_out: bool,
    probe_every: Duration,
    /// BYE queued: signal every WR so finalize can wait for all of them.
    closing: bool,
    /// What the peer's goodbye said ([`bye_header`](super::bye_header)).
    pub bye_cause: u64,
    /// The QP is connected to the peer's (RTS) and its receives posted.
    connected: bool,
    /// The peer's QP is connected too: records may be sent. Until then
    /// `try_send` finds no room, so sends wait in order in the engine.
    ready: bool,
    /// Listed in `RdmaNet::touched` for this pass.
    pub touched: bool,
}

/// How many consumed receive slots to repost at once. Slots held back here
/// plus credits owed below the update threshold must stay below the slot
/// count, or a sender could wait for credits nobody sends: batch +
/// threshold <= slots (with the reserved credit, the sender keeps >= 1).
fn repost_batch(slots: usize, credit_update: usize) -> usize {
    ((slots - credit_update.min(slots - 1)) / 2).clamp(1, 16)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn desc(addr: u64, rkey: u32) -> [u8; DESC_LEN] {
    let mut d = [0u8; DESC_LEN];
    d[..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&rkey.to_le_bytes());
    d
}

impl RdmaChannel {
    /// Bytes of this channel's own registered buffers.
    pub fn registered_bytes(&self) -> u64 {
        (self.pool.slot_size() * self.pool.count() + self.sbuf.len()) as u64
    }

    /// A channel to `peer_rank` with its QP made (in RESET) and its
    /// buffers registered; [`connect`](Self::connect) brings it up.
    pub fn open(
        ctx: Rc<RdmaCtx>,
        peer_rank: usize,
        peer_pid: Option<i32>,
    ) -> Result<RdmaChannel, String> {
        let ep = make_ep(&ctx)?;
        let c = ctx.cfg.clone();
        let slot = (c.eager_limit.max(8) + MSG_OVERHEAD).div_ceil(64) * 64;
        let nrecv = (ep.qp().caps().max_recv_wr as usize)
            .min(c.recv_bufs)
            .max(4);
        let pool =
            RecvPool::new(&ctx.pd, slot, nrecv, wr(TAG_RECV, 0)).map_err(|e| e.to_string())?;
        let sbuf = RegisteredBuffer::new(
            &ctx.pd,
            slot * c.send_bufs,
            ibcoll_rdma::Access::LOCAL_WRITE,
        )
        .map_err(|e| e.to_string())?;
        let probe_every = (ctx.peer_timeout / 4).max(Duration::from_millis(50));
        Ok(RdmaChannel {
            ep,
            pool,
            sbuf,
            eager_limit: c.eager_limit,
            health: Health::Open,
            peer_rank,
            peer_pid,
            // The peer posted as many buffers as we did (same config).
            credits: Credits::new(nrecv as u32, c.credit_update as u32),
            send_slot: slot,
            nslots: c.send_bufs,
            next_slot: 0,
            slot_wr: vec![0; c.send_bufs],
            posted: 0,
            send_mrs: HashMap::new(),
            rts_remote: HashMap::new(),
            cts_remote: HashMap::new(),
            expect: HashMap::new(),
            xfers: Vec::new(),
            pending: VecDeque::new(),
            consumed: Vec::with_capacity(nrecv),
            repost_batch: repost_batch(nrecv, c.credit_update),
            last_heard: Instant::now(),
            heard: false,
            probe_out: false,
            probe_every,
            closing: false,
            bye_cause: 0,
            connected: false,
            ready: false,
            touched: false,
            ctx,
        })
    }

    /// What the peer needs to connect its QP to ours.
    pub fn local_info(&self) -> QpInfo {
        self.ep.local_info()
    }

    /// The peer's QP number, once connected.
    pub fn remote_qpn(&self) -> Option<u32> {
        self.ep.remote().map(|r| r.qpn)
    }

    pub fn is_connected(&self) -> bool {
        self.connected
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Connects our QP to the peer's `remote` one (RTR, RTS) and posts the
    /// receive buffers: from now on the peer may send.
    pub fn connect(&mut self, remote: &QpInfo) -> Result<(), String> {
        self.ep
            .connect(remote)
            .map_err(|e| format!("connect the queue pair to {}: {e}", self.peer_desc()))?;
        // SAFETY: the pool lives in this channel, which drops the QP (`ep`,
        // first field) before the pool; slots are read only between their
        // completion and their repost.
        unsafe { self.pool.post_all(self.ep.qp()) }
            .map_err(|e| format!("post receives for {}: {e}", self.peer_desc()))?;
        self.connected = true;
        self.last_heard = Instant::now();
        Ok(())
    }

    /// The peer's QP is connected: records may flow.
    pub fn set_ready(&mut self) {
        self.ready = true;
    }

    /// This channel's queue pair number (its completions carry it).
    pub fn qpn(&self) -> u32 {
        self.ep.qp().qpn()
    }

    /// True while work waits for credits or completions.
    pub fn has_backlog(&self) -> bool {
        self.health == Health::Open && (!self.pending.is_empty() || self.ep.outstanding() > 0)
    }

    pub fn fail(&mut self, reason: String) {
        if self.health == Health::Open {
            // Stop the device from touching memory the engine is about to
            // hand back to the user: outstanding WRs are flushed.
            let _ = self.ep.qp().set_error();
            self.health = Health::Failed(reason);
        }
    }

    fn peer_desc(&self) -> String {
        format!(
            "rank {} over {} qpn {:#x}",
            self.peer_rank,
            self.ctx.port.context.name(),
            self.ep.qp().qpn()
        )
    }

    fn completed(&self) -> u64 {
        self.posted - self.ep.outstanding()
    }

    /// Sends one message, or returns Ok(false) (nothing sent) when there is
    /// no credit, send-queue room or send buffer now.
    fn send_msg(
        &mut self,
        ty: u8,
        flags: u8,
        parts: &[&[u8]],
        signal: bool,
    ) -> Result<bool, String> {
        if self.ep.send_queue_free() < 2 {
            return Ok(false);
        }
        let total = PREFIX_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
        let inline = total <= self.ep.max_inline() as usize;
        let slot = self.next_slot;
        if !inline && self.completed() < self.slot_wr[slot] {
            return Ok(false);
        }
        let signal = signal || self.closing;
        // Credit updates and the goodbye may use the reserved credit.
        let ok = if ty == MSG_CREDIT || self.closing {
            self.credits.try_take_for_update()
        } else {
            self.credits.try_take()
        };
        if !ok {
            return Ok(false);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        prefix[0] = ty;
        prefix[1] = flags;
        prefix[4..8].copy_from_slice(&self.credits.take_owed().to_le_bytes());
        let res = if inline {
            let mut buf = [0u8; 160];
            buf[..PREFIX_LEN].copy_from_slice(&prefix);
            let mut off = PREFIX_LEN;
            for p in parts {
                buf[off..off + p.len()].copy_from_slice(p);
                off += p.len();
            }
            self.ep
                .send_inline(wr(TAG_INLINE, 0), &buf[..total], SendOp::Send, signal)
        } else {
            let base = slot * self.send_slot;
            let dst = &mut self.sbuf.as_mut_slice()[base..base + total];
            dst[..PREFIX_LEN].copy_from_slice(&prefix);
            let mut off = PREFIX_LEN;
            for p in parts {
                dst[off..off + p.len()].copy_from_slice(p);
                off += p.len();
            }
            let sge = self.sbuf.sge(base, total as u32).expect("slot in range");
            let half = (self.nslots / 2).max(1);
            let force = signal || slot % half == half - 1;
            // SAFETY: the slot lies in our registered send buffer, which
            // outlives the QP (field order); it is not written again until
            // a completion at or after this WR retires it (`slot_wr`).
            unsafe {
                self.ep
                    .post(wr(TAG_SEND, slot as u64), &[sge], SendOp::Send, force)
            }
        };
        res.map_err(|e| format!("post send to {}: {e}", self.peer_desc()))?;
        self.posted += 1;
        if !inline {
            self.slot_wr[slot] = self.posted;
            self.next_slot = (slot + 1) % self.nslots;
        }
        Ok(true)
    }

    /// Sends a message now or queues it behind earlier ones.
    fn send_or_queue(&mut self, ty: u8, flags: u8, body: Vec<u8>, signal: bool) {
        if self.pending.is_empty() {
            match self.send_msg(ty, flags, &[&body], signal) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    self.fail(e);
                    return;
                }
            }
        }
        self.pending.push_back(Pend::Msg {
            ty,
            flags,
            body,
            signal,
        });
    }

    fn register(&self, addr: u64, len: usize, send: bool) -> Result<Arc<MemoryRegion>, String> {
        let cache = if send {
            &self.ctx.send_cache
        } else {
            &self.ctx.cache
        };
        // SAFETY: `addr..addr+len` is a user buffer borrowed by a pending
        // operation's Request, hence mapped memory of this process.
        unsafe { cache.get_raw(addr as *const u8, len) }
            .map_err(|e| format!("cannot register {len} bytes at {addr:#x}: {e}"))
    }

    /// Posts an RDMA read or write (split into WRs of at most 1 GiB), or
    /// returns Ok(false) when the send queue has no room.
    #[allow(clippy::too_many_arguments)]
    fn post_xfer(
        &mut self,
        write: bool,
        send_token: u64,
        recv_token: u64,
        local: u64,
        remote: RemoteBuf,
        len: usize,
        mr: &Arc<MemoryRegion>,
    ) -> Result<bool, String> {
        let chunks = len.div_ceil(MAX_WR_BYTES).max(1);
        if (self.ep.send_queue_free() as usize) < chunks + 1 {
            return Ok(false);
        }
        let idx = match self.xfers.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.xfers.push(None);
                self.xfers.len() - 1
            }
        };
        for c in 0..chunks {
            let off = c * MAX_WR_BYTES;
            let n = (len - off).min(MAX_WR_BYTES);
            let sge = mr
                .sge_at(local + off as u64, n as u32)
                .ok_or_else(|| "buffer outside its registration".to_string())?;
            let rb = RemoteBuf {
                addr: remote.addr + off as u64,
                len: n as u64,
                rkey: remote.rkey,
            };
            let op = if write {
                SendOp::Write(rb)
            } else {
                SendOp::Read(rb)
            };
            // SAFETY: `sge` lies in `mr`, a registration of a user buffer
            // borrowed by the pending operation until the transfer's
            // completion has been polled (the Xfer keeps `mr` alive that
            // long); on failure the QP is moved to the error state first.
            unsafe { self.ep.post(wr(TAG_XFER, idx as u64), &[sge], op, true) }
                .map_err(|e| format!("post {} to {}: {e}", op.name(), self.peer_desc()))?;
            self.posted += 1;
        }
        self.xfers[idx] = Some(Xfer {
            write,
            send_token,
            recv_token,
            len,
            chunks_left: chunks,
            _mr: mr.clone(),
        });
        if write {
            // DONE goes behind the write: RC delivers it after the data.
            let mut body = Vec::with_capacity(16);
            body.extend_from_slice(&recv_token.to_le_bytes());
            body.extend_from_slice(&(len as u64).to_le_bytes());
            match self.send_msg(MSG_DONE, 0, &[&body], false)? {
                true => {}
                false => self.pending.push_front(Pend::Msg {
                    ty: MSG_DONE,
                    flags: 0,
                    body,
                    signal: false,
                }),
            }
        }
        Ok(true)
    }

    fn flush_pending(&mut self) -> usize {
        let mut n = 0;
        while let Some(p) = self.pending.pop_front() {
            let r = match &p {
                Pend::Msg {
                    ty,
                    flags,
                    body,
                    signal,
                } => self.send_msg(*ty, *flags, &[body], *signal),
                Pend::Xfer {
                    write,
                    send_token,
                    recv_token,
                    local,
                    remote,
                    len,
                    mr,
                } => {
                    let mr = mr.clone();
                    // A DONE this queues goes to the front, ahead of `p`'s
                    // successors, which is where it belongs.
                    self.post_xfer(*write, *send_token, *recv_token, *local, *remote, *len, &mr)
                }
            };
            match r {
                Ok(true) => n += 1,
                Ok(false) => {
                    self.pending.push_front(p);
                    break;
                }
                Err(e) => {
                    self.fail(e);
                    break;
                }
            }
        }
        n
    }

    pub fn try_send(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        if self.health != Health::Open {
            // The engine fails the operation from the channel's health.
            return true;
        }
        if !self.ready {
            // Still connecting: the record waits in the engine, in order.
            return false;
        }
        if !self.pending.is_empty() {
            self.flush_pending();
            if !self.pending.is_empty() {
                return false;
            }
        }
        let h = hdr.encode();
        let res = match hdr.kind {
            Kind::Rts => {
                let addr = if payload.len() == 8 {
                    le_u64(payload)
                } else {
                    0
                };
                let len = hdr.len as usize;
                let mut d = None;
                let read = match self.ctx.cfg.rndv {
                    RndvMode::Read => true,
                    RndvMode::Write => false,
                    RndvMode::Auto => len <= self.ctx.cfg.read_max,
                };
                if read && addr != 0 && len > 0 && self.credits.available() > 0 {
                    // If registration fails, the receiver answers CTS
                    // and we write instead (and report the error there).
                    if let Ok(mr) = self.register(addr, len, true) {
                        d = Some(desc(addr, mr.rkey()));
                        self.send_mrs.insert(hdr.seq, mr);
                    }
                }
                match d {
                    Some(d) => self.send_msg(MSG_RECORD, FLAG_DESC, &[&h, payload, &d], false),
                    None => self.send_msg(MSG_RECORD, 0, &[&h, payload], false),
                }
            }
            Kind::Cts if hdr.len > 0 && payload.len() == 8 => {
                let recv_token = le_u64(payload);
                let Some((mr, addr, wanted)) = self.expect.get(&recv_token).cloned() else {
                    self.fail(format!("CTS for unknown receive {recv_token:#x}"));
                    return true;
                };
                if let Some(remote) = self.rts_remote.remove(&hdr.seq) {
                    // Read mode: take the data instead of asking for it.
                    let len = wanted.min(remote.len as usize);
                    self.pending.push_back(Pend::Xfer {
                        write: false,
                        send_token: hdr.seq,
                        recv_token,
                        local: addr,
                        remote,
                        len,
                        mr,
                    });
                    self.flush_pending();
                    return true;
                }
                let d = desc(addr, mr.rkey());
                self.send_msg(MSG_RECORD, FLAG_DESC, &[&h, payload, &d], false)
            }
            _ => self.send_msg(MSG_RECORD, 0, &[&h, payload], false),
        };
        match res {
            Ok(sent) => sent,
            Err(e) => {
                self.fail(e);
                true
            }
        }
    }

    /// Receiver, before CTS: `wanted` bytes at `buf` are the target of
    /// rendezvous `recv_token`; registers them.
    pub fn expect_stream(&mut self, recv_token: Token, wanted: usize, buf: *mut u8) {
        if buf.is_null() || wanted == 0 {
            return;
        }
        match self.register(buf as u64, wanted, false) {
            Ok(mr) => {
                self.expect.insert(recv_token, (mr, buf as u64, wanted));
            }
            Err(e) => self.fail(e),
        }
    }

    /// Sender, after CTS: write `len` bytes at `ptr` into the receiver's
    /// buffer named in the CTS.
    pub fn start_stream(&mut self, send_token: Token, recv_token: u64, ptr: *const u8, len: usize) {
        if self.health != Health::Open {
            return;
        }
        let Some(remote) = self.cts_remote.remove(&send_token) else {
            self.fail(format!("CTS for send {send_token:#x} carried no buffer"));
            return;
        };
        let mr = match self.register(ptr as u64, len, true) {
            Ok(m) => m,
            Err(e) => {
                self.fail(e);
                return;
            }
        };
        self.pending.push_back(Pend::Xfer {
            write: true,
            send_token,
            recv_token,
            local: ptr as u64,
            remote,
            len: len.min(remote.len as usize),
            mr,
        });
        self.flush_pending();
    }

    /// Queues a goodbye (signaled, so finalize can wait for it).
    pub fn send_bye(&mut self, cause: u64) {
        // A pair that never connected has nothing to close.
        if self.health == Health::Open && self.ready {
            self.closing = true;
            let h = super::bye_header(cause).encode();
            self.send_or_queue(MSG_RECORD, 0, h.to_vec(), true);
        }
    }

    /// Same-host pid check, and a probe of an idle peer.
    pub fn check_alive(&mut self) -> Option<String> {
        if self.health != Health::Open {
            return None;
        }
        if let Some(pid) = self.peer_pid {
            if !ibcoll_shm::pid_alive(pid) {
                return Some(format!("process {pid} is gone"));
            }
        }
        if self.heard {
            self.heard = false;
            self.last_heard = Instant::now();
        }
        if !self.connected {
            // The handshake's deadline bounds the wait for an answer.
            return None;
        }
        if !self.probe_out
            && self.last_heard.elapsed() >= self.probe_every
            && self.ep.send_queue_free() >= 2
        {
            // A zero-length RDMA write touches no memory on either side
            // (no SGE; responders skip the R_Key check, IBTA C9-88); it is
            // acked by a live peer and fails with "retry counter exceeded"
            // when the peer's QP is gone.
            // SAFETY: no SGEs: the WR reads and writes no local memory.
            let r = unsafe {
                self.ep.post(
                    wr(TAG_PROBE, 0),
                    &[],
                    SendOp::Write(RemoteBuf::default()),
                    true,
                )
            };
            match r {
                Ok(_) => {
                    self.posted += 1;
                    self.probe_out = true;
                }
                Err(e) => return Some(format!("probe failed: {e}")),
            }
        }
        None
    }

    /// One completion of this channel's QP, taken from the shared CQ.
    #[inline]
    pub fn on_wc(&mut self, peer: usize, st: &mut State, wc: &WorkCompletion) {
        if self.health != Health::Open || !self.connected {
            // Flushed after a failure (or stale): the channel is done.
            return;
        }
        if let Err(e) = self.on_completion(peer, st, wc) {
            self.fail(e);
            return;
        }
        if !self.ready {
            // Only a connected peer can have sent (or acked) anything: its
            // RDY may still be on the way, but it is ready.
            self.ready = true;
        }
        // No clock read here: it can cost microseconds (emulated
        // clocksources); check_alive turns the flag into a time.
        self.heard = true;
    }

    /// After this pass's completions: repost consumed buffers, send what
    /// waited for credits or room, return credits.
    pub fn service(&mut self) -> usize {
        if self.health != Health::Open || !self.connected {
            return 0;
        }
        let mut n = 0;
        if self.consumed.len() >= self.repost_batch {
            // SAFETY: these slots' data has been consumed (handed to the
            // engine, which copies what it keeps); the pool outlives the QP.
            if let Err(e) = unsafe { self.pool.repost(self.ep.qp(), &self.consumed) } {
                self.fail(format!("repost receives for {}: {e}", self.peer_desc()));
                return n;
            }
            self.credits.reposted(self.consumed.len() as u32);
            self.consumed.clear();
        }
        if !self.pending.is_empty() {
            n += self.flush_pending();
        }
        if self.credits.update_due() && self.pending.is_empty() {
            match self.send_msg(MSG_CREDIT, 0, &[], false) {
                Ok(_) => {}
                Err(e) => self.fail(e),
            }
        }
        n
    }

    fn on_completion(
        &mut self,
        peer: usize,
        st: &mut State,
        wc: &WorkCompletion,
    ) -> Result<(), String> {
        let tag = wc.wr_id() >> TAG_SHIFT;
        let idx = (wc.wr_id() & TAG_MASK) as usize;
        if tag != TAG_RECV {
            if let Err(e) = self.ep.on_send_completion(wc) {
                return Err(format!("rank {}: {e}", self.peer_rank));
            }
        } else if !wc.is_success() {
            return Err(format!(
                "rank {}: RECV completed with error on {}: {} (status {})",
                self.peer_rank,
                self.ctx.port.context.name(),
                wc.status_str(),
                wc.status()
            ));
        }
        match tag {
            TAG_RECV => self.on_recv(peer, st, idx, wc.byte_len() as usize),
            TAG_XFER => {
                let Some(x) = self.xfers.get_mut(idx).and_then(Option::as_mut) else {
                    return Ok(());
                };
                x.chunks_left -= 1;
                if x.chunks_left > 0 {
                    return Ok(());
                }
                let x = self.xfers[idx].take().expect("present");
                if x.write {
                    st.send_stream_done(x.send_token);
                } else {
                    self.expect.remove(&x.recv_token);
                    st.recv_stream_advance(x.recv_token, x.len);
                    let mut fin = Header::new(Kind::Fin);
                    fin.seq = x.send_token;
                    self.send_or_queue(MSG_RECORD, 0, fin.encode().to_vec(), false);
                }
                Ok(())
            }
            TAG_PROBE => {
                self.probe_out = false;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn on_recv(
        &mut self,
        peer: usize,
        st: &mut State,
        slot: usize,
        len: usize,
    ) -> Result<(), String> {
        if slot >= self.pool.count() || len < PREFIX_LEN {
            return Err(format!(
                "bad receive completion (slot {slot}, {len} bytes) from rank {}",
                self.peer_rank
            ));
        }
        self.consumed.push(slot);
        let data = self.pool.data(slot, len);
        let (ty, flags) = (data[0], data[1]);
        let credits = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        self.credits.grant(credits);
        let body = &data[PREFIX_LEN..];
        match ty {
            MSG_CREDIT => Ok(()),
            MSG_DONE => {
                if body.len() < 16 {
                    return Err("short DONE message".into());
                }
                let (tok, n) = (le_u64(body), le_u64(&body[8..]) as usize);
                self.expect.remove(&tok);
                st.recv_stream_advance(tok, n);
                Ok(())
            }
            MSG_RECORD => {
                let hdr = Header::decode(body).map_err(|e| format!("bad header over rdma: {e}"))?;
                let mut payload = &body[HEADER_LEN..];
                let mut d = None;
                if flags & FLAG_DESC != 0 {
                    if payload.len() < DESC_LEN {
                        return Err("short buffer descriptor".into());
                    }
                    let (p, x) = payload.split_at(payload.len() - DESC_LEN);
                    payload = p;
                    d = Some(RemoteBuf {
                        addr: le_u64(x),
                        len: hdr.len,
                        rkey: u32::from_le_bytes([x[8], x[9], x[10], x[11]]),
                    });
                }
                let info = PeerInfo {
                    cma_pid: None,
                    local: false,
                };
                match hdr.kind {
                    Kind::Bye => {
                        self.health = Health::Closed;
                        self.bye_cause = hdr.seq;
                        return Ok(());
                    }
                    Kind::Rts => {
                        if let Some(d) = d {
                            self.rts_remote.insert(hdr.seq, d);
                        }
                    }
                    Kind::Cts => {
                        if let Some(d) = d {
                            self.cts_remote.insert(hdr.seq, d);
                        }
                    }
                    Kind::Fin => {
                        self.send_mrs.remove(&hdr.seq);
                    }
                    _ => {}
                }
                st.on_record(peer, info, &hdr, payload)
            }
            t => Err(format!("unknown rdma message type {t}")),
        }
    }
}

// ------------------------------------------------------------------ engine

impl Engine {
    /// Arms every rdma CQ for a completion event before a blocking wait
    /// (the completion channel's descriptor is in the epoll set). Returns
    /// false when something happened meanwhile and the caller must not
    /// block.
    pub(crate) fn rdma_arm(&mut self) -> bool {
        if let Some(r) = &self.rdma {
            // Handshake datagrams wake a blocked rank too.
            let _ = r.ud_cq.req_notify(false);
            if let Err(e) = r.ctx.cq.req_notify(false) {
                let why = format!("cannot arm the completion queue: {e}");
                self.rdma_fail_all(&why);
            }
        }
        self.progress() == 0
    }

    /// Polls the shared RC completion queue once and hands each completion
    /// to its channel (by queue pair number); then each channel that took
    /// some reposts, sends what waited and returns credits. Costs one poll
    /// plus the work of the completions, whatever the number of peers.
    #[inline]
    pub(crate) fn progress_rdma(&mut self) -> usize {
        let Some(r) = self.rdma.as_mut() else {
            return 0;
        };
        let k = match r.ctx.cq.poll(&mut r.wcs[..]) {
            Ok(0) => return 0,
            Ok(k) => k,
            Err(e) => {
                let why = format!("polling the completion queue: {e}");
                self.rdma_fail_all(&why);
                return 1;
            }
        };
        for i in 0..k {
            let wc = &r.wcs[i];
            let Some(&peer) = r.qp_peer.get(&wc.qp_num()) else {
                continue;
            };
            if let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) {
                c.on_wc(peer, &mut self.st, wc);
                if !c.touched {
                    c.touched = true;
                    r.touched.push(peer);
                }
            }
        }
        let mut n = k;
        for peer in r.touched.drain(..) {
            if let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) {
                c.touched = false;
                n += c.service();
                if c.health != Health::Open {
                    self.health_dirty = true;
                }
            }
        }
        n
    }

    /// The device failed under every rdma channel (rare: an error of the
    /// shared CQ itself).
    #[cold]
    fn rdma_fail_all(&mut self, why: &str) {
        for i in 0..self.rdma_peers.len() {
            let p = self.rdma_peers[i];
            if let Some(Channel::Rdma(c)) = self.peers.get_mut(p).map(|x| &mut x.chan) {
                c.fail(why.to_string());
            }
        }
        self.health_dirty = true;
    }

    /// After a blocking wait that included the completion channel: consumes
    /// the completion events (the CQs are polled by the next progress pass).
    pub(crate) fn rdma_after_wait(&mut self) {
        if let Some(r) = &self.rdma {
            let _ = r.ctx.comp.take_events();
        }
    }

    /// True while an open rdma channel still has messages or completions
    /// outstanding (finalize waits for them).
    pub(crate) fn rdma_backlog(&self) -> bool {
        self.rdma_peers.iter().any(|&p| match self.peers.chan(p) {
            Some(Channel::Rdma(c)) => c.has_backlog(),
            _ => false,
        })
    }

    /// Bytes registered with the device for the rdma channels' own buffers
    /// (receive pools and send rings).
    pub(crate) fn rdma_registered_bytes(&self) -> u64 {
        let ud = self
            .rdma
            .as_ref()
            .map_or(0, |r| r.ud.registered_bytes() as u64);
        ud + self
            .rdma_peers
            .iter()
            .map(|&p| match self.peers.chan(p) {
                Some(Channel::Rdma(c)) => c.registered_bytes(),
                _ => 0,
            })
            .sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_per_node() {
        assert_eq!(device_for_node(None, 3), None);
        assert_eq!(device_for_node(Some("auto"), 0), None);
        assert_eq!(device_for_node(Some(" "), 0), None);
        assert_eq!(
            device_for_node(Some("mlx5_0"), 5).as_deref(),
            Some("mlx5_0")
        );
        assert_eq!(
            device_for_node(Some("rxe0,rxe1"), 0).as_deref(),
            Some("rxe0")
        );
        assert_eq!(
            device_for_node(Some("rxe0,rxe1"), 1).as_deref(),
            Some("rxe1")
        );
        assert_eq!(
            device_for_node(Some("rxe0, rxe1"), 3).as_deref(),
            Some("rxe1")
        );
    }

    #[test]
    fn repost_batch_never_starves_credits() {
        for slots in 4..300 {
            for update in 1..slots {
                let b = repost_batch(slots, update);
                assert!((1..=16).contains(&b), "{slots} {update} -> {b}");
                assert!(b + update <= slots, "{slots} {update} -> {b}");
            }
        }
        assert_eq!(repost_batch(64, 16), 16);
        assert_eq!(repost_batch(4, 1), 1);
    }

    #[test]
    fn wr_ids_round_trip() {
        let id = wr(TAG_XFER, 17);
        assert_eq!(id >> TAG_SHIFT, TAG_XFER);
        assert_eq!(id & TAG_MASK, 17);
        assert_eq!(wr(TAG_RECV, 5), 5);
    }
}
