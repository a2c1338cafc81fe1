//! The channel to a peer on the same node: records go into the small fast
//! box (an SPSC ring) the peer granted us when they fit and it has room,
//! else into the peer's receive queue (MPSC, shared by every local
//! sender), the peer's futex doorbell rung after every push (free when the
//! peer is awake); for rendezvous either a single copy by CMA or a
//! pipelined copy through the sender's pipe area.
//!
//! # Fast boxes only for senders that talk
//! A rank has a pool of `IBCOLL_SHM_BOXES` boxes. Every sender starts on
//! the queue; once a sender's records taken from the queue reach
//! `IBCOLL_SHM_BOX_AFTER`, the receiver (while it has a box left) makes
//! its consumer end of the next box, names it in the pair's grant word and
//! adds the channel to the list a progress pass polls ([`Polled`]). The
//! sender reads the grant word when it queues a record and, once it sees
//! one, opens the producer end. So a pass looks at the queue, at most
//! `IBCOLL_SHM_BOXES` boxes and the channels with rendezvous or control
//! work in flight, never at every local peer, and an untouched box costs
//! no resident memory.
//!
//! # Order across box and queue
//! A sender puts a record into the box only when every record it queued
//! to that peer has been released by the receiver (the queue's release
//! index is past it); the receiver, before it handles a queued record,
//! drains the sender's box. So box records are never overtaken by queued
//! ones, nor queued ones by box records.
//!
//! # One pipe per sender
//! A rank's one pipe streams to one receiver at a time. The pipe-owner
//! word in the segment names the receiver (and where its stream starts);
//! every slot is tagged with its receiver, so a receiver never takes
//! another's bytes. The sender hands the pipe to another receiver only
//! once the current stream is fully written and the pipe drained.
//!
//! # Rendezvous through the pipe
//! A rendezvous message below `cma_min` bytes (16 MiB unless the node is
//! oversubscribed) is not copied by CMA even when CMA works: the receiver
//! answers CTS and the sender streams it through the pair's pipe area,
//! two memcpys that overlap chunk by chunk. On this machine that is about
//! twice as fast as `process_vm_readv`, which spends a third of its time
//! pinning and walking the sender's pages and copies slower than an AVX
//! memcpy. It needs both ranks to progress, so an oversubscribed node,
//! where a rank may be descheduled, copies by CMA from the eager limit on.
//!
//! # Rendezvous by CMA
//! The receiver, once an RTS matched, copies the sender's buffer with
//! `process_vm_readv` in chunks of `cma_chunk` bytes, one chunk per poll,
//! so records that arrive meanwhile (FINs, new RTSs) are handled between
//! chunks. From `split_min` bytes on, both cores copy: when the receiver
//! begins a message it reads the first half itself and offers the second
//! half as chunks in a claim slot of the pair ([`ibcoll_shm::rndv`]),
//! announced to the sender by PUT. It does so only while it has no
//! rendezvous send of its own to that peer pending: otherwise the peer is
//! copying our messages (a two-way exchange) and both cores are busy
//! already.
//! The sender claims chunks and writes them into the receive buffer with
//! `process_vm_writev`; the receiver, once its own half is done, claims
//! whatever chunks are left and reads them. So a busy or descheduled
//! sender only costs the chunk it holds. The receive completes when the
//! slot counts every byte copied; only then does the receiver send FIN, so
//! the sender's buffer stays borrowed until all copies are over, and no
//! write into the receive buffer can come after its completion.
//!
//! PUT and PUT_FAILED are DATA records on the ring (the shm channel has no
//! other use for DATA), told apart by `tag`, and never reach the engine:
//! - PUT: `seq` = send token, `len` = bytes offered, `src` = slot,
//!   `ctx` = slot generation, payload = receiver's address of the first
//!   offered byte, its offset in the message, receive token, chunk size;
//! - PUT_FAILED (a write failed): `seq` = receive token, `len` = bytes not
//!   written, payload = their offset; the receiver reads them itself.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use ibcoll_shm::{
    NodeSegment, PipeReceiver, PipeSender, QueueConsumer, QueueProducer, RingConsumer,
    RingProducer, WakeWriter,
};

use super::header::{Header, Kind, HEADER_LEN};
use super::{Health, PeerInfo};
use crate::engine::ops::Token;
use crate::engine::State;

/// Records handled per poll, so one busy peer cannot starve the others.
const POLL_BATCH: usize = 32;

/// Bytes copied by one CMA call (one per poll and direction).
pub(crate) const CMA_CHUNK: usize = 1 << 20;

/// Smallest rendezvous message copied by CMA (when the pair also has a
/// pipe).
pub(crate) const CMA_MIN: usize = 16 << 20;

/// Smallest rendezvous message whose copy is split between receiver and
/// sender.
pub(crate) const SPLIT_MIN: usize = 64 * 1024;

const TAG_PUT: i32 = 1;
const TAG_PUT_FAILED: i32 = 2;

/// Control record payloads are at most this long.
const CTL_MAX: usize = 32;

/// A part of a receive this side copies by `process_vm_readv`.
struct CmaRead {
    recv_token: Token,
    /// Sender's buffer address (of byte 0 of the message).
    remote: usize,
    buf: *mut u8,
    off: usize,
    end: usize,
    /// Part of the offered (claimed) range: counted in the claim slot.
    shared: bool,
}

/// The offered part of a split receive.
struct Offer {
    slot: usize,
    gen: u32,
    /// Offset of the first offered byte, bytes offered, chunk size.
    start: usize,
    len: usize,
    chunk: usize,
}

impl Offer {
    fn chunks(&self) -> u32 {
        self.len.div_ceil(self.chunk) as u32
    }

    /// Range of chunk `k` in the message.
    fn range(&self, k: u32) -> (usize, usize) {
        let a = self.start + k as usize * self.chunk;
        (a, (a + self.chunk).min(self.start + self.len))
    }
}

