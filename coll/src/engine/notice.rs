//! Notices: small eager messages that tell the other members of an
//! operation that it failed elsewhere (a collective whose ranks disagree:
//! the rank that received a wrong-sized message knows, its partners may
//! not). They travel on the operation's context with a tag of their own
//! ([`notice_tag`]: bit 31 set, bit 30 clear, the operation's tag below;
//! no receive is ever posted for such a tag, user tags are non-negative
//! and the fast path's block tags have bit 30 set), so they always land in
//! the unexpected queue, where the engine counts them: a waiter learns of
//! one by comparing [`State::notices`] with the count it saw last, and only
//! then searches the queue. The engine knows nothing of what a notice
//! says; the schedule runner writes and reads them.

use super::{Engine, Posted2, State};

/// Bits of a notice tag above the operation's tag.
const NOTICE_TAG: i32 = i32::MIN;
/// The bits of the operation's tag a notice keeps.
pub(crate) const NOTICE_MASK: i32 = 0x3fff_ffff;

/// The tag of a notice about the operation with tag `tag`.
#[inline]
pub(crate) fn notice_tag(tag: i32) -> i32 {
    NOTICE_TAG | (tag & NOTICE_MASK)
}

/// Whether `tag` is a notice's.
#[inline]
pub(crate) fn is_notice(tag: i32) -> bool {
    tag & !NOTICE_MASK == NOTICE_TAG
}

impl State {
    #[cold]
    #[inline(never)]
    pub(super) fn note_notice(&mut self) {
        self.notices += 1;
        self.notices_waiting += 1;
    }
}

/// Operations [`State::failed_ops`] remembers.
const FAILED_KEPT: usize = 16;

impl State {
    /// Remembers that operation `tag` on `ctx` failed here already.
    #[cold]
    #[inline(never)]
    pub(crate) fn note_failed_op(&mut self, ctx: u32, tag: i32) {
        let k = (ctx, tag & NOTICE_MASK);
        if !self.failed_ops.contains(&k) {
            if self.failed_ops.len() == FAILED_KEPT {
                self.failed_ops.pop_front();
            }
            self.failed_ops.push_back(k);
        }
    }

    /// Whether operation `tag` on `ctx` failed here already.
    pub(crate) fn failed_op(&self, ctx: u32, tag: i32) -> bool {
        self.failed_ops.contains(&(ctx, tag & NOTICE_MASK))
    }
}

/// A notice taken from the unexpected queue.
pub(crate) struct Notice {
    /// Communicator rank of the sender.
    pub src: u32,
    /// The operation's tag ([`NOTICE_MASK`] bits).
    pub tag: i32,
    pub payload: Vec<u8>,
}

/// Collective calls [`State::calls`] remembers (context, tag, stamp).
const CALLS_KEPT: usize = 16;

/// Unexpected messages a starting call looks at for conflicts (the
/// oldest).
const EARLY_LOOKED_AT: usize = 16;

/// Probes [`State::probes`] keeps for calls not started here yet.
const PROBES_KEPT: usize = 64;

/// A probe for a call this process has not started yet.
pub(crate) struct Probe {
    ctx: u32,
    tag: i32,
    src: u32,
    peer: usize,
    stamp: u32,
}

/// A message of a collective call (context and tag) that this process
/// makes or made with another stamp (`Header::stamp`): the two ranks
/// disagree on the call, though the message itself was never matched (a
/// root that sends to a rank that, by its own root, receives from
/// another). Found by the engine, reported like a notice: the run of that
/// call fails (or, when it is over, the next call on the context), and
/// tells the others.
pub(crate) struct Conflict {
    pub ctx: u32,
    pub tag: i32,
    /// Communicator rank and world rank of the sender.
    pub src: u32,
    pub peer: usize,
    /// The message's stamp and this process's.
    pub got: u32,
    pub mine: u32,
}

impl State {
    /// Remembers that this process runs collective call `tag` on `ctx`
    /// with `stamp`, and looks at the messages of that call that arrived
    /// already and went unmatched: one with another stamp is a
    /// [`Conflict`] (so is any that arrives later, see
    /// [`State::check_stamp`]).
    pub(crate) fn note_call(&mut self, ctx: u32, tag: i32, stamp: u32) {
        if self.calls.len() == CALLS_KEPT {
            self.calls.pop_front();
        }
        self.calls.push_back((ctx, tag, stamp));
        if self.matcher.has_unexpected() {
            // The oldest messages only: the current call's are the oldest
            // waiting (calls go in order, each sender's messages too), and
            // a long queue (a root running ahead) must not make every call
            // walk it.
            self.find_conflicts(ctx, tag, stamp);
        }
        if !self.probes.is_empty() {
            self.find_probed(ctx, tag, stamp);
        }
    }

