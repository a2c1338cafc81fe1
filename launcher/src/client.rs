//! The PMI-1 client every rank uses to bootstrap.
//!
//! It connects the way MPICH's simple PMI does — an inherited socket in
//! `PMI_FD` (ibrun, hydra, `srun --mpi=pmi2`), a TCP address in `PMI_PORT`
//! with `PMI_ID` (remote ranks of ibrun), or nothing (a singleton of size 1) —
//! and adds what ibcoll needs on top: binary values of any length, the
//! placement of every rank on nodes, counters of its PMI traffic
//! ([`Pmi::stats`]), and news of lost ranks where the server offers it
//! ([`Pmi::event_fd`], [`Pmi::take_failures`]).
//!
//! Lost ranks: ibrun and the `srun --mpi=none` store tell a client that sent
//! `cmd=ibcoll_notify` of every rank that ends without finalizing, with
//! unsolicited `cmd=ibcoll_failed` lines. Other PMI servers (Slurm's pmi2,
//! hydra) know no such command, so the client sends it only to a server that
//! said it understands: ibrun names its kvsname in `IBCOLL_PMI_NOTIFY`; the
//! store is ibcoll's own. Such lines may arrive at any time, also in the
//! middle of a reply's wait; they are set aside, never taken for a reply.

use std::collections::{HashMap, VecDeque};
use std::env;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::Duration;

use crate::codec;
use crate::mapping::{self, NodeMap};
use crate::server::{escape_message, unescape_message, FAILED_CMD, NOTIFY_CMD};
use crate::slurm::SlurmStep;
use crate::wire::{self, Command, LineBuffer};

/// The longest request line PMI-1 servers accept.
const PMI_LINE_MAX: usize = 1024;

/// How the client reached its process manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitMode {
    /// An inherited socket named by `PMI_FD`.
    Fd,
    /// A TCP connection to `PMI_PORT`, identified by `PMI_ID`.
    Port,
    /// Started by `srun --mpi=none`: rank 0 serves the key-value space.
    Slurm,
    /// No process manager: rank 0 of 1.
    Singleton,
}

/// A PMI failure, naming the rank and the operation.
#[derive(Debug, thiserror::Error)]
#[error("PMI {op} failed on rank {rank}: {detail}")]
pub struct PmiError {
    pub rank: usize,
    pub op: &'static str,
    pub detail: String,
}

/// What this rank asked of the process manager, for `IBCOLL_STATS`. Each
/// counts requests sent to it (a singleton sends none): a value that
/// [`Pmi::put`] splits into k chunks counts k + 1 puts, and reading it back
/// k + 1 gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmiStats {
    pub puts: u64,
    pub gets: u64,
    pub fences: u64,
    /// Bytes of the values received (as they travel: encoded text).
    pub bytes_fetched: u64,
}

/// Where this rank sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node_id: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub num_nodes: usize,
    /// The node of every rank, when the process manager told us.
    pub map: Option<NodeMap>,
}

enum Stream {
    Fd(File),
    Tcp(TcpStream),
}

impl Stream {
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Fd(f) => f.write_all(b),
            Stream::Tcp(t) => t.write_all(b),
        }
    }
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Fd(f) => f.read(b),
            Stream::Tcp(t) => t.read(b),
        }
    }
    fn raw(&self) -> RawFd {
        match self {
            Stream::Fd(f) => f.as_raw_fd(),
            Stream::Tcp(t) => t.as_raw_fd(),
        }
    }
}

struct Conn {
    stream: Stream,
    lines: LineBuffer,
}

/// A connected (or singleton) PMI client.
pub struct Pmi {
    conn: Option<Conn>,
    mode: InitMode,
    rank: usize,
    size: usize,
    kvsname: String,
    keylen_max: usize,
    vallen_max: usize,
    universe_size: usize,
    appnum: i64,
    job_id: String,
    placement: Placement,
    /// Singleton key-value space (and nothing else).
    local_kvs: HashMap<String, String>,
    finalized: bool,
    /// Rank 0's key-value server under `srun --mpi=none`.
    kvs_thread: Option<std::thread::JoinHandle<()>>,
    /// The server agreed to tell us of lost ranks.
    notify: bool,
    /// Lost ranks told of and not yet taken.
    failures: Vec<(usize, String)>,
    /// Lines read past a reply that are not notifications (a confused
    /// server's); the next call reads them first, as it would have.
    early: VecDeque<Command>,
    /// The process manager closed the connection.
    closed: bool,
    stats: PmiStats,
}