/// A receive being copied by CMA.
struct RndvIn {
    recv_token: Token,
    send_token: u64,
    remote: usize,
    buf: *mut u8,
    /// Bytes to copy in all.
    wanted: usize,
    offer: Option<Offer>,
    err: Option<crate::error::Error>,
}

/// A split send this side helps with (PUT): claims chunks of the offer and
/// writes them into the receiver by `process_vm_writev`.
struct CmaPut {
    send_token: Token,
    recv_token: u64,
    /// Send buffer (byte 0 of the message).
    src: *const u8,
    /// Receiver's address of byte `offer.start` of the message.
    dst: usize,
    offer: Offer,
}

/// A control record waiting for ring space.
struct CtlRec {
    hdr: Header,
    payload: [u8; CTL_MAX],
    plen: usize,
}

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

/// This rank's one pipe, shared by its channels.
pub(crate) struct PipeOut {
    // Dropped before `node`, into which it points.
    tx: PipeSender,
    /// The receiver the pipe streams to now (local rank).
    owner: Option<usize>,
    /// A stream to `owner` is partly written.
    busy: bool,
    gen: u32,
    me: usize,
    node: Rc<NodeSegment>,
}

impl PipeOut {
    /// # Safety
    /// `me` is this process's local rank, and only one `PipeOut` is made
    /// per process.
    pub unsafe fn new(node: Rc<NodeSegment>, me: usize) -> ibcoll_shm::Result<PipeOut> {
        // SAFETY: forwarded contract; dropped before its `node`.
        let tx = unsafe { node.pipe_sender(me)? };
        Ok(PipeOut {
            tx,
            owner: None,
            busy: false,
            gen: 0,
            me,
            node,
        })
    }

    /// Takes the pipe for a stream to `peer`; false while it serves
    /// another.
    fn take(&mut self, peer: usize) -> bool {
        if self.owner == Some(peer) {
            return true;
        }
        if self.busy || !self.tx.is_drained() {
            return false;
        }
        self.gen = self.gen.wrapping_add(1).max(1);
        self.owner = Some(peer);
        let w = owner_word(self.gen, self.tx.position(), peer);
        self.node
            .pipe_owner(self.me)
            .store(w, std::sync::atomic::Ordering::Release);
        true
    }

    /// The stream's receiver is gone: nobody will drain what it holds.
    fn abandon(&mut self, peer: usize) {
        if self.owner == Some(peer) {
            self.tx.reset();
            self.owner = None;
            self.busy = false;
        }
    }
}

/// A slot's receiver tag: receiver + 1 (22 bits) and the low 9 bits of
/// the pipe generation it was written in (the tag has 31 bits).
fn slot_tag(gen: u32, peer: usize) -> u32 {
    (gen & 0x1ff) << 22 | (peer as u32 + 1) & 0x3f_ffff
}

/// Generation (32 bits), start slot (10 bits), receiver + 1 (22 bits).
fn owner_word(gen: u32, start: usize, peer: usize) -> u64 {
    u64::from(gen) << 32 | (start as u64 & 0x3ff) << 22 | (peer as u64 + 1) & 0x3f_ffff
}

/// The receiving end of a peer's pipe.
struct PipeIn {
    rx: PipeReceiver,
    seen_gen: u32,
}

/// Peer-table entries of the shm channels a progress pass polls: those
/// holding a box granted to their peer, and those with work besides the
/// box (streams, CMA copies, control records waiting for room). A channel
/// adds itself when it gets either; the pass drops it once it has neither.
pub(crate) type Polled = Rc<RefCell<Vec<u32>>>;

/// This rank's receive queue: records of every local sender without a box,
/// or whose box was full or too small, handed to the sender's channel.
/// It also hands out this rank's fast boxes.
pub(crate) struct ShmInbox {
    // Dropped before `_node`, into which it points.
    q: QueueConsumer,
    /// Peer-table entry of each local rank (u32::MAX: none).
    slots: Vec<u32>,
    /// Boxes granted so far, of `boxes`.
    granted: usize,
    boxes: usize,
    /// Queued records of a sender before it is granted a box.
    box_after: u32,
    _node: Rc<NodeSegment>,
}

impl ShmInbox {
    /// # Safety
    /// `me` is this process's local rank, and only one inbox is made per
    /// process.
    pub unsafe fn new(node: Rc<NodeSegment>, me: usize) -> ibcoll_shm::Result<ShmInbox> {
        // SAFETY: forwarded contract; dropped before its `node`.
        let q = unsafe { node.queue_consumer(me)? };
        Ok(ShmInbox {
            q,
            slots: vec![u32::MAX; node.layout().local_size()],
            granted: 0,
            boxes: node.layout().boxes(),
            box_after: 0,
            _node: node,
        })
    }

    /// Skips a record a dead local sender reserved in our queue but never
    /// published (see `ibcoll_shm::queue`), so the records of the others
    /// behind it are delivered. Called between blocks, not per pass: two
    /// loads when the queue is not stalled. Returns the cells skipped.
    pub fn skip_dead_reservation(&mut self, me: usize) -> u64 {
        if self.q.stalled().is_none() {
            return 0;
        }
        let node = &self._node;
        let n = node.layout().local_size();
        let intents = (0..n).filter(|&r| r != me).map(|r| {
            let pid = node.pid(r);
            (node.intent(r).get(), pid == 0 || ibcoll_shm::pid_alive(pid))
        });
        self.q.skip_dead(me as u32, intents)
    }

    /// Boxes this rank granted so far.
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// A sender gets a box once it queued `n` records (while any is left).
    pub fn grant_after(&mut self, n: u32) {
        self.box_after = n;
    }

    /// Records from local rank `local` go to peer-table entry `slot`.
    pub fn route(&mut self, local: usize, slot: usize) {
        self.slots[local] = slot as u32;
    }

    /// Handles up to a batch of queued records; one load when idle.
    #[inline]
    pub fn poll(&mut self, peers: &mut crate::engine::peers::Peers, st: &mut State) -> usize {
        if !self.q.maybe_ready() {
            return 0;
        }
        self.poll_slow(peers, st)
    }

