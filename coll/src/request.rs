//! Nonblocking point-to-point operations: [`Request`], its [`Status`], and
//! waiting for several at once. Why they are sound: [`crate::scope`].

use std::marker::PhantomData;
use std::rc::{Rc, Weak};

use crate::datatype::Datatype;
use crate::engine::cell::EngineCell;
use crate::engine::ops::Token;
use crate::engine::Engine;
use crate::error::{Error, Op, Result};

/// What a completed receive got (for sends, all fields are zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Rank of the sender in the communicator.
    pub source: usize,
    /// Tag of the message.
    pub tag: i32,
    /// Length of the message in bytes.
    pub len: usize,
}

impl Status {
    pub(crate) fn empty() -> Status {
        Status {
            source: 0,
            tag: 0,
            len: 0,
        }
    }

    /// Number of whole `T` elements in the message.
    pub fn count<T: Datatype>(&self) -> usize {
        self.len / std::mem::size_of::<T>()
    }
}

/// A pending send or receive, started in a [`Scope`](crate::Scope) whose
/// lifetime `'scope` its buffer is borrowed for.
///
/// Waiting or testing gives the outcome. Dropping an incomplete request
/// waits for it; forgetting or leaking it is harmless: the scope finishes
/// the operation before the buffer can be used again (see
/// [`crate::scope`]). Requests belong to the thread that called
/// [`crate::init`] (neither `Send` nor `Sync`).
#[must_use = "a request does nothing unless waited for or tested"]
pub struct Request<'scope> {
    /// Weak: the job is left when the last communicator is dropped, even
    /// with requests leaked (their operations are settled then).
    eng: Weak<EngineCell>,
    tok: Option<Token>,
    /// The error boxed: a request is moved around on every nonblocking
    /// call (the C interface moves it into and out of its table), and the
    /// error inline made it 104 bytes instead of 64.
    outcome: Option<std::result::Result<Status, Box<Error>>>,
    active: bool,
    _buf: PhantomData<&'scope mut [u8]>,
}

impl<'scope> Request<'scope> {
    pub(crate) fn pending(eng: &Rc<EngineCell>, tok: Token) -> Request<'scope> {
        Request {
            eng: Rc::downgrade(eng),
            tok: Some(tok),
            outcome: None,
            active: true,
            _buf: PhantomData,
        }
    }

    pub(crate) fn finished(eng: &Rc<EngineCell>, outcome: Result<Status>) -> Request<'scope> {
        Request {
            eng: Rc::downgrade(eng),
            tok: None,
            outcome: Some(outcome.map_err(Box::new)),
            active: true,
            _buf: PhantomData,
        }
    }

    /// The engine's operation, while it is pending.
    pub(crate) fn token(&self) -> Option<Token> {
        self.tok
    }

    /// Moves the engine's outcome into the request if it is complete.
    fn collect(&mut self, eng: &mut Engine) -> bool {
        if self.outcome.is_some() {
            return true;
        }
        let Some(tok) = self.tok else {
            return true;
        };
        match eng.take_result(tok) {
            Some(r) => {
                self.outcome = Some(r.map_err(Box::new));
                self.tok = None;
                true
            }
            None => false,
        }
    }

    fn outcome_copy(&self) -> Result<Status> {
        match &self.outcome {
            Some(Ok(s)) => Ok(*s),
            Some(Err(e)) => Err(e.duplicate()),
            None => Err(Error::InvalidArgument {
                rank: 0,
                op: Op::Wait,
                detail: "request has no outcome".into(),
            }),
        }
    }

    /// Blocks until the operation completes.
    pub fn wait(mut self) -> Result<Status> {
        if let Some(tok) = self.tok {
            let Some(eng) = self.eng.upgrade() else {
                self.tok = None;
                return Err(finalized());
            };
            let mut e = eng.borrow_mut();
            if let Some(x) = e.wait_op_watched(tok, Op::Wait) {
                self.tok = None;
                return Err(x);
            }
            self.collect(&mut e);
        }
        match self.outcome.take() {
            Some(r) => r.map_err(|e| *e),
            None => Ok(Status::empty()),
        }
    }

    /// Makes progress once; `Some(status)` if the operation is complete
    /// (and stays so on later calls).
    pub fn test(&mut self) -> Result<Option<Status>> {
        if self.outcome.is_none() {
            let Some(eng) = self.eng.upgrade() else {
                self.tok = None;
                self.outcome = Some(Err(Box::new(finalized())));
                return self.outcome_copy().map(Some);
            };
            let mut e = eng.borrow_mut();
            e.progress();
            if !self.collect(&mut e) {
                return Ok(None);
            }
        }
        self.outcome_copy().map(Some)
    }

    /// Cancels a receive that no message has matched yet: it completes at
    /// once with an empty status and nothing is written into its buffer
    /// later. False (and no effect) for a send, or a receive that matched
    /// or completed already.
    pub fn cancel(&mut self) -> bool {
        let Some(tok) = self.tok else { return false };
        let Some(eng) = self.eng.upgrade() else {
            return false;
        };
        let mut e = eng.borrow_mut();
        e.progress();
        if !e.cancel_recv(tok) {
            return false;
        }
        self.tok = None;
        self.outcome = Some(Ok(Status::empty()));
        true
    }

    /// True once complete (makes progress once).
    pub fn is_complete(&mut self) -> bool {
        !matches!(self.test(), Ok(None))
    }
}

