//! One epoll set for everything of a rank that signals through a file
//! descriptor: tcp channels and dials, the listener and the sockets it
//! accepted, the wake-up FIFO, the rdma completion channel, and the
//! launcher's notifications. A progress pass asks it once what is ready
//! (one syscall, whatever the number of connections), and a blocked rank
//! sleeps in it.
//!
//! Sockets are registered edge-triggered (their readers read, and writers
//! write, until the socket pushes back); the others level-triggered.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What a ready descriptor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The tcp channel (or dial) of world rank `n`.
    Peer(usize),
    Listener,
    /// A socket the listener accepted, hello not read yet.
    Incoming,
    Wake,
    Rdma,
    Launcher,
}

const KIND_SHIFT: u32 = 56;

fn token(s: Source) -> u64 {
    let (k, n) = match s {
        Source::Peer(n) => (0u64, n as u64),
        Source::Listener => (1, 0),
        Source::Incoming => (2, 0),
        Source::Wake => (3, 0),
        Source::Rdma => (4, 0),
        Source::Launcher => (5, 0),
    };
    (k << KIND_SHIFT) | n
}

fn source(t: u64) -> Source {
    match t >> KIND_SHIFT {
        0 => Source::Peer((t & ((1 << KIND_SHIFT) - 1)) as usize),
        1 => Source::Listener,
        2 => Source::Incoming,
        3 => Source::Wake,
        4 => Source::Rdma,
        _ => Source::Launcher,
    }
}

/// Ready events taken per wait.
const BATCH: usize = 64;

pub(crate) struct NetPoll {
    ep: OwnedFd,
    buf: Vec<libc::epoll_event>,
    /// Descriptors registered (a pass skips the syscall when none is).
    pub registered: usize,
}

impl NetPoll {
    pub fn new() -> io::Result<NetPoll> {
        // SAFETY: epoll_create1 has no memory preconditions.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(NetPoll {
            // SAFETY: `fd` is a new descriptor this struct alone owns.
            ep: unsafe { OwnedFd::from_raw_fd(fd) },
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; BATCH],
            registered: 0,
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, s: Source) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: token(s),
        };
        // SAFETY: `ev` is a live epoll_event; the kernel only reads it.
        if unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches socket `fd` (reads and writes, edge-triggered) for `s`.
    pub fn add_socket(&mut self, fd: RawFd, s: Source) -> io::Result<()> {
        let ev = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
        self.ctl(libc::EPOLL_CTL_ADD, fd, ev, s)?;
        self.registered += 1;
        Ok(())
    }

    /// Watches `fd` for input, level-triggered.
    pub fn add_input(&mut self, fd: RawFd, s: Source) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32, s)?;
        self.registered += 1;
        Ok(())
    }

    /// Stops watching `fd` (before it is closed; a closed descriptor leaves
    /// the set by itself, but the count must follow).
    pub fn remove(&mut self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as in `ctl`.
        if unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) } == 0 {
            self.registered = self.registered.saturating_sub(1);
        }
    }

    /// Waits up to `timeout_ms` (0: just look) and returns what is ready.
    pub fn wait(&mut self, timeout_ms: i32) -> impl Iterator<Item = Source> + '_ {
        // SAFETY: `buf` holds `buf.len()` writable epoll_events.
        let n = unsafe {
            libc::epoll_wait(
                self.ep.as_raw_fd(),
                self.buf.as_mut_ptr(),
                self.buf.len() as libc::c_int,
                timeout_ms,
            )
        };
        let n = n.max(0) as usize;
        self.buf[..n].iter().map(|e| source(e.u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn tokens_roundtrip() {
        for s in [
            Source::Peer(0),
            Source::Peer(1 << 40),
            Source::Listener,
            Source::Incoming,
            Source::Wake,
            Source::Rdma,
            Source::Launcher,
        ] {
            assert_eq!(source(token(s)), s);
        }
    }

    #[test]
    fn a_socket_with_data_is_reported_once_per_edge() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut p = NetPoll::new().unwrap();
        p.add_socket(b.as_raw_fd(), Source::Peer(3)).unwrap();
        // Writable at once.
        assert_eq!(p.wait(0).collect::<Vec<_>>(), vec![Source::Peer(3)]);
        assert_eq!(p.wait(0).count(), 0);
        a.write_all(b"x").unwrap();
        assert_eq!(p.wait(1000).collect::<Vec<_>>(), vec![Source::Peer(3)]);
        p.remove(b.as_raw_fd());
        assert_eq!(p.registered, 0);
    }
}