fn env_usize(name: &str) -> Option<usize> {
    env::var(name).ok()?.trim().parse().ok()
}

impl Pmi {
    /// Connects according to the environment; see the module docs.
    pub fn init() -> Result<Pmi, PmiError> {
        let fail = |op, detail: String| PmiError {
            rank: env_usize("PMI_RANK").unwrap_or(0),
            op,
            detail,
        };
        let mut slurm = None;
        let (stream, mode) = if let Ok(fd) = env::var("PMI_FD") {
            let fd: RawFd = fd
                .trim()
                .parse()
                .map_err(|_| fail("init", format!("PMI_FD={fd:?} is not a descriptor")))?;
            // Refuse descriptors that are not open sockets rather than adopt
            // some unrelated file as our PMI channel.
            match nix::sys::stat::fstat(fd) {
                Ok(st) if (st.st_mode & libc::S_IFMT) == libc::S_IFSOCK => {}
                _ => return Err(fail("init", format!("PMI_FD={fd} is not an open socket"))),
            }
            // SAFETY: the descriptor was handed to this process by its launcher
            // for PMI alone and was just checked to be an open socket; nothing
            // else in the process owns it, so the File may close it on drop.
            let file = unsafe { File::from_raw_fd(fd) };
            (Some(Stream::Fd(file)), InitMode::Fd)
        } else if let Ok(port) = env::var("PMI_PORT") {
            let stream = connect_with_retry(&port)
                .map_err(|e| fail("init", format!("cannot connect to PMI_PORT={port}: {e}")))?;
            (Some(Stream::Tcp(stream)), InitMode::Port)
        } else if let Some(step) = SlurmStep::from_env().filter(|_| !forced_singleton()) {
            let step = step.map_err(|e| fail("init", format!("in a Slurm step, but {e}")))?;
            let (stream, thread) = slurm_connect(&step).map_err(|e| fail("init", e))?;
            slurm = Some((step, thread));
            (Some(Stream::Tcp(stream)), InitMode::Slurm)
        } else {
            (None, InitMode::Singleton)
        };

        let mut pmi = Pmi {
            conn: stream.map(|stream| Conn {
                stream,
                lines: LineBuffer::new(),
            }),
            mode,
            rank: 0,
            size: 1,
            kvsname: "singleton_kvs".into(),
            keylen_max: 64,
            vallen_max: 1024,
            universe_size: 1,
            appnum: 0,
            job_id: String::new(),
            placement: Placement {
                node_id: 0,
                local_rank: 0,
                local_size: 1,
                num_nodes: 1,
                map: Some(NodeMap::single_node(1)),
            },
            local_kvs: HashMap::new(),
            finalized: false,
            kvs_thread: None,
            notify: false,
            failures: Vec::new(),
            early: VecDeque::new(),
            closed: false,
            stats: PmiStats::default(),
        };
        match mode {
            InitMode::Singleton => {
                pmi.job_id = format!("single{}", std::process::id());
                return Ok(pmi);
            }
            InitMode::Fd => {
                pmi.rank = env_usize("PMI_RANK").unwrap_or(0);
                pmi.size = env_usize("PMI_SIZE").unwrap_or(1);
            }
            InitMode::Port => {
                let id = env_usize("PMI_ID")
                    .ok_or_else(|| fail("init", "PMI_PORT is set but PMI_ID is not".into()))?;
                pmi.rank = id;
                pmi.handshake_port(id)?;
            }
            InitMode::Slurm => {
                if let Some((step, thread)) = slurm {
                    pmi.rank = step.rank;
                    pmi.size = step.size;
                    pmi.kvs_thread = thread;
                }
            }
        }
        if pmi.size == 0 || pmi.rank >= pmi.size {
            return Err(pmi.err(
                "init",
                format!("rank {} is not below size {}", pmi.rank, pmi.size),
            ));
        }
        let r = pmi.call(
            "init",
            Command::new("init")
                .arg("pmi_version", 1)
                .arg("pmi_subversion", 1),
            "response_to_init",
        )?;
        pmi.check_rc("init", &r)?;
        let r = pmi.call("get_maxes", Command::new("get_maxes"), "maxes")?;
        pmi.keylen_max = r
            .require_int("keylen_max")
            .map_err(|e| pmi.err("get_maxes", e.to_string()))? as usize;
        pmi.vallen_max = r
            .require_int("vallen_max")
            .map_err(|e| pmi.err("get_maxes", e.to_string()))? as usize;
        if pmi.keylen_max < 16 || pmi.vallen_max < 16 {
            return Err(pmi.err(
                "get_maxes",
                format!(
                    "limits too small (keylen_max {}, vallen_max {})",
                    pmi.keylen_max, pmi.vallen_max
                ),
            ));
        }
        let r = pmi.call(
            "get_my_kvsname",
            Command::new("get_my_kvsname"),
            "my_kvsname",
        )?;
        pmi.kvsname = r
            .require("kvsname")
            .map_err(|e| pmi.err("get_my_kvsname", e.to_string()))?
            .to_string();
        let r = pmi.call(
            "get_universe_size",
            Command::new("get_universe_size"),
            "universe_size",
        )?;
        pmi.universe_size = r.require_int("size").unwrap_or(pmi.size as i64).max(0) as usize;
        let r = pmi.call("get_appnum", Command::new("get_appnum"), "appnum")?;
        pmi.appnum = r.require_int("appnum").unwrap_or(0);
        if pmi.server_can_notify() {
            let r = pmi.call(NOTIFY_CMD, Command::new(NOTIFY_CMD), "ibcoll_notify_result")?;
            pmi.notify = pmi.check_rc(NOTIFY_CMD, &r).is_ok();
        }
        pmi.job_id = env::var("IBCOLL_JOB_ID").unwrap_or_else(|_| pmi.kvsname.clone());
        pmi.placement = pmi.resolve_placement()?;
        Ok(pmi)
    }

