//! The PMI-1 server: the key-value space and barrier of one job.
//!
//! This is a pure state machine: the launcher's event loop feeds it lines read
//! from each connection and carries out the [`Action`]s it returns (replies,
//! log lines, an abort). Keeping I/O out makes every protocol path testable
//! without processes, and guarantees that a malformed line can only produce an
//! error reply, never a crash or a stuck barrier.
//!
//! Costs, for N ranks: a put or get is one hash-map operation, a barrier
//! costs O(N) in all (O(1) per `barrier_in`, O(N) to release it), and memory
//! is O(N + bytes put). [`PmiServer::work`] counts the steps so that tests can
//! hold the server to that at any scale.
//!
//! Beyond PMI-1, a client that sends `cmd=ibcoll_notify` (ibcoll's does, when
//! its launcher says the server understands it) is told of every rank that
//! ends without finalizing, by unsolicited `cmd=ibcoll_failed rank=R
//! reason=TEXT` lines, so that it can fail operations on that rank at once.
//! Other clients never see such a line.

use std::collections::{HashMap, HashSet};

use crate::wire::{self, Command};

/// PMI-1 servers (MPICH's, Slurm's) read 1024-byte lines; refusing longer
/// puts here keeps clients tested under ibrun honest elsewhere.
pub const PMI1_LINE_MAX: usize = 1024;

/// The command a client sends to be told of lost ranks.
pub const NOTIFY_CMD: &str = "ibcoll_notify";
/// The unsolicited line that tells a subscribed client of a lost rank.
pub const FAILED_CMD: &str = "ibcoll_failed";

/// Identifies one client connection inside the launcher.
pub type ConnId = usize;

/// Limits and names advertised to clients.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub kvsname: String,
    pub size: usize,
    pub universe_size: usize,
    pub appnum: i64,
    pub kvsname_max: usize,
    pub keylen_max: usize,
    pub vallen_max: usize,
    /// Entries present before any client puts (e.g. `PMI_process_mapping`).
    pub preset: Vec<(String, String)>,
}

impl ServerConfig {
    /// Slurm's limits, so that clients exercised under ibrun behave the same
    /// under `srun --mpi=pmi2`.
    pub fn new(kvsname: &str, size: usize) -> Self {
        ServerConfig {
            kvsname: kvsname.to_string(),
            size,
            universe_size: size,
            appnum: 0,
            kvsname_max: 256,
            keylen_max: 64,
            vallen_max: 1024,
            preset: Vec::new(),
        }
    }
}

/// What the event loop must do after a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write these bytes (one or more lines) to the connection.
    Reply(ConnId, String),
    /// Print a diagnostic line on ibrun's stderr.
    Log(String),
    /// A rank asked to abort the job.
    Abort {
        rank: Option<usize>,
        exit_code: i32,
        message: String,
    },
    /// The rank sent `finalize`.
    Finalized(usize),
    /// Rank `rank` put its watchdog state (a key under
    /// [`HANG_KEY_PREFIX`]): ibrun gathers them into one report.
    Hang { rank: usize, state: String },
}

/// Keys under which ibcoll's hang watchdog puts a rank's state (the rank
/// number follows): `text|ranks waited for|seconds`, with `_` for spaces,
/// or `finalizing...` for a rank that reached finalize.
pub const HANG_KEY_PREFIX: &str = "ibcoll-hang-";

#[derive(Debug, Default)]
struct Conn {
    rank: Option<usize>,
    /// Sent `init`: from then on it takes part in barriers.
    initialized: bool,
    finalized: bool,
    /// Waiting in the current barrier.
    in_barrier: bool,
}

/// The server state of one job.
#[derive(Debug)]
pub struct PmiServer {
    cfg: ServerConfig,
    kvs: HashMap<String, String>,
    /// Bytes of keys and values held in `kvs`.
    kvs_bytes: usize,
    conns: HashMap<ConnId, Conn>,
    /// The connection each rank had (kept after it closes: a rank joins once).
    by_rank: HashMap<usize, ConnId>,
    /// Ranks that sent `finalize`.
    finalized: HashSet<usize>,
    /// Connections that entered the current barrier, in order; an entry
    /// whose connection has since gone (or left the barrier) is skipped.
    barrier: Vec<ConnId>,
    /// Connections counted in the current barrier.
    waiting: usize,
    /// The first rank that can no longer take part, and how it ended.
    lost: Option<(usize, String)>,
    /// Every rank reported lost, in order, and the same as a set.
    failed: Vec<(usize, String)>,
    failed_set: HashSet<usize>,
    /// Connections that asked to be told of lost ranks.
    subscribers: HashSet<ConnId>,
    /// Set by [`PmiServer::stop_notifying`].
    quiet: bool,
    work: u64,
}