    #[inline(never)]
    fn poll_slow(&mut self, peers: &mut crate::engine::peers::Peers, st: &mut State) -> usize {
        let mut n = 0;
        while n < POLL_BATCH {
            let Some(rec) = self.q.peek() else { break };
            let slot = self.slots.get(rec.src()).copied().unwrap_or(u32::MAX);
            if let Some(p) = peers.list.get_mut(slot as usize) {
                let peer = p.rank;
                if let super::Channel::Shm(c) = &mut p.chan {
                    c.on_queued(peer, st, rec.bytes());
                    if self.granted < self.boxes && c.wants_box(self.box_after) {
                        // Before the record is released: the sender takes
                        // the box only once its queued records are.
                        c.grant_box(self.granted);
                        self.granted += 1;
                    }
                }
            }
            rec.consume();
            n += 1;
        }
        n
    }
}

pub(crate) struct ShmChannel {
    // Field order matters: the ring and pipe handles point into the
    // segment, so they are dropped before `node`.
    /// The box the peer granted us, once it did.
    tx: Option<RingProducer>,
    /// The box we granted the peer, once we did.
    rx: Option<RingConsumer>,
    /// The peer's receive queue (None in a layout without queues).
    q: Option<QueueProducer>,
    /// Queue position past our last queued record, while the peer has not
    /// released it (then records must not take the box).
    q_end: u64,
    q_pending: bool,
    q_looks: u32,
    /// Largest record for the box (0 while the peer granted none).
    box_max: usize,
    /// Records of the peer taken from our queue (up to the grant).
    queued_in: u32,
    /// Our entry in the peer table, and whether it is in `polled`.
    slot: u32,
    listed: bool,
    polled: Polled,
    /// Everything an eager message does not touch, out of line.
    slow: Box<Slow>,
    node: Rc<NodeSegment>,
    me: usize,
    peer_local: usize,
    pub peer_pid: i32,
    /// Both sides can read each other's memory by CMA.
    pub cma: bool,
    /// Some queue of `slow` (streams, CMA copies, control records) is not
    /// empty: poll must look at more than the ring.
    busy: bool,
    pub eager_limit: usize,
    pub health: Health,
    /// Split copies from this many bytes (0: never).
    pub split_min: usize,
    pub cma_chunk: usize,
    /// Rendezvous messages from this many bytes are copied by CMA, smaller
    /// ones stream through the pipe (when the pair has one).
    pub cma_min: usize,
}

