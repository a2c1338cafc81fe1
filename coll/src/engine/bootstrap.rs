//! Building the engine: PMI, this rank's card (one fence), the node
//! segment and the channels to the other ranks of the node, and the network
//! side for ranks on other nodes, which get their channels on first use.
//!
//! Order: local rank 0 creates the node segment; a rank that may have peers
//! on other nodes opens its listener and, when rdma may be used, its verbs
//! device with one UD endpoint; everyone `put`s its constant-size card
//! (`card.rs`: pid, node, host, CMA ability, the listener's port and
//! addresses, the UD address) and fences, the only fence of init. Then the
//! ranks of a node attach to the segment and publish their slot in it
//! (world rank, pid, flags), so they learn each other without the
//! key-value space. Nothing else is per remote peer: a peer's card is
//! fetched, and the tcp connection or RC queue pair made, when the pair
//! first talks (`connect.rs`, `rdma_connect.rs`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ibcoll_launcher::Pmi;
use ibcoll_shm::{LayoutParams, NodeLayout, NodeSegment, ShmError};

use super::card::Card;
use super::connect::Net;
use super::peers::Peers;
use super::{Engine, State};
use crate::config::{CmaMode, Config, TransportMode};
use crate::error::{Error, Op, Result};
use crate::transport::local::LocalChannel;
use crate::transport::rdma::RdmaNet;
use crate::transport::shm::{PipeOut, ShmChannel, ShmInbox};
use crate::transport::tcp_connect::job_key;
use crate::transport::{netif, Channel};

/// The key-value key of rank `r`'s card.
pub(crate) fn card_key(r: usize) -> String {
    format!("ibc{r}")
}

/// Flags a rank publishes in its node-segment slot.
const LOCAL_CMA: u32 = 1;
const LOCAL_MEMBARRIER: u32 = 2;

/// Where this rank sits in the job.
struct Placement {
    rank: usize,
    size: usize,
    node_id: usize,
    local_rank: usize,
    local_size: usize,
    num_nodes: usize,
}

/// Whether this process can do CMA transfers, per config and probe.
pub(crate) fn cma_usable(cfg: &Config) -> (bool, String) {
    match cfg.cma {
        CmaMode::Off => (false, "disabled by IBCOLL_CMA=off".into()),
        CmaMode::On | CmaMode::Auto => {
            let _ = ibcoll_shm::allow_peer_access();
            match ibcoll_shm::cma_probe() {
                Ok(()) => (true, "process_vm_readv works".into()),
                Err(e) if cfg.cma == CmaMode::On => (true, format!("forced on despite: {e}")),
                Err(e) => (false, e.to_string()),
            }
        }
    }
}

/// The addresses this rank would publish for tcp and why (for
/// `ibcoll-info`).
pub(crate) fn tcp_address_choice(cfg: &Config) -> std::result::Result<netif::Choice, String> {
    netif::choose(cfg.tcp_host.as_deref(), cfg.tcp_if.as_deref())
}

/// More ranks on the node than it has CPUs online. Counted against the
/// node, not this rank's affinity mask: a rank bound to one core (ibrun
/// --bind-to core) is not oversubscribed by that.
fn oversubscribed(local_size: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    cpus > 0 && local_size as i64 > cpus
}

