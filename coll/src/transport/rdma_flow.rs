//! Credit flow control of the rdma channels over one shared receive queue
//! (SRQ) per process, as state machines without I/O: the receiver's
//! [`Ledger`] (the SRQ's buffers and the credits promised out of them) and
//! the sender's [`Outbound`] (the credits it holds and its requests for
//! more). `transport/rdma.rs` does the verbs; docs/ARCHITECTURE.md ("The
//! rdma channel", "Credits") says why this cannot deadlock or storm.
//!
//! Counters are cumulative `u32`s compared with wrapping arithmetic
//! (credits outstanding never approach 2^31).
//!
//! * A sender SENDs only with a credit. The receiver grants credits out of
//!   its SRQ buffers so that the credits outstanding (granted and not yet
//!   seen used) never exceed the buffers posted: `promised <= posted`.
//! * Grants need no receive buffer: they are RDMA-written into the
//!   sender's flow word (or ride on a message the receiver sends anyway).
//! * Every message says how many credits its sender has used in all
//!   (`used`) and how many more records it has waiting (`backlog`); the
//!   receiver tops a sender up to `used + backlog + allowance`, so grants
//!   follow demand and a sender that goes quiet holds at most its small
//!   allowance.
//! * Allowances (credits kept by idle senders, for latency) are given to
//!   connections only while their sum stays below `total - reserve`: at
//!   least `reserve` buffers always circulate among senders with demand.
//! * A sender with no credit and something to send asks (WANT, a datagram
//!   on the UD endpoint, resent until answered); the receiver grants at
//!   once if it can, else queues it (FIFO) and says so in the flow word,
//!   which stops the resends. Buffers coming back serve the queue first.

use std::collections::VecDeque;

/// `a` is after `b` (wrapping).
#[inline]
pub(crate) fn ahead(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The later of two cumulative counters.
#[inline]
pub(crate) fn later(a: u32, b: u32) -> u32 {
    if ahead(b, a) {
        b
    } else {
        a
    }
}

/// `a - b` when `a` is not behind `b`, else 0.
#[inline]
fn gap(a: u32, b: u32) -> u32 {
    if ahead(a, b) {
        a.wrapping_sub(b)
    } else {
        0
    }
}

/// Counts for `IBCOLL_STATS`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FlowStats {
    /// Fewest SRQ buffers posted at once.
    pub low_posted: u32,
    /// Credit requests (WANTs) that found the sender out of credits.
    pub starved: u64,
    /// Longest the queue of waiting senders got.
    pub fifo_max: usize,
    /// Grants and acknowledgements RDMA-written.
    pub writes: u64,
    /// Grants that rode on a message instead.
    pub piggybacked: u64,
    /// Messages that carried a sender's `used` beyond its credits (must
    /// stay 0).
    pub violations: u64,
}

/// The receiver's view of one connection's inbound direction.
#[derive(Debug, Clone, Default)]
struct Inbound {
    open: bool,
    /// Credits granted so far.
    granted: u32,
    /// Credits the peer used, as its last polled message said.
    used: u32,
    /// What `granted` should reach: used + backlog + allowance.
    target: u32,
    /// Credits it may keep while idle (0 or the ledger's allowance).
    allowance: u32,
    /// The grant the peer has been told (written or piggybacked).
    told: u32,
    /// The last credit request seen, and the last one acknowledged.
    want_seen: u32,
    want_acked: u32,
    in_fifo: bool,
    in_touched: bool,
    in_dirty: bool,
    /// The peer asked and may be asleep: wake it with the next grant.
    hint: bool,
}

/// What to tell a peer now ([`Ledger::due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tell {
    pub granted: u32,
    pub acked: u32,
    /// Also wake it (a datagram): it asked and may be blocked.
    pub wake: bool,
}

/// The receiver side: the SRQ's buffers and every inbound connection's
/// credits.
#[derive(Debug)]
pub(crate) struct Ledger {
    total: u32,
    allowance: u32,
    reserve: u32,
    max_share: u32,
    /// Owed credits that are written without waiting for a message to
    /// carry them.
    lazy: u32,
    /// By connection id (ids are not reused: a peer's channel is made once).
    conns: Vec<Inbound>,
    /// Buffers posted in the SRQ (as far as polled completions tell).
    posted: u32,
    /// Credits granted and not yet seen used, over all connections.
    promised: u32,
    /// Sum of the allowances handed out.
    idle_total: u32,
    fifo: VecDeque<u32>,
    touched: Vec<u32>,
    dirty: Vec<u32>,
    /// Connections closed whose promise is released once the completions
    /// they may still have in the CQ are polled.
    retiring: Vec<u32>,
    pub stats: FlowStats,
}

