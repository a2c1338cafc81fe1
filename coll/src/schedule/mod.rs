//! Schedules: collective algorithms as data.
//!
//! An algorithm is a function from (rank, communicator shape, sizes) to a
//! [`Schedule`]: a list of rounds, each a list of [`Step`]s over byte
//! slices of three kinds of buffer (the user's send buffer, the user's
//! receive buffer, and scratch buffers the schedule owns). A round is run
//! as: post every send and receive of the round (in the listed order), wait
//! for all of them, then carry out the round's local copies and reductions
//! in order. The same schedule is run by the engine (blocking or as a
//! nonblocking [`CollRequest`](crate::CollRequest), see `run.rs`) and by the
//! simulator (`crate::sim`) for thousands of virtual ranks.
//!
//! Messages between two ranks within one collective are matched in FIFO
//! order on the communicator's internal context with a tag unique to the
//! collective call, so both sides must list the messages they exchange in
//! the same order (every builder here does).

pub(crate) mod run;

use std::fmt;

/// Which buffer a slice lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The user's send (input) buffer; read only.
    Send,
    /// The user's receive (output, or in-place) buffer.
    Recv,
    /// Scratch buffer `i` owned by the schedule.
    Scratch(u16),
}

/// A byte range of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub buf: Buf,
    pub off: usize,
    pub len: usize,
}

impl Slice {
    /// Whether the two slices share a byte.
    pub fn overlaps(&self, other: &Slice) -> bool {
        self.buf == other.buf
            && self.len > 0
            && other.len > 0
            && self.off < other.off + other.len
            && other.off < self.off + self.len
    }
}

/// One step of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send `data` to communicator rank `peer`.
    Send { peer: usize, data: Slice },
    /// Receive exactly `data.len` bytes from communicator rank `peer`.
    Recv { peer: usize, data: Slice },
    /// `dst = src` (after the round's messages completed).
    Copy { src: Slice, dst: Slice },
    /// `dst = op(src, dst)` if `src_left`, else `dst = op(dst, src)`.
    Reduce {
        src: Slice,
        dst: Slice,
        src_left: bool,
    },
    /// `dst = bytes`: values only the builder knows (the counts a peer
    /// learns from this rank, see [`Schedule::then`]).
    Put { dst: Slice, bytes: Vec<u8> },
}

impl Step {
    pub fn is_comm(&self) -> bool {
        matches!(self, Step::Send { .. } | Step::Recv { .. })
    }
}

/// The rounds of one rank's part of a collective.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    pub rounds: Vec<Vec<Step>>,
    /// Scratch buffer sizes in bytes.
    pub scratch: Vec<usize>,
    /// Whether any step reduces (the runner then needs an operation).
    pub reduces: bool,
    /// A schedule in two phases (the node-aware v-collectives, where a
    /// node leader learns its members' counts from a peer before it can
    /// size their messages): after the last round, the runner (engine or
    /// simulator) calls the algorithm again with [`Args::learned`] set to
    /// the little-endian `u64`s of this scratch buffer, and runs the
    /// schedule it returns, on the same buffers, tag and peers.
    ///
    /// [`Args::learned`]: crate::algorithms::Args::learned
    pub then: Option<u16>,
    /// Counts learned from a peer that disagree with this rank's own: the
    /// runner fails the call with [`Error::Mismatch`] (told to every rank)
    /// instead of running the rounds.
    ///
    /// [`Error::Mismatch`]: crate::Error::Mismatch
    pub fault: Option<Fault>,
}

/// A disagreement a builder found in learned counts: rank `from` sends
/// `sent` bytes where rank `to` expects `expected` (communicator ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub from: usize,
    pub to: usize,
    pub sent: u64,
    pub expected: u64,
}

