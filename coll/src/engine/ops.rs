//! Pending operations: a generation-checked slab, so a token from the wire
//! (a peer echoing our token in CTS or FIN) can never reach a recycled slot.

use std::rc::Rc;

use crate::error::Result;
use crate::request::Status;
use crate::transport::header::Header;

/// Names one operation: slot index in the low 32 bits, generation above.
pub(crate) type Token = u64;

/// Where a send is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendStage {
    /// Waiting for room in the channel (queued behind earlier sends).
    Queued,
    /// RTS sent; waiting for CTS (streamed) or FIN (peer read it itself).
    AwaitReply,
    /// Data being streamed by the channel.
    Streaming,
}

/// Where a receive is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecvStage {
    /// In the posted queue.
    Posted,
    /// Matched a rendezvous message whose data is being streamed in.
    Streaming {
        peer: usize,
        src: u32,
        tag: i32,
        msg_len: usize,
        wanted: usize,
        got: usize,
    },
}

#[derive(Debug)]
pub(crate) enum OpKind {
    Send {
        peer: usize,
        hdr: Header,
        buf: *const u8,
        len: usize,
        stage: SendStage,
    },
    Recv {
        /// World rank of the source, `None` for any source.
        peer: Option<usize>,
        /// World ranks of the communicator (for any-source failure checks).
        group: Rc<[usize]>,
        buf: *mut u8,
        cap: usize,
        stage: RecvStage,
        /// The stamp of the message it matched (`Header::stamp`; 0 before
        /// it matched one, or for a message that has none).
        stamp: u32,
    },
}

#[derive(Debug)]
pub(crate) struct Op {
    pub kind: OpKind,
    /// Set once the operation is complete.
    pub result: Option<Result<Status>>,
}

struct Slot<T> {
    gen: u32,
    val: Option<T>,
}

/// Slab with generation-checked tokens; no allocation once warm.
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Slab<T> {
    pub fn insert(&mut self, val: T) -> Token {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            let s = &mut self.slots[i as usize];
            s.gen = s.gen.wrapping_add(1);
            s.val = Some(val);
            return u64::from(i) | (u64::from(s.gen) << 32);
        }
        let i = self.slots.len() as u32;
        self.slots.push(Slot {
            gen: 1,
            val: Some(val),
        });
        u64::from(i) | (1u64 << 32)
    }

    fn index(&self, t: Token) -> Option<usize> {
        let i = (t & 0xffff_ffff) as usize;
        let gen = (t >> 32) as u32;
        let s = self.slots.get(i)?;
        (s.gen == gen && s.val.is_some()).then_some(i)
    }

    pub fn get(&self, t: Token) -> Option<&T> {
        let i = self.index(t)?;
        self.slots[i].val.as_ref()
    }

    pub fn get_mut(&mut self, t: Token) -> Option<&mut T> {
        let i = self.index(t)?;
        self.slots[i].val.as_mut()
    }

    pub fn remove(&mut self, t: Token) -> Option<T> {
        let i = self.index(t)?;
        self.live -= 1;
        self.free.push(i as u32);
        self.slots[i].val.take()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live
    }

    /// Tokens of every live entry.
    pub fn tokens(&self) -> impl Iterator<Item = Token> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.val.is_some())
            .map(|(i, s)| i as u64 | (u64::from(s.gen) << 32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_tokens_miss() {
        let mut s = Slab::default();
        let a = s.insert(1);
        assert_eq!(s.get(a), Some(&1));
        assert_eq!(s.remove(a), Some(1));
        let b = s.insert(2);
        assert_ne!(a, b);
        assert_eq!(s.get(a), None);
        assert_eq!(s.get(b), Some(&2));
        assert_eq!(s.get(u64::MAX), None);
        assert_eq!(s.len(), 1);
        assert_eq!(s.tokens().collect::<Vec<_>>(), vec![b]);
    }
}
