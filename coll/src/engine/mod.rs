//! The point-to-point engine: pending operations, matching, the protocol
//! state machine (eager, rendezvous), and the channels to every peer.
//!
//! [`State`] is everything but the channels, so a channel being polled can
//! hand records to it (`on_record`) while the engine holds both. What a
//! record makes the engine send back (CTS, FIN) or start (a stream) is
//! queued as an [`Action`] and carried out after the poll.
//!
//! Collectives (next step) run schedules of sends, receives and local
//! reductions on top of `post_send` / `post_recv` / `progress`, so a
//! nonblocking collective is one more kind of pending work polled by the
//! same loop.

pub(crate) mod bootstrap;
pub(crate) mod card;
pub(crate) mod cell;
pub(crate) mod connect;
pub(crate) mod matching;
pub(crate) mod netpoll;
pub(crate) mod notice;
pub(crate) mod ops;
pub(crate) mod peers;
pub(crate) mod progress;
pub(crate) mod rdma_connect;
pub(crate) mod stats;
pub(crate) mod watchdog;

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

use ibcoll_launcher::Pmi;
use ibcoll_shm::NodeSegment;

use crate::config::Config;
use crate::error::{Error, Op as ErrOp, Result};
use crate::request::Status;
use crate::transport::header::{Header, Kind};
use crate::transport::{Channel, Health, PeerInfo};
use matching::{Body, Matcher, Posted, Unexpected};
use ops::{Op, OpKind, RecvStage, SendStage, Slab, Token};
use peers::Peers;

/// Work a record asks for, carried out once the channel poll is over.
#[derive(Debug)]
pub(crate) enum Action {
    /// Send a control record (CTS carries a word: the receive's token).
    Ctl {
        peer: usize,
        hdr: Header,
        word: Option<u64>,
    },
    /// Receiver: `wanted` bytes for `token` will be streamed.
    ExpectStream {
        peer: usize,
        token: Token,
        wanted: usize,
    },
    /// Receiver (shm with CMA): the data of receive `token` (`wanted`
    /// bytes into `buf`) is at `addr` in the sender, whose send is
    /// `send_token`; the channel copies it (in chunks, possibly with the
    /// sender's help) and answers FIN.
    CmaRead {
        peer: usize,
        token: Token,
        send_token: u64,
        addr: u64,
        buf: *mut u8,
        wanted: usize,
    },
    /// Sender: stream `len` bytes at `ptr` to the peer's receive `recv_token`.
    StartStream {
        peer: usize,
        send_token: Token,
        recv_token: u64,
        ptr: *const u8,
        len: usize,
    },
}

/// Everything of the engine except the channels.
pub(crate) struct State {
    /// World rank of this process.
    pub rank: usize,
    pub ops: Slab<Op>,
    pub matcher: Matcher,
    pub actions: VecDeque<Action>,
    /// Buffers of unexpected eager messages, kept for the next ones: a
    /// fresh allocation per message (tens of KiB in pieces of a big
    /// collective) went through brk and page faults on most calls, as the
    /// allocator gave the top of the heap back after each burst.
    eager_pool: Vec<Vec<u8>>,
    /// Notices that arrived unexpected, ever (see `notice.rs`): a waiter
    /// compares it with the count it saw last, one load on the success
    /// path.
    pub notices: u64,
    /// Notices still in the unexpected queue.
    pub notices_waiting: usize,
    /// The latest operations (context, tag) this process failed in a way
    /// a notice would report: later notices about them say nothing new.
    pub failed_ops: VecDeque<(u32, i32)>,
    /// The rank whose loss first failed an operation of this process (the
    /// one a lost peer's goodbye named, if it named one): its own goodbye
    /// carries it ([`crate::transport::bye_header`]).
    pub lost_cause: Option<usize>,
    /// This process's latest collective calls: context, tag and stamp
    /// (see `notice.rs`, [`Conflict`](notice::Conflict)).
    pub calls: VecDeque<(u32, i32, u32)>,
    /// Messages of those calls that carried another stamp, not yet
    /// reported (counted in `notices` and `notices_waiting`).
    pub conflicts: Vec<notice::Conflict>,
    /// Probes for calls not started here yet ([`State::on_probe`]).
    pub probes: Vec<notice::Probe>,
    /// The receives of collective calls this process sent probes for
    /// (context, tag, token): once each.
    pub probed: VecDeque<(u32, i32, Token)>,
}

/// Buffers [`State::eager_pool`] keeps at most (each up to the largest
/// eager message seen).
const EAGER_POOL: usize = 64;

fn word(payload: &[u8]) -> std::result::Result<u64, String> {
    let b: [u8; 8] = payload
        .try_into()
        .map_err(|_| format!("control payload of {} bytes, expected 8", payload.len()))?;
    Ok(u64::from_le_bytes(b))
}

/// The error a failed CMA transfer with world rank `peer` becomes.
pub(crate) fn cma_error(rank: usize, peer: usize, op: ErrOp, e: ibcoll_shm::ShmError) -> Error {
    match e {
        ibcoll_shm::ShmError::PeerGone { pid, .. } => Error::PeerLost {
            rank,
            peer,
            op,
            reason: format!("process {pid} is gone"),
        },
        e => Error::Transport {
            rank,
            peer,
            op,
            transport: "shm",
            detail: e.to_string(),
        },
    }
}

/// Why a peer whose channel is closed is gone: it finalized, and if its
/// goodbye said so, after an operation of its failed because another rank
/// was lost (that rank is the cause to report).
#[cold]
fn closed_reason(chan: Option<&Channel>) -> String {
    match chan.and_then(Channel::bye_cause) {
        Some(r) => format!("it has finalized after losing rank {r}"),
        None => "it has finalized".into(),
    }
}