    /// Whether the server is one that understands `ibcoll_notify` (see the
    /// module docs); `IBCOLL_PMI_NOTIFY=0` turns the subscription off.
    fn server_can_notify(&self) -> bool {
        let var = env::var("IBCOLL_PMI_NOTIFY").ok();
        match self.mode {
            InitMode::Slurm => var.as_deref() != Some("0"),
            InitMode::Fd | InitMode::Port => var.as_deref() == Some(self.kvsname.as_str()),
            InitMode::Singleton => false,
        }
    }

    fn handshake_port(&mut self, id: usize) -> Result<(), PmiError> {
        self.send("initack", &Command::new("initack").arg("pmiid", id))?;
        let r = self.recv("initack")?;
        if r.name != "initack" {
            return Err(self.err("initack", format!("unexpected reply {:?}", r.to_line())));
        }
        self.check_rc("initack", &r)?;
        for _ in 0..3 {
            let s = self.recv("initack")?;
            if s.name != "set" {
                return Err(self.err(
                    "initack",
                    format!("expected cmd=set, got {:?}", s.to_line()),
                ));
            }
            if let Some(v) = s.get("size") {
                self.size = v
                    .parse()
                    .map_err(|_| self.err("initack", format!("bad size {v:?}")))?;
            }
            if let Some(v) = s.get("rank") {
                self.rank = v
                    .parse()
                    .map_err(|_| self.err("initack", format!("bad rank {v:?}")))?;
            }
        }
        Ok(())
    }

