//! Tcp connections on first use: dialing a peer, answering a peer that
//! dials, and deciding which connection a pair keeps when both dial at
//! once.
//!
//! The dialer connects (nonblocking) to each published address of the peer
//! in turn, sends a [`Hello`] (magic, job key, its rank), and waits for one
//! reply byte: [`ACCEPT`] (the connection is the pair's channel from now
//! on; only then may data flow on it) or [`REJECT`]. The acceptor rejects
//! a hello when it already has a channel to that peer, or when it is
//! dialing the peer itself and has the lower rank: of two simultaneous
//! first contacts the lower rank's connection wins, and the higher rank
//! waits for it (its own dial is rejected, so it never sends data on it).
//! Everything is nonblocking and bounded: a dial that reaches no listener
//! within `IBCOLL_PEER_TIMEOUT_MS` fails naming every address tried, and an
//! accepted socket that sends no hello within it is closed. A connected
//! dial waits for its reply as long as the peer is alive (it answers when
//! it next enters the library; keepalive ends the wait if its host goes).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const MAGIC: u32 = 0x1bc0_7c91;
/// Bytes of a hello: magic, job key, rank.
pub(crate) const HELLO_LEN: usize = 16;
/// Reply: the connection is the pair's channel.
pub(crate) const ACCEPT: u8 = 0xA5;
/// Reply: it is not (the pair has or will have another one).
pub(crate) const REJECT: u8 = 0x5A;

