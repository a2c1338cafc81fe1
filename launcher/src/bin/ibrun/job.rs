//! The running job: one poll loop over the PMI connections, the ranks' output
//! pipes, signals and the clock. It carries out the PMI server's actions and
//! ends the whole job when one rank fails.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

use ibcoll_launcher::server::{Action, ConnId, PmiServer};
use ibcoll_launcher::wire::LineBuffer;

use crate::output::{OutputSink, PipeLines};
use crate::plan::RankSlot;
use crate::proxy::{parse_marker, Marker};

/// How one rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Code(i32),
    Signal(i32),
}

impl End {
    fn from_status(s: std::process::ExitStatus) -> End {
        match (s.code(), s.signal()) {
            (Some(c), _) => End::Code(c),
            (None, Some(sig)) => End::Signal(sig),
            _ => End::Code(1),
        }
    }
}

pub fn signal_name(sig: i32) -> String {
    Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

pub struct Rank {
    pub slot: RankSlot,
    pub host: String,
    pub child: Child,
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

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn raw(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
}

struct Conn {
    stream: Stream,
    lines: LineBuffer,
    pending: Vec<u8>,
}

/// Why the job is being ended.
#[derive(Debug, Clone)]
pub struct Failure {
    pub exit_code: i32,
}

pub struct Job {
    pub ranks: Vec<Rank>,
    server: PmiServer,
    conns: HashMap<ConnId, Conn>,
    next_conn: ConnId,
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
    /// ibrun's own standard input while it is forwarded to rank 0.
    input: Option<File>,
    input_buf: Vec<u8>,
}

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
    // blocking, which the poll loop tolerates (it only reads after POLLIN).
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

#[derive(Clone, Copy)]
enum Source {
    Input,
    RankInput,
    Signals,
    Listener,
    Conn(ConnId),
    Stdout(usize),
    Stderr(usize),
}

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
    ) -> Job {
        if let Some(l) = &listener {
            let _ = l.set_nonblocking(true);
        }
        Job {
            ranks: Vec::new(),
            server,
            conns: HashMap::new(),
            next_conn: 0,
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
            input: dup_stdin(),
            input_buf: Vec::new(),
        }
    }

    /// Adds a started rank, with ibrun's end of its PMI socket if local.
    pub fn add_rank(
        &mut self,
        slot: RankSlot,
        host: String,
        mut child: Child,
        pmi: Option<OwnedFd>,
    ) {
        let idx = self.ranks.len();
        let remote = slot.host.is_some();
        if let Some(fd) = pmi {
            let s = UnixStream::from(fd);
            let _ = s.set_nonblocking(true);
            let id = self.new_conn(Stream::Unix(s));
            self.server.add_conn(id, Some(slot.rank));
        }
        let pipe = |fd: OwnedFd| {
            set_nonblocking(fd.as_raw_fd());
            PipeLines::new(File::from(fd))
        };
        let stdout = child.stdout.take().map(|p| pipe(p.into()));
        let stderr = child.stderr.take().map(|p| pipe(p.into()));
        let stdin = child.stdin.take();
        if let Some(p) = &stdin {
            set_nonblocking(p.as_raw_fd());
        }
        let pid = child.id() as i32;
        debug_assert_eq!(idx, slot.rank);
        self.ranks.push(Rank {
            slot,
            host,
            child,
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
    }

    fn new_conn(&mut self, stream: Stream) -> ConnId {
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(
            id,
            Conn {
                stream,
                lines: LineBuffer::new(),
                pending: Vec::new(),
            },
        );
        id
    }

    fn log(&self, msg: &str) {
        self.sink.diag(msg);
    }

    fn describe(&self, rank: usize) -> String {
        let r = &self.ranks[rank];
        format!("rank {} (host {}, pid {})", rank, r.host, r.pid)
    }

    fn running(&self) -> impl Iterator<Item = &Rank> {
        self.ranks.iter().filter(|r| r.end.is_none())
    }

    /// Starts ending the job: TERM now, KILL after the grace period.
    fn fail(&mut self, message: String, exit_code: i32) {
        if self.failure.is_some() {
            return;
        }
        let others = self.running().count();
        let text = if others > 0 {
            format!("{message}; terminating the job ({others} rank(s) still running)")
        } else {
            message
        };
        self.log(&text);
        self.failure = Some(Failure {
            exit_code: if exit_code == 0 { 1 } else { exit_code },
        });
        self.signal_all(Signal::SIGTERM);
        self.term_sent_at = Some(Instant::now());
    }

    fn signal_all(&mut self, sig: Signal) {
        for r in self.ranks.iter_mut().filter(|r| r.end.is_none()) {
            // Each rank leads its own process group, so the signal reaches
            // whatever it started too (and the remote shell for remote ranks).
            let _ = killpg(Pid::from_raw(r.child.id() as i32), sig);
            if r.remote && sig == Signal::SIGKILL {
                // Closing the pipe tells the remote proxy to end its rank.
                r.stdin = None;
            }
        }
    }

    /// Runs until every rank has ended; returns the job's exit status.
    pub fn run(&mut self) -> i32 {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            self.reap();
            if self.finished() {
                break;
            }
            let (mut fds, sources) = self.poll_set();
            let timeout_ms = self.poll_timeout();
            // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd
            // whose length is passed alongside; the descriptors stay open for
            // the duration of the call since nothing else runs meanwhile.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    self.log(&format!("poll failed: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for (pfd, src) in fds.iter().zip(sources) {
                if pfd.revents == 0 {
                    continue;
                }
                match src {
                    Source::Signals => self.on_signals(),
                    Source::Input => self.on_input(&mut buf),
                    Source::RankInput => self.flush_input(),
                    Source::Listener => self.on_accept(),
                    Source::Conn(id) => self.on_conn(id, pfd.revents, &mut buf),
                    Source::Stdout(i) => self.on_output(i, false, &mut buf),
                    Source::Stderr(i) => self.on_output(i, true, &mut buf),
                }
            }
            self.check_clock();
        }
        self.sink.flush();
        self.exit_status()
    }

    fn poll_set(&self) -> (Vec<libc::pollfd>, Vec<Source>) {
        let mut fds = Vec::new();
        let mut src = Vec::new();
        let mut add = |fd: RawFd, events: i16, s: Source| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            src.push(s);
        };
        add(self.signals.as_raw_fd(), libc::POLLIN, Source::Signals);
        if let Some(l) = &self.listener {
            add(l.as_raw_fd(), libc::POLLIN, Source::Listener);
        }
        if let Some(rank0) = self
            .ranks
            .first()
            .and_then(|r| r.stdin.as_ref())
            .filter(|_| !self.ranks[0].remote)
        {
            // Read more only once what was read reached rank 0 (backpressure).
            match (&self.input, self.input_buf.is_empty()) {
                (Some(i), true) => add(i.as_raw_fd(), libc::POLLIN, Source::Input),
                (_, false) => add(rank0.as_raw_fd(), libc::POLLOUT, Source::RankInput),
                _ => {}
            }
        }
        for (&id, c) in &self.conns {
            let mut ev = libc::POLLIN;
            if !c.pending.is_empty() {
                ev |= libc::POLLOUT;
            }
            add(c.stream.raw(), ev, Source::Conn(id));
        }
        for (i, r) in self.ranks.iter().enumerate() {
            if let Some(p) = &r.stdout {
                add(p.raw(), libc::POLLIN, Source::Stdout(i));
            }
            if let Some(p) = &r.stderr {
                add(p.raw(), libc::POLLIN, Source::Stderr(i));
            }
        }
        (fds, src)
    }

    fn poll_timeout(&self) -> i32 {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let Some((d, _)) = self.deadline {
            if self.failure.is_none() {
                consider(d);
            }
        }
        if let (Some(t), false) = (self.term_sent_at, self.kill_sent) {
            consider(t + self.kill_grace);
        }
        if let Some(t) = self.all_exited_at {
            consider(t + DRAIN_AFTER_EXIT);
        }
        // Children are reaped on SIGCHLD, but a periodic look costs nothing
        // and covers a coalesced or lost notification.
        consider(now + Duration::from_millis(500));
        next.map_or(-1, |t| {
            t.saturating_duration_since(now)
                .as_millis()
                .min(i32::MAX as u128) as i32
                + 1
        })
    }

    fn on_signals(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            let sig = info.ssi_signo as i32;
            match Signal::try_from(sig) {
                Ok(Signal::SIGCHLD) | Ok(Signal::SIGPIPE) => {}
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
                        self.running().count()
                    ));
                    self.signal_all(s);
                    self.failure = Some(Failure {
                        exit_code: 128 + sig,
                    });
                    self.term_sent_at = Some(Instant::now());
                }
                _ => {}
            }
        }
    }

    fn on_input(&mut self, buf: &mut [u8]) {
        let Some(input) = self.input.as_mut() else {
            return;
        };
        match input.read(buf) {
            Ok(0) | Err(_) => {
                // End of ibrun's input: rank 0 sees end of file too.
                self.input = None;
                if self.input_buf.is_empty() {
                    self.ranks[0].stdin = None;
                }
            }
            Ok(n) => {
                self.input_buf.extend_from_slice(&buf[..n]);
                self.flush_input();
            }
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
                    self.input = None;
                    self.ranks[0].stdin = None;
                    return;
                }
            }
        }
        if self.input.is_none() {
            self.ranks[0].stdin = None;
        }
    }

    fn on_accept(&mut self) {
        let Some(l) = &self.listener else { return };
        let mut accepted = Vec::new();
        while let Ok(c) = l.accept() {
            accepted.push(c);
        }
        for (s, peer) in accepted {
            let _ = s.set_nonblocking(true);
            let _ = s.set_nodelay(true);
            let id = self.new_conn(Stream::Tcp(s));
            self.server.add_conn(id, None);
            if self.verbose {
                self.log(&format!("PMI connection {id} from {peer}"));
            }
        }
    }

    fn on_conn(&mut self, id: ConnId, revents: i16, buf: &mut [u8]) {
        if revents & libc::POLLOUT != 0 {
            self.flush_conn(id);
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
            return;
        }
        let mut closed = false;
        let mut lines = Vec::new();
        if let Some(c) = self.conns.get_mut(&id) {
            loop {
                match c.stream.read(buf) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => c.lines.extend(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            }
            loop {
                match c.lines.next_line() {
                    Ok(Some(l)) => lines.push(Ok(l)),
                    Ok(None) => break,
                    Err(e) => lines.push(Err(e)),
                }
            }
        }
        for line in lines {
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
                            self.ranks[r].pmi_initialized = true;
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
        if closed {
            // A rank's PMI socket closes because the rank is dying. Report
            // that death before the server tells the others their barrier
            // failed, or their error exits would be blamed instead.
            if let Some(r) = self
                .server
                .rank_of(id)
                .filter(|&r| !self.ranks[r].finalized)
            {
                let until = Instant::now() + Duration::from_secs(1);
                while Instant::now() < until {
                    if matches!(self.ranks[r].child.try_wait(), Ok(Some(_)) | Err(_)) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                self.reap();
            }
            let actions = self.server.remove_conn(id);
            self.apply(actions);
            self.conns.remove(&id);
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
                Action::Reply(id, text) => {
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.pending.extend_from_slice(text.as_bytes());
                    }
                    self.flush_conn(id);
                }
                Action::Log(msg) => self.log(&msg),
                Action::Finalized(r) => {
                    if let Some(rank) = self.ranks.get_mut(r) {
                        rank.finalized = true;
                    }
                }
                Action::Abort {
                    rank,
                    exit_code,
                    message,
                } => {
                    let who = rank
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

    fn flush_conn(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        while !c.pending.is_empty() {
            match c.stream.write(&c.pending) {
                Ok(0) => break,
                Ok(n) => {
                    c.pending.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // The rank is gone; its exit status tells the story.
                    c.pending.clear();
                    break;
                }
            }
        }
    }

    fn on_output(&mut self, i: usize, is_err: bool, buf: &mut [u8]) {
        let rank = &mut self.ranks[i];
        let pipe = if is_err {
            &mut rank.stderr
        } else {
            &mut rank.stdout
        };
        let Some(p) = pipe.as_mut() else { return };
        let (lines, eof) = p.read_lines(buf);
        if eof {
            *pipe = None;
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

    fn reap(&mut self) {
        let mut ended = Vec::new();
        for (i, r) in self.ranks.iter_mut().enumerate() {
            if r.end.is_some() {
                continue;
            }
            if let Ok(Some(status)) = r.child.try_wait() {
                let end = End::from_status(status);
                r.end = Some(end);
                ended.push(i);
            }
        }
        for i in ended {
            // The proxy's report arrives on stderr just before it exits; read
            // what is left so that we see it.
            if self.ranks[i].remote {
                let mut buf = vec![0u8; 4096];
                self.on_output(i, true, &mut buf);
            }
            let r = &self.ranks[i];
            let end = r.remote_end.or(r.end).unwrap_or(End::Code(1));
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
                    let msg = format!("{} {how}", self.describe(i));
                    self.fail(msg, code);
                } else if self.verbose {
                    self.log(&format!("{} {how}", self.describe(i)));
                }
            }
        }
        if self.all_exited_at.is_none() && self.ranks.iter().all(|r| r.end.is_some()) {
            self.all_exited_at = Some(Instant::now());
        }
    }

    fn check_clock(&mut self) {
        let now = Instant::now();
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
            if now >= t + self.kill_grace && self.running().count() > 0 {
                if self.verbose {
                    self.log("grace period over; sending SIGKILL");
                }
                self.signal_all(Signal::SIGKILL);
                self.kill_sent = true;
            }
        }
    }

    fn finished(&mut self) -> bool {
        let Some(t) = self.all_exited_at else {
            return false;
        };
        let pipes_open = self
            .ranks
            .iter()
            .any(|r| r.stdout.is_some() || r.stderr.is_some());
        if !pipes_open {
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
        if self.ranks.is_empty() {
            self.all_exited_at = Some(Instant::now());
        }
    }
}

/// How long output may still arrive after the last rank exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(1000);