    /// The probes that came for call `tag` on `ctx` before it started here.
    #[cold]
    #[inline(never)]
    fn find_probed(&mut self, ctx: u32, tag: i32, mine: u32) {
        let (hit, rest): (Vec<Probe>, Vec<Probe>) = std::mem::take(&mut self.probes)
            .into_iter()
            .partition(|p| p.ctx == ctx && p.tag == tag);
        self.probes = rest;
        for p in hit {
            if p.stamp != mine {
                self.add_conflict(Conflict {
                    ctx,
                    tag,
                    src: p.src,
                    peer: p.peer,
                    got: p.stamp,
                    mine,
                });
            }
        }
    }

    /// A probe (a notice with a stamp and no payload, [`Engine::probe_calls`])
    /// from `src` (world rank `peer`): that rank has waited a while in
    /// call `tag` on `ctx` with `stamp`, for a message of this process. A
    /// [`Conflict`] when this process makes or made that call with another
    /// stamp; kept for the call when it has not started here yet.
    #[cold]
    #[inline(never)]
    pub(super) fn on_probe(&mut self, ctx: u32, tag: i32, src: u32, peer: usize, stamp: u32) {
        let tag = tag & NOTICE_MASK;
        if self.calls.iter().any(|&(c, t, _)| c == ctx && t == tag) {
            self.check_stamp(ctx, tag, src, peer, stamp);
            return;
        }
        if self.probes.len() == PROBES_KEPT {
            self.probes.remove(0);
        }
        self.probes.push(Probe {
            ctx,
            tag,
            src,
            peer,
            stamp,
        });
    }

    #[cold]
    #[inline(never)]
    fn find_conflicts(&mut self, ctx: u32, tag: i32, mine: u32) {
        let found: Vec<Conflict> = self
            .matcher
            .oldest_unexpected(EARLY_LOOKED_AT)
            .filter(|u| u.ctx == ctx && u.tag == tag && u.stamp != 0 && u.stamp != mine)
            .map(|u| Conflict {
                ctx,
                tag,
                src: u.src,
                peer: u.peer,
                got: u.stamp,
                mine,
            })
            .collect();
        for c in found {
            self.add_conflict(c);
        }
    }

    /// An unmatched message of call `tag` on `ctx` with `stamp` arrived
    /// from `src` (world rank `peer`): a [`Conflict`] when this process
    /// makes or made that call with another stamp. One short scan of the
    /// calls remembered, per message that arrives before its receive.
    #[inline]
    pub(super) fn check_stamp(&mut self, ctx: u32, tag: i32, src: u32, peer: usize, stamp: u32) {
        let mine = self
            .calls
            .iter()
            .rev()
            .find(|&&(c, t, _)| c == ctx && t == tag)
            .map(|&(_, _, s)| s);
        if let Some(mine) = mine.filter(|&m| m != stamp) {
            self.add_conflict(Conflict {
                ctx,
                tag,
                src,
                peer,
                got: stamp,
                mine,
            });
        }
    }

    #[cold]
    #[inline(never)]
    fn add_conflict(&mut self, c: Conflict) {
        // One per call is enough to fail it.
        if self
            .conflicts
            .iter()
            .any(|x| x.ctx == c.ctx && x.tag == c.tag)
        {
            return;
        }
        self.conflicts.push(c);
        // Waiters look for notices when the count moves.
        self.note_notice();
    }

    /// Takes the first conflict on `ctx` whose call's tag `pick` accepts.
    #[cold]
    #[inline(never)]
    pub(crate) fn take_conflict(
        &mut self,
        ctx: u32,
        pick: impl Fn(i32) -> bool,
    ) -> Option<Conflict> {
        let i = self
            .conflicts
            .iter()
            .position(|c| c.ctx == ctx && pick(c.tag & NOTICE_MASK))?;
        self.notices_waiting = self.notices_waiting.saturating_sub(1);
        Some(self.conflicts.remove(i))
    }
}

