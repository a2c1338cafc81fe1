//! One member's state machine: bytes and instants in, packets and errors
//! out (no sockets, no clock). See the module documentation for the
//! protocol.

use super::wire::{Abort, Ack, Control, DataHdr, Nack, DATA_HDR, HINT_UNIT, NACK_MAX_RANGES};
use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// Parameters of one group member. Every member of a group must use the
/// same `group`, `members`, `mtu` (it fixes the fragmentation) and
/// `window`/`ack_step`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Tag carried by every packet (the communicator's); packets of other
    /// groups sharing the QP are ignored.
    pub group: u32,
    /// This member's index, `0..members`.
    pub me: u32,
    /// Members of the group.
    pub members: u32,
    /// Largest datagram (the path MTU): header plus fragment.
    pub mtu: usize,
    /// Fragments a source holds unacknowledged (its whole buffer: `window
    /// × mtu` bytes, whatever the message size).
    pub window: usize,
    /// A member acknowledges each time its subtree's prefix grows by this
    /// many fragments (and at the end); at most `window / 2`.
    pub ack_step: u32,
    /// A receiver missing fragments nacks them after this long without a
    /// new one (gaps it sees are nacked at once), or after the root's
    /// hint where that is longer.
    pub nack_delay: Duration,
    /// A source retransmits one fragment at most once in this interval,
    /// however many members nack it (suppression at the root), or in its
    /// measured round trip where that is longer.
    pub retx_holdoff: Duration,
    /// No progress for this long on something this member waits for (acks
    /// from a subtree; data from the root: a quarter longer):
    /// `Error::PeerLost`.
    pub peer_timeout: Duration,
    /// Broadcasts a member keeps open (begun, not yet acknowledged by its
    /// subtree) before `can_begin` says wait.
    pub max_open: usize,
    /// Fragments of broadcasts not begun yet that a member keeps (copies);
    /// beyond, they are dropped and repaired later by nack.
    pub early_cap: usize,
}

impl Config {
    /// Defaults for everything but the identity and the MTU.
    pub fn new(group: u32, me: u32, members: u32, mtu: usize) -> Config {
        Config {
            group,
            me,
            members,
            mtu,
            window: 64,
            ack_step: 16,
            nack_delay: Duration::from_micros(200),
            retx_holdoff: Duration::from_micros(100),
            peer_timeout: Duration::from_secs(10),
            max_open: 64,
            early_cap: 64,
        }
    }

    /// Payload bytes per fragment.
    pub fn payload(&self) -> usize {
        self.mtu.saturating_sub(DATA_HDR)
    }

    /// Fragments of a broadcast of `len` bytes.
    pub fn nfrags(&self, len: usize) -> u64 {
        (len as u64).div_ceil(self.payload().max(1) as u64)
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |what: String| {
            Err(Error::Usage {
                group: self.group,
                me: self.me,
                what,
            })
        };
        if self.members == 0 || self.me >= self.members {
            return bad(format!("member {} of a group of {}", self.me, self.members));
        }
        if self.mtu <= DATA_HDR {
            return bad(format!(
                "MTU {} leaves no payload after the {DATA_HDR}-byte header",
                self.mtu
            ));
        }
        if self.window < 2 || self.ack_step == 0 || self.ack_step as usize > self.window / 2 {
            return bad(format!(
                "window {} and ack step {}: need window >= 2 and 1 <= step <= window / 2",
                self.window, self.ack_step
            ));
        }
        if self.max_open == 0 {
            return bad("max_open 0".into());
        }
        Ok(())
    }
}

