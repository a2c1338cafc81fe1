//! Building the engine: PMI, one exchange of per-rank cards (one fence),
//! the node segment, rdma queue pairs, tcp connections, and one channel per
//! peer.
//!
//! Order: local rank 0 creates the node segment; every rank that has tcp
//! peers binds a listener; a rank with peers on other nodes (or everywhere
//! with `IBCOLL_TRANSPORT=rdma`) opens its verbs device and makes one RC QP
//! per such peer; everyone `put`s its card (pid, node, local rank, CMA
//! ability, tcp address, its QPs' addresses) and fences; then the others
//! open the segment, each rdma pair connects its QPs (a pair uses rdma when
//! both published a QP for the other), and each other pair of tcp peers
//! connects (the lower rank connects, the higher accepts). When any pair
//! uses rdma, a second fence makes sure every QP is ready to receive before
//! anyone sends.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ibcoll_launcher::Pmi;
use ibcoll_rdma::QpInfo;
use ibcoll_shm::{LayoutParams, NodeLayout, NodeSegment, ShmError};

use super::{Engine, State};
use crate::config::{CmaMode, Config, TransportMode};
use crate::error::{Error, Op, Result};
use crate::transport::local::LocalChannel;
use crate::transport::rdma::RdmaSetup;
use crate::transport::shm::ShmChannel;
use crate::transport::tcp::{tune_socket, TcpChannel};
use crate::transport::Channel;

const CARD_VERSION: u8 = 2;
const HANDSHAKE_MAGIC: u32 = 0x1bc0_7c90;

/// What every rank publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Card {
    pub pid: i32,
    pub node: u32,
    pub local_rank: u32,
    pub cma: bool,
    /// Registered for expedited global memory barriers (ringers of a node
    /// whose ranks all are skip their fence: `ibcoll_shm::fences`).
    pub membarrier: bool,
    /// `host:port` of the tcp listener, empty if none.
    pub addr: String,
    pub hostname: String,
    /// Our RC QP for each peer that may use rdma: (peer rank, address).
    pub rdma: Vec<(u32, QpInfo)>,
}

impl Card {
    /// Our QP for `peer`, if we made one.
    pub fn qp_for(&self, peer: usize) -> Option<&QpInfo> {
        self.rdma
            .iter()
            .find(|(p, _)| *p as usize == peer)
            .map(|(_, q)| q)
    }
}

impl Card {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![CARD_VERSION];
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.node.to_le_bytes());
        v.extend_from_slice(&self.local_rank.to_le_bytes());
        v.push(u8::from(self.cma) | (u8::from(self.membarrier) << 1));
        for s in [&self.addr, &self.hostname] {
            v.extend_from_slice(&(s.len() as u16).to_le_bytes());
            v.extend_from_slice(s.as_bytes());
        }
        v.extend_from_slice(&(self.rdma.len() as u32).to_le_bytes());
        for (p, q) in &self.rdma {
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&q.to_bytes());
        }
        v
    }

    pub fn decode(b: &[u8]) -> Option<Card> {
        let (&ver, rest) = b.split_first()?;
        if ver != CARD_VERSION || rest.len() < 13 {
            return None;
        }
        let u32_at =
            |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
        let pid = u32_at(0) as i32;
        let node = u32_at(4);
        let local_rank = u32_at(8);
        let cma = rest[12] & 1 != 0;
        let membarrier = rest[12] & 2 != 0;
        let mut pos = 13;
        let mut strs = Vec::new();
        for _ in 0..2 {
            let l = u16::from_le_bytes([*rest.get(pos)?, *rest.get(pos + 1)?]) as usize;
            pos += 2;
            let s = std::str::from_utf8(rest.get(pos..pos + l)?)
                .ok()?
                .to_string();
            pos += l;
            strs.push(s);
        }
        let hostname = strs.pop()?;
        let addr = strs.pop()?;
        let n = u32::from_le_bytes(rest.get(pos..pos + 4)?.try_into().ok()?) as usize;
        pos += 4;
        let mut rdma = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let p = u32::from_le_bytes(rest.get(pos..pos + 4)?.try_into().ok()?);
            let q = QpInfo::from_bytes(rest.get(pos + 4..pos + 4 + QpInfo::WIRE_LEN)?).ok()?;
            pos += 4 + QpInfo::WIRE_LEN;
            rdma.push((p, q));
        }
        Some(Card {
            pid,
            node,
            local_rank,
            cma,
            membarrier,
            addr,
            hostname,
            rdma,
        })
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is passed.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
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

