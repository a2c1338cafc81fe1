//! The server's end of the PMI connections: nonblocking sockets on a
//! [`Poller`], their bytes cut into lines, and replies queued until the
//! socket takes them, so that a rank slow to read (or one told of many lost
//! peers at once) never blocks the server for the others. Shared by ibrun and
//! the `srun --mpi=none` key-value server.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use crate::poller::{Interest, Poller};
use crate::server::ConnId;
use crate::wire::{LineBuffer, WireError};

/// A connected PMI client.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(true),
            Stream::Tcp(s) => {
                let _ = s.set_nodelay(true);
                s.set_nonblocking(true)
            }
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Conn {
    stream: Stream,
    lines: LineBuffer,
    /// Reply bytes the socket has not taken yet.
    pending: Vec<u8>,
}

/// What one readiness event on a connection brought.
#[derive(Debug, Default)]
pub struct Incoming {
    /// Complete lines, in order (an error for an overlong one).
    pub lines: Vec<Result<Vec<u8>, WireError>>,
    /// The peer closed the connection (or it failed): remove it.
    pub closed: bool,
}

/// Reads taken per readiness event, so that one chatty connection cannot
/// starve the others; level-triggered epoll reports the rest next time.
const READS_PER_EVENT: usize = 16;

/// The open connections; connection `id` has poller token `base + id`.
pub struct Conns {
    map: HashMap<ConnId, Conn>,
    next: ConnId,
    base: u64,
}

impl Conns {
    pub fn new(token_base: u64) -> Conns {
        Conns {
            map: HashMap::new(),
            next: 0,
            base: token_base,
        }
    }

    /// The connection a poller token stands for, if it is one of ours.
    pub fn id_of(&self, token: u64) -> Option<ConnId> {
        let id = token.checked_sub(self.base)? as ConnId;
        self.map.contains_key(&id).then_some(id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Makes the stream nonblocking and watches it; ids are never reused.
    pub fn add(&mut self, poller: &Poller, stream: Stream) -> io::Result<ConnId> {
        stream.set_nonblocking()?;
        let id = self.next;
        poller.add(&stream, self.base + id as u64, Interest::Read)?;
        self.next += 1;
        self.map.insert(
            id,
            Conn {
                stream,
                lines: LineBuffer::new(),
                pending: Vec::new(),
            },
        );
        Ok(id)
    }

    /// Reads what connection `id` has sent.
    pub fn read(&mut self, id: ConnId, buf: &mut [u8]) -> Incoming {
        let mut out = Incoming::default();
        let Some(c) = self.map.get_mut(&id) else {
            return out;
        };
        for _ in 0..READS_PER_EVENT {
            match c.stream.read(buf) {
                Ok(0) => {
                    out.closed = true;
                    break;
                }
                Ok(n) => c.lines.extend(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    out.closed = true;
                    break;
                }
            }
        }
        loop {
            match c.lines.next_line() {
                Ok(Some(l)) => out.lines.push(Ok(l)),
                Ok(None) => break,
                Err(e) => out.lines.push(Err(e)),
            }
        }
        out
    }

    /// Queues `bytes` for connection `id` and writes what the socket takes.
    pub fn send(&mut self, poller: &Poller, id: ConnId, bytes: &[u8]) {
        if let Some(c) = self.map.get_mut(&id) {
            c.pending.extend_from_slice(bytes);
        }
        self.flush(poller, id);
    }

    /// Writes queued bytes; watches for writability only while some remain.
    pub fn flush(&mut self, poller: &Poller, id: ConnId) {
        let Some(c) = self.map.get_mut(&id) else {
            return;
        };
        let had = !c.pending.is_empty();
        let mut written = 0;
        while written < c.pending.len() {
            match c.stream.write(&c.pending[written..]) {
                Ok(0) => break,
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // The peer is gone; reading will report the close.
                    written = c.pending.len();
                }
            }
        }
        c.pending.drain(..written);
        let token = self.base + id as u64;
        match (had, c.pending.is_empty()) {
            (true, true) => {
                let _ = poller.modify(&c.stream, token, Interest::Read);
            }
            (_, false) => {
                let _ = poller.modify(&c.stream, token, Interest::ReadWrite);
            }
            (false, true) => {}
        }
    }

    /// Writes every queued byte, blocking up to `limit` per connection: for
    /// a server about to stop, whose last replies must still arrive.
    pub fn drain(&mut self, limit: std::time::Duration) {
        for c in self.map.values_mut().filter(|c| !c.pending.is_empty()) {
            let timed = match &c.stream {
                Stream::Unix(s) => s
                    .set_nonblocking(false)
                    .and_then(|_| s.set_write_timeout(Some(limit))),
                Stream::Tcp(s) => s
                    .set_nonblocking(false)
                    .and_then(|_| s.set_write_timeout(Some(limit))),
            };
            if timed.is_ok() {
                let _ = c.stream.write_all(&c.pending);
            }
            c.pending.clear();
        }
    }

    /// Stops watching and closes connection `id`.
    pub fn remove(&mut self, poller: &Poller, id: ConnId) {
        if let Some(c) = self.map.remove(&id) {
            poller.remove(&c.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn lines_in_replies_out_and_backpressure() {
        let mut p = Poller::new().unwrap();
        let mut conns = Conns::new(1000);
        let (mut client, server) = UnixStream::pair().unwrap();
        let id = conns.add(&p, Stream::Unix(server)).unwrap();
        client.write_all(b"cmd=a\ncmd=b x=1\ncmd=").unwrap();
        let ready = p.wait(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(conns.id_of(ready[0].token), Some(id));
        let mut buf = vec![0u8; 4];
        let got = conns.read(id, &mut buf);
        assert_eq!(got.lines.len(), 2);
        assert!(!got.closed);
        // A reply larger than the socket buffer waits for writability.
        let big = vec![b'x'; 4 << 20];
        conns.send(&p, id, &big);
        let ready = p.wait(Some(Duration::ZERO)).unwrap();
        assert!(ready.iter().all(|r| !r.writable));
        client.set_nonblocking(true).unwrap();
        let mut sink = vec![0u8; 1 << 16];
        let mut received = 0;
        while received < big.len() {
            match client.read(&mut sink) {
                Ok(n) => received += n,
                Err(_) => {
                    for r in p.wait(Some(Duration::from_secs(5))).unwrap() {
                        if r.writable {
                            conns.flush(&p, id);
                        }
                    }
                }
            }
        }
        drop(client);
        let ready = p.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(ready[0].readable || ready[0].closed);
        assert!(conns.read(id, &mut buf).closed);
        conns.remove(&p, id);
        assert!(conns.is_empty());
    }
}
