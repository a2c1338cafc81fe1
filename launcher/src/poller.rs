//! Readiness of many descriptors at a cost proportional to those ready: a
//! thin layer over level-triggered epoll, for ibrun's job loop and the
//! `srun --mpi=none` key-value server. Each descriptor is registered once
//! with a caller-chosen token; a wakeup returns only the tokens that are
//! ready, so a job of N ranks costs O(ready) per wakeup, not O(N) as poll(2)
//! over every descriptor did.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// What a descriptor is watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    Read,
    Write,
    ReadWrite,
}

impl Interest {
    fn flags(self) -> EpollFlags {
        match self {
            Interest::Read => EpollFlags::EPOLLIN,
            Interest::Write => EpollFlags::EPOLLOUT,
            Interest::ReadWrite => EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT,
        }
    }
}

/// One ready descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    pub token: u64,
    pub readable: bool,
    pub writable: bool,
    /// Hang-up or error: reading will tell which (end of file or an error).
    pub closed: bool,
}

/// An epoll set.
pub struct Poller {
    ep: Epoll,
    events: Vec<EpollEvent>,
}

/// Events taken per wakeup; more stay ready for the next one.
const BATCH: usize = 256;

impl Poller {
    pub fn new() -> io::Result<Poller> {
        Ok(Poller {
            ep: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
            events: vec![EpollEvent::empty(); BATCH],
        })
    }

    /// Starts watching `fd`. Fails (EPERM) for descriptors epoll cannot
    /// watch, such as regular files, which are always ready.
    pub fn add(&self, fd: impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        Ok(self.ep.add(fd, EpollEvent::new(interest.flags(), token))?)
    }

    /// Changes what `fd` is watched for.
    pub fn modify(&self, fd: impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        let mut ev = EpollEvent::new(interest.flags(), token);
        Ok(self.ep.modify(fd, &mut ev)?)
    }

    /// Stops watching `fd` (closing it does the same).
    pub fn remove(&self, fd: impl AsFd) {
        let _ = self.ep.delete(fd);
    }

    /// Waits until something is ready or `timeout` passes (`None`: forever).
    /// An interrupted wait returns nothing.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<Vec<Ready>> {
        let ms: i32 = match timeout {
            None => -1,
            // Round up so that a deadline is never woken for just before it.
            Some(t) => t
                .as_micros()
                .div_ceil(1000)
                .min(i32::MAX as u128)
                .try_into()
                .unwrap_or(i32::MAX),
        };
        let timeout = EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::NONE);
        let n = match self.ep.wait(&mut self.events, timeout) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(e.into()),
        };
        Ok(self.events[..n]
            .iter()
            .map(|e| {
                let f = e.events();
                Ready {
                    token: e.data(),
                    readable: f.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLPRI),
                    writable: f.contains(EpollFlags::EPOLLOUT),
                    closed: f.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn ready_tokens(p: &mut Poller) -> Vec<u64> {
        let mut got: Vec<u64> = p
            .wait(Some(Duration::from_secs(5)))
            .unwrap()
            .iter()
            .map(|r| r.token)
            .collect();
        got.sort();
        got
    }

    #[test]
    fn reports_only_what_is_ready() {
        let mut p = Poller::new().unwrap();
        let pairs: Vec<(UnixStream, UnixStream)> =
            (0..100).map(|_| UnixStream::pair().unwrap()).collect();
        for (i, (_, b)) in pairs.iter().enumerate() {
            p.add(b, i as u64, Interest::Read).unwrap();
        }
        assert!(p.wait(Some(Duration::ZERO)).unwrap().is_empty());
        (&pairs[42].0).write_all(b"x").unwrap();
        (&pairs[7].0).write_all(b"y").unwrap();
        assert_eq!(ready_tokens(&mut p), vec![7, 42]);
        p.modify(&pairs[3].1, 3, Interest::Write).unwrap();
        p.remove(&pairs[42].1);
        assert_eq!(ready_tokens(&mut p), vec![3, 7]);
        drop(pairs);
    }

    #[test]
    fn regular_files_are_refused() {
        let p = Poller::new().unwrap();
        let path = std::env::temp_dir().join(format!("poller-test-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        let added = p.add(&f, 1, Interest::Read);
        let _ = std::fs::remove_file(&path);
        assert!(added.is_err());
    }
}
