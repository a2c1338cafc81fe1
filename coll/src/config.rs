//! The configuration registry: every `IBCOLL_*` variable, its default and a
//! one-line doc, and the typed [`Config`] read from the environment.
//!
//! Every tunable lives in [`REGISTRY`]; `ibcoll-info` prints it. A value
//! that does not parse is an [`Error::Config`], never a silent default.

use std::time::Duration;

use crate::error::{Error, Result};

/// One registered variable.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

const fn e(name: &'static str, default: &'static str, doc: &'static str) -> Entry {
    Entry { name, default, doc }
}

/// Every variable ibcoll reads (or that ibrun sets for it).
pub const REGISTRY: &[Entry] = &[
    e("IBCOLL_TRANSPORT", "auto", "channels to use: auto (shm on a node; rdma between nodes when a usable verbs device exists, else tcp), tcp (tcp everywhere, for testing) or rdma (rdma between every pair of ranks; an error without verbs)"),
    e("IBCOLL_EAGER_LIMIT", "32768", "shm: largest message (bytes) copied through the ring; larger ones use rendezvous (single copy by CMA); measured crossover on this machine is above 32 KiB"),
    e("IBCOLL_TCP_EAGER_LIMIT", "65536", "tcp: largest message (bytes) sent eagerly; larger ones use rendezvous (streamed into the user buffer)"),
    e("IBCOLL_SHM_BOX_BYTES", "4096", "capacity of each shm fast box (power of two, at least 1024): a small ring a receiver grants one sender, for records up to half its size; larger records, and any while the box is full, go to the receiver's queue"),
    e("IBCOLL_SHM_BOXES", "32", "shm fast boxes per receiving rank: it grants them to the first senders that queued it IBCOLL_SHM_BOX_AFTER records, and polls only those (the others' records all go through its receive queue)"),
    e("IBCOLL_SHM_BOX_AFTER", "16", "records a local sender puts into a rank's receive queue before that rank grants it a fast box (while it has one left); 0 = at the first"),
    e("IBCOLL_SHM_QUEUE_BYTES", "262144", "capacity of each local rank's shm receive queue (power of two, at least 2 * (eager limit + 64)), written by every other rank of the node"),
    e("IBCOLL_SHM_PIPE_SLOTS", "4", "slots per pipelined-copy area (used when CMA is unavailable)"),
    e("IBCOLL_SHM_PIPE_CHUNK", "65536", "bytes per pipelined-copy slot (multiple of 64)"),
    e("IBCOLL_CMA", "auto", "single-copy transfers by process_vm_readv: auto (probe), on, off (always pipelined copy)"),
    e("IBCOLL_SHM_CMA_MIN", "auto", "shm with CMA: rendezvous messages from this many bytes are copied by CMA; smaller ones stream through the pair's pipelined-copy area (two memcpys, faster here than the kernel's page pinning and copy, but both ranks must progress); auto: 16777216, or 0 (always CMA) when the node is oversubscribed"),
    e("IBCOLL_SHM_SPLIT_MIN", "65536", "shm with CMA: CMA copies (rendezvous messages from IBCOLL_SHM_CMA_MIN) from this many bytes are done by both sides at once (receiver reads the first half, sender writes the second), unless the receiver has rendezvous sends of its own to that peer pending; 0 = receiver copies alone"),
    e("IBCOLL_SHM_CMA_CHUNK", "1048576", "shm with CMA: bytes per process_vm_readv/writev call (and claim granularity of a split copy); records are handled between chunks"),
    e("IBCOLL_SHM_TREE_MIN", "auto", "shared-memory barrier, bcast, reduce, allreduce, gather and scatter: from this many local ranks on, arrivals and the release go through a 4-ary tree (each rank polls at most 5 lines) instead of one rank or every rank polling every other's line; auto: 16, but never on an oversubscribed node (more local ranks than CPUs), where the tree's chain of dependent publications measured slower"),
    e("IBCOLL_SHM_COLL_BYTES", "65536", "shared-memory collective fast paths: data bytes per big publication buffer (each local rank has eight in the node segment, besides a ring of 64 lines that carries up to 48 bytes per call); a call whose per-rank data does not fit takes a message-based algorithm; 0 turns the fast paths off"),
    e("IBCOLL_MEMBARRIER", "auto", "shm doorbells: auto (when every rank of a node can register for membarrier(2) global expedited barriers, a rank going to sleep issues one and senders skip their memory fence on every message) or off (a fence on every message)"),
    e("IBCOLL_SPIN", "auto", "busy-poll iterations before yielding (auto: 20, or 0 when the node has more ranks than CPUs online)"),
    e("IBCOLL_YIELD", "auto", "sched_yield calls before blocking (auto: 2000)"),
    e("IBCOLL_BLOCK_MS", "100", "longest single block on the doorbell or in poll(2) before re-checking peers (ms)"),
    e("IBCOLL_MIXED_WAIT_US", "200", "with both shm and tcp peers: longest doorbell block before polling the sockets again (us)"),
    e("IBCOLL_PEER_TIMEOUT_MS", "10000", "bound on noticing a lost peer: tcp keepalive/user timeout (ms); local peers are checked every IBCOLL_BLOCK_MS"),
    e("IBCOLL_TCP_HOST", "auto", "one address (or a name, resolved here) peers use to reach this rank's tcp listener; auto: chosen by IBCOLL_TCP_IF or the interface rules (docs/ARCHITECTURE.md); peers on the same host and network namespace use 127.0.0.1"),
    e("IBCOLL_TCP_IF", "auto", "interfaces whose addresses this rank publishes for tcp: a comma list of names (eth0) and CIDR blocks (10.251.0.0/24), ^ excludes one (^docker0); auto: the interface that reaches the launcher (ibrun's PMI address, Slurm's launch node), else the first up non-loopback one"),
    e("IBCOLL_STATS", "0", "1: at finalize every rank prints one line (stderr): connections by transport and how they were made, PMI puts/gets/fences and bytes fetched, with rdma the queue pairs, rdma handshakes, the shared receive queue (size, fewest buffers posted, credits promised, senders queued for credits, credit requests, grants written or piggybacked) and send buffers, registered memory, shm segment bytes, peak RSS"),
    e("IBCOLL_TCP_BUF_BYTES", "4194304", "SO_SNDBUF/SO_RCVBUF for tcp channels (0 leaves the kernel default)"),
    e("IBCOLL_IB_DEVICE", "auto", "verbs device (rxe0, mlx5_0); a comma list (rxe0,rxe1) means node i uses entry i mod n; auto: first device with an active port and a usable address"),
    e("IBCOLL_IB_PORT", "auto", "verbs port (1-based); auto: the first active one"),
    e("IBCOLL_IB_GID_INDEX", "auto", "GID index (RoCE); auto: RoCE v2 IPv4-mapped first"),
    e("IBCOLL_RDMA_EAGER_LIMIT", "8192", "rdma: largest message (bytes) sent eagerly through the peer's pre-posted receive buffers; this is the rendezvous threshold (larger messages go zero-copy between the registered user buffers)"),
    e("IBCOLL_RDMA_RNDV", "auto", "rdma rendezvous: read (receiver RDMA-reads the sender's buffer, then FIN; one round trip less), write (receiver answers CTS with its buffer, sender RDMA-writes, then DONE), or auto (read up to IBCOLL_RDMA_READ_MAX, write above)"),
    e("IBCOLL_RDMA_READ_MAX", "524288", "rdma, IBCOLL_RDMA_RNDV=auto: largest message (bytes) fetched by RDMA read; larger ones are RDMA-written (many large outstanding reads collapse on Soft-RoCE: measured)"),
    e("IBCOLL_RDMA_SRQ_BUFS", "1024", "rdma: eager receive buffers (of eager limit + 72 bytes, 8.1 MiB at the defaults) of the one shared receive queue of the process, whatever the number of peers (8..=65536, at most the device's max_srq_wr); senders get credits out of them on demand (docs/ARCHITECTURE.md)"),
    e("IBCOLL_RDMA_SEND_BUFS", "256", "rdma: registered send buffers of the process (shared by every peer) for eager messages too large to inline"),
    e("IBCOLL_RDMA_TIMEOUT", "16", "rdma: RC ack timeout exponent (4.096 us * 2^n; 16 = 268 ms, so 8 tries span ~2 s: robust on loaded, emulated hosts); with the retry count it bounds how long a dead peer's QP goes unnoticed"),
    e("IBCOLL_RDMA_RETRY_CNT", "7", "rdma: RC transport retries (0-7) before a send fails with 'transport retry counter exceeded'"),
    e("IBCOLL_RDMA_RNR_RETRY", "7", "rdma: RNR retries (7 = infinite; credits keep receivers from running out of buffers)"),
    e("IBCOLL_RDMA_UD_DROP", "0", "rdma, for tests: silently drop one in N datagrams of the connection manager (UD) to exercise its resends; 0 = none"),
    e("IBCOLL_RDMA_PID_CHECK", "on", "rdma: also check the pid of peers on the same host (virtual nodes) every IBCOLL_BLOCK_MS; off leaves dead-peer detection to the verbs heartbeat"),
    e("IBCOLL_CHECK", "0", "1: before every collective the ranks of the communicator exchange its signature (collective, root, bytes per rank, reduction operation and type, call number; one small internal allgather per call; alltoallv also an alltoall of its counts) and a disagreement fails every rank with Error::Mismatch naming both ranks and both values; 0: only the checks that cost nothing measurable"),
    e("IBCOLL_HANG_TIMEOUT", "0", "seconds a blocking collective, collective wait or point-to-point wait (recv, send, probe, a request's wait) may wait before the watchdog reports which ranks it waits for and what each is doing (collective and call number, or in user code), then fails with Error::Hang; 0 = off"),
    e("IBCOLL_TEST_DIE_MID_QUEUE", "0", "test hook: this rank kills itself (SIGKILL) after reserving its N-th record in some local rank's receive queue, before publishing it (0: never)"),
    e("IBCOLL_HANG_ACTION", "error", "what the watchdog does after its report: error (the call returns Error::Hang) or abort (the job is aborted through the process manager)"),
    e("IBCOLL_TUNING_FILE", "", "collectives: JSON selection table tried before the built-in one (format in docs/COLLECTIVES.md); an unreadable or invalid file is an error at the first collective"),
    e("IBCOLL_BARRIER_ALGORITHM", "auto", "force the barrier algorithm: auto (selection table) or one of dissemination, tree, node_aware, multi_leader, mcast (released by multicast among node leaders, blocking calls; otherwise node_aware), hier (blocking calls: the node's shared-memory fast path and the leaders' call as two sub-communicators; nonblocking ones and communicators with one rank per node run node_aware), shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_BCAST_ALGORITHM", "auto", "force the bcast algorithm: auto (selection table) or one of binomial, scatter_allgather, chain, node_aware, multi_leader (small data on many nodes: a (q+1)-ary tree among nodes through q ports per node), mcast (multicast among node leaders, blocking calls; nonblocking ones and communicators that cannot join a group run node_aware), hier (blocking calls: the node's shared-memory fast path and the leaders' call as two sub-communicators; nonblocking ones and communicators with one rank per node run node_aware), shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_MCAST_DROP_RATE", "0", "multicast broadcast, tests: drop this fraction (0..1) of the multicast packets each leader receives; the protocol repairs them"),
    e("IBCOLL_MCAST_WINDOW", "64", "multicast broadcast: fragments (one path MTU each) a root holds unacknowledged; acks every window/4"),
    e("IBCOLL_MCAST_NACK_US", "200", "multicast broadcast: a leader missing fragments nacks them after this many microseconds without a new one (gaps at once)"),
    e("IBCOLL_MCAST_REPORT", "0", "1: the first leader prints one line when a communicator's multicast group is set up, and every leader its protocol counters when it leaves the group"),
    e("IBCOLL_REDUCE_ALGORITHM", "auto", "force the reduce algorithm: auto (selection table) or one of binomial, reduce_scatter_gather, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_ALLREDUCE_ALGORITHM", "auto", "force the allreduce algorithm: auto (selection table) or one of recursive_doubling, ring, rabenseifner, node_aware, multi_leader (small vectors on many nodes: a (q+1)-ary allgather of the node sums through q ports per node, each node combining them in node order; commutative operations), mcast (the result multicast among node leaders, blocking calls with a commutative operation; otherwise node_aware), hier (blocking calls with a commutative operation: the node's shared-memory fast path and the leaders' call as two sub-communicators; nonblocking ones and communicators with one rank per node run node_aware), shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_GATHER_ALGORITHM", "auto", "force the gather algorithm: auto (selection table) or one of binomial, linear, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_GATHERV_ALGORITHM", "auto", "force the gatherv algorithm: auto (selection table) or one of linear, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_SCATTER_ALGORITHM", "auto", "force the scatter algorithm: auto (selection table) or one of binomial, linear, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_SCATTERV_ALGORITHM", "auto", "force the scatterv algorithm: auto (selection table) or one of linear, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_ALLGATHER_ALGORITHM", "auto", "force the allgather algorithm: auto (selection table) or one of ring, recursive_doubling, bruck, node_aware, multi_leader (many nodes: every rank of a node a port of a (q+1)-ary Bruck exchange of node blocks), shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_ALLGATHERV_ALGORITHM", "auto", "force the allgatherv algorithm: auto (selection table) or one of ring, recursive_doubling, bruck, node_aware, multi_leader (many nodes: every rank of a node a port of a (q+1)-ary Bruck exchange of node blocks), shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_ALLTOALL_ALGORITHM", "auto", "force the alltoall algorithm: auto (selection table) or one of pairwise, bruck, linear, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_ALLTOALLV_ALGORITHM", "auto", "force the alltoallv algorithm: auto (selection table) or one of pairwise, linear, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_REDUCE_SCATTER_ALGORITHM", "auto", "force the reduce_scatter algorithm: auto (selection table) or one of ring, recursive_halving, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_REDUCE_SCATTER_BLOCK_ALGORITHM", "auto", "force the reduce_scatter_block algorithm: auto (selection table) or one of ring, recursive_halving, node_aware, shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_SCAN_ALGORITHM", "auto", "force the scan algorithm: auto (selection table) or one of recursive_doubling, chain, multi_leader (small vectors on many nodes of consecutive ranks: scan in the node, the node totals gathered through q ports per node, each node's prefix put in front; other placements run recursive_doubling), shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_EXSCAN_ALGORITHM", "auto", "force the exscan algorithm: auto (selection table) or one of recursive_doubling, chain, multi_leader (small vectors on many nodes of consecutive ranks: scan in the node, the node totals gathered through q ports per node, each node's prefix put in front; other placements run recursive_doubling), shm (shared-memory fast path: blocking calls on a communicator that is one whole node; others take the table's best schedule)"),
    e("IBCOLL_NODE_ID", "(set by ibrun)", "this rank's node (virtual nodes under ibrun --nodes)"),
    e("IBCOLL_LOCAL_RANK", "(set by ibrun)", "this rank's index on its node"),
    e("IBCOLL_LOCAL_SIZE", "(set by ibrun)", "number of ranks on this rank's node"),
    e("IBCOLL_NUM_NODES", "(set by ibrun)", "number of nodes in the job"),
    e("IBCOLL_JOB_ID", "(set by ibrun)", "job name, unique on the machine while the job runs (names shm segments)"),
    e("IBCOLL_STDERR_TTY", "(set by ibrun)", "1 when ibrun's standard error is a terminal (a rank's is a pipe to ibrun): ibcoll-bench tune then shows its progress line"),
    e("IBCOLL_PMI_NOTIFY", "(set by ibrun)", "ibrun's kvsname: the PMI client subscribes to notifications of lost ranks (so survivors fail at once); 0 turns the subscription off (also under the srun --mpi=none store)"),
    e("IBCOLL_BOOTSTRAP", "auto", "auto: PMI_FD, PMI_PORT, a Slurm step (srun --mpi=none) or a singleton; singleton: ignore Slurm's variables"),
    e("IBCOLL_SLURM_PORT_BASE", "41000", "srun --mpi=none: first port of the range rank 0's key-value store is derived from (job and step ids, 8 fallbacks)"),
    e("IBCOLL_BOOTSTRAP_TIMEOUT", "60", "srun --mpi=none: seconds the other tasks keep trying to reach rank 0's key-value store"),
];