/// What went wrong, with the group, this member and the other one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Something this member waited for made no progress within
    /// `peer_timeout`: `peer` (or a member `peer` waits for) is gone.
    PeerLost {
        /// Group tag.
        group: u32,
        /// This member.
        me: u32,
        /// The member held responsible (the root for missing data, the
        /// laggard of the subtree for missing acks).
        peer: u32,
        /// Broadcast number.
        bcast: u32,
        /// What was awaited.
        what: &'static str,
        /// How long without progress.
        waited: Duration,
    },
    /// Another member lost `peer` (its [`Error::PeerLost`]) and said so
    /// in an abort: this member stops waiting too.
    Reported {
        /// Group tag.
        group: u32,
        /// This member.
        me: u32,
        /// The member lost.
        peer: u32,
        /// Broadcast number.
        bcast: u32,
        /// The member that lost it.
        by: u32,
    },
    /// The root's packets disagree with this member's call.
    Mismatch {
        /// Group tag.
        group: u32,
        /// This member.
        me: u32,
        /// Broadcast number.
        bcast: u32,
        /// Root and length as this member called it.
        mine: (u32, u64),
        /// Root and length in the packets.
        theirs: (u32, u64),
    },
    /// The caller broke the contract (begin while a broadcast is
    /// incomplete, a buffer of the wrong length, a bad control message).
    Usage {
        /// Group tag.
        group: u32,
        /// This member.
        me: u32,
        /// What.
        what: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::PeerLost {
                group,
                me,
                peer,
                bcast,
                what,
                waited,
            } => write!(
                f,
                "multicast group {group:#x}: member {me} lost member {peer} in broadcast {bcast}: no {what} for {waited:?}"
            ),
            Error::Reported {
                group,
                me,
                peer,
                bcast,
                by,
            } => write!(
                f,
                "multicast group {group:#x}: member {by} lost member {peer} in broadcast {bcast} (member {me} was told)"
            ),
            Error::Mismatch {
                group,
                me,
                bcast,
                mine,
                theirs,
            } => write!(
                f,
                "multicast group {group:#x}: broadcast {bcast}: member {me} called it with root {} and {} bytes, member {} sends {} bytes",
                mine.0, mine.1, theirs.0, theirs.1
            ),
            Error::Usage { group, me, what } => {
                write!(f, "multicast group {group:#x}, member {me}: {what}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// Where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// The group, by multicast (lossy).
    Group,
    /// One member, over the reliable channel.
    Member(u32),
}

/// A packet to send now.
#[derive(Debug)]
pub struct Transmit<'a> {
    /// Where.
    pub dest: Dest,
    /// The bytes (valid until the next call on the member).
    pub bytes: &'a [u8],
}

/// The user buffer of the broadcast in progress, lent for one call.
#[derive(Debug)]
pub enum Data<'a> {
    /// None (no broadcast in progress, or only control work).
    None,
    /// The root's data.
    Source(&'a [u8]),
    /// A receiver's destination.
    Sink(&'a mut [u8]),
}

/// Counters (for tests and `IBCOLL_STATS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Fragments sent the first time.
    pub sent: u64,
    /// Fragments sent again after a nack.
    pub retransmitted: u64,
    /// New fragments received.
    pub received: u64,
    /// Fragments received that were already there.
    pub duplicates: u64,
    /// Fragments of broadcasts not begun yet, kept.
    pub early_kept: u64,
    /// Fragments of broadcasts not begun yet, dropped (no room).
    pub early_dropped: u64,
    /// Packets of other groups or malformed.
    pub foreign: u64,
    /// Nacks sent.
    pub nacks_sent: u64,
    /// Acks sent.
    pub acks_sent: u64,
    /// Nacks received (as a source).
    pub nacks_received: u64,
}

struct Slot {
    bcast: u32,
    frag: u32,
    last_sent: Instant,
    /// When the first copy went out: an ack covering the fragment is a
    /// round-trip sample from there, also when the fragment was sent
    /// again (Karn's rule would discard those, but on a network slower
    /// than the timers every fragment is resent, so nothing would ever
    /// be learned; a sample inflated by a real repair only makes the
    /// holdoff longer).
    first_sent: Instant,
    pkt: Vec<u8>,
}

/// A source's round trip: from sending a fragment until a child's ack
/// covers it, which includes the datagram's way and the ack tree's. Acks
/// also wait for members that begin the broadcast late and for repairs,
/// which only ever add: so the estimate is a minimum, drifting up slowly
/// (1/64 of the difference per sample) so that it follows a network that
/// got slower.
fn add_rtt(r: Option<Duration>, sample: Duration) -> Duration {
    match r {
        Some(m) if sample >= m => m + (sample - m) / 64,
        _ => sample,
    }
}

struct Early {
    hdr: DataHdr,
    payload: Vec<u8>,
}

struct Kid {
    member: u32,
    acked: u32,
    laggard: u32,
}

/// One broadcast from `begin` until its subtree has it all.
struct Open {
    id: u32,
    root: u32,
    len: u64,
    nfrags: u32,
    // Receiving side (not the root).
    have: Vec<u64>,
    prefix: u32,
    highest: u32,
    last_data: Instant,
    last_nack: Option<Instant>,
    /// Quiet-time nacks since the last new fragment: each doubles the next
    /// wait (up to 64 x `nack_delay`), so a root stalled on acks is not
    /// flooded with nacks of fragments it has not sent yet.
    nack_backoff: u32,
    // Source side (the root): the ring holds [held_from, next_send).
    next_send: u32,
    held_from: u32,
    // Ack tree (a binomial tree rooted at the broadcast's root).
    parent: Option<u32>,
    kids: Vec<Kid>,
    reported: u32,
    sub: u32,
    progress_at: Instant,
}

impl Open {
    fn is_root(&self, me: u32) -> bool {
        self.root == me
    }
    fn local_done(&self, me: u32) -> bool {
        if self.is_root(me) {
            self.next_send == self.nfrags
        } else {
            self.prefix == self.nfrags
        }
    }
    /// The subtree's prefix and who holds the minimum.
    fn subtree(&self, me: u32) -> (u32, u32) {
        let mut best = if self.is_root(me) {
            (self.nfrags, me)
        } else {
            (self.prefix, me)
        };
        for k in &self.kids {
            if k.acked < best.0 {
                best = (k.acked, k.laggard);
            }
        }
        best
    }
    fn closed(&self, me: u32) -> bool {
        self.local_done(me)
            && if self.is_root(me) {
                self.sub == self.nfrags
            } else {
                self.reported == self.nfrags
            }
    }
    fn frag_len(&self, f: u32, payload: usize) -> usize {
        let off = f as u64 * payload as u64;
        (self.len - off).min(payload as u64) as usize
    }
}

/// How long a receiver waits for the root's data: a quarter more than the
/// peer timeout, so that a root stalled on another member's acks (it
/// stops sending when its window is full) fails first, naming that
/// member, and its abort reaches the receivers before they would blame
/// the root.
fn data_timeout(cfg: &Config) -> Duration {
    cfg.peer_timeout + cfg.peer_timeout / 4
}

/// `quiet` doubled `backoff` times (at most 64x), but never past an
/// eighth of the peer timeout: a receiver nacks several times before it
/// gives up on the root.
fn backed_off(cfg: &Config, quiet: Duration, backoff: u32) -> Duration {
    (quiet * (1 << backoff.min(6))).min(cfg.peer_timeout / 8)
}

/// Parent and children of `me` in the binomial tree of `n` members rooted
/// at `root` (children at most log2 n).
pub fn tree(me: u32, root: u32, n: u32) -> (Option<u32>, Vec<u32>) {
    let rel = (me + n - root) % n;
    let parent = (rel != 0).then(|| ((rel & (rel - 1)) + root) % n);
    let low = if rel == 0 {
        n.next_power_of_two()
    } else {
        rel & rel.wrapping_neg()
    };
    let mut kids = Vec::new();
    let mut bit = 1u32;
    while bit < low && rel as u64 + (bit as u64) < n as u64 {
        kids.push((rel + bit + root) % n);
        bit <<= 1;
    }
    (parent, kids)
}

/// One member of a reliable multicast group.
pub struct Member {
    cfg: Config,
    next_id: u32,
    cur: Option<u32>,
    open: VecDeque<Open>,
    ring: VecDeque<Slot>,
    spare: Vec<Vec<u8>>,
    early: Vec<Early>,
    early_acks: Vec<Ack>,
    ctrl: VecDeque<(u32, Control)>,
    retx: VecDeque<(u32, u32)>,
    scratch: Vec<u8>,
    failed: Option<Error>,
    stats: Stats,
    /// As a source: the round trip measured from acks (`add_rtt`).
    rtt: Option<Duration>,
    /// As a receiver: the last root's hint (`DataHdr::hint`).
    hint: Duration,
    /// Aborts to send after this member lost a peer ([`Member::poll_abort`]).
    aborts: Vec<(u32, Abort)>,
}

impl Member {
    /// A member; the configuration is checked.
    pub fn new(cfg: Config) -> Result<Member, Error> {
        cfg.check()?;
        Ok(Member {
            cfg,
            next_id: 0,
            cur: None,
            open: VecDeque::new(),
            ring: VecDeque::new(),
            spare: Vec::new(),
            early: Vec::new(),
            early_acks: Vec::new(),
            ctrl: VecDeque::new(),
            retx: VecDeque::new(),
            scratch: Vec::new(),
            failed: None,
            stats: Stats::default(),
            rtt: None,
            hint: Duration::ZERO,
            aborts: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
    /// The broadcast in progress here (begun, this member's part not done:
    /// a receiver lacks data, the root has not sent everything).
    pub fn current(&self) -> Option<u32> {
        self.cur
    }
    /// Whether `begin` may be called now (no broadcast in progress, fewer
    /// than `max_open` open, not failed).
    pub fn can_begin(&self) -> bool {
        self.cur.is_none() && self.open.len() < self.cfg.max_open && self.failed.is_none()
    }
    /// Nothing open, nothing to send: the group may be left.
    pub fn is_idle(&self) -> bool {
        self.open.is_empty() && self.ctrl.is_empty() && self.retx.is_empty()
    }
    /// Bytes held for retransmission (at most `window × mtu`).
    pub fn held_bytes(&self) -> usize {
        self.ring.iter().map(|s| s.pkt.len()).sum()
    }
    /// The error this member failed with, if any (sticky).
    pub fn error(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    /// How long a source waits before sending a fragment again: a nack
    /// that comes sooner after the last copy went out is taken to cross
    /// it (on a network slower than the configured timers every quiet
    /// nack would otherwise resend what is still on its way). Capped well
    /// below the peer timeout.
    fn holdoff(&self) -> Duration {
        let measured = self.rtt.unwrap_or(Duration::ZERO);
        self.cfg
            .retx_holdoff
            .max(measured)
            .min(self.cfg.peer_timeout / 8)
    }

    /// How long a receiver waits without news before its first quiet-time
    /// nack (doubled after each: [`backed_off`]).
    fn quiet_delay(&self) -> Duration {
        self.cfg
            .nack_delay
            .max(self.hint)
            .min(self.cfg.peer_timeout / 8)
    }

    fn usage(&self, what: String) -> Error {
        Error::Usage {
            group: self.cfg.group,
            me: self.cfg.me,
            what,
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            self.failed = Some(e.clone());
            if let Error::PeerLost {
                group,
                me,
                peer,
                bcast,
                ..
            } = e
            {
                // Everyone else may wait for the lost member too (a root
                // stalled on its acks stops sending, so the others would
                // time out naming the root): tell them.
                self.aborts = (0..self.cfg.members)
                    .filter(|&m| m != me && m != peer)
                    .map(|m| {
                        let a = Abort {
                            group,
                            bcast,
                            from: me,
                            dead: peer,
                        };
                        (m, a)
                    })
                    .collect();
            }
        }
        e
    }

    /// After this member failed with [`Error::PeerLost`]: the next abort
    /// to send to another member over the reliable channel (each member
    /// once), also while every other call returns the error. Error paths
    /// only: one message per member.
    pub fn poll_abort(&mut self) -> Option<Transmit<'_>> {
        let (to, a) = self.aborts.pop()?;
        Control::Abort(a).encode(&mut self.scratch);
        Some(Transmit {
            dest: Dest::Member(to),
            bytes: &self.scratch,
        })
    }

    fn check_failed(&self) -> Result<(), Error> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn find(&self, id: u32) -> Option<usize> {
        self.open.iter().position(|o| o.id == id)
    }

    /// Begin the next broadcast of the group (every member calls it for
    /// every broadcast, in the same order, with the same root and length).
    /// The root passes `Data::Source`, the others `Data::Sink` of `len`
    /// bytes. Returns the broadcast's number.
    pub fn begin(
        &mut self,
        now: Instant,
        root: u32,
        len: usize,
        data: &mut Data<'_>,
    ) -> Result<u32, Error> {
        self.check_failed()?;
        if let Some(c) = self.cur {
            return Err(self.usage(format!("begin while broadcast {c} is still in progress")));
        }
        if self.open.len() >= self.cfg.max_open {
            return Err(self.usage(format!(
                "begin with {} broadcasts open (max_open): wait for can_begin",
                self.open.len()
            )));
        }
        if root >= self.cfg.members {
            return Err(self.usage(format!(
                "root {root} outside the group of {}",
                self.cfg.members
            )));
        }
        let nfrags = self.cfg.nfrags(len);
        if nfrags > u32::MAX as u64 / 2 {
            return Err(self.usage(format!("{len} bytes are too many fragments")));
        }
        let nfrags = nfrags as u32;
        let me = self.cfg.me;
        match data {
            Data::Source(s) if root == me && s.len() == len => {}
            Data::Sink(s) if root != me && s.len() == len => {}
            _ => {
                return Err(self.usage(format!(
                    "begin(root {root}, {len} bytes): the root passes its data, the others a buffer of that length"
                )))
            }
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let (parent, kids) = tree(me, root, self.cfg.members);
        self.open.push_back(Open {
            id,
            root,
            len: len as u64,
            nfrags,
            have: if root == me {
                Vec::new()
            } else {
                vec![0; (nfrags as usize).div_ceil(64)]
            },
            prefix: 0,
            highest: 0,
            last_data: now,
            last_nack: None,
            nack_backoff: 0,
            next_send: 0,
            held_from: 0,
            parent,
            kids: kids
                .into_iter()
                .map(|k| Kid {
                    member: k,
                    acked: 0,
                    laggard: k,
                })
                .collect(),
            reported: 0,
            sub: 0,
            progress_at: now,
        });
        let idx = self.open.len() - 1;
        if !self.open[idx].local_done(me) {
            self.cur = Some(id);
        }
        // Acks from children that were faster than this member.
        let mut i = 0;
        while i < self.early_acks.len() {
            if self.early_acks[i].bcast == id {
                let a = self.early_acks.swap_remove(i);
                self.apply_ack(idx, a)?;
            } else {
                i += 1;
            }
        }
        // Fragments that came before the call.
        let mut i = 0;
        while i < self.early.len() {
            if self.early[i].hdr.bcast == id {
                let e = self.early.swap_remove(i);
                if let Data::Sink(sink) = data {
                    self.accept(now, idx, &e.hdr, &e.payload, sink)?;
                }
            } else {
                i += 1;
            }
        }
        self.update(idx, now);
        self.gc();
        Ok(id)
    }

    /// A packet from the multicast group (after loss injection). `data` is
    /// the buffer of the broadcast in progress, if any.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        pkt: &[u8],
        data: &mut Data<'_>,
    ) -> Result<(), Error> {
        self.check_failed()?;
        let Some((h, payload)) = DataHdr::parse(pkt) else {
            self.stats.foreign += 1;
            return Ok(());
        };
        if h.group != self.cfg.group || h.root >= self.cfg.members {
            self.stats.foreign += 1;
            return Ok(());
        }
        if h.root == self.cfg.me {
            return Ok(()); // our own packet looped back
        }
        if h.hint != 0 {
            self.hint = HINT_UNIT * u32::from(h.hint);
        }
        let ahead = h.bcast.wrapping_sub(self.next_id) as i32;
        if ahead >= 0 {
            // Not begun here yet: keep a copy if there is room, else the
            // nack after begin repairs it.
            if self.early.len() < self.cfg.early_cap && ahead < (1 << 20) {
                self.early.push(Early {
                    hdr: h,
                    payload: payload.to_vec(),
                });
                self.stats.early_kept += 1;
            } else {
                self.stats.early_dropped += 1;
            }
            return Ok(());
        }
        let Some(idx) = self.find(h.bcast) else {
            self.stats.duplicates += 1; // closed here: a repair for others
            return Ok(());
        };
        if self.cur != Some(h.bcast) {
            self.stats.duplicates += 1;
            return Ok(());
        }
        let Data::Sink(sink) = data else {
            return Err(self.usage(format!(
                "a packet of broadcast {} in progress, but no receive buffer given",
                h.bcast
            )));
        };
        self.accept(now, idx, &h, payload, sink)?;
        self.update(idx, now);
        self.gc();
        Ok(())
    }

    /// Store one fragment of the broadcast in progress.
    fn accept(
        &mut self,
        now: Instant,
        idx: usize,
        h: &DataHdr,
        payload: &[u8],
        sink: &mut [u8],
    ) -> Result<(), Error> {
        let p = self.cfg.payload();
        let o = &mut self.open[idx];
        if h.root != o.root || h.len != o.len || h.nfrags != o.nfrags {
            let e = Error::Mismatch {
                group: self.cfg.group,
                me: self.cfg.me,
                bcast: o.id,
                mine: (o.root, o.len),
                theirs: (h.root, h.len),
            };
            return Err(self.fail(e));
        }
        let f = h.frag;
        if payload.len() != o.frag_len(f, p) || sink.len() as u64 != o.len {
            self.stats.foreign += 1;
            return Ok(());
        }
        let (w, b) = ((f / 64) as usize, f % 64);
        if o.have[w] >> b & 1 == 1 {
            self.stats.duplicates += 1;
            return Ok(());
        }
        o.have[w] |= 1 << b;
        let off = f as usize * p;
        sink[off..off + payload.len()].copy_from_slice(payload);
        self.stats.received += 1;
        o.last_data = now;
        o.nack_backoff = 0;
        if f > o.highest {
            // A gap nobody has nacked yet (the highest only grows): ask now.
            let gap = Nack {
                group: self.cfg.group,
                bcast: o.id,
                from: self.cfg.me,
                ranges: vec![(o.highest, f - o.highest)],
            };
            o.last_nack = Some(now);
            self.ctrl.push_back((o.root, Control::Nack(gap)));
            self.stats.nacks_sent += 1;
        }
        o.highest = o.highest.max(f + 1);
        while o.prefix < o.nfrags && o.have[(o.prefix / 64) as usize] >> (o.prefix % 64) & 1 == 1 {
            o.prefix += 1;
        }
        if o.prefix == o.nfrags && self.cur == Some(o.id) {
            self.cur = None;
        }
        Ok(())
    }

    /// Recompute the subtree's prefix; ack upwards, free the ring.
    fn update(&mut self, idx: usize, now: Instant) {
        let me = self.cfg.me;
        let step = self.cfg.ack_step;
        let o = &mut self.open[idx];
        let (v, lag) = o.subtree(me);
        if v > o.sub {
            o.sub = v;
            o.progress_at = now;
        }
        if let Some(parent) = o.parent {
            if v > o.reported && (v == o.nfrags || v - o.reported >= step) {
                o.reported = v;
                self.ctrl.push_back((
                    parent,
                    Control::Ack(Ack {
                        group: self.cfg.group,
                        bcast: o.id,
                        from: me,
                        upto: v,
                        laggard: lag,
                    }),
                ));
                self.stats.acks_sent += 1;
            }
        } else {
            self.release();
        }
    }

    /// Free the ring's front while the whole group has it.
    fn release(&mut self) {
        while let Some(front) = self.ring.front() {
            let done = match self.find(front.bcast) {
                Some(i) => front.frag < self.open[i].sub,
                None => true,
            };
            if !done {
                break;
            }
            let s = self.ring.pop_front().expect("front");
            if let Some(i) = self.find(s.bcast) {
                self.open[i].held_from = s.frag + 1;
            }
            self.spare.push(s.pkt);
        }
    }

    fn gc(&mut self) {
        let me = self.cfg.me;
        self.open.retain(|o| !o.closed(me));
        if self.open.is_empty() {
            self.release();
        }
    }

    fn apply_ack(&mut self, idx: usize, a: Ack) -> Result<(), Error> {
        let o = &mut self.open[idx];
        let Some(k) = o.kids.iter_mut().find(|k| k.member == a.from) else {
            let what = format!(
                "ack for broadcast {} from member {}, which is not a child here (root {})",
                a.bcast, a.from, o.root
            );
            return Err(self.fail(self.usage(what)));
        };
        if a.upto > o.nfrags {
            let what = format!(
                "ack of {} fragments of {} from member {}",
                a.upto, o.nfrags, a.from
            );
            return Err(self.fail(self.usage(what)));
        }
        if a.upto > k.acked {
            k.acked = a.upto;
            k.laggard = if a.upto == o.nfrags {
                a.from
            } else {
                a.laggard
            };
        }
        Ok(())
    }

    /// An ack or nack from member `from` over the reliable channel.
    pub fn handle_control(&mut self, now: Instant, from: u32, pkt: &[u8]) -> Result<(), Error> {
        self.check_failed()?;
        let c = match Control::decode(pkt) {
            Some(c) => c,
            None => {
                let e = self.usage(format!(
                    "malformed control message ({} bytes) from member {from}",
                    pkt.len()
                ));
                return Err(self.fail(e));
            }
        };
        let (group, bcast, sender) = match &c {
            Control::Ack(a) => (a.group, a.bcast, a.from),
            Control::Nack(n) => (n.group, n.bcast, n.from),
            Control::Abort(a) => (a.group, a.bcast, a.from),
        };
        if group != self.cfg.group || sender != from {
            let e = self.usage(format!(
                "control message of group {group:#x} from member {sender} came from member {from}"
            ));
            return Err(self.fail(e));
        }
        let ahead = bcast.wrapping_sub(self.next_id) as i32 >= 0;
        match c {
            Control::Abort(a) => {
                // Not about this member itself (a receiver that timed out
                // on a root stalled by another member names the root).
                if a.dead != self.cfg.me {
                    let e = Error::Reported {
                        group,
                        me: self.cfg.me,
                        peer: a.dead,
                        bcast,
                        by: from,
                    };
                    // Told, not found: no aborts of its own.
                    self.failed.get_or_insert(e.clone());
                    return Err(e);
                }
            }
            Control::Ack(a) => {
                if ahead {
                    // A child got everything before this member began.
                    if let Some(e) = self
                        .early_acks
                        .iter_mut()
                        .find(|e| e.bcast == a.bcast && e.from == a.from)
                    {
                        if a.upto > e.upto {
                            *e = a;
                        }
                    } else {
                        self.early_acks.push(a);
                    }
                    return Ok(());
                }
                let Some(idx) = self.find(bcast) else {
                    return Ok(());
                };
                if self.open[idx].root == self.cfg.me && a.upto > 0 {
                    self.sample_rtt(now, bcast, a.upto - 1);
                }
                self.apply_ack(idx, a)?;
                self.update(idx, now);
                self.gc();
            }
            Control::Nack(n) => {
                self.stats.nacks_received += 1;
                if ahead {
                    return Ok(()); // everything is still to come
                }
                let Some(idx) = self.find(bcast) else {
                    return Ok(());
                };
                if self.open[idx].root != self.cfg.me {
                    let e = self.usage(format!(
                        "nack for broadcast {bcast} from member {from}, but the root is member {}",
                        self.open[idx].root
                    ));
                    return Err(self.fail(e));
                }
                let (held, sent) = (self.open[idx].held_from, self.open[idx].next_send);
                let holdoff = self.holdoff();
                for (first, count) in n.ranges {
                    let lo = first.max(held);
                    let hi = first.saturating_add(count).min(sent);
                    for f in lo..hi {
                        if let Some(s) = self.slot(bcast, f) {
                            let slot = &mut self.ring[s];
                            if now.saturating_duration_since(slot.last_sent) >= holdoff {
                                slot.last_sent = now;
                                self.retx.push_back((bcast, f));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A child's ack covers fragment `f` of this source's broadcast `b`:
    /// a round-trip sample if that fragment is still held (an older one
    /// was confirmed by an earlier ack).
    fn sample_rtt(&mut self, now: Instant, b: u32, f: u32) {
        if let Some(s) = self.slot(b, f) {
            let r = now.saturating_duration_since(self.ring[s].first_sent);
            self.rtt = Some(add_rtt(self.rtt, r));
        }
    }

    /// Index in the ring of fragment `f` of broadcast `b`.
    fn slot(&self, b: u32, f: u32) -> Option<usize> {
        let base = self.ring.front()?.bcast;
        let key = |bb: u32, ff: u32| (bb.wrapping_sub(base), ff);
        self.ring
            .binary_search_by(|s| key(s.bcast, s.frag).cmp(&key(b, f)))
            .ok()
    }

    /// The next packet to send, if any: control first, then repairs, then
    /// new fragments of this member's broadcast while its window has room.
    /// The root passes its `Data::Source` while its broadcast is current.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        data: &Data<'_>,
    ) -> Result<Option<Transmit<'_>>, Error> {
        self.check_failed()?;
        if let Some((to, c)) = self.ctrl.pop_front() {
            c.encode(&mut self.scratch);
            return Ok(Some(Transmit {
                dest: Dest::Member(to),
                bytes: &self.scratch,
            }));
        }
        while let Some((b, f)) = self.retx.pop_front() {
            if let Some(s) = self.slot(b, f) {
                self.stats.retransmitted += 1;
                return Ok(Some(Transmit {
                    dest: Dest::Group,
                    bytes: &self.ring[s].pkt,
                }));
            }
        }
        let Some(id) = self.cur else { return Ok(None) };
        let idx = self.find(id).expect("current is open");
        if self.open[idx].root != self.cfg.me || self.ring.len() >= self.cfg.window {
            return Ok(None);
        }
        let Data::Source(src) = data else {
            return Err(self.usage(format!(
                "broadcast {id} is this member's, but no data was given"
            )));
        };
        let p = self.cfg.payload();
        let hint = match self.rtt {
            Some(_) => (self.holdoff().as_micros() / HINT_UNIT.as_micros())
                .clamp(1, u16::MAX as u128) as u16,
            None => 0,
        };
        let o = &mut self.open[idx];
        if src.len() as u64 != o.len {
            let what = format!(
                "broadcast {id} of {} bytes given {} bytes",
                o.len,
                src.len()
            );
            return Err(self.usage(what));
        }
        let f = o.next_send;
        let n = o.frag_len(f, p);
        let off = f as usize * p;
        let mut pkt = self.spare.pop().unwrap_or_default();
        pkt.clear();
        pkt.resize(DATA_HDR, 0);
        DataHdr {
            group: self.cfg.group,
            bcast: id,
            root: o.root,
            frag: f,
            nfrags: o.nfrags,
            len: o.len,
            hint,
        }
        .write(&mut pkt);
        pkt.extend_from_slice(&src[off..off + n]);
        o.next_send += 1;
        if o.next_send == o.nfrags {
            self.cur = None; // the ring holds what is not acknowledged
        }
        self.stats.sent += 1;
        self.ring.push_back(Slot {
            bcast: id,
            frag: f,
            last_sent: now,
            first_sent: now,
            pkt,
        });
        self.gc();
        Ok(Some(Transmit {
            dest: Dest::Group,
            bytes: &self.ring.back().expect("pushed").pkt,
        }))
    }

    /// When `handle_timeout` wants to run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let me = self.cfg.me;
        let quiet = self.quiet_delay();
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |y| y.min(x)));
        for o in &self.open {
            if !o.local_done(me) && !o.is_root(me) {
                at(o.last_data + data_timeout(&self.cfg));
                at(o.last_data.max(o.last_nack.unwrap_or(o.last_data))
                    + backed_off(&self.cfg, quiet, o.nack_backoff));
            } else if o.sub < o.nfrags {
                at(o.progress_at + self.cfg.peer_timeout);
            }
        }
        t
    }

    /// Timers: nack what is missing after a quiet `nack_delay`; fail with
    /// `PeerLost` after `peer_timeout` without progress.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), Error> {
        self.check_failed()?;
        let me = self.cfg.me;
        let quiet_delay = self.quiet_delay();
        let cfg = &self.cfg;
        for o in self.open.iter_mut() {
            if !o.local_done(me) && !o.is_root(me) {
                let quiet = now.saturating_duration_since(o.last_data);
                if quiet >= data_timeout(cfg) {
                    let e = Error::PeerLost {
                        group: cfg.group,
                        me,
                        peer: o.root,
                        bcast: o.id,
                        what: "data from the root (or an acknowledgement it waits for)",
                        waited: quiet,
                    };
                    return Err(self.fail(e));
                }
                let since = o.last_nack.map_or(o.last_data, |n| n.max(o.last_data));
                if now.saturating_duration_since(since)
                    >= backed_off(cfg, quiet_delay, o.nack_backoff)
                {
                    o.nack_backoff += 1;
                    let mut ranges = Vec::new();
                    let mut f = o.prefix;
                    while f < o.highest && ranges.len() < NACK_MAX_RANGES - 1 {
                        if o.have[(f / 64) as usize] >> (f % 64) & 1 == 0 {
                            let s = f;
                            while f < o.highest && o.have[(f / 64) as usize] >> (f % 64) & 1 == 0 {
                                f += 1;
                            }
                            ranges.push((s, f - s));
                        } else {
                            f += 1;
                        }
                    }
                    if o.highest < o.nfrags {
                        // The tail: lost, or not sent yet (the root skips those).
                        let tail = (o.nfrags - o.highest).min(cfg.window as u32);
                        ranges.push((o.highest, tail));
                    }
                    o.last_nack = Some(now);
                    self.ctrl.push_back((
                        o.root,
                        Control::Nack(Nack {
                            group: cfg.group,
                            bcast: o.id,
                            from: me,
                            ranges,
                        }),
                    ));
                    self.stats.nacks_sent += 1;
                }
            } else if o.sub < o.nfrags {
                let quiet = now.saturating_duration_since(o.progress_at);
                if quiet >= cfg.peer_timeout {
                    let e = Error::PeerLost {
                        group: cfg.group,
                        me,
                        peer: o.subtree(me).1,
                        bcast: o.id,
                        what: "acknowledgement",
                        waited: quiet,
                    };
                    return Err(self.fail(e));
                }
            }
        }
        Ok(())
    }
}