impl PmiServer {
    pub fn new(cfg: ServerConfig) -> Self {
        let kvs: HashMap<String, String> = cfg.preset.iter().cloned().collect();
        let kvs_bytes = kvs.iter().map(|(k, v)| k.len() + v.len()).sum();
        PmiServer {
            cfg,
            kvs,
            kvs_bytes,
            conns: HashMap::new(),
            by_rank: HashMap::new(),
            finalized: HashSet::new(),
            barrier: Vec::new(),
            waiting: 0,
            lost: None,
            failed: Vec::new(),
            failed_set: HashSet::new(),
            subscribers: HashSet::new(),
            quiet: false,
            work: 0,
        }
    }

    /// Registers a connection; `rank` is known for socketpair connections and
    /// learned from `initack` for TCP ones.
    pub fn add_conn(&mut self, id: ConnId, rank: Option<usize>) {
        self.work += 1;
        if let Some(r) = rank {
            self.by_rank.insert(r, id);
        }
        self.conns.insert(
            id,
            Conn {
                rank,
                ..Conn::default()
            },
        );
    }

    /// Forgets a closed connection. A rank that leaves without finalizing
    /// can never enter another barrier, so every barrier, present and future,
    /// fails with an error naming it instead of waiting forever, and the
    /// subscribed ranks are told.
    pub fn remove_conn(&mut self, id: ConnId) -> Vec<Action> {
        self.work += 1;
        let Some(c) = self.conns.remove(&id) else {
            return Vec::new();
        };
        self.subscribers.remove(&id);
        if c.in_barrier {
            self.waiting -= 1;
        }
        let Some(r) = c.rank else {
            return Vec::new();
        };
        if !c.initialized || c.finalized || self.failed_set.contains(&r) {
            return Vec::new();
        }
        let how = "disconnected before finalize";
        let mut actions = Vec::new();
        if self.lost.is_none() {
            actions.push(Action::Log(format!("PMI: rank {r} {how}")));
        }
        actions.extend(self.lose(r, how));
        actions
    }

    /// The launcher saw rank `rank` end without finalizing (`how`: e.g.
    /// "was killed by signal 9 (SIGKILL)"): fail the barriers it will never
    /// join and tell the subscribed ranks. Ranks already reported, or that
    /// finalized, are left alone.
    pub fn rank_ended(&mut self, rank: usize, how: &str) -> Vec<Action> {
        self.work += 1;
        if self.finalized.contains(&rank)
            || rank >= self.cfg.size
            || self.failed_set.contains(&rank)
        {
            return Vec::new();
        }
        self.lose(rank, how)
    }

    fn lose(&mut self, r: usize, how: &str) -> Vec<Action> {
        self.failed_set.insert(r);
        self.failed.push((r, how.to_string()));
        let mut actions = Vec::new();
        // Notifications go first: a subscriber whose fence fails below has
        // then always been told why by the time it reads the error.
        if !self.quiet {
            let line = failed_line(r, how);
            for &s in &self.subscribers {
                self.work += 1;
                if self.conns.get(&s).and_then(|c| c.rank) != Some(r) {
                    actions.push(Action::Reply(s, line.clone()));
                }
            }
        }
        if self.lost.is_none() {
            self.lost = Some((r, how.to_string()));
            let reply = error_reply("barrier_out", &format!("rank {r} {how}"));
            actions.extend(self.release_barrier(&reply));
        }
        actions
    }

    /// Whether every rank is in the barrier or has finalized. A rank that
    /// finalized never enters another one: ibcoll skips its closing fence
    /// after a failed call (its peers may be gone), and the ranks still
    /// fencing must not wait for it.
    fn barrier_complete(&self) -> bool {
        self.waiting + self.finalized.len() >= self.cfg.size
    }

    /// Sends `reply` to every connection still in the barrier and empties it.
    fn release_barrier(&mut self, reply: &str) -> Vec<Action> {
        let mut actions = Vec::with_capacity(self.waiting);
        for w in std::mem::take(&mut self.barrier) {
            self.work += 1;
            if let Some(c) = self.conns.get_mut(&w).filter(|c| c.in_barrier) {
                c.in_barrier = false;
                actions.push(Action::Reply(w, reply.to_string()));
            }
        }
        self.waiting = 0;
        actions
    }

    /// The launcher is ending the job: ranks lost from now on are its own
    /// doing, and are not announced one by one (N ranks ending would cost
    /// N^2 lines).
    pub fn stop_notifying(&mut self) {
        self.quiet = true;
    }

