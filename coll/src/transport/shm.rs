//! The channel to a peer on the same node: one SPSC ring each way in the
//! node segment, the peer's futex doorbell rung after every push (free when
//! the peer is awake), and for rendezvous either a single-copy read by the
//! receiver (CMA) or a pipelined copy through the pair's pipe area.

use std::collections::VecDeque;
use std::rc::Rc;

use ibcoll_shm::{NodeSegment, PipeReceiver, PipeSender, RingConsumer, RingProducer};

use super::header::{Header, Kind, HEADER_LEN};
use super::{Health, PeerInfo};
use crate::engine::ops::Token;
use crate::engine::State;

/// Records handled per poll, so one busy peer cannot starve the others.
const POLL_BATCH: usize = 32;

struct OutStream {
    send_token: Token,
    ptr: *const u8,
    len: usize,
    off: usize,
}

struct InStream {
    recv_token: Token,
    wanted: usize,
    got: usize,
}

pub(crate) struct ShmChannel {
    // Field order matters: the ring and pipe handles point into the
    // segment, so they are dropped before `node`.
    tx: RingProducer,
    rx: RingConsumer,
    pipe_tx: Option<PipeSender>,
    pipe_rx: Option<PipeReceiver>,
    node: Rc<NodeSegment>,
    peer_local: usize,
    pub peer_pid: i32,
    /// Both sides can read each other's memory by CMA.
    pub cma: bool,
    pub eager_limit: usize,
    pub health: Health,
    out_streams: VecDeque<OutStream>,
    in_streams: VecDeque<InStream>,
    scratch: Vec<u8>,
}

impl ShmChannel {
    /// The channel from local rank `me` to local rank `peer_local`.
    ///
    /// # Safety
    /// `me` is this process's local rank in `node`, and only one channel per
    /// peer is made in this process (so each ring and pipe end has a single
    /// owner).
    pub unsafe fn new(
        node: Rc<NodeSegment>,
        me: usize,
        peer_local: usize,
        peer_pid: i32,
        cma: bool,
        eager_limit: usize,
    ) -> ibcoll_shm::Result<ShmChannel> {
        // SAFETY: forwarded contract; the handles live in this struct, which
        // drops them before its `node` reference.
        let (tx, rx, pipe_tx, pipe_rx) = unsafe {
            let tx = node.ring_producer(me, peer_local)?;
            let rx = node.ring_consumer(peer_local, me)?;
            let (ptx, prx) = if node.layout().pipe_offset(me, peer_local).is_some() {
                (
                    Some(node.pipe_sender(me, peer_local)?),
                    Some(node.pipe_receiver(peer_local, me)?),
                )
            } else {
                (None, None)
            };
            (tx, rx, ptx, prx)
        };
        Ok(ShmChannel {
            tx,
            rx,
            pipe_tx,
            pipe_rx,
            node,
            peer_local,
            peer_pid,
            cma,
            eager_limit,
            health: Health::Open,
            out_streams: VecDeque::new(),
            in_streams: VecDeque::new(),
            scratch: Vec::new(),
        })
    }

    #[inline]
    pub fn try_send(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        let h = hdr.encode();
        if !self.tx.try_push(&[&h, payload]) {
            return false;
        }
        self.node.doorbell(self.peer_local).ring();
        true
    }

    pub fn has_backlog(&self) -> bool {
        !self.out_streams.is_empty()
    }

    pub fn start_stream(&mut self, send_token: Token, ptr: *const u8, len: usize) {
        self.out_streams.push_back(OutStream {
            send_token,
            ptr,
            len,
            off: 0,
        });
    }

    pub fn expect_stream(&mut self, recv_token: Token, wanted: usize) {
        self.in_streams.push_back(InStream {
            recv_token,
            wanted,
            got: 0,
        });
    }

    pub fn check_alive(&mut self) -> Option<String> {
        if self.health != Health::Open || ibcoll_shm::pid_alive(self.peer_pid) {
            return None;
        }
        Some(format!("process {} is gone", self.peer_pid))
    }

    #[inline]
    pub fn poll(&mut self, peer: usize, st: &mut State) -> usize {
        let mut n = 0;
        if self.health == Health::Open || !self.rx.is_empty() {
            let info = PeerInfo {
                cma_pid: self.cma.then_some(self.peer_pid),
                local: false,
            };
            while n < POLL_BATCH {
                let Some(rec) = self.rx.peek() else { break };
                let bytes = rec.bytes();
                let res = match Header::decode(bytes) {
                    Ok(h) if h.kind == Kind::Bye => {
                        self.health = Health::Closed;
                        Ok(())
                    }
                    Ok(h) => st.on_record(peer, info, &h, &bytes[HEADER_LEN..]),
                    Err(e) => Err(format!("bad header on the shm ring: {e}")),
                };
                rec.consume();
                n += 1;
                if let Err(e) = res {
                    self.health = Health::Failed(e);
                    break;
                }
            }
            if n > 0 {
                // The peer may be asleep waiting for ring space.
                self.node.doorbell(self.peer_local).ring();
            }
        }
        if !self.out_streams.is_empty() || !self.in_streams.is_empty() {
            n += self.poll_pipes(st);
        }
        n
    }

    fn poll_pipes(&mut self, st: &mut State) -> usize {
        let mut n = 0;
        if let (Some(front), Some(tx)) = (self.out_streams.front_mut(), self.pipe_tx.as_mut()) {
            // SAFETY: the send's Request borrows `len` bytes at `ptr` until
            // the operation completes, which happens only below, after the
            // last byte has been copied out.
            let src = unsafe { std::slice::from_raw_parts(front.ptr, front.len) };
            let sent = tx.try_send(&src[front.off..]);
            if sent > 0 {
                front.off += sent;
                n += 1;
                self.node.doorbell(self.peer_local).ring();
            }
            if front.off == front.len {
                st.send_stream_done(front.send_token);
                self.out_streams.pop_front();
            }
        }
        if let (Some(front), Some(rx)) = (self.in_streams.front_mut(), self.pipe_rx.as_mut()) {
            let left = front.wanted - front.got;
            let got = match st.recv_stream_buf(front.recv_token) {
                Some(dst) => {
                    let m = left.min(dst.len());
                    rx.try_recv(&mut dst[..m])
                }
                None => {
                    // The receive failed meanwhile: drain and drop its bytes.
                    self.scratch.resize(left.min(1 << 16), 0);
                    rx.try_recv(&mut self.scratch)
                }
            };
            if got > 0 {
                front.got += got;
                n += 1;
                st.recv_stream_advance(front.recv_token, got);
                // The sender may be asleep waiting for a free slot.
                self.node.doorbell(self.peer_local).ring();
            }
            if front.got == front.wanted {
                self.in_streams.pop_front();
            }
        }
        n
    }

    /// Tells the peer we are leaving; false if the ring has no room yet.
    pub fn send_bye(&mut self) -> bool {
        self.try_send(&Header::new(Kind::Bye), &[])
    }
}