/// The outcome of a receive of a `msg_len`-byte message into `cap` bytes.
fn recv_result(
    rank: usize,
    peer: usize,
    src: u32,
    tag: i32,
    msg_len: usize,
    cap: usize,
) -> Result<Status> {
    if msg_len > cap {
        return Err(Error::Truncated {
            rank,
            peer,
            op: ErrOp::Recv,
            tag,
            message_len: msg_len,
            buffer_len: cap,
        });
    }
    Ok(Status {
        source: src as usize,
        tag,
        len: msg_len,
    })
}

impl State {
    /// A copy of `payload` in a pooled buffer.
    fn eager_copy(&mut self, payload: &[u8]) -> Vec<u8> {
        let mut v = self.eager_pool.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(payload);
        v
    }

    /// Returns the buffer of a matched unexpected message to the pool.
    pub fn eager_recycle(&mut self, v: Vec<u8>) {
        if self.eager_pool.len() < EAGER_POOL {
            self.eager_pool.push(v);
        }
    }

    pub fn new(rank: usize) -> State {
        State {
            rank,
            ops: Slab::default(),
            matcher: Matcher::default(),
            actions: VecDeque::new(),
            eager_pool: Vec::new(),
            notices: 0,
            notices_waiting: 0,
            failed_ops: VecDeque::new(),
            lost_cause: None,
            calls: VecDeque::new(),
            conflicts: Vec::new(),
            probes: Vec::new(),
            probed: VecDeque::new(),
        }
    }

    /// Handles one record from world rank `peer`. An `Err` is a protocol
    /// violation; the channel then fails.
    #[inline]
    pub fn on_record(
        &mut self,
        peer: usize,
        info: PeerInfo,
        hdr: &Header,
        payload: &[u8],
    ) -> std::result::Result<(), String> {
        match hdr.kind {
            Kind::Eager => {
                if payload.len() as u64 != hdr.len {
                    return Err(format!(
                        "eager message says {} bytes, carries {}",
                        hdr.len,
                        payload.len()
                    ));
                }
                if let Some(tok) = self.matcher.take_posted(hdr.ctx, hdr.src, hdr.tag) {
                    self.set_stamp(tok, hdr.stamp);
                    self.finish_eager(tok, peer, hdr.src, hdr.tag, payload);
                } else {
                    if notice::is_notice(hdr.tag) {
                        if hdr.stamp != 0 && payload.is_empty() {
                            self.on_probe(hdr.ctx, hdr.tag, hdr.src, peer, hdr.stamp);
                            return Ok(());
                        }
                        self.note_notice();
                    }
                    let body = Body::Eager(self.eager_copy(payload));
                    self.matcher.add_unexpected(Unexpected {
                        peer,
                        ctx: hdr.ctx,
                        src: hdr.src,
                        tag: hdr.tag,
                        len: payload.len(),
                        stamp: hdr.stamp,
                        body,
                    });
                    if hdr.stamp != 0 {
                        self.check_stamp(hdr.ctx, hdr.tag, hdr.src, peer, hdr.stamp);
                    }
                }
            }
            Kind::Rts => {
                let addr = word(payload)?;
                let len =
                    usize::try_from(hdr.len).map_err(|_| "RTS length overflows".to_string())?;
                if let Some(tok) = self.matcher.take_posted(hdr.ctx, hdr.src, hdr.tag) {
                    self.set_stamp(tok, hdr.stamp);
                    self.start_rndv(tok, peer, info, hdr.src, hdr.tag, len, hdr.seq, addr);
                } else {
                    self.matcher.add_unexpected(Unexpected {
                        peer,
                        ctx: hdr.ctx,
                        src: hdr.src,
                        tag: hdr.tag,
                        len,
                        stamp: hdr.stamp,
                        body: Body::Rts {
                            send_token: hdr.seq,
                            addr,
                        },
                    });
                    if hdr.stamp != 0 {
                        self.check_stamp(hdr.ctx, hdr.tag, hdr.src, peer, hdr.stamp);
                    }
                }
            }
            Kind::Cts => {
                let recv_token = word(payload)?;
                let send_token = hdr.seq;
                let Some(op) = self.ops.get_mut(send_token) else {
                    return Err(format!("CTS for unknown send {send_token:#x}"));
                };
                let OpKind::Send {
                    peer: p,
                    buf,
                    len,
                    stage,
                    ..
                } = &mut op.kind
                else {
                    return Err("CTS names a receive".into());
                };
                if *p != peer || *stage != SendStage::AwaitReply || hdr.len > *len as u64 {
                    return Err(format!(
                        "CTS does not fit send {send_token:#x} (wants {} of {} bytes)",
                        hdr.len, len
                    ));
                }
                let wanted = hdr.len as usize;
                if wanted == 0 {
                    op.result = Some(Ok(Status::empty()));
                } else {
                    *stage = SendStage::Streaming;
                    self.actions.push_back(Action::StartStream {
                        peer,
                        send_token,
                        recv_token,
                        ptr: *buf,
                        len: wanted,
                    });
                }
            }
            Kind::Fin => {
                let send_token = hdr.seq;
                match self.ops.get_mut(send_token) {
                    Some(Op {
                        kind:
                            OpKind::Send {
                                peer: p,
                                stage: SendStage::AwaitReply,
                                ..
                            },
                        result,
                    }) if *p == peer => *result = Some(Ok(Status::empty())),
                    _ => return Err(format!("FIN for unknown send {send_token:#x}")),
                }
            }
            Kind::Data | Kind::Bye => {
                return Err(format!(
                    "{:?} record outside its channel's framing",
                    hdr.kind
                ));
            }
        }
        Ok(())
    }

    fn recv_result(
        &self,
        peer: usize,
        src: u32,
        tag: i32,
        msg_len: usize,
        cap: usize,
    ) -> Result<Status> {
        recv_result(self.rank, peer, src, tag, msg_len, cap)
    }