/// The rendezvous and wake-up state of a [`ShmChannel`].
struct Slow {
    pipe_tx: Option<Rc<RefCell<PipeOut>>>,
    pipe_rx: Option<PipeIn>,
    out_streams: VecDeque<OutStream>,
    in_streams: VecDeque<InStream>,
    /// The peer said goodbye while streams from it were still in the pipe
    /// (its sends completed once their bytes were in): the channel closes
    /// once those are drained.
    bye: bool,
    /// What its goodbye said ([`bye_header`](super::bye_header)).
    bye_cause: u64,
    scratch: Vec<u8>,
    reads: VecDeque<CmaRead>,
    rndv_in: Vec<RndvIn>,
    puts: VecDeque<CmaPut>,
    ctl: VecDeque<CtlRec>,
    /// Claim slots of the pair `peer -> me` not in use.
    free_slots: Vec<usize>,
    /// The peer's wake-up FIFO, opened the first time it sleeps in poll(2).
    wake: Option<WakeWriter>,
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
        pipe_tx: Option<Rc<RefCell<PipeOut>>>,
    ) -> ibcoll_shm::Result<ShmChannel> {
        // SAFETY: forwarded contract; the handles live in this struct, which
        // drops them before its `node` reference.
        let (q, pipe_rx) = unsafe {
            let q = match node.layout().queue_offset(peer_local) {
                Some(_) => Some(node.queue_producer(me, peer_local)?),
                None => None,
            };
            let prx = match (&pipe_tx, node.layout().pipe_offset(peer_local)) {
                (Some(_), Some(_)) => Some(PipeIn {
                    rx: node.pipe_receiver(peer_local)?,
                    seen_gen: 0,
                }),
                _ => None,
            };
            (q, prx)
        };
        Ok(ShmChannel {
            tx: None,
            rx: None,
            q,
            q_end: 0,
            q_pending: false,
            q_looks: 0,
            box_max: 0,
            queued_in: 0,
            slot: u32::MAX,
            listed: false,
            polled: Polled::default(),
            slow: Box::new(Slow {
                pipe_tx,
                pipe_rx,
                out_streams: VecDeque::new(),
                in_streams: VecDeque::new(),
                bye: false,
                bye_cause: 0,
                scratch: Vec::new(),
                reads: VecDeque::new(),
                rndv_in: Vec::new(),
                puts: VecDeque::new(),
                ctl: VecDeque::new(),
                free_slots: (0..ibcoll_shm::CLAIM_SLOTS).rev().collect(),
                wake: None,
            }),
            node,
            me,
            peer_local,
            peer_pid,
            cma,
            busy: false,
            eager_limit,
            health: Health::Open,
            split_min: SPLIT_MIN,
            cma_chunk: CMA_CHUNK,
            cma_min: CMA_MIN,
        })
    }

    /// The peer's index among the ranks of the node.
    pub fn peer_local(&self) -> usize {
        self.peer_local
    }

    /// Test hook: see [`ibcoll_shm::QueueProducer::die_mid_publish_at`].
    pub fn die_mid_queue_at(&mut self, n: u64) {
        if let Some(q) = self.q.as_mut() {
            q.die_mid_publish_at(n);
        }
    }

    /// Our entry in the peer table, and the engine's list of polled
    /// channels, which names it while we have a box of ours or work.
    pub fn set_slot(&mut self, slot: usize, polled: Polled) {
        self.slot = slot as u32;
        self.polled = polled;
    }

    /// Puts the channel on the list a progress pass polls.
    #[inline]
    fn enlist(&mut self) {
        if !self.listed && self.slot != u32::MAX {
            self.listed = true;
            self.polled.borrow_mut().push(self.slot);
        }
    }

    /// Work besides the box: polled on every pass until it is done.
    #[inline]
    fn set_busy(&mut self) {
        self.busy = true;
        self.enlist();
    }

    /// Nothing for a pass to look at (no box of ours, no work): the pass
    /// drops the channel from its list (`listed` off) when this holds.
    #[inline]
    pub fn unlist_if_idle(&mut self) -> bool {
        if self.busy || self.rx.is_some() {
            return false;
        }
        self.listed = false;
        true
    }

    /// Whether the peer has queued enough records to get a box from us.
    #[inline]
    fn wants_box(&self, after: u32) -> bool {
        self.rx.is_none() && self.health == Health::Open && self.queued_in >= after.max(1)
    }

    /// Grants the peer our fast box `index`: our end first, then the grant
    /// word (Release), and from now on every pass polls the box.
    #[inline(never)]
    fn grant_box(&mut self, index: usize) {
        // SAFETY: `me` is this process's local rank, and the inbox hands
        // each box index out once, so this is its only consumer; the handle
        // is dropped before `node` (field order).
        match unsafe { self.node.box_consumer(self.me, index) } {
            Ok(rx) => {
                self.rx = Some(rx);
                self.node
                    .box_grant(self.me, self.peer_local)
                    .store(index as u64 + 1, std::sync::atomic::Ordering::Release);
                self.enlist();
            }
            Err(e) => {
                self.health = Health::Failed(format!("fast box {index}: {e}"));
                self.enlist();
            }
        }
    }

    /// Sender: opens the box the peer granted us, if it did by now.
    #[inline(never)]
    fn take_grant(&mut self) {
        let g = self
            .node
            .box_grant(self.peer_local, self.me)
            .load(std::sync::atomic::Ordering::Acquire);
        if g == 0 {
            return;
        }
        // SAFETY: the peer granted box `g - 1` to us alone, so this is its
        // only producer; the handle is dropped before `node` (field order).
        match unsafe { self.node.box_producer(self.peer_local, g as usize - 1) } {
            Ok(tx) => {
                self.box_max = tx.max_record();
                self.tx = Some(tx);
            }
            Err(e) => {
                self.health =
                    Health::Failed(format!("fast box {} granted by the peer: {e}", g - 1));
                self.enlist();
            }
        }
    }

    /// Wakes the peer if it sleeps: a futex wake, or a byte into its
    /// wake-up FIFO when it blocks in poll(2) (it also has socket peers).
    /// One fence and one load while it is awake.
    #[inline]
    pub fn ring_peer(&mut self) {
        let bell = self.node.doorbell(self.peer_local);
        let wake = &mut self.slow.wake;
        bell.ring_with(|| {
            wake.get_or_insert_with(|| {
                WakeWriter::new(ibcoll_shm::wake_path(
                    self.node.segment().name(),
                    self.peer_local,
                ))
            })
            .poke();
        });
    }

    #[inline]
    pub fn try_send(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        let h = hdr.encode();
        // `box_max` is 0 until the peer granted a box.
        if h.len() + payload.len() <= self.box_max && (!self.q_pending || self.queue_caught_up()) {
            if let Some(tx) = &mut self.tx {
                if tx.try_push(&[&h, payload]) {
                    self.ring_peer();
                    return true;
                }
            }
        }
        self.try_queue(&h, payload)
    }

    /// Whether the peer has released everything we queued to it (then the
    /// box may carry records again).
    #[inline(never)]
    fn queue_caught_up(&mut self) -> bool {
        // The release index is a line the receiver writes per record:
        // looked at every 16th record only, so a stream of records does
        // not pull it over on each.
        self.q_looks = self.q_looks.wrapping_add(1);
        if self.q_looks % 16 != 0 {
            return false;
        }
        let released = self.q.as_mut().map_or(u64::MAX, |q| q.released());
        if released < self.q_end {
            return false;
        }
        self.q_pending = false;
        true
    }

    #[inline(never)]
    fn try_queue(&mut self, h: &[u8], payload: &[u8]) -> bool {
        if self.tx.is_none() {
            self.take_grant();
        }
        let Some(q) = self.q.as_mut() else {
            return false;
        };
        match q.try_push(&[h, payload]) {
            Some(end) => {
                self.q_end = end;
                self.q_pending = true;
                self.ring_peer();
                true
            }
            None => false,
        }
    }

    /// A record of this peer from our receive queue: the box holds the
    /// ones it sent before it, so they go first.
    pub fn on_queued(&mut self, peer: usize, st: &mut State, bytes: &[u8]) {
        if self.health != Health::Open {
            return;
        }
        self.queued_in = self.queued_in.saturating_add(1);
        while self.health == Health::Open && self.poll_box(peer, st, usize::MAX) > 0 {}
        if self.health != Health::Open {
            // The pass's health look must see it.
            self.enlist();
            return;
        }
        let info = self.info();
        let res = match Header::decode(bytes) {
            Ok(h) if h.kind == Kind::Bye => {
                self.slow.bye = true;
                self.slow.bye_cause = h.seq;
                self.set_busy();
                Ok(())
            }
            Ok(h) if h.kind == Kind::Data => self.on_data(peer, st, &h, &bytes[HEADER_LEN..]),
            Ok(h) => st.on_record(peer, info, &h, &bytes[HEADER_LEN..]),
            Err(e) => Err(format!("bad header on the shm queue: {e}")),
        };
        if let Err(e) = res {
            self.health = Health::Failed(e);
            self.enlist();
        }
    }

    fn info(&self) -> PeerInfo {
        PeerInfo {
            cma_pid: self.cma.then_some(self.peer_pid),
            local: false,
        }
    }

    /// Work is queued besides the ring (CMA copies, streams, control
    /// records waiting for ring space).
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    pub fn has_backlog(&self) -> bool {
        !self.slow.out_streams.is_empty()
    }

    pub fn start_stream(&mut self, send_token: Token, ptr: *const u8, len: usize) {
        self.set_busy();
        self.slow.out_streams.push_back(OutStream {
            send_token,
            ptr,
            len,
            off: 0,
        });
    }

    pub fn expect_stream(&mut self, recv_token: Token, wanted: usize) {
        self.set_busy();
        self.slow.in_streams.push_back(InStream {
            recv_token,
            wanted,
            got: 0,
        });
    }

    /// Receiver side: see [`super::Channel::start_cma_read`].
    ///
    /// Whether the copy is split is decided only when it begins (see
    /// [`ShmChannel::begin_read`]): a window of RTSs arrives at once, and
    /// offering them all up front would tie up every claim slot with
    /// messages the receiver will not reach for a while, leaving the
    /// later ones unsplit.
    pub fn start_cma_read(
        &mut self,
        recv_token: Token,
        send_token: u64,
        addr: u64,
        buf: *mut u8,
        wanted: usize,
    ) {
        if wanted < self.cma_min && self.slow.pipe_tx.is_some() && self.slow.pipe_rx.is_some() {
            // Two user-space copies through the pipe beat the kernel's
            // single copy here: process_vm_readv pins and walks every page
            // (a third of its time) and copies slower than memcpy.
            self.expect_stream(recv_token, wanted);
            let mut cts = Header::new(Kind::Cts);
            cts.seq = send_token;
            cts.len = wanted as u64;
            let mut p = [0u8; CTL_MAX];
            p[..8].copy_from_slice(&recv_token.to_le_bytes());
            self.send_ctl(cts, p, 8);
            return;
        }
        self.set_busy();
        let remote = addr as usize;
        self.slow.rndv_in.push(RndvIn {
            recv_token,
            send_token,
            remote,
            buf,
            wanted,
            offer: None,
            err: None,
        });
        self.slow.reads.push_back(CmaRead {
            recv_token,
            remote,
            buf,
            off: 0,
            end: wanted,
            shared: false,
        });
    }

    /// Receiver: the copy of a whole receive (the front read, not yet
    /// begun) starts now. If the message is large enough and the sender is
    /// not itself busy reading our messages (then both cores copy anyway
    /// and a split only adds coordination), keep the first half and offer
    /// the second to the sender by PUT.
    fn begin_read(&mut self, peer: usize, st: &State) {
        let Some(r) = self.slow.reads.front() else {
            return;
        };
        if r.shared || r.off != 0 || self.split_min == 0 || r.end < self.split_min {
            return;
        }
        // Asked once per message, so the eager path pays nothing for it.
        if st.rndv_sends_to(peer) {
            return;
        }
        let tok = r.recv_token;
        let Some(i) = self.slow.rndv_in.iter().position(|x| x.recv_token == tok) else {
            return;
        };
        let wanted = self.slow.rndv_in[i].wanted;
        // Split on a page boundary, so each side walks its own pages.
        let half = (wanted / 2) & !4095;
        if half == 0 || r.end != wanted || self.slow.rndv_in[i].offer.is_some() {
            return;
        }
        let Some(slot) = self.slow.free_slots.pop() else {
            return;
        };
        let gen = self.node.claim_slot(self.peer_local, self.me, slot).offer();
        let offer = Offer {
            slot,
            gen,
            start: half,
            len: wanted - half,
            chunk: self.cma_chunk,
        };
        let rin = &self.slow.rndv_in[i];
        let mut put = Header::new(Kind::Data);
        put.tag = TAG_PUT;
        put.seq = rin.send_token;
        put.len = offer.len as u64;
        put.src = slot as u32;
        put.ctx = gen;
        let mut p = [0u8; CTL_MAX];
        p[..8].copy_from_slice(&(rin.buf as u64 + half as u64).to_le_bytes());
        p[8..16].copy_from_slice(&(half as u64).to_le_bytes());
        p[16..24].copy_from_slice(&tok.to_le_bytes());
        p[24..].copy_from_slice(&(offer.chunk as u64).to_le_bytes());
        self.slow.rndv_in[i].offer = Some(offer);
        if let Some(r) = self.slow.reads.front_mut() {
            r.end = half;
        }
        self.send_ctl(put, p, CTL_MAX);
    }

    /// A CMA transfer found the peer process gone: the channel fails (so
    /// the engine fails what needs the peer and finalize skips the fence).
    fn note_gone(&mut self, e: &ibcoll_shm::ShmError) {
        if matches!(e, ibcoll_shm::ShmError::PeerGone { .. }) && self.health == Health::Open {
            self.health = Health::Failed(format!("process {} is gone", self.peer_pid));
        }
    }

    /// Sends a control record now, or queues it behind earlier ones.
    fn send_ctl(&mut self, hdr: Header, payload: [u8; CTL_MAX], plen: usize) {
        if self.slow.ctl.is_empty() && self.try_send(&hdr, &payload[..plen]) {
            return;
        }
        self.set_busy();
        self.slow.ctl.push_back(CtlRec { hdr, payload, plen });
    }

    fn flush_ctl(&mut self) -> usize {
        let mut n = 0;
        while let Some(c) = self.slow.ctl.front() {
            let (hdr, payload, plen) = (c.hdr, c.payload, c.plen);
            if !self.try_send(&hdr, &payload[..plen]) {
                break;
            }
            self.slow.ctl.pop_front();
            n += 1;
        }
        n
    }

    /// Receiver: moves receive `i` of `rndv_in` on once its own reads are
    /// over: claims a chunk of its offer that the sender has not taken,
    /// or, once the slot counts every offered byte, completes (or fails)
    /// the receive and answers FIN. Returns whether something happened.
    fn settle(&mut self, i: usize, st: &mut State) -> bool {
        let tok = self.slow.rndv_in[i].recv_token;
        if self.slow.reads.iter().any(|x| x.recv_token == tok) {
            return false;
        }
        if let Some(o) = &self.slow.rndv_in[i].offer {
            let slot = self.node.claim_slot(self.peer_local, self.me, o.slot);
            if let Some(k) = slot.claim(o.gen, o.chunks()) {
                let (off, end) = o.range(k);
                let r = &self.slow.rndv_in[i];
                let read = CmaRead {
                    recv_token: tok,
                    remote: r.remote,
                    buf: r.buf,
                    off,
                    end,
                    shared: true,
                };
                // First in line: it finishes a receive.
                self.slow.reads.push_front(read);
                return true;
            }
            if slot.done() < o.len as u64 {
                // The sender is still copying a chunk it claimed.
                return false;
            }
        }
        let r = self.slow.rndv_in.swap_remove(i);
        if let Some(o) = &r.offer {
            self.slow.free_slots.push(o.slot);
            if r.err.is_none() {
                st.recv_stream_advance(tok, o.len);
            }
        }
        if let Some(e) = r.err {
            st.recv_stream_fail(tok, e);
        }
        let mut fin = Header::new(Kind::Fin);
        fin.seq = r.send_token;
        self.send_ctl(fin, [0; CTL_MAX], 0);
        true
    }

    /// Handles a PUT or PUT_FAILED record.
    fn on_data(&mut self, peer: usize, st: &mut State, h: &Header, p: &[u8]) -> Result<(), String> {
        let w = |i: usize| -> Result<u64, String> {
            p.get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .ok_or_else(|| format!("shm DATA record of {} bytes is short", p.len()))
        };
        match h.tag {
            TAG_PUT => {
                let (dst, start, recv_token, chunk) =
                    (w(0)?, w(1)? as usize, w(2)?, w(3)? as usize);
                let n = h.len as usize;
                let slot = h.src as usize;
                let Some((src, len)) = st.send_awaiting(h.seq, peer) else {
                    return Err(format!("PUT for unknown send {:#x}", h.seq));
                };
                if !self.cma
                    || start.checked_add(n).map_or(true, |e| e > len)
                    || n == 0
                    || chunk == 0
                    || slot >= ibcoll_shm::CLAIM_SLOTS
                {
                    return Err(format!(
                        "PUT of {n} bytes at {start} (slot {slot}, chunk {chunk}) does not fit send of {len}"
                    ));
                }
                self.set_busy();
                self.slow.puts.push_back(CmaPut {
                    send_token: h.seq,
                    recv_token,
                    src,
                    dst: dst as usize,
                    offer: Offer {
                        slot,
                        gen: h.ctx,
                        start,
                        len: n,
                        chunk,
                    },
                });
            }
            TAG_PUT_FAILED => {
                let tok = h.seq;
                let (off, n) = (w(0)? as usize, h.len as usize);
                let Some(r) = self.slow.rndv_in.iter().find(|r| r.recv_token == tok) else {
                    // The receive failed meanwhile (its peer is gone).
                    return Ok(());
                };
                let ok = r
                    .offer
                    .as_ref()
                    .is_some_and(|o| off >= o.start && off + n <= o.start + o.len);
                if !ok {
                    return Err(format!(
                        "PUT_FAILED for {n} bytes at {off} outside the offer"
                    ));
                }
                // The sender claimed these bytes but could not write them.
                let read = CmaRead {
                    recv_token: tok,
                    remote: r.remote,
                    buf: r.buf,
                    off,
                    end: off + n,
                    shared: true,
                };
                self.set_busy();
                self.slow.reads.push_front(read);
            }
            t => return Err(format!("shm DATA record with unknown tag {t}")),
        }
        Ok(())
    }

    /// One chunk of the oldest CMA read and of the oldest CMA write, and
    /// the bookkeeping of split receives.
    fn poll_cma(&mut self, peer: usize, st: &mut State) -> usize {
        let mut n = 0;
        self.begin_read(peer, st);
        if let Some(r) = self.slow.reads.front_mut() {
            n += 1;
            let tok = r.recv_token;
            if !st.recv_streaming(tok) {
                // Failed meanwhile (peer lost): drop it. Its claim slot is
                // not reused while the dead sender might hold a chunk.
                self.slow.reads.retain(|x| x.recv_token != tok);
                self.slow.rndv_in.retain(|x| x.recv_token != tok);
            } else {
                let c = (r.end - r.off).min(self.cma_chunk);
                // SAFETY: the receive is still streaming, so its Request
                // still borrows `wanted >= r.end` bytes at `r.buf` mutably;
                // `off + c <= end`.
                let dst = unsafe { std::slice::from_raw_parts_mut(r.buf.add(r.off), c) };
                let res = ibcoll_shm::cma_read(self.peer_pid, r.remote + r.off, dst);
                let shared = r.shared;
                let left = r.end - r.off;
                let err = match res {
                    Ok(()) => {
                        r.off += c;
                        if r.off == r.end {
                            self.slow.reads.pop_front();
                        }
                        None
                    }
                    Err(e) => {
                        self.slow.reads.pop_front();
                        self.note_gone(&e);
                        Some(crate::engine::cma_error(
                            st.rank,
                            peer,
                            crate::error::Op::Recv,
                            e,
                        ))
                    }
                };
                let i = self.slow.rndv_in.iter().position(|x| x.recv_token == tok);
                match (shared, i) {
                    (true, Some(i)) => {
                        let o = self.slow.rndv_in[i].offer.as_ref().map(|o| o.slot);
                        if let Some(slot) = o {
                            // Counted even when it failed (the receive then
                            // fails), so completion never waits for it.
                            let bytes = if err.is_some() { left } else { c };
                            self.node
                                .claim_slot(self.peer_local, self.me, slot)
                                .add_done(bytes as u64);
                        }
                    }
                    _ if err.is_none() => {
                        st.recv_stream_advance(tok, c);
                    }
                    _ => {}
                }
                if let (Some(e), Some(i)) = (err, i) {
                    self.slow.rndv_in[i].err.get_or_insert(e);
                }
            }
        }
        // Receives whose own reads are over: steal chunks or complete.
        let mut i = 0;
        while i < self.slow.rndv_in.len() {
            let len = self.slow.rndv_in.len();
            if self.settle(i, st) {
                n += 1;
            }
            if self.slow.rndv_in.len() == len {
                i += 1;
            }
        }
        if let Some(p) = self.slow.puts.front() {
            n += 1;
            let slot = self.node.claim_slot(self.me, self.peer_local, p.offer.slot);
            let claimed = if st.send_awaiting(p.send_token, peer).is_some() {
                slot.claim(p.offer.gen, p.offer.chunks())
            } else {
                // Failed meanwhile (peer lost): nobody waits for the rest.
                None
            };
            match claimed {
                None => {
                    self.slow.puts.pop_front();
                }
                Some(k) => {
                    let (a, b) = p.offer.range(k);
                    // SAFETY: the send waits for the receiver's FIN, which
                    // comes only after the claim slot counts this chunk, so
                    // its Request still borrows `len >= b` bytes at `p.src`.
                    let src = unsafe { std::slice::from_raw_parts(p.src.add(a), b - a) };
                    let dst = p.dst + (a - p.offer.start);
                    let recv_token = p.recv_token;
                    match ibcoll_shm::cma_write(self.peer_pid, dst, src) {
                        Ok(()) => slot.add_done((b - a) as u64),
                        Err(e) => {
                            self.note_gone(&e);
                            // The receiver reads (and counts) this chunk.
                            let mut d = Header::new(Kind::Data);
                            d.tag = TAG_PUT_FAILED;
                            d.seq = recv_token;
                            d.len = (b - a) as u64;
                            let mut pl = [0u8; CTL_MAX];
                            pl[..8].copy_from_slice(&(a as u64).to_le_bytes());
                            self.send_ctl(d, pl, 8);
                        }
                    }
                }
            }
        }
        n
    }

    pub fn check_alive(&mut self) -> Option<String> {
        if self.health != Health::Open || ibcoll_shm::pid_alive(self.peer_pid) {
            return None;
        }
        Some(format!("process {} is gone", self.peer_pid))
    }

    /// Handles what arrived and moves what can move; an idle check (one
    /// load of the next ring cell, one flag) is all an idle poll costs.
    #[inline(always)]
    pub fn poll(&mut self, peer: usize, st: &mut State) -> usize {
        if !self.busy && !self.rx.as_ref().is_some_and(|r| r.maybe_ready()) {
            return 0;
        }
        self.poll_slow(peer, st)
    }

    /// Handles up to `batch` records of the box.
    fn poll_box(&mut self, peer: usize, st: &mut State, batch: usize) -> usize {
        let mut n = 0;
        let Some(rx) = &self.rx else { return 0 };
        if self.health == Health::Open || !rx.is_empty() {
            let info = self.info();
            let mut data = None;
            while n < batch {
                let Some(rec) = self.rx.as_mut().and_then(|r| r.peek()) else {
                    break;
                };
                let bytes = rec.bytes();
                let res = match Header::decode(bytes) {
                    Ok(h) if h.kind == Kind::Bye => {
                        self.slow.bye = true;
                        self.slow.bye_cause = h.seq;
                        Ok(())
                    }
                    Ok(h) if h.kind == Kind::Data => {
                        // Handled once the record is released (it borrows
                        // the ring); its payload is at most CTL_MAX bytes.
                        let pl = &bytes[HEADER_LEN..];
                        let k = pl.len().min(CTL_MAX);
                        let mut p = [0u8; CTL_MAX];
                        p[..k].copy_from_slice(&pl[..k]);
                        data = Some((h, p, k));
                        Ok(())
                    }
                    Ok(h) => st.on_record(peer, info, &h, &bytes[HEADER_LEN..]),
                    Err(e) => Err(format!("bad header on the shm ring: {e}")),
                };
                rec.consume();
                let res = match (res, data.take()) {
                    (Ok(()), Some((h, p, k))) => self.on_data(peer, st, &h, &p[..k]),
                    (res, _) => res,
                };
                n += 1;
                if let Err(e) = res {
                    self.health = Health::Failed(e);
                    break;
                }
            }
            // No ring here for a producer waiting for space: that would
            // cost a fence per receive; such a producer sleeps briefly and
            // re-checks instead (`SPACE_WAIT` in engine/progress.rs).
        }
        n
    }

    #[inline(never)]
    fn poll_slow(&mut self, peer: usize, st: &mut State) -> usize {
        let mut n = self.poll_box(peer, st, POLL_BATCH);
        if matches!(self.health, Health::Failed(_)) && !self.slow.out_streams.is_empty() {
            // The receiver is gone: its streams fail with the channel, and
            // the pipe is free for the others.
            if let Some(p) = &self.slow.pipe_tx {
                p.borrow_mut().abandon(self.peer_local);
            }
            self.slow.out_streams.clear();
        }
        if !self.slow.out_streams.is_empty() || !self.slow.in_streams.is_empty() {
            n += self.poll_pipes(st);
        }
        if self.slow.bye && self.slow.in_streams.is_empty() && self.health == Health::Open {
            self.health = Health::Closed;
        }
        if !self.slow.reads.is_empty()
            || !self.slow.rndv_in.is_empty()
            || !self.slow.puts.is_empty()
            || !self.slow.ctl.is_empty()
        {
            n += self.flush_ctl();
            n += self.poll_cma(peer, st);
        }
        self.busy = !self.slow.out_streams.is_empty()
            || !self.slow.in_streams.is_empty()
            || !self.slow.rndv_in.is_empty()
            || !self.slow.reads.is_empty()
            || !self.slow.puts.is_empty()
            || !self.slow.ctl.is_empty();
        n
    }

    fn poll_pipes(&mut self, st: &mut State) -> usize {
        let moved = usize::from(self.poll_out_stream(st)) + usize::from(self.poll_in_stream(st));
        if moved > 0 {
            // The peer may be asleep waiting for data or a free slot.
            self.ring_peer();
        }
        moved
    }

    /// Writes what fits of the oldest stream to the peer into our pipe;
    /// true if something was written.
    fn poll_out_stream(&mut self, st: &mut State) -> bool {
        let (Some(front), Some(pipe)) = (
            self.slow.out_streams.front_mut(),
            self.slow.pipe_tx.as_ref(),
        ) else {
            return false;
        };
        let mut po = pipe.borrow_mut();
        if !po.take(self.peer_local) {
            return false;
        }
        let tag = slot_tag(po.gen, self.peer_local);
        // SAFETY: the send's Request borrows `len` bytes at `ptr` until the
        // operation completes, which happens only below, after the last
        // byte has been copied out.
        let src = unsafe { std::slice::from_raw_parts(front.ptr, front.len) };
        let sent = po.tx.try_send_tagged(&src[front.off..], tag);
        front.off += sent;
        po.busy = front.off < front.len;
        if front.off == front.len {
            st.send_stream_done(front.send_token);
            self.slow.out_streams.pop_front();
        }
        sent > 0
    }

    /// Reads what the peer's pipe holds of the oldest stream from it; true
    /// if something was read.
    fn poll_in_stream(&mut self, st: &mut State) -> bool {
        let (Some(front), Some(pin)) =
            (self.slow.in_streams.front_mut(), self.slow.pipe_rx.as_mut())
        else {
            return false;
        };
        if front.got == front.wanted {
            // Nothing to read (a zero-byte receive of a truncated message).
            self.slow.in_streams.pop_front();
            return false;
        }
        let w = self
            .node
            .pipe_owner(self.peer_local)
            .load(std::sync::atomic::Ordering::Acquire);
        if w & 0x3f_ffff != self.me as u64 + 1 {
            // Not (yet) ours. Reading slots on this owner word would be
            // reading on a stale one: the sender may take the pipe for us
            // and fill slots between this load and theirs, and the restart
            // on the next pass would then skip what we had read (a hang
            // seen about once in 1,500 runs of a 2-rank bcast).
            return false;
        }
        let gen = (w >> 32) as u32;
        if gen != pin.seen_gen {
            // The pipe served another receiver since we last read it.
            pin.seen_gen = gen;
            pin.rx.restart_at(((w >> 22) & 0x3ff) as usize);
        }
        // Slots carry the generation too, so a stream begun for us after
        // the load above (at another start slot) reads as empty until the
        // next pass restarts there.
        let tag = slot_tag(gen, self.me);
        let left = front.wanted - front.got;
        let got = match st.recv_stream_buf(front.recv_token) {
            Some(dst) => {
                let m = left.min(dst.len());
                pin.rx.try_recv_tagged(&mut dst[..m], tag)
            }
            None => {
                // The receive failed meanwhile: drain and drop its bytes.
                self.slow.scratch.resize(left.min(1 << 16), 0);
                pin.rx.try_recv_tagged(&mut self.slow.scratch, tag)
            }
        };
        front.got += got;
        if got > 0 {
            st.recv_stream_advance(front.recv_token, got);
        }
        if front.got == front.wanted {
            self.slow.in_streams.pop_front();
        }
        got > 0
    }

    /// This rank's side of the work in flight with the peer, for a hang
    /// report: streams, CMA copies, control records waiting for room, and
    /// both pipes' state (owner word, generation, read position).
    pub fn describe(&self) -> String {
        let sl = &self.slow;
        let busy = !(sl.out_streams.is_empty()
            && sl.in_streams.is_empty()
            && sl.reads.is_empty()
            && sl.rndv_in.is_empty()
            && sl.puts.is_empty()
            && sl.ctl.is_empty());
        if !busy {
            return "shm: no transfer in flight".into();
        }
        let mut d = format!(
            "shm: {} stream(s) out, {} in",
            sl.out_streams.len(),
            sl.in_streams.len()
        );
        if let Some(o) = sl.out_streams.front() {
            d.push_str(&format!(", out front {} of {} B written", o.off, o.len));
        }
        if let Some(i) = sl.in_streams.front() {
            d.push_str(&format!(", in front {} of {} B read", i.got, i.wanted));
        }
        d.push_str(&format!(
            ", {} CMA read(s), {} split receive(s), {} put(s), {} control record(s) waiting",
            sl.reads.len(),
            sl.rndv_in.len(),
            sl.puts.len(),
            sl.ctl.len()
        ));
        let owner = |w: u64| {
            format!(
                "gen {} for local rank {} from slot {}",
                w >> 32,
                (w & 0x3f_ffff) as i64 - 1,
                (w >> 22) & 0x3ff
            )
        };
        if let Some(p) = &sl.pipe_tx {
            let p = p.borrow();
            let w = self
                .node
                .pipe_owner(self.me)
                .load(std::sync::atomic::Ordering::Acquire);
            d.push_str(&format!(
                "; our pipe: {}, busy {}, next slot {}, drained {}",
                owner(w),
                p.busy,
                p.tx.position(),
                p.tx.is_drained()
            ));
        }
        if let Some(pin) = &sl.pipe_rx {
            let w = self
                .node
                .pipe_owner(self.peer_local)
                .load(std::sync::atomic::Ordering::Acquire);
            let (slot, off) = pin.rx.position();
            d.push_str(&format!(
                "; its pipe: {}, seen gen {}, reading slot {slot} at {off} (ready {})",
                owner(w),
                pin.seen_gen,
                pin.rx.is_ready()
            ));
        }
        d
    }

    /// Tells the peer we are leaving; false if the ring has no room yet.
    pub fn send_bye(&mut self, cause: u64) -> bool {
        self.try_send(&super::bye_header(cause), &[])
    }

    /// What the peer's goodbye said (0: nothing).
    pub fn bye_cause(&self) -> u64 {
        self.slow.bye_cause
    }
}
