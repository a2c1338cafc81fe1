//! The channel to a peer on another node over verbs: one RC queue pair per
//! peer (`ibcoll-rdma`'s [`RcEndpoint`]), all on one device, protection
//! domain, registration cache, completion queue and completion channel per
//! process.
//!
//! Wire format: every SEND carries a 16-byte prefix
//!
//! ```text
//! 0  type u8      1 record (header + payload), 3 DONE
//! 1  flags u8     1: a 16-byte buffer descriptor (addr u64, rkey u32, 0 u32)
//!                    follows the record's payload (RTS: the sender's buffer,
//!                    CTS: the receiver's buffer)
//! 4  used u32     credits the sender has used towards us in all, this one included
//! 8  backlog u32  messages it has waiting for us besides this one
//! 12 granted u32  credits it has granted us in all (piggybacked grant)
//! ```
//!
//! * **Eager** (`len <= IBCOLL_RDMA_EAGER_LIMIT`): prefix + header + payload
//!   into one of the receive buffers of the peer's shared receive queue
//!   (one SRQ per process, `IBCOLL_RDMA_SRQ_BUFS`); inline when small,
//!   else copied into one of the process's registered send buffers. One
//!   credit per message. Credits come from the receiver's SRQ, granted on
//!   demand by its [`Ledger`](super::rdma_flow::Ledger) so that credits
//!   outstanding never exceed buffers posted (no RNR); grants ride on
//!   messages or are RDMA-written into the sender's flow word, and a sender
//!   out of credits asks over UD (WANT) — no control message ever needs a
//!   credit, so the two sides can never wait on each other
//!   (`transport/rdma_flow.rs`, docs/ARCHITECTURE.md).
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

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibcoll_rdma::{
    CompletionChannel, CompletionQueue, DeviceSelection, FlowWords, MemoryRegion, ProtectionDomain,
    QpCaps, QpInfo, RcConfig, RcEndpoint, RegCache, RegCacheConfig, RemoteBuf, SelectedPort,
    SendOp, SendSlots, SrqPool, UdAddr, UdConfig, UdEndpoint, WorkCompletion,
};

use super::header::{Header, Kind, HEADER_LEN};
use super::rdma_cm::{Flow, FlowKind, Msg};
use super::rdma_flow::{Ledger, Outbound, Tell};
use super::{Channel, Health, PeerInfo};
use crate::config::{Config, RdmaConfig, RndvMode};
use crate::engine::ops::Token;
use crate::engine::{Engine, State};

const PREFIX_LEN: usize = 16;
const DESC_LEN: usize = 16;
const MSG_RECORD: u8 = 1;
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
const TAG_GRANT: u64 = 5;
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
    /// The eager buffers and credit ledger every channel shares; made with
    /// the first channel (a rank that never talks over rdma registers none).
    pub shared: RefCell<Option<Shared>>,
}

/// What every rdma channel of the process shares: its receive buffers
/// (one SRQ), send buffers, flow words and the credit ledger over them.
/// Borrowed only inside one channel or engine method at a time, never
/// across a call into another channel.
pub(crate) struct Shared {
    /// The process's eager receive buffers; every RC QP is made on its SRQ.
    pub srq: SrqPool,
    /// Registered send buffers for eager messages too large to inline.
    pub slots: SendSlots,
    /// One word per connection, where its peer RDMA-writes our credits.
    pub words: FlowWords,
    /// Receiver side: credits promised out of the SRQ, by connection.
    pub ledger: Ledger,
    /// The peer of each ledger connection (its id is the index).
    pub conn_peer: Vec<usize>,
    /// SRQ slots consumed in this pass, reposted at its end.
    pub consumed: Vec<usize>,
    /// Channels with records waiting for a credit or a send buffer (each
    /// once, `RdmaChannel::stalled`): looked at every pass until they can
    /// send.
    pub stalled: Vec<usize>,
    /// Scratch for the ledger's dirty connections.
    pub dirty: Vec<u32>,
}

