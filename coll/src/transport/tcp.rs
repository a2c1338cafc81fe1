//! The channel to a peer on another node: one nonblocking TCP connection.
//!
//! Records go out as `header ++ payload` (written straight from the caller's
//! slices when the socket takes them, copied only when it pushes back).
//! Rendezvous data goes out as one DATA frame written straight from the
//! user's buffer, and on the receiving side is read straight into the
//! posted buffer once the bytes already staged are used up: no extra full
//! copy on either side.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::header::{Header, Kind, HEADER_LEN};
use super::{Health, PeerInfo};
use crate::engine::ops::Token;
use crate::engine::State;

/// Staging room beyond the largest eager frame.
const STAGING_EXTRA: usize = 64 * 1024;

enum Out {
    Bytes {
        buf: Vec<u8>,
        off: usize,
    },
    Body {
        send_token: Token,
        ptr: *const u8,
        len: usize,
        off: usize,
    },
}

#[derive(Clone, Copy)]
enum RState {
    Header,
    Payload { hdr: Header, need: usize },
    Body { token: u64, left: usize },
}

pub(crate) struct TcpChannel {
    sock: TcpStream,
    pub eager_limit: usize,
    pub health: Health,
    out: VecDeque<Out>,
    rbuf: Box<[u8]>,
    rpos: usize,
    rlen: usize,
    rstate: RState,
    bye_seen: bool,
    /// What its goodbye said ([`bye_header`](super::bye_header)).
    pub bye_cause: u64,
}

/// Sets socket options that bound how long a dead peer goes unnoticed.
pub(crate) fn tune_socket(sock: &TcpStream, peer_timeout: Duration, buf_bytes: usize) {
    let fd = sock.as_raw_fd();
    let set = |level: libc::c_int, opt: libc::c_int, val: libc::c_int| {
        // SAFETY: `fd` is an open socket owned by `sock`; the option value
        // is a live c_int of the size passed.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                &val as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    };
    let secs = (peer_timeout.as_secs() as libc::c_int).max(1);
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, (secs / 2).max(1));
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, (secs / 4).max(1));
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 2);
    set(
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        peer_timeout.as_millis().min(i32::MAX as u128) as libc::c_int,
    );
    if buf_bytes > 0 {
        let b = buf_bytes.min(i32::MAX as usize) as libc::c_int;
        set(libc::SOL_SOCKET, libc::SO_SNDBUF, b);
        set(libc::SOL_SOCKET, libc::SO_RCVBUF, b);
    }
    let _ = sock.set_nodelay(true);
}

impl TcpChannel {
    pub fn new(sock: TcpStream, eager_limit: usize) -> io::Result<TcpChannel> {
        sock.set_nonblocking(true)?;
        Ok(TcpChannel {
            sock,
            eager_limit,
            health: Health::Open,
            out: VecDeque::new(),
            rbuf: vec![0u8; eager_limit + HEADER_LEN + STAGING_EXTRA].into_boxed_slice(),
            rpos: 0,
            rlen: 0,
            rstate: RState::Header,
            bye_seen: false,
            bye_cause: 0,
        })
    }

    /// True while bytes wait to be written.
    /// Queued bytes that can still reach the peer; a closed or failed
    /// channel never drains, so it has none (finalize must not wait on it).
    pub fn has_backlog(&self) -> bool {
        self.health == Health::Open && !self.out.is_empty()
    }