    /// Records on receive `tok` the stamp of the message it matched.
    #[inline]
    fn set_stamp(&mut self, tok: Token, got: u32) {
        if let Some(Op {
            kind: OpKind::Recv { stamp, .. },
            ..
        }) = self.ops.get_mut(tok)
        {
            *stamp = got;
        }
    }

    /// Copies an eager payload into the receive `tok` and completes it.
    pub fn finish_eager(&mut self, tok: Token, peer: usize, src: u32, tag: i32, payload: &[u8]) {
        let Some(Op {
            kind: OpKind::Recv { buf, cap, .. },
            ..
        }) = self.ops.get(tok)
        else {
            return;
        };
        let (buf, cap) = (*buf, *cap);
        let n = payload.len().min(cap);
        // SAFETY: the receive's Request mutably borrows `cap` bytes at `buf`
        // until the operation is removed from the slab, which happens only
        // after it completes; `n <= cap`, and the payload lives elsewhere.
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), buf, n) };
        let r = self.recv_result(peer, src, tag, payload.len(), cap);
        if let Some(op) = self.ops.get_mut(tok) {
            op.result = Some(r);
        }
    }

    /// A matched receive whose data now arrives as a stream of `wanted`
    /// bytes from `peer`.
    fn mark_streaming(
        &mut self,
        tok: Token,
        peer: usize,
        src: u32,
        tag: i32,
        msg_len: usize,
        wanted: usize,
    ) {
        if let Some(Op {
            kind: OpKind::Recv { stage, .. },
            ..
        }) = self.ops.get_mut(tok)
        {
            *stage = RecvStage::Streaming {
                peer,
                src,
                tag,
                msg_len,
                wanted,
                got: 0,
            };
        }
    }

    /// A receive matched a rendezvous message: read it directly (CMA,
    /// memcpy for self) or ask for it to be streamed.
    #[allow(clippy::too_many_arguments)]
    pub fn start_rndv(
        &mut self,
        tok: Token,
        peer: usize,
        info: PeerInfo,
        src: u32,
        tag: i32,
        msg_len: usize,
        send_token: u64,
        addr: u64,
    ) {
        let Some(Op {
            kind: OpKind::Recv { buf, cap, .. },
            ..
        }) = self.ops.get(tok)
        else {
            return;
        };
        let (buf, cap) = (*buf, *cap);
        let wanted = msg_len.min(cap);
        if let (Some(pid), true) = (info.cma_pid, addr != 0) {
            if wanted > 0 && !info.local {
                // The channel copies in chunks between polls (so FINs and
                // new RTSs are not held behind a long copy) and may split
                // the copy with the sender.
                self.mark_streaming(tok, peer, src, tag, msg_len, wanted);
                self.actions.push_back(Action::CmaRead {
                    peer,
                    token: tok,
                    send_token,
                    addr,
                    buf,
                    wanted,
                });
                return;
            }
            let res = if wanted == 0 {
                Ok(())
            } else if info.local {
                // SAFETY: the sender is this process; its Request borrows
                // `msg_len >= wanted` bytes at `addr` until our FIN
                // completes it, and ours borrows `cap >= wanted` bytes at
                // `buf` mutably; distinct borrows cannot overlap.
                unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf, wanted) };
                Ok(())
            } else {
                // SAFETY: as in `finish_eager`, `wanted <= cap` bytes at
                // `buf` are ours to write until the receive completes.
                let dst = unsafe { std::slice::from_raw_parts_mut(buf, wanted) };
                ibcoll_shm::cma_read(pid, addr as usize, dst)
            };
            let mut fin = Header::new(Kind::Fin);
            fin.seq = send_token;
            self.actions.push_back(Action::Ctl {
                peer,
                hdr: fin,
                word: None,
            });
            let r = match res {
                Ok(()) => self.recv_result(peer, src, tag, msg_len, cap),
                Err(e) => Err(cma_error(self.rank, peer, ErrOp::Recv, e)),
            };
            if let Some(op) = self.ops.get_mut(tok) {
                op.result = Some(r);
            }
            return;
        }
        let mut cts = Header::new(Kind::Cts);
        cts.seq = send_token;
        cts.len = wanted as u64;
        if wanted == 0 {
            let r = self.recv_result(peer, src, tag, msg_len, cap);
            if let Some(op) = self.ops.get_mut(tok) {
                op.result = Some(r);
            }
        } else {
            self.mark_streaming(tok, peer, src, tag, msg_len, wanted);
            self.actions.push_back(Action::ExpectStream {
                peer,
                token: tok,
                wanted,
            });
        }
        self.actions.push_back(Action::Ctl {
            peer,
            hdr: cts,
            word: Some(tok),
        });
    }

    /// The part of streaming receive `tok` still to be filled, if it is
    /// still streaming.
    pub fn recv_stream_buf(&mut self, tok: u64) -> Option<&mut [u8]> {
        match self.ops.get(tok) {
            Some(Op {
                kind:
                    OpKind::Recv {
                        buf,
                        stage: RecvStage::Streaming { wanted, got, .. },
                        ..
                    },
                result: None,
            }) => {
                // SAFETY: as in `finish_eager`: `got <= wanted <= cap` and
                // the receive's Request holds the buffer until completion.
                Some(unsafe { std::slice::from_raw_parts_mut(buf.add(*got), wanted - got) })
            }
            _ => None,
        }
    }

    /// True while receive `tok` is still streaming (not completed or
    /// failed), so its buffer may still be written.
    pub fn recv_streaming(&self, tok: u64) -> bool {
        matches!(
            self.ops.get(tok),
            Some(Op {
                kind: OpKind::Recv {
                    stage: RecvStage::Streaming { .. },
                    ..
                },
                result: None,
            })
        )
    }

    /// Fails streaming receive `tok` (a copy of its data failed).
    pub fn recv_stream_fail(&mut self, tok: u64, err: Error) {
        if let Some(op) = self.ops.get_mut(tok) {
            if op.result.is_none() {
                op.result = Some(Err(err));
            }
        }
    }

    /// The buffer of send `tok` to `peer`, while it waits for the peer's
    /// reply (RTS sent, no FIN yet).
    pub fn send_awaiting(&self, tok: u64, peer: usize) -> Option<(*const u8, usize)> {
        match self.ops.get(tok) {
            Some(Op {
                kind:
                    OpKind::Send {
                        peer: p,
                        buf,
                        len,
                        stage: SendStage::AwaitReply,
                        ..
                    },
                result: None,
            }) if *p == peer => Some((*buf, *len)),
            _ => None,
        }
    }

    /// True while a rendezvous send to `peer` is pending: the peer is (or
    /// soon will be) copying our data. A scan of the pending operations,
    /// for the once-per-large-message split decision.
    pub fn rndv_sends_to(&self, peer: usize) -> bool {
        self.ops.tokens().any(|t| {
            matches!(
                self.ops.get(t),
                Some(Op {
                    kind: OpKind::Send { peer: p, hdr, .. },
                    result: None,
                }) if *p == peer && hdr.kind == Kind::Rts
            )
        })
    }

    /// `n` more bytes of streaming receive `tok` arrived; true if that
    /// completed it.
    pub fn recv_stream_advance(&mut self, tok: u64, n: usize) -> bool {
        let rank = self.rank;
        let Some(op) = self.ops.get_mut(tok) else {
            return false;
        };
        let OpKind::Recv {
            cap,
            stage:
                RecvStage::Streaming {
                    peer,
                    src,
                    tag,
                    msg_len,
                    wanted,
                    got,
                },
            ..
        } = &mut op.kind
        else {
            return false;
        };
        *got = (*got + n).min(*wanted);
        if *got == *wanted && op.result.is_none() {
            op.result = Some(recv_result(rank, *peer, *src, *tag, *msg_len, *cap));
            return true;
        }
        false
    }

    /// Streaming send `tok` has handed over its last byte.
    pub fn send_stream_done(&mut self, tok: Token) {
        if let Some(op) = self.ops.get_mut(tok) {
            if op.result.is_none() {
                op.result = Some(Ok(Status::empty()));
            }
        }
    }

    /// Fails every pending operation that needs `peer`. `died` (rather than
    /// finalized) also fails any-source receives of communicators holding
    /// the peer; `cause` is the rank whose loss that was at bottom (the
    /// peer, or the rank its goodbye named).
    pub fn fail_peer(&mut self, peer: usize, reason: &str, died: bool, cause: usize) {
        let rank = self.rank;
        let toks: Vec<Token> = self.ops.tokens().collect();
        for tok in toks {
            let Some(op) = self.ops.get_mut(tok) else {
                continue;
            };
            if op.result.is_some() {
                continue;
            }
            let (hit, what, unpost) = match &op.kind {
                OpKind::Send { peer: p, .. } => (*p == peer, ErrOp::Send, false),
                OpKind::Recv {
                    stage: RecvStage::Streaming { peer: p, .. },
                    ..
                } => (*p == peer, ErrOp::Recv, false),
                OpKind::Recv {
                    peer: Some(p),
                    stage: RecvStage::Posted,
                    ..
                } => (*p == peer, ErrOp::Recv, true),
                OpKind::Recv {
                    peer: None,
                    group,
                    stage: RecvStage::Posted,
                    ..
                } => (died && group.contains(&peer), ErrOp::Recv, true),
            };
            if !hit {
                continue;
            }
            self.lost_cause.get_or_insert(cause);
            op.result = Some(Err(Error::PeerLost {
                rank,
                peer,
                op: what,
                reason: reason.to_string(),
            }));
            if unpost {
                self.matcher.unpost(tok);
            }
        }
    }
}