/// Which channels the engine may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportMode {
    /// shm on a node, tcp between nodes.
    Auto,
    /// tcp between every pair of distinct ranks.
    Tcp,
    /// rdma between every pair of distinct ranks (verbs required).
    Rdma,
}

/// Rendezvous protocol over rdma.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RndvMode {
    /// The receiver reads the sender's buffer (RTS, READ, FIN).
    Read,
    /// The sender writes the receiver's buffer (RTS, CTS, WRITE, FIN).
    Write,
    /// Read up to `read_max` bytes, write above.
    Auto,
}

/// The rdma channel's settings (`IBCOLL_RDMA_*`).
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    pub eager_limit: usize,
    pub rndv: RndvMode,
    pub read_max: usize,
    /// Receive buffers of the shared receive queue (per process).
    pub srq_bufs: usize,
    /// Registered send buffers (per process).
    pub send_bufs: usize,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub pid_check: bool,
    /// Test hook: drop one in this many UD datagrams (0: none).
    pub ud_drop: u32,
}

/// Whether to use process_vm_readv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmaMode {
    Auto,
    On,
    Off,
}

/// The typed configuration of one process.
#[derive(Debug, Clone)]
pub struct Config {
    pub transport: TransportMode,
    pub eager_limit: usize,
    pub tcp_eager_limit: usize,
    pub ring_bytes: usize,
    /// Fast boxes per receiving rank (`IBCOLL_SHM_BOXES`).
    pub shm_boxes: usize,
    /// Queued records before a sender is granted a box.
    pub shm_box_after: u32,
    pub queue_bytes: usize,
    pub pipe_slots: usize,
    pub pipe_chunk: usize,
    pub cma: CmaMode,
    /// `None` = auto (`IBCOLL_SHM_CMA_MIN`).
    pub shm_cma_min: Option<usize>,
    pub shm_split_min: usize,
    pub shm_cma_chunk: usize,
    /// Data bytes per collective publication buffer (0: no fast paths).
    pub shm_coll_bytes: usize,
    /// Members from which the fast barrier uses a tree.
    pub shm_tree_min: usize,
    /// Try membarrier-based light ringers (`IBCOLL_MEMBARRIER`).
    pub membarrier: bool,
    /// `None` = auto.
    pub spins: Option<u32>,
    pub yields: Option<u32>,
    pub block: Duration,
    pub mixed_wait: Duration,
    pub peer_timeout: Duration,
    pub tcp_host: Option<String>,
    pub tcp_if: Option<String>,
    pub tcp_buf_bytes: usize,
    /// Print the `IBCOLL_STATS` line at finalize.
    pub stats: bool,
    /// Exchange every collective's signature first (`IBCOLL_CHECK`).
    pub check: bool,
    /// Watchdog bound on one blocking wait (`IBCOLL_HANG_TIMEOUT`).
    pub hang_timeout: Option<Duration>,
    /// Abort the job instead of returning `Error::Hang`.
    pub hang_abort: bool,
    /// Test hook (`IBCOLL_TEST_DIE_MID_QUEUE`).
    pub test_die_mid_queue: u64,
    pub rdma: RdmaConfig,
}

