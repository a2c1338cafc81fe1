//! Blocks of different lengths in one fast-path call (gatherv, scatterv,
//! alltoallv). Only some ranks know every length, so a call cannot be
//! turned away from the fast path for being too big (the ranks would not
//! agree); instead each rank decides block by block. A block that fits
//! goes through the slots; one that does not travels as a message of the
//! call on the communicator's collective context, with a tag made from the
//! call's number (negative, so never a schedule's).
//!
//! A rank that publishes the blocks of several members (the scatterv root,
//! every alltoallv rank) starts its publication with a directory: for each
//! member the block's offset and length, or [`BY_MESSAGE`]. Blocks are
//! placed in member order while they fit ([`plan`]); a publication too
//! short to hold the directory means every block travels as a message.
//! Readers check every entry against the publication and their own
//! expectations.
//!
//! Once a message is posted the call goes on to the end, keeping its first
//! error ([`Msgs`], held by the [`FastCall`]): a receive must not outlive
//! the call whose buffer it points into. Dropping the call (an early
//! return, a panic) waits for its messages too.

use super::FastCall;
use crate::engine::ops::Token;
use crate::engine::Posted2;
use crate::error::{Error, Result};

/// Directory entry of a block that travels as a message.
const BY_MESSAGE: u32 = u32::MAX;

/// Bytes of one directory entry: offset and length, `u32` each.
const ENTRY: usize = 8;

/// The messages of one call, and its first error.
#[derive(Default)]
pub(super) struct Msgs {
    /// Operation, member, and for a receive the length expected.
    pending: Vec<(Token, usize, Option<usize>)>,
    err: Option<Error>,
}

impl Msgs {
    /// The value of `r`, or `None` after keeping its error (the first).
    fn note<T>(&mut self, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.err.get_or_insert(e);
                None
            }
        }
    }

    /// Whether an error was kept.
    fn failed(&self) -> bool {
        self.err.is_some()
    }

    /// Whether nothing is pending and no error kept.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.err.is_none()
    }
}