impl Shared {
    fn new(ctx: &RdmaCtx) -> Result<Shared, String> {
        let c = &ctx.cfg;
        let slot = slot_size(c.eager_limit);
        let dev_max = ctx.port.context.attr().max_srq_wr as usize;
        let n = if dev_max > 0 {
            c.srq_bufs.min(dev_max)
        } else {
            c.srq_bufs
        };
        let srq = SrqPool::new(&ctx.pd, slot, n, wr(TAG_RECV, 0))
            .map_err(|e| format!("make the shared receive queue ({n} x {slot} B): {e}"))?;
        let slots = SendSlots::new(&ctx.pd, slot, c.send_bufs)
            .map_err(|e| format!("register {} send buffers: {e}", c.send_bufs))?;
        // Every posted receive can complete into the shared CQ.
        ctx.cq_need.set(ctx.cq_need.get() + n as u32);
        let mut ledger = Ledger::new(n as u32, allowance(n));
        ledger.posted_more(n as u32);
        Ok(Shared {
            srq,
            slots,
            words: FlowWords::new(&ctx.pd),
            ledger,
            conn_peer: Vec::new(),
            consumed: Vec::with_capacity(WC_BATCH),
            stalled: Vec::new(),
            dirty: Vec::new(),
        })
    }

    /// Bytes registered for the shared buffers and the flow words.
    pub fn registered_bytes(&self) -> u64 {
        (self.srq.registered_bytes()
            + self.slots.registered_bytes()
            + self.words.registered_bytes()) as u64
    }
}

/// Receive and send buffer size for an eager limit.
fn slot_size(eager_limit: usize) -> usize {
    (eager_limit.max(8) + MSG_OVERHEAD).div_ceil(64) * 64
}

/// Credits an idle connection keeps (for latency and pipelining), out of an
/// SRQ of `total` buffers; the ledger gives them only while their sum
/// leaves a quarter of the buffers circulating among senders that ask.
fn allowance(total: usize) -> u32 {
    (total / 8).clamp(1, 64) as u32
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
    /// Flow datagrams of this pass.
    pub flows: Vec<Flow>,
    pub flow_stats: FlowCounts,
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
            shared: RefCell::new(None),
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
            flows: Vec::new(),
            flow_stats: FlowCounts::default(),
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

/// First resend of an unanswered WANT; resends double up to [`WANT_MAX`].
const WANT_FIRST: Duration = Duration::from_millis(1);
const WANT_MAX: Duration = Duration::from_millis(64);

/// Flow datagram counts for `IBCOLL_STATS`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FlowCounts {
    /// WANTs sent (first requests and resends).
    pub wants: u64,
}

/// Entries of the shared RC completion queue before any queue pair needs
/// more (it grows with the connections, `RdmaCtx::cq_need`).
const RC_CQ_INITIAL: u32 = 1024;

/// Completions taken from the shared CQ per progress pass.
const WC_BATCH: usize = 32;

/// Send queue depth of every RC QP: eager sends, grant writes, transfers.
const SEND_WR: u32 = 192;