/// True if one of the first `k` records of `q` is for `peer`.
fn ctl_waits_for(q: &VecDeque<Action>, peer: usize, k: usize) -> bool {
    q.iter()
        .take(k)
        .any(|a| matches!(a, Action::Ctl { peer: p, .. } if *p == peer))
}

/// True if one of the last `k` records of `q` is for `peer`.
fn ctl_waits_for_last(q: &VecDeque<Action>, peer: usize, k: usize) -> bool {
    q.iter()
        .rev()
        .take(k)
        .any(|a| matches!(a, Action::Ctl { peer: p, .. } if *p == peer))
}

/// How a send was posted.
pub(crate) enum Posted2 {
    /// Handed over completely already (eager into a channel).
    Done,
    /// Pending as this operation.
    Pending(Token),
}

/// The shared-memory fast paths' sequence, per process (kept here because
/// every communicator of the node shares it; `crate::fastpath` reads and
/// advances it).
pub(crate) struct FastSeq {
    /// Number of the last fast-path collective.
    pub seq: u64,
    /// By local rank: the highest sequence number seen published.
    pub seen: Vec<u64>,
    /// At most the lowest `seen` of the other local ranks (refreshed by a
    /// claim when it looks at them; `seen` only grows), so that most
    /// claims need not look at every member.
    pub min_other: u64,
    /// The fast-path call in which this process found the members disagree
    /// (0: none): every later fast-path call publishes that instead of
    /// taking part, so that the members that returned from it (a bcast or
    /// scatter root publishes and goes on) fail too, naming it
    /// (`crate::fastpath::FAIL_MARK`).
    pub failed: u64,
    /// The blocking call this process runs as a schedule on a fast-path
    /// communicator, announced in the slots and not waited for (a wait
    /// would make every such call a barrier); looked at while the
    /// schedule blocks ([`Engine::check_announced`]).
    pub announced: Option<Announced>,
    /// A member published something else for the announced call:
    /// (communicator rank, what it published).
    pub split: Option<(usize, usize)>,
    /// The fast-path call this process waits in for a member's line: the
    /// member's local rank and the call ([`Engine::check_passed`]).
    pub awaited: Option<(usize, u64)>,
    /// A later call the awaited member published instead: it went on
    /// without publishing the awaited one, so the two disagree on it.
    pub passed: Option<u64>,
    /// This process's wait word is set (`ibcoll_shm::SlotArea::wait_word`).
    pub wait_published: bool,
    /// Local ranks, this one first, that each wait for the next's line of
    /// the awaited call, the last for this one's: they disagree on it.
    pub cycle: Option<Vec<usize>>,
}