/// More ranks on the node than it has CPUs online. Counted against the
/// node, not this rank's affinity mask: a rank bound to one core (ibrun
/// --bind-to core) is not oversubscribed by that.
fn oversubscribed(local_size: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    cpus > 0 && local_size as i64 > cpus
}

impl Engine {
    /// Initialises the world from the environment (PMI or singleton).
    pub(crate) fn init() -> Result<Engine> {
        let cfg = Config::from_env()?;
        let mut pmi = Pmi::init().map_err(|e| Error::Pmi {
            rank: e.rank,
            op: Op::Init,
            detail: e.to_string(),
        })?;
        let rank = pmi.rank();
        let size = pmi.size();
        let pmi_err = |e: ibcoll_launcher::PmiError| Error::Pmi {
            rank,
            op: Op::Init,
            detail: e.to_string(),
        };
        let node_id = pmi.node_id();
        let local_rank = pmi.local_rank();
        let local_size = pmi.local_size().max(1);
        let num_nodes = pmi.num_nodes().max(1);
        let use_shm = cfg.transport == TransportMode::Auto && local_size > 1;
        let (cma, _) = if use_shm {
            cma_usable(&cfg)
        } else {
            (false, String::new())
        };

        // Node segment: created before the fence by local rank 0.
        let layout = NodeLayout::from_params(LayoutParams {
            local_size,
            ring_bytes: cfg.ring_bytes,
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
        })
        .map_err(|e| shm_err(rank, e))?;
        let seg_name = ibcoll_shm::segment_name(pmi.job_id(), node_id);
        let mut node = None;
        if use_shm && local_rank == 0 {
            let n = match NodeSegment::create(&seg_name, layout) {
                Err(ShmError::Exists { .. }) => {
                    // A crashed job with the same id left it behind.
                    let _ = ibcoll_shm::Segment::unlink(&seg_name);
                    NodeSegment::create(&seg_name, layout)
                }
                r => r,
            }
            .map_err(|e| shm_err(rank, e))?;
            node = Some(n);
        }

        // Tcp listener, if any peer may be on another node (or tcp is forced).
        let need_tcp = size > 1 && (cfg.transport == TransportMode::Tcp || num_nodes > 1);
        let host = hostname();
        let mut listener = None;
        let mut addr = String::new();
        if need_tcp {
            let bind = "0.0.0.0:0";
            let l = TcpListener::bind(bind)
                .map_err(|e| tcp_setup_err(rank, rank, format!("bind {bind}: {e}")))?;
            let port = l
                .local_addr()
                .map_err(|e| tcp_setup_err(rank, rank, e.to_string()))?
                .port();
            let h = cfg.tcp_host.clone().unwrap_or_else(|| host.clone());
            addr = format!("{h}:{port}");
            listener = Some(l);
        }

        // Rdma: one QP per peer that may be on another node (all peers when
        // forced, or when the placement of the others is unknown).
        let want_rdma = size > 1
            && match cfg.transport {
                TransportMode::Auto => num_nodes > 1,
                TransportMode::Rdma => true,
                TransportMode::Tcp => false,
            };
        let mut rdma = None;
        let mut rdma_note = None;
        if want_rdma {
            let peers: Vec<usize> = (0..size)
                .filter(|&r| {
                    r != rank
                        && (cfg.transport == TransportMode::Rdma || pmi.node_of(r) != Some(node_id))
                })
                .collect();
            match RdmaSetup::new(&cfg, node_id, &peers) {
                Ok(s) => rdma = Some(s),
                Err(e) if cfg.transport == TransportMode::Rdma => {
                    return Err(Error::Transport {
                        rank,
                        peer: rank,
                        op: Op::Init,
                        transport: "rdma",
                        detail: format!("IBCOLL_TRANSPORT=rdma needs a usable verbs device: {e}"),
                    })
                }
                Err(e) => rdma_note = Some(e),
            }
        }

        let membarrier = use_shm && cfg.membarrier && ibcoll_shm::fences::register();
        let card = Card {
            pid: std::process::id() as i32,
            node: node_id as u32,
            local_rank: local_rank as u32,
            cma,
            membarrier,
            addr,
            hostname: host.clone(),
            rdma: rdma.as_ref().map(|s| s.infos()).unwrap_or_default(),
        };
        if size > 1 {
            pmi.put(&format!("ibc{rank}"), &card.encode())
                .map_err(pmi_err)?;
            pmi.fence().map_err(pmi_err)?;
        }
        let mut cards = Vec::with_capacity(size);
        for r in 0..size {
            if r == rank {
                cards.push(card.clone());
                continue;
            }
            let b = pmi.get(&format!("ibc{r}")).map_err(pmi_err)?;
            let c = Card::decode(&b).ok_or_else(|| Error::Protocol {
                rank,
                peer: r,
                detail: "its bootstrap card does not parse (different ibcoll versions?)".into(),
            })?;
            cards.push(c);
        }

        if use_shm && node.is_none() {
            node = Some(NodeSegment::open(&seg_name, layout).map_err(|e| shm_err(rank, e))?);
        }
        let node = node.map(Rc::new);
        // Light ringers only when every rank of the node can take the
        // sleeper's side of the barrier; decided before any shm traffic.
        ibcoll_shm::fences::set_light_ringers(
            membarrier
                && cards
                    .iter()
                    .filter(|c| c.node as usize == node_id)
                    .all(|c| c.membarrier),
        );
        if let Some(n) = &node {
            n.publish_pid(local_rank);
            if n.all_attached() {
                let _ = n.unlink();
            }
        }

        // Channels.
        let mut chans: Vec<Option<Channel>> = (0..size).map(|_| None).collect();
        let mut shm_peers = Vec::new();
        let mut tcp_peers = Vec::new();
        let mut rdma_peers = Vec::new();
        // A pair uses rdma when both sides made a QP for each other (and it
        // is not a shm pair); every rank computes the same from the cards.
        let rdma_pair = |a: usize, b: usize| {
            cards[a].qp_for(b).is_some()
                && cards[b].qp_for(a).is_some()
                && (cfg.transport == TransportMode::Rdma || cards[a].node != cards[b].node)
        };
        let mut accept_from = Vec::new();
        for (r, c) in cards.iter().enumerate() {
            if r == rank {
                chans[r] = Some(Channel::Local(LocalChannel::new(cfg.eager_limit)));
                continue;
            }
            let same_node = c.node as usize == node_id;
            if same_node && use_shm {
                let n = node
                    .clone()
                    .ok_or_else(|| shm_err(rank, ShmError::Invalid("no node segment".into())))?;
                let peer_local = c.local_rank as usize;
                if peer_local >= local_size || peer_local == local_rank {
                    return Err(Error::Protocol {
                        rank,
                        peer: r,
                        detail: format!("local rank {peer_local} clashes with ours ({local_rank} of {local_size})"),
                    });
                }
                // SAFETY: `local_rank` is ours in this segment and this loop
                // makes exactly one channel per peer.
                let mut ch = unsafe {
                    ShmChannel::new(
                        n,
                        local_rank,
                        peer_local,
                        c.pid,
                        cma && c.cma,
                        cfg.eager_limit,
                    )
                }
                .map_err(|e| shm_err(rank, e))?;
                ch.split_min = cfg.shm_split_min;
                ch.cma_chunk = cfg.shm_cma_chunk;
                // The pipe needs both ranks running at once; CMA does not.
                let cma_min = if oversubscribed(local_size) {
                    0
                } else {
                    16 << 20
                };
                ch.cma_min = cfg.shm_cma_min.unwrap_or(cma_min);
                chans[r] = Some(Channel::Shm(ch));
                shm_peers.push(r);
            } else if rdma_pair(rank, r) && rdma.as_ref().is_some_and(|s| s.has(r)) {
                let setup = rdma.as_mut().expect("checked");
                let remote = cards[r].qp_for(rank).expect("checked");
                let pid = (c.hostname == host).then_some(c.pid);
                let pid = pid.filter(|_| cfg.rdma.pid_check);
                let ch = setup
                    .connect(r, remote, pid)
                    .map_err(|e| Error::Transport {
                        rank,
                        peer: r,
                        op: Op::Init,
                        transport: "rdma",
                        detail: e,
                    })?;
                chans[r] = Some(Channel::Rdma(Box::new(ch)));
                rdma_peers.push(r);
            } else if cfg.transport == TransportMode::Rdma {
                return Err(Error::Transport {
                    rank,
                    peer: r,
                    op: Op::Init,
                    transport: "rdma",
                    detail: "IBCOLL_TRANSPORT=rdma, but the peer published no queue pair for us (no usable verbs device there?)".into(),
                });
            } else {
                tcp_peers.push(r);
                if r > rank {
                    let sock = connect(rank, r, &c.addr, &c.hostname, &host, cfg.peer_timeout)?;
                    tune_socket(&sock, cfg.peer_timeout, cfg.tcp_buf_bytes);
                    let ch = TcpChannel::new(sock, cfg.tcp_eager_limit)
                        .map_err(|e| tcp_setup_err(rank, r, e.to_string()))?;
                    chans[r] = Some(Channel::Tcp(ch));
                } else {
                    accept_from.push(r);
                }
            }
        }
        if !accept_from.is_empty() {
            let l = listener
                .as_ref()
                .ok_or_else(|| tcp_setup_err(rank, accept_from[0], "no listener".into()))?;
            let deadline = Instant::now() + cfg.peer_timeout.max(Duration::from_secs(60));
            let mut left = accept_from.len();
            while left > 0 {
                let (sock, peer) = accept(rank, l, deadline)?;
                if peer >= size || !accept_from.contains(&peer) || chans[peer].is_some() {
                    return Err(tcp_setup_err(
                        rank,
                        peer,
                        "unexpected tcp connection".into(),
                    ));
                }
                tune_socket(&sock, cfg.peer_timeout, cfg.tcp_buf_bytes);
                let ch = TcpChannel::new(sock, cfg.tcp_eager_limit)
                    .map_err(|e| tcp_setup_err(rank, peer, e.to_string()))?;
                chans[peer] = Some(Channel::Tcp(ch));
                left -= 1;
            }
        }
        let chans: Vec<Channel> = chans
            .into_iter()
            .enumerate()
            .map(|(r, c)| c.ok_or_else(|| tcp_setup_err(rank, r, "no channel".into())))
            .collect::<Result<_>>()?;
        // Every rank sees the same cards, so all agree on this fence.
        let any_rdma = (0..size).any(|a| (a + 1..size).any(|b| rdma_pair(a, b)));
        if any_rdma {
            pmi.fence().map_err(pmi_err)?;
        }
        if rank == 0 && cfg.transport == TransportMode::Auto && num_nodes > 1 {
            let tcp_between_nodes = (0..size)
                .any(|a| (a + 1..size).any(|b| cards[a].node != cards[b].node && !rdma_pair(a, b)));
            if tcp_between_nodes {
                match &rdma_note {
                    Some(why) => eprintln!(
                        "ibcoll: no usable RDMA device ({}), using tcp between nodes",
                        why.lines().next().unwrap_or("")
                    ),
                    None => eprintln!(
                        "ibcoll: some ranks have no usable RDMA device, using tcp between their nodes"
                    ),
                }
            }
        }

        let over = oversubscribed(local_size);
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
            reported: vec![false; size],
            send_queue: (0..size).map(|_| VecDeque::new()).collect(),
            queued: 0,
            ctl_retry: VecDeque::new(),
            chans,
            shm_peers,
            tcp_peers,
            rdma_peers,
            node,
            local_rank,
            local_size,
            node_id,
            num_nodes,
            cfg,
            spins,
            yields,
            pmi: Some(pmi),
            next_ctx: 2,
            last_liveness: Instant::now(),
            any_failed: false,
            wake: None,
            fast: super::FastSeq::new(local_size),
            poisoned: None,
        })
    }
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