/// What a dialer says first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Distinguishes jobs that happen to reuse a port.
    pub job: u64,
    pub rank: u32,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..12].copy_from_slice(&self.job.to_le_bytes());
        b[12..].copy_from_slice(&self.rank.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        (magic == MAGIC).then(|| Hello {
            job: u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")),
            rank: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }
}

/// A key for the job, from its id (FNV-1a, the same in every process).
pub(crate) fn job_key(job: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

enum Stage {
    /// Nonblocking connect to `addrs[next]` in progress.
    Connecting(Socket),
    /// Connected; `sent` bytes of the hello written.
    Hello(TcpStream, usize),
    /// Waiting for the reply byte.
    Reply(TcpStream),
    /// Between attempts (some address did not answer in time, or failed
    /// otherwise than by a refusal), retrying until the deadline.
    Backoff(Instant),
}

/// What a [`Dial::step`] came to.
pub(crate) enum DialStep {
    /// Not yet; wait for the socket ([`Dial::fd`]) or the next step.
    Pending,
    /// The pair's channel.
    Accepted(TcpStream),
    /// The peer keeps another connection (its own dial to us wins).
    Rejected,
    /// No connection within the bound: every address tried and why.
    Failed(String),
}

/// This rank dialing a peer.
pub(crate) struct Dial {
    addrs: Vec<SocketAddr>,
    next: usize,
    stage: Option<Stage>,
    hello: [u8; HELLO_LEN],
    deadline: Instant,
    attempt: Duration,
    attempt_end: Instant,
    /// Keepalive bound on a connected dial (the peer's host vanishing).
    keepalive: Duration,
    tried: Vec<String>,
    /// Addresses of the current round that refused the connection.
    refused: usize,
}

impl Dial {
    /// Starts dialing `addrs` (in order) with `hello`, giving up after
    /// `timeout`.
    pub fn new(addrs: Vec<SocketAddr>, hello: Hello, timeout: Duration) -> Dial {
        let now = Instant::now();
        let mut d = Dial {
            addrs,
            next: 0,
            stage: None,
            hello: hello.encode(),
            deadline: now + timeout,
            // One address may not hold up the others for long.
            attempt: (timeout / 4).max(Duration::from_millis(200)),
            attempt_end: now,
            keepalive: timeout,
            tried: Vec::new(),
            refused: 0,
        };
        d.start();
        d
    }

    /// The socket to wait on, if any.
    pub fn fd(&self) -> Option<RawFd> {
        match self.stage.as_ref()? {
            Stage::Connecting(s) => Some(s.as_raw_fd()),
            Stage::Hello(s, _) | Stage::Reply(s) => Some(s.as_raw_fd()),
            Stage::Backoff(_) => None,
        }
    }

    fn start(&mut self) {
        while self.next < self.addrs.len() {
            let a = self.addrs[self.next];
            match connect_nonblocking(a) {
                Ok(s) => {
                    self.attempt_end = Instant::now() + self.attempt;
                    self.stage = Some(Stage::Connecting(s));
                    return;
                }
                Err(e) => {
                    self.refused += usize::from(is_refusal(&e));
                    self.tried.push(format!("{a}: {e}"));
                    self.next += 1;
                }
            }
        }
        self.stage = Some(Stage::Backoff(Instant::now() + Duration::from_millis(20)));
    }

    fn fail_attempt(&mut self, why: String) {
        self.tried.push(format!("{}: {why}", self.addrs[self.next]));
        self.next += 1;
        self.start();
    }

    /// Every address of the round refused: nothing listens there. A peer
    /// publishes its address only once its listener is open (before the
    /// startup fence, which precedes every dial), and closes it only when
    /// it finalizes or dies, so waiting out the deadline would only delay
    /// the error (and a finalizing rank's exit) by the peer timeout.
    fn all_refused(&self) -> bool {
        !self.addrs.is_empty() && self.refused >= self.addrs.len()
    }

    fn failure(&self) -> String {
        let mut t = self.tried.clone();
        t.dedup();
        if t.is_empty() {
            "no address published".into()
        } else {
            format!("tried {}", t.join("; "))
        }
    }

    /// Moves the dial on as far as it can without blocking. The bound
    /// covers reaching a listener; once connected, the peer answers when
    /// it next makes progress (it is alive).
    pub fn step(&mut self) -> DialStep {
        loop {
            let now = Instant::now();
            let connected = matches!(self.stage, Some(Stage::Hello(..) | Stage::Reply(_)));
            if now >= self.deadline && !connected {
                return DialStep::Failed(self.failure());
            }
            match self.stage.take() {
                None => self.start(),
                Some(Stage::Backoff(_)) if self.all_refused() => {
                    return DialStep::Failed(format!(
                        "{}: refused (nothing listens there any more: the peer has finalized or died)",
                        self.failure()
                    ));
                }
                Some(Stage::Backoff(t)) => {
                    if now < t {
                        self.stage = Some(Stage::Backoff(t));
                        return DialStep::Pending;
                    }
                    self.next = 0;
                    self.refused = 0;
                    self.start();
                }
                Some(Stage::Connecting(s)) => match s.take_error() {
                    Ok(Some(e)) => {
                        self.refused += usize::from(is_refusal(&e));
                        self.fail_attempt(e.to_string())
                    }
                    Err(e) => self.fail_attempt(e.to_string()),
                    Ok(None) => match s.peer_addr() {
                        Ok(_) => {
                            let t: TcpStream = s.into();
                            super::tcp::tune_socket(&t, self.keepalive, 0);
                            self.stage = Some(Stage::Hello(t, 0));
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                            if now >= self.attempt_end {
                                self.fail_attempt("no answer".into());
                            } else {
                                self.stage = Some(Stage::Connecting(s));
                                return DialStep::Pending;
                            }
                        }
                        Err(e) => self.fail_attempt(e.to_string()),
                    },
                },
                Some(Stage::Hello(mut t, sent)) => match t.write(&self.hello[sent..]) {
                    Ok(n) if sent + n == HELLO_LEN => self.stage = Some(Stage::Reply(t)),
                    Ok(0) => self.fail_attempt("closed before the hello".into()),
                    Ok(n) => self.stage = Some(Stage::Hello(t, sent + n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.stage = Some(Stage::Hello(t, sent));
                        return DialStep::Pending;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                        self.stage = Some(Stage::Hello(t, sent));
                    }
                    Err(e) => self.fail_attempt(format!("hello: {e}")),
                },
                Some(Stage::Reply(mut t)) => {
                    let mut b = [0u8];
                    match t.read(&mut b) {
                        Ok(1) if b[0] == ACCEPT => return DialStep::Accepted(t),
                        Ok(1) if b[0] == REJECT => return DialStep::Rejected,
                        Ok(1) => self.fail_attempt(format!("bad reply byte {:#x}", b[0])),
                        Ok(_) => self.fail_attempt("closed without a reply".into()),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            // The peer is alive (its kernel accepted) but
                            // answers only when it next enters the library:
                            // no bound but the socket's keepalive.
                            self.stage = Some(Stage::Reply(t));
                            return DialStep::Pending;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                            self.stage = Some(Stage::Reply(t))
                        }
                        Err(e) => self.fail_attempt(format!("reply: {e}")),
                    }
                }
            }
        }
    }
}

fn is_refusal(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ECONNREFUSED)
}

fn connect_nonblocking(a: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(a), Type::STREAM, Some(Protocol::TCP))?;
    s.set_nonblocking(true)?;
    match s.connect(&SockAddr::from(a)) {
        Ok(()) => Ok(s),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
        Err(e) => Err(e),
    }
}

/// A socket the listener accepted, until its hello is in.
pub(crate) struct Incoming {
    pub sock: TcpStream,
    got: [u8; HELLO_LEN],
    len: usize,
    pub deadline: Instant,
}

/// What reading an incoming socket came to.
pub(crate) enum IncomingStep {
    Pending,
    Hello(Hello),
    /// Not an ibcoll peer of this job, or it went away: drop it.
    Drop,
}

impl Incoming {
    pub fn new(sock: TcpStream, timeout: Duration) -> io::Result<Incoming> {
        sock.set_nonblocking(true)?;
        Ok(Incoming {
            sock,
            got: [0; HELLO_LEN],
            len: 0,
            deadline: Instant::now() + timeout,
        })
    }

    /// Reads what there is of the hello.
    pub fn step(&mut self) -> IncomingStep {
        loop {
            if self.len == HELLO_LEN {
                return match Hello::decode(&self.got) {
                    Some(h) => IncomingStep::Hello(h),
                    None => IncomingStep::Drop,
                };
            }
            match self.sock.read(&mut self.got[self.len..]) {
                Ok(0) => return IncomingStep::Drop,
                Ok(n) => self.len += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= self.deadline {
                        return IncomingStep::Drop;
                    }
                    return IncomingStep::Pending;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return IncomingStep::Drop,
            }
        }
    }