/// A schedule's announcement in the slots (`crate::fastpath::SCHEDULE_MARK`).
pub(crate) struct Announced {
    /// Its fast-path call number.
    pub k: u64,
    /// What this rank published.
    pub mark: usize,
    /// Local rank of every member.
    pub locals: std::rc::Rc<[usize]>,
}

impl FastSeq {
    pub fn new(local_size: usize) -> FastSeq {
        FastSeq {
            seq: 0,
            seen: vec![0; local_size],
            min_other: 0,
            failed: 0,
            announced: None,
            split: None,
            awaited: None,
            passed: None,
            wait_published: false,
            cycle: None,
        }
    }
}

/// The engine of one process.
pub(crate) struct Engine {
    pub st: State,
    /// The peers this rank talks to, with their channels, send queues and
    /// reported health (`peers.rs`); this rank itself is one of them.
    pub peers: Peers,
    /// Sends queued over all peers.
    queued: usize,
    /// Control records waiting for room.
    ctl_retry: VecDeque<Action>,
    /// World ranks with an shm / tcp / rdma channel.
    pub shm_peers: Vec<usize>,
    /// This rank's shm receive queue (records that did not take a box).
    pub(crate) shm_inbox: Option<crate::transport::shm::ShmInbox>,
    /// The shm channels a progress pass polls (see `transport::shm`).
    pub(crate) shm_polled: crate::transport::shm::Polled,
    pub tcp_peers: Vec<usize>,
    pub rdma_peers: Vec<usize>,
    /// The verbs side: device, UD endpoint, rdma handshakes in progress
    /// (`rdma_connect.rs`); `None` without rdma.
    pub(crate) rdma: Option<crate::transport::rdma::RdmaNet>,
    /// The network side: listener, dials, accepted sockets, epoll set
    /// (`connect.rs`); `None` in a job that needs no sockets.
    pub(crate) net: Option<connect::Net>,
    /// What a first contact needs: this rank's card and whether node
    /// segments are in use.
    pub(crate) me: card::Card,
    pub(crate) use_shm: bool,
    /// A channel's health may have changed outside the polled list (a
    /// send failed, a dial ended, the launcher reported a death): the next
    /// pass looks at every peer's.
    pub(crate) health_dirty: bool,
    pub node: Option<Rc<NodeSegment>>,
    /// The fast paths' slots in `node`, checked once at init (`None`
    /// without a segment, or when they do not fit it).
    pub slots: Option<ibcoll_shm::SlotLayout>,
    pub local_rank: usize,
    pub local_size: usize,
    pub node_id: usize,
    pub num_nodes: usize,
    pub cfg: Config,
    pub spins: u32,
    pub yields: u32,
    pub pmi: Option<Pmi>,
    /// Next free communicator context id (even; odd ids are the internal
    /// twins used by collectives).
    pub next_ctx: u32,
    last_liveness: Instant,
    pub(crate) any_failed: bool,
    /// The peer a wait outside the operations (a fast path's flag) depends
    /// on: its liveness is watched like an operation's peer.
    pub(crate) watch: Option<usize>,
    /// This process has put its state for the hang watchdog.
    pub(crate) hang_published: bool,
    /// This rank's wake-up FIFO, made on the first block of a rank with both
    /// shm and socket/rdma peers (`Err` once making it failed: such a rank
    /// falls back to bounded doorbell sleeps).
    pub(crate) wake: Option<std::result::Result<ibcoll_shm::WakeFifo, ()>>,
    /// Shared-memory collective fast paths: their sequence and what was
    /// seen of the other local ranks (see `crate::fastpath`).
    pub(crate) fast: FastSeq,
    /// Why this process can no longer take part (a reduction operation
    /// panicked): every later call fails with [`Error::Poisoned`].
    pub(crate) poisoned: Option<String>,
    /// Counts for `IBCOLL_STATS` (`stats.rs`).
    pub(crate) stats: stats::Stats,
    /// The launcher's notification descriptor while it is in the epoll set.
    pub(crate) launcher_fd: Option<std::os::fd::RawFd>,
}

impl Engine {
    pub fn rank(&self) -> usize {
        self.st.rank
    }

    pub fn size(&self) -> usize {
        self.peers.job_size()
    }

    /// The health of world rank `peer`'s channel; a peer this rank has not
    /// talked to yet is presumed open.
    #[inline]
    pub fn health_of(&self, peer: usize) -> &Health {
        match self.peers.chan(peer) {
            Some(c) => c.health(),
            None => &Health::Open,
        }
    }

    /// The node of world rank `r`, from the process manager's map (none
    /// when it published no map).
    pub fn node_of(&self, r: usize) -> Option<usize> {
        if r == self.rank() {
            return Some(self.node_id);
        }
        self.pmi.as_ref().and_then(|p| p.node_of(r))
    }