    fn resolve_placement(&mut self) -> Result<Placement, PmiError> {
        let size = self.size;
        let mut map = match self.get_raw("PMI_process_mapping")? {
            Some(text) => {
                let blocks = mapping::parse_process_mapping(&text)
                    .map_err(|e| self.err("init", e.to_string()))?;
                Some(
                    NodeMap::from_blocks(&blocks, size)
                        .map_err(|e| self.err("init", e.to_string()))?,
                )
            }
            None => None,
        };
        if map.is_none() {
            let tpn = env::var("SLURM_STEP_TASKS_PER_NODE")
                .or_else(|_| env::var("SLURM_TASKS_PER_NODE"))
                .ok();
            if let Some(t) = tpn {
                if let Ok(counts) = mapping::parse_tasks_per_node(&t) {
                    if counts.iter().sum::<usize>() == size {
                        map = Some(NodeMap::from_counts(&counts));
                    }
                }
            }
        }
        // ibrun states this rank's own position outright; it wins over what
        // we derive, and must agree with the map it also publishes.
        let from_env = (
            env_usize("IBCOLL_NODE_ID"),
            env_usize("IBCOLL_LOCAL_RANK"),
            env_usize("IBCOLL_LOCAL_SIZE"),
            env_usize("IBCOLL_NUM_NODES"),
        );
        if let (Some(node_id), Some(local_rank), Some(local_size), Some(num_nodes)) = from_env {
            return Ok(Placement {
                node_id,
                local_rank,
                local_size,
                num_nodes,
                map,
            });
        }
        if let Some(m) = &map {
            let node_id = m.node_of(self.rank).unwrap_or(0);
            let (local_rank, local_size) = m.local_position(self.rank).unwrap_or((0, 1));
            return Ok(Placement {
                node_id,
                local_rank,
                local_size,
                num_nodes: m.num_nodes(),
                map,
            });
        }
        if let (Some(node_id), Some(local_rank)) =
            (env_usize("SLURM_NODEID"), env_usize("SLURM_LOCALID"))
        {
            return Ok(Placement {
                node_id,
                local_rank,
                local_size: local_rank + 1,
                num_nodes: env_usize("SLURM_NNODES").unwrap_or(node_id + 1),
                map: None,
            });
        }
        Ok(Placement {
            node_id: 0,
            local_rank: self.rank,
            local_size: size,
            num_nodes: 1,
            map: Some(NodeMap::single_node(size)),
        })
    }

    fn err(&self, op: &'static str, detail: impl Into<String>) -> PmiError {
        PmiError {
            rank: self.rank,
            op,
            detail: detail.into(),
        }
    }

    fn send(&mut self, op: &'static str, cmd: &Command) -> Result<(), PmiError> {
        let rank = self.rank;
        let conn = self.conn.as_mut().ok_or(PmiError {
            rank,
            op,
            detail: "no process manager (singleton)".into(),
        })?;
        conn.stream
            .write_all(cmd.to_line().as_bytes())
            .map_err(|e| PmiError {
                rank,
                op,
                detail: format!("write to the process manager failed: {e}"),
            })
    }

