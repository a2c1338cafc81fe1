//! Nonblocking operations: [`Request`], its [`Status`], and waiting for
//! several at once.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

use crate::datatype::Datatype;
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

/// A pending send or receive. It borrows the buffer for `'a`; dropping it
/// before completion waits for completion (an operation cannot be
/// abandoned while the engine may still touch the buffer).
///
/// Leaking a pending request (`mem::forget`) while its buffer is freed is
/// not supported: the engine would still write into the buffer.
#[must_use = "a request does nothing unless waited for or tested"]
pub struct Request<'a> {
    eng: Rc<RefCell<Engine>>,
    tok: Option<Token>,
    outcome: Option<Result<Status>>,
    active: bool,
    _buf: PhantomData<&'a mut [u8]>,
}

impl<'a> Request<'a> {
    pub(crate) fn pending(eng: Rc<RefCell<Engine>>, tok: Token) -> Request<'a> {
        Request {
            eng,
            tok: Some(tok),
            outcome: None,
            active: true,
            _buf: PhantomData,
        }
    }

    pub(crate) fn finished(eng: Rc<RefCell<Engine>>, outcome: Result<Status>) -> Request<'a> {
        Request {
            eng,
            tok: None,
            outcome: Some(outcome),
            active: true,
            _buf: PhantomData,
        }
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
                self.outcome = Some(r);
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
            let eng = self.eng.clone();
            let mut e = eng.borrow_mut();
            e.wait_until(|e| e.is_done(tok));
            self.collect(&mut e);
        }
        self.outcome.take().unwrap_or_else(|| Ok(Status::empty()))
    }

    /// Makes progress once; `Some(status)` if the operation is complete
    /// (and stays so on later calls).
    pub fn test(&mut self) -> Result<Option<Status>> {
        if self.outcome.is_none() {
            let eng = self.eng.clone();
            let mut e = eng.borrow_mut();
            e.progress();
            if !self.collect(&mut e) {
                return Ok(None);
            }
        }
        self.outcome_copy().map(Some)
    }

    /// True once complete (makes progress once).
    pub fn is_complete(&mut self) -> bool {
        !matches!(self.test(), Ok(None))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if let Some(tok) = self.tok.take() {
            if let Ok(mut e) = self.eng.try_borrow_mut() {
                e.wait_until(|e| e.is_done(tok));
                let _ = e.take_result(tok);
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
    let eng = reqs[first].eng.clone();
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