/// Looks up a variable's raw value (environment, else registered default).
pub fn raw(name: &str) -> String {
    if let Ok(v) = std::env::var(name) {
        return v;
    }
    REGISTRY
        .iter()
        .find(|e| e.name == name)
        .map(|e| e.default.to_string())
        .unwrap_or_default()
}

fn bad(var: &'static str, value: &str, detail: impl Into<String>) -> Error {
    Error::Config {
        var,
        value: value.to_string(),
        detail: detail.into(),
    }
}

fn num(var: &'static str) -> Result<u64> {
    let v = raw(var);
    parse_size(&v).ok_or_else(|| {
        bad(
            var,
            &v,
            "expected a non-negative integer (suffixes k, m, g allowed)",
        )
    })
}

fn opt_num(var: &'static str) -> Result<Option<u32>> {
    let v = raw(var);
    if v.trim().eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    let n =
        parse_size(&v).ok_or_else(|| bad(var, &v, "expected auto or a non-negative integer"))?;
    u32::try_from(n)
        .map(Some)
        .map_err(|_| bad(var, &v, "too large"))
}

/// Parses `123`, `4k`, `1m`, `2g` (binary multiples).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(mult)
}

impl Config {
    /// Reads every variable; fails on the first value that does not parse
    /// or that contradicts another.
    pub fn from_env() -> Result<Config> {
        let t = raw("IBCOLL_TRANSPORT");
        let transport = match t.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => TransportMode::Auto,
            "tcp" => TransportMode::Tcp,
            "rdma" => TransportMode::Rdma,
            _ => return Err(bad("IBCOLL_TRANSPORT", &t, "expected auto, tcp or rdma")),
        };
        let c = raw("IBCOLL_CMA");
        let cma = match c.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => CmaMode::Auto,
            "on" | "1" | "yes" => CmaMode::On,
            "off" | "0" | "no" => CmaMode::Off,
            _ => return Err(bad("IBCOLL_CMA", &c, "expected auto, on or off")),
        };
        let to_usize = |var: &'static str, max: u64| -> Result<usize> {
            let n = num(var)?;
            if n > max {
                return Err(bad(var, &raw(var), format!("must be at most {max}")));
            }
            Ok(n as usize)
        };
        let eager_limit = to_usize("IBCOLL_EAGER_LIMIT", 1 << 30)?;
        let tcp_eager_limit = to_usize("IBCOLL_TCP_EAGER_LIMIT", 1 << 30)?;
        let ring_bytes = to_usize("IBCOLL_SHM_BOX_BYTES", 1 << 31)?;
        if ibcoll_shm::ring::check_capacity(ring_bytes).is_err() {
            return Err(bad(
                "IBCOLL_SHM_BOX_BYTES",
                &raw("IBCOLL_SHM_BOX_BYTES"),
                "must be a power of two between 1024 and 2^31",
            ));
        }
        let shm_boxes = to_usize("IBCOLL_SHM_BOXES", 1 << 20)?;
        let shm_box_after = to_usize("IBCOLL_SHM_BOX_AFTER", u32::MAX as u64)? as u32;
        let queue_bytes = to_usize("IBCOLL_SHM_QUEUE_BYTES", 1 << 31)?;
        if ibcoll_shm::queue::check_capacity(queue_bytes).is_err() {
            return Err(bad(
                "IBCOLL_SHM_QUEUE_BYTES",
                &raw("IBCOLL_SHM_QUEUE_BYTES"),
                "must be a power of two between 4096 and 2^31",
            ));
        }
        let max_rec = ibcoll_shm::queue::max_record_for(queue_bytes);
        if eager_limit + crate::transport::header::HEADER_LEN > max_rec {
            return Err(bad(
                "IBCOLL_EAGER_LIMIT",
                &raw("IBCOLL_EAGER_LIMIT"),
                format!(
                    "an eager message plus its header must fit in one queue record ({max_rec} bytes with IBCOLL_SHM_QUEUE_BYTES={queue_bytes})"
                ),
            ));
        }
        let pipe_slots = to_usize("IBCOLL_SHM_PIPE_SLOTS", 1024)?;
        let pipe_chunk = to_usize("IBCOLL_SHM_PIPE_CHUNK", u32::MAX as u64)?;
        if pipe_slots == 0 || pipe_chunk == 0 || pipe_chunk % 64 != 0 {
            return Err(bad(
                "IBCOLL_SHM_PIPE_CHUNK",
                &raw("IBCOLL_SHM_PIPE_CHUNK"),
                "pipe slots must be >= 1 and the chunk a positive multiple of 64",
            ));
        }
        let ms = |var: &'static str| -> Result<Duration> {
            let n = num(var)?;
            if n == 0 {
                return Err(bad(var, &raw(var), "must be positive"));
            }
            Ok(Duration::from_millis(n))
        };
        let block = ms("IBCOLL_BLOCK_MS")?;
        let peer_timeout = ms("IBCOLL_PEER_TIMEOUT_MS")?;
        let mixed = num("IBCOLL_MIXED_WAIT_US")?.max(1);
        let host = raw("IBCOLL_TCP_HOST");
        let tcp_host = match host.trim() {
            "" | "auto" => None,
            h => Some(h.to_string()),
        };
        let ifs = raw("IBCOLL_TCP_IF");
        let tcp_if = match ifs.trim() {
            "" | "auto" => None,
            l => Some(l.to_string()),
        };
        let st = raw("IBCOLL_STATS");
        let stats = match st.trim() {
            "" | "0" | "off" | "no" => false,
            "1" | "on" | "yes" => true,
            _ => return Err(bad("IBCOLL_STATS", &st, "expected 0 or 1")),
        };
        let ck = raw("IBCOLL_CHECK");
        let check = match ck.trim() {
            "" | "0" | "off" | "no" => false,
            "1" | "on" | "yes" => true,
            _ => return Err(bad("IBCOLL_CHECK", &ck, "expected 0 or 1")),
        };
        let ht = raw("IBCOLL_HANG_TIMEOUT");
        let hang_timeout = match ht.trim().parse::<f64>() {
            Ok(0.0) => None,
            Ok(x) if x > 0.0 && x < 1e9 => Some(Duration::from_secs_f64(x)),
            _ => {
                return Err(bad(
                    "IBCOLL_HANG_TIMEOUT",
                    &ht,
                    "expected seconds (a non-negative number; 0 = off)",
                ))
            }
        };
        let ha = raw("IBCOLL_HANG_ACTION");
        let hang_abort = match ha.trim() {
            "" | "error" => false,
            "abort" => true,
            _ => return Err(bad("IBCOLL_HANG_ACTION", &ha, "expected error or abort")),
        };
        Ok(Config {
            transport,
            eager_limit,
            tcp_eager_limit,
            ring_bytes,
            shm_boxes,
            shm_box_after,
            queue_bytes,
            pipe_slots,
            pipe_chunk,
            cma,
            shm_cma_min: match raw("IBCOLL_SHM_CMA_MIN").trim() {
                "auto" | "" => None,
                _ => Some(to_usize("IBCOLL_SHM_CMA_MIN", u64::MAX)?),
            },
            shm_split_min: to_usize("IBCOLL_SHM_SPLIT_MIN", u64::MAX)?,
            shm_cma_chunk: to_usize("IBCOLL_SHM_CMA_CHUNK", 1 << 30)?.max(4096),
            shm_coll_bytes: to_usize("IBCOLL_SHM_COLL_BYTES", 1 << 28)?,
            // 0: auto, resolved at init (it depends on the node).
            shm_tree_min: match raw("IBCOLL_SHM_TREE_MIN").trim() {
                "auto" | "" => 0,
                _ => to_usize("IBCOLL_SHM_TREE_MIN", u32::MAX as u64)?.max(2),
            },
            membarrier: match raw("IBCOLL_MEMBARRIER").as_str() {
                "" | "auto" | "on" => true,
                "off" => false,
                v => return Err(bad("IBCOLL_MEMBARRIER", v, "must be auto or off")),
            },
            spins: opt_num("IBCOLL_SPIN")?,
            yields: opt_num("IBCOLL_YIELD")?,
            block,
            mixed_wait: Duration::from_micros(mixed),
            peer_timeout,
            tcp_host,
            tcp_if,
            tcp_buf_bytes: to_usize("IBCOLL_TCP_BUF_BYTES", 1 << 30)?,
            stats,
            check,
            hang_timeout,
            hang_abort,
            test_die_mid_queue: to_usize("IBCOLL_TEST_DIE_MID_QUEUE", u64::MAX)? as u64,
            rdma: RdmaConfig::from_env()?,
        })
    }
}