    /// The next line that is not a notification; notifications read on the
    /// way, and any complete after it, are set aside for
    /// [`Pmi::take_failures`].
    fn recv(&mut self, op: &'static str) -> Result<Command, PmiError> {
        let rank = self.rank;
        let mk = |detail: String| PmiError { rank, op, detail };
        if let Some(c) = self.early.pop_front() {
            return Ok(c);
        }
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| mk("no process manager (singleton)".into()))?;
        let mut buf = [0u8; 4096];
        let reply = loop {
            if let Some(line) = conn.lines.next_line().map_err(|e| mk(e.to_string()))? {
                let c = wire::parse_line(&line).map_err(|e| mk(format!("bad reply: {e}")))?;
                if c.name == FAILED_CMD {
                    self.failures.extend(parse_failure(&c));
                    continue;
                }
                break c;
            }
            match conn.stream.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    return Err(mk("the process manager closed the connection".into()));
                }
                Ok(n) => conn.lines.extend(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(mk(format!("read from the process manager failed: {e}"))),
            }
        };
        // Lines already read no longer make the descriptor readable: sort
        // them now so that no notification waits unseen in the buffer.
        self.sort_buffered_lines();
        Ok(reply)
    }

    fn sort_buffered_lines(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        while let Ok(Some(line)) = conn.lines.next_line() {
            match wire::parse_line(&line) {
                Ok(c) if c.name == FAILED_CMD => self.failures.extend(parse_failure(&c)),
                Ok(c) => self.early.push_back(c),
                Err(_) => {}
            }
        }
    }

    /// The descriptor to watch for news of lost ranks: when it is readable,
    /// call [`Pmi::take_failures`] (and call it before each wait too: news
    /// that arrived during another PMI call was read then and no longer
    /// makes the descriptor readable). `None` where the process manager
    /// cannot tell (Slurm's pmi2, hydra, a singleton) or has closed the
    /// connection (check again after `take_failures`; stop watching then).
    pub fn event_fd(&self) -> Option<RawFd> {
        if !self.notify || self.closed {
            return None;
        }
        self.conn.as_ref().map(|c| c.stream.raw())
    }

    /// Ranks the process manager reported lost since the last call, with how
    /// each ended (e.g. "was killed by signal 9 (SIGKILL)"); each rank is
    /// reported once. Never blocks and never takes a reply meant for a later
    /// call. Notifications that arrived during another call were set aside
    /// then and no longer make [`Pmi::event_fd`] readable: call this before
    /// waiting on it. A fence that fails because a rank was lost has always
    /// set that rank aside here. Under `srun --mpi=none` the end of rank 0's
    /// store is reported as the loss of rank 0. Empty where the process
    /// manager cannot tell.
    pub fn take_failures(&mut self) -> Vec<(usize, String)> {
        if self.notify && !self.closed {
            self.read_notifications();
        }
        std::mem::take(&mut self.failures)
    }

    fn read_notifications(&mut self) {
        use nix::sys::socket::{recv, MsgFlags};
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let fd = conn.stream.raw();
        let mut buf = [0u8; 4096];
        loop {
            match recv(fd, &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => {
                    self.closed = true;
                    if self.mode == InitMode::Slurm && self.rank != 0 {
                        self.failures
                            .push((0, "ended: its key-value store closed the connection".into()));
                    }
                    break;
                }
                Ok(n) => conn.lines.extend(&buf[..n]),
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
        }
        self.sort_buffered_lines();
    }

    /// Counts of this rank's requests so far.
    pub fn stats(&self) -> PmiStats {
        self.stats
    }

    fn call(&mut self, op: &'static str, cmd: Command, expect: &str) -> Result<Command, PmiError> {
        self.send(op, &cmd)?;
        let r = self.recv(op)?;
        if r.name != expect {
            let detail = format!("expected cmd={expect}, got {:?}", r.to_line().trim_end());
            return Err(self.err(op, detail));
        }
        Ok(r)
    }

    fn check_rc(&self, op: &'static str, r: &Command) -> Result<(), PmiError> {
        match r.get("rc").map(str::trim) {
            None | Some("0") => Ok(()),
            Some(rc) => Err(self.err(
                op,
                format!("rc={rc} msg={}", r.get("msg").unwrap_or("(none)")),
            )),
        }
    }

    /// Stores a wire-safe value as it is (for keys other programs read, such
    /// as MPICH's). Most callers want [`Pmi::put`].
    pub fn put_raw(&mut self, key: &str, value: &str) -> Result<(), PmiError> {
        if !wire::is_wire_safe(key) || key.len() > self.keylen_max {
            return Err(self.err(
                "put",
                format!(
                    "key {key:?} is empty, too long (max {}) or has separators",
                    self.keylen_max
                ),
            ));
        }
        if (!value.is_empty() && !wire::is_wire_safe(value)) || value.len() > self.vallen_max {
            return Err(self.err(
                "put",
                format!(
                    "value for {key:?} has separators or exceeds {} bytes",
                    self.vallen_max
                ),
            ));
        }
        if self.conn.is_none() {
            self.local_kvs.insert(key.to_string(), value.to_string());
            return Ok(());
        }
        let cmd = Command::new("put")
            .arg("kvsname", &self.kvsname)
            .arg("key", key)
            .arg("value", value);
        self.stats.puts += 1;
        let r = self.call("put", cmd, "put_result")?;
        self.check_rc("put", &r)
    }

    /// Fetches a raw value; `None` when the key does not exist.
    pub fn get_raw(&mut self, key: &str) -> Result<Option<String>, PmiError> {
        if !wire::is_wire_safe(key) {
            return Err(self.err("get", format!("key {key:?} is empty or has separators")));
        }
        if self.conn.is_none() {
            return Ok(self.local_kvs.get(key).cloned());
        }
        let cmd = Command::new("get")
            .arg("kvsname", &self.kvsname)
            .arg("key", key);
        self.stats.gets += 1;
        let r = self.call("get", cmd, "get_result")?;
        match r.get("rc").map(str::trim) {
            None | Some("0") => {
                let v = r.get("value").unwrap_or("");
                self.stats.bytes_fetched += v.len() as u64;
                Ok(Some(v.to_string()))
            }
            Some(_) => Ok(None),
        }
    }

    /// Longest key [`Pmi::put`] accepts (room is kept for chunk suffixes).
    pub fn max_key_len(&self) -> usize {
        self.keylen_max.saturating_sub(6)
    }

    /// Stores bytes of any length under `key`, visible to all ranks after the
    /// next [`Pmi::fence`].
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<(), PmiError> {
        if key.len() > self.max_key_len() || !wire::is_wire_safe(key) || key.contains('~') {
            return Err(self.err(
                "put",
                format!(
                    "key {key:?} must be 1..={} printable bytes without '=', '~' or spaces",
                    self.max_key_len()
                ),
            ));
        }
        // PMI-1 servers read requests into 1024-byte lines (MPICH's
        // PMIU_MAXLINE; Slurm rejects longer ones), so the whole
        // `cmd=put kvsname=.. key=.. value=..` line must fit, not just the value.
        let overhead =
            "cmd=put kvsname= key=~00000 value=\n".len() + self.kvsname.len() + key.len();
        let per_value = self
            .vallen_max
            .min(PMI_LINE_MAX.saturating_sub(overhead))
            .max(64);
        let chunks = codec::chunk_texts(value, per_value);
        if chunks.len() <= 1 {
            let text = format!("{}{}", codec::TAG_INLINE, chunks.first().map_or("", |s| s));
            return self.put_raw(key, &text);
        }
        for (i, c) in chunks.iter().enumerate() {
            self.put_raw(&format!("{key}~{i}"), c)?;
        }
        self.put_raw(key, &format!("{}{}", codec::TAG_CHUNKED, chunks.len()))
    }

    /// Reads what some rank stored with [`Pmi::put`]; `None` if nobody did.
    pub fn try_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, PmiError> {
        let Some(head) = self.get_raw(key)? else {
            return Ok(None);
        };
        let bad = |s: &Self, why: &str| s.err("get", format!("value of {key:?} {why}"));
        if let Some(text) = head.strip_prefix(codec::TAG_INLINE) {
            return codec::decode(text)
                .map(Some)
                .ok_or_else(|| bad(self, "is not valid encoded data"));
        }
        if let Some(n) = head.strip_prefix(codec::TAG_CHUNKED) {
            let n: usize = n
                .parse()
                .ok()
                .filter(|&n| n <= 1 << 16)
                .ok_or_else(|| bad(self, "has a bad chunk count"))?;
            let mut out = Vec::new();
            for i in 0..n {
                let part = self
                    .get_raw(&format!("{key}~{i}"))?
                    .ok_or_else(|| bad(self, &format!("lacks chunk {i} of {n}")))?;
                out.extend(codec::decode(&part).ok_or_else(|| bad(self, "has a corrupt chunk"))?);
            }
            return Ok(Some(out));
        }
        Err(bad(self, "was not stored by ibcoll's put"))
    }

    /// Like [`Pmi::try_get`], but a missing key is an error.
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>, PmiError> {
        self.try_get(key)?
            .ok_or_else(|| self.err("get", format!("no value for key {key:?}")))
    }

    /// Barrier over all ranks; afterwards every earlier put is visible.
    pub fn fence(&mut self) -> Result<(), PmiError> {
        if self.conn.is_none() {
            return Ok(());
        }
        self.stats.fences += 1;
        let r = self.call("fence", Command::new("barrier_in"), "barrier_out")?;
        self.check_rc("fence", &r)
    }

    /// Tells the process manager to end the whole job, then exits.
    pub fn abort(&mut self, exit_code: i32, message: &str) -> ! {
        if self.conn.is_some() {
            eprintln!("ibcoll: rank {} aborting the job: {message}", self.rank);
        }
        self.abort_quietly(exit_code, message)
    }

    /// [`Pmi::abort`] without printing the message here: the launcher
    /// prints it (ibrun with the job's watchdog report, when the message is
    /// the watchdog's); printed here only when no launcher is there to.
    pub fn abort_quietly(&mut self, exit_code: i32, message: &str) -> ! {
        if self.conn.is_none() {
            eprintln!("ibcoll: rank {} aborting the job: {message}", self.rank);
        }
        if self.conn.is_some() {
            let cmd = Command::new("abort")
                .arg("exitcode", exit_code)
                .arg("message", escape_message(message));
            let _ = self.send("abort", &cmd);
            // Give the launcher a moment to act before we exit by ourselves,
            // so that it reports the abort rather than a plain non-zero exit.
            std::thread::sleep(Duration::from_millis(200));
        }
        std::process::exit(if exit_code == 0 { 1 } else { exit_code })
    }

    /// Leaves the job cleanly; the launcher then expects this rank to exit.
    pub fn finalize(mut self) -> Result<(), PmiError> {
        self.finalize_inner()
    }

    fn finalize_inner(&mut self) -> Result<(), PmiError> {
        if self.finalized || self.conn.is_none() {
            self.finalized = true;
            return Ok(());
        }
        self.finalized = true;
        let r = self.call("finalize", Command::new("finalize"), "finalize_ack")?;
        self.check_rc("finalize", &r)?;
        // Rank 0 hosts the key-value space under `srun --mpi=none`: it may
        // only leave once every other rank is done with it.
        if let Some(t) = self.kvs_thread.take() {
            let _ = t.join();
        }
        Ok(())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }
    pub fn mode(&self) -> InitMode {
        self.mode
    }
    pub fn is_singleton(&self) -> bool {
        self.mode == InitMode::Singleton
    }
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }
    /// A name for this job, unique on the machine while it runs.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }
    pub fn universe_size(&self) -> usize {
        self.universe_size
    }
    pub fn appnum(&self) -> i64 {
        self.appnum
    }
    pub fn placement(&self) -> &Placement {
        &self.placement
    }
    pub fn node_id(&self) -> usize {
        self.placement.node_id
    }
    pub fn local_rank(&self) -> usize {
        self.placement.local_rank
    }
    pub fn local_size(&self) -> usize {
        self.placement.local_size
    }
    pub fn num_nodes(&self) -> usize {
        self.placement.num_nodes
    }
    /// Node of any rank, when the process manager published the mapping.
    pub fn node_of(&self, rank: usize) -> Option<usize> {
        self.placement.map.as_ref().and_then(|m| m.node_of(rank))
    }
}