impl FastCall<'_> {
    fn msg_tag(&self) -> i32 {
        -1 - (self.k % (1 << 30)) as i32
    }

    /// Sends `len` bytes at `buf` (valid until [`finish`](Self::finish)
    /// or the call's end) to member `r` as this call's message.
    pub fn send_msg(&mut self, r: usize, buf: *const u8, len: usize) {
        let tag = self.msg_tag();
        let stamp = (self.stamp >> super::STAMP_SHIFT) as u32;
        match self.e.post_send_stamped(
            self.group[r],
            self.ctx,
            self.me as u32,
            tag,
            buf,
            len,
            stamp,
        ) {
            Ok(Posted2::Done) => {}
            Ok(Posted2::Pending(t)) => self.msgs().pending.push((t, r, None)),
            Err(e) => {
                self.msgs().note::<()>(Err(e));
            }
        }
    }

    /// Receives member `r`'s message of this call, exactly `len` bytes,
    /// into `buf` (valid until [`finish`](Self::finish) or the call's end).
    pub fn recv_msg(&mut self, r: usize, buf: *mut u8, len: usize) {
        let tag = self.msg_tag();
        let t = self.e.post_recv(
            self.ctx,
            Some(r as u32),
            Some(self.group[r]),
            Some(tag),
            self.group,
            buf,
            len,
        );
        self.msgs().pending.push((t, r, Some(len)));
    }

    /// Waits for every message of the call (each ends, delivered or
    /// failed, within the engine's bounds); the call's first error.
    ///
    /// Checked inline: most calls have no messages.
    #[inline]
    pub fn finish(&mut self) -> Result<()> {
        let idle = match &self.msgs {
            None => true,
            Some(m) => m.is_empty(),
        };
        if idle {
            return Ok(());
        }
        self.finish_msgs()
    }

    /// Keeps `r`'s error as the call's (if it is the first) and gives its
    /// value otherwise.
    pub fn note<T>(&mut self, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => self.msgs().note(Err(e)),
        }
    }

    /// The call's messages, made on first use (most calls have none).
    fn msgs(&mut self) -> &mut Msgs {
        self.msgs.get_or_insert_with(Box::default)
    }

    /// Whether the call has an error already.
    pub fn msgs_failed(&self) -> bool {
        self.msgs.as_ref().is_some_and(|m| m.failed())
    }

    #[inline(never)]
    pub(super) fn finish_msgs(&mut self) -> Result<()> {
        let Some(m) = self.msgs.take() else {
            return Ok(());
        };
        let (pending, mut err) = (m.pending, m.err);
        let group = self.group;
        for (t, r, want) in pending {
            // A member's death may leave a live peer that gave up on the
            // call (it will never post its side): then let go of what can
            // be let go of safely and wait only for data already moving.
            self.e
                .wait_until(|e| e.is_done(t) || e.failed_member(group).is_some());
            if !self.e.is_done(t) {
                err.get_or_insert_with(|| self.lost(self.group[r]));
                match self.e.abandon(t) {
                    Some(_) => continue,
                    None => self.e.wait_until(|e| e.is_done(t)),
                }
            }
            let got = self.e.recv_stamp(t);
            match self.e.take_result(t) {
                Some(Ok(st)) => {
                    if want.is_some() && got != (self.stamp >> super::STAMP_SHIFT) as u32 {
                        err.get_or_insert(
                            self.stamp_mismatch(r, (got as usize) << super::STAMP_SHIFT),
                        );
                    } else if let Some(w) = want.filter(|&w| w != st.len) {
                        err.get_or_insert(self.mismatch(r, st.len, w));
                    }
                }
                Some(Err(x)) => {
                    err.get_or_insert(x);
                }
                None => {}
            }
        }
        err.map_or(Ok(()), |e| Err(e.with_op(self.op)))
    }

    /// Publishes a directory and the blocks of the other members that fit
    /// (member `r`'s: `block(r)`, byte offset in `src` and length), then
    /// sends the others as messages of the call.
    ///
    /// # Safety
    /// `src` readable for every `block(r)` until [`finish`](Self::finish)
    /// (the caller checked them).
    pub unsafe fn publish_blocks(
        &mut self,
        src: *const u8,
        block: impl Fn(usize) -> (usize, usize),
    ) -> Result<()> {
        let (n, me, cap) = (self.size(), self.me, self.capacity());
        let total = plan(n, me, cap, |r| block(r).1, |_, _| {});
        let slot = self.claim(total)?;
        let mut by_message = Vec::new();
        // SAFETY: the slot holds `total` bytes: the directory, then each
        // placed block at its offset (`plan`); the blocks are readable (the
        // caller's guarantee).
        unsafe {
            if total > 0 {
                write_entry(slot, me, None, 0);
            }
            plan(
                n,
                me,
                cap,
                |r| block(r).1,
                |r, at| {
                    let (off, len) = block(r);
                    match at {
                        Some(at) => super::copy(src.add(off), slot.add(at), len),
                        None => by_message.push(r),
                    }
                    if total > 0 {
                        write_entry(slot, r, at, len);
                    }
                },
            );
        }
        self.publish();
        for r in by_message {
            let (off, len) = block(r);
            // SAFETY: as above.
            self.send_msg(r, unsafe { src.add(off) }, len);
        }
        Ok(())
    }

    /// Member `j`'s block for this rank in `j`'s directory publication,
    /// `want` bytes long: `Some(pointer)` in the slot, `None` when it
    /// travels as a message (checked against the publication).
    pub fn block_from(&mut self, j: usize, want: usize) -> Result<Option<*const u8>> {
        let (p, len) = self.publication_of(j)?;
        let n = self.size();
        if len < n * ENTRY {
            return Ok(None);
        }
        // SAFETY: the publication holds the directory (checked above).
        let (off, blen) = unsafe { read_entry(p, self.me) };
        if off == BY_MESSAGE {
            return Ok(None);
        }
        let (off, blen) = (off as usize, blen as usize);
        if blen != want || off.checked_add(blen).map_or(true, |e| e > len) {
            return Err(self.mismatch(j, blen, want));
        }
        // SAFETY: `off + blen <= len` bytes of the publication.
        Ok(Some(unsafe { p.add(off) }))
    }
}