impl Engine {
    /// Sends `payload` as a notice about operation `tag` on context `ctx`
    /// to world rank `peer` (`src`: this rank in the communicator), if it
    /// fits an eager message; never waits: a send that finds no room goes
    /// on from a copy of its own. Best effort: a peer that cannot be told
    /// still ends its wait by the usual means (a lost peer, the watchdog).
    #[cold]
    #[inline(never)]
    pub fn send_notice(&mut self, peer: usize, ctx: u32, src: u32, tag: i32, payload: &[u8]) {
        let slot = match self.peers.slot(peer) {
            Some(i) => i,
            None => self.open_channel(peer),
        };
        if payload.len() > self.peers.list[slot].chan.eager_limit() {
            return;
        }
        let t = notice_tag(tag);
        if let Ok(Posted2::Pending(tok)) =
            self.post_send(peer, ctx, src, t, payload.as_ptr(), payload.len())
        {
            // Nobody waits for it: it keeps a copy of the payload and its
            // completion is collected when the engine settles.
            let _ = self.abandon(tok);
        }
    }

    /// Once a wait has blocked for a liveness interval: to every peer that
    /// a collective receive of this process waits for, says once which
    /// call this is (a probe: a notice with the call's stamp and no
    /// payload). A peer that makes that call with another stamp finds the
    /// disagreement ([`State::on_probe`]) where no message would ever show
    /// it: two ranks that each think they are a reduce's root both wait to
    /// receive, and nothing is sent. One small message per peer and call,
    /// only from a rank that blocks; nothing on a call that does not.
    #[cold]
    #[inline(never)]
    pub(crate) fn probe_calls(&mut self) {
        if self.st.calls.is_empty() {
            return;
        }
        let me = self.rank();
        let mut probes: Vec<(usize, u32, u32, i32, u32)> = Vec::new();
        for (ctx, src, tag, tok) in self.st.matcher.posted_keys() {
            let (Some(_), Some(tag)) = (src, tag) else {
                continue;
            };
            let Some(&(_, _, stamp)) = self
                .st
                .calls
                .iter()
                .rev()
                .find(|&&(c, t, _)| c == ctx && t == tag)
            else {
                continue;
            };
            // A call without a stamp (the library's own exchanges) has
            // nothing to compare, and its probe would read as a notice.
            if stamp == 0 || self.st.probed.contains(&(ctx, tag, tok)) {
                continue;
            }
            let Some(super::ops::Op {
                kind:
                    super::ops::OpKind::Recv {
                        peer: Some(w),
                        group,
                        ..
                    },
                ..
            }) = self.st.ops.get(tok)
            else {
                continue;
            };
            let Some(mine) = group.iter().position(|&g| g == me) else {
                continue;
            };
            probes.push((*w, ctx, mine as u32, tag, stamp));
            if self.st.probed.len() == CALLS_KEPT {
                self.st.probed.pop_front();
            }
            self.st.probed.push_back((ctx, tag, tok));
        }
        for (w, ctx, mine, tag, stamp) in probes {
            let t = notice_tag(tag);
            let buf = std::ptr::NonNull::<u8>::dangling().as_ptr();
            if let Ok(Posted2::Pending(tok)) =
                self.post_send_stamped(w, ctx, mine, t, buf, 0, stamp)
            {
                let _ = self.abandon(tok);
            }
        }
    }

    /// Takes the earliest notice on context `ctx` whose operation tag
    /// `pick` accepts.
    #[cold]
    #[inline(never)]
    pub fn take_notice(&mut self, ctx: u32, pick: impl Fn(i32) -> bool) -> Option<Notice> {
        if self.st.notices_waiting == 0 {
            return None;
        }
        let u = self
            .st
            .matcher
            .take_unexpected_where(ctx, |t| is_notice(t) && pick(t & NOTICE_MASK))?;
        self.st.notices_waiting -= 1;
        let payload = match u.body {
            super::matching::Body::Eager(v) => v,
            // Notices are only sent eagerly.
            super::matching::Body::Rts { .. } => Vec::new(),
        };
        Some(Notice {
            src: u.src,
            tag: u.tag & NOTICE_MASK,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notice_tags_are_their_own() {
        for t in [0, 16, 17, (1 << 29) + 15, (1 << 30) - 1] {
            let n = notice_tag(t);
            assert!(is_notice(n));
            assert_eq!(n & NOTICE_MASK, t);
        }
        // User tags, collective tags, sentinels (bit 30) and the fast
        // path's block tags (-1 - k, k below 2^30) are not notices.
        for t in [0, 5, 16 + 1000, (1 << 30) | 17, -1, -(1 << 30), i32::MAX] {
            assert!(!is_notice(t), "{t}");
        }
    }
}
