//! The peers this rank talks to: a dense table of channels, found by world
//! rank through an index of 4 bytes per rank of the job.
//!
//! A peer gets an entry when it first matters: this rank itself and the
//! ranks of its node at init (their channels live in the node segment),
//! the others when this rank first sends to them or they first connect
//! (or when they are learned dead). Everything that is per peer (channel,
//! send queue, reported health) lives in the entry, so memory grows with
//! the peers a rank talks to, not with the job; at 128,000 ranks the index
//! is 512 KB.

use std::collections::VecDeque;

use super::ops::Token;
use crate::transport::Channel;

const NONE: u32 = u32::MAX;

/// One peer's state.
pub(crate) struct Peer {
    /// World rank.
    pub rank: usize,
    pub chan: Channel,
    /// Its health was reported to the operations already.
    pub reported: bool,
    /// Sends waiting for room in the channel (or for the channel), in
    /// order.
    pub send_queue: VecDeque<Token>,
}

/// The table.
pub(crate) struct Peers {
    idx: Vec<u32>,
    pub list: Vec<Peer>,
    /// Entries whose channel is looked at on every progress pass (self,
    /// shm and rdma: their traffic arrives in memory, not as an event on a
    /// file descriptor).
    pub polled: Vec<u32>,
    /// Entries with sends queued.
    pub queued: Vec<u32>,
}

impl Peers {
    /// An empty table for a job of `size` ranks.
    pub fn new(size: usize) -> Peers {
        Peers {
            idx: vec![NONE; size],
            list: Vec::new(),
            polled: Vec::new(),
            queued: Vec::new(),
        }
    }

    /// Number of ranks of the job.
    #[inline]
    pub fn job_size(&self) -> usize {
        self.idx.len()
    }

    /// The entry of world rank `rank`, if it has one.
    #[inline]
    pub fn slot(&self, rank: usize) -> Option<usize> {
        match self.idx.get(rank) {
            Some(&i) if i != NONE => Some(i as usize),
            _ => None,
        }
    }

    #[inline]
    pub fn get(&self, rank: usize) -> Option<&Peer> {
        self.slot(rank).map(|i| &self.list[i])
    }

    #[inline]
    pub fn get_mut(&mut self, rank: usize) -> Option<&mut Peer> {
        self.slot(rank).map(|i| &mut self.list[i])
    }

    /// The channel of `rank`, if it has one.
    #[inline]
    pub fn chan(&self, rank: usize) -> Option<&Channel> {
        self.get(rank).map(|p| &p.chan)
    }

    /// Adds `rank` with `chan` (polled on every pass when `polled`);
    /// returns its entry. A rank that has one already gets the new channel
    /// in it (a tcp connection replacing its dial).
    pub fn add(&mut self, rank: usize, chan: Channel, polled: bool) -> usize {
        if let Some(i) = self.slot(rank) {
            self.list[i].chan = chan;
            if polled && !self.polled.contains(&(i as u32)) {
                self.polled.push(i as u32);
            }
            return i;
        }
        let i = self.list.len();
        self.list.push(Peer {
            rank,
            chan,
            reported: false,
            send_queue: VecDeque::new(),
        });
        self.idx[rank] = i as u32;
        if polled {
            self.polled.push(i as u32);
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::local::LocalChannel;

    #[test]
    fn entries_only_for_peers_added() {
        let mut p = Peers::new(1000);
        assert!(p.get(7).is_none() && p.slot(999).is_none() && p.slot(5000).is_none());
        let a = p.add(7, Channel::Local(LocalChannel::new(64)), true);
        let b = p.add(500, Channel::Local(LocalChannel::new(64)), false);
        assert_eq!((a, b), (0, 1));
        assert_eq!(p.get(500).map(|x| x.rank), Some(500));
        assert_eq!(p.polled, vec![0]);
        assert_eq!(p.add(500, Channel::Local(LocalChannel::new(32)), true), 1);
        assert_eq!(p.polled, vec![0, 1]);
        assert_eq!(
            p.list.iter().map(|x| x.rank).collect::<Vec<_>>(),
            vec![7, 500]
        );
        assert_eq!(p.list.len(), 2);
    }
}