impl Drop for Pmi {
    fn drop(&mut self) {
        // A rank that returns from main without finalizing is still a clean
        // exit for MPICH-style launchers; finalize so ibrun does not wait.
        let _ = self.finalize_inner();
    }
}

/// A notification's rank and text; `None` for a malformed one.
fn parse_failure(c: &Command) -> Option<(usize, String)> {
    let rank = c.get("rank")?.parse().ok()?;
    Some((rank, unescape_message(c.get("reason").unwrap_or(""))))
}

fn forced_singleton() -> bool {
    env::var("IBCOLL_BOOTSTRAP").is_ok_and(|v| v == "singleton")
}

type KvsThread = Option<std::thread::JoinHandle<()>>;

/// Finds (rank 0: starts) the step's key-value server and joins it.
fn slurm_connect(step: &SlurmStep) -> Result<(TcpStream, KvsThread), String> {
    use std::net::{TcpListener, ToSocketAddrs};
    let ports = step.ports();
    let timeout = env::var("IBCOLL_BOOTSTRAP_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0 && *s < 1e6)
        .unwrap_or(60.0);
    let kvsname = step.kvsname();
    let mut thread = None;
    let mut targets: Vec<(String, u16)> = Vec::new();
    if step.rank != 0 {
        let host = crate::slurm::node_address(&step.first_host).map_err(|e| {
            format!(
                "cannot find the key-value server of Slurm job {} step {} on {}: {e}",
                step.job_id, step.step_id, step.first_host
            )
        })?;
        targets = ports.iter().map(|&p| (host.clone(), p)).collect();
    }
    if step.rank == 0 {
        let mut errors = Vec::new();
        for &p in &ports {
            match TcpListener::bind(("0.0.0.0", p)) {
                Ok(l) => {
                    let mut cfg = crate::server::ServerConfig::new(&kvsname, step.size);
                    let tpn = env::var("SLURM_STEP_TASKS_PER_NODE").unwrap_or_default();
                    if let Ok(counts) = mapping::parse_tasks_per_node(&tpn) {
                        if counts.iter().sum::<usize>() == step.size {
                            let m = NodeMap::from_counts(&counts);
                            cfg.preset.push((
                                "PMI_process_mapping".into(),
                                mapping::format_process_mapping(&m.to_blocks()),
                            ));
                        }
                    }
                    thread = Some(
                        crate::kvs_host::spawn(l, cfg)
                            .map_err(|e| format!("cannot start the key-value server: {e}"))?,
                    );
                    targets = vec![("127.0.0.1".into(), p)];
                    break;
                }
                Err(e) => errors.push(format!("{p}: {e}")),
            }
        }
        if thread.is_none() {
            return Err(format!(
                "rank 0 of Slurm job {} step {} could not listen on any port ({})",
                step.job_id,
                step.step_id,
                errors.join("; ")
            ));
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(timeout);
    let mut last = String::from("no attempt");
    let mut pause = Duration::from_millis(10);
    loop {
        for (host, port) in &targets {
            let addrs = match (host.as_str(), *port).to_socket_addrs() {
                Ok(a) => a.collect::<Vec<_>>(),
                Err(e) => {
                    last = format!("cannot resolve {host}: {e}");
                    continue;
                }
            };
            for a in addrs {
                match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
                    Ok(s) => match initack(s, step.rank, &kvsname) {
                        Ok(s) => return Ok((s, thread)),
                        Err(e) => last = format!("{a}: {e}"),
                    },
                    Err(e) => last = format!("{a}: {e}"),
                }
            }
        }
        if std::time::Instant::now() >= deadline {
            let tried: Vec<String> = targets.iter().map(|(h, p)| format!("{h}:{p}")).collect();
            return Err(format!(
                "no key-value server of Slurm job {} step {} answered within {timeout} s \
                 (IBCOLL_BOOTSTRAP_TIMEOUT); tried {} (last error: {last})",
                step.job_id,
                step.step_id,
                tried.join(", ")
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// PMI_PORT's handshake, naming the job so a stranger's server refuses us.
fn initack(mut s: TcpStream, rank: usize, kvsname: &str) -> Result<TcpStream, String> {
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let req = Command::new("initack")
        .arg("pmiid", rank)
        .arg("kvsname", kvsname);
    s.write_all(req.to_line().as_bytes())
        .map_err(|e| e.to_string())?;
    let mut lines = LineBuffer::new();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while got.len() < 4 {
        match lines.next_line().map_err(|e| e.to_string())? {
            Some(l) => {
                let c = wire::parse_line(&l).map_err(|e| e.to_string())?;
                if got.is_empty()
                    && (c.name != "initack" || c.get("rc").is_some_and(|rc| rc != "0"))
                {
                    return Err(format!("refused: {}", c.to_line().trim_end()));
                }
                got.push(c);
            }
            None => {
                let n = s.read(&mut buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("connection closed during the handshake".into());
                }
                lines.extend(&buf[..n]);
            }
        }
    }
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(s)
}

fn connect_with_retry(port: &str) -> std::io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = port.to_socket_addrs()?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    // The launcher listens before it starts ranks; retries only cover
    // transient failures such as a full accept backlog.
    for attempt in 0..50 {
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        std::thread::sleep(Duration::from_millis(20 * (attempt + 1).min(10)));
    }
    Err(last)
}