    /// The channel of `peer`, made on first use ([`Engine::open_channel`]).
    #[inline]
    pub fn chan_mut(&mut self, peer: usize) -> &mut Channel {
        let i = match self.peers.slot(peer) {
            Some(i) => i,
            None => self.open_channel(peer),
        };
        &mut self.peers.list[i].chan
    }

    #[inline]
    fn peer_err(&self, peer: usize, op: ErrOp) -> Option<Error> {
        if matches!(self.health_of(peer), Health::Open) {
            return None;
        }
        self.peer_err_slow(peer, op)
    }

    #[cold]
    #[inline(never)]
    fn peer_err_slow(&self, peer: usize, op: ErrOp) -> Option<Error> {
        match self.health_of(peer) {
            Health::Open => None,
            Health::Closed => Some(Error::PeerLost {
                rank: self.st.rank,
                peer,
                op,
                reason: closed_reason(self.peers.chan(peer)),
            }),
            Health::Failed(r) => Some(Error::PeerLost {
                rank: self.st.rank,
                peer,
                op,
                reason: r.clone(),
            }),
        }
    }

    /// Starts a send of `len` bytes at `buf` to world rank `peer`.
    ///
    /// The caller keeps the buffer borrowed until the returned operation
    /// completes.
    #[inline]
    pub fn post_send(
        &mut self,
        peer: usize,
        ctx: u32,
        src: u32,
        tag: i32,
        buf: *const u8,
        len: usize,
    ) -> Result<Posted2> {
        self.post_send_mode(peer, ctx, src, tag, buf, len, false, 0)
    }

    /// [`post_send`](Self::post_send) of a message of a collective call
    /// with `stamp` ([`Header::stamp`]), which the matched receive records
    /// for its run to compare with its own.
    #[allow(clippy::too_many_arguments)]
    pub fn post_send_stamped(
        &mut self,
        peer: usize,
        ctx: u32,
        src: u32,
        tag: i32,
        buf: *const u8,
        len: usize,
        stamp: u32,
    ) -> Result<Posted2> {
        self.post_send_mode(peer, ctx, src, tag, buf, len, false, stamp)
    }

