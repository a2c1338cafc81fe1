//! The running job: one epoll loop over the PMI connections, the ranks'
//! output pipes, signals and the clock. A wakeup costs what is ready: every
//! descriptor is registered once, children are reaped with waitpid(-1) on
//! SIGCHLD, and the job's state is kept in counters rather than found by
//! visiting every rank. It carries out the PMI server's actions, tells the
//! subscribed ranks when one is lost, and ends the whole job when one fails.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, ChildStdin};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use ibcoll_launcher::conns::{Conns, Stream};
use ibcoll_launcher::hang_report;
use ibcoll_launcher::poller::{Interest, Poller, Ready};
use ibcoll_launcher::server::{Action, ConnId, PmiServer};

use crate::output::{OutputSink, PipeLines};
use crate::plan::RankSlot;
use crate::proxy::{parse_marker, Marker};

/// How one rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Code(i32),
    Signal(i32),
}

pub fn signal_name(sig: i32) -> String {
    Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

pub struct Rank {
    pub slot: RankSlot,
    pub host: String,
    /// The process ibrun started: the rank itself, or the remote shell.
    launch_pid: i32,
    /// The rank's own pid (the remote process's for remote ranks, once known).
    pub pid: i32,
    pub remote: bool,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<PipeLines<File>>,
    pub stderr: Option<PipeLines<File>>,
    pub end: Option<End>,
    /// Reported by the remote proxy, more precise than the shell's status.
    pub remote_end: Option<End>,
    pub pmi_initialized: bool,
    pub finalized: bool,
}

/// Why the job is being ended.
#[derive(Debug, Clone)]
pub struct Failure {
    pub exit_code: i32,
}

/// Poller tokens: fixed ones, then one range per kind of descriptor.
const SIGNALS: u64 = 0;
const LISTENER: u64 = 1;
const INPUT: u64 = 2;
const RANK_INPUT: u64 = 3;
const STDOUT_BASE: u64 = 1 << 40;
const STDERR_BASE: u64 = 2 << 40;
const CONN_BASE: u64 = 3 << 40;

/// What ibrun's standard input is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InputWait {
    /// Not forwarded (any more).
    Nothing,
    /// More input to read.
    Input,
    /// Rank 0 to take what was read.
    RankInput,
}

pub struct Job {
    pub ranks: Vec<Rank>,
    server: PmiServer,
    poller: Poller,
    conns: Conns,
    listener: Option<TcpListener>,
    signals: SignalFd,
    sink: OutputSink,
    verbose: bool,
    kill_grace: Duration,
    deadline: Option<(Instant, Duration)>,
    failure: Option<Failure>,
    term_sent_at: Option<Instant>,
    kill_sent: bool,
    all_exited_at: Option<Instant>,
    by_pid: HashMap<i32, usize>,
    /// Ranks not yet reaped.
    running: usize,
    /// Output pipes still open.
    open_pipes: usize,
    /// PMI connections that closed before finalize, by rank: reported once
    /// the rank's exit is known (so that the report names how it ended) or
    /// at the deadline in `closing`, whichever comes first.
    closing_conn: HashMap<usize, ConnId>,
    closing: VecDeque<(usize, Instant)>,
    /// ibrun's own standard input while it is forwarded to rank 0.
    input: Option<File>,
    input_buf: Vec<u8>,
    input_wait: InputWait,
    /// Standard input is a file or device epoll cannot watch (always ready).
    input_unpollable: bool,
    /// The ranks' watchdog states (PMI puts under `HANG_KEY_PREFIX`), for
    /// the one report printed `HANG_COLLECT` after the first wait fired.
    hangs: BTreeMap<usize, String>,
    hang_since: Option<Instant>,
    hang_printed: bool,
}

/// How long ibrun gathers watchdog states after the first before it prints
/// the report: a fired watchdog looks for the states of the ranks it waits
/// for for 2 s, so those that fire too have put theirs by then.
const HANG_COLLECT: Duration = Duration::from_secs(3);