    /// The rank behind a connection, when known.
    pub fn rank_of(&self, id: ConnId) -> Option<usize> {
        self.conns.get(&id).and_then(|c| c.rank)
    }

    /// Whether the connection's rank has sent `finalize`.
    pub fn is_finalized(&self, id: ConnId) -> bool {
        self.conns.get(&id).is_some_and(|c| c.finalized)
    }

    /// Number of ranks currently waiting in the barrier.
    pub fn barrier_waiting(&self) -> usize {
        self.waiting
    }

    /// The ranks reported lost so far, in order, with how each ended.
    pub fn failed(&self) -> &[(usize, String)] {
        &self.failed
    }

    /// Bytes of keys and values stored (presets included).
    pub fn stored_bytes(&self) -> usize {
        self.kvs_bytes
    }

    /// Steps taken so far: one per line, connection event and element
    /// visited in any loop. Tests compare it with the job's size.
    pub fn work(&self) -> u64 {
        self.work
    }

    /// Handles one line from connection `id`.
    pub fn handle_line(&mut self, id: ConnId, line: &[u8]) -> Vec<Action> {
        self.work += 1;
        let who = self.describe(id);
        let cmd = match wire::parse_line(line) {
            Ok(c) => c,
            Err(e) => {
                return vec![
                    Action::Log(format!("PMI: malformed line from {who}: {e}")),
                    Action::Reply(id, error_reply("error", &format!("malformed: {e}"))),
                ]
            }
        };
        match self.dispatch(id, &cmd, line.len()) {
            Ok(actions) => actions,
            Err(msg) => vec![
                Action::Log(format!("PMI: {who}: cmd={} rejected: {msg}", cmd.name)),
                Action::Reply(id, error_reply(&reply_name(&cmd.name), &msg)),
            ],
        }
    }

    fn describe(&self, id: ConnId) -> String {
        match self.rank_of(id) {
            Some(r) => format!("rank {r}"),
            None => format!("connection {id}"),
        }
    }