    pub fn try_send(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        if self.health != Health::Open {
            // The engine fails the operation from the channel's health.
            return true;
        }
        let h = hdr.encode();
        let total = HEADER_LEN + payload.len();
        let mut written = 0;
        if self.out.is_empty() {
            loop {
                let r = if written < HEADER_LEN {
                    self.sock
                        .write_vectored(&[IoSlice::new(&h[written..]), IoSlice::new(payload)])
                } else {
                    self.sock.write(&payload[written - HEADER_LEN..])
                };
                match r {
                    Ok(0) => {
                        self.health = Health::Failed("connection closed while sending".into());
                        return true;
                    }
                    Ok(n) => {
                        written += n;
                        if written == total {
                            return true;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        self.health = Health::Failed(format!("send failed: {e}"));
                        return true;
                    }
                }
            }
        }
        let mut buf = Vec::with_capacity(total - written);
        if written < HEADER_LEN {
            buf.extend_from_slice(&h[written..]);
            buf.extend_from_slice(payload);
        } else {
            buf.extend_from_slice(&payload[written - HEADER_LEN..]);
        }
        self.out.push_back(Out::Bytes { buf, off: 0 });
        true
    }

    pub fn start_stream(&mut self, send_token: Token, recv_token: u64, ptr: *const u8, len: usize) {
        let mut h = Header::new(Kind::Data);
        h.seq = recv_token;
        h.len = len as u64;
        self.out.push_back(Out::Bytes {
            buf: h.encode().to_vec(),
            off: 0,
        });
        self.out.push_back(Out::Body {
            send_token,
            ptr,
            len,
            off: 0,
        });
    }

    /// Queues a goodbye; the engine flushes before closing.
    pub fn send_bye(&mut self, cause: u64) {
        let _ = self.try_send(&super::bye_header(cause), &[]);
    }

    pub fn poll(&mut self, peer: usize, st: &mut State) -> usize {
        if self.health != Health::Open {
            return 0;
        }
        let mut n = 0;
        if !self.out.is_empty() {
            n += self.flush(st);
        }
        n + self.read(peer, st)
    }

    /// Writes queued bytes until the socket pushes back.
    pub fn flush(&mut self, st: &mut State) -> usize {
        let mut n = 0;
        while let Some(front) = self.out.front_mut() {
            let (r, done) = match front {
                Out::Bytes { buf, off } => {
                    let r = self.sock.write(&buf[*off..]);
                    if let Ok(k) = r {
                        *off += k;
                    }
                    (r, *off == buf.len())
                }
                Out::Body { ptr, len, off, .. } => {
                    // SAFETY: the send's Request borrows `len` bytes at `ptr`
                    // until the operation completes, which happens only once
                    // every byte has been written (below).
                    let src = unsafe { std::slice::from_raw_parts(*ptr, *len) };
                    let r = self.sock.write(&src[*off..]);
                    if let Ok(k) = r {
                        *off += k;
                    }
                    (r, *off == *len)
                }
            };
            match r {
                Ok(0) if !done => {
                    self.health = Health::Failed("connection closed while sending".into());
                    return n;
                }
                Ok(_) => {
                    if done {
                        if let Some(Out::Body { send_token, .. }) = self.out.pop_front() {
                            st.send_stream_done(send_token);
                        }
                        n += 1;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.health = Health::Failed(format!("send failed: {e}"));
                    return n;
                }
            }
        }
        n
    }

    fn fail_read(&mut self, why: String) {
        self.health = if self.bye_seen {
            Health::Closed
        } else {
            Health::Failed(why)
        };
    }

    fn read(&mut self, peer: usize, st: &mut State) -> usize {
        let info = PeerInfo {
            cma_pid: None,
            local: false,
        };
        let mut n = 0;
        loop {
            let avail = self.rlen - self.rpos;
            match self.rstate {
                RState::Header if avail >= HEADER_LEN => {
                    let hdr = match Header::decode(&self.rbuf[self.rpos..self.rlen]) {
                        Ok(h) => h,
                        Err(e) => {
                            self.health = Health::Failed(format!("bad header: {e}"));
                            return n;
                        }
                    };
                    self.rpos += HEADER_LEN;
                    match hdr.kind {
                        Kind::Bye => {
                            self.bye_seen = true;
                            self.bye_cause = hdr.seq;
                            self.health = Health::Closed;
                            return n + 1;
                        }
                        Kind::Data => {
                            self.rstate = RState::Body {
                                token: hdr.seq,
                                left: usize::try_from(hdr.len).unwrap_or(usize::MAX),
                            };
                        }
                        _ => {
                            let need = hdr.payload_len();
                            if need > self.eager_limit as u64 + 8 {
                                self.health = Health::Failed(format!(
                                    "{:?} frame of {need} bytes exceeds the eager limit {} (do both sides use the same IBCOLL_TCP_EAGER_LIMIT?)",
                                    hdr.kind, self.eager_limit
                                ));
                                return n;
                            }
                            self.rstate = RState::Payload {
                                hdr,
                                need: need as usize,
                            };
                        }
                    }
                    continue;
                }
                RState::Payload { hdr, need } if avail >= need => {
                    let payload = &self.rbuf[self.rpos..self.rpos + need];
                    let res = st.on_record(peer, info, &hdr, payload);
                    self.rpos += need;
                    self.rstate = RState::Header;
                    n += 1;
                    if let Err(e) = res {
                        self.health = Health::Failed(e);
                        return n;
                    }
                    continue;
                }
                RState::Body { token, left } => {
                    if left == 0 {
                        self.rstate = RState::Header;
                        n += 1;
                        continue;
                    }
                    if avail > 0 {
                        let k = avail.min(left);
                        let took = match st.recv_stream_buf(token) {
                            Some(dst) => {
                                let m = k.min(dst.len());
                                dst[..m].copy_from_slice(&self.rbuf[self.rpos..self.rpos + m]);
                                m
                            }
                            None => 0,
                        };
                        if took > 0 {
                            st.recv_stream_advance(token, took);
                        }
                        // Bytes beyond the buffer (or for a failed receive)
                        // are dropped.
                        self.rpos += k;
                        self.rstate = RState::Body {
                            token,
                            left: left - k,
                        };
                        continue;
                    }
                    // Staging is empty: read straight into the user buffer.
                    let direct = match st.recv_stream_buf(token) {
                        Some(dst) if !dst.is_empty() => {
                            let m = left.min(dst.len());
                            Some(self.sock.read(&mut dst[..m]))
                        }
                        _ => None,
                    };
                    if let Some(r) = direct {
                        match r {
                            Ok(0) => {
                                self.fail_read("connection closed by peer".into());
                                return n;
                            }
                            Ok(k) => {
                                st.recv_stream_advance(token, k);
                                self.rstate = RState::Body {
                                    token,
                                    left: left - k,
                                };
                                continue;
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return n,
                            Err(e) => {
                                self.fail_read(format!("receive failed: {e}"));
                                return n;
                            }
                        }
                    }
                    // No room in the user buffer: fall through to staging.
                }
                _ => {}
            }
            // Need more bytes in staging.
            if self.rpos == self.rlen {
                self.rpos = 0;
                self.rlen = 0;
            } else if self.rlen == self.rbuf.len() {
                self.rbuf.copy_within(self.rpos..self.rlen, 0);
                self.rlen -= self.rpos;
                self.rpos = 0;
            }
            match self.sock.read(&mut self.rbuf[self.rlen..]) {
                Ok(0) => {
                    self.fail_read("connection closed by peer".into());
                    return n;
                }
                Ok(k) => self.rlen += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return n,
                Err(e) => {
                    self.fail_read(format!("receive failed: {e}"));
                    return n;
                }
            }
        }
    }
}