impl Engine {
    /// Initialises the world from the environment (PMI or singleton): the
    /// node segment, this rank's card (published with the only fence of
    /// init), the channels to the other
    /// ranks of the node, and the network side for the others, which get
    /// channels on first use.
    pub(crate) fn init() -> Result<Engine> {
        let cfg = Config::from_env()?;
        let mut pmi = Pmi::init().map_err(|e| Error::Pmi {
            rank: e.rank,
            op: Op::Init,
            detail: e.to_string(),
        })?;
        let pl = Placement {
            rank: pmi.rank(),
            size: pmi.size(),
            node_id: pmi.node_id(),
            local_rank: pmi.local_rank(),
            local_size: pmi.local_size().max(1),
            num_nodes: pmi.num_nodes().max(1),
        };
        let rank = pl.rank;
        let pmi_err = |e: ibcoll_launcher::PmiError| Error::Pmi {
            rank,
            op: Op::Init,
            detail: e.to_string(),
        };
        let mut cfg = cfg;
        if cfg.shm_tree_min == 0 {
            // Measured on 2 cores (docs/PERFORMANCE.md): oversubscribed, the
            // tree's 2 log4(n) dependent publications lose to the flat
            // barrier at 4 to 32 ranks.
            cfg.shm_tree_min = if oversubscribed(pl.local_size) {
                usize::MAX
            } else {
                16
            };
        }
        let use_shm = cfg.transport == TransportMode::Auto && pl.local_size > 1;
        let cma = use_shm && cma_usable(&cfg).0;
        let (layout, seg_name, created) = create_segment(&cfg, &pl, &pmi, use_shm)?;

        // The network side, when any peer may be on another node (or tcp
        // is forced): its listener is up before the fence, so a peer that
        // fetched our card can always connect.
        let need_tcp = pl.size > 1 && (cfg.transport == TransportMode::Tcp || pl.num_nodes > 1);
        let (net, port, addrs) = if need_tcp {
            open_network(&cfg, rank, pmi.job_id())?
        } else {
            (None, 0, Vec::new())
        };
        let host = netif::host_key();
        let (rdma, rdma_note) = setup_rdma(&cfg, &pl, job_key(pmi.job_id()), host)?;

        let membarrier = use_shm && cfg.membarrier && ibcoll_shm::fences::register();
        let me = Card {
            pid: std::process::id() as i32,
            node: pl.node_id as u32,
            local_rank: pl.local_rank as u32,
            cma,
            membarrier,
            verbs: rdma.is_some(),
            ud: rdma.as_ref().map(|r| r.ud.local_addr()),
            explicit: cfg.tcp_host.is_some() || cfg.tcp_if.is_some(),
            host,
            port,
            addrs,
        };
        let mut stats = super::stats::Stats::default();
        if pl.size > 1 {
            pmi.put(&card_key(rank), &me.encode()).map_err(pmi_err)?;
            stats.puts += 1;
            pmi.fence().map_err(pmi_err)?;
            stats.fences += 1;
        }

        let mut peers = Peers::new(pl.size);
        peers.add(
            rank,
            Channel::Local(LocalChannel::new(cfg.eager_limit)),
            true,
        );
        let mut shm_peers = Vec::new();
        let mut shm_inbox = None;
        let shm_polled = crate::transport::shm::Polled::default();
        let node = if use_shm {
            let n = attach_segment(&cfg, &pl, &seg_name, layout, created, cma, membarrier)?;
            let (sp, inbox) = shm_channels(&cfg, &pl, &n, cma, &mut peers, &shm_polled)?;
            shm_peers = sp;
            shm_inbox = inbox;
            Some(n)
        } else {
            None
        };

        if rank == 0 && cfg.transport == TransportMode::Auto && pl.num_nodes > 1 {
            if let Some(why) = &rdma_note {
                eprintln!(
                    "ibcoll: no usable RDMA device ({}), using tcp between nodes",
                    why.lines().next().unwrap_or("")
                );
            }
        }
        let mut net = net;
        if let Some(r) = &rdma {
            // Completions (handshake datagrams first) wake a blocked rank
            // through the epoll set.
            let mut n = match net.take() {
                Some(n) => n,
                None => Net::new(job_key(pmi.job_id()))
                    .map_err(|e| tcp_setup_err(rank, rank, format!("epoll: {e}")))?,
            };
            let _ = n
                .poll
                .add_input(r.ctx.comp.fd(), super::netpoll::Source::Rdma);
            net = Some(n);
        }

        let over = oversubscribed(pl.local_size);
        // A short spin, then sched_yield: long pause loops cost more than
        // they catch on a VM (pause-loop exits; 2 pinned ranks: 8 B
        // latency 0.31 us with 2000 spins, 0.13 with 20, allreduce 0.40 vs
        // 0.16). Oversubscribed, a rank that cannot go on yields at once:
        // the rank it waits for may need this CPU (8 ranks on 2 cores:
        // allreduce 8 B 6.5-7.6 us with no spinning vs 13-14 us with 20).
        let spins = cfg.spins.unwrap_or(if over { 0 } else { 20 });
        let yields = cfg.yields.unwrap_or(2000);
        Ok(Engine {
            st: State::new(rank),
            peers,
            queued: 0,
            ctl_retry: VecDeque::new(),
            shm_peers,
            shm_inbox,
            shm_polled,
            tcp_peers: Vec::new(),
            rdma_peers: Vec::new(),
            rdma,
            net,
            me,
            use_shm,
            health_dirty: false,
            slots: node.as_ref().and_then(|n| {
                ibcoll_shm::SlotArea::new(n, cfg.shm_coll_bytes)
                    .ok()
                    .map(|a| a.layout())
            }),
            node,
            local_rank: pl.local_rank,
            local_size: pl.local_size,
            node_id: pl.node_id,
            num_nodes: pl.num_nodes,
            cfg,
            spins,
            yields,
            pmi: Some(pmi),
            next_ctx: 2,
            last_liveness: Instant::now(),
            any_failed: false,
            watch: None,
            hang_published: false,
            wake: None,
            fast: super::FastSeq::new(pl.local_size),
            poisoned: None,
            stats,
            launcher_fd: None,
        })
        .map(|mut e| {
            e.watch_launcher();
            e
        })
    }
}