/// The outcome of a request waited for after the last communicator was
/// dropped (its operation was settled then).
fn finalized() -> Error {
    Error::InvalidArgument {
        rank: 0,
        op: Op::Wait,
        detail: "every communicator was dropped before this request was waited for \
                 (ibcoll finalized and settled its operation then)"
            .into(),
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        let Some(tok) = self.tok.take() else { return };
        // Gone: the operation was settled when the engine finalized.
        let Some(eng) = self.eng.upgrade() else {
            return;
        };
        let guard = eng.try_borrow_mut();
        match guard {
            Some(mut e) if std::thread::panicking() => {
                // Unwinding: a receive nobody will match must not hold the
                // panic up; let go of what can be let go of safely.
                if e.abandon(tok).is_none() {
                    e.wait_until(|e| e.is_done(tok));
                    let _ = e.take_result(tok);
                }
            }
            Some(mut e) => {
                e.wait_until(|e| e.is_done(tok));
                let _ = e.take_result(tok);
            }
            None => {
                // Only a request dropped from inside a reduction operation
                // gets here: it cannot be waited for, and skipping the wait
                // would let the engine write into a buffer that is about
                // to be reused.
                eprintln!(
                    "ibcoll: a pending request was dropped while ibcoll was busy with \
                     another call (from inside a reduction operation); aborting the process"
                );
                std::process::abort();
            }
        }
    }
}

/// Waits for every request; returns their statuses, or the first error
/// (after all have completed).
pub fn wait_all<'a>(reqs: impl IntoIterator<Item = Request<'a>>) -> Result<Vec<Status>> {
    let mut out = Vec::new();
    let mut first_err = None;
    for r in reqs {
        match r.wait() {
            Ok(s) => out.push(s),
            Err(e) => {
                if first_err.is_none() {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Waits until one of the not yet reported requests completes and returns
/// its index and outcome; that request is then inactive (later calls skip
/// it). `None` when no active request is left.
pub fn wait_any(reqs: &mut [Request<'_>]) -> Option<(usize, Result<Status>)> {
    let first = reqs.iter().position(|r| r.active)?;
    let Some(eng) = reqs[first].eng.upgrade() else {
        let r = &mut reqs[first];
        r.active = false;
        r.tok = None;
        return Some((first, Err(finalized())));
    };
    let mut e = eng.borrow_mut();
    loop {
        for (i, r) in reqs.iter_mut().enumerate() {
            if r.active && r.collect(&mut e) {
                r.active = false;
                let out = r.outcome_copy();
                return Some((i, out));
            }
        }
        let toks: Vec<Token> = reqs
            .iter()
            .filter(|r| r.active)
            .filter_map(|r| r.tok)
            .collect();
        e.wait_until(|e| toks.iter().any(|&t| e.is_done(t)));
    }
}