/// The `u64`s a phase learned (see [`Schedule::then`]).
pub fn learned_values(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// `counts` as the bytes a peer learns them from.
pub fn learned_bytes(counts: impl IntoIterator<Item = usize>) -> Vec<u8> {
    counts
        .into_iter()
        .flat_map(|c| (c as u64).to_le_bytes())
        .collect()
}

/// Why a schedule cannot run on the given buffers (a bug in a builder or
/// inconsistent arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSchedule(pub String);

impl fmt::Display for BadSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Schedule {
    /// Number of messages sent and bytes sent, for statistics.
    pub fn send_volume(&self) -> (usize, usize) {
        let mut m = 0;
        let mut b = 0;
        for s in self.rounds.iter().flatten() {
            if let Step::Send { data, .. } = s {
                m += 1;
                b += data.len;
            }
        }
        (m, b)
    }

    /// Checks every slice against the buffer lengths (`send_len`,
    /// `recv_len`, scratch sizes), that nothing writes the send buffer,
    /// that peers are below `size` and not `rank`, and that reductions do
    /// not overlap themselves.
    pub fn validate(
        &self,
        rank: usize,
        size: usize,
        send_len: usize,
        recv_len: usize,
    ) -> Result<(), BadSchedule> {
        let cap = |b: Buf| match b {
            Buf::Send => Some(send_len),
            Buf::Recv => Some(recv_len),
            Buf::Scratch(i) => self.scratch.get(i as usize).copied(),
        };
        let check = |s: &Slice, write: bool| -> Result<(), BadSchedule> {
            let c = cap(s.buf).ok_or_else(|| BadSchedule(format!("{s:?}: no such buffer")))?;
            if s.off.checked_add(s.len).map_or(true, |end| end > c) {
                return Err(BadSchedule(format!(
                    "{s:?} exceeds its buffer of {c} bytes"
                )));
            }
            if write && s.buf == Buf::Send && s.len > 0 {
                return Err(BadSchedule(format!("{s:?} writes the send buffer")));
            }
            Ok(())
        };
        let overlap = |a: &Slice, b: &Slice| a.overlaps(b);
        for (i, round) in self.rounds.iter().enumerate() {
            for s in round {
                match s {
                    Step::Send { peer, data } | Step::Recv { peer, data } => {
                        if *peer >= size || *peer == rank {
                            return Err(BadSchedule(format!(
                                "round {i}: peer {peer} invalid for rank {rank} of {size}"
                            )));
                        }
                        check(data, matches!(s, Step::Recv { .. }))?;
                    }
                    Step::Copy { src, dst } => {
                        check(src, false)?;
                        check(dst, true)?;
                        if src.len != dst.len {
                            return Err(BadSchedule(format!("round {i}: copy length mismatch")));
                        }
                    }
                    Step::Put { dst, bytes } => {
                        check(dst, true)?;
                        if bytes.len() != dst.len {
                            return Err(BadSchedule(format!("round {i}: put length mismatch")));
                        }
                    }
                    Step::Reduce { src, dst, .. } => {
                        check(src, false)?;
                        check(dst, true)?;
                        if src.len != dst.len || overlap(src, dst) {
                            return Err(BadSchedule(format!(
                                "round {i}: reduce {src:?} -> {dst:?} mismatched or overlapping"
                            )));
                        }
                    }
                }
            }
        }
        if let Some(t) = self.then {
            if self.scratch.get(t as usize).is_none() {
                return Err(BadSchedule(format!(
                    "learns from scratch {t}, which is not there"
                )));
            }
        }
        Ok(())
    }
}

/// Builds a schedule in element units (`esize` bytes per element).
#[derive(Debug)]
pub struct Builder {
    esize: usize,
    sched: Schedule,
    cur: Vec<Step>,
    /// While set, the peers of sends and receives are indices into it, so
    /// a schedule written for ranks 0..n runs on a group of them.
    group: Option<Vec<usize>>,
}

/// A slice in element units: (buffer, offset, length).
pub type El = (Buf, usize, usize);

impl Builder {
    pub fn new(esize: usize) -> Builder {
        Builder {
            esize: esize.max(1),
            sched: Schedule::default(),
            cur: Vec::new(),
            group: None,
        }
    }

    /// Peers given from now on are members of `group` (`None`: ranks).
    /// One group at a time: a call replaces the group before it, so a
    /// schedule run on a group must not itself call this.
    pub fn within(&mut self, group: Option<&[usize]>) {
        self.group = group.map(<[usize]>::to_vec);
    }

    fn peer(&self, p: usize) -> usize {
        self.group.as_ref().map_or(p, |g| g[p])
    }

    fn sl(&self, (buf, off, len): El) -> Slice {
        Slice {
            buf,
            off: off * self.esize,
            len: len * self.esize,
        }
    }

    /// A new scratch buffer of `elems` elements.
    pub fn scratch(&mut self, elems: usize) -> Buf {
        self.sched.scratch.push(elems * self.esize);
        Buf::Scratch((self.sched.scratch.len() - 1) as u16)
    }

    pub fn send(&mut self, peer: usize, s: El) {
        let peer = self.peer(peer);
        let data = self.sl(s);
        self.cur.push(Step::Send { peer, data });
    }

    pub fn recv(&mut self, peer: usize, s: El) {
        let peer = self.peer(peer);
        let data = self.sl(s);
        self.cur.push(Step::Recv { peer, data });
    }

    /// A local copy; skipped when empty or a no-op.
    pub fn copy(&mut self, src: El, dst: El) {
        if src.2 == 0 || (src.0 == dst.0 && src.1 == dst.1) {
            return;
        }
        let (src, dst) = (self.sl(src), self.sl(dst));
        self.cur.push(Step::Copy { src, dst });
    }

    /// `dst = op(src, dst)` if `src_left`, else `dst = op(dst, src)`.
    pub fn reduce(&mut self, src: El, dst: El, src_left: bool) {
        if src.2 == 0 {
            return;
        }
        let (src, dst) = (self.sl(src), self.sl(dst));
        self.sched.reduces = true;
        self.cur.push(Step::Reduce { src, dst, src_left });
    }

    /// A new scratch buffer of `bytes` bytes (for counts, whatever the
    /// element size).
    pub fn scratch_bytes(&mut self, bytes: usize) -> Buf {
        self.sched.scratch.push(bytes);
        Buf::Scratch((self.sched.scratch.len() - 1) as u16)
    }

    /// `bytes` at byte `off` of `buf`, sent or received whole with
    /// [`Builder::send_bytes`] and [`Builder::recv_bytes`].
    pub fn put(&mut self, buf: Buf, off: usize, bytes: Vec<u8>) {
        let dst = Slice {
            buf,
            off,
            len: bytes.len(),
        };
        self.cur.push(Step::Put { dst, bytes });
    }

    /// Sends `len` bytes at byte `off` of `buf`.
    pub fn send_bytes(&mut self, peer: usize, buf: Buf, off: usize, len: usize) {
        let peer = self.peer(peer);
        let data = Slice { buf, off, len };
        self.cur.push(Step::Send { peer, data });
    }

    /// Receives `len` bytes into byte `off` of `buf`.
    pub fn recv_bytes(&mut self, peer: usize, buf: Buf, off: usize, len: usize) {
        let peer = self.peer(peer);
        let data = Slice { buf, off, len };
        self.cur.push(Step::Recv { peer, data });
    }

    /// Copies `len` bytes (a local step; skipped when empty).
    pub fn copy_bytes(&mut self, src: (Buf, usize), dst: (Buf, usize), len: usize) {
        if len == 0 {
            return;
        }
        let src = Slice {
            buf: src.0,
            off: src.1,
            len,
        };
        let dst = Slice {
            buf: dst.0,
            off: dst.1,
            len,
        };
        self.cur.push(Step::Copy { src, dst });
    }

    /// Makes the schedule a first phase that learns the `u64`s `buf` holds
    /// at its end (see [`Schedule::then`]).
    pub fn then(&mut self, buf: Buf) {
        if let Buf::Scratch(i) = buf {
            self.sched.then = Some(i);
        }
    }

    /// Makes the schedule fail the call with `f` (see [`Schedule::fault`]).
    pub fn fault(&mut self, f: Fault) {
        self.sched.fault = Some(f);
    }

    /// Closes the current round (no-op when empty).
    pub fn end_round(&mut self) {
        if !self.cur.is_empty() {
            let r = std::mem::take(&mut self.cur);
            self.sched.rounds.push(r);
        }
    }

    pub fn finish(mut self) -> Schedule {
        self.end_round();
        self.sched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_and_validation() {
        let mut b = Builder::new(4);
        let t = b.scratch(2);
        b.recv(1, (t, 0, 2));
        b.send(1, (Buf::Send, 0, 2));
        b.reduce((t, 0, 2), (Buf::Recv, 0, 2), true);
        b.end_round();
        b.copy((Buf::Recv, 0, 1), (Buf::Recv, 0, 1));
        let s = b.finish();
        assert_eq!(s.rounds.len(), 1);
        assert!(s.reduces);
        assert_eq!(s.scratch, vec![8]);
        assert!(s.validate(0, 2, 8, 8).is_ok());
        assert!(s.validate(0, 2, 8, 4).is_err());
        assert!(s.validate(1, 2, 8, 8).is_err());
        let mut b = Builder::new(1);
        b.recv(1, (Buf::Send, 0, 1));
        assert!(b.finish().validate(0, 2, 1, 1).is_err());
        // Two-phase pieces: a put fits its buffer, the learned buffer
        // exists, counts round-trip through their bytes.
        let mut b = Builder::new(4);
        let t = b.scratch_bytes(16);
        b.put(t, 0, learned_bytes([7, 0]));
        b.end_round();
        b.send_bytes(1, t, 0, 16);
        b.then(t);
        let s = b.finish();
        assert_eq!(s.then, Some(0));
        assert!(s.validate(0, 2, 0, 0).is_ok());
        let mut b = Builder::new(1);
        let t = b.scratch_bytes(8);
        b.put(t, 4, learned_bytes([1]));
        assert!(b.finish().validate(0, 2, 0, 0).is_err());
        let mut bad = Schedule {
            then: Some(3),
            ..Schedule::default()
        };
        assert!(bad.validate(0, 2, 0, 0).is_err());
        bad.then = None;
        assert!(bad.validate(0, 2, 0, 0).is_ok());
        assert_eq!(
            learned_values(&learned_bytes([5, 1 << 40])),
            vec![5, 1 << 40]
        );
    }
}