/// Lays out a directory publication for `n` members: the directory, then
/// the blocks of the members other than `me` (`len_of`) while they fit in
/// `cap` bytes, in member order. Calls `each(member, Some(offset))` for a
/// block placed and `each(member, None)` for one sent as a message;
/// returns the publication's length (0 when even the directory does not
/// fit: then every block is a message). The same inputs give the same
/// layout.
fn plan(
    n: usize,
    me: usize,
    cap: usize,
    len_of: impl Fn(usize) -> usize,
    mut each: impl FnMut(usize, Option<usize>),
) -> usize {
    let dir = n * ENTRY;
    let mut total = dir;
    for j in (0..n).filter(|&j| j != me) {
        let len = len_of(j);
        let room = cap.min(u32::MAX as usize);
        if dir <= cap && total.checked_add(len).is_some_and(|end| end <= room) {
            each(j, Some(total));
            total += len;
        } else {
            each(j, None);
        }
    }
    if dir > cap {
        0
    } else {
        total
    }
}

/// Writes directory entry `j` at `dir`: a block of `len` bytes at `off`,
/// or with `off` `None` one sent as a message.
///
/// # Safety
/// `dir` writable for `(j + 1) * ENTRY` bytes.
unsafe fn write_entry(dir: *mut u8, j: usize, off: Option<usize>, len: usize) {
    let off = off.map_or(BY_MESSAGE, |o| o as u32);
    let len = len.min(u32::MAX as usize) as u32;
    // SAFETY: entry `j` lies within the directory, as the caller
    // guarantees; unaligned writes need no alignment.
    unsafe {
        let e = dir.add(j * ENTRY);
        (e as *mut u32).write_unaligned(off);
        (e.add(4) as *mut u32).write_unaligned(len);
    }
}

/// Reads directory entry `j` at `dir`: offset (or [`BY_MESSAGE`]) and
/// length.
///
/// # Safety
/// `dir` readable for `(j + 1) * ENTRY` bytes.
unsafe fn read_entry(dir: *const u8, j: usize) -> (u32, u32) {
    // SAFETY: entry `j` lies within the directory, as the caller
    // guarantees.
    unsafe {
        let e = dir.add(j * ENTRY);
        (
            (e as *const u32).read_unaligned(),
            (e.add(4) as *const u32).read_unaligned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(n: usize, me: usize, cap: usize, lens: &[usize]) -> (usize, Vec<Option<usize>>) {
        let mut got = vec![None; n];
        let total = plan(n, me, cap, |j| lens[j], |j, o| got[j] = o);
        (total, got)
    }

    #[test]
    fn blocks_fill_in_member_order_after_the_directory() {
        let (total, at) = layout(3, 1, 64, &[8, 99, 16]);
        assert_eq!(at, vec![Some(24), None, Some(32)]);
        assert_eq!(total, 48);
    }

    #[test]
    fn a_block_that_does_not_fit_is_a_message_and_later_ones_may_fit() {
        let (total, at) = layout(4, 0, 64, &[0, 40, 8, 100]);
        assert_eq!(at, vec![None, None, Some(32), None]);
        assert_eq!(total, 40);
    }

    #[test]
    fn no_room_for_the_directory_means_every_block_is_a_message() {
        let (total, at) = layout(8, 0, 48, &[1; 8]);
        assert_eq!(total, 0);
        assert!(at.iter().all(|o| o.is_none()));
    }

    #[test]
    fn entries_round_trip() {
        let mut d = [0u8; 24];
        // SAFETY: three entries fit in 24 bytes.
        unsafe {
            write_entry(d.as_mut_ptr(), 0, Some(24), 8);
            write_entry(d.as_mut_ptr(), 2, None, 1 << 20);
            assert_eq!(read_entry(d.as_ptr(), 0), (24, 8));
            assert_eq!(read_entry(d.as_ptr(), 2), (BY_MESSAGE, 1 << 20));
        }
    }
}