fn connect(
    rank: usize,
    peer: usize,
    addr: &str,
    peer_host: &str,
    my_host: &str,
    timeout: Duration,
) -> Result<TcpStream> {
    let err = |d: String| tcp_setup_err(rank, peer, d);
    // A peer on this host is reached over loopback whatever it published.
    let target = match addr.rsplit_once(':') {
        Some((_, port)) if peer_host == my_host => format!("127.0.0.1:{port}"),
        _ => addr.to_string(),
    };
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| err(format!("resolve {target}: {e}")))?
        .collect();
    let mut last = format!("no address for {target}");
    let deadline = Instant::now() + timeout;
    let mut sock = None;
    'outer: while Instant::now() < deadline {
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => {
                    sock = Some(s);
                    break 'outer;
                }
                Err(e) => last = format!("connect {a}: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut s = sock.ok_or_else(|| err(last))?;
    let mut hello = [0u8; 8];
    hello[..4].copy_from_slice(&HANDSHAKE_MAGIC.to_le_bytes());
    hello[4..].copy_from_slice(&(rank as u32).to_le_bytes());
    s.write_all(&hello)
        .map_err(|e| err(format!("handshake: {e}")))?;
    Ok(s)
}

fn accept(rank: usize, l: &TcpListener, deadline: Instant) -> Result<(TcpStream, usize)> {
    let err = |d: String| tcp_setup_err(rank, rank, d);
    l.set_nonblocking(true).map_err(|e| err(e.to_string()))?;
    loop {
        match l.accept() {
            Ok((mut s, from)) => {
                s.set_nonblocking(false).map_err(|e| err(e.to_string()))?;
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(10));
                let _ = s.set_read_timeout(Some(left));
                let mut hello = [0u8; 8];
                s.read_exact(&mut hello)
                    .map_err(|e| err(format!("handshake from {from}: {e}")))?;
                let _ = s.set_read_timeout(None);
                let magic = u32::from_le_bytes([hello[0], hello[1], hello[2], hello[3]]);
                if magic != HANDSHAKE_MAGIC {
                    return Err(err(format!("connection from {from} is not an ibcoll peer")));
                }
                let peer = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]) as usize;
                return Ok((s, peer));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(err("timed out waiting for tcp peers to connect".into()));
                }
                let mut pfd = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(l),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd, count 1.
                unsafe { libc::poll(&mut pfd, 1, 100) };
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(err(format!("accept: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_roundtrip_and_garbage() {
        let c = Card {
            pid: 1234,
            node: 2,
            local_rank: 3,
            cma: true,
            membarrier: true,
            addr: "127.0.0.1:5555".into(),
            hostname: "h".into(),
            rdma: vec![(
                7,
                QpInfo {
                    qpn: 0x12,
                    psn: 0x345,
                    gid: ibcoll_rdma::Gid([1; 16]),
                    lid: 0,
                    mtu: ibcoll_rdma::Mtu::M1024,
                },
            )],
        };
        assert_eq!(Card::decode(&c.encode()), Some(c.clone()));
        let b = c.encode();
        for i in 0..b.len() {
            let _ = Card::decode(&b[..i]);
        }
        assert_eq!(Card::decode(&[9, 9, 9]), None);
    }
}