    /// Sends the one reply byte (the socket has room for it: nothing else
    /// was written on it).
    pub fn reply(&mut self, b: u8) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.sock.write(&[b]) {
                Ok(1) => return Ok(()),
                Ok(_) => return Err(io::Error::new(io::ErrorKind::WriteZero, "reply not sent")),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::yield_now()
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether the acceptor `me`, receiving a hello from `peer`, keeps that
/// connection: not if it has a channel to the peer already, nor if it is
/// dialing the peer itself and has the lower rank (its own dial wins).
pub(crate) fn keep_incoming(me: usize, peer: usize, have_channel: bool, dialing: bool) -> bool {
    !(have_channel || (dialing && me < peer))
}

/// The channel of a tcp pair while it has no connection yet: sends wait
/// in the engine's queue ([`Connecting::try_send`] says there is no room)
/// until the dial is accepted or the peer's own connection comes in.
pub(crate) struct Connecting {
    /// This rank's dial, until it is accepted or rejected.
    pub dial: Option<Dial>,
    /// After a rejection: the peer's connection must arrive by then.
    pub await_until: Option<Instant>,
    pub health: super::Health,
    pub eager_limit: usize,
}

impl Connecting {
    /// A pair that will connect through `dial` (or, with `None`, through
    /// the peer's dial to us).
    pub fn new(dial: Option<Dial>, eager_limit: usize) -> Connecting {
        Connecting {
            dial,
            await_until: None,
            health: super::Health::Open,
            eager_limit,
        }
    }

    /// A pair that never got a connection, for the reason given.
    pub fn failed(reason: String, eager_limit: usize) -> Connecting {
        Connecting {
            dial: None,
            await_until: None,
            health: super::Health::Failed(reason),
            eager_limit,
        }
    }

    /// No room until connected; a failed pair takes (and the engine fails)
    /// the record.
    pub fn try_send(&mut self) -> bool {
        self.health != super::Health::Open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn hello_roundtrip() {
        let h = Hello {
            job: job_key("abc"),
            rank: 77,
        };
        assert_eq!(Hello::decode(&h.encode()), Some(h));
        let mut b = h.encode();
        b[0] ^= 1;
        assert_eq!(Hello::decode(&b), None);
        assert_ne!(job_key("abc"), job_key("abd"));
    }

    #[test]
    fn simultaneous_dials_keep_exactly_the_lower_ranks() {
        // Both dial: the lower keeps none of the higher's, the higher keeps
        // the lower's; one connection survives.
        assert!(!keep_incoming(1, 5, false, true));
        assert!(keep_incoming(5, 1, false, true));
        // Only one dials: the other keeps it.
        assert!(keep_incoming(1, 5, false, false));
        assert!(keep_incoming(5, 1, false, false));
        // A duplicate after the channel exists.
        assert!(!keep_incoming(5, 1, true, false));
        assert!(!keep_incoming(1, 5, true, true));
    }

    fn run(d: &mut Dial) -> DialStep {
        loop {
            match d.step() {
                DialStep::Pending => std::thread::sleep(Duration::from_millis(1)),
                s => return s,
            }
        }
    }

    #[test]
    fn dial_accept_and_reject_over_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let hello = Hello { job: 9, rank: 3 };
        for reply in [ACCEPT, REJECT] {
            let mut d = Dial::new(vec![a], hello, Duration::from_secs(5));
            let (s, _) = l.accept().unwrap();
            let mut inc = Incoming::new(s, Duration::from_secs(5)).unwrap();
            let got = loop {
                let _ = d.step();
                match inc.step() {
                    IncomingStep::Hello(h) => break h,
                    IncomingStep::Pending => std::thread::sleep(Duration::from_millis(1)),
                    IncomingStep::Drop => panic!("dropped"),
                }
            };
            assert_eq!(got, hello);
            inc.reply(reply).unwrap();
            match (reply, run(&mut d)) {
                (ACCEPT, DialStep::Accepted(_)) | (REJECT, DialStep::Rejected) => {}
                (_, DialStep::Failed(w)) => panic!("{w}"),
                _ => panic!("wrong outcome for {reply:#x}"),
            }
        }
    }

    #[test]
    fn a_dial_nobody_answers_fails_in_bounded_time_naming_every_address() {
        // Ports of listeners that are gone: connections are refused.
        let dead: Vec<SocketAddr> = (0..2)
            .map(|_| {
                TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
            })
            .collect();
        let t = Instant::now();
        let mut d = Dial::new(
            dead.clone(),
            Hello { job: 1, rank: 0 },
            Duration::from_millis(300),
        );
        match run(&mut d) {
            DialStep::Failed(w) => {
                for a in &dead {
                    assert!(w.contains(&a.to_string()), "{w}");
                }
            }
            _ => panic!("connected to a dead port"),
        }
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
