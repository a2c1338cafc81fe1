//! Communicators: a group of ranks plus a matching context.
//!
//! Each communicator owns two context ids: an even one for user
//! point-to-point traffic and the odd one after it for the library's own
//! collective traffic (split and the collectives in `collectives.rs`), so the
//! two never match each other's messages.

use std::rc::Rc;

use crate::datatype::{as_bytes, as_bytes_mut, Datatype};
use crate::engine::cell::EngineCell;
use crate::engine::{Engine, Posted2};
use crate::error::{Error, Op, Result};
use crate::request::{Request, Status};
use crate::scope::Scope;

/// Receive from any source.
pub const ANY_SOURCE: usize = usize::MAX;
/// Receive any tag.
pub const ANY_TAG: i32 = -1;
/// Color for [`Comm::split`] meaning "not in any new communicator".
pub const UNDEFINED: i32 = -1;

const TAG_SPLIT: i32 = 1;

/// A communicator.
///
/// Threading: ibcoll is called from one thread per process (like
/// `MPI_THREAD_FUNNELED`): the thread that called [`crate::init`]. A
/// `Comm`, and every request and scope made from it, is neither `Send` nor
/// `Sync`, so the compiler keeps them on that thread:
///
/// ```compile_fail
/// fn needs_send<T: Send>(_: T) {}
/// let world = ibcoll::init().unwrap();
/// needs_send(world);
/// ```
pub struct Comm {
    pub(crate) eng: Rc<EngineCell>,
    pub(crate) ctx: u32,
    rank: usize,
    /// World rank of each member.
    pub(crate) group: Rc<[usize]>,
    /// What the collectives learned about the group on first use (see
    /// `collectives.rs`).
    pub(crate) coll: std::cell::OnceCell<crate::collectives::CollInfo>,
    /// Multicast broadcast state, set up on first use (`mcast.rs`); holds
    /// the group membership, left when the communicator is dropped.
    pub(crate) mcast: std::cell::RefCell<Option<crate::mcast::State>>,
    /// Node and leaders communicators of the `hier` algorithms, made on
    /// first use (`hier.rs`).
    pub(crate) hier: std::cell::RefCell<Option<crate::hier::State>>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.group.len())
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl Comm {
    pub(crate) fn world(eng: Engine) -> Comm {
        let rank = eng.rank();
        let size = eng.size();
        Comm {
            eng: Rc::new(EngineCell::new(eng)),
            ctx: 0,
            rank,
            group: (0..size).collect::<Vec<_>>().into(),
            coll: Default::default(),
            mcast: Default::default(),
            hier: Default::default(),
        }
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.group.len()
    }

    /// World rank of communicator rank `r`.
    pub fn world_rank(&self, r: usize) -> Option<usize> {
        self.group.get(r).copied()
    }

    /// This process's node.
    pub fn node_id(&self) -> usize {
        self.eng.borrow().node_id
    }

    /// Number of nodes in the job.
    pub fn num_nodes(&self) -> usize {
        self.eng.borrow().num_nodes
    }

    /// This process's index among the ranks of its node.
    pub fn local_rank(&self) -> usize {
        self.eng.borrow().local_rank
    }

    /// Number of ranks on this process's node.
    pub fn local_size(&self) -> usize {
        self.eng.borrow().local_size
    }

    /// Channel used to reach communicator rank `r`: "self", "shm", "tcp"
    /// or "rdma" (made now if this rank had none to it yet).
    pub fn transport_to(&self, r: usize) -> Option<&'static str> {
        let w = self.world_rank(r)?;
        Some(self.eng.borrow_mut().chan_mut(w).name())
    }

    /// Largest message sent eagerly to communicator rank `r`.
    pub fn eager_limit_to(&self, r: usize) -> Option<usize> {
        let w = self.world_rank(r)?;
        Some(self.eng.borrow_mut().chan_mut(w).eager_limit())
    }

    /// Ends the whole job with `code` (through the process manager).
    pub fn abort(&self, code: i32, msg: &str) -> ! {
        let pmi = self.eng.borrow_mut().pmi.take();
        match pmi {
            Some(mut p) => p.abort(code, msg),
            None => {
                eprintln!("ibcoll: rank {} aborting: {msg}", self.rank);
                std::process::exit(if code == 0 { 1 } else { code })
            }
        }
    }

    fn invalid(&self, op: Op, detail: String) -> Error {
        Error::InvalidArgument {
            rank: self.eng.borrow().rank(),
            op,
            detail,
        }
    }

    fn dest_world(&self, dest: usize, tag: i32, op: Op) -> Result<usize> {
        if tag < 0 {
            return Err(self.invalid(op, format!("tag {tag} is negative")));
        }
        self.world_rank(dest).ok_or_else(|| {
            self.invalid(
                op,
                format!(
                    "destination {dest} is not below the communicator size {}",
                    self.size()
                ),
            )
        })
    }

    fn source_filter(
        &self,
        source: usize,
        tag: i32,
        op: Op,
    ) -> Result<(Option<u32>, Option<usize>, Option<i32>)> {
        let tag = match tag {
            ANY_TAG => None,
            t if t < 0 => {
                return Err(self.invalid(op, format!("tag {t} is negative (and not ANY_TAG)")))
            }
            t => Some(t),
        };
        if source == ANY_SOURCE {
            return Ok((None, None, tag));
        }
        let w = self.world_rank(source).ok_or_else(|| {
            self.invalid(
                op,
                format!(
                    "source {source} is not below the communicator size {}",
                    self.size()
                ),
            )
        })?;
        Ok((Some(source as u32), Some(w), tag))
    }

    fn isend_on<'a>(
        &self,
        ctx: u32,
        bytes: &'a [u8],
        dest: usize,
        tag: i32,
    ) -> Result<Request<'a>> {
        self.isend_mode(ctx, bytes, dest, tag, false)
    }

    #[inline(always)]
    fn isend_mode<'a>(
        &self,
        ctx: u32,
        bytes: &'a [u8],
        dest: usize,
        tag: i32,
        sync: bool,
    ) -> Result<Request<'a>> {
        let peer = self.dest_world(dest, tag, Op::Send)?;
        let mut e = self.eng.borrow_mut();
        let (r, b) = (self.rank as u32, bytes.as_ptr());
        let posted = if sync {
            e.post_ssend(peer, ctx, r, tag, b, bytes.len())?
        } else {
            e.post_send(peer, ctx, r, tag, b, bytes.len())?
        };
        drop(e);
        Ok(match posted {
            Posted2::Done => Request::finished(&self.eng, Ok(Status::empty())),
            Posted2::Pending(tok) => Request::pending(&self.eng, tok),
        })
    }

    fn irecv_on<'a>(
        &self,
        ctx: u32,
        bytes: &'a mut [u8],
        source: usize,
        tag: i32,
    ) -> Result<Request<'a>> {
        let (src, peer, tag) = self.source_filter(source, tag, Op::Recv)?;
        let tok = self.eng.borrow_mut().post_recv(
            ctx,
            src,
            peer,
            tag,
            &self.group,
            bytes.as_mut_ptr(),
            bytes.len(),
        );
        Ok(Request::pending(&self.eng, tok))
    }

    fn send_on(&self, ctx: u32, bytes: &[u8], dest: usize, tag: i32) -> Result<()> {
        self.send_mode(ctx, bytes, dest, tag, false)
    }

    #[inline(always)]
    fn send_mode(&self, ctx: u32, bytes: &[u8], dest: usize, tag: i32, sync: bool) -> Result<()> {
        let peer = self.dest_world(dest, tag, Op::Send)?;
        let mut e = self.eng.borrow_mut();
        let (r, b) = (self.rank as u32, bytes.as_ptr());
        let posted = if sync {
            e.post_ssend(peer, ctx, r, tag, b, bytes.len())?
        } else {
            e.post_send(peer, ctx, r, tag, b, bytes.len())?
        };
        match posted {
            Posted2::Done => Ok(()),
            Posted2::Pending(tok) => {
                if let Some(x) = e.wait_op_watched(tok, Op::Send) {
                    return Err(x);
                }
                match e.take_result(tok) {
                    Some(r) => r.map(|_| ()).map_err(|e| e.with_op(Op::Send)),
                    None => Ok(()),
                }
            }
        }
    }

    fn recv_on(&self, ctx: u32, bytes: &mut [u8], source: usize, tag: i32) -> Result<Status> {
        let (src, peer, tag) = self.source_filter(source, tag, Op::Recv)?;
        let mut e = self.eng.borrow_mut();
        let tok = e.post_recv(
            ctx,
            src,
            peer,
            tag,
            &self.group,
            bytes.as_mut_ptr(),
            bytes.len(),
        );
        if let Some(x) = e.wait_op_watched(tok, Op::Recv) {
            return Err(x);
        }
        e.take_result(tok).unwrap_or_else(|| Ok(Status::empty()))
    }

    /// Sends `buf` to rank `dest` with `tag` (>= 0); returns once the buffer
    /// may be reused.
    pub fn send<T: Datatype>(&self, buf: &[T], dest: usize, tag: i32) -> Result<()> {
        self.send_on(self.ctx, as_bytes(buf), dest, tag)
    }

    /// Synchronous [`Comm::send`] (MPI_Ssend): returns only once the
    /// receiver has matched the message with a receive, at any size.
    pub fn ssend<T: Datatype>(&self, buf: &[T], dest: usize, tag: i32) -> Result<()> {
        self.send_mode(self.ctx, as_bytes(buf), dest, tag, true)
    }

    /// Nonblocking [`Comm::ssend`] (MPI_Issend): the request completes only
    /// once the receiver has matched the message.
    pub fn issend<'s, T: Datatype>(
        &self,
        s: &'s Scope<'s, '_>,
        buf: &'s [T],
        dest: usize,
        tag: i32,
    ) -> Result<Request<'s>> {
        let r = self.isend_mode(self.ctx, as_bytes(buf), dest, tag, true);
        self.track(s, &r);
        r
    }

    /// Receives into `buf` from `source` (or [`ANY_SOURCE`]) with `tag` (or
    /// [`ANY_TAG`]). A longer message gives [`Error::Truncated`] after
    /// filling `buf`.
    pub fn recv<T: Datatype>(&self, buf: &mut [T], source: usize, tag: i32) -> Result<Status> {
        self.recv_on(self.ctx, as_bytes_mut(buf), source, tag)
    }

    /// Starts a send in scope `s`; the buffer stays borrowed until the
    /// scope ends, which finishes the send if nothing else did (see
    /// [`crate::scope`]).
    #[inline]
    pub fn isend<'s, T: Datatype>(
        &self,
        s: &'s Scope<'s, '_>,
        buf: &'s [T],
        dest: usize,
        tag: i32,
    ) -> Result<Request<'s>> {
        let r = self.isend_on(self.ctx, as_bytes(buf), dest, tag);
        self.track(s, &r);
        r
    }

    /// Has scope `s` track the operation of a request just made (the
    /// result is looked at in place: moving it through `?` and `Ok` copied
    /// the request twice).
    #[inline]
    fn track<'s>(&self, s: &'s Scope<'s, '_>, r: &Result<Request<'s>>) {
        if let Ok(q) = r {
            if let Some(t) = q.token() {
                s.track_op(&self.eng, t);
            }
        }
    }

    /// Starts a receive in scope `s`; the buffer stays borrowed until the
    /// scope ends, which finishes the receive if nothing else did (see
    /// [`crate::scope`]).
    #[inline]
    pub fn irecv<'s, T: Datatype>(
        &self,
        s: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        source: usize,
        tag: i32,
    ) -> Result<Request<'s>> {
        let r = self.irecv_on(self.ctx, as_bytes_mut(buf), source, tag);
        self.track(s, &r);
        r
    }

    /// Sends and receives at once (no deadlock between two ranks doing it).
    pub fn sendrecv<S: Datatype, R: Datatype>(
        &self,
        sendbuf: &[S],
        dest: usize,
        sendtag: i32,
        recvbuf: &mut [R],
        source: usize,
        recvtag: i32,
    ) -> Result<Status> {
        // Both are waited for here (dropping waits too), so the requests
        // need no scope.
        let r = self.irecv_on(self.ctx, as_bytes_mut(recvbuf), source, recvtag)?;
        let s = self.isend_on(self.ctx, as_bytes(sendbuf), dest, sendtag)?;
        // The receive's error first: a receive the watchdog gave up on
        // says for whom it waited (the send may then wait in turn).
        let rs = r.wait();
        let ss = s.wait();
        rs.and_then(|st| ss.map(|_| st))
    }

    /// Waits for a matching message without receiving it.
    pub fn probe(&self, source: usize, tag: i32) -> Result<Status> {
        let (src, peer, tag) = self.source_filter(source, tag, Op::Probe)?;
        let ctx = self.ctx;
        let mut e = self.eng.borrow_mut();
        if let Some(err) = e.poison_err(Op::Probe) {
            return Err(err);
        }
        let mut lost = None;
        let hung = e.wait_until_watched(|e| {
            if e.st.matcher.peek_unexpected(ctx, src, tag).is_some() {
                return true;
            }
            lost = peer.and_then(|p| e.peer_lost(p, Op::Probe));
            lost.is_some()
        });
        if let (Some(waited), None) = (hung, e.st.matcher.peek_unexpected(ctx, src, tag)) {
            let (what, peers) = match peer {
                Some(p) => (format!("probe for a message from rank {p}"), vec![p]),
                None => (
                    "probe for a message from any rank".into(),
                    self.group.to_vec(),
                ),
            };
            return Err(e.hang_error(Op::Probe, &what, &peers, waited));
        }
        if let Some(u) = e.st.matcher.peek_unexpected(ctx, src, tag) {
            return Ok(Status {
                source: u.src as usize,
                tag: u.tag,
                len: u.len,
            });
        }
        Err(lost.unwrap_or_else(|| self.invalid(Op::Probe, "probe ended without a message".into())))
    }

    /// Like [`Comm::probe`] but returns `None` at once if no message waits.
    pub fn iprobe(&self, source: usize, tag: i32) -> Result<Option<Status>> {
        let (src, peer, tag) = self.source_filter(source, tag, Op::Probe)?;
        let mut e = self.eng.borrow_mut();
        if let Some(err) = e.poison_err(Op::Probe) {
            return Err(err);
        }
        e.progress();
        if let Some(u) = e.st.matcher.peek_unexpected(self.ctx, src, tag) {
            return Ok(Some(Status {
                source: u.src as usize,
                tag: u.tag,
                len: u.len,
            }));
        }
        match peer.and_then(|p| e.peer_lost(p, Op::Probe)) {
            Some(err) => Err(err),
            None => Ok(None),
        }
    }

    /// Ring allgather of one fixed-size item per rank on the internal
    /// context.
    fn allgather_items<const N: usize>(&self, mine: [u8; N], op: Op) -> Result<Vec<[u8; N]>> {
        let n = self.size();
        let mut all = vec![[0u8; N]; n];
        all[self.rank] = mine;
        let right = (self.rank + 1) % n;
        let left = (self.rank + n - 1) % n;
        for step in 0..n.saturating_sub(1) {
            let send_idx = (self.rank + n - step) % n;
            let recv_idx = (self.rank + n - step - 1) % n;
            let out = all[send_idx];
            let mut inc = [0u8; N];
            let r = self.irecv_on(self.ctx + 1, &mut inc, left, TAG_SPLIT)?;
            self.send_on(self.ctx + 1, &out, right, TAG_SPLIT)
                .map_err(|e| e.with_op(op))?;
            r.wait().map_err(|e| e.with_op(op))?;
            all[recv_idx] = inc;
        }
        Ok(all)
    }

    /// Splits into disjoint communicators, one per `color` (>= 0), ranked
    /// by `key` then by rank here. Collective over this communicator.
    /// Ranks passing [`UNDEFINED`] get `None`.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Comm>> {
        if color < 0 && color != UNDEFINED {
            return Err(self.invalid(
                Op::Split,
                format!("color {color} is negative (and not UNDEFINED)"),
            ));
        }
        let next = self.eng.borrow().next_ctx;
        let mut item = [0u8; 12];
        item[..4].copy_from_slice(&color.to_le_bytes());
        item[4..8].copy_from_slice(&key.to_le_bytes());
        item[8..].copy_from_slice(&next.to_le_bytes());
        let all = self.allgather_items(item, Op::Split)?;
        let field = |b: &[u8; 12], i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        let ctx = all
            .iter()
            .map(|b| u32::from_le_bytes(field(b, 8)))
            .max()
            .unwrap_or(next);
        if ctx >= u32::MAX - 2 {
            return Err(self.invalid(Op::Split, "out of communicator context ids".into()));
        }
        // Every member of every new communicator agrees on `ctx`, and no
        // member has used it; distinct colors share it but no rank.
        let ctx = self.eng.borrow_mut().bump_ctx(ctx);
        if color == UNDEFINED {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, b)| i32::from_le_bytes(field(b, 0)) == color)
            .map(|(r, b)| (i32::from_le_bytes(field(b, 4)), r))
            .collect();
        members.sort();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .unwrap_or(0);
        let group: Rc<[usize]> = members.iter().map(|&(_, r)| self.group[r]).collect();
        Ok(Some(Comm {
            eng: self.eng.clone(),
            ctx,
            rank,
            group,
            coll: Default::default(),
            mcast: Default::default(),
            hier: Default::default(),
        }))
    }

    /// A communicator of this rank alone (MPI's `MPI_COMM_SELF`), made
    /// without a message: its context is taken from this rank's own
    /// counter, which every later `split` it takes part in goes beyond.
    pub fn self_comm(&self) -> Comm {
        let me = self.group[self.rank];
        let next = self.eng.borrow().next_ctx;
        let ctx = self.eng.borrow_mut().bump_ctx(next);
        Comm {
            eng: self.eng.clone(),
            ctx,
            rank: 0,
            group: Rc::from([me]),
            coll: Default::default(),
            mcast: Default::default(),
            hier: Default::default(),
        }
    }

    /// A communicator with the same ranks and a new context.
    pub fn dup(&self) -> Result<Comm> {
        match self
            .split(0, self.rank as i32)
            .map_err(|e| e.with_op(Op::Dup))?
        {
            Some(c) => Ok(c),
            None => Err(self.invalid(Op::Dup, "dup produced no communicator".into())),
        }
    }
}