    fn dispatch(
        &mut self,
        id: ConnId,
        cmd: &Command,
        line_len: usize,
    ) -> Result<Vec<Action>, String> {
        if cmd.multi {
            return Err(format!("mcmd={} (spawn) is not supported", cmd.name));
        }
        let reply = |c: Command| Ok(vec![Action::Reply(id, c.to_line())]);
        match cmd.name.as_str() {
            "init" => {
                let v = cmd.require_int("pmi_version").map_err(|e| e.to_string())?;
                let sv = cmd.get("pmi_subversion").unwrap_or("0");
                if v != 1 {
                    return Err(format!(
                        "PMI version {v}.{sv} requested; this server speaks PMI-1.1"
                    ));
                }
                if let Some(c) = self.conns.get_mut(&id) {
                    c.initialized = true;
                }
                reply(
                    Command::new("response_to_init")
                        .arg("pmi_version", 1)
                        .arg("pmi_subversion", 1)
                        .arg("rc", 0),
                )
            }
            "initack" => {
                // A client that knows which job it belongs to says so, so that
                // it cannot join a stranger's server by mistake.
                self.check_kvsname(cmd)?;
                let raw = cmd.require("pmiid").map_err(|e| e.to_string())?;
                let r: usize =
                    raw.parse()
                        .ok()
                        .filter(|&r| r < self.cfg.size)
                        .ok_or_else(|| {
                            format!("pmiid {raw:?} is not a rank below {}", self.cfg.size)
                        })?;
                if self.by_rank.contains_key(&r) {
                    return Err(format!("rank {r} is already connected"));
                }
                let Some(c) = self.conns.get_mut(&id) else {
                    return Err("initack on an unknown connection".into());
                };
                if c.rank.is_some() {
                    return Err("initack on a connection that already has a rank".into());
                }
                c.rank = Some(r);
                self.by_rank.insert(r, id);
                let text = [
                    Command::new("initack").arg("rc", 0),
                    Command::new("set").arg("size", self.cfg.size),
                    Command::new("set").arg("rank", r),
                    Command::new("set").arg("debug", 0),
                ]
                .iter()
                .map(Command::to_line)
                .collect();
                Ok(vec![Action::Reply(id, text)])
            }
            "get_maxes" => reply(
                Command::new("maxes")
                    .arg("kvsname_max", self.cfg.kvsname_max)
                    .arg("keylen_max", self.cfg.keylen_max)
                    .arg("vallen_max", self.cfg.vallen_max)
                    .arg("rc", 0),
            ),
            "get_universe_size" => reply(
                Command::new("universe_size")
                    .arg("size", self.cfg.universe_size)
                    .arg("rc", 0),
            ),
            "get_appnum" => reply(
                Command::new("appnum")
                    .arg("appnum", self.cfg.appnum)
                    .arg("rc", 0),
            ),
            "get_my_kvsname" => reply(
                Command::new("my_kvsname")
                    .arg("kvsname", &self.cfg.kvsname)
                    .arg("rc", 0),
            ),
            "put" => {
                self.check_kvsname(cmd)?;
                if line_len > PMI1_LINE_MAX {
                    return Err(format!(
                        "put line of {line_len} bytes exceeds PMI-1's {PMI1_LINE_MAX}-byte lines"
                    ));
                }
                let key = cmd.require("key").map_err(|e| e.to_string())?;
                let value = cmd.require("value").map_err(|e| e.to_string())?;
                if key.len() > self.cfg.keylen_max {
                    return Err(format!(
                        "key of {} bytes exceeds keylen_max {}",
                        key.len(),
                        self.cfg.keylen_max
                    ));
                }
                if value.len() > self.cfg.vallen_max {
                    return Err(format!(
                        "value of {} bytes exceeds vallen_max {}",
                        value.len(),
                        self.cfg.vallen_max
                    ));
                }
                self.kvs_bytes += key.len() + value.len();
                if let Some(old) = self.kvs.insert(key.to_string(), value.to_string()) {
                    self.kvs_bytes -= key.len() + old.len();
                }
                let hang = key
                    .strip_prefix(HANG_KEY_PREFIX)
                    .and_then(|r| r.parse::<usize>().ok())
                    .map(|rank| Action::Hang {
                        rank,
                        state: value.to_string(),
                    });
                let mut out = reply(
                    Command::new("put_result")
                        .arg("rc", 0)
                        .arg("msg", "success"),
                )?;
                out.extend(hang);
                Ok(out)
            }
            "get" => {
                self.check_kvsname(cmd)?;
                let key = cmd.require("key").map_err(|e| e.to_string())?;
                match self.kvs.get(key) {
                    Some(v) => reply(
                        Command::new("get_result")
                            .arg("rc", 0)
                            .arg("msg", "success")
                            .arg("value", v),
                    ),
                    // A missing key is an ordinary answer, not a protocol error:
                    // clients probe optional keys such as PMI_process_mapping.
                    None => reply(
                        Command::new("get_result")
                            .arg("rc", -1)
                            .arg("msg", "key_not_found"),
                    ),
                }
            }
            "barrier_in" => {
                let Some(c) = self.conns.get_mut(&id) else {
                    return Err("barrier_in on an unknown connection".into());
                };
                if c.in_barrier {
                    return Err("barrier_in twice without barrier_out".into());
                }
                if let Some((r, how)) = &self.lost {
                    return Err(format!("rank {r} {how}"));
                }
                c.in_barrier = true;
                self.barrier.push(id);
                self.waiting += 1;
                if !self.barrier_complete() {
                    return Ok(Vec::new());
                }
                let out = Command::new("barrier_out").arg("rc", 0).to_line();
                Ok(self.release_barrier(&out))
            }
            NOTIFY_CMD => {
                if self.rank_of(id).is_none() {
                    return Err(format!("{NOTIFY_CMD} before the rank is known"));
                }
                self.subscribers.insert(id);
                // Ranks lost before this one asked are reported at once.
                let mut text = Command::new("ibcoll_notify_result").arg("rc", 0).to_line();
                for (r, how) in &self.failed {
                    self.work += 1;
                    text.push_str(&failed_line(*r, how));
                }
                Ok(vec![Action::Reply(id, text)])
            }
            "finalize" => {
                let mut actions = vec![Action::Reply(
                    id,
                    Command::new("finalize_ack").arg("rc", 0).to_line(),
                )];
                if let Some(c) = self.conns.get_mut(&id) {
                    if !c.finalized {
                        c.finalized = true;
                        self.subscribers.remove(&id);
                        if let Some(r) = c.rank {
                            self.finalized.insert(r);
                            actions.push(Action::Finalized(r));
                        }
                        if self.waiting > 0 && self.barrier_complete() {
                            let out = Command::new("barrier_out").arg("rc", 0).to_line();
                            actions.extend(self.release_barrier(&out));
                        }
                    }
                }
                Ok(actions)
            }
            "abort" => {
                let exit_code = cmd
                    .get("exitcode")
                    .and_then(|v| v.parse::<i32>().ok())
                    .unwrap_or(1);
                let message = cmd
                    .get("message")
                    .or_else(|| cmd.get("msg"))
                    .map(unescape_message)
                    .unwrap_or_default();
                Ok(vec![Action::Abort {
                    rank: self.rank_of(id),
                    exit_code,
                    message,
                }])
            }
            other => Err(format!("unknown command {other:?}")),
        }
    }

