//! MPI matching: posted receives and unexpected messages, both searched in
//! arrival/post order, so messages of one (source, tag, context) are matched
//! in the order they were sent (channels deliver each peer's records in
//! order, and the engine matches them as they arrive).

use std::collections::VecDeque;

use super::ops::Token;

/// A receive waiting for a message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Posted {
    pub ctx: u32,
    /// Communicator rank of the source, `None` = any.
    pub src: Option<u32>,
    /// `None` = any tag.
    pub tag: Option<i32>,
    pub token: Token,
}

/// What an unexpected message holds.
#[derive(Debug)]
pub(crate) enum Body {
    /// The whole payload, copied out of the channel.
    Eager(Vec<u8>),
    /// A rendezvous envelope: the data stays with the sender.
    Rts { send_token: u64, addr: u64 },
}

/// A message that arrived before a matching receive was posted.
#[derive(Debug)]
pub(crate) struct Unexpected {
    /// World rank it came from.
    pub peer: usize,
    pub ctx: u32,
    pub src: u32,
    pub tag: i32,
    pub len: usize,
    /// The message's collective stamp (`Header::stamp`).
    pub stamp: u32,
    pub body: Body,
}

#[inline]
fn matches(
    ctx: u32,
    src: Option<u32>,
    tag: Option<i32>,
    m_ctx: u32,
    m_src: u32,
    m_tag: i32,
) -> bool {
    ctx == m_ctx
        && match src {
            Some(s) => s == m_src,
            None => true,
        }
        && match tag {
            Some(t) => t == m_tag,
            None => true,
        }
}

/// The two queues of one process.
#[derive(Debug, Default)]
pub(crate) struct Matcher {
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
}

impl Matcher {
    /// Removes and returns the earliest posted receive that matches an
    /// arriving message.
    #[inline]
    pub fn take_posted(&mut self, ctx: u32, src: u32, tag: i32) -> Option<Token> {
        // Usually the oldest posted receive is the one.
        if let Some(p) = self.posted.front() {
            if matches(p.ctx, p.src, p.tag, ctx, src, tag) {
                return self.posted.pop_front().map(|p| p.token);
            }
        }
        let i = self
            .posted
            .iter()
            .position(|p| matches(p.ctx, p.src, p.tag, ctx, src, tag))?;
        self.posted.remove(i).map(|p| p.token)
    }

    pub fn post(&mut self, p: Posted) {
        self.posted.push_back(p);
    }

    /// Forgets a posted receive (it failed).
    pub fn unpost(&mut self, token: Token) {
        self.posted.retain(|p| p.token != token);
    }

    pub fn add_unexpected(&mut self, u: Unexpected) {
        self.unexpected.push_back(u);
    }

    /// Removes the earliest unexpected message a receive matches.
    pub fn take_unexpected(
        &mut self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
    ) -> Option<Unexpected> {
        let i = self.find_unexpected(ctx, src, tag)?;
        self.unexpected.remove(i)
    }

    /// Removes the earliest unexpected message of context `ctx` whose tag
    /// `pick` accepts.
    pub fn take_unexpected_where(
        &mut self,
        ctx: u32,
        pick: impl Fn(i32) -> bool,
    ) -> Option<Unexpected> {
        let i = self
            .unexpected
            .iter()
            .position(|u| u.ctx == ctx && pick(u.tag))?;
        self.unexpected.remove(i)
    }

    /// (context, source, tag, token) of every posted receive.
    pub fn posted_keys(&self) -> impl Iterator<Item = (u32, Option<u32>, Option<i32>, Token)> + '_ {
        self.posted.iter().map(|p| (p.ctx, p.src, p.tag, p.token))
    }

    /// Whether any message waits unexpected.
    #[inline]
    pub fn has_unexpected(&self) -> bool {
        !self.unexpected.is_empty()
    }

    /// The `k` oldest unexpected messages.
    pub fn oldest_unexpected(&self, k: usize) -> impl Iterator<Item = &Unexpected> {
        self.unexpected.iter().take(k)
    }

    /// The earliest unexpected message a receive would match (for probe).
    pub fn peek_unexpected(
        &self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<i32>,
    ) -> Option<&Unexpected> {
        self.find_unexpected(ctx, src, tag)
            .and_then(|i| self.unexpected.get(i))
    }

    fn find_unexpected(&self, ctx: u32, src: Option<u32>, tag: Option<i32>) -> Option<usize> {
        if self.unexpected.is_empty() {
            return None;
        }
        self.unexpected
            .iter()
            .position(|u| matches(ctx, src, tag, u.ctx, u.src, u.tag))
    }

    #[cfg(test)]
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    #[cfg(test)]
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eager(src: u32, tag: i32, ctx: u32, id: u8) -> Unexpected {
        Unexpected {
            peer: src as usize,
            ctx,
            src,
            tag,
            len: 1,
            stamp: 0,
            body: Body::Eager(vec![id]),
        }
    }

    fn id(u: &Unexpected) -> u8 {
        match &u.body {
            Body::Eager(v) => v[0],
            Body::Rts { .. } => 255,
        }
    }

    #[test]
    fn posted_in_order_with_wildcards() {
        let mut m = Matcher::default();
        m.post(Posted {
            ctx: 0,
            src: Some(1),
            tag: Some(5),
            token: 10,
        });
        m.post(Posted {
            ctx: 0,
            src: None,
            tag: None,
            token: 11,
        });
        m.post(Posted {
            ctx: 2,
            src: None,
            tag: Some(5),
            token: 12,
        });
        assert_eq!(m.take_posted(0, 2, 5), Some(11));
        assert_eq!(m.take_posted(0, 1, 5), Some(10));
        assert_eq!(m.take_posted(0, 1, 5), None);
        assert_eq!(m.take_posted(2, 9, 6), None);
        assert_eq!(m.take_posted(2, 9, 5), Some(12));
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn unexpected_fifo_per_source_and_context() {
        let mut m = Matcher::default();
        m.add_unexpected(eager(1, 7, 0, 1));
        m.add_unexpected(eager(2, 7, 0, 2));
        m.add_unexpected(eager(1, 7, 0, 3));
        m.add_unexpected(eager(1, 7, 4, 4));
        assert_eq!(m.peek_unexpected(0, Some(1), None).map(id), Some(1));
        assert_eq!(
            m.take_unexpected(4, Some(1), Some(7)).map(|u| id(&u)),
            Some(4)
        );
        assert_eq!(
            m.take_unexpected(0, Some(1), Some(7)).map(|u| id(&u)),
            Some(1)
        );
        assert_eq!(m.take_unexpected(0, None, Some(7)).map(|u| id(&u)), Some(2));
        assert_eq!(m.take_unexpected(0, None, None).map(|u| id(&u)), Some(3));
        assert!(m.take_unexpected(0, None, None).is_none());
        assert_eq!(m.unexpected_len(), 0);
    }

    #[test]
    fn unpost_removes() {
        let mut m = Matcher::default();
        m.post(Posted {
            ctx: 0,
            src: None,
            tag: None,
            token: 1,
        });
        m.unpost(1);
        assert_eq!(m.take_posted(0, 0, 0), None);
    }
}