/// The parameters of the node segment for `local_size` ranks.
pub(crate) fn layout_params(cfg: &Config, local_size: usize) -> LayoutParams {
    LayoutParams {
        local_size,
        ring_bytes: cfg.ring_bytes,
        boxes: cfg.shm_boxes,
        queue_bytes: cfg.queue_bytes,
        pipe_slots: if cfg.cma == CmaMode::On {
            0
        } else {
            cfg.pipe_slots
        },
        pipe_chunk: cfg.pipe_chunk,
        extra_bytes: if cfg.shm_coll_bytes > 0 {
            ibcoll_shm::SlotArea::bytes_needed(local_size, cfg.shm_coll_bytes)
        } else {
            0
        },
    }
}

/// The node's segment layout and name; local rank 0 creates it before the
/// fence (the others open it after).
fn create_segment(
    cfg: &Config,
    pl: &Placement,
    pmi: &Pmi,
    use_shm: bool,
) -> Result<(NodeLayout, String, Option<NodeSegment>)> {
    let rank = pl.rank;
    let layout =
        NodeLayout::from_params(layout_params(cfg, pl.local_size)).map_err(|e| shm_err(rank, e))?;
    let seg_name = ibcoll_shm::segment_name(pmi.job_id(), pl.node_id);
    let mut created = None;
    if use_shm && pl.local_rank == 0 {
        let n = match NodeSegment::create(&seg_name, layout) {
            Err(ShmError::Exists { .. }) => {
                // A crashed job with the same id left it behind.
                let _ = ibcoll_shm::Segment::unlink(&seg_name);
                NodeSegment::create(&seg_name, layout)
            }
            r => r,
        }
        .map_err(|e| shm_err(rank, e))?;
        created = Some(n);
    }
    Ok((layout, seg_name, created))
}

/// The epoll set and the listener; the port and addresses to publish.
#[allow(clippy::type_complexity)]
fn open_network(
    cfg: &Config,
    rank: usize,
    job: &str,
) -> Result<(Option<Net>, u16, Vec<std::net::IpAddr>)> {
    let mut net =
        Net::new(job_key(job)).map_err(|e| tcp_setup_err(rank, rank, format!("epoll: {e}")))?;
    let port = net
        .listen()
        .map_err(|e| tcp_setup_err(rank, rank, format!("listen: {e}")))?;
    let choice = tcp_address_choice(cfg).map_err(|e| Error::Config {
        var: "IBCOLL_TCP_IF",
        value: cfg.tcp_if.clone().unwrap_or_default(),
        detail: e,
    })?;
    let mut addrs = choice.addrs;
    addrs.truncate(super::card::MAX_ADDRS);
    Ok((Some(net), port, addrs))
}

fn wants_rdma(cfg: &Config, pl: &Placement) -> bool {
    pl.size > 1
        && match cfg.transport {
            TransportMode::Auto => pl.num_nodes > 1,
            TransportMode::Rdma => true,
            TransportMode::Tcp => false,
        }
}

/// The verbs side: device, PD and the UD endpoint (RC queue pairs are made
/// per peer on first use). Without a device (auto mode) the reason is
/// returned for rank 0's note.
fn setup_rdma(
    cfg: &Config,
    pl: &Placement,
    job: u64,
    host: u64,
) -> Result<(Option<RdmaNet>, Option<String>)> {
    if !wants_rdma(cfg, pl) {
        return Ok((None, None));
    }
    match RdmaNet::new(cfg, pl.node_id, pl.rank, job, host) {
        Ok(s) => Ok((Some(s), None)),
        Err(e) if cfg.transport == TransportMode::Rdma => Err(Error::Transport {
            rank: pl.rank,
            peer: pl.rank,
            op: Op::Init,
            transport: "rdma",
            detail: format!("IBCOLL_TRANSPORT=rdma needs a usable verbs device: {e}"),
        }),
        Err(e) => Ok((None, Some(e))),
    }
}