impl Ledger {
    /// A ledger for an SRQ of `total` buffers (none posted yet); idle
    /// connections keep up to `allowance` credits while that fits.
    pub fn new(total: u32, allowance: u32) -> Ledger {
        let total = total.max(2);
        let reserve = (total / 4).max(1);
        let allowance = allowance.min(total - reserve);
        Ledger {
            total,
            allowance,
            reserve,
            max_share: (total / 2).max(allowance).max(1),
            lazy: allowance.clamp(1, 8),
            conns: Vec::new(),
            posted: 0,
            promised: 0,
            idle_total: 0,
            fifo: VecDeque::new(),
            touched: Vec::new(),
            dirty: Vec::new(),
            retiring: Vec::new(),
            stats: FlowStats {
                low_posted: total,
                ..FlowStats::default()
            },
        }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn posted(&self) -> u32 {
        self.posted
    }

    pub fn promised(&self) -> u32 {
        self.promised
    }

    /// Posted buffers nobody holds a credit for.
    pub fn free(&self) -> u32 {
        self.posted.saturating_sub(self.promised)
    }

    /// Senders waiting in the queue.
    pub fn waiting(&self) -> usize {
        self.fifo.len()
    }

    /// A buffer was taken by something that is no message of an open
    /// connection (a flushed receive, a late message of a retired one).
    pub fn taken(&mut self) {
        self.posted = self.posted.saturating_sub(1);
        self.stats.low_posted = self.stats.low_posted.min(self.posted);
    }

    /// `n` buffers were (re)posted.
    pub fn posted_more(&mut self, n: u32) {
        self.posted += n;
        debug_assert!(
            self.posted <= self.total,
            "{} > {}",
            self.posted,
            self.total
        );
    }

    /// A new connection: its id (also its flow word's index) and the
    /// credits granted to it up front (its allowance, if one fits and the
    /// buffers are free).
    pub fn open(&mut self) -> (u32, u32) {
        self.conns.push(Inbound::default());
        let id = (self.conns.len() - 1) as u32;
        let allowance = if self.idle_total + self.allowance <= self.total - self.reserve {
            self.allowance
        } else {
            0
        };
        self.idle_total += allowance;
        let g = allowance.min(self.free());
        self.promised += g;
        self.conns[id as usize] = Inbound {
            open: true,
            granted: g,
            target: allowance,
            allowance,
            told: g,
            ..Inbound::default()
        };
        (id, g)
    }

    fn touch(&mut self, id: u32) {
        let c = &mut self.conns[id as usize];
        if !c.in_touched {
            c.in_touched = true;
            self.touched.push(id);
        }
    }

    fn mark(&mut self, id: u32) {
        let c = &mut self.conns[id as usize];
        if !c.in_dirty {
            c.in_dirty = true;
            self.dirty.push(id);
        }
    }

    /// A message of connection `id` took a buffer; its prefix said the
    /// sender has used `used` credits in all and has `backlog` records
    /// waiting. Err when it used more credits than it was granted.
    pub fn on_message(&mut self, id: u32, used: u32, backlog: u32) -> Result<(), String> {
        self.posted = self.posted.saturating_sub(1);
        self.stats.low_posted = self.stats.low_posted.min(self.posted);
        let Some(c) = self.conns.get_mut(id as usize) else {
            return Ok(());
        };
        if !c.open {
            // Retired: its whole promise goes when it is released.
            return Ok(());
        }
        let delta = used.wrapping_sub(c.used);
        if delta == 0 || delta > c.granted.wrapping_sub(c.used) {
            self.stats.violations += 1;
            return Err(format!(
                "a message used credit {used} with {} granted and {} used before",
                c.granted, c.used
            ));
        }
        c.used = used;
        self.promised -= delta;
        c.target = later(
            c.target,
            used.wrapping_add(backlog).wrapping_add(c.allowance),
        );
        self.touch(id);
        Ok(())
    }

    /// Credit request `seq` of connection `id`, whose sender had used
    /// `used` credits (messages may still be on the way: this only raises
    /// the target) and has `backlog` records waiting.
    pub fn on_want(&mut self, id: u32, seq: u32, used: u32, backlog: u32) {
        let Some(c) = self.conns.get_mut(id as usize) else {
            return;
        };
        if !c.open || !ahead(seq, c.want_seen) {
            // A resend that crossed our answer: that answer is on its way.
            return;
        }
        c.want_seen = seq;
        c.hint = true;
        c.target = later(
            c.target,
            used.wrapping_add(backlog.max(1)).wrapping_add(c.allowance),
        );
        self.stats.starved += 1;
        if !c.in_fifo {
            let queued = !self.fifo.is_empty();
            if !queued {
                self.grant_toward(id);
            }
            let c = &mut self.conns[id as usize];
            if queued || ahead(c.target, c.granted) {
                c.in_fifo = true;
                self.fifo.push_back(id);
                self.stats.fifo_max = self.stats.fifo_max.max(self.fifo.len());
            }
        }
        self.mark(id);
    }

    /// Grants connection `id` what it wants, as far as free buffers and
    /// its share allow; returns how many.
    fn grant_toward(&mut self, id: u32) -> u32 {
        let free = self.free();
        let c = &mut self.conns[id as usize];
        let want = gap(c.target, c.granted);
        let room = self
            .max_share
            .saturating_sub(c.granted.wrapping_sub(c.used));
        let g = want.min(room).min(free);
        c.granted = c.granted.wrapping_add(g);
        self.promised += g;
        g
    }

    /// After a pass's messages and reposts: the waiting senders first, in
    /// order (one that stays short goes to the back), then, once nobody
    /// waits, the connections whose messages came in are topped up.
    pub fn serve(&mut self) {
        let mut n = self.fifo.len();
        while n > 0 && self.free() > 0 {
            n -= 1;
            let Some(id) = self.fifo.pop_front() else {
                break;
            };
            if !self.conns[id as usize].open {
                self.conns[id as usize].in_fifo = false;
                continue;
            }
            if self.grant_toward(id) > 0 {
                self.mark(id);
            }
            let c = &mut self.conns[id as usize];
            if ahead(c.target, c.granted) {
                self.fifo.push_back(id);
            } else {
                c.in_fifo = false;
            }
        }
        if !self.fifo.is_empty() {
            return;
        }
        let mut touched = std::mem::take(&mut self.touched);
        for &id in &touched {
            self.conns[id as usize].in_touched = false;
            if self.conns[id as usize].open && self.grant_toward(id) > 0 {
                self.mark(id);
            }
        }
        touched.clear();
        self.touched = touched;
    }

    /// Connections that may have something to be told; look at each with
    /// [`due`](Self::due).
    pub fn take_dirty(&mut self, out: &mut Vec<u32>) {
        for &id in &self.dirty {
            self.conns[id as usize].in_dirty = false;
        }
        out.append(&mut self.dirty);
    }

    /// Puts `id` back among the dirty (its write found no room).
    pub fn redo(&mut self, id: u32) {
        self.mark(id);
    }

    /// Whether connection `id` must be told now: it waits (asked, or is
    /// queued and not yet acknowledged), or owes enough, or is down to its
    /// last credits as far as we know. Marks it told.
    pub fn due(&mut self, id: u32) -> Option<Tell> {
        let lazy = self.lazy;
        let c = self.conns.get_mut(id as usize)?;
        if !c.open {
            return None;
        }
        let owed = c.granted.wrapping_sub(c.told);
        let ack = c.in_fifo && ahead(c.want_seen, c.want_acked);
        let left = c.told.wrapping_sub(c.used);
        let tell = ack || (owed > 0 && (c.hint || owed >= lazy || left <= 2));
        if !tell {
            return None;
        }
        let wake = c.hint && owed > 0;
        if wake {
            c.hint = false;
        }
        c.told = c.granted;
        c.want_acked = c.want_seen;
        self.stats.writes += 1;
        Some(Tell {
            granted: c.granted,
            acked: c.want_seen,
            wake,
        })
    }

    /// The grant to carry on a message going to connection `id`'s peer
    /// anyway (it is told with it).
    pub fn piggyback(&mut self, id: u32) -> u32 {
        let Some(c) = self.conns.get_mut(id as usize) else {
            return 0;
        };
        if c.told != c.granted {
            self.stats.piggybacked += 1;
            c.told = c.granted;
            // A message wakes the peer by itself.
            c.hint = false;
        }
        c.granted
    }

    /// Connection `id` is closed or failed: no more grants. Its promise is
    /// released by [`release`](Self::release) once the completions it may
    /// still have in the CQ are polled.
    pub fn retire(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(id as usize) {
            if c.open {
                c.open = false;
                self.retiring.push(id);
            }
        }
    }

    /// Connections retired and not yet released.
    pub fn retiring(&self) -> usize {
        self.retiring.len()
    }

    /// Releases the first `n` retired connections (the CQ was drained
    /// since they were retired): their credits are promised no more.
    pub fn release(&mut self, n: usize) -> usize {
        let n = n.min(self.retiring.len());
        for id in self.retiring.drain(..n) {
            let c = &mut self.conns[id as usize];
            self.promised -= c.granted.wrapping_sub(c.used);
            self.idle_total -= c.allowance;
            c.granted = c.used;
            c.allowance = 0;
        }
        n
    }
}

/// The sender's side of one connection: credits seen and used, and its
/// request for more.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outbound {
    /// Credits granted as far as seen (flow word, or carried by a message).
    seen: u32,
    /// Credits used (messages sent).
    used: u32,
    /// The last request made, and the last the receiver acknowledged.
    want: u32,
    acked: u32,
    /// A request is out: no credit seen since it was made.
    asking: bool,
}

