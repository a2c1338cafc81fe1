//! The crate's one error type. Every variant names the rank that saw the
//! failure, the operation, and where one is involved, the peer.

use std::fmt;

/// What was being done when an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Init,
    Send,
    Recv,
    Probe,
    Wait,
    Split,
    Dup,
    Barrier,
    Finalize,
    /// A collective operation.
    Collective(crate::algorithms::Collective),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Op::Init => "init",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Probe => "probe",
            Op::Wait => "wait",
            Op::Split => "split",
            Op::Dup => "dup",
            Op::Barrier => "barrier",
            Op::Finalize => "finalize",
            Op::Collective(c) => c.name(),
        };
        f.write_str(s)
    }
}

/// What two ranks of a call disagree on, for [`Error::Mismatch`]: `what`
/// names the property, `a_value` and `b_value` are what each rank passed
/// (for a transfer, `what` is empty and the values say what each side
/// sends or expects).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disagreement {
    pub what: String,
    pub a_value: String,
    pub b_value: String,
}

impl Disagreement {
    /// The two ranks' sides of a transfer within a collective call: rank
    /// `from` sends `sent` bytes (as one message, or in its slot) where rank
    /// `to` expects `expected` (`what` is empty: the values are the clauses).
    pub(crate) fn transfer(from: usize, to: usize, sent: u64, expected: u64) -> Disagreement {
        Disagreement {
            what: String::new(),
            a_value: format!("sends {sent} bytes to rank {to}"),
            b_value: format!("expects {expected} bytes from rank {from}"),
        }
    }

    /// "rank a has root 0, rank b has root 1", or for a transfer "rank a
    /// sends 8 bytes to rank b, rank b expects 16 bytes from rank a".
    fn text(&self, a: usize, b: usize) -> String {
        let (w, x, y) = (&self.what, &self.a_value, &self.b_value);
        if w.is_empty() {
            format!("rank {a} {x}, rank {b} {y}")
        } else {
            format!("rank {a} has {w} {x}, rank {b} has {w} {y}")
        }
    }
}

/// A call number of [`Error::Mismatch`] that is not known (a disagreement
/// found in a message of a schedule, which does not count the calls).
pub(crate) const CALL_UNKNOWN: u64 = u64::MAX;

/// A call number of [`Error::Mismatch`] saying the disagreement was in an
/// earlier call of the communicator, which this rank completed before it
/// learned of it (a notice from a rank of that call): this call fails
/// instead.
pub(crate) const CALL_EARLIER: u64 = u64::MAX - 1;

fn call_text(call: u64) -> String {
    if call == CALL_UNKNOWN {
        "this collective call".into()
    } else if call == CALL_EARLIER {
        "an earlier collective call of the communicator (so this call fails too)".into()
    } else {
        format!("collective call {call} of the communicator")
    }
}

/// Every failure ibcoll reports.
///
/// Ranks in messages are world ranks unless the text says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The matched message is longer than the receive buffer. The first
    /// `buffer_len` bytes were delivered; the rest was discarded. The
    /// library stays usable.
    #[error("rank {rank}: {op} from rank {peer} (tag {tag}) truncated: message has {message_len} bytes, buffer holds {buffer_len}")]
    Truncated {
        rank: usize,
        peer: usize,
        op: Op,
        tag: i32,
        message_len: usize,
        buffer_len: usize,
    },

    /// The peer process died, closed its connection, or finalized while an
    /// operation still needed it.
    #[error("rank {rank}: {op} with rank {peer} failed: peer lost ({reason})")]
    PeerLost {
        rank: usize,
        peer: usize,
        op: Op,
        reason: String,
    },

    /// A bad argument (rank out of range, negative tag, ...).
    #[error("rank {rank}: {op}: invalid argument: {detail}")]
    InvalidArgument { rank: usize, op: Op, detail: String },

    /// The process manager failed.
    #[error("rank {rank}: {op}: PMI: {detail}")]
    Pmi { rank: usize, op: Op, detail: String },

    /// A configuration variable has a value that cannot be used.
    #[error("configuration {var}={value:?}: {detail}")]
    Config {
        var: &'static str,
        value: String,
        detail: String,
    },

    /// A transport could not be set up or failed (not a lost peer).
    #[error("rank {rank}: {op} with rank {peer} over {transport}: {detail}")]
    Transport {
        rank: usize,
        peer: usize,
        op: Op,
        transport: &'static str,
        detail: String,
    },

    /// An earlier call failed in a way that leaves this process's ranks
    /// out of step with the others (a reduction operation panicked): every
    /// later call says so instead of computing with them.
    #[error("rank {rank}: {op}: ibcoll cannot be used any more in this process: {detail}")]
    Poisoned { rank: usize, op: Op, detail: String },

    /// The ranks of a collective call disagree on its signature (which
    /// collective, root, bytes per rank, reduction operation or type):
    /// every rank of the call gets this error, naming the same two ranks
    /// (`a`, `b`, world ranks) and what each passed. `call` counts the
    /// collectives called on the communicator (from 0).
    /// The texts are boxed: every `Result` of the library carries this
    /// enum, and unboxed they made it 112 bytes instead of 72 (8-byte
    /// bandwidth 60 vs 70 MB/s).
    #[error("rank {rank}: {op}: ranks disagree on {}: {}", call_text(*.call), values.text(*.a, *.b))]
    Mismatch {
        rank: usize,
        op: Op,
        call: u64,
        a: usize,
        b: usize,
        values: Box<Disagreement>,
    },

    /// The watchdog (`IBCOLL_HANG_TIMEOUT`) found a blocking call waiting
    /// too long; `report` says for which ranks and what each is doing.
    #[error("rank {rank}: {op}: no progress for {waited_s} s: {report}")]
    Hang {
        rank: usize,
        op: Op,
        waited_s: u64,
        /// World ranks this call waits for.
        waiting_for: Box<[usize]>,
        report: Box<str>,
    },

    /// A peer sent bytes that do not follow the protocol.
    #[error("rank {rank}: protocol error from rank {peer}: {detail}")]
    Protocol {
        rank: usize,
        peer: usize,
        detail: String,
    },
}