/// Opens (or takes the created) node segment, publishes this rank's slot
/// and waits until every rank of the node has published its own: what the
/// ranks of a node need of each other comes through the segment, not
/// through the key-value space.
fn attach_segment(
    cfg: &Config,
    pl: &Placement,
    seg_name: &str,
    layout: NodeLayout,
    created: Option<NodeSegment>,
    cma: bool,
    membarrier: bool,
) -> Result<Rc<NodeSegment>> {
    let rank = pl.rank;
    let n = match created {
        Some(n) => n,
        None => NodeSegment::open(seg_name, layout).map_err(|e| shm_err(rank, e))?,
    };
    let flags = if cma { LOCAL_CMA } else { 0 } | if membarrier { LOCAL_MEMBARRIER } else { 0 };
    n.publish_rank(pl.local_rank, rank as u32, flags);
    let deadline = Instant::now() + cfg.peer_timeout.max(Duration::from_secs(30));
    let mut b = ibcoll_shm::backoff::Backoff::new(0, 1000);
    loop {
        let missing = (0..pl.local_size).find(|&l| n.rank_info(l).is_none());
        let Some(l) = missing else { break };
        if Instant::now() >= deadline {
            return Err(shm_err(
                rank,
                ShmError::Invalid(format!(
                    "local rank {l} of this node never attached to segment {seg_name}"
                )),
            ));
        }
        if b.step() == ibcoll_shm::backoff::Step::Block {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Light ringers only when every rank of the node can take the
    // sleeper's side of the barrier; decided before any shm traffic.
    let all_membarrier = (0..pl.local_size).all(|l| {
        n.rank_info(l)
            .is_some_and(|(_, _, f)| f & LOCAL_MEMBARRIER != 0)
    });
    ibcoll_shm::fences::set_light_ringers(membarrier && all_membarrier);
    if n.all_attached() {
        let _ = n.unlink();
    }
    Ok(Rc::new(n))
}

/// One shm channel to every other rank of the node (from their slots in
/// the segment), and this rank's receive queue; returns their world ranks.
fn shm_channels(
    cfg: &Config,
    pl: &Placement,
    node: &Rc<NodeSegment>,
    cma: bool,
    peers: &mut Peers,
    polled: &crate::transport::shm::Polled,
) -> Result<(Vec<usize>, Option<ShmInbox>)> {
    let rank = pl.rank;
    let mut out = Vec::with_capacity(pl.local_size.saturating_sub(1));
    let mut inbox = match node.layout().queue_offset(pl.local_rank) {
        // SAFETY: `local_rank` is ours in this segment, and this is the
        // only inbox this process makes.
        Some(_) => Some(unsafe { ShmInbox::new(node.clone(), pl.local_rank) })
            .transpose()
            .map_err(|e| shm_err(rank, e))?
            .map(|mut ib| {
                ib.grant_after(cfg.shm_box_after);
                ib
            }),
        None => None,
    };
    let pipe = match node.layout().pipe_offset(pl.local_rank) {
        // SAFETY: as above, the only pipe sender this process makes.
        Some(_) => Some(unsafe { PipeOut::new(node.clone(), pl.local_rank) })
            .transpose()
            .map_err(|e| shm_err(rank, e))?
            .map(|p| Rc::new(RefCell::new(p))),
        None => None,
    };
    // The pipe needs both ranks running at once; CMA does not.
    let cma_min = if oversubscribed(pl.local_size) {
        0
    } else {
        16 << 20
    };
    for l in (0..pl.local_size).filter(|&l| l != pl.local_rank) {
        let (pid, world, flags) = node
            .rank_info(l)
            .ok_or_else(|| shm_err(rank, ShmError::Invalid(format!("local rank {l} vanished"))))?;
        let world = world as usize;
        if world >= pl.size || world == rank || peers.slot(world).is_some() {
            return Err(Error::Protocol {
                rank,
                peer: world,
                detail: format!("local rank {l} claims world rank {world}, which clashes"),
            });
        }
        // SAFETY: `local_rank` is ours in this segment and this loop makes
        // exactly one channel per other local rank.
        let mut ch = unsafe {
            ShmChannel::new(
                node.clone(),
                pl.local_rank,
                l,
                pid,
                cma && flags & LOCAL_CMA != 0,
                cfg.eager_limit,
                pipe.clone(),
            )
        }
        .map_err(|e| shm_err(rank, e))?;
        ch.split_min = cfg.shm_split_min;
        ch.die_mid_queue_at(cfg.test_die_mid_queue);
        ch.cma_chunk = cfg.shm_cma_chunk;
        ch.cma_min = cfg.shm_cma_min.unwrap_or(cma_min);
        // Polled only once it has a box or work (`Polled`).
        let slot = peers.add(world, Channel::Shm(ch), false);
        if let Channel::Shm(c) = &mut peers.list[slot].chan {
            c.set_slot(slot, polled.clone());
        }
        if let Some(ib) = inbox.as_mut() {
            ib.route(l, slot);
        }
        out.push(world);
    }
    out.sort_unstable();
    Ok((out, inbox))
}

fn shm_err(rank: usize, e: ShmError) -> Error {
    Error::Transport {
        rank,
        peer: rank,
        op: Op::Init,
        transport: "shm",
        detail: e.to_string(),
    }
}

fn tcp_setup_err(rank: usize, peer: usize, detail: String) -> Error {
    Error::Transport {
        rank,
        peer,
        op: Op::Init,
        transport: "tcp",
        detail,
    }
}