    fn check_kvsname(&self, cmd: &Command) -> Result<(), String> {
        match cmd.get("kvsname") {
            Some(k) if k != self.cfg.kvsname => Err(format!(
                "unknown kvsname {k:?} (this job's is {:?})",
                self.cfg.kvsname
            )),
            _ => Ok(()),
        }
    }
}

/// PMI-1 replies are named after the request (`put` → `put_result`).
fn reply_name(request: &str) -> String {
    match request {
        "init" => "response_to_init".into(),
        "get_maxes" => "maxes".into(),
        "get_universe_size" => "universe_size".into(),
        "get_appnum" => "appnum".into(),
        "get_my_kvsname" => "my_kvsname".into(),
        "barrier_in" => "barrier_out".into(),
        "finalize" => "finalize_ack".into(),
        "initack" => "initack".into(),
        other => format!("{other}_result"),
    }
}

fn error_reply(name: &str, msg: &str) -> String {
    let msg: String = msg
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '=' {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    Command::new(name).arg("rc", -1).arg("msg", msg).to_line()
}

/// The notification of a lost rank.
pub fn failed_line(rank: usize, how: &str) -> String {
    Command::new(FAILED_CMD)
        .arg("rank", rank)
        .arg("reason", escape_message(how))
        .to_line()
}

/// Escapes free text for a PMI value (`%XX` for separators), as the client's
/// `abort` does for its message.
pub fn escape_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_graphic() && b != b'%' && b != b'=' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Reverses [`escape_message`]; invalid escapes are kept as they are.
pub fn unescape_message(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn server(n: usize) -> PmiServer {
        let mut cfg = ServerConfig::new("kvs_1", n);
        cfg.preset
            .push(("PMI_process_mapping".into(), "(vector,(0,1,2))".into()));
        let mut s = PmiServer::new(cfg);
        for r in 0..n {
            s.add_conn(r, Some(r));
        }
        s
    }

    fn reply_of(actions: &[Action]) -> &str {
        actions
            .iter()
            .find_map(|a| match a {
                Action::Reply(_, t) => Some(t.as_str()),
                _ => None,
            })
            .expect("a reply")
    }

    #[test]
    fn init_and_queries() {
        let mut s = server(2);
        let a = s.handle_line(0, b"cmd=init pmi_version=1 pmi_subversion=1");
        assert_eq!(
            reply_of(&a),
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
        );
        let a = s.handle_line(0, b"cmd=get_maxes");
        assert!(reply_of(&a).starts_with("cmd=maxes kvsname_max=256 keylen_max=64"));
        let a = s.handle_line(0, b"cmd=get_my_kvsname");
        assert_eq!(reply_of(&a), "cmd=my_kvsname kvsname=kvs_1 rc=0\n");
        let a = s.handle_line(0, b"cmd=get_universe_size");
        assert_eq!(reply_of(&a), "cmd=universe_size size=2 rc=0\n");
        let a = s.handle_line(0, b"cmd=get_appnum");
        assert_eq!(reply_of(&a), "cmd=appnum appnum=0 rc=0\n");
    }

    #[test]
    fn pmi2_init_is_refused_with_error_reply() {
        let mut s = server(1);
        let a = s.handle_line(0, b"cmd=init pmi_version=2 pmi_subversion=0");
        assert!(reply_of(&a).contains("rc=-1"));
        assert!(a.iter().any(|x| matches!(x, Action::Log(_))));
    }

    #[test]
    fn put_get_and_missing() {
        let mut s = server(2);
        let a = s.handle_line(0, b"cmd=put kvsname=kvs_1 key=k0 value=v0");
        assert_eq!(reply_of(&a), "cmd=put_result rc=0 msg=success\n");
        let a = s.handle_line(1, b"cmd=get kvsname=kvs_1 key=k0");
        assert_eq!(reply_of(&a), "cmd=get_result rc=0 msg=success value=v0\n");
        let a = s.handle_line(1, b"cmd=get kvsname=kvs_1 key=nope");
        assert!(reply_of(&a).contains("rc=-1"));
        let a = s.handle_line(1, b"cmd=get kvsname=kvs_1 key=PMI_process_mapping");
        assert!(reply_of(&a).contains("value=(vector,(0,1,2))"));
        let a = s.handle_line(1, b"cmd=get kvsname=other key=k0");
        assert!(reply_of(&a).starts_with("cmd=get_result rc=-1"));
    }

    #[test]
    fn put_limits() {
        let mut s = server(1);
        let long_key = format!("cmd=put kvsname=kvs_1 key={} value=x", "k".repeat(65));
        assert!(reply_of(&s.handle_line(0, long_key.as_bytes())).contains("rc=-1"));
        let long_val = format!("cmd=put kvsname=kvs_1 key=k value={}", "v".repeat(1025));
        assert!(reply_of(&s.handle_line(0, long_val.as_bytes())).contains("rc=-1"));
    }

    #[test]
    fn barrier_releases_everyone_at_once() {
        let mut s = server(3);
        assert!(s.handle_line(0, b"cmd=barrier_in").is_empty());
        assert!(s.handle_line(2, b"cmd=barrier_in").is_empty());
        assert!(reply_of(&s.handle_line(2, b"cmd=barrier_in")).contains("rc=-1"));
        let a = s.handle_line(1, b"cmd=barrier_in");
        assert_eq!(a.len(), 3);
        assert_eq!(s.barrier_waiting(), 0);
        // A second barrier works the same way.
        for r in 0..2 {
            assert!(s.handle_line(r, b"cmd=barrier_in").is_empty());
        }
        assert_eq!(s.handle_line(2, b"cmd=barrier_in").len(), 3);
    }

    #[test]
    fn a_finalized_rank_does_not_hold_the_barrier() {
        // Rank 2 finalizes without the closing fence (a failed call): the
        // others' fence ends when it finalizes, before or after they enter.
        let mut s = server(3);
        assert!(s.handle_line(0, b"cmd=barrier_in").is_empty());
        let a = s.handle_line(2, b"cmd=finalize");
        assert_eq!(a.len(), 2, "only the finalize_ack and Finalized: {a:?}");
        let a = s.handle_line(1, b"cmd=barrier_in");
        assert_eq!(a.len(), 2);
        assert!(a.iter().all(|x| format!("{x:?}").contains("rc=0")), "{a:?}");
        let mut s = server(3);
        assert!(s.handle_line(0, b"cmd=barrier_in").is_empty());
        assert!(s.handle_line(1, b"cmd=barrier_in").is_empty());
        let a = s.handle_line(2, b"cmd=finalize");
        assert_eq!(a.len(), 4, "ack, Finalized and two barrier_outs: {a:?}");
        assert_eq!(s.barrier_waiting(), 0);
    }

    #[test]
    fn lost_rank_fails_barriers() {
        let mut s = server(3);
        for r in 0..3 {
            s.handle_line(r, b"cmd=init pmi_version=1 pmi_subversion=1");
        }
        assert!(s.handle_line(0, b"cmd=barrier_in").is_empty());
        let a = s.remove_conn(1);
        assert!(a.iter().any(
            |x| matches!(x, Action::Reply(0, t) if t.contains("rc=-1") && t.contains("rank_1"))
        ));
        assert!(reply_of(&s.handle_line(2, b"cmd=barrier_in")).contains("rc=-1"));
        // A rank that finalized, or never used PMI, may leave freely.
        let mut s = server(3);
        assert!(s.remove_conn(2).is_empty());
        s.handle_line(1, b"cmd=init pmi_version=1 pmi_subversion=1");
        s.handle_line(1, b"cmd=finalize");
        assert!(s.remove_conn(1).is_empty());
        assert!(s.handle_line(0, b"cmd=barrier_in").is_empty());
    }

    #[test]
    fn subscribers_learn_of_lost_ranks() {
        let mut s = server(4);
        for r in 0..4 {
            s.handle_line(r, b"cmd=init pmi_version=1 pmi_subversion=1");
        }
        assert_eq!(
            reply_of(&s.handle_line(0, b"cmd=ibcoll_notify")),
            "cmd=ibcoll_notify_result rc=0\n"
        );
        s.handle_line(1, b"cmd=ibcoll_notify");
        // Rank 2 dies; rank 3 never subscribed and sees nothing.
        let a = s.rank_ended(2, "was killed by signal 9 (SIGKILL)");
        let want = "cmd=ibcoll_failed rank=2 reason=was%20killed%20by%20signal%209%20(SIGKILL)\n";
        let mut to: Vec<ConnId> = a
            .iter()
            .filter_map(|x| match x {
                Action::Reply(c, t) if t == want => Some(*c),
                _ => None,
            })
            .collect();
        to.sort();
        assert_eq!(to, vec![0, 1]);
        assert_eq!(a.len(), 2);
        // Its connection closing afterwards reports nothing twice.
        assert!(s.remove_conn(2).is_empty());
        // A late subscriber hears of it at once; a barrier now fails.
        let a = s.handle_line(3, b"cmd=ibcoll_notify");
        assert_eq!(
            reply_of(&a),
            format!("cmd=ibcoll_notify_result rc=0\n{want}")
        );
        let a = s.handle_line(3, b"cmd=barrier_in");
        assert!(reply_of(&a).contains("rank_2_was_killed_by_signal_9"));
        // A closed connection without finalize reports itself.
        let a = s.remove_conn(1);
        assert!(a.contains(&Action::Reply(
            0,
            "cmd=ibcoll_failed rank=1 reason=disconnected%20before%20finalize\n".into()
        )));
        assert!(a.contains(&Action::Reply(
            3,
            "cmd=ibcoll_failed rank=1 reason=disconnected%20before%20finalize\n".into()
        )));
        assert_eq!(s.failed().len(), 2);
        // A finalized rank is neither reported nor told.
        s.handle_line(3, b"cmd=finalize");
        assert!(s.rank_ended(3, "exited with status 0").is_empty());
        let a = s.rank_ended(0, "exited with status 1");
        assert!(a.is_empty(), "{a:?}");
    }

    #[test]
    fn notify_needs_a_rank() {
        let mut s = PmiServer::new(ServerConfig::new("kvs", 2));
        s.add_conn(5, None);
        assert!(reply_of(&s.handle_line(5, b"cmd=ibcoll_notify")).contains("rc=-1"));
    }

    #[test]
    fn a_rank_lost_while_others_wait_fails_their_barrier() {
        let mut s = server(3);
        for r in 0..3 {
            s.handle_line(r, b"cmd=init pmi_version=1 pmi_subversion=1");
        }
        s.handle_line(0, b"cmd=ibcoll_notify");
        assert!(s.handle_line(0, b"cmd=barrier_in").is_empty());
        assert!(s.handle_line(1, b"cmd=barrier_in").is_empty());
        let a = s.rank_ended(2, "exited with status 3");
        let err = "cmd=barrier_out rc=-1 msg=rank_2_exited_with_status_3\n";
        assert!(a.contains(&Action::Reply(0, err.into())));
        assert!(a.contains(&Action::Reply(1, err.into())));
        assert!(a.contains(&Action::Reply(
            0,
            "cmd=ibcoll_failed rank=2 reason=exited%20with%20status%203\n".into()
        )));
        assert_eq!(s.barrier_waiting(), 0);
    }

    /// One job of `n` ranks: init, subscribe, put, fence, three gets of
    /// neighbours, fence, finalize. Returns the server's work and the bytes
    /// of every reply.
    fn job_work(n: usize) -> (u64, usize, usize) {
        let mut s = PmiServer::new(ServerConfig::new("kvs", n));
        let mut bytes = 0usize;
        let mut go = |s: &mut PmiServer, r: usize, line: &str| {
            for a in s.handle_line(r, line.as_bytes()) {
                match a {
                    Action::Reply(_, t) => {
                        assert!(!t.contains("rc=-1"), "{line}: {t}");
                        bytes += t.len();
                    }
                    Action::Log(m) => panic!("{m}"),
                    _ => {}
                }
            }
        };
        for r in 0..n {
            s.add_conn(r, None);
            go(&mut s, r, &format!("cmd=initack pmiid={r} kvsname=kvs"));
            go(&mut s, r, "cmd=init pmi_version=1 pmi_subversion=1");
            go(&mut s, r, "cmd=ibcoll_notify");
            go(
                &mut s,
                r,
                &format!("cmd=put kvsname=kvs key=card{r} value=v{r}"),
            );
        }
        for r in 0..n {
            go(&mut s, r, "cmd=barrier_in");
        }
        assert_eq!(s.barrier_waiting(), 0);
        for r in 0..n {
            for peer in [r + 1, r + n - 1, 0] {
                go(
                    &mut s,
                    r,
                    &format!("cmd=get kvsname=kvs key=card{}", peer % n),
                );
            }
        }
        // Overwriting a key does not grow the store.
        let stored = s.stored_bytes();
        go(&mut s, 0, "cmd=put kvsname=kvs key=card0 value=v0");
        assert_eq!(s.stored_bytes(), stored);
        for r in (0..n).rev() {
            go(&mut s, r, "cmd=barrier_in");
        }
        for r in 0..n {
            go(&mut s, r, "cmd=finalize");
            assert!(s.remove_conn(r).is_empty());
        }
        (s.work(), bytes, stored)
    }

    #[test]
    fn work_and_memory_grow_linearly_to_20000_ranks() {
        let (w1, b1, m1) = job_work(10_000);
        let (w2, b2, m2) = job_work(20_000);
        // About 14 steps per rank: one per line and connection event, one
        // per barrier release. A quadratic step anywhere would be 10^8.
        assert!(w1 <= 16 * 10_000, "work {w1} for 10,000 ranks");
        assert!(w2 <= 16 * 20_000, "work {w2} for 20,000 ranks");
        assert!(w2 <= 2 * w1 + 100, "work {w1} -> {w2} when doubling N");
        assert!(b2 <= 2 * b1 + 20_000 * 8, "reply bytes {b1} -> {b2}");
        assert!(m2 <= 2 * m1 + 20_000 * 2, "stored bytes {m1} -> {m2}");
    }

    #[test]
    fn failures_at_scale_cost_one_step_per_subscriber() {
        let n = 10_000;
        let mut s = server(n);
        for r in 0..n {
            s.handle_line(r, b"cmd=init pmi_version=1 pmi_subversion=1");
            s.handle_line(r, b"cmd=ibcoll_notify");
        }
        for r in 0..n - 1 {
            s.handle_line(r, b"cmd=barrier_in");
        }
        let before = s.work();
        let a = s.rank_ended(n - 1, "exited with status 2");
        // N-1 barrier errors and N-1 notifications.
        assert_eq!(a.len(), 2 * (n - 1));
        assert!(s.work() - before <= 2 * n as u64 + 2);
    }

    #[test]
    fn tcp_initack() {
        let mut s = PmiServer::new(ServerConfig::new("kvs", 2));
        s.add_conn(7, None);
        let a = s.handle_line(7, b"cmd=initack pmiid=1");
        assert_eq!(
            reply_of(&a),
            "cmd=initack rc=0\ncmd=set size=2\ncmd=set rank=1\ncmd=set debug=0\n"
        );
        assert_eq!(s.rank_of(7), Some(1));
        s.add_conn(8, None);
        assert!(reply_of(&s.handle_line(8, b"cmd=initack pmiid=1")).contains("rc=-1"));
        assert!(reply_of(&s.handle_line(8, b"cmd=initack pmiid=2")).contains("rc=-1"));
        assert!(reply_of(&s.handle_line(8, b"cmd=initack pmiid=x")).contains("rc=-1"));
    }

    #[test]
    fn abort_and_finalize() {
        let mut s = server(2);
        let a = s.handle_line(1, b"cmd=abort exitcode=7 message=bad%20input");
        assert_eq!(
            a,
            vec![Action::Abort {
                rank: Some(1),
                exit_code: 7,
                message: "bad input".into()
            }]
        );
        let a = s.handle_line(0, b"cmd=finalize");
        assert_eq!(reply_of(&a), "cmd=finalize_ack rc=0\n");
        assert!(a.contains(&Action::Finalized(0)));
    }

    #[test]
    fn unknown_and_malformed_get_error_replies() {
        let mut s = server(1);
        let a = s.handle_line(0, b"cmd=frobnicate");
        assert_eq!(
            reply_of(&a),
            "cmd=frobnicate_result rc=-1 msg=unknown_command_\"frobnicate\"\n"
        );
        let a = s.handle_line(0, b"garbage here");
        assert!(reply_of(&a).starts_with("cmd=error rc=-1"));
        let a = s.handle_line(0, b"mcmd=spawn nprocs=2");
        assert!(reply_of(&a).contains("rc=-1"));
        let a = s.handle_line(0, b"cmd=put kvsname=kvs_1");
        assert!(reply_of(&a).contains("rc=-1"));
    }

    #[test]
    fn message_escaping_round_trips() {
        let t = "rank 3: bad = 100%\n";
        assert_eq!(unescape_message(&escape_message(t)), t);
        assert_eq!(unescape_message("%zz%4"), "%zz%4");
    }

    proptest! {
        #[test]
        fn any_line_gives_actions_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut s = server(2);
            let _ = s.handle_line(0, &bytes);
        }

        #[test]
        fn any_wireish_line_never_panics(line in "cmd=[a-z_]{0,12}( [a-z_]{0,8}=[ -~]{0,12}){0,4}") {
            let mut s = server(2);
            s.add_conn(9, None);
            let _ = s.handle_line(9, line.as_bytes());
            let _ = s.handle_line(0, line.as_bytes());
        }

        #[test]
        fn unescape_never_panics(t in "\\PC{0,40}") {
            let _ = unescape_message(&t);
        }
    }
}