    /// A synchronous send (MPI_Ssend): always by rendezvous, at any size,
    /// so it completes only once the receiver has matched it (its CTS or
    /// FIN answers the RTS from the matched receive).
    pub fn post_ssend(
        &mut self,
        peer: usize,
        ctx: u32,
        src: u32,
        tag: i32,
        buf: *const u8,
        len: usize,
    ) -> Result<Posted2> {
        self.post_send_mode(peer, ctx, src, tag, buf, len, true, 0)
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn post_send_mode(
        &mut self,
        peer: usize,
        ctx: u32,
        src: u32,
        tag: i32,
        buf: *const u8,
        len: usize,
        sync: bool,
        stamp: u32,
    ) -> Result<Posted2> {
        let slot = match self.peers.slot(peer) {
            Some(i) => i,
            None => self.open_channel(peer),
        };
        if let Some(e) = self.peer_err(peer, ErrOp::Send) {
            return Err(e);
        }
        if let Some(e) = self.poison_err(ErrOp::Send) {
            return Err(e);
        }
        let p = &mut self.peers.list[slot];
        let ch = &mut p.chan;
        let mut hdr = Header {
            kind: Kind::Eager,
            src,
            tag,
            ctx,
            len: len as u64,
            seq: 0,
            stamp,
        };
        let idle = p.send_queue.is_empty();
        if !sync && len <= ch.eager_limit() {
            if idle {
                // SAFETY: the caller guarantees `len` readable bytes at
                // `buf` for the duration of the call.
                let payload = unsafe { std::slice::from_raw_parts(buf, len) };
                if ch.try_send(&hdr, payload) {
                    if !matches!(ch.health(), Health::Open) {
                        self.health_dirty = true;
                    }
                    return Ok(Posted2::Done);
                }
            }
        } else {
            hdr.kind = Kind::Rts;
        }
        let tok = self.st.ops.insert(Op {
            kind: OpKind::Send {
                peer,
                hdr,
                buf,
                len,
                stage: SendStage::Queued,
            },
            result: None,
        });
        if hdr.kind == Kind::Rts && idle && self.try_push_send(tok) {
            return Ok(Posted2::Pending(tok));
        }
        self.enqueue(slot, tok);
        Ok(Posted2::Pending(tok))
    }

    /// Queues send `tok` behind the others of peer entry `slot`.
    fn enqueue(&mut self, slot: usize, tok: Token) {
        let q = &mut self.peers.list[slot].send_queue;
        if q.is_empty() {
            self.peers.queued.push(slot as u32);
        }
        q.push_back(tok);
        self.queued += 1;
    }

    /// Tries to hand queued send `tok` to its channel.
    fn try_push_send(&mut self, tok: Token) -> bool {
        let Some(Op {
            kind:
                OpKind::Send {
                    peer,
                    hdr,
                    buf,
                    len,
                    stage,
                },
            result,
        }) = self.st.ops.get_mut(tok)
        else {
            return true;
        };
        if result.is_some() {
            return true;
        }
        let peer = *peer;
        let ch = match self.peers.get_mut(peer) {
            Some(p) => &mut p.chan,
            None => return false,
        };
        if !matches!(ch.health(), Health::Open) {
            // Off the queue; the health report fails it (a channel that
            // never connected must not complete an eager send).
            self.health_dirty = true;
            return true;
        }
        if hdr.kind == Kind::Eager {
            // SAFETY: the send's Request borrows `len` bytes at `buf` until
            // the operation completes.
            let payload = unsafe { std::slice::from_raw_parts(*buf, *len) };
            if !ch.try_send(hdr, payload) {
                return false;
            }
            *result = Some(Ok(Status::empty()));
        } else {
            let mut h = *hdr;
            h.seq = tok;
            let addr = ch.rts_addr(*buf).to_le_bytes();
            if !ch.try_send(&h, &addr) {
                return false;
            }
            *stage = SendStage::AwaitReply;
        }
        if !matches!(ch.health(), Health::Open) {
            self.health_dirty = true;
        }
        true
    }

    /// Posts a receive; `src` is the communicator rank (None = any) and
    /// `peer` its world rank.
    #[allow(clippy::too_many_arguments)]
    pub fn post_recv(
        &mut self,
        ctx: u32,
        src: Option<u32>,
        peer: Option<usize>,
        tag: Option<i32>,
        group: &Rc<[usize]>,
        buf: *mut u8,
        cap: usize,
    ) -> Token {
        let tok = self.st.ops.insert(Op {
            kind: OpKind::Recv {
                peer,
                group: group.clone(),
                buf,
                cap,
                stage: RecvStage::Posted,
                stamp: 0,
            },
            result: None,
        });
        if let Some(e) = self.poison_err(ErrOp::Recv) {
            if let Some(op) = self.st.ops.get_mut(tok) {
                op.result = Some(Err(e));
            }
            return tok;
        }
        if let Some(u) = self.st.matcher.take_unexpected(ctx, src, tag) {
            self.st.set_stamp(tok, u.stamp);
            match u.body {
                Body::Eager(data) => {
                    self.st.finish_eager(tok, u.peer, u.src, u.tag, &data);
                    self.st.eager_recycle(data);
                }
                Body::Rts { send_token, addr } => {
                    let info = self.chan_mut(u.peer).info();
                    self.st
                        .start_rndv(tok, u.peer, info, u.src, u.tag, u.len, send_token, addr);
                    self.apply_actions();
                }
            }
            return tok;
        }
        if let Some(e) = peer.and_then(|p| self.peer_err(p, ErrOp::Recv)) {
            if let Some(op) = self.st.ops.get_mut(tok) {
                op.result = Some(Err(e));
            }
            return tok;
        }
        self.st.matcher.post(Posted {
            ctx,
            src,
            tag,
            token: tok,
        });
        tok
    }

    /// Carries out queued actions; returns how many.
    pub fn apply_actions(&mut self) -> usize {
        let mut n = 0;
        while let Some(a) = self.st.actions.pop_front() {
            n += 1;
            match a {
                Action::Ctl { peer, hdr, word } => {
                    let w = word.unwrap_or(0).to_le_bytes();
                    let payload: &[u8] = if word.is_some() { &w } else { &[] };
                    // Never overtake a record of the same peer that found no
                    // room: the shm pipe pairs streams with CTSs by order.
                    if ctl_waits_for(&self.ctl_retry, peer, self.ctl_retry.len())
                        || !self.chan_mut(peer).try_send(&hdr, payload)
                    {
                        self.ctl_retry.push_back(Action::Ctl { peer, hdr, word });
                    }
                }
                Action::ExpectStream {
                    peer,
                    token,
                    wanted,
                } => {
                    let buf = self
                        .st
                        .recv_stream_buf(token)
                        .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr());
                    self.chan_mut(peer).expect_stream(token, wanted, buf)
                }
                Action::CmaRead {
                    peer,
                    token,
                    send_token,
                    addr,
                    buf,
                    wanted,
                } => self
                    .chan_mut(peer)
                    .start_cma_read(token, send_token, addr, buf, wanted),
                Action::StartStream {
                    peer,
                    send_token,
                    recv_token,
                    ptr,
                    len,
                } => {
                    let ch = self.chan_mut(peer);
                    ch.start_stream(send_token, recv_token, ptr, len);
                    if matches!(ch, Channel::Tcp(_)) {
                        // Its socket may be writable already: no edge will
                        // say so, so it is flushed until its queue is empty.
                        self.note_tcp_busy(peer);
                    }
                }
            }
        }
        n
    }

    /// Retries control records and queued sends that found no room.
    fn drain_queues(&mut self) -> usize {
        let mut n = 0;
        let mut again = 0;
        for _ in 0..self.ctl_retry.len() {
            let Some(a) = self.ctl_retry.pop_front() else {
                break;
            };
            if let Action::Ctl { peer, hdr, word } = a {
                let w = word.unwrap_or(0).to_le_bytes();
                let payload: &[u8] = if word.is_some() { &w } else { &[] };
                // The records put back in this pass are the last `again`;
                // one of this peer among them must stay ahead of this one.
                let behind = ctl_waits_for_last(&self.ctl_retry, peer, again);
                if !behind && self.chan_mut(peer).try_send(&hdr, payload) {
                    n += 1;
                } else {
                    self.ctl_retry.push_back(Action::Ctl { peer, hdr, word });
                    again += 1;
                }
            }
        }
        if self.queued == 0 {
            return n;
        }
        let mut k = 0;
        while k < self.peers.queued.len() {
            let slot = self.peers.queued[k] as usize;
            while let Some(&tok) = self.peers.list[slot].send_queue.front() {
                if !self.try_push_send(tok) {
                    break;
                }
                self.peers.list[slot].send_queue.pop_front();
                self.queued -= 1;
                n += 1;
            }
            if self.peers.list[slot].send_queue.is_empty() {
                self.peers.queued.swap_remove(k);
            } else {
                k += 1;
            }
        }
        n
    }

    /// Drops the send queues behind channels that failed or closed: nothing
    /// will carry them (at finalize, a dial to a peer that has already left
    /// is refused, and its queue must not hold the exit up to the peer
    /// timeout). Their operations fail through the health report.
    pub(super) fn drop_dead_queues(&mut self) {
        let mut k = 0;
        while k < self.peers.queued.len() {
            let slot = self.peers.queued[k] as usize;
            if matches!(self.peers.list[slot].chan.health(), Health::Open) {
                k += 1;
                continue;
            }
            self.check_health(slot);
            let p = &mut self.peers.list[slot];
            self.queued -= p.send_queue.len();
            p.send_queue.clear();
            self.peers.queued.swap_remove(k);
        }
    }