impl Error {
    /// The peer involved, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Truncated { peer, .. }
            | Error::PeerLost { peer, .. }
            | Error::Transport { peer, .. }
            | Error::Protocol { peer, .. } => Some(*peer),
            Error::Mismatch { rank, a, b, .. } => Some(if rank == a { *b } else { *a }),
            Error::Hang { waiting_for, .. } => waiting_for.first().copied(),
            _ => None,
        }
    }

    /// True for [`Error::PeerLost`].
    pub fn is_peer_lost(&self) -> bool {
        matches!(self, Error::PeerLost { .. })
    }

    /// True for [`Error::Mismatch`].
    pub fn is_mismatch(&self) -> bool {
        matches!(self, Error::Mismatch { .. })
    }

    /// True for [`Error::Hang`].
    pub fn is_hang(&self) -> bool {
        matches!(self, Error::Hang { .. })
    }

    /// A copy, for reporting one failure to several operations.
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Truncated {
                rank,
                peer,
                op,
                tag,
                message_len,
                buffer_len,
            } => Error::Truncated {
                rank: *rank,
                peer: *peer,
                op: *op,
                tag: *tag,
                message_len: *message_len,
                buffer_len: *buffer_len,
            },
            Error::PeerLost {
                rank,
                peer,
                op,
                reason,
            } => Error::PeerLost {
                rank: *rank,
                peer: *peer,
                op: *op,
                reason: reason.clone(),
            },
            Error::InvalidArgument { rank, op, detail } => Error::InvalidArgument {
                rank: *rank,
                op: *op,
                detail: detail.clone(),
            },
            Error::Pmi { rank, op, detail } => Error::Pmi {
                rank: *rank,
                op: *op,
                detail: detail.clone(),
            },
            Error::Config { var, value, detail } => Error::Config {
                var,
                value: value.clone(),
                detail: detail.clone(),
            },
            Error::Transport {
                rank,
                peer,
                op,
                transport,
                detail,
            } => Error::Transport {
                rank: *rank,
                peer: *peer,
                op: *op,
                transport,
                detail: detail.clone(),
            },
            Error::Protocol { rank, peer, detail } => Error::Protocol {
                rank: *rank,
                peer: *peer,
                detail: detail.clone(),
            },
            Error::Poisoned { rank, op, detail } => Error::Poisoned {
                rank: *rank,
                op: *op,
                detail: detail.clone(),
            },
            Error::Mismatch {
                rank,
                op,
                call,
                a,
                b,
                values,
            } => Error::Mismatch {
                rank: *rank,
                op: *op,
                call: *call,
                a: *a,
                b: *b,
                values: values.clone(),
            },
            Error::Hang {
                rank,
                op,
                waited_s,
                waiting_for,
                report,
            } => Error::Hang {
                rank: *rank,
                op: *op,
                waited_s: *waited_s,
                waiting_for: waiting_for.clone(),
                report: report.clone(),
            },
        }
    }

    /// The same error, re-attributed to operation `op`.
    ///
    /// A truncated message inside a collective is a disagreement between
    /// its sender and this rank (a collective's messages are exactly as
    /// long as both sides computed from their arguments): it becomes
    /// [`Error::Mismatch`] naming both and both lengths.
    pub(crate) fn with_op(mut self, new: Op) -> Error {
        if let (
            Error::Truncated {
                rank,
                peer,
                message_len,
                buffer_len,
                ..
            },
            Op::Collective(_),
        ) = (&self, new)
        {
            return Error::Mismatch {
                rank: *rank,
                op: new,
                call: CALL_UNKNOWN,
                a: *peer,
                b: *rank,
                values: Box::new(Disagreement::transfer(
                    *peer,
                    *rank,
                    *message_len as u64,
                    *buffer_len as u64,
                )),
            };
        }
        match &mut self {
            Error::Truncated { op, .. }
            | Error::PeerLost { op, .. }
            | Error::InvalidArgument { op, .. }
            | Error::Pmi { op, .. }
            | Error::Transport { op, .. }
            | Error::Poisoned { op, .. }
            | Error::Mismatch { op, .. }
            | Error::Hang { op, .. } => *op = new,
            Error::Config { .. } | Error::Protocol { .. } => {}
        }
        self
    }
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