/// Blocks the signals ibrun handles through its signalfd. Must run before any
/// thread or child exists; std resets the mask in children.
pub fn block_signals() -> nix::Result<SignalFd> {
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        mask.add(s);
    }
    mask.thread_block()?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor this process owns; failure leaves it
    // blocking, which the loop tolerates (it only reads after readiness).
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

/// A nonblocking duplicate of ibrun's standard input.
fn dup_stdin() -> Option<File> {
    // SAFETY: dup of descriptor 0 returns a new descriptor (or -1) that
    // nothing else owns, so the File may close it.
    let fd = unsafe { libc::dup(0) };
    if fd < 0 {
        return None;
    }
    set_nonblocking(fd);
    // SAFETY: `fd` is a fresh, valid descriptor owned by nobody else.
    Some(unsafe { File::from_raw_fd(fd) })
}

/// How long a PMI connection that closed before finalize waits for its
/// rank's exit status before it is reported as a plain disconnect.
const CLOSE_WAITS_FOR_EXIT: Duration = Duration::from_secs(1);

/// How long output may still arrive after the last rank exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(1000);

impl Job {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        server: PmiServer,
        listener: Option<TcpListener>,
        signals: SignalFd,
        sink: OutputSink,
        verbose: bool,
        kill_grace: Duration,
        timeout: Option<Duration>,
    ) -> std::io::Result<Job> {
        let poller = Poller::new()?;
        poller.add(&signals, SIGNALS, Interest::Read)?;
        if let Some(l) = &listener {
            l.set_nonblocking(true)?;
            poller.add(l, LISTENER, Interest::Read)?;
        }
        Ok(Job {
            ranks: Vec::new(),
            server,
            poller,
            conns: Conns::new(CONN_BASE),
            listener,
            signals,
            sink,
            verbose,
            kill_grace,
            deadline: timeout.map(|t| (Instant::now() + t, t)),
            failure: None,
            term_sent_at: None,
            kill_sent: false,
            all_exited_at: None,
            by_pid: HashMap::new(),
            running: 0,
            open_pipes: 0,
            closing_conn: HashMap::new(),
            closing: VecDeque::new(),
            input: dup_stdin(),
            input_buf: Vec::new(),
            input_wait: InputWait::Nothing,
            input_unpollable: false,
            hangs: BTreeMap::new(),
            hang_since: None,
            hang_printed: false,
        })
    }

    /// Adds a started rank, with ibrun's end of its PMI socket if local.
    /// The rank is tracked (and will be ended with the job) even when
    /// watching one of its descriptors fails; the error is returned.
    pub fn add_rank(
        &mut self,
        slot: RankSlot,
        host: String,
        mut child: Child,
        pmi: Option<OwnedFd>,
    ) -> std::io::Result<()> {
        let idx = self.ranks.len();
        debug_assert_eq!(idx, slot.rank);
        let remote = slot.host.is_some();
        let pid = child.id() as i32;
        self.by_pid.insert(pid, idx);
        self.running += 1;
        let mut result = Ok(());
        if let Some(fd) = pmi {
            match self
                .conns
                .add(&self.poller, Stream::Unix(UnixStream::from(fd)))
            {
                Ok(id) => self.server.add_conn(id, Some(slot.rank)),
                Err(e) => result = Err(e),
            }
        }
        let mut pipe = |fd: OwnedFd, base: u64| {
            set_nonblocking(fd.as_raw_fd());
            match self.poller.add(&fd, base + idx as u64, Interest::Read) {
                Ok(()) => {
                    self.open_pipes += 1;
                    Some(PipeLines::new(File::from(fd)))
                }
                Err(e) => {
                    result = Err(e);
                    None
                }
            }
        };
        let stdout = child
            .stdout
            .take()
            .and_then(|p| pipe(p.into(), STDOUT_BASE));
        let stderr = child
            .stderr
            .take()
            .and_then(|p| pipe(p.into(), STDERR_BASE));
        let stdin = child.stdin.take();
        if let Some(p) = &stdin {
            set_nonblocking(p.as_raw_fd());
        }
        self.ranks.push(Rank {
            slot,
            host,
            launch_pid: pid,
            pid,
            remote,
            stdin,
            stdout,
            stderr,
            end: None,
            remote_end: None,
            pmi_initialized: false,
            finalized: false,
        });
        result
    }

    fn log(&self, msg: &str) {
        self.sink.diag(msg);
    }

    fn describe(&self, rank: usize) -> String {
        let r = &self.ranks[rank];
        format!("rank {} (host {}, pid {})", rank, r.host, r.pid)
    }

    /// Prints the watchdog report once: every rank's state, identical ones
    /// grouped (see `hang_report`).
    fn print_hangs(&mut self) {
        if self.hang_printed || self.hang_since.is_none() {
            return;
        }
        self.hang_printed = true;
        let ranks = &self.ranks;
        let lines = hang_report::lines(ranks.len(), &self.hangs, |r| match &ranks[r] {
            x if x.finalized => "finalized".into(),
            Rank {
                end: Some(End::Code(c)),
                ..
            } => format!("exited with status {c}"),
            Rank {
                end: Some(End::Signal(g)),
                ..
            } => format!("killed by {}", signal_name(*g)),
            _ => "not waiting in ibcoll (in user code, or stuck outside ibcoll)".into(),
        });
        self.log("watchdog report (IBCOLL_HANG_TIMEOUT), what each rank does:");
        for l in lines {
            self.log(&format!("  {l}"));
        }
    }

    fn running(&self) -> impl Iterator<Item = &Rank> {
        self.ranks.iter().filter(|r| r.end.is_none())
    }

    /// Starts ending the job: TERM now, KILL after the grace period.
    fn fail(&mut self, message: String, exit_code: i32) {
        if self.failure.is_some() {
            return;
        }
        let text = if self.running > 0 {
            format!(
                "{message}; terminating the job ({} rank(s) still running)",
                self.running
            )
        } else {
            message
        };
        self.log(&text);
        self.failure = Some(Failure {
            exit_code: if exit_code == 0 { 1 } else { exit_code },
        });
        self.server.stop_notifying();
        self.signal_all(Signal::SIGTERM);
        self.term_sent_at = Some(Instant::now());
    }

    fn signal_all(&mut self, sig: Signal) {
        for r in self.ranks.iter_mut().filter(|r| r.end.is_none()) {
            // Each rank leads its own process group, so the signal reaches
            // whatever it started too (and the remote shell for remote ranks).
            let _ = killpg(Pid::from_raw(r.launch_pid), sig);
            if r.remote && sig == Signal::SIGKILL {
                // Closing the pipe tells the remote proxy to end its rank.
                r.stdin = None;
            }
        }
    }

    /// Runs until every rank has ended; returns the job's exit status.
    pub fn run(&mut self) -> i32 {
        let mut buf = vec![0u8; 64 * 1024];
        self.start_input();
        self.reap();
        while !self.finished() {
            let busy = self.pump_unpollable_input(&mut buf);
            let timeout = if busy {
                Some(Duration::ZERO)
            } else {
                self.next_timer()
            };
            let ready = match self.poller.wait(timeout) {
                Ok(r) => r,
                Err(e) => {
                    self.log(&format!("epoll failed: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            for ev in ready {
                self.dispatch(ev, &mut buf);
            }
            self.check_clock();
        }
        // A job that ended before the report was due still gets it.
        self.print_hangs();
        self.sink.flush();
        self.exit_status()
    }

    fn dispatch(&mut self, ev: Ready, buf: &mut [u8]) {
        match ev.token {
            SIGNALS => self.on_signals(),
            LISTENER => self.on_accept(),
            INPUT => self.on_input(buf),
            RANK_INPUT => {
                self.flush_input();
                self.watch_input();
            }
            t if t >= CONN_BASE => {
                if let Some(id) = self.conns.id_of(t) {
                    self.on_conn(id, ev, buf);
                }
            }
            t if t >= STDERR_BASE => self.on_output((t - STDERR_BASE) as usize, true, buf),
            t if t >= STDOUT_BASE => self.on_output((t - STDOUT_BASE) as usize, false, buf),
            _ => {}
        }
    }

    /// The nearest deadline: the job's timeout, the kill after the grace
    /// period, the end of draining output, a closed connection's wait.
    fn next_timer(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let (Some((d, _)), None) = (self.deadline, &self.failure) {
            consider(d);
        }
        if let (Some(t), false) = (self.term_sent_at, self.kill_sent) {
            consider(t + self.kill_grace);
        }
        if let Some(t) = self.all_exited_at {
            consider(t + DRAIN_AFTER_EXIT);
        }
        if let Some(&(_, t)) = self.closing.front() {
            consider(t);
        }
        if let (Some(t), false) = (self.hang_since, self.hang_printed) {
            consider(t + HANG_COLLECT);
        }
        next.map(|t| t.saturating_duration_since(now))
    }

    fn on_signals(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            let sig = info.ssi_signo as i32;
            match Signal::try_from(sig) {
                Ok(Signal::SIGCHLD) => self.reap(),
                Ok(s @ (Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP)) => {
                    if self.failure.is_some() {
                        // A second interrupt while ending: no more grace.
                        self.signal_all(Signal::SIGKILL);
                        self.kill_sent = true;
                        continue;
                    }
                    self.log(&format!(
                        "received {}; forwarding it to {} rank(s)",
                        s.as_str(),
                        self.running
                    ));
                    self.signal_all(s);
                    self.failure = Some(Failure {
                        exit_code: 128 + sig,
                    });
                    self.server.stop_notifying();
                    self.term_sent_at = Some(Instant::now());
                }
                _ => {}
            }
        }
    }

    /// Begins forwarding ibrun's standard input to a local rank 0.
    fn start_input(&mut self) {
        let forward = self
            .ranks
            .first()
            .is_some_and(|r| !r.remote && r.stdin.is_some());
        if !forward {
            self.input = None;
        }
        self.watch_input();
    }

    /// Watches whichever side of the forwarding is due: ibrun's input while
    /// nothing is buffered, rank 0's pipe while something is (backpressure).
    fn watch_input(&mut self) {
        let rank0 = self.ranks.first().and_then(|r| r.stdin.as_ref());
        let want = match (rank0, &self.input, self.input_buf.is_empty()) {
            (None, _, _) => InputWait::Nothing,
            (Some(_), _, false) => InputWait::RankInput,
            (Some(_), Some(_), true) => InputWait::Input,
            (Some(_), None, true) => InputWait::Nothing,
        };
        if want == self.input_wait {
            return;
        }
        match self.input_wait {
            InputWait::Input if !self.input_unpollable => {
                if let Some(i) = &self.input {
                    self.poller.remove(i);
                }
            }
            InputWait::RankInput => {
                if let Some(p) = rank0 {
                    self.poller.remove(p);
                }
            }
            _ => {}
        }
        self.input_wait = want;
        match want {
            InputWait::Input if !self.input_unpollable => {
                if let Some(i) = &self.input {
                    if self.poller.add(i, INPUT, Interest::Read).is_err() {
                        // A regular file or /dev/null: always ready, read
                        // it between waits instead.
                        self.input_unpollable = true;
                    }
                }
            }
            InputWait::RankInput => {
                if let Some(p) = rank0 {
                    let _ = self.poller.add(p, RANK_INPUT, Interest::Write);
                }
            }
            _ => {}
        }
    }

    /// Reads an input that epoll cannot watch; true while more is ready.
    fn pump_unpollable_input(&mut self, buf: &mut [u8]) -> bool {
        for _ in 0..16 {
            if !(self.input_unpollable && self.input_wait == InputWait::Input) {
                return false;
            }
            self.on_input(buf);
        }
        self.input_unpollable && self.input_wait == InputWait::Input
    }

    fn on_input(&mut self, buf: &mut [u8]) {
        let Some(input) = self.input.as_mut() else {
            return;
        };
        match input.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => {
                // End of ibrun's input: rank 0 sees end of file too.
                if self.input_wait == InputWait::Input && !self.input_unpollable {
                    self.poller.remove(input);
                    self.input_wait = InputWait::Nothing;
                }
                self.input = None;
                if self.input_buf.is_empty() {
                    self.close_rank0_input();
                }
            }
            Ok(n) => {
                self.input_buf.extend_from_slice(&buf[..n]);
                self.flush_input();
            }
        }
        self.watch_input();
    }

    fn close_rank0_input(&mut self) {
        if self.input_wait == InputWait::RankInput {
            if let Some(p) = self.ranks.first().and_then(|r| r.stdin.as_ref()) {
                self.poller.remove(p);
            }
            self.input_wait = InputWait::Nothing;
        }
        if let Some(r) = self.ranks.first_mut() {
            r.stdin = None;
        }
    }

    fn flush_input(&mut self) {
        let Some(pipe) = self.ranks.first_mut().and_then(|r| r.stdin.as_mut()) else {
            self.input_buf.clear();
            return;
        };
        while !self.input_buf.is_empty() {
            match pipe.write(&self.input_buf) {
                Ok(n) if n > 0 => {
                    self.input_buf.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ => {
                    // Rank 0 closed its input: drop what it will never read.
                    self.input_buf.clear();
                    if let (Some(i), InputWait::Input, false) =
                        (&self.input, self.input_wait, self.input_unpollable)
                    {
                        self.poller.remove(i);
                        self.input_wait = InputWait::Nothing;
                    }
                    self.input = None;
                    self.close_rank0_input();
                    return;
                }
            }
        }
        if self.input.is_none() {
            self.close_rank0_input();
        }
    }

    fn on_accept(&mut self) {
        let Some(l) = &self.listener else { return };
        let mut accepted = Vec::new();
        while let Ok(c) = l.accept() {
            accepted.push(c);
        }
        for (s, peer) in accepted {
            match self.conns.add(&self.poller, Stream::Tcp(s)) {
                Ok(id) => {
                    self.server.add_conn(id, None);
                    if self.verbose {
                        self.log(&format!("PMI connection {id} from {peer}"));
                    }
                }
                Err(e) => self.log(&format!("PMI connection from {peer} refused: {e}")),
            }
        }
    }

    fn on_conn(&mut self, id: ConnId, ev: Ready, buf: &mut [u8]) {
        if ev.writable {
            self.conns.flush(&self.poller, id);
        }
        if !(ev.readable || ev.closed) {
            return;
        }
        let got = self.conns.read(id, buf);
        for line in got.lines {
            let actions = match line {
                Ok(l) => {
                    if self.verbose {
                        self.log(&format!(
                            "PMI {}: {}",
                            self.conn_name(id),
                            String::from_utf8_lossy(&l)
                        ));
                    }
                    if l.starts_with(b"cmd=init ") {
                        if let Some(r) = self.server.rank_of(id) {
                            if let Some(rank) = self.ranks.get_mut(r) {
                                rank.pmi_initialized = true;
                            }
                        }
                    }
                    self.server.handle_line(id, &l)
                }
                Err(e) => {
                    vec![Action::Log(format!(
                        "PMI: {}: {e}; closing it",
                        self.conn_name(id)
                    ))]
                }
            };
            self.apply(actions);
        }
        if got.closed {
            self.conns.remove(&self.poller, id);
            // A rank's PMI socket closes because the rank is dying. Report
            // that death, with how it ended, before the server tells the
            // others their barrier failed, or their error exits would be
            // blamed instead: wait (in the loop) for its exit status.
            let unfinished = self.server.rank_of(id).filter(|&r| {
                self.ranks
                    .get(r)
                    .is_some_and(|x| !x.finalized && x.end.is_none())
            });
            match unfinished {
                Some(r) => {
                    self.closing_conn.insert(r, id);
                    self.closing
                        .push_back((r, Instant::now() + CLOSE_WAITS_FOR_EXIT));
                }
                None => {
                    let actions = self.server.remove_conn(id);
                    self.apply(actions);
                }
            }
        }
    }

    fn conn_name(&self, id: ConnId) -> String {
        match self.server.rank_of(id) {
            Some(r) => format!("rank {r}"),
            None => format!("connection {id}"),
        }
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Reply(id, text) => self.conns.send(&self.poller, id, text.as_bytes()),
                Action::Log(msg) => self.log(&msg),
                Action::Finalized(r) => {
                    if let Some(rank) = self.ranks.get_mut(r) {
                        rank.finalized = true;
                    }
                }
                Action::Hang { rank, state } => {
                    if self.hang_printed {
                        continue;
                    }
                    if hang_report::is_wait(&state) && self.hang_since.is_none() {
                        self.hang_since = Some(Instant::now());
                    }
                    self.hangs.insert(rank, state);
                }
                Action::Abort {
                    rank,
                    exit_code,
                    mut message,
                } => {
                    if message.starts_with("ibcoll watchdog:") && self.hang_since.is_some() {
                        // The job's report instead of this rank's alone.
                        self.print_hangs();
                        if let Some(i) = message.find(" s: ") {
                            message.truncate(i + 2);
                            message.push_str(" (watchdog report above)");
                        }
                    }
                    let who = rank
                        .filter(|&r| r < self.ranks.len())
                        .map_or_else(|| "an unidentified rank".to_string(), |r| self.describe(r));
                    let msg = if message.is_empty() {
                        format!("{who} called abort with exit code {exit_code}")
                    } else {
                        format!("{who} called abort with exit code {exit_code}: {message}")
                    };
                    self.fail(msg, exit_code);
                }
            }
        }
    }

    fn on_output(&mut self, i: usize, is_err: bool, buf: &mut [u8]) {
        let Some(rank) = self.ranks.get_mut(i) else {
            return;
        };
        let pipe = if is_err {
            &mut rank.stderr
        } else {
            &mut rank.stdout
        };
        let Some(p) = pipe.as_mut() else { return };
        let (lines, eof) = p.read_lines(buf);
        if eof {
            if let Some(p) = pipe.take() {
                self.poller.remove(p.fd());
            }
            self.open_pipes -= 1;
        }
        let remote = rank.remote;
        for line in &lines {
            if remote && is_err {
                if let Some((before, marker)) = parse_marker(line) {
                    if !before.is_empty() {
                        self.sink.line(i, true, before);
                    }
                    match marker {
                        Marker::Pid(pid) => self.ranks[i].pid = pid,
                        Marker::Ended(end) => self.ranks[i].remote_end = Some(end),
                    }
                    continue;
                }
            }
            self.sink.line(i, is_err, line);
        }
    }

    /// Collects every child that has ended (each SIGCHLD may stand for
    /// several), then handles each.
    fn reap(&mut self) {
        let mut ended = Vec::new();
        loop {
            let end = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, End::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, End::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            };
            if let Some(i) = self.by_pid.remove(&end.0.as_raw()) {
                ended.push((i, end.1));
            }
        }
        for (i, end) in ended {
            self.rank_ended(i, end);
        }
    }

    fn rank_ended(&mut self, i: usize, end: End) {
        self.ranks[i].end = Some(end);
        self.running -= 1;
        // The proxy's report arrives on stderr just before it exits; read
        // what is left so that we see it.
        if self.ranks[i].remote {
            let mut buf = vec![0u8; 4096];
            self.on_output(i, true, &mut buf);
        }
        let r = &self.ranks[i];
        let end = r.remote_end.unwrap_or(end);
        let how = match end {
            End::Code(0) if r.pmi_initialized && !r.finalized => Some((
                "exited with status 0 without calling PMI finalize".to_string(),
                1,
            )),
            End::Code(0) => None,
            End::Code(c) if r.remote && r.remote_end.is_none() => Some((
                format!("ended with status {c} of the remote shell (no report from the proxy)"),
                c,
            )),
            End::Code(c) => Some((format!("exited with status {c}"), c)),
            End::Signal(s) => Some((
                format!("was killed by signal {s} ({})", signal_name(s)),
                128 + s,
            )),
        };
        if let Some((how, code)) = how {
            if self.failure.is_none() {
                // Survivors that asked are told first (and their barriers
                // fail), then TERM follows. Deaths after that are the job's
                // own ending and are not announced one by one.
                let actions = self.server.rank_ended(i, &how);
                self.apply(actions);
                let msg = format!("{} {how}", self.describe(i));
                self.fail(msg, code);
            } else if self.verbose {
                self.log(&format!("{} {how}", self.describe(i)));
            }
        }
        if let Some(id) = self.closing_conn.remove(&i) {
            let actions = self.server.remove_conn(id);
            self.apply(actions);
        }
        if self.running == 0 && self.all_exited_at.is_none() {
            self.all_exited_at = Some(Instant::now());
        }
    }

    fn check_clock(&mut self) {
        let now = Instant::now();
        if self.hang_since.is_some_and(|t| now >= t + HANG_COLLECT) {
            self.print_hangs();
        }
        if let (Some((d, t)), None) = (self.deadline, &self.failure) {
            if now >= d {
                let still: Vec<String> = self
                    .running()
                    .map(|r| format!("rank {} (host {}, pid {})", r.slot.rank, r.host, r.pid))
                    .collect();
                let msg = format!(
                    "job timed out after {:.1} s (--timeout) with {} of {} rank(s) still running: {}",
                    t.as_secs_f64(),
                    still.len(),
                    self.ranks.len(),
                    still.join(", ")
                );
                self.fail(msg, 124);
            }
        }
        if let (Some(t), false) = (self.term_sent_at, self.kill_sent) {
            if now >= t + self.kill_grace && self.running > 0 {
                if self.verbose {
                    self.log("grace period over; sending SIGKILL");
                }
                self.signal_all(Signal::SIGKILL);
                self.kill_sent = true;
            }
        }
        while let Some(&(r, t)) = self.closing.front() {
            if now < t {
                break;
            }
            self.closing.pop_front();
            // No exit status in time: report the plain disconnect.
            if let Some(id) = self.closing_conn.remove(&r) {
                let actions = self.server.remove_conn(id);
                self.apply(actions);
            }
        }
    }

    fn finished(&mut self) -> bool {
        let Some(t) = self.all_exited_at else {
            return false;
        };
        if self.open_pipes == 0 {
            return true;
        }
        if Instant::now() >= t + DRAIN_AFTER_EXIT {
            // Something the ranks started still holds their output open; do
            // not let it keep the job alive.
            for r in &mut self.ranks {
                if let Some(p) = r.stdout.take() {
                    for l in p.finish() {
                        self.sink.line(r.slot.rank, false, &l);
                    }
                }
                if let Some(p) = r.stderr.take() {
                    for l in p.finish() {
                        self.sink.line(r.slot.rank, true, &l);
                    }
                }
            }
            self.open_pipes = 0;
            return true;
        }
        false
    }

    fn exit_status(&self) -> i32 {
        match &self.failure {
            Some(f) => f.exit_code,
            None => 0,
        }
    }

    /// A rank could not be started: end the ones that were.
    pub fn abort_start(&mut self, message: &str) {
        self.fail(message.to_string(), 127);
        if self.running == 0 {
            self.all_exited_at = Some(Instant::now());
        }
    }
}