    /// Notices channels that closed or failed since the last look and fails
    /// the operations that needed them.
    fn check_health(&mut self, slot: usize) {
        let p = &mut self.peers.list[slot];
        if p.reported {
            return;
        }
        let (reason, died) = match p.chan.health() {
            Health::Open => return,
            Health::Closed => (closed_reason(Some(&p.chan)), false),
            Health::Failed(r) => (r.clone(), true),
        };
        p.reported = true;
        self.any_failed |= died;
        self.queued -= p.send_queue.len();
        p.send_queue.clear();
        let peer = p.rank;
        let cause = p.chan.bye_cause().unwrap_or(peer);
        self.st.fail_peer(peer, &reason, died, cause);
    }

    /// Removes a completed operation and returns its outcome.
    pub fn take_result(&mut self, tok: Token) -> Option<Result<Status>> {
        let done = self.st.ops.get(tok)?.result.is_some();
        if !done {
            return None;
        }
        self.st.ops.remove(tok).and_then(|op| op.result)
    }

    /// Withdraws receive `tok` if no message has matched it yet (nothing
    /// can land in its buffer afterwards); false otherwise.
    pub fn cancel_recv(&mut self, tok: Token) -> bool {
        if self.is_done(tok) {
            return false;
        }
        match self.st.ops.get(tok) {
            Some(Op {
                kind:
                    OpKind::Recv {
                        stage: RecvStage::Posted,
                        ..
                    },
                ..
            }) => {
                self.st.matcher.unpost(tok);
                self.st.ops.remove(tok);
                true
            }
            _ => false,
        }
    }

    /// Lets go of operation `tok` of a collective that gave up (a member
    /// failed): `Some(outcome)` when it was done (its error, if any), or
    /// when it could be dropped safely: a receive not matched yet is
    /// withdrawn (nothing can land in its buffer later), a send whose data
    /// is not streaming yet reads a leaked copy from now on (the peer may
    /// still ask for it). `None`: data is moving, wait for it.
    pub fn abandon(&mut self, tok: Token) -> Option<Option<Error>> {
        if self.is_done(tok) {
            return Some(self.take_result(tok).and_then(|r| r.err()));
        }
        match self.st.ops.get_mut(tok) {
            Some(Op {
                kind:
                    OpKind::Recv {
                        stage: RecvStage::Posted,
                        ..
                    },
                ..
            }) => {
                self.st.matcher.unpost(tok);
                self.st.ops.remove(tok);
                Some(None)
            }
            Some(Op {
                kind: OpKind::Send {
                    buf, len, stage, ..
                },
                ..
            }) if *stage != SendStage::Streaming => {
                // SAFETY: the send's buffer is still borrowed by the
                // collective giving up; the copy is leaked so that the
                // orphaned send may read it whenever the peer asks.
                let copy: &'static [u8] =
                    Box::leak(unsafe { std::slice::from_raw_parts(*buf, *len) }.into());
                *buf = copy.as_ptr();
                Some(None)
            }
            _ => None,
        }
    }

    /// The error of any call once the engine is poisoned (one load while
    /// it is not).
    #[inline]
    pub fn poison_err(&self, op: ErrOp) -> Option<Error> {
        self.poisoned.as_ref().map(|why| Error::Poisoned {
            rank: self.st.rank,
            op,
            detail: why.clone(),
        })
    }

    /// Marks the engine poisoned by a panic of a reduction operation in
    /// `op` (the first reason is kept).
    pub fn poison_by_panic(&mut self, op: ErrOp, p: &(dyn std::any::Any + Send)) {
        if self.poisoned.is_none() {
            self.poisoned = Some(format!(
                "a reduction operation panicked in {op} on rank {}: {}",
                self.st.rank,
                crate::ops::panic_message(p)
            ));
        }
    }

    /// The stamp of the message receive `tok` matched (0: none yet, or a
    /// message without one).
    pub fn recv_stamp(&self, tok: Token) -> u32 {
        match self.st.ops.get(tok) {
            Some(Op {
                kind: OpKind::Recv { stamp, .. },
                ..
            }) => *stamp,
            _ => 0,
        }
    }

    pub fn is_done(&self, tok: Token) -> bool {
        match self.st.ops.get(tok) {
            None => true,
            Some(op) => op.result.is_some(),
        }
    }

    /// A fresh context id agreed by the caller's protocol.
    pub fn bump_ctx(&mut self, at_least: u32) -> u32 {
        let c = self.next_ctx.max(at_least);
        self.next_ctx = c + 2;
        c
    }
}

impl Engine {
    /// The error an operation with world rank `peer` gets, if the peer is
    /// gone.
    pub fn peer_lost(&self, peer: usize, op: ErrOp) -> Option<Error> {
        self.peer_err(peer, op)
    }

    /// Like [`Engine::peer_lost`], but only for a peer that died: one that
    /// finalized normally may still have delivered everything it owed.
    /// A member of `group` (world ranks) whose channel failed, if any
    /// (one load while no peer has died).
    #[inline]
    pub fn failed_member(&self, group: &[usize]) -> Option<usize> {
        if !self.any_failed {
            return None;
        }
        group
            .iter()
            .copied()
            .find(|&g| matches!(self.health_of(g), Health::Failed(_)))
    }

    pub fn peer_died(&self, peer: usize, op: ErrOp) -> Option<Error> {
        match self.health_of(peer) {
            Health::Failed(_) => self.peer_err(peer, op),
            _ => None,
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.finalize();
    }
}