impl RdmaConfig {
    fn from_env() -> Result<RdmaConfig> {
        let small = |var: &'static str, min: u64, max: u64| -> Result<u64> {
            let n = num(var)?;
            if n < min || n > max {
                return Err(bad(var, &raw(var), format!("must be in {min}..={max}")));
            }
            Ok(n)
        };
        let eager_limit = small("IBCOLL_RDMA_EAGER_LIMIT", 0, 1 << 20)? as usize;
        let r = raw("IBCOLL_RDMA_RNDV");
        let rndv = match r.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => RndvMode::Auto,
            "read" => RndvMode::Read,
            "write" => RndvMode::Write,
            _ => return Err(bad("IBCOLL_RDMA_RNDV", &r, "expected auto, read or write")),
        };
        let p = raw("IBCOLL_RDMA_PID_CHECK");
        let pid_check = match p.trim().to_ascii_lowercase().as_str() {
            "on" | "1" | "yes" | "" => true,
            "off" | "0" | "no" => false,
            _ => return Err(bad("IBCOLL_RDMA_PID_CHECK", &p, "expected on or off")),
        };
        Ok(RdmaConfig {
            eager_limit,
            rndv,
            read_max: num("IBCOLL_RDMA_READ_MAX")? as usize,
            srq_bufs: small("IBCOLL_RDMA_SRQ_BUFS", 8, 65536)? as usize,
            send_bufs: small("IBCOLL_RDMA_SEND_BUFS", 2, 65536)? as usize,
            timeout: small("IBCOLL_RDMA_TIMEOUT", 1, 31)? as u8,
            retry_cnt: small("IBCOLL_RDMA_RETRY_CNT", 0, 7)? as u8,
            rnr_retry: small("IBCOLL_RDMA_RNR_RETRY", 0, 7)? as u8,
            pid_check,
            ud_drop: small("IBCOLL_RDMA_UD_DROP", 0, 1 << 20)? as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("17"), Some(17));
        assert_eq!(parse_size(" 4k"), Some(4096));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("k"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999999999g"), None);
    }

    #[test]
    fn registry_names_are_unique_and_prefixed() {
        let mut names: Vec<_> = REGISTRY.iter().map(|e| e.name).collect();
        assert!(names.iter().all(|n| n.starts_with("IBCOLL_")));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len());
    }

    #[test]
    fn defaults_are_consistent() {
        // The test environment may set variables; only check the defaults
        // when none of ours is set.
        if std::env::vars().any(|(k, _)| k.starts_with("IBCOLL_")) {
            return;
        }
        let c = Config::from_env().unwrap();
        assert_eq!(c.transport, TransportMode::Auto);
        assert!(c.peer_timeout <= Duration::from_secs(10));
    }
}