impl Outbound {
    /// `initial` credits granted in the handshake.
    pub fn new(initial: u32) -> Outbound {
        Outbound {
            seen: initial,
            ..Outbound::default()
        }
    }

    pub fn available(&self) -> u32 {
        gap(self.seen, self.used)
    }

    pub fn used(&self) -> u32 {
        self.used
    }

    /// The receiver's word (or a message) says `granted`, `acked`.
    pub fn see(&mut self, granted: u32, acked: Option<u32>) {
        self.seen = later(self.seen, granted);
        if let Some(a) = acked {
            self.acked = later(self.acked, a);
        }
        if self.asking && self.available() > 0 {
            self.asking = false;
        }
    }

    /// Takes a credit for a message; false when none is left.
    pub fn take(&mut self) -> bool {
        if self.available() == 0 {
            return false;
        }
        self.used = self.used.wrapping_add(1);
        true
    }

    /// Out of credits with something to send: the request to make (a new
    /// one, or the one still out), or None when the receiver has queued it.
    pub fn starve(&mut self) -> Option<u32> {
        if !self.asking {
            self.asking = true;
            self.want = self.want.wrapping_add(1);
        }
        (!self.is_queued()).then_some(self.want)
    }

    /// The receiver acknowledged the request that is out: no resend.
    pub fn is_queued(&self) -> bool {
        !ahead(self.want, self.acked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[test]
    fn wrapping_counters() {
        assert!(ahead(1, 0) && !ahead(0, 0) && !ahead(0, 1));
        assert!(ahead(2, u32::MAX));
        assert_eq!(later(u32::MAX, 3), 3);
        assert_eq!(gap(3, u32::MAX), 4);
        assert_eq!(gap(u32::MAX, 3), 0);
    }

    #[test]
    fn allowances_leave_a_reserve() {
        let mut l = Ledger::new(16, 4);
        l.posted_more(16);
        let grants: Vec<u32> = (0..6).map(|_| l.open().1).collect();
        // 16 - 4 reserved: three connections keep 4 each, the rest none.
        assert_eq!(grants, vec![4, 4, 4, 0, 0, 0]);
        assert_eq!(l.free(), 4);
        assert!(l.promised() <= l.posted());
    }

    #[test]
    fn a_starving_sender_is_queued_then_served_first() {
        let mut l = Ledger::new(8, 2);
        l.posted_more(8);
        let (a, ga) = l.open();
        let (b, gb) = l.open();
        let (c, gc) = l.open();
        assert_eq!((ga, gb, gc), (2, 2, 2));
        // a wants 6 more: 2 are free.
        l.on_want(a, 1, 0, 6);
        let mut d = Vec::new();
        l.take_dirty(&mut d);
        let t = l.due(a).expect("told");
        assert_eq!((t.granted, t.acked, t.wake), (4, 1, true));
        assert_eq!(l.free(), 0);
        assert_eq!(l.waiting(), 1);
        // b sends 2 (idle after): its buffers go to a, not back to b.
        l.on_message(b, 1, 0).unwrap();
        l.on_message(b, 2, 0).unwrap();
        l.posted_more(2);
        l.serve();
        d.clear();
        l.take_dirty(&mut d);
        // a holds its share (half the buffers) unused: it gets nothing
        // more until it uses some, and b, which did not ask, waits behind.
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(l.waiting(), 1);
        // a sends 2 of its 4: those buffers come back to it.
        l.on_message(a, 1, 5).unwrap();
        l.on_message(a, 2, 4).unwrap();
        l.posted_more(2);
        l.serve();
        l.take_dirty(&mut d);
        assert_eq!(d, vec![a]);
        assert_eq!(l.due(a).map(|t| t.granted), Some(6));
        assert!(l.promised() <= l.posted());
        let _ = c;
    }

    #[test]
    fn a_message_beyond_its_credits_is_an_error() {
        let mut l = Ledger::new(8, 2);
        l.posted_more(8);
        let (a, _) = l.open();
        l.on_message(a, 1, 0).unwrap();
        l.on_message(a, 2, 0).unwrap();
        assert!(l.on_message(a, 3, 0).is_err());
    }

    #[test]
    fn retired_connections_give_their_credits_back() {
        let mut l = Ledger::new(8, 2);
        l.posted_more(8);
        let (a, _) = l.open();
        let (b, _) = l.open();
        l.retire(a);
        assert_eq!(l.promised(), 4);
        assert_eq!(l.release(1), 1);
        assert_eq!(l.promised(), 2);
        // Its allowance is free for a new connection.
        let (c, g) = l.open();
        assert_eq!((c, g), (2, 2));
        let _ = b;
    }

    /// A whole system: one receiver with `total` SRQ buffers, `senders`
    /// senders each with messages to send, a network that delays grants
    /// and messages and loses credit requests, a receiver that reposts in
    /// batches. Checks that a message never lands without a posted buffer
    /// (no RNR), that every message arrives, and that it all ends.
    fn simulate(total: u32, allowance: u32, senders: usize, msgs: u32, seed: u64) {
        let mut rng = seed | 1;
        let mut rand = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n.max(1)
        };
        let mut l = Ledger::new(total, allowance);
        l.posted_more(total);
        let mut posted = total; // the SRQ's real count
        let mut out: Vec<Outbound> = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..senders {
            let (id, g) = l.open();
            ids.push(id);
            out.push(Outbound::new(g));
        }
        let mut left = vec![msgs; senders];
        // Messages on the wire: (sender, used, backlog); words in flight:
        // (sender, granted, acked); requests: (sender, seq, used, backlog).
        let mut wire: VecDeque<(usize, u32, u32)> = VecDeque::new();
        let mut landed: VecDeque<(usize, u32, u32)> = VecDeque::new();
        let mut words: VecDeque<(usize, u32, u32)> = VecDeque::new();
        let mut wants: VecDeque<(usize, u32, u32, u32)> = VecDeque::new();
        let mut consumed = 0u32;
        let mut got = vec![0u32; senders];
        let mut dirty = Vec::new();
        for step in 0..2_000_000u64 {
            if got.iter().all(|&g| g == msgs) {
                return;
            }
            match rand(6) {
                0 | 1 => {
                    // A sender sends or asks.
                    let s = rand(senders as u64) as usize;
                    if left[s] == 0 {
                        continue;
                    }
                    if out[s].take() {
                        left[s] -= 1;
                        wire.push_back((s, out[s].used(), left[s]));
                    } else if let Some(seq) = out[s].starve() {
                        // Resent every time it comes up: a lossy, eager path.
                        if rand(4) != 0 {
                            wants.push_back((s, seq, out[s].used(), left[s]));
                        }
                    }
                }
                2 => {
                    // The network delivers a message into a posted buffer.
                    if let Some(m) = wire.pop_front() {
                        assert!(posted > 0, "RNR at step {step}: no buffer posted");
                        posted -= 1;
                        landed.push_back(m);
                    }
                }
                3 => {
                    // The receiver polls, reposts in batches, serves.
                    for _ in 0..rand(4) + 1 {
                        if let Some((s, used, backlog)) = landed.pop_front() {
                            l.on_message(ids[s], used, backlog).unwrap();
                            consumed += 1;
                            got[s] += 1;
                        }
                    }
                    if let Some((s, seq, used, backlog)) = wants.pop_front() {
                        l.on_want(ids[s], seq, used, backlog);
                    }
                    if consumed >= 3 || (l.waiting() > 0 && consumed > 0) {
                        posted += consumed;
                        l.posted_more(consumed);
                        consumed = 0;
                    }
                    l.serve();
                    assert!(l.promised() <= l.posted(), "over-promised at {step}");
                    l.take_dirty(&mut dirty);
                    for id in dirty.drain(..) {
                        if let Some(t) = l.due(id) {
                            let s = ids.iter().position(|&x| x == id).unwrap();
                            words.push_back((s, t.granted, t.acked));
                        }
                    }
                }
                _ => {
                    // A grant lands in a sender's word.
                    if let Some((s, g, a)) = words.pop_front() {
                        out[s].see(g, Some(a));
                    }
                }
            }
        }
        panic!(
            "no end: got {got:?} of {msgs}, left {left:?}, free {}, waiting {}",
            l.free(),
            l.waiting()
        );
    }

    #[test]
    fn many_to_one_never_overruns_and_always_ends() {
        for seed in 1..40 {
            simulate(16, 4, 5, 300, seed);
            simulate(4, 1, 9, 100, seed * 7);
            simulate(256, 4, 3, 500, seed * 13);
            simulate(16, 4, 40, 30, seed * 31);
        }
    }
}