fn make_ep(ctx: &Rc<RdmaCtx>) -> Result<RcEndpoint, String> {
    let c = &ctx.cfg;
    if ctx.shared.borrow().is_none() {
        let sh = Shared::new(ctx)?;
        *ctx.shared.borrow_mut() = Some(sh);
    }
    let shared = ctx.shared.borrow();
    let srq = shared.as_ref().expect("made above").srq.srq().clone();
    drop(shared);
    let max_wr = ctx.port.context.attr().max_qp_wr.max(16);
    let send_wr = SEND_WR.min(max_wr);
    let need = ctx.cq_need.get() + send_wr;
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
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            max_inline_data: 128, // <= the 160-byte staging in send_msg
        },
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: c.rnr_retry,
        ..RcConfig::default()
    };
    let ep = match RcEndpoint::with_srq(&ctx.port, &ctx.pd, cq, cq, &srq, rc) {
        Ok(ep) => ep,
        Err(_) => {
            // The device may not inline that much.
            rc.caps.max_inline_data = 64;
            RcEndpoint::with_srq(&ctx.port, &ctx.pd, cq, cq, &srq, rc).map_err(|e| e.to_string())?
        }
    };
    let caps = ep.qp().caps();
    ctx.cq_need.set(ctx.cq_need.get() + caps.max_send_wr);
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
    // Drop order: the QP before the buffers it uses (`ctx` holds them).
    ep: RcEndpoint,
    ctx: Rc<RdmaCtx>,
    pub eager_limit: usize,
    pub health: Health,
    peer_rank: usize,
    peer_pid: Option<i32>,
    /// Our connection in the shared ledger (receiver side of this pair).
    conn: u32,
    /// Our flow word (the peer writes our credits there), and the credits
    /// we grant the peer up front (both sent in the handshake).
    word: u32,
    grant0: u32,
    /// The peer's flow word (we write its credits there) and UD address
    /// (for WANT and WAKE), from its handshake message.
    peer_word: RemoteBuf,
    peer_ud: Option<UdAddr>,
    /// Sender side: credits the peer granted us and we used.
    out: Outbound,
    /// Listed in `Shared::stalled` (records wait for a credit or a buffer).
    stalled: bool,
    /// The last send found no credit: the engine holds a record for us.
    starved: bool,
    /// When to (re)send WANT while starved, and the next resend interval.
    want_at: Option<Instant>,
    want_gap: Duration,
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
    /// A channel to `peer_rank` with its QP made (in RESET) on the shared
    /// receive queue, its flow word and its connection in the ledger;
    /// [`connect`](Self::connect) brings it up.
    pub fn open(
        ctx: Rc<RdmaCtx>,
        peer_rank: usize,
        peer_pid: Option<i32>,
    ) -> Result<RdmaChannel, String> {
        let ep = make_ep(&ctx)?;
        let (conn, word, grant0) = {
            let mut g = ctx.shared.borrow_mut();
            let sh = g.as_mut().expect("made by make_ep");
            let word = sh
                .words
                .take()
                .map_err(|e| format!("register flow words: {e}"))?;
            let (conn, grant0) = sh.ledger.open();
            debug_assert_eq!(conn as usize, sh.conn_peer.len());
            sh.conn_peer.push(peer_rank);
            (conn, word, grant0)
        };
        let probe_every = (ctx.peer_timeout / 4).max(Duration::from_millis(50));
        Ok(RdmaChannel {
            ep,
            eager_limit: ctx.cfg.eager_limit,
            health: Health::Open,
            peer_rank,
            peer_pid,
            conn,
            word,
            grant0,
            peer_word: RemoteBuf::default(),
            peer_ud: None,
            out: Outbound::new(0),
            stalled: false,
            starved: false,
            want_at: None,
            want_gap: WANT_FIRST,
            posted: 0,
            send_mrs: HashMap::new(),
            rts_remote: HashMap::new(),
            cts_remote: HashMap::new(),
            expect: HashMap::new(),
            xfers: Vec::new(),
            pending: VecDeque::new(),
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

    /// Where the peer is to write our credits, and what we grant it up
    /// front (for the handshake message).
    pub fn flow_offer(&self) -> (RemoteBuf, u32) {
        let g = self.ctx.shared.borrow();
        let sh = g.as_ref().expect("made with the channel");
        (sh.words.remote(self.word), self.grant0)
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

    /// Connects our QP to the peer's (RTR, RTS) as its handshake message
    /// `m` describes, and takes the credits it granted us up front and
    /// where to write its credits: from now on the peer may send (its
    /// receives come from the shared receive queue, always posted).
    pub fn connect(&mut self, m: &Msg) -> Result<(), String> {
        self.ep
            .connect(&m.qp)
            .map_err(|e| format!("connect the queue pair to {}: {e}", self.peer_desc()))?;
        self.peer_word = m.word;
        self.peer_ud = Some(m.ud);
        self.out = Outbound::new(m.grant);
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
            self.retire();
        }
    }

    /// No more credits for this pair: the ledger takes back what it
    /// promised the peer once the completions it may still have queued
    /// are polled. Never called with `shared` borrowed (a failure found
    /// inside a borrow is reported after it ends).
    fn retire(&mut self) {
        if let Ok(mut g) = self.ctx.shared.try_borrow_mut() {
            if let Some(sh) = g.as_mut() {
                sh.ledger.retire(self.conn);
            }
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

    /// Messages this side has waiting for the peer (for the receiver's
    /// grants: never more than will really be sent, or credits would be
    /// parked): the channel's own queue, plus one when the engine holds a
    /// record that found no credit.
    fn backlog(&self) -> u32 {
        self.pending.len() as u32 + u32::from(self.starved)
    }

    /// Takes the credits the peer last wrote into our flow word.
    fn refresh(&mut self, sh: &Shared) {
        let (granted, acked) = sh.words.grant(self.word);
        self.out.see(granted, Some(acked));
    }

    /// Lists the channel among the stalled (once).
    fn stall(&mut self, sh: &mut Shared) {
        if !self.stalled {
            self.stalled = true;
            sh.stalled.push(self.peer_rank);
        }
    }

    /// Sends one message, or returns Ok(false) (nothing sent) when there is
    /// no credit, send-queue room or send buffer now (the channel is then
    /// listed as stalled and retried every pass).
    fn send_msg(
        &mut self,
        ty: u8,
        flags: u8,
        parts: &[&[u8]],
        signal: bool,
    ) -> Result<bool, String> {
        if self.ep.send_queue_free() < 2 {
            // Room comes back with this channel's own completions.
            return Ok(false);
        }
        let ctx = self.ctx.clone();
        let mut g = ctx.shared.borrow_mut();
        let sh = g.as_mut().expect("made with the channel");
        let total = PREFIX_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
        let inline = total <= self.ep.max_inline() as usize;
        if self.out.available() == 0 {
            self.refresh(sh);
        }
        if self.out.available() == 0 {
            self.starved = true;
            self.stall(sh);
            return Ok(false);
        }
        let slot = if inline {
            None
        } else {
            match sh.slots.take() {
                Some(s) => Some(s),
                None => {
                    self.stall(sh);
                    return Ok(false);
                }
            }
        };
        let took = self.out.take();
        debug_assert!(took);
        let signal = signal || self.closing;
        let mut prefix = [0u8; PREFIX_LEN];
        prefix[0] = ty;
        prefix[1] = flags;
        prefix[4..8].copy_from_slice(&self.out.used().to_le_bytes());
        prefix[8..12].copy_from_slice(&self.backlog().to_le_bytes());
        prefix[12..16].copy_from_slice(&sh.ledger.piggyback(self.conn).to_le_bytes());
        let res = match slot {
            None => {
                let mut buf = [0u8; 160];
                buf[..PREFIX_LEN].copy_from_slice(&prefix);
                let mut off = PREFIX_LEN;
                for p in parts {
                    buf[off..off + p.len()].copy_from_slice(p);
                    off += p.len();
                }
                self.ep
                    .send_inline(wr(TAG_INLINE, 0), &buf[..total], SendOp::Send, signal)
            }
            Some(slot) => {
                let mut all: [&[u8]; 5] = [&[]; 5];
                all[0] = &prefix;
                for (i, p) in parts.iter().enumerate().take(4) {
                    all[i + 1] = p;
                }
                let Some(sge) = sh.slots.fill(slot, &all[..parts.len().min(4) + 1]) else {
                    sh.slots.give(slot);
                    return Err(format!(
                        "a {total}-byte message for {} does not fit a send buffer",
                        self.peer_desc()
                    ));
                };
                // Signaled, so the buffer comes back with its own
                // completion even if this channel then goes quiet.
                // SAFETY: the slot lies in the process's registered send
                // buffers, which outlive every QP (they are dropped with
                // the last `Rc<RdmaCtx>`, after every channel); it is not
                // written again until this WR's completion gives it back.
                unsafe {
                    self.ep
                        .post(wr(TAG_SEND, u64::from(slot)), &[sge], SendOp::Send, true)
                }
            }
        };
        if let Err(e) = res {
            if let Some(slot) = slot {
                sh.slots.give(slot);
            }
            return Err(format!("post send to {}: {e}", self.peer_desc()));
        }
        self.posted += 1;
        self.starved = false;
        Ok(true)
    }

    /// Whether a grant can be written to the peer now.
    fn can_write(&self) -> bool {
        self.health == Health::Open && self.connected && self.ep.send_queue_free() >= 1
    }

    /// RDMA-writes `t` into the peer's flow word (inline: no buffer, no
    /// credit, no receive at the peer).
    fn write_grant(&mut self, t: Tell) -> Result<(), String> {
        let w = ibcoll_rdma::grant_word(t.granted, t.acked);
        let dst = RemoteBuf {
            addr: self.peer_word.addr,
            len: w.len() as u64,
            rkey: self.peer_word.rkey,
        };
        self.ep
            .send_inline(wr(TAG_GRANT, 0), &w, SendOp::Write(dst), self.closing)
            .map_err(|e| format!("write credits to {}: {e}", self.peer_desc()))?;
        self.posted += 1;
        Ok(())
    }

    /// A stalled channel's turn in a pass: takes new credits, sends what
    /// waited, and says whether to (re)send WANT (out of credits with
    /// something to send and not yet queued by the peer). Stays listed
    /// while something still waits.
    pub fn unstall(&mut self, now: Instant) -> Option<Flow> {
        self.stalled = false;
        if self.health != Health::Open || !self.connected {
            return None;
        }
        {
            let ctx = self.ctx.clone();
            let g = ctx.shared.borrow();
            self.refresh(g.as_ref().expect("made with the channel"));
        }
        if !self.pending.is_empty() {
            self.flush_pending();
        }
        let waiting = !self.pending.is_empty() || self.starved;
        if !waiting {
            self.want_at = None;
            self.want_gap = WANT_FIRST;
            return None;
        }
        {
            let ctx = self.ctx.clone();
            let mut g = ctx.shared.borrow_mut();
            self.stall(g.as_mut().expect("made with the channel"));
        }
        if self.out.available() > 0 {
            // Waiting for a send buffer or queue room, not for credits.
            self.want_at = None;
            self.want_gap = WANT_FIRST;
            return None;
        }
        let seq = self.out.starve()?;
        if self.want_at.is_some_and(|t| now < t) {
            return None;
        }
        self.want_at = Some(now + self.want_gap);
        self.want_gap = (self.want_gap * 2).min(WANT_MAX);
        Some(Flow {
            kind: FlowKind::Want,
            job: 0,
            from: 0,
            to: self.peer_rank as u32,
            seq,
            used: self.out.used(),
            backlog: self.backlog().max(1),
        })
    }

    /// The peer's UD address (for flow datagrams).
    pub fn peer_ud(&self) -> Option<UdAddr> {
        self.peer_ud
    }

    /// The peer says it granted us credits: look at once.
    pub fn wake(&mut self) {
        let ctx = self.ctx.clone();
        let mut g = ctx.shared.borrow_mut();
        if let Some(sh) = g.as_mut() {
            self.stall(sh);
        }
    }

    /// Our connection in the shared ledger.
    pub fn conn(&self) -> u32 {
        self.conn
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
                if read && addr != 0 && len > 0 && self.out.available() > 0 {
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
        let tag = wc.wr_id() >> TAG_SHIFT;
        if tag == TAG_RECV {
            // The SRQ slot goes back whatever happens to the channel.
            let live = self.health == Health::Open && self.connected && wc.is_success();
            let ctx = self.ctx.clone();
            let mut g = ctx.shared.borrow_mut();
            let sh = g.as_mut().expect("made with the channel");
            let Some(slot) = sh.srq.slot_of(wc.wr_id()) else {
                return;
            };
            sh.consumed.push(slot);
            if !live {
                // Flushed after a failure, or stale: the buffer is free.
                sh.ledger.taken();
                drop(g);
                if self.health == Health::Open && self.connected {
                    self.fail(format!(
                        "rank {}: RECV completed with error on {}: {} (status {})",
                        self.peer_rank,
                        self.ctx.port.context.name(),
                        wc.status_str(),
                        wc.status()
                    ));
                }
                return;
            }
            let r = self.on_recv(peer, st, sh, slot, wc.byte_len() as usize);
            drop(g);
            self.after_wc(r);
            return;
        }
        if tag == TAG_SEND {
            // Signaled, always: the device is done with the buffer (a
            // flushed WR too).
            let ctx = self.ctx.clone();
            let mut g = ctx.shared.borrow_mut();
            if let Some(sh) = g.as_mut() {
                sh.slots.give((wc.wr_id() & TAG_MASK) as u32);
            }
        }
        if self.health != Health::Open || !self.connected {
            // Flushed after a failure (or stale): the channel is done.
            return;
        }
        let r = self.on_completion(st, wc);
        self.after_wc(r);
    }

    fn after_wc(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
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

    /// After this pass's completions: send what waited for room (the SRQ
    /// is reposted and credits granted once per pass, for every channel,
    /// by `Engine::progress_rdma`).
    pub fn service(&mut self) -> usize {
        if self.health != Health::Open || !self.connected {
            return 0;
        }
        let mut n = 0;
        if !self.pending.is_empty() {
            n += self.flush_pending();
        }
        n
    }

    fn on_completion(&mut self, st: &mut State, wc: &WorkCompletion) -> Result<(), String> {
        let tag = wc.wr_id() >> TAG_SHIFT;
        let idx = (wc.wr_id() & TAG_MASK) as usize;
        if let Err(e) = self.ep.on_send_completion(wc) {
            return Err(format!("rank {}: {e}", self.peer_rank));
        }
        match tag {
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

    /// A message in SRQ `slot` (its completion just polled; the slot is
    /// reposted after this pass, once nothing borrows it).
    fn on_recv(
        &mut self,
        peer: usize,
        st: &mut State,
        sh: &mut Shared,
        slot: usize,
        len: usize,
    ) -> Result<(), String> {
        if len < PREFIX_LEN {
            sh.ledger.taken();
            return Err(format!(
                "bad receive completion (slot {slot}, {len} bytes) from rank {}",
                self.peer_rank
            ));
        }
        // SAFETY: the slot's completion was just polled, so the device is
        // done writing it; it is reposted only at the end of the pass,
        // after this borrow of its data ends (`Shared::consumed`).
        let data = unsafe { sh.srq.data(slot, len) };
        let (ty, flags) = (data[0], data[1]);
        let le32 = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        let (used, backlog, granted) = (le32(4), le32(8), le32(12));
        sh.ledger
            .on_message(self.conn, used, backlog)
            .map_err(|e| format!("rank {} broke the credit protocol: {e}", self.peer_rank))?;
        self.out.see(granted, None);
        let body = &data[PREFIX_LEN..];
        match ty {
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
                        // Its last message: nothing more will use our buffers.
                        sh.ledger.retire(self.conn);
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
    /// to its channel (by queue pair number); then reposts the SRQ slots
    /// the pass consumed (one post for all channels) and lets each channel
    /// that took completions send what waited. Costs one poll plus the
    /// work of the completions, whatever the number of peers.
    #[inline]
    pub(crate) fn progress_rdma(&mut self) -> usize {
        let Some(r) = self.rdma.as_mut() else {
            return 0;
        };
        // Connections retired before this poll are released once a poll
        // finds the CQ drained: their last messages were then handed out.
        let retiring = r
            .ctx
            .shared
            .borrow()
            .as_ref()
            .map_or(0, |sh| sh.ledger.retiring());
        let k = match r.ctx.cq.poll(&mut r.wcs[..]) {
            Ok(k) => k,
            Err(e) => {
                let why = format!("polling the completion queue: {e}");
                self.rdma_fail_all(&why);
                return 1;
            }
        };
        if retiring > 0 && k < WC_BATCH {
            if let Some(sh) = r.ctx.shared.borrow_mut().as_mut() {
                sh.ledger.release(retiring);
            }
        }
        if k == 0 {
            return 0;
        }
        for i in 0..k {
            let wc = &r.wcs[i];
            let chan = match r.qp_peer.get(&wc.qp_num()) {
                Some(&peer) => match self.peers.get_mut(peer).map(|p| &mut p.chan) {
                    Some(Channel::Rdma(c)) => Some((peer, c)),
                    _ => None,
                },
                None => None,
            };
            match chan {
                Some((peer, c)) => {
                    c.on_wc(peer, &mut self.st, wc);
                    if !c.touched {
                        c.touched = true;
                        r.touched.push(peer);
                    }
                }
                None if wc.wr_id() >> TAG_SHIFT == TAG_RECV => {
                    // No channel for it (any more): its buffer still goes back.
                    if let Some(sh) = r.ctx.shared.borrow_mut().as_mut() {
                        if let Some(slot) = sh.srq.slot_of(wc.wr_id()) {
                            sh.consumed.push(slot);
                            sh.ledger.taken();
                        }
                    }
                }
                None => {}
            }
        }
        let repost = match r.ctx.shared.borrow_mut().as_mut() {
            Some(sh) if !sh.consumed.is_empty() => {
                // SAFETY: each slot's completion was polled in this pass
                // and its data handed on (the engine copies what it keeps);
                // nothing borrows it any more.
                let res = unsafe { sh.srq.repost(&sh.consumed) };
                if res.is_ok() {
                    sh.ledger.posted_more(sh.consumed.len() as u32);
                }
                sh.consumed.clear();
                res
            }
            _ => Ok(()),
        };
        if let Err(e) = repost {
            let why = format!("reposting the shared receive queue: {e}");
            self.rdma_fail_all(&why);
            return 1;
        }
        let mut n = k;
        let Some(r) = self.rdma.as_mut() else {
            return n;
        };
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

    /// Once per pass, after the completions and datagrams: the ledger
    /// hands out the buffers that came back (waiting senders first), the
    /// connections with news get their credits written, and the stalled
    /// senders look at their credits and (re)send WANT. Visits only
    /// connections with news and stalled senders.
    pub(crate) fn progress_rdma_flow(&mut self) -> usize {
        let Some(r) = self.rdma.as_mut() else {
            return 0;
        };
        let ctx = r.ctx.clone();
        let mut g = ctx.shared.borrow_mut();
        let Some(sh) = g.as_mut() else {
            return 0;
        };
        let mut n = 0;
        sh.ledger.serve();
        let mut dirty = std::mem::take(&mut sh.dirty);
        sh.ledger.take_dirty(&mut dirty);
        let mut failed: Vec<(usize, String)> = Vec::new();
        for &id in &dirty {
            let peer = sh.conn_peer[id as usize];
            let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) else {
                continue;
            };
            if c.conn() != id || c.health != Health::Open {
                continue;
            }
            if !c.can_write() {
                // No room in its send queue (or not connected yet): later.
                sh.ledger.redo(id);
                continue;
            }
            let Some(t) = sh.ledger.due(id) else {
                continue;
            };
            n += 1;
            if let Err(e) = c.write_grant(t) {
                failed.push((peer, e));
                continue;
            }
            if let (true, Some(dst)) = (t.wake, c.peer_ud()) {
                let f = Flow {
                    kind: FlowKind::Wake,
                    job: r.job,
                    from: r.rank as u32,
                    to: peer as u32,
                    seq: 0,
                    used: 0,
                    backlog: 0,
                };
                // A lost WAKE costs the sleeper at most its bounded sleep.
                let _ = r.ud.send(&dst, &f.encode());
            }
        }
        dirty.clear();
        sh.dirty = dirty;
        let stalled = std::mem::take(&mut sh.stalled);
        drop(g);
        for (peer, e) in failed {
            if let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) {
                c.fail(e);
            }
            self.health_dirty = true;
        }
        if stalled.is_empty() {
            return n;
        }
        let now = Instant::now();
        let Some(r) = self.rdma.as_mut() else {
            return n;
        };
        for &peer in &stalled {
            let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) else {
                continue;
            };
            let Some(mut f) = c.unstall(now) else {
                continue;
            };
            if c.health != Health::Open {
                self.health_dirty = true;
                continue;
            }
            let Some(dst) = c.peer_ud() else {
                continue;
            };
            f.job = r.job;
            f.from = r.rank as u32;
            r.flow_stats.wants += 1;
            // A lost WANT is resent (`WANT_FIRST` doubling to `WANT_MAX`).
            let _ = r.ud.send(&dst, &f.encode());
        }
        n
    }

    /// A flow datagram from a peer (WANT: it is out of credits; WAKE: it
    /// wrote us credits).
    pub(crate) fn on_flow(&mut self, f: &Flow) {
        let Some(r) = self.rdma.as_ref() else {
            return;
        };
        let peer = f.from as usize;
        if f.job != r.job || f.to as usize != self.rank() || peer >= self.size() {
            return;
        }
        let ctx = r.ctx.clone();
        let Some(Channel::Rdma(c)) = self.peers.get_mut(peer).map(|p| &mut p.chan) else {
            return;
        };
        if c.health != Health::Open || !c.is_connected() {
            return;
        }
        match f.kind {
            FlowKind::Want => {
                if let Some(sh) = ctx.shared.borrow_mut().as_mut() {
                    sh.ledger.on_want(c.conn(), f.seq, f.used, f.backlog);
                }
            }
            FlowKind::Wake => c.wake(),
        }
    }

    /// Whether a blocked wait must wake up soon by itself: a stalled
    /// sender resends WANT on a timer that no completion announces.
    pub(crate) fn rdma_stalled(&self) -> bool {
        self.rdma.as_ref().is_some_and(|r| {
            r.ctx
                .shared
                .borrow()
                .as_ref()
                .is_some_and(|sh| !sh.stalled.is_empty())
        })
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

    /// Bytes registered with the device for the rdma channels' buffers: the
    /// UD endpoint's, the shared receive queue's, the send buffers and the
    /// flow words (nothing else is per connection).
    pub(crate) fn rdma_registered_bytes(&self) -> u64 {
        self.rdma.as_ref().map_or(0, |r| {
            r.ud.registered_bytes() as u64
                + r.ctx
                    .shared
                    .borrow()
                    .as_ref()
                    .map_or(0, |sh| sh.registered_bytes())
        })
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
    fn allowance_leaves_buffers_to_circulate() {
        assert_eq!(allowance(16), 2);
        assert_eq!(allowance(8), 1);
        assert_eq!(allowance(1024), 64);
        assert_eq!(allowance(65536), 64);
        // A full message fits a slot whatever the eager limit.
        assert!(slot_size(8192) >= 8192 + MSG_OVERHEAD);
        assert_eq!(slot_size(8192) % 64, 0);
    }

    #[test]
    fn wr_ids_round_trip() {
        let id = wr(TAG_XFER, 17);
        assert_eq!(id >> TAG_SHIFT, TAG_XFER);
        assert_eq!(id & TAG_MASK, 17);
        assert_eq!(wr(TAG_RECV, 5), 5);
    }
}
