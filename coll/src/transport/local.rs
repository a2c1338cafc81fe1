//! The channel from a rank to itself: records queue in memory; rendezvous
//! data is copied straight from the sender's buffer.

use std::collections::VecDeque;

use super::header::Header;
use super::PeerInfo;
use crate::engine::State;

pub(crate) struct LocalChannel {
    pub eager_limit: usize,
    /// This process's pid (cached: no syscall on the polling path).
    pub pid: i32,
    queue: VecDeque<(Header, Vec<u8>)>,
}

impl LocalChannel {
    pub fn new(eager_limit: usize) -> LocalChannel {
        LocalChannel {
            eager_limit,
            pid: std::process::id() as i32,
            queue: VecDeque::new(),
        }
    }

    pub fn try_send(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        self.queue.push_back((*hdr, payload.to_vec()));
        true
    }

    pub fn has_backlog(&self) -> bool {
        !self.queue.is_empty()
    }

    #[inline(always)]
    pub fn poll(&mut self, peer: usize, st: &mut State) -> usize {
        if self.queue.is_empty() {
            return 0;
        }
        self.poll_slow(peer, st)
    }

    #[inline(never)]
    fn poll_slow(&mut self, peer: usize, st: &mut State) -> usize {
        let info = PeerInfo {
            cma_pid: Some(self.pid),
            local: true,
        };
        let mut n = 0;
        // Only what is queued now: handling a record may queue replies.
        for _ in 0..self.queue.len() {
            let Some((hdr, payload)) = self.queue.pop_front() else {
                break;
            };
            // A record we made ourselves cannot be malformed.
            let _ = st.on_record(peer, info, &hdr, &payload);
            n += 1;
        }
        n
    }
}
